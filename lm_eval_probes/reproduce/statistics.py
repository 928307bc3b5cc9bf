"""Reading a claim's number from what one ``lm_eval`` run returned: its results rows and its samples.

Nothing is recomputed in a second way: a row's value is the results table's, its interval the report's
percentile bootstrap over documents (:mod:`lm_eval_probes.reports.bootstrap`) of the row's own aggregation on
the documents' records (:mod:`lm_eval_probes.reports.corpus_rows`), and a clean-vs-noised change is the same
statistic on the same resampled twins (document *i* of a noised task is the twin of document *i* of the clean
one). Seeding as the report's: ``SeedSequence([seed, crc32(model label), crc32(task), crc32(filter)])``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lm_eval_probes.metrics.calibration import CalibrationOptions
from lm_eval_probes.reports.bootstrap import (
    DEFAULT_LEVEL,
    ConfidenceInterval,
    model_seed_label,
    percentile_interval,
    resample_indices,
)
from lm_eval_probes.reports.corpus_rows import corpus_row, records
from lm_eval_probes.reproduce.claims import Measurement
from lm_eval_probes.rows import bound_aggregation, rows_by_name


@dataclass(frozen=True)
class Run:
    """What ``lm_eval.simple_evaluate`` returned for a reproduction's tasks, with what the intervals need.

    Attributes:
        results: ``{task: {"<row>,<filter>": value}}`` (lm_eval's ``results``).
        samples: ``{task: [sample, ...]}`` (lm_eval's in-memory ``--log_samples`` entries: each has ``doc_id``,
            ``filter``, the task's metrics and every probe row's per-document value; ``filtered_resps`` still carry
            their records).
        configs: ``{task: task config}`` (lm_eval's ``configs``; the calibration options are its ``metadata``).
        model_label: the model's name in the bootstrap key.
        seed, n_resamples: the bootstrap's seed and resamples.
    """

    results: Mapping[str, Mapping[str, Any]]
    samples: Mapping[str, Sequence[Mapping[str, Any]]]
    configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    model_label: str = "model"
    seed: int = 0
    n_resamples: int = 1000

    def value(self, task: str, row: str, filter_key: str) -> float | None:
        """Row ``row`` of ``task`` under ``filter_key`` from the results table (``None``: absent or undefined)."""
        value = self.results.get(task, {}).get(f"{row},{filter_key}")
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    def documents(self, task: str, filter_key: str) -> list[Mapping[str, Any]]:
        """The task's samples under ``filter_key``, in ``doc_id`` order.

        Raises:
            KeyError: the run has no samples of ``task`` (it was not evaluated with samples).
        """
        if task not in self.samples:
            raise KeyError(f"no samples of task {task!r} in this run (have: {sorted(self.samples)})")
        return sorted((s for s in self.samples[task] if s.get("filter") == filter_key), key=lambda s: s["doc_id"])

    def options(self, task: str) -> CalibrationOptions:
        """The calibration options the task's rows were aggregated with (its ``metadata``)."""
        metadata = self.configs.get(task, {}).get("metadata") or {}
        return CalibrationOptions.from_metadata(metadata)

    def indices(self, n: int, task: str, filter_key: str) -> np.ndarray:
        """``[n_resamples, n]`` resample indices, keyed as the report keys them."""
        return resample_indices(n, n_resamples=self.n_resamples, seed=self.seed,
                                key=(model_seed_label(self.model_label), task, filter_key))


def percentile_ci(values: np.ndarray, n: int) -> ConfidenceInterval:
    """The 95 % percentile interval of a statistic's values on the resamples of ``n`` documents."""
    return percentile_interval(np.asarray(values, dtype=float), n_documents=n, level=DEFAULT_LEVEL)


def measured_with(value: float | None, interval: ConfidenceInterval | None, n: int, note: str = "") -> Measurement:
    """A :class:`Measurement` of ``value`` with ``interval``'s bounds where it is defined."""
    low = interval.low if interval is not None and interval.defined else None
    high = interval.high if interval is not None and interval.defined else None
    return Measurement(value, low, high, n, note)


def row_measurement(run: Run, task: str, row: str, filter_key: str) -> Measurement:
    """Row ``row`` as the results table has it, with the report's bootstrap CI where the row has one (rows
    recomputable from the samples' records; not the reader rows nor the cross-fitted ``ece_scaled``)."""
    value = run.value(task, row, filter_key)
    recompute = corpus_row(row)
    if recompute is None:
        return measured_with(value, None, len(run.documents(task, filter_key)), "no CI: not recomputable from samples")
    rows = records(run.documents(task, filter_key), row, recompute.width)
    if len(rows) == 0:
        return measured_with(value, None, 0, "no document has this row")
    on_resamples = recompute.on_resamples(rows, run.indices(len(rows), task, filter_key), run.options(task))
    return measured_with(value, percentile_ci(on_resamples, len(rows)), len(rows))


def column_mean_measurement(run: Run, task: str, row: str, column: int, filter_key: str, note: str) -> Measurement:
    """Mean over documents of column ``column`` of row ``row``'s records (e.g. a calibration row's
    ``[confidence, correct]``: column 1 is the correctness the row reads), with its bootstrap CI."""
    recompute = corpus_row(row)
    if recompute is None:
        raise ValueError(f"row {row!r} has no numeric per-document records")
    rows = records(run.documents(task, filter_key), row, recompute.width)
    if len(rows) == 0:
        return Measurement(None, n_documents=0, note="no document has this row")
    column_values = rows[:, column]
    resampled = column_values[run.indices(len(rows), task, filter_key)].mean(axis=1)
    return measured_with(float(column_values.mean()), percentile_ci(resampled, len(rows)), len(rows), note)


def _keyed_records(run: Run, task: str, row: str, filter_key: str) -> dict[int, np.ndarray]:
    recompute = corpus_row(row)
    if recompute is None:
        raise ValueError(f"row {row!r} has no numeric per-document records")
    out = {}
    for sample in run.documents(task, filter_key):
        rows = records([sample], row, recompute.width)
        if len(rows):
            out[int(sample["doc_id"])] = rows[0]
    return out


Statistic = Callable[[np.ndarray, CalibrationOptions], float]


def row_statistic(row: str) -> Statistic:
    """Row ``row``'s own aggregation (as lm_eval ran it) on a ``[n, width]`` record array; ``nan`` if undefined.

    Raises:
        KeyError: ``row`` is no row of the plugin (of the probes registered now).
    """
    declared = rows_by_name()[row]

    def statistic(rows: np.ndarray, options: CalibrationOptions) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = bound_aggregation(declared, options)(rows.tolist())
        return math.nan if value is None else float(value)

    return statistic


def column_mean(column: int) -> Statistic:
    """The mean of one record column (accuracy from ``[confidence, correct]``: column 1)."""
    return lambda rows, options: float(rows[:, column].mean()) if len(rows) else math.nan


def paired_change(run: Run, clean: str, noised: str, row: str, filter_key: str, statistic: Statistic,
                  note: str = "") -> Measurement:
    """``statistic(noised) − statistic(clean)`` on row ``row``'s records of the documents both tasks have (twins
    by ``doc_id``), with a paired bootstrap CI (the same resampled documents on both sides)."""
    clean_rows, noised_rows = (_keyed_records(run, task, row, filter_key) for task in (clean, noised))
    common = sorted(set(clean_rows) & set(noised_rows))
    if len(common) < 2:
        return Measurement(None, n_documents=len(common), note="fewer than 2 twin documents")
    a = np.stack([clean_rows[d] for d in common])
    b = np.stack([noised_rows[d] for d in common])
    options = run.options(clean)
    value = statistic(b, options) - statistic(a, options)
    resampled = np.array([statistic(b[i], options) - statistic(a[i], options)
                          for i in run.indices(len(common), noised, filter_key)])
    return measured_with(value if math.isfinite(value) else None, percentile_ci(resampled, len(common)), len(common), note)


def level_means(run: Run, task: str, ranked_row: str, filter_key: str) -> Measurement:
    """Mean of the ranked value per difficulty level, levels ascending, from row ``ranked_row``'s
    ``[value, difficulty]`` records (documents without a label are skipped, as the ρ rows skip them)."""
    rows = records(run.documents(task, filter_key), ranked_row, 2)
    if len(rows) == 0:
        return Measurement(None, n_documents=0, note="no document has a value and a difficulty")
    levels = np.unique(rows[:, 1])
    means = tuple(float(rows[rows[:, 1] == level, 0].mean()) for level in levels)
    counts = ", ".join(f"{level:g}: {int((rows[:, 1] == level).sum())}" for level in levels)
    return Measurement(means, n_documents=len(rows), note=f"documents per level {counts}")


def level_gap(run: Run, task: str, ranked_row: str, filter_key: str) -> Measurement:
    """Mean ranked value of the hardest level minus that of the easiest (from row ``ranked_row``'s
    ``[value, difficulty]`` records), with a bootstrap CI over documents (a resample missing either level is
    undefined)."""
    rows = records(run.documents(task, filter_key), ranked_row, 2)
    levels = np.unique(rows[:, 1]) if len(rows) else np.array([])
    if len(levels) < 2:
        return Measurement(None, n_documents=len(rows), note="fewer than two difficulty levels")
    easy, hard = levels[0], levels[-1]

    def gap(sample: np.ndarray) -> float:
        top, bottom = sample[sample[:, 1] == hard, 0], sample[sample[:, 1] == easy, 0]
        return float(top.mean() - bottom.mean()) if len(top) and len(bottom) else math.nan

    resampled = np.array([gap(rows[i]) for i in run.indices(len(rows), task, filter_key)])
    return measured_with(gap(rows), percentile_ci(resampled, len(rows)), len(rows),
                        f"level {hard:g} − level {easy:g}")
