"""δ_TCB (``probes=tcb``): how far the final hidden state can move before the next-token distribution changes, with
its entropy, logit-margin and effective-vocabulary baselines (the math: :mod:`lm_eval_probes.probes.tcb.math`).

Reads the final layer's state at every response position and the final distribution the harness itself reads (its
logits before the model's soft-capping).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lm_eval_probes.api import (UNBOUNDED, UNIT_INTERVAL, Probe, ProbeOptions, Row, Shapes, TraceField, as_float, option,
                                or_none)


@dataclass(frozen=True)
class TcbOptions(ProbeOptions):
    """δ_TCB's options."""

    eps: float = option(1.0, "tolerance ε of δ_TCB = ε / ‖J‖_F")
    ablation: float | None = option(
        None, "the paper's cluster/disperse ablation: the competing tokens' unembedding rows moved toward their "
              "probability-weighted centre by α (0 < α < 1) and away by 1/α, o held fixed; off unless set",
        parse=or_none(as_float, "", "none", "0", "off"), shown="none", requires_probe=True)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"probe_tcb_eps must be finite and > 0, got {self.eps!r}")
        if self.ablation is not None and not (isinstance(self.ablation, float) and 0.0 < self.ablation < 1.0):
            raise ValueError(f"probe_tcb_ablation must be a factor 0 < α < 1 (cluster by α, disperse by 1/α), "
                             f"got {self.ablation!r}")


class TcbPositions:
    """δ_TCB's :class:`~lm_eval_probes.api.PositionProbe`: per position log10 δ_TCB (ε = ``probe_tcb_eps``) and the
    final distribution's entropy, top-1 − top-2 logit margin and effective vocabulary sizes; per response their means
    and δ's minimum. With ``probe_tcb_ablation=α`` also δ after the competing tokens' rows are clustered (by α) and
    dispersed (by 1/α) with the distribution held fixed: per response the means of their log10 and the fraction of
    positions where δ_cluster > δ > δ_disperse."""

    reads_lens = True
    position_axis = -1

    def __init__(self, options: TcbOptions, num_layers: int) -> None:
        self.eps = options.eps
        self.scales = () if options.ablation is None else (options.ablation, 1.0 / options.ablation)
        self.num_layers = num_layers

    def layers(self) -> frozenset[int]:
        return frozenset({self.num_layers})

    def at_positions(self, chunk: Any) -> dict[str, Any]:
        """``[n]`` each: ``log10_tcb`` (float64), ``entropy``, ``logit_margin``, ``v_eff_ipr``, ``v_eff_exp``; with the
        ablation ``log10_cluster`` and ``log10_disperse`` (float64)."""
        import torch

        from lm_eval_probes.probes.tcb.math import tcb_readout

        readout = chunk.readout
        # logits = g(s·(W h + b)): J carries the factor s, so δ = (ε/|s|) / ‖J‖ of the unscaled rows at those logits
        delta, baselines, moved = tcb_readout(
            chunk.final_hidden,
            readout.rows,
            readout.bias,
            eps=self.eps / abs(readout.logit_scale),
            logit_softcap=readout.logit_softcap,
            row_sq_norms=readout.row_sq_norms,
            logits=chunk.raw_logits,
            scales=self.scales,
        )
        values = {
            "log10_tcb": torch.log10(delta.double()),
            "entropy": baselines.entropy,
            "logit_margin": baselines.logit_margin,
            "v_eff_ipr": baselines.v_eff_ipr,
            "v_eff_exp": baselines.v_eff_exp,
        }
        if self.scales:
            values["log10_cluster"], values["log10_disperse"] = torch.log10(moved.double()).unbind(0)
        return values

    def per_position(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The trace's arrays (:data:`TCB_TRACES`): log10 δ_TCB, the entropy and the logit margin at each position."""
        return {"tcb_log10": values["log10_tcb"], "entropy": values["entropy"], "logit_margin": values["logit_margin"]}

    def reduce(self, values: Mapping[str, Any], *, positions: int, generation: bool) -> dict[str, Any]:
        """``tcb_log10_mean`` / ``tcb_log10_min``: mean / minimum of log10 δ_TCB over the positions; ``tcb_argmin``:
        the index (0-based, within the response) of the position with the smallest δ (``None`` without positions);
        ``entropy`` / ``logit_margin`` / ``v_eff_ipr`` / ``v_eff_exp``: means over the positions of the final
        distribution's entropy (nats), top-1 minus top-2 logit, 1/Σo² and exp(entropy); with the ablation
        ``tcb_cluster_log10_mean`` / ``tcb_disperse_log10_mean`` (means of log10 δ after each move) and
        ``tcb_ablation_ordered`` (the fraction of positions with δ_cluster > δ > δ_disperse), else ``None``."""
        import torch

        log10_tcb = values["log10_tcb"]
        baselines = ("entropy", "logit_margin", "v_eff_ipr", "v_eff_exp")
        # the four baselines' means in one reduction (host values: no sync)
        means = dict(zip(baselines, torch.stack([values[name] for name in baselines]).double().mean(-1).tolist())) \
            if positions else dict.fromkeys(baselines, math.nan)

        def mean(name: str) -> float:
            return values[name].double().mean().tolist() if positions else math.nan

        ablation: dict[str, Any] = dict.fromkeys(("tcb_cluster_log10_mean", "tcb_disperse_log10_mean",
                                                  "tcb_ablation_ordered"))
        if self.scales:
            cluster, disperse = values["log10_cluster"], values["log10_disperse"]
            ordered = (cluster > log10_tcb) & (log10_tcb > disperse)
            ablation = {"tcb_cluster_log10_mean": mean("log10_cluster"),
                        "tcb_disperse_log10_mean": mean("log10_disperse"),
                        "tcb_ablation_ordered": ordered.double().mean().tolist() if positions else math.nan}
        return {
            "tcb_log10_mean": mean("log10_tcb"),
            "tcb_log10_min": log10_tcb.min().tolist() if positions else math.nan,
            "tcb_argmin": log10_tcb.argmin().tolist() if positions else None,
            **means,
            **ablation,
        }


def lens_bytes(shapes: Shapes, buffers: float) -> float:
    """``buffers`` float32 ``[chunk, V]`` buffers of the logit lens."""
    return buffers * shapes.lens_positions * shapes.vocab * 4


def tcb_memory(options: TcbOptions, shapes: Shapes) -> float:
    """The final logits of a lens chunk (float32) and two float64 ``[chunk, V]`` tensors (the softmax and the Jacobian
    terms' weights): five float32-sized buffers; the ablation adds none (its moves reuse the terms)."""
    return lens_bytes(shapes, 5)


@dataclass(frozen=True)
class TcbRecord:
    """δ_TCB's values of one response (:meth:`TcbPositions.reduce`; ``None``: not computed, ``nan``: no positions)."""

    tcb_log10_mean: float | None = None
    tcb_log10_min: float | None = None
    tcb_argmin: int | None = None
    entropy: float | None = None
    logit_margin: float | None = None
    v_eff_ipr: float | None = None
    v_eff_exp: float | None = None
    tcb_cluster_log10_mean: float | None = None
    tcb_disperse_log10_mean: float | None = None
    tcb_ablation_ordered: float | None = None


TCB_TRACES = (TraceField("tcb_log10", "tcb_log10_mean"), TraceField("tcb_log10", "tcb_log10_min", "min"),
              TraceField("entropy", "entropy"), TraceField("logit_margin", "logit_margin"))
"""δ_TCB's per-position arrays in a document's trace and the record fields they reduce to."""

PROBE = Probe(
    name="tcb",
    summary="δ_TCB: how far the final hidden state can move before the next-token distribution changes "
            "(+ entropy, logit margin and V_eff baselines)",
    paper="Token Constraint Bound: \"Beyond Confidence: The Rhythms of Reasoning\" (ICLR 2026, arXiv 2602.10816)",
    formula="δ_TCB = ε / ‖J‖_F, J = ∂softmax(W h + b)/∂h, ‖J‖_F² = Σ_i o_i² ‖w_i − Wᵀo‖², ε = 1, per response "
            "position; per document the mean and the minimum of log10 δ_TCB",
    reads="the final layer's state at every response position (its logits: the harness's own readout)",
    record=TcbRecord,
    position_probe=TcbPositions,
    traces=TCB_TRACES,
    options=TcbOptions,
    memory=tcb_memory,
    default_enabled=True,
    rows=(
        Row("tcb_log10", "float", "mean", True, "probe",
            "mean over documents of the mean log10 δ_TCB over response positions", "tcb_log10_mean",
            bounds=UNBOUNDED),  # δ_TCB = ε/‖J‖_F takes any value in (0, ∞)
        Row("tcb_log10_min", "float", "mean", True, "probe",
            "mean over documents of the smallest log10 δ_TCB of the response", "tcb_log10_min", bounds=UNBOUNDED),
        Row("tcb_ablation_ordered", "float", "mean", True, "probe",
            "probe_tcb_ablation=α: mean over documents of the fraction of response positions where δ_TCB with "
            "the competing tokens' unembedding rows clustered (×α) > δ_TCB > dispersed (×1/α), o held fixed",
            "tcb_ablation_ordered", scored=False, bounds=UNIT_INTERVAL),
        Row("tcb_cluster_log10", "float", "mean", True, "probe",
            "probe_tcb_ablation=α: mean over documents of the mean log10 δ_TCB with the competitors' rows "
            "clustered toward their probability-weighted centre by α", "tcb_cluster_log10_mean", scored=False,
            bounds=UNBOUNDED),
        Row("tcb_disperse_log10", "float", "mean", True, "probe",
            "probe_tcb_ablation=α: mean over documents of the mean log10 δ_TCB with the competitors' rows "
            "dispersed from their probability-weighted centre by 1/α", "tcb_disperse_log10_mean", scored=False,
            bounds=UNBOUNDED),
    ),
    ranked="tcb_log10_mean",
    ranked_text="the document's mean log10 δ_TCB",
    label="log10 δ_TCB",
)
