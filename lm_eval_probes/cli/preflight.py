"""What ``lm-eval-probes run`` checks before it imports torch or builds a model: the probe names, every ``probe_*``
and ``diffusion_*`` option and its value, ``pretrained=`` (:mod:`lm_eval_probes.harness.pretrained`) and the task
names. A bad one is a :class:`PreflightError` whose message is one line: what is wrong, the did-you-mean, and where
the valid list is; ``lm-eval-probes`` prints it and exits 2 within a second or two instead of after the start-up.

The run's arguments are read with lm_eval's own parser (``lm_eval._cli``: no torch), so ``-M``/``-a``/``-t``,
``--model_args`` as several ``key=value`` words or a JSON object, ``--tasks a,b c`` and ``--config run.yaml`` mean
what they mean to lm_eval. The task names are found by reading the ``task:``, ``group:`` and ``tag:`` entries of
the task YAMLs as text (not parsing them as lm_eval's task index does, which takes 15-25 s of a core for lm_eval's
~14,000 files); the names of lm_eval's own folder are kept in a small cache file per lm_eval version
(:func:`cache_folder`). Nothing here imports torch, transformers or lm_eval's tasks.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL_TYPES: tuple[str, ...] = ("hf-probes", "hf-probes-diffusion")
"""The plugin's model types: their ``probe_*`` / ``diffusion_*`` options are checked."""
HF_MODEL_TYPES: tuple[str, ...] = ("hf", "hf-auto", "huggingface", *MODEL_TYPES)
"""Model types whose ``pretrained=`` is a Hugging Face folder or hub id (checked by :func:`check_pretrained`)."""
HELP = "lm-eval-probes --help"


class PreflightError(ValueError):
    """A run that cannot start; the message is the one line ``lm-eval-probes`` prints."""


@dataclass(frozen=True)
class RunArguments:
    """What the preflight reads of an ``lm-eval-probes run`` command line (after ``--config`` is merged).

    Attributes:
        model: ``--model`` (``None`` when not given: lm_eval's default, ``hf``).
        model_args: ``--model_args`` as lm_eval's parser makes it (values may be str, int, float, bool), with
            ``trust_remote_code=True`` where ``--trust_remote_code`` was given.
        tasks: the ``--tasks`` items, comma-split.
        include_path: ``--include_path``.
    """

    model: str | None
    model_args: Mapping[str, Any] = field(default_factory=dict)
    tasks: tuple[str, ...] = ()
    include_path: str | None = None


def read_run_arguments(argv: Sequence[str]) -> RunArguments | None:
    """The run's model, ``model_args``, tasks and include path, read by lm_eval's own parser; ``None`` for
    anything that is not a run (``ls``, ``validate``, ``--help``, no arguments) or that lm_eval's parser refuses
    (lm_eval then says why itself)."""
    if not argv or {"-h", "--help"} & set(argv) or argv[0] in ("ls", "validate") or list(argv) == ["run"]:
        return None
    from lm_eval._cli import HarnessCLI

    saved = sys.argv
    sys.argv = ["lm-eval-probes", *argv]
    try:
        parser = HarnessCLI()
        with open(os.devnull, "w") as quiet:
            stderr, sys.stderr = sys.stderr, quiet
            try:
                namespace = parser.parse_args()
            except SystemExit:
                return None
            finally:
                sys.stderr = stderr
    finally:
        sys.argv = saved
    if getattr(namespace, "command", None) != "run":
        return None
    values = {k: v for k, v in vars(namespace).items() if v or v == 0}
    if values.get("config"):
        values = {**_yaml_config(values["config"]), **values}
    model_args = values.get("model_args") or {}
    if isinstance(model_args, str):
        model_args = parse_arg_string(model_args)
    model_args = dict(model_args)
    if values.get("trust_remote_code"):  # lm_eval's --trust_remote_code gives it to the model as a model argument
        model_args.setdefault("trust_remote_code", True)
    tasks = values.get("tasks") or ()
    if isinstance(tasks, str):
        tasks = [tasks]
    return RunArguments(
        model=values.get("model"), model_args=dict(model_args),
        tasks=tuple(t.strip() for item in tasks for t in str(item).split(",") if t.strip()),
        include_path=values.get("include_path"),
    )


def _yaml_config(path: str) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise PreflightError(f"--config {path}: cannot be read ({error.strerror or error})") from None
    except yaml.YAMLError as error:
        raise PreflightError(f"--config {path} is not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(data, dict):
        raise PreflightError(f"--config {path} must be a mapping of lm_eval run options, got {type(data).__name__}")
    return data


def parse_arg_string(text: str) -> dict[str, str]:
    """``a=1,b=x`` (or a JSON object) → a dict; values stay strings (the options' parsers take strings)."""
    text = text.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise PreflightError(f"model_args is not a valid JSON object: {error}") from None
        return dict(value)
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise PreflightError(f"model_args: expected key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


# ----------------------------------------------------------------------------------------- model_args


def check_model_args(model: str | None, model_args: Mapping[str, Any]) -> None:
    """The ``probes``, ``probe_*`` and (for ``hf-probes-diffusion``) ``diffusion_*`` options of the plugin's models,
    parsed as the wrappers parse them (:meth:`ProbeConfig.from_model_args`, :meth:`DiffusionConfig.from_model_args`).

    Raises:
        PreflightError: the options' own message (unknown option or probe with a did-you-mean and the valid ones,
            or a bad value), followed by where the list is.
    """
    if model not in MODEL_TYPES:
        return
    from lm_eval_probes.config import ProbeConfig, split_model_args
    from lm_eval_probes.models.diffusion_config import DiffusionConfig, split_diffusion_args

    import logging

    notices = logging.getLogger("lm_eval_probes.models.diffusion_config")  # the wrapper gives its notices itself
    level, notices.level = notices.level, logging.ERROR
    try:
        rest: Mapping[str, Any] = model_args
        if model == "hf-probes-diffusion":
            diffusion_args, rest = split_diffusion_args(model_args)
            DiffusionConfig.from_model_args(diffusion_args)
        else:
            stray = [key for key in model_args if key.startswith("diffusion_")]
            if stray:
                raise ValueError(f"{stray[0]!r} is an option of --model hf-probes-diffusion, not of hf-probes")
        plugin_args, _ = split_model_args(rest)
        ProbeConfig.from_model_args(plugin_args)
    except PreflightError:
        raise
    except ValueError as error:
        raise PreflightError(f"--model_args: {error} ({HELP} lists every option)") from None
    finally:
        notices.level = level


def check_model_folder(model: str | None, model_args: Mapping[str, Any]) -> None:
    """``pretrained=`` of a Hugging Face model type (:func:`~lm_eval_probes.harness.pretrained.check_pretrained`,
    offline when ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` says so)."""
    if (model or "hf") not in HF_MODEL_TYPES or "pretrained" not in model_args:
        return
    from lm_eval_probes.harness.pretrained import ModelNotFound, check_pretrained, hub_offline

    gguf = model_args.get("gguf_file")
    subfolder = model_args.get("subfolder")
    try:
        check_pretrained(str(model_args["pretrained"]), offline=hub_offline(),
                         gguf_file=str(gguf) if gguf else None, subfolder=str(subfolder) if subfolder else None,
                         trust_remote_code=model_args.get("trust_remote_code"))
    except ModelNotFound as error:
        raise PreflightError(f"pretrained: {error}") from None


# ----------------------------------------------------------------------------------------- task names

_NAME = r"['\"]?([^\s'\"#\[\]{},]+)['\"]?"
_KEY = r"['\"]?(?:task|group|tag)['\"]?:[ \t]*"
_SCALAR = re.compile(r"^" + _KEY + _NAME + r"[ \t]*(?:#.*)?$", re.M)
_INLINE = re.compile(r"^" + _KEY + r"\[([^\]\n]*)\]", re.M)
_BLOCK = re.compile(r"^" + _KEY + r"(?:#.*)?\n((?:(?:[ \t]+.*|-.*|#.*)?\n)+)", re.M)
_ITEM = re.compile(r"^[ \t]*-[ \t]*" + _NAME + r"[ \t]*(?:#.*)?$", re.M)
_NESTED = re.compile(r"^[ \t]+(?:-[ \t]*)?['\"]?(?:task|group)['\"]?:[ \t]*" + _NAME, re.M)


def yaml_task_names(text: str) -> set[str]:
    """Every name a task YAML defines or lists, read as text: the values of its top-level ``task:``, ``group:``
    and ``tag:`` keys (a scalar, an inline ``[a, b]`` list, or ``- item`` lines below) and nested ``task:`` /
    ``group:`` entries. Over-inclusive by design (a group's member names count too): it refuses a name no YAML
    mentions, never one lm_eval knows (a test compares it with lm_eval's task index)."""
    names = set(_SCALAR.findall(text)) | set(_NESTED.findall(text))
    for inline in _INLINE.findall(text):
        names.update(item.strip().strip("'\"") for item in inline.split(",") if item.strip())
    if "\n" in text:
        for block in _BLOCK.findall(text if text.endswith("\n") else text + "\n"):
            names.update(_ITEM.findall(block))
    return names


def is_yaml_name(name: str) -> bool:
    """A task YAML or a template it includes: ``*.yaml``, ``*.yml``, ``*yaml`` (``_default_template_yaml``) or a
    name without a suffix (lm_eval's ``naijarc``)."""
    return name.endswith((".yaml", ".yml", "yaml")) or "." not in name


def folder_task_names(folder: str | Path) -> set[str]:
    """:func:`yaml_task_names` over every task YAML and included template under ``folder`` (:func:`is_yaml_name`;
    a template's ``tag:`` names the tasks that include it)."""
    names: set[str] = set()
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if is_yaml_name(name):
                try:
                    with open(os.path.join(root, name), encoding="utf-8", errors="replace") as handle:
                        names |= yaml_task_names(handle.read())
                except OSError:
                    continue
    return names


def cache_folder() -> Path:
    """Where the names of lm_eval's own task folder are kept: ``$XDG_CACHE_HOME/lm_eval_probes`` (default
    ``~/.cache/lm_eval_probes``); delete it to rebuild."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lm_eval_probes"


def lm_eval_task_names() -> set[str]:
    """The names in lm_eval's installed task folder, from the cache file of this lm_eval version and folder
    (written on first use; rebuilt when the folder's modification time changes, as a reinstall does)."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return set()
    folder = Path(list(spec.submodule_search_locations)[0]) / "tasks"
    try:
        version = importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    stamp = f"{folder.resolve()}|{version}|{folder.stat().st_mtime_ns}"
    cache = cache_folder() / f"lm_eval-task-names-{version}-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.json"
    try:
        data = json.loads(cache.read_text(encoding="utf-8"))
        if data.get("stamp") == stamp:
            return set(data["names"])
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    names = folder_task_names(folder)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        temporary = cache.with_name(f".{cache.name}.{os.getpid()}")
        temporary.write_text(json.dumps({"stamp": stamp, "names": sorted(names)}), encoding="utf-8")
        os.replace(temporary, cache)
    except OSError:
        pass  # a read-only home: scanned again next time
    return names


def is_task_path(task: str) -> bool:
    """A ``--tasks`` item lm_eval reads as a file, folder or glob of YAMLs rather than a name."""
    return task.endswith((".yaml", ".yml")) or os.sep in task or "/" in task or Path(task).is_dir()


def check_tasks(tasks: Iterable[str], *, include_paths: Iterable[str | Path]) -> None:
    """Every task name is one that lm_eval's folder or an include path defines (a glob pattern must match one).

    Raises:
        PreflightError: ``unknown task 'x'. Did you mean 'y'?`` and where the list is (``lm-eval-probes ls tasks``).
    """
    wanted = [task for task in tasks if not is_task_path(task)]
    if not wanted:
        return
    known: set[str] = set()
    for folder in include_paths:
        known |= folder_task_names(folder)
    if any(task not in known for task in wanted):
        known |= lm_eval_task_names()
    for task in wanted:
        if task in known or (any(c in task for c in "*?[") and fnmatch.filter(known, task)):
            continue
        close = difflib.get_close_matches(task, sorted(known), n=1, cutoff=0.75)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise PreflightError(f"unknown task {task!r}.{hint} lm-eval-probes ls tasks lists every task "
                             "(the plugin's are probes_*)")


# ----------------------------------------------------------------------------------------- all of it


def preflight(argv: Sequence[str], *, tasks_dir: str) -> None:
    """Every check of this module on an ``lm-eval-probes`` command line (after :func:`~lm_eval_probes.__main__.rewrite_argv`);
    nothing for a command that is not a run.

    Raises:
        PreflightError: the first problem found, as one line.
    """
    run = read_run_arguments(argv)
    if run is None:
        return
    check_model_args(run.model, run.model_args)
    check_model_folder(run.model, run.model_args)
    include = [tasks_dir] + ([run.include_path] if run.include_path and run.include_path != tasks_dir else [])
    check_tasks(run.tasks, include_paths=[p for p in include if Path(p).is_dir()])
