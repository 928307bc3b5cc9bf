"""Percentile bootstrap confidence intervals over documents.

Method (Efron & Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13): draw ``n_resamples``
samples of the n documents with replacement, recompute the row on each, and report the
(1 − level)/2 and (1 + level)/2 quantiles of the recomputed values (``numpy.quantile``, linear
interpolation). A resample on which the row is undefined (AUROC with one class, ρ with a constant
side) is dropped; when fewer than half of the resamples are defined the interval is undefined.

Seeding: the resample indices come from ``numpy.random.default_rng(SeedSequence([seed, key...]))``,
where ``key`` is a stable hash of (model label, task, filter) — what the run evaluated, never where it
was stored: the label is a sweep's model name, or lm_eval's model name with its folders dropped
(:func:`model_seed_label`; a plain run is named after its ``pretrained`` path), and ``model_args`` (which
carry that path) are not part of it. So a run cloned, moved or sharded across machines gets the same
intervals. Every row of one task shares the same resamples, and the interval of a row depends neither on
the order in which the report visits rows nor on the other models. No global random state is touched.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 1000
DEFAULT_LEVEL = 0.95


@dataclass(frozen=True)
class ConfidenceInterval:
    """A bootstrap interval ``[low, high]`` (both ``nan`` when undefined).

    Attributes:
        low, high: the interval bounds.
        level: nominal coverage, e.g. 0.95.
        n_resamples: resamples drawn; ``n_defined`` of them gave a defined value.
        n_documents: documents resampled.
    """

    low: float
    high: float
    level: float
    n_resamples: int
    n_defined: int
    n_documents: int

    @property
    def defined(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def stable_key(*parts: str) -> list[int]:
    """32-bit CRC of each part: a platform- and run-independent seed component (``hash()`` is salted)."""
    return [zlib.crc32(part.encode("utf-8")) for part in parts]


FOLDER_PREFIX = re.compile(r"[^\s,=()/\\]*[/\\]+(?=[^\s,=()/\\])")
"""A path's leading segments (``/abs/``, ``org/``, ``C:\\models\\``) inside a model name, each followed by more name."""
TRAILING_SEPARATOR = re.compile(r"[/\\]+(?=$|[\s,=()])")
"""A path's trailing ``/`` (``/models/m/``)."""


def model_seed_label(name: str) -> str:
    """The model part of the bootstrap key: ``name`` with the folders of every path-like part dropped.

    ``/scratch/u/models/SmolLM2-135M`` → ``SmolLM2-135M``, ``HuggingFaceTB/SmolLM2-135M`` → ``SmolLM2-135M``,
    ``m (dtype=float32,pretrained=/a/b/m/)`` → ``m (dtype=float32,pretrained=m)``; a sweep label (no ``/``)
    is returned as is. Two names that differ only in folders share their resamples, which is harmless:
    each model's interval still depends only on its own documents.
    """
    return FOLDER_PREFIX.sub("", TRAILING_SEPARATOR.sub("", name))


def resample_indices(n_documents: int, *, n_resamples: int, seed: int, key: Sequence[str]) -> np.ndarray:
    """``[n_resamples, n_documents]`` int indices drawn with replacement, reproducible from (seed, key).

    Raises:
        ValueError: ``n_resamples`` < 1 or ``n_documents`` < 0.
    """
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if n_documents < 0:
        raise ValueError(f"n_documents must be >= 0, got {n_documents}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), *stable_key(*key)]))
    return rng.integers(0, max(n_documents, 1), size=(n_resamples, n_documents))


def percentile_interval(values: np.ndarray, *, n_documents: int, level: float = DEFAULT_LEVEL) -> ConfidenceInterval:
    """Percentile interval of a row's values on the resamples (``nan`` = undefined on that resample).

    Args:
        values: ``[B]`` the row recomputed on each resample.
        n_documents: documents resampled (recorded; fewer than 2 gives an undefined interval).
        level: nominal coverage in (0, 1).

    Returns:
        ``[quantile((1 − level)/2), quantile((1 + level)/2)]`` of the defined values; undefined (``nan``
        bounds) for n < 2 or fewer than B/2 defined resamples.

    Raises:
        ValueError: ``level`` outside (0, 1) or ``values`` not 1-D and non-empty.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"values must be a non-empty 1-D array, got shape {values.shape}")
    n_resamples = values.size
    defined = values[np.isfinite(values)]
    if n_documents < 2 or len(defined) * 2 < n_resamples:
        return ConfidenceInterval(math.nan, math.nan, level, n_resamples, len(defined), n_documents)
    low, high = np.quantile(defined, [(1 - level) / 2, (1 + level) / 2])
    return ConfidenceInterval(float(low), float(high), level, n_resamples, len(defined), n_documents)
