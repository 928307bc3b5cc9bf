"""Corpus-level rows recomputed from the per-document records of ``--log_samples`` files.

lm_eval gives no standard error for these rows (their aggregation is not ``mean``); the report
recomputes them from the records to bootstrap them, with exactly the aggregation lm_eval ran: which
row holds which record and is aggregated how comes from the one table, :mod:`lm_eval_probes.rows`, read
when a row is asked for (a probe registered later is seen). Recomputable rows are those whose per-document
value is numbers: ``confidence`` records ``[confidence, correct]`` (``corruption_confidence_auroc``:
``[1 − confidence, noised]``), ``ranked`` ``[value, difficulty]`` and ``partial`` ``[value, difficulty,
length]``. The reader rows (``lcr_*``, ``corruption_auroc``) are written to samples as one-line strings, so
their features are not recoverable (no CI; :func:`not_recoverable`); ``ece_scaled`` is fitted out-of-fold
(:func:`cross_fitted`): no CI either. The task's ``metadata`` options (``ece_bins``, ``ece_binning``) apply
as in the run.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from lm_eval_probes.metrics.calibration import CalibrationOptions
from lm_eval_probes.probes.correlation import finite_rows
from lm_eval_probes.api import Row
from lm_eval_probes.rows import bound_aggregation, rows_by_name

RECORD_WIDTHS: dict[str, int] = {"confidence": 2, "ranked": 2, "partial": 3}
"""Per-document value kind of :mod:`lm_eval_probes.rows` → numbers per record (the recomputable kinds)."""

Statistic = Callable[[np.ndarray, CalibrationOptions], float]
"""``statistic(rows, options)``: rows ``[n, width]`` of finite floats → the row's value (``nan`` if undefined)."""

Resampled = Callable[[np.ndarray, CalibrationOptions], np.ndarray]
"""``resampled(rows, options)``: ``[B, n, width]`` → ``[B]``, the row on every resample at once."""


def _aggregation_statistic(row: Row) -> Statistic:
    """``row``'s own aggregation (as lm_eval ran it) on a record array; ``nan`` where it is undefined."""

    def statistic(rows: np.ndarray, options: CalibrationOptions) -> float:
        value = bound_aggregation(row, options)(rows.tolist())
        return math.nan if value is None else float(value)

    return statistic


# ----------------------------------------------------------------- the same statistics over many resamples
# ``resampled`` is ``[B, n, width]``; each returns ``[B]``. scikit-learn's AUROC and scipy's Spearman cost
# about a millisecond a call (input validation), too slow for 1000 resamples × every row × every task, so
# these rank-based forms compute all resamples at once; tests check them against the functions above.


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (1-based, ties share their mean rank) along the last axis."""
    return stats.rankdata(values, axis=-1)


def _row_pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation of each row pair of ``[B, n]`` arrays; ``nan`` where a row is constant."""
    a = a - a.mean(axis=-1, keepdims=True)
    b = b - b.mean(axis=-1, keepdims=True)
    denominator = np.sqrt((a * a).sum(axis=-1) * (b * b).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (a * b).sum(axis=-1) / np.where(denominator > 0, denominator, 1.0), np.nan)


def auroc_resampled(resampled: np.ndarray, options: CalibrationOptions | None = None) -> np.ndarray:
    """Mann–Whitney AUROC of confidence (column 0) for correct (column 1 = 1) over wrong, per resample:
    (Σ ranks of the correct − n₁(n₁+1)/2) / (n₁·n₀), ties ½ via average ranks; ``nan`` with one class."""
    ranks = _ranks(resampled[..., 0])
    positive = resampled[..., 1] == 1.0
    n_pos = positive.sum(axis=-1)
    n_neg = resampled.shape[-2] - n_pos
    u = (ranks * positive).sum(axis=-1) - n_pos * (n_pos + 1) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n_pos > 0) & (n_neg > 0), u / np.maximum(n_pos * n_neg, 1), np.nan)


def spearman_resampled(resampled: np.ndarray, options: CalibrationOptions | None = None) -> np.ndarray:
    """Spearman ρ of column 0 with column 1 per resample (Pearson of average ranks); ``nan`` for a constant
    side or fewer than 3 documents, as :func:`~lm_eval_probes.probes.correlation.spearman_score`."""
    if resampled.shape[-2] < 3:
        return np.full(resampled.shape[0], np.nan)
    return _row_pearson(_ranks(resampled[..., 0]), _ranks(resampled[..., 1]))


def partial_spearman_resampled(resampled: np.ndarray, options: CalibrationOptions | None = None) -> np.ndarray:
    """Partial Spearman ρ of columns 0 and 1 given column 2, per resample, as
    :func:`~lm_eval_probes.probes.correlation.partial_spearman_score` (a constant column 2 gives plain ρ)."""
    if resampled.shape[-2] < 3:
        return np.full(resampled.shape[0], np.nan)
    rx, ry, rz = (_ranks(resampled[..., k]) for k in range(3))
    r_xy, r_xz, r_yz = _row_pearson(rx, ry), _row_pearson(rx, rz), _row_pearson(ry, rz)
    constant_z = np.ptp(resampled[..., 2], axis=-1) == 0
    denominator = np.sqrt(np.clip((1 - r_xz**2) * (1 - r_yz**2), 0.0, None))
    with np.errstate(invalid="ignore", divide="ignore"):
        partial = np.clip((r_xy - r_xz * r_yz) / np.where(denominator > 0, denominator, np.nan), -1.0, 1.0)
    return np.where(constant_z, r_xy, partial)


def _descending(resampled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each resample's confidences (column 0) sorted descending, and its 0/1 correctness in that order."""
    order = np.argsort(-resampled[..., 0], axis=-1, kind="stable")
    confidence = np.take_along_axis(resampled[..., 0], order, axis=-1)
    correct = np.take_along_axis(resampled[..., 1], order, axis=-1)
    return confidence, correct


def _tie_groups(sorted_values: np.ndarray) -> np.ndarray:
    """``[B, n]`` ids of the runs of equal values of each (sorted) row, unique across rows."""
    starts = np.ones(sorted_values.shape, dtype=bool)
    starts[..., 1:] = sorted_values[..., 1:] != sorted_values[..., :-1]
    return np.cumsum(starts.reshape(-1)).reshape(sorted_values.shape) - 1


def _group_means(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each element replaced by the mean of ``values`` over its group."""
    flat = groups.reshape(-1)
    sums = np.bincount(flat, weights=values.reshape(-1))
    counts = np.bincount(flat)
    return (sums / counts)[flat].reshape(values.shape)


def _expected_cumulative_errors(resampled: np.ndarray) -> np.ndarray:
    """``[B, n]`` expected errors among the k most confident, k = 1..n, ties broken at random (as
    :func:`lm_eval_probes.probes.calibration.risk_coverage_curve`): inside a tied group each member carries the
    group's mean error, so the running sum is errors before the group + (k − before)/m · e."""
    confidence, correct = _descending(resampled)
    return np.cumsum(_group_means(1.0 - correct, _tie_groups(confidence)), axis=-1)


def aurc_resampled(resampled: np.ndarray, options: CalibrationOptions | None = None) -> np.ndarray:
    """AURC per resample: the mean over k of the risk of the k most confident; ``nan`` for no documents."""
    n = resampled.shape[-2]
    if n == 0:
        return np.full(resampled.shape[0], np.nan)
    return (_expected_cumulative_errors(resampled) / np.arange(1, n + 1)).mean(axis=-1)


def coverage_area_resampled(resampled: np.ndarray, options: CalibrationOptions | None = None) -> np.ndarray:
    """The coverage–accuracy area (HELM's ``selective_cov_acc_area``) per resample: 1 − AURC."""
    return 1.0 - aurc_resampled(resampled, options)


def prr_resampled(resampled: np.ndarray, options: CalibrationOptions | None = None) -> np.ndarray:
    """The prediction rejection ratio per resample, (A − accuracy)/(A_oracle − accuracy); ``nan`` where a
    resample's documents are all right or all wrong (as
    :func:`~lm_eval_probes.probes.calibration.prediction_rejection_ratio_score`)."""
    n = resampled.shape[-2]
    if n == 0:
        return np.full(resampled.shape[0], np.nan)
    k = np.arange(1, n + 1)
    correct = resampled[..., 1]
    accuracy = correct.mean(axis=-1)
    area = coverage_area_resampled(resampled, options)
    oracle = (np.minimum(correct.sum(axis=-1, keepdims=True), k) / k).mean(axis=-1)
    single_class = (correct == correct[..., :1]).all(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(single_class, np.nan, (area - accuracy) / np.where(single_class, 1.0, oracle - accuracy))


def accuracy_at_coverage_resampled(coverage: float) -> Resampled:
    """The selective accuracy of the ⌈coverage·n⌉ most confident documents per resample."""

    def resampled_accuracy(resampled: np.ndarray, options: CalibrationOptions | None = None) -> np.ndarray:
        n = resampled.shape[-2]
        if n == 0:
            return np.full(resampled.shape[0], np.nan)
        k = min(n, max(1, math.ceil(coverage * n - 1e-9)))
        return 1.0 - _expected_cumulative_errors(resampled)[..., k - 1] / k

    return resampled_accuracy


def _bin_ece(resampled: np.ndarray, bins: np.ndarray, n_bins: int) -> np.ndarray:
    """ECE = Σ_b |Σ_{i∈b} y_i − Σ_{i∈b} c_i| / n per resample, from each document's bin ``[B, n]``."""
    n_resamples, n = bins.shape
    if n == 0:
        return np.full(n_resamples, np.nan)
    flat = (np.arange(n_resamples)[:, None] * n_bins + bins).reshape(-1)
    size = n_resamples * n_bins
    gap = (np.bincount(flat, weights=resampled[..., 1].reshape(-1), minlength=size)
           - np.bincount(flat, weights=resampled[..., 0].reshape(-1), minlength=size))
    return np.abs(gap).reshape(n_resamples, n_bins).sum(axis=-1) / n


def _ascending(resampled: np.ndarray) -> np.ndarray:
    order = np.argsort(resampled[..., 0], axis=-1, kind="stable")
    return np.take_along_axis(resampled, order[..., None], axis=-2)


def ece_bins_resampled(n_bins: int, binning: str) -> Resampled:
    """ECE with ``n_bins`` bins of ``binning`` (``uniform``, ``quantile`` or ``helm``, as
    :func:`~lm_eval_probes.probes.calibration.reliability_diagram` draws them) per resample."""

    def resampled_ece(resampled: np.ndarray, options: CalibrationOptions | None = None) -> np.ndarray:
        n = resampled.shape[-2]
        if binning == "uniform":
            edges = np.arange(n_bins + 1, dtype=np.float64)[1:] / n_bins
            return _bin_ece(resampled, np.searchsorted(edges, resampled[..., 0], side="left"), n_bins)
        ordered = _ascending(resampled)
        confidence = ordered[..., 0]
        if n == 0:
            return np.full(resampled.shape[0], np.nan)
        if binning == "quantile":  # a tie group goes to the bin of its mid-rank (first + last)/2
            position = np.broadcast_to(np.arange(n), confidence.shape)
            groups = _tie_groups(confidence)
            mid = _group_means(position.astype(float), groups)
            bins = np.minimum(np.floor(mid * n_bins / n).astype(np.intp), n_bins - 1)
            return _bin_ece(ordered, bins, n_bins)
        # helm: np.array_split's chunks of the sorted confidences, a boundary midway between chunks, the last at 1
        chunks = min(n_bins, n)
        ends = np.cumsum([len(part) for part in np.array_split(np.arange(n), chunks)])[:-1] - 1
        boundaries = np.concatenate([(confidence[..., ends] + confidence[..., ends + 1]) / 2.0,
                                     np.ones(confidence.shape[:-1] + (1,))], axis=-1)
        bins = (confidence[..., :, None] > boundaries[..., None, :]).sum(axis=-1)
        return _bin_ece(ordered, bins, chunks)

    return resampled_ece


def _ece_option_resampled(resampled: np.ndarray, options: CalibrationOptions | None = None) -> np.ndarray:
    """ECE with the task's ``ece_bins`` and ``ece_binning`` per resample."""
    options = options or CalibrationOptions()
    return ece_bins_resampled(options.ece_bins, options.ece_binning)(resampled, options)



@dataclass(frozen=True)
class CorpusRow:
    """A row recomputable from per-document records of ``width`` numbers.

    ``statistic`` computes it on one ``[n, width]`` record array (the project's function);
    ``resampled`` (optional) on ``[B, n, width]`` at once, else :meth:`on_resamples` loops.
    """

    width: int
    statistic: Statistic
    resampled: Resampled | None = None

    def on_resamples(self, rows: np.ndarray, indices: np.ndarray, options: CalibrationOptions) -> np.ndarray:
        """``[B]`` values of the row on ``rows[indices[b]]`` (``nan`` where undefined; warnings silenced)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self.resampled is not None:
                return np.asarray(self.resampled(rows[indices], options), dtype=float)
            return np.array([self.statistic(rows[i], options) for i in indices], dtype=float)


FAST_RESAMPLED: dict[str, Resampled] = {
    "probe_selective_auroc": auroc_resampled,
    "probe_corruption_confidence_auroc": auroc_resampled,
    "probe_ece": _ece_option_resampled,
    "probe_ece_10_bin": ece_bins_resampled(10, "helm"),
    "probe_aurc": aurc_resampled,
    "probe_prr": prr_resampled,
    "probe_selective_cov_acc_area": coverage_area_resampled,
    "probe_selective_acc_50": accuracy_at_coverage_resampled(0.5),
    "probe_selective_acc_80": accuracy_at_coverage_resampled(0.8),
    "probe_spearman": spearman_resampled,
    "probe_partial_spearman": partial_spearman_resampled,
}
"""Aggregation name → its all-resamples-at-once form (tested equal to the aggregation)."""


def not_recoverable() -> frozenset[str]:
    """Reader rows (of the probes registered now): samples hold a one-line description of their records, not the
    features."""
    return frozenset(name for name, row in rows_by_name().items() if row.value == "reader")


def cross_fitted() -> frozenset[str]:
    """Rows fitted out-of-fold inside the aggregation: a bootstrap resample repeats documents, which would land
    in training and test folds at once, so these get no interval."""
    return frozenset(name for name, row in rows_by_name().items() if row.value == "confidence_keyed")


def corpus_row(name: str) -> CorpusRow | None:
    """The recomputation of row ``name``, or ``None`` for rows that are means, counts, cross-fitted, not
    recoverable from samples, or not the plugin's."""
    row = rows_by_name().get(name)
    if row is None or row.value not in RECORD_WIDTHS:
        return None
    return CorpusRow(RECORD_WIDTHS[row.value], _aggregation_statistic(row), FAST_RESAMPLED.get(row.aggregation))


def records(samples: Sequence[Mapping[str, Any]], name: str, width: int) -> np.ndarray:
    """``[n, width]`` float array of the documents' records of row ``name``, in samples order.

    Documents without the row, or whose record is not a list of ``width`` numbers (an undefined value
    left out, a null member), or has a non-finite member, are skipped — as the aggregation skips them.
    """
    items = [s[name] for s in samples if isinstance(s.get(name), (list, tuple)) and len(s[name]) == width]
    numeric = [item for item in items if all(v is None or isinstance(v, (int, float)) for v in item)]
    return finite_rows(numeric, width)
