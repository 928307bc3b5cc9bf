"""Evaluation-time stability margins of a pretrained model's first attention layer (``probes=margin``).

The paper's margin (:mod:`lm_eval_probes.probes.margin`) belongs to an embedding-level attention prior.
A pretrained LLM has no such prior; its closest counterpart is the first attention layer, which reads the
(normalised) token embeddings. Per head h of that layer, with its own query/key projections, rotary
rotation and the key/value head it shares (grouped KV heads):

    α_ts = softmax_{s<t}(scale · q_t·k_s)       (the model's logits, renormalised over the strict prefix)
    m_t^h = log|det(I_p − scale · R_t Σ_s α_ts (u_s − ū_t)(k_s − k̄_t)ᵀ)|,   u_s = W_Q^h x_s

(:func:`~lm_eval_probes.probes.margin.head_margins`), x_s = the first attention layer's input (the output
of its input norm), and the position's margin is the mean over heads (or the minimum:
``probe_margin_heads``). Where the family normalises each head's queries and keys (Gemma-3's ``q_norm`` and
``k_norm``), the keys are the normalised ones and the query norm's Jacobian J_t joins R_t (``query_norm`` of
:func:`~lm_eval_probes.probes.margin.head_margins`). Every place where this departs from the paper's prior is listed in the README.

:class:`FirstLayerMargins` holds the layer's weights and a hook (:meth:`FirstLayerMargins.capture`) that
records, for every forward of the model inside the block, the layer's inputs, rotary tables, the token ids
and the attention mask: nothing is recomputed but two small projections, and during ``generate`` the
one-position calls are joined into the whole sequence (no extra forward).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lm_eval_probes.capture.readouts import UnsupportedModelError
from lm_eval_probes.plugins.margin import HEAD_REDUCTIONS as MARGIN_HEAD_REDUCTIONS
from lm_eval_probes.probes.margin import head_margins, prefix_attention_weights, rotate_half, support_tokens

MARGIN_FAMILIES: tuple[str, ...] = ("gemma", "gemma3_text", "llama", "mistral", "qwen2")
"""``model_type`` values whose first attention layer has separate ``q_proj``/``k_proj``, rotate-half rotary
embeddings, per-head query/key RMS norms or none, and no attention-logit soft-capping (what the margin's
formula assumes)."""

_QK_NORM_WEIGHT_OFFSET: dict[str, float] = {"gemma3_text": 1.0}
"""Families with per-head query/key RMS norms (``q_norm``/``k_norm``): the norm multiplies by offset + weight."""


@dataclass
class FirstLayerInputs:
    """What :meth:`FirstLayerMargins.capture` recorded: one segment per forward call of the model.

    Each segment: ``ids [B, t]`` token ids, ``hidden [B, t, d]`` the first attention layer's input,
    ``cos``/``sin`` ``[B or 1, t, p]`` its rotary tables, ``mask [B, T]`` the model's 2-D attention mask of
    that call (``None`` when not given: no padding before the call's last position).
    """

    segments: list[dict[str, Any]] = field(default_factory=list)

    def latest(self) -> dict[str, Any]:
        if not self.segments or "hidden" not in self.segments[-1]:
            raise RuntimeError("no first-layer inputs were captured: run the forward inside FirstLayerMargins.capture()")
        return self.segments[-1]

    def joined(self) -> dict[str, Any]:
        """The calls of one ``generate`` (prefill, then one position per step) as one sequence."""
        parts = [s for s in self.segments if "hidden" in s]
        if not parts:
            raise RuntimeError("no first-layer inputs were captured: run generate inside FirstLayerMargins.capture()")
        joined = {name: torch.cat([p[name] for p in parts], dim=1) for name in ("ids", "hidden", "cos", "sin")}
        joined["mask"] = parts[-1]["mask"]
        return joined


@dataclass(frozen=True)
class MarginSummary:
    """One sequence's margins reduced: mean and minimum over positions with a margin, and the support tokens
    (positions in the sequence the model saw, their token ids and margins, smallest margin first)."""

    mean: float
    minimum: float
    positions: tuple[int, ...]
    token_ids: tuple[int, ...]
    values: tuple[float, ...]
    sequence: tuple[tuple[int, ...], tuple[float, ...]] | None = None
    """``probe_traces=true``: every position's token id and margin (``nan``: none), for the trace."""

    def record_fields(self, decode: Callable[[int], str], prefix: str) -> dict[str, Any]:
        """The record fields of a first-attention request with field prefix ``prefix``: ``<prefix>_mean`` /
        ``<prefix>_min``, the mean / minimum stability margin of the first attention layer over the positions the model
        saw (context and response; the first position has none); ``<prefix>_support_positions`` /
        ``<prefix>_support_tokens`` / ``<prefix>_support_values``, the k support tokens (smallest margins, smallest
        first): positions in the sequence the model saw (0 = its first token), their tokens (each decoded alone by
        ``decode``) and margins."""
        return {
            f"{prefix}_mean": self.mean,
            f"{prefix}_min": self.minimum,
            f"{prefix}_support_positions": self.positions,
            f"{prefix}_support_tokens": tuple(decode(token) for token in self.token_ids),
            f"{prefix}_support_values": self.values,
        }


def summarize_margins(margins: torch.Tensor, token_ids: torch.Tensor, k: int, *, whole: bool = False) -> MarginSummary:
    """``[n]`` margins (``nan`` = none) and ``[n]`` ids of one sequence → a :class:`MarginSummary` (nan when none;
    ``whole``: with every position's, :attr:`MarginSummary.sequence`)."""
    defined = margins[~torch.isnan(margins)]
    support = support_tokens(margins, k)
    return MarginSummary(
        mean=float(defined.mean()) if defined.numel() else math.nan,
        minimum=float(defined.min()) if defined.numel() else math.nan,
        positions=tuple(int(i) for i in support),
        token_ids=tuple(int(token_ids[i]) for i in support),
        values=tuple(float(margins[i]) for i in support),
        sequence=(tuple(int(t) for t in token_ids.tolist()), tuple(float(m) for m in margins.tolist())) if whole else None,
    )


def _head_projection(x: torch.Tensor, proj: nn.Linear, head: int, width: int, *, bias: bool = True) -> torch.Tensor:
    """``[B, T, d]`` float64 inputs through rows ``[head·width, (head + 1)·width)`` of ``proj`` (its weight converted to
    float64 for those rows only; its bias added when ``bias``) → ``[B, 1, T, width]``."""
    rows = slice(head * width, (head + 1) * width)
    b = None if not bias or proj.bias is None else proj.bias.detach()[rows].double()
    return nn.functional.linear(x, proj.weight.detach()[rows].double(), b).unsqueeze(1)


def _rms_norm(v: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """g ⊙ v / (mean(v²) + eps)^½ over the last axis."""
    return gain * v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)


class FirstLayerMargins:
    """Per-position margins m_t of a model's first attention layer (see the module docstring).

    Args:
        model: a ``*ForCausalLM`` of a family in :data:`MARGIN_FAMILIES`.
        heads: how the per-head margins combine per position: ``mean`` (default) or ``min``.
        chunk: query positions per determinant batch (memory ≈ (T + chunk) · p² float64 per head; one batch row
            at a time in :meth:`of_segment`).
    """

    def __init__(self, model: nn.Module, *, heads: str = "mean", chunk: int = 64) -> None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if model_type not in MARGIN_FAMILIES:
            raise UnsupportedModelError(
                f"probes=margin needs a first attention layer with q_proj/k_proj, rotate-half rotary embeddings, "
                f"per-head query/key RMS norms or none, and no attention soft-capping; model_type {model_type!r} is "
                f"not one of {', '.join(MARGIN_FAMILIES)}"
            )
        if heads not in MARGIN_HEAD_REDUCTIONS:
            raise ValueError(f"heads must be one of {MARGIN_HEAD_REDUCTIONS}, got {heads!r}")
        self.model = model
        self.attention = model.model.layers[0].self_attn
        config = model.config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(self.attention, "head_dim", None) or config.hidden_size // self.num_heads
        self.scale = float(getattr(self.attention, "scaling", self.head_dim**-0.5))
        self.heads = heads
        self.chunk = chunk
        self.qk_norm_offset = _QK_NORM_WEIGHT_OFFSET.get(model_type)
        if self.qk_norm_offset is None and (hasattr(self.attention, "q_norm") or hasattr(self.attention, "k_norm")):
            raise UnsupportedModelError(f"probes=margin: model_type {model_type!r} has query/key norms of an unknown form")
        if getattr(self.attention, "attn_logit_softcapping", None):
            raise UnsupportedModelError("probes=margin: the first attention layer soft-caps its logits")

    @contextmanager
    def capture(self, *, join: bool = False) -> Iterator[FirstLayerInputs]:
        """Hooks on the model and its first attention layer, removed when the block ends. Without ``join`` only
        the latest forward's inputs are kept; with it every call's (one ``generate``: :meth:`FirstLayerInputs.joined`)."""
        inputs = FirstLayerInputs()

        def enter(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            mask = kwargs.get("attention_mask")
            if not join:
                inputs.segments.clear()
            inputs.segments.append({
                "ids_in": None if ids is None else ids.detach(),
                "mask": mask.detach() if isinstance(mask, torch.Tensor) and mask.ndim == 2 else None,
            })

        def attention_inputs(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not inputs.segments or "hidden" in inputs.segments[-1]:
                return  # a call outside the model's forward, or a second call within one
            segment = inputs.segments[-1]
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            rotary = kwargs.get("position_embeddings", args[1] if len(args) > 1 else None)
            if hidden is None or rotary is None:
                raise UnsupportedModelError("the first attention layer was called without hidden_states/position_embeddings")
            ids = segment.pop("ids_in")
            if ids is None or ids.shape != hidden.shape[:2]:
                raise UnsupportedModelError("probes=margin needs input_ids matching the first layer's positions")
            segment.update(ids=ids, hidden=hidden.detach(), cos=rotary[0].detach(), sin=rotary[1].detach())

        handles = []
        try:
            handles.append(self.model.register_forward_pre_hook(enter, with_kwargs=True))
            handles.append(self.attention.register_forward_pre_hook(attention_inputs, with_kwargs=True))
            yield inputs
        finally:
            for handle in handles:
                handle.remove()

    @torch.no_grad()
    def margins(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T]`` float64 margins (``nan``: no prefix, or ``valid`` False) from the first layer's inputs.

        Args:
            hidden: ``[B, T, d]`` the first attention layer's input; cos, sin: ``[B or 1, T, p]`` its rotary tables.
            valid: optional bool ``[B, T]`` (False = padding).
        """
        batch, length, _ = hidden.shape
        x = hidden.double()
        attn = self.attention
        p = self.head_dim
        cos, sin = cos.double().unsqueeze(1), sin.double().unsqueeze(1)  # [B or 1, 1, T, p]
        rotation = (cos.expand(batch, 1, length, -1), sin.expand(batch, 1, length, -1))
        norms = None
        if self.qk_norm_offset is not None:  # per-head RMS norms before the rotation (float64 here, not the module's float32)
            norms = (self._norm_parameters(attn.q_norm), self._norm_parameters(attn.k_norm))
        mask = None if valid is None else valid.bool().unsqueeze(1)  # [B, 1, T]
        groups = self.num_heads // self.num_kv_heads
        heads = []
        # one KV head's keys and one query head's inputs, queries and [B, 1, T, T] attention weights at a time (float64
        # [B, 1, T, p] each; W_Q and W_K converted a head's p rows at a time), not all heads' at once
        for kv_head in range(self.num_kv_heads):
            keys = _head_projection(x, attn.k_proj, kv_head, p)  # [B, 1, T, p]
            if norms is not None:
                keys = _rms_norm(keys, *norms[1])
            keys = keys * cos + rotate_half(keys) * sin
            for head in range(kv_head * groups, (kv_head + 1) * groups):  # head h reads KV head h // groups
                u = _head_projection(x, attn.q_proj, head, p, bias=False)  # the query bias cancels in u_s − ū_t
                q_bias = attn.q_proj.bias
                queries = u if q_bias is None else u + q_bias.detach()[head * p : (head + 1) * p].double()
                query_norm = None
                if norms is not None:
                    query_norm = (queries, *norms[0])
                    queries = _rms_norm(queries, *norms[0])
                queries = queries * cos + rotate_half(queries) * sin
                weights = prefix_attention_weights(queries, keys, scale=self.scale, valid=mask)
                heads.append(head_margins(u, keys, weights, scale=self.scale, rotation=rotation, valid=mask,
                                          chunk=self.chunk, query_norm=query_norm))
                del weights, queries, u
        per_head = torch.cat(heads, dim=1)
        if self.heads == "min":
            return per_head.min(dim=1).values  # nan propagates: a position without a margin has none in any head
        return per_head.mean(dim=1)

    def _norm_parameters(self, norm: nn.Module) -> tuple[torch.Tensor, float]:
        """A query/key RMS norm's effective weight (offset + weight, float64) and epsilon."""
        eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
        if eps is None:
            raise UnsupportedModelError(f"probes=margin: {type(norm).__name__} has no eps / variance_epsilon")
        return self.qk_norm_offset + norm.weight.detach().double(), float(eps)

    def of_segment(self, segment: dict[str, Any], rows: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Margins ``[b, T]`` and ids ``[b, T]`` of a captured segment (optionally only some batch rows)."""
        hidden, cos, sin, ids = segment["hidden"], segment["cos"], segment["sin"], segment["ids"]
        mask = segment.get("mask")
        length = hidden.shape[1]
        valid = None if mask is None else mask[:, -length:].bool() if mask.shape[1] >= length else None
        if rows is not None:
            index = torch.tensor(list(rows), device=hidden.device)
            hidden, ids = hidden.index_select(0, index), ids.index_select(0, index)
            if cos.shape[0] > 1:
                cos, sin = cos.index_select(0, index), sin.index_select(0, index)
            if valid is not None:
                valid = valid.index_select(0, index.to(valid.device))
        rows_out = []
        for row in range(hidden.shape[0]):  # one row at a time: the float64 [H, T, p²] products dominate memory
            pick = slice(row, row + 1)
            rows_out.append(self.margins(hidden[pick], cos[pick] if cos.shape[0] > 1 else cos,
                                         sin[pick] if sin.shape[0] > 1 else sin,
                                         None if valid is None else valid[pick]).cpu())
        margins = torch.cat(rows_out) if rows_out else torch.empty(0, hidden.shape[1], dtype=torch.float64)
        return margins, ids.cpu()


class MarginRows:
    """Bookkeeping of one ``loglikelihood`` call for ``probes=margin``, beside HFLM's own batching.

    HFLM answers each row's requests (:meth:`on_answer`, from ``cache_hook.add_partial``) after the row's forward;
    ``locate`` (:meth:`~lm_eval_probes.capture.loglikelihood.LoglikelihoodRows.locate`) names the request's row in
    that batch and its input length. The margins of the batch are computed once, at its first answer. A request's
    margins are those of the row's input positions ``[0, input length)``: its context and all but its last
    continuation token (what the model saw). Only the current batch's ``[B, T]`` margins are held.
    """

    def __init__(self, reader: FirstLayerMargins, inputs: FirstLayerInputs, *, support: int,
                 locate: Callable[[Any], tuple[int, int, int] | None], whole: bool = False) -> None:
        self.reader, self.inputs, self.support, self.locate, self.whole = reader, inputs, support, locate, whole
        self.summaries: dict[Any, MarginSummary] = {}
        self._segment: dict[str, Any] | None = None
        self._batch: tuple[torch.Tensor, torch.Tensor] | None = None

    def on_answer(self, attr: str, request_key: Any, _answer: Any) -> None:
        located = self.locate(request_key) if attr == "loglikelihood" else None
        if located is None:
            return
        segment = self.inputs.latest()
        if segment is not self._segment:  # the first answer of a new batch
            self._segment, self._batch = segment, self.reader.of_segment(segment)
        margins, ids = self._batch
        row, input_length, _ = located
        self.summaries[request_key] = summarize_margins(margins[row, :input_length], ids[row, :input_length], self.support,
                                                        whole=self.whole)


@dataclass(frozen=True)
class GenerationMargins:
    """One generation's margins over the positions the model saw: its (unpadded) prompt, then the generated
    tokens fed back (all but the last); :meth:`summary` cuts them to the kept tokens."""

    margins: torch.Tensor
    token_ids: torch.Tensor
    prompt_tokens: int

    def summary(self, kept: int, support: int, *, whole: bool = False) -> MarginSummary:
        """Margins of the prompt and the first ``kept − 1`` kept tokens (the inputs of the kept span)."""
        stop = self.prompt_tokens + max(kept, 1) - 1
        return summarize_margins(self.margins[:stop], self.token_ids[:stop], support, whole=whole)


def generation_margins(
    reader: FirstLayerMargins, inputs: FirstLayerInputs, prompt_len: int, bounds: Sequence[int]
) -> list[GenerationMargins]:
    """Per row of one (left-padded) ``generate`` batch, the margins of its real positions up to its bound."""
    joined = inputs.joined()
    margins, ids = reader.of_segment(joined)
    mask = joined["mask"]
    first = [0] * margins.shape[0] if mask is None else (mask[:, :prompt_len] == 0).sum(-1).tolist()
    return [
        GenerationMargins(margins[row, pad : prompt_len + bound - 1], ids[row, pad : prompt_len + bound - 1], prompt_len - pad)
        for row, (pad, bound) in enumerate(zip(first, bounds, strict=True))
    ]
