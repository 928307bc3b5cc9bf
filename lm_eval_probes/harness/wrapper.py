"""What both wrappers share around HFLM: one ``loglikelihood`` and one ``generate_until``, each in lm_eval's
``hf_steered`` shape — the wrapper's capture around HFLM's own method, then its probes attached to the answers.

:class:`ProbeWrapper` (mixed in before ``HFLM``) defines the public methods; a wrapper says how it captures one call
(:meth:`ProbeWrapper._capturing`: a context manager that yields the call's :class:`ProbeCall`), and reaches that call
from the HFLM methods it replaces (``_loglikelihood_tokens``, ``_model_generate``) with :meth:`ProbeWrapper._current_call`.
:class:`GenerationCall` is the generation bookkeeping of both: the generated rows ``_model_generate`` queues, paired in
order with the texts HFLM answers (``cache_hook.add_partial``), each becoming a record.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Generic, Protocol, TypeVar

import lm_eval_probes
from lm_eval_probes.harness.applicability import SkippedProbes
from lm_eval_probes.harness.hflm import CallScope, answers_tapped, namespace_response_cache
from lm_eval_probes.records import ResponseProbe, with_generation_probes

__all__ = ["GenerationCall", "ProbeCall", "ProbeWrapper"]

Pending = TypeVar("Pending")


class ProbeCall(Protocol):
    """What one public call collects: ``on_answer`` (``None``: no tap), called once per answered request with HFLM's
    ``(attr, request key, answer)``; ``attach`` turns HFLM's answers into the responses that carry their probes."""

    on_answer: Callable[[str, Any, Any], None] | None

    def attach(self, requests: Sequence[Any], answers: Sequence[Any]) -> list[Any]: ...


class Unprobed:
    """A call without probes: HFLM's answers as they are."""

    on_answer = None

    def attach(self, requests: Sequence[Any], answers: Sequence[Any]) -> list[Any]:
        return list(answers)


class GenerationCall(Generic[Pending]):
    """One ``generate_until`` call: ``_model_generate`` queues each generated row (:meth:`queue`, in row order);
    HFLM answers each row's text in the same order, and ``record(row, text)`` makes it ``(kept text, record)`` (the
    kept text: the text itself, or a decoding family's own); :meth:`attach` gives each answer its kept text and its
    record (identical answers to identical contexts first come, first served)."""

    def __init__(self, record: Callable[[Pending, str], tuple[str, ResponseProbe]]) -> None:
        self._record = record
        self._rows: deque[Pending] = deque()
        self._probes: dict[tuple[str, str], deque[ResponseProbe]] = defaultdict(deque)
        self._kept: dict[tuple[str, str], deque[str]] = defaultdict(deque)

    def queue(self, rows: Sequence[Pending]) -> None:
        self._rows.extend(rows)

    def on_answer(self, attr: str, request_key: Any, text: str) -> None:
        if attr == "generate_until":
            kept, probe = self._record(self._rows.popleft(), text)
            self._probes[(request_key[0], kept)].append(probe)
            self._kept[(request_key[0], text)].append(kept)

    def attach(self, requests: Sequence[Any], answers: Sequence[str]) -> list[Any]:
        kept = []
        for req, text in zip(requests, answers, strict=True):
            queue = self._kept.get((req.args[0], text))
            kept.append(queue.popleft() if queue else text)
        return with_generation_probes(requests, kept, self._probes)


_CALL: CallScope[ProbeCall] = CallScope("lm-eval-probes call")
"""The running public call of a wrapper (read by the HFLM methods it replaces)."""


class ProbeWrapper(SkippedProbes):
    """Mixed into both wrappers (before ``HFLM``): ``loglikelihood`` and ``generate_until`` as ``with capture: answers
    = HFLM's; return attach(answers)``, ``--use_cache`` in a table of the probe configuration (``cache_hook``),
    and the plan's skipped probes in ``get_model_info`` (:class:`SkippedProbes`).

    A wrapper provides :meth:`_capturing`, :meth:`_cache_fingerprint` and ``captures``: the whole-forward captures
    set up on the loaded model, in its calls (:class:`~lm_eval_probes.capture.calls.CallCaptures`)."""

    captures: Any
    _responses_cached: bool = False  # --use_cache: every option goes through the lens (which one a task reads may change)

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        with self._running("loglikelihood", requests) as call:
            answers = super().loglikelihood(requests, disable_tqdm)  # type: ignore[misc]
        return self._attached(requests, call.attach(requests, answers))

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        with self._running("generate_until", requests) as call:
            texts = super().generate_until(requests, disable_tqdm)  # type: ignore[misc]
        return self._attached(requests, call.attach(requests, texts))

    def _with_trace_tokens(self, probe: ResponseProbe | None) -> ResponseProbe | None:
        """``probe`` with its trace's token ids decoded one by one into its ``tokens`` (``tok_decode``), and its lens
        grid's top tokens into ``lens_tokens`` (id → text; unchanged without a trace), as both wrappers write them."""
        if probe is None or probe.trace is None or "token_ids" not in probe.trace:
            return probe
        trace = dict(probe.trace)
        tokens = [self.tok_decode([token]) for token in trace.pop("token_ids")]
        if "lens" in trace:
            top = sorted({token for row in trace["lens"]["top_token"] for token in row})
            trace["lens_tokens"] = {str(token): self.tok_decode([token]) for token in top}
        return dataclasses.replace(probe, trace={"tokens": tokens, **trace})

    @property
    def cache_hook(self) -> Any:
        """lm_eval's hook that writes each answered response into ``--use_cache``'s table (``LM.set_cache_hook`` sets
        it; ``answers_tapped`` taps it). lm_eval reads cached responses before the model is called, so setting a hook
        of a cache first points that cache at a table of this run's probe configuration (:meth:`_cache_fingerprint`).
        An attribute of lm_eval's ``LM`` made a property, not an HFLM method overridden."""
        return self.__dict__.get("_cache_hook")

    @cache_hook.setter
    def cache_hook(self, cache_hook: Any) -> None:
        namespaced = self.__dict__.get("_namespaced_hook")  # the hook restored after a call's tap: done already
        if cache_hook is not namespaced and getattr(cache_hook, "dbdict", None) is not None:
            fingerprint = self._cache_fingerprint()
            if fingerprint is not None:
                self._responses_cached = namespace_response_cache(
                    cache_hook, f"lm-eval-probes {lm_eval_probes.__version__} {fingerprint}") is not None
            self.__dict__["_namespaced_hook"] = cache_hook
        self.__dict__["_cache_hook"] = cache_hook

    def _cache_fingerprint(self) -> str | None:
        """What this run's cached responses depend on (``None``: lm_eval's own table)."""
        return None

    def _capturing(self, kind: str, requests: Sequence[Any]) -> AbstractContextManager[ProbeCall]:
        """The capture of one ``loglikelihood`` or ``generate_until`` (``kind``) call of ``requests``: hooks held
        while HFLM's own method runs, yielding what the call collects."""
        return nullcontext(Unprobed())

    def _current_call(self) -> ProbeCall | None:
        """The running public call's :class:`ProbeCall` (``None`` outside one)."""
        return _CALL.of(self)

    @contextmanager
    def _running(self, kind: str, requests: Sequence[Any]) -> Iterator[ProbeCall]:
        with self._capturing(kind, requests) as call, _CALL.running(self, call):
            if call.on_answer is None:
                yield call
                return
            with answers_tapped(self, call.on_answer, forward_partials=False):
                yield call

    def _attached(self, requests: Sequence[Any], responses: list[Any]) -> list[Any]:
        """The responses, once they carry their probes, handed to the captures too (``probe_save_states`` writes their
        states)."""
        captures = getattr(self, "captures", None)
        if captures is not None:
            captures.attached(requests, responses)
        return responses
