"""Means per difficulty level, with percentile bootstrap intervals over each level's documents.

For every task whose samples carry a difficulty label (the second member of a ρ row's ``[value, difficulty]``
records), every model and every metric of :func:`level_metrics` — correctness, confidence and each probe's
headline value — :func:`level_means` gives, per level, the number of documents with a defined value, their mean
and its interval: the :mod:`~lm_eval_probes.reports.bootstrap` percentile interval of the mean over resamples of
that level's documents (seeded by the model's label, the task, the metric and the level; never by a path). The
report draws them as the "against difficulty" figures (points with error bars), lists correctness per level in
``leaderboard.md`` and writes every entry into ``summary.json`` (``by_level``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lm_eval_probes import registry
from lm_eval_probes.declarations import CONFIDENCE
from lm_eval_probes.reports.bootstrap import model_seed_label, percentile_interval, resample_indices
from lm_eval_probes.reports.reading import ModelResults
from lm_eval_probes.reports.tables import BootstrapSettings, markdown_escape, primary_metric
from lm_eval_probes.rows import all_rows

CORRECT = "correct"
"""The correctness metric of :func:`level_metrics`: each task's own (``acc``, ``exact_match``, …)."""


def level_metrics() -> tuple[tuple[str, str], ...]:
    """(metric, its label on a figure axis): the task's correctness, confidence and the headline value of each probe
    registered now."""
    return (
        (CORRECT, "accuracy"), (CONFIDENCE.name, "confidence"),
        *((probe.row("float").name, probe.label) for probe in registry.probes() if probe.rows),
    )


def difficulty_sources() -> tuple[str, ...]:
    """Rows whose ``[value, difficulty]`` records carry a document's difficulty label (of the probes registered
    now)."""
    return tuple(row.name for row in all_rows() if row.value == "ranked")


@dataclass(frozen=True)
class LevelMean:
    """One metric's mean over the documents of one difficulty level (``low``/``high``: ``nan`` when undefined)."""

    task: str
    model: str
    metric: str
    level: float
    n: int
    mean: float
    low: float
    high: float

    def to_json(self) -> dict[str, Any]:
        def number(value: float) -> float | None:
            return value if math.isfinite(value) else None

        level: float | int = int(self.level) if float(self.level).is_integer() else self.level
        return {"task": self.task, "model": self.model, "metric": self.metric, "level": level, "n": self.n,
                "mean": number(self.mean), "ci_low": number(self.low), "ci_high": number(self.high)}


def document_difficulties(samples: Sequence[Mapping[str, Any]]) -> list[float | None]:
    """Each sample's difficulty label, from the second member of its first ``[value, difficulty]`` record
    (:func:`difficulty_sources`); ``None`` when the document has none."""
    sources = difficulty_sources()
    out: list[float | None] = []
    for sample in samples:
        label = None
        for name in sources:
            record = sample.get(name)
            if isinstance(record, (list, tuple)) and len(record) == 2 and isinstance(record[1], (int, float)):
                label = float(record[1])
                break
        out.append(label)
    return out


def document_value(sample: Mapping[str, Any], metric: str, correctness: str) -> float:
    """The sample's value of ``metric`` (:data:`CORRECT`: of the task's ``correctness`` row); ``nan`` when absent
    or not a finite number."""
    value = sample.get(correctness if metric == CORRECT else metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        return math.nan
    return float(value)


def level_means(models: Sequence[ModelResults], settings: BootstrapSettings) -> list[LevelMean]:
    """Every (task, model, metric, level) mean with its interval, in task, model, metric and level order; a
    metric without a defined value on a level has no entry for it."""
    out = []
    metrics = level_metrics()
    for task in sorted({name for model in models for name in model.tasks}):
        for model in models:
            result = model.tasks.get(task)
            primary = primary_metric(result) if result is not None else None
            if primary is None:
                continue
            samples = result.samples_of(primary[1])
            levels = document_difficulties(samples)
            if all(level is None for level in levels):
                continue
            for metric, _ in metrics:
                values = np.array([document_value(sample, metric, primary[0]) for sample in samples])
                for level in sorted({level for level in levels if level is not None}):
                    kept = values[[lv == level and math.isfinite(v) for lv, v in zip(levels, values)]]
                    if not kept.size:
                        continue
                    indices = resample_indices(kept.size, n_resamples=settings.n_resamples, seed=settings.seed,
                                               key=(model_seed_label(model.name), task, metric, f"level={level:g}"))
                    ci = percentile_interval(kept[indices].mean(axis=1), n_documents=kept.size, level=settings.level)
                    out.append(LevelMean(task, model.name, metric, level, int(kept.size), float(kept.mean()),
                                         ci.low, ci.high))
    return out


def level_markdown(means: Sequence[LevelMean], models: Sequence[str], *, decimals: int = 3) -> str:
    """Per task, correctness per level: one row per level, one column per model (``mean [low, high] (n)``)."""
    parts = []
    for task in sorted({m.task for m in means if m.metric == CORRECT}):
        found = {(m.model, m.level): m for m in means if m.task == task and m.metric == CORRECT}
        shown = [model for model in models if any(key[0] == model for key in found)]
        parts += [f"**{markdown_escape(task)}**", "", "| level | " + " | ".join(map(markdown_escape, shown)) + " |", "|---" * (len(shown) + 1) + "|"]
        for level in sorted({key[1] for key in found}):
            cells = []
            for model in shown:
                entry = found.get((model, level))
                if entry is None:
                    cells.append("—")
                    continue
                interval = (f" [{entry.low:.{decimals}f}, {entry.high:.{decimals}f}]"
                            if math.isfinite(entry.low) else "")
                cells.append(f"{entry.mean:.{decimals}f}{interval} ({entry.n})")
            parts.append(f"| {level:g} | " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts).strip()
