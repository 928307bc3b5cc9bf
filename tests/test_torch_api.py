"""``lm_eval_probes.stack_api``: each branch of a call whose API differs between torch releases, forced."""

from __future__ import annotations

import pytest
import torch

from lm_eval_probes import stack_api as torch_api
from lm_eval_probes.stack_api import bfloat16_terms, float32_products_emulated, matmul_float32


def _operands(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(3, 17, 300, generator=generator), 4 * torch.randn(300, 9, generator=generator)


def test_three_bfloat16_terms_hold_a_float32_value_exactly():
    x = torch.randn(1000, dtype=torch.float32) * torch.logspace(-20, 20, 1000)
    terms = bfloat16_terms(x, 3)
    assert all(term.dtype == torch.bfloat16 for term in terms)
    assert torch.equal(sum(term.double() for term in terms), x.double())
    assert bfloat16_terms(x.bfloat16(), 3)[0] is not None and len(bfloat16_terms(x.bfloat16(), 3)) == 1
    with pytest.raises(ValueError, match="terms"):
        bfloat16_terms(x, 0)


@pytest.mark.parametrize("native", [False, True])
def test_both_branches_give_float32_products(native):
    """The device's float32 product and the tensor-core path (bfloat16 terms, float32 accumulation; emulated here where
    the device has no ``out_dtype`` kernel) agree with float64 to float32's rounding, with broadcast leading dims."""
    a, b = _operands()
    want = a.double() @ b.double()
    with float32_products_emulated():
        got = matmul_float32(a, b, native=native)
    assert got.dtype == torch.float32 and got.shape == want.shape
    error = float((got.double() - want).abs().max() / want.abs().max())
    assert error < 2e-6, error
    bf16_weight = b.bfloat16()  # a bfloat16 operand is one term: 3 products, still float32's precision
    with float32_products_emulated():
        got = matmul_float32(a, bf16_weight, native=native)
    assert float((got.double() - a.double() @ bf16_weight.double()).abs().max() / want.abs().max()) < 2e-6


def test_two_terms_keep_sixteen_bits():
    a, b = _operands(1)
    want = a.double() @ b.double()
    with float32_products_emulated():
        got = matmul_float32(a, b, terms=2, native=True)
    assert 1e-7 < float((got.double() - want).abs().max() / want.abs().max()) < 5e-5


@pytest.mark.parametrize("batched", [False, True])
def test_the_native_branch_calls_out_dtype(monkeypatch, batched):
    """The native branch is ``torch.mm`` (``b`` a matrix: ``a``'s leading dims folded into its rows, no copy of ``b``)
    or ``torch.bmm`` with ``out_dtype=torch.float32`` (seen by the emulating mode)."""
    name = "bmm" if batched else "mm"
    seen = []
    real = getattr(torch, name)

    def spy(*args, **kwargs):
        seen.append((args[1].shape, kwargs.get("out_dtype")))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, name, spy)
    a, b = _operands()
    b = b.expand(3, *b.shape) if batched else b
    with float32_products_emulated():
        matmul_float32(a, b, native=True)
    assert seen[0][1] == torch.float32  # then the emulation's own float32 product
    assert seen[0][0][-2] == 6 * 300  # the 6 pairs of terms side by side: one product


def test_detection_per_device_and_inside_the_emulation(monkeypatch):
    monkeypatch.setattr(torch_api, "_NATIVE", {})
    native = torch_api.float32_products_native("cpu")
    try:
        torch.mm(torch.ones(1, 1, dtype=torch.bfloat16), torch.ones(1, 1, dtype=torch.bfloat16), out_dtype=torch.float32)
        expected = True
    except (TypeError, RuntimeError, NotImplementedError):
        expected = False
    assert native is expected
    with float32_products_emulated():
        assert torch_api.float32_products_native("cpu")
    assert torch_api.float32_products_native("cpu") is expected
    a, b = _operands()  # the default follows the device
    torch.testing.assert_close(matmul_float32(a, b), matmul_float32(a, b, native=expected))
