"""The first softmax-attention layer of a model whose layers compute their attention themselves instead of calling
transformers' attention interface (BLOOM's ALiBi ``baddbmm``, XGLM, GPT-NeoX-Japanese, GPT-Neo, TrOCR, GPT-1): found,
and stopped in its re-runs, at the softmax its own code calls, for :class:`~lm_eval_probes.capture.attention.FirstAttentionCapture`.

Both are read through a :class:`torch.overrides.TorchFunctionMode` that sees every torch call of the layer's forward
(only while that module runs):

* :func:`first_own_attention`: in a forward of a few tokens, the first softmax over the last axis whose input is
  ``[..., N, N]`` with N ≥ T (N > T: positions of the layer's own before the input's, CPM-Ant's prompt) and which
  follows a product (``matmul``, ``bmm``, ``baddbmm``, ``@``) of the same module with as many entries; the layer is the
  innermost module with parameters that is running then (the module that holds the projections, not a parameterless
  ``nn.Softmax`` or a core-attention helper).
* :meth:`OwnAttention.recorded`: in the capture's re-runs of that layer, the first product ``A @ B`` of its forward with
  ``A [..., T, p]`` and ``B [..., p, T]`` (T the positions the layer was handed) is its queries and transposed keys
  (``[B·H, T, p]`` is read as ``[B, H, T, p]``, B the rows of the layer's input); the run stops there when only the
  queries are asked for (the query map's Jacobian), else at the softmax, whose input ``z`` gives the rest of the
  logits: ``z = c · q·k + b``. The scale ``c`` (everything the code multiplies the product by: ``baddbmm``'s ``alpha``,
  a division by √p after it; 1 where the queries were scaled before it) is found once, in the load's float64 re-run, by
  running the code between the product and the softmax a second time on the product of ``2A`` (each op that reads the
  product, or a tensor computed from it, is repeated on its shadow): ``z' − z = c · A@B`` at every entry the logits
  read the product at. The bias ``b = z − c · q·k`` (BLOOM's ALiBi, the causal and padding masks as the layer applies
  them: added, ``torch.where``, ``w·b − 10⁴(1 − b)``) is handed to the margins as a float mask added to the logits.

Self-checked at load (:meth:`OwnAttention.check`, beside the capture's check of the queries): every entry of the
float64 re-run's softmax input above float16's lowest value (masked entries hold their dtype's lowest) changes by
``c · q·k`` or not at all when the queries double (the bias reads no query), and the weights softmax(c·q·k + b) from
the re-run's queries, keys, scale and bias reproduce the layer's own attention weights in its own forward (1e-4 in
float32, 0.05 in bfloat16); otherwise the margins are refused in one line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["OwnAttention", "first_own_attention"]

_PRODUCTS = frozenset({torch.matmul, torch.bmm, torch.baddbmm, torch.Tensor.matmul, torch.Tensor.__matmul__,
                       torch.Tensor.bmm, torch.Tensor.baddbmm})
_SOFTMAXES = frozenset({torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax, torch.special.softmax})
_MASKED = torch.finfo(torch.float16).min
"""An entry of the logits at or below this is masked (the margins' convention: transformers' masked entry is its
dtype's lowest value)."""


class _Stop(Exception):
    """Ends a forward at the layer's softmax (or at its query-key product)."""


def _operands(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> tuple[Any, Any, Callable[[torch.Tensor], Any]] | None:
    """The product's ``A`` and ``B`` and a call of ``func`` with another ``A`` (``None``: not two tensors)."""
    if func in (torch.baddbmm, torch.Tensor.baddbmm):
        rest = list(args[1:])
        a = rest.pop(0) if rest else kwargs.get("batch1")
        b = rest.pop(0) if rest else kwargs.get("batch2")
        others = {key: value for key, value in kwargs.items() if key not in ("batch1", "batch2")}
        call = lambda other: func(args[0], other, b, *rest, **others)  # noqa: E731
    else:
        a = args[0] if args else kwargs.get("input")
        b = args[1] if len(args) > 1 else kwargs.get("other", kwargs.get("mat2"))
        others = {key: value for key, value in kwargs.items() if key not in ("input", "other", "mat2")}
        call = lambda other: func(other, b, *args[2:], **others)  # noqa: E731
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return None
    return a, b, call


def _softmax_input(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """A softmax's input when it runs over the last axis (``None``: another axis, or not a tensor)."""
    z = args[0] if args else kwargs.get("input")
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if not isinstance(z, torch.Tensor) or dim is None or dim not in (-1, z.ndim - 1):
        return None
    return z


def _has_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


class _FirstSoftmax(TorchFunctionMode):
    """:func:`first_own_attention`'s mode: per module on the stack, its products' entry counts; stops at the first
    softmax over ``[..., T, T]`` that follows a product of as many entries in the same module."""

    def __init__(self, stack: list[nn.Module], length: int) -> None:
        super().__init__()
        self.stack, self.length = stack, length
        self.products: dict[int, list[int]] = {}
        self.found: nn.Module | None = None

    def _layer(self) -> nn.Module | None:
        return next((module for module in reversed(self.stack) if _has_parameters(module)), None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _PRODUCTS and isinstance(out, torch.Tensor) and self._layer() is not None:
            self.products.setdefault(id(self._layer()), []).append(out.numel())
        elif func in _SOFTMAXES:
            z = _softmax_input(func, args, kwargs)
            layer = self._layer()
            if z is not None and layer is not None and z.ndim >= 3 and z.shape[-1] == z.shape[-2] >= self.length \
                    and z.numel() in self.products.get(id(layer), ()):
                self.found = layer  # over more positions than the input's: its own before them (CPM-Ant's prompt)
                raise _Stop
        return out


@torch.no_grad()
def first_own_attention(model: nn.Module, ids: torch.Tensor) -> nn.Module | None:
    """The first module of ``model`` that computes softmax attention itself (see the module docstring), in a forward
    of ``ids`` ``[1, T]`` (a few tokens); ``None``: none does."""
    stack: list[nn.Module] = []

    def left(_module: nn.Module, _args: Any, _out: Any) -> None:
        stack.pop()

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(lambda m, _args: stack.append(m)))
        handles.append(module.register_forward_hook(left))
    mode = _FirstSoftmax(stack, ids.shape[1])
    try:
        with mode:
            model(input_ids=ids, use_cache=False)
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return mode.found


class _Recording(TorchFunctionMode):
    """:meth:`OwnAttention.recorded`'s mode (see the module docstring)."""

    def __init__(self, owner: OwnAttention, record: Callable[[Any], None], early: bool) -> None:
        super().__init__()
        self.owner, self.record, self.early = owner, record, early
        self.inside = False
        self.rows = self.positions = 0
        self.dtype = torch.float32
        self.product: tuple[torch.Tensor, torch.Tensor] | None = None
        self.shadows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def entered(self, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if isinstance(hidden, torch.Tensor) and hidden.ndim == 3:
            self.inside, self.rows, self.positions = True, hidden.shape[0], hidden.shape[1]
            self.dtype = hidden.dtype
            if hidden.dtype == torch.float64:  # a float64 re-run: tensors its code makes are float64 too (XGLM's
                torch.set_default_dtype(torch.float64)  # lowest-value fill would not fit a float32)

    def _heads(self, value: torch.Tensor, own: bool) -> torch.Tensor:
        """``[B, H, n, ·]`` from ``[B, H, n, ·]`` or ``[B·H, n, ·]``, in float64 (``own``: in the layer's input dtype
        where that is narrower — GPT-Neo upcasts its bfloat16 queries to float32 —, so the load's check of the queries
        takes the model's precision)."""
        if value.ndim == 3 and value.shape[0] % self.rows == 0:
            value = value.unflatten(0, (self.rows, -1))
        if value.ndim != 4 or value.shape[0] != self.rows:
            raise ValueError(f"its query-key product's operand {tuple(value.shape)} is not [rows, heads, positions, "
                             "width] or [rows · heads, positions, width]")
        if own:
            narrow = torch.finfo(self.dtype).eps > torch.finfo(value.dtype).eps if value.is_floating_point() else False
            return value.to(self.dtype) if narrow else value
        return value.double()

    def _shadowed(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Repeat ``func`` on the shadows of the tensors it read that come from the product."""
        leaves, _ = tree_flatten((args, kwargs))
        if not any(isinstance(leaf, torch.Tensor) and self.shadows.get(id(leaf), (None,))[0] is leaf for leaf in leaves):
            return

        def shadow(value: Any) -> Any:
            known = self.shadows.get(id(value)) if isinstance(value, torch.Tensor) else None
            return known[1] if known is not None and known[0] is value else value

        shadow_args, shadow_kwargs = tree_map(shadow, (args, kwargs))
        shadow_out = func(*shadow_args, **shadow_kwargs)
        outs, _ = tree_flatten(out)
        shadow_outs, _ = tree_flatten(shadow_out)
        for value, other in zip(outs, shadow_outs):
            if isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor):
                self.shadows[id(value)] = (value, other)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.inside:
            return func(*args, **kwargs)
        if func in _PRODUCTS and self.product is None:
            operands = _operands(func, args, kwargs)
            if operands is not None:
                a, b, call = operands
                if a.ndim >= 3 and a.ndim == b.ndim and a.shape[-2] == self.positions == b.shape[-1] \
                        and a.shape[-1] == b.shape[-2]:
                    own = self.owner.keep_weights  # the layer's own forward: its queries in its own dtype
                    queries, keys = self._heads(a, own), self._heads(b.transpose(-1, -2), own)
                    self.product = (queries, keys)
                    if self.early:
                        self.record(self.owner.call(queries, keys, None))
                        raise _Stop
                    out = call(a)
                    if self.owner.scale is None and not self.owner.keep_weights:
                        self.shadows[id(out)] = (out, call(2 * a))
                    return out
        if func in _SOFTMAXES and self.product is not None:
            z = _softmax_input(func, args, kwargs)
            if z is not None:
                queries, keys = self.product
                if self.owner.keep_weights:  # the layer's own forward (the load's check): its weights, no bias
                    self.record(self.owner.call(queries, keys, None, func(*args, **kwargs)))
                    raise _Stop
                known = self.shadows.get(id(z))
                shadow = known[1] if known is not None and known[0] is z else None
                self.record(self.owner.call(queries, keys, self.owner.bias(z, queries, keys, shadow)))
                raise _Stop
        out = func(*args, **kwargs)
        if self.shadows:
            self._shadowed(func, args, kwargs, out)
        return out


def _logits(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, S]`` q·k, keys ``[B, KV, S, p]`` shared by H / KV query heads."""
    if keys.shape[1] != queries.shape[1]:
        keys = keys.repeat_interleave(queries.shape[1] // keys.shape[1], 1)
    return queries @ keys.transpose(-1, -2)


class OwnAttention:
    """A layer that computes its attention itself (:func:`first_own_attention`): its recorded calls (:meth:`recorded`),
    its logit scale (found at load), its self-check (:meth:`check`)."""

    def __init__(self, module: nn.Module, make_call: Callable[..., Any]) -> None:
        """``make_call(module, queries, keys, scaling, softcap, sliding_window, sinks, mask)``: one recorded call
        (:class:`~lm_eval_probes.capture.attention_calls.AttentionCall`)."""
        self.module, self.make_call = module, make_call
        self.scale: float | None = None
        self.keep_weights = False
        self.weights: torch.Tensor | None = None

    def call(self, queries: torch.Tensor, keys: torch.Tensor, bias: torch.Tensor | None,
             weights: torch.Tensor | None = None) -> Any:
        if weights is not None:
            self.weights = weights.detach()
        return self.make_call(self.module, queries, keys, self.scale, None, None, None, bias)

    def bias(self, z: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, shadow: torch.Tensor | None) -> torch.Tensor:
        """``[B, H, T, S]`` b = z − c · q·k (float64); finds c from the shadow at its first call (the module docstring)."""
        product = _logits(queries, keys)
        if z.numel() != product.numel():
            raise ValueError(f"its softmax's input {tuple(z.shape)} does not hold one logit per query-key product "
                             f"{tuple(product.shape)}")
        z = z.reshape(product.shape).double()
        if self.scale is None:
            if shadow is None:
                raise ValueError("its softmax's input is not computed from its query-key product")
            change = shadow.reshape(product.shape).double() - z
            live = (z > _MASKED) & (change != 0)
            if not bool(live.any()):
                raise ValueError("its softmax's input does not change with its queries")
            scale = float((change[live] * product[live]).sum() / product[live].pow(2).sum())
            error = float((change[live] - scale * product[live]).abs().max())
            if not error <= 1e-5 * max(float((scale * product[live]).abs().max()), 1e-30):
                raise ValueError(f"its logits are not c · q·k plus a bias that reads no query (off by {error:.1e})")
            self.scale = scale
        return product.mul_(-self.scale).add_(z)  # in place: one [B, H, T, S] beside the layer's own logits

    @contextmanager
    def recorded(self, record: Callable[[Any], None], *, stop: bool = True, early: bool = False) -> Iterator[None]:
        """While the block runs, the layer's forward records its call with ``record`` and stops (see the module
        docstring); ``early``: at the query-key product (queries and keys only)."""
        if not stop:
            raise ValueError("a layer that computes its attention itself is only recorded up to its softmax")
        mode = _Recording(self, record, early)
        handle = self.module.register_forward_pre_hook(mode.entered, with_kwargs=True)
        default = torch.get_default_dtype()
        try:
            with mode:
                yield
        except _Stop:
            pass
        finally:
            handle.remove()
            torch.set_default_dtype(default)

    def check(self, row: Any, weights: torch.Tensor | None, tolerance: float) -> None:
        """The weights softmax(c·q·k + b) of ``row`` (:class:`~lm_eval_probes.capture.attention.AttentionRow`, the
        float64 re-run of the first row) reproduce the layer's own, ``weights`` ``[B, H, T, T]`` of its own forward."""
        if weights is None or row.mask is None:
            raise ValueError("its own attention weights or its bias were not recorded")
        logits = row.scale * _logits(row.queries[None], row.keys[None])[0] + row.mask
        got = torch.softmax(logits.masked_fill(row.mask <= _MASKED, -math.inf), -1)
        want = weights.reshape(-1, *got.shape)[0].double()  # [B, H, T, T] or [B · H, T, T]
        error = float((got - want).abs().max())
        if not error <= tolerance:
            raise ValueError(f"its float64 re-run's attention weights (queries, keys, scale {row.scale:.4g} and bias) "
                             f"are {error:.1e} from its own")
