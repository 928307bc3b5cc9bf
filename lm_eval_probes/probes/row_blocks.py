"""Products with a matrix ``W [V, d]`` in a higher precision than W's own, a block of its rows at a time.

A bfloat16 model's unembedding is read by the lens in float32. A float32 copy of W costs 4·V·d bytes (1.96 GiB for
Llama-3-8B's 128256 × 4096, 2.5 GiB for Gemma-3's 262144 × 2560), more than the bound of a probe's memory; a
:class:`RowBlocks` converts at most :data:`ROW_BLOCK_ELEMENTS` of W's values at a time into one reused buffer instead
(64 MiB in float32). A W that already has the working precision is used as it is, as one block: no copy and the same
products (bit for bit) as a plain ``x @ W.T`` and ``c @ W``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = ["ROW_BLOCK_ELEMENTS", "TENSOR_CORE_BLOCK_ROWS", "RowBlocks"]

ROW_BLOCK_ELEMENTS = 1 << 24
"""The most values of W converted at a time (64 MiB in float32, 128 MiB in float64)."""


TENSOR_CORE_BLOCK_ROWS = 1 << 16
"""Rows of W per float32-accumulated sum of :meth:`RowBlocks.weighted_sum` on tensor cores (summed in float64)."""


class RowBlocks:
    """``weight [V, d]`` read in ``dtype``, a block of rows at a time.

    Args:
        weight: the matrix (any floating dtype; not copied).
        dtype: the precision of the products (float32 or float64).
        block_elements: the most values of ``weight`` converted at a time (a block has at least one row).
    """

    def __init__(self, weight: Tensor, dtype: torch.dtype, *, block_elements: int = ROW_BLOCK_ELEMENTS) -> None:
        if weight.ndim != 2 or not torch.is_floating_point(weight):
            raise ValueError(f"weight must be a floating-point [V, d] matrix, got {weight.dtype} {tuple(weight.shape)}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"the products run in float32 or float64, got {dtype}")
        if block_elements < 1:
            raise ValueError(f"block_elements must be >= 1, got {block_elements}")
        self.weight = weight
        self.dtype = dtype
        vocab, d = weight.shape
        self.block_rows = vocab if weight.dtype == dtype else min(vocab, max(1, block_elements // max(d, 1)))
        self._buffer: Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    @property
    def device(self) -> torch.device:
        return self.weight.device

    @property
    def converts(self) -> bool:
        """Whether W is read through the buffer (its dtype differs from the products')."""
        return self.weight.dtype != self.dtype

    def blocks(self) -> Iterator[tuple[int, int, Tensor]]:
        """``(start, stop, W[start:stop] in dtype)`` for consecutive blocks of rows. With a conversion, every block
        is a view of the same buffer: use it before asking for the next one."""
        vocab = self.weight.shape[0]
        if not self.converts:
            yield 0, vocab, self.weight
            return
        if self._buffer is None:
            self._buffer = torch.empty(self.block_rows, self.weight.shape[1], dtype=self.dtype, device=self.device)
        for start in range(0, vocab, self.block_rows):
            stop = min(vocab, start + self.block_rows)
            block = self._buffer[: stop - start]
            block.copy_(self.weight[start:stop])
            yield start, stop, block

    def rows(self, index: Tensor) -> Tensor:
        """``W[index]`` in ``dtype``."""
        return self.weight[index].to(self.dtype)

    @property
    def tensor_cores(self) -> bool:
        """Whether the products run as bfloat16 terms with float32 accumulation (:mod:`lm_eval_probes.stack_api`): float32 products
        with a bfloat16 W, on a device that has them (W is one term, never converted; x three)."""
        from lm_eval_probes.stack_api import float32_products_native

        return self.dtype == torch.float32 and self.weight.dtype == torch.bfloat16 and \
            float32_products_native(self.weight.device)

    def times_transposed(self, x: Tensor, *, out: Tensor | None = None) -> Tensor:
        """``x [N, d] @ Wᵀ`` → ``[N, V]`` in ``dtype`` (written into ``out`` when given). Each entry is one dot
        product over d, the same whichever block its row of W was in."""
        if self.tensor_cores:
            from lm_eval_probes.stack_api import matmul_float32

            product = matmul_float32(x, self.weight.T)
            return product if out is None else out.copy_(product)
        x = x.to(self.dtype)
        if not self.converts:
            return torch.matmul(x, self.weight.T) if out is None else torch.matmul(x, self.weight.T, out=out)
        if out is None:
            out = torch.empty(*x.shape[:-1], self.weight.shape[0], dtype=self.dtype, device=x.device)
        for start, stop, block in self.blocks():
            out[..., start:stop] = x @ block.T
        return out

    def weighted_sum(self, coefficients: Tensor) -> Tensor:
        """``coefficients [N, V] @ W`` → ``[N, d]``: one product in ``dtype`` when W is not converted; otherwise
        the blocks' products (in ``dtype``) summed in float64."""
        if coefficients.shape[-1] != self.weight.shape[0]:
            raise ValueError(f"coefficients must have {self.weight.shape[0]} columns, got {tuple(coefficients.shape)}")
        if not self.converts:
            return coefficients @ self.weight
        total = torch.zeros(*coefficients.shape[:-1], self.weight.shape[1], dtype=torch.float64, device=coefficients.device)
        if self.tensor_cores:  # a block of W's rows at a time as it is (bfloat16), each block's sum in float32
            from lm_eval_probes.stack_api import matmul_float32

            rows = max(self.block_rows, TENSOR_CORE_BLOCK_ROWS)  # nothing converted: only the sums' blocks
            for start in range(0, self.weight.shape[0], rows):
                stop = min(self.weight.shape[0], start + rows)
                total += matmul_float32(coefficients[..., start:stop], self.weight[start:stop]).to(torch.float64)
            return total
        for start, stop, block in self.blocks():
            total += (coefficients[..., start:stop] @ block).to(torch.float64)
        return total
