"""Mean hidden states over a span or under a mask, as the wrappers take them over a prompt (the reader probe's
``prompt_states``; its states at a response's positions: :mod:`lm_eval_probes.probes.reader.probe`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lm_eval_probes.records import LayerStates


def span_mean_states(layers: Sequence[int], spans: Sequence[torch.Tensor]) -> LayerStates:
    """The reader's states of one span: per layer of ``layers``, the float32 mean over positions of its ``[n, H]``
    span (the prompt of a loglikelihood request, or a masked-diffusion request's context and continuation)."""
    return LayerStates(tuple(layers), torch.stack([span.float().mean(0) for span in spans]).cpu().numpy())


def masked_mean_states(states: Sequence[torch.Tensor], mask: torch.Tensor, layers: Sequence[int]) -> list[LayerStates]:
    """Per row: the mean over the positions where ``mask`` is true of each of ``states`` (``[B, T, H]``).

    Returns one ``[k, H]`` float32 :class:`LayerStates` per row (the prompt states of a batch).
    """
    weights = mask.to(device=states[0].device, dtype=torch.float32)
    weights = (weights / weights.sum(-1, keepdim=True).clamp(min=1)).unsqueeze(1)  # [B, 1, T]
    means = torch.stack([torch.bmm(weights, h.float()).squeeze(1) for h in states], dim=1)  # [B, k, H]
    return [LayerStates(tuple(layers), row.float().cpu().numpy()) for row in means]
