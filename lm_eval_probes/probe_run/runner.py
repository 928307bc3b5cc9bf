"""``probe-run``: the probes of ``hf-probes`` added to a finished run of any backend, one forward per document.

:func:`probe_run` reads the run (:func:`~lm_eval_probes.probe_run.logged.read_run`), loads the probing model as
:class:`~lm_eval_probes.models.replay.ReplayHFLM` and lets lm_eval's own ``simple_evaluate`` build, answer, filter
and score the run's tasks with the run's settings (few-shot count and seed, generation kwargs, chat template, system
instruction): every request is answered from the logged responses while the model's forward feeds the probes, so the
accuracy and the responses are the original run's and every probe row is computed as under ``hf-probes``. It writes
a new output folder of lm_eval's usual shape (``<output_path>/<model>/results_<date>.json`` and
``samples_<task>_<date>.jsonl``) and never writes into the run's folder.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lm_eval_probes.probe_run.logged import LoggedRun, ProbeRunError, read_run
from lm_eval_probes.probe_run.progress import ProgressFolder

__all__ = ["PROBE_RUN_KEY", "ProbeRunOptions", "lm_eval_cli_device", "probe_run", "selected_doc_ids"]

logger = logging.getLogger(__name__)

PROBE_RUN_KEY = "lm_eval_probes_probe_run"
"""Top-level key of the written results file: where the responses came from and how the replay went."""
SAMPLE_KEY = "probe_run"
"""Key added to each written sample: how its response was replayed."""


@dataclass(frozen=True)
class ProbeRunOptions:
    """What ``lm-eval-probes probe-run`` is asked.

    Attributes:
        run: the finished run (a folder with one results file, that file, or samples files of one run).
        output_path: where the new run goes (never inside ``run``'s folder).
        model_args: the probing model's (``pretrained`` and every HFLM argument, ``probes``, ``probe_*``).
        tasks: the run's tasks to probe (``None``: every task with samples).
        limit: documents per task, the first of those the run logged (an int, or a fraction in (0, 1)).
        batch_size, max_batch_size, device: as lm_eval's (``device`` ``None``: where lm_eval's CLI puts a model
            without ``--device``, :func:`lm_eval_cli_device`).
        include_path: a task folder besides the plugin's (the run's own tasks).
        metadata: task metadata, as lm_eval's ``--metadata``.
        num_fewshot: ``None``: the run's (read from its results file).
        documents_per_chunk: documents probed (and stored, for a resume) at a time.
        allow_other_model: probe with a model of another size than the run's (same tokenizer): its states over
            another model's responses.
    """

    run: Sequence[Path]
    output_path: Path
    model_args: Mapping[str, Any]
    tasks: Sequence[str] | None = None
    limit: int | float | None = None
    batch_size: int | str = 1
    max_batch_size: int | None = None
    device: str | None = None
    include_path: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    num_fewshot: int | None = None
    documents_per_chunk: int = 64
    allow_other_model: bool = False


def lm_eval_cli_device() -> str:
    """The ``device`` lm_eval's CLI passes when ``--device`` is not given (``EvaluatorConfig``'s default, ``cuda:0`` in
    0.4.13), which HFLM takes as "not specified" on a machine without it and replaces by ``cuda`` when CUDA is
    available, else the CPU; leaving ``device`` out instead gives HFLM its own default, ``cuda``, which fails on a
    machine without CUDA.

    Raises:
        RuntimeError: an lm_eval whose CLI has no default device.
    """
    import dataclasses

    from lm_eval.config.evaluate_config import EvaluatorConfig

    default = next((f.default for f in dataclasses.fields(EvaluatorConfig) if f.name == "device"), None)
    if not isinstance(default, str):
        raise RuntimeError(f"lm_eval's CLI has no default device to follow (got {default!r}); pass --device")
    return default


def selected_doc_ids(logged: LoggedRun, limit: int | float | None) -> dict[str, list[int]]:
    """Per task, the logged documents to probe: all of them, or the first ``limit`` (a fraction: of the logged
    count, rounded up as lm_eval rounds)."""
    out = {}
    for name, task in logged.tasks.items():
        ids = sorted(task.documents)
        if limit is not None:
            count = int(math.ceil(len(ids) * limit)) if isinstance(limit, float) and limit < 1 else int(limit)
            ids = ids[:count]
        out[name] = ids
    return out


def _check_output_path(options: ProbeRunOptions, logged: LoggedRun) -> None:
    output = options.output_path.resolve()
    named = [Path(p).resolve() if Path(p).is_dir() else Path(p).resolve().parent for p in options.run]
    for source in (logged.folder.resolve(), *named):
        if output == source or source in output.parents:
            raise ProbeRunError(f"--output_path {options.output_path} is inside the run's folder {source}: "
                                "probe-run writes nothing there; choose another folder")


def _fingerprint(options: ProbeRunOptions, logged: LoggedRun, doc_ids: Mapping[str, list[int]]) -> dict[str, Any]:
    import lm_eval

    import lm_eval_probes

    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]

    return {
        "results": f"{logged.results_path.resolve()} {digest(logged.results_path)}",
        "samples": {name: f"{task.samples.resolve()} {digest(task.samples)}" for name, task in logged.tasks.items()},
        "documents": {name: [ids[0], ids[-1], len(ids)] if ids else [] for name, ids in doc_ids.items()},
        "model_args": {key: str(value) for key, value in options.model_args.items()},
        "metadata": {key: str(value) for key, value in options.metadata.items()},
        "num_fewshot": options.num_fewshot,
        "versions": f"lm_eval_probes {lm_eval_probes.__version__}, lm_eval {lm_eval.__version__}",
    }


def _check_model(logged: LoggedRun, lm: Any, options: ProbeRunOptions) -> None:
    logged.check_tokenizer(lm.tokenizer, lm.eot_token_id)
    theirs = logged.config.get("model_num_parameters")
    mine = lm.get_model_info().get("model_num_parameters") if hasattr(lm, "get_model_info") else None
    if (isinstance(theirs, int) and theirs > 0 and isinstance(mine, int) and mine > 0 and theirs != mine
            and not options.allow_other_model):
        raise ProbeRunError(f"{logged.results_path}: the run's model has {theirs:,} parameters, the probing model "
                            f"{mine:,}: another model (--allow_other_model probes it over the run's responses anyway)")


def _num_fewshot(logged: LoggedRun, options: ProbeRunOptions) -> int | None:
    if options.num_fewshot is not None:
        return options.num_fewshot
    shots = {(logged.results.get("n-shot") or {}).get(name) for name in logged.tasks}
    return shots.pop() if len(shots) == 1 and None not in shots else None


def _replay_notes(lm: Any, logged: LoggedRun, doc_ids: Mapping[str, list[int]], samples: Mapping[str, list[dict]]) -> dict:
    """Per task, how its responses were replayed; each generated sample gets its own note (``probe_run``)."""
    from lm_eval.models.utils import handle_stop_sequences

    from lm_eval_probes.models.replay import replayed_tokens

    eos = lm.tok_decode(lm.eot_token_id, skip_special_tokens=False)
    notes = {}
    for name, task in logged.tasks.items():
        if task.output_type != "generate_until":
            notes[name] = {"documents": len(doc_ids[name]), "output_type": task.output_type,
                           "response": "the option the logged log-likelihoods choose"}
            continue
        per_doc = {}
        for doc_id in doc_ids[name]:
            document = task.documents[doc_id]
            kwargs = document.arguments[0][1] if len(document.arguments[0]) > 1 else {}
            stop = handle_stop_sequences(kwargs.get("until") if isinstance(kwargs, dict) else None, eos=eos)
            prompt = str(document.arguments[0][0])
            replays = [replayed_tokens(lm, text, stop, prompt) for text in document.responses[0]]
            per_doc[doc_id] = {
                "flagged": not all(r.faithful for r in replays),
                "reencoded_tokens": [len(r.ids) for r in replays],
                "text_round_trip": all(r.round_trip for r in replays),
                "lossy_text": any(r.lossy for r in replays),
                "stop_merge": any(r.stop_merge for r in replays),
                "boundary_merge": any(r.boundary_merge for r in replays),
                "empty": any(not text for text in document.responses[0]),
            }
        for sample in samples.get(name, []):
            note = per_doc.get(int(sample["doc_id"]))
            if note is not None:
                sample[SAMPLE_KEY] = note
        notes[name] = {
            "documents": len(per_doc), "output_type": task.output_type,
            "response": "the logged response (lm_eval's resps: before the task's filters), re-encoded and "
                        "teacher-forced after its prompt",
            "flagged_documents": sum(n["flagged"] for n in per_doc.values()),
            "text_round_trip_failures": sum(not n["text_round_trip"] for n in per_doc.values()),
            "lossy_texts": sum(n["lossy_text"] for n in per_doc.values()),
            "stop_merges": sum(n["stop_merge"] for n in per_doc.values()),
            "boundary_merges": sum(n["boundary_merge"] for n in per_doc.values()),
            "empty_responses": sum(n["empty"] for n in per_doc.values()),
        }
    return notes


def probe_run(options: ProbeRunOptions, *, lm: Any | None = None, task_manager: Any | None = None,
              annotations: Mapping[str, Any] | None = None) -> Path:
    """Probe a finished run (see the module docstring); returns the written results file.

    Resumable: finished documents are kept under ``<output_path>/.probe-run/`` (removed at the end) and a rerun of
    the same command probes only the others.

    Args:
        lm: a loaded :class:`~lm_eval_probes.models.replay.ReplayHFLM` of ``options.model_args`` to reuse (a sweep
            probes several runs with one model load); ``None`` loads one.
        task_manager: a :class:`~lm_eval_probes.tasks.manager.ProbeTaskManager` to reuse (indexing lm_eval's tasks
            takes seconds); ``None`` builds one from ``options.include_path`` and ``options.metadata``.
        annotations: top-level keys added to the written results file.

    Raises:
        ProbeRunError: a run, task, prompt, tokenizer or model that does not match (named), or an output path inside
            the run's folder.
        ValueError: a bad ``probes`` / ``probe_*`` option.
    """
    from lm_eval_probes.config import ProbeConfig, split_model_args

    started = time.monotonic()
    logged = read_run(options.run, options.tasks)
    _check_output_path(options, logged)
    plugin, _hf = split_model_args(options.model_args)
    ProbeConfig.from_model_args({"probe_gen_capture": "teacher_forced", **plugin})  # before any model loads
    if "pretrained" not in options.model_args:
        raise ProbeRunError("--model_args needs pretrained= (the model that made the run, or one with its tokenizer)")
    doc_ids = selected_doc_ids(logged, options.limit)
    progress = ProgressFolder(options.output_path, _fingerprint(options, logged, doc_ids))
    resumed = {name: sum(progress.answered(name, i) is not None for i in ids) for name, ids in doc_ids.items()}

    import lm_eval
    from lm_eval.loggers import EvaluationTracker

    import lm_eval_probes
    from lm_eval_probes.harness.pretrained import check_pretrained, hub_offline
    from lm_eval_probes.models.replay import ReplayHFLM
    from lm_eval_probes.tasks.manager import ProbeTaskManager

    args = dict(options.model_args)
    replay = {"logged": {name: task.documents for name, task in logged.tasks.items()}, "doc_ids": doc_ids,
              "progress": progress, "documents_per_chunk": options.documents_per_chunk}
    if lm is None:
        check_pretrained(args["pretrained"], offline=hub_offline(), gguf_file=args.get("gguf_file"),
                         subfolder=args.get("subfolder"), trust_remote_code=args.get("trust_remote_code"))
        additional = {"batch_size": options.batch_size, "max_batch_size": options.max_batch_size,
                      "device": options.device or lm_eval_cli_device()}
        lm = ReplayHFLM(**args, **{k: v for k, v in additional.items() if v is not None}, **replay)
    elif isinstance(lm, ReplayHFLM):
        lm.replay_from(**replay)
    else:
        raise TypeError(f"lm must be a ReplayHFLM, got {type(lm).__name__}")
    _check_model(logged, lm, options)
    progress.rank = lm.rank
    if task_manager is None:
        include = [lm_eval_probes.tasks_dir()] + ([options.include_path] if options.include_path else [])
        task_manager = ProbeTaskManager(include_path=include, metadata=dict(options.metadata) or None)
    elif not isinstance(task_manager, ProbeTaskManager):
        raise TypeError(f"task_manager must be a ProbeTaskManager (its tasks report the probe rows), got "
                        f"{type(task_manager).__name__}")
    config = logged.config
    prefix = all(ids == list(range(len(ids))) for ids in doc_ids.values())
    counts = {len(ids) for ids in doc_ids.values()}
    selection: dict[str, Any]
    if prefix and len(counts) == 1:  # lm_eval's own --limit: the first documents of each task
        selection = {"limit": counts.pop()}
    else:
        selection = {"samples": {name: list(ids) for name, ids in doc_ids.items()}}
    tracker = EvaluationTracker(output_path=str(options.output_path))
    seeds = {key: config[name] for key, name in (("random_seed", "random_seed"), ("numpy_random_seed", "numpy_seed"),
                                                 ("torch_random_seed", "torch_seed"),
                                                 ("fewshot_random_seed", "fewshot_seed")) if config.get(name) is not None}
    model_args = {**args, "probe_gen_capture": "teacher_forced"}
    results = lm_eval.simple_evaluate(
        model=lm, model_args=model_args, tasks=list(logged.tasks), task_manager=task_manager,
        num_fewshot=_num_fewshot(logged, options), batch_size=options.batch_size,
        max_batch_size=options.max_batch_size, device=options.device or lm_eval_cli_device(), log_samples=True,
        evaluation_tracker=tracker,
        gen_kwargs=config.get("gen_kwargs") or None,
        bootstrap_iters=int(config.get("bootstrap_iters", 100000) or 0),
        apply_chat_template=bool(logged.results.get("chat_template")),
        system_instruction=logged.results.get("system_instruction"),
        fewshot_as_multiturn=bool(logged.results.get("fewshot_as_multiturn")),
        **seeds, **selection,
    )
    if results is None:  # a non-zero rank: rank 0 writes
        return options.output_path
    samples = results.pop("samples", None) or {}
    results["config"]["model"] = "hf-probes"
    results[PROBE_RUN_KEY] = {
        "source_results": str(logged.results_path.resolve()),
        "source_samples": {name: str(task.samples.resolve()) for name, task in logged.tasks.items()},
        "source_model": logged.model_type,
        "source_model_args": config.get("model_args"),
        "resumed_documents": resumed,
        "tasks": _replay_notes(lm, logged, doc_ids, samples),
        "seconds": round(time.monotonic() - started, 3),
    }
    results.update(annotations or {})
    tracker.save_results_aggregated(results=results, samples=samples)
    for name in results["configs"]:
        if name in samples:
            tracker.save_results_samples(task_name=name, samples=samples[name])
    written = sorted(Path(options.output_path).rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    progress.remove()
    return written[-1]
