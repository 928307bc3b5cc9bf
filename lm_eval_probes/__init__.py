"""lm-eval-probes: hidden-state probes (δ_TCB, BTE, …) reported next to accuracy in lm-evaluation-harness.

Importing this package is cheap (no torch): it registers a lazy ``hf-probes`` placeholder in lm_eval's
model registry; the model class (and the probe metrics) load on first use. ``TASKS_DIR`` is the folder
of the packaged task YAMLs, for ``TaskManager(include_path=lm_eval_probes.TASKS_DIR)`` or
``--include_path``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

__version__ = "0.1.0"
MODEL_NAME = "hf-probes"


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
    """Register the lazy ``hf-probes`` model placeholder (idempotent)."""
    import lm_eval.models  # noqa: F401  (built-in placeholders first, else they get hidden)
    from lm_eval.api.registry import model_registry

    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME, target="lm_eval_probes.models:ProbeHFLM")


def __getattr__(name: str) -> Any:
    if name == "TASKS_DIR":
        return tasks_dir()
    if name == "ProbeTaskManager":
        from lm_eval_probes.tasks.probe_task import ProbeTaskManager

        return ProbeTaskManager
    raise AttributeError(f"module 'lm_eval_probes' has no attribute {name!r}")


register()
