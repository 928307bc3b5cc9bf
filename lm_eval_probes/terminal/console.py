"""What the plugin's own commands (``lm-eval-probes sweep``, ``lm-eval-probes-demo``) print while lm_eval runs.

:func:`tidy_console` is a context manager those command-line entry points enter around their work; importing
this module changes nothing, and leaving the context restores the logging handlers' filters and the warnings
machinery. Inside it:

* lm_eval's notices are shown once: a notice that lm_eval logs again (for every task or every pair, e.g.
  "<task>: Custom kwargs can be passed to `--metadata` …" or the chat-template recommendation) is dropped
  after its first showing; the leading task name does not make a notice new (:class:`RepeatedNoticeFilter`).
* a warning names where it arose instead of a site-packages path: the sweep pair (model × task) and the
  results row (``<metric>,<filter>``) whose aggregation raised it, followed by its class and message
  (:func:`describe_warning`), e.g. ``SmolLM2 × probes_synth_logic, row length_spearman,none:
  UndefinedMetricWarning: Spearman rho is undefined: the probe value is the same (1) for all 40 documents``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

_TASK_PREFIX = re.compile(r"^(\[[^\]\n]+\]\s*|[A-Za-z0-9_.\-]+:\s+)")
_PATH = re.compile(r"(/[^\s:'\"]+)+")


class RepeatedNoticeFilter(logging.Filter):
    """A handler filter that lets each distinct lm_eval notice (below ERROR) through once.

    Two notices are the same when their texts agree after a leading ``<task>: `` or ``[<task>] `` is removed
    and paths are ignored. Records of other loggers (the plugin's own progress lines) and errors always
    pass. ``folded`` counts the notices dropped, per kept notice text.
    """

    def __init__(self, prefixes: tuple[str, ...] = ("lm_eval",)) -> None:
        """``prefixes``: the loggers whose notices are folded (and their children)."""
        super().__init__()
        self.prefixes = prefixes
        self.folded: dict[str, int] = {}

    @staticmethod
    def key(message: str) -> str:
        return _PATH.sub("<path>", _TASK_PREFIX.sub("", message.strip(), count=1))

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR or not any(
                record.name == prefix or record.name.startswith(prefix + ".") for prefix in self.prefixes):
            return True
        key = self.key(record.getMessage())
        if key in self.folded:
            self.folded[key] += 1
            return False
        self.folded[key] = 0
        return True


def _frames(start: FrameType | None) -> Iterator[FrameType]:
    while start is not None:
        yield start
        start = start.f_back


def warning_origin(frame: FrameType | None) -> str | None:
    """Where in a sweep or lm_eval run a warning arose, read from the calling frames: ``model × task`` of the
    sweep pair being evaluated and ``row <metric>,<filter>`` of the lm_eval aggregation being computed
    (lm_eval 0.4.13's ``_compute_task_aggregations``); ``None`` outside both."""
    pair = row = None
    for current in _frames(frame):
        local = current.f_locals
        name = current.f_code.co_name
        if row is None and name == "_compute_task_aggregations" and "metric" in local:
            task = getattr(local.get("task"), "task_name", None)
            row = f"row {local['metric']},{local.get('filter_key', 'none')}" + (f" of {task}" if task else "")
        elif pair is None and name == "_evaluate_pair" and "task" in local and hasattr(local.get("model"), "name"):
            pair = f"{local['model'].name} × {local['task']}"
    parts = [part for part in (pair, row) if part]
    return ", ".join(parts) if parts else None


def describe_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     origin: str | None) -> str:
    """One line: the origin (pair and row) when known, else the warning's module as a package path
    (``lm_eval_probes/probes/reader/math.py:194``, not the site-packages path), then its class and message."""
    where = origin
    if where is None:
        parts = Path(filename).parts
        inside = next((i for i, part in enumerate(parts) if part in ("site-packages", "dist-packages")), None)
        where = f"{'/'.join(parts[inside + 1:]) if inside is not None else Path(filename).name}:{lineno}"
    text = " ".join(str(message).split())
    return f"{where}: {category.__name__}: {text}"


@contextlib.contextmanager
def tidy_console() -> Iterator[RepeatedNoticeFilter]:
    """Fold lm_eval's repeated notices and show warnings as :func:`describe_warning` lines (logged by this
    module's logger at WARNING), until the context ends; yields the notice filter."""
    notices = RepeatedNoticeFilter()
    handlers = {*logging.getLogger().handlers, *logging.getLogger("lm_eval").handlers}
    for handler in handlers:
        handler.addFilter(notices)

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        origin = warning_origin(sys._getframe(1))
        logger.warning("%s", describe_warning(message, category, filename, lineno, origin))

    try:
        with warnings.catch_warnings():
            warnings.showwarning = show
            yield notices
    finally:
        for handler in handlers:
            handler.removeFilter(notices)
