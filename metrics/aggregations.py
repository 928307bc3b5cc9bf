"""Corpus-level aggregations of per-document probe records (pure numpy/scipy; no torch, no lm_eval).

Each aggregation maps the list of per-document values that ``process_results`` returned for one metric
(gathered across ranks by lm_eval) to one float. Undefined cases warn and return ``nan``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from scipy import stats


class UndefinedMetricWarning(UserWarning):
    """An aggregation was asked for a value that is not defined on its input (returns ``nan``)."""


def _finite_pairs(items: Iterable[Sequence[Any]]) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for item in items:
        if len(item) != 2:
            raise ValueError(f"expected (value, label) pairs, got {item!r}")
        x, y = item
        if x is None or y is None:
            continue
        x, y = float(x), float(y)
        if math.isfinite(x) and math.isfinite(y):
            xs.append(x)
            ys.append(y)
    return np.asarray(xs), np.asarray(ys)


def spearman_score(items: Iterable[Sequence[Any]]) -> float:
    """Spearman ρ between per-document probe values and difficulty labels.

    ``items``: ``(value, difficulty)`` pairs; pairs with a missing or non-finite member are skipped.
    Returns ρ in [-1, 1], or ``nan`` (with :class:`UndefinedMetricWarning`) for fewer than 3 pairs or a
    constant side.
    """
    x, y = _finite_pairs(items)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        warnings.warn(
            f"Spearman rho is undefined for {len(x)} usable pairs (needs >= 3 and both sides non-constant)",
            UndefinedMetricWarning,
            stacklevel=2,
        )
        return math.nan
    return float(stats.spearmanr(x, y).statistic)
