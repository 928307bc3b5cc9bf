"""Per-document details as Parquet, laid out like the Open LLM Leaderboard's details datasets.

Under ``details/`` in the report folder: one folder per model (its name with ``/`` as ``__``, as the leaderboard
names ``org__model``), in it one ``samples_<task>.parquet`` per task (no run date in the name, so that a run moved,
cloned or sharded gives the same folder; the date of the run the report kept is the dataset card's split name),
one row per document of the task's correctness filter: ``doc_id``, ``filter``, lm_eval's hashes (``doc_hash``,
``prompt_hash``, ``target_hash``), ``target`` (as lm_eval wrote it: an option's index is ``"1"``), ``gold`` (the gold
answer's text: a multiple-choice document's gold option), ``response`` (the generated text, or the chosen option's text
for a multiple-choice task), ``choices`` and ``choice_logliks`` (a multiple-choice document's options and each one's
log-likelihood; null for a generation: :mod:`~lm_eval_probes.reports.choices` reads lm_eval's strings), ``correct`` (the correctness row's value), lm_eval's ``arguments``, ``resps`` and
``filtered_resps`` (as JSON text, as in the leaderboard's files), every metric lm_eval scored on the document, and
every per-document probe value (numbers as float64, records such as ``[confidence, correct]`` as lists of float64,
anything else as JSON text). A ``README.md`` beside them is a dataset card whose ``configs`` name each model and task
(``<model>__<task>``) with one split per run date and ``latest``, so the folder is a Hugging Face dataset as it is::

    datasets.load_dataset("parquet", data_files="details/<model>/samples_<task>.parquet")
    datasets.load_dataset("details", "<model>__<task>", split="latest")

Written through ``pyarrow`` (installed with lm_eval's ``datasets``); torch-free.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lm_eval_probes.reports.choices import gold_text, option_logliks, options, response_text
from lm_eval_probes.reports.reading import ModelResults, TaskResult
from lm_eval_probes.reports.tables import primary_metric
from lm_eval_probes.rows import rows_by_name

DETAILS_FOLDER = "details"
UNSAFE = re.compile(r"[^\w.\-]+")


def model_folder(name: str) -> str:
    """A model's folder: ``org/model`` → ``org__model`` (the leaderboard's naming), other unsafe characters ``_``."""
    return UNSAFE.sub("_", name.strip().strip("/").replace("/", "__")) or "model"


def split_name(date: str) -> str:
    """A run date as a dataset split name (letters, digits, ``_`` and ``.``; the leaderboard's form)."""
    return re.sub(r"[^\w.]", "_", date)


def _number(value: Any) -> float | None:
    if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
        return float(value)
    return None


def _column_kind(values: Sequence[Any]) -> str:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, (bool, int, float)) for v in present):
        return "number"
    if present and all(isinstance(v, (list, tuple)) and all(x is None or isinstance(x, (bool, int, float)) for x in v)
                       for v in present):
        return "numbers"
    return "json"


def details_table(result: TaskResult) -> Any:
    """The task's documents (its correctness filter) as a ``pyarrow.Table``."""
    import pyarrow as pa

    primary = primary_metric(result)
    metric, filter_name = primary if primary else (None, None)
    lines = [s for s in result.samples if filter_name is None or s.get("filter", "none") == filter_name]
    scored = sorted({m for line in lines for m in (line.get("metrics") or []) if isinstance(m, str)})
    probes = [name for name in rows_by_name() if any(name in line for line in lines) and name not in scored]
    columns: dict[str, Any] = {
        "doc_id": pa.array([str(line.get("doc_id", "")) for line in lines], pa.string()),
        "filter": pa.array([str(line.get("filter", "none")) for line in lines], pa.string()),
        **{key: pa.array([None if line.get(key) is None else str(line[key]) for line in lines], pa.string())
           for key in ("doc_hash", "prompt_hash", "target_hash")},
        "target": pa.array([None if line.get("target") is None else str(line["target"]) for line in lines], pa.string()),
        "gold": pa.array([gold_text(line) for line in lines], pa.string()),
        "response": pa.array([response_text(line, metric) for line in lines], pa.string()),
        "choices": pa.array([options(line) or None for line in lines], pa.list_(pa.string())),
        "choice_logliks": pa.array([option_logliks(line) for line in lines], pa.list_(pa.float64())),
        "correct": pa.array([_number(line.get(primary[0])) if primary else None for line in lines], pa.float64()),
        **{key: pa.array([json.dumps(line.get(key), ensure_ascii=False) for line in lines], pa.string())
           for key in ("arguments", "resps", "filtered_resps")},
    }
    for name in [*scored, *probes]:
        if name in columns:
            continue
        values = [line.get(name) for line in lines]
        kind = _column_kind(values)
        if kind == "number":
            columns[name] = pa.array([_number(v) for v in values], pa.float64())
        elif kind == "numbers":
            columns[name] = pa.array([None if v is None else [_number(x) for x in v] for v in values],
                                     pa.list_(pa.float64()))
        else:
            columns[name] = pa.array([None if v is None else json.dumps(v, ensure_ascii=False) for v in values],
                                     pa.string())
    return pa.table(columns)


def write_details(models: Sequence[ModelResults], out: Path) -> dict[tuple[str, str], Path]:
    """Write every model's tasks with samples under ``out/details/``; returns (model, task) → the Parquet file."""
    import pyarrow.parquet as pq

    written: dict[tuple[str, str], Path] = {}
    root = out / DETAILS_FOLDER
    configs = []
    for model in models:
        for task, result in sorted(model.tasks.items()):
            if not result.samples:
                continue
            path = root / model_folder(model.name) / f"samples_{task}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(details_table(result), path)
            written[(model.name, task)] = path
            relative = path.relative_to(root).as_posix()
            configs.append((f"{model_folder(model.name)}__{task}", split_name(result.date), relative))
    if configs:
        (root / "README.md").write_text(dataset_card(configs), encoding="utf-8")
    return written


def dataset_card(configs: Sequence[tuple[str, str, str]]) -> str:
    """A dataset card whose YAML ``configs`` name each (model, task) with its run's split and ``latest``."""
    lines = ["---", "configs:"]
    for name, split, path in configs:
        lines += [f"- config_name: {json.dumps(name)}", "  data_files:",
                  f"  - split: {json.dumps(split)}", f"    path: {json.dumps(path)}",
                  "  - split: latest", f"    path: {json.dumps(path)}"]
    lines += ["---", "", "# Per-document details", "",
              "Written by `lm-eval-probes report`: one Parquet file per model and task, one row per document (lm_eval's "
              "hashes, target, response, correctness, every metric and per-document probe value), laid out like the "
              "Open LLM Leaderboard's details datasets. Load one with "
              "`datasets.load_dataset(\"parquet\", data_files=PATH)`, or this folder with "
              "`datasets.load_dataset(FOLDER, CONFIG, split=\"latest\")`.", ""]
    return "\n".join(lines)
