"""Latent Correctness Reader (LCR): a linear probe that reads P(correct) off hidden states.

Source: "Unsure but Certain" (arXiv 2608.08791). Each document is summarised by the mean hidden
state over its answer positions at a mid-to-late layer; a standardised L2 logistic regression on
that vector predicts whether the answer is correct. The same reader doubles as a corruption
detector: features are the mean *prompt* hidden state, the label is "the prompt was noised", and
each document's clean and noised twin share a group so they never straddle train and test.

This module is pure (numpy, scipy, scikit-learn and its dependency threadpoolctl; no torch): it
takes the pooled features, not a model.

Protocols (see :func:`reader_scores`):

* ``"cross_fit"`` (default): stratified K-fold over the run's documents; every document is scored
  exactly once, out of fold, by a model that never saw its label. Layer and C are chosen inside
  each outer training part by an inner stratified cross-validation on mean AUROC.
* ``"split"`` (the paper's): a seeded, stratified selection of 200 calibration documents fits the
  reader (layer and C again chosen by inner CV on them) and the next 400 documents are scored.

Model: ``make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=1000))`` (lbfgs, L2
penalty on the weights, intercept unpenalised), fitted on a single layer's features.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.stats import rankdata
from sklearn import config_context
from sklearn.exceptions import UndefinedMetricWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from ..calibration import selective_auroc_score

__all__ = ["DEFAULT_CS", "PROTOCOLS", "ReaderScores", "reader_auroc_score", "reader_scores"]

DEFAULT_CS: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
"""Default grid of inverse L2 strengths (sklearn ``C = 1/λ``, loss summed over documents).

Five decades on standardised features: 1e-4 is close to the nearest-centroid limit for
d ≈ 4096 and a few hundred documents, 1.0 is nearly unregularised at d ≈ 10-100. Odd length, so
the "middle C" used when no inner search is possible is exactly 1e-2.
"""

PROTOCOLS: tuple[str, ...] = ("cross_fit", "split")
"""Valid values of ``protocol``."""

_MAX_ITER = 1000
_TIE_TOL = 1e-12
_Split = tuple[NDArray[np.intp], NDArray[np.intp]]


@dataclass(frozen=True, eq=False)
class ReaderScores:
    """Out-of-sample reader probabilities for one run's documents (arrays are read-only).

    Attributes:
        scores: ``[n]`` float64, P(label = 1) in [0, 1] for scored documents; nan for unscored
            ones (calibration or leftover documents of the split protocol, or a degenerate input).
        labels: ``[n]`` int64 0/1, the labels as given.
        scored: ``[n]`` bool, True where ``scores`` is defined.
        layers: chosen layer index (into the features' axis 1) per fitted model, in fold order:
            one per outer fold for ``"cross_fit"``, one for ``"split"``; () if nothing was fitted.
        Cs: chosen C per fitted model, aligned with ``layers``.
        protocol: ``"cross_fit"`` or ``"split"``.
        fold: ``[n]`` int64; ``"cross_fit"``: the outer fold whose held-out part holds the
            document (0..k-1); ``"split"``: 0 for scored (test) documents; -1 for unscored ones.
    """

    scores: NDArray[np.float64]
    labels: NDArray[np.int64]
    scored: NDArray[np.bool_]
    layers: tuple[int, ...]
    Cs: tuple[float, ...]
    protocol: str
    fold: NDArray[np.int64]


def reader_scores(
    features: ArrayLike,
    labels: ArrayLike,
    *,
    groups: Sequence[Hashable] | ArrayLike | None = None,
    protocol: str = "cross_fit",
    n_splits: int = 5,
    inner_splits: int = 3,
    Cs: Sequence[float] = DEFAULT_CS,
    seed: int = 0,
    calibration_size: int = 200,
    test_size: int = 400,
) -> ReaderScores:
    """Latent Correctness Reader scores, out of sample (arXiv 2608.08791).

    Args:
        features: ``[n, n_layers, d]`` pooled hidden states (e.g. mean over answer positions per
            layer); a ``[n, d]`` array is one layer. Finite real numbers (float16/32/64 or ints;
            computed in float64, one layer at a time).
        labels: ``[n]`` 0/1 or bool (1 = correct, or 1 = prompt was noised).
        groups: optional ``[n]`` hashable ids; documents sharing an id are never split between a
            training and a test part (outer and inner splits use ``StratifiedGroupKFold``;
            without groups ``StratifiedKFold``; both ``shuffle=True, random_state=seed``).
        protocol: ``"cross_fit"`` or ``"split"`` (below).
        n_splits: outer folds for ``"cross_fit"`` (>= 2).
        inner_splits: inner CV folds for choosing layer and C (>= 2).
        Cs: grid of inverse L2 strengths (> 0); duplicates are dropped.
        seed: seed for every splitter and for the split protocol's selection. Same inputs and
            seed give identical output; no global random state is touched.
        calibration_size, test_size: sizes for ``"split"`` (the paper uses 200 / 400).

    Protocols:
        ``"cross_fit"``: outer split into ``k = min(n_splits, minority count)`` folds (with
        groups the count is of distinct groups holding the minority label). In each outer
        training part, every (layer, C) pair gets the mean AUROC over an inner CV; the best is
        refitted on the whole outer training part and its ``predict_proba`` scores the
        held-out fold. Every document is scored exactly once, by a model that never saw its
        label.

        ``"split"``: documents (whole groups, with ``groups``) are put in a seeded order whose
        every prefix is stratified by label (by label composition for groups); the first
        ``calibration_size`` documents fit the reader (inner CV for layer and C on them) and the
        next ``test_size`` (or all the rest, if fewer) are scored; the others stay unscored.
        With groups the parts are whole groups, each part growing until it reaches its size.

    Model selection: inner mean AUROC (rank-sum AUROC, equal to ``roc_auc_score``, of the
    decision function; inner folds lacking a class are skipped). Ties (within 1e-12) go to the
    later layer, then the smaller C. The inner CV uses ``min(inner_splits, minority count of the training
    part)`` folds; below 2 (or if no inner fold is usable) there is no search: the last layer and
    the middle C of the sorted grid (``Cs[(len - 1) // 2]``) are used.

    Degenerate cases: fewer than 2 documents (or groups) in the minority label warns
    ``UndefinedMetricWarning`` and returns all-nan scores (``scored`` all False). An outer
    training part (or the calibration part) holding one class only (possible with groups) warns
    the same and leaves its documents unscored. Zero-variance feature columns are fine.

    Raises:
        ValueError: wrong ``features`` ndim or an empty axis, non-finite or non-real features,
            length mismatches, labels not 0/1, unknown protocol, ``n_splits`` or
            ``inner_splits`` < 2, empty or non-positive ``Cs``, non-positive sizes, and for
            ``"split"`` when ``n < calibration_size + 2``.

    Returns:
        :class:`ReaderScores`. AUROC over the scored documents: :func:`reader_auroc_score`.
    """
    x = _validated_features(features)
    n = x.shape[0]
    y = _validated_labels(labels, n)
    group_codes = None if groups is None else _group_codes(groups, n)
    grid = _validated_grid(Cs)
    n_splits = _validated_count("n_splits", n_splits, minimum=2)
    inner_splits = _validated_count("inner_splits", inner_splits, minimum=2)
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if protocol == "split":
        calibration_size = _validated_count("calibration_size", calibration_size, minimum=1)
        test_size = _validated_count("test_size", test_size, minimum=1)
        if n < calibration_size + 2:
            raise ValueError(
                f"protocol='split' needs at least calibration_size + 2 = {calibration_size + 2} documents, "
                f"got n = {n}; use protocol='cross_fit' or lower calibration_size"
            )
    builder = _ResultBuilder(y, protocol)
    minority = _minority_units(y, group_codes)
    if minority < 2:
        _warn(f"the minority label has {minority} document(s) or group(s) (< 2): reader undefined, scores are nan")
        return builder.result()
    # Finiteness is checked above (skip sklearn's per-fit re-checks); single-threaded BLAS because
    # the many small fits gain nothing from threads and oversubscribe a busy machine (10x slower).
    with config_context(assume_finite=True), threadpool_limits(limits=1, user_api="blas"):
        if protocol == "cross_fit":
            _cross_fit(builder, x, y, group_codes, n_splits=n_splits, inner_splits=inner_splits, Cs=grid, seed=seed)
        else:
            _split_fit(
                builder, x, y, group_codes, inner_splits=inner_splits, Cs=grid, seed=seed,
                calibration_size=calibration_size, test_size=test_size,
            )
    return builder.result()


def reader_auroc_score(result: ReaderScores) -> float:
    """AUROC of ``result.scores`` against ``result.labels`` over the scored documents.

    Returns a float in [0, 1] (0.5 = chance). With no scored document, or a single class among
    them, warns ``UndefinedMetricWarning`` and returns nan.
    """
    return selective_auroc_score(result.scores[result.scored], result.labels[result.scored])


# --- validation -------------------------------------------------------------------------------


def _validated_features(features: ArrayLike) -> NDArray:
    x = np.asarray(features)
    if x.ndim == 2:
        x = x[:, None, :]
    if x.ndim == 4:  # a state of several residual streams ([streams, d]: DeepSeek-V4): all its streams, one vector
        x = x.reshape(*x.shape[:2], -1)
    if x.ndim != 3:
        raise ValueError(f"features must be [n, n_layers, d], [n, n_layers, streams, d] or [n, d], got shape "
                         f"{np.shape(features)}")
    if x.dtype.kind not in "fiu":
        raise ValueError(f"features must be real numbers, got dtype {x.dtype}")
    if x.shape[1] == 0 or x.shape[2] == 0:
        raise ValueError(f"features need at least one layer and one dimension, got shape {x.shape}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        bad = int(np.count_nonzero(~np.isfinite(x).all(axis=(1, 2))))
        raise ValueError(f"features must be finite; {bad} of {x.shape[0]} documents hold nan or inf (shape {x.shape})")
    return x


def _validated_labels(labels: ArrayLike, n: int) -> NDArray[np.int64]:
    y = np.asarray(labels)
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"labels must have shape ({n},) to match features, got {y.shape}")
    if y.dtype.kind not in "biuf":
        raise ValueError(f"labels must be 0/1 or bool, got dtype {y.dtype}")
    bad = ~np.isin(y, (0, 1))
    if bad.any():
        raise ValueError(f"labels must be 0/1 or bool, got values {np.unique(y[bad])[:5].tolist()}")
    return y.astype(np.int64)


def _group_codes(groups: Sequence[Hashable] | ArrayLike, n: int) -> NDArray[np.int64]:
    """Integer codes in order of first appearance (works for any hashable ids)."""
    ids = list(groups)  # type: ignore[arg-type]
    if len(ids) != n:
        raise ValueError(f"groups must have length {n} to match features, got {len(ids)}")
    codes: dict[Hashable, int] = {}
    try:
        return np.array([codes.setdefault(g, len(codes)) for g in ids], dtype=np.int64)
    except TypeError as error:
        raise ValueError(f"groups must be hashable ids: {error}") from error


def _validated_grid(Cs: Sequence[float]) -> tuple[float, ...]:
    grid = np.asarray(Cs, dtype=np.float64).ravel()
    if grid.size == 0:
        raise ValueError("Cs must hold at least one value")
    if not (np.isfinite(grid) & (grid > 0)).all():
        raise ValueError(f"Cs must be finite and > 0, got {grid.tolist()}")
    return tuple(float(c) for c in np.unique(grid))


def _validated_count(name: str, value: int, *, minimum: int) -> int:
    try:
        count = operator.index(value)
    except TypeError as error:
        raise ValueError(f"{name} must be an integer, got {value!r}") from error
    if count < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {count}")
    return count


# --- protocols --------------------------------------------------------------------------------


class _ResultBuilder:
    """Collects scores fold by fold; :meth:`result` freezes them into a :class:`ReaderScores`."""

    def __init__(self, labels: NDArray[np.int64], protocol: str) -> None:
        self.labels = labels
        self.protocol = protocol
        self.scores = np.full(labels.shape[0], np.nan)
        self.fold = np.full(labels.shape[0], -1, dtype=np.int64)
        self.layers: list[int] = []
        self.Cs: list[float] = []

    def add(self, test_idx: NDArray[np.intp], probabilities: NDArray, fold: int, layer: int, C: float) -> None:
        self.scores[test_idx] = probabilities
        self.fold[test_idx] = fold
        self.layers.append(layer)
        self.Cs.append(C)

    def result(self) -> ReaderScores:
        arrays = (self.scores, self.labels.copy(), ~np.isnan(self.scores), self.fold)
        for array in arrays:
            array.setflags(write=False)
        scores, labels, scored, fold = arrays
        return ReaderScores(scores, labels, scored, tuple(self.layers), tuple(self.Cs), self.protocol, fold)


def _cross_fit(
    builder: _ResultBuilder,
    x: NDArray,
    y: NDArray[np.int64],
    groups: NDArray[np.int64] | None,
    *,
    n_splits: int,
    inner_splits: int,
    Cs: tuple[float, ...],
    seed: int,
) -> None:
    k = min(n_splits, _minority_units(y, groups))
    for fold, (train_idx, test_idx) in enumerate(_splits(y, groups, n_splits=k, seed=seed)):
        if np.unique(y[train_idx]).size < 2:
            _warn(f"outer training part {fold} holds one class only; its {test_idx.size} documents stay unscored",
                  stacklevel=4)
            continue
        layer, C = _select_layer_and_C(x, y, groups, train_idx, inner_splits=inner_splits, Cs=Cs, seed=seed)
        builder.add(test_idx, _fit_predict(x, y, train_idx, test_idx, layer=layer, C=C), fold, layer, C)


def _split_fit(
    builder: _ResultBuilder,
    x: NDArray,
    y: NDArray[np.int64],
    groups: NDArray[np.int64] | None,
    *,
    inner_splits: int,
    Cs: tuple[float, ...],
    seed: int,
    calibration_size: int,
    test_size: int,
) -> None:
    units = _stratified_unit_order(y, groups, seed=seed)
    calibration_idx, rest = _take_prefix(units, calibration_size)
    test_idx, _ = _take_prefix(rest, test_size)
    if np.unique(y[calibration_idx]).size < 2 or test_idx.size == 0:
        _warn(
            f"split protocol: calibration part of {calibration_idx.size} documents with labels "
            f"{np.unique(y[calibration_idx]).tolist()} and {test_idx.size} test documents; nothing is scored",
            stacklevel=4,
        )
        return
    layer, C = _select_layer_and_C(x, y, groups, calibration_idx, inner_splits=inner_splits, Cs=Cs, seed=seed)
    builder.add(test_idx, _fit_predict(x, y, calibration_idx, test_idx, layer=layer, C=C), 0, layer, C)


# --- splitting --------------------------------------------------------------------------------


def _minority_units(y: NDArray[np.int64], groups: NDArray[np.int64] | None) -> int:
    """Documents (or distinct groups) holding the rarer label: the most stratified folds possible."""
    if groups is None:
        return int(np.bincount(y, minlength=2).min())
    return min(int(np.unique(groups[y == label]).size) for label in (0, 1))


def _splits(y: NDArray[np.int64], groups: NDArray[np.int64] | None, *, n_splits: int, seed: int) -> Iterator[_Split]:
    placeholder = np.zeros((y.shape[0], 1))
    if groups is None:
        return StratifiedKFold(n_splits=n_splits, shuffle=True, random_state=seed).split(placeholder, y)
    return StratifiedGroupKFold(n_splits=n_splits, shuffle=True, random_state=seed).split(placeholder, y, groups)


def _stratified_unit_order(
    y: NDArray[np.int64], groups: NDArray[np.int64] | None, *, seed: int
) -> list[NDArray[np.intp]]:
    """Units (documents, or whole groups) in a seeded order whose every prefix is stratified.

    Units are stratified by their label composition (a document's label, a group's mean label).
    Within a stratum of m units the r-th of a random permutation sits at position (r + u) / m
    (u ~ U[0, 1), one per stratum); sorting all units by position interleaves the strata evenly.
    """
    rng = np.random.default_rng(seed)
    codes = np.arange(y.shape[0]) if groups is None else groups
    order = np.argsort(codes, kind="stable")
    boundaries = np.flatnonzero(np.diff(codes[order])) + 1
    units = np.split(order, boundaries)
    strata = np.array([y[unit].mean() for unit in units])
    positions = np.empty(len(units))
    for stratum in np.unique(strata):
        members = np.flatnonzero(strata == stratum)
        shuffled = members[rng.permutation(members.size)]
        positions[shuffled] = (np.arange(members.size) + rng.uniform()) / members.size
    tie_break = rng.permutation(len(units))
    return [units[i] for i in np.lexsort((tie_break, positions))]


def _take_prefix(units: list[NDArray[np.intp]], size: int) -> tuple[NDArray[np.intp], list[NDArray[np.intp]]]:
    """The shortest prefix of ``units`` holding >= ``size`` documents (or all of them), and the rest."""
    sizes = np.cumsum([unit.size for unit in units])
    stop = int(np.searchsorted(sizes, size)) + 1
    taken = units[:stop]
    indices = np.sort(np.concatenate(taken)) if taken else np.empty(0, dtype=np.intp)
    return indices, units[stop:]


# --- fitting ----------------------------------------------------------------------------------


def _layer(x: NDArray, layer: int, rows: NDArray[np.intp]) -> NDArray[np.float64]:
    return np.asarray(x[rows, layer, :], dtype=np.float64)


def _select_layer_and_C(
    x: NDArray,
    y: NDArray[np.int64],
    groups: NDArray[np.int64] | None,
    train_idx: NDArray[np.intp],
    *,
    inner_splits: int,
    Cs: tuple[float, ...],
    seed: int,
) -> tuple[int, float]:
    """(layer, C) maximising mean inner-CV AUROC on ``train_idx``; ties → later layer, smaller C."""
    fallback = (x.shape[1] - 1, Cs[(len(Cs) - 1) // 2])
    y_train = y[train_idx]
    g_train = None if groups is None else groups[train_idx]
    k = min(inner_splits, _minority_units(y_train, g_train))
    if k < 2:
        return fallback
    inner = [
        (fit, val)
        for fit, val in _splits(y_train, g_train, n_splits=k, seed=seed)
        if np.unique(y_train[fit]).size == 2 and np.unique(y_train[val]).size == 2
    ]
    if not inner:
        return fallback
    mean_auroc = np.empty((x.shape[1], len(Cs)))
    for layer in range(x.shape[1]):
        x_train = _layer(x, layer, train_idx)
        fold_aurocs = [_grid_aurocs(x_train[fit], y_train[fit], x_train[val], y_train[val], Cs) for fit, val in inner]
        mean_auroc[layer] = np.mean(fold_aurocs, axis=0)
    return _best(mean_auroc, Cs)


def _grid_aurocs(
    x_fit: NDArray[np.float64], y_fit: NDArray[np.int64], x_val: NDArray[np.float64], y_val: NDArray[np.int64],
    Cs: tuple[float, ...],
) -> NDArray[np.float64]:
    """Validation AUROC for every C (ascending), standardising once and warm-starting along the path."""
    scaler = StandardScaler().fit(x_fit)
    z_fit, z_val = scaler.transform(x_fit), scaler.transform(x_val)
    model = LogisticRegression(max_iter=_MAX_ITER, warm_start=True)
    aurocs = np.empty(len(Cs))
    for j, C in enumerate(Cs):
        model.set_params(C=C).fit(z_fit, y_fit)
        aurocs[j] = _binary_auroc(y_val, model.decision_function(z_val))
    return aurocs


def _binary_auroc(y: NDArray[np.int64], score: NDArray[np.float64]) -> float:
    """AUROC via the Mann–Whitney rank sum (ties count ½): equal to ``roc_auc_score``, without its
    per-call input validation (which dominated the inner search). Both classes must be present."""
    positives = y == 1
    n_pos = int(positives.sum())
    n_neg = y.shape[0] - n_pos
    rank_sum = float(rankdata(score)[positives].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def _best(mean_auroc: NDArray[np.float64], Cs: tuple[float, ...]) -> tuple[int, float]:
    """Highest mean AUROC; among ties (within 1e-12) the latest layer, then the smallest C."""
    near_top = mean_auroc >= mean_auroc.max() - _TIE_TOL
    layer = int(np.flatnonzero(near_top.any(axis=1))[-1])
    return layer, Cs[int(np.argmax(near_top[layer]))]


def _make_reader(C: float) -> Pipeline:
    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=_MAX_ITER))


def _fit_predict(
    x: NDArray, y: NDArray[np.int64], train_idx: NDArray[np.intp], test_idx: NDArray[np.intp], *, layer: int, C: float
) -> NDArray[np.float64]:
    reader = _make_reader(C).fit(_layer(x, layer, train_idx), y[train_idx])
    return reader.predict_proba(_layer(x, layer, test_idx))[:, 1]


def _warn(message: str, stacklevel: int = 3) -> None:
    """Warn ``UndefinedMetricWarning``; ``stacklevel`` 3 points at the caller of a public function."""
    warnings.warn(message, UndefinedMetricWarning, stacklevel=stacklevel)
