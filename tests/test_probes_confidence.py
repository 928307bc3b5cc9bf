"""Confidence of a response against hand-computed numbers and numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lm_eval_probes.probes import chosen_option_confidence, geometric_mean_probability, option_probabilities


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_option_probabilities_hand_computed():
    got = option_probabilities([-1.0, -2.0, -3.0])
    denominator = 1.0 + math.exp(-1.0) + math.exp(-2.0)
    np.testing.assert_allclose(got.numpy(), [1 / denominator, math.exp(-1) / denominator, math.exp(-2) / denominator])
    assert got.dtype == torch.float64


def test_option_probabilities_length_normalised():
    got = option_probabilities([-4.0, -3.0], option_lengths=[4, 1])  # per-unit -1 and -3
    np.testing.assert_allclose(got.numpy(), [1 / (1 + math.exp(-2)), math.exp(-2) / (1 + math.exp(-2))])


def test_option_probabilities_batched_against_numpy():
    logliks = torch.randn(5, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 5 - 20
    lengths = torch.randint(1, 9, (5, 4), generator=torch.Generator().manual_seed(1))
    np.testing.assert_allclose(option_probabilities(logliks).numpy(), _softmax(logliks.numpy()), rtol=1e-12)
    np.testing.assert_allclose(
        option_probabilities(logliks, lengths).numpy(), _softmax(logliks.numpy() / lengths.numpy()), rtol=1e-12
    )
    assert option_probabilities(logliks.float()).dtype == torch.float32


def test_option_probabilities_invariant_to_constant_shift():
    logliks = torch.tensor([-12.5, -11.0, -14.25, -11.5], dtype=torch.float64)
    for shift in (-100.0, 3.0, 250.0):
        torch.testing.assert_close(option_probabilities(logliks + shift), option_probabilities(logliks))


def test_impossible_option_gets_zero():
    got = option_probabilities([-1.0, -math.inf])
    assert got.tolist() == [1.0, 0.0]


def test_chosen_option_confidence():
    index, prob = chosen_option_confidence([-1.0, -0.5, -3.0])
    assert index == 1 and isinstance(index, int) and isinstance(prob, float)
    assert prob == pytest.approx(1.0 / (1.0 + math.exp(-0.5) + math.exp(-2.5)))
    # length normalisation can change the choice: -2/1 vs -3/6
    index, prob = chosen_option_confidence([-2.0, -3.0], [1, 6])
    assert index == 1 and prob == pytest.approx(1.0 / (1.0 + math.exp(-1.5)))
    assert chosen_option_confidence([-1.0, -1.0]) == (0, 0.5)


@pytest.mark.parametrize(
    "logliks,lengths,match",
    [
        ([], None, "n_options >= 1"),
        ([-1.0, float("nan")], None, "NaN"),
        ([-1.0, float("inf")], None, "\\+inf"),
        ([-1.0, -2.0], [1.0], "shape"),
        ([-1.0, -2.0], [1.0, 0.0], "positive"),
        ([-1.0, -2.0], [1.0, -3.0], "positive"),
    ],
)
def test_option_validation_errors(logliks, lengths, match):
    with pytest.raises(ValueError, match=match):
        option_probabilities(logliks, lengths)


def test_chosen_option_requires_one_question():
    with pytest.raises(ValueError, match="one question"):
        chosen_option_confidence(torch.zeros(2, 3))


def test_geometric_mean_probability_hand_computed():
    got = geometric_mean_probability([math.log(0.5), math.log(0.125)])
    assert isinstance(got, float) and got == pytest.approx(0.25)
    assert geometric_mean_probability([math.log(0.5), -math.inf]) == 0.0


def test_geometric_mean_probability_batched_and_masked():
    logprobs = torch.log(torch.rand(3, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    logprobs[0, 3:] = -math.inf  # masked-out -inf must not leak
    got = geometric_mean_probability(logprobs, mask)
    assert isinstance(got, torch.Tensor) and got.shape == (3,)
    p = logprobs.exp().numpy()
    assert float(got[0]) == pytest.approx(np.prod(p[0, :3]) ** (1 / 3))
    assert float(got[1]) == pytest.approx(np.prod(p[1]) ** (1 / 6))
    assert math.isnan(float(got[2]))  # nothing counted


def test_geometric_mean_probability_empty_and_validation():
    assert math.isnan(geometric_mean_probability([]))
    with pytest.raises(ValueError, match="scalar"):
        geometric_mean_probability(torch.tensor(-1.0))
    with pytest.raises(ValueError, match="NaN"):
        geometric_mean_probability([-1.0, float("nan")])
    with pytest.raises(ValueError, match="shape"):
        geometric_mean_probability(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        geometric_mean_probability(torch.zeros(3), torch.ones(3))
