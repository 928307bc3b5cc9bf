"""What the whole-forward captures do in a wrapper's calls: the hooks of their open interface, and the wrappers' one
handle on them.

Neither wrapper names a capture (:mod:`~lm_eval_probes.capture.captures`). Each holds one :class:`CallCaptures`,
built at load from its :class:`~lm_eval_probes.capture.plan.ProbePlan` and what each capture's set-up holds: every
capture the enabled probes ask for gives its hooks (its registered ``calls``, built from an
:class:`~lm_eval_probes.capture.captures.InCalls`): an object with any of these methods, each optional — it
implements those it needs:

================================================ ==================================================================
hook                                             called
================================================ ==================================================================
``forwards(kind) -> context manager | None``     around forwards of ``kind``: ``"loglikelihood"`` (HFLM's batches
                                                 of a call), ``"generate"`` (one ``generate``'s calls),
                                                 ``"teacher_forced"`` (a generation's teacher-forced forward);
                                                 what it yields is the capture's ``recorded`` (``None``: not hooked;
                                                 nothing may happen before it is entered: :meth:`CallCaptures.reads`
                                                 asks without entering)
``read_at(recorded, windows)``                   before each such forward: the rows' positions ``[start, stop)``
                                                 its answers will read
``position_values(recorded, states, spans)``     after it: per span ``(row, start, stop)``, values (positions on
                                                 the last axis) joined to the position probes of the probe that
                                                 asked (``with_values``)
``answers(recorded, locate)``                    a ``loglikelihood`` call's per-request bookkeeping: its
                                                 ``on_answer(attr, key, answer)`` per answered request, its
                                                 ``fields`` (request key → record fields)
``generated(recorded, prompt_len, bounds)``      per row of a ``generate`` batch, an object whose ``fields(kept)``
                                                 are the row's record fields once its kept tokens are known
``prompt_layers``, ``prompt_fields(states,       the ``hidden_states`` layers it reads over a response's prompt,
mask)``, ``span_fields(states, prompt_tokens)``  and the record fields it makes of them: per row of a left-padded
                                                 batch, or of one unpadded response
``attached(requests, responses)``                after a call's responses carry their probes
================================================ ==================================================================

Adding a capture means registering it with its hooks; neither wrapper changes (``tests/test_wrapper_overrides.py``
checks that ``models/`` names none). The four built-ins' hooks: :mod:`~lm_eval_probes.capture.builtin_hooks`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from lm_eval_probes.capture.captures import InCalls, capture_named
from lm_eval_probes.capture.plan import ProbePlan
from lm_eval_probes.records import ResponseProbe

__all__ = ["CallCaptures", "with_fields"]


def with_fields(probe: ResponseProbe, fields: Mapping[str, Any]) -> ResponseProbe:
    """``probe`` with the record fields the captures made of a response's forwards (:meth:`CallCaptures.answers`,
    :meth:`CallCaptures.generated`); their arrays over every position the model saw (``probe_traces=true``: under
    ``trace``) join the probe's trace."""
    if not fields:
        return probe
    fields = dict(fields)
    arrays = fields.pop("trace", None)
    if probe.trace is not None and arrays:
        fields["trace"] = {**probe.trace, **arrays}
    return dataclasses.replace(probe, **fields)


class _Answers:
    """The captures' per-request bookkeeping of one ``loglikelihood`` call, as one."""

    def __init__(self, hooked: list[Any]) -> None:
        self._hooked = hooked

    def on_answer(self, attr: str, request_key: Any, answer: Any) -> None:
        for hooks in self._hooked:
            hooks.on_answer(attr, request_key, answer)

    def fields(self, request_key: Any) -> dict[str, Any]:
        """The record fields of the request ``request_key`` (``{}``: none)."""
        out: dict[str, Any] = {}
        for hooks in self._hooked:
            out.update(hooks.fields.get(request_key, {}))
        return out


class _GeneratedRow:
    """The captures' rows of one generated row, as one: :meth:`fields` of its first ``kept`` tokens."""

    def __init__(self, rows: Sequence[Any]) -> None:
        self._rows = rows

    def fields(self, kept: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for row in self._rows:
            out.update(row.fields(kept))
        return out


class CallCaptures:
    """The whole-forward captures of one loaded model in its wrapper's calls (see the module docstring).

    ``plan``: the model's plan (which captures the enabled probes ask for, with their requests); ``held``: what each
    capture's set-up holds, by capture name (:meth:`~lm_eval_probes.capture.plan.ProbePlan.set_up`); ``decode``: a
    token id → its text (the tokenizer's); ``traces``: ``probe_traces=true``.
    """

    def __init__(self, plan: ProbePlan, held: Mapping[str, Any], *, decode: Callable[[int], str] | None = None,
                 traces: bool = False) -> None:
        self.plan = plan
        self.hooks: dict[str, Any] = {}
        """Each capture's hooks in the calls, by capture name, in registration order."""
        for name, (probe, request) in plan.requested.requests.items():
            build = capture_named(name).calls
            if build is not None:
                self.hooks[name] = build(InCalls(held.get(name), request, probe, decode, traces))

    def _having(self, hook: str) -> list[tuple[str, Any]]:
        return [(name, hooks) for name, hooks in self.hooks.items() if hasattr(hooks, hook)]

    # ----------------------------------------------------------------------------- forwards

    @contextmanager
    def forwards(self, kind: str) -> Iterator[dict[str, Any]]:
        """Around forwards of ``kind`` (see the module docstring): the hooks of the captures that read them; yields what
        each records, by capture name (empty: none)."""
        with ExitStack() as stack:
            recorded = {}
            for name, hooks in self._having("forwards"):
                context = hooks.forwards(kind)
                if context is not None:
                    recorded[name] = stack.enter_context(context)
            yield recorded

    def reads(self, kind: str) -> bool:
        """Whether a capture hooks forwards of ``kind`` (a replayed generation must then run one)."""
        return any(hooks.forwards(kind) is not None for _, hooks in self._having("forwards"))

    def read_at(self, recorded: Mapping[str, Any], windows: Mapping[int, tuple[int, int]]) -> None:
        """Before a forward: the rows' positions ``windows`` (row → ``[start, stop)``) its answers will read."""
        for name, hooks in self._having("read_at"):
            if name in recorded:
                hooks.read_at(recorded[name], windows)

    def position_values(self, recorded: Mapping[str, Any], states: Sequence[torch.Tensor] | None,
                        spans: Sequence[tuple[int, int, int]]) -> list[dict[str, dict[str, torch.Tensor]]]:
        """After that forward (its ``states``): per span ``(row, start, stop)``, probe name → the values the captures
        computed at its positions (on their last axis)."""
        out: list[dict[str, dict[str, torch.Tensor]]] = [{} for _ in spans]
        for name, hooks in self._having("position_values"):
            if name in recorded:
                for values, got in zip(out, hooks.position_values(recorded[name], states, spans), strict=True):
                    values[hooks.probe] = got
        return out

    @staticmethod
    def with_position_values(rows: Sequence[Any], values: Sequence[Mapping[str, Mapping[str, torch.Tensor]]]) -> list[Any]:
        """The position probes ``rows`` with :meth:`position_values` (one entry per row)."""
        out = []
        for probes, by_probe in zip(rows, values, strict=True):
            for probe, named in by_probe.items():
                probes = probes.with_values(probe, **named)
            out.append(probes)
        return out

    def answers(self, recorded: Mapping[str, Any], *, locate: Callable[[Any], tuple[int, int, int] | None]) -> Any:
        """The captures' per-request bookkeeping of one ``loglikelihood`` call over what :meth:`forwards` recorded
        (``None``: none): ``on_answer(attr, key, answer)`` per answered request (``locate``: the request's row of the
        latest batch), ``fields(key)`` its record fields."""
        hooked = [hooks.answers(recorded[name], locate) for name, hooks in self._having("answers") if name in recorded]
        return _Answers(hooked) if hooked else None

    def generated(self, recorded: Mapping[str, Any], prompt_len: int, bounds: Sequence[int]) -> list[_GeneratedRow]:
        """Per row of one (left-padded) ``generate`` batch, what the captures recorded of it up to its bound."""
        rows = [hooks.generated(recorded[name], prompt_len, bounds) for name, hooks in self._having("generated")
                if name in recorded]
        return [_GeneratedRow([one[index] for one in rows]) for index in range(len(bounds))]

    # ----------------------------------------------------------------------------- the prompt's states

    @property
    def prompt_layers(self) -> tuple[int, ...]:
        """The ``hidden_states`` layers whose states over a response's prompt the captures read, ascending."""
        return tuple(sorted({layer for _, hooks in self._having("prompt_layers") for layer in hooks.prompt_layers}))

    def prompt_fields(self, states: Mapping[int, torch.Tensor], mask: torch.Tensor) -> list[dict[str, Any]]:
        """Per row of a left-padded batch, the record fields the captures make of its prompt: ``states`` maps each layer
        of :attr:`prompt_layers` to ``[B, P, H]`` over the prompt's ``P`` columns, ``mask`` ``[B, P]`` its real
        tokens."""
        out: list[dict[str, Any]] = [{} for _ in range(mask.shape[0])]
        for _, hooks in self._having("prompt_fields"):
            for fields, got in zip(out, hooks.prompt_fields(states, mask), strict=True):
                fields.update(got)
        return out

    def span_fields(self, states: Mapping[int, torch.Tensor], prompt_tokens: int) -> dict[str, Any]:
        """The record fields the captures make of one unpadded response's prompt: ``states`` maps each layer of
        :attr:`prompt_layers` to ``[T, H]`` whose first ``prompt_tokens`` positions are the prompt's."""
        out: dict[str, Any] = {}
        for _, hooks in self._having("span_fields"):
            out.update(hooks.span_fields(states, prompt_tokens))
        return out

    # ----------------------------------------------------------------------------- responses

    def attached(self, requests: Sequence[Any], responses: Sequence[Any]) -> None:
        """A call's ``responses`` (its answers to ``requests``, in order) carry their probes."""
        for _, hooks in self._having("attached"):
            hooks.attached(requests, responses)
