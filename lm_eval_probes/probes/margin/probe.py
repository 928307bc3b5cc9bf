"""Stability margins and support tokens (``probes=margin``): log|det(I − Σ_t A)| of the first attention layer at every
position the model saw (the math: :mod:`lm_eval_probes.probes.margin.math`).

Its values need the first softmax-attention layer over whole sequences: it asks for the wrappers' whole-forward
capture ``first_attention`` (:class:`~lm_eval_probes.api.FirstAttention`), which gives it each captured row's queries,
keys and query-map Jacobians (:class:`~lm_eval_probes.capture.attention.AttentionRow`, any family);
:func:`~lm_eval_probes.probes.margin.math.layer_margins` makes them margins, :meth:`MarginPositions.fields` a response's
record fields. :func:`margin_unavailable` says, from a model's config, why the margins cannot run on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lm_eval_probes.api import (UNBOUNDED, FirstAttention, Probe, ProbeOptions, Row, Shapes, TraceField, as_choice,
                                jacobian_chunks, option)

HEAD_REDUCTIONS: tuple[str, ...] = ("mean", "min")

PRECISIONS: tuple[str, ...] = ("auto", "float32", "float64")
"""The margins' arithmetic (``probe_margin_precision``, ``docs/precision.md``): ``float64`` (every product in
float64: exact to the float64 references), ``float32`` (float32 products, on tensor cores where the device has them:
bfloat16 terms with float32 accumulation, :func:`~lm_eval_probes.stack_api.matmul_float32`), ``auto`` (float32 where
the device has those products, a CUDA GPU; float64 elsewhere): :func:`~lm_eval_probes.probes.margin.math.margin_dtype`."""


@dataclass(frozen=True)
class MarginOptions(ProbeOptions):
    """The margins' options."""

    support: int = option(5, "k, the number of support tokens (smallest margins) kept per response (k >= 0)")
    heads: str = option("mean", "how the first layer's per-head margins combine per position: mean or min",
                        parse=as_choice(*HEAD_REDUCTIONS))
    precision: str = option("auto", "the margins' arithmetic: float64 (exact to the float64 references), float32 "
                            "(float32 products, on tensor cores where the device has them), or auto (float32 on such a "
                            "device, a CUDA GPU; float64 elsewhere)", parse=as_choice(*PRECISIONS))

    def __post_init__(self) -> None:
        if self.support < 0:
            raise ValueError(f"probe_margin_support must be an integer k >= 0, got {self.support}")


def margin_unavailable(config: Any) -> str | None:
    """Why ``probes=margin`` cannot run on a model of this (transformers) config, or ``None`` when the config does not
    tell (the load then finds the first layer that calls transformers' attention interface, or refuses in one line):
    no attention heads, or ``layer_types`` whose every kind is neither an attention other than linear attention nor a
    hybrid (attention beside an SSM)."""
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    model_type = getattr(text, "model_type", None)
    if "num_attention_heads" in (getattr(text, "per_layer_attributes", None) or ()):  # set per layer (dots3)
        heads = max((getattr(layer, "num_attention_heads", None) or 0 for layer in text.per_layer_config), default=0)
    else:
        heads = getattr(text, "num_attention_heads", None)
    if not heads:
        return f"model_type {model_type!r} has no attention heads (no softmax attention)"
    layer_types = getattr(text, "layer_types", None)
    softmax = ("attention" in str(kind) and "linear" not in str(kind) or "hybrid" in str(kind) for kind in layer_types or ())
    if layer_types and not any(softmax):  # a hybrid layer (Falcon-H1) runs attention beside its SSM
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
        """``[n]`` margins (``nan`` = none) and ``[n]`` ids of one sequence (nan mean and minimum when none).

        Read as lists (one transfer each, no read of a single value: a sync on a device); the support tokens
        (:func:`~lm_eval_probes.probes.margin.math.support_tokens`: the k smallest, ties by position) and the minimum
        are taken from them on the host, the mean by torch from the defined values in order."""
        import torch

        values = margins.tolist()
        defined = [(value, position) for position, value in enumerate(values) if not math.isnan(value)]
        support = [position for _, position in sorted(defined)[:k]]
        ids = torch.as_tensor(token_ids).tolist()
        return cls(
            mean=torch.tensor([value for value, _ in defined], dtype=margins.dtype).mean().tolist() if defined
            else math.nan,
            minimum=min(defined)[0] if defined else math.nan,
            positions=tuple(support),
            token_ids=tuple(ids[position] for position in support),
            values=tuple(values[position] for position in support),
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
    RECENT = 16
    """The latest rows whose margins are kept for the rows after them (:meth:`values`)."""

    def __init__(self, options: MarginOptions, num_layers: int) -> None:
        self.options = options
        self.first_attention = FirstAttention(values=self.values, fields=self.fields, trace="margin")
        self._recent: list[tuple[tuple[int, ...], Any, int, int]] = []  # (ids, margins, chunk, length) of the latest rows

    def values(self, batch: Any) -> Any:
        """``[B, T]`` float64 margins of a captured batch, on the CPU (:func:`~lm_eval_probes.probes.margin.math.layer_margins`
        of each row; one row's re-run and one chunk of positions' query-map Jacobians held at a time; the batch's
        values leave the device once).

        The margin at position t reads the layer's inputs at positions ≤ t only, which a causal model computes from the
        first t + 1 tokens alone: a row that begins with the same tokens as one of the :data:`RECENT` rows before it
        (the options of a multiple-choice document share its context) takes that row's margins of those positions and
        computes the rest (:func:`~lm_eval_probes.probes.margin.math.layer_margins` from ``start``): from the first
        chunk of positions that holds a token it does not share (none: a row of the same tokens and length), so that
        every chunk is the one a row computed alone would compute (the values do not depend on which rows came
        before)."""
        import torch

        from lm_eval_probes.probes.margin.math import layer_margins, margin_dtype

        work = margin_dtype(self.options.precision, batch.ids.device)
        if batch.undefined:
            return _undefined(batch.undefined, batch.ids.shape)
        ids = batch.ids.cpu()  # the row's tokens, to find a row that began with the same ones
        valid = None if batch.valid is None else batch.valid.cpu()
        rows = []
        for index, row in enumerate(batch.rows(work)):
            if row.undefined:
                rows.append(_undefined(row.undefined, batch.ids.shape[1:]).to(row.queries.device))
                continue
            # the margin at t reads positions <= t only, of the input's alone: then a row can share an earlier one's
            tokens = _leading_tokens(ids[index], None if valid is None else valid[index]) \
                if row.causal and not row.prepended else ()
            length = row.queries.shape[-2]
            start, earlier = self._shared(tokens, row.chunk, length)
            margins = layer_margins(row.queries, row.keys, row.all_query_inputs(), row.query_jacobian, scale=row.scale,
                                    softcap=row.softcap, window=row.sliding_window, sinks=row.sinks, valid=row.valid,
                                    heads=self.options.heads, chunk=row.chunk, mask=row.mask, work=work, start=start,
                                    causal=row.causal, bias_term=row.bias_term)[row.prepended:]  # the input's positions
            if start:
                margins = torch.cat([earlier[:start].to(margins.device, margins.dtype), margins])
            if tokens:
                self._recent = [*self._recent[1 - self.RECENT:], (tokens, margins[:len(tokens)], row.chunk, length)]
            rows.append(margins)
        batch.verify()
        return torch.stack(rows).cpu() if rows else torch.empty(0, batch.ids.shape[1], dtype=torch.float64)

    def _shared(self, tokens: tuple[int, ...], chunk: int, length: int) -> tuple[int, Any]:
        """Where a row of ``tokens`` (``length`` positions, padding included, in chunks of ``chunk``) starts to differ
        from a recent row of the same chunks, a chunk's first position (the row's length where one of the same tokens
        and length was seen), and that row's margins (``(0, None)``: none)."""
        best, margins = 0, None
        for seen, kept, its_chunk, its_length in self._recent:
            if its_chunk != chunk or not tokens:
                continue
            same = next((i for i, (a, b) in enumerate(zip(tokens, seen)) if a != b), min(len(tokens), len(seen)))
            if not (same == len(tokens) == len(seen) and its_length == length):
                same -= same % chunk  # the chunk of its first other token is computed again, whole
            if same > best:
                best, margins = same, kept
        return best, margins

    def fields(self, margins: Any, token_ids: Any, decode: Callable[[int], str]) -> dict[str, Any]:
        """A response's record fields from the margins of the positions the model saw."""
        return MarginSummary.of(margins, token_ids, self.options.support).record_fields(decode)


def _leading_tokens(ids: Any, valid: Any) -> tuple[int, ...]:
    """A row's tokens when its real positions lead it (no padding, or padding only after them: the inputs of a
    ``loglikelihood`` batch); ``()`` otherwise (a left-padded ``generate`` row: its positions are not those of another
    row with the same tokens)."""
    if valid is None:
        return tuple(ids.tolist())
    real = int(valid.sum())
    return tuple(ids[:real].tolist()) if bool(valid[:real].all()) else ()


def _undefined(why: str, shape: Any) -> Any:
    """``nan`` margins of ``shape`` (a row's ``[T]`` or a batch's ``[B, T]``) where the capture cannot give them
    (``why``: keys beyond its positions that it cannot place,
    :meth:`~lm_eval_probes.capture.attention.FirstAttentionCapture._extra_keys_mask`; a ``generate`` of a layer with
    positions of its own before the input's)."""
    import torch

    global _WARNED
    if not _WARNED:
        _WARNED = True
        import logging

        logging.getLogger(__name__).warning("margins: the first attention layer: %s: its margins are nan", why)
    return torch.full(tuple(shape), math.nan, dtype=torch.float64)


_WARNED = False


def margin_memory(options: MarginOptions, shapes: Shapes) -> float:
    """One sequence at a time. The capture's float64 re-run of one row (8 bytes) holds throughout its input
    projections' outputs u (T·m, m = (H + 2·KV)·p), queries (T·H·p) and keys (T·KV·p); beside them the larger of two
    phases — the re-run (the row's inputs T·d, a block of a projection's float64 weight and its output, and the
    layer's own query code a block of positions at a time: about 2²³ values each) or the margins: each head's inputs
    and keys (2·T·H·p) and one chunk of c positions (:func:`~lm_eval_probes.api.jacobian_chunks`) — its query-map
    Jacobians (H·c·p·n, n = p columns per head) and either one forward-mode product (float64, g·c·(2m + 8·H·p)
    values; fewer where the query map's columns share products, :class:`~lm_eval_probes.capture.attention._Coloring`:
    then this bounds it from above) or one group of h heads' margins (h·c·n·p at most 2²³, 2²⁵ in float32:
    :func:`~lm_eval_probes.probes.margin.math.layer_margins`): their weights over the prefix (3·h·c·T: logits, softmax, the soft cap's), C_t (h·c·n·p; a block of weighted
    inputs is freed before it peaks) and D_t C_t (h·c·p², taken to float64 for the log-determinants). The margins'
    values are 8 bytes each in float64 and 4 in float32 (``precision`` float32, or ``auto`` on a device with tensor
    cores: :attr:`~lm_eval_probes.api.Shapes.tensor_cores`), where D_t C_t is also held in float32 before its float64
    copy and a product covers :data:`~lm_eval_probes.api.PRODUCT_ELEMENTS_TENSOR_CORES`."""
    from lm_eval_probes.probes.margin.math import WORK_ELEMENTS, WORK_ELEMENTS_FLOAT32

    wide = options.precision == "float32" or (options.precision == "auto" and shapes.tensor_cores)
    size = 4 if wide else 8
    p, d, t, h = shapes.head_dim, shapes.width, shapes.tokens, shapes.heads
    kv = shapes.kv_heads or h
    m = (h + 2 * kv) * p
    chunk, group = jacobian_chunks(t, h, p, p, m, tensor_cores=wide)
    held = 8 * t * (m + h * p + kv * p)
    rerun = 8 * (t * d + 3 * (1 << 23))
    product = 8 * group * chunk * (2 * m + 8 * h * p)
    heads = min(h, max(1, (WORK_ELEMENTS_FLOAT32 if wide else WORK_ELEMENTS) // (chunk * max(p * p, 3 * t))))
    margins = size * heads * (3 * chunk * t + chunk * p * p) + (size if size == 4 else 0) * heads * chunk * p * p \
        + 8 * heads * chunk * p * p
    jacobians = size * (h * chunk * p * p + 2 * t * h * p)
    return held + max(rerun, jacobians + max(product, margins))


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
