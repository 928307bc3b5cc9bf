"""Is ``pretrained=`` there? The check that runs before any model is built, with a message a person can act on.

Without it a missing folder reaches ``transformers`` as a hub id and comes back, after two chained tracebacks, as
``Repo id must be in the form 'repo_name' or 'namespace/repo_name'`` — which never says the folder is missing.
:func:`check_pretrained` says what is missing instead:

* a value that names a path (absolute, ``./``, ``../``, ``~``, a parent folder that exists, or more than one ``/``,
  which no hub id has) where nothing is: ``no model folder at PATH``;
* a folder without ``config.json`` (and without the ``gguf_file`` it was given): that, and what the folder holds;
  a folder of GGUF files without ``gguf_file=``: the file names to pass;
* offline (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``) with a hub id that is not in the Hugging Face cache: that
  it is not cached and that the run is offline.

Torch-free and lm_eval-free (it imports ``huggingface_hub.constants`` only for the cache folder): the
``lm-eval-probes run`` preflight and the sweep call it before importing torch or loading a model.
"""

from __future__ import annotations

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


def _cached(repo_id: str, *, gguf_file: str | None, subfolder: str) -> bool:
    """Whether some snapshot of the model repo ``repo_id`` in the Hugging Face cache has its ``config.json``
    (or its ``gguf_file``)."""
    from huggingface_hub.constants import HF_HUB_CACHE

    snapshots = Path(HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    wanted = str(Path(subfolder) / (gguf_file or "config.json")) if subfolder else (gguf_file or "config.json")
    try:
        return any((snapshot / wanted).is_file() for snapshot in snapshots.iterdir())
    except OSError:
        return False


def check_pretrained(value: Any, *, offline: bool, gguf_file: str | None = None, subfolder: str | None = None) -> None:
    """Raise :class:`ModelNotFound` when ``pretrained=value`` cannot be a model, before anything is loaded.

    Args:
        value: lm_eval's ``pretrained`` model argument: a folder or a hub id (``namespace/name``). Anything but a
            string (an already-built model object, as lm_eval's Python API accepts) is not checked.
        offline: whether the run may not download (see :func:`hub_offline`); then a hub id must be in the
            Hugging Face cache (``HF_HUB_CACHE``), in any snapshot.
        gguf_file: the ``gguf_file`` model argument: the folder must hold this file and needs no ``config.json``.
        subfolder: the ``subfolder`` model argument: where in the folder (or repo) the model is.

    Raises:
        ModelNotFound: ``no model folder at PATH`` (a path where nothing is, or a file); ``the model folder PATH has
            no config.json …: it holds …``; ``no GGUF file …``; ``… is not in the Hugging Face cache and the run is
            offline …``. Online, a hub id is not checked (the hub answers for it).
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
