"""The HFLM machinery both wrappers hook into besides their overridden methods.

* Responses: :func:`answers_tapped` stands a tap in for HFLM's ``cache_hook`` (its ``add_partial`` is called once
  per answered request, in order, with the request's key) and keeps probe-less partial answers out of
  ``--use_cache``; :func:`namespace_response_cache` gives a run's cached responses their own table per probe
  configuration (``CachingLM``'s ``SqliteDict``).
* :func:`note_unprobed_requests` warns once when a wrapper computes probes for a task that cannot show them (its
  requests carry no :class:`~lm_eval_probes.records.ProbeRequest`).
* Calls: :class:`CallScope` carries what one public call (``loglikelihood``, ``generate_until``) collects to the HFLM
  methods it reaches (``_loglikelihood_tokens``, ``_model_generate``) for as long as the call runs — nothing per call
  is kept on the wrapper.
* Processes: :func:`take_ranks_from_accelerate` gives both wrappers the rank and world size of every
  ``accelerate launch``/``torchrun`` run (HFLM 0.4.13 splits documents only when it sees more than one GPU).

Importing this module is cheap: nothing of lm_eval or torch.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Generic, TypeVar

from lm_eval_probes.records import probe_request_of

eval_logger = logging.getLogger(__name__)

Collector = TypeVar("Collector")


class CallScope(Generic[Collector]):
    """What one public call of a wrapper collects, reachable from the HFLM methods the call reaches while it runs.

    ``with scope.running(lm, collector):`` around HFLM's own public method; inside it ``scope.of(lm)`` is that
    collector (``None`` outside a call, or for another wrapper instance). A context variable, so that nothing per call
    lives on the wrapper and a call in another thread or task sees its own.
    """

    def __init__(self, name: str) -> None:
        self._current: ContextVar[tuple[int, Any] | None] = ContextVar(name, default=None)

    @contextmanager
    def running(self, owner: object, collector: Collector) -> Iterator[Collector]:
        token = self._current.set((id(owner), collector))
        try:
            yield collector
        finally:
            self._current.reset(token)

    def of(self, owner: object) -> Collector | None:
        current = self._current.get()
        return current[1] if current is not None and current[0] == id(owner) else None


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


def note_unprobed_requests(requests: Iterable[Any]) -> None:
    """Warn (once per task) about requests of tasks that will not show the probes computed for them."""
    unprobed = {getattr(req, "task_name", None) for req in requests if probe_request_of(req) is None}
    for task in sorted(unprobed - {None}):
        _warn_unprobed(task)


@functools.cache
def _warn_unprobed(task: str) -> None:
    eval_logger.warning(
        "hf-probes computes probes for task %r, but the task has no probe rows, so none will be shown. Run it "
        "with the `lm-eval-probes` command (it gives every task the rows), load it with "
        "lm_eval_probes.ProbeTaskManager, or give its YAML `class: !function "
        "lm_eval_probes.tasks.probe_task.ProbeTask` (lm-eval >= 0.4.12; on 0.4.10 and 0.4.11 a `!function` reads a "
        "file beside the YAML: docs/tasks.md).", task)


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
