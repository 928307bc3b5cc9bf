"""Belief-Trajectory Energy at a response span's positions (``probes=bte``; the math: :mod:`lm_eval_probes.probes.bte`).

Reads the lens logits of the layers whose transitions it computes — the central window's, or all L
(``probe_bte_profile=full``, ``probe_bte_features=1``) — at every response position, two layers' at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from lm_eval_probes.capture.positions import LensChunk
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.probes import (
    central_window,
    central_window_energy,
    consecutive_js_divergences_of_logits,
    depth_profile,
    transition_statistics,
)


def bte_transitions(num_layers: int, config: ProbeConfig) -> tuple[int, int]:
    """The transitions ``[start, stop)`` BTE computes: the central window's, or all L (``probe_bte_profile=full``)."""
    window = central_window(num_layers, config.bte_window)  # validates the window against L
    return (0, num_layers) if config.bte_profile == "full" or config.bte_features else window


class BtePositions:
    """The :class:`~lm_eval_probes.capture.positions.PositionProbe` of BTE: per position the JSD of consecutive
    logit-lens beliefs over :func:`bte_transitions`; per response the depth profile, its central-window energy ē_M
    and (``probe_bte_features=1``) the transitions' statistics."""

    reads_lens = True
    position_axis = -1

    def __init__(self, config: ProbeConfig, num_layers: int) -> None:
        self.num_layers = num_layers
        self.window = central_window(num_layers, config.bte_window)
        self.transitions = bte_transitions(num_layers, config)
        self.features = config.bte_features

    def layers(self) -> frozenset[int]:
        first, last = self.transitions
        return frozenset(range(first, last + 1))

    def at_positions(self, chunk: LensChunk) -> dict[str, torch.Tensor]:
        """``energy [stop − start, n]``: the JSD (nats) of each transition of :attr:`transitions`."""
        return {"energy": consecutive_js_divergences_of_logits(chunk.layer_logits(*self.transitions))}

    def reduce(self, values: Mapping[str, torch.Tensor], *, positions: int, tail: int) -> dict[str, Any]:
        """``bte_energy``: the mean of the depth profile e(l) over the central window (the difficulty scalar ē_M);
        ``bte_profile`` (every transition computed: ``probe_bte_profile=full``): e(l), l = 0..L-1, the mean JSD of
        layer l → l+1 over the positions; ``bte_features`` (``probe_bte_features=1``): the 11 statistics of each
        transition over the positions (:func:`~lm_eval_probes.probes.transition_statistics`), transition-major
        (11·L floats: transition 0's mean, std, …, then transition 1's), for the detection/attribution classifiers."""
        energy = values["energy"].double()
        first, last = self.transitions
        profile = depth_profile(energy)  # nan for an empty span
        window_start, window_stop = self.window
        fields: dict[str, Any] = {"bte_energy": central_window_energy(profile, (window_start - first, window_stop - first))}
        if (first, last) == (0, self.num_layers):
            fields["bte_profile"] = tuple(float(v) for v in profile)
            if self.features and positions:
                statistics = transition_statistics(energy)  # [L, 11]
                fields["bte_features"] = tuple(float(v) for v in statistics.reshape(-1))
        return fields
