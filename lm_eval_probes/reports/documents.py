"""The documents view's data: per task, every document with each model's response, gold answer, correctness,
confidence, per-document probe values and (``probe_traces=true``) per-token trace, read from the samples files.

The page opens from ``file://``, where a browser fetches no local file, so each task's data is a script file beside the
page that assigns into one global (``window.LEP_DOCUMENTS[<task>] = {...}``) and is added to the page when its view
opens; the traces, the larger part (each holds its logit-lens grid), are further files per task, one per
:data:`TRACE_DOCUMENTS` consecutive documents (``window.LEP_TRACES["<task>#<k>"]``), the one holding a document added
when it is opened. Both are JSON (a subset of JavaScript): the text of a document is a string value, never markup, and the page
inserts it as text. Torch-free.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lm_eval_probes.reports.columns import meaning
from lm_eval_probes.reports.choices import choice_summary, gold_indices, gold_text, options, prompt_text, response_text
from lm_eval_probes.reports.reading import ModelResults
from lm_eval_probes.reports.tables import primary_metric, primary_samples
from lm_eval_probes.rows import rows_by_name

DOCUMENTS_FOLDER = "documents"
DOCUMENTS_GLOBAL = "LEP_DOCUMENTS"
TRACES_GLOBAL = "LEP_TRACES"
UNSAFE = re.compile(r"[^\w.\-]+")
TRACE_DOCUMENTS = 50
"""Documents per traces file: opening a document loads its block's traces (every model's), not the task's."""


def _number(value: Any) -> float | None:
    if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
        return float(value)
    return None


def value_columns(lines: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-document numbers of the samples that the declarations know as ``float`` rows (the confidence, every
    probe's values, the response's length), in the declarations' order."""
    return [row.name for row in rows_by_name().values()
            if row.value == "float" and any(_number(line.get(row.name)) is not None for line in lines)]


def task_documents(models: Sequence[ModelResults], task: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The documents view of ``task``: ``(documents, traces)``, both JSON-native.

    ``documents``: ``task``, ``metric`` (the correctness row), ``models`` (labels, report order), ``columns`` (name,
    description, ``higher_is_better``: the per-document values), ``documents`` (``id``, ``prompt``, ``gold`` (text),
    ``options``, ``gold_options`` (the gold options' indices, or null); by ``doc_id``) and ``pairs``: one ``[model
    index, document index, response (text: a multiple-choice document's chosen option), correct (1/0/null),
    confidence, [values by column], has trace, choices]`` per (model, document), ``choices`` a multiple-choice
    document's ``{"logliks", "chosen"}`` (:func:`~lm_eval_probes.reports.choices.choice_summary`) or null. ``traces``: ``"<model index>:<doc_id>"`` → the
    document's trace as the samples hold it."""
    ran = [m for m in models if task in m.tasks and m.tasks[task].samples]
    primary = next((p for p in (primary_metric(m.tasks[task]) for m in ran) if p is not None), None)
    metric = primary[0] if primary else None
    lines_of = {m.name: primary_samples(m.tasks[task]) for m in ran}
    every = [line for lines in lines_of.values() for line in lines]
    columns = value_columns(every)
    documents: dict[str, dict[str, Any]] = {}
    for line in every:
        key = str(line.get("doc_id", ""))
        if key not in documents:
            documents[key] = {"id": key, "prompt": prompt_text(line), "gold": gold_text(line), "options": options(line),
                              "gold_options": gold_indices(line)}
    order = sorted(documents, key=lambda k: (0, int(k), "") if k.isdigit() else (1, 0, k))
    index = {key: i for i, key in enumerate(order)}
    pairs, traces = [], {}
    for m_index, model in enumerate(ran):
        for line in lines_of[model.name]:
            key = str(line.get("doc_id", ""))
            correct = _number(line.get(primary[0])) if primary else None
            trace = line.get("trace")
            if isinstance(trace, Mapping):
                traces[f"{m_index}:{key}"] = trace
            pairs.append([m_index, index[key], response_text(line, metric), None if correct is None else int(correct),
                          _number(line.get("confidence")), [_number(line.get(c)) for c in columns],
                          int(isinstance(trace, Mapping)), choice_summary(line, metric)])
    described = []
    for name in columns:
        found = meaning(name)
        described.append({"name": name, "description": found.description, "higher_is_better": found.higher_is_better})
    return ({"task": task, "metric": primary[0] if primary else None, "models": [m.name for m in ran],
             "columns": described, "documents": [documents[k] for k in order], "pairs": pairs}, traces)


def documents_file(task: str, index: int) -> str:
    """The file name of a task's documents (its traces: ``.traces-<block>.js``), unique by the task's index."""
    return f"{index:03d}-{UNSAFE.sub('_', task)[:80]}.js"


def script(global_name: str, task: str, data: Any) -> str:
    """``window.<global>[<task>] = <data>;`` — JSON, in which ``</`` cannot close a script element either."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).replace("</", "<\\/")
    return (f"window.{global_name} = window.{global_name} || {{}};\n"
            f"window.{global_name}[{json.dumps(task)}] = {text};\n")


def write_documents(models: Sequence[ModelResults], tasks: Sequence[str], out: Path) -> dict[str, dict[str, Any]]:
    """Write each task's documents (and traces, where any) under ``out/documents/``; returns the page's manifest:
    task → ``{"documents": path, "traces": [path or None per block of TRACE_DOCUMENTS documents] or None,
    "trace_documents": TRACE_DOCUMENTS, "pairs": count}`` (paths relative to ``out``; a block's traces are
    ``window.LEP_TRACES["<task>#<block>"]``). A task whose runs logged no samples has no entry; the script files an
    earlier report left in that folder are removed first."""
    manifest: dict[str, dict[str, Any]] = {}
    folder = out / DOCUMENTS_FOLDER
    for stale in folder.glob("*.js") if folder.is_dir() else ():  # an earlier report's, in the same folder
        stale.unlink()
    for number, task in enumerate(tasks, start=1):
        documents, traces = task_documents(models, task)
        if not documents["pairs"]:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        name = documents_file(task, number)
        (folder / name).write_text(script(DOCUMENTS_GLOBAL, task, documents), encoding="utf-8")
        blocks: list[str | None] | None = None
        if traces:
            index = {doc["id"]: i for i, doc in enumerate(documents["documents"])}
            grouped: dict[int, dict[str, Any]] = {}
            for key, trace in traces.items():
                grouped.setdefault(index[key.split(":", 1)[1]] // TRACE_DOCUMENTS, {})[key] = trace
            blocks = [None] * (max(grouped) + 1)
            for block, part in sorted(grouped.items()):
                traced = name.removesuffix(".js") + f".traces-{block:03d}.js"
                (folder / traced).write_text(script(TRACES_GLOBAL, f"{task}#{block}", part), encoding="utf-8")
                blocks[block] = f"{DOCUMENTS_FOLDER}/{traced}"
        manifest[task] = {"documents": f"{DOCUMENTS_FOLDER}/{name}", "traces": blocks, "trace_documents": TRACE_DOCUMENTS,
                          "pairs": len(documents["pairs"])}
    return manifest
