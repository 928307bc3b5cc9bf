"""Virtual environments the tests need beside ``.venv``, built once per machine and kept in the user's cache
(``$XDG_CACHE_HOME/lm-eval-probes`` or ``~/.cache/lm-eval-probes``): another stack of torch and transformers
(``test_other_stack.py``) and every-eval-ever's validator on a Python >= 3.12 (``test_every_eval_ever_validator.py``).

An environment is marked complete when its last install has passed, so a build that was stopped is started over,
never used half-made; pip installs from the package index without this machine's cap on
torch (``/etc/xdg/pip``), without pip's cache (a CUDA build of torch is several GB)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lm-eval-probes"


def _last_lines(text: str, lines: int = 5) -> str:
    kept = [line for line in text.splitlines() if line.strip() and not line.startswith("WARNING: Location")]
    return "\n".join(kept[-lines:])


def cached_venv(name: str, python: str, installs: Sequence[Sequence[str]]) -> Path:
    """The ``bin/python`` of the environment ``name`` made by ``python -m venv``, then ``pip install`` of each of
    ``installs`` in turn; built at the first call on this machine. A failing install raises with pip's last lines."""
    folder = cache_root() / name
    complete = folder / ".complete"
    if complete.exists():
        return folder / "bin" / "python"
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-m", "venv", str(folder)], check=True, capture_output=True, timeout=300)
    free = Path(tempfile.mkdtemp()) / "no-constraints.txt"
    free.write_text("")
    environment = {**os.environ, "PIP_CONSTRAINT": str(free)}
    environment.pop("VIRTUAL_ENV", None)
    for arguments in ([["--upgrade", "pip"]] + [list(a) for a in installs]):
        done = subprocess.run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q", "--no-cache-dir",
                               "--disable-pip-version-check", *arguments], capture_output=True, text=True,
                              timeout=1800, env=environment)
        if done.returncode != 0:
            raise RuntimeError(f"building {name}: pip install {' '.join(arguments)} failed:\n{_last_lines(done.stderr)}")
    complete.write_text(" ".join(" ".join(a) for a in installs) + "\n")
    return folder / "bin" / "python"


def cached_wheel(requirement: str, python_version: str) -> Path:
    """The wheel of ``requirement`` (one release, ``name==version``) for CPython ``python_version``, downloaded once
    per machine into the cache (``pip download --no-deps --only-binary=:all:``)."""
    name, version = requirement.split("==")
    folder = cache_root() / "wheels"
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(folder.glob(pattern))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                               "--disable-pip-version-check", "--python-version", python_version, "-d", str(folder),
                               requirement], capture_output=True, text=True, timeout=900)
        found = sorted(folder.glob(pattern))
        if done.returncode != 0 or not found:
            raise RuntimeError(f"pip download {requirement} failed:\n{_last_lines(done.stderr)}")
    return found[0]
