"""Running a sweep: every (model, task) pair through ``lm_eval.simple_evaluate``, one model load per model, failures
recorded and the sweep going on, one progress line per pair with its ETA."""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import logging
import math
import os
import shutil
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm_eval_probes.harness.pretrained import ModelNotFound, check_pretrained, hub_offline
from lm_eval_probes.harness.release import release_models
from lm_eval_probes.probe_run.runner import lm_eval_cli_device
from lm_eval_probes.sweep.config import SWEEP_KEY, Shard, SweepConfig, SweepConfigError, SweepModel
from lm_eval_probes.sweep.store import collect_status, is_finished, pair_dir, record_status
from lm_eval_probes.terminal.interrupt import deferred_interrupt, restore_interrupt, stop_at_next_interrupt

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


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by Ctrl-C, after ``sweep_status.json`` was written; ``summary`` is :func:`collect_status`'s
    (``interrupted: true``) and ``str()`` the line the commands print."""

    def __init__(self, summary: dict[str, Any]) -> None:
        super().__init__(interrupted_line(summary))
        self.summary = summary


def interrupted_line(summary: dict[str, Any]) -> str:
    """``interrupted: N done, M pending — rerun the same command to resume`` (failed pairs, which a rerun retries,
    are counted when there are any)."""
    counts = summary["counts"]
    failed = f", {counts['failed']} failed" if counts.get("failed") else ""
    return f"interrupted: {counts['done']} done, {counts['pending']} pending{failed} — rerun the same command to resume"


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


def _evaluate_pair(config: SweepConfig, lm: Any, model: SweepModel, task: str, task_manager: Any, shard: Shard,
                   route: PairRoute | None = None) -> None:
    """Run one pair (``hf-probes`` generating and probing at once, or ``probe-run`` on generated or existing samples:
    ``route``) and move its lm_eval files into place atomically; its attempt folder in ``.partial/`` is removed
    whatever happens."""
    route = route or PairRoute(DIRECT)
    partial_root = config.output_dir / ".partial" / model.name
    for stale in partial_root.glob(f"{task}.*"):
        shutil.rmtree(stale, ignore_errors=True)  # a killed earlier attempt of this pair
    partial = partial_root / f"{task}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    _make_folder(partial)
    try:
        if route.kind == DIRECT:
            _evaluate_into(config, lm, model, task, task_manager, shard, partial)
        else:
            _probe_into(config, lm, model, task, task_manager, shard, partial, route)
    finally:  # done, failed or interrupted: nothing of this attempt stays in .partial/
        shutil.rmtree(partial, ignore_errors=True)
        remove_empty_partials(config)


def _make_folder(folder: Path) -> None:
    for attempt in range(3):  # another shard may remove an empty parent between the two steps of mkdir
        try:
            folder.mkdir(parents=True)
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


def remove_empty_partials(config: SweepConfig) -> None:
    """Remove the empty folders of ``<output_dir>/.partial/`` and ``.partial`` itself when it is empty (a running
    shard's attempt, which has files, stays)."""
    root = config.output_dir / ".partial"
    if not root.is_dir():
        return
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()


def _evaluate_into(config: SweepConfig, lm: Any, model: SweepModel, task: str, task_manager: Any, shard: Shard,
                   partial: Path) -> None:
    import lm_eval
    from lm_eval.loggers import EvaluationTracker

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
        return
    samples = results.pop("samples", None)
    results[SWEEP_KEY] = _sweep_note(model, task, shard, lm, pair_route(model))
    results.setdefault("config", {})["model_args"] = model_args
    tracker.save_results_aggregated(results=results, samples=samples)
    if config.log_samples and samples:
        for name in results["configs"]:
            tracker.save_results_samples(task_name=name, samples=samples[name])
    _move_into_place(config, model, task, partial)


def _sweep_note(model: SweepModel, task: str, shard: Shard, lm: Any, route: PairRoute) -> dict[str, Any]:
    device = getattr(lm, "device", None)
    note = {"model": model.name, "task": task, "shard": str(shard), "model_type": model.model,
            "device": None if device is None else str(device)}
    if model.generate_with is not None or model.samples is not None:
        note["generated_with"] = route.generated_with(model)
    return note


def _move_into_place(config: SweepConfig, model: SweepModel, task: str, partial: Path) -> None:
    written = list(partial.rglob("results_*.json"))
    if len(written) != 1:
        raise RuntimeError(f"lm_eval wrote {len(written)} results files for {model.name} × {task} (expected 1)")
    files = written[0].parent
    final = pair_dir(config, model.name, task)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(files, final)  # the pair appears complete or not at all


# ----------------------------------------------------------------------------- generate elsewhere, then probe-run

DIRECT, GENERATE, SAMPLES, UNAVAILABLE = "hf-probes", "generate", "samples", "unavailable"

BACKENDS: dict[str, tuple[str, str]] = {"vllm": ("vllm", "pip install vllm"), "vllm-vlm": ("vllm", "pip install vllm"),
                                        "sglang": ("sglang", "pip install sglang")}
"""lm_eval model types that need a package lm_eval does not install: the module to find, how to install it."""


@dataclass(frozen=True)
class PairRoute:
    """How a pair is run: ``hf-probes`` generating and probing (``DIRECT``), ``probe-run`` on responses another model
    type generates (``GENERATE``) or on existing samples (``SAMPLES``), or not at all (``UNAVAILABLE``: ``note`` says
    why). ``note`` also says why a pair fell back to ``hf-probes``."""

    kind: str
    note: str | None = None

    def generated_with(self, model: SweepModel) -> str:
        if self.kind == GENERATE:
            return str(model.generate_with)
        if self.kind == SAMPLES:
            return f"samples in {model.samples}"
        return DIRECT if self.note is None else f"{DIRECT} ({self.note})"


def backend_missing(model_type: str) -> str | None:
    """Why lm_eval's model type ``model_type`` cannot run here (its package is not installed), or ``None``."""
    backend = BACKENDS.get(model_type)
    if backend is None or importlib.util.find_spec(backend[0]) is not None:
        return None
    return f"{backend[0]} is not installed ({backend[1]})"


def pair_route(model: SweepModel) -> PairRoute:
    """How ``model``'s pairs run here (:class:`PairRoute`)."""
    if model.samples is not None:
        return PairRoute(SAMPLES)
    if model.generate_with is None:
        return PairRoute(DIRECT)
    missing = backend_missing(model.generate_with)
    if missing is None:
        return PairRoute(GENERATE)
    if model.fallback == DIRECT:
        return PairRoute(DIRECT, f"generate_with {model.generate_with}: {missing}; fell back to {DIRECT}")
    return PairRoute(UNAVAILABLE, f"generate_with {model.generate_with}: {missing}; set fallback: {DIRECT} to generate "
                                  f"with {DIRECT} instead")


def find_logged_run(folder: Path, task: str) -> Path:
    """The newest results file under ``folder`` whose run logged samples of ``task``.

    Raises:
        FileNotFoundError: none.
    """
    found = []
    for results in folder.rglob("results_*.json"):
        date = results.name[len("results_"):-len(".json")]
        if (results.parent / f"samples_{task}_{date}.jsonl").is_file():
            found.append((date, results))
    if not found:
        raise FileNotFoundError(f"no lm_eval run with samples of {task} under {folder} (samples_{task}_<date>.jsonl "
                                "beside its results_<date>.json)")
    return max(found)[1]


def generation_folder(config: SweepConfig, model: SweepModel, task: str) -> Path:
    """Where ``generate_with``'s run of a pair is kept (reused by a rerun)."""
    return config.output_dir / "generations" / model.name / task


def load_generator(config: SweepConfig, model: SweepModel) -> Any:
    """lm_eval's ``model.generate_with`` model (``vllm``, …) with ``generate_args`` and the sweep's batch size and
    device, loaded once for all of the model's generations in this process."""
    import lm_eval.api.registry
    import lm_eval.models  # noqa: F401  (lm_eval's own model names)

    additional = {"batch_size": config.batch_size, "max_batch_size": config.max_batch_size, "device": model_device(config)}
    return lm_eval.api.registry.get_model(model.generate_with).create_from_arg_obj(
        model.generation_args(), {k: v for k, v in additional.items() if v is not None})


def generate_samples(config: SweepConfig, generator: Any, model: SweepModel, task: str, folder: Path,
                     task_manager: Any) -> None:
    """Run ``generator`` (:func:`load_generator`) on ``task`` with ``--log_samples`` into ``folder`` (the sweep's
    limit, few-shot, generation kwargs, seeds and chat template), recorded as ``lm_eval --model <generate_with> ...
    --log_samples`` records it."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker

    tracker = EvaluationTracker(output_path=str(folder))
    results = lm_eval.simple_evaluate(
        model=generator, model_args=model.generation_args(), tasks=[task], num_fewshot=config.num_fewshot,
        batch_size=config.batch_size, max_batch_size=config.max_batch_size, device=model_device(config),
        limit=config.limit, bootstrap_iters=0, log_samples=True, evaluation_tracker=tracker,
        apply_chat_template=config.apply_chat_template,
        gen_kwargs=dict(config.gen_kwargs) if config.gen_kwargs else None, task_manager=task_manager,
        random_seed=config.seeds[0], numpy_random_seed=config.seeds[1], torch_random_seed=config.seeds[2],
        fewshot_random_seed=config.seeds[3],
    )
    if results is None:
        return
    samples = results.pop("samples", None) or {}
    results["model_source"] = results["config"]["model"] = model.generate_with
    tracker.save_results_aggregated(results=results, samples=samples)
    for name in results["configs"]:
        if name in samples:
            tracker.save_results_samples(task_name=name, samples=samples[name])


def _generate_all(config: SweepConfig, model: SweepModel, tasks: list[str], generation_tasks: Any) -> dict[str, Any]:
    """Generate every pair of ``tasks`` that has no kept generation, with one ``generate_with`` model loaded for all
    of them and released before any probing model loads (vLLM keeps its GPU memory while it lives). Returns, per task,
    the seconds its generation took, or the exception that failed it (a failed load fails them all)."""
    outcome: dict[str, Any] = {}
    missing = []
    for task in tasks:
        try:
            find_logged_run(generation_folder(config, model, task), task)
            outcome[task] = 0.0
        except FileNotFoundError:
            missing.append(task)
    if not missing:
        return outcome
    started = time.monotonic()
    try:
        generator = load_generator(config, model)
    except Exception as error:  # noqa: BLE001  (recorded per pair)
        error.trace = traceback.format_exc()[-4000:]  # type: ignore[attr-defined]
        return {**outcome, **dict.fromkeys(missing, error)}
    load_seconds = time.monotonic() - started
    try:
        for task in missing:
            started = time.monotonic()
            partial = (config.output_dir / ".partial" / "generations" / model.name
                       / f"{task}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
            _make_folder(partial)
            try:
                generate_samples(config, generator, model, task, partial, generation_tasks())
                find_logged_run(partial, task)  # raises when the generation logged nothing
                final = generation_folder(config, model, task)
                if final.exists():
                    shutil.rmtree(final)
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(partial, final)
                outcome[task] = time.monotonic() - started + load_seconds
                load_seconds = 0.0
            except Exception as error:  # noqa: BLE001
                error.trace = traceback.format_exc()[-4000:]  # type: ignore[attr-defined]
                outcome[task] = error
            finally:
                shutil.rmtree(partial, ignore_errors=True)
    finally:
        del generator
        release_models()
    return outcome


def _probe_into(config: SweepConfig, lm: Any, model: SweepModel, task: str, task_manager: Any, shard: Shard,
                partial: Path, route: PairRoute) -> None:
    from lm_eval_probes.probe_run.runner import ProbeRunOptions, probe_run

    folder = model.samples if route.kind == SAMPLES else generation_folder(config, model, task)
    source = find_logged_run(folder, task)
    options = ProbeRunOptions(
        run=[source], output_path=partial, model_args=config.model_args(model), tasks=[task],
        limit=config.limit if route.kind == SAMPLES else None, batch_size=config.batch_size,
        max_batch_size=config.max_batch_size, device=model_device(config), metadata=dict(config.metadata),
    )
    probe_run(options, lm=lm, task_manager=task_manager, annotations={SWEEP_KEY: _sweep_note(model, task, shard, lm, route)})
    _move_into_place(config, model, task, partial)


def model_device(config: SweepConfig) -> str:
    """The ``device`` the models are created with: the config's, else the one lm_eval's CLI passes when
    ``--device`` is not given (``EvaluatorConfig``'s default, ``cuda:0`` in 0.4.13).

    HFLM takes a device it does not know on this machine (``cuda:0`` without a GPU) as "not specified" and
    picks ``cuda`` when CUDA is available, else the CPU; leaving ``device`` out instead would give HFLM its
    own default, ``cuda``, which it always accepts, and fail on a machine without CUDA.
    """
    if config.device is not None:
        return config.device
    return lm_eval_cli_device()


def check_model_folder(model: SweepModel) -> None:
    """``pretrained=`` of a Hugging Face model type is there (:func:`~lm_eval_probes.harness.pretrained.check_pretrained`;
    offline as ``HF_HUB_OFFLINE`` says).

    Raises:
        ModelNotFound: what is missing, in one line.
    """
    if model.model not in ("hf", "hf-auto", "huggingface", "hf-probes", "hf-probes-diffusion"):
        return
    args = model.model_args
    gguf, subfolder = args.get("gguf_file"), args.get("subfolder")
    check_pretrained(args.get("pretrained"), offline=hub_offline(), gguf_file=str(gguf) if gguf else None,
                     subfolder=str(subfolder) if subfolder else None, trust_remote_code=args.get("trust_remote_code"))


def load_failure(error: BaseException) -> str:
    """The one-line error of a model that failed to load, as the FAILED line and ``sweep_status.json`` carry it."""
    if isinstance(error, ModelNotFound):
        return f"model failed to load: {error}"
    return f"model failed to load: {type(error).__name__}: {error}"


def _load_model(config: SweepConfig, model: SweepModel) -> Any:
    check_model_folder(model)
    import lm_eval.api.registry

    import lm_eval_probes  # noqa: F401  (registers hf-probes)

    additional = {"batch_size": config.batch_size, "max_batch_size": config.max_batch_size, "device": model_device(config)}
    return lm_eval.api.registry.get_model(model.model).create_from_arg_obj(
        config.model_args(model), {k: v for k, v in additional.items() if v is not None})


def _load_replay(config: SweepConfig, model: SweepModel) -> Any:
    """``hf-probes`` answering from logged responses (:class:`~lm_eval_probes.models.replay.ReplayHFLM`), for the
    pairs that ``probe-run`` probes."""
    check_model_folder(model)
    from lm_eval_probes.models.replay import ReplayHFLM

    additional = {"batch_size": config.batch_size, "max_batch_size": config.max_batch_size, "device": model_device(config)}
    return ReplayHFLM(**config.model_args(model), **{k: v for k, v in additional.items() if v is not None}, logged={})


class _ModelLoads:
    """A model's loaded wrappers in this process, each loaded once when a pair first needs it (``hf-probes`` and
    the replaying ``hf-probes`` of probe-run); a failed load is remembered and fails the model's later pairs alike."""

    def __init__(self, config: SweepConfig, model: SweepModel) -> None:
        self.config, self.model = config, model
        self.loaded: dict[bool, Any] = {}

    def get(self, replay: bool) -> Any:
        if replay not in self.loaded:
            try:
                self.loaded[replay] = (_load_replay if replay else _load_model)(self.config, self.model)
            except Exception as error:  # noqa: BLE001  (recorded per pair)
                self.loaded[replay] = _LoadFailed(error, traceback.format_exc()[-4000:])
        lm = self.loaded[replay]
        if isinstance(lm, _LoadFailed):
            raise lm
        return lm


class _LoadFailed(Exception):
    def __init__(self, error: BaseException, trace: str) -> None:
        super().__init__(str(error))
        self.error, self.trace = error, trace


def run_sweep(config: SweepConfig, *, shard: Shard = Shard(), task_manager: Any | None = None) -> dict[str, Any]:
    """Run this shard's unfinished pairs, one model load per model; returns :func:`collect_status`.

    A model that fails to load fails all its pairs in this shard (recorded, not raised; a ``pretrained=`` that
    is not there fails with what is missing, :func:`check_model_folder`); a pair that fails to evaluate is recorded
    and the next one runs. A Ctrl-C (``KeyboardInterrupt``) lets the status being written finish, writes
    ``sweep_status.json`` (``interrupted: true``) and raises :class:`SweepInterrupted`; the pair in progress stays
    pending, its attempt folder removed, and is redone by the next run. A finished sweep leaves no ``.partial/``
    folder behind (another shard's running attempt excepted).

    Args:
        task_manager: a :class:`~lm_eval_probes.tasks.manager.ProbeTaskManager` with the plugin's tasks on its
            include path and the config's ``metadata``, to reuse across sweeps in one process (indexing
            lm_eval's tasks takes seconds); ``None`` builds one.

    Raises:
        SweepConfigError: an unknown task name (checked before any model loads).
        SweepInterrupted: Ctrl-C (a :class:`KeyboardInterrupt`), after ``sweep_status.json`` is written.
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
    try:
        _run_pairs(config, shard, task_manager)
    except KeyboardInterrupt as interrupt:
        traceback.clear_frames(interrupt.__traceback__)  # its frames' locals (a loaded model) go now, not with it
        release_models()
        previous = stop_at_next_interrupt()  # a second Ctrl-C stops at once
        try:
            summary = collect_status(config, interrupted=True)
        finally:
            restore_interrupt(previous)
        raise SweepInterrupted(summary) from None
    remove_empty_partials(config)
    return collect_status(config)


def _shown(message: str) -> str:
    """An error as the progress line shows it: its first line, at most 300 characters."""
    first = (message.splitlines() or [""])[0]
    return first if len(first) <= 300 else first[:299] + "…"


def _run_pairs(config: SweepConfig, shard: Shard, task_manager: Any) -> None:
    mine = shard.select(config.pairs())
    logger.info("sweep %s: %d of %d pairs in shard %s", config.output_dir, len(mine), len(config.pairs()), shard)
    progress = Progress(len(mine))
    by_model: dict[str, list[str]] = {}
    for model_name, task in mine:
        by_model.setdefault(model_name, []).append(task)
    generation_tasks = _GenerationTasks(config)
    for model_name, tasks in by_model.items():
        try:
            _run_model_pairs(config, shard, task_manager, model_name, tasks, progress, generation_tasks)
        finally:  # this model's objects are gone before the next one loads, whatever its pairs' outcome
            release_models()


def _run_model_pairs(config: SweepConfig, shard: Shard, task_manager: Any, model_name: str, tasks: list[str],
                     progress: Progress, generation_tasks: _GenerationTasks) -> None:
    """One model's unfinished pairs of this shard, with its wrappers loaded once (:class:`_ModelLoads`). They are
    this call's locals only: when it returns (or raises), nothing holds the model any more."""
    todo = [t for t in tasks if not is_finished(config, model_name, t)]
    for task in tasks:
        if task not in todo:
            progress.line(model_name, task, "already done, skipped")
    if not todo:
        return
    model = config.model(model_name)
    route = pair_route(model)
    loads = _ModelLoads(config, model)
    if route.note is not None:
        logger.warning("%s: %s", model_name, route.note)
    generated = _generate_all(config, model, todo, generation_tasks) if route.kind == GENERATE else {}
    for task in todo:
        started = time.monotonic()
        generation = generated.get(task, 0.0)
        if isinstance(generation, Exception):
            message = f"generation with {model.generate_with} failed: {type(generation).__name__}: {generation}"
            with deferred_interrupt():
                record_status(config, model_name, task, "failed", error=message,
                              traceback=getattr(generation, "trace", ""))
                progress.line(model_name, task, f"FAILED ({_shown(message)})", 0.0)
            continue
        started -= generation  # the pair's time includes its generation
        try:
            if route.kind == UNAVAILABLE:
                raise RuntimeError(route.note)
            lm = loads.get(replay=route.kind != DIRECT)
            _evaluate_pair(config, lm, model, task, task_manager, shard, route)
        except _LoadFailed as failure:
            message = load_failure(failure.error)
            details = {} if isinstance(failure.error, ModelNotFound) else {"traceback": failure.trace}
            with deferred_interrupt():  # the status is written whole
                record_status(config, model_name, task, "failed", error=message, **details)
                progress.line(model_name, task, f"FAILED ({_shown(message)})", time.monotonic() - started)
        except Exception as error:  # noqa: BLE001
            message = f"{type(error).__name__}: {error}"
            with deferred_interrupt():
                record_status(config, model_name, task, "failed", error=message, traceback=traceback.format_exc()[-4000:])
                progress.line(model_name, task, f"FAILED ({_shown(message)})", time.monotonic() - started)
        else:
            seconds = time.monotonic() - started
            extra = {} if model.generate_with is None and model.samples is None else {
                "generated_with": route.generated_with(model)}
            with deferred_interrupt():
                record_status(config, model_name, task, "done", seconds=round(seconds, 3), shard=str(shard),
                              results_dir=str(pair_dir(config, model_name, task)), **extra)
                progress.line(model_name, task, "done" + (f" ({route.note})" if route.note else ""), seconds)


class _GenerationTasks:
    """lm_eval's own task manager for the ``generate_with`` runs (the plugin's tasks on its path, no probe rows),
    built when a pair first needs it."""

    def __init__(self, config: SweepConfig) -> None:
        self.config = config
        self.manager: Any = None

    def __call__(self) -> Any:
        if self.manager is None:
            from lm_eval.tasks import TaskManager

            import lm_eval_probes

            self.manager = TaskManager(include_path=lm_eval_probes.tasks_dir(), metadata=dict(self.config.metadata) or None)
        return self.manager
