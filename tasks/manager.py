"""Probe rows for any lm_eval task: a built task's class swapped for one with the rows mixed in, and the task
manager that does it for every task it loads (also the one lm_eval's CLI builds under ``lm-eval-probes``).

The lm_eval internals used: ``ConfigurableTask``'s instance layout (the ``__class__`` swap needs
:class:`~lm_eval_probes.tasks.probe_task.ProbeResults` to add none), its ``_aggregation_list`` and
``_higher_is_better`` (filled by ``ProbeResults._add_probe_metrics``), ``TaskManager.load`` (``load_task_or_group``
in 0.4.10 and 0.4.11) and the CLI's lookup of ``lm_eval.tasks.TaskManager`` (:func:`every_task_probed`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lm_eval.tasks
from lm_eval.api.task import ConfigurableTask
from lm_eval.tasks import TaskManager

from lm_eval_probes.harness.registry import register_rows
from lm_eval_probes.tasks.probe_task import ProbeResults

eval_logger = logging.getLogger(__name__)


def probed_class(cls: type) -> type:
    """``cls`` with :class:`~lm_eval_probes.tasks.probe_task.ProbeResults` mixed in (one class per ``cls``)."""
    if issubclass(cls, ProbeResults):
        return cls
    return _probed_class(cls)


@functools.cache
def _probed_class(cls: type) -> type:
    # ProbeResults adds no instance layout (``__slots__ = ()``), so CPython allows the ``__class__`` swap
    return type(f"Probe{cls.__name__}", (ProbeResults, cls), {"__module__": cls.__module__, "__slots__": ()})


def with_probe_metrics(task: Any) -> Any:
    """Give an already built task (a stock lm_eval task, say) the probe rows, keeping everything it has.

    The instance's class becomes a subclass of its own class with ``ProbeResults`` mixed in, so its
    prompts, filters, metrics and any Python overrides stay as they were. Idempotent.
    """
    if isinstance(task, ProbeResults):
        return task
    if not isinstance(task, ConfigurableTask):
        raise TypeError(f"probe metrics need a ConfigurableTask, got {type(task).__name__}")
    task.__class__ = probed_class(type(task))
    task._add_probe_metrics()
    return task


class ProbeTaskManager(TaskManager):
    """A ``TaskManager`` whose loaded tasks all report probe rows (stock tasks keep their prompts,
    filters and metrics). ``simple_evaluate(..., task_manager=ProbeTaskManager(include_path=TASKS_DIR))``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        register_rows()
        super().__init__(*args, **kwargs)

    def load(self, task_list: Any) -> Any:
        loaded = super().load(task_list)
        for name, task in loaded["tasks"].items():
            _probe(name, task)
        return loaded

    def load_task_or_group(self, *args: Any, **kwargs: Any) -> Any:
        """lm_eval 0.4.10 and 0.4.11 (no ``load``; their ``get_task_dict`` calls this): the nested dict of groups and
        tasks, every task in it probed. Later releases wrap ``load`` here (deprecated), which probes them already."""
        loaded = super().load_task_or_group(*args, **kwargs)
        for name, task in _nested_tasks(loaded):
            _probe(name, task)
        return loaded


def _probe(name: Any, task: Any) -> None:
    if isinstance(task, ConfigurableTask):
        with_probe_metrics(task)
    else:
        eval_logger.warning("task %s is not a ConfigurableTask: no probe rows", name)


def _nested_tasks(loaded: dict[Any, Any]) -> Iterator[tuple[Any, Any]]:
    """``(name, task)`` of every task in lm_eval's nested ``{group: {name: task, …}, name: task}`` dict."""
    for name, value in loaded.items():
        if isinstance(value, dict):
            yield from _nested_tasks(value)
        else:
            yield name, value


@contextmanager
def every_task_probed() -> Iterator[None]:
    """Within the block, the task manager that lm_eval's CLI builds is a ``ProbeTaskManager``."""
    original = lm_eval.tasks.TaskManager
    lm_eval.tasks.TaskManager = ProbeTaskManager
    try:
        yield
    finally:
        lm_eval.tasks.TaskManager = original
