"""Masked-diffusion decoding with reveal-time confidences, and the Monte-Carlo masked log-likelihoods.

Model-free: every function takes a ``forward(ids, want_states) -> (logits, hidden_states | None)``
callable (the model class builds it: attention mask, position ids, logits shift, autocast), so the loop
is tested against independent references on any tensor function.

Decoding: a canvas of ``gen_length`` mask tokens follows the prompt; one forward over prompt + canvas per
step; a :class:`Sampler` picks each masked position's token and which positions to reveal.

* LLaDA (Nie et al. 2025, ``generate.py``): semi-autoregressive blocks of ``block_length``, each in
  ``steps / num_blocks`` steps revealing :func:`transfer_counts` tokens; ``low_confidence`` ranks by the
  probability of the argmax (or Gumbel-max sampled) token, ``random`` by a uniform draw; optional
  classifier-free guidance and EOS suppression.
* Dream (Ye et al. 2025, ``generation_utils.py``'s ``_sample``): one block, ``steps`` steps over
  ``t = linspace(1, eps, steps + 1)``; ``origin`` reveals each masked position with probability
  ``1 - s/t``; ``maskgit_plus`` / ``topk_margin`` / ``entropy`` reveal the :func:`dream_transfer_count`
  best by top probability, top-1 minus top-2 probability, or negative entropy (of the tempered,
  top-p / top-k filtered distribution).

Whatever ranks the positions, a token's *reveal-time confidence* ("Unsure but Certain", arXiv
2608.08791, §2) is its probability under the model's distribution at the step that revealed it:
softmax in float64 of that step's logits (after the shift, guidance and EOS suppression; before
temperature and top-p). Randomness comes only from per-row ``torch.Generator`` objects (no global
seeding), so a row decodes the same alone or in any batch.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

Forward = Callable[[torch.Tensor, bool], tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]]
"""``forward(ids [B, T], want_states) -> (logits [B, T, V], hidden_states (L+1 of [B, T, H]) or None)``."""

RevealCells = Callable[[Sequence[torch.Tensor], int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]
"""``reveal_cells(hidden_states, row, columns, tokens) -> (cells [k, n], ...)``: per-position reductions of the step's
states (L+1 of ``[B, T, H]``) at the ``n`` columns of ``ids`` the step reveals in ``row``, with their ``tokens``
(``probe_traces=true``: the lens grid at reveal)."""

LLADA_ALGS: tuple[str, ...] = ("low_confidence", "random")
"""LLaDA's remasking strategies (``generate(remasking=…)``): blocks and the uniform schedule."""

DREAM_ALGS: tuple[str, ...] = ("origin", "maskgit_plus", "topk_margin", "entropy")
"""Dream's ``alg`` values (``diffusion_generate(alg=…)``): one block and Dream's time schedule."""

ALGS: tuple[str, ...] = LLADA_ALGS + DREAM_ALGS


def transfer_counts(masked: int, steps: int) -> list[int]:
    """Tokens revealed at each of ``steps`` steps of a block with ``masked`` masks: ``masked // steps``
    each, the remainder one more in the first steps (LLaDA's ``get_num_transfer_tokens``; the expected
    count per step is constant under its linear noise schedule). Sums to ``masked``."""
    if steps < 1 or masked < 0:
        raise ValueError(f"transfer_counts needs steps >= 1 and masked >= 0, got steps={steps}, masked={masked}")
    base, remainder = divmod(masked, steps)
    return [base + (1 if i < remainder else 0) for i in range(steps)]


def dream_timesteps(steps: int, eps: float) -> torch.Tensor:
    """Dream's time grid ``linspace(1, eps, steps + 1)`` in float32 (CPU), ``t`` of step i = entry i, ``s`` = i + 1."""
    if steps < 1 or not 0 < eps < 1:
        raise ValueError(f"dream_timesteps needs steps >= 1 and 0 < eps < 1, got steps={steps}, eps={eps}")
    return torch.linspace(1, eps, steps + 1)


def dream_transfer_count(masked: int, step: int, steps: int, timesteps: torch.Tensor) -> int:
    """Tokens Dream reveals at ``step`` (0-based) with ``masked`` masks left: ``int(masked · (1 − s/t))``
    computed in float32 as Dream does (t, s = ``timesteps[step]``, ``timesteps[step + 1]``), all of them at
    the last step. Can be 0 (then that step reveals nothing)."""
    if step == steps - 1:
        return masked
    t, s = timesteps[step], timesteps[step + 1]
    return int(torch.tensor(float(masked), dtype=torch.float32) * (1 - s / t))


@dataclass(frozen=True)
class Sampler:
    """How one denoising step picks tokens and the positions to reveal.

    Attributes:
        alg: one of :data:`ALGS` (LLaDA's ``low_confidence`` / ``random`` or Dream's ``origin`` /
            ``maskgit_plus`` / ``topk_margin`` / ``entropy``).
        temperature: 0 = greedy. LLaDA: Gumbel-max over ``exp(logits) / (−ln u)^temperature`` in float64;
            Dream: a categorical draw from ``softmax(logits / temperature)`` (after top-p / top-k).
        top_p, top_k: Dream's nucleus / top-k filters (``None`` = off); applied at every temperature.
        alg_temp: Dream's ``alg_temp``: > 0 draws the revealed positions from ``softmax(score / alg_temp)``
            instead of taking the best ``k``.
        eps: Dream's final time (``linspace(1, eps, steps + 1)``).
        cfg_scale: LLaDA's classifier-free guidance, ``un + (cfg_scale + 1)(cond − un)`` where ``un`` is the
            forward with the prompt masked; 0 = off.
        eos_ids, eot_ids: token ids of EOS and end-of-turn (LLaDA: 126081, 126348).
        logits_eos_inf: the EOS logits are −inf at every step (LLaDA's ``logits_eos_inf``).
        confidence_eos_eot_inf: ``low_confidence`` ranks with EOS and EoT excluded from the ranking softmax
            (LLaDA's ``confidence_eos_eot_inf``; their own score is then 0). As in LLaDA's code, with
            temperature > 0 only EoT is excluded (its chained assignment writes EOS into the noised copy).
        ranking_dtype: dtype of the ranking softmax / scores; ``None`` = the logits' own dtype (the
            official codes' rule: in bfloat16 many scores tie, and ties go to the lower position here,
            where ``torch.topk``'s order is unspecified). Default float64.
    """

    alg: str = "low_confidence"
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    alg_temp: float = 0.0
    eps: float = 1e-3
    cfg_scale: float = 0.0
    eos_ids: tuple[int, ...] = ()
    eot_ids: tuple[int, ...] = ()
    logits_eos_inf: bool = False
    confidence_eos_eot_inf: bool = False
    ranking_dtype: torch.dtype | None = torch.float64

    def __post_init__(self) -> None:
        if self.alg not in ALGS:
            raise ValueError(f"unknown diffusion alg {self.alg!r}; valid: {', '.join(ALGS)}")
        if self.temperature < 0 or self.alg_temp < 0 or self.cfg_scale < 0:
            raise ValueError(f"temperature, alg_temp and cfg_scale must be >= 0, got {self}")

    @property
    def dream(self) -> bool:
        """Whether the algorithm is Dream's (one block, Dream's time schedule)."""
        return self.alg in DREAM_ALGS

    @property
    def random(self) -> bool:
        """Whether a step draws random numbers (then every row needs a generator)."""
        return self.temperature > 0 or self.alg in ("random", "origin") or (self.dream and self.alg_temp > 0)


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
        reveal_cells: with a ``reveal_cells`` callback, what it returned for each position at its reveal step,
            each ``[B, k, G]`` (CPU; ``()`` without one).
    """

    tokens: torch.Tensor
    reveal_step: torch.Tensor
    reveal_logprob: torch.Tensor
    final_logprob: torch.Tensor
    final_states: tuple[torch.Tensor, ...] = ()
    reveal_cells: tuple[torch.Tensor, ...] = ()


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
    sampler: Sampler = Sampler(),
    generators: Sequence[torch.Generator] | None = None,
    reveal_cells: RevealCells | None = None,
) -> Decoded:
    """Decode a canvas of ``gen_length`` masks after ``prompt`` ``[B, P]`` (see the module docstring).

    LLaDA's algorithms: ``steps`` must be a multiple of the number of blocks ``gen_length / block_length``
    and at most ``gen_length``; a block never reveals a position past its end. Dream's: one block
    (``block_length == gen_length``), any ``steps >= 1``. Ties in a ranking go to the lower position (a
    stable sort). ``generators``: one CPU generator per row, required when ``sampler.random``; row r's
    draws come from ``generators[r]`` alone. ``state_layers``: ``hidden_states`` indices kept from the final
    (conditional) pass. ``reveal_cells``: called at every step with that step's (conditional) hidden states and the
    positions it reveals (every forward then returns its states; nothing of them outlives the step but what the
    callback returns, kept in :attr:`Decoded.reveal_cells`).
    """
    if sampler.dream:
        if block_length != gen_length or steps < 1:
            raise ValueError(f"Dream's sampler decodes one block in steps >= 1: gen_length={gen_length}, "
                             f"block_length={block_length}, steps={steps}")
    elif gen_length % block_length or steps % (gen_length // block_length) or not 1 <= steps <= gen_length:
        raise ValueError(f"invalid schedule: gen_length={gen_length}, block_length={block_length}, steps={steps}")
    batch, prompt_len = prompt.shape
    if sampler.random and (generators is None or len(generators) != batch):
        raise ValueError(f"{sampler.alg} at temperature {sampler.temperature} draws random numbers: pass one generator per row ({batch})")
    canvas = torch.full((batch, gen_length), mask_token_id, dtype=prompt.dtype, device=prompt.device)
    ids = torch.cat([prompt, canvas], dim=1)
    reveal_step = torch.full((batch, gen_length), -1, dtype=torch.long)
    reveal_logprob = torch.full((batch, gen_length), float("nan"), dtype=torch.float64)
    num_blocks = gen_length // block_length
    per_block = steps // num_blocks
    timesteps = dream_timesteps(per_block, sampler.eps) if sampler.dream else None
    forward = guided_forward(forward, prompt_len, mask_token_id, sampler.cfg_scale)
    final_logits: torch.Tensor | None = None
    final_states: tuple[torch.Tensor, ...] = ()
    cells: list[torch.Tensor] = []
    for block in range(num_blocks):
        lo, hi = prompt_len + block * block_length, prompt_len + (block + 1) * block_length
        counts = None if sampler.dream else transfer_counts(block_length, per_block)
        for i in range(per_block):
            step = block * per_block + i
            last = step == steps - 1
            logits, states = forward(ids, reveal_cells is not None or (last and bool(state_layers)))
            if sampler.logits_eos_inf and sampler.eos_ids:
                logits[:, :, list(sampler.eos_ids)] = float("-inf")
            if last:
                final_logits = logits
                if state_layers:
                    if states is None:
                        raise RuntimeError("the forward returned no hidden_states although asked to")
                    final_states = tuple(states[layer].detach() for layer in state_layers)
            for row in range(batch):  # one row's block at a time (V can be ~150k)
                masked = ids[row, lo:hi] == mask_token_id
                if not bool(masked.any()):
                    continue
                generator = generators[row] if generators is not None else None
                block_logits = logits[row, lo:hi]
                if sampler.dream:
                    chosen, tokens = _dream_step(block_logits, masked, i, per_block, timesteps, sampler, generator)
                else:
                    chosen, tokens = _llada_step(block_logits, masked, counts[i], sampler, generator)
                if chosen.numel() == 0:
                    continue
                logprob = torch.log_softmax(block_logits[chosen].double(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
                ids[row, lo + chosen] = tokens
                reveal_step[row, lo - prompt_len + chosen.cpu()] = step
                reveal_logprob[row, lo - prompt_len + chosen.cpu()] = logprob.cpu()
                if reveal_cells is not None:
                    if states is None:
                        raise RuntimeError("the forward returned no hidden_states although asked to")
                    got = reveal_cells(states, row, lo + chosen, tokens)
                    if not cells:
                        cells = [torch.zeros(batch, value.shape[0], gen_length, dtype=value.dtype) for value in got]
                    for kept, value in zip(cells, got, strict=True):
                        kept[row, :, lo - prompt_len + chosen.cpu()] = value.cpu()
            del logits, states  # before the next forward allocates its own
    tokens = ids[:, prompt_len:]
    if final_logits is None:  # unreachable: steps >= 1 and the last step always runs
        raise RuntimeError("the decoding ran no step")
    final_logprob = torch.stack([
        torch.log_softmax(final_logits[row, prompt_len:].double(), dim=-1).gather(-1, tokens[row].unsqueeze(-1)).squeeze(-1).cpu()
        for row in range(batch)
    ])
    return Decoded(tokens=tokens.cpu(), reveal_step=reveal_step, reveal_logprob=reveal_logprob,
                   final_logprob=final_logprob, final_states=final_states, reveal_cells=tuple(cells))


def _ranking(values: torch.Tensor, sampler: Sampler) -> torch.Tensor:
    return values if sampler.ranking_dtype is None else values.to(sampler.ranking_dtype)


def _llada_step(logits: torch.Tensor, masked: torch.Tensor, count: int, sampler: Sampler,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """LLaDA's step on one row's block: ``logits`` ``[n, V]`` (guided, EOS-suppressed), ``masked`` ``[n]``.
    Returns (block positions revealed, their tokens)."""
    device = logits.device
    if sampler.temperature > 0:  # Gumbel-max in float64: exp(z) / (-ln u)^temperature
        noise = torch.rand(logits.shape, dtype=torch.float64, generator=generator).to(device)
        tokens = (logits.double().exp() / (-torch.log(noise)) ** sampler.temperature).argmax(dim=-1)
    else:
        tokens = logits.argmax(dim=-1)
    if sampler.alg == "low_confidence":
        ranked = logits
        if sampler.confidence_eos_eot_inf:
            excluded = list(sampler.eot_ids) + (list(sampler.eos_ids) if sampler.temperature == 0 else [])
            ranked = logits.clone()
            ranked[:, excluded] = float("-inf")
        scores = torch.softmax(_ranking(ranked, sampler), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    else:  # random remasking: a uniform score per position
        scores = torch.rand(masked.shape[0], generator=generator).to(device)
    scores = scores.masked_fill(~masked, float("-inf"))
    order = torch.sort(scores, descending=True, stable=True).indices[:count]
    chosen = order[masked[order]]
    return chosen, tokens[chosen]


def _dream_filtered_probs(logits: torch.Tensor, sampler: Sampler) -> torch.Tensor:
    """Dream's ``sample_tokens`` distribution: logits / temperature, then top-p and top-k (filtered entries
    set to the dtype's minimum), then softmax."""
    logits = _ranking(logits, sampler)
    if sampler.temperature > 0:
        logits = logits / sampler.temperature
    lowest = torch.finfo(logits.dtype).min
    if sampler.top_p is not None and sampler.top_p < 1:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        beyond = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1) > sampler.top_p
        beyond[..., 1:] = beyond[..., :-1].clone()  # keep the token that crosses top_p
        beyond[..., 0] = False
        logits = logits.masked_fill(torch.zeros_like(beyond).scatter(-1, order, beyond), lowest)
    if sampler.top_k is not None:
        kth = torch.topk(logits, min(sampler.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, lowest)
    return torch.softmax(logits, dim=-1)


def _dream_tokens(logits: torch.Tensor, sampler: Sampler, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream's ``sample_tokens`` on ``[m, V]`` logits: (ranking score, token) per row of ``logits``."""
    probs = _dream_filtered_probs(logits, sampler)
    if sampler.temperature > 0:  # a categorical draw by inverse CDF: one CPU uniform per row, the rest on the device
        uniform = torch.rand(probs.shape[0], 1, dtype=torch.float64, generator=generator).to(probs.device)
        cdf = probs.double().cumsum(dim=-1)
        tokens = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
        score = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    else:
        score, tokens = probs.max(dim=-1)
    if sampler.alg == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        score = top2[:, 0] - top2[:, 1]
    elif sampler.alg == "entropy":
        score = (probs * torch.log(probs + 1e-10)).sum(dim=-1)
    return score, tokens


def _dream_step(logits: torch.Tensor, masked: torch.Tensor, step: int, steps: int, timesteps: torch.Tensor,
                sampler: Sampler, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream's step on one row's canvas: ``logits`` ``[n, V]`` (shifted, guided), ``masked`` ``[n]``."""
    positions = masked.nonzero().squeeze(-1)
    masked_logits = logits[positions]
    if sampler.alg == "origin":  # each masked position revealed with probability 1 - s/t (all at the last step)
        draws = torch.rand(positions.numel(), generator=generator)  # drawn at the last step too, as Dream does
        moving = draws < (1 - timesteps[step + 1] / timesteps[step] if step < steps - 1 else 1)
        moving = moving.to(logits.device)
        if not bool(moving.any()):
            return positions[:0], positions[:0]
        _, tokens = _dream_tokens(masked_logits[moving], sampler, generator)
        return positions[moving], tokens
    scores, tokens = _dream_tokens(masked_logits, sampler, generator)
    count = dream_transfer_count(positions.numel(), step, steps, timesteps)
    if count <= 0:
        return positions[:0], positions[:0]
    if sampler.alg_temp > 0:
        weights = torch.softmax(scores.double() / sampler.alg_temp, dim=-1)
        picked = torch.multinomial(weights.cpu(), count, generator=generator).to(logits.device)
    else:
        picked = torch.sort(scores, descending=True, stable=True).indices[:count]
    return positions[picked], tokens[picked]


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


def guided_forward(forward: Forward, prompt_len: int, mask_token_id: int, cfg_scale: float) -> Forward:
    """``forward`` with LLaDA's unsupervised classifier-free guidance: ``un + (cfg_scale + 1)(cond − un)``,
    ``un`` the logits with the first ``prompt_len`` columns masked; ``cfg_scale = 0`` returns ``forward``."""
    if cfg_scale <= 0:
        return forward

    def guided(ids: torch.Tensor, want_states: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        logits, states = forward(ids, want_states)
        unconditioned = ids.clone()
        unconditioned[:, :prompt_len] = mask_token_id
        un_logits, _ = forward(unconditioned, False)
        return un_logits + (cfg_scale + 1) * (logits - un_logits), states

    return guided


def _masked_token_logprobs(forward: Forward, ids: torch.Tensor, prompt_len: int, target: torch.Tensor) -> torch.Tensor:
    """``[b, L]`` float64 ln p of each continuation token under one forward of ``ids`` ``[b, P + L]``."""
    logits, _ = forward(ids, False)
    return torch.stack([  # one row in float64 at a time
        torch.log_softmax(logits[row, prompt_len:].double(), dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
        for row in range(ids.shape[0])
    ]).cpu()


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
    cfg_scale: float = 0.0,
) -> float:
    """Monte-Carlo estimate of ln p(continuation | context) for a masked diffusion LM (LLaDA's
    ``get_loglikelihood``; Nie et al. 2025, Eq. 6 / App. B.6): the mean over ``samples`` random maskings
    of −Σ_masked CE(token) / (masked ratio), i.e. E_m[(L/m) Σ_{i masked} ln p(x_i | unmasked)], a lower
    bound (ELBO) on the log-likelihood. ``context`` ``[P]``, ``continuation`` ``[L]`` (L >= 1) 1-D ids;
    the random masks come from ``seed`` alone (a CPU generator). ``cfg_scale``: LLaDA's guidance
    (:func:`guided_forward`; its likelihood tasks use 0.5–2.0).
    """
    if continuation.numel() < 1:
        raise ValueError("the Monte-Carlo log-likelihood needs a continuation of at least one token")
    if samples % batch_size:
        raise ValueError(f"samples ({samples}) must be a multiple of batch_size ({batch_size})")
    return _masked_estimate(forward, context, continuation, mask_token_id=mask_token_id, cfg_scale=cfg_scale,
                            rounds=samples // batch_size, batch_size=batch_size, seed=seed,
                            draw=lambda length, generator, _prompt_len: mc_masks(length, batch_size, generator))


MaskDraw = Callable[[int, torch.Generator, int], tuple[torch.Tensor, torch.Tensor]]
"""(continuation length, generator, prompt length) → one batch's ``(mask [batch, length] bool, weight [batch])``."""


def _masked_estimate(forward: Forward, context: torch.Tensor, continuation: torch.Tensor, *, mask_token_id: int,
                     cfg_scale: float, rounds: int, batch_size: int, seed: int, draw: MaskDraw) -> float:
    """The mean over ``rounds`` batches of maskings (``draw``, from a CPU generator seeded with ``seed``) of
    Σ_masked ln p(token | the rest) / weight: the Monte-Carlo likelihoods of LLaDA and Dream."""
    generator = torch.Generator().manual_seed(seed)
    target = continuation.reshape(-1)
    full = torch.cat([context.reshape(-1), target]).reshape(1, -1)
    prompt_len, target_len = context.numel(), target.numel()
    forward = guided_forward(forward, prompt_len, mask_token_id, cfg_scale)
    totals = []
    for _ in range(rounds):
        mask, weight = draw(target_len, generator, prompt_len)
        ids = full.repeat(batch_size, 1)
        ids[:, prompt_len:] = torch.where(mask.to(full.device), torch.full_like(target, mask_token_id), target)
        token_logprobs = _masked_token_logprobs(forward, ids, prompt_len, target)
        totals.append(float(((token_logprobs * mask).sum(-1) / weight).sum()) / batch_size)
    return sum(totals) / len(totals)


def dream_masks(target_len: int, batch: int, eps: float, generator: torch.Generator, *,
                first_fixed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of Dream's forward process over a continuation of ``target_len`` tokens whose last token
    (the EOS Dream's harness appends) is never masked: times ``t_j = (u + j / batch) mod 1`` (one uniform
    ``u``: stratified), mask probability ``p_j = (1 − eps) t_j + eps``, each other position masked
    independently with probability ``p_j`` (``first_fixed``: the continuation starts the sequence, whose
    first token Dream never masks either). Returns ``(mask [batch, target_len] bool, p [batch] float64)``."""
    u = torch.rand(1, generator=generator)
    t = (u + torch.arange(batch, dtype=torch.float32) / batch) % 1
    p = (1 - eps) * t + eps
    mask = torch.rand(batch, target_len, generator=generator) < p[:, None]
    mask[:, -1] = False
    if first_fixed:
        mask[:, 0] = False
    return mask, p.double()


@torch.no_grad()
def dream_mc_loglikelihood(
    forward: Forward,
    context: torch.Tensor,
    continuation: torch.Tensor,
    *,
    mask_token_id: int,
    samples: int,
    batch_size: int,
    seed: int,
    eps: float = 1e-3,
    cfg_scale: float = 0.0,
) -> float:
    """Dream's Monte-Carlo log-likelihood (its harness's ``_eval_target_nll_mc``, ``log_type=ftb``):
    ``continuation`` ends with the EOS the harness appends (never masked, context only); per sample
    (:func:`dream_masks`) −Σ_masked CE(token) / p, averaged over ``samples`` (at least one batch).
    In expectation ``E_t[Σ_S p^|S|(1−p)^(L−|S|) Σ_{i∈S} ln p(x_i | x without S) / p]``, t uniform,
    ``p = (1 − eps) t + eps``, over the L maskable tokens; a masking that hides nothing counts 0.
    """
    if continuation.numel() < 2:
        raise ValueError("Dream's log-likelihood needs the continuation and its appended EOS (>= 2 tokens)")
    return _masked_estimate(
        forward, context, continuation, mask_token_id=mask_token_id, cfg_scale=cfg_scale,
        rounds=max(samples // batch_size, 1), batch_size=batch_size, seed=seed,
        draw=lambda length, generator, prompt_len: dream_masks(length, batch_size, eps, generator,
                                                               first_fixed=prompt_len == 0))


def trajectory_steps(steps: int, fractions: Sequence[float] = (0.25, 0.5, 0.75, 1.0)) -> tuple[int, ...]:
    """The 0-based steps at ``fractions`` of a ``steps``-step decoding: ``ceil(f · steps) − 1`` (1.0 → the last
    step), distinct and increasing."""
    if steps < 1 or any(not 0 < f <= 1 for f in fractions):
        raise ValueError(f"trajectory_steps needs steps >= 1 and fractions in (0, 1], got {steps}, {fractions}")
    return tuple(sorted({max(0, math.ceil(f * steps) - 1) for f in fractions}))


@torch.no_grad()
def trajectory_logprobs(
    forward: Forward,
    prompt: torch.Tensor,
    decoded: Decoded,
    *,
    mask_token_id: int,
    at_steps: Sequence[int],
    sampler: Sampler = Sampler(),
) -> torch.Tensor:
    """``[B, len(at_steps), G]`` float64: ln p of every canvas position's **final** token under the forward
    the decoding ran at each step of ``at_steps`` (masked or not), for calibration along the denoising
    trajectory. The canvas of step k is rebuilt from ``decoded.reveal_step`` (tokens revealed before k, the
    rest masked), so this replays exactly the inputs the decoding saw (one forward per step, with the
    sampler's guidance and EOS suppression): at a token's reveal step it equals its reveal-time log-probability.
    """
    prompt_len = prompt.shape[1]
    forward = guided_forward(forward, prompt_len, mask_token_id, sampler.cfg_scale)
    tokens = decoded.tokens.to(prompt.device)
    steps = []
    for step in at_steps:
        canvas = torch.where((decoded.reveal_step < step).to(prompt.device), tokens, torch.full_like(tokens, mask_token_id))
        logits, _ = forward(torch.cat([prompt, canvas], dim=1), False)
        if sampler.logits_eos_inf and sampler.eos_ids:
            logits[:, :, list(sampler.eos_ids)] = float("-inf")
        steps.append(torch.stack([
            torch.log_softmax(logits[row, prompt_len:].double(), dim=-1).gather(-1, tokens[row].unsqueeze(-1)).squeeze(-1).cpu()
            for row in range(tokens.shape[0])
        ]))
        del logits
    return torch.stack(steps, dim=1)
