"""Running a sweep: every (model, task) pair through ``lm_eval.simple_evaluate``, one model load per model, failures
recorded and the sweep going on, one progress line per pair with its ETA."""

from __future__ import annotations

import dataclasses
import logging
import difflib
import math
import os
import shutil
import time
import traceback
import uuid
from typing import Any

from lm_eval_probes.sweep.config import SWEEP_KEY, Shard, SweepConfig, SweepConfigError, SweepModel
from lm_eval_probes.sweep.store import collect_status, is_finished, pair_dir, record_status

logger = logging.getLogger(__name__)


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
        task_manager: a :class:`~lm_eval_probes.tasks.manager.ProbeTaskManager` with the plugin's tasks on its
            include path and the config's ``metadata``, to reuse across sweeps in one process (indexing
            lm_eval's tasks takes seconds); ``None`` builds one.

    Raises:
        SweepConfigError: an unknown task name (checked before any model loads).
        ValueError: a ``task_manager`` that is not a ProbeTaskManager or has other task metadata.
    """
    import lm_eval_probes
    from lm_eval_probes.harness.registry import register_model_placeholder
    from lm_eval_probes.tasks.manager import ProbeTaskManager

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


