"""Rank intervals and tie groups: which models a benchmark can tell apart.

A leaderboard's positions 1, 2, 3 read as an order even where the documents cannot separate the models. Per task
(and for the overview), each model's rank is recomputed on paired bootstrap resamples of the documents every
ranked model ran:

* **Documents**: those (by ``doc_id``) on which every ranked model has a finite value of the task's correctness
  row (its filter) in its samples; a model without samples for the task takes no rank there.
* **Resamples**: ``n_resamples`` draws of those documents with replacement, the same draw for every model, from
  ``SeedSequence([seed, crc32("ranks"), crc32(task), crc32(filter)])`` (:func:`.bootstrap.resample_indices`):
  recorded in ``summary.json``, independent of the models and of any path.
* **Rank on a resample**: 1 + the number of models whose mean on it is strictly better (in the row's direction),
  so models with equal means share the better rank (two exact copies are both rank 1 on every resample).
* **Rank interval**: the (1 − level)/2 and (1 + level)/2 quantiles of a model's ranks over the resamples
  (``numpy.quantile`` with ``method="lower"`` / ``"higher"``: whole ranks), e.g. "rank 1–3" at level 0.95.
  ``rank`` is the rank on all the shared documents.
* **Tie groups**: models sorted by their interval; a model whose interval starts after the highest rank of
  the group so far opens the next group (the groups are the connected runs of overlapping intervals). Models in
  one group cannot be told apart by this benchmark at this level; a model alone in its group is separated from
  every other model.
* **Overview** (task name :data:`OVERVIEW_TASK`): every ranked model, on the counted tasks (those in the win rate)
  that all of them ran with samples, by the mean over those tasks of its correctness row (a lower-is-better row
  enters negated), each task resampled as above (its own documents and draws), the same draw for every model.
  When no counted task was run by all of them: the models that ran every counted task, on all of them.

Torch-free: numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lm_eval_probes.reports.bootstrap import resample_indices
from lm_eval_probes.reports.reading import ModelResults

OVERVIEW_TASK = "(overview)"
"""The ``task`` of the overview's ranks in ``summary.json``, the CSV and the Markdown (no lm_eval task name holds
parentheses)."""
RANK_KEY = "ranks"
TIE_TOLERANCE = 1e-12
"""Means closer than this (relative to 1) are equal: they share a rank."""


@dataclass(frozen=True)
class RankInterval:
    """One model's rank on one task (or :data:`OVERVIEW_TASK`).

    Attributes:
        rank: on all the shared documents (1 = best; equal means share the better rank).
        rank_low, rank_high: the bootstrap interval of the rank (whole ranks, ``rank_low <= rank_high``).
        group: the tie group (1 = the best group); models of one group cannot be told apart.
        n_documents: the shared documents resampled (for the overview: summed over its tasks).
        n_models: models ranked together.
    """

    task: str
    model: str
    rank: int
    rank_low: int
    rank_high: int
    group: int
    n_documents: int
    n_models: int

    @property
    def text(self) -> str:
        """``3`` or ``1–3``."""
        return str(self.rank_low) if self.rank_low == self.rank_high else f"{self.rank_low}–{self.rank_high}"

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "model": self.model, "rank": self.rank, "rank_low": self.rank_low,
                "rank_high": self.rank_high, "group": self.group, "n_documents": self.n_documents,
                "n_models": self.n_models}


def ranks_of(scores: np.ndarray) -> np.ndarray:
    """``[..., m]`` scores (higher is better) → ranks 1 + #{models strictly better}, along the last axis."""
    scores = np.asarray(scores, dtype=float)
    better = scores[..., None, :] > scores[..., :, None] + TIE_TOLERANCE * np.maximum(1.0, np.abs(scores[..., :, None]))
    return 1 + better.sum(axis=-1)


def tie_groups(low: Sequence[int], high: Sequence[int], order: Sequence[int]) -> list[int]:
    """Group numbers (1-based) of intervals ``[low[i], high[i]]`` visited in ``order`` (sorted by their low end):
    an interval that starts after the highest end so far opens a new group."""
    groups = [0] * len(low)
    group, reach = 0, -math.inf
    for i in order:
        if low[i] > reach:
            group += 1
        reach = max(reach, high[i])
        groups[i] = group
    return groups


def rank_intervals(task: str, models: Sequence[str], resampled_scores: np.ndarray, point_scores: np.ndarray, *,
                   level: float, n_documents: int) -> list[RankInterval]:
    """The rank interval and tie group of each model.

    Args:
        models: the ranked models, ``m`` of them.
        resampled_scores: ``[B, m]`` each model's score on each resample (higher is better).
        point_scores: ``[m]`` the scores on all the shared documents.
        level: interval coverage in (0, 1).

    Returns:
        One :class:`RankInterval` per model, best first (by rank, then interval, then name).
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    ranks = ranks_of(resampled_scores)
    point = ranks_of(point_scores)
    low = np.quantile(ranks, (1 - level) / 2, axis=0, method="lower").astype(int)
    high = np.quantile(ranks, (1 + level) / 2, axis=0, method="higher").astype(int)
    order = sorted(range(len(models)), key=lambda i: (low[i], point[i], high[i], models[i]))
    groups = tie_groups(low.tolist(), high.tolist(), order)
    return [RankInterval(task, models[i], int(point[i]), int(low[i]), int(high[i]), groups[i], n_documents, len(models))
            for i in order]


def _document_values(model: ModelResults, task: str, metric: str, filter_name: str) -> dict[Any, float] | None:
    result = model.tasks.get(task)
    if result is None or not result.samples:
        return None
    values = {}
    for line in result.samples_of(filter_name):
        value = line.get(metric)
        if "doc_id" in line and isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            values[line["doc_id"]] = float(value)
    return values or None


@dataclass(frozen=True)
class _TaskScores:
    """The shared documents' values ``[m, n]`` of the ranked models on one task (sign: higher is better)."""

    models: tuple[str, ...]
    values: np.ndarray
    indices: np.ndarray


def _task_scores(models: Sequence[ModelResults], task: str, metric: str, filter_name: str, higher_is_better: bool | None,
                 *, n_resamples: int, seed: int) -> _TaskScores | None:
    by_model = {m.name: v for m in models if (v := _document_values(m, task, metric, filter_name)) is not None}
    if len(by_model) < 1:
        return None
    shared = set.intersection(*(set(v) for v in by_model.values()))
    documents = sorted(shared, key=lambda d: (str(type(d)), d))
    if not documents:
        return None
    sign = -1.0 if higher_is_better is False else 1.0
    names = tuple(by_model)
    values = sign * np.array([[by_model[name][d] for d in documents] for name in names], dtype=float)
    indices = resample_indices(len(documents), n_resamples=n_resamples, seed=seed, key=(RANK_KEY, task, filter_name))
    return _TaskScores(names, values, indices)


@dataclass(frozen=True)
class RankColumn:
    """A task's correctness row to rank on (the overview's columns)."""

    task: str
    metric: str
    filter: str
    higher_is_better: bool | None
    counted: bool = True


def rank_table(models: Sequence[ModelResults], columns: Sequence[RankColumn], *, n_resamples: int, seed: int,
               level: float) -> tuple[RankInterval, ...]:
    """Every task's rank intervals (its models with samples), then the overview's (:data:`OVERVIEW_TASK`: the models
    with samples for every counted task, by the mean of their sign-adjusted correctness over those tasks)."""
    out: list[RankInterval] = []
    scored: dict[str, _TaskScores] = {}
    for column in columns:
        found = _task_scores(models, column.task, column.metric, column.filter, column.higher_is_better,
                             n_resamples=n_resamples, seed=seed)
        if found is None:
            continue
        scored[column.task] = found
        resampled = np.stack([found.values[:, idx].mean(axis=-1) for idx in found.indices])  # [B, m]
        out += rank_intervals(column.task, found.models, resampled, found.values.mean(axis=-1), level=level,
                              n_documents=found.values.shape[1])
    ranked = {name for found in scored.values() for name in found.models}
    counted = [c for c in columns if c.counted and c.task in scored]
    complete = [c for c in counted if ranked <= set(scored[c.task].models)] or counted
    everywhere = [m.name for m in models if complete and all(m.name in scored[c.task].models for c in complete)]
    if everywhere:
        kept = [m for m in models if m.name in everywhere]
        tasks = [t for c in complete if (t := _task_scores(kept, c.task, c.metric, c.filter, c.higher_is_better,
                                                             n_resamples=n_resamples, seed=seed)) is not None]
        columns_of = [[t.models.index(name) for name in everywhere] for t in tasks]
        resampled = np.mean([np.stack([t.values[:, idx].mean(axis=-1) for idx in t.indices])[:, at]
                             for t, at in zip(tasks, columns_of)], axis=0)
        point = np.mean([t.values.mean(axis=-1)[at] for t, at in zip(tasks, columns_of)], axis=0)
        out += rank_intervals(OVERVIEW_TASK, everywhere, resampled, point, level=level,
                              n_documents=sum(t.values.shape[1] for t in tasks))
    return tuple(out)


def ranks_by_task(ranks: Sequence[RankInterval]) -> dict[str, dict[str, RankInterval]]:
    """``{task: {model: RankInterval}}``."""
    out: dict[str, dict[str, RankInterval]] = {}
    for rank in ranks:
        out.setdefault(rank.task, {})[rank.model] = rank
    return out


def group_text(rank: RankInterval | None, ranks: Mapping[str, RankInterval]) -> str:
    """``alone`` or ``tied with 2 others`` (``—`` when the model has no rank)."""
    if rank is None:
        return "—"
    others = sum(1 for r in ranks.values() if r.group == rank.group and r.model != rank.model)
    return "alone" if not others else f"tied with {others} other{'s' if others > 1 else ''}"
