"""The lazy names of a built-in probe's package: a name of its ``math`` module read from the package loads that module
on first access (the package itself imports nothing, so loading a probe's declaration imports no torch)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def forwarded(package: str, module: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: a missing name is read from ``package.module``."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        target = importlib.import_module(f"{package}.{module}")
        try:
            return getattr(target, name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    def __dir__() -> list[str]:
        own = vars(sys.modules[package])
        return sorted(set(own) | set(dir(importlib.import_module(f"{package}.{module}"))))

    return __getattr__, __dir__
