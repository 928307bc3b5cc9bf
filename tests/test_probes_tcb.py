"""Token Constraint Bound against an autograd Jacobian, and the baselines against direct formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch
from torch.autograd.functional import jacobian
from torch.utils._python_dispatch import TorchDispatchMode

from lm_eval_probes.probes import PredictionBaselines, distribution_baselines, squared_row_norms, token_constraint_bound


def _probabilities(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, softcap: float | None) -> torch.Tensor:
    z = w @ h if b is None else w @ h + b
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    return torch.softmax(z, dim=-1)


def reference_delta(h, w, b=None, *, eps=1.0, softcap=None) -> float:
    """eps / ‖∂softmax(g(W h + b))/∂h‖_F with the Jacobian from autograd, in float64."""
    w64 = w.double()
    b64 = None if b is None else b.double()
    jac = jacobian(lambda x: _probabilities(x, w64, b64, softcap), h.double(), vectorize=True)
    return eps / float(jac.norm())


def naive_delta_fp32(h, w, b=None) -> float:
    """The naive expansion Σo²‖w‖² − 2(Σo²w)·μ + ‖μ‖²Σo², all in float32 (the known failure)."""
    o = _probabilities(h.float(), w.float(), None if b is None else b.float(), None)
    mu = w.T @ o
    o2 = o * o
    j_sq = (o2 * (w * w).sum(-1)).sum() - 2.0 * (o2 @ w) @ mu + (mu @ mu) * o2.sum()
    return float(1.0 / j_sq.clamp_min(0.0).sqrt())  # inf when the expansion cancels to <= 0


def _random_problem(vocab: int, d: int, seed: int, with_bias: bool):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(vocab, d, generator=gen, dtype=torch.float64) / math.sqrt(d) * 3.0
    h = torch.randn(d, generator=gen, dtype=torch.float64)
    b = torch.randn(vocab, generator=gen, dtype=torch.float64) if with_bias else None
    return h, w, b


@pytest.mark.parametrize("vocab,d", [(1000, 16), (50, 64), (7, 3)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("softcap", [None, 4.0])
def test_delta_matches_autograd_jacobian(vocab, d, with_bias, softcap):
    h, w, b = _random_problem(vocab, d, seed=vocab + d, with_bias=with_bias)
    got = token_constraint_bound(h, w, b, logit_softcap=softcap)
    assert got.dtype == torch.float64 and got.shape == ()
    assert float(got) == pytest.approx(reference_delta(h, w, b, softcap=softcap), rel=1e-10)


def test_eps_scales_delta_and_batch_shape_is_kept():
    _, w, b = _random_problem(200, 12, seed=1, with_bias=True)
    hs = torch.randn(2, 3, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    got = token_constraint_bound(hs, w, b, eps=2.5, logit_softcap=6.0)
    assert got.shape == (2, 3)
    for idx in np.ndindex(2, 3):
        assert float(got[idx]) == pytest.approx(reference_delta(hs[idx], w, b, eps=2.5, softcap=6.0), rel=1e-10)


def test_jacobian_identity_against_direct_fp64():
    """‖(diag(o) − o oᵀ) W‖_F² = Σ_i o_i² ‖w_i − μ‖², μ = Wᵀo, and δ = 1/sqrt of it."""
    h, w, b = _random_problem(300, 20, seed=3, with_bias=True)
    o = _probabilities(h, w, b, None)
    mu = w.T @ o
    identity = float((o**2 * ((w - mu) ** 2).sum(-1)).sum())
    direct = float(((torch.diag(o) - torch.outer(o, o)) @ w).pow(2).sum())
    assert identity == pytest.approx(direct, rel=1e-12)
    assert float(token_constraint_bound(h, w, b)) == pytest.approx(1.0 / math.sqrt(identity), rel=1e-10)


def materialised_readout(h, w, b, softcap) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, Ŵ): the distribution softmax(g(W h + b)) and the rows ŵ_i = g'(z_i) w_i its Jacobian is made of, with
    the matrix itself (in the inputs' dtype)."""
    z = w @ h + (0.0 if b is None else b)
    slope = torch.ones_like(z)
    if softcap is not None:
        t = torch.tanh(z / softcap)
        z, slope = softcap * t, 1.0 - t * t
    return torch.softmax(z, dim=-1), slope[:, None] * w


def _scale_for_delta(h, w, b, softcap, target: float) -> torch.Tensor:
    """h·α with δ(h·α) = target, by bisection on log δ in float64 (reference, materialised form)."""

    def log_delta(alpha: float) -> float:
        o, w_hat = materialised_readout(h * alpha, w, b, softcap)
        return -0.5 * math.log(float((o**2 * ((w_hat - w_hat.T @ o) ** 2).sum(-1)).sum()))

    lo, hi = 0.0, 1.0
    while log_delta(hi) < math.log(target):
        lo, hi = hi, hi * 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if log_delta(mid) < math.log(target) else (lo, mid)
    return h * hi


@pytest.mark.parametrize("target", [1e4, 1e5, 1e6])
@pytest.mark.parametrize(
    "vocab,d,with_bias,softcap", [(1000, 16, True, None), (50, 64, False, None), (1000, 16, False, 30.0)]
)
def test_confident_fp32_inputs_match_fp64_reference(target, vocab, d, with_bias, softcap):
    h, w, b = _random_problem(vocab, d, seed=7, with_bias=with_bias)
    h = _scale_for_delta(h, w, b, softcap, target)
    h32, w32 = h.float(), w.float()
    b32 = None if b is None else b.float()
    reference = reference_delta(h32, w32, b32, softcap=softcap)  # fp64 autograd on the fp32 values
    assert reference == pytest.approx(target, rel=0.01)
    got = token_constraint_bound(h32, w32, b32, logit_softcap=softcap)
    assert got.dtype == torch.float32
    assert abs(float(got) - reference) / reference < 1e-3


@pytest.mark.parametrize("target", [1e4, 1e5, 1e6])
def test_naive_fp32_expansion_fails_where_ours_passes(target):
    """The problem is real: the expanded form cancels catastrophically in float32."""
    h, w, b = _random_problem(1000, 16, seed=7, with_bias=True)
    h32 = _scale_for_delta(h, w, b, None, target).float()
    w32, b32 = w.float(), b.float()
    reference = reference_delta(h32, w32, b32)
    naive = naive_delta_fp32(h32, w32, b32)
    assert not (abs(naive - reference) / reference < 1e-3)  # inf / nan count as failures
    assert abs(float(token_constraint_bound(h32, w32, b32)) - reference) / reference < 1e-3


def test_cached_row_norms_and_dtypes():
    h, w, b = _random_problem(100, 8, seed=4, with_bias=True)
    expected = token_constraint_bound(h, w, b)
    cached = token_constraint_bound(h, w, b, row_sq_norms=(w * w).sum(-1))
    assert float(cached) == pytest.approx(float(expected), rel=1e-12)
    assert token_constraint_bound(h.float(), w.float(), b.float()).dtype == torch.float32
    assert token_constraint_bound(h.bfloat16(), w.bfloat16()).dtype == torch.float32
    assert token_constraint_bound(h.float(), w).dtype == torch.float64


def _largest_allocation(fn) -> int:
    """The largest single CPU allocation (bytes) while ``fn()`` runs, from torch's memory profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.cpu_memory_usage for e in prof.events()), default=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_squared_row_norms_are_exact_without_a_float64_copy(monkeypatch, dtype):
    import lm_eval_probes.probes.tcb.math as tcb

    vocab, d, buffer = 1001, 24, 100  # 4 rows per step, the last step a single row
    w = torch.randn(vocab, d, generator=torch.Generator().manual_seed(0)).to(dtype)
    monkeypatch.setattr(tcb, "SQUARED_NORM_BUFFER_ELEMENTS", buffer)
    got = squared_row_norms(w)
    assert got.dtype == torch.float64 and got.shape == (vocab,)
    np.testing.assert_allclose(got.numpy(), (w.double() ** 2).sum(-1).numpy(), rtol=1e-15)
    # the result and the buffer: never a float64 [V, d] (which the one-call float64 norm allocates)
    assert _largest_allocation(lambda: squared_row_norms(w)) <= 8 * max(vocab, buffer)
    if dtype != torch.float64:  # the check sees the conversion it guards against
        assert _largest_allocation(lambda: torch.linalg.vector_norm(w, dim=-1, dtype=torch.float64)) >= 8 * vocab * d
    with pytest.raises(ValueError, match="floating-point"):
        squared_row_norms(torch.ones(3, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"\[V, d\]"):
        squared_row_norms(torch.ones(3))


def test_single_token_vocabulary_gives_inf():
    assert math.isinf(float(token_constraint_bound(torch.ones(4), torch.ones(1, 4))))


class _LargestOutput(TorchDispatchMode):
    """Records the largest numel of any tensor produced by an op."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_never_materialises_positions_by_vocab_by_dim():
    n, vocab, d = 8, 300, 20
    hs = torch.randn(n, d)
    w = torch.randn(vocab, d)
    with _LargestOutput() as mode:
        token_constraint_bound(hs, w, torch.randn(vocab), logit_softcap=5.0)
    assert mode.largest <= max(n * vocab, vocab * d)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(hidden=torch.randn(3, 5), unembed=torch.randn(10, 4)), "hidden must have shape"),
        (dict(hidden=torch.randn(4), unembed=torch.randn(10, 4), bias=torch.randn(9)), "bias must have shape"),
        (dict(hidden=torch.randn(4), unembed=torch.randn(10, 4, 1)), "unembed must have shape"),
        (dict(hidden=torch.randn(4), unembed=torch.randn(10, 4), eps=0.0), "eps must be"),
        (dict(hidden=torch.randn(4), unembed=torch.randn(10, 4), eps=-1.0), "eps must be"),
        (dict(hidden=torch.randn(4), unembed=torch.randn(10, 4), logit_softcap=0.0), "logit_softcap"),
        (dict(hidden=torch.randn(4), unembed=torch.randn(10, 4), row_sq_norms=torch.ones(3)), "row_sq_norms"),
    ],
)
def test_validation_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        token_constraint_bound(**kwargs)


def test_integer_inputs_are_rejected():
    with pytest.raises(TypeError):
        token_constraint_bound(torch.ones(4, dtype=torch.long), torch.randn(10, 4))


def test_baselines_against_direct_formulas():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 4, 40, generator=gen) * 3.0
    logits[0, 0, :5] = -math.inf
    got = distribution_baselines(logits)
    assert isinstance(got, PredictionBaselines) and got.entropy.shape == (3, 4)
    z = logits.double().numpy()
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    entropy = scipy.stats.entropy(p, axis=-1)
    top = np.sort(z, axis=-1)
    np.testing.assert_allclose(got.entropy.numpy(), entropy, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.logit_margin.numpy(), top[..., -1] - top[..., -2], rtol=1e-6)
    np.testing.assert_allclose(got.v_eff_ipr.numpy(), 1.0 / (p**2).sum(-1), rtol=1e-5)
    np.testing.assert_allclose(got.v_eff_exp.numpy(), np.exp(entropy), rtol=1e-5)
    assert got.entropy.dtype == torch.float32
    assert distribution_baselines(logits.double()).entropy.dtype == torch.float64


def test_baselines_uniform_and_validation():
    got = distribution_baselines(torch.zeros(8, dtype=torch.float64))
    assert float(got.entropy) == pytest.approx(math.log(8))
    assert float(got.v_eff_ipr) == pytest.approx(8.0) and float(got.v_eff_exp) == pytest.approx(8.0)
    assert float(got.logit_margin) == 0.0
    with pytest.raises(ValueError, match="V >= 2"):
        distribution_baselines(torch.zeros(3, 1))


def test_given_logits_skip_the_first_product_and_give_the_same_delta():
    h, w, b = _random_problem(300, 16, seed=11, with_bias=True)
    for softcap in (None, 30.0):
        want = token_constraint_bound(h.float(), w.float(), b.float(), logit_softcap=softcap)
        logits = torch.nn.functional.linear(h.float(), w.float(), b.float())
        got = token_constraint_bound(h.float(), w.float(), b.float(), logit_softcap=softcap, logits=logits)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    with pytest.raises(ValueError, match="logits must have shape"):
        token_constraint_bound(h.float(), w.float(), logits=logits[..., :-1])


@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tcb_with_baselines_equals_the_two_functions_and_leaves_its_inputs(softcap, dtype):
    from lm_eval_probes.probes import tcb_with_baselines

    _, w, b = _random_problem(400, 12, seed=12, with_bias=True)
    hs = torch.randn(2, 3, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(13)) * 3.0
    hs, w, b = hs.to(dtype), w.to(dtype), b.to(dtype)
    logits = torch.nn.functional.linear(hs, w, b)
    before = logits.clone()
    delta, baselines = tcb_with_baselines(hs, w, b, eps=2.0, logit_softcap=softcap, logits=logits)
    torch.testing.assert_close(logits, before, rtol=0, atol=0)  # computed in place only on its own copies
    rtol = 1e-12 if dtype == torch.float64 else 1e-5
    want = token_constraint_bound(hs, w, b, eps=2.0, logit_softcap=softcap)
    torch.testing.assert_close(delta, want, rtol=rtol, atol=0)
    capped = logits.double() if softcap is None else softcap * torch.tanh(logits.double() / softcap)
    reference = distribution_baselines(capped)
    for name in ("entropy", "logit_margin", "v_eff_ipr", "v_eff_exp"):
        got = getattr(baselines, name)
        assert got.shape == (2, 3) and got.dtype == dtype
        torch.testing.assert_close(got.double(), getattr(reference, name), rtol=rtol, atol=1e-6 if dtype == torch.float32 else 0)


def test_baselines_leave_float64_logits_unchanged_and_handle_minus_inf():
    logits = torch.tensor([[0.0, 1.0, -math.inf, 2.0], [3.0, -math.inf, -math.inf, 3.0]], dtype=torch.float64)
    before = logits.clone()
    got = distribution_baselines(logits)
    torch.testing.assert_close(logits, before, rtol=0, atol=0)
    p = torch.softmax(torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), -1)
    assert float(got.entropy[0]) == pytest.approx(float(-(p * p.log()).sum()), rel=1e-12)
    assert float(got.entropy[1]) == pytest.approx(math.log(2.0), rel=1e-12)


@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("with_logits", [False, True])
def test_several_float32_rows_match_their_own_float64_reference(softcap, with_logits):
    """Each row of a float32 batch (the weights of both moments share one [2N, V] tensor, in the storage of the
    log-probabilities) against autograd's float64 Jacobian of that row alone."""
    from lm_eval_probes.probes import tcb_with_baselines

    _, w, b = _random_problem(500, 16, seed=21, with_bias=True)
    hs = torch.randn(5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(22)) * torch.tensor(
        [0.5, 1.0, 2.0, 4.0, 8.0], dtype=torch.float64)[:, None]  # from flat to confident predictions
    h32, w32, b32 = hs.float(), w.float(), b.float()
    logits = torch.nn.functional.linear(h32, w32, b32) if with_logits else None
    delta, _ = tcb_with_baselines(h32, w32, b32, logit_softcap=softcap, logits=logits)
    for row in range(5):
        reference = reference_delta(h32[row], w32, b32, softcap=softcap)
        assert abs(float(delta[row]) - reference) / reference < 1e-4, row


@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_do_not_move_with_the_rows_beside_them(softcap, dtype):
    """Given the same logits, δ and the baselines of a row are the same in any batch to the rounding of their
    float64 reductions (torch's batched dot and product take other kernels for other batch sizes, ~1e-16):
    every V-reduction is per row, none a float32 matrix-vector product over the batch (those moved rows by
    ~1e-5 and failed the two-rank gather)."""
    from lm_eval_probes.probes import tcb_with_baselines

    _, w, b = _random_problem(700, 24, seed=31, with_bias=True)
    hs = (torch.randn(7, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(32)) * 3.0).to(dtype)
    w, b = w.to(dtype), b.to(dtype)
    logits = torch.cat([torch.nn.functional.linear(h[None], w, b) for h in hs])  # a matmul's rows move with N
    whole, whole_baselines = tcb_with_baselines(hs, w, b, logit_softcap=softcap, logits=logits)
    rtol = 1e-13 if dtype == torch.float64 else torch.finfo(torch.float32).eps  # float32: one step of the result
    for rows in ([3], [0, 6], [1, 2, 5], [6, 5, 4, 3, 2, 1, 0]):
        part, part_baselines = tcb_with_baselines(hs[rows], w, b, logit_softcap=softcap, logits=logits[rows])
        torch.testing.assert_close(part, whole[rows], rtol=rtol, atol=0, msg=str(rows))
        for name in ("entropy", "logit_margin", "v_eff_ipr", "v_eff_exp"):
            torch.testing.assert_close(getattr(part_baselines, name), getattr(whole_baselines, name)[rows], rtol=rtol,
                                       atol=0, msg=f"{rows} {name}")


def moved_reference(h, w, b=None, *, scale: float, softcap=None, eps=1.0) -> float:
    """δ after the competitors' rows move, from the moved matrix itself (float64, independent of the expansion):
    Ŵ = diag(g'(z)) W, every row but the top-1's replaced by c + scale · (ŵ_i − c) with c the competitors'
    probability-weighted centre, and ‖(diag(o) − o oᵀ) Ŵ'‖_F with the model's own o."""
    o, w_hat = materialised_readout(h.double(), w.double(), None if b is None else b.double(), softcap)
    k = int(o.argmax())
    others = torch.arange(len(o)) != k
    centre = (o[others, None] * w_hat[others]).sum(0) / o[others].sum()
    moved = w_hat.clone()
    moved[others] = centre + scale * (w_hat[others] - centre)
    jac = (torch.diag(o) - torch.outer(o, o)) @ moved
    return eps / float(jac.norm())


@pytest.mark.parametrize("vocab,d", [(1000, 16), (50, 64), (7, 3)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("softcap", [None, 4.0])
def test_competitor_moves_equal_the_moved_matrix(vocab, d, with_bias, softcap):
    from lm_eval_probes.probes import tcb_competitor_moves

    h, w, b = _random_problem(vocab, d, seed=vocab * d, with_bias=with_bias)
    scales = (0.0, 0.5, 1.0, 2.0)
    got = tcb_competitor_moves(h, w, b, scales=scales, logit_softcap=softcap, eps=2.0)
    assert got.shape == (4,) and got.dtype == torch.float64
    for value, scale in zip(got.tolist(), scales):
        assert value == pytest.approx(moved_reference(h, w, b, scale=scale, softcap=softcap, eps=2.0), rel=1e-9)
    assert got[2] == pytest.approx(float(token_constraint_bound(h, w, b, logit_softcap=softcap, eps=2.0)), rel=1e-12)


def test_competitor_moves_can_break_the_ordering():
    """Clustering the competitors does not always raise δ: the o²-weighted spread can pull the other way (so the
    paper's 90 % is a measurement, not an identity; 22 % of random three-token problems break it). Here the order
    is reversed: the likelier competitor (logit 0.5) sits close to the top-1 row, the unlikely one far on the other
    side, so moving them together pulls the likelier one away from the top-1 row."""
    from lm_eval_probes.probes import tcb_competitor_moves

    w = torch.tensor([[1.0], [-2.5], [0.5]], dtype=torch.float64)
    z = torch.tensor([1.0, -4.5, 0.5], dtype=torch.float64)  # logits set through the bias, h = 0
    h = torch.zeros(1, dtype=torch.float64)
    cluster, orig, disperse = tcb_competitor_moves(h, w, z, scales=(0.5, 1.0, 2.0)).tolist()
    for value, scale in zip((cluster, orig, disperse), (0.5, 1.0, 2.0)):
        assert value == pytest.approx(moved_reference(h, w, z, scale=scale), rel=1e-9)
    assert cluster < orig < disperse


def test_competitor_moves_batch_shape_one_hot_and_validation():
    from lm_eval_probes.probes import tcb_competitor_moves, tcb_readout

    _, w, b = _random_problem(100, 8, seed=3, with_bias=True)
    hs = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    got = tcb_competitor_moves(hs.float(), w.float(), b.float(), scales=(0.5, 2.0))
    assert got.shape == (2, 2, 3) and got.dtype == torch.float32
    for i in range(2):
        for j in range(3):
            assert float(got[0, i, j]) == pytest.approx(moved_reference(hs[i, j], w, b, scale=0.5), rel=1e-4)
    one_hot = tcb_competitor_moves(torch.zeros(8, dtype=torch.float64), w, torch.where(
        torch.arange(100) == 5, 1e4, 0.0).double(), scales=(0.5,))
    assert math.isinf(float(one_hot[0]))  # no competitors' mass: δ stays +inf
    readout = tcb_readout(hs, w, b, scales=())
    assert readout.moved.shape == (0, 2, 3) and readout.baselines is not None
    with pytest.raises(ValueError, match="scales must be finite"):
        tcb_competitor_moves(hs, w, b, scales=(-1.0,))


@pytest.mark.parametrize("products", ["device", "tensor cores"])
@pytest.mark.parametrize("block_elements", [1, 7 * 16, 10**9])
def test_a_bfloat16_unembedding_read_in_row_blocks_gives_the_float32_copy_s_numbers(block_elements, products):
    """:class:`RowBlocks` converts W a block of rows at a time: the logits equal the float32 copy's product, δ_TCB and
    its baselines agree with the copy's to float32 rounding (only the order of the moments' sums over V changes). On
    tensor cores (emulated here: bfloat16 terms of x against W as it is, float32 accumulation) the same."""
    from contextlib import nullcontext

    from lm_eval_probes.stack_api import float32_products_emulated

    with float32_products_emulated() if products == "tensor cores" else nullcontext():
        _bfloat16_row_blocks_check(block_elements, tensor_cores=products == "tensor cores")


@pytest.mark.parametrize("target", [1e4, 1e6])
def test_confident_predictions_on_tensor_cores_match_the_float64_reference(target):
    """A bfloat16 W on tensor cores (emulated): δ_TCB of confident predictions within the float32 bar of
    :func:`test_confident_fp32_inputs_match_fp64_reference`."""
    from lm_eval_probes.probes import RowBlocks
    from lm_eval_probes.stack_api import float32_products_emulated

    h, w, b = _random_problem(1000, 16, seed=7, with_bias=False)
    w16 = w.bfloat16()
    h = _scale_for_delta(h, w16.double(), None, None, target)
    reference = reference_delta(h.float(), w16.float(), None, softcap=None)
    with float32_products_emulated():
        rows = RowBlocks(w16, torch.float32)
        assert rows.tensor_cores
        got = token_constraint_bound(h.float(), rows)
    assert abs(float(got) - reference) / reference < 1e-3


def _bfloat16_row_blocks_check(block_elements: int, *, tensor_cores: bool) -> None:
    from lm_eval_probes.probes import RowBlocks, tcb_readout

    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(50, 16, generator=generator).to(torch.bfloat16)
    hidden = torch.randn(5, 16, generator=generator)
    rows = RowBlocks(weight, torch.float32, block_elements=block_elements)
    assert rows.converts and rows.block_rows == min(50, max(1, block_elements // 16))
    assert rows.tensor_cores is tensor_cores
    copy = weight.float()
    torch.testing.assert_close(rows.times_transposed(hidden), hidden @ copy.T, rtol=1e-6, atol=1e-6)
    coefficients = torch.rand(3, 50, generator=generator)
    torch.testing.assert_close(rows.weighted_sum(coefficients), (coefficients.double() @ copy.double()), rtol=1e-6, atol=1e-6)
    blocked, copied = (tcb_readout(hidden, w, logit_softcap=30.0, scales=(0.5,)) for w in (rows, copy))
    torch.testing.assert_close(blocked.delta, copied.delta, rtol=1e-5, atol=0)
    torch.testing.assert_close(blocked.moved, copied.moved, rtol=1e-5, atol=0)
    torch.testing.assert_close(blocked.baselines.entropy, copied.baselines.entropy, rtol=1e-5, atol=0)


def test_row_blocks_of_a_matrix_already_in_the_products_dtype_are_the_matrix_itself():
    from lm_eval_probes.probes import RowBlocks

    weight = torch.randn(9, 4)
    rows = RowBlocks(weight, torch.float32, block_elements=4)
    assert not rows.converts and [(lo, hi, w is weight) for lo, hi, w in rows.blocks()] == [(0, 9, True)]
    hidden = torch.randn(2, 4)
    assert torch.equal(rows.times_transposed(hidden), hidden @ weight.T)
    with pytest.raises(ValueError, match="float32 or float64"):
        RowBlocks(weight, torch.bfloat16)


def test_a_small_chunk_reads_several_layers_out_of_one_pass_over_a_converted_unembedding(tiny_model_dir):
    """A bfloat16 model's lens, chunk smaller than its capacity: the layers' logits come from one pass over W per group
    of layers (:meth:`LensChunk._grouped_layer_logits`), equal to reading them out one by one; BTE's energies too."""
    from transformers import AutoModelForCausalLM

    from lm_eval_probes.capture.positions import LensChunk
    from lm_eval_probes.capture.readouts import LensReadout
    from lm_eval_probes.probes import consecutive_js_divergences_of_logits

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama"), torch_dtype=torch.bfloat16).requires_grad_(False)
    readout = LensReadout(model)
    assert readout.rows.converts
    generator = torch.Generator().manual_seed(5)
    states = [torch.randn(3, model.config.hidden_size, generator=generator).to(torch.bfloat16)
              for _ in range(model.config.num_hidden_layers + 1)]
    last = len(states) - 1
    one_by_one = [logits.clone() for logits in LensChunk(states, readout, 0, 3).layer_logits(0, last)]
    grouped = LensChunk(states, readout, 0, 3, capacity=6)  # two layers a pass
    # A product over 6 rows and one over 3 need not round alike (the BLAS picks its kernel by shape and by CPU:
    # Intel with AMX, AMD without), so the grouped logits equal the one-by-one ones to float32 rounding, not bitwise.
    got = [t.clone() for t in grouped.layer_logits(0, last)]
    assert len(got) == len(one_by_one) == len(states)
    for layer, (a, b) in enumerate(zip(one_by_one, got, strict=True)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=f"layer {layer}")
    energies = [consecutive_js_divergences_of_logits(LensChunk(states, readout, 0, 3, capacity=capacity).layer_logits(1, last))
                for capacity in (3, 9)]
    torch.testing.assert_close(energies[0], energies[1], rtol=1e-4, atol=1e-7)  # docs/precision.md: 1e-4 per document


class _ProductOperands(TorchDispatchMode):
    """Records the smallest nonzero magnitude of every float32 matrix product's operands."""

    def __init__(self) -> None:
        super().__init__()
        self.smallest: list[float] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            for operand in args:
                if isinstance(operand, torch.Tensor) and operand.dtype == torch.float32 and bool((operand != 0).any()):
                    self.smallest.append(float(operand[operand != 0].abs().min()))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("scale", [20.0, 40.0, 90.0])  # top-2 probability 2e-6, 3e-11, 4e-23
def test_confident_predictions_put_no_subnormal_float32_into_the_products(scale):
    """Over a vocabulary where most tokens lie 43+ nats below the top, o_i'² (and from 87 nats o_i') fall below
    float32's normal range: subnormal operands make a CPU's matrix product tens of times slower (33 s against 1.2 s for
    64 positions at Gemma-3's 262k vocabulary) and lose their digits. δ still matches autograd's float64 Jacobian of
    the same float32 inputs — where that is well conditioned: at a top-2 probability of 4e-23 (every o_i'² subnormal)
    autograd's 1 − o_k loses its digits, and the float64 products of the same function are the reference — and no
    product sees a subnormal operand."""
    h, w, b = _random_problem(1000, 16, seed=41, with_bias=True)
    h32, w32, b32 = (h * scale).float(), w.float(), b.float()
    o = _probabilities(h32.double(), w32.double(), b32.double(), None)
    rest = o.sort(descending=True).values[1:]
    assert float((rest**2 < torch.finfo(torch.float32).tiny).double().mean()) > 0.5  # mostly subnormal squares
    operands = _ProductOperands()
    with operands:
        got = token_constraint_bound(h32, w32, b32)
    assert min(operands.smallest) >= torch.finfo(torch.float32).tiny
    if scale < 50:
        reference = reference_delta(h32, w32, b32)
    else:
        assert float((rest[0] ** 2)) < torch.finfo(torch.float32).tiny  # the whole second moment is subnormal
        reference = float(token_constraint_bound(h32.double(), w32.double(), b32.double()))
    assert abs(float(got) - reference) / reference < 1e-4
