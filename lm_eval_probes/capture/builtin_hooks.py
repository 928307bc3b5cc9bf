"""The four built-in whole-forward captures' hooks in the wrappers' calls (the interface:
:mod:`~lm_eval_probes.capture.calls`). Each is built once at load from an
:class:`~lm_eval_probes.capture.captures.InCalls` (``context``: what its set-up holds, the request of the probe that
asked, ``decode``, ``traces``) and implements only the hooks it needs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from lm_eval_probes.capture.reader import masked_mean_states, span_mean_states

__all__ = ["FirstAttentionHooks", "FocalDepthHooks", "PromptMeansHooks", "StatesFolderHooks"]


class PromptMeansHooks:
    """``prompt_means`` (:class:`~lm_eval_probes.api.PromptMeans`): the mean states over a response's prompt (its last
    ``tail`` tokens; 0: all), set as the record field the request names."""

    def __init__(self, context: Any) -> None:
        self.request = context.request
        self.prompt_layers = tuple(self.request.layers)

    def prompt_fields(self, states: Mapping[int, torch.Tensor], mask: torch.Tensor) -> list[dict[str, Any]]:
        tail = self.request.tail
        if tail:  # left padding: the prompt's last tokens are the last columns
            mask = mask.clone()
            mask[:, : max(0, mask.shape[1] - tail)] = 0
        means = masked_mean_states([states[layer] for layer in self.prompt_layers], mask, self.prompt_layers)
        return [{self.request.field: row} for row in means]

    def span_fields(self, states: Mapping[int, torch.Tensor], prompt_tokens: int) -> dict[str, Any]:
        tail = self.request.tail
        start = max(0, prompt_tokens - tail) if tail else 0
        if prompt_tokens <= start:
            return {}
        layers = self.prompt_layers
        return {self.request.field: span_mean_states(layers, [states[layer][start:prompt_tokens] for layer in layers])}


class FocalDepthHooks:
    """``focal_depth`` (:class:`~lm_eval_probes.api.FocalDepth`): the
    :class:`~lm_eval_probes.capture.readouts.FocalDepthDecoder` records the blocks' inputs of HFLM's loglikelihood
    forwards and of a generation's teacher-forced forward, decodes the rows' positions while the forward runs, and
    gives each span's top-K masses ``mass [S, n]``."""

    def __init__(self, context: Any) -> None:
        self.decoder, self.probe = context.held, context.probe

    def forwards(self, kind: str) -> Any:
        return self.decoder.capture() if kind in ("loglikelihood", "teacher_forced") else None

    def read_at(self, recorded: Any, windows: Mapping[int, tuple[int, int]]) -> None:
        self.decoder.read_at(recorded, dict(windows))

    def position_values(self, recorded: Any, states: Sequence[torch.Tensor] | None,
                        spans: Sequence[tuple[int, int, int]]) -> list[dict[str, torch.Tensor]]:
        return [{"mass": mass} for mass in self.decoder.confidences(states, recorded, spans)]


class FirstAttentionHooks:
    """``first_attention`` (:class:`~lm_eval_probes.api.FirstAttention`): the
    :class:`~lm_eval_probes.capture.attention.FirstAttentionCapture` keeps the first softmax-attention layer's
    arguments in HFLM's own forwards (a ``generate``'s calls joined into whole sequences), and the probe's per-position
    values become each response's record fields."""

    def __init__(self, context: Any) -> None:
        self.capture, self.request = context.held, context.request
        self.decode, self.traces = context.decode, context.traces

    def forwards(self, kind: str) -> Any:
        if kind == "teacher_forced":
            return None
        return self.capture.capture(join=kind == "generate")

    def answers(self, recorded: Any, locate: Callable[[Any], tuple[int, int, int] | None]) -> Any:
        from lm_eval_probes.capture.attention_fields import AttentionRows

        return AttentionRows(self.capture, recorded, self.request, locate=locate, decode=self.decode,
                             traces=self.traces)

    def generated(self, recorded: Any, prompt_len: int, bounds: Sequence[int]) -> list[Any]:
        from lm_eval_probes.capture.attention_fields import attention_spans

        return [_SpanFields(span, self) for span in attention_spans(self.capture, recorded, self.request, prompt_len,
                                                                    bounds)]


@dataclasses.dataclass(frozen=True)
class _SpanFields:
    span: Any
    hooks: FirstAttentionHooks

    def fields(self, kept: int) -> dict[str, Any]:
        return self.span.fields(self.hooks.request, kept, self.hooks.decode, traces=self.hooks.traces)


class StatesFolderHooks:
    """``states_folder`` (``probe_save_states``): the :class:`~lm_eval_probes.capture.saved_states.StatesWriter`
    writes the states each call's responses carry."""

    def __init__(self, context: Any) -> None:
        self.writer = context.held

    def attached(self, requests: Sequence[Any], responses: Sequence[Any]) -> None:
        self.writer.write(requests, responses)
