"""Find and parse lm_eval output files: ``results_<date>.json`` and ``samples_<task>_<date>.jsonl``.

lm_eval's ``EvaluationTracker`` writes, per run, ``<output_path>/<model>/results_<date>.json`` and (with
``--log_samples``) one ``samples_<task>_<date>.jsonl`` per task beside it, with the same ``<date>``
(``datetime.now().isoformat()`` with ``:`` replaced by ``-``). This module reads any such files (from a
sweep or from a plain ``lm_eval --model hf-probes --log_samples`` run) into typed records and merges
the runs of one model. No torch, no lm_eval: plain ``json``.

Undefined values: results hold ``null`` (this plugin) or a bare ``NaN`` (lm_eval's ``json.dumps`` of a
float nan, in older files); both are read as ``math.nan`` ("undefined"). A metric a run does not have
is simply absent ("missing"). Neither is ever turned into 0.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS_PATTERN = re.compile(r"^results_(?P<date>.+)\.json$")
SWEEP_KEY = "lm_eval_probes_sweep"
"""Top-level key a sweep adds to each results file: ``{"model": <label from the sweep config>, ...}``."""


@dataclass(frozen=True)
class Metric:
    """One row of one task in a results file.

    Attributes:
        name: metric name (``acc``, ``ece``, ``bte_spearman``, …).
        filter: lm_eval filter name (``none`` for tasks without filters).
        value: the aggregated value; ``math.nan`` when the file holds ``null``/``NaN`` (undefined).
        stderr: lm_eval's standard error, or ``None`` when it gave none (``"N/A"`` or absent).
        higher_is_better: from the results' ``higher_is_better`` block; ``None`` when not stated.
    """

    name: str
    filter: str
    value: float
    stderr: float | None
    higher_is_better: bool | None

    @property
    def key(self) -> tuple[str, str]:
        return self.name, self.filter


@dataclass(frozen=True)
class TaskResult:
    """One task of one run: its rows, its config metadata and its per-document samples (if logged).

    Attributes:
        task: task name.
        date: the run's date id (from the file name; ISO 8601 with ``-`` for ``:``), orders runs.
        results_file: the results JSON it came from.
        samples_file: the ``samples_<task>_<date>.jsonl`` beside it, or ``None`` when not logged.
        metrics: the task's rows, in file order.
        n_documents: documents evaluated (``n-samples.effective``), ``None`` when unknown.
        metadata: the task config's ``metadata`` block (noise operator, ECE binning, …).
        samples: the samples lines (one per document and filter), empty when not logged.
    """

    task: str
    date: str
    results_file: Path
    samples_file: Path | None
    metrics: tuple[Metric, ...]
    n_documents: int | None
    metadata: Mapping[str, Any]
    samples: tuple[Mapping[str, Any], ...] = ()

    def metric(self, name: str, filter_name: str) -> Metric | None:
        for metric in self.metrics:
            if metric.key == (name, filter_name):
                return metric
        return None

    def filters(self) -> list[str]:
        """Filters of this task, ``none`` first, then in file order."""
        seen: list[str] = []
        for metric in self.metrics:
            if metric.filter not in seen:
                seen.append(metric.filter)
        return sorted(seen, key=lambda f: f != "none")

    def samples_of(self, filter_name: str) -> list[Mapping[str, Any]]:
        """The samples lines of one filter (lm_eval writes one line per document and filter)."""
        return [s for s in self.samples if s.get("filter", "none") == filter_name]


@dataclass(frozen=True)
class RunFile:
    """One results file: the model it evaluated and its tasks."""

    path: Path
    date: str
    model_name: str
    model_args: str
    num_parameters: int | None
    tasks: Mapping[str, TaskResult]
    probes_skipped: Mapping[str, str] = field(default_factory=dict)

    @property
    def model_key(self) -> tuple[str, str]:
        """Runs with the same key are the same model and are merged."""
        return self.model_name, self.model_args


@dataclass
class ModelResults:
    """Every task of one model, merged over its runs.

    Attributes:
        name: display name (sweep label, else lm_eval's model name, e.g. the ``pretrained`` value).
        model_args: the canonical ``model_args`` string (items sorted).
        num_parameters: parameter count where lm_eval recorded it (``model_num_parameters``), else ``None``.
        tasks: task name → the newest run of it.
        sources: every results file merged in, sorted.
        replaced: one note per task that appeared in more than one run: which file won (the newest) and
            which were dropped.
        probes_skipped: probe → why ``probes=all`` skipped it on this model (the results' config), over its runs.
    """

    name: str
    model_args: str
    num_parameters: int | None
    tasks: dict[str, TaskResult] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    replaced: list[dict[str, Any]] = field(default_factory=list)
    probes_skipped: dict[str, str] = field(default_factory=dict)


def as_float(value: Any) -> float:
    """A results value as a float: numbers as they are, ``None``/``NaN``/non-numbers as ``nan``."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return math.nan


def _as_stderr(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None  # "N/A", null, absent
    return float(value) if math.isfinite(float(value)) else None


def canonical_model_args(model_args: Any) -> str:
    """``model_args`` (a ``k=v,...`` string or a dict) as one string with its items sorted."""
    if model_args is None:
        return ""
    if isinstance(model_args, Mapping):
        items = [f"{k}={v}" for k, v in model_args.items()]
    else:
        items = [item.strip() for item in str(model_args).split(",") if item.strip()]
    return ",".join(sorted(items))


def find_results_files(paths: Iterable[str | Path]) -> list[Path]:
    """Every ``results_*.json`` under the given folders (recursively) or given directly, sorted.

    Raises:
        FileNotFoundError: a path that does not exist, or no results file at all.
    """
    found: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise FileNotFoundError(f"no such file or folder: {path}")
        if path.is_file():
            if not RESULTS_PATTERN.match(path.name):
                raise FileNotFoundError(f"{path} is not an lm_eval results file (results_<date>.json)")
            found.add(path.resolve())
        else:
            found |= {p.resolve() for p in path.rglob("results_*.json") if RESULTS_PATTERN.match(p.name)}
    if not found:
        raise FileNotFoundError(f"no lm_eval results_*.json under {', '.join(map(str, paths))}")
    return sorted(found)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """One JSON object per non-empty line (bare ``NaN`` accepted, as Python's ``json`` does)."""
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_results_file(path: str | Path) -> RunFile:
    """Parse one ``results_<date>.json`` and the samples files of the same date beside it.

    Raises:
        ValueError: the file is not a results file (no ``results`` block) or not JSON.
    """
    path = Path(path)
    match = RESULTS_PATTERN.match(path.name)
    date = match.group("date") if match else path.stem
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise ValueError(f"{path} has no 'results' block: not an lm_eval results file")
    config = data.get("config") or {}
    sweep = data.get(SWEEP_KEY) or {}
    model_args = canonical_model_args(config.get("model_args"))
    model_name = str(sweep.get("model") or data.get("model_name") or config.get("model") or model_args or "unknown model")
    num_parameters = config.get("model_num_parameters")
    if isinstance(num_parameters, bool) or not isinstance(num_parameters, int) or num_parameters <= 0:
        num_parameters = None
    higher = data.get("higher_is_better") or {}
    n_samples = data.get("n-samples") or {}
    configs = data.get("configs") or {}
    tasks: dict[str, TaskResult] = {}
    for task, rows in data["results"].items():
        if not isinstance(rows, dict):
            continue
        directions = higher.get(task) or {}
        samples_file = path.with_name(f"samples_{task}_{date}.jsonl")
        tasks[task] = TaskResult(
            task=task,
            date=date,
            results_file=path,
            samples_file=samples_file if samples_file.is_file() else None,
            metrics=tuple(_metrics(rows, directions)),
            n_documents=_effective(n_samples.get(task)),
            metadata=dict((configs.get(task) or {}).get("metadata") or {}),
            samples=tuple(read_jsonl(samples_file)) if samples_file.is_file() else (),
        )
    skipped = config.get("probes_skipped")
    skipped = {str(k): str(v) for k, v in skipped.items()} if isinstance(skipped, dict) else {}
    return RunFile(path=path, date=date, model_name=model_name, model_args=model_args,
                   num_parameters=num_parameters, tasks=tasks, probes_skipped=skipped)


def _metrics(rows: Mapping[str, Any], directions: Mapping[str, Any]) -> list[Metric]:
    metrics = []
    for key, value in rows.items():
        if "," not in key:
            continue  # "alias", "name", ...
        name, filter_name = key.split(",", 1)
        if name.endswith("_stderr"):
            continue
        direction = directions.get(name)
        metrics.append(Metric(
            name=name,
            filter=filter_name,
            value=as_float(value),
            stderr=_as_stderr(rows.get(f"{name}_stderr,{filter_name}")),
            higher_is_better=direction if isinstance(direction, bool) else None,
        ))
    return metrics


def _effective(entry: Any) -> int | None:
    if isinstance(entry, Mapping) and isinstance(entry.get("effective"), int):
        return int(entry["effective"])
    return None


def merge_runs(runs: Sequence[RunFile]) -> list[ModelResults]:
    """Merge the runs of each model (same model name and ``model_args``): tasks are unioned; a task
    present in several runs is taken from the newest (by the date in the file name) and the merge is
    noted in ``replaced``. Models come back sorted by name (then ``model_args``), whatever the order and
    dates of their runs: shards of a sweep that finished in any order give the same report.

    Models that share a display name but differ in ``model_args`` stay separate and get the
    ``model_args`` appended to their name.
    """
    models: dict[tuple[str, str], ModelResults] = {}
    for run in sorted(runs, key=lambda r: (r.date, str(r.path))):
        model = models.setdefault(run.model_key, ModelResults(run.model_name, run.model_args, run.num_parameters))
        model.sources.append(str(run.path))
        if model.num_parameters is None:
            model.num_parameters = run.num_parameters
        model.probes_skipped.update(run.probes_skipped)
        for task, result in run.tasks.items():
            previous = model.tasks.get(task)
            if previous is not None:
                model.replaced.append({"task": task, "kept": str(result.results_file),
                                       "dropped": str(previous.results_file), "reason": "newer run of the same task"})
            model.tasks[task] = result  # runs come oldest first: the newest wins
    merged = sorted(models.values(), key=lambda m: (m.name, m.model_args))
    names = [m.name for m in merged]
    for model in merged:
        model.sources.sort()
        if names.count(model.name) > 1:
            model.name = f"{model.name} ({model.model_args})"
    return merged


def read_runs(paths: Iterable[str | Path]) -> list[ModelResults]:
    """:func:`find_results_files` → :func:`read_results_file` each → :func:`merge_runs`."""
    return merge_runs([read_results_file(p) for p in find_results_files(paths)])
