"""HyperLens refinement area Ω: how much confidence the model still has to build up across depth.

Source: "HyperLens: Quantifying Cognitive Effort …" (arXiv 2605.05741). The state of source layer i is
decoded at focal depth m, D_m(H_i) = softmax(W_U · norm(f_N ∘ … ∘ f_{N−m+1}(H_i))) (m = 0: the logit
lens); the confidence trajectory C_i is the mean over response positions of the top-K probability mass
of D_m(H_i), and Ω = Σ_i (1 − C_i) is the area above it (unit spacing). Higher Ω = the prediction is
settled later in depth (the paper: more cognitive effort, harder tasks).

The propagation through the model's blocks lives with the architecture knowledge
(:class:`lm_eval_probes.capture.readouts.FocalDepthDecoder`); this module is the pure math on its logits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..bte.math import depth_profile

__all__ = ["confidence_trajectory", "refinement_area", "top_k_mass"]


def top_k_mass(logits: Tensor, k: int = 1, dim: int = -1) -> Tensor:
    """Probability mass of the ``k`` most likely entries of softmax(``logits``).

    Args:
        logits: real logits (or log-probabilities) of any shape; ``dim`` is the vocabulary axis (size V).
        k: 1 ≤ k ≤ V.
        dim: the vocabulary axis.

    Returns:
        ``logits`` with ``dim`` removed, in [k/V, 1] (float32, or float64 for float64 input); higher =
        more confident. Formula: Σ_{j ∈ top-k} exp(z_j − logsumexp(z)). A row of equal logits gives k/V;
        −inf entries count as probability 0 (a row that is all −inf is undefined: nan).
    """
    if not torch.is_floating_point(logits):
        raise TypeError(f"logits must be a floating-point tensor, got dtype {logits.dtype}")
    if logits.ndim == 0:
        raise ValueError("logits must have a vocabulary axis, got a scalar")
    vocab = logits.shape[dim]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= vocab:
        raise ValueError(f"k must be an int with 1 <= k <= V = {vocab}, got {k!r}")
    dtype = torch.promote_types(logits.dtype, torch.float32)
    z = logits.to(dtype)
    top = z.topk(k, dim=dim).values
    return (top - torch.logsumexp(z, dim=dim, keepdim=True)).exp().sum(dim).clamp(max=1.0)


def confidence_trajectory(masses: Tensor, mask: Tensor | None = None) -> Tensor:
    """Confidence trajectory C_i: the mean over response positions of each source layer's top-K mass.

    Args:
        masses: ``[S, n]`` (or ``[S, ..., n]``) top-K masses of D_m(H_i) for S source layers (rows) and
            n response positions.
        mask: optional bool tensor broadcastable to ``masses.shape[1:]``; True = a response position.

    Returns:
        ``[S]`` means in [0, 1] (float64 for float64 input), higher = more confident at that source
        layer; independent of the response length. NaN for every layer when no position is selected.
    """
    if not torch.is_floating_point(masses):
        raise TypeError(f"masses must be a floating-point tensor, got dtype {masses.dtype}")
    if masses.ndim < 2:
        raise ValueError(f"masses must have shape [S, ..., n], got {tuple(masses.shape)}")
    return depth_profile(masses, mask)  # the same per-row mean over (selected) positions as BTE's profile


def refinement_area(trajectory: Tensor) -> float | Tensor:
    """Ω = Σ_i (1 − C_i): the area above the confidence trajectory, unit spacing between source layers.

    Args:
        trajectory: ``[S]`` confidences C_i in [0, 1] (or ``[..., S]``, layers last), S ≥ 1.

    Returns:
        A Python float for a 1-D trajectory, else a ``[...]`` tensor; in [0, S], lower = the model is
        confident from shallower layers on. 0 when every layer is fully confident; S(1 − K/V) when
        every layer's decoding is uniform. NaN propagates (an empty response).
    """
    if not torch.is_floating_point(trajectory):
        raise TypeError(f"trajectory must be a floating-point tensor, got dtype {trajectory.dtype}")
    if trajectory.ndim < 1 or trajectory.shape[-1] < 1:
        raise ValueError(f"trajectory must have shape [..., S] with S >= 1, got {tuple(trajectory.shape)}")
    area = (1.0 - trajectory).sum(-1)
    return area.tolist() if trajectory.ndim == 1 else area  # tolist: no single-value read (a sync on a device)
