"""What a :class:`~lm_eval_probes.api.FirstAttention` request's per-position values become in each response's record:
the bookkeeping of a ``loglikelihood`` call (:class:`AttentionRows`, beside HFLM's own batching) and of a ``generate``
batch (:func:`attention_spans`), over what :class:`~lm_eval_probes.capture.attention.FirstAttentionCapture` kept of
the forwards."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lm_eval_probes.api import FirstAttention
from lm_eval_probes.capture.attention import CapturedInputs, FirstAttentionCapture, _LayerCall
from lm_eval_probes.records import trace_values

logger = logging.getLogger(__name__)

__all__ = ["AttentionRows", "AttentionSpan", "attention_spans", "response_fields"]


class AttentionRows:
    """Bookkeeping of one ``loglikelihood`` call for a :class:`~lm_eval_probes.api.FirstAttention` request, beside
    HFLM's own batching.

    HFLM answers each row's requests (:meth:`on_answer`, from ``cache_hook.add_partial``) after the row's forward;
    ``locate`` (:meth:`~lm_eval_probes.capture.loglikelihood.LoglikelihoodRows.locate`) names the request's row in
    that batch and its input length. The probe's per-position values of the batch are computed once, at its first
    answer; a request's record fields are those of the row's input positions ``[0, input length)``: its context and
    all but its last continuation token (what the model saw). Only the current batch's values are held.
    """

    def __init__(self, capture: FirstAttentionCapture, inputs: CapturedInputs, request: FirstAttention, *,
                 locate: Callable[[Any], tuple[int, int, int] | None], decode: Callable[[int], str],
                 traces: bool = False) -> None:
        self.capture, self.inputs, self.request, self.locate, self.decode = capture, inputs, request, locate, decode
        self.traces = traces
        self.fields: dict[Any, dict[str, Any]] = {}
        self._layer_call: _LayerCall | None = None
        self._batch: tuple[torch.Tensor, torch.Tensor] | None = None

    def on_answer(self, attr: str, request_key: Any, _answer: Any) -> None:
        located = self.locate(request_key) if attr == "loglikelihood" else None
        if located is None:
            return
        layer_call = self.inputs.latest()
        if layer_call is not self._layer_call:  # the first answer of a new batch
            self._layer_call = layer_call
            self._batch = (self.request.values(self.capture.batch(layer_call)), layer_call.ids.cpu())
        values, ids = self._batch
        row, input_length, _ = located
        self.fields[request_key] = response_fields(self.request, values[row, :input_length], ids[row, :input_length],
                                                   self.decode, traces=self.traces)


def response_fields(request: FirstAttention, values: torch.Tensor, token_ids: torch.Tensor, decode: Callable[[int], str],
                    *, traces: bool = False) -> dict[str, Any]:
    """One response's record fields from the per-position ``values`` of the n positions the model saw; with ``traces``
    (``probe_traces=true``) and a request that names :attr:`~lm_eval_probes.api.FirstAttention.trace`, also
    ``trace``: the values over every position (``nan``: none, ``null``) and ``sequence_tokens`` (the ids decoded one
    by one), for the wrapper to join into the response's trace."""
    fields = request.fields(values, token_ids, decode)
    if traces and request.trace is not None:
        fields["trace"] = {request.trace: trace_values(values.tolist()),
                           "sequence_tokens": [decode(int(token)) for token in token_ids.tolist()]}
    return fields


@dataclass(frozen=True)
class AttentionSpan:
    """One generation's per-position values over the positions the model saw: its (unpadded) prompt, then the
    generated tokens fed back (all but the last); :meth:`fields` cuts them to the kept tokens."""

    values: torch.Tensor
    token_ids: torch.Tensor
    prompt_tokens: int

    def fields(self, request: FirstAttention, kept: int, decode: Callable[[int], str], *,
               traces: bool = False) -> dict[str, Any]:
        """The record fields of the prompt and the first ``kept − 1`` kept tokens (the inputs of the kept span)."""
        stop = self.prompt_tokens + max(kept, 1) - 1
        return response_fields(request, self.values[:stop], self.token_ids[:stop], decode, traces=traces)


def attention_spans(capture: FirstAttentionCapture, inputs: CapturedInputs, request: FirstAttention, prompt_len: int,
                    bounds: Sequence[int]) -> list[AttentionSpan]:
    """Per row of one (left-padded) ``generate`` batch, the values of its real positions up to its bound (``nan`` where
    the layer reads the attention mask before its attention call, :func:`_generate_unread`, and on the left-padded rows
    of a layer whose queries read the positions before their own, :func:`_padded_unread`)."""
    batch = capture.joined(inputs)
    ids = batch.ids.cpu()
    if capture.reads_mask:
        _generate_unread(capture._name)
        values = torch.full(ids.shape, float("nan"), dtype=torch.float64)
    else:
        values = request.values(batch)
    mask = inputs.layer_calls[-1].mask
    first = [0] * values.shape[0] if mask is None else (mask[:, :prompt_len] == 0).sum(-1).tolist()
    if capture._reach and any(first):  # the joined re-run has no mask: the first real queries would read the padding
        _padded_unread(capture._name)
        values[torch.tensor(first) > 0] = float("nan")
    return [
        AttentionSpan(values[row, pad : prompt_len + bound - 1], ids[row, pad : prompt_len + bound - 1], prompt_len - pad)
        for row, (pad, bound) in enumerate(zip(first, bounds, strict=True))
    ]


@functools.cache
def _padded_unread(name: str) -> None:
    """Say once per layer why the first-attention values of a generation's left-padded rows are ``nan``."""
    logger.warning("%s: its queries read the positions before their own (a causal convolution), and the calls of one "
                   "generate are re-run as one without their masks (they do not join), so a left-padded row's first "
                   "queries would read its padding: the first-attention values of left-padded generations are nan "
                   "(those of loglikelihood requests and of unpadded rows are computed)", name)


@functools.cache
def _generate_unread(name: str) -> None:
    """Say once per layer why a generation's first-attention values are ``nan``."""
    logger.warning("%s reads the attention mask before its attention call (an indexer), so the calls of one generate "
                   "cannot be re-run as one: the first-attention values of generated text are nan (those of "
                   "loglikelihood requests are computed)", name)
