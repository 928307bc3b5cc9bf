"""The one in-place log-softmax of the lens (BTE's readouts, δ_TCB's and the baselines' float64 softmax)."""

from __future__ import annotations

import torch
from torch import Tensor


def log_softmax_(z: Tensor, dim: int = -1, *, probs_out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(log softmax(z), softmax(z))`` along ``dim``; ``z`` itself becomes the log-softmax and the probabilities
    go into ``probs_out`` (a new tensor without it): no other vocabulary-sized tensor is made.

    Below float64 the probabilities are the exponentials of the returned log-probabilities, so the two agree
    entry by entry (to exp's own rounding). Probabilities divided by the normaliser would not: in float32 each
    log-probability carries its own rounding of up to half a step at its magnitude (~5e-7 at ln V), which a sum
    Σ p log p over a few large probabilities does not average away, and a small JSD in entropy form would
    inherit it. In float64 that rounding is ~1e-16, and the probabilities are the exponentials divided by their
    sum (one exp pass fewer).
    """
    z.sub_(z.amax(dim, keepdim=True))
    probs = torch.exp(z, out=probs_out)
    total = probs.sum(dim, keepdim=True)
    if z.dtype == torch.float64:
        probs.div_(total)
        return z.sub_(total.log_()), probs
    z.sub_(total.log_())
    return z, torch.exp(z, out=probs)
