"""Token Constraint Bound δ_TCB and the distribution baselines reported next to it.

Source: "Beyond Confidence: The Rhythms of Reasoning" (ICLR 2026, arXiv 2602.10816).
δ_TCB = ε / ‖∂softmax(W h + b)/∂h‖_F measures how far the post-final-norm state h can move
before the next-token distribution changes by ε: larger δ means a more constrained (stabler)
prediction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from .._softmax import log_softmax_
from ..row_blocks import RowBlocks

__all__ = [
    "JacobianTerms",
    "PredictionBaselines",
    "TcbReadout",
    "distribution_baselines",
    "squared_row_norms",
    "tcb_competitor_moves",
    "tcb_readout",
    "tcb_with_baselines",
    "token_constraint_bound",
]

SQUARED_NORM_BUFFER_ELEMENTS = 1 << 20
"""The float64 buffer :func:`squared_row_norms` works through, in elements (8 MB)."""


def _output_dtype(*tensors: Tensor | None) -> torch.dtype:
    """float64 when any given tensor is float64, else float32."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _validate_tcb_inputs(
    hidden: Tensor,
    unembed: Tensor,
    bias: Tensor | None,
    eps: float,
    logit_softcap: float | None,
    row_sq_norms: Tensor | None,
) -> None:
    for name, t in (("hidden", hidden), ("unembed", unembed), ("bias", bias), ("row_sq_norms", row_sq_norms)):
        if t is not None and not torch.is_floating_point(t):
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if unembed.ndim != 2:
        raise ValueError(f"unembed must have shape [V, d], got {tuple(unembed.shape)}")
    vocab, d = unembed.shape
    if vocab < 1 or d < 1:
        raise ValueError(f"unembed must be non-empty, got shape {tuple(unembed.shape)}")
    if hidden.ndim < 1 or hidden.shape[-1] != d:
        raise ValueError(
            f"hidden must have shape [..., {d}] to match unembed {tuple(unembed.shape)}, got {tuple(hidden.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (vocab,):
        raise ValueError(f"bias must have shape [{vocab}] to match unembed, got {tuple(bias.shape)}")
    if row_sq_norms is not None and tuple(row_sq_norms.shape) != (vocab,):
        raise ValueError(f"row_sq_norms must have shape [{vocab}] to match unembed, got {tuple(row_sq_norms.shape)}")
    if not (isinstance(eps, (int, float)) and 0.0 < float(eps) < float("inf")):
        raise ValueError(f"eps must be a finite positive number, got {eps!r}")
    if logit_softcap is not None and not (
        isinstance(logit_softcap, (int, float)) and 0.0 < float(logit_softcap) < float("inf")
    ):
        raise ValueError(f"logit_softcap must be None or a finite positive number, got {logit_softcap!r}")


def token_constraint_bound(
    hidden: Tensor,
    unembed: Tensor | RowBlocks,
    bias: Tensor | None = None,
    *,
    eps: float = 1.0,
    logit_softcap: float | None = None,
    row_sq_norms: Tensor | None = None,
    logits: Tensor | None = None,
) -> Tensor:
    """Token Constraint Bound δ = eps / ‖J‖_F with J = ∂softmax(g(W h + b))/∂h.

    Args:
        hidden: ``[..., d]`` post-final-norm states (``hidden_states[L]`` in Hugging Face, or
            ``final_norm(hidden_states[l])`` for a logit-lens readout).
        unembed: ``[V, d]`` unembedding matrix (rows w_i), or its :class:`~lm_eval_probes.probes.row_blocks.RowBlocks`
            (a bfloat16 W read in float32 a block of rows at a time, with no float32 copy of W).
        bias: optional ``[V]`` logit bias b.
        eps: the output-change budget ε (paper: 1). Must be finite and > 0.
        logit_softcap: ``c`` for Gemma-style soft-capping g(z) = c·tanh(z/c); None for g = id.
        row_sq_norms: optional cached ``[V]`` squared row norms ‖w_i‖² of ``unembed`` (unscaled,
            i.e. before soft-capping), so a caller can compute them once per model.
        logits: optional ``[..., V]`` logits ``W h + b`` before soft-capping, when the caller already
            has them (a logit-lens readout): the first of the two products is then skipped.

    Returns:
        δ of shape ``[...]`` in (0, +inf], larger = prediction more constrained. float64 if
        ``hidden`` or ``unembed`` is float64, else float32. The two V × d products (logits, and the
        two moments of o over the rows in one product of 2N rows) run in ``unembed``'s
        precision (float64 for a float64 ``unembed``, else float32, so no float64 copy of a large
        unembedding is made; a lower precision W is converted a block of rows at a time, and the moments' blocks
        are summed in float64); everything else (softmax, the expansion, the V-reductions) runs in
        float64. With a float32 ``unembed`` δ keeps 1e-3 relative accuracy against the float64
        Jacobian up to δ = 1e6 (tested). ‖J‖_F = 0 (V = 1, or a distribution that is one-hot in
        float64) gives +inf; NaN inputs propagate.

    Formula: with z = W h + b, o = softmax(g(z)), ŵ_i = g'(z_i) w_i (g' = 1 − tanh²(z/c), or 1),
    J = (diag(o) − o oᵀ) Ŵ and ‖J‖_F² = Σ_i o_i² ‖ŵ_i − μ‖², μ = Ŵᵀo. The naive expansion
    Σ o_i²‖ŵ_i‖² − 2(Σ o_i² ŵ_i)·μ + ‖μ‖² Σ o_i² cancels catastrophically for confident
    predictions, so the sum is expanded around the top-1 row k instead (u_i = ŵ_i − ŵ_k,
    o' = o with o'_k = 0, s = Σ_{j≠k} o_j, S2' = Σ_{j≠k} o_j², ν = μ − ŵ_k = Ŵᵀo' − s ŵ_k):
    ‖J‖² = Σ_{i≠k} o_i² ‖u_i‖² − 2 (Ŵᵀ(o'²) − S2' ŵ_k)·ν + (o_k² + S2') ‖ν‖²,
    where every term scales with the off-top-1 mass, so nothing large cancels. Its first sum needs no
    product of its own: Σ_{i≠k} o_i² ‖u_i‖² = Σ_{i≠k} o_i² ‖ŵ_i‖² − 2 ŵ_k·(Ŵᵀ(o'²)) + S2' ‖ŵ_k‖², from the
    cached row norms and the second moment already computed (its terms also scale with o'²).

    Cost: two ``[·, d] × [d, V]``-shaped products (3N rows in all) for N positions; no ``[N, V, d]``
    tensor is formed. Memory: a few ``[N, V]`` float64 tensors: chunk positions in the caller for
    long sequences.
    """
    return _tcb_and_baselines(hidden, unembed, bias, eps, logit_softcap, row_sq_norms, logits, baselines=False)[0]


def tcb_competitor_moves(
    hidden: Tensor,
    unembed: Tensor | RowBlocks,
    bias: Tensor | None = None,
    *,
    scales: Sequence[float],
    eps: float = 1.0,
    logit_softcap: float | None = None,
    row_sq_norms: Tensor | None = None,
    logits: Tensor | None = None,
) -> Tensor:
    """δ_TCB after the competing tokens' rows are clustered or dispersed with the distribution held fixed (the
    paper's ablation: δ_cluster > δ_orig > δ_disperse in 90 % of cases).

    For each ``scale`` every row ŵ_i but the top-1 token's is replaced by c + scale · (ŵ_i − c), c = Σ_{i≠k} o_i ŵ_i /
    Σ_{i≠k} o_i the competitors' probability-weighted centre (``scale`` < 1 clusters them, > 1 disperses them), and
    δ = ε / ‖(diag(o) − o oᵀ) Ŵ'‖_F is recomputed with the model's o. INFERRED: the paper holds o fixed and moves
    "the competing tokens' embeddings" toward or away from their centre; which rows compete (here: every token but
    the top-1) and how far they move are not stated. No extra V × d product: the move is exact on the terms δ itself
    is made of (:meth:`JacobianTerms.squared_norm`).

    Args:
        scales: the factors, each finite and ≥ 0 (1 gives δ itself).
        Everything else: as :func:`token_constraint_bound`.

    Returns:
        ``[len(scales), ...]``: δ after each move, dtype as :func:`token_constraint_bound`'s.
    """
    return tcb_readout(hidden, unembed, bias, eps=eps, logit_softcap=logit_softcap, row_sq_norms=row_sq_norms,
                       logits=logits, scales=scales, baselines=False).moved


class TcbReadout(NamedTuple):
    """δ_TCB of a batch of predictions, their baselines (``None`` when not asked for) and δ after each competitor
    move (``[len(scales), ...]``)."""

    delta: Tensor
    baselines: PredictionBaselines | None
    moved: Tensor


def tcb_readout(
    hidden: Tensor,
    unembed: Tensor | RowBlocks,
    bias: Tensor | None = None,
    *,
    eps: float = 1.0,
    logit_softcap: float | None = None,
    row_sq_norms: Tensor | None = None,
    logits: Tensor | None = None,
    scales: Sequence[float] = (),
    baselines: bool = True,
) -> TcbReadout:
    """:func:`token_constraint_bound`, :func:`distribution_baselines` (when ``baselines``) and
    :func:`tcb_competitor_moves` at ``scales`` of the same predictions, from one float64 softmax."""
    for scale in scales:
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
            raise ValueError(f"scales must be finite and >= 0, got {list(scales)!r}")
    delta, summary, terms = _tcb_and_baselines(hidden, unembed, bias, eps, logit_softcap, row_sq_norms, logits,
                                               baselines=baselines)
    moved = [float(eps) / terms.squared_norm(float(scale)).clamp_min(0.0).sqrt() for scale in scales]
    shape = (len(scales), *delta.shape)
    moved_tensor = torch.stack(moved).reshape(shape).to(delta.dtype) if moved else delta.new_empty(shape)
    return TcbReadout(delta, summary, moved_tensor)


def tcb_with_baselines(
    hidden: Tensor,
    unembed: Tensor | RowBlocks,
    bias: Tensor | None = None,
    *,
    eps: float = 1.0,
    logit_softcap: float | None = None,
    row_sq_norms: Tensor | None = None,
    logits: Tensor | None = None,
) -> tuple[Tensor, PredictionBaselines]:
    """:func:`token_constraint_bound` and :func:`distribution_baselines` of the same prediction softmax(g(W h + b)),
    from one float64 softmax (the same arguments as :func:`token_constraint_bound`)."""
    delta, baselines, _ = _tcb_and_baselines(hidden, unembed, bias, eps, logit_softcap, row_sq_norms, logits,
                                             baselines=True)
    assert baselines is not None
    return delta, baselines


def _tcb_and_baselines(
    hidden: Tensor,
    unembed: Tensor | RowBlocks,
    bias: Tensor | None,
    eps: float,
    logit_softcap: float | None,
    row_sq_norms: Tensor | None,
    logits: Tensor | None,
    *,
    baselines: bool,
) -> tuple[Tensor, PredictionBaselines | None, JacobianTerms]:
    f64 = torch.float64
    weight = unembed.weight if isinstance(unembed, RowBlocks) else unembed
    _validate_tcb_inputs(hidden, weight, bias, eps, logit_softcap, row_sq_norms)
    # the V × d products' dtype: no copy of a float32 (or float64) unembedding, blocks of a lower precision one
    w = unembed if isinstance(unembed, RowBlocks) else RowBlocks(weight, f64 if weight.dtype == f64 else torch.float32)
    mm = w.dtype
    out_dtype = _output_dtype(hidden, w.weight if mm == f64 else None)
    batch_shape = hidden.shape[:-1]
    vocab, d = w.shape
    h = hidden.reshape(-1, d)
    if logits is None:
        z = w.times_transposed(h).to(f64)
        if bias is not None:
            z = z + bias.to(f64)
    else:
        if tuple(logits.shape) != (*batch_shape, vocab):
            raise ValueError(f"logits must have shape {(*batch_shape, vocab)}, got {tuple(logits.shape)}")
        z = logits.reshape(-1, vocab).to(f64, copy=True)  # a copy: the softmax below works in place
    capped, scale = _capped(z, logit_softcap)
    summary = None
    if baselines:
        top2, top_index = capped.topk(2, dim=-1)
        margin = (top2[..., 0] - top2[..., 1]).reshape(batch_shape)
    log_o, o = log_softmax_(capped)  # capped is now its log-softmax: the same argmax
    if baselines:
        summary = _baselines_of(log_o.reshape(*batch_shape, vocab), o.reshape(*batch_shape, vocab), margin, out_dtype)
    top1 = top_index[..., :1] if baselines else None  # the top-1 token, from the margin's top 2 (no argmax pass)
    delta, terms = _tcb_of_probabilities(o, log_o, scale, w, mm, row_sq_norms, eps, top1)
    return delta.reshape(batch_shape).to(out_dtype), summary, terms


def _capped(z: Tensor, logit_softcap: float | None) -> tuple[Tensor, Tensor | None]:
    """g(z) and g'(z) (``None`` for the identity) in float64."""
    if logit_softcap is None:
        return z, None
    t = torch.tanh(z / logit_softcap)
    return logit_softcap * t, 1.0 - t * t

def squared_row_norms(weight: Tensor) -> Tensor:
    """‖w_i‖² of every row of ``weight [V, d]``, in float64 (each row converted exactly, squared and summed in float64).

    The rows go through one reused float64 buffer of :data:`SQUARED_NORM_BUFFER_ELEMENTS` elements, so
    no float64 copy of the whole matrix is made, not even for a moment: ``weight.double()`` or
    ``vector_norm(weight, dtype=float64)`` would allocate 8·V·d bytes (1.3 GB for Gemma-3's 262k × 640
    unembedding, which made the peak resident memory of a probed process 1.3× that of plain ``hf``).
    """
    if weight.ndim != 2 or not torch.is_floating_point(weight):
        raise ValueError(f"weight must be a floating-point [V, d] matrix, got {weight.dtype} {tuple(weight.shape)}")
    vocab, d = weight.shape
    out = torch.empty(vocab, dtype=torch.float64, device=weight.device)
    step = max(1, SQUARED_NORM_BUFFER_ELEMENTS // max(d, 1))
    buffer = torch.empty(min(step, vocab), d, dtype=torch.float64, device=weight.device)
    for start in range(0, vocab, step):
        rows = buffer[: min(step, vocab - start)]
        rows.copy_(weight[start : start + step])
        rows.mul_(rows)
        torch.sum(rows, dim=-1, out=out[start : start + rows.shape[0]])
    return out


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """Σ_i a_i b_i along the last axis of two ``[..., V]`` tensors, without an ``[..., V]`` product tensor: one
    batched product (the kernel ``@`` would reach through five more views)."""
    vocab = a.shape[-1]
    return torch.bmm(a.reshape(-1, 1, vocab), b.reshape(-1, vocab, 1)).view(a.shape[:-1])


def _tcb_of_probabilities(
    o: Tensor,
    capped: Tensor,
    scale: Tensor | None,
    w: RowBlocks,
    mm: torch.dtype,
    row_sq_norms: Tensor | None,
    eps: float,
    top1: Tensor | None = None,
) -> tuple[Tensor, JacobianTerms]:
    """δ of each row of ``[N, V]`` float64 probabilities ``o`` = softmax(``capped``); both are overwritten. ``capped``
    may be shifted per row (it gives the top-1 token k, unless ``top1 [N, 1]`` gives it). Every V-reduction is
    a per-row float64 sum (no float32 matrix-vector product over the batch), so a row's δ moves with the rows
    beside it only by float64 rounding. Also returns the :class:`JacobianTerms` δ was made of."""
    f64 = torch.float64
    n = o.shape[0]
    row_sq = squared_row_norms(w.weight) if row_sq_norms is None else row_sq_norms.to(f64)
    k = capped.argmax(dim=-1, keepdim=True) if top1 is None else top1  # [N, 1]
    w_k = w.rows(k.squeeze(-1))  # [N, d]
    c_k = torch.ones_like(k, dtype=f64) if scale is None else scale.gather(-1, k)  # [N, 1]
    w_hat_k = c_k * w_k.to(f64)
    o_k = o.gather(-1, k).squeeze(-1)
    o_rest = o.scatter_(-1, k, 0.0)  # o'
    s = o_rest.sum(-1, keepdim=True)
    # rows whose weights may fall below the products' normal range (log o_i' of their least likely token, and the
    # soft-capping's smallest slope): read before ``capped``'s storage takes the weights
    lowest = capped.amin(-1, keepdim=True) if scale is None else \
        capped.amin(-1, keepdim=True) + 2 * scale.amin(-1, keepdim=True).log()
    log_tiny = math.log(torch.finfo(mm).tiny)

    # the two moments' weights (o_i' ĝ_i and o_i'² ĝ_i), in the products' dtype, in one [2N, V] tensor; o' is
    # squared in place after its copy (no further [N, V] float64 tensor). For float32 products the weights take
    # the storage of ``capped`` (the same bytes: its float64 [N, V]), which is not needed once k is known.
    if mm == torch.float32 and capped.dtype == f64 and capped.is_contiguous() and capped.shape == o.shape:
        weights = capped.view(torch.float32).view(2 * n, o.shape[-1])
    else:
        weights = torch.empty(2 * n, o.shape[-1], dtype=mm, device=o.device)
    first = _normal_weights(weights[:n], o_rest, scale, lowest < log_tiny)
    squares = o_rest.mul_(o_rest)  # o_i'²
    s2 = squares.sum(-1, keepdim=True)
    if scale is None:
        second = _normal_weights(weights[n:], squares, None, 2 * lowest < log_tiny)
        spread_rows = squares.mul_(row_sq).sum(-1)  # Σ_{i≠k} o_i'² ‖w_i‖²
    else:
        second = _normal_weights(weights[n:], squares.mul_(scale), None, 2 * lowest < log_tiny)
        spread_rows = squares.mul_(scale).mul_(row_sq).sum(-1)  # Σ_{i≠k} o_i'² ‖ŵ_i‖²
    moments = w.weighted_sum(weights).to(f64)  # [2N, d]: Σ o_i ŵ_i and Σ o_i² ŵ_i over i ≠ k, in one product
    if first is not None:
        moments[:n] /= first
    if second is not None:
        moments[n:] /= second
    nu = moments[:n] - s * w_hat_k  # [N, d]
    m2 = moments[n:] - s2 * w_hat_k  # Σ_{i≠k} o_i² u_i
    # Σ_{i≠k} o_i² ‖ŵ_i − ŵ_k‖², expanded: the second moment gives the cross term (no [N, V] dot products)
    spread = spread_rows - 2.0 * (w_hat_k * moments[n:]).sum(-1) + s2.squeeze(-1) * (w_hat_k * w_hat_k).sum(-1)
    terms = JacobianTerms(spread=spread, cross=(m2 * nu).sum(-1), nu_sq=(nu * nu).sum(-1), o_k=o_k,
                          s=s.squeeze(-1), s2=s2.squeeze(-1))
    return float(eps) / terms.squared_norm().clamp_min(0.0).sqrt(), terms


def _normal_weights(out: Tensor, values: Tensor, scale: Tensor | None, suspect: Tensor) -> Tensor | None:
    """Write ``values`` (non-negative float64 ``[N, V]``, times ``scale`` if given) into ``out`` (the products' dtype),
    as they are — except in the rows flagged ``suspect`` (``[N, 1]`` bool: their smallest entry may fall below
    ``finfo(out.dtype).tiny``; a confident prediction over a large vocabulary has many: o_i'² < 1.2e-38 for every token
    43 nats below the top). Subnormal operands make a CPU's float32 matrix product tens of times slower and lose their
    digits, so such a row is written times the power of two that brings its largest entry into [1/2, 1), with the
    entries still below float32's range (under 2⁻¹²⁶ of the row's largest, together under 1e-32 of its sum) set to 0.
    Exact: the product's row is the same up to that power, which the caller divides out in float64 — and in a row
    that had nothing subnormal, bit for bit the same. Returns the ``[N, 1]`` float64 powers of two (1 for untouched
    rows), or ``None`` when no row is suspect (``out`` is then exactly the rounded values)."""
    rows = suspect.squeeze(-1).nonzero().flatten().tolist()
    if len(rows) < out.shape[0]:
        if scale is None:
            out.copy_(values)
        else:
            torch.mul(values, scale, out=out)
    if not rows:
        return None
    tiny = torch.finfo(out.dtype).tiny
    factor = torch.ones(out.shape[0], 1, dtype=torch.float64, device=out.device)
    for row in rows:
        value = values[row] if scale is None else values[row] * scale[row if scale.shape[0] > 1 else 0]
        peak = value.max()
        if not bool(peak > 0):
            out[row].zero_()
            continue
        power = torch.ldexp(torch.ones_like(peak), -torch.frexp(peak).exponent)
        scaled = value * power
        out[row].copy_(scaled.masked_fill_(scaled < tiny, 0.0))
        factor[row] = power
    return factor


@dataclass(frozen=True)
class JacobianTerms:
    """‖J‖_F² of a batch of predictions, expanded around each one's top-1 row k (float64 ``[N]`` tensors): with
    u_i = ŵ_i − ŵ_k and ν = μ − ŵ_k = Σ_{i≠k} o_i u_i (see :func:`token_constraint_bound`),

    Attributes:
        spread: Σ_{i≠k} o_i² ‖u_i‖².
        cross: (Σ_{i≠k} o_i² u_i)·ν.
        nu_sq: ‖ν‖².
        o_k: the top-1 probability.
        s: Σ_{i≠k} o_i (the competitors' mass).
        s2: Σ_{i≠k} o_i².
    """

    spread: Tensor
    cross: Tensor
    nu_sq: Tensor
    o_k: Tensor
    s: Tensor
    s2: Tensor

    def squared_norm(self, scale: float = 1.0) -> Tensor:
        """‖J‖_F² after every competitor's row (i ≠ k) is moved toward (``scale`` < 1: cluster) or away from
        (``scale`` > 1: disperse) the competitors' probability-weighted centre c = Σ_{i≠k} o_i ŵ_i / s, with o held
        fixed: ŵ_i ← c + scale · (ŵ_i − c). The move keeps μ (Σ_{i≠k} o_i (ŵ_i − c) = 0), so with
        β = (1 − scale) / s (u_i ← scale · u_i + β ν):
        ‖J‖² = scale² · spread + 2 · scale · (β − 1) · cross + (S2' (β − 1)² + o_k²) · ‖ν‖²;
        ``scale`` = 1 is the model's own ‖J‖² = spread − 2 cross + (o_k² + S2') ‖ν‖². A prediction without
        competitors' mass (s = 0: one-hot in float64) keeps its own value.
        """
        if scale == 1.0:
            return self.spread - 2.0 * self.cross + (self.o_k * self.o_k + self.s2) * self.nu_sq
        if not (math.isfinite(scale) and scale >= 0.0):
            raise ValueError(f"scale must be finite and >= 0, got {scale!r}")
        beta_minus_1 = torch.where(self.s > 0, (1.0 - scale) / self.s, torch.zeros_like(self.s)) - 1.0
        moved = (scale * scale * self.spread + 2.0 * scale * beta_minus_1 * self.cross
                 + (self.s2 * beta_minus_1 * beta_minus_1 + self.o_k * self.o_k) * self.nu_sq)
        return torch.where(self.s > 0, moved, self.squared_norm())


@dataclass(frozen=True)
class PredictionBaselines:
    """Per-position baselines of a next-token distribution, each a tensor of shape ``[...]``.

    Attributes:
        entropy: Shannon entropy −Σ o_i ln o_i in nats, in [0, ln V]; higher = less certain.
        logit_margin: top-1 minus top-2 logit, in [0, +inf]; higher = more certain.
        v_eff_ipr: inverse participation ratio 1/Σ o_i², in [1, V]: effective vocabulary size.
            INFERRED (methods.md §1): the paper's exact V_eff definition was not found; the IPR
            makes "‖J‖² ∝ 1/V_eff" exact when all rows are equidistant from μ.
        v_eff_exp: exp(entropy), in [1, V]: the perplexity-style effective vocabulary size.
    """

    entropy: Tensor
    logit_margin: Tensor
    v_eff_ipr: Tensor
    v_eff_exp: Tensor


def distribution_baselines(logits: Tensor) -> PredictionBaselines:
    """Entropy, top-1/top-2 logit margin and effective vocabulary sizes of softmax(logits).

    Args:
        logits: ``[..., V]`` with V ≥ 2, the logits the model samples from (after any
            soft-capping). −inf entries are allowed (probability 0, contributing 0 to the entropy).

    Returns:
        :class:`PredictionBaselines` of ``[...]`` tensors, float64 for float64 logits else
        float32; computed in float64. Formulas: o = softmax(logits), H = −Σ o_i ln o_i,
        margin = z_(1) − z_(2), V_eff^IPR = 1/Σ o_i², V_eff^exp = exp(H). Baselines for δ_TCB
        in arXiv 2602.10816.
    """
    if not torch.is_floating_point(logits):
        raise TypeError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    if logits.ndim < 1 or logits.shape[-1] < 2:
        raise ValueError(f"logits must have shape [..., V] with V >= 2, got {tuple(logits.shape)}")
    out_dtype = _output_dtype(logits)
    z = logits.to(torch.float64, copy=True)
    top2 = z.topk(2, dim=-1).values
    return _baselines_of(*log_softmax_(z), top2[..., 0] - top2[..., 1], out_dtype)


def _baselines_of(log_o: Tensor, o: Tensor, margin: Tensor, out_dtype: torch.dtype) -> PredictionBaselines:
    """:class:`PredictionBaselines` from float64 log-probabilities and probabilities and the logit margin."""
    entropy = -_row_dot(o, log_o)
    if bool(torch.isnan(entropy).any()):  # a -inf logit: 0·log 0 = 0 (not 0·(−inf) = nan)
        entropy = -torch.where(o > 0, o * log_o, torch.zeros((), dtype=o.dtype)).sum(-1)
    ipr = torch.reciprocal(_row_dot(o, o))
    return PredictionBaselines(
        entropy=entropy.to(out_dtype),
        logit_margin=margin.to(out_dtype),
        v_eff_ipr=ipr.to(out_dtype),
        v_eff_exp=entropy.exp().to(out_dtype),
    )
