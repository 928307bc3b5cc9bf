"""δ_TCB and its baselines at a response span's positions (``probes=tcb``; the math: :mod:`lm_eval_probes.probes.tcb`).

Reads the final layer's state at every response position and the final distribution the harness itself reads
(its logits before the model's soft-capping).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from lm_eval_probes.capture.positions import LensChunk
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.probes import tcb_readout


class TcbPositions:
    """The :class:`~lm_eval_probes.capture.positions.PositionProbe` of δ_TCB: per position log10 δ_TCB (ε =
    ``probe_tcb_eps``) and the final distribution's entropy, top-1 − top-2 logit margin and effective vocabulary
    sizes; per response their means and δ's minimum. With ``probe_tcb_ablation=α`` also δ after the competing
    tokens' rows are clustered (by α) and dispersed (by 1/α) with the distribution held fixed: per response the means
    of their log10 and the fraction of positions where δ_cluster > δ > δ_disperse."""

    reads_lens = True
    position_axis = -1

    def __init__(self, config: ProbeConfig, num_layers: int) -> None:
        self.eps = config.tcb_eps
        self.scales = () if config.tcb_ablation is None else (config.tcb_ablation, 1.0 / config.tcb_ablation)
        self.num_layers = num_layers

    def layers(self) -> frozenset[int]:
        return frozenset({self.num_layers})

    def at_positions(self, chunk: LensChunk) -> dict[str, torch.Tensor]:
        """``[n]`` each: ``log10_tcb`` (float64), ``entropy``, ``logit_margin``, ``v_eff_ipr``, ``v_eff_exp``; with the
        ablation ``log10_cluster`` and ``log10_disperse`` (float64)."""
        readout = chunk.readout
        delta, baselines, moved = tcb_readout(
            chunk.final_hidden,
            readout.unembed,
            readout.bias,
            eps=self.eps,
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

    def reduce(self, values: Mapping[str, torch.Tensor], *, positions: int, tail: int) -> dict[str, Any]:
        """``tcb_log10_mean`` / ``tcb_log10_min``: mean / minimum of log10 δ_TCB over the positions; ``tcb_argmin``:
        the index (0-based, within the response) of the position with the smallest δ (``None`` without positions);
        ``entropy`` / ``logit_margin`` / ``v_eff_ipr`` / ``v_eff_exp``: means over the positions of the final
        distribution's entropy (nats), top-1 minus top-2 logit, 1/Σo² and exp(entropy); with the ablation
        ``tcb_cluster_log10_mean`` / ``tcb_disperse_log10_mean`` (means of log10 δ after each move) and
        ``tcb_ablation_ordered`` (the fraction of positions with δ_cluster > δ > δ_disperse), else ``None``."""
        log10_tcb = values["log10_tcb"]

        def mean(name: str) -> float:
            return float(values[name].double().mean()) if positions else math.nan

        ablation: dict[str, Any] = dict.fromkeys(("tcb_cluster_log10_mean", "tcb_disperse_log10_mean",
                                                  "tcb_ablation_ordered"))
        if self.scales:
            cluster, disperse = values["log10_cluster"], values["log10_disperse"]
            ordered = (cluster > log10_tcb) & (log10_tcb > disperse)
            ablation = {"tcb_cluster_log10_mean": mean("log10_cluster"),
                        "tcb_disperse_log10_mean": mean("log10_disperse"),
                        "tcb_ablation_ordered": float(ordered.double().mean()) if positions else math.nan}
        return {
            "tcb_log10_mean": mean("log10_tcb"),
            "tcb_log10_min": float(log10_tcb.min()) if positions else math.nan,
            "tcb_argmin": int(log10_tcb.argmin()) if positions else None,
            **{name: mean(name) for name in ("entropy", "logit_margin", "v_eff_ipr", "v_eff_exp")},
            **ablation,
        }
