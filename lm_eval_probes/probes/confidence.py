"""Output confidence of a response: option probabilities and geometric-mean token probability.

Source: "Unsure but Certain" (arXiv 2608.08791): multiple-choice confidence is the probability of
the chosen option under a softmax over the options' log-likelihoods (also length-normalised);
generation confidence is the geometric mean of the answer tokens' probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["chosen_option_confidence", "geometric_mean_probability", "option_probabilities"]


def _as_float_tensor(name: str, values: Tensor | Sequence[float]) -> Tensor:
    """A float tensor: float tensors keep their dtype (at least float32), the rest become float64."""
    if not isinstance(values, Tensor):
        return torch.as_tensor(values, dtype=torch.float64)
    if values.is_floating_point():
        return values.to(torch.promote_types(values.dtype, torch.float32))
    if values.dtype in (torch.int32, torch.int64):
        return values.to(torch.float64)
    raise TypeError(f"{name} must be a real-valued tensor, got dtype {values.dtype}")


def _describe(values: Tensor) -> str:
    """The values for an error message (shape only when large)."""
    return str(values.tolist()) if values.numel() <= 20 else f"a tensor of shape {tuple(values.shape)}"


def option_probabilities(
    option_logliks: Tensor | Sequence[float],
    option_lengths: Tensor | Sequence[float] | None = None,
) -> Tensor:
    """Probabilities of the answer options: softmax over their (length-normalised) log-likelihoods.

    Args:
        option_logliks: ``[..., n_options]`` log-likelihoods ln P(option | context), n ≥ 1, no NaN
            or +inf (−inf = impossible option).
        option_lengths: optional positive lengths, same shape as ``option_logliks`` (tokens or
            characters, the caller's choice); each log-likelihood is divided by its length first.

    Returns:
        ``[..., n_options]`` probabilities in [0, 1] summing to 1 (NaN if every option is −inf);
        invariant to adding one constant to all unnormalised log-likelihoods. Python sequences
        give float64, tensors keep their float dtype (at least float32).
        Formula: p_j = exp(ℓ_j / n_j) / Σ_i exp(ℓ_i / n_i) (n_j = 1 without lengths).
    """
    logliks = _as_float_tensor("option_logliks", option_logliks)
    if logliks.ndim < 1 or logliks.shape[-1] < 1:
        raise ValueError(
            f"option_logliks must have shape [..., n_options] with n_options >= 1, got {tuple(logliks.shape)}"
        )
    if (torch.isnan(logliks) | torch.isposinf(logliks)).any().tolist():  # tolist: no single-value read (a sync)
        raise ValueError(f"option_logliks must not contain NaN or +inf, got {_describe(logliks)}")
    if option_lengths is not None:
        lengths = _as_float_tensor("option_lengths", option_lengths).to(logliks.dtype)
        if lengths.shape != logliks.shape:
            raise ValueError(
                f"option_lengths must have the shape of option_logliks {tuple(logliks.shape)}, "
                f"got {tuple(lengths.shape)}"
            )
        if not bool((lengths > 0).all()) or not bool(torch.isfinite(lengths).all()):
            raise ValueError(f"option_lengths must be finite and positive, got {_describe(lengths)}")
        logliks = logliks / lengths
    return torch.softmax(logliks, dim=-1)


def chosen_option_confidence(
    option_logliks: Tensor | Sequence[float],
    option_lengths: Tensor | Sequence[float] | None = None,
) -> tuple[int, float]:
    """The chosen option (argmax) and its probability under :func:`option_probabilities`.

    Args:
        option_logliks: ``[n_options]`` log-likelihoods of one question's options.
        option_lengths: optional ``[n_options]`` lengths for the length-normalised variant.

    Returns:
        (index, probability) with probability in [1/n, 1]; higher = more confident. Ties go to
        the lowest index.
    """
    probs = option_probabilities(option_logliks, option_lengths)
    if probs.ndim != 1:
        raise ValueError(f"option_logliks must have shape [n_options] for one question, got {tuple(probs.shape)}")
    index = probs.argmax().tolist()  # read as lists: no single-value read (a device sync where probs is on one)
    return index, probs[index].tolist()


def geometric_mean_probability(
    token_logprobs: Tensor | Sequence[float],
    mask: Tensor | None = None,
) -> float | Tensor:
    """Geometric mean of token probabilities, exp(mean ln p_t), over the last axis.

    Args:
        token_logprobs: ``[T]`` or ``[..., T]`` log-probabilities ln p_t ≤ 0 of the scored
            tokens (e.g. the extracted final answer, or all generated tokens).
        mask: optional bool tensor of the same shape; True = token counted.

    Returns:
        A Python float for 1-D input, else a ``[...]`` tensor; in [0, 1], higher = more
        confident. NaN when no token is counted (T = 0 or an all-False mask row).
    """
    logprobs = _as_float_tensor("token_logprobs", token_logprobs)
    if logprobs.ndim < 1:
        raise ValueError("token_logprobs must have shape [..., T], got a scalar")
    if torch.isnan(logprobs).any().tolist():  # tolist: no single-value read (a sync on a device)
        raise ValueError("token_logprobs must not contain NaN")
    if mask is None:
        mean = logprobs.mean(-1)  # T = 0 gives NaN
    else:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor, got {type(mask).__name__} {getattr(mask, 'dtype', '')}")
        if mask.shape != logprobs.shape:
            raise ValueError(
                f"mask must have the shape of token_logprobs {tuple(logprobs.shape)}, got {tuple(mask.shape)}"
            )
        zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
        mean = torch.where(mask, logprobs, zero).sum(-1) / mask.sum(-1).to(logprobs.dtype)
    value = mean.exp()
    return value.tolist() if logprobs.ndim == 1 else value
