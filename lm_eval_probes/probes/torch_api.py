"""The torch calls whose API differs between the torch releases the project supports, in one place.

Products with a float32 result from bfloat16 inputs: ``torch.mm`` / ``torch.bmm`` with ``out_dtype=torch.float32``
(CUDA's tensor cores: bfloat16 products accumulated and returned in float32; the keyword is absent from older torch
releases and has no CPU kernel in torch 2.13). :func:`float32_products_native` says whether a device has them;
:func:`matmul_float32` is the product every probe's large work goes through:

* where the device has them, each operand is split into bfloat16 terms (:func:`bfloat16_terms`: x = x₁ + x₂ + x₃,
  each the bfloat16 rounding of what the previous left, 24 significant bits in all: float32's) and the products of
  the terms whose orders sum below ``terms`` are accumulated in float32 — 6 products for two float32 operands, 3
  when one is bfloat16 already (a bfloat16 model's weights), 1 when both are;
* elsewhere, the float32 product of the same float32 values.

Both are float32 products of float32-exact inputs, accumulated in float32: they agree to float32's rounding
(``tests/test_torch_api.py``). :func:`float32_products_emulated` runs the first branch on any device (a
``TorchDispatchMode`` computing ``mm``/``bmm`` with ``out_dtype`` from the float32 values): the GPU's path, taken
on a CPU to count or test it.

This module imports torch only: it lives with the probes' math (the lowest layer, ``tests/test_layout.py``), which uses
it, as do the capture's products.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["bfloat16_terms", "float32_products_emulated", "float32_products_native", "matmul_float32"]

_NATIVE: dict[str, bool] = {}
_EMULATED: list[bool] = []


def float32_products_native(device: torch.device | str) -> bool:
    """Whether ``torch.mm(a, b, out_dtype=torch.float32)`` runs for bfloat16 ``a``, ``b`` on ``device`` (tried once
    per device type; ``True`` inside :func:`float32_products_emulated`)."""
    if _EMULATED:
        return True
    kind = torch.device(device).type
    if kind not in _NATIVE:
        try:
            one = torch.ones(1, 1, dtype=torch.bfloat16, device=device)
            _NATIVE[kind] = torch.mm(one, one, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):  # older torch: no keyword; no kernel for the device
            _NATIVE[kind] = False
    return _NATIVE[kind]


def bfloat16_terms(x: Tensor, terms: int = 3) -> list[Tensor]:
    """x as a sum of up to ``terms`` bfloat16 tensors, largest first (each the bfloat16 rounding of what the previous
    left): 3 terms hold float32's 24 significant bits; a bfloat16 tensor is one term."""
    if terms < 1:
        raise ValueError(f"terms must be >= 1, got {terms}")
    if x.dtype == torch.bfloat16:
        return [x]
    rest = x if x.dtype == torch.float32 else x.float()
    out = []
    for index in range(terms):
        piece = rest.to(torch.bfloat16)
        out.append(piece)
        if index < terms - 1:
            rest = rest - piece  # float32 − bfloat16: exact, in float32
    return out


def _product(a: Tensor, b: Tensor) -> Tensor:
    if a.ndim == 2:
        return torch.mm(a, b, out_dtype=torch.float32)
    return torch.bmm(a, b, out_dtype=torch.float32)


def matmul_float32(a: Tensor, b: Tensor, *, terms: int = 3, native: bool | None = None) -> Tensor:
    """``a @ b`` in float32 (see the module docstring): ``a`` ``[..., m, k]``, ``b`` ``[k, n]`` or ``[..., k, n]``
    (leading dimensions broadcast; a 2-D ``b``, a weight matrix, is never copied per leading index). ``terms``:
    bfloat16 terms per float32 operand on the native path (3: float32's precision; 2: 16 significant bits, 3
    products instead of 6). ``native``: force a branch (``None``: the device's)."""
    if native is None:
        native = float32_products_native(a.device)
    if not native:
        return torch.matmul(a.float() if a.dtype != torch.float32 else a, b.float() if b.dtype != torch.float32 else b)
    if b.ndim == 2:  # rows of a against one matrix: one 2-D product chain
        out = _pairs(a.reshape(-1, a.shape[-1]), b, terms)
        return out.reshape(*a.shape[:-1], b.shape[-1])
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    flat_a = a.expand(*lead, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    flat_b = b.expand(*lead, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    return _pairs(flat_a, flat_b, terms).reshape(*lead, a.shape[-2], b.shape[-1])


def _pairs(a: Tensor, b: Tensor, terms: int) -> Tensor:
    """Σ a_i b_j over the bfloat16 terms with i + j < ``terms``, accumulated in float32."""
    left, right = bfloat16_terms(a, terms), bfloat16_terms(b, terms)
    pairs = [(i, j) for i in range(len(left)) for j in range(len(right)) if i + j < terms]
    if len(left) == 1 or len(right) == 1:  # one side is bfloat16 already (a model's weight): no copy of it
        out = None
        for i, j in reversed(pairs):  # smallest terms first
            part = _product(left[i], right[j])
            out = part if out is None else out.add_(part)
        return out
    # Σ a_i b_j as one product over the pairs laid side by side: one launch, one float32 accumulation
    return _product(torch.cat([left[i] for i, _ in pairs], -1), torch.cat([right[j] for _, j in pairs], -2))


class float32_products_emulated:  # noqa: N801  (used as a function: ``with float32_products_emulated():``)
    """While the block runs, :func:`matmul_float32` takes the native branch on any device, and ``mm`` / ``bmm`` with
    ``out_dtype`` are computed from their inputs' float32 values where the device has no kernel for them (a
    ``TorchDispatchMode``: enter it outside any counting mode, so that a counter sees the bfloat16 products)."""

    def __enter__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        aten = torch.ops.aten

        class Emulated(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                kwargs = dict(kwargs or {})
                if func in (aten.mm.dtype, aten.bmm.dtype):
                    dtype = kwargs.pop("out_dtype", args[2] if len(args) > 2 else torch.float32)
                    product = torch.mm if func is aten.mm.dtype else torch.bmm
                    return product(args[0].float(), args[1].float()).to(dtype)
                return func(*args, **kwargs)

        self._mode = Emulated()
        _EMULATED.append(True)
        self._mode.__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            self._mode.__exit__(*exc)
        finally:
            _EMULATED.pop()
