"""Running a reproduction's tasks: one ``lm_eval.simple_evaluate`` through the plugin's task manager, with samples.

The same evaluation a user runs with ``lm-eval-probes run --log_samples``: the plugin's model (``hf-probes`` or
``hf-probes-diffusion``), the plugin's tasks, their rows; lm_eval's results and samples files are written under
``OUT/lm_eval`` (``lm-eval-probes report OUT/lm_eval`` reads them).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lm_eval_probes.config import join_probe_names
from lm_eval_probes.reproduce.statistics import Run

MODELS: tuple[str, ...] = ("hf-probes", "hf-probes-diffusion")


class ReproduceError(ValueError):
    """A reproduction that cannot run as asked (bad protocol, variant, model or arguments)."""


def parse_model_args(text: str) -> dict[str, str]:
    """``key=value,...`` (lm_eval's ``--model_args``; bare probe names after ``probes=`` joined with ``+``) → dict.

    Raises:
        ReproduceError: an item without ``=`` or with an empty key.
    """
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in join_probe_names(text or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ReproduceError(f"--model_args: expected key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def merge_model_args(given: dict[str, str], required: dict[str, str]) -> dict[str, str]:
    """The user's ``model_args`` with what the protocol needs: its probes added to the user's (``+``; ``all`` has
    them, ``none`` gives way), its other options set where the user did not set them."""
    merged = dict(given)
    for key, value in required.items():
        if key == "probes" and key in merged:
            have = [p for p in merged[key].split("+") if p and p != "none"]
            if "all" not in have:
                merged[key] = "+".join(have + [p for p in value.split("+") if p and p not in have])
        else:
            merged.setdefault(key, value)
    return merged


@dataclass(frozen=True)
class RunOptions:
    """How to run a protocol's tasks.

    Attributes:
        model: ``hf-probes`` or ``hf-probes-diffusion``.
        model_args: the model's arguments (the protocol's probes already merged in).
        tasks: the tasks to evaluate.
        limit: documents per task (``None``: all).
        data_dir: local benchmark files (the tasks' ``probes_data_dir``); ``None``: the Hugging Face hub.
        metadata: more task metadata (``noise_eta``, ``ece_bins``, ...).
        out: where lm_eval's files and the tables go.
        device, batch_size, num_fewshot, gen_kwargs, apply_chat_template: as lm_eval's options (``None``:
            lm_eval's / the task's).
        seed, n_resamples: the bootstrap's.
    """

    model: str
    model_args: dict[str, str]
    tasks: tuple[str, ...]
    out: Path
    limit: int | None = None
    data_dir: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    batch_size: str = "auto"
    num_fewshot: int | None = None
    gen_kwargs: str | None = None
    apply_chat_template: bool = False
    seed: int = 0
    n_resamples: int = 1000

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ReproduceError(f"--model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.limit is not None and self.limit < 1:
            raise ReproduceError(f"--limit must be a positive number of documents, got {self.limit}")
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise ReproduceError(f"--data_dir {self.data_dir!r} is not a folder")
        if self.n_resamples < 1:
            raise ReproduceError(f"--resamples must be >= 1, got {self.n_resamples}")

    def task_metadata(self) -> dict[str, Any]:
        data = {"probes_data_dir": str(Path(self.data_dir).resolve())} if self.data_dir else {}
        return {**data, **self.metadata}

    def model_args_text(self) -> str:
        return ",".join(f"{key}={value}" for key, value in self.model_args.items())


def _device(device: str | None) -> str:
    if device is not None:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _batch_size(text: str) -> int | str:
    return int(text) if str(text).isdigit() else text


def evaluate(options: RunOptions, *, lm: Any | None = None, output_dir: Path | None = None) -> Run:
    """Evaluate ``options.tasks`` once with samples and return them as a :class:`Run`; lm_eval's results and
    samples files go to ``output_dir`` (default ``options.out / "lm_eval"``).

    Args:
        lm: an already built model; ``None`` builds ``options.model`` from ``options.model_args``.
    """
    import lm_eval
    from lm_eval.loggers import EvaluationTracker

    import lm_eval_probes
    from lm_eval_probes.harness.registry import register_model_placeholder
    from lm_eval_probes.tasks.manager import ProbeTaskManager

    register_model_placeholder()
    manager = ProbeTaskManager(include_path=lm_eval_probes.tasks_dir(), metadata=options.task_metadata() or None)
    unknown = [task for task in options.tasks if task not in set(manager.all_tasks)]
    if unknown:
        raise ReproduceError(f"unknown task(s) {unknown}: is the plugin's task folder installed?")
    tracker = EvaluationTracker(output_path=str(output_dir or options.out / "lm_eval"))
    out = lm_eval.simple_evaluate(
        model=lm if lm is not None else options.model, model_args=None if lm is not None else options.model_args_text(),
        tasks=list(options.tasks), num_fewshot=options.num_fewshot, batch_size=_batch_size(options.batch_size),
        device=_device(options.device), limit=options.limit, log_samples=True, bootstrap_iters=0,
        gen_kwargs=options.gen_kwargs, apply_chat_template=options.apply_chat_template, task_manager=manager,
        evaluation_tracker=tracker,
    )
    if out is None:  # a non-zero rank of a distributed run
        raise ReproduceError("lm_eval returned no results on this process (run the reproduction on one process)")
    samples = out.pop("samples")
    label = options.model_args.get("pretrained", options.model)
    out.setdefault("config", {})["model_args"] = options.model_args_text()
    tracker.save_results_aggregated(results=out, samples=samples)
    for task in out["configs"]:
        if task in samples:
            # lm_eval stringifies a sample's responses in place: write copies, so the run keeps the records
            tracker.save_results_samples(task_name=task, samples=[dict(sample) for sample in samples[task]])
    return Run(results=out["results"], samples=samples, configs=out.get("configs", {}), model_label=label,
               seed=options.seed, n_resamples=options.n_resamples)


def describe(options: RunOptions) -> dict[str, Any]:
    """The run's setting as written into the reproduction's JSON (JSON-native)."""
    fields = dataclasses.asdict(options)
    fields["out"] = str(options.out)
    fields["tasks"] = list(options.tasks)
    return json.loads(json.dumps(fields, default=str))
