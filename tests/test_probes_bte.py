"""Belief-Trajectory Energy: JSD against a KL-based reference, windows and statistics against numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import rel_entr

from lm_eval_probes.probes import (
    TRANSITION_STATISTIC_NAMES,
    belief_trajectory_energy,
    central_window,
    central_window_energy,
    consecutive_js_divergences_of_logits,
    depth_profile,
    js_divergence,
    transition_statistics,
)

LN2 = math.log(2.0)


def reference_jsd(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """½ KL(p‖m) + ½ KL(q‖m), m = (p + q)/2, built in probability space in float64."""
    m = 0.5 * (p + q)
    return 0.5 * rel_entr(p, m).sum(-1) + 0.5 * rel_entr(q, m).sum(-1)


def _random_logprobs(shape, seed, scale=2.0, dtype=torch.float64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(*shape, generator=gen, dtype=torch.float64) * scale, -1).to(dtype)


def test_jsd_matches_kl_reference():
    lp, lq = _random_logprobs((5, 7, 30), 0), _random_logprobs((5, 7, 30), 1, scale=4.0)
    got = js_divergence(lp, lq)
    assert got.shape == (5, 7) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), reference_jsd(lp.exp().numpy(), lq.exp().numpy()), rtol=1e-10)
    got32 = js_divergence(lp.float(), lq.float())
    assert got32.dtype == torch.float32
    np.testing.assert_allclose(got32.numpy(), reference_jsd(lp.exp().numpy(), lq.exp().numpy()), rtol=1e-4)


def test_jsd_other_dim_and_half_inputs_upcast():
    lp, lq = _random_logprobs((4, 12), 2), _random_logprobs((4, 12), 3)
    got = js_divergence(lp.T, lq.T, dim=0)
    np.testing.assert_allclose(got.numpy(), js_divergence(lp, lq).numpy(), rtol=1e-12)
    half = js_divergence(lp.half(), lq.half())
    assert half.dtype == torch.float32
    np.testing.assert_allclose(half.numpy(), js_divergence(lp, lq).numpy(), rtol=2e-2)


def test_jsd_symmetric():
    lp, lq = _random_logprobs((6, 50), 4), _random_logprobs((6, 50), 5)
    np.testing.assert_allclose(js_divergence(lp, lq).numpy(), js_divergence(lq, lp).numpy(), rtol=1e-12)


def test_jsd_bounds_identical_and_disjoint():
    lp = _random_logprobs((3, 20), 6)
    assert torch.all(js_divergence(lp, lp).abs() < 1e-15)
    ninf = -math.inf
    disjoint_p = torch.tensor([[math.log(0.5), math.log(0.5), ninf, ninf]])
    disjoint_q = torch.tensor([[ninf, ninf, math.log(0.25), math.log(0.75)]])
    got = js_divergence(disjoint_p, disjoint_q)
    assert not torch.isnan(got).any()
    assert float(got) == pytest.approx(LN2, rel=1e-6)
    many = js_divergence(_random_logprobs((200, 10), 7, scale=10.0), _random_logprobs((200, 10), 8, scale=10.0))
    assert torch.all(many >= 0.0) and torch.all(many <= LN2)


def test_jsd_zero_probability_entries():
    p = np.array([[0.0, 0.2, 0.8, 0.0], [0.0, 0.0, 1.0, 0.0]])
    q = np.array([[0.1, 0.0, 0.6, 0.3], [0.0, 0.0, 1.0, 0.0]])
    with np.errstate(divide="ignore"):
        lp, lq = torch.from_numpy(np.log(p)), torch.from_numpy(np.log(q))
    got = js_divergence(lp, lq)
    assert not torch.isnan(got).any()
    np.testing.assert_allclose(got.numpy(), reference_jsd(p, q), rtol=1e-12, atol=1e-15)
    assert float(got[1]) == 0.0


def test_jsd_float32_underflowing_probabilities():
    """Log-probabilities whose probabilities underflow float32 (e^-150 = 0) in both beliefs count as 0, not nan."""
    head_p, head_q = _random_logprobs((3, 10), 11), _random_logprobs((3, 10), 12)
    tail = torch.full((3, 500), -150.0, dtype=torch.float64)  # total mass 500·e^-150: nothing, even in float64
    lp, lq = torch.cat([head_p, tail], -1), torch.cat([head_q, tail - 30.0], -1)
    got = js_divergence(lp.float(), lq.float())
    assert torch.isfinite(got).all()
    np.testing.assert_allclose(got.numpy(), reference_jsd(head_p.exp().numpy(), head_q.exp().numpy()), rtol=1e-5)
    with_zeros = torch.cat([lp[:, :-1], torch.full((3, 1), -math.inf, dtype=torch.float64)], -1)  # and an exact 0
    np.testing.assert_allclose(js_divergence(with_zeros.float(), lq.float()).numpy(), got.numpy(), rtol=1e-6)


def test_jsd_local_quadratic_approximation():
    """JSD(p, softmax(z + δ)) ≈ ⅛ δᵀ(diag(p) − ppᵀ)δ, with relative error shrinking with |δ|."""
    gen = torch.Generator().manual_seed(9)
    z = torch.randn(40, generator=gen, dtype=torch.float64)
    direction = torch.randn(40, generator=gen, dtype=torch.float64)
    p = torch.softmax(z, -1)
    fisher = torch.diag(p) - torch.outer(p, p)
    errors = []
    for size in (1e-2, 1e-3, 1e-4):
        delta = size * direction
        exact = float(js_divergence(torch.log_softmax(z, -1), torch.log_softmax(z + delta, -1)))
        approx = float(delta @ fisher @ delta) / 8.0
        errors.append(abs(exact - approx) / approx)
    assert errors[0] < 1e-2
    assert errors[1] < 0.2 * errors[0] and errors[2] < 0.2 * errors[1]  # O(|δ|) relative error


def test_belief_trajectory_energy_shapes_and_values():
    layers = _random_logprobs((5, 2, 3, 11), 10)  # L+1 = 5 layers, batch 2, 3 positions
    energy = belief_trajectory_energy(layers)
    assert energy.shape == (4, 2, 3)
    for layer in range(4):
        torch.testing.assert_close(energy[layer], js_divergence(layers[layer], layers[layer + 1]))
    assert belief_trajectory_energy(_random_logprobs((2, 7), 11)).shape == (1,)
    with pytest.raises(ValueError, match="L\\+1 >= 2"):
        belief_trajectory_energy(_random_logprobs((1, 4, 7), 12))


def test_js_divergence_validation():
    with pytest.raises(ValueError, match="same shape"):
        js_divergence(torch.zeros(3, 4), torch.zeros(3, 5))
    with pytest.raises(TypeError):
        js_divergence(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long))


def test_central_window_defaults_and_explicit():
    assert central_window(32) == (12, 20)
    assert tuple(range(*central_window(32))) == tuple(range(12, 20))
    assert central_window(30) == (11, 18)
    assert central_window(28) == (10, 17)
    assert central_window(1) == (0, 1) and central_window(3) == (1, 2)  # widened empty defaults
    assert central_window(32, (0, 32)) == (0, 32)
    for bad in [(5, 5), (-1, 3), (3, 33), (1.0, 3)]:
        with pytest.raises(ValueError, match="window"):
            central_window(32, bad)
    with pytest.raises(ValueError, match="num_layers"):
        central_window(0)


def test_central_window_energy():
    profile = torch.arange(32, dtype=torch.float64)
    value = central_window_energy(profile)
    assert isinstance(value, float) and value == pytest.approx(np.mean(np.arange(12, 20)))
    assert central_window_energy(profile, (0, 2)) == pytest.approx(0.5)
    batched = central_window_energy(torch.stack([profile, 2 * profile]))
    torch.testing.assert_close(batched, torch.tensor([15.5, 31.0], dtype=torch.float64))


def test_depth_profile_mean_and_mask():
    energy = torch.rand(6, 10, generator=torch.Generator().manual_seed(13), dtype=torch.float64)
    np.testing.assert_allclose(depth_profile(energy).numpy(), energy.numpy().mean(-1))
    mask = torch.zeros(10, dtype=torch.bool)
    mask[3:8] = True
    np.testing.assert_allclose(depth_profile(energy, mask).numpy(), energy.numpy()[:, 3:8].mean(-1))
    batched = energy.reshape(6, 2, 5)
    np.testing.assert_allclose(depth_profile(batched, mask.reshape(2, 5)).numpy(), energy.numpy()[:, 3:8].mean(-1))
    assert torch.isnan(depth_profile(energy, torch.zeros(10, dtype=torch.bool))).all()
    with pytest.raises(ValueError, match="broadcast"):
        depth_profile(energy, torch.ones(9, dtype=torch.bool))
    with pytest.raises(ValueError, match="\\[L, ..., T\\]"):
        depth_profile(torch.zeros(4))


def numpy_transition_statistics(energy: np.ndarray) -> np.ndarray:
    rows = []
    for x in energy:
        t = len(x)
        quarters = []
        for q in range(4):
            start = q * t // 4
            quarters.append(x[start : max((q + 1) * t // 4, start + 1)].mean())
        c = x - x.mean()
        autocorr = 0.0 if t < 2 or np.ptp(x) == 0 else float((c[:-1] * c[1:]).sum() / (c * c).sum())
        top = np.sort(x)[::-1][: int(np.ceil(t / 10))]
        rows.append([x.mean(), x.std(), *np.percentile(x, [10, 50, 90]), *quarters, autocorr, top.mean()])
    return np.array(rows)


@pytest.mark.parametrize("num_positions", [1, 2, 3, 4, 5, 17, 40, 101])
def test_transition_statistics_against_numpy(num_positions):
    energy = torch.rand(3, num_positions, generator=torch.Generator().manual_seed(num_positions), dtype=torch.float64)
    got = transition_statistics(energy)
    assert got.shape == (3, 11) == (3, len(TRANSITION_STATISTIC_NAMES))
    np.testing.assert_allclose(got.numpy(), numpy_transition_statistics(energy.numpy()), rtol=1e-10, atol=1e-12)
    assert torch.isfinite(got).all()


def test_transition_statistics_degenerate_cases():
    constant = transition_statistics(torch.full((2, 7), 0.1))
    assert constant.dtype == torch.float32
    assert torch.all(constant[:, 1] == 0) and torch.all(constant[:, 9] == 0)
    torch.testing.assert_close(constant[:, [0, 2, 3, 4, 5, 6, 7, 8, 10]], torch.full((2, 9), 0.1))
    single = transition_statistics(torch.tensor([[0.3], [0.2]], dtype=torch.float64))
    expected = torch.tensor([0.3, 0.0, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.0, 0.3], dtype=torch.float64)
    torch.testing.assert_close(single[0], expected)
    with pytest.raises(ValueError, match="T >= 1"):
        transition_statistics(torch.zeros(3, 0))
    with pytest.raises(ValueError, match="\\[L, T\\]"):
        transition_statistics(torch.zeros(3, 4, 5))


def test_consecutive_divergences_equal_pairwise_ones_bit_for_bit():
    from lm_eval_probes.probes import consecutive_js_divergences

    torch.manual_seed(3)
    layers = [torch.log_softmax(torch.randn(5, 40) * scale, dim=-1) for scale in (0.5, 1.0, 4.0, 30.0)]
    layers[2][1, :3] = -math.inf  # zero probabilities: 0·log 0 = 0
    layers[2][1] = torch.log_softmax(layers[2][1], dim=-1)
    got = consecutive_js_divergences(iter(layers))
    want = torch.stack([js_divergence(a, b) for a, b in zip(layers[:-1], layers[1:])])
    assert got.shape == (3, 5) and torch.isfinite(got).all()
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="at least two"):
        consecutive_js_divergences([layers[0]])
    with pytest.raises(ValueError, match="differ in shape"):
        consecutive_js_divergences([layers[0], layers[1][:2]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_divergences_of_logits_equal_those_of_their_log_softmax(dtype):
    from lm_eval_probes.probes import consecutive_js_divergences, consecutive_js_divergences_of_logits

    gen = torch.Generator().manual_seed(5)
    vocab = 1000  # not a multiple of the 64-entry blocks of the float64 accumulation
    logits = [(torch.randn(6, vocab, generator=gen, dtype=torch.float64) * s).to(dtype) for s in (0.3, 1.0, 3.0, 12.0)]
    logits[1][2, :5] = -math.inf  # exact zero probabilities
    want = consecutive_js_divergences([torch.log_softmax(z, -1) for z in logits])
    got = consecutive_js_divergences_of_logits([z.clone() for z in logits])
    assert got.dtype == dtype and got.shape == (3, 6) and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-7 if dtype == torch.float32 else 1e-15)
    p = [torch.softmax(z.double(), -1).numpy() for z in logits]
    reference = np.stack([reference_jsd(a, b) for a, b in zip(p[:-1], p[1:])])
    np.testing.assert_allclose(got.double().numpy(), reference, rtol=1e-4 if dtype == torch.float32 else 1e-10, atol=1e-7 if dtype == torch.float32 else 0)
    transposed = consecutive_js_divergences_of_logits([z.T.contiguous() for z in logits], dim=0)
    torch.testing.assert_close(transposed, got, rtol=1e-5, atol=1e-7)


def test_divergence_rows_do_not_move_with_the_rows_beside_them():
    """Row by row (no product mixes rows): a row's divergences equal the whole batch's to float32 rounding of the
    reductions, which a CPU may vectorise differently for another number of rows."""
    from lm_eval_probes.probes import consecutive_js_divergences_of_logits

    gen = torch.Generator().manual_seed(6)
    logits = [torch.randn(9, 3000, generator=gen) * s for s in (0.5, 2.0, 6.0)]
    whole = consecutive_js_divergences_of_logits([z.clone() for z in logits])
    for rows in (slice(0, 1), slice(2, 5), slice(4, 9)):
        torch.testing.assert_close(consecutive_js_divergences_of_logits([z[rows].clone() for z in logits]), whole[:, rows],
                                   rtol=1e-6, atol=1e-9, msg=str(rows))
    torch.testing.assert_close(js_divergence(torch.log_softmax(logits[0][3:4], -1), torch.log_softmax(logits[1][3:4], -1)),
                               js_divergence(torch.log_softmax(logits[0], -1), torch.log_softmax(logits[1], -1))[3:4],
                               rtol=1e-6, atol=1e-9)


def test_float32_divergence_of_flat_near_identical_beliefs_keeps_its_small_difference():
    """JSD = Σ(p/2)log p + Σ(q/2)log q − Σ m log m subtracts sums of size ≈ ln V: accumulated in float32 they
    would lose a JSD of 1e-5 (float32's spacing at 10 is 1e-6); the float64 accumulation keeps it."""
    gen = torch.Generator().manual_seed(7)
    vocab = 50_000
    z = torch.randn(4, vocab, generator=gen, dtype=torch.float64) * 0.1  # entropy ≈ ln V ≈ 10.8 nats
    z2 = z + torch.randn(4, vocab, generator=gen, dtype=torch.float64) * 1e-2
    reference = reference_jsd(torch.softmax(z, -1).numpy(), torch.softmax(z2, -1).numpy())
    assert 5e-6 < reference.min() and reference.max() < 5e-5
    got = js_divergence(torch.log_softmax(z.float(), -1), torch.log_softmax(z2.float(), -1)).double().numpy()
    np.testing.assert_allclose(got, reference, rtol=5e-3)  # 3e-8 absolute: the inputs' float32 rounding
    # the same three sums in float32 miss it by 10 times more (the check can fail)
    lp, lq = torch.log_softmax(z.float(), -1), torch.log_softmax(z2.float(), -1)
    hp, hq = lp.exp() / 2, lq.exp() / 2
    m = hp + hq
    naive = ((hp * lp).sum(-1) + (hq * lq).sum(-1) - (m * m.log()).sum(-1)).double().numpy()
    assert (np.abs(naive - reference) / reference).max() > 5e-2


@pytest.mark.parametrize("spread", [0.1, 1.0, 3.0])
def test_float32_divergence_of_logits_keeps_small_differences_of_peaked_beliefs(spread):
    """The in-place path from logits (BTE's readouts) as accurate as the log-probabilities' path, from flat
    (spread 0.1) to peaked beliefs (3.0: a few tokens hold most of the mass). Its probabilities are the
    exponentials of its own log-probabilities: probabilities divided by the normaliser would disagree with the
    rounded log-probabilities by up to ~5e-7 at their few large entries, 1e-2 relative on these JSDs (the entropy
    form's weakness; the per-entry form has none)."""
    gen = torch.Generator().manual_seed(8)
    z = (torch.randn(4, 50_000, generator=gen, dtype=torch.float64) * spread).float()
    z2 = z + torch.randn(4, 50_000, generator=gen).mul_(1e-2)
    reference = reference_jsd(torch.softmax(z.double(), -1).numpy(), torch.softmax(z2.double(), -1).numpy())
    assert reference.max() < 1e-4
    got = consecutive_js_divergences_of_logits([z.clone(), z2.clone()])[0].double().numpy()
    np.testing.assert_allclose(got, reference, rtol=1e-6)  # entropy form: ≤ 4.4e-3 at best


@pytest.mark.parametrize("vocab", [600, 50_000])
@pytest.mark.parametrize("target", [1e-2, 1e-3, 1e-5, 1e-7])
def test_float32_divergence_at_the_accuracy_of_its_inputs(vocab, target):
    """The float32 JSD of float32 logits against float64 of the very same logits, from JSD 1e-2 down to 1e-7, flat
    and peaked beliefs: within 1e-6 relative (measured: ≤ 2e-7 at every size). The entropy form
    ½Σp log p + ½Σq log q − Σ m log m turned the rounding of its O(entropy) terms into ~1e-7 nats (1e-2 relative
    at JSD 1e-5, 2 at 1e-7: checked below, so this test can fail)."""
    gen = torch.Generator().manual_seed(vocab + int(-math.log10(target)))
    for spread in (1.0, 3.0):
        z = torch.randn(8, vocab, generator=gen, dtype=torch.float64) * spread
        z2 = (z + torch.randn(8, vocab, generator=gen, dtype=torch.float64) * math.sqrt(8 * target)).float()
        z = z.float()
        reference = reference_jsd(torch.softmax(z.double(), -1).numpy(), torch.softmax(z2.double(), -1).numpy())
        assert target / 3 < np.median(reference) < 3 * target
        got = consecutive_js_divergences_of_logits([z.clone(), z2.clone()])[0].double().numpy()
        np.testing.assert_allclose(got, reference, rtol=1e-6)
        pairwise = js_divergence(z, z2).double().numpy()  # logits (or log-probabilities) directly
        np.testing.assert_allclose(pairwise, reference, rtol=1e-6)
    if target <= 1e-5:
        lp, lq = torch.log_softmax(z, -1), torch.log_softmax(z2, -1)
        p, q = lp.exp(), lq.exp()
        m = (p + q) / 2
        entropy_form = (0.5 * (p * lp).double().sum(-1) + 0.5 * (q * lq).double().sum(-1)
                        - (m * m.log()).double().sum(-1)).numpy()
        assert (np.abs(entropy_form - reference) / reference).max() > 1e-3
