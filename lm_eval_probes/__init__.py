"""lm-eval-probes: hidden-state probes (δ_TCB, BTE, …) reported next to accuracy in lm-evaluation-harness.

Importing this package has no side effects and imports neither torch nor lm_eval. A regular install
registers the ``hf-probes`` model with lm_eval when lm_eval's model registry is first imported (a ``.pth`` file puts
an import finder on ``sys.meta_path``, which imports nothing itself); elsewhere (an
editable install) call :func:`register` once. ``TASKS_DIR`` is the folder of the packaged task YAMLs,
for ``ProbeTaskManager(include_path=lm_eval_probes.TASKS_DIR)`` or ``--include_path``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

__version__ = "0.2.0"


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
