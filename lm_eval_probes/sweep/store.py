"""The sweep's files: each pair's folder (moved into place atomically when it finishes) and its status record."""

from __future__ import annotations

import json
import os
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lm_eval_probes.sweep.config import SweepConfig


def pair_dir(config: SweepConfig, model: str, task: str) -> Path:
    """The finished pair's folder (exists only once the pair is complete)."""
    return config.output_dir / "runs" / model / task


def status_file(config: SweepConfig, model: str, task: str) -> Path:
    return config.output_dir / "status" / f"{model}__{task}.json"


def is_finished(config: SweepConfig, model: str, task: str) -> bool:
    folder = pair_dir(config, model, task)
    return folder.is_dir() and any(folder.glob("results_*.json"))


def _write_json_atomically(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    temporary.write_text(json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False), encoding="utf-8")
    os.replace(temporary, path)


def record_status(config: SweepConfig, model: str, task: str, state: str, **details: Any) -> dict[str, Any]:
    entry = {"model": model, "task": task, "state": state,
             "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), **details}
    _write_json_atomically(status_file(config, model, task), entry)
    return entry


def collect_status(config: SweepConfig, *, interrupted: bool = False) -> dict[str, Any]:
    """Every pair's state: ``done`` (folder present), ``failed`` (its last error), ``pending``; written to
    ``<output_dir>/sweep_status.json`` and returned, with ``interrupted`` (whether a Ctrl-C ended the run that
    wrote it)."""
    pairs = []
    for model, task in config.pairs():
        entry: dict[str, Any] = {"model": model, "task": task, "state": "pending"}
        path = status_file(config, model, task)
        if path.is_file():
            entry.update(json.loads(path.read_text(encoding="utf-8")))
        if is_finished(config, model, task):
            entry["state"] = "done"
            entry.pop("error", None)
            entry.pop("traceback", None)
        pairs.append(entry)
    counts = {state: sum(p["state"] == state for p in pairs) for state in ("done", "failed", "pending")}
    summary = {"output_dir": str(config.output_dir), "counts": counts, "interrupted": interrupted, "pairs": pairs}
    _write_json_atomically(config.output_dir / "sweep_status.json", summary)
    return summary


