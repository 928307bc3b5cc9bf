"""lm-eval-probes: hidden-state probes (δ_TCB, BTE, …) reported next to accuracy in lm-evaluation-harness.

Importing this package has no side effects and imports neither torch nor lm_eval. A regular install
registers the ``hf-probes`` model with lm_eval when lm_eval's model registry is first imported (a ``.pth`` file puts
an import finder on ``sys.meta_path``, which imports nothing itself); elsewhere (an
editable install) call :func:`register` once. ``TASKS_DIR`` is the folder of the packaged task YAMLs,
for ``ProbeTaskManager(include_path=lm_eval_probes.TASKS_DIR)`` or ``--include_path``.

Run from a clone's root (``python -m lm_eval --model hf-probes …``, a notebook), ``import lm_eval_probes`` finds the
source folder before the installed package; the repository's top-level ``metrics/`` and ``tasks/`` then stand for
``lm_eval_probes.metrics`` and ``lm_eval_probes.tasks``, as ``setup.cfg``'s ``package_dir`` maps them in an install
(:class:`SourceTreeSubpackages`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import Any

__version__ = "0.2.0"

SOURCE_SUBPACKAGES = ("metrics", "tasks")
"""The subpackages whose source is a top-level folder of the repository (``setup.cfg``'s ``package_dir``)."""


class SourceTreeSubpackages(importlib.abc.MetaPathFinder):
    """Finds ``lm_eval_probes.metrics`` and ``lm_eval_probes.tasks`` in the repository's top-level folders when the
    package is imported from its source folder (a clone's root on ``sys.path``). Last on ``sys.meta_path``: an
    install or an editable install that maps them answers first; it imports nothing itself."""

    def __init__(self, folders: dict[str, Path]) -> None:
        self.folders = folders

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


def _map_source_subpackages() -> None:
    here = Path(__file__).resolve().parent
    root = here.parent
    if not (root / "setup.cfg").is_file():
        return  # an install: the subpackages sit inside the package
    folders = {f"{__name__}.{name}": root / name for name in SOURCE_SUBPACKAGES
               if not (here / name).exists() and (root / name / "__init__.py").is_file()}
    if folders and not any(isinstance(finder, SourceTreeSubpackages) for finder in sys.meta_path):
        sys.meta_path.append(SourceTreeSubpackages(folders))


_map_source_subpackages()


def package_folder(name: str, hint: str) -> str:
    """Folder of an installed package, found without importing it (``hint`` says how to install it)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{name} is not installed: {hint}")
    return list(spec.submodule_search_locations)[0]


def tasks_dir() -> str:
    """Folder of the packaged task YAMLs (works for wheel and editable installs alike)."""
    return package_folder("lm_eval_probes.tasks", "reinstall lm-eval-probes")


def register() -> None:
    """Register the lazy ``hf-probes`` and ``hf-probes-diffusion`` model placeholders with lm_eval (idempotent)."""
    from lm_eval_probes.harness.registry import register_model_placeholder

    register_model_placeholder()


def __getattr__(name: str) -> Any:
    if name == "TASKS_DIR":
        return tasks_dir()
    if name == "ProbeTaskManager":
        from lm_eval_probes.tasks.manager import ProbeTaskManager

        return ProbeTaskManager
    raise AttributeError(f"module 'lm_eval_probes' has no attribute {name!r}")
