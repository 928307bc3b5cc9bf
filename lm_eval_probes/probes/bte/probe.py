"""Belief-Trajectory Energy (``probes=bte``): the Jensen–Shannon energy between consecutive logit-lens beliefs (the
math: :mod:`lm_eval_probes.probes.bte.math`).

Reads the lens logits of the layers whose transitions it computes — the central window's, or all L
(``probe_bte_profile=full``, ``probe_bte_features=1``) — at every response position, two layers' at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lm_eval_probes.api import Probe, ProbeOptions, Row, Shapes, TraceField, as_choice, as_range, option

PROFILE_MODES: tuple[str, ...] = ("window", "full")
"""``probe_bte_profile``: ``window`` reads out only the layers of ē_M's central window (the cheap default), ``full``
every layer, so each record also carries the whole depth profile (for the reports' plots)."""


@dataclass(frozen=True)
class BteOptions(ProbeOptions):
    """BTE's options."""

    window: tuple[int, int] | None = option(
        None, "central window [start, stop) of transitions for ē_M (e.g. 12:20); auto = [⌊3L/8⌋, ⌊5L/8⌋)",
        parse=as_range)
    profile: str = option("window", "which transitions BTE computes: window (ē_M's only) or full (all L, and the "
                                    "per-document depth profile)", parse=as_choice(*PROFILE_MODES))
    features: bool = option(False, "also record the 11 statistics of every transition (11·L features of the paper's "
                                   "detection/attribution classifiers); computes all L transitions")

    def __post_init__(self) -> None:
        if self.window is not None:
            start, stop = self.window
            if not 0 <= start < stop:
                raise ValueError(f"probe_bte_window must be 'start:stop' with 0 <= start < stop, got {self.window}")

    def transitions(self, num_layers: int) -> tuple[int, int]:
        """The transitions ``[start, stop)`` BTE computes: the central window's, or all L (``profile=full``)."""
        from lm_eval_probes.probes.bte.math import central_window

        window = central_window(num_layers, self.window)  # validates the window against L
        return (0, num_layers) if self.profile == "full" or self.features else window


class BtePositions:
    """BTE's :class:`~lm_eval_probes.api.PositionProbe`: per position the JSD of consecutive logit-lens beliefs over
    :meth:`BteOptions.transitions`; per response the depth profile, its central-window energy ē_M and
    (``probe_bte_features=1``) the transitions' statistics."""

    reads_lens = True
    position_axis = -1

    def __init__(self, options: BteOptions, num_layers: int) -> None:
        from lm_eval_probes.probes.bte.math import central_window

        self.num_layers = num_layers
        self.window = central_window(num_layers, options.window)
        self.transitions = options.transitions(num_layers)
        self.features = options.features

    def layers(self) -> frozenset[int]:
        first, last = self.transitions
        return frozenset(range(first, last + 1))

    def at_positions(self, chunk: Any) -> dict[str, Any]:
        """``energy [stop − start, n]``: the JSD (nats) of each transition of :attr:`transitions`."""
        from lm_eval_probes.probes.bte.math import consecutive_js_divergences_of_logits

        return {"energy": consecutive_js_divergences_of_logits(chunk.layer_logits(*self.transitions))}

    def per_position(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The trace's ``bte_step`` ``[n]``: at each position the mean JSD of the central window's transitions (the
        mean of these over the positions is ē_M: both are means over the window × the positions)."""
        first, _ = self.transitions
        window_start, window_stop = self.window
        return {"bte_step": values["energy"].double()[window_start - first : window_stop - first].mean(dim=0)}

    def reduce(self, values: Mapping[str, Any], *, positions: int, generation: bool) -> dict[str, Any]:
        """``bte_energy``: the mean of the depth profile e(l) over the central window (the difficulty scalar ē_M);
        ``bte_profile`` (every transition computed: ``probe_bte_profile=full``): e(l), l = 0..L-1, the mean JSD of
        layer l → l+1 over the positions; ``bte_features`` (``probe_bte_features=1``): the 11 statistics of each
        transition over the positions (:func:`~lm_eval_probes.probes.bte.math.transition_statistics`), transition-major
        (11·L floats: transition 0's mean, std, …, then transition 1's), for the detection/attribution classifiers."""
        from lm_eval_probes.probes.bte.math import central_window_energy, depth_profile, transition_statistics

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


def bte_memory(options: BteOptions, shapes: Shapes) -> float:
    """Two alternating ``[chunk, V]`` lens buffers and the JSD's log-softmaxes and mixture of a transition (float32):
    five buffers at the peak, as measured at real widths; the per-transition energies are small (``[L, chunk]``)."""
    return 5 * shapes.lens_positions * shapes.vocab * 4


@dataclass(frozen=True)
class BteRecord:
    """BTE's values of one response (:meth:`BtePositions.reduce`; ``None``: not computed)."""

    bte_energy: float | None = None
    bte_profile: tuple[float, ...] | None = None
    bte_features: tuple[float, ...] | None = None


JSD_BOUNDS: tuple[float, float] = (0.0, math.log(2.0))
"""A mean of Jensen–Shannon divergences in nats: [0, ln 2]."""


PROBE = Probe(
    name="bte",
    summary="BTE: Jensen–Shannon energy between consecutive logit-lens beliefs, over the central window of "
            "depth (probe_bte_profile=full: every transition)",
    paper="Belief-Trajectory Energy: \"Measuring the Path to a Prediction\" (2026 preprint)",
    formula="BTE_t,l = JSD(p_t^(l), p_t^(l+1)) of consecutive logit-lens beliefs (nats); e(l) = mean over response "
            "positions; ē_M = mean of e(l) over the central window [⌊3L/8⌋, ⌊5L/8⌋)",
    reads="the states of the layers of the central window (or all L+1) at every response position",
    record=BteRecord,
    position_probe=BtePositions,
    traces=(TraceField("bte_step", "bte_energy"),),
    options=BteOptions,
    memory=bte_memory,
    default_enabled=True,
    rows=(
        Row("bte_energy", "float", "mean", False, "probe",
            "mean over documents of the BTE central-window energy ē_M (nats)", "bte_energy",
            bounds=JSD_BOUNDS),
        Row("bte_profile", "vector", "probe_vector_mean", False, "probe",
            "probe_bte_profile=full: mean over documents of the mean JSD e(l) over all L layer transitions "
            "(nats); per document the depth profile e(0..L-1) is in --log_samples", "bte_profile", bounds=JSD_BOUNDS),
    ),
    ranked="bte_energy",
    ranked_text="ē_M",
    label="BTE energy ē_M (nats)",
)
