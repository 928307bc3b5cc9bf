"""The one in-place log-softmax of the lens (BTE's readouts, δ_TCB's and the baselines' float64 softmax)."""

from __future__ import annotations

import torch
from torch import Tensor


def log_softmax_(z: Tensor, dim: int = -1, *, probs_out: Tensor | None = None, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """``(log softmax(z), scale · softmax(z))`` along ``dim``; ``z`` itself becomes the log-softmax and the
    probabilities go into ``probs_out`` (a new tensor without it): no other vocabulary-sized tensor is made."""
    z.sub_(z.amax(dim, keepdim=True))
    probs = torch.exp(z, out=probs_out)
    total = probs.sum(dim, keepdim=True)
    probs.div_(total / scale)
    return z.sub_(total.log_()), probs
