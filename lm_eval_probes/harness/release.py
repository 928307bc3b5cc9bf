"""Letting a model go before the next one loads: the commands that build several models in one process (a sweep's
models, a reproduction's passes) call :func:`release_models` between them, so that at most one is held at a time."""

from __future__ import annotations

import gc
import sys


def release_models() -> None:
    """Collect what no one holds any more (a model and its wrapper may keep each other in reference cycles), then hand
    CUDA's cached blocks back to the device (where torch is already imported and a GPU is there): the next model
    finds the memory of the last one free."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
