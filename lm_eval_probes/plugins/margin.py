"""Stability margins and support tokens (``probes=margin``): log|det(I − Σ_t A)| of the first attention layer at every
position the model saw (the math: :mod:`lm_eval_probes.probes.margin`).

Its values need the first attention layer's inputs over whole sequences: the wrappers' whole-forward capture
``first_attention`` (:class:`~lm_eval_probes.capture.margins.FirstLayerMargins`, built from :class:`MarginOptions`)
hooks that layer in the same forwards and fills the record fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lm_eval_probes.api import (UNBOUNDED, FirstAttention, Probe, ProbeOptions, Row, Shapes, TraceField, as_choice,
                                option)

HEAD_REDUCTIONS: tuple[str, ...] = ("mean", "min")


@dataclass(frozen=True)
class MarginOptions(ProbeOptions):
    """The margins' options."""

    support: int = option(5, "k, the number of support tokens (smallest margins) kept per response (k >= 0)")
    heads: str = option("mean", "how the first layer's per-head margins combine per position: mean or min",
                        parse=as_choice(*HEAD_REDUCTIONS))

    def __post_init__(self) -> None:
        if self.support < 0:
            raise ValueError(f"probe_margin_support must be an integer k >= 0, got {self.support}")


class MarginPositions:
    """The margins' :class:`~lm_eval_probes.api.PositionProbe`: nothing at a response's positions; its record fields come
    from the wrappers' first-attention capture (:attr:`first_attention`)."""

    reads_lens = False
    position_axis = 0

    def __init__(self, options: MarginOptions, num_layers: int) -> None:
        self.first_attention = FirstAttention(heads=options.heads, support=options.support, prefix="margin")

    def layers(self) -> frozenset[int]:
        return frozenset()

    def at_positions(self, chunk: Any) -> dict[str, Any]:
        return {}

    def reduce(self, values: Mapping[str, Any], *, positions: int, generation: bool) -> dict[str, Any]:
        return {}


def margin_memory(options: MarginOptions, shapes: Shapes) -> float:
    """Float64 (8 bytes) of one sequence and one head at a time: the layer's inputs (T·d), that head's rows of W_Q
    and W_K (2·p·d), its inputs, queries, keys and rotations (6·T·p), then the larger of two phases — its attention
    weights (2·T²: logits, then their softmax), or :func:`~lm_eval_probes.probes.margin.head_margins` with the weights
    (T²), one block of flattened outer products (min(T, ⌊2²³/p²⌋)·p² values: at most 64 MiB) and a chunk's
    ``[64, p, p]`` products and their LU (2·64·p²) — the memory model measured at real widths in
    ``docs/performance.md``."""
    p, d, t = shapes.head_dim, shapes.width, shapes.tokens
    block = min(t, max(1, (1 << 23) // (p * p))) * p * p
    return 8 * (2 * p * d + t * d + 6 * t * p + max(2 * t * t, t * t + block + 2 * 64 * p * p))


@dataclass(frozen=True)
class MarginRecord:
    """The stability margins of one response's sequence (the wrappers' first-attention capture,
    :meth:`~lm_eval_probes.capture.margins.MarginSummary.record_fields`; ``None``: not computed)."""

    margin_mean: float | None = None
    margin_min: float | None = None
    margin_support_positions: tuple[int, ...] | None = None
    margin_support_tokens: tuple[str, ...] | None = None
    margin_support_values: tuple[float, ...] | None = None


PROBE = Probe(
    name="margin",
    summary="stability margins log|det(I − Σ_t A)| of the first attention layer and the support tokens",
    paper="Stability margins: \"Support Tokens, Stability Margins, and a New Foundation for Robust LLMs\" "
          "(arXiv 2602.22271)",
    formula="m_t = log|det(I − Σ_t A)|, A = W_Kᵀ W_Q / √p, Σ_t the attention-weighted covariance of the inputs, "
            "per head of the first attention layer (mean over heads); per document the mean and the minimum; "
            "support tokens: the k smallest",
    reads="the first attention layer's inputs at every position the model saw",
    record=MarginRecord,
    position_probe=MarginPositions,
    traces=(TraceField("margin", "margin_mean", over="sequence"), TraceField("margin", "margin_min", "min", over="sequence")),
    options=MarginOptions,
    memory=margin_memory,
    rows=(
        Row("margin", "float", "mean", True, "probe",
            "mean over documents of the mean stability margin log|det(I − Σ_t A)| of the first attention layer "
            "over the positions the model saw (probes=margin)", "margin_mean",
            bounds=UNBOUNDED),  # log|det|: −∞ at the degeneracy boundary det = 0, no ceiling
        Row("margin_min", "float", "mean", True, "probe",
            "mean over documents of the smallest margin (the first support token's)", "margin_min", bounds=UNBOUNDED),
        Row("margin_support", "support", "probe_support_mean", True, "probe",
            "probes=margin: mean over documents of the mean margin of the k support tokens; per document their "
            "positions, tokens and margins are in --log_samples", "margin_support", bounds=UNBOUNDED),
    ),
    ranked="margin_mean",
    ranked_text="the document's mean margin",
    label="mean stability margin",
)
