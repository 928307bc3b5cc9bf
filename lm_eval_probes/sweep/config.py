"""The sweep's configuration: models × tasks and one uniform setup, parsed into frozen dataclasses and validated
(unknown keys name the valid ones, the plugin's ``probe_*`` options are checked) without lm_eval, torch or YAML
imported at module level; and the ``--shard K/N`` selection of pairs."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lm_eval_probes.config import DEFAULT_PROBES, ProbeConfig, split_model_args, unknown_message



DEFAULT_PROBE_SET = "+".join(DEFAULT_PROBES)
"""The sweep's default ``probes``: the wrapper's default set (the cheap probes; ``all`` adds Ω)."""

SWEEP_KEY = "lm_eval_probes_sweep"
"""Top-level key added to each results file: the sweep's model label (read by the report), task, shard, model type
and the device the model ran on."""

CONFIG_KEYS: tuple[str, ...] = (
    "models", "tasks", "output_dir", "probes", "seeds", "limit", "num_fewshot", "batch_size", "max_batch_size",
    "device", "gen_kwargs", "metadata", "apply_chat_template", "bootstrap_iters", "log_samples",
)
MODEL_KEYS: tuple[str, ...] = ("name", "model", "model_args", "generate_with", "generate_args", "samples", "fallback")
GENERATE_FALLBACKS: tuple[str, ...] = ("hf-probes",)
"""What ``fallback`` may name: the model type that generates (and probes) a pair when ``generate_with``'s backend is
not installed."""
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
        generate_with: an lm_eval model type that generates the responses (``vllm``, ``sglang``, ``hf``): it runs
            each pair with ``--log_samples`` into ``<output_dir>/generations/<name>/<task>/`` (one instance for all of
            them, released before the probing model loads), then ``probe-run`` probes its samples with this model
            (``hf-probes``, one forward per document); ``None``: ``hf-probes`` generates and probes at once.
        generate_args: the generating model's ``model_args`` (default: ``model_args`` without the plugin's keys).
        samples: a folder of finished lm_eval runs of this model (with ``--log_samples``): each pair runs
            ``probe-run`` on the newest run there that has the task's samples, generating nothing.
        fallback: ``hf-probes``: when ``generate_with``'s backend is not installed, generate with ``hf-probes``
            instead (said in the progress line and the pair's status); ``None``: the pair fails, saying so.
    """

    name: str
    model: str = "hf-probes"
    model_args: Mapping[str, Any] = field(default_factory=dict)
    generate_with: str | None = None
    generate_args: Mapping[str, Any] | None = None
    samples: Path | None = None
    fallback: str | None = None

    def generation_args(self) -> dict[str, Any]:
        """The generating model's ``model_args``: ``generate_args``, else ``model_args`` without the plugin's keys."""
        if self.generate_args is not None:
            return dict(self.generate_args)
        return split_model_args(self.model_args)[1]


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


def _parse_model(index: int, raw: Any, base_dir: Path | None = None) -> SweepModel:
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
    model = str(raw.get("model", "hf-probes"))
    generate_with, samples, fallback = raw.get("generate_with"), raw.get("samples"), raw.get("fallback")
    generate_args = raw.get("generate_args")
    _require(generate_with is None or (isinstance(generate_with, str) and generate_with.strip() != ""),
             f"{where}.generate_with must be an lm_eval model type (vllm, sglang, hf), got {generate_with!r}")
    _require(generate_with is None or "diffusion" not in str(generate_with),
             f"{where}.generate_with: {generate_with!r} does not generate left to right; probe-run needs an "
             "autoregressive model's responses")
    _require(generate_with is None or samples is None,
             f"{where}: generate_with and samples exclude each other (generate the responses, or use existing ones)")
    _require((generate_with is None and samples is None) or model == "hf-probes",
             f"{where}: generate_with and samples are probed by probe-run with model hf-probes, got model {model!r}")
    _require(generate_args is None or (isinstance(generate_args, Mapping) and generate_with is not None),
             f"{where}.generate_args must be a mapping, given with generate_with, got {generate_args!r}")
    _require(fallback is None or (generate_with is not None and fallback in GENERATE_FALLBACKS),
             f"{where}.fallback must be {' or '.join(GENERATE_FALLBACKS)}, given with generate_with, got {fallback!r}")
    _require(samples is None or isinstance(samples, str), f"{where}.samples must be a folder, got {samples!r}")
    folder = None
    if samples is not None:
        folder = Path(samples)
        if not folder.is_absolute() and base_dir is not None:
            folder = base_dir / folder
    return SweepModel(name=name, model=model, model_args=dict(model_args),
                      generate_with=None if generate_with is None else str(generate_with).strip(),
                      generate_args=None if generate_args is None else dict(generate_args), samples=folder,
                      fallback=fallback)


def _parse_seeds(value: Any) -> tuple[int, int, int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * 4  # type: ignore[return-value]
    _require(isinstance(value, (list, tuple)) and len(value) == 4 and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
             f"seeds must be one integer or 4 integers (random, numpy, torch, fewshot), got {value!r}")
    return tuple(value)  # type: ignore[return-value]


def parse_config(raw: Mapping[str, Any], *, base_dir: Path | None = None) -> SweepConfig:
    """Validate a parsed YAML mapping into a :class:`SweepConfig` (no model or lm_eval is loaded).

    ``output_dir`` and a model's ``samples`` are resolved against ``base_dir`` (the config file's folder) when
    relative.

    Raises:
        SweepConfigError: an unknown key (with the valid ones and a did-you-mean), a missing or ill-typed
            value, duplicate model names or tasks, a bad ``probe_*`` option.
    """
    _require(isinstance(raw, Mapping), f"a sweep config must be a mapping of {', '.join(CONFIG_KEYS)}, got {type(raw).__name__}")
    _check_keys("sweep config", raw, CONFIG_KEYS)
    for key in ("models", "tasks", "output_dir"):
        _require(key in raw, f"the sweep config needs '{key}'")
    _require(isinstance(raw["models"], list) and raw["models"], "models must be a non-empty list")
    models = tuple(_parse_model(i, m, base_dir) for i, m in enumerate(raw["models"]))
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


