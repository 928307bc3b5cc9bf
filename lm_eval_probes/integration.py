"""Every place where the plugin works around or reaches into lm_eval 0.4.13 — one file to revisit on an upgrade.

* Registration: a lazy ``hf-probes`` placeholder (0.4.13 has no plugin discovery: the ``.pth``
  autoload calls :func:`register_model_placeholder` at interpreter start), and the rows of
  :mod:`lm_eval_probes.rows` as metrics and aggregations (:func:`register_rows`; lm_eval auto-imports
  its built-ins only into an empty registry, so those come first).
* Tasks: :func:`with_probe_metrics` swaps a built task's class for a subclass with the probe rows
  mixed in; :class:`ProbeTaskManager` does it for every task it loads; :func:`every_task_probed`
  makes lm_eval's CLI build that manager.
* Responses: :func:`answers_tapped` stands a tap in for HFLM's ``cache_hook`` (its ``add_partial``
  is called once per answered request, in order, with the request's key) and keeps probe-less partial
  answers out of ``--use_cache``; :func:`namespace_response_cache` gives a run's cached responses
  their own table per probe configuration.
* :func:`note_unprobed_requests` warns once when ``hf-probes`` computes probes for a task that cannot
  show them.
* Processes: :func:`take_ranks_from_accelerate` gives both wrappers the rank and world size of every
  ``accelerate launch``/``torchrun`` run (HFLM 0.4.13 splits documents only when it sees more than one GPU).

Importing this module is cheap: lm_eval is imported inside the functions that need it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

MODEL_NAME = "hf-probes"
MODEL_TARGET = "lm_eval_probes.models:ProbeHFLM"
DIFFUSION_MODEL_NAME = "hf-probes-diffusion"
DIFFUSION_MODEL_TARGET = "lm_eval_probes.diffusion_model:DiffusionProbeHFLM"

eval_logger = logging.getLogger(__name__)

_PROBED_TASKS: dict[str, Any] = {}
"""Tasks built in this process with probe rows, by name (weak references; filled by the task adapter)."""


def register_model_placeholder() -> None:
    """Register the lazy ``hf-probes`` and ``hf-probes-diffusion`` placeholders in lm_eval's model registry
    (idempotent; no torch)."""
    import lm_eval.models  # noqa: F401  (built-in placeholders first, else they get hidden)
    from lm_eval.api.registry import model_registry

    for name, target in ((MODEL_NAME, MODEL_TARGET), (DIFFUSION_MODEL_NAME, DIFFUSION_MODEL_TARGET)):
        if name not in model_registry:
            model_registry.register(name, target=target)


def take_ranks_from_accelerate(lm: Any) -> None:
    """Data parallel on any device: the rank and world size of ``lm`` (an HFLM) from accelerate whenever it runs
    more than one process.

    HFLM 0.4.13 keeps its ``Accelerator`` whenever accelerate runs several processes, but splits the documents
    only when it also sees more than one GPU (``gpus > 1``): on CPUs (``ACCELERATE_USE_CPU=true``), or with one GPU
    visible per process, every process ran every document and wrote results. With the rank and world size set,
    lm_eval itself shards the documents (``islice(rank, limit, world_size)``), pads the request counts, and gathers
    every per-document record and sample to rank 0 (``gather_object`` over the process group: gloo on CPUs, NCCL on
    GPUs). The model stays where HFLM placed it (``accelerator.device``). Nothing changes for one process, for
    ``tp_plan`` (no accelerator) or where HFLM already set up data parallelism.
    """
    accelerator = getattr(lm, "accelerator", None)
    if accelerator is None or accelerator.num_processes <= 1 or lm.world_size == accelerator.num_processes:
        return
    lm._rank, lm._world_size = accelerator.process_index, accelerator.num_processes
    logging.getLogger("lm_eval.lm_eval_probes").info(  # lm_eval's own log (its handler and --verbosity)
        "%s: data parallel, rank %d of %d on %s (ranks from accelerate)", type(lm).__name__, lm._rank,
        lm._world_size, accelerator.device)


@functools.cache
def register_rows() -> None:
    """Register every row of :data:`lm_eval_probes.rows.ROWS` and the plugin's aggregations (once)."""
    import lm_eval.api.metrics  # noqa: F401  (built-in aggregations such as "mean" first)
    from lm_eval.api.registry import aggregation_registry, metric_registry, register_aggregation, register_metric

    from lm_eval_probes.rows import AGGREGATIONS, ROWS

    for name, fn in AGGREGATIONS.items():
        if name not in aggregation_registry:
            register_aggregation(name)(fn)
    for row in ROWS:
        if row.name not in metric_registry:
            register_metric(metric=row.name, higher_is_better=row.higher_is_better, aggregation=row.aggregation)(
                _value_made_in_process_results
            )


def _value_made_in_process_results(items: Any) -> Any:
    """lm_eval's metric registry wants a callable; the probe rows' values are made in ``process_results``."""
    return items


def task_aggregation(row: Any, options: Any) -> Callable[..., Any]:
    """The aggregation callable of one row for one task (``mean`` is lm_eval's, for its stderr)."""
    from lm_eval.api.registry import get_aggregation

    from lm_eval_probes.rows import bound_aggregation

    return bound_aggregation(row, options) or get_aggregation(row.aggregation)


def note_probed_task(name: str, task: Any = None) -> None:
    """Remember that task ``name`` (the object ``task``) reports probe rows in this process."""
    _PROBED_TASKS[name] = weakref.ref(task) if task is not None else _no_task


def probed_task(name: Any) -> Any:
    """The live task object of that name with probe rows, or ``None``."""
    ref = _PROBED_TASKS.get(name)
    return None if ref is None else ref()


def _no_task() -> None:
    return None


def note_unprobed_requests(requests: Iterable[Any]) -> None:
    """Warn (once per task) about requests of tasks that will not show the probes computed for them."""
    for task in sorted({getattr(req, "task_name", None) for req in requests} - set(_PROBED_TASKS) - {None}):
        _warn_unprobed(task)


@functools.cache
def _warn_unprobed(task: str) -> None:
    eval_logger.warning(
        "hf-probes computes probes for task %r, but the task has no probe rows, so none will be shown. Run it "
        "with the `lm-eval-probes` command (it gives every task the rows), load it with "
        "lm_eval_probes.ProbeTaskManager, or give its YAML `class: !function "
        "lm_eval_probes.tasks.probe_task.ProbeTask`.", task)


# ----------------------------------------------------------------------------------------------- tasks


def probed_class(cls: type) -> type:
    """``cls`` with :class:`~lm_eval_probes.tasks.probe_task.ProbeResults` mixed in (one class per ``cls``)."""
    from lm_eval_probes.tasks.probe_task import ProbeResults

    if issubclass(cls, ProbeResults):
        return cls
    return _probed_class(cls)


@functools.cache
def _probed_class(cls: type) -> type:
    from lm_eval_probes.tasks.probe_task import ProbeResults

    # ProbeResults adds no instance layout (``__slots__ = ()``), so CPython allows the ``__class__`` swap
    return type(f"Probe{cls.__name__}", (ProbeResults, cls), {"__module__": cls.__module__, "__slots__": ()})


def with_probe_metrics(task: Any) -> Any:
    """Give an already built task (a stock lm_eval task, say) the probe rows, keeping everything it has.

    The instance's class becomes a subclass of its own class with ``ProbeResults`` mixed in, so its
    prompts, filters, metrics and any Python overrides stay as they were. Idempotent.
    """
    from lm_eval.api.task import ConfigurableTask

    from lm_eval_probes.tasks.probe_task import ProbeResults

    if isinstance(task, ProbeResults):
        return task
    if not isinstance(task, ConfigurableTask):
        raise TypeError(f"probe metrics need a ConfigurableTask, got {type(task).__name__}")
    task.__class__ = probed_class(type(task))
    task._add_probe_metrics()
    return task


def _probe_task_manager_class() -> type:
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks import TaskManager

    class ProbeTaskManager(TaskManager):
        """A ``TaskManager`` whose loaded tasks all report probe rows (stock tasks keep their prompts,
        filters and metrics). ``simple_evaluate(..., task_manager=ProbeTaskManager(include_path=TASKS_DIR))``."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            register_rows()
            super().__init__(*args, **kwargs)

        def load(self, task_list: Any) -> Any:
            loaded = super().load(task_list)
            for name, task in loaded["tasks"].items():
                if isinstance(task, ConfigurableTask):
                    with_probe_metrics(task)
                else:
                    eval_logger.warning("task %s is not a ConfigurableTask: no probe rows", name)
            return loaded

    ProbeTaskManager.__module__ = __name__
    return ProbeTaskManager


def __getattr__(name: str) -> Any:
    if name == "ProbeTaskManager":  # built on first use: its base class imports lm_eval's task machinery
        cls = _probe_task_manager_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextmanager
def every_task_probed() -> Iterator[None]:
    """Within the block, the task manager that lm_eval's CLI builds is a ``ProbeTaskManager``."""
    import lm_eval.tasks

    original = lm_eval.tasks.TaskManager
    lm_eval.tasks.TaskManager = __getattr__("ProbeTaskManager")
    try:
        yield
    finally:
        lm_eval.tasks.TaskManager = original


# ------------------------------------------------------------------------------------------- responses


class CacheHookTap:
    """Stands in for HFLM's ``cache_hook``: calls ``on_answer`` first, then (optionally) the real hook.

    ``forward_partials=False`` keeps partial answers out of ``--use_cache``: they carry no probe yet,
    and a run killed mid-way would otherwise leave probe-less entries that later runs replay.
    """

    def __init__(self, inner: Any, on_answer: Callable[[str, Any, Any], None], *, forward_partials: bool) -> None:
        self._inner = inner
        self._on_answer = on_answer
        self._forward_partials = forward_partials

    def add_partial(self, attr: str, req: Any, res: Any) -> None:
        self._on_answer(attr, req, res)
        if self._forward_partials:
            self._inner.add_partial(attr, req, res)


@contextmanager
def answers_tapped(lm: Any, on_answer: Callable[[str, Any, Any], None], *, forward_partials: bool) -> Iterator[None]:
    """Within the block, ``lm.cache_hook.add_partial`` also calls ``on_answer(attr, request_key, answer)``."""
    inner = lm.cache_hook
    lm.cache_hook = CacheHookTap(inner, on_answer, forward_partials=forward_partials)
    try:
        yield
    finally:
        lm.cache_hook = inner


def namespace_response_cache(cache_hook: Any, fingerprint: str) -> str | None:
    """Point ``--use_cache``'s response table at one named after ``fingerprint`` (the probe configuration).

    lm_eval's ``CachingLM`` keys responses by the request alone and hands its hook the same
    ``SqliteDict`` it reads from; switching that dict's table makes every read and write of this run
    use a table of its own configuration, so a response (and the probe it carries) cached under
    another configuration is never replayed. Returns the table name, or ``None`` without a cache.
    """
    cache = getattr(cache_hook, "dbdict", None)
    if cache is None:
        return None
    table = "hf_probes_" + hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    cache.conn.execute(f'CREATE TABLE IF NOT EXISTS "{table}" (key TEXT PRIMARY KEY, value BLOB)')
    cache.conn.commit()
    cache.tablename = table
    return table
