"""The log-barrier training penalty of the embedding-level attention prior, and a small GPT that has one.

Source: "Support Tokens, Stability Margins, and a New Foundation for Robust LLMs" (arXiv 2602.22271).
The exact log-likelihood of the latent-noise view of causal attention carries Σ_t m_t with
m_t = log|det(I − Σ_t A)| (:mod:`lm_eval_probes.probes.margin.math`), a log-barrier that is −∞ on the
degeneracy boundary. The penalty adds it to the usual objective:

    loss = CE + λ · mean_t(−max(m_t, −30))

The clamp at −30 (the paper's) keeps one position on the boundary (m_t → −∞) from producing an infinite
loss or gradient; below it the penalty is flat (gradient 0 for that position). Positions without a
prefix (the first token) have no margin and are left out of the mean.

Plain PyTorch loop::

    out = model(input_ids, labels=labels)            # SupportTokenGPT: {"loss", "logits", "margins"}
    loss = barrier_loss(out["loss"], out["margins"], weight=0.05)
    loss.backward(); optimizer.step(); optimizer.zero_grad()

Hugging Face ``Trainer``: ``LogBarrierTrainer(model=model, args=args, train_dataset=ds, barrier_weight=0.05)``
(any model whose output has ``loss`` and ``margins``).

:class:`SupportTokenGPT` is a small pre-LN causal GPT (learned positions) whose first attention layer is
the prior: its margins are the per-head margins of that layer on its (LayerNorm-ed) inputs, averaged over
heads — the same definition as the evaluation-time probe ``probes=margin`` on pretrained models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lm_eval_probes.probes.margin.math import head_margins, prefix_attention_weights

__all__ = ["MARGIN_FLOOR", "GPTConfig", "LogBarrierTrainer", "SupportTokenGPT", "barrier_loss", "log_barrier_penalty"]

MARGIN_FLOOR = -30.0
"""Margins are clamped at this value in the penalty (the paper's −30)."""


def log_barrier_penalty(margins: Tensor, *, mask: Tensor | None = None, floor: float = MARGIN_FLOOR) -> Tensor:
    """mean_t(−max(m_t, floor)) over the positions with a margin.

    Args:
        margins: ``[...]`` margins m_t (``nan`` = undefined: no prefix or padding; left out).
        mask: optional bool, same shape: False = leave the position out too (e.g. padding).
        floor: the clamp (default −30); must be finite and < 0.

    Returns:
        A scalar tensor, lower = further from the degeneracy boundary; 0 when no position has a margin.
        Differentiable; its gradient is finite everywhere (0 for positions below the floor).
    """
    if not torch.is_floating_point(margins):
        raise TypeError(f"margins must be a floating-point tensor, got {margins.dtype}")
    if not (math.isfinite(floor) and floor < 0):
        raise ValueError(f"floor must be finite and < 0, got {floor!r}")
    keep = ~torch.isnan(margins)
    if mask is not None:
        if mask.shape != margins.shape:
            raise ValueError(f"mask must have the margins' shape {tuple(margins.shape)}, got {tuple(mask.shape)}")
        keep = keep & mask.bool()
    safe = torch.where(keep, margins, torch.zeros_like(margins))  # no nan reaches the graph
    count = keep.sum()
    return -(safe.clamp(min=floor) * keep).sum() / count.clamp(min=1)


def barrier_loss(
    loss: Tensor, margins: Tensor, *, weight: float, mask: Tensor | None = None, floor: float = MARGIN_FLOOR
) -> Tensor:
    """``loss + weight · log_barrier_penalty(margins)``: CE plus the log-barrier, λ = ``weight`` ≥ 0
    (the paper: 0.02–0.05, best near 0.05)."""
    if not (math.isfinite(weight) and weight >= 0):
        raise ValueError(f"weight (λ) must be finite and >= 0, got {weight!r}")
    if weight == 0:
        return loss
    return loss + weight * log_barrier_penalty(margins, mask=mask, floor=floor)


@dataclass(frozen=True)
class GPTConfig:
    """Size of a :class:`SupportTokenGPT`: vocabulary, context length, width, blocks and heads."""

    vocab_size: int
    context: int = 128
    d_model: int = 128
    layers: int = 4
    heads: int = 4

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.context, self.d_model, self.layers, self.heads) < 1:
            raise ValueError(f"every GPTConfig size must be >= 1, got {self}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by heads={self.heads}")


class _Attention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = config.heads, config.d_model // config.heads
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, config.d_model)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.o_proj = nn.Linear(config.d_model, config.d_model)

    def _split(self, x: Tensor) -> Tensor:  # [B, T, d] -> [B, H, T, p]
        return x.view(*x.shape[:2], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, *, with_margins: bool, positions: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        q, k, v = self._split(self.q_proj(x)), self._split(self.k_proj(x)), self._split(self.v_proj(x))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        margins = None
        if with_margins:  # the prior over this layer's inputs: per head, strict prefix, averaged over heads
            scale = 1.0 / math.sqrt(self.head_dim)
            weights = prefix_attention_weights(q, k, scale=scale)
            if positions is None:
                margins = head_margins(q, k, weights, scale=scale).mean(1)  # [B, T]; nan at t = 0
            else:
                sampled = head_margins(q, k, weights[..., positions, :], scale=scale, positions=positions).mean(1)
                margins = sampled.new_full(weights.shape[:1] + weights.shape[-1:], math.nan)
                margins = margins.index_copy(1, positions, sampled)  # nan where not sampled
        return self.o_proj(out.transpose(1, 2).reshape(x.shape)), margins


class _Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(config.d_model), nn.LayerNorm(config.d_model)
        self.attn = _Attention(config)
        self.mlp = nn.Sequential(nn.Linear(config.d_model, 4 * config.d_model), nn.GELU(), nn.Linear(4 * config.d_model, config.d_model))

    def forward(self, x: Tensor, *, with_margins: bool, positions: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        attended, margins = self.attn(self.ln_1(x), with_margins=with_margins, positions=positions)
        x = x + attended
        return x + self.mlp(self.ln_2(x)), margins


class SupportTokenGPT(nn.Module):
    """A small pre-LN causal GPT whose first attention layer is the embedding-level attention prior.

    ``forward(input_ids, labels=None, *, noise_std=0.0, generator=None, with_margins=True)`` returns a dict
    with ``logits [B, T, V]``, ``margins [B, T]`` (the first layer's per-head margins on its LayerNorm-ed
    inputs, mean over heads; ``nan`` at position 0; ``None`` with ``with_margins=False``; with
    ``margin_positions`` (int64 ``[n]``) only those positions get a margin, the rest ``nan``: the penalty's
    mean over positions is then estimated on a sample, which cuts its cost by T/n) and, given
    ``labels [B, T]`` (next-token targets aligned with ``input_ids``; −100 = ignore), ``loss`` (mean CE,
    nats). ``noise_std`` adds N(0, σ²) noise to the embeddings (token + position) before the first block:
    the paper's robustness test. Token embeddings are N(0, 1) at init (PyTorch's default), so σ is on
    the embeddings' own scale.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.gpt_config = config  # not `config`: the HF Trainer writes HF config attributes into a model's `config`
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.context, config.d_model)
        nn.init.normal_(self.pos_emb.weight, std=0.1)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(
        self,
        input_ids: Tensor,
        labels: Tensor | None = None,
        *,
        noise_std: float = 0.0,
        generator: torch.Generator | None = None,
        with_margins: bool = True,
        margin_positions: Tensor | None = None,
        **_ignored: Any,
    ) -> dict[str, Any]:
        if input_ids.ndim != 2 or input_ids.shape[1] > self.gpt_config.context:
            raise ValueError(f"input_ids must be [B, T] with T <= {self.gpt_config.context}, got {tuple(input_ids.shape)}")
        if noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {noise_std}")
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tok_emb(input_ids) + self.pos_emb(positions)
        if noise_std:
            x = x + noise_std * torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        margins = None
        for i, block in enumerate(self.blocks):
            x, block_margins = block(x, with_margins=with_margins and i == 0, positions=margin_positions if i == 0 else None)
            margins = block_margins if i == 0 else margins
        logits = self.head(self.ln_f(x))
        out: dict[str, Any] = {"logits": logits, "margins": margins}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
            out = {"loss": out.pop("loss"), **out}  # the HF Trainer reads a dict's loss first
        return out


def _log_barrier_trainer_class() -> type:
    from transformers import Trainer

    class LogBarrierTrainer(Trainer):
        """A Hugging Face ``Trainer`` whose loss is ``outputs["loss"] + λ · log_barrier_penalty(outputs["margins"])``.

        ``barrier_weight`` is λ (keyword-only, ≥ 0); ``margin_floor`` the clamp (default −30). The model's
        output (a dict or a ``ModelOutput``) must carry ``loss`` (its CE: pass labels) and ``margins``.
        """

        def __init__(self, *args: Any, barrier_weight: float, margin_floor: float = MARGIN_FLOOR, **kwargs: Any) -> None:
            if not (math.isfinite(barrier_weight) and barrier_weight >= 0):
                raise ValueError(f"barrier_weight (λ) must be finite and >= 0, got {barrier_weight!r}")
            super().__init__(*args, **kwargs)
            self.barrier_weight, self.margin_floor = float(barrier_weight), float(margin_floor)

        def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False, **kwargs: Any) -> Any:
            outputs = model(**inputs)
            if outputs.get("loss") is None or outputs.get("margins") is None:
                raise ValueError("LogBarrierTrainer needs a model output with 'loss' (pass labels) and 'margins'")
            loss = barrier_loss(outputs["loss"], outputs["margins"], weight=self.barrier_weight, floor=self.margin_floor)
            return (loss, outputs) if return_outputs else loss

    LogBarrierTrainer.__module__ = __name__
    return LogBarrierTrainer


def __getattr__(name: str) -> Any:
    if name == "LogBarrierTrainer":  # built on first use: importing transformers is slow
        cls = _log_barrier_trainer_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
