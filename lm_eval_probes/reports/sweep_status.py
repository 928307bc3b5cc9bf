"""The sweep's record of what it attempted: models × tasks that have no result stay visible in the report.

``lm-eval-probes sweep`` writes into its output folder ``runs/<model>/<task>/`` (the results), ``status/<model>__<task>.json``
(one record per pair and attempt: ``{"model", "task", "state", "finished_at", "error"?, ...}``) and
``sweep_status.json`` (``{"output_dir", "counts", "pairs": [that record per pair, "state" resolved to done / failed /
pending]}``; :mod:`lm_eval_probes.sweep.store`). When a folder given to the report is such an output folder or its
``runs/`` folder, the report reads both (a status file is the newer record of its pair; fields other than
``model``, ``task``, ``state`` and ``error`` are ignored, so the sweep may add more) and lists every pair that was
attempted — any state but ``done`` and ``pending`` — and has no result in the runs read, with the first line of its
error. Such pairs take no rank and count in no win rate.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm_eval_probes.reports.reading import ModelResults

logger = logging.getLogger(__name__)

STATUS_SUMMARY = "sweep_status.json"
STATUS_FOLDER = "status"
NOT_ATTEMPTED = frozenset({"done", "pending"})
ERROR_LENGTH = 300
"""An error is shown as its first line, cut to this many characters."""


@dataclass(frozen=True)
class FailedPair:
    """A model × task the sweep attempted that has no result: ``error`` is its one-line error."""

    model: str
    task: str
    error: str

    def to_json(self) -> dict[str, str]:
        return {"model": self.model, "task": self.task, "error": self.error}


def one_line(error: Any) -> str:
    """The first non-empty line of an error message, at most :data:`ERROR_LENGTH` characters."""
    lines = [line.strip() for line in str(error or "").splitlines() if line.strip()]
    if not lines:
        return "failed (no error recorded)"
    first = lines[0]
    return first if len(first) <= ERROR_LENGTH else first[:ERROR_LENGTH - 1] + "…"


def sweep_folders(run_dirs: Iterable[str | Path]) -> list[Path]:
    """The sweep output folders among the given folders and their parents (a folder holding ``sweep_status.json``
    or ``status/``), each once, in order."""
    found: list[Path] = []
    for raw in run_dirs:
        path = Path(raw)
        if not path.is_dir():
            continue
        for folder in (path, path.parent):
            if ((folder / STATUS_SUMMARY).is_file() or (folder / STATUS_FOLDER).is_dir()) and folder.resolve() not in found:
                found.append(folder.resolve())
    return found


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        logger.warning("skipping unreadable sweep status %s: %s", path, error)
        return None


def sweep_records(folder: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """``{(model, task): record}`` from ``sweep_status.json``, each updated by its newer ``status/*.json``."""
    records: dict[tuple[str, str], dict[str, Any]] = {}
    summary = _read_json(folder / STATUS_SUMMARY) if (folder / STATUS_SUMMARY).is_file() else None
    pairs = summary.get("pairs") if isinstance(summary, dict) else None
    for entry in pairs if isinstance(pairs, list) else ():
        if isinstance(entry, dict) and isinstance(entry.get("model"), str) and isinstance(entry.get("task"), str):
            records[(entry["model"], entry["task"])] = dict(entry)
    for path in sorted((folder / STATUS_FOLDER).glob("*.json")) if (folder / STATUS_FOLDER).is_dir() else ():
        entry = _read_json(path)
        if isinstance(entry, dict) and isinstance(entry.get("model"), str) and isinstance(entry.get("task"), str):
            key = (entry["model"], entry["task"])
            records[key] = {**records.get(key, {}), **entry}
    return records


def failed_pairs(run_dirs: Iterable[str | Path], models: Sequence[ModelResults]) -> tuple[FailedPair, ...]:
    """Every pair a sweep behind ``run_dirs`` attempted without a result among ``models``, sorted by model, task."""
    have = {(m.name, task) for m in models for task in m.tasks}
    failed: dict[tuple[str, str], FailedPair] = {}
    for folder in sweep_folders(run_dirs):
        for (model, task), entry in sweep_records(folder).items():
            state = str(entry.get("state", ""))
            if state in NOT_ATTEMPTED or (model, task) in have:
                continue
            error = entry.get("error") or (f"state {state!r}" if state else None)
            failed[(model, task)] = FailedPair(model, task, one_line(error))
    return tuple(failed[key] for key in sorted(failed))
