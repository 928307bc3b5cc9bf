"""Is ``pretrained=`` there? The check that runs before any model is built, with a message a person can act on.

Without it a missing folder reaches ``transformers`` as a hub id and comes back, after two chained tracebacks, as
``Repo id must be in the form 'repo_name' or 'namespace/repo_name'`` — which never says the folder is missing.
:func:`check_pretrained` says what is missing instead:

* a value that names a path (absolute, ``./``, ``../``, ``~``, a parent folder that exists, or more than one ``/``,
  which no hub id has) where nothing is: ``no model folder at PATH``;
* a folder without ``config.json`` (and without the ``gguf_file`` it was given): that, and what the folder holds;
  a folder of GGUF files without ``gguf_file=``: the file names to pass;
* offline (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``) with a hub id that is not in the Hugging Face cache: that
  it is not cached and that the run is offline;
* a model whose config needs code from its own repository (an ``auto_map`` with a ``model_type`` transformers does
  not know: LLaDA, Dream) while the user did not give ``trust_remote_code=True``: that option, named
  (:class:`RemoteCodeNeeded`). Nothing in the plugin turns it on: running a repository's code needs the user's word.

Torch-free and lm_eval-free (it imports ``huggingface_hub.constants`` only for the cache folder): the
``lm-eval-probes run`` preflight and the sweep call it before importing torch or loading a model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_TRUE = ("1", "ON", "YES", "TRUE")
_SHOWN = 8
"""At most this many entries of a folder are listed in a message."""


class ModelNotFound(OSError):
    """``pretrained=`` names no loadable model: a missing folder, a folder without ``config.json`` (or without its
    ``gguf_file``), or a hub id that is not cached while the run is offline.

    A subclass of :class:`OSError` (what ``transformers`` raises for a model it cannot find), so code that catches
    that keeps working; its message is one line that names the path or id and what is missing."""


class RemoteCodeNeeded(ModelNotFound):
    """The model's config needs code from its repository and ``trust_remote_code=True`` was not given. A
    :class:`ModelNotFound` (a model that cannot load as asked), so every place that reports one in one line reports
    this one too."""


def hub_offline(environ: Mapping[str, str] | None = None) -> bool:
    """Whether Hugging Face downloads are off: ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is 1/on/yes/true."""
    env = os.environ if environ is None else environ
    return any(str(env.get(name, "")).strip().upper() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def looks_like_path(value: str) -> bool:
    """Whether ``value`` names a local path rather than a hub id (``namespace/name``): absolute, starting with
    ``./``, ``../`` or ``~``, a Windows drive or backslash path, more than one ``/``, or a first part that is an
    existing folder here."""
    if value.startswith(("/", "./", "../", "~", ".\\", "..\\")) or value in (".", "..") or "\\" in value:
        return True
    if len(value) > 1 and value[1] == ":":  # C:...
        return True
    if value.count("/") > 1:
        return True
    parent = os.path.dirname(value)
    return bool(parent) and os.path.isdir(parent)


def _listing(folder: Path) -> str:
    try:
        names = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in folder.iterdir())
    except OSError as error:
        return f"it cannot be listed ({error.strerror or error})"
    if not names:
        return "it is empty"
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return "it holds " + ", ".join(names[:_SHOWN]) + more


def _check_folder(folder: Path, *, gguf_file: str | None, subfolder: str) -> None:
    where = folder / subfolder if subfolder else folder
    if not where.is_dir():
        raise ModelNotFound(f"no model folder at {where}" + (f" (subfolder={subfolder!r} of {folder})" if subfolder else ""))
    if gguf_file:
        if not (where / gguf_file).is_file():
            raise ModelNotFound(f"no GGUF file {gguf_file!r} in the model folder {where}: {_listing(where)}")
        return
    if (where / "config.json").is_file():
        return
    ggufs = sorted(path.name for path in where.glob("*.gguf"))
    if ggufs:
        raise ModelNotFound(f"the model folder {where} has no config.json but GGUF files: pass gguf_file={ggufs[0]}"
                            + (f" (or one of {', '.join(ggufs[1:_SHOWN])})" if len(ggufs) > 1 else ""))
    raise ModelNotFound(f"the model folder {where} has no config.json (not a saved Hugging Face model): {_listing(where)}")


def _cached_files(repo_id: str, wanted: str) -> list[Path]:
    """``wanted`` (a path inside the repo) in each snapshot of the model repo ``repo_id`` in the Hugging Face cache
    that has it."""
    from huggingface_hub.constants import HF_HUB_CACHE

    snapshots = Path(HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    try:
        return [snapshot / wanted for snapshot in snapshots.iterdir() if (snapshot / wanted).is_file()]
    except OSError:
        return []


def _in_repo(name: str, subfolder: str) -> str:
    return str(Path(subfolder) / name) if subfolder else name


def _cached(repo_id: str, *, gguf_file: str | None, subfolder: str) -> bool:
    """Whether some snapshot of the model repo ``repo_id`` in the Hugging Face cache has its ``config.json``
    (or its ``gguf_file``)."""
    return bool(_cached_files(repo_id, _in_repo(gguf_file or "config.json", subfolder)))


def gives_trust(value: Any) -> bool:
    """Whether a ``trust_remote_code`` model argument says yes (``True``, or the strings true/1/yes/on)."""
    return value is True or str(value).strip().upper() in _TRUE


def needs_remote_code(config: Mapping[str, Any]) -> bool:
    """Whether a model's ``config.json`` can only be read with its repository's code: it maps the auto classes to
    its own (``auto_map``) and its ``model_type`` is not one transformers knows (as transformers decides it)."""
    if "auto_map" not in config:
        return False
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return config.get("model_type") not in CONFIG_MAPPING_NAMES


def _check_remote_code(text: str, config_files: list[Path], trust_remote_code: Any) -> None:
    if gives_trust(trust_remote_code):
        return
    for path in config_files:
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # transformers reports an unreadable config itself
        if isinstance(config, dict) and needs_remote_code(config):
            raise RemoteCodeNeeded(
                f"{text} (model_type {config.get('model_type')!r}) runs code from its own repository, which needs "
                "your explicit word: add trust_remote_code=True to the model arguments if you trust it")


def check_pretrained(value: Any, *, offline: bool, gguf_file: str | None = None, subfolder: str | None = None,
                     trust_remote_code: Any = None) -> None:
    """Raise :class:`ModelNotFound` when ``pretrained=value`` cannot be a model, before anything is loaded.

    Args:
        value: lm_eval's ``pretrained`` model argument: a folder or a hub id (``namespace/name``). Anything but a
            string (an already-built model object, as lm_eval's Python API accepts) is not checked.
        offline: whether the run may not download (see :func:`hub_offline`); then a hub id must be in the
            Hugging Face cache (``HF_HUB_CACHE``), in any snapshot.
        gguf_file: the ``gguf_file`` model argument: the folder must hold this file and needs no ``config.json``.
        subfolder: the ``subfolder`` model argument: where in the folder (or repo) the model is.
        trust_remote_code: the ``trust_remote_code`` model argument as given (unset: ``None``). A folder's or a
            cached hub snapshot's ``config.json`` that needs its repository's code is refused without it.

    Raises:
        ModelNotFound: ``no model folder at PATH`` (a path where nothing is, or a file); ``the model folder PATH has
            no config.json …: it holds …``; ``no GGUF file …``; ``… is not in the Hugging Face cache and the run is
            offline …``. Online, a hub id is not checked (the hub answers for it).
        RemoteCodeNeeded: ``… runs code from its own repository …: add trust_remote_code=True …``.
    """
    if not isinstance(value, (str, os.PathLike)):
        return
    text = os.fspath(value).strip()
    if not text:
        raise ModelNotFound("pretrained= is empty: give a model folder or a Hugging Face hub id (namespace/name)")
    path = Path(text).expanduser()
    sub = (subfolder or "").strip()
    if path.is_dir():
        _check_folder(path.resolve(), gguf_file=gguf_file, subfolder=sub)
        if not gguf_file:
            _check_remote_code(text, [path.resolve() / _in_repo("config.json", sub)], trust_remote_code)
        return
    if looks_like_path(text) or path.exists():
        absolute = path.resolve()
        if path.is_file():
            hint = f" (a GGUF file: pass pretrained={absolute.parent},gguf_file={absolute.name})" \
                if absolute.suffix == ".gguf" else ""
            raise ModelNotFound(f"no model folder at {absolute}: it is a file{hint}")
        raise ModelNotFound(f"no model folder at {absolute}")
    if offline and not _cached(text, gguf_file=gguf_file, subfolder=sub):
        from huggingface_hub.constants import HF_HUB_CACHE

        raise ModelNotFound(
            f"the model {text!r} is not in the Hugging Face cache ({HF_HUB_CACHE}) and the run is offline "
            "(HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set): download it once online, or give a local folder")
    if not gguf_file:
        _check_remote_code(text, _cached_files(text, _in_repo("config.json", sub)), trust_remote_code)
