"""Masked-diffusion decoding with reveal-time confidences, and the Monte-Carlo masked log-likelihood.

Model-free: every function takes a ``forward(ids, want_states) -> (logits, hidden_states | None)``
callable (the model class builds it: attention mask, position ids, logits shift, autocast), so the loop
is tested against an independent reference on any tensor function.

Decoding (LLaDA, Nie et al. 2025, ``generate.py``; "Unsure but Certain", arXiv 2608.08791, §2): a canvas
of ``gen_length`` mask tokens follows the prompt; it is decoded block by block (semi-autoregressive blocks
of ``block_length``), each block in ``steps / num_blocks`` steps. At every step one forward over prompt +
canvas gives each masked position of the current block its argmax token and that token's probability
(softmax in float64); the ``k`` most probable are revealed (low-confidence remasking, greedy = temperature
0), ``k`` from LLaDA's uniform schedule (:func:`transfer_counts`). A token's *reveal-time confidence* is
its probability at the step that revealed it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

Forward = Callable[[torch.Tensor, bool], tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]]
"""``forward(ids [B, T], want_states) -> (logits [B, T, V], hidden_states (L+1 of [B, T, H]) or None)``."""


def transfer_counts(masked: int, steps: int) -> list[int]:
    """Tokens revealed at each of ``steps`` steps of a block with ``masked`` masks: ``masked // steps``
    each, the remainder one more in the first steps (LLaDA's ``get_num_transfer_tokens``; the expected
    count per step is constant under its linear noise schedule). Sums to ``masked``."""
    if steps < 1 or masked < 0:
        raise ValueError(f"transfer_counts needs steps >= 1 and masked >= 0, got steps={steps}, masked={masked}")
    base, remainder = divmod(masked, steps)
    return [base + (1 if i < remainder else 0) for i in range(steps)]


@dataclass(frozen=True)
class Decoded:
    """The outcome of :func:`masked_diffusion_decode` for a batch (CPU tensors).

    Attributes:
        tokens: ``[B, G]`` the canvas after the last step (every position revealed).
        reveal_step: ``[B, G]`` the step (0-based, counted over all blocks) that revealed each position.
        reveal_logprob: ``[B, G]`` float64: ln p of each token at its reveal step (its reveal-time confidence).
        final_logprob: ``[B, G]`` float64: ln p of each token under the last step's forward (the final
            denoising pass). Equal to ``reveal_logprob`` for the tokens revealed at the last step (their
            input was still the mask there); for earlier tokens the pass sees the token itself.
        final_states: the final pass's hidden states of the requested layers, each ``[B, T, H]`` over
            prompt + canvas (``()`` when none were asked for).
    """

    tokens: torch.Tensor
    reveal_step: torch.Tensor
    reveal_logprob: torch.Tensor
    final_logprob: torch.Tensor
    final_states: tuple[torch.Tensor, ...] = ()


@torch.no_grad()
def masked_diffusion_decode(
    forward: Forward,
    prompt: torch.Tensor,
    *,
    mask_token_id: int,
    gen_length: int,
    block_length: int,
    steps: int,
    state_layers: Sequence[int] = (),
) -> Decoded:
    """Decode a canvas of ``gen_length`` masks after ``prompt`` ``[B, P]`` (see the module docstring).

    ``steps`` must be a multiple of the number of blocks ``gen_length / block_length`` and at most
    ``gen_length``; a block never reveals a position past its end. Ties in confidence go to the lower
    position (a stable sort). ``state_layers``: ``hidden_states`` indices kept from the final pass.
    """
    if gen_length % block_length or steps % (gen_length // block_length) or not 1 <= steps <= gen_length:
        raise ValueError(f"invalid schedule: gen_length={gen_length}, block_length={block_length}, steps={steps}")
    batch, prompt_len = prompt.shape
    canvas = torch.full((batch, gen_length), mask_token_id, dtype=prompt.dtype, device=prompt.device)
    ids = torch.cat([prompt, canvas], dim=1)
    reveal_step = torch.full((batch, gen_length), -1, dtype=torch.long)
    reveal_logprob = torch.full((batch, gen_length), float("nan"), dtype=torch.float64)
    num_blocks = gen_length // block_length
    per_block = steps // num_blocks
    final_logits: torch.Tensor | None = None
    final_states: tuple[torch.Tensor, ...] = ()
    for block in range(num_blocks):
        lo, hi = prompt_len + block * block_length, prompt_len + (block + 1) * block_length
        for i, count in enumerate(transfer_counts(block_length, per_block)):
            step = block * per_block + i
            last = step == steps - 1
            logits, states = forward(ids, last and bool(state_layers))
            if last:
                final_logits = logits
                if state_layers:
                    if states is None:
                        raise RuntimeError("the forward returned no hidden_states although asked to")
                    final_states = tuple(states[layer].detach() for layer in state_layers)
            for row in range(batch):  # one row's block in float64 at a time (V can be ~150k)
                best_logprob, best = torch.log_softmax(logits[row, lo:hi].double(), dim=-1).max(dim=-1)  # [block]
                masked = ids[row, lo:hi] == mask_token_id
                confidence = best_logprob.masked_fill(~masked, float("-inf"))
                order = torch.sort(confidence, descending=True, stable=True).indices[:count]
                chosen = order[masked[order]]  # never a position revealed before
                ids[row, lo + chosen] = best[chosen]
                reveal_step[row, lo - prompt_len + chosen.cpu()] = step
                reveal_logprob[row, lo - prompt_len + chosen.cpu()] = best_logprob[chosen].cpu()
            del logits, states  # before the next forward allocates its own
    tokens = ids[:, prompt_len:]
    if final_logits is None:  # unreachable: steps >= 1 and the last step always runs
        raise RuntimeError("the decoding ran no step")
    final_logprob = torch.stack([
        torch.log_softmax(final_logits[row, prompt_len:].double(), dim=-1).gather(-1, tokens[row].unsqueeze(-1)).squeeze(-1).cpu()
        for row in range(batch)
    ])
    return Decoded(tokens=tokens.cpu(), reveal_step=reveal_step, reveal_logprob=reveal_logprob,
                   final_logprob=final_logprob, final_states=final_states)


def request_seed(seed: int, context: Sequence[int], continuation: Sequence[int]) -> int:
    """A 63-bit seed for one request, from the run's ``seed`` and the request's token ids (so the estimate
    depends neither on the request order nor on batching)."""
    text = f"{seed}|{','.join(map(str, context))}|{','.join(map(str, continuation))}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def mc_masks(target_len: int, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of LLaDA's forward process over a continuation of ``target_len`` tokens.

    Row j masks ``m_j`` of the continuation's positions, uniformly at random, where the ``m_j`` are
    ``batch`` evenly spaced counts in 1..target_len from a random start (LLaDA's ``_forward_process``:
    stratified mask ratios). Returns ``(mask [batch, target_len] bool, ratio [batch] = m_j / target_len)``.
    """
    k = int(torch.randint(1, target_len + 1, (), generator=generator))
    counts = torch.round(torch.linspace(float(k), k + (batch - 1) * (target_len / batch), batch)).long()
    counts = (counts - 1) % target_len + 1
    mask = torch.zeros(batch, target_len, dtype=torch.bool)
    for row in range(batch):
        mask[row, torch.randperm(target_len, generator=generator)[: counts[row]]] = True
    return mask, counts.double() / target_len


@torch.no_grad()
def mc_loglikelihood(
    forward: Forward,
    context: torch.Tensor,
    continuation: torch.Tensor,
    *,
    mask_token_id: int,
    samples: int,
    batch_size: int,
    seed: int,
) -> float:
    """Monte-Carlo estimate of ln p(continuation | context) for a masked diffusion LM (LLaDA's
    ``get_loglikelihood``; Nie et al. 2025, Eq. 6 / App. B.6): the mean over ``samples`` random maskings
    of −Σ_masked CE(token) / (masked ratio), i.e. E_m[(L/m) Σ_{i masked} ln p(x_i | unmasked)], a lower
    bound (ELBO) on the log-likelihood. ``context`` ``[P]``, ``continuation`` ``[L]`` (L >= 1) 1-D ids;
    the random masks come from ``seed`` alone (a CPU generator).
    """
    if continuation.numel() < 1:
        raise ValueError("the Monte-Carlo log-likelihood needs a continuation of at least one token")
    if samples % batch_size:
        raise ValueError(f"samples ({samples}) must be a multiple of batch_size ({batch_size})")
    generator = torch.Generator().manual_seed(seed)
    target = continuation.reshape(1, -1)
    full = torch.cat([context.reshape(1, -1), target], dim=1)
    prompt_len, target_len = context.numel(), target.shape[1]
    totals = []
    for _ in range(samples // batch_size):
        mask, ratio = mc_masks(target_len, batch_size, generator)
        mask = mask.to(full.device)
        ids = full.repeat(batch_size, 1)
        ids[:, prompt_len:] = torch.where(mask, torch.full_like(target, mask_token_id), target)
        logits, _ = forward(ids, False)
        token_logprobs = torch.stack([  # one row in float64 at a time
            torch.log_softmax(logits[row, prompt_len:].double(), dim=-1).gather(-1, target[0].unsqueeze(-1)).squeeze(-1)
            for row in range(batch_size)
        ])
        weighted = (token_logprobs * mask).sum(-1).cpu() / ratio
        totals.append(float(weighted.sum()) / batch_size)
    return sum(totals) / len(totals)
