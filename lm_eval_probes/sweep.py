"""``lm-eval-probes sweep CONFIG.yaml``: models × tasks through lm_eval with one uniform setup.

Every (model, task) pair runs through ``lm_eval.simple_evaluate`` with the same probes, seeds, limit,
few-shot count, batch-size policy and task metadata, and writes lm_eval's own files (``results_<date>.json``,
``samples_<task>_<date>.jsonl``, via lm_eval's ``EvaluationTracker`` as its CLI does) into
``<output_dir>/runs/<model>/<task>/``. Then ``lm-eval-probes report <output_dir>/runs --out ...`` builds
the leaderboard.

* **Atomic, resumable.** A pair is written into ``<output_dir>/.partial/`` and moved into place with one
  ``os.replace``; a pair whose folder exists is finished and skipped on a rerun. A crash or Ctrl-C leaves at
  most a partial folder, which is ignored and redone.
* **Failures recorded, sweep goes on.** A model that fails to load (bad name, unsupported architecture,
  out of memory) or a pair that fails to evaluate is recorded with its error in
  ``<output_dir>/status/<model>__<task>.json`` (collected into ``<output_dir>/sweep_status.json``); the
  other pairs still run; failed pairs are retried by the next run.
* **Sharding without a coordinator.** ``--shard K/N`` (0 ≤ K < N) runs pair i of the sorted pair list
  when i mod N = K: N processes, Slurm array tasks or machines split the sweep, into one shared
  ``output_dir`` or each into its own (``--output_dir``) whose ``runs/`` folders are then copied into one;
  either way the report equals the unsharded sweep's (docs/scale-out.md).
* **Any machine.** Without ``device`` each model goes where lm_eval's CLI puts it without ``--device``:
  the first GPU when there is one, else the CPU (:func:`model_device`).
* **One model load per model** (per process): its pairs reuse the loaded model.

The config is parsed into frozen dataclasses and validated (unknown keys name the valid ones, the
plugin's ``probe_*`` options are checked) before anything heavy is imported; task names are checked
against lm_eval's task index before the first model loads. lm_eval is imported only inside
:func:`run_sweep`.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import logging
import math
import os
import re
import shutil
import sys
import time
import traceback
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lm_eval_probes.config import DEFAULT_PROBES, ProbeConfig, split_model_args, unknown_message
from lm_eval_probes.console import tidy_console

DEFAULT_PROBE_SET = "+".join(DEFAULT_PROBES)
"""The sweep's default ``probes``: the wrapper's default set (the cheap probes; ``all`` adds Ω)."""

logger = logging.getLogger(__name__)

SWEEP_KEY = "lm_eval_probes_sweep"
"""Top-level key added to each results file: the sweep's model label (read by the report), task, shard, model type
and the device the model ran on."""

CONFIG_KEYS: tuple[str, ...] = (
    "models", "tasks", "output_dir", "probes", "seeds", "limit", "num_fewshot", "batch_size", "max_batch_size",
    "device", "gen_kwargs", "metadata", "apply_chat_template", "bootstrap_iters", "log_samples",
)
MODEL_KEYS: tuple[str, ...] = ("name", "model", "model_args")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


class SweepConfigError(ValueError):
    """A sweep config that cannot run; the message names the bad key and the valid ones."""


@dataclass(frozen=True)
class SweepModel:
    """One model of the sweep.

    Attributes:
        name: label in the leaderboard and folder name (letters, digits, ``._+-``).
        model: lm_eval model type (default ``hf-probes``).
        model_args: passed to the model as is (``pretrained``, ``dtype``, ``gguf_file``, ``parallelize``, …);
            the sweep adds its ``probes``. ``probes`` itself is a sweep-level key (same for every model).
    """

    name: str
    model: str = "hf-probes"
    model_args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SweepConfig:
    """A sweep: every model × every task with the same settings.

    Attributes:
        models, tasks: what to run (task names as lm_eval knows them; the plugin's tasks are on the path).
        output_dir: where ``runs/``, ``status/`` and ``sweep_status.json`` go.
        probes: the ``probes`` model_arg for every model (default: the wrapper's default set, tcb+bte+reader;
            ``all`` adds Ω).
        seeds: lm_eval's (random, numpy, torch, fewshot) seeds.
        limit: documents per task (``None`` = all; a float in (0, 1) = a fraction, as lm_eval).
        num_fewshot: ``None`` = each task's own.
        batch_size / max_batch_size: lm_eval's batch-size policy (an int, ``auto`` or ``auto:N``).
        device: e.g. ``cpu``, ``cuda``, ``cuda:1``; ``None`` lets lm_eval choose as its CLI does without
            ``--device`` (:func:`model_device`).
        gen_kwargs: generation overrides for every generation task.
        metadata: lm_eval task metadata for every task (``probes_data_dir``, ``noise_eta``, …).
        apply_chat_template: as lm_eval's flag.
        bootstrap_iters: lm_eval's stderr bootstrap iterations (only its non-mean metrics use them).
        log_samples: write the per-document samples (the report's CIs and plots need them).
    """

    models: tuple[SweepModel, ...]
    tasks: tuple[str, ...]
    output_dir: Path
    probes: str = DEFAULT_PROBE_SET
    seeds: tuple[int, int, int, int] = (0, 1234, 1234, 1234)
    limit: int | float | None = None
    num_fewshot: int | None = None
    batch_size: int | str = 1
    max_batch_size: int | None = None
    device: str | None = None
    gen_kwargs: Mapping[str, Any] | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    apply_chat_template: bool = False
    bootstrap_iters: int = 100000
    log_samples: bool = True

    def pairs(self) -> list[tuple[str, str]]:
        """Every (model name, task), sorted: the order shards index into."""
        return sorted((m.name, t) for m in self.models for t in self.tasks)

    def model(self, name: str) -> SweepModel:
        return next(m for m in self.models if m.name == name)

    def model_args(self, model: SweepModel) -> dict[str, Any]:
        """The model's ``model_args`` with the sweep's ``probes`` added."""
        return {**dict(model.model_args), "probes": self.probes}


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise SweepConfigError(message)


def _check_keys(where: str, given: Mapping[str, Any], valid: Sequence[str]) -> None:
    for key in given:
        if key not in valid:
            raise SweepConfigError(unknown_message(f"{where} key", str(key), valid))


def _int(name: str, value: Any, *, minimum: int) -> int:
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
             f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _parse_model(index: int, raw: Any) -> SweepModel:
    where = f"models[{index}]"
    _require(isinstance(raw, Mapping), f"{where} must be a mapping with keys {', '.join(MODEL_KEYS)}, got {raw!r}")
    _check_keys(where, raw, MODEL_KEYS)
    _require("name" in raw, f"{where} needs a 'name' (the leaderboard label)")
    name = str(raw["name"])
    _require(bool(NAME_PATTERN.match(name)), f"{where}.name must be letters, digits and ._+- (a folder name), got {name!r}")
    model_args = raw.get("model_args") or {}
    _require(isinstance(model_args, Mapping), f"{where}.model_args must be a mapping, got {model_args!r}")
    _require("pretrained" in model_args, f"{where}.model_args needs 'pretrained' (a hub id or a folder)")
    plugin, _ = split_model_args(model_args)
    _require("probes" not in plugin, f"{where}.model_args: 'probes' is a sweep-level key (the same for every model)")
    try:
        ProbeConfig.from_model_args(plugin)
    except ValueError as error:
        raise SweepConfigError(f"{where}.model_args: {error}") from None
    return SweepModel(name=name, model=str(raw.get("model", "hf-probes")), model_args=dict(model_args))


def _parse_seeds(value: Any) -> tuple[int, int, int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * 4  # type: ignore[return-value]
    _require(isinstance(value, (list, tuple)) and len(value) == 4 and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
             f"seeds must be one integer or 4 integers (random, numpy, torch, fewshot), got {value!r}")
    return tuple(value)  # type: ignore[return-value]


def parse_config(raw: Mapping[str, Any], *, base_dir: Path | None = None) -> SweepConfig:
    """Validate a parsed YAML mapping into a :class:`SweepConfig` (no model or lm_eval is loaded).

    ``output_dir`` is resolved against ``base_dir`` (the config file's folder) when relative.

    Raises:
        SweepConfigError: an unknown key (with the valid ones and a did-you-mean), a missing or ill-typed
            value, duplicate model names or tasks, a bad ``probe_*`` option.
    """
    _require(isinstance(raw, Mapping), f"a sweep config must be a mapping of {', '.join(CONFIG_KEYS)}, got {type(raw).__name__}")
    _check_keys("sweep config", raw, CONFIG_KEYS)
    for key in ("models", "tasks", "output_dir"):
        _require(key in raw, f"the sweep config needs '{key}'")
    _require(isinstance(raw["models"], list) and raw["models"], "models must be a non-empty list")
    models = tuple(_parse_model(i, m) for i, m in enumerate(raw["models"]))
    names = [m.name for m in models]
    _require(len(set(names)) == len(names), f"model names must be unique, got {names}")
    tasks = raw["tasks"]
    if isinstance(tasks, str):
        tasks = [t.strip() for t in tasks.split(",") if t.strip()]
    _require(isinstance(tasks, list) and tasks and all(isinstance(t, str) and t for t in tasks),
             f"tasks must be a non-empty list of task names, got {raw['tasks']!r}")
    _require(len(set(tasks)) == len(tasks), f"tasks lists a task twice: {tasks}")
    output_dir = Path(str(raw["output_dir"]))
    if not output_dir.is_absolute() and base_dir is not None:
        output_dir = base_dir / output_dir
    probes = raw.get("probes", DEFAULT_PROBE_SET)
    try:
        ProbeConfig.from_model_args({"probes": probes})
    except ValueError as error:
        raise SweepConfigError(f"probes: {error}") from None
    limit = raw.get("limit")
    if limit is not None:
        _require(isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit > 0
                 and (isinstance(limit, int) or limit < 1),
                 f"limit must be a positive integer (documents) or a fraction in (0, 1), got {limit!r}")
    num_fewshot = None if raw.get("num_fewshot") is None else _int("num_fewshot", raw["num_fewshot"], minimum=0)
    batch_size = raw.get("batch_size", 1)
    if not (isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size >= 1):
        _require(isinstance(batch_size, str) and re.fullmatch(r"auto(:\d+)?", batch_size) is not None,
                 f"batch_size must be an integer >= 1, 'auto' or 'auto:N', got {batch_size!r}")
    max_batch_size = None if raw.get("max_batch_size") is None else _int("max_batch_size", raw["max_batch_size"], minimum=1)
    for key in ("gen_kwargs", "metadata"):
        _require(raw.get(key) is None or isinstance(raw[key], Mapping), f"{key} must be a mapping, got {raw.get(key)!r}")
    for key in ("apply_chat_template", "log_samples"):
        _require(isinstance(raw.get(key, False), bool), f"{key} must be true or false, got {raw.get(key)!r}")
    device = raw.get("device")
    _require(device is None or isinstance(device, str), f"device must be a string such as 'cpu' or 'cuda', got {device!r}")
    return SweepConfig(
        models=models, tasks=tuple(tasks), output_dir=output_dir, probes=str(probes) if not isinstance(probes, list) else "+".join(probes),
        seeds=_parse_seeds(raw.get("seeds", [0, 1234, 1234, 1234])), limit=limit, num_fewshot=num_fewshot,
        batch_size=batch_size, max_batch_size=max_batch_size, device=device,
        gen_kwargs=dict(raw["gen_kwargs"]) if raw.get("gen_kwargs") else None, metadata=dict(raw.get("metadata") or {}),
        apply_chat_template=bool(raw.get("apply_chat_template", False)),
        bootstrap_iters=_int("bootstrap_iters", raw.get("bootstrap_iters", 100000), minimum=0),
        log_samples=bool(raw.get("log_samples", True)),
    )


def load_config(path: str | Path) -> SweepConfig:
    """Read and validate a YAML sweep config (relative ``output_dir`` = relative to the file).

    Raises:
        SweepConfigError: unreadable YAML or an invalid config (see :func:`parse_config`).
        FileNotFoundError: no such file.
    """
    import yaml

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise SweepConfigError(f"{path} is not valid YAML: {error}") from None
    return parse_config(raw, base_dir=path.resolve().parent)


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (0 ≤ index < count): pair i of the sorted pair list when i mod count = index."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not (self.count >= 1 and 0 <= self.index < self.count):
            raise SweepConfigError(f"shard must be K/N with 0 <= K < N, got {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not match:
            raise SweepConfigError(f"--shard must be K/N (e.g. 0/4, with 0 <= K < N), got {text!r}")
        return cls(int(match.group(1)), int(match.group(2)))

    def select(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        return [pair for i, pair in enumerate(pairs) if i % self.count == self.index]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


# ----------------------------------------------------------------------------------------- files


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


def collect_status(config: SweepConfig) -> dict[str, Any]:
    """Every pair's state: ``done`` (folder present), ``failed`` (its last error), ``pending``; written to
    ``<output_dir>/sweep_status.json`` and returned."""
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
    summary = {"output_dir": str(config.output_dir), "counts": counts, "pairs": pairs}
    _write_json_atomically(config.output_dir / "sweep_status.json", summary)
    return summary


# ----------------------------------------------------------------------------------------- running


def _format_seconds(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Progress:
    """One log line per pair: position, outcome, the pair's time, elapsed and an ETA from measured work.

    The ETA is the mean time of the pairs run so far × the pairs left, leaving out the first pair this process
    runs: it also pays the process's start-up (imports, lm_eval's task index, the first batches' warm-up), which
    the later pairs do not, so an ETA from it alone overestimates (about 4× in ``make demo``). Until a second
    pair has run the line says so instead of guessing. Skipped (already finished) pairs take no time and do
    not count.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.ran = 0
        self.start = time.monotonic()
        self.busy = 0.0  # seconds of the pairs run after the first

    def eta(self) -> str:
        if self.done >= self.total:
            return "ETA 0s"
        if self.ran < 2:
            return "ETA after the next pair" if self.ran == 1 else "ETA after the first pair"
        return f"ETA {_format_seconds(self.busy / (self.ran - 1) * (self.total - self.done))}"

    def line(self, model: str, task: str, outcome: str, seconds: float | None = None) -> str:
        self.done += 1
        if seconds is not None:
            self.ran += 1
            if self.ran > 1:
                self.busy += seconds
        elapsed = time.monotonic() - self.start
        took = f" in {_format_seconds(seconds)}" if seconds is not None else ""
        text = f"[{self.done}/{self.total}] {model} × {task}: {outcome}{took} (elapsed {_format_seconds(elapsed)}, {self.eta()})"
        logger.info(text)
        return text


def check_tasks(config: SweepConfig, task_manager: Any) -> None:
    """Every task name known to lm_eval (with the plugin's tasks), before any model loads.

    Raises:
        SweepConfigError: an unknown task, with a did-you-mean.
    """
    known = sorted(set(task_manager.all_tasks))
    for task in config.tasks:
        if task not in known:
            close = difflib.get_close_matches(task, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            plugin = ", ".join(t for t in known if t.startswith("probes_"))
            raise SweepConfigError(f"unknown task {task!r}.{hint} The plugin's tasks: {plugin}; or any task lm_eval knows.")


def _evaluate_pair(config: SweepConfig, lm: Any, model: SweepModel, task: str, task_manager: Any, shard: Shard) -> None:
    """Run one pair and move its lm_eval files into place atomically."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker

    partial_root = config.output_dir / ".partial" / model.name
    for stale in partial_root.glob(f"{task}.*"):
        shutil.rmtree(stale, ignore_errors=True)  # a killed earlier attempt of this pair
    partial = partial_root / f"{task}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    partial.mkdir(parents=True)
    tracker = EvaluationTracker(output_path=str(partial))
    model_args = config.model_args(model)
    results = lm_eval.simple_evaluate(
        model=lm, model_args=model_args, tasks=[task], num_fewshot=config.num_fewshot, batch_size=config.batch_size,
        max_batch_size=config.max_batch_size, device=model_device(config), limit=config.limit,
        bootstrap_iters=config.bootstrap_iters, log_samples=config.log_samples, evaluation_tracker=tracker,
        apply_chat_template=config.apply_chat_template, gen_kwargs=dict(config.gen_kwargs) if config.gen_kwargs else None,
        task_manager=task_manager, random_seed=config.seeds[0], numpy_random_seed=config.seeds[1],
        torch_random_seed=config.seeds[2], fewshot_random_seed=config.seeds[3],
    )
    if results is None:  # a non-zero rank of a distributed run: rank 0 writes
        shutil.rmtree(partial, ignore_errors=True)
        return
    samples = results.pop("samples", None)
    device = getattr(lm, "device", None)
    results[SWEEP_KEY] = {"model": model.name, "task": task, "shard": str(shard), "model_type": model.model,
                          "device": None if device is None else str(device)}
    results.setdefault("config", {})["model_args"] = model_args
    tracker.save_results_aggregated(results=results, samples=samples)
    if config.log_samples and samples:
        for name in results["configs"]:
            tracker.save_results_samples(task_name=name, samples=samples[name])
    written = list(partial.rglob("results_*.json"))
    if len(written) != 1:
        raise RuntimeError(f"lm_eval wrote {len(written)} results files for {model.name} × {task} (expected 1)")
    files = written[0].parent
    final = pair_dir(config, model.name, task)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(files, final)  # the pair appears complete or not at all
    shutil.rmtree(partial, ignore_errors=True)


def model_device(config: SweepConfig) -> str:
    """The ``device`` the models are created with: the config's, else the one lm_eval's CLI passes when
    ``--device`` is not given (``EvaluatorConfig``'s default, ``cuda:0`` in 0.4.13).

    HFLM takes a device it does not know on this machine (``cuda:0`` without a GPU) as "not specified" and
    picks ``cuda`` when CUDA is available, else the CPU; leaving ``device`` out instead would give HFLM its
    own default, ``cuda``, which it always accepts, and fail on a machine without CUDA.
    """
    if config.device is not None:
        return config.device
    from lm_eval.config.evaluate_config import EvaluatorConfig

    default = next((f.default for f in dataclasses.fields(EvaluatorConfig) if f.name == "device"), None)
    if not isinstance(default, str):
        raise RuntimeError(f"lm_eval's CLI has no default device to follow (got {default!r}); set 'device' in the sweep config")
    return default


def _load_model(config: SweepConfig, model: SweepModel) -> Any:
    import lm_eval.api.registry

    import lm_eval_probes  # noqa: F401  (registers hf-probes)

    additional = {"batch_size": config.batch_size, "max_batch_size": config.max_batch_size, "device": model_device(config)}
    return lm_eval.api.registry.get_model(model.model).create_from_arg_obj(
        config.model_args(model), {k: v for k, v in additional.items() if v is not None})


def run_sweep(config: SweepConfig, *, shard: Shard = Shard(), task_manager: Any | None = None) -> dict[str, Any]:
    """Run this shard's unfinished pairs, one model load per model; returns :func:`collect_status`.

    A model that fails to load fails all its pairs in this shard (recorded, not raised); a pair that fails
    to evaluate is recorded and the next one runs. ``KeyboardInterrupt`` propagates (the pair in progress
    stays unfinished and is redone next time).

    Args:
        task_manager: a :class:`~lm_eval_probes.integration.ProbeTaskManager` with the plugin's tasks on its
            include path and the config's ``metadata``, to reuse across sweeps in one process (indexing
            lm_eval's tasks takes seconds); ``None`` builds one.

    Raises:
        SweepConfigError: an unknown task name (checked before any model loads).
        ValueError: a ``task_manager`` that is not a ProbeTaskManager or has other task metadata.
    """
    import lm_eval_probes
    from lm_eval_probes.integration import ProbeTaskManager, register_model_placeholder

    register_model_placeholder()
    if task_manager is None:
        task_manager = ProbeTaskManager(include_path=lm_eval_probes.tasks_dir(), metadata=dict(config.metadata) or None)
    elif not isinstance(task_manager, ProbeTaskManager):
        raise ValueError(f"task_manager must be a ProbeTaskManager (its tasks report the probe rows), got {type(task_manager).__name__}")
    elif dict(task_manager.metadata or {}) != dict(config.metadata):
        raise ValueError(f"task_manager has task metadata {task_manager.metadata!r}, the sweep config {dict(config.metadata)!r}")
    check_tasks(config, task_manager)
    mine = shard.select(config.pairs())
    logger.info("sweep %s: %d of %d pairs in shard %s", config.output_dir, len(mine), len(config.pairs()), shard)
    progress = Progress(len(mine))
    by_model: dict[str, list[str]] = {}
    for model_name, task in mine:
        by_model.setdefault(model_name, []).append(task)
    for model_name, tasks in by_model.items():
        todo = [t for t in tasks if not is_finished(config, model_name, t)]
        for task in tasks:
            if task not in todo:
                progress.line(model_name, task, "already done, skipped")
        if not todo:
            continue
        model = config.model(model_name)
        started = time.monotonic()
        try:
            lm = _load_model(config, model)
        except Exception as error:  # noqa: BLE001  (any load failure is recorded; the sweep goes on)
            message = f"model failed to load: {type(error).__name__}: {error}"
            for task in todo:
                record_status(config, model_name, task, "failed", error=message, traceback=traceback.format_exc()[-4000:])
                progress.line(model_name, task, f"FAILED ({message[:200]})", time.monotonic() - started)
                started = time.monotonic()
            continue
        load_seconds = time.monotonic() - started
        for task in todo:
            started = time.monotonic()
            try:
                _evaluate_pair(config, lm, model, task, task_manager, shard)
            except Exception as error:  # noqa: BLE001
                message = f"{type(error).__name__}: {error}"
                record_status(config, model_name, task, "failed", error=message, traceback=traceback.format_exc()[-4000:])
                progress.line(model_name, task, f"FAILED ({message[:200]})", time.monotonic() - started + load_seconds)
            else:
                seconds = time.monotonic() - started + load_seconds
                record_status(config, model_name, task, "done", seconds=round(seconds, 3), shard=str(shard),
                              results_dir=str(pair_dir(config, model_name, task)))
                progress.line(model_name, task, "done", seconds)
            load_seconds = 0.0
        del lm
    return collect_status(config)


# ----------------------------------------------------------------------------------------- CLI

EXAMPLE = """\
example config (YAML), for any machine: without 'device' each model goes where lm_eval's CLI puts it
without --device (the first GPU when there is one, else the CPU):
  output_dir: results/sweep          # relative to this file
  models:
    - name: smollm2-135m
      model_args: {pretrained: HuggingFaceTB/SmolLM2-135M-Instruct, dtype: float32}
    - name: qwen2.5-0.5b
      model_args: {pretrained: Qwen/Qwen2.5-0.5B-Instruct, dtype: bfloat16, parallelize: true}
  tasks: [probes_synth_arith, probes_synth_logic]
  probes: tcb+bte+reader
  limit: 100
  batch_size: auto
  seeds: 0

example config (YAML) on a chosen device:
  output_dir: results/sweep-cpu
  models:
    - name: smollm2-135m
      model_args: {pretrained: HuggingFaceTB/SmolLM2-135M-Instruct, dtype: float32}
  tasks: [probes_synth_arith, probes_synth_logic]
  limit: 100
  device: cpu                        # or cuda, cuda:1, mps
  seeds: 0

across machines (docs/scale-out.md): each runs its shard into its own folder, then copy runs/ into one:
  lm-eval-probes sweep sweep.yaml --shard 0/2 --output_dir /scratch/a     # machine 1
  lm-eval-probes sweep sweep.yaml --shard 1/2 --output_dir /scratch/b     # machine 2
  mkdir -p results/sweep && cp -r /scratch/a/runs /scratch/b/runs results/sweep/   # then, once
  lm-eval-probes report results/sweep/runs --out results/leaderboard
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lm-eval-probes sweep",
        description="Run every model × task of CONFIG.yaml through lm_eval with the same probes, seeds, limit, "
                    "few-shot and batch-size policy, writing lm_eval's results and samples files per pair into "
                    "OUTPUT_DIR/runs/<model>/<task>/. Finished pairs are skipped on a rerun; failures are recorded "
                    "in OUTPUT_DIR/sweep_status.json and the sweep goes on. Then: lm-eval-probes report OUTPUT_DIR/runs --out DIR.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", metavar="CONFIG.yaml", help="the sweep config (see the example below and the README)")
    p.add_argument("--shard", default="0/1", help="K/N: run pair i of the sorted pair list when i mod N = K "
                   "(0 <= K < N; e.g. --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT); default 0/1 = all")
    p.add_argument("--output_dir", metavar="DIR", help="write runs/, status/ and sweep_status.json into DIR instead of "
                   "the config's output_dir (e.g. one folder per shard on a machine's own disk; copy their runs/ folders "
                   "into one afterwards)")
    p.add_argument("--check", action="store_true", help="validate the config and list this shard's pairs and their "
                   "state, load nothing")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    try:
        config = load_config(args.config)
        if args.output_dir is not None:
            config = dataclasses.replace(config, output_dir=Path(args.output_dir).resolve())
        shard = Shard.parse(args.shard)
        if args.check:
            for model, task in shard.select(config.pairs()):
                state = "done" if is_finished(config, model, task) else "to run"
                print(f"{model}\t{task}\t{state}")
            return 0
        with tidy_console():  # lm_eval's repeated notices once; warnings name the pair and the row
            summary = run_sweep(config, shard=shard)
    except (SweepConfigError, FileNotFoundError) as error:
        print(f"lm-eval-probes sweep: error: {error}", file=sys.stderr)
        return 2
    counts = summary["counts"]
    print(f"{counts['done']} done, {counts['failed']} failed, {counts['pending']} pending (all shards): "
          f"{config.output_dir / 'sweep_status.json'}")
    return 1 if counts["failed"] else 0
