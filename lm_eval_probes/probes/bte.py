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
        logp, logq: log-probabilities of the same shape (normalised along ``dim``; not checked).
            −inf entries (probability 0) are allowed.
        dim: the distribution axis.

    Returns:
        JSD with ``dim`` removed, in [0, ln 2] (clamped: rounding negatives → 0, cap ln 2);
        symmetric; 0 iff p = q, ln 2 for disjoint supports; higher = more different. Computed in
        float32 (half/bfloat16 are upcast), float64 inputs stay float64.

    Formula: log m = logaddexp(log p, log q) − ln 2,
    JSD = ½ Σ p (log p − log m) + ½ Σ q (log q − log m), with 0·log 0 = 0. (This is the true JSD,
    not tuned-lens's symmetrised KL.)
    """
    _require_float("logp", logp)
    _require_float("logq", logq)
    if logp.shape != logq.shape:
        raise ValueError(f"logp and logq must have the same shape, got {tuple(logp.shape)} and {tuple(logq.shape)}")
    dtype = torch.promote_types(torch.promote_types(logp.dtype, logq.dtype), torch.float32)
    return _js_divergence(_Belief.of(logp.to(dtype)), _Belief.of(logq.to(dtype)), dim)


class _Belief:
    """Log-probabilities with their probabilities (exponentiated once) and whether all are finite."""

    __slots__ = ("finite", "logp", "p")

    def __init__(self, logp: Tensor, p: Tensor, finite: bool) -> None:
        self.logp, self.p, self.finite = logp, p, finite

    @classmethod
    def of(cls, logp: Tensor) -> _Belief:
        # log-probabilities are <= 0: one reduction tells whether a -inf (or a nan) is present
        finite = logp.numel() == 0 or bool(logp.amin() > -math.inf)
        return cls(logp, logp.exp(), finite)


def _js_divergence(a: _Belief, b: _Belief, dim: int) -> Tensor:
    """The formula of :func:`js_divergence` (0·log 0 = 0 handled only where a −inf is present)."""
    log_m = torch.logaddexp(a.logp, b.logp).sub_(_LN2)
    term_a = (a.logp - log_m).mul_(a.p)
    term_b = (b.logp - log_m).mul_(b.p)
    if not a.finite:
        term_a = torch.where(a.p > 0, term_a, torch.zeros((), dtype=term_a.dtype, device=term_a.device))
    if not b.finite:
        term_b = torch.where(b.p > 0, term_b, torch.zeros((), dtype=term_b.dtype, device=term_b.device))
    return (0.5 * term_a.add_(term_b).sum(dim)).clamp(0.0, _LN2)


def consecutive_js_divergences(layer_logprobs: Iterable[Tensor], dim: int = -1) -> Tensor:
    """``JSD(p^(l), p^(l+1))`` of consecutive entries of a stream of log-probabilities, stacked ``[L, ...]``.

    The same values as :func:`js_divergence` of each pair, with each layer's probabilities exponentiated
    once (the stream lets a caller compute one layer's readout at a time). Needs at least two entries.
    """
    out: list[Tensor] = []
    previous: _Belief | None = None
    for logp in layer_logprobs:
        _require_float("layer_logprobs", logp)
        current = _Belief.of(logp.to(torch.promote_types(logp.dtype, torch.float32)))
        if previous is not None:
            if previous.logp.shape != current.logp.shape:
                raise ValueError(f"layer log-probabilities differ in shape: {tuple(previous.logp.shape)} and "
                                 f"{tuple(current.logp.shape)}")
            out.append(_js_divergence(previous, current, dim))
        previous = current
    if not out:
        raise ValueError("consecutive_js_divergences needs at least two layers")
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
    return float(value) if profile.ndim == 1 else value


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
