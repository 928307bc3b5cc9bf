"""The reader's hidden states (``probes=reader``; the math: :mod:`lm_eval_probes.probes.reader`): the reader layers'
states at a response span's positions (:class:`ReaderPositions`), and the means over a prompt the wrappers take
(:func:`span_mean_states`, :func:`masked_mean_states`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lm_eval_probes.capture.positions import LensChunk
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.records import LayerStates


class ReaderPositions:
    """The :class:`~lm_eval_probes.capture.positions.PositionProbe` of the reader: per position the reader layers'
    states (float32); per response their mean and (generations) the last positions' states one by one. Reads no
    lens: every answered request keeps them, also an option the model did not choose."""

    reads_lens = False
    position_axis = 1

    def __init__(self, config: ProbeConfig, num_layers: int) -> None:
        self.reader_layers = config.resolved_reader_layers(num_layers)

    def layers(self) -> frozenset[int]:
        return frozenset(self.reader_layers)

    def at_positions(self, chunk: LensChunk) -> dict[str, torch.Tensor]:
        """``states [k, n, H]``: the k reader layers' states, float32."""
        return {"states": torch.stack([chunk.states(layer).detach().float().cpu() for layer in self.reader_layers])}

    def reduce(self, values: Mapping[str, torch.Tensor], *, positions: int, tail: int) -> dict[str, Any]:
        """``answer_states``: ``[k, H]`` the mean hidden state over the response positions at the reader layers;
        ``tail_states`` (generations: ``tail`` > 0): ``[k, m, H]`` the states of the last m = ``tail`` response
        positions (float16; float32 when a value exceeds float16's range), so that the reader can average over the
        answer span the task's filter extracts later. Neither without positions. (``prompt_states``, the mean over
        the prompt, is measured by the wrapper: :func:`span_mean_states`, :func:`masked_mean_states`.)"""
        states = values["states"]
        fields: dict[str, Any] = {}
        if positions:
            fields["answer_states"] = answer_mean_states(self.reader_layers, states)
        if positions and tail:
            fields["tail_states"] = compact_states(self.reader_layers, states[:, -tail:])
        return fields


def span_mean_states(layers: Sequence[int], spans: Sequence[torch.Tensor]) -> LayerStates:
    """The reader's states of one span: per layer of ``layers``, the float32 mean over positions of its ``[n, H]``
    span (the prompt of a loglikelihood request, or a masked-diffusion request's context and continuation)."""
    return LayerStates(tuple(layers), torch.stack([span.float().mean(0) for span in spans]).cpu().numpy())


def answer_mean_states(layers: Sequence[int], states: torch.Tensor) -> LayerStates:
    """The reader's answer states: ``[k, n, H]`` states of the response positions, averaged over positions in float64."""
    return LayerStates(tuple(layers), states.double().mean(1).float().numpy())


def compact_states(layers: Sequence[int], states: torch.Tensor) -> LayerStates:
    """``[k, m, H]`` states kept one by one: float16, or float32 where a value exceeds float16's range (±65504, as in
    Gemma's residual stream)."""
    packed = states.half()
    if not bool(torch.isfinite(packed).all()):
        packed = states.float()
    return LayerStates(tuple(layers), packed.numpy())


def masked_mean_states(states: Sequence[torch.Tensor], mask: torch.Tensor, layers: Sequence[int]) -> list[LayerStates]:
    """Per row: the mean over the positions where ``mask`` is true of each of ``states`` (``[B, T, H]``).

    Returns one ``[k, H]`` float32 :class:`LayerStates` per row (the prompt states of a batch).
    """
    weights = mask.to(device=states[0].device, dtype=torch.float32)
    weights = (weights / weights.sum(-1, keepdim=True).clamp(min=1)).unsqueeze(1)  # [B, 1, T]
    means = torch.stack([torch.bmm(weights, h.float()).squeeze(1) for h in states], dim=1)  # [B, k, H]
    return [LayerStates(tuple(layers), row.float().cpu().numpy()) for row in means]
