"""Corpus-level rows recomputed from the per-document records of ``--log_samples`` files.

lm_eval gives no standard error for these rows (their aggregation is not ``mean``); the report
recomputes them from the records to bootstrap them. The records in a samples line, per row:

* ``ece``, ``selective_auroc``, ``aurc``, ``selective_acc_50/80``: ``[confidence, correct]``;
  ``corruption_confidence_auroc``: ``[1 − confidence, noised]``;
* ``*_spearman``: ``[value, difficulty]``; ``*_spearman_partial*``: ``[value, difficulty, length]``.

The reader rows (``lcr_*``, ``corruption_auroc``) are written to samples as one-line strings: their
features are not recoverable, so they have no recomputation (and no CI). ``ece_scaled`` is fitted out-of-fold (see
:data:`CROSS_FITTED`): no CI either. The math is the project's
pure functions (:mod:`lm_eval_probes.probes.calibration`, :mod:`lm_eval_probes.probes.correlation`),
with the task's ``metadata`` options (``ece_bins``, ``ece_binning``) as the aggregation used them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from lm_eval_probes.probes.calibration import (
    accuracy_at_coverage_score,
    aurc_error,
    expected_calibration_error,
    selective_auroc_score,
)
from lm_eval_probes.probes.correlation import finite_rows, partial_spearman_score, spearman_score


@dataclass(frozen=True)
class RowOptions:
    """The task ``metadata`` options that change a recomputed row (defaults as in ``CalibrationOptions``)."""

    ece_bins: int = 15
    ece_binning: str = "uniform"

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> RowOptions:
        """Read ``ece_bins`` and ``ece_binning``; other keys are the task's own.

        Raises:
            ValueError: a present option of the wrong type.
        """
        try:
            return cls(
                ece_bins=int(metadata.get("ece_bins", cls.ece_bins)),
                ece_binning=str(metadata.get("ece_binning", cls.ece_binning)),
            )
        except (TypeError, ValueError) as error:
            raise ValueError(f"bad calibration option in task metadata {dict(metadata)!r}: {error}") from None


Statistic = Callable[[np.ndarray, RowOptions], float]
"""``statistic(rows, options)``: rows ``[n, width]`` of finite floats → the row's value (``nan`` if undefined)."""


def _ece(rows: np.ndarray, options: RowOptions) -> float:
    return expected_calibration_error(rows[:, 0], rows[:, 1], n_bins=options.ece_bins, binning=options.ece_binning)


def _aurc(rows: np.ndarray, options: RowOptions) -> float:
    return aurc_error(rows[:, 0], rows[:, 1])


def _coverage(coverage: float) -> Statistic:
    def statistic(rows: np.ndarray, options: RowOptions) -> float:
        return accuracy_at_coverage_score(rows[:, 0], rows[:, 1], coverage=coverage)

    return statistic


def _auroc(rows: np.ndarray, options: RowOptions) -> float:
    return selective_auroc_score(rows[:, 0], rows[:, 1])


def _spearman(rows: np.ndarray, options: RowOptions) -> float:
    return spearman_score(rows.tolist())


def _partial_spearman(rows: np.ndarray, options: RowOptions) -> float:
    return partial_spearman_score(rows.tolist())


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


def auroc_resampled(resampled: np.ndarray, options: RowOptions | None = None) -> np.ndarray:
    """Mann–Whitney AUROC of confidence (column 0) for correct (column 1 = 1) over wrong, per resample:
    (Σ ranks of the correct − n₁(n₁+1)/2) / (n₁·n₀), ties ½ via average ranks; ``nan`` with one class."""
    ranks = _ranks(resampled[..., 0])
    positive = resampled[..., 1] == 1.0
    n_pos = positive.sum(axis=-1)
    n_neg = resampled.shape[-2] - n_pos
    u = (ranks * positive).sum(axis=-1) - n_pos * (n_pos + 1) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n_pos > 0) & (n_neg > 0), u / np.maximum(n_pos * n_neg, 1), np.nan)


def spearman_resampled(resampled: np.ndarray, options: RowOptions | None = None) -> np.ndarray:
    """Spearman ρ of column 0 with column 1 per resample (Pearson of average ranks); ``nan`` for a constant
    side or fewer than 3 documents, as :func:`~lm_eval_probes.probes.correlation.spearman_score`."""
    if resampled.shape[-2] < 3:
        return np.full(resampled.shape[0], np.nan)
    return _row_pearson(_ranks(resampled[..., 0]), _ranks(resampled[..., 1]))


def partial_spearman_resampled(resampled: np.ndarray, options: RowOptions | None = None) -> np.ndarray:
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


Resampled = Callable[[np.ndarray, RowOptions], np.ndarray]


@dataclass(frozen=True)
class CorpusRow:
    """A row recomputable from per-document records of ``width`` numbers.

    ``statistic`` computes it on one ``[n, width]`` record array (the project's function);
    ``resampled`` (optional) on ``[B, n, width]`` at once, else :meth:`on_resamples` loops.
    """

    width: int
    statistic: Statistic
    resampled: Resampled | None = None

    def on_resamples(self, rows: np.ndarray, indices: np.ndarray, options: RowOptions) -> np.ndarray:
        """``[B]`` values of the row on ``rows[indices[b]]`` (``nan`` where undefined; warnings silenced)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self.resampled is not None:
                return np.asarray(self.resampled(rows[indices], options), dtype=float)
            return np.array([self.statistic(rows[i], options) for i in indices], dtype=float)


CONFIDENCE_ROWS: dict[str, CorpusRow] = {
    "ece": CorpusRow(2, _ece),
    "selective_auroc": CorpusRow(2, _auroc, auroc_resampled),
    "aurc": CorpusRow(2, _aurc),
    "selective_acc_50": CorpusRow(2, _coverage(0.5)),
    "selective_acc_80": CorpusRow(2, _coverage(0.8)),
    "corruption_confidence_auroc": CorpusRow(2, _auroc, auroc_resampled),
}

NOT_RECOVERABLE: frozenset[str] = frozenset({"lcr_auroc", "lcr_ece", "corruption_auroc"})
"""Reader rows: samples hold a one-line description of their records, not the features."""

CROSS_FITTED: frozenset[str] = frozenset({"ece_scaled"})
"""Rows fitted out-of-fold inside the aggregation: a bootstrap resample repeats documents, which would land
in training and test folds at once, so these get no interval."""


def corpus_row(name: str) -> CorpusRow | None:
    """The recomputation of row ``name``, or ``None`` for rows that are means, cross-fitted or not recoverable.

    Besides :data:`CONFIDENCE_ROWS`: any ``*_spearman`` row (width 2) and ``*_spearman_partial*`` row
    (width 3), so rows added later under the same naming are covered.
    """
    if name in CONFIDENCE_ROWS:
        return CONFIDENCE_ROWS[name]
    if "_spearman_partial" in name:
        return CorpusRow(3, _partial_spearman, partial_spearman_resampled)
    if name.endswith("_spearman"):
        return CorpusRow(2, _spearman, spearman_resampled)
    return None


def records(samples: Sequence[Mapping[str, Any]], name: str, width: int) -> np.ndarray:
    """``[n, width]`` float array of the documents' records of row ``name``, in samples order.

    Documents without the row, or whose record is not a list of ``width`` numbers (an undefined value
    left out, a null member), or has a non-finite member, are skipped — as the aggregation skips them.
    """
    items = [s[name] for s in samples if isinstance(s.get(name), (list, tuple)) and len(s[name]) == width]
    numeric = [item for item in items if all(v is None or isinstance(v, (int, float)) for v in item)]
    return finite_rows(numeric, width)
