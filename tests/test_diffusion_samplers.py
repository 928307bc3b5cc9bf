"""``hf-probes-diffusion`` against plainly written transcriptions of LLaDA's ``generate`` and Dream's ``_sample``.

The references below are written from the authors' code (LLaDA ``generate.py``, Dream ``generation_utils.py``),
one prompt at a time with Python loops; the project side decodes a left-padded batch through the model class's
own forward. Random draws follow the project's documented per-row convention (one generator per prompt, seeded
from ``diffusion_seed`` and the prompt's tokens): Gumbel noise and ``random`` scores for the current block's
positions, Dream's uniforms / categorical draws for the masked positions in order.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers

from conftest import save_tiny_bert
from lm_eval_probes.models.diffusion_decoding import Sampler, masked_diffusion_decode, request_seed
from lm_eval_probes.models.diffusion import DiffusionProbeHFLM

MASK, EOT = "<|mask|>", "<|eot_id|>"
PROMPTS = ["Question: Mia has 7 apples. Answer:", "The bear is red.", "0 1 2 3 4 5 6 7 8 9 Anne is kind. Anne is"]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert-samplers"), seed=5, special_tokens={"mask_token": MASK, "additional_special_tokens": [EOT]})


class ShiftedLogits(torch.nn.Module):
    """A bidirectional model whose position i outputs the logits of token i + 1 (as Dream's does)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, output_hidden_states=False):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         output_hidden_states=output_hidden_states)
        return transformers.modeling_outputs.MaskedLMOutput(logits=torch.roll(out.logits, -1, dims=1),
                                                            hidden_states=out.hidden_states)


def load_lm(bert_dir: str, *, shifted: bool = False, **kwargs) -> DiffusionProbeHFLM:
    lm = DiffusionProbeHFLM(pretrained=bert_dir, device="cpu", probes="none", **kwargs)
    if shifted:
        lm._model = ShiftedLogits(lm._model)
    return lm


def logits_of(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


# ------------------------------------------------------------------------------------------ references

def llada_generate(model, prompt, *, steps, gen_length, block_length, mask_id, temperature=0.0, cfg_scale=0.0,
                   remasking="low_confidence", logits_eos_inf=False, confidence_eos_eot_inf=False, eos_id=None,
                   eot_id=None, generator=None):
    """LLaDA's ``generate`` for one prompt. Returns (tokens, reveal step per position, ln p at reveal)."""
    x = list(prompt) + [mask_id] * gen_length
    p_len, vocab = len(prompt), None
    reveal_step, reveal_logprob = [None] * gen_length, [None] * gen_length
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks
    step = 0
    for b in range(num_blocks):
        start, end = p_len + b * block_length, p_len + (b + 1) * block_length
        n_masked = sum(1 for pos in range(start, end) if x[pos] == mask_id)
        counts = [n_masked // steps_per_block + (1 if i < n_masked % steps_per_block else 0) for i in range(steps_per_block)]
        for i in range(steps_per_block):
            logits = logits_of(model, x)
            if cfg_scale > 0:
                un_x = [mask_id] * p_len + x[p_len:]
                un_logits = logits_of(model, un_x)
                logits = un_logits + (cfg_scale + 1) * (logits - un_logits)
            if logits_eos_inf:
                logits[:, eos_id] = -math.inf
            vocab = logits.shape[-1]
            block = logits[start:end]
            if temperature > 0:
                u = torch.rand((end - start, vocab), dtype=torch.float64, generator=generator)
                x0 = torch.argmax(block.double().exp() / (-torch.log(u)) ** temperature, dim=-1).tolist()
            else:
                x0 = torch.argmax(block, dim=-1).tolist()
            if remasking == "low_confidence":
                ranked = block.clone()
                if confidence_eos_eot_inf:
                    ranked[:, eot_id] = -math.inf
                    if temperature == 0:  # the same tensor as the noised logits at temperature 0
                        ranked[:, eos_id] = -math.inf
                p = torch.softmax(ranked.double(), dim=-1)
                score = [float(p[j, x0[j]]) for j in range(end - start)]
            else:
                score = torch.rand(end - start, generator=generator).tolist()
            candidates = sorted((-score[j], j) for j in range(end - start) if x[start + j] == mask_id)
            for _, j in candidates[: counts[i]]:
                x[start + j] = x0[j]
                reveal_step[start + j - p_len] = step
                reveal_logprob[start + j - p_len] = float(torch.log_softmax(block[j].double(), -1)[x0[j]])
            step += 1
    return x[p_len:], reveal_step, reveal_logprob


def dream_sample(model, prompt, *, steps, gen_length, mask_id, alg, temperature=0.0, top_p=None, top_k=None,
                 alg_temp=0.0, eps=1e-3, generator=None):
    """Dream's ``_sample`` (with ``sample_tokens``) for one prompt; ``model`` outputs shifted logits."""
    x = list(prompt) + [mask_id] * gen_length
    p_len = len(prompt)
    reveal_step, reveal_logprob = [None] * gen_length, [None] * gen_length
    timesteps = torch.linspace(1, eps, steps + 1)

    def sample_tokens(logits):
        logits = logits.double()
        if temperature > 0:
            logits = logits / temperature
        if top_p is not None and top_p < 1:
            sorted_logits, sorted_index = torch.sort(logits, descending=True)
            remove = torch.cumsum(torch.softmax(sorted_logits, -1), -1) > top_p
            remove[..., 1:] = remove[..., :-1].clone()
            remove[..., 0] = False
            for r in range(logits.shape[0]):
                logits[r, sorted_index[r][remove[r]]] = torch.finfo(logits.dtype).min
        if top_k is not None:
            kth = torch.topk(logits, top_k).values[:, -1:]
            logits = torch.where(logits < kth, torch.finfo(logits.dtype).min, logits)
        probs = torch.softmax(logits, -1)
        if temperature > 0:  # the categorical draw: the first token whose cumulative probability exceeds u
            x0, uniforms = [], torch.rand(probs.shape[0], 1, dtype=torch.float64, generator=generator)
            for r in range(probs.shape[0]):
                u = float(uniforms[r, 0])
                cumulative = torch.cumsum(probs[r], 0)
                x0.append(next(j for j in range(len(cumulative)) if cumulative[j] > u * cumulative[-1]))
            x0 = torch.tensor(x0)
            confidence = probs[torch.arange(len(x0)), x0]
        else:
            confidence, x0 = probs.max(-1)
        if alg == "topk_margin":
            top = torch.sort(probs, descending=True).values
            confidence = top[:, 0] - top[:, 1]
        if alg == "entropy":
            confidence = torch.sum(probs * torch.log(probs + 1e-10), -1)
        return confidence, x0

    for i in range(steps):
        masked = [pos for pos in range(len(x)) if x[pos] == mask_id]
        raw = logits_of(model, x)
        logits = torch.cat([raw[:1], raw[:-1]])
        mask_logits = logits[masked]
        t, s = timesteps[i], timesteps[i + 1]
        revealed: list[tuple[int, int]] = []
        if alg == "origin":
            p_transfer = 1 - s / t if i < steps - 1 else 1
            moving = [j for j, u in enumerate(torch.rand(len(masked), generator=generator)) if u < p_transfer]
            if moving:
                _, x0 = sample_tokens(mask_logits[moving])
                revealed = [(masked[j], int(tok)) for j, tok in zip(moving, x0, strict=True)]
        else:
            confidence, x0 = sample_tokens(mask_logits)
            number = int(torch.tensor(len(masked), dtype=torch.float32) * (1 - s / t)) if i < steps - 1 else len(masked)
            if number > 0:
                if alg_temp:
                    weights = torch.softmax(confidence / alg_temp, -1)
                    picked = torch.multinomial(weights, number, generator=generator).tolist()
                else:
                    picked = [j for _, j in sorted((-float(c), j) for j, c in enumerate(confidence))][:number]
                revealed = [(masked[j], int(x0[j])) for j in picked]
        for pos, tok in revealed:
            x[pos] = tok
            reveal_step[pos - p_len] = i
            reveal_logprob[pos - p_len] = float(torch.log_softmax(logits[pos].double(), -1)[tok])
        if not any(tok == mask_id for tok in x):
            pass
    return x[p_len:], reveal_step, reveal_logprob


# ------------------------------------------------------------------------------------------ decoding

def batched(lm: DiffusionProbeHFLM):
    """The prompts left-padded into one batch, as lm_eval hands them to ``_model_generate``."""
    rows = [lm.tok_encode(p) for p in PROMPTS]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[lm.tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return rows, ids, mask


def generators_for(rows, seed):
    return [torch.Generator().manual_seed(request_seed(seed, row, ())) for row in rows]


def assert_same(got, row, reference):
    tokens, steps, logprobs = reference
    assert got.tokens[row].tolist() == tokens
    assert got.reveal_step[row].tolist() == steps
    # confidences (probabilities) within 1e-6: a padded batch's float32 forward is not bit-equal to one prompt's
    np.testing.assert_allclose(np.exp(got.reveal_logprob[row].numpy()), np.exp(logprobs), rtol=0, atol=1e-6)


LLADA_CASES = [
    dict(alg="low_confidence"),
    dict(alg="low_confidence", block_length=4, steps=4),
    dict(alg="low_confidence", temperature=0.7, block_length=4, steps=8),
    dict(alg="random"),
    dict(alg="random", temperature=1.0, block_length=4, steps=4),
    dict(alg="low_confidence", cfg_scale=1.5, block_length=4, steps=4),
    dict(alg="low_confidence", logits_eos_inf=True, confidence_eos_eot_inf=True),
    dict(alg="low_confidence", confidence_eos_eot_inf=True, temperature=0.5),
]


@pytest.mark.parametrize("case", LLADA_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_llada_sampler_matches_the_reference_batched_with_left_padding(bert_dir, case):
    case = dict(case)
    block_length, steps = case.pop("block_length", 8), case.pop("steps", 8)
    options = {f"diffusion_{k}": v for k, v in case.items()}
    lm = load_lm(bert_dir, diffusion_family="llada", diffusion_gen_length=8, diffusion_block_length=block_length,
                 diffusion_steps=steps, **options)
    rows, ids, mask = batched(lm)
    got = masked_diffusion_decode(lm._forward(mask), ids, mask_token_id=lm.mask_token_id, gen_length=8,
                                  block_length=block_length, steps=steps, sampler=lm.sampler,
                                  generators=generators_for(rows, 1234) if lm.sampler.random else None)
    eos, eot = lm.tokenizer.eos_token_id, lm.tokenizer.convert_tokens_to_ids(EOT)
    assert lm.sampler.eos_ids == (eos,) and lm.sampler.eot_ids == (eot,)
    for row, prompt in enumerate(rows):
        reference = llada_generate(
            lm.model, prompt, steps=steps, gen_length=8, block_length=block_length, mask_id=lm.mask_token_id,
            temperature=case.get("temperature", 0.0), cfg_scale=case.get("cfg_scale", 0.0), remasking=case["alg"],
            logits_eos_inf=case.get("logits_eos_inf", False), confidence_eos_eot_inf=case.get("confidence_eos_eot_inf", False),
            eos_id=eos, eot_id=eot, generator=torch.Generator().manual_seed(request_seed(1234, prompt, ())))
        assert_same(got, row, reference)
        if case.get("logits_eos_inf"):
            assert eos not in got.tokens[row].tolist()


DREAM_CASES = [
    dict(alg="entropy"),
    dict(alg="maskgit_plus"),
    dict(alg="topk_margin"),
    dict(alg="origin"),
    dict(alg="entropy", steps=5),
    dict(alg="maskgit_plus", steps=12),
    dict(alg="entropy", temperature=0.2, top_p=0.95),
    dict(alg="topk_margin", temperature=0.7, top_k=20),
    dict(alg="origin", temperature=0.5, top_p=0.9),
    dict(alg="maskgit_plus", alg_temp=0.5, steps=4),
]


@pytest.mark.parametrize("case", DREAM_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_dream_sampler_matches_the_reference_batched_with_left_padding(bert_dir, case):
    case = dict(case)
    steps = case.pop("steps", 8)
    options = {f"diffusion_{k}": v for k, v in case.items()}
    lm = load_lm(bert_dir, shifted=True, diffusion_family="dream", diffusion_gen_length=8, diffusion_steps=steps, **options)
    assert lm.diffusion_config.logits_shift and lm.diffusion_config.stop_rule == "dream"
    rows, ids, mask = batched(lm)
    got = masked_diffusion_decode(lm._forward(mask), ids, mask_token_id=lm.mask_token_id, gen_length=8, block_length=8,
                                  steps=steps, sampler=lm.sampler,
                                  generators=generators_for(rows, 1234) if lm.sampler.random else None)
    for row, prompt in enumerate(rows):
        reference = dream_sample(lm.model, prompt, steps=steps, gen_length=8, mask_id=lm.mask_token_id,
                                 generator=torch.Generator().manual_seed(request_seed(1234, prompt, ())), **case)
        assert_same(got, row, reference)


def test_dream_schedule_is_not_llada_schedule(bert_dir):
    """Entropy ranking with Dream's time schedule reveals other positions than LLaDA's rule (the issue's 31 of 80)."""
    dream = load_lm(bert_dir, shifted=True, diffusion_family="dream", diffusion_gen_length=8, diffusion_steps=5)
    rows, ids, mask = batched(dream)
    got = masked_diffusion_decode(dream._forward(mask), ids, mask_token_id=dream.mask_token_id, gen_length=8,
                                  block_length=8, steps=5, sampler=dream.sampler)
    per_step = [int((got.reveal_step[0] == s).sum()) for s in range(5)]
    assert per_step == [1, 1, 1, 2, 3]  # int(n (1 - s/t)) of the masks left; LLaDA's would be [2, 2, 2, 1, 1]
    plain = masked_diffusion_decode(dream._forward(mask), ids, mask_token_id=dream.mask_token_id, gen_length=8,
                                    block_length=8, steps=8, sampler=Sampler(alg="low_confidence"))
    assert not torch.equal(plain.reveal_step, masked_diffusion_decode(
        dream._forward(mask), ids, mask_token_id=dream.mask_token_id, gen_length=8, block_length=8, steps=8,
        sampler=dream.sampler).reveal_step)


def test_generation_records_follow_the_seeded_sampler_end_to_end(bert_dir):
    """Through generate_until: each row's generator comes from the seed and its own prompt, whatever its batch."""
    from lm_eval.api.instance import Instance

    def run(batch_size: int, seed: int):
        lm = load_lm(bert_dir, shifted=True, diffusion_family="dream", diffusion_gen_length=8, diffusion_steps=8,
                     diffusion_temperature=0.8, diffusion_top_p=0.95, diffusion_seed=seed, batch_size=batch_size)
        kwargs = {"until": ["<never>"], "max_gen_toks": 8, "do_sample": False}
        requests = [Instance("generate_until", {}, (p, dict(kwargs)), idx=0, metadata=("t", i, 1)) for i, p in enumerate(PROMPTS)]
        return lm, lm.generate_until(requests)

    lm, one = run(1, 7)
    _, many = run(3, 7)
    _, other = run(3, 8)
    assert [str(t) for t in one] == [str(t) for t in many]
    assert [t.probe.reveal_steps for t in one] == [t.probe.reveal_steps for t in many]
    assert [t.probe.reveal_steps for t in one] != [t.probe.reveal_steps for t in other]  # the seed matters
    for prompt, text in zip(PROMPTS, one, strict=True):
        ids = lm.tok_encode(prompt)
        tokens, steps, logprobs = dream_sample(lm.model, ids, steps=8, gen_length=8, mask_id=lm.mask_token_id,
                                               alg="entropy", temperature=0.8, top_p=0.95,
                                               generator=torch.Generator().manual_seed(request_seed(7, ids, ())))
        n = text.probe.n_tokens
        if not text.probe.empty:
            assert list(text.probe.reveal_steps) == steps[:n]
            np.testing.assert_allclose(text.probe.token_logprobs, logprobs[:n], atol=1e-5)


def test_reveal_confidence_is_the_token_probability_whatever_ranks(bert_dir):
    """The answer score is ln p(token) at its reveal step, not the entropy or margin that ranked it."""
    lm = load_lm(bert_dir, shifted=True, diffusion_family="dream", diffusion_alg="entropy", diffusion_gen_length=8,
                 diffusion_steps=4)
    rows, ids, mask = batched(lm)
    got = masked_diffusion_decode(lm._forward(mask), ids, mask_token_id=lm.mask_token_id, gen_length=8, block_length=8,
                                  steps=4, sampler=lm.sampler)
    assert bool((got.reveal_logprob <= 0).all()) and bool((got.reveal_logprob > -30).all())
    first = got.reveal_step[0] == 0
    assert int(first.sum()) == 1  # int(8 (1 - 0.75025)) = 1 at Dream's first of 4 steps
    with torch.no_grad():
        logits, _ = lm._forward(mask)(torch.cat([ids, torch.full((3, 8), lm.mask_token_id)], 1), False)
    probs = torch.softmax(logits[0, ids.shape[1]:].double(), -1)
    entropy_score = (probs * torch.log(probs + 1e-10)).sum(-1)
    np.testing.assert_allclose(got.reveal_logprob[0, first].numpy(),
                               probs[first].gather(-1, got.tokens[0, first].unsqueeze(-1)).squeeze(-1).log().numpy(), atol=1e-9)
    assert not np.allclose(got.reveal_logprob[0, first].numpy(), entropy_score[first].numpy())


def test_ranking_in_the_logits_dtype_breaks_ties_to_the_lower_position():
    vocab, prompt = 11, torch.tensor([[1, 2, 3]])

    def flat(ids, want_states):  # every masked position equally sure in bfloat16
        logits = torch.zeros(ids.shape[0], ids.shape[1], vocab, dtype=torch.bfloat16)
        logits[..., 4] = 5.0
        logits[..., 5] = torch.linspace(0, 1e-3, ids.shape[1], dtype=torch.float32).to(torch.bfloat16)[None]
        return logits, None

    for alg in ("low_confidence", "maskgit_plus", "topk_margin", "entropy"):
        got = masked_diffusion_decode(flat, prompt, mask_token_id=0, gen_length=4, block_length=4, steps=4,
                                      sampler=Sampler(alg=alg, ranking_dtype=None))
        steps = got.reveal_step[0].tolist()
        assert steps == sorted(steps), (alg, steps)  # equal scores: the lower position first
        assert got.tokens[0].tolist() == [4] * 4
    low = masked_diffusion_decode(flat, prompt, mask_token_id=0, gen_length=4, block_length=4, steps=4,
                                  sampler=Sampler(alg="low_confidence", ranking_dtype=None))
    assert low.reveal_step[0].tolist() == [0, 1, 2, 3]


def test_random_algorithms_need_generators():
    def constant(ids, want_states):
        return torch.zeros(ids.shape[0], ids.shape[1], 5), None

    with pytest.raises(ValueError, match="one generator per row"):
        masked_diffusion_decode(constant, torch.tensor([[1]]), mask_token_id=0, gen_length=2, block_length=2, steps=2,
                                sampler=Sampler(alg="random"))
    with pytest.raises(ValueError, match="one block"):
        masked_diffusion_decode(constant, torch.tensor([[1]]), mask_token_id=0, gen_length=4, block_length=2, steps=2,
                                sampler=Sampler(alg="entropy"))


@pytest.mark.parametrize("family,options", [("llada", {"diffusion_block_length": 4, "diffusion_steps": 4,
                                                        "diffusion_cfg_scale": 0.5, "diffusion_logits_eos_inf": True}),
                                             ("dream", {"diffusion_steps": 6})])
def test_trajectory_replays_the_decoding_inputs(bert_dir, family, options):
    """Calibration along the trajectory: each step's probability of the final tokens, from the canvas rebuilt out of
    the reveal steps, equals the reveal-time probability at each token's reveal step and the final pass at the end."""
    from lm_eval_probes.models.diffusion_decoding import trajectory_logprobs, trajectory_steps

    lm = load_lm(bert_dir, shifted=family == "dream", diffusion_family=family, diffusion_gen_length=8, **options)
    rows, ids, mask = batched(lm)
    steps = options["diffusion_steps"]
    got = masked_diffusion_decode(lm._forward(mask), ids, mask_token_id=lm.mask_token_id, gen_length=8,
                                  block_length=options.get("diffusion_block_length", 8), steps=steps, sampler=lm.sampler)
    trajectory = trajectory_logprobs(lm._forward(mask), ids, got, mask_token_id=lm.mask_token_id, at_steps=range(steps),
                                     sampler=lm.sampler)
    assert trajectory.shape == (3, steps, 8)
    at_reveal = trajectory.gather(1, got.reveal_step.unsqueeze(1)).squeeze(1)
    np.testing.assert_allclose(at_reveal.numpy(), got.reveal_logprob.numpy(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(trajectory[:, -1].numpy(), got.final_logprob.numpy(), rtol=0, atol=1e-9)
    assert not np.allclose(trajectory[:, 0].numpy(), trajectory[:, -1].numpy())  # the belief moves along the way
    assert trajectory_steps(8) == (1, 3, 5, 7) and trajectory_steps(3) == (0, 1, 2)
    with pytest.raises(ValueError):
        trajectory_steps(4, (0.0,))
