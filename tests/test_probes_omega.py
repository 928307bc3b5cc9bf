"""HyperLens Ω: top-K mass against a sort-based numpy reference, trajectory and area against toys."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lm_eval_probes.probes import confidence_trajectory, refinement_area, top_k_mass


def reference_top_k_mass(logits: np.ndarray, k: int) -> np.ndarray:
    """Softmax in float64 with the max subtracted, then the sum of the k largest by a full sort."""
    z = logits - logits.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    return np.sort(p, axis=-1)[..., ::-1][..., :k].sum(-1)


@pytest.mark.parametrize("k", [1, 3, 17])
def test_top_k_mass_matches_sorted_softmax(k):
    gen = torch.Generator().manual_seed(k)
    logits = torch.randn(4, 6, 40, generator=gen, dtype=torch.float64) * 3
    got = top_k_mass(logits, k)
    assert got.shape == (4, 6) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), reference_top_k_mass(logits.numpy(), k), rtol=1e-12)
    got32 = top_k_mass(logits.float(), k)
    assert got32.dtype == torch.float32
    np.testing.assert_allclose(got32.numpy(), reference_top_k_mass(logits.numpy(), k), rtol=1e-5)
    other_axis = top_k_mass(logits.transpose(1, 2), k, dim=1)
    np.testing.assert_allclose(other_axis.numpy(), got.numpy(), rtol=1e-12)


def test_top_k_mass_bounds_and_invalid_input():
    uniform = torch.zeros(3, 10)
    torch.testing.assert_close(top_k_mass(uniform, 4), torch.full((3,), 0.4))
    peaked = torch.tensor([[0.0, 1e4, -math.inf]])
    assert float(top_k_mass(peaked, 1)) == pytest.approx(1.0)
    assert float(top_k_mass(torch.tensor([0.0, 0.0, -math.inf]), 2)) == pytest.approx(1.0)  # -inf is probability 0
    with pytest.raises(ValueError, match=r"1 <= k <= V = 10, got 11"):
        top_k_mass(uniform, 11)
    with pytest.raises(ValueError, match=r"got 0"):
        top_k_mass(uniform, 0)
    with pytest.raises(TypeError, match="floating-point"):
        top_k_mass(torch.zeros(3, 10, dtype=torch.long), 1)


def test_one_hot_at_every_layer_gives_zero_area():
    num_sources, positions, vocab = 7, 5, 30
    logits = torch.full((num_sources, positions, vocab), -1e9, dtype=torch.float64)
    logits[..., 3] = 0.0  # every layer's decoding is one-hot on token 3
    trajectory = confidence_trajectory(top_k_mass(logits, 1))
    torch.testing.assert_close(trajectory, torch.ones(num_sources, dtype=torch.float64))
    assert refinement_area(trajectory) == 0.0


@pytest.mark.parametrize("k", [1, 2, 5])
def test_uniform_toy_gives_the_closed_form(k):
    num_layers, vocab = 6, 25  # source layers i = 0..N: N + 1 of them
    logits = torch.randn(1, 1, 1).expand(num_layers + 1, 9, vocab).clone()  # one constant per row: uniform
    omega = refinement_area(confidence_trajectory(top_k_mass(logits, k)))
    assert omega == pytest.approx((num_layers + 1) * (1 - k / vocab), rel=1e-6)


def test_trajectory_is_a_mean_over_response_positions():
    masses = torch.tensor([[0.2, 0.4, 0.9], [1.0, 0.5, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(confidence_trajectory(masses), torch.tensor([0.5, 0.5], dtype=torch.float64))
    mask = torch.tensor([True, False, True])
    torch.testing.assert_close(confidence_trajectory(masses, mask), torch.tensor([0.55, 0.5], dtype=torch.float64))
    assert torch.isnan(confidence_trajectory(torch.empty(2, 0))).all()
    assert math.isnan(refinement_area(confidence_trajectory(torch.empty(2, 0))))
    with pytest.raises(ValueError, match="does not broadcast"):
        confidence_trajectory(masses, torch.tensor([True, False]))
    with pytest.raises(TypeError, match="bool"):
        confidence_trajectory(masses, torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match=r"\[S, \.\.\., n\]"):
        confidence_trajectory(torch.ones(3))


def test_area_is_the_sum_above_the_trajectory():
    trajectory = torch.tensor([0.1, 0.5, 0.75, 1.0], dtype=torch.float64)
    assert refinement_area(trajectory) == pytest.approx(0.9 + 0.5 + 0.25 + 0.0)
    batched = refinement_area(torch.stack([trajectory, torch.ones(4, dtype=torch.float64)]))
    torch.testing.assert_close(batched, torch.tensor([1.65, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="S >= 1"):
        refinement_area(torch.empty(0))
