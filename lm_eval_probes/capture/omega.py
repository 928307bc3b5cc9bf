"""HyperLens Ω of a response (``probes=omega``; the math: :mod:`lm_eval_probes.probes.omega`).

Its per-position values, the top-K masses of the focal-depth decodings of every source layer, need the whole
sequence of each source layer (the model's last m blocks run on it), so the
:class:`~lm_eval_probes.capture.readouts.FocalDepthDecoder` reads them from the wrapper's own forward and the wrapper
attaches them (:meth:`~lm_eval_probes.capture.positions.PositionProbes.with_values`, ``mass``); here they become the
record fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from lm_eval_probes.capture.positions import LensChunk
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.probes import confidence_trajectory, refinement_area


class OmegaPositions:
    """The :class:`~lm_eval_probes.capture.positions.PositionProbe` of Ω: per position ``mass [S, n]`` (attached
    from the :class:`~lm_eval_probes.capture.readouts.FocalDepthDecoder`); per response the confidence trajectory
    and its refinement area."""

    reads_lens = False  # the focal-depth decoder reads every answered request, an option not chosen too
    position_axis = -1

    def __init__(self, config: ProbeConfig, num_layers: int) -> None:
        """Ω's options (focal depth, source layers, K) are the focal-depth decoder's."""

    def layers(self) -> frozenset[int]:
        return frozenset()  # read by the focal-depth decoder from the whole forward, not at the span's positions

    def at_positions(self, chunk: LensChunk) -> dict[str, torch.Tensor]:
        return {}

    def reduce(self, values: Mapping[str, torch.Tensor], *, positions: int, tail: int) -> dict[str, Any]:
        """``omega_trajectory``: the confidence trajectory C_i over the source layers (default i = 0..L: L+1 floats),
        the mean over the response positions of the top-K mass of the focal-depth decoding of layer i; ``omega``: its
        refinement area Ω = Σ_i (1 − C_i). Nothing before the masses are attached."""
        if "mass" not in values:
            return {}
        trajectory = confidence_trajectory(values["mass"].double())  # nan for an empty span
        return {"omega_trajectory": tuple(float(v) for v in trajectory), "omega": refinement_area(trajectory)}
