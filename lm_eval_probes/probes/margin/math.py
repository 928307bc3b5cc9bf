"""Stability margins and support tokens of the embedding-level causal attention prior.

Source: "Support Tokens, Stability Margins, and a New Foundation for Robust LLMs" (arXiv 2602.22271).
Latent-noise view of causal self-attention over embeddings: x_t = μ_t(x) + ε_t with
μ_t = Σ_{s<t} α_ts x_s and α_ts = softmax_{s<t}(x_tᵀ W_Qᵀ W_K x_s / √p). The Jacobian of the residual
e_t = x_t − μ_t with respect to x_t is I − Σ_t A, where A = W_Kᵀ W_Q / √p and
Σ_t = Σ_s α_ts (x_s − x̄_t)(x_s − x̄_t)ᵀ is the attention-weighted covariance of the prefix
(x̄_t = Σ_s α_ts x_s). The margin m_t = log|det(I − Σ_t A)| enters the exact log-likelihood as a
log-barrier; it tends to −∞ at the degeneracy boundary det = 0. Support tokens are the positions with the
smallest margins (closest to the boundary). Scalar case (d = p = 1): ∂e_t/∂x_t = 1 − a·Var_t.

Two exact forms of the margin: the d×d ``slogdet`` of I − Σ_t A (:func:`prior_margins_direct`) and, by
Sylvester's identity det(I_d − Σ_t W_Kᵀ W_Q/√p) = det(I_p − W_Q Σ_t W_Kᵀ/√p), a p×p determinant of the
attention-weighted cross-covariance of the query- and key-projected inputs
(:func:`prior_margins`, and :func:`head_margins` for one head of a pretrained model with rotary
embeddings: there the cross-covariance is rotated by the query's rotation R_t, see its docstring).

Everything here is differentiable (the training penalty of :mod:`lm_eval_probes.models.barrier_training` uses it).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "attention_covariance",
    "head_margins",
    "layer_margins",
    "margin_dtype",
    "prefix_attention_weights",
    "prior_jacobian",
    "prior_margins",
    "prior_margins_direct",
    "rotate_half",
    "scalar_prior_jacobian",
    "support_tokens",
]


def _check_float(name: str, value: Tensor) -> None:
    if not isinstance(value, Tensor) or not torch.is_floating_point(value):
        raise TypeError(f"{name} must be a floating-point tensor, got {getattr(value, 'dtype', type(value))}")


def prefix_attention_weights(queries: Tensor, keys: Tensor, *, scale: float, valid: Tensor | None = None,
                             softcap: float | None = None, window: int | None = None, sink: Tensor | None = None,
                             positions: Tensor | None = None, mask: Tensor | None = None,
                             logits: Tensor | None = None, extra: int = 0, causal: bool = True) -> Tensor:
    """Attention weights over the strict causal prefix: α_ts = softmax_{s<t, s valid}(scale · q_t·k_s).

    Args:
        queries: ``[..., T, p]`` (as used in the logits: with bias and rotary rotation, if any).
        keys: ``[..., T, p]``.
        scale: the logit scale (1/√p in the paper).
        valid: optional bool ``[..., T]``: False marks padding, never attended to.
        softcap: c of soft-capped logits c·tanh(scale · q_t·k_s / c) (Gemma-2); ``None``: none.
        window: a sliding window W: s is attended from t only when t − s < W (transformers' convention); ``None``: none.
        sink: an attention-sink logit (gpt-oss): it takes part in the softmax, has no value, so a row sums to less
            than 1; ``None``: none.
        positions: int64 ``[n]``: ``queries`` are ``[..., n, p]``, the queries of these positions only (their rows of
            the weights, ``[..., n, T]``); ``None``: every position's.
        mask: the mask the model's attention was handed, ``[..., T (or n), T]``: bool (False: not attended) or float
            (added to the logits after the soft cap; windows, chunks and biases; an entry at or below float16's lowest
            value, transformers' masked entry, is not attended); ``None``: none.
        logits: ``scale · q_t·k_s`` computed by the caller (``[..., T (or n), T]``, consumed: changed in place);
            ``None``: computed here.
        extra: the last ``extra`` of ``keys`` (``[..., T + extra, p]``, the weights ``[..., T (or n), T + extra]``) are
            entries without a position of their own (DeepSeek-V4's compressed keys): attended where ``mask`` says,
            neither causal order, window nor ``valid`` (``[..., T]``, the positions') applies to them.
        causal: ``False``: every position s ≠ t is in t's prior (a layer that attends both ways, CPM-Ant's: its mask
            says which it attends; a window then bounds |t − s|), not only s < t.

    Returns:
        ``[..., T, T]`` (``[..., n, T]`` with ``positions``) row-stochastic over the valid s < t; a row with no valid prefix (the first real
        token, a chunk's first position in chunked attention) is all zeros. The diagonal is excluded: the paper's μ_t averages the *previous* tokens.
    """
    _check_float("queries", queries)
    _check_float("keys", keys)
    rows = queries.shape[-2] if positions is None else positions.shape[0]
    length = keys.shape[-2] - extra  # T: the positions' keys
    if queries.shape[:-2] != keys.shape[:-2] or queries.shape[-1] != keys.shape[-1] or queries.ndim < 2 or \
            queries.shape[-2] != rows or positions is None and queries.shape[-2] != length or not 0 <= extra <= keys.shape[-2]:
        raise ValueError(f"queries and keys must both be [..., T, p] (queries [..., n, p] with n positions; keys "
                         f"[..., T + extra, p]), got {tuple(queries.shape)} and {tuple(keys.shape)} (extra {extra})")
    logits = scale * queries @ keys.transpose(-1, -2) if logits is None else logits
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    query_at = torch.arange(length, device=queries.device) if positions is None else positions.to(queries.device)
    lag = query_at[:, None] - torch.arange(length + extra, device=queries.device)[None, :]  # t − s
    allowed = lag > 0 if causal else lag != 0
    if window is not None:
        allowed = allowed & (lag < window if causal else lag.abs() < window)
    if extra:
        allowed[:, length:] = True  # entries without a position: the mask alone says which are attended
    if valid is not None:
        if valid.shape != (*keys.shape[:-2], length):
            raise ValueError(f"valid must be {(*keys.shape[:-2], length)}, got {tuple(valid.shape)}")
        valid = valid.bool()
        if extra:
            valid = torch.cat([valid, valid.new_ones(*valid.shape[:-1], extra)], -1)
        allowed = allowed & valid.unsqueeze(-2)
    if mask is not None and mask.dtype == torch.bool:
        allowed = allowed & mask
    elif mask is not None:  # added to the logits; transformers' masked entries hold their dtype's lowest value
        allowed = allowed & (mask > torch.finfo(torch.float16).min)  # not attended (a chunk's first position: none)
        logits = logits + mask.to(logits.dtype)
    logits = logits.masked_fill_(~allowed, -math.inf)  # in place: the product's backward does not read it
    if sink is not None:
        column = sink.to(logits.dtype).expand(*logits.shape[:-1], 1)
        weights = torch.softmax(torch.cat([logits, column], -1), dim=-1)[..., :-1]
        del logits
        return weights  # a row without any allowed s: all weight on the sink, zeros here
    weights = torch.softmax(logits, dim=-1)
    del logits  # [..., T, T]: at most two of them alive at once
    if weights.requires_grad and torch.is_grad_enabled():  # softmax's backward reads its output
        return torch.nan_to_num(weights, nan=0.0)
    return weights.nan_to_num_(nan=0.0)  # a row without any allowed s: softmax of all −inf


def attention_covariance(x: Tensor, weights: Tensor) -> Tensor:
    """Σ_t = Σ_s α_ts (x_s − x̄_t)(x_s − x̄_t)ᵀ, the attention-weighted covariance of the prefix.

    Args:
        x: ``[T, d]`` inputs; weights: ``[T, T]`` rows α_t· (each summing to 1 or all zero).

    Returns:
        ``[T, d, d]`` symmetric positive semi-definite; zero for a row of zero weights.
    """
    _check_float("x", x)
    _check_float("weights", weights)
    if x.ndim != 2 or weights.shape != (x.shape[0], x.shape[0]):
        raise ValueError(f"x must be [T, d] and weights [T, T], got {tuple(x.shape)} and {tuple(weights.shape)}")
    mean = weights @ x  # [T, d]
    second = torch.einsum("ts,sd,se->tde", weights, x, x)
    return second - weights.sum(-1)[:, None, None] * mean[:, :, None] * mean[:, None, :]


def prior_jacobian(x: Tensor, w_q: Tensor, w_k: Tensor, *, scale: float | None = None) -> Tensor:
    """The Jacobian ∂e_t/∂x_t = I − Σ_t A of the prior's residual, A = W_Kᵀ W_Q · scale.

    Args:
        x: ``[T, d]`` embeddings of one sequence; w_q, w_k: ``[p, d]`` projections; scale: default 1/√p.

    Returns:
        ``[T, d, d]``. Position 0 (no prefix) gives I.
    """
    w_q, w_k, scale = _projections(x, w_q, w_k, scale)
    weights = prefix_attention_weights(x @ w_q.T, x @ w_k.T, scale=scale)
    eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)
    return eye - attention_covariance(x, weights) @ (scale * w_k.T @ w_q)


def prior_margins_direct(x: Tensor, w_q: Tensor, w_k: Tensor, *, scale: float | None = None) -> Tensor:
    """m_t = log|det(I_d − Σ_t A)| by a d×d ``slogdet`` (the reference form; O(T·d³)).

    Args:
        x: ``[T, d]``; w_q, w_k: ``[p, d]``; scale: default 1/√p.

    Returns:
        ``[T]`` margins (natural log); 0 at position 0; −inf exactly on the degeneracy boundary.
    """
    return torch.linalg.slogdet(prior_jacobian(x, w_q, w_k, scale=scale)).logabsdet


def prior_margins(x: Tensor, w_q: Tensor, w_k: Tensor, *, scale: float | None = None, valid: Tensor | None = None) -> Tensor:
    """m_t = log|det(I_p − W_Q Σ_t W_Kᵀ · scale)| (Sylvester form of :func:`prior_margins_direct`; O(T²·p²)).

    Args:
        x: ``[..., T, d]`` embeddings (a batch of sequences is fine); w_q, w_k: ``[p, d]``; scale: default 1/√p.
        valid: optional bool ``[..., T]``, False = padding (neither attended to nor given a margin).

    Returns:
        ``[..., T]`` margins; ``nan`` where there is no valid prefix (the first real token, padding).
    """
    w_q, w_k, scale = _projections(x, w_q, w_k, scale)
    queries, keys = x @ w_q.T, x @ w_k.T
    weights = prefix_attention_weights(queries, keys, scale=scale, valid=valid)
    return head_margins(queries, keys, weights, scale=scale, valid=valid)


def head_margins(
    query_inputs: Tensor,
    keys: Tensor,
    weights: Tensor,
    *,
    scale: float,
    rotation: tuple[Tensor, Tensor] | None = None,
    valid: Tensor | None = None,
    positions: Tensor | None = None,
    chunk: int = 64,
    query_norm: tuple[Tensor, Tensor, float] | None = None,
) -> Tensor:
    """One attention head's margins m_t = log|det(I_p − scale · R_t C_t)| from projected inputs.

    C_t = Σ_s α_ts (u_s − ū_t)(k_s − k̄_t)ᵀ is the attention-weighted cross-covariance of the
    query-projected inputs u_s = W_Q x_s and the keys k_s the logits use; R_t is the rotation applied to
    the query at position t (rotary embeddings; identity without). Derivation: with
    q_t = R_t W_Q x_t (+ bias), ∂μ_t/∂x_t = Σ_s α_ts (x_s − x̄_t)(k_s − k̄_t)ᵀ R_t W_Q · scale, and
    Sylvester's identity turns det(I_d − ·) into this p×p determinant. Biases cancel in u_s − ū_t.

    Args:
        query_inputs: ``[..., T, p]`` u_s = W_Q x_s (a query bias may be included: it cancels; no rotation).
        keys: ``[..., T, p]`` keys as in the logits (bias and rotation included).
        weights: ``[..., T, T]`` α over the strict prefix (:func:`prefix_attention_weights`).
        scale: the logit scale (1/√p in the paper).
        rotation: ``(cos, sin)`` each ``[..., T, p]`` in the rotate-half convention
            (R_t v = v·cos_t + rotate_half(v)·sin_t; Llama, Qwen2, Mistral, Gemma); ``None``: no rotation.
        valid: optional bool ``[..., T]``; margins of invalid positions are ``nan``.
        positions: optional int64 ``[n]``: ``weights`` is ``[..., n, T]``, the rows of these query positions only
            (the margins of a subset of positions; e.g. a sampled estimate of a mean over positions).
        chunk: query positions processed at once; heads (and batch rows) one at a time. Transient memory
            ≈ :data:`WORK_ELEMENTS` + 3 · chunk · p² floats, whatever T and the number of heads.
        query_norm: for a head whose queries are RMS-normalised before the rotation (Gemma-3's ``q_norm``):
            ``(v, g, eps)`` with ``v [..., T, p]`` the norm's inputs (projection and bias), ``g [p]`` its
            effective weight and ``eps``, so q_t = R_t (g ⊙ v_t / r_t), r_t = (mean(v_t²) + eps)^½. The
            norm's Jacobian J_t = diag(g) (I − v_t v_tᵀ / (p r_t²)) / r_t then sits between the rotation and
            W_Q: m_t = log|det(I_p − scale · R_t J_t C_t)| (the keys' norm only changes the keys given).

    Returns:
        ``[..., T]`` (``[..., n]`` with ``positions``) margins in the dtype of the inputs; ``nan`` at positions
        without any prefix weight.
    """
    for name, value in (("query_inputs", query_inputs), ("keys", keys), ("weights", weights)):
        _check_float(name, value)
    length, dim = keys.shape[-2:]
    rows = length if positions is None else positions.shape[0]
    if query_inputs.shape != keys.shape or weights.shape != (*keys.shape[:-2], rows, length):
        raise ValueError(
            f"expected query_inputs and keys [..., T, p] and weights [..., T (or n positions), T], got "
            f"{tuple(query_inputs.shape)}, {tuple(keys.shape)} and {tuple(weights.shape)}"
        )
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if positions is not None:
        if rotation is not None:
            rotation = (rotation[0][..., positions, :], rotation[1][..., positions, :])
        if valid is not None:
            valid = valid[..., positions]
        if query_norm is not None:
            query_norm = (query_norm[0][..., positions, :], query_norm[1], query_norm[2])
    lead = keys.shape[:-2]
    per_head = []
    for index in _indices(lead):  # one head (and batch row) at a time
        norm = None if query_norm is None else (_pick(query_norm[0], index, lead), query_norm[1], query_norm[2])
        per_head.append(_one_head_margins(
            _pick(query_inputs, index, lead), _pick(keys, index, lead), _pick(weights, index, lead), scale=scale,
            rotation=None if rotation is None else (_pick(rotation[0], index, lead), _pick(rotation[1], index, lead)),
            chunk=chunk, query_norm=norm))
    margins = torch.stack(per_head).reshape(*lead, rows) if per_head else keys.new_empty((*lead, rows))
    undefined = weights.sum(-1) == 0
    if valid is not None:
        undefined = undefined | ~valid.bool()
    return margins.masked_fill(undefined, math.nan)


WORK_ELEMENTS = 1 << 23
"""Elements of the largest transient of :func:`head_margins` beside its ``[chunk, p, p]`` products: the flattened
outer products u_s k_sᵀ of a block of prefix positions (64 MiB in float64); in :func:`layer_margins`, a group of
heads' C_t and a block of its weighted inputs, in float64."""

WORK_ELEMENTS_FLOAT32 = 1 << 25
""":data:`WORK_ELEMENTS` of :func:`layer_margins` on float32 products (a GPU's, 128 MiB): larger groups of heads,
fewer launches."""


def _indices(lead: torch.Size) -> list[tuple[int, ...]]:
    """Every index of a tensor of shape ``lead``, in row-major order (``()`` once for an empty shape)."""
    out: list[tuple[int, ...]] = [()]
    for size in lead:
        out = [index + (i,) for index in out for i in range(size)]
    return out


def _pick(value: Tensor, index: tuple[int, ...], lead: torch.Size) -> Tensor:
    """``value[index]`` of a tensor whose leading dims broadcast against ``lead`` (a view; no copy)."""
    return torch.broadcast_to(value, (*lead, *value.shape[-2:]))[index]


def _one_head_margins(u: Tensor, keys: Tensor, weights: Tensor, *, scale: float, rotation: tuple[Tensor, Tensor] | None,
                      chunk: int, query_norm: tuple[Tensor, Tensor, float] | None) -> Tensor:
    """:func:`head_margins` of one head: u, keys ``[T, p]``, weights ``[n, T]``, rotation and the norm's inputs
    ``[n, p]`` (already cut to the rows' positions) → ``[n]`` log|det| (no nan masking).

    Per chunk of query positions, C_t is summed only over the prefix any of them attends to (the columns up to the
    chunk's last nonzero weight: half the products of a causal pass), one matrix product ``[c, S] @ [S, p²]`` per
    block of S prefix positions with their flattened outer products u_s k_sᵀ (built once per head when all T of them
    fit in :data:`WORK_ELEMENTS`, else per block). Without autograd the corrections (means, query norm, rotation,
    I − scale·X) run in place on the ``[c, p, p]`` products. Transient memory: :data:`WORK_ELEMENTS` plus about three
    ``[c, p, p]`` per chunk, whatever T and the number of heads."""
    rows, length, dim = weights.shape[0], keys.shape[0], keys.shape[-1]
    in_place = not (torch.is_grad_enabled() and (u.requires_grad or keys.requires_grad or weights.requires_grad
                                                 or (query_norm is not None and query_norm[0].requires_grad)))
    block = max(1, WORK_ELEMENTS // (dim * dim))
    outer_all = _outer(u, keys) if length <= block else None  # [T, p²], reused by every chunk
    parts = []
    for lo in range(0, rows, chunk):
        hi = min(rows, lo + chunk)
        attended = torch.nonzero(weights[lo:hi].detach().ne(0).any(0))
        span = int(attended[-1]) + 1 if attended.numel() else 1  # no prefix at all: one all-zero column
        alpha = weights[lo:hi, :span]  # [c, S]
        second = None  # Σ_s α_ts u_s k_sᵀ, [c, p²]
        for start in range(0, span, block):
            stop = min(span, start + block)
            outer = outer_all[start:stop] if outer_all is not None else _outer(u[start:stop], keys[start:stop])
            if second is None:
                second = alpha[:, start:stop] @ outer
            elif in_place:
                second.addmm_(alpha[:, start:stop], outer)
            else:
                second = second + alpha[:, start:stop] @ outer
            del outer  # freed before the next block is built: one block alive at a time
        cross = second.unflatten(-1, (dim, dim))
        mean_u, mean_k = alpha @ u[:span], alpha @ keys[:span]  # [c, p]
        correction = (alpha.sum(-1)[:, None] * mean_u)[:, :, None]  # (Σ_s α_ts) ū_t, [c, p, 1]
        cross = cross.baddbmm_(correction, mean_k[:, None, :], alpha=-1) if in_place else \
            cross - correction * mean_k[:, None, :]
        if query_norm is not None:  # J_t C_t = diag(g) (C_t − v_t (v_tᵀ C_t) / (p r_t²)) / r_t
            v, gain, eps = query_norm
            v = v[lo:hi]
            r_sq = v.pow(2).mean(-1) + eps  # [c]
            projected = (v.unsqueeze(-2) @ cross).squeeze(-2)  # v_tᵀ C_t: [c, p]
            scaled_v = (v / (dim * r_sq)[:, None])[:, :, None]
            factor = gain[None, :, None] / r_sq.sqrt()[:, None, None]  # [c, p, 1]
            if in_place:
                cross.baddbmm_(scaled_v, projected[:, None, :], alpha=-1).mul_(factor)
            else:
                cross = (cross - scaled_v * projected[:, None, :]) * factor
        if rotation is not None:  # R_t X: rows (v₁; v₂) → (v₁ cos₁ − v₂ sin₁; v₂ cos₂ + v₁ sin₂)
            cos, sin = (r[lo:hi, :, None] for r in rotation)
            cross = _rotate_rows(cross, cos, sin) if in_place else cross * cos + rotate_half(cross, dim=-2) * sin
        if in_place:  # I − scale · X
            matrix = cross.mul_(-scale)
            matrix.diagonal(dim1=-2, dim2=-1).add_(1.0)
        else:
            matrix = torch.eye(dim, dtype=cross.dtype, device=cross.device) - scale * cross
        parts.append(torch.linalg.slogdet(matrix).logabsdet)
    return torch.cat(parts) if parts else keys.new_empty(0)


def _outer(u: Tensor, keys: Tensor) -> Tensor:
    """``[S, p²]``: the flattened u_s k_sᵀ of each position."""
    return (u[:, :, None] * keys[:, None, :]).flatten(-2)


def _rotate_rows(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x·cos + rotate_half(x, dim=-2)·sin for ``x [c, p, p]`` and cos, sin ``[c, p, 1]``, in two passes."""
    half = x.shape[-2] // 2
    top, bottom = x[:, :half], x[:, half:]
    out = torch.empty_like(x)
    torch.mul(top, cos[:, :half], out=out[:, :half]).addcmul_(bottom, sin[:, :half], value=-1.0)
    torch.mul(bottom, cos[:, half:], out=out[:, half:]).addcmul_(top, sin[:, half:])
    return out


def rotate_half(v: Tensor, *, dim: int = -1) -> Tensor:
    """(v₁, v₂) → (−v₂, v₁) along ``dim`` (halves of even size): the rotary convention of Llama-family models."""
    first, second = v.chunk(2, dim=dim)
    return torch.cat((-second, first), dim=dim)


def scalar_prior_jacobian(a: float | Tensor, variance: Tensor) -> Tensor:
    """The scalar case (d = p = 1) of the Jacobian: 1 − a·Var_t, with a = w_k·w_q/√p the coupling.

    ``variance``: the attention-weighted variance Var_t ≥ 0 of the prefix. The margin is log|1 − a·Var_t|;
    for a > 0 the degeneracy boundary is Var_t = 1/a, for a < 0 there is none (the term promotes dispersion).
    """
    _check_float("variance", variance)
    return 1.0 - a * variance


def support_tokens(margins: Tensor, k: int) -> Tensor:
    """Positions of the ``k`` smallest margins (the support tokens), smallest first; ties by position.

    Args:
        margins: ``[T]``; ``nan`` entries (no prefix, padding) are never chosen.
        k: k ≥ 0; fewer are returned when fewer margins are defined.

    Returns:
        ``[min(k, #defined)]`` int64 positions.
    """
    _check_float("margins", margins)
    if margins.ndim != 1:
        raise ValueError(f"margins must be [T], got {tuple(margins.shape)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    defined = torch.nonzero(~torch.isnan(margins)).squeeze(-1)
    order = torch.sort(margins[defined], stable=True).indices  # stable: equal margins keep position order
    return defined[order[:k]]


def _projections(x: Tensor, w_q: Tensor, w_k: Tensor, scale: float | None) -> tuple[Tensor, Tensor, float]:
    for name, value in (("x", x), ("w_q", w_q), ("w_k", w_k)):
        _check_float(name, value)
    if w_q.ndim != 2 or w_q.shape != w_k.shape or x.shape[-1] != w_q.shape[1]:
        raise ValueError(f"expected x [..., T, d] and w_q, w_k [p, d], got {tuple(x.shape)}, {tuple(w_q.shape)}, {tuple(w_k.shape)}")
    return w_q.to(x.dtype), w_k.to(x.dtype), 1.0 / math.sqrt(w_q.shape[0]) if scale is None else float(scale)


def margin_dtype(precision: str, device: torch.device | str) -> torch.dtype:
    """The dtype of the margins' products for ``precision`` (``probe_margin_precision``: ``auto``, ``float32`` or
    ``float64``) on ``device``: ``auto`` is float32 where the device has float32 products of bfloat16 terms
    (:func:`~lm_eval_probes.stack_api.float32_products_native`: a CUDA GPU's tensor cores), float64 elsewhere."""
    from lm_eval_probes.stack_api import float32_products_native

    dtypes = {"float32": torch.float32, "float64": torch.float64}
    if precision == "auto":
        return torch.float32 if float32_products_native(device) else torch.float64
    if precision not in dtypes:
        raise ValueError(f"probe_margin_precision must be one of auto, float32, float64, got {precision!r}")
    return dtypes[precision]


def _products(work: torch.dtype) -> Callable[[Tensor, Tensor], Tensor]:
    """``a @ b`` in ``work``: float64 products, or :func:`~lm_eval_probes.stack_api.matmul_float32`."""
    if work == torch.float64:
        return lambda a, b: torch.matmul(a.double(), b.double())
    from lm_eval_probes.stack_api import matmul_float32

    return matmul_float32


def layer_margins(queries: Tensor, keys: Tensor, query_inputs: Tensor | Callable[[int], Tensor],
                  query_jacobian: Callable[[int, int], Tensor], *, scale: float, softcap: float | None = None,
                  window: int | None = None, sinks: Tensor | None = None, valid: Tensor | None = None,
                  heads: str = "mean", chunk: int = 64, mask: Tensor | None = None,
                  work: torch.dtype = torch.float64, start: int = 0, causal: bool = True,
                  bias_term: Callable[[int, int, Tensor], Tensor] | None = None) -> Tensor:
    """Per-position margins of one sequence through a pretrained model's attention layer, a chunk of query positions
    at a time, a group of heads at a time.

    Per chunk of positions, the query map's Jacobians D_t of every head (``query_jacobian``); for a group of heads h
    together (head h reads key head h // (H / KV)): α = :func:`prefix_attention_weights` of its queries (soft cap,
    sliding window and attention sink as the layer has them), β = α ⊙ (1 − tanh²(scale · q·k / c)) with a soft cap,
    and m_t = log|det(I_p − scale · D_t C_t)| (:func:`head_margins`' C_t over the inputs u the head's queries read);
    the position's margin is the mean (or ``min``) over heads. A layer whose logit bias b_ts and sinks σ_t move with
    the query's input (``bias_term``: E_ts = ∂b_ts/∂u_t, Inkling's) has ∂z_ts/∂u_t = scale · D_tᵀ k_s + E_ts, so
    m_t = log|det(I_n − scale · C_t D_t − F_t)| with F_t = Σ_s α_ts u_s E_tsᵀ − ū_t Ē_tᵀ,
    Ē_t = Σ_s α_ts E_ts + α_t,sink ∂σ_t/∂u_t (n × n). Only one chunk's Jacobians and one group's weights,
    C_t and products are held (a group: at most :data:`WORK_ELEMENTS` values of C_t, :data:`WORK_ELEMENTS_FLOAT32`
    on float32 products).

    Precision (``docs/precision.md``): the weights, the means, C_t and D_t C_t are ``work`` (float64, or float32
    products through :func:`~lm_eval_probes.stack_api.matmul_float32`: bfloat16 terms with float32 accumulation on
    tensor cores); C_t is summed as Σ_s β_ts (u_s − ū_t)(k_s − κ)ᵀ + (Σ_s β_ts (u_s − ū_t)) κᵀ, κ a per-head centre
    of the keys: each term a deviation, so no sum cancels (a position with one key in its prefix has C_t = 0, margin
    0, exactly); the p×p log-determinants are taken in float64. No value is read by the host.

    Args:
        queries: ``[H, T, p]`` as the logits use them; keys: ``[KV, T + E, p]`` (H a multiple of KV): the positions'
            keys, then E ≥ 0 entries without a position of their own (DeepSeek-V4's compressed keys), which take part
            in the softmax as an attention sink does, with their logits scale · q_t·k_c, and have no input (x = 0 in
            μ_t: u = 0 in C_t); attended where ``mask`` says.
        query_inputs: ``[H or 1, T, n]`` the inputs u each head's queries read (``1``: shared by every head), or
            ``(head) -> [T, n]``.
        query_jacobian: ``(lo, hi) -> [H, hi − lo, p, n]`` D_t = ∂q_t/∂u_t of every head at positions [lo, hi).
        scale, softcap, window: the layer's logit scale, soft cap (``None``: none) and sliding window (``None``: none).
        sinks: ``[H]`` attention-sink logits, or ``[H, T]`` one per query (``None``: none).
        valid: optional bool ``[T]`` (False = padding).
        heads: ``mean`` or ``min``.
        chunk: query positions per chunk.
        mask: ``[H or 1, T, T + E]`` the mask the layer handed its attention (:func:`prefix_attention_weights`); ``None``:
            none (the window alone).
        work: float64 or float32 (:func:`~lm_eval_probes.probes.margin.probe.margin_dtype`).
        start: the first position whose margin is computed (0 ≤ start ≤ T; the margin at t reads positions ≤ t only,
            so a caller that has those of [0, start) from a sequence with the same first ``start`` tokens asks for the
            rest).
        bias_term: ``(lo, hi, α [H, hi − lo, hi]) -> [H, hi − lo, n, n]`` F_t of the chunk, asked before its
            ``query_jacobian`` (the capture's products give both:
            :attr:`~lm_eval_probes.capture.attention.AttentionRow.bias_term`); ``None``: the bias and sinks do not
            move with u.
        causal: ``False``: the prior at t is over every attended s ≠ t, renormalised without s = t (a layer whose mask
            lets a position attend later ones; :func:`prefix_attention_weights`).

    Returns:
        ``[T − start]`` margins of positions [start, T) in the inputs' dtype; ``nan`` where a position has no prefix or
        is padding.
    """
    if heads not in ("mean", "min"):
        raise ValueError(f"heads must be 'mean' or 'min', got {heads!r}")
    if work not in (torch.float32, torch.float64):
        raise ValueError(f"work must be torch.float32 or torch.float64, got {work}")
    num_heads, length, dim = queries.shape
    if not 0 <= start <= length:
        raise ValueError(f"start must be in [0, {length}], got {start}")
    if keys.ndim != 3 or num_heads % keys.shape[0] or keys.shape[1] < length or keys.shape[2] != dim:
        raise ValueError(f"keys must be [KV, {length} (+ extra), {dim}] with H = {num_heads} a multiple of KV, got "
                         f"{tuple(keys.shape)}")
    extra = keys.shape[1] - length  # entries without a position of their own, after the positions' keys
    if bias_term is not None and (extra or not causal):
        raise ValueError("a logit bias that moves with the queries' inputs is read over a causal prefix of the "
                         "positions' keys only")
    groups = num_heads // keys.shape[0]
    product = _products(work)
    budget = WORK_ELEMENTS if work == torch.float64 else WORK_ELEMENTS_FLOAT32
    q_all = queries.to(work)
    k_all = keys.to(work).repeat_interleave(groups, 0) if groups > 1 else keys.to(work)  # [H, T, p]
    u_all = (torch.stack([query_inputs(head) for head in range(num_heads)]) if callable(query_inputs) else
             query_inputs).to(work)  # [H or 1, T, n]: a set shared by every head is not repeated
    width = u_all.shape[-1]
    sinks = None if sinks is None else sinks.to(work)
    parts = []
    for lo in range(start, length, chunk):
        hi = min(length, lo + chunk)
        at = torch.arange(lo, hi, device=queries.device)
        step = max(1, budget // max(1, (hi - lo) * max(width * dim, 3 * hi)))  # heads per group: C_t, or the weights
        seen = hi if causal else length  # causal: no query in the chunk attends a position past hi

        def weights(first: int, last: int) -> tuple[Tensor, Tensor, Tensor]:
            """α, β and the keys of heads [first, last) at the chunk (see above)."""
            q = q_all[first:last, lo:hi]
            k = _attended_columns(k_all[first:last], seen, length, 1)
            prefix = None if valid is None else valid[:seen].expand(last - first, seen)
            given = None if mask is None else mask[first:last] if mask.shape[0] > 1 else mask
            given = None if given is None else _attended_columns(given[:, lo:hi], seen, length, 2)
            logits = product(q, k.transpose(-1, -2)).mul_(scale)  # [h, c, hi]
            capped = None if softcap is None else 1 - torch.tanh(logits / softcap).pow(2)
            sink = None if sinks is None else sinks[first:last, None, None] if sinks.ndim == 1 else \
                sinks[first:last, lo:hi, None]
            alpha = prefix_attention_weights(q, k, scale=scale, valid=prefix, softcap=softcap, window=window,
                                             sink=sink, positions=at, mask=given, logits=logits,
                                             extra=extra, causal=causal)  # [h, c, seen + extra]
            del logits
            return alpha, alpha if capped is None else alpha.mul(capped), k

        groups = [(first, min(num_heads, first + step)) for first in range(0, num_heads, step)]
        given_weights = None
        if bias_term is not None:  # the chunk's F_t needs every head's α before its products run
            given_weights = [weights(first, last) for first, last in groups]
            moved = bias_term(lo, hi, torch.cat([alpha for alpha, _, _ in given_weights])).to(work)  # [H, c, n, n]
        jacobian = query_jacobian(lo, hi)
        per_group = []
        for index, (first, last) in enumerate(groups):
            alpha, beta, k = weights(first, last) if given_weights is None else given_weights[index]
            u = u_all[first:last] if u_all.shape[0] > 1 else u_all
            u = u[:, :seen] if not extra else torch.cat([u[:, :seen], u.new_zeros(u.shape[0], extra, width)], 1)  # x = 0
            margins = _chunk_margins(u, k, alpha, beta, jacobian[first:last], scale, product, budget,
                                     None if bias_term is None else moved[first:last])
            per_group.append(margins.masked_fill(alpha.sum(-1) == 0, math.nan))  # [h, c]
            del alpha, beta
        del jacobian, given_weights
        margins = per_group[0] if len(per_group) == 1 else torch.cat(per_group)
        parts.append(margins.min(0).values if heads == "min" else margins.mean(0))  # nan propagates: no margin anywhere
    out = (parts[0] if len(parts) == 1 else torch.cat(parts)).to(queries.dtype) if parts else queries.new_empty(0)
    return out if valid is None else out.masked_fill(~valid[start:].bool(), math.nan)


def _attended_columns(value: Tensor, hi: int, length: int, axis: int) -> Tensor:
    """``value``'s columns along ``axis`` that queries before ``hi`` may attend: the positions [0, hi) and the entries
    after the ``length`` positions' (keys without a position of their own)."""
    if value.shape[axis] == length:
        return value.narrow(axis, 0, hi)
    return torch.cat([value.narrow(axis, 0, hi), value.narrow(axis, length, value.shape[axis] - length)], axis)


def _chunk_margins(u: Tensor, keys: Tensor, alpha: Tensor, beta: Tensor, jacobian: Tensor, scale: float,
                   product: Callable[[Tensor, Tensor], Tensor], budget: int, bias_term: Tensor | None = None) -> Tensor:
    """log|det(I_p − scale · D_t C_t)| of h heads at a chunk of c query positions: u ``[h or 1, S, n]``, keys
    ``[h, S, p]``, weights α and β ``[h, c, S]``, D ``[h, c, p, n]`` → ``[h, c]`` (``product``: :func:`_products`);
    with a moving bias's F_t ``[h, c, n, n]`` (:func:`layer_margins`) log|det(I_n − scale · C_t D_t − F_t)|.

    C_t = Σ_s β_ts u_s k_sᵀ − ū_t (Σ_s β_ts k_s)ᵀ with ū_t = Σ_s α_ts u_s (Σ_s α_ts < 1 with a sink) is summed as
    Σ_s w_ts (k_s − κ)ᵀ + (Σ_s w_ts) κᵀ with w_ts = β_ts (u_s − ū_t) and κ the keys' mean over the prefix: one batched
    product ``[h, c·n, S'] @ [h, S', p]`` per block of S' prefix positions (the block's w: at most ``budget``
    values)."""
    heads, rows, span = alpha.shape
    width = u.shape[-1]
    block = max(1, budget // max(1, heads * rows * width))
    # ū_t, [h, c, n]; inputs shared by every head: one 2-D product (no copy of u per head)
    mean_u = product(alpha, u) if u.shape[0] > 1 else product(alpha.flatten(0, 1), u[0]).unflatten(0, (heads, rows))
    centre = keys.mean(1, keepdim=True)  # κ, [h, 1, p]
    centred = keys - centre
    u_t = u.transpose(1, 2)  # [h or 1, n, S]
    cross, total = None, None  # Σ_s w_ts (k_s − κ)ᵀ [h, c·n, p] and Σ_s w_ts [h, c·n]
    for start in range(0, span, block):
        stop = min(span, start + block)
        weighted = (u_t[:, None, :, start:stop] - mean_u[..., None]).mul_(beta[:, :, None, start:stop]).flatten(1, 2)
        part = product(weighted, centred[:, start:stop])
        cross = part if cross is None else cross.add_(part)
        total = weighted.sum(-1) if total is None else total.add_(weighted.sum(-1))
        del weighted, part
    cross.add_(total[..., None] * centre)  # [h, c·n, p] + [h, c·n, 1] ⊗ [h, 1, p]
    del total, centred
    if bias_term is not None:
        matrix = product(cross.unflatten(1, (rows, width)), jacobian).double().mul_(-scale).sub_(bias_term.double())
        matrix.diagonal(dim1=-2, dim2=-1).add_(1.0)  # I − scale · C_t D_t − F_t
        return torch.linalg.slogdet(matrix).logabsdet
    matrix = product(jacobian, cross.unflatten(1, (rows, width))).double().mul_(-scale)  # I − scale · D_t C_t
    matrix.diagonal(dim1=-2, dim2=-1).add_(1.0)
    return torch.linalg.slogdet(matrix).logabsdet
