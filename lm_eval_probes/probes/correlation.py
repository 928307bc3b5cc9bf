"""Rank correlations of per-document probe values with difficulty (pure numpy/scipy; no torch, no lm_eval).

Each function maps a list of per-document records (as ``process_results`` returns them and lm_eval
gathers them across ranks, or as a ``--log_samples`` file holds them) to one float. Undefined cases
warn :class:`UndefinedMetricWarning` and return ``nan``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from scipy import stats
from sklearn.exceptions import UndefinedMetricWarning  # one warning class for every undefined metric

__all__ = ["UndefinedMetricWarning", "count", "finite_rows", "partial_spearman_score", "spearman_score"]


def finite_rows(items: Iterable[Sequence[Any]], width: int) -> np.ndarray:
    """``[n, width]`` float array of the items whose members are all present and finite."""
    rows = []
    for item in items:
        if len(item) != width:
            raise ValueError(f"expected records of {width} values, got {item!r}")
        if any(v is None for v in item):
            continue
        row = [float(v) for v in item]
        if all(math.isfinite(v) for v in row):
            rows.append(row)
    return np.asarray(rows, dtype=float).reshape(-1, width)


COLUMNS: tuple[str, ...] = ("probe value", "difficulty", "length")
"""What the columns of a ``ranked`` / ``partial`` record hold (named in the undefined-metric warnings)."""


def undefined_cause(rows: np.ndarray) -> str | None:
    """Why a rank correlation of ``rows`` (``[n, k]``, finite) is undefined, in words; ``None`` when it is not:
    fewer than 3 records, or a column that takes one value only (e.g. every document has the same difficulty)."""
    if len(rows) < 3:
        return f"only {len(rows)} document(s) have a finite {' and '.join(COLUMNS[:rows.shape[1]])} (needs >= 3)"
    for column in range(rows.shape[1]):
        if np.ptp(rows[:, column]) == 0:
            return f"the {COLUMNS[column]} is the same ({rows[0, column]:g}) for all {len(rows)} documents"
    return None


def _undefined(what: str, cause: str) -> float:
    warnings.warn(f"{what} is undefined: {cause}", UndefinedMetricWarning, stacklevel=3)
    return math.nan


def spearman_score(items: Iterable[Sequence[Any]]) -> float:
    """Spearman ρ between per-document probe values and difficulty labels.

    ``items``: ``(value, difficulty)`` pairs; pairs with a missing or non-finite member are skipped.
    Returns ρ in [-1, 1], or ``nan`` (with :class:`UndefinedMetricWarning`) for fewer than 3 pairs or a
    constant side.
    """
    rows = finite_rows(items, 2)
    cause = undefined_cause(rows)
    if cause is not None:
        return _undefined("Spearman rho", cause)
    return float(stats.spearmanr(rows[:, 0], rows[:, 1]).statistic)


def partial_spearman_score(items: Iterable[Sequence[Any]]) -> float:
    """Spearman ρ between a probe value and difficulty with response length partialled out.

    ``items``: ``(value, difficulty, length)`` records (incomplete or non-finite ones skipped). The three
    columns are ranked (average ranks for ties) and the partial correlation of the ranks is
    ρ_xy·z = (ρ_xy − ρ_xz ρ_yz) / √((1 − ρ_xz²)(1 − ρ_yz²)). Returns a value in [-1, 1], or ``nan``
    (with :class:`UndefinedMetricWarning`) for fewer than 3 records, a constant value or difficulty, or
    a value or difficulty that length explains perfectly. A constant length (one-token answers) controls
    for nothing: the result is then the plain Spearman ρ.
    """
    rows = finite_rows(items, 3)
    if len(rows) >= 3 and np.ptp(rows[:, 2]) == 0:  # a constant length controls for nothing
        return spearman_score(rows[:, :2].tolist())
    cause = undefined_cause(rows)
    if cause is not None:
        return _undefined("partial Spearman rho", cause)
    rho = stats.spearmanr(rows).statistic  # 3x3 rank-correlation matrix
    r_xy, r_xz, r_yz = rho[0, 1], rho[0, 2], rho[1, 2]
    denominator = math.sqrt(max(0.0, (1 - r_xz**2) * (1 - r_yz**2)))
    if denominator == 0:
        return _undefined("partial Spearman rho", f"the length ranks the {'probe value' if abs(r_xz) == 1 else 'difficulty'} "
                                                  f"exactly (|rho| = 1) over the {len(rows)} documents, so nothing is left "
                                                  "once it is partialled out")
    return float(np.clip((r_xy - r_xz * r_yz) / denominator, -1.0, 1.0))


def count(items: Iterable[Any]) -> float:
    """Sum of per-document 0/1 flags (e.g. documents without a difficulty label)."""
    return float(sum(float(v) for v in items))
