"""Belief-Trajectory Energy (BTE): how much the logit-lens belief moves from layer to layer.

Source: "Measuring the Path to a Prediction" (2026 preprint). BTE_{t,l} = JSD(p_t^(l), p_t^(l+1))
for the logit-lens beliefs p^(l), l = 0..L (l = 0 is the embedding readout); its depth profile
averaged over a central window of layers is the difficulty scalar ē_M.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor


__all__ = [
    "belief_trajectory_energy",
    "central_window",
    "central_window_energy",
    "consecutive_js_divergences",
    "consecutive_js_divergences_of_logits",
    "depth_profile",
    "js_divergence",
    "transition_statistics",
    "TRANSITION_STATISTIC_NAMES",
]

_LN2 = math.log(2.0)
TRANSITION_STATISTIC_NAMES: tuple[str, ...] = (
    "mean", "std", "p10", "p50", "p90", "quarter1", "quarter2", "quarter3", "quarter4", "lag1_autocorr", "top10_mean",
)
"""Column names of :func:`transition_statistics`, in order."""


def _require_float(name: str, t: Tensor) -> None:
    if not torch.is_floating_point(t):
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


def js_divergence(logp: Tensor, logq: Tensor, dim: int = -1) -> Tensor:
    """Jensen–Shannon divergence JSD(p, q) in nats, from log-probabilities.

    Args:
        logp, logq: log-probabilities of the same shape along ``dim`` (treated as logits: renormalised, so
            unnormalised log-weights work too). −inf entries (probability 0) are allowed.
        dim: the distribution axis.

    Returns:
        JSD with ``dim`` removed, in [0, ln 2] (clamped: rounding negatives → 0, cap ln 2);
        symmetric; 0 iff p = q, ln 2 for disjoint supports; higher = more different. Computed in
        float32 (half/bfloat16 are upcast), float64 inputs stay float64.

    Formula: m = (p + q)/2, JSD = ½ Σ p (log p − log m) + ½ Σ q (log q − log m), with 0·log 0 = 0
    (the true JSD, not tuned-lens's symmetrised KL). It is evaluated per entry in a form whose rounding scales
    with the divergence itself: with d = log p − log q, h = d/2, r = tanh h = (p − q)/(p + q),
    p = m(1 + r) and q = m(1 − r), so JSD = ½ Σ m f(h) with
    f = (1 + r) log(1 + r) + (1 − r) log(1 − r) = 2h·tanh h − log(1 + sinh² h) ≥ 0
    (f ≈ h² for close beliefs, → 2 ln 2 for disjoint ones). d is taken from the inputs' differences and the
    float64 difference of their normalisers; m's sum is accumulated in float64 (see :func:`_accurate_sum`).
    The entropy form ½ Σ p log p + ½ Σ q log q − Σ m log m instead subtracts sums of size ≈ the entropy, whose
    rounding does not shrink with the divergence (1e-3 relative at JSD 1e-5 in float32; this form: 1e-5).
    """
    _require_float("logp", logp)
    _require_float("logq", logq)
    if logp.shape != logq.shape:
        raise ValueError(f"logp and logq must have the same shape, got {tuple(logp.shape)} and {tuple(logq.shape)}")
    dtype = torch.promote_types(torch.promote_types(logp.dtype, logq.dtype), torch.float32)
    return _js_divergence(_Belief.of(logp.to(dtype), dim), _Belief.of(logq.to(dtype), dim), dim)


_BLOCK = 64
"""Entries summed in the input's precision before :func:`_accurate_sum` continues in float64."""


def _accurate_sum(x: Tensor, dim: int) -> Tensor:
    """Σ of ``x`` along ``dim`` in float64, without a float64 copy of ``x``: float32 sums of blocks of
    :data:`_BLOCK` neighbouring entries (each rounded once, relative to its own small size), then the blocks' sum
    in float64. Every row is reduced alone, in the same order whatever the rows beside it."""
    if x.dtype == torch.float64:
        return x.sum(dim)
    x = x.movedim(dim, -1)
    n = x.shape[-1]
    main = n - n % _BLOCK
    total = x[..., :main].unflatten(-1, (main // _BLOCK, _BLOCK)).sum(-1).sum(-1, dtype=torch.float64)
    if main < n:
        total += x[..., main:].sum(-1, dtype=torch.float64)
    return total


class _Belief:
    """One distribution softmax(z) along ``dim``: its logits z (kept as given), the float64 log-normaliser
    c = log Σ exp z (keepdim), and its probabilities p = exp(z − max z) / Σ exp(z − max z), so that
    log p = z − c exactly up to the rounding of z itself."""

    __slots__ = ("logits", "log_normalizer", "probs")

    def __init__(self, logits: Tensor, log_normalizer: Tensor, probs: Tensor) -> None:
        self.logits, self.log_normalizer, self.probs = logits, log_normalizer, probs

    @classmethod
    def of(cls, logits: Tensor, dim: int, probs_out: Tensor | None = None) -> _Belief:
        """The belief of softmax(``logits``); its probabilities are written into ``probs_out`` when given (``logits``
        is not modified)."""
        top = logits.amax(dim, keepdim=True)
        top = top.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)  # a row of −inf stays −inf, not nan (0 for any
        # maximum that is not finite: one pass)
        probs = torch.sub(logits, top, out=probs_out).exp_()
        total = _accurate_sum(probs, dim).unsqueeze(dim)
        probs.div_(total.to(probs.dtype))
        return cls(logits, top.double() + total.log(), probs)


def _half_log_ratio_cap(dtype: torch.dtype) -> float:
    """|h| = |log p − log q|/2 is capped here, where f(h) = 2 ln 2 − 4h·e^(−2h) − … is 2 ln 2 = f(∞) to below the
    arithmetic's own rounding (float32: f(10) = 2 ln 2 − 8e-8; float64: f(20) = 2 ln 2 − 3e-16), and sinh² h is
    finite."""
    return 20.0 if dtype == torch.float64 else 10.0


def _js_divergence(a: _Belief, b: _Belief, dim: int, *, consume_logits: bool = False, work: Tensor | None = None) -> Tensor:
    """The formula of :func:`js_divergence`, ½ Σ m f(h), in the beliefs' dtype.

    ``a`` is used up: its probabilities' tensor becomes m, and with ``consume_logits`` its logits' tensor holds
    h = (log p − log q)/2 (else a new tensor does). ``work``: a tensor of the beliefs' shape to hold h tanh h
    (allocated without it).
    An entry where m = 0 contributes 0, also where h is undefined (both logits −inf).
    """
    shift = (a.log_normalizer - b.log_normalizer).to(a.logits.dtype)  # c_a − c_b, rounded once
    h = torch.sub(a.logits, b.logits, out=a.logits if consume_logits else None)
    cap = _half_log_ratio_cap(h.dtype)
    h.sub_(shift).mul_(0.5).clamp_(-cap, cap)
    h_tanh_h = torch.tanh(h, out=work).mul_(h)
    terms = h.sinh_().square_().log1p_().sub_(h_tanh_h, alpha=2.0)  # −f = log(1 + sinh² h) − 2h tanh h
    m = a.probs.lerp_(b.probs, 0.5)
    terms.mul_(m)
    total = _accurate_sum(terms, dim)
    if bool(torch.isnan(total).any()):  # rare: both logits −inf (h = nan where m = 0). NaN inputs stay NaN
        total = _accurate_sum(terms.masked_fill_(m == 0, 0.0), dim)
    return total.mul_(-0.5).clamp_(0.0, _LN2).add_(0.0).to(a.probs.dtype)  # + 0: no −0.0 for identical beliefs


def consecutive_js_divergences(layer_logprobs: Iterable[Tensor], dim: int = -1) -> Tensor:
    """``JSD(p^(l), p^(l+1))`` of consecutive entries of a stream of log-probabilities, stacked ``[L, ...]``.

    The same values as :func:`js_divergence` of each pair, with each layer's probabilities computed
    once (the stream lets a caller compute one layer's readout at a time). Needs at least two entries.
    """
    out: list[Tensor] = []
    previous: _Belief | None = None
    for logp in layer_logprobs:
        _require_float("layer_logprobs", logp)
        current = _Belief.of(logp.to(torch.promote_types(logp.dtype, torch.float32)), dim)
        if previous is not None:
            if previous.probs.shape != current.probs.shape:
                raise ValueError(f"layer log-probabilities differ in shape: {tuple(previous.probs.shape)} and "
                                 f"{tuple(current.probs.shape)}")
            out.append(_js_divergence(previous, current, dim))
        previous = current
    if not out:
        raise ValueError("consecutive_js_divergences needs at least two layers")
    return torch.stack(out)


def consecutive_js_divergences_of_logits(layer_logits: Iterable[Tensor], dim: int = -1) -> Tensor:
    """:func:`consecutive_js_divergences` of the softmax of each entry of a stream of float logits.

    For a caller that reads out one layer at a time into reusable buffers: every entry but the last is
    overwritten once the next one has arrived (it becomes the JSD's work tensor), so a caller may alternate two
    buffers, writing layer l + 2's logits where layer l's were. The probabilities live in two buffers and the
    JSD's terms in one, allocated once (no per-layer allocation of vocabulary-sized tensors).
    """
    out: list[Tensor] = []
    previous: _Belief | None = None
    probs: list[Tensor] = []
    work: Tensor | None = None
    for index, logits in enumerate(layer_logits):
        if logits.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"layer_logits must be float32 or float64 tensors, got dtype {logits.dtype}")
        if previous is not None and previous.probs.shape != logits.shape:
            raise ValueError(f"layer logits differ in shape: {tuple(previous.probs.shape)} and {tuple(logits.shape)}")
        if len(probs) < 2:
            probs.append(torch.empty_like(logits))
        current = _Belief.of(logits, dim, probs_out=probs[index % 2])  # the previous belief holds the other buffer
        if previous is not None:
            if work is None:
                work = torch.empty_like(logits)
            out.append(_js_divergence(previous, current, dim, consume_logits=True, work=work))
        previous = current
    if not out:
        raise ValueError("consecutive_js_divergences_of_logits needs at least two layers")
    return torch.stack(out)


def belief_trajectory_energy(layer_logprobs: Tensor) -> Tensor:
    """Per-transition energy BTE_l = JSD(p^(l), p^(l+1)) for l = 0..L−1.

    Args:
        layer_logprobs: ``[L+1, ..., V]`` log-probabilities of the logit-lens beliefs of layers
            0..L (layer 0 = embedding readout, layer L = the model's own output), L ≥ 1.

    Returns:
        ``[L, ...]`` JSD in nats, in [0, ln 2]; higher = the belief moves more at that depth.
        A caller that streams layers can call :func:`js_divergence` per adjacent pair instead.
    """
    _require_float("layer_logprobs", layer_logprobs)
    if layer_logprobs.ndim < 2 or layer_logprobs.shape[0] < 2:
        raise ValueError(
            f"layer_logprobs must have shape [L+1, ..., V] with L+1 >= 2, got {tuple(layer_logprobs.shape)}"
        )
    return js_divergence(layer_logprobs[:-1], layer_logprobs[1:], dim=-1)


def depth_profile(energy: Tensor, mask: Tensor | None = None) -> Tensor:
    """Depth profile e(l): mean energy of each transition over response positions.

    Args:
        energy: ``[L, T]`` or ``[L, ..., T]`` per-transition energies, positions last.
        mask: optional bool tensor broadcastable to ``energy.shape[1:]``; True = response position.

    Returns:
        ``[L]`` means over all non-layer entries (selected by ``mask``); length-independent.
        NaN for every layer when no position is selected (T = 0 or an all-False mask).
    """
    _require_float("energy", energy)
    if energy.ndim < 2:
        raise ValueError(f"energy must have shape [L, ..., T], got {tuple(energy.shape)}")
    values = energy.reshape(energy.shape[0], -1)
    if mask is None:
        return values.mean(-1)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    try:
        full = torch.broadcast_to(mask, energy.shape[1:])
    except RuntimeError as err:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to positions {tuple(energy.shape[1:])}"
        ) from err
    weights = full.reshape(1, -1).to(values.dtype)
    return (values * weights).sum(-1) / weights.sum()


def central_window(num_layers: int, window: tuple[int, int] | None = None) -> tuple[int, int]:
    """The central transition window M = [start, stop) used for the difficulty scalar ē_M.

    Args:
        num_layers: L, the number of transitions (= transformer blocks), L ≥ 1.
        window: an explicit (start, stop) with 0 ≤ start < stop ≤ L; None for the default.

    Returns:
        (start, stop); default [⌊3L/8⌋, ⌊5L/8⌋), e.g. (12, 20) for L = 32 and (11, 18) for L = 30.
        Where the default is empty (L = 1 or 3) it is widened to the single transition ⌊3L/8⌋.
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
    if window is None:
        start, stop = (3 * num_layers) // 8, (5 * num_layers) // 8
        return start, max(stop, start + 1)
    if len(window) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in window):
        raise ValueError(f"window must be a (start, stop) pair of ints, got {window!r}")
    start, stop = window
    if not 0 <= start < stop <= num_layers:
        raise ValueError(f"window must satisfy 0 <= start < stop <= {num_layers}, got {window!r}")
    return start, stop


def central_window_energy(profile: Tensor, window: tuple[int, int] | None = None) -> float | Tensor:
    """Difficulty scalar ē_M: mean of the depth profile over the central window.

    Args:
        profile: ``[L]`` depth profile (or ``[..., L]``, layers last).
        window: see :func:`central_window`.

    Returns:
        A Python float for a 1-D profile, else a ``[...]`` tensor; in [0, ln 2] for JSD energies,
        higher = harder (the paper's Spearman ρ with difficulty is positive).
    """
    _require_float("profile", profile)
    if profile.ndim < 1:
        raise ValueError(f"profile must have shape [..., L], got {tuple(profile.shape)}")
    start, stop = central_window(profile.shape[-1], window)
    value = profile[..., start:stop].mean(-1)
    return value.tolist() if profile.ndim == 1 else value  # tolist: no single-value read (a sync on a device)


def _quarter_bounds(num_positions: int) -> list[tuple[int, int]]:
    """[⌊qT/4⌋, max(⌊(q+1)T/4⌋, ⌊qT/4⌋ + 1)) for q = 0..3: a partition when T ≥ 4."""
    bounds = []
    for q in range(4):
        start = (q * num_positions) // 4
        bounds.append((start, max(((q + 1) * num_positions) // 4, start + 1)))
    return bounds


def transition_statistics(energy: Tensor) -> Tensor:
    """Eleven statistics of each transition's energy over the response positions.

    Args:
        energy: ``[L, T]`` per-transition energies of one document, T ≥ 1 response positions.

    Returns:
        ``[L, 11]`` (float64 for float64 input, else float32), columns in order:
        mean, std (population, ddof = 0), P10, P50, P90 (linear interpolation, as numpy),
        the means of the 4 position quarters, lag-1 autocorrelation, mean of the top 10 %.
        Column names are :data:`TRANSITION_STATISTIC_NAMES`. Flattened it gives the paper's
        11·L classifier features.

    Degenerate cases (chosen so that every feature stays finite for finite input):
        - quarters: quarter q covers positions [⌊qT/4⌋, ⌊(q+1)T/4⌋), a partition for T ≥ 4;
          for T < 4 an empty quarter takes the single position ⌊qT/4⌋ (T = 1: all four equal
          the value).
        - lag-1 autocorrelation r = Σ_t (x_t − x̄)(x_{t+1} − x̄) / Σ_t (x_t − x̄)² is 0 when
          T < 2 or the series is constant (max = min).
        - top 10 %: the mean of the ⌈0.1 T⌉ largest values (at least one).
        - T = 1: std 0, all percentiles and quarters equal the value, autocorrelation 0.
    """
    _require_float("energy", energy)
    if energy.ndim != 2 or energy.shape[1] < 1:
        raise ValueError(f"energy must have shape [L, T] with T >= 1, got {tuple(energy.shape)}")
    out_dtype = torch.float64 if energy.dtype == torch.float64 else torch.float32
    x = energy.to(torch.float64)
    num_positions = x.shape[1]
    mean = x.mean(-1)
    centred = x - mean[:, None]
    std = centred.pow(2).mean(-1).sqrt()
    quantiles = torch.quantile(x, torch.tensor([0.1, 0.5, 0.9], dtype=x.dtype, device=x.device), dim=-1).T
    quarters = torch.stack([x[:, a:b].mean(-1) for a, b in _quarter_bounds(num_positions)], dim=-1)
    num = (centred[:, :-1] * centred[:, 1:]).sum(-1)
    den = centred.pow(2).sum(-1)
    constant = x.amax(-1) == x.amin(-1)
    autocorr = torch.where(constant, torch.zeros_like(num), num / torch.where(constant, torch.ones_like(den), den))
    top_k = (num_positions + 9) // 10  # ⌈0.1 T⌉ without float rounding
    top_mean = x.topk(top_k, dim=-1).values.mean(-1)
    stats = torch.cat([mean[:, None], std[:, None], quantiles, quarters, autocorr[:, None], top_mean[:, None]], dim=-1)
    return stats.to(out_dtype)
