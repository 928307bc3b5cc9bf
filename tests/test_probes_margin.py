"""Stability margins of the embedding-level attention prior, each against an independent computation."""

from __future__ import annotations

import math

import pytest
import torch

from lm_eval_probes.probes.margin.math import (
    attention_covariance,
    head_margins,
    prefix_attention_weights,
    prior_jacobian,
    prior_margins,
    prior_margins_direct,
    rotate_half,
    scalar_prior_jacobian,
    support_tokens,
)


def random_prior(seed: int, *, length: int = 9, d: int = 6, p: int = 4, scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(length, d, generator=gen, dtype=torch.float64)
    w_q = scale * torch.randn(p, d, generator=gen, dtype=torch.float64)
    w_k = scale * torch.randn(p, d, generator=gen, dtype=torch.float64)
    return x, w_q, w_k


def residual_at(x: torch.Tensor, t: int, w_q: torch.Tensor, w_k: torch.Tensor):
    """e_t(x_t) = x_t − Σ_{s<t} softmax_s(x_tᵀW_QᵀW_K x_s/√p) x_s with the prefix held fixed (written from the paper)."""
    prefix = x[:t]
    p = w_q.shape[0]

    def residual(xt: torch.Tensor) -> torch.Tensor:
        logits = torch.stack([(w_q @ xt) @ (w_k @ xs) / math.sqrt(p) for xs in prefix])
        alpha = torch.softmax(logits, 0)
        return xt - (alpha[:, None] * prefix).sum(0)

    return residual


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_autograd_jacobian_of_the_residual_is_identity_minus_sigma_a(seed):
    x, w_q, w_k = random_prior(seed)
    jac = prior_jacobian(x, w_q, w_k)
    for t in range(1, x.shape[0]):
        expected = torch.autograd.functional.jacobian(residual_at(x, t, w_q, w_k), x[t])
        torch.testing.assert_close(jac[t], expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(jac[0], torch.eye(x.shape[1], dtype=torch.float64))


def test_attention_covariance_by_explicit_sums():
    x, w_q, w_k = random_prior(3)
    weights = prefix_attention_weights(x @ w_q.T, x @ w_k.T, scale=0.5)
    cov = attention_covariance(x, weights)
    for t in range(1, x.shape[0]):
        mean = sum(weights[t, s] * x[s] for s in range(t))
        expected = sum(weights[t, s] * torch.outer(x[s] - mean, x[s] - mean) for s in range(t))
        torch.testing.assert_close(cov[t], expected)
        assert float(weights[t, t:].abs().sum()) == 0.0 and math.isclose(float(weights[t].sum()), 1.0)
    assert float(weights[0].abs().sum()) == 0.0


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("scale", [0.3, 1.0, 3.0])
def test_slogdet_and_sylvester_forms_agree(seed, scale):
    x, w_q, w_k = random_prior(seed, length=12, d=7, p=3, scale=scale)
    direct = prior_margins_direct(x, w_q, w_k)
    sylvester = prior_margins(x, w_q, w_k)
    assert math.isnan(float(sylvester[0])) and float(direct[0]) == 0.0  # no prefix: undefined vs det(I) = 1
    torch.testing.assert_close(sylvester[1:], direct[1:], rtol=1e-6, atol=1e-12)


def test_scalar_case_is_one_minus_a_var():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(10, 1, generator=gen, dtype=torch.float64)
    w_q, w_k = torch.tensor([[1.7]], dtype=torch.float64), torch.tensor([[-0.9]], dtype=torch.float64)
    a = float(w_k * w_q)  # p = 1: √p = 1
    weights = prefix_attention_weights(x @ w_q.T, x @ w_k.T, scale=1.0)
    mean = weights @ x[:, 0]
    var = weights @ x[:, 0] ** 2 - mean**2
    expected = scalar_prior_jacobian(a, var).abs().log()
    torch.testing.assert_close(prior_margins_direct(x, w_q, w_k)[1:], expected[1:])
    torch.testing.assert_close(prior_margins(x, w_q, w_k)[1:], expected[1:])


def test_batched_and_padded_margins_equal_single_sequences():
    x, w_q, w_k = random_prior(7, length=8)
    short = x[:5]
    batch = torch.zeros(2, 10, x.shape[1], dtype=torch.float64)
    batch[0, :8] = x  # right padding
    batch[1, 5:] = short  # left padding
    valid = torch.zeros(2, 10, dtype=torch.bool)
    valid[0, :8] = True
    valid[1, 5:] = True
    margins = prior_margins(batch, w_q, w_k, valid=valid)
    torch.testing.assert_close(margins[0, :8], prior_margins(x, w_q, w_k), equal_nan=True)
    torch.testing.assert_close(margins[1, 5:], prior_margins(short, w_q, w_k), equal_nan=True)
    assert torch.isnan(margins[0, 8:]).all() and torch.isnan(margins[1, :5]).all()


def rotation_matrix(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """R with R v = v·cos + rotate_half(v)·sin, built column by column."""
    p = cos.shape[0]
    eye = torch.eye(p, dtype=cos.dtype)
    return torch.stack([eye[i] * cos + rotate_half(eye[i]) * sin for i in range(p)], dim=1)


def test_rotary_head_margin_equals_the_d_by_d_jacobian_with_rotations():
    """Logits (R_t W_Q x_t + b_q)·(R_s (W_K x_s + b_k)) · scale: margins against autograd + a d×d slogdet."""
    gen = torch.Generator().manual_seed(11)
    length, d, p, scale = 7, 6, 4, 0.7
    x = torch.randn(length, d, generator=gen, dtype=torch.float64)
    w_q, w_k = torch.randn(p, d, generator=gen, dtype=torch.float64), torch.randn(p, d, generator=gen, dtype=torch.float64)
    b_q, b_k = torch.randn(p, generator=gen, dtype=torch.float64), torch.randn(p, generator=gen, dtype=torch.float64)
    inv_freq = 1.0 / (10.0 ** (torch.arange(0, p, 2, dtype=torch.float64) / p))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rot = [rotation_matrix(cos[t], sin[t]) for t in range(length)]
    keys = torch.stack([rot[s] @ (w_k @ x[s] + b_k) for s in range(length)])
    queries = torch.stack([rot[t] @ (w_q @ x[t] + b_q) for t in range(length)])
    weights = prefix_attention_weights(queries, keys, scale=scale)
    got = head_margins(x @ w_q.T + b_q, keys, weights, scale=scale, rotation=(cos, sin), chunk=3)
    for t in range(1, length):
        def residual(xt, t=t):
            logits = torch.stack([scale * (rot[t] @ (w_q @ xt + b_q)) @ keys[s] for s in range(t)])
            return xt - (torch.softmax(logits, 0)[:, None] * x[:t]).sum(0)

        jac = torch.autograd.functional.jacobian(residual, x[t])
        assert math.isclose(float(got[t]), float(torch.linalg.slogdet(jac).logabsdet), rel_tol=1e-6, abs_tol=1e-12)


def test_margins_of_a_subset_of_positions():
    x, w_q, w_k = random_prior(4, length=10)
    queries, keys = x @ w_q.T, x @ w_k.T
    weights = prefix_attention_weights(queries, keys, scale=0.5)
    full = head_margins(queries, keys, weights, scale=0.5)
    positions = torch.tensor([2, 5, 9])
    part = head_margins(queries, keys, weights[positions], scale=0.5, positions=positions)
    torch.testing.assert_close(part, full[positions])


def test_support_tokens_are_the_smallest_defined_margins():
    margins = torch.tensor([math.nan, 0.3, -2.0, 0.1, -2.0, 5.0, -0.5])
    assert support_tokens(margins, 3).tolist() == [2, 4, 6]
    assert support_tokens(margins, 10).tolist() == [2, 4, 6, 3, 1, 5]
    assert support_tokens(margins, 0).tolist() == []
    with pytest.raises(ValueError, match="k must be an int >= 0"):
        support_tokens(margins, -1)


def test_margin_reaches_the_degeneracy_boundary():
    """Scalar prior with a > 0: as Var_t → 1/a the margin → −∞ (the log-barrier)."""
    var = torch.tensor([0.0, 0.5, 0.9, 0.99, 0.999999], dtype=torch.float64)
    margins = scalar_prior_jacobian(1.0, var).abs().log()
    assert float(margins[0]) == 0.0 and torch.all(margins.diff() < 0) and float(margins[-1]) < -13


def test_validation_messages():
    x, w_q, w_k = random_prior(0)
    with pytest.raises(ValueError, match=r"w_q, w_k \[p, d\]"):
        prior_margins(x, w_q[:, :3], w_k)
    with pytest.raises(TypeError, match="floating-point"):
        prior_margins(x.long(), w_q, w_k)
    with pytest.raises(ValueError, match="weights"):
        head_margins(x[:, :4], x[:, :4], torch.zeros(3, 3, dtype=torch.float64), scale=1.0)


def _reference_head_margins(u, keys, weights, scale, cos, sin, norm):
    """Per head and position, in plain Python loops: the centred cross-covariance Σ_s α_ts (u_s − ū_t)(k_s − k̄_t)ᵀ,
    the rotation and the query norm's Jacobian as explicit p×p matrices, numpy's slogdet."""
    import numpy as np

    heads, length, dim = keys.shape
    half = dim // 2
    out = np.full((heads, length), np.nan)
    for h in range(heads):
        for t in range(length):
            alpha = weights[h, t].numpy()
            if alpha.sum() == 0:
                continue
            uu, kk = u[h].numpy(), keys[h].numpy()
            u_bar, k_bar = alpha @ uu, alpha @ kk
            cross = sum(alpha[s] * np.outer(uu[s] - u_bar, kk[s] - k_bar) for s in range(length))
            v, gain, eps = norm[0][h, t].numpy(), norm[1].numpy(), norm[2]
            r = math.sqrt(float(np.mean(v**2)) + eps)
            jacobian = np.diag(gain) @ (np.eye(dim) - np.outer(v, v) / (dim * r**2)) / r
            rotation = np.diag(cos[t].numpy())
            for i in range(half):  # rotate_half: (v₁, v₂) → (−v₂, v₁)
                rotation[i, i + half] = -sin[t, i].item()
                rotation[i + half, i] = sin[t, i + half].item()
            out[h, t] = np.linalg.slogdet(np.eye(dim) - scale * rotation @ jacobian @ cross)[1]
    return torch.from_numpy(out)


@pytest.mark.parametrize("work_elements", [1 << 23, 40])  # one block of prefix positions, or blocks of 2
def test_head_margins_equal_an_explicit_per_position_reference(monkeypatch, work_elements):
    """The blocked, causally cut, in-place evaluation of :func:`head_margins` against per-position loops (within
    1e-9 relative, 1e-12 absolute), with rotation, query norm, several heads and chunks."""
    import lm_eval_probes.probes.margin.math as margin

    monkeypatch.setattr(margin, "WORK_ELEMENTS", work_elements)
    generator = torch.Generator().manual_seed(5)
    heads, length, dim, scale = 3, 11, 4, 0.7
    u = torch.randn(heads, length, dim, generator=generator, dtype=torch.float64)
    keys = torch.randn(heads, length, dim, generator=generator, dtype=torch.float64)
    weights = prefix_attention_weights(u, keys, scale=scale)
    angles = torch.rand(length, dim // 2, generator=generator, dtype=torch.float64) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    norm = (u + 0.2, 1 + 0.3 * torch.randn(dim, generator=generator, dtype=torch.float64), 1e-6)
    with torch.no_grad():
        got = head_margins(u, keys, weights, scale=scale, rotation=(cos, sin), chunk=4, query_norm=norm)
    want = _reference_head_margins(u, keys, weights, scale, cos, sin, norm)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, equal_nan=True)
    grad_u = u.clone().requires_grad_()  # the autograd path (the barrier's training penalty) gives the same values
    again = head_margins(grad_u, keys, weights, scale=scale, rotation=(cos, sin), chunk=4, query_norm=norm)
    torch.testing.assert_close(again.detach(), want, rtol=1e-9, atol=1e-12, equal_nan=True)
    again.nansum().backward()
    assert grad_u.grad is not None and torch.isfinite(grad_u.grad).all()
