"""Corpus-level rows recomputed from the per-document records of ``--log_samples`` files.

lm_eval gives no standard error for these rows (their aggregation is not ``mean``); the report
recomputes them from the records to bootstrap them, with exactly the aggregation lm_eval ran: which
row holds which record and is aggregated how comes from the one table, :mod:`lm_eval_probes.rows`.
Recomputable rows are those whose per-document value is numbers: ``confidence`` records
``[confidence, correct]`` (``corruption_confidence_auroc``: ``[1 − confidence, noised]``), ``ranked``
``[value, difficulty]`` and ``partial`` ``[value, difficulty, length]``. The reader rows (``lcr_*``,
``corruption_auroc``) are written to samples as one-line strings, so their features are not
recoverable (no CI); ``ece_scaled`` is fitted out-of-fold (:data:`CROSS_FITTED`): no CI either. The
task's ``metadata`` options (``ece_bins``, ``ece_binning``) apply as in the run.
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
from lm_eval_probes.rows import ROWS_BY_NAME, bound_aggregation

RECORD_WIDTHS: dict[str, int] = {"confidence": 2, "ranked": 2, "partial": 3}
"""Per-document value kind of :mod:`lm_eval_probes.rows` → numbers per record (the recomputable kinds)."""

Statistic = Callable[[np.ndarray, CalibrationOptions], float]
"""``statistic(rows, options)``: rows ``[n, width]`` of finite floats → the row's value (``nan`` if undefined)."""


def _aggregation_statistic(name: str) -> Statistic:
    """Row ``name``'s own aggregation (as lm_eval ran it) on a record array; ``nan`` where it is undefined."""

    def statistic(rows: np.ndarray, options: CalibrationOptions) -> float:
        value = bound_aggregation(ROWS_BY_NAME[name], options)(rows.tolist())
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


Resampled = Callable[[np.ndarray, CalibrationOptions], np.ndarray]


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
    "probe_spearman": spearman_resampled,
    "probe_partial_spearman": partial_spearman_resampled,
}
"""Aggregation name → its all-resamples-at-once form (tested equal to the aggregation)."""

NOT_RECOVERABLE: frozenset[str] = frozenset(name for name, row in ROWS_BY_NAME.items() if row.value == "reader")
"""Reader rows: samples hold a one-line description of their records, not the features."""

CROSS_FITTED: frozenset[str] = frozenset(name for name, row in ROWS_BY_NAME.items() if row.value == "confidence_keyed")
"""Rows fitted out-of-fold inside the aggregation: a bootstrap resample repeats documents, which would land
in training and test folds at once, so these get no interval."""


def corpus_row(name: str) -> CorpusRow | None:
    """The recomputation of row ``name``, or ``None`` for rows that are means, counts, cross-fitted, not
    recoverable from samples, or not the plugin's."""
    row = ROWS_BY_NAME.get(name)
    if row is None or row.value not in RECORD_WIDTHS:
        return None
    return CorpusRow(RECORD_WIDTHS[row.value], _aggregation_statistic(name), FAST_RESAMPLED.get(row.aggregation))


def records(samples: Sequence[Mapping[str, Any]], name: str, width: int) -> np.ndarray:
    """``[n, width]`` float array of the documents' records of row ``name``, in samples order.

    Documents without the row, or whose record is not a list of ``width`` numbers (an undefined value
    left out, a null member), or has a non-finite member, are skipped — as the aggregation skips them.
    """
    items = [s[name] for s in samples if isinstance(s.get(name), (list, tuple)) and len(s[name]) == width]
    numeric = [item for item in items if all(v is None or isinstance(v, (int, float)) for v in item)]
    return finite_rows(numeric, width)
