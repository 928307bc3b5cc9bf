"""The first softmax-attention layer of any decoder-only model: its queries, keys and logit settings as the attention
uses them, and the Jacobian of its query map, over every position the model saw (a whole-forward capture any probe
can ask for: :class:`~lm_eval_probes.api.FirstAttention`).

Found and read through transformers' attention interface (``AttentionInterface``, its public extension point): every
attention module of a current transformers model hands its queries, keys and values to the function registered under
its ``config._attn_implementation`` (``eager`` falls back to the module's own). For a short while — one two-token
forward at load (:func:`first_softmax_attention`: the first module that calls it is the first softmax-attention
layer; linear-attention and SSM layers of a hybrid do not), and each re-run below — :func:`attention_calls_recorded`
registers a recording function under every name, then restores the originals. The harness's own forwards run
untouched: a pre-hook on the layer (:meth:`FirstAttentionCapture.capture`) only keeps its arguments.

Each captured batch is then re-run through that layer alone in float64 (its parameters converted for the call;
:func:`torch.func.functional_call`), so that the queries and keys are those of its own code — fused qkv, per-head or
full-width query/key norms, full, partial or interleaved rotary, query scalars — whatever the family. The query map
q_t = ψ_t(u_t) is split at its input projections u_t (the submodules that read the layer's input x_t: ``q_proj``,
``qkv_proj``, ``c_attn``, ``query_key_value``, …; u_t = W x_t + b), and ψ's Jacobian D_t = ∂q_t/∂u_t is computed by
forward-mode autograd (:func:`torch.func.jvp`) over the layer's own code: ∂q_t/∂x_t = D_t W. Which columns of u each
query head reads is found by reverse mode (one vector-Jacobian product per head); where the heads read disjoint
blocks of equal width n (every family but full-width query norms) D is ``[p, n]`` per head and position, found with n
products; otherwise ``[p, m]`` over all m columns any head reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lm_eval_probes.api import FirstAttention
from lm_eval_probes.capture.readouts import UnsupportedModelError
from lm_eval_probes.records import trace_values

__all__ = ["AttentionBatch", "AttentionCall", "AttentionRows", "AttentionSpan", "FirstAttentionCapture",
           "attention_calls_recorded", "attention_spans", "first_softmax_attention"]


@dataclass
class AttentionCall:
    """What the attention interface was handed: ``queries [B, H, T, p]``, ``keys [B, KV, T, p]``, the logit
    ``scaling`` (``None``: p^-½), ``softcap`` (logits c·tanh(z/c); ``None``: none), ``sliding_window`` (s attended
    from t only when t − s < W; ``None``: none) and its attention sinks (``s_aux``: one logit per head that takes part
    in the softmax and has no value, gpt-oss; ``None``: none)."""

    module: nn.Module
    queries: torch.Tensor
    keys: torch.Tensor
    scaling: float | None
    softcap: float | None
    sliding_window: int | None
    sinks: torch.Tensor | None


class _Stop(Exception):
    """Ends a forward at its first attention call (the discovery forward)."""


@contextmanager
def attention_calls_recorded(record: Callable[[AttentionCall], None], *, stop: bool = False) -> Iterator[None]:
    """While the block runs, every attention implementation registered with transformers' ``AttentionInterface``
    (and ``eager``) records its call with ``record`` and returns zeros (``stop``: ends the forward instead).
    The originals are restored when the block ends."""
    from transformers.modeling_utils import AttentionInterface

    mapping = AttentionInterface._global_mapping
    saved = dict(mapping)

    def recording(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                  **kwargs: Any) -> tuple[torch.Tensor, None]:
        record(AttentionCall(module, query, key, scaling, kwargs.get("softcap"), kwargs.get("sliding_window"),
                             kwargs.get("s_aux")))
        if stop:
            raise _Stop
        batch, _, length, _ = query.shape
        return query.new_zeros(batch, length, query.shape[1], value.shape[-1]), None

    try:
        for name in (*saved, "eager"):
            AttentionInterface.register(name, recording)
        yield
    finally:
        mapping.clear()
        mapping.update(saved)


@torch.no_grad()
def first_softmax_attention(model: nn.Module) -> nn.Module | None:
    """The first module of ``model`` that calls the attention interface in a two-token forward (``None``: none
    does — no softmax attention, or attention written without the interface)."""
    found: list[nn.Module] = []
    parameter = next(model.parameters())
    ids = torch.tensor([[1, 2]], device=parameter.device).clamp(max=model.config.get_text_config().vocab_size - 1)
    try:
        with attention_calls_recorded(lambda call: found.append(call.module), stop=True):
            model(input_ids=ids, use_cache=False)
    except _Stop:
        pass
    return found[0] if found else None


@dataclass
class AttentionBatch:
    """The first softmax-attention layer over one captured batch (float64; see the module docstring).

    Attributes:
        ids: ``[B, T]`` the token ids the model saw.
        valid: ``[B, T]`` bool, False at padding (``None``: no padding).
        queries: ``[B, H, T, p]`` as the attention uses them; keys: ``[B, KV, T, p]`` (query head h reads key head
            h // (H / KV)).
        scale: the logit scale; softcap: ``None`` or c (logits c·tanh(scale·q·k / c)); sliding_window: ``None`` or W;
            sinks: ``None`` or ``[H]`` the heads' attention-sink logits.
        query_inputs: ``[B, H or 1, T, n]`` the columns of the input projections' outputs u each head's query reads
            (one set shared by every head: ``1``).
        query_jacobian: ``(head) -> [B, T, p, n]`` D_t = ∂q_t/∂u_t of that head's queries on its columns, computed
            when asked (n forward-mode products of the query map, which stops at the attention call), so that only one
            head's Jacobian is held at a time (B·T·p·n values) instead of every head's.
    """

    ids: torch.Tensor
    valid: torch.Tensor | None
    queries: torch.Tensor
    keys: torch.Tensor
    scale: float
    softcap: float | None
    sliding_window: int | None
    query_inputs: torch.Tensor
    query_jacobian: Callable[[int], torch.Tensor]
    sinks: torch.Tensor | None = None

    def rows(self, index: Sequence[int]) -> AttentionBatch:
        """The same batch cut to some rows."""
        pick = torch.tensor(list(index), device=self.ids.device)

        def cut(value: torch.Tensor | None) -> torch.Tensor | None:
            return None if value is None else value.index_select(0, pick.to(value.device))

        jacobian = self.query_jacobian
        return AttentionBatch(cut(self.ids), cut(self.valid), cut(self.queries), cut(self.keys), self.scale, self.softcap,
                              self.sliding_window, cut(self.query_inputs), lambda head: cut(jacobian(head)), self.sinks)


def _is_cache(value: Any) -> bool:
    return any(cls.__name__.endswith("Cache") for cls in type(value).__mro__)


def _float64(value: Any) -> Any:
    """Floating tensors (in tuples too) as float64; caches dropped (the re-run must not extend them)."""
    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_float64(item) for item in value)
    return None if _is_cache(value) else value


@dataclass
class _Segment:
    ids: torch.Tensor | None
    mask: torch.Tensor | None
    args: tuple[Any, ...] | None = None
    kwargs: dict[str, Any] | None = None


@dataclass
class CapturedInputs:
    """The layer's arguments of each forward of the model inside :meth:`FirstAttentionCapture.capture`: one segment per
    forward (without ``join``: only the latest)."""

    segments: list[_Segment] = field(default_factory=list)

    def latest(self) -> _Segment:
        if not self.segments or self.segments[-1].args is None:
            raise RuntimeError("no first-attention inputs were captured: run the forward inside capture()")
        return self.segments[-1]


def _joined(values: list[Any], lengths: list[int]) -> tuple[bool, Any]:
    """One argument of several calls joined along its positions: tensors along the one axis whose size is each call's
    length (the same tensor in every call: kept); attention masks dropped (the re-run reads no mask); other values
    must be equal. ``(False, None)`` when they cannot be joined."""
    first = values[0]
    if all(value is first for value in values) or first is None and all(value is None for value in values):
        return True, first
    if isinstance(first, torch.Tensor) and all(isinstance(v, torch.Tensor) and v.ndim == first.ndim for v in values):
        axes = [axis for axis in range(first.ndim) if all(v.shape[axis] == n for v, n in zip(values, lengths))
                and all(v.shape[:axis] + v.shape[axis + 1:] == first.shape[:axis] + first.shape[axis + 1:] for v in values)]
        return (True, torch.cat(values, axes[0])) if len(axes) == 1 else (False, None)
    if isinstance(first, tuple) and all(isinstance(v, tuple) and len(v) == len(first) for v in values):
        joined = [_joined(list(items), lengths) for items in zip(*values)]
        return (all(ok for ok, _ in joined), tuple(value for _, value in joined))
    if _is_cache(first) or all(type(v) is type(first) and v == first for v in values):
        return True, first
    return False, None


def _joined_segment(segments: list[_Segment]) -> _Segment | None:
    """The layer's arguments of several calls (one ``generate``) as those of one call over all their positions, or
    ``None`` when an argument cannot be joined (:func:`_joined`)."""
    lengths = [segment.ids.shape[1] for segment in segments]
    if len(segments) == 1:
        return segments[0]
    if any(len(segment.args) != len(segments[0].args) or segment.kwargs.keys() != segments[0].kwargs.keys()
           for segment in segments):
        return None
    args = []
    for values in zip(*(segment.args for segment in segments)):
        ok, value = _joined(list(values), lengths)
        if not ok:
            return None
        args.append(value)
    kwargs = {}
    for name in segments[0].kwargs:
        if name == "attention_mask":
            kwargs[name] = None
            continue
        ok, value = _joined([segment.kwargs[name] for segment in segments], lengths)
        if not ok:
            return None
        kwargs[name] = value
    return _Segment(torch.cat([segment.ids for segment in segments], 1), segments[-1].mask, tuple(args), kwargs)


class FirstAttentionCapture:
    """The first softmax-attention layer of ``model`` (:func:`first_softmax_attention`): its arguments captured in the
    model's own forwards (:meth:`capture`), re-run in float64 to an :class:`AttentionBatch` (:meth:`batch`).

    Raises:
        UnsupportedModelError: no module of the model calls transformers' attention interface.
    """

    def __init__(self, model: nn.Module) -> None:
        module = first_softmax_attention(model)
        if module is None:
            raise UnsupportedModelError(f"model_type {getattr(model.config, 'model_type', None)!r}: no layer calls transformers' "
                             "attention interface (no softmax attention, or attention written without it)")
        self.model, self.module = model, module
        self._columns: torch.Tensor | None = None  # the columns of u each head reads (the same for every batch)

    @contextmanager
    def capture(self, *, join: bool = False) -> Iterator[CapturedInputs]:
        """Hooks on the model and its first attention layer, removed when the block ends. Without ``join`` only the
        latest forward's arguments are kept; with it every call's (one ``generate``: :meth:`joined`)."""
        inputs = CapturedInputs()

        def enter(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            mask = kwargs.get("attention_mask")
            if not join:
                inputs.segments.clear()
            inputs.segments.append(_Segment(None if ids is None else ids.detach(),
                                            mask.detach() if isinstance(mask, torch.Tensor) and mask.ndim == 2 else None))

        def layer_inputs(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not inputs.segments or inputs.segments[-1].args is not None:
                return  # a call outside the model's forward, or a second call within one
            segment = inputs.segments[-1]
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            if segment.ids is None or hidden is None or segment.ids.shape != hidden.shape[:2]:
                raise ValueError("the first attention layer's capture needs input_ids matching its positions")
            segment.args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
            segment.kwargs = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}

        handles = []
        try:
            handles.append(self.model.register_forward_pre_hook(enter, with_kwargs=True))
            handles.append(self.module.register_forward_pre_hook(layer_inputs, with_kwargs=True))
            yield inputs
        finally:
            for handle in handles:
                handle.remove()

    def joined(self, inputs: CapturedInputs) -> AttentionBatch:
        """The calls of one ``generate`` (prefill, then one position per step) as one sequence. The query and key maps
        read each position alone, so the calls' arguments are joined along their positions and re-run once
        (:func:`_joined_segment`); where they cannot be, each call is re-run alone and the results are joined."""
        segments = [segment for segment in inputs.segments if segment.args is not None]
        if not segments:
            raise RuntimeError("no first-attention inputs were captured: run generate inside capture()")
        one = _joined_segment(segments)
        parts = [self.batch(segment, joined_mask=False) for segment in ([one] if one is not None else segments)]
        mask = inputs.segments[-1].mask
        length = sum(part.ids.shape[1] for part in parts)
        valid = None if mask is None or mask.shape[1] < length else mask[:, -length:].bool()
        return AttentionBatch(
            torch.cat([p.ids for p in parts], 1), valid, torch.cat([p.queries for p in parts], 2),
            torch.cat([p.keys for p in parts], 2), parts[0].scale, parts[0].softcap, parts[0].sliding_window,
            torch.cat([p.query_inputs for p in parts], 2),
            lambda head: torch.cat([p.query_jacobian(head) for p in parts], 1), parts[0].sinks)

    def batch(self, segment: _Segment, *, joined_mask: bool = True) -> AttentionBatch:
        """One captured forward re-run through the layer in float64 (see the module docstring)."""
        args, kwargs = _float64(segment.args), {k: _float64(v) for k, v in segment.kwargs.items()}
        hidden_name = "hidden_states" if "hidden_states" in kwargs else None
        x = kwargs["hidden_states"] if hidden_name else args[0]
        params = {name: _float64(value.detach()) for name, value in
                  (*self.module.named_parameters(), *self.module.named_buffers())}

        def run(replace: dict[nn.Module, torch.Tensor] | None = None) -> None:
            """The layer's forward; the modules of ``replace`` return the tensor given instead of computing (their
            ``forward`` shadowed on the instance while it runs)."""
            for module, out in (replace or {}).items():
                module.forward = lambda *_args, out=out, **_kwargs: out
            try:
                torch.func.functional_call(self.module, params, args, kwargs)
            finally:
                for module in replace or {}:
                    del module.forward

        # the input projections: the submodules called on x itself, and their outputs
        projections: list[tuple[nn.Module, torch.Tensor]] = []
        calls: list[AttentionCall] = []

        def seen(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            if inputs and inputs[0] is x and isinstance(output, torch.Tensor) and output.shape[:2] == x.shape[:2]:
                projections.append((module, output.detach()))

        handles = [sub.register_forward_hook(seen) for sub in self.module.modules() if sub is not self.module]
        try:
            with torch.no_grad(), attention_calls_recorded(calls.append):
                run()
        finally:
            for handle in handles:
                handle.remove()
        call = self._one_call(calls)
        if not projections:
            raise UnsupportedModelError(f"{type(self.module).__name__}: no submodule reads the layer's input (its query "
                             "projection was not found)")
        widths = [out.shape[-1] for _, out in projections]
        u = torch.cat([out.reshape(*x.shape[:2], -1) for _, out in projections], -1)  # [B, T, m]

        def queries_of(flat: torch.Tensor) -> torch.Tensor:
            replace = {module: part.reshape(out.shape) for (module, out), part in
                       zip(projections, flat.split(widths, -1), strict=True)}
            found: list[AttentionCall] = []
            try:
                with attention_calls_recorded(found.append, stop=True):  # nothing after the queries
                    run(replace)
            except _Stop:
                pass
            return self._one_call(found).queries

        _, heads, length, dim = call.queries.shape
        columns = self._columns
        if columns is None:
            supports = self._supports(queries_of, u, heads)
            if all(len(s) == len(supports[0]) for s in supports) and \
                    len(torch.cat(supports).unique()) == sum(len(s) for s in supports):
                columns = torch.stack(supports)  # [H, n]: disjoint blocks, one per head
            else:
                columns = torch.cat(supports).unique()[None]  # [1, m]: every column any head reads, shared
            if length > 1:  # one position may hide a column (a rotation by angle 0): found again next time
                self._columns = columns

        def query_jacobian(head: int) -> torch.Tensor:
            """``[B, T, p, n]`` D_t of one head: one forward-mode product per column it reads."""
            read = columns[head if columns.shape[0] > 1 else 0]
            out = call.queries.new_empty(call.queries.shape[0], length, dim, read.shape[0])
            with torch.no_grad():
                for c in range(read.shape[0]):
                    tangent = torch.zeros_like(u)
                    tangent[..., read[c]] = 1.0
                    out[..., c] = torch.func.jvp(queries_of, (u,), (tangent,))[1][:, head]
            return out
        if columns.shape[0] == 1:
            query_inputs = u[..., columns[0]].unsqueeze(1)
        else:
            query_inputs = u[..., columns].permute(0, 2, 1, 3)  # [B, T, H, n] -> [B, H, T, n]
        mask = segment.mask
        valid = None
        if joined_mask and mask is not None and mask.shape[1] >= length:
            valid = mask[:, -length:].bool()
        scale = call.scaling if call.scaling is not None else dim**-0.5
        return AttentionBatch(segment.ids, valid, call.queries.detach(), call.keys.detach(), float(scale),
                              None if not call.softcap else float(call.softcap), call.sliding_window,
                              query_inputs, query_jacobian,
                              None if call.sinks is None else call.sinks.detach().reshape(-1))

    def _one_call(self, calls: list[AttentionCall]) -> AttentionCall:
        mine = [call for call in calls if call.module is self.module]
        if len(mine) != 1:
            raise UnsupportedModelError(f"{type(self.module).__name__} called the attention interface {len(mine)} times in one "
                             "forward (one expected)")
        return mine[0]

    @staticmethod
    def _supports(queries_of: Callable[[torch.Tensor], torch.Tensor], u: torch.Tensor, heads: int) -> list[torch.Tensor]:
        """Per query head, the columns of u its queries depend on (one vector-Jacobian product per head, with a fixed
        random cotangent: a column is read when its gradient is nonzero anywhere)."""
        queries, pullback = torch.func.vjp(queries_of, u)
        generator = torch.Generator(device="cpu").manual_seed(0)
        cotangent = torch.rand(queries.shape, generator=generator, dtype=queries.dtype).to(queries.device) + 0.5
        supports = []
        for head in range(heads):
            only = torch.zeros_like(cotangent)
            only[:, head] = cotangent[:, head]
            (grad,) = pullback(only)
            supports.append(torch.nonzero(grad.detach().ne(0).flatten(0, -2).any(0)).squeeze(-1))
        return supports



class AttentionRows:
    """Bookkeeping of one ``loglikelihood`` call for a :class:`~lm_eval_probes.api.FirstAttention` request, beside
    HFLM's own batching.

    HFLM answers each row's requests (:meth:`on_answer`, from ``cache_hook.add_partial``) after the row's forward;
    ``locate`` (:meth:`~lm_eval_probes.capture.loglikelihood.LoglikelihoodRows.locate`) names the request's row in
    that batch and its input length. The probe's per-position values of the batch are computed once, at its first
    answer; a request's record fields are those of the row's input positions ``[0, input length)``: its context and
    all but its last continuation token (what the model saw). Only the current batch's values are held.
    """

    def __init__(self, capture: FirstAttentionCapture, inputs: CapturedInputs, request: FirstAttention, *,
                 locate: Callable[[Any], tuple[int, int, int] | None], decode: Callable[[int], str],
                 traces: bool = False) -> None:
        self.capture, self.inputs, self.request, self.locate, self.decode = capture, inputs, request, locate, decode
        self.traces = traces
        self.fields: dict[Any, dict[str, Any]] = {}
        self._segment: _Segment | None = None
        self._batch: tuple[torch.Tensor, torch.Tensor] | None = None

    def on_answer(self, attr: str, request_key: Any, _answer: Any) -> None:
        located = self.locate(request_key) if attr == "loglikelihood" else None
        if located is None:
            return
        segment = self.inputs.latest()
        if segment is not self._segment:  # the first answer of a new batch
            self._segment = segment
            self._batch = (self.request.values(self.capture.batch(segment)), segment.ids.cpu())
        values, ids = self._batch
        row, input_length, _ = located
        self.fields[request_key] = response_fields(self.request, values[row, :input_length], ids[row, :input_length],
                                                   self.decode, traces=self.traces)


def response_fields(request: FirstAttention, values: torch.Tensor, token_ids: torch.Tensor, decode: Callable[[int], str],
                    *, traces: bool = False) -> dict[str, Any]:
    """One response's record fields from the per-position ``values`` of the n positions the model saw; with ``traces``
    (``probe_traces=true``) and a request that names :attr:`~lm_eval_probes.api.FirstAttention.trace`, also
    ``trace``: the values over every position (``nan``: none, ``null``) and ``sequence_tokens`` (the ids decoded one
    by one), for the wrapper to join into the response's trace."""
    fields = request.fields(values, token_ids, decode)
    if traces and request.trace is not None:
        fields["trace"] = {request.trace: trace_values(values.tolist()),
                           "sequence_tokens": [decode(int(token)) for token in token_ids.tolist()]}
    return fields


@dataclass(frozen=True)
class AttentionSpan:
    """One generation's per-position values over the positions the model saw: its (unpadded) prompt, then the
    generated tokens fed back (all but the last); :meth:`fields` cuts them to the kept tokens."""

    values: torch.Tensor
    token_ids: torch.Tensor
    prompt_tokens: int

    def fields(self, request: FirstAttention, kept: int, decode: Callable[[int], str], *,
               traces: bool = False) -> dict[str, Any]:
        """The record fields of the prompt and the first ``kept − 1`` kept tokens (the inputs of the kept span)."""
        stop = self.prompt_tokens + max(kept, 1) - 1
        return response_fields(request, self.values[:stop], self.token_ids[:stop], decode, traces=traces)


def attention_spans(capture: FirstAttentionCapture, inputs: CapturedInputs, request: FirstAttention, prompt_len: int,
                    bounds: Sequence[int]) -> list[AttentionSpan]:
    """Per row of one (left-padded) ``generate`` batch, the values of its real positions up to its bound."""
    batch = capture.joined(inputs)
    values, ids = request.values(batch), batch.ids.cpu()
    mask = inputs.segments[-1].mask
    first = [0] * values.shape[0] if mask is None else (mask[:, :prompt_len] == 0).sum(-1).tolist()
    return [
        AttentionSpan(values[row, pad : prompt_len + bound - 1], ids[row, pad : prompt_len + bound - 1], prompt_len - pad)
        for row, (pad, bound) in enumerate(zip(first, bounds, strict=True))
    ]
