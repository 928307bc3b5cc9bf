"""What the whole-forward captures set up on one model do in a wrapper's calls: the wrappers' one handle on them.

A wrapper names no capture (:mod:`~lm_eval_probes.capture.captures`). It holds one :class:`CallCaptures` of its
:class:`~lm_eval_probes.capture.plan.ProbePlan` and what each capture set up at load holds, and hands it a call's
forwards and states; it gives back what the captures the probes asked for add to each response:

* around HFLM's own forwards (:meth:`CallCaptures.forwards`): the hooks of the captures that read those forwards'
  inputs (the first softmax-attention layer's arguments), then per answered request (:meth:`CallCaptures.answers`)
  or per generated row (:meth:`CallCaptures.generated`) the record fields they make of them;
* over a response's prompt (:meth:`CallCaptures.prompt_fields`, :meth:`CallCaptures.span_fields`): the record fields
  made of the prompt's states (the prompt means), from the layers :attr:`CallCaptures.prompt_layers`;
* around a teacher-forced forward (:meth:`CallCaptures.teacher_forced`) and after it
  (:meth:`CallCaptures.position_values`): the per-position values a capture computes from the blocks' inputs (Ω's
  focal-depth masses), joined to the position probes of the probe that asked.

Adding a capture means registering it (:func:`~lm_eval_probes.capture.captures.register_capture`) and giving it its
part here; neither wrapper changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from lm_eval_probes.capture.plan import ProbePlan
from lm_eval_probes.capture.reader import masked_mean_states, span_mean_states
from lm_eval_probes.records import ResponseProbe

__all__ = ["CallCaptures", "GeneratedRow", "with_fields"]


@dataclass(frozen=True)
class GeneratedRow:
    """What the captures hold of one generated row until its kept tokens are known: :meth:`fields` cuts it to them."""

    span: Any = None  # the first-attention values of the row (an AttentionSpan), or None
    request: Any = None
    decode: Callable[[int], str] | None = None
    traces: bool = False

    def fields(self, kept: int) -> dict[str, Any]:
        """The record fields of the row's first ``kept`` tokens (``{}``: nothing captured)."""
        if self.span is None:
            return {}
        return self.span.fields(self.request, kept, self.decode, traces=self.traces)


def with_fields(probe: ResponseProbe, fields: Mapping[str, Any]) -> ResponseProbe:
    """``probe`` with the record fields a capture made (:meth:`CallCaptures.answers`, :meth:`GeneratedRow.fields`); the
    arrays over every position the model saw (``probe_traces=true``: under ``trace``) join the probe's trace."""
    if not fields:
        return probe
    fields = dict(fields)
    arrays = fields.pop("trace", None)
    if probe.trace is not None and arrays:
        fields["trace"] = {**probe.trace, **arrays}
    return dataclasses.replace(probe, **fields)


class CallCaptures:
    """The whole-forward captures of one loaded model, in its wrapper's calls (see the module docstring).

    ``plan``: the model's plan (which captures the enabled probes ask for, with their requests); ``held``: what each
    capture set up at load holds, by capture name (:meth:`~lm_eval_probes.capture.plan.ProbePlan.set_up`);
    ``decode``: a token id → its text (the tokenizer's); ``traces``: ``probe_traces=true``.
    """

    def __init__(self, plan: ProbePlan, held: Mapping[str, Any], *, decode: Callable[[int], str] | None = None,
                 traces: bool = False) -> None:
        self.plan, self.held, self.decode, self.traces = plan, dict(held), decode, traces

    @property
    def decoder(self) -> Any:
        """The focal-depth decoder (:class:`~lm_eval_probes.capture.readouts.FocalDepthDecoder`) whose block inputs
        the teacher-forced and the harness's forwards record (``None``: no capture asks for them)."""
        return self.held.get("focal_depth")

    @property
    def _attention(self) -> Any:
        return self.held.get("first_attention")

    @property
    def reads_forwards(self) -> bool:
        """Whether a capture reads the inputs of the model's own forwards (a replayed generation must then run one)."""
        return self._attention is not None

    @property
    def states_writer(self) -> Any:
        """The writer of ``probe_save_states`` (``None`` without it)."""
        return self.held.get("states_folder")

    # ----------------------------------------------------------------------------- the harness's own forwards

    @contextmanager
    def forwards(self, *, join: bool = False) -> Iterator[Any]:
        """Around HFLM's own forwards of one call: the hooks of the captures that read their inputs; yields what they
        record (``None``: no such capture). ``join``: the forwards are one ``generate``'s calls, joined into whole
        sequences."""
        if self._attention is None:
            yield None
            return
        with self._attention.capture(join=join) as inputs:
            yield inputs

    def answers(self, recorded: Any, *, locate: Callable[[Any], tuple[int, int, int] | None]) -> Any:
        """The per-request bookkeeping of one ``loglikelihood`` call over what :meth:`forwards` recorded
        (``None``: nothing recorded): its ``on_answer(attr, request key, answer)`` is called per answered request
        (``locate``: the request's row of the latest batch), its ``fields`` maps a request key to its record fields."""
        if recorded is None:
            return None
        from lm_eval_probes.capture.attention import AttentionRows

        return AttentionRows(self._attention, recorded, self.plan.whole.first_attention[1], locate=locate,
                             decode=self.decode, traces=self.traces)

    def generated(self, recorded: Any, prompt_len: int, bounds: Sequence[int]) -> list[GeneratedRow]:
        """Per row of one (left-padded) ``generate`` batch, what :meth:`forwards` recorded of it up to its bound."""
        if recorded is None:
            return [GeneratedRow() for _ in bounds]
        from lm_eval_probes.capture.attention import attention_spans

        request = self.plan.whole.first_attention[1]
        return [GeneratedRow(span, request, self.decode, self.traces)
                for span in attention_spans(self._attention, recorded, request, prompt_len, bounds)]

    # ----------------------------------------------------------------------------- the prompt's states

    @property
    def prompt_layers(self) -> tuple[int, ...]:
        """The ``hidden_states`` layers whose states over a response's prompt a capture reads (none: no such capture)."""
        return self.plan.whole.prompt_layers

    def prompt_fields(self, states: Sequence[torch.Tensor], mask: torch.Tensor) -> list[dict[str, Any]]:
        """Per row of a left-padded batch, the record fields made of its prompt's states: ``states`` (one
        ``[B, P, H]`` per layer of :attr:`prompt_layers`) over the prompt's ``P`` columns, ``mask`` ``[B, P]`` its
        real tokens."""
        whole = self.plan.whole
        if not whole.prompt_layers:
            return [{} for _ in range(mask.shape[0])]
        tail = whole.prompt_tail
        if tail:  # left padding: the prompt's last tokens are the last columns
            mask = mask.clone()
            mask[:, : max(0, mask.shape[1] - tail)] = 0
        return [whole.prompt_fields(means) for means in masked_mean_states(states, mask, whole.prompt_layers)]

    def span_fields(self, states: Mapping[int, torch.Tensor], prompt_tokens: int) -> dict[str, Any]:
        """The record fields made of one unpadded response's prompt: ``states`` maps each layer of
        :attr:`prompt_layers` to ``[T, H]`` states whose first ``prompt_tokens`` positions are the prompt's."""
        whole = self.plan.whole
        layers = whole.prompt_layers
        if not layers:
            return {}
        tail = whole.prompt_tail
        start = max(0, prompt_tokens - tail) if tail else 0
        if prompt_tokens <= start:
            return {}
        return whole.prompt_fields(span_mean_states(layers, [states[layer][start:prompt_tokens] for layer in layers]))

    # ----------------------------------------------------------------------------- a teacher-forced forward

    @contextmanager
    def teacher_forced(self, windows: Mapping[int, tuple[int, int]]) -> Iterator[Any]:
        """Around one teacher-forced forward: the hooks of the captures that read its blocks' inputs at the rows'
        positions ``windows`` (row → ``[start, stop)``); yields what they record (``None``: no such capture)."""
        decoder = self.decoder
        if decoder is None:
            yield None
            return
        with decoder.capture() as inputs:
            decoder.read_at(inputs, dict(windows))
            yield inputs

    def position_values(self, rows: Sequence[Any], states: Sequence[torch.Tensor] | None, recorded: Any,
                        spans: Sequence[tuple[int, int, int]]) -> list[Any]:
        """The position probes ``rows`` (one per span ``(row, start, stop)``) with the per-position values the
        captures computed from what :meth:`teacher_forced` recorded of the forward whose ``states`` they are."""
        if recorded is None:
            return list(rows)
        masses = self.decoder.confidences(states, recorded, spans)
        name = self.plan.whole.focal_depth[0]
        return [probes.with_values(name, mass=mass) for probes, mass in zip(rows, masses, strict=True)]
