"""Stability margins and support tokens (``probes=margin``): log|det(I − Σ_t A)| of the first attention layer at every
position the model saw (the math: :mod:`lm_eval_probes.probes.margin`).

Its values need the first softmax-attention layer over whole sequences: it asks for the wrappers' whole-forward
capture ``first_attention`` (:class:`~lm_eval_probes.api.FirstAttention`), which gives it each captured batch's queries,
keys and query-map Jacobian (:class:`~lm_eval_probes.capture.attention.AttentionBatch`, any family);
:func:`~lm_eval_probes.probes.margin.layer_margins` makes them margins, :meth:`MarginPositions.fields` a response's
record fields. :func:`margin_unavailable` says, from a model's config, why the margins cannot run on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
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


def margin_unavailable(config: Any) -> str | None:
    """Why ``probes=margin`` cannot run on a model of this (transformers) config, or ``None`` when the config does not
    tell (the load then finds the first layer that calls transformers' attention interface, or refuses in one line):
    no attention heads, or ``layer_types`` without any softmax-attention layer."""
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    model_type = getattr(text, "model_type", None)
    if not getattr(text, "num_attention_heads", None):
        return f"model_type {model_type!r} has no attention heads (no softmax attention)"
    layer_types = getattr(text, "layer_types", None)
    if layer_types and not any("attention" in str(kind) and "linear" not in str(kind) for kind in layer_types):
        return f"model_type {model_type!r} has no softmax-attention layer (layer_types {sorted(set(layer_types))})"
    return None


@dataclass(frozen=True)
class MarginSummary:
    """One sequence's margins reduced: mean and minimum over positions with a margin, and the support tokens
    (positions in the sequence the model saw, their token ids and margins, smallest margin first)."""

    mean: float
    minimum: float
    positions: tuple[int, ...]
    token_ids: tuple[int, ...]
    values: tuple[float, ...]

    @classmethod
    def of(cls, margins: Any, token_ids: Any, k: int) -> MarginSummary:
        """``[n]`` margins (``nan`` = none) and ``[n]`` ids of one sequence (nan mean and minimum when none)."""
        import torch

        from lm_eval_probes.probes.margin import support_tokens

        defined = margins[~torch.isnan(margins)]
        support = support_tokens(margins, k)
        return cls(
            mean=float(defined.mean()) if defined.numel() else math.nan,
            minimum=float(defined.min()) if defined.numel() else math.nan,
            positions=tuple(int(i) for i in support),
            token_ids=tuple(int(token_ids[i]) for i in support),
            values=tuple(float(margins[i]) for i in support),
        )

    def record_fields(self, decode: Callable[[int], str]) -> dict[str, Any]:
        """The record fields (:class:`MarginRecord`); support tokens decoded one by one with ``decode``."""
        return {"margin_mean": self.mean, "margin_min": self.minimum, "margin_support_positions": self.positions,
                "margin_support_tokens": tuple(decode(token) for token in self.token_ids),
                "margin_support_values": self.values}


class MarginPositions:
    """The margins' :class:`~lm_eval_probes.api.PositionProbe`: nothing at a response's positions; its record fields come
    from the wrappers' first-attention capture (:attr:`first_attention`)."""

    reads_lens = False
    position_axis = 0

    def __init__(self, options: MarginOptions, num_layers: int) -> None:
        self.options = options
        self.first_attention = FirstAttention(values=self.values, fields=self.fields, trace="margin")

    def values(self, batch: Any) -> Any:
        """``[B, T]`` float64 margins of a captured batch, on the CPU (:func:`~lm_eval_probes.probes.margin.layer_margins`;
        one head's query-map Jacobian at a time, one row at a time)."""
        from lm_eval_probes.probes.margin import layer_margins

        return layer_margins(batch.queries, batch.keys, batch.query_inputs, batch.query_jacobian, scale=batch.scale,
                             softcap=batch.softcap, window=batch.sliding_window, sinks=batch.sinks, valid=batch.valid,
                             heads=self.options.heads).cpu()

    def fields(self, margins: Any, token_ids: Any, decode: Callable[[int], str]) -> dict[str, Any]:
        """A response's record fields from the margins of the positions the model saw."""
        return MarginSummary.of(margins, token_ids, self.options.support).record_fields(decode)

    def layers(self) -> frozenset[int]:
        return frozenset()

    def at_positions(self, chunk: Any) -> dict[str, Any]:
        return {}

    def reduce(self, values: Mapping[str, Any], *, positions: int, generation: bool) -> dict[str, Any]:
        return {}


def margin_memory(options: MarginOptions, shapes: Shapes) -> float:
    """Float64 (8 bytes): the captured batch re-run through the first attention layer — its parameters (about
    4·d·H·p), its inputs and input projections (B·T·4d), each head's queries, keys and query inputs (3·B·H·T·p) — and
    one head's query-map Jacobian at a time (B·T·p²: heads that read their own p columns; families whose heads share
    all query inputs, full-width query norms, hold more) with one forward-mode product's queries (B·H·T·p); then one
    sequence of that head at a time: its attention weights (2·T²: logits, then their softmax), or
    :func:`~lm_eval_probes.probes.margin.head_margins` with the weights (T²), one block of flattened outer products
    (min(T, ⌊2²³/p²⌋)·p² values: at most 64 MiB) and a chunk's ``[64, p, p]`` products and their LU (2·64·p²)."""
    p, d, t, b, h = shapes.head_dim, shapes.width, shapes.tokens, shapes.batch, shapes.heads
    block = min(t, max(1, (1 << 23) // (p * p))) * p * p
    return 8 * (4 * d * h * p + b * t * (4 * d + 4 * h * p + p * p) + max(2 * t * t, t * t + block + 2 * 64 * p * p))


@dataclass(frozen=True)
class MarginRecord:
    """The stability margins of one response's sequence (:meth:`MarginSummary.record_fields`; ``None``: not
    computed)."""

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
            "per head of the first softmax-attention layer (its own query map's Jacobian in place of W_Q; mean over "
            "heads); per document the mean and the minimum; "
            "support tokens: the k smallest",
    reads="the first softmax-attention layer's queries, keys and query-map Jacobian at every position the model saw",
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
    applies=margin_unavailable,
    ranked="margin_mean",
    ranked_text="the document's mean margin",
    label="mean stability margin",
)
