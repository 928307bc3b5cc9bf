"""The first softmax-attention layer of any decoder-only model: its queries, keys and logit settings as the attention
uses them, and the Jacobian of its query map, over every position the model saw (a whole-forward capture any probe
can ask for: :class:`~lm_eval_probes.api.FirstAttention`).

Found and recorded through transformers' attention interface (:mod:`~lm_eval_probes.capture.attention_calls`: the
first module that calls it is the first softmax-attention layer); the harness's own forwards run untouched: a
pre-hook on the layer (:meth:`FirstAttentionCapture.capture`) only keeps its arguments. What a probe's per-position
values become in each response's record: :mod:`~lm_eval_probes.capture.attention_fields`.

Each captured batch is then re-run through that layer, one row at a time, in float64 and stopped at the attention
call (:func:`torch.func.functional_call`), so that the queries and keys are those of its own code — fused qkv,
per-head or full-width query/key norms, full, partial or interleaved rotary, query scalars — whatever the family. The
query map q_t = ψ_t(u_t) is split at its input projections u_t (the submodules that read the layer's input x_t:
``q_proj``, ``qkv_proj``, ``c_attn``, ``query_key_value``, …; u_t = W x_t + b, computed in float64 a block of the
weight at a time), and ψ's Jacobian D_t = ∂q_t/∂u_t is computed by forward-mode autograd (:func:`torch.func.jvp`)
over the layer's own code, a chunk of positions at a time: the chunk's arguments are repeated once per column of u a
head reads (along their position axes, found at load by comparing the layer's arguments in forwards of two lengths
and two batch sizes), each copy with a tangent on one column of every head, so one product gives every head's D on
those columns. Columns that move disjoint entries of the queries share a copy (:class:`_Coloring`, found at load: a
rotary-only query map needs two copies per position where every column alone took ``n``). Which columns of u each query head reads is found at load by reverse mode (one vector-Jacobian
product per head); where the heads read disjoint blocks of equal width n (every family but full-width query norms),
D is ``[p, n]`` per head and position; otherwise ``[p, m]`` over all m columns any head reads. Where no submodule maps
the layer's input alone to its queries, or the re-run so split does not reproduce them (JetMoE: a mixture of attention
experts whose query projections a router picks per token, called through a method of the experts' module on the rows
it gathers), u is the layer's input itself (u_t = x_t, m = d) and D_t = ∂q_t/∂x_t through all its query code. A
layer whose code before the attention call reads the attention mask (``reads_mask``: an indexer that folds the keys it
selects into the mask it hands its attention, DeepSeek-V3.2, Qwen4-exp) is re-run a whole row at a time: a block of
positions alone would select among its own keys. A query map that reads the K positions before its own too (Zaya's
causal convolution over its queries' and keys' inputs; K found at load from one forward-mode product per position,
refused where a query reads its whole row) is re-run a whole row at a time and differentiated at each query's own
position, the others fixed: per product the prefix up to the chunk's end, with a tangent on one column of every head at
the chunk's positions K + 1 apart.

A model none of whose modules calls the interface (BLOOM, XGLM, GPT-NeoX-Japanese, GPT-Neo, TrOCR, GPT-1: layers that
compute their attention themselves) is read the same way, with the layer's softmax in place of the attention call and
its query-key product giving the queries and keys (:mod:`~lm_eval_probes.capture.own_attention`, :meth:`_recorded`):
its logits' scale and bias (ALiBi, masks) are read from its own code, each row re-run whole (the bias is a ``[H, T, T]``
float mask).

The inputs the margins read are u less its value at a zero input (W x_t: an attention sink has no input, x = 0, so
beside one a projection's bias does not cancel from the prior). A logit bias or per-query sink logit that the layer
computes from each query's own input and hands its attention (Inkling's ``position_bias``, Inkling-2's ``sinks``;
:meth:`FirstAttentionCapture._moves`, found at load) is differentiated with the queries: such a row re-runs whole,
one product per column of u over the prefix up to the chunk's end, and the products give E_ts = ∂b_ts/∂u_t beside
D_t, contracted at once with the chunk's attention weights into F_t (:attr:`AttentionRow.bias_term`).
The first T keys the attention reads are the T positions' (checked at load: :meth:`FirstAttentionCapture._check_key_positions`);
any after them are keys without a position of their own (DeepSeek-V4's compressed keys: a row with them is re-run
whole, and each is left out at the positions whose input it reads, :meth:`FirstAttentionCapture._extra_keys_mask`). A
layer may run over positions of its own before the input's (CPM-Ant's prompt: its input holds more positions than the
ids, :attr:`AttentionRow.prepended`) and attend both ways (its mask at load: :attr:`AttentionRow.causal`).

Self-checked at load on a six-token forward: the float64 re-run reproduces the layer's own queries (within the
model's precision) and every chunk's repeated re-run reproduces the whole row's (to float64 rounding); otherwise the
capture refuses in one line (:class:`~lm_eval_probes.capture.readouts.UnsupportedModelError`).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lm_eval_probes.api import PRODUCT_ELEMENTS, PRODUCT_ELEMENTS_TENSOR_CORES, PRODUCT_POSITIONS, jacobian_chunks
from lm_eval_probes.capture.attention_calls import (AttentionCall, attention_calls_recorded, first_softmax_attention,
                                                    stopped, token_ids)
from lm_eval_probes.capture.own_attention import OwnAttention, first_own_attention
from lm_eval_probes.capture.readouts import UnsupportedModelError

logger = logging.getLogger(__name__)

__all__ = ["AttentionBatch", "AttentionRow", "CapturedInputs", "FirstAttentionCapture"]

# The layer's arguments, ``(args, kwargs)``, as a tree of tuples, lists and dicts; a leaf's path is its keys from the
# root.
Path = tuple[Any, ...]


def _is_cache(value: Any) -> bool:
    return any(cls.__name__.endswith("Cache") for cls in type(value).__mro__)


def _leaves(value: Any, path: Path = ()) -> Iterator[tuple[Path, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))


def _mapped(value: Any, leaf: Callable[[Path, torch.Tensor], Any], path: Path = ()) -> Any:
    """The tree with each tensor replaced by ``leaf(path, tensor)``; caches dropped (a re-run must not extend them)."""
    if isinstance(value, torch.Tensor):
        return leaf(path, value)
    if isinstance(value, (tuple, list)):
        items = [_mapped(item, leaf, (*path, index)) for index, item in enumerate(value)]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return {key: _mapped(item, leaf, (*path, key)) for key, item in value.items()}
    return None if _is_cache(value) else value


@dataclass(frozen=True)
class _ArgumentAxes:
    """Which axes of one argument follow the positions and which the batch rows."""

    positions: tuple[int, ...]
    rows: tuple[int, ...]


def _changed(one: dict[Path, torch.Tensor], other: dict[Path, torch.Tensor], path: Path) -> tuple[int, ...]:
    a, b = one.get(path), other.get(path)
    if a is None or b is None or a.ndim != b.ndim:
        return ()
    return tuple(axis for axis in range(a.ndim) if a.shape[axis] != b.shape[axis])


@dataclass
class _LayerCall:
    """One captured call of the layer: the model's token ids ``[B, T]`` and attention mask of that forward, and the
    layer's own arguments; ``positions``: the layer's positions, T plus any of its own before the input's (CPM-Ant's
    prompt; ``None``: T)."""

    ids: torch.Tensor | None
    mask: torch.Tensor | None
    args: tuple[Any, ...] | None = None
    kwargs: dict[str, Any] | None = None
    positions: int | None = None

    @property
    def length(self) -> int:
        """The layer's positions."""
        return self.ids.shape[1] if self.positions is None else self.positions


@dataclass
class CapturedInputs:
    """The layer's arguments of each forward of the model inside :meth:`FirstAttentionCapture.capture`: one layer_call per
    forward (without ``join``: only the latest)."""

    layer_calls: list[_LayerCall] = field(default_factory=list)

    def latest(self) -> _LayerCall:
        if not self.layer_calls or self.layer_calls[-1].args is None:
            raise RuntimeError("no first-attention inputs were captured: run the forward inside capture()")
        return self.layer_calls[-1]


def _joined(values: list[Any], lengths: list[int]) -> tuple[bool, Any]:
    """One argument of several calls joined along its positions: tensors along the one axis whose size is each call's
    length (the same tensor in every call: kept), tuples, lists and dicts item by item; other values must be equal.
    ``(False, None)`` when they cannot be joined (then each call is re-run alone)."""
    first = values[0]
    if all(value is first for value in values) or first is None and all(value is None for value in values):
        return True, first
    if isinstance(first, torch.Tensor) and all(isinstance(v, torch.Tensor) and v.ndim == first.ndim for v in values):
        axes = [axis for axis in range(first.ndim) if all(v.shape[axis] == n for v, n in zip(values, lengths))
                and all(v.shape[:axis] + v.shape[axis + 1:] == first.shape[:axis] + first.shape[axis + 1:] for v in values)]
        if len(axes) == 1:
            return True, torch.cat(values, axes[0])
        return _over_all_keys(values, lengths)
    if isinstance(first, (tuple, list)) and all(type(v) is type(first) and len(v) == len(first) for v in values):
        joined = [_joined(list(items), lengths) for items in zip(*values)]
        return (all(ok for ok, _ in joined), type(first)(value for _, value in joined))
    if isinstance(first, dict) and all(isinstance(v, dict) and v.keys() == first.keys() for v in values):
        joined = {key: _joined([v[key] for v in values], lengths) for key in first}
        return (all(ok for ok, _ in joined.values()), {key: value for key, (_, value) in joined.items()})
    if _is_cache(first) or any(isinstance(v, torch.Tensor) for v in values):
        return _is_cache(first), first if _is_cache(first) else None
    try:
        return (True, first) if all(type(v) is type(first) and v == first for v in values) else (False, None)
    except (RuntimeError, ValueError, TypeError):  # values that hold tensors of other lengths
        return False, None


def _over_all_keys(values: list[torch.Tensor], lengths: list[int]) -> tuple[bool, Any]:
    """Tensors with one axis over every key so far (BLOOM's ALiBi bias in ``generate``: the positions of all calls up
    to each): the last, when it extends the first (``(False, None)`` otherwise)."""
    first, totals = values[0], list(itertools.accumulate(lengths))
    spans = [axis for axis in range(first.ndim) if all(v.shape[axis] == n for v, n in zip(values, totals))
             and all(v.shape[:axis] + v.shape[axis + 1:] == first.shape[:axis] + first.shape[axis + 1:] for v in values)]
    if len(spans) == 1 and totals[0] != totals[-1] and \
            torch.equal(values[-1].narrow(spans[0], 0, totals[0]).to(first.device), first):
        return True, values[-1]
    return False, None


def _joined_call(layer_calls: list[_LayerCall]) -> _LayerCall | None:
    """The layer's arguments of several calls (one ``generate``) as those of one call over all their positions, or
    ``None`` when an argument cannot be joined (:func:`_joined`)."""
    lengths = [layer_call.ids.shape[1] for layer_call in layer_calls]
    if len(layer_calls) == 1:
        return layer_calls[0]
    if any(len(layer_call.args) != len(layer_calls[0].args) or layer_call.kwargs.keys() != layer_calls[0].kwargs.keys()
           for layer_call in layer_calls):
        return None
    args = []
    for values in zip(*(layer_call.args for layer_call in layer_calls)):
        ok, value = _joined(list(values), lengths)
        if not ok:
            return None
        args.append(value)
    kwargs = {}
    for name in layer_calls[0].kwargs:
        if name == "attention_mask":
            kwargs[name] = None
            continue
        ok, value = _joined([layer_call.kwargs[name] for layer_call in layer_calls], lengths)
        if not ok:
            return None
        kwargs[name] = value
    return _LayerCall(torch.cat([layer_call.ids for layer_call in layer_calls], 1), layer_calls[-1].mask, tuple(args), kwargs)


@dataclass
class AttentionRow:
    """The first softmax-attention layer over one row of a captured batch (float64; see the module docstring).

    Attributes:
        queries: ``[H, T, p]`` as the attention uses them; keys: ``[KV, T + E, p]`` (query head h reads key
            head h // (H / KV)): the positions' keys, then E ≥ 0 entries without a position of their own (DeepSeek-V4's
            compressed keys: the whole row's re-run gives them).
        inputs: ``[T, m]`` the input projections' outputs u less their value at a zero input (W x_t: an attention sink
            has no input, x = 0, so a projection's bias does not cancel from the prior beside one); columns: ``[H or 1, n]`` the columns of u each head's
            queries read (one set shared by every head: ``1``).
        query_jacobian: ``(lo, hi) -> [H, hi − lo, p, n]`` D_t = ∂q_t/∂u_t of every head at positions [lo, hi) on its
            columns, computed when asked.
        chunk: the positions per ``query_jacobian`` call (:func:`~lm_eval_probes.api.jacobian_chunks`).
        scale: the logit scale; softcap: ``None`` or c (logits c·tanh(scale·q·k / c)); sliding_window: ``None`` or W;
            sinks: ``None``, ``[H]`` the heads' attention-sink logits or ``[H, T]`` one per query; valid: ``[T]`` bool, False at padding
            (``None``: no padding); mask: ``None`` or ``[H or 1, T, T + E]`` the mask the layer handed its
            attention (windows, chunks, biases: bool attended, float added to the logits; an extra key left out at the
            positions whose own input it reads).
        checks: per chunk of ``query_jacobian`` computed so far, a bool tensor (its re-run's queries differ from the
            whole row's): read by :meth:`AttentionBatch.verify`, once per batch.
        bias_term: ``None``, or for a layer whose logits' bias and sinks move with each query's input (Inkling's
            ``position_bias``, Inkling-2's per-query sinks) ``(lo, hi, α [H, hi − lo, hi]) -> [H, hi − lo, n, n]``
            F_t = Σ_s α_ts u_s E_tsᵀ − ū_t Ē_tᵀ, Ē_t = Σ_s α_ts E_ts + (1 − Σ_s α_ts) ∂σ_t/∂u_t with
            E_ts = ∂b_ts/∂u_t (:func:`~lm_eval_probes.probes.margin.math.layer_margins`), each product's E contracted
            as it is made; the same products give the chunk's D_t, which ``query_jacobian(lo, hi)`` then returns.
        undefined: ``None``, or why this row has no margins (keys beyond its positions that it cannot place:
            :meth:`FirstAttentionCapture._extra_keys_mask`).
        prepended: the layer's positions of its own before the input's (CPM-Ant's prompt: T counts them; the input's
            are the last T − prepended). causal: False where the layer's mask lets a position attend later ones (found
            at load; CPM-Ant attends both ways).
    """

    queries: torch.Tensor
    keys: torch.Tensor
    inputs: torch.Tensor
    columns: torch.Tensor
    query_jacobian: Callable[[int, int], torch.Tensor]
    chunk: int
    scale: float
    softcap: float | None
    sliding_window: int | None
    sinks: torch.Tensor | None
    valid: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    checks: list[torch.Tensor] = field(default_factory=list)
    bias_term: Callable[[int, int, torch.Tensor], torch.Tensor] | None = None
    undefined: str | None = None
    prepended: int = 0
    causal: bool = True

    def query_inputs(self, head: int) -> torch.Tensor:
        """``[T, n]`` the columns of u head ``head``'s queries read."""
        return self.inputs[:, self.columns[head if self.columns.shape[0] > 1 else 0]]

    def all_query_inputs(self) -> torch.Tensor:
        """``[H or 1, T, n]`` :meth:`query_inputs` of every head at once (``1``: one set shared by every head)."""
        return self.inputs[:, self.columns].transpose(0, 1)


def _joined_rows(parts: list[AttentionRow]) -> AttentionRow:
    """Rows of consecutive spans of one sequence (re-run alone: calls whose arguments could not be joined) as one (the
    parts share their ``checks``: :meth:`FirstAttentionCapture.joined`)."""
    if len(parts) == 1:
        return parts[0]
    if parts[0].bias_term is not None:  # its bias reads the distance between positions that the parts do not share
        raise RuntimeError("the first attention layer's logit bias moves with its queries' inputs: the calls of one "
                           "generate must re-run as one sequence, and these could not be joined")
    starts = [0]
    for part in parts:
        starts.append(starts[-1] + part.queries.shape[1])

    def query_jacobian(lo: int, hi: int) -> torch.Tensor:
        pieces = [part.query_jacobian(max(lo, start) - start, min(hi, stop) - start)
                  for part, start, stop in zip(parts, starts, starts[1:]) if max(lo, start) < min(hi, stop)]
        return torch.cat(pieces, 1)

    first = parts[0]
    undefined = next((part.undefined for part in parts if part.undefined), None)
    if any(part.keys.shape[1] > part.queries.shape[1] for part in parts):  # each part's own: they do not join
        undefined = undefined or "its calls re-run alone read keys beyond their positions (compressed keys)"
    return AttentionRow(torch.cat([p.queries for p in parts], 1), torch.cat([p.keys for p in parts], 1),
                        torch.cat([p.inputs for p in parts]), first.columns, query_jacobian, min(p.chunk for p in parts),
                        first.scale, first.softcap, first.sliding_window, first.sinks, checks=first.checks,
                        undefined=undefined)


@dataclass
class AttentionBatch:
    """One captured batch of the first softmax-attention layer: its token ids ``[B, T]``, ``valid`` ``[B, T]`` bool
    (False at padding; ``None``: no padding), and :meth:`row`, each row's :class:`AttentionRow` re-run when asked
    (one row's re-run held at a time; ``work``: the dtype of its input projections' products and query-map
    Jacobians, float64 or float32 — :data:`~lm_eval_probes.probes.margin.math` precision)."""

    ids: torch.Tensor
    valid: torch.Tensor | None
    row: Callable[[int, torch.dtype], AttentionRow]
    _checks: list[list[torch.Tensor]] = field(default_factory=list)
    undefined: str | None = None
    """Why no row of this batch has margins (``None``: each row tells, :attr:`AttentionRow.undefined`)."""

    def rows(self, work: torch.dtype = torch.float64) -> Iterator[AttentionRow]:
        """Each row's :class:`AttentionRow` in order, with its ``valid`` positions (``work``: see the class; a layer's
        positions of its own before the input's are valid)."""
        for index in range(self.ids.shape[0]):
            row = self.row(index, work)
            row.valid = None if self.valid is None else self.valid[index]
            if row.valid is not None and row.prepended:
                row.valid = torch.cat([row.valid.new_ones(row.prepended), row.valid])
            self._checks.append(row.checks)
            yield row

    def verify(self) -> None:
        """Raise when a chunk of any row given so far re-ran to other queries than its whole row (its query map does
        not read each position alone): one value read by the host for the whole batch."""
        pending = [check for checks in self._checks for check in checks]
        if pending and bool(torch.stack(pending).any()):
            raise RuntimeError("the first attention layer's re-run on a chunk of positions alone differs from the "
                               "whole row's queries: its query map does not read each position alone")
        for checks in self._checks:
            checks.clear()


@dataclass(frozen=True, eq=False)  # hashed by identity: a row's tangents and products are kept per colouring
class _Coloring:
    """Colours of the columns of u the heads read, for D_t = ∂q_t/∂u_t by forward mode (Curtis, Powell and Reid's
    colouring of a sparse Jacobian, 1974): the columns of one colour move disjoint entries of every head's queries
    (:attr:`pattern`), so one tangent on all of them at once gives each one's entries of D, read back through the
    pattern. A rotary-only query map moves entry i from columns i and its rotation partner: two colours where every
    column alone took a product; a per-head query norm moves every entry from every column: as many colours as columns
    (each column alone, as without colours). Found once per layer at load (:meth:`of`), from every column alone on the
    load's row, and kept only where the colours give those same columns' D there.

    Attributes:
        columns: ``[H or 1, n]`` the columns of u each head reads, as the layer's :attr:`FirstAttentionCapture._columns`
            (the colouring is for those).
        colors: ``[n]`` int64, each column's colour; ``None``: each column its own (``count`` = n).
        hidden: ``[H, n, p]`` bool, True where column j does not move head h's query entry i (``None``: none hidden).
        count: K, the number of colours.
    """

    columns: torch.Tensor
    colors: torch.Tensor | None
    hidden: torch.Tensor | None
    count: int

    @classmethod
    def dense(cls, columns: torch.Tensor) -> _Coloring:
        """Every column its own colour."""
        return cls(columns, None, None, columns.shape[1])

    @classmethod
    def of(cls, dense: list[torch.Tensor], columns: torch.Tensor,
           recompute: Callable[[_Coloring], list[torch.Tensor]]) -> _Coloring:
        """Greedy colours from D over a row (``dense``: its chunks ``[H, c, p, n]``, every column alone): a column takes
        the first colour none of whose columns moves an entry it moves. Kept when ``recompute`` with them gives the
        same D within 1e-12 of its largest entry (else every column its own)."""
        moved = torch.stack([(part != 0).any(1) for part in dense]).any(0).transpose(-1, -2).cpu()  # [H, n, p]
        rows = moved.transpose(0, 1).flatten(1)  # [n, H·p]: the entries each column moves
        taken: list[torch.Tensor] = []
        colors: list[int] = []
        for column in rows:
            color = next((c for c, used in enumerate(taken) if not bool((used & column).any())), len(taken))
            if color == len(taken):
                taken.append(column.clone())
            else:
                taken[color] |= column
            colors.append(color)
        if len(taken) == rows.shape[0]:
            return cls.dense(columns)
        device = dense[0].device
        colored = cls(columns, torch.tensor(colors, device=device), ~moved.to(device), len(taken))
        for want, got in zip(dense, recompute(colored), strict=True):
            if not bool((got - want).abs().max() <= 1e-12 * want.abs().max()):
                return cls.dense(columns)
        return colored

    def tangents(self, u: torch.Tensor) -> torch.Tensor:
        """``[K, m]`` (u's dtype): colour c's tangent at one position, 1 on its columns of every head."""
        table = u.new_zeros(self.count, u.shape[-1])
        colors = torch.arange(self.count, device=u.device) if self.colors is None else self.colors
        table[colors.expand(self.columns.shape), self.columns.to(u.device)] = 1.0
        return table

    def columns_of(self, by_color: torch.Tensor) -> torch.Tensor:
        """``[H, c, n, p]`` each column's entries of Dᵀ from the colours' ``[H, c, K, p]``."""
        if self.colors is None:
            return by_color
        return by_color.index_select(2, self.colors).masked_fill_(self.hidden[:, None], 0.0)


def _attends_later(queries: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None, scale: float) -> bool:
    """Whether a layer's attention gives weight to a position after the query's: queries ``[H, T, p]``, keys ``[KV, T,
    p]``, ``mask`` ``[H or 1, T, T]`` as it hands its attention (``None``: causal; bool: attended; float: added to the
    logits, an entry at or below float16's lowest value not attended — a bias of −10⁴, GPT-1's mask, gives no weight
    in float64)."""
    if mask is None:
        return False
    later = torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).triu(1)
    if mask.dtype == torch.bool:
        return bool((mask & later).any())
    logits = scale * (queries @ keys.repeat_interleave(queries.shape[0] // keys.shape[0], 0).transpose(-1, -2)) + mask
    weights = torch.softmax(logits.masked_fill(mask <= torch.finfo(torch.float16).min, -math.inf), -1)
    return bool((weights.nan_to_num(0.0) > 0).logical_and(later).any())


def _tolerance(dtype: torch.dtype) -> float:
    """How far, relative to the largest query, the model's own queries may be from their float64 re-run."""
    return 1e-4 if dtype in (torch.float32, torch.float64) else 0.05


class FirstAttentionCapture:
    """The first softmax-attention layer of ``model`` (:func:`first_softmax_attention`): its arguments captured in the
    model's own forwards (:meth:`capture`), re-run in float64 one row at a time (:meth:`batch`).

    Raises:
        UnsupportedModelError: no module of the model calls transformers' attention interface or computes a softmax
            over its positions after a query-key product itself, or its re-run does not reproduce its queries (and, for
            a layer that computes its attention itself, its attention weights: the load's self-check).
    """

    CHECK_LENGTH = 6
    _moving = False
    _at_zero: torch.Tensor | None = None
    _zero_for: list[nn.Module] | None = None  # the projections :attr:`_at_zero` was made for
    """Whether the logit bias or the per-query sinks the layer hands its attention move with its queries' inputs
    (found at load, :meth:`_moves`): then its rows re-run whole and their products give E_ts too."""
    _coloring: _Coloring | None = None
    """The colours of the query map's input columns (:class:`_Coloring`), found at the first row re-run for the current
    :attr:`_columns`."""

    def __init__(self, model: nn.Module) -> None:
        model_type = getattr(model.config, "model_type", None)
        try:
            module = first_softmax_attention(model)
        except (RuntimeError, ValueError, TypeError, IndexError, KeyError, AttributeError) as error:
            raise UnsupportedModelError(f"model_type {model_type!r}: a two-token forward to find its first attention "
                                        f"layer failed: {type(error).__name__}: {error}") from None
        self._own: OwnAttention | None = None
        if module is None:  # a layer that computes its attention itself (capture/own_attention.py)
            try:
                module = first_own_attention(model, token_ids(model, 1, 5))
            except (RuntimeError, ValueError, TypeError, IndexError, KeyError, AttributeError) as error:
                raise UnsupportedModelError(f"model_type {model_type!r}: a five-token forward to find its first "
                                            f"softmax attention failed: {type(error).__name__}: {error}") from None
            self._own = None if module is None else OwnAttention(module, AttentionCall)
        if module is None:
            raise UnsupportedModelError(f"model_type {model_type!r}: no layer calls transformers' attention interface "
                                        "or computes a softmax over its positions itself (no softmax attention)")
        self.model, self.module = model, module
        self._name = f"model_type {model_type!r}: {type(module).__name__}"
        self._columns: torch.Tensor | None = None
        self._read: list[bool] | None = None
        self._reach = 0  # how many positions before its own a query reads (a causal convolution: Zaya)
        self._causal: bool | None = None  # whether no position attends a later one (found at load, from its mask)
        try:
            self._discover()
        except UnsupportedModelError:
            raise
        except (RuntimeError, ValueError, TypeError, IndexError, KeyError, AttributeError) as error:
            raise UnsupportedModelError(f"{self._name}: the first-attention capture cannot re-run this layer: "
                                        f"{type(error).__name__}: {error}") from None

    def _recorded(self, record: Callable[[AttentionCall], None], *, early: bool = False) -> Any:
        """The layer's calls recorded, each run stopped there: at its attention-interface call, or for a layer that
        computes its attention itself at its softmax (``early``: at its query-key product; :mod:`.own_attention`)."""
        if self._own is not None:
            return self._own.recorded(record, early=early)
        return attention_calls_recorded(self.module, record, stop=True)

    # -- load: the layer's arguments, its projections, the self-check -------------------------------------------------

    def _discover(self) -> None:
        """The layer's arguments' axes, its input projections and the parameters its query code reads; the self-check."""
        short, long, wide = (self._arguments(rows, length) for rows, length in
                             ((1, self.CHECK_LENGTH - 1), (1, self.CHECK_LENGTH), (2, self.CHECK_LENGTH)))
        shapes = [dict(_leaves((layer_call.args, layer_call.kwargs))) for layer_call in (short, long, wide)]
        self._axes = {path: _ArgumentAxes(_changed(shapes[0], shapes[1], path), _changed(shapes[1], shapes[2], path))
                      for path in shapes[1]}
        self._hidden: Path = ((1, "hidden_states") if "hidden_states" in long.kwargs else (0, 0))
        self.reads_mask = False
        if self._own is not None:
            self._own.keep_weights = True
        try:
            projections, own_queries = self._find_projections(long)
        finally:
            if self._own is not None:
                self._own.keep_weights = False
        try:
            if not projections:
                raise UnsupportedModelError(f"{self._name}: no submodule reads the layer's input (its query projection "
                                            "was not found)")
            self._use_projections(projections)
            self._check(long, own_queries)
        except UnsupportedModelError as error:
            if self._own is not None:
                raise
            self._use_projections([])  # the query code reads the layer's input itself (JetMoE's routed query experts)
            try:
                self._check(long, own_queries)
            except UnsupportedModelError as other:
                raise UnsupportedModelError(f"{error}; with the layer's input itself as the queries' input: "
                                            f"{str(other).removeprefix(self._prefix)}") from None
        self._check_key_positions(short, long)
        if self._own is not None:
            try:
                self._own.check(self._row(long, 0), self._own.weights, _tolerance(own_queries.dtype))
            except ValueError as error:
                raise UnsupportedModelError(f"{self._name}: the first-attention capture cannot re-run this layer: "
                                            f"{error}") from None
        self.reads_mask = self._reads_mask(long)

    @property
    def _prefix(self) -> str:
        return f"{self._name}: the first-attention capture cannot re-run this layer: "

    def _use_projections(self, projections: list[nn.Module]) -> None:
        """Split the query map at ``projections`` (their outputs are u), or, with none, at the layer's input itself
        (u = x: a query code that reads x other than through submodules of x alone, JetMoE's mixture of attention
        heads routing each token's queries to its experts); the float64 copies of the parameters its other code
        reads."""
        self._projections, self._columns, self._read, self._reach, self._moving = projections, None, None, 0, False
        inside = {sub for projection in projections for sub in projection.modules()}
        names = {sub: name for name, sub in self.module.named_modules()}
        self._params = {f"{names[sub]}.{name}".lstrip("."): value.detach().double() if value.is_floating_point() else value
                        for sub in self._called if sub not in inside
                        for name, value in (*sub.named_parameters(recurse=False), *sub.named_buffers(recurse=False))}

    def _reads_mask(self, layer_call: _LayerCall) -> bool:
        """Whether the layer's code before the attention call reads the attention mask (DeepSeek-V3.2's indexer): its
        re-run fails without it. Then the calls of one ``generate`` cannot be re-run as one (their masks do not join)."""
        if not isinstance(layer_call.kwargs.get("attention_mask"), torch.Tensor):
            return False
        try:
            self._row(_LayerCall(layer_call.ids, layer_call.mask, layer_call.args, {**layer_call.kwargs, "attention_mask": None}), 0)
        except (RuntimeError, ValueError, TypeError, IndexError, AttributeError):
            return True
        return False

    @torch.no_grad()
    def _arguments(self, rows: int, length: int) -> _LayerCall:
        """The layer's arguments in a forward of ``rows × length`` tokens (stopped at its attention call)."""
        ids = token_ids(self.model, rows, length)
        kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}
        with self.capture() as inputs, self._recorded(lambda call: None, early=True):
            try:  # positions per row, as generate gives them
                stopped(lambda: self.model(**kwargs, position_ids=torch.arange(length, device=ids.device).expand_as(ids)))
            except TypeError:
                stopped(lambda: self.model(**kwargs))
        return inputs.latest()

    @torch.no_grad()
    def _find_projections(self, layer_call: _LayerCall) -> tuple[list[nn.Module], torch.Tensor]:
        """The submodules that read the layer's input (in call order) and the layer's own queries, from a run of the
        layer on ``layer_call``'s arguments; :attr:`_called`: the submodules that ran before the attention call."""
        x = self._leaf((layer_call.args, layer_call.kwargs), self._hidden)
        projections: list[nn.Module] = []
        self._called: list[nn.Module] = [self.module]
        calls: list[AttentionCall] = []

        def entered(module: nn.Module, _inputs: Any) -> None:
            if module not in self._called:
                self._called.append(module)

        def seen(module: nn.Module, inputs: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if len(inputs) == 1 and not kwargs and inputs[0] is x and isinstance(output, torch.Tensor) \
                    and output.is_floating_point() and output.shape[:2] == x.shape[:2] and module not in projections:
                projections.append(module)  # a map of x alone (not an indexer reading x among other arguments)

        handles = [hook for sub in self.module.modules() if sub is not self.module
                   for hook in (sub.register_forward_pre_hook(entered), sub.register_forward_hook(seen, with_kwargs=True))]
        try:
            with self._recorded(calls.append):
                stopped(lambda: self.module(*layer_call.args, **layer_call.kwargs))
        finally:
            for handle in handles:
                handle.remove()
        return projections, self._one_call(calls).queries

    def _check(self, layer_call: _LayerCall, own_queries: torch.Tensor) -> None:
        """The float64 re-run reproduces the layer's own queries, and its chunks repeated per column the whole row's."""
        try:
            self._moving = self._moves(layer_call)
            row = self._row(layer_call, 0, check_chunk=2)
            want = own_queries[0].double()
            error = float((row.queries - want).abs().max()) / max(float(want.abs().max()), 1e-30)
            if not error <= _tolerance(own_queries.dtype):
                raise UnsupportedModelError(f"its float64 re-run (input projections replaced by their outputs) is "
                                            f"{error:.1e} (relative) from its own queries")
            try:
                self._check_chunks(layer_call, row)
            except RuntimeError:  # a query that reads positions before its own: found, or the first error
                self._reach = self._reach_of(layer_call) or 0
                if not self._reach:
                    raise
                self._check_chunks(layer_call, self._row(layer_call, 0), layer_call.length)  # its products read the prefix
        except (UnsupportedModelError, RuntimeError, ValueError, TypeError, IndexError) as error:
            why = str(error) if isinstance(error, UnsupportedModelError) else f"{type(error).__name__}: {error}"
            raise UnsupportedModelError(f"{self._name}: the first-attention capture cannot re-run this layer: "
                                        f"{why}") from None

    def _check_key_positions(self, short: _LayerCall, long: _LayerCall) -> None:
        """The first T of the keys the layer's attention reads are its T positions' (the margins read any after them as
        entries without a position of their own: DeepSeek-V4's compressed keys): in forwards of two lengths, at least
        T keys each, and in the longer, one forward-mode product per position j with a random tangent on its u moves
        key j and no key before it among the first T."""
        counts = []
        for layer_call in (short, long):
            tree, with_placeholder_input, u, widths = self._prepared(layer_call, 0, torch.float64)
            length = u.shape[1]
            with torch.no_grad():
                counts.append(self._queries(with_placeholder_input(tree, length), u.split(widths, -1)).keys.shape[2])
        moved_wrong = None
        if counts[0] >= short.length and counts[1] >= length:
            generator = torch.Generator(device="cpu").manual_seed(0)
            for position in range(length):
                tangent = torch.zeros_like(u)
                tangent[0, position] = (torch.rand(u.shape[-1], generator=generator, dtype=u.dtype) + 0.5).to(u.device)
                with torch.no_grad():
                    _, derivative = torch.func.jvp(
                        lambda v: self._queries(with_placeholder_input(tree, length), v.split(widths, -1),
                                                early=True).keys, (u,), (tangent,))
                moved = derivative[0, :, :length].ne(0).any(-1).any(0)  # [T]: the position columns it moves
                if not moved[position] or moved[:position].any():
                    moved_wrong = (position, torch.nonzero(moved).flatten().tolist())
                    break
        if counts[0] < short.length or counts[1] < length or moved_wrong is not None:
            where = "" if moved_wrong is None else f"; position {moved_wrong[0]}'s input moves keys {moved_wrong[1]}"
            raise UnsupportedModelError(f"{self._prefix}its attention reads {counts[0]} and {counts[1]} keys for "
                                        f"{short.length} and {length} positions{where}: the margins read the "
                                        "first T keys as the T positions' (any after them as keys without a position "
                                        "of their own)")

    def _check_chunks(self, layer_call: _LayerCall, row: AttentionRow, chunk: int = 2) -> None:
        """Every chunk's re-run for its Jacobians reproduces the whole row's queries."""
        length = row.queries.shape[1]
        for lo in range(0, length, chunk):
            row.query_jacobian(lo, min(length, lo + chunk))
        AttentionBatch(layer_call.ids, None, lambda _: row, [row.checks]).verify()

    def _terms(self, call: AttentionCall, every: bool = False) -> tuple[torch.Tensor, ...]:
        """What a forward-mode product of the layer's re-run differentiates: its queries, and for a layer whose bias
        moves (:attr:`_moving`, or ``every``) its logit bias and per-query sinks (empty where it has none)."""
        if not (self._moving or every):
            return (call.queries,)
        empty = call.queries.new_zeros(0)
        sinks = call.sinks if call.sinks is not None and call.sinks.ndim == 4 else empty
        return call.queries, empty if call.bias is None else call.bias, sinks

    def _moves(self, layer_call: _LayerCall) -> bool:
        """Whether the logit bias or the per-query sinks the layer hands its attention move with its queries' inputs u
        (Inkling's ``position_bias``, Inkling-2's sinks: each computed from its query's input), from one forward-mode
        product per position of the load's row with a random tangent on its u. Raises
        :class:`UnsupportedModelError` where a query's bias moves with another position's input, or beside a soft
        cap (which logits it caps is the attention function's)."""
        tree, with_placeholder_input, u, widths = self._prepared(layer_call, 0, torch.float64)
        length = u.shape[1]

        def terms(v: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self._terms(self._queries(with_placeholder_input(tree, length), v.split(widths, -1), early=True),
                               every=True)

        with torch.no_grad():
            call = self._queries(with_placeholder_input(tree, length), u.split(widths, -1), early=True)
        _, bias, sinks = self._terms(call, every=True)
        if not bias.numel() and not sinks.numel():
            return False
        generator = torch.Generator(device="cpu").manual_seed(0)
        moving = False
        for position in range(length):
            tangent = torch.zeros_like(u)
            tangent[0, position] = (torch.rand(u.shape[-1], generator=generator, dtype=u.dtype) + 0.5).to(u.device)
            with torch.no_grad():
                _, (_, bias, sinks) = torch.func.jvp(terms, (u,), (tangent,))
            for name, derivative in (("logit bias", bias), ("sinks", sinks)):
                if not derivative.numel():
                    continue
                rows = torch.nonzero(derivative[0].ne(0).flatten(-1).any(-1).any(0)).flatten().tolist()
                if any(row != position for row in rows):
                    raise UnsupportedModelError(f"its attention's {name} at a query moves with another position's "
                                                "input (the margins differentiate each query's at its own)")
                moving = moving or bool(rows)
        if moving and call.softcap:
            raise UnsupportedModelError("its attention's logit bias moves with its queries' inputs beside a soft cap")
        return moving

    def _reach_of(self, layer_call: _LayerCall) -> int | None:
        """How many positions before its own each query reads, at most (a causal convolution over the queries' and
        keys' inputs: Zaya), from one forward-mode product per position of the load's row with a random tangent on its
        u: the queries it moves. ``None``: a query moves before the tangent's position, or the first position's moves
        the last (no window within the load's row)."""
        tree, with_placeholder_input, u, widths = self._prepared(layer_call, 0, torch.float64)
        length = u.shape[1]
        generator = torch.Generator(device="cpu").manual_seed(0)
        reach = 0
        for position in range(length):
            tangent = torch.zeros_like(u)
            tangent[0, position] = (torch.rand(u.shape[-1], generator=generator, dtype=u.dtype) + 0.5).to(u.device)
            with torch.no_grad():
                _, derivative = torch.func.jvp(
                    lambda v: self._queries(with_placeholder_input(tree, length), v.split(widths, -1), early=True).queries,
                    (u,), (tangent,))
            moved = torch.nonzero(derivative[0].ne(0).any(-1).any(0)).flatten().tolist()  # positions of moved queries
            if moved and moved[0] < position:
                return None
            reach = max(reach, (moved[-1] - position) if moved else 0)
        return reach if reach < length - 1 else None

    # -- the harness's forwards ---------------------------------------------------------------------------------------

    @contextmanager
    def capture(self, *, join: bool = False) -> Iterator[CapturedInputs]:
        """Hooks on the model and its first attention layer, removed when the block ends. Without ``join`` only the
        latest forward's arguments are kept; with it every call's (one ``generate``: :meth:`joined`)."""
        inputs = CapturedInputs()

        def enter(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            mask = kwargs.get("attention_mask")
            if not join:
                inputs.layer_calls.clear()
            inputs.layer_calls.append(_LayerCall(None if ids is None else ids.detach(),
                                            mask.detach() if isinstance(mask, torch.Tensor) and mask.ndim == 2 else None))

        def layer_inputs(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not inputs.layer_calls or inputs.layer_calls[-1].args is not None:
                return  # a call outside the model's forward, or a second call within one
            layer_call = inputs.layer_calls[-1]
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            if layer_call.ids is None or hidden is None or layer_call.ids.shape[0] != hidden.shape[0] \
                    or hidden.shape[1] < layer_call.ids.shape[1] and not join:  # (CPM-Ant's generate: every id so far)
                raise ValueError("the first attention layer's capture needs input_ids matching its positions")
            detached: dict[int, torch.Tensor] = {}  # one tensor handed twice stays one (CPM-Ant's queries' and keys' input)

            def kept(value: Any) -> Any:
                return detached.setdefault(id(value), value.detach()) if isinstance(value, torch.Tensor) else value

            layer_call.args = tuple(kept(a) for a in args)
            layer_call.kwargs = {k: kept(v) for k, v in kwargs.items()}
            if hidden.shape[1] != layer_call.ids.shape[1]:  # positions of its own before the input's
                layer_call.positions = hidden.shape[1]

        handles = []
        try:
            handles.append(self.model.register_forward_pre_hook(enter, with_kwargs=True))
            handles.append(self.module.register_forward_pre_hook(layer_inputs, with_kwargs=True))
            yield inputs
        finally:
            for handle in handles:
                handle.remove()

    def batch(self, layer_call: _LayerCall, *, joined_mask: bool = True) -> AttentionBatch:
        """One captured forward; its rows re-run when asked (see the module docstring)."""
        length = layer_call.ids.shape[1]
        mask = layer_call.mask
        valid = mask[:, -length:].bool() if joined_mask and mask is not None and mask.shape[1] >= length else None
        return AttentionBatch(layer_call.ids, valid, lambda row, work: self._row(layer_call, row, work=work))

    def joined(self, inputs: CapturedInputs) -> AttentionBatch:
        """The calls of one ``generate`` (prefill, then one position per step) as one sequence. The query and key maps
        read each position alone, so the calls' arguments are joined along their positions and re-run once
        (:func:`_joined_call`); where they cannot be, each call is re-run alone and the rows are joined."""
        layer_calls = [layer_call for layer_call in inputs.layer_calls if layer_call.args is not None]
        if not layer_calls:
            raise RuntimeError("no first-attention inputs were captured: run generate inside capture()")
        if len(layer_calls) > 1 and any(layer_call.positions is not None for layer_call in layer_calls):
            return AttentionBatch(torch.cat([layer_call.ids for layer_call in layer_calls], 1), None, self._row,
                                  undefined="its calls in generate do not hand it its positions of its own before the "
                                            "input's each time (a cache holds them)")
        one = _joined_call(layer_calls)
        parts = [one] if one is not None else layer_calls
        ids = torch.cat([part.ids for part in parts], 1)
        mask = inputs.layer_calls[-1].mask
        valid = None if mask is None or mask.shape[1] < ids.shape[1] else mask[:, -ids.shape[1]:].bool()

        def joined_row(row: int, work: torch.dtype) -> AttentionRow:
            checks: list[torch.Tensor] = []
            return _joined_rows([self._row(part, row, work=work, checks=checks) for part in parts])

        return AttentionBatch(ids, valid, joined_row)

    # -- one row's float64 re-run -------------------------------------------------------------------------------------

    def _leaf(self, tree: Any, path: Path) -> Any:
        for key in path:
            tree = tree[key]
        return tree

    def _sliced(self, tree: Any, *, rows: int, length: int, row: int | None = None,
             positions: torch.Tensor | None = None) -> Any:
        """The arguments of one row (``row``) and some positions (``positions``, with repeats) in float64: each tensor
        cut along the axes that follow the batch rows and the positions (found at load; an argument not seen then:
        its axes of the sequence's length, and a first axis of the batch's size); a float attention mask too (an
        indexer may fill it with float64's lowest value: HY-V4), a boolean one as it is."""

        def cut(path: Path, value: torch.Tensor) -> torch.Tensor | None:
            axes = self._axes.get(path)
            if axes is None:
                axes = _ArgumentAxes(tuple(axis for axis, size in enumerate(value.shape) if size == length), ())
            if row is not None:  # a first axis of the batch's size counts too (per-row positions, say)
                first = (0,) if value.ndim and value.shape[0] == rows and 0 not in axes.positions else ()
                for axis in sorted({*axes.rows, *first}):
                    per = value.shape[axis] // rows  # entries per row (BLOOM's ALiBi bias [B · heads, 1, T]: heads)
                    if rows > 1 and per and value.shape[axis] == per * rows:
                        value = value.narrow(axis, row * per, per)
            if positions is not None:
                for axis in axes.positions:
                    if axis < value.ndim and value.shape[axis] == length:
                        value = value.index_select(axis, positions.to(value.device))
            return value.double() if value.is_floating_point() else value

        return _mapped(tree, cut)

    def _project(self, module: nn.Module, x: torch.Tensor, work: torch.dtype) -> torch.Tensor:
        """One input projection's output (float64 values). A linear layer: with ``work`` float32, x Wᵀ by
        :func:`~lm_eval_probes.stack_api.matmul_float32` (float32 accumulation of float32-exact inputs: bfloat16
        terms on tensor cores; a bfloat16 model's weight is one term) plus the bias in float64; with float64, in
        float64 a block of its weight's rows at a time (its float64 copy never whole). Any other module: re-run with
        float64 parameters."""
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Linear) and weight is not None and weight.is_floating_point():
            if work == torch.float32:
                from lm_eval_probes.stack_api import matmul_float32

                out = matmul_float32(x.flatten(0, -2), weight.detach().T).double().unflatten(0, x.shape[:-1])
                return out if module.bias is None else out.add_(module.bias.detach().double())
            out = x.new_empty(*x.shape[:-1], weight.shape[0])
            step = max(1, PRODUCT_ELEMENTS // weight.shape[1])  # 64 MiB of float64 weights at a time
            for lo in range(0, weight.shape[0], step):
                hi = min(weight.shape[0], lo + step)
                bias = None if module.bias is None else module.bias.detach()[lo:hi].double()
                out[..., lo:hi] = nn.functional.linear(x, weight.detach()[lo:hi].double(), bias)
            return out
        params = {name: value.detach().double() if value.is_floating_point() else value
                  for name, value in (*module.named_parameters(), *module.named_buffers())}
        return torch.func.functional_call(module, params, (x,))

    def _queries(self, tree: Any, parts: Sequence[torch.Tensor], *, early: bool = False) -> AttentionCall:
        """The layer run on ``tree``'s arguments with its input projections returning ``parts`` (one ``[1, L, w]`` each)
        instead (their ``forward`` shadowed on the instance while it runs; with none, ``parts`` is the layer's input),
        stopped at the attention call."""
        calls: list[AttentionCall] = []
        if not self._projections:
            (part,) = parts
            tree = _mapped(tree, lambda path, value: part if path == self._hidden else value)
        for module, part in zip(self._projections, parts if self._projections else (), strict=True):
            module.forward = lambda *_args, part=part, **_kwargs: part
        try:
            with self._recorded(calls.append, early=early):
                stopped(lambda: torch.func.functional_call(self.module, self._params, tree[0], tree[1]))
        finally:
            for module in self._projections:
                del module.forward
        return self._one_call(calls)

    def _prepared(self, layer_call: _LayerCall, row: int, work: torch.dtype) -> tuple[Any, Callable[[Any, int], Any],
                                                                               torch.Tensor, list[int]]:
        """One row's arguments in float64 with the layer's input replaced by a placeholder (the re-runs hand its input
        projections' outputs u instead; :func:`with_placeholder_input` gives it the shape of a run's positions), u ``[1, T, m]`` and the
        widths of its parts (one per input projection); :attr:`_at_zero`: u at a zero input ``[m]`` (the projections'
        biases; ``None`` where all are zero: u is then W x), made once per layer."""
        rows, length = layer_call.ids.shape[0], layer_call.length
        tree = self._sliced((layer_call.args, layer_call.kwargs), rows=rows, length=length, row=row)
        x = self._leaf(tree, self._hidden)
        with torch.no_grad():
            outputs = [self._project(module, x, work) for module in self._projections] if self._projections else [x]
            if self._zero_for is not self._projections:  # once per split (at load), not per row
                zero = x.new_zeros(1, x.shape[-1])
                at_zero = torch.cat([self._project(module, zero, torch.float64) for module in self._projections], -1)[0] \
                    if self._projections else None
                self._at_zero = at_zero if at_zero is not None and bool(at_zero.ne(0).any()) else None
                self._zero_for = self._projections
        widths = [out.shape[-1] for out in outputs]
        u = torch.cat(outputs, -1)
        x_shape = x.shape
        tree = _mapped(tree, lambda path, value: x.new_zeros(()) if path == self._hidden else value)
        del outputs, x

        def with_placeholder_input(tree: Any, positions: int) -> Any:
            """``tree`` with the layer's input as a tensor of its shape that holds one value (only the shadowed
            projections read it: the load's self-check would see another reader)."""
            shape = (*x_shape[:-2], positions, x_shape[-1])
            return _mapped(tree, lambda path, value: value.expand(shape) if path == self._hidden else value)

        return tree, with_placeholder_input, u, widths

    def _row(self, layer_call: _LayerCall, row: int, *, work: torch.dtype = torch.float64, check_chunk: int | None = None,
             checks: list[torch.Tensor] | None = None) -> AttentionRow:
        """One row of ``layer_call`` re-run in float64 (see the module docstring); ``work``: :class:`AttentionBatch`."""
        length = layer_call.length
        tree, with_placeholder_input, u, widths = self._prepared(layer_call, row, work)
        budget = PRODUCT_ELEMENTS_TENSOR_CORES if work == torch.float32 else PRODUCT_ELEMENTS  # as a product's
        step = max(1, min(PRODUCT_POSITIONS, budget // (10 * u.shape[-1])))  # its query code within ~64 (512) MiB
        if self._own is not None or self.reads_mask or self._reach or self._moving:  # its bias is read from the whole
            step = length  # row's logits; an indexer folds its selection into the mask its attention is handed; a query
            # reads its past; a bias of each query's input reads its distance to each key (counted within the run)
        calls = []
        with torch.no_grad():
            for lo in range(0, length, step):
                at = torch.arange(lo, min(length, lo + step), device=u.device)
                cut = tree if step >= length else self._sliced(tree, rows=1, length=length, positions=at)
                calls.append(self._queries(with_placeholder_input(cut, at.shape[0]), u[:, lo:lo + step].split(widths, -1)))
        if len(calls) > 1 and any(one.keys.shape[2] > one.queries.shape[2] for one in calls):
            with torch.no_grad():  # keys beyond the positions' (compressed keys): those of the whole row
                calls = [self._queries(with_placeholder_input(tree, length), u.split(widths, -1))]
        call = calls[0]
        mask = call.mask if len(calls) == 1 else self._leaf(tree, (1, "attention_mask")) if "attention_mask" in tree[1] \
            else None  # a run over a block of positions is handed that block's mask: the whole row's is the layer's
        mask = mask[0] if isinstance(mask, torch.Tensor) and mask.ndim == 4 and mask.shape[0] == 1 \
            and mask.shape[-2:] == (length, call.keys.shape[2] if len(calls) == 1 else length) else None
        if call.bias is not None:  # a logit bias before the mask (the run is the whole row's: step above)
            bias = call.bias[0].double()
            if mask is not None and mask.shape[-1] > bias.shape[-1]:  # keys beyond the positions': no bias of theirs
                bias = torch.nn.functional.pad(bias, (0, mask.shape[-1] - bias.shape[-1]))
            if mask is None:  # causal only (the interface's convention): the bias must not open the later keys
                mask = torch.ones(bias.shape[-2:], dtype=torch.bool, device=bias.device).tril()
            base = mask if mask.is_floating_point() else \
                torch.zeros((), dtype=bias.dtype, device=bias.device).masked_fill(~mask, -torch.inf)
            mask = bias + base
        sinks = None if call.sinks is None else call.sinks.detach().double()
        sinks = None if sinks is None else sinks[0, :, :, 0] if sinks.ndim == 4 else sinks.reshape(-1)  # [H, T] or [H]
        queries = torch.cat([one.queries[0] for one in calls], 1)  # [H, T, p]
        keys = torch.cat([one.keys[0] for one in calls], 1)  # [KV, T (+ E), p]
        del calls
        undefined = None
        if keys.shape[1] > length:
            mask, undefined = self._extra_keys_mask(tree, with_placeholder_input, u, widths, mask)
        if self._causal is None:  # at load: whether its mask lets a position attend a later one (CPM-Ant's)
            self._causal = not _attends_later(queries, keys[:, :length], None if mask is None else mask[..., :length],
                                              float(call.scaling if call.scaling is not None else queries.shape[-1]**-0.5))
        if self._columns is None:
            self._columns = self._supports(tree, with_placeholder_input, u, widths, queries.shape[0])
        columns = self._columns
        heads, _, dim = queries.shape
        copies = columns.shape[1]
        chunk, group = jacobian_chunks(length, heads, dim, copies, u.shape[-1], tensor_cores=work == torch.float32)
        wide, most = chunk, group  # the colours' search below runs at the row's own sizes
        if check_chunk is not None:
            chunk, group = check_chunk, 1

        starts = [sum(widths[:index]) for index in range(len(widths))]
        if self._read is None or len(self._read) != len(widths):  # which projections any query reads: once per layer
            self._read = [bool(((columns >= start) & (columns < start + width)).any())
                          for start, width in zip(starts, widths)]
        read = self._read

        checks = [] if checks is None else checks  # per chunk: its re-run's queries differ from the whole row's
        tables: dict[_Coloring, torch.Tensor] = {}  # per colouring: its tangents, made once per row

        at_once: dict[_Coloring, tuple[int, torch.Tensor]] = {}  # per colouring: the rest of the row's colours, from where

        def jacobian(lo: int, hi: int, coloring: _Coloring, group: int) -> torch.Tensor:
            """``[H, hi − lo, p, n]``: :func:`colored` read back per column (:meth:`_Coloring.columns_of`). Where one
            product of every colour over the rest of the row from ``lo`` fits what a product may hold (``most`` copies
            of ``wide`` positions: few colours), that product is made at the first call and the later chunks read
            it."""
            if self._reach or self._moving:
                out = queries.new_empty(heads, hi - lo, copies, dim, dtype=work)  # Dᵀ, a row per column
                return local_jacobian(lo, hi, out, None)
            whole = at_once.get(coloring)
            if whole is None and check_chunk is None and coloring.count * (length - lo) <= most * wide:
                whole = at_once[coloring] = (lo, colored(lo, length, coloring, coloring.count))
            if whole is not None and whole[0] <= lo:
                by_color = whole[1][:, lo - whole[0]:hi - whole[0]]
            else:
                by_color = colored(lo, hi, coloring, group)
            return coloring.columns_of(by_color).transpose(-2, -1)

        def colored(lo: int, hi: int, coloring: _Coloring, group: int) -> torch.Tensor:
            """``[H, hi − lo, K, p]`` the colours' Dᵀ: per product, the chunk's arguments repeated for ``group`` colours,
            each copy with a tangent on its colour's columns of every head (see the module docstring and
            :class:`_Coloring`); the projections no query reads (keys, values) carry none."""
            span = hi - lo
            colors = coloring.count
            by_color = queries.new_empty(heads, span, colors, dim, dtype=work)  # a row per colour
            if coloring not in tables:
                tables[coloring] = coloring.tangents(u)
            table = tables[coloring]  # [K, m]: a colour's tangent at one position
            repeated: dict[int, tuple[Any, torch.Tensor]] = {}  # per number of copies: the arguments and u, cut once
            for first in range(0, colors, group):
                last = min(colors, first + group)
                if last - first not in repeated:
                    positions = torch.arange(lo, hi, device=u.device).repeat(last - first)
                    repeated[last - first] = (with_placeholder_input(self._sliced(tree, rows=1, length=length, positions=positions),
                                                     positions.shape[0]), u[:, positions])
                part, gathered = repeated[last - first]
                inputs = gathered.split(widths, -1)
                tangents = table[first:last].repeat_interleave(span, 0)[None].split(widths, -1)  # copy c: colour c

                def of_read(*dual: torch.Tensor, inputs: Sequence[torch.Tensor] = inputs) -> torch.Tensor:
                    given = iter(dual)
                    return self._queries(part, [next(given) if r else v for v, r in zip(inputs, read)],
                                         early=True).queries

                with torch.no_grad():
                    primal, derivative = torch.func.jvp(
                        of_read, tuple(v for v, r in zip(inputs, read) if r), tuple(t for t, r in zip(tangents, read) if r))
                del tangents
                if first == 0:  # every product's primal is the same; checked by verify(), once per batch
                    want = queries[:, lo:hi]
                    checks.append((primal[0, :, :span] - want).abs().max() > 1e-9 * want.abs().max().clamp_min(1e-30))
                by_color[:, :, first:last] = derivative[0].unflatten(1, (last - first, span)).transpose(1, 2)
            return by_color

        def local_jacobian(lo: int, hi: int, out: torch.Tensor, alpha: torch.Tensor | None) -> torch.Tensor:
            """:func:`query_jacobian` of a query map that reads the ``K = _reach`` positions before its own (a causal
            convolution): per product the prefix [0, hi) with a tangent on one column of every head at the chunk's
            positions ``K + 1`` apart (each query then sees its own position's tangent alone). A layer whose logit
            bias and sinks move with each query's input (:attr:`_moving`, K = 0) has their tangents from the same
            products; given the chunk's weights ``alpha`` they are contracted into F_t as they come
            (:attr:`AttentionRow.bias_term`, kept in :data:`contracted`)."""
            part = with_placeholder_input(tree if hi == length else self._sliced(tree, rows=1, length=length,
                                                              positions=torch.arange(hi, device=u.device)), hi)
            inputs = u[:, :hi].split(widths, -1)
            if alpha is not None:  # F_t, a column per product; ū_t [H, c, n] over the inputs each head reads
                inputs_of = u[0, :hi, columns] if self._at_zero is None else u[0, :hi, columns] - self._at_zero[columns]
                inputs_of = inputs_of.transpose(0, 1).to(work)  # [H or 1, hi, n]
                inputs_of = inputs_of.expand(heads, -1, -1)
                mean_u = alpha @ inputs_of
                rest = 1 - alpha.sum(-1)  # the sink's weight (its logit's tangent is zero where it has none)
                contracted[(lo, hi)] = term = queries.new_zeros(heads, hi - lo, copies, copies, dtype=work)

            def of_read(*dual: torch.Tensor) -> tuple[torch.Tensor, ...]:
                given = iter(dual)
                return self._terms(self._queries(part, [next(given) if r else v for v, r in zip(inputs, read)],
                                                 early=True))

            for first in range(lo, min(hi, lo + self._reach + 1)):
                targets = torch.arange(first, hi, self._reach + 1, device=u.device)
                for copy in range(copies):
                    tangent = torch.zeros_like(u[:, :hi])
                    tangent[0, targets[None, :], columns[:, copy, None]] = 1.0
                    with torch.no_grad():
                        primal, derivative = torch.func.jvp(
                            of_read, tuple(v for v, r in zip(inputs, read) if r),
                            tuple(t for t, r in zip(tangent.split(widths, -1), read) if r))
                    if first == lo and copy == 0:
                        want = queries[:, lo:hi]
                        checks.append((primal[0][0, :, lo:hi] - want).abs().max() >
                                      1e-9 * want.abs().max().clamp_min(1e-30))
                    out[:, targets - lo, copy] = derivative[0][0][:, targets].to(work)
                    if alpha is not None:  # the chunk's bias rows and sinks: E_ts, ∂σ_t on this column
                        bias, sink = derivative[1], derivative[2]
                        weighted = alpha * bias[0][:, lo:hi, :hi].to(work) if bias.numel() else torch.zeros_like(alpha)
                        mean_e = weighted.sum(-1)
                        if sink.numel():
                            mean_e += rest * sink[0][:, lo:hi, 0].to(work)
                        term[..., copy] = weighted @ inputs_of - mean_u * mean_e[..., None]
            return out.transpose(-2, -1)

        contracted: dict[tuple[int, int], torch.Tensor] = {}  # a chunk's F_t, made by local_jacobian given α
        kept: dict[tuple[int, int], torch.Tensor] = {}  # the D_t of the chunk bias_term was last asked for

        def bias_term(lo: int, hi: int, alpha: torch.Tensor) -> torch.Tensor:
            """``[H, hi − lo, n, n]`` F_t of the chunk (:attr:`AttentionRow.bias_term`); its D_t kept for
            :func:`query_jacobian`."""
            out = queries.new_empty(heads, hi - lo, copies, dim, dtype=work)
            kept.clear()
            kept[(lo, hi)] = local_jacobian(lo, hi, out, alpha.to(work))
            return contracted.pop((lo, hi))

        coloring = self._coloring if self._coloring is not None and self._coloring.columns is columns else None
        if coloring is None:  # once per layer (at load): D's pattern from every column alone, then the colours
            coloring = _Coloring.dense(columns)
            if not self._reach and not self._moving:
                def whole_row(given: _Coloring) -> list[torch.Tensor]:
                    return [jacobian(lo, min(length, lo + wide), given, max(1, min(most, given.count)))
                            for lo in range(0, length, wide)]

                coloring = _Coloring.of(whole_row(coloring), columns, whole_row)
            self._coloring = coloring

        def query_jacobian(lo: int, hi: int) -> torch.Tensor:
            """``[H, hi − lo, p, n]`` D_t = ∂q_t/∂u_t on each head's columns: :func:`jacobian` with the layer's
            colours."""
            if (lo, hi) in kept:
                return kept.pop((lo, hi))
            return jacobian(lo, hi, coloring, max(1, min(group, coloring.count)))

        inputs = u[0] if self._at_zero is None else u[0] - self._at_zero  # W x_t
        return AttentionRow(queries, keys, inputs, columns, query_jacobian, chunk,
                            float(call.scaling if call.scaling is not None else dim**-0.5),
                            None if not call.softcap else float(call.softcap), call.sliding_window, sinks, mask=mask,
                            checks=checks, bias_term=bias_term if self._moving else None, undefined=undefined,
                            prepended=length - layer_call.ids.shape[1], causal=self._causal)

    def _extra_keys_mask(self, tree: Any, with_placeholder_input: Callable[[Any, int], Any], u: torch.Tensor,
                         widths: list[int], mask: torch.Tensor | None) -> tuple[torch.Tensor | None, str | None]:
        """The mask of a row whose attention reads E keys after its T positions' (entries without a position of their
        own: DeepSeek-V4's compressed keys, each a gated sum over a block of positions), ``[H or 1, T, T + E]``, with
        each extra key left out at the positions whose own input it reads (as a position's own key is), and ``None``
        or why the row's margins are undefined: the layer hands its attention no mask (which positions attend which
        extra key is not known), or an extra key attended at t reads a position after t. Which positions each extra
        key reads: one vector-Jacobian product per extra key (its gradient with respect to u over the whole row)."""
        length = u.shape[1]
        if mask is None:
            return None, (f"its attention reads keys beyond its {length} positions and is handed no mask of them: "
                          "which positions attend them is not known")
        whole = with_placeholder_input(tree, length)
        extra, pullback = torch.func.vjp(
            lambda v: self._queries(whole, v.split(widths, -1), early=True).keys[0, :, length:], u)  # [KV, E, p]
        generator = torch.Generator(device="cpu").manual_seed(0)
        reads = []
        for entry in range(extra.shape[1]):
            cotangent = torch.zeros_like(extra)
            cotangent[:, entry] = torch.rand(cotangent[:, entry].shape, generator=generator,
                                             dtype=extra.dtype).to(extra.device) + 0.5
            (grad,) = pullback(cotangent)
            reads.append(grad[0].detach().ne(0).any(-1))  # [T]: the positions this extra key reads
        del extra, pullback
        own = torch.stack(reads).T  # [T, E]: position t's input read by extra key e
        attended = mask[..., length:] if mask.dtype == torch.bool else mask[..., length:] > torch.finfo(torch.float16).min
        last = torch.where(own, torch.arange(length, device=own.device)[:, None], -1).amax(0)  # [E]
        later = last[None, :] > torch.arange(length, device=own.device)[:, None]  # [T, E]: e reads a position after t
        if bool((attended & later).any()):
            return None, (f"a key beyond its {length} positions attended at a position reads a position after it "
                          "(the prior at t reads positions up to t)")
        mask = mask.clone()
        if mask.dtype == torch.bool:
            mask[..., length:] &= ~own
        else:
            mask[..., length:] = mask[..., length:].masked_fill(own, -math.inf)
        return mask, None

    def _supports(self, tree: Any, with_placeholder_input: Callable[[Any, int], Any], u: torch.Tensor, widths: list[int],
                  heads: int) -> torch.Tensor:
        """The columns of u each query head reads, ``[H, n]`` (disjoint blocks of equal width, one per head) or
        ``[1, m]`` (every column any head reads, shared): one vector-Jacobian product per head with a fixed random
        cotangent (a column is read when its gradient is nonzero anywhere)."""
        length = u.shape[1]
        terms, pullback = torch.func.vjp(
            lambda v: self._terms(self._queries(with_placeholder_input(tree, length), v.split(widths, -1), early=True)), u)
        generator = torch.Generator(device="cpu").manual_seed(0)
        cotangents = [torch.rand(term.shape, generator=generator, dtype=term.dtype).to(term.device) + 0.5
                      for term in terms]
        supports = []
        for head in range(heads):  # what its queries read, and its bias and sinks where they move (every head's: one)
            only = [torch.zeros_like(c) for c in cotangents]
            for mine, cotangent in zip(only, cotangents):
                if mine.numel():
                    mine[:, head if mine.shape[1] > 1 else 0] = cotangent[:, head if mine.shape[1] > 1 else 0]
            (grad,) = pullback(tuple(only))
            supports.append(torch.nonzero(grad.detach().ne(0).flatten(0, -2).any(0)).squeeze(-1))
        if all(len(s) == len(supports[0]) for s in supports) and \
                len(torch.cat(supports).unique()) == sum(len(s) for s in supports):
            return torch.stack(supports)
        return torch.cat(supports).unique()[None]

    def _one_call(self, calls: list[AttentionCall]) -> AttentionCall:
        mine = [call for call in calls if call.module is self.module]
        if len(mine) != 1:
            raise UnsupportedModelError(f"{self._name} called the attention interface {len(mine)} times in one "
                                        "forward (one expected)")
        return mine[0]
