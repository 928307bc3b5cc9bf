"""Calibration and selective prediction of a confidence score against 0/1 correctness.

Source: "Unsure but Certain" (arXiv 2608.08791): expected calibration error with 15 equal-width
bins (the paper) and equal-mass bins (HELM's convention, 10 bins there, drawn its way with ``binning="helm"``); selective-prediction
AUROC (does confidence rank correct answers above wrong ones); AURC, the area under the
risk–coverage curve (Geifman et al., "Bias-Reduced Uncertainty Estimation for Deep Neural
Classifiers", ICLR 2019); accuracy at coverage 0.5 and 0.8; temperature scaling fitted by NLL
(Guo et al., "On Calibration of Modern Neural Networks", ICML 2017), which is a monotone map of
confidence and so cannot change AUROC. Scores users compare against elsewhere: lm-polygraph's prediction
rejection ratio (:func:`prediction_rejection_ratio_score`), and HELM's equal-mass ECE (``binning="helm"``,
10 bins: HELM's ``ece_10_bin``) and coverage–accuracy area (:func:`coverage_accuracy_area_score`: HELM's
``selective_cov_acc_area``).

Inputs everywhere: ``confidence`` is a 1-D array-like of finite floats in [0, 1] and ``correct``
a 1-D array-like of 0/1 (or bool) of the same length. Bad inputs raise :class:`ValueError`
naming the offending shape or value; undefined metrics (empty input, a single class for AUROC)
emit :class:`sklearn.exceptions.UndefinedMetricWarning` and return ``nan``.

Naming follows scikit-learn: ``*_score`` is higher-is-better, ``*_error`` / ``*_loss``
lower-is-better. Pure numpy / scipy / scikit-learn (no torch, no lm_eval).
"""

from __future__ import annotations

import difflib
import math
import warnings
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import minimize_scalar
from scipy.special import expit
from sklearn.exceptions import UndefinedMetricWarning
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import KFold, StratifiedKFold

__all__ = [
    "BINNINGS",
    "NLL_CLIP",
    "ReliabilityDiagram",
    "accuracy_at_coverage_score",
    "aurc_error",
    "binary_nll_loss",
    "coverage_accuracy_area_score",
    "expected_calibration_error",
    "fit_temperature",
    "out_of_fold_temperature_scale",
    "prediction_rejection_ratio_score",
    "reliability_diagram",
    "risk_coverage_curve",
    "selective_auroc_score",
    "temperature_scale",
]

BINNINGS: tuple[str, ...] = ("uniform", "quantile", "helm")
"""Valid ``binning`` values: equal-width bins over [0, 1], equal-mass bins, and equal-mass bins as HELM draws them."""

NLL_CLIP: float = 1e-12
""":func:`binary_nll_loss` clips probabilities to [NLL_CLIP, 1 − NLL_CLIP]."""

_COVERAGE_TOL = 1e-9  # ⌈coverage·n⌉ forgives float noise, so 0.7·10 (= 7.000000000000001) keeps 7 documents

JSONScalar = Union[float, int, None]


# --------------------------------------------------------------------------- validation


def _as_1d(name: str, values: ArrayLike) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be numeric (or bool), got dtype {arr.dtype}")
    return arr


def _check_confidence(confidence: ArrayLike) -> np.ndarray:
    """``confidence`` as float64 ``[n]``, every entry finite and in [0, 1]."""
    c = _as_1d("confidence", confidence).astype(np.float64)
    bad = np.flatnonzero(~(np.isfinite(c) & (c >= 0.0) & (c <= 1.0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"confidence must be finite and in [0, 1], got {c[i].item()!r} at index {i}")
    return c


def _check_correct(correct: ArrayLike) -> np.ndarray:
    """``correct`` as float64 ``[n]`` of exact 0.0 / 1.0."""
    raw = _as_1d("correct", correct)
    y = raw.astype(np.float64)
    bad = np.flatnonzero((y != 0.0) & (y != 1.0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"correct must hold only 0/1 (or bool), got {raw[i].item()!r} at index {i}")
    return y


def _check_inputs(confidence: ArrayLike, correct: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    c = _check_confidence(confidence)
    y = _check_correct(correct)
    if c.shape != y.shape:
        raise ValueError(f"confidence and correct must have the same length, got {c.shape[0]} vs {y.shape[0]}")
    return c, y


def _check_n_bins(n_bins: Any) -> int:
    if isinstance(n_bins, (bool, np.bool_)) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be an integer >= 1, got {n_bins!r}")
    return int(n_bins)


def _check_binning(binning: Any) -> str:
    if binning in BINNINGS:
        return str(binning)
    close = difflib.get_close_matches(str(binning), BINNINGS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown binning {binning!r}, expected one of {', '.join(map(repr, BINNINGS))}{hint}")


def _check_temperature(temperature: Any) -> float:
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, (int, float, np.integer, np.floating)):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    t = float(temperature)
    if not (math.isfinite(t) and t > 0.0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return t


def _undefined(message: str) -> float:
    warnings.warn(message, UndefinedMetricWarning, stacklevel=3)
    return float("nan")


# --------------------------------------------------------------------------- binning and ECE


def _uniform_edges(n_bins: int) -> np.ndarray:
    """``[n_bins + 1]`` edges i/n_bins, computed as exactly that division (0 and 1 are exact)."""
    return np.arange(n_bins + 1, dtype=np.float64) / n_bins


def _uniform_bin_index(c: np.ndarray, n_bins: int) -> np.ndarray:
    """Bin i holds (i/n, (i+1)/n]; confidence 0 goes to bin 0. Compared against the edges, not c·n."""
    return np.searchsorted(_uniform_edges(n_bins)[1:], c, side="left")


def _quantile_bin_index(c: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-mass bins: position p (0-based) of the ascending sort goes to bin ⌊p·n_bins/n⌋.

    A group of identical confidences occupies positions first..last; all of it goes to the bin of
    its mid-rank (first + last)/2, so ties share a bin and the result does not depend on input order.
    With distinct confidences, bin sizes are ⌊n/n_bins⌋ or ⌈n/n_bins⌉.
    """
    n = c.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.intp)
    values, inverse, counts = np.unique(c, return_inverse=True, return_counts=True)
    last = np.cumsum(counts) - 1
    first = last - counts + 1
    mid_rank = (first + last) / 2.0
    group_bin = np.floor(mid_rank * n_bins / n).astype(np.intp)
    return np.minimum(group_bin, n_bins - 1)[inverse.reshape(-1)]


def _helm_bin_index(c: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-mass bins as HELM's ``ece_10_bin`` draws them (the ``uncertainty-calibration`` library's
    ``get_equal_bins``): the ascending confidences split into min(n_bins, n) chunks by ``np.array_split`` (the
    first n mod n_bins chunks one longer), a boundary at the midpoint between each chunk's last and the next
    chunk's first confidence, the last boundary 1; a confidence goes to the first bin whose boundary is >= it (a
    confidence on a boundary stays in the lower bin; equal boundaries merge their bins)."""
    n = c.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.intp)
    chunks = np.array_split(np.sort(c), min(n_bins, n))
    boundaries = [(chunks[i][-1] + chunks[i + 1][0]) / 2.0 for i in range(len(chunks) - 1)] + [1.0]
    return np.searchsorted(np.unique(boundaries), c, side="left")


@dataclass(frozen=True, eq=False)
class ReliabilityDiagram:
    """Per-bin statistics of a confidence score, all read-only numpy arrays of shape ``[n_bins]``.

    Attributes:
        bin_lower, bin_upper: bin bounds. ``"uniform"``: the edges i/n_bins and (i+1)/n_bins
            (bin = (lower, upper], confidence 0 in bin 0). ``"quantile"``: the smallest and
            largest confidence in the bin (nan for an empty bin).
        count: int64 number of documents in each bin (sums to n).
        mean_confidence: mean confidence in each bin, in [0, 1]; nan for an empty bin.
        accuracy: fraction correct in each bin, in [0, 1]; nan for an empty bin.

    ``eq=False``: comparing arrays element-wise has no single truth value, so instances compare
    by identity.
    """

    bin_lower: np.ndarray
    bin_upper: np.ndarray
    count: np.ndarray
    mean_confidence: np.ndarray
    accuracy: np.ndarray

    def expected_calibration_error(self) -> float:
        """ECE = Σ_b (n_b / n)·|acc_b − conf_b| over non-empty bins, in [0, 1], lower is better.

        No documents (n = 0): UndefinedMetricWarning and nan.
        """
        n = int(self.count.sum())
        if n == 0:
            return _undefined("expected calibration error is undefined for empty input; returning nan")
        filled = self.count > 0
        gaps = np.abs(self.accuracy[filled] - self.mean_confidence[filled])
        return float(np.sum(self.count[filled] / n * gaps))

    def to_dict(self) -> dict[str, list[JSONScalar]]:
        """JSON-native lists (Python floats and ints), nan → None, keyed by attribute name."""

        def floats(a: np.ndarray) -> list[JSONScalar]:
            return [None if math.isnan(v) else float(v) for v in a.tolist()]

        return {
            "bin_lower": floats(self.bin_lower),
            "bin_upper": floats(self.bin_upper),
            "count": [int(v) for v in self.count.tolist()],
            "mean_confidence": floats(self.mean_confidence),
            "accuracy": floats(self.accuracy),
        }


def _read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def reliability_diagram(
    confidence: ArrayLike,
    correct: ArrayLike,
    *,
    n_bins: int = 15,
    binning: str = "uniform",
) -> ReliabilityDiagram:
    """Bin documents by confidence and report each bin's count, mean confidence and accuracy.

    Args:
        confidence: ``[n]`` finite floats in [0, 1].
        correct: ``[n]`` 0/1 or bool.
        n_bins: number of bins, an integer >= 1 (paper: 15 with ``"uniform"``; HELM: 10 with
            ``"helm"``).
        binning: ``"uniform"``: equal-width bins, bin i = (i/n_bins, (i+1)/n_bins], with
            confidence exactly 0 put in the first bin (so every value in [0, 1] has a bin).
            ``"quantile"``: equal-mass bins: after sorting by confidence, position p (0-based) goes
            to bin ⌊p·n_bins/n⌋, so with distinct confidences bin sizes differ by at most 1; a group
            of identical confidences goes whole to the bin of its mid-rank (first + last position)/2,
            so ties share a bin (bins may then be uneven, or empty). n < n_bins leaves empty bins.
            ``"helm"``: equal-mass bins as HELM draws them (:func:`_helm_bin_index`: chunks of the sorted
            confidences, boundaries at their midpoints); bins past the last boundary stay empty.

    Returns:
        A :class:`ReliabilityDiagram` with ``[n_bins]`` arrays; empty bins have nan mean
        confidence and accuracy. Empty input gives all-zero counts (no warning here; the ECE of it
        warns).

    Raises:
        ValueError: invalid inputs, ``n_bins`` < 1 or not an integer, unknown ``binning``.
    """
    c, y = _check_inputs(confidence, correct)
    n_bins = _check_n_bins(n_bins)
    binning = _check_binning(binning)
    index = {"uniform": _uniform_bin_index, "quantile": _quantile_bin_index, "helm": _helm_bin_index}[binning](c, n_bins)
    count = np.bincount(index, minlength=n_bins).astype(np.int64)
    filled = count > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_confidence = np.where(filled, np.bincount(index, weights=c, minlength=n_bins) / count, np.nan)
        accuracy = np.where(filled, np.bincount(index, weights=y, minlength=n_bins) / count, np.nan)
    if binning == "uniform":
        edges = _uniform_edges(n_bins)
        lower, upper = edges[:-1].copy(), edges[1:].copy()
    else:
        lower = np.full(n_bins, np.nan)
        upper = np.full(n_bins, np.nan)
        np.fmin.at(lower, index, c)
        np.fmax.at(upper, index, c)
    return ReliabilityDiagram(
        bin_lower=_read_only(lower),
        bin_upper=_read_only(upper),
        count=_read_only(count),
        mean_confidence=_read_only(mean_confidence),
        accuracy=_read_only(accuracy),
    )


def expected_calibration_error(
    confidence: ArrayLike,
    correct: ArrayLike,
    *,
    n_bins: int = 15,
    binning: str = "uniform",
) -> float:
    """Expected calibration error ECE = Σ_b (n_b / n)·|acc_b − conf_b|.

    acc_b and conf_b are the accuracy and mean confidence of the n_b documents in bin b, binned
    exactly as :func:`reliability_diagram` does (this calls it): ``"uniform"`` = equal-width bins
    (i/n_bins, (i+1)/n_bins] with confidence 0 in the first bin (paper: 15 bins); ``"quantile"`` =
    equal-mass bins by rank, ties kept in one bin; ``"helm"`` = equal-mass bins as HELM draws them (10 bins there).

    Args:
        confidence: ``[n]`` finite floats in [0, 1].
        correct: ``[n]`` 0/1 or bool.
        n_bins: integer >= 1. n_bins = 1 gives |accuracy − mean confidence|.
        binning: ``"uniform"`` or ``"quantile"``.

    Returns:
        ECE in [0, 1]; lower is better (0 = calibrated per bin). Empty input:
        UndefinedMetricWarning and nan.

    Raises:
        ValueError: invalid inputs, bad ``n_bins``, unknown ``binning``.
    """
    diagram = reliability_diagram(confidence, correct, n_bins=n_bins, binning=binning)
    return diagram.expected_calibration_error()


# --------------------------------------------------------------------------- selective prediction


def selective_auroc_score(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Selective-prediction AUROC: P(confidence of a correct doc > that of a wrong one), ties ½.

    ``sklearn.metrics.roc_auc_score(correct, confidence)``.

    Args:
        confidence: ``[n]`` finite floats in [0, 1].
        correct: ``[n]`` 0/1 or bool (the positive class is "correct").

    Returns:
        AUROC in [0, 1]; higher is better, 0.5 = confidence carries no ranking information.
        Empty input, or only one class present: UndefinedMetricWarning and nan.
    """
    c, y = _check_inputs(confidence, correct)
    if c.size == 0:
        return _undefined("selective AUROC is undefined for empty input; returning nan")
    if np.all(y == y[0]):
        return _undefined(f"selective AUROC needs both correct and wrong documents, all {int(y[0])}; returning nan")
    return float(roc_auc_score(y.astype(np.int64), c))


def _expected_cumulative_errors(c: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``[n]``: expected number of errors among the k most confident, k = 1..n, ties broken at random.

    Documents are sorted by confidence descending. Inside a tied group of size m with e errors that
    starts after ``before`` documents, uniformly random tie-breaking puts (k − before)·e/m errors
    among its first k − before members in expectation, so
    E(k) = errors before the group + (k − before)/m · e.
    """
    n = c.shape[0]
    values, inverse, counts = np.unique(-c, return_inverse=True, return_counts=True)  # groups, most confident first
    inverse = inverse.reshape(-1)
    group_errors = np.bincount(inverse, weights=1.0 - y, minlength=values.size)
    end = np.cumsum(counts)
    start = end - counts
    errors_before = np.cumsum(group_errors) - group_errors
    k = np.arange(1, n + 1)
    group_of_k = np.repeat(np.arange(values.size), counts)
    return errors_before[group_of_k] + (k - start[group_of_k]) / counts[group_of_k] * group_errors[group_of_k]


def risk_coverage_curve(confidence: ArrayLike, correct: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Risk–coverage curve of selective prediction (Geifman & El-Yaniv; Geifman et al. 2019).

    Keep the k most confident documents (confidence descending), k = 1..n:
    coverage_k = k/n, risk_k = (errors among them)/k. With tied confidences the errors are the
    expectation over uniformly random tie-breaking: inside a tied group of size m with e errors,
    preceded by ``before`` documents, errors(k) = errors before the group + (k − before)/m · e.
    The curve therefore does not depend on input order.

    Args:
        confidence: ``[n]`` finite floats in [0, 1].
        correct: ``[n]`` 0/1 or bool.

    Returns:
        ``(coverage, risk)``, both float64 ``[n]``: coverage increasing in (0, 1] (ending at 1),
        risk in [0, 1] (lower is better; risk at coverage 1 is the plain error rate). Empty input:
        two empty arrays.
    """
    c, y = _check_inputs(confidence, correct)
    n = c.shape[0]
    k = np.arange(1, n + 1, dtype=np.float64)
    if n == 0:
        return k, k.copy()
    return k / n, _expected_cumulative_errors(c, y) / k


def aurc_error(confidence: ArrayLike, correct: ArrayLike) -> float:
    """AURC: area under the step risk–coverage curve = (1/n)·Σ_{k=1..n} risk_k (Geifman et al. 2019).

    risk_k is from :func:`risk_coverage_curve` (ties = expectation over random tie-breaking, so
    AURC is the mean AURC over all tie orders).

    Args:
        confidence: ``[n]`` finite floats in [0, 1].
        correct: ``[n]`` 0/1 or bool.

    Returns:
        AURC in [0, 1]; lower is better. Its floor for a given error rate is reached when every
        correct document is more confident than every wrong one. Empty input:
        UndefinedMetricWarning and nan.
    """
    _, risk = risk_coverage_curve(confidence, correct)
    if risk.size == 0:
        return _undefined("AURC is undefined for empty input; returning nan")
    return float(np.mean(risk))


def coverage_accuracy_area_score(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Area under the coverage–accuracy curve: (1/n)·Σ_{k=1..n} accuracy of the k most confident = 1 − AURC.

    HELM's ``selective_cov_acc_area``, and lm-polygraph's prediction-rejection area for a 0/1 quality. Ties are
    the expectation over uniformly random tie-breaking (as in :func:`risk_coverage_curve`); HELM breaks them in
    ``np.argsort(-confidence)``'s order, so with tied confidences the two may differ.

    Returns:
        The area in [0, 1]; higher is better. Empty input: UndefinedMetricWarning and nan.
    """
    _, risk = risk_coverage_curve(confidence, correct)
    if risk.size == 0:
        return _undefined("the coverage-accuracy area is undefined for empty input; returning nan")
    return float(np.mean(1.0 - risk))


def prediction_rejection_ratio_score(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Prediction rejection ratio (lm-polygraph's PRR; Malinin et al.): how much of the oracle's gain over random
    rejection the confidence achieves, PRR = (A − A_random) / (A_oracle − A_random).

    A is the prediction-rejection area, the mean over k = 1..n of the accuracy of the k most confident documents
    (:func:`coverage_accuracy_area_score`); A_oracle is the same with every correct document first; A_random,
    its expectation under a random order, is the accuracy (lm-polygraph estimates it from 1000 random orders).

    Returns:
        PRR, at most 1 (the oracle's order); 0 = no better than random, negative = worse. Empty input, or only
        correct or only wrong documents (the oracle is then no better than random): UndefinedMetricWarning and
        nan.
    """
    c, y = _check_inputs(confidence, correct)
    n = c.shape[0]
    if n == 0:
        return _undefined("the prediction rejection ratio is undefined for empty input; returning nan")
    if np.all(y == y[0]):
        return _undefined(f"the prediction rejection ratio needs correct and wrong documents, all {int(y[0])}; returning nan")
    area = coverage_accuracy_area_score(c, y)
    accuracy = float(np.mean(y))
    k = np.arange(1, n + 1, dtype=np.float64)
    oracle = float(np.mean(np.minimum(np.sum(y), k) / k))
    return (area - accuracy) / (oracle - accuracy)


def accuracy_at_coverage_score(confidence: ArrayLike, correct: ArrayLike, *, coverage: float = 0.5) -> float:
    """Selective accuracy of the k = ⌈coverage·n⌉ most confident documents (k >= 1).

    accuracy = 1 − E(errors among the k most confident)/k, ties resolved as the expectation over
    uniformly random tie-breaking (as in :func:`risk_coverage_curve`). ⌈·⌉ forgives float noise of
    1e-9 (0.7·10 keeps 7 documents, not 8). The paper reports coverage 0.5 and 0.8.

    Args:
        confidence: ``[n]`` finite floats in [0, 1].
        correct: ``[n]`` 0/1 or bool.
        coverage: fraction of documents kept, in (0, 1]; 1.0 gives plain accuracy.

    Returns:
        Accuracy in [0, 1]; higher is better. Empty input: UndefinedMetricWarning and nan.

    Raises:
        ValueError: invalid inputs or ``coverage`` outside (0, 1].
    """
    if isinstance(coverage, (bool, np.bool_)) or not isinstance(coverage, (int, float, np.integer, np.floating)):
        raise ValueError(f"coverage must be a number in (0, 1], got {coverage!r}")
    if not (0.0 < float(coverage) <= 1.0):
        raise ValueError(f"coverage must be in (0, 1], got {coverage!r}")
    c, y = _check_inputs(confidence, correct)
    n = c.shape[0]
    if n == 0:
        return _undefined("accuracy at coverage is undefined for empty input; returning nan")
    k = min(n, max(1, math.ceil(float(coverage) * n - _COVERAGE_TOL)))
    return float(1.0 - _expected_cumulative_errors(c, y)[k - 1] / k)


# --------------------------------------------------------------------------- temperature scaling


def _logit(c: np.ndarray) -> np.ndarray:
    """log(c) − log1p(−c): −inf at 0, +inf at 1, no clipping."""
    with np.errstate(divide="ignore"):
        return np.log(c) - np.log1p(-c)


def temperature_scale(confidence: ArrayLike, temperature: float) -> np.ndarray:
    """Binary temperature scaling of a correctness confidence: σ(logit(c)/T).

    logit(c) = log(c) − log1p(−c), so c = 0 → −inf → 0 and c = 1 → +inf → 1 without clipping; σ is
    ``scipy.special.expit``. T > 1 softens towards 0.5, T < 1 sharpens, T = 1 is the identity (up
    to rounding).

    The map is strictly increasing in c, so it preserves the ranking of documents and selective
    AUROC is unchanged exactly (the same ROC is computed from the same order). That is why the
    binary form, on the confidence of being correct, is used for every confidence source,
    multiple choice included: the softmax-over-options form would rescale each document's option
    distribution separately and could reorder documents. (In float64, distinct confidences could
    only merge for extreme T, where σ saturates or squeezes everything to 0.5.)

    Args:
        confidence: ``[n]`` finite floats in [0, 1].
        temperature: T, finite and > 0.

    Returns:
        float64 ``[n]`` in [0, 1], in input order.

    Raises:
        ValueError: invalid confidence or T not finite and > 0.
    """
    c = _check_confidence(confidence)
    t = _check_temperature(temperature)
    return expit(_logit(c) / t)


def _nll(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, NLL_CLIP, 1.0 - NLL_CLIP)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def binary_nll_loss(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Mean negative log-likelihood of the correctness labels under the confidence.

    NLL = −(1/n)·Σ [y_i·log p_i + (1 − y_i)·log(1 − p_i)], with p_i = confidence clipped to
    [1e-12, 1 − 1e-12] (:data:`NLL_CLIP`) so a confident mistake costs at most −log(1e-12) ≈ 27.6.

    Args:
        confidence: ``[n]`` finite floats in [0, 1].
        correct: ``[n]`` 0/1 or bool.

    Returns:
        NLL in nats, in [≈1e-12, ≈27.6]; lower is better. Empty input: UndefinedMetricWarning and nan.
    """
    c, y = _check_inputs(confidence, correct)
    if c.size == 0:
        return _undefined("binary NLL is undefined for empty input; returning nan")
    return _nll(c, y)


def _check_bounds(bounds: Any) -> tuple[float, float]:
    try:
        low, high = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"bounds must be a pair (low, high), got {bounds!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and 0.0 < low < high):
        raise ValueError(f"bounds must satisfy 0 < low < high < inf, got {bounds!r}")
    return low, high


def _fit_temperature(c: np.ndarray, y: np.ndarray, low: float, high: float) -> float:
    logits = _logit(c)
    informative = np.isfinite(logits) & (logits != 0.0)
    if not np.any(informative):
        return min(max(1.0, low), high)  # NLL does not depend on T

    def objective(log_t: float) -> float:
        return _nll(expit(logits / math.exp(log_t)), y)

    result = minimize_scalar(
        objective, bounds=(math.log(low), math.log(high)), method="bounded", options={"xatol": 1e-10, "maxiter": 500}
    )
    return float(math.exp(result.x))


def fit_temperature(
    confidence: ArrayLike,
    correct: ArrayLike,
    *,
    bounds: tuple[float, float] = (1e-2, 1e2),
) -> float:
    """The temperature T minimising ``binary_nll_loss(temperature_scale(confidence, T), correct)``.

    Minimised over log T with ``scipy.optimize.minimize_scalar(method="bounded")`` (Brent on a
    bracket, xatol 1e-10 in log T).

    Args:
        confidence: ``[n]`` finite floats in [0, 1].
        correct: ``[n]`` 0/1 or bool. A single class is allowed (no warning): the fit then only
            pushes confidences towards that class, so T typically ends (within xatol) at a bound,
            e.g. the lower bound when every document is correct with confidence > 0.5.
        bounds: ``(low, high)`` with 0 < low < high < inf.

    Returns:
        T in [low, high]; T > 1 means the raw confidence was overconfident. When no confidence is
        informative (all in {0, 0.5, 1}), NLL does not depend on T and 1.0 (clipped into the
        bounds) is returned. Empty input: UndefinedMetricWarning and nan.

    Raises:
        ValueError: invalid inputs or bounds.
    """
    c, y = _check_inputs(confidence, correct)
    low, high = _check_bounds(bounds)
    if c.size == 0:
        return _undefined("temperature is undefined for empty input; returning nan")
    return _fit_temperature(c, y, low, high)


def _splitter(y: np.ndarray, n_splits: int, seed: int) -> StratifiedKFold | KFold:
    minority = int(min(np.count_nonzero(y == 1.0), np.count_nonzero(y == 0.0)))
    if minority >= 2:
        return StratifiedKFold(n_splits=min(n_splits, minority), shuffle=True, random_state=seed)
    return KFold(n_splits=min(n_splits, y.shape[0]), shuffle=True, random_state=seed)


def out_of_fold_temperature_scale(
    confidence: ArrayLike,
    correct: ArrayLike,
    *,
    n_splits: int = 5,
    seed: int = 0,
) -> np.ndarray:
    """Cross-fitted temperature scaling: each document is scaled by a T fitted without its label.

    Folds: ``StratifiedKFold(n_splits, shuffle=True, random_state=seed)``; if the minority class
    has fewer than ``n_splits`` members, that many splits (at least 2). If a class has fewer than
    2 members (one class only, or a single wrong/correct document), stratification is impossible
    and ``KFold(min(n_splits, n), shuffle=True, random_state=seed)`` is used instead. For each fold,
    T = :func:`fit_temperature` (default bounds) on the other folds, applied with
    :func:`temperature_scale` to the held-out fold. A training part with a single class drives T
    to a bound (see :func:`fit_temperature`).

    Args:
        confidence: ``[n]`` finite floats in [0, 1].
        correct: ``[n]`` 0/1 or bool.
        n_splits: integer >= 2, the number of folds at most.
        seed: ``random_state`` of the splitter.

    Returns:
        float64 ``[n]`` scaled confidences in [0, 1], in input order. n < 2 (nothing to hold out
        from): UndefinedMetricWarning and an all-nan ``[n]`` array.

    Raises:
        ValueError: invalid inputs or ``n_splits`` < 2.
    """
    if isinstance(n_splits, (bool, np.bool_)) or not isinstance(n_splits, (int, np.integer)) or n_splits < 2:
        raise ValueError(f"n_splits must be an integer >= 2, got {n_splits!r}")
    c, y = _check_inputs(confidence, correct)
    n = c.shape[0]
    if n < 2:
        _undefined(f"out-of-fold temperature scaling needs at least 2 documents, got {n}; returning nan")
        return np.full(n, np.nan)
    low, high = 1e-2, 1e2
    scaled = np.empty(n, dtype=np.float64)
    for train, test in _splitter(y, int(n_splits), seed).split(c.reshape(-1, 1), y.astype(np.int64)):
        scaled[test] = temperature_scale(c[test], _fit_temperature(c[train], y[train], low, high))
    return scaled
