"""``hf-probes-diffusion``: masked-diffusion decoding, reveal-time confidence, the MC log-likelihood, options, end to end.

Tiny random bidirectional models built from configs (BERT, ModernBERT) with a tiny tokenizer that has a mask token.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
from types import SimpleNamespace

import lm_eval.evaluator
import lm_eval.tasks
import numpy as np
import pytest
import torch
import transformers
from lm_eval.api.instance import Instance

from conftest import build_tokenizer
from lm_eval_probes import TASKS_DIR
from lm_eval_probes.models.diffusion_decoding import masked_diffusion_decode, mc_loglikelihood, request_seed, transfer_counts
from lm_eval_probes.models.diffusion_config import DiffusionConfig
from lm_eval_probes.models.diffusion import DiffusionProbeHFLM, model_class_for, resolve_mask_token_id
from lm_eval_probes.estimators import answer_confidence, answer_reveal_step
from lm_eval_probes.records import ResponseProbe, probe_of
from lm_eval_probes.tasks.manager import ProbeTaskManager

MASK = "<|mask|>"


def mask_tokenizer():
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"mask_token": MASK})
    return tokenizer


def tiny_config(arch: str, tokenizer):
    common = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                  initializer_range=0.3)
    if arch == "bert":
        return transformers.BertConfig(**common)
    if arch == "modernbert":
        return transformers.ModernBertConfig(**common, global_attn_every_n_layers=1, local_attention=64,
                                             bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                                             cls_token_id=tokenizer.eos_token_id, sep_token_id=tokenizer.eos_token_id)
    raise ValueError(arch)


@pytest.fixture(scope="module")
def masked_lm_dir(tmp_path_factory: pytest.TempPathFactory):
    made: dict[str, str] = {}

    def make(arch: str = "bert") -> str:
        if arch not in made:
            tokenizer = mask_tokenizer()
            torch.manual_seed(7)
            model = transformers.AutoModelForMaskedLM.from_config(tiny_config(arch, tokenizer)).eval()
            folder = tmp_path_factory.mktemp(f"tiny-mlm-{arch}")
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            made[arch] = str(folder)
        return made[arch]

    return make


@pytest.fixture(scope="module")
def manager() -> ProbeTaskManager:
    """One task index for the module (building it reads every lm_eval YAML: the slow part of a run here)."""
    return ProbeTaskManager(include_path=TASKS_DIR)


def load(folder: str):
    model = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
    return model, transformers.AutoTokenizer.from_pretrained(folder)


def plain_forward(model):
    def forward(ids, want_states):
        out = model(input_ids=ids, output_hidden_states=want_states)
        return out.logits, out.hidden_states if want_states else None
    return forward


def reference_decode(model, prompt: list[int], mask_id: int, gen_length: int, block_length: int, steps: int):
    """A plainly written masked-diffusion loop (one sequence, Python lists): per block, per step, reveal the
    masked positions of the block whose argmax probability is highest (ties: lower position)."""
    seq = list(prompt) + [mask_id] * gen_length
    revealed_at: dict[int, tuple[int, float]] = {}
    blocks = gen_length // block_length
    per_block = steps // blocks
    step = 0
    for block in range(blocks):
        start = len(prompt) + block * block_length
        positions = list(range(start, start + block_length))
        base, extra = divmod(block_length, per_block)
        for i in range(per_block):
            count = base + (1 if i < extra else 0)
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([seq])).logits[0].double()
            candidates = []
            for pos in positions:
                if seq[pos] != mask_id:
                    continue
                probs = torch.softmax(logits[pos], dim=-1)
                token = int(torch.argmax(probs))
                candidates.append((-float(probs[token]), pos, token))
            candidates.sort()
            for negative_p, pos, token in candidates[:count]:
                seq[pos] = token
                revealed_at[pos - len(prompt)] = (step, math.log(-negative_p))
            step += 1
    tokens = seq[len(prompt):]
    return tokens, [revealed_at[i][0] for i in range(gen_length)], [revealed_at[i][1] for i in range(gen_length)]


SCHEDULES = [(8, 8, 8), (8, 4, 4), (12, 4, 6), (6, 2, 6)]  # (gen_length, block_length, steps)


# ------------------------------------------------------------------------------------------ decoding loop

def test_transfer_counts_is_llada_uniform_schedule():
    assert transfer_counts(8, 8) == [1] * 8
    assert transfer_counts(10, 4) == [3, 3, 2, 2]
    assert sum(transfer_counts(37, 5)) == 37
    with pytest.raises(ValueError):
        transfer_counts(4, 0)


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_decode_matches_a_plain_reference_loop(masked_lm_dir, arch, schedule):
    model, tokenizer = load(masked_lm_dir(arch))
    gen_length, block_length, steps = schedule
    prompt = tokenizer("Question: Mia has 7 apples. Answer:")["input_ids"]
    got = masked_diffusion_decode(plain_forward(model), torch.tensor([prompt]), mask_token_id=tokenizer.mask_token_id,
                                  gen_length=gen_length, block_length=block_length, steps=steps)
    tokens, reveal_steps, logprobs = reference_decode(model, prompt, tokenizer.mask_token_id, gen_length, block_length, steps)
    assert got.tokens[0].tolist() == tokens
    assert got.reveal_step[0].tolist() == reveal_steps
    np.testing.assert_allclose(got.reveal_logprob[0].numpy(), logprobs, rtol=1e-9, atol=1e-12)
    assert tokenizer.mask_token_id not in got.tokens[0].tolist()


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_block_never_reveals_past_its_end(masked_lm_dir, schedule):
    model, tokenizer = load(masked_lm_dir("bert"))
    gen_length, block_length, steps = schedule
    prompts = torch.tensor([tokenizer("The cat is big. The cat")["input_ids"]] * 2)
    seen: list[torch.Tensor] = []

    def spying(ids, want_states):
        seen.append(ids[:, prompts.shape[1]:].clone())
        return plain_forward(model)(ids, want_states)

    got = masked_diffusion_decode(spying, prompts, mask_token_id=tokenizer.mask_token_id, gen_length=gen_length,
                                  block_length=block_length, steps=steps)
    per_block = steps // (gen_length // block_length)
    for position in range(gen_length):
        block = position // block_length
        assert (got.reveal_step[:, position] // per_block == block).all()  # revealed during its own block
    for step, canvas in enumerate(seen):  # what each forward saw: nothing revealed beyond the current block
        block = step // per_block
        assert (canvas[:, (block + 1) * block_length:] == tokenizer.mask_token_id).all()
        assert (canvas[:, : block * block_length] != tokenizer.mask_token_id).all()
    counts = [int((got.reveal_step[0] == s).sum()) for s in range(steps)]
    assert counts == transfer_counts(block_length, per_block) * (gen_length // block_length)


def test_reveal_time_confidence_differs_from_the_final_pass_where_it_should(masked_lm_dir):
    model, tokenizer = load(masked_lm_dir("bert"))
    prompt = torch.tensor([tokenizer("Anne is kind. If someone is kind then they are smart.")["input_ids"]])
    got = masked_diffusion_decode(plain_forward(model), prompt, mask_token_id=tokenizer.mask_token_id,
                                  gen_length=12, block_length=4, steps=6, state_layers=(1, 3))
    last = got.reveal_step[0] == 5
    # revealed at the last step: the final pass is their reveal pass (their input was still the mask)
    np.testing.assert_allclose(got.final_logprob[0, last].numpy(), got.reveal_logprob[0, last].numpy(), rtol=1e-12)
    # revealed earlier: the final pass sees the token itself, so its probability there is another number
    earlier = (got.final_logprob[0, ~last] - got.reveal_logprob[0, ~last]).abs()
    assert bool((earlier > 1e-6).all())
    # and the final pass is an independent forward over the finished canvas with the last tokens still masked
    canvas = torch.cat([prompt, got.tokens], dim=1)
    canvas[0, prompt.shape[1]:][last] = tokenizer.mask_token_id
    with torch.no_grad():
        out = model(input_ids=canvas, output_hidden_states=True)
    final = torch.log_softmax(out.logits[0, prompt.shape[1]:].double(), -1).gather(-1, got.tokens[0].unsqueeze(-1))
    np.testing.assert_allclose(got.final_logprob[0].numpy(), final.squeeze(-1).numpy(), rtol=1e-9, atol=1e-12)
    for layer, states in zip((1, 3), got.final_states, strict=True):
        torch.testing.assert_close(states, out.hidden_states[layer])


# ------------------------------------------------------------------------------------------ MC log-likelihood

def test_mc_loglikelihood_of_one_token_is_exact(masked_lm_dir):
    model, tokenizer = load(masked_lm_dir("bert"))
    context = torch.tensor(tokenizer("The bear is")["input_ids"])
    target = torch.tensor(tokenizer(" red")["input_ids"][:1])
    got = mc_loglikelihood(plain_forward(model), context, target, mask_token_id=tokenizer.mask_token_id,
                           samples=4, batch_size=2, seed=0)
    with torch.no_grad():
        logits = model(input_ids=torch.cat([context, torch.tensor([tokenizer.mask_token_id])])[None]).logits
    assert got == pytest.approx(float(torch.log_softmax(logits[0, -1].double(), -1)[target[0]]), rel=1e-6)  # float32 forward, batch 2 vs 1


def test_mc_loglikelihood_estimates_the_masked_elbo(masked_lm_dir):
    """Against the exact expectation, enumerated: E_m E_S[(L/m) Σ_{i∈S} ln p(x_i | x without S)], m uniform in 1..L."""
    model, tokenizer = load(masked_lm_dir("bert"))
    context = torch.tensor(tokenizer("Question: 1 + 2 =")["input_ids"])
    target = torch.tensor(tokenizer(" 3 .")["input_ids"][:3])
    n, p, mask_id = target.numel(), context.numel(), tokenizer.mask_token_id
    exact = 0.0
    for m in range(1, n + 1):
        subsets = list(itertools.combinations(range(n), m))
        for subset in subsets:
            ids = torch.cat([context, target]).clone()
            ids[[p + i for i in subset]] = mask_id
            with torch.no_grad():
                logprobs = torch.log_softmax(model(input_ids=ids[None]).logits[0].double(), -1)
            exact += (1 / n) * (1 / len(subsets)) * (n / m) * sum(float(logprobs[p + i, target[i]]) for i in subset)
    forward = plain_forward(model)
    estimate = mc_loglikelihood(forward, context, target, mask_token_id=mask_id, samples=512, batch_size=64, seed=3)
    assert estimate == pytest.approx(exact, rel=0.05)
    again = mc_loglikelihood(forward, context, target, mask_token_id=mask_id, samples=512, batch_size=64, seed=3)
    assert again == estimate  # the seed alone decides the masks
    assert request_seed(1, [1, 2], [3]) == request_seed(1, [1, 2], [3]) != request_seed(1, [1], [2, 3])


# ------------------------------------------------------------------------------------------ options

def test_config_parses_strictly_and_validates_the_schedule():
    config = DiffusionConfig.from_model_args({"diffusion_steps": "8", "diffusion_gen_length": 16,
                                              "diffusion_block_length": "4", "diffusion_logits_shift": "true"})
    assert (config.steps, config.gen_length, config.block_length, config.logits_shift) == (8, 16, 4, True)
    assert config.schedule() == (16, 4, 8)
    assert DiffusionConfig().schedule(32) == (32, 32, 32)  # defaults: one block, one token per step
    assert DiffusionConfig(block_length=8).schedule(32) == (32, 8, 32)
    with pytest.raises(ValueError, match="must divide the canvas"):
        DiffusionConfig(block_length=8).schedule(20)
    with pytest.raises(ValueError, match="multiple of the number of blocks"):
        DiffusionConfig(steps=6, block_length=4).schedule(16)


BAD_OPTIONS = [
    ({"diffusion_stpes": 8}, "Did you mean 'diffusion_steps'"),
    ({"difusion_steps": 8}, "Did you mean 'diffusion_steps'"),
    ({"diffusion_steps": 0}, "diffusion_steps must be an integer >= 1"),
    ({"diffusion_steps": "many"}, "diffusion_steps must be an integer"),
    ({"diffusion_gen_length": 10, "diffusion_block_length": 4}, "must divide the canvas"),
    ({"diffusion_gen_length": 16, "diffusion_block_length": 4, "diffusion_steps": 6}, "multiple of the number of blocks"),
    ({"diffusion_gen_length": 8, "diffusion_steps": 16, "diffusion_family": "llada"}, "at most the canvas length"),
    ({"diffusion_mc_samples": 100, "diffusion_mc_batch_size": 32}, "multiple of diffusion_mc_batch_size"),
    ({"diffusion_logits_shift": "maybe"}, "true or false"),
    ({"probes": "tcb"}, "supports probes"),
    ({"probe_reader_tial": 3}, "Did you mean"),
]


@pytest.mark.parametrize("options,message", BAD_OPTIONS)
def test_bad_options_fail_before_the_model_loads(monkeypatch, options, message):
    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", no_loading)
    with pytest.raises(ValueError, match=message):
        DiffusionProbeHFLM(pretrained="/does/not/exist", device="cpu", **options)


def test_trust_remote_code_is_never_set_implicitly(masked_lm_dir, monkeypatch):
    seen: list[object] = []
    original = transformers.AutoConfig.from_pretrained.__func__

    def recording(cls, *args, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", classmethod(recording))
    DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu")
    assert seen and not any(seen)
    seen.clear()
    DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", trust_remote_code=True)  # given: passed on
    assert seen and all(seen)


def test_model_class_and_mask_token_lookup():
    assert model_class_for(transformers.BertConfig()) is transformers.AutoModelForMaskedLM
    llada = SimpleNamespace(model_type="llada", auto_map={"AutoModel": "m.L", "AutoModelForCausalLM": "m.L"})
    dream = SimpleNamespace(model_type="Dream", auto_map={"AutoModel": "m.D"})
    assert model_class_for(llada) is transformers.AutoModelForCausalLM
    assert model_class_for(dream) is transformers.AutoModel
    assert model_class_for(transformers.LlamaConfig()) is transformers.AutoModelForCausalLM
    config, tokenizer = SimpleNamespace(mask_token_id=126336), SimpleNamespace(mask_token_id=5)
    assert resolve_mask_token_id(9, config, tokenizer) == 9
    assert resolve_mask_token_id(None, config, tokenizer) == 126336
    assert resolve_mask_token_id(None, SimpleNamespace(), tokenizer) == 5
    with pytest.raises(ValueError, match="diffusion_mask_token_id"):
        resolve_mask_token_id(None, SimpleNamespace(), SimpleNamespace(mask_token_id=None))


# ------------------------------------------------------------------------------------------ the model class

PROMPTS = ["Question: Mia has 7 apples. She buys 5 more apples. How many apples does Mia have now? Answer:",
           "The bear is red.", "Anne is kind. If someone is kind then they are smart. Anne is", "0 1 2"]
MODEL_ARGS = {"diffusion_gen_length": 8, "diffusion_block_length": 4, "diffusion_steps": 4}


def generate(lm: DiffusionProbeHFLM, until: list[str]) -> list:
    kwargs = {"until": until, "max_gen_toks": 99, "do_sample": False}
    requests = [Instance("generate_until", {}, (p, dict(kwargs)), idx=0, metadata=("t", i, 1)) for i, p in enumerate(PROMPTS)]
    return lm.generate_until(requests)


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_batch_size_and_left_padding_do_not_change_results(masked_lm_dir, arch):
    one = DiffusionProbeHFLM(pretrained=masked_lm_dir(arch), device="cpu", batch_size=1, **MODEL_ARGS)
    many = DiffusionProbeHFLM(pretrained=masked_lm_dir(arch), device="cpu", batch_size=4, **MODEL_ARGS)
    alone, batched = generate(one, ["<never>"]), generate(many, ["<never>"])
    assert [str(t) for t in alone] == [str(t) for t in batched]
    for a, b in zip(alone, batched, strict=True):
        assert a.probe.reveal_steps == b.probe.reveal_steps and a.probe.token_ends == b.probe.token_ends
        np.testing.assert_allclose(a.probe.token_logprobs, b.probe.token_logprobs, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(a.probe.get("answer_states").values, b.probe.get("answer_states").values, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(a.probe.get("prompt_states").values, b.probe.get("prompt_states").values, rtol=1e-3, atol=1e-4)


def test_generation_records_carry_reveal_order_and_match_the_decoding(masked_lm_dir):
    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", batch_size=2, **MODEL_ARGS)
    tokenizer = lm.tokenizer
    texts = generate(lm, ["<never>"])
    for prompt, text in zip(PROMPTS, texts, strict=True):
        probe: ResponseProbe = text.probe
        ids = torch.tensor([lm.tok_encode(prompt)])
        decoded = masked_diffusion_decode(lm._forward(None), ids, mask_token_id=tokenizer.mask_token_id,
                                          gen_length=8, block_length=4, steps=4)
        n = probe.n_tokens
        assert list(probe.reveal_steps) == decoded.reveal_step[0, :n].tolist()
        np.testing.assert_allclose(probe.token_logprobs, decoded.reveal_logprob[0, :n].numpy(), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(probe.final_token_logprobs, decoded.final_logprob[0, :n].numpy(), rtol=1e-5, atol=1e-7)
        assert probe.mean_token_logprob == pytest.approx(float(np.mean(probe.token_logprobs)))
        assert str(text) == lm.tok_decode(decoded.tokens[0, :n].tolist())
        assert probe.token_ends[-1] == len(text) and probe.get("answer_states").values.shape == (len(lm.plan.requested.prompt_layers), 32)
        # the confidence of an answer span is the geometric mean of its reveal-time probabilities
        located = ResponseProbe(**{**probe.__dict__, "answer_span": (max(0, n - 2), n)})
        assert answer_confidence(located) == pytest.approx(math.exp(np.mean(probe.token_logprobs[-2:])))


def test_stop_strings_and_eos_cut_the_kept_tokens(masked_lm_dir):
    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", batch_size=2, **MODEL_ARGS)
    full = generate(lm, ["<never>"])
    eos = lm.tok_decode([lm.eot_token_id], skip_special_tokens=False)
    for text in full:
        assert eos not in text
    cut_at = next(str(t)[1:3] for t in full if len(str(t)) > 3)  # a stop string from inside one generation
    cut = generate(lm, [cut_at])
    for whole, kept in zip(full, cut, strict=True):
        assert str(kept) == str(whole).split(cut_at)[0]
        assert kept.probe.token_logprobs == whole.probe.token_logprobs[: kept.probe.n_tokens]
        assert kept.probe.n_tokens <= whole.probe.n_tokens and kept.probe.token_ends[-1] >= len(kept)
    first = next(t for t in full if str(t))
    (empty,) = [t for t, w in zip(generate(lm, [str(first)[0]]), full, strict=True) if w is first]
    assert str(empty) == "" and empty.probe.empty and empty.probe.n_tokens == 1  # probed where it chose to stop
    assert empty.probe.token_logprobs == first.probe.token_logprobs[:1] and empty.probe.reveal_steps == first.probe.reveal_steps[:1]


def test_probes_none_keeps_the_confidence_records_without_states(masked_lm_dir):
    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", probes="none", **MODEL_ARGS)
    for text in generate(lm, ["<never>"]):
        assert text.probe.get("answer_states") is None and text.probe.get("prompt_states") is None and text.probe.get("tail_states") is None
        assert len(text.probe.token_logprobs) == len(text.probe.reveal_steps) == text.probe.n_tokens


def test_loglikelihood_returns_the_mc_estimate_with_probes(masked_lm_dir):
    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", diffusion_mc_samples=4,
                            diffusion_mc_batch_size=2, diffusion_check_greedy=True)
    requests = [Instance("loglikelihood", {}, ("The bear is", " red"), idx=0, metadata=("t", 0, 1)),
                Instance("loglikelihood", {}, ("The bear is", " big"), idx=1, metadata=("t", 0, 1))]
    answers = lm.loglikelihood(requests)
    for req, answer in zip(requests, answers, strict=True):
        context_ids, continuation_ids = lm._encode_pair(*req.args)
        want = mc_loglikelihood(lm._forward(None), torch.tensor(context_ids), torch.tensor(continuation_ids),
                                mask_token_id=lm.mask_token_id, samples=4, batch_size=2,
                                seed=request_seed(1234, context_ids, continuation_ids))
        assert answer[0] == pytest.approx(want) and isinstance(answer[1], bool)
        probe = probe_of(answer)
        assert probe.n_tokens == len(continuation_ids) and probe.mean_token_logprob == pytest.approx(want / probe.n_tokens)
        assert probe.get("answer_states") is not None and probe.get("prompt_states") is not None
    assert lm.loglikelihood(requests[::-1])[::-1] == answers  # order does not change an estimate
    with pytest.raises(NotImplementedError, match="rolling"):  # HFLM's windows reach _loglikelihood_tokens keyed None
        lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("The bear is red.",), idx=0, metadata=("t", 0, 1))])


def test_sampling_is_refused(masked_lm_dir):
    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", **MODEL_ARGS)
    request = Instance("generate_until", {}, ("0 1 2", {"until": ["\n"], "max_gen_toks": 8, "do_sample": True, "temperature": 0.7}),
                       idx=0, metadata=("t", 0, 1))
    with pytest.raises(ValueError, match="samples only as its options say"):
        lm.generate_until([request])


# ------------------------------------------------------------------------------------------ end to end

def test_end_to_end_generation_and_multiple_choice_rows(masked_lm_dir, manager):
    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", batch_size=8, diffusion_block_length=8,
                            diffusion_steps=8, diffusion_mc_samples=2, diffusion_mc_batch_size=2)
    tasks = lm_eval.tasks.get_task_dict(["probes_synth_arith_gen", "probes_synth_logic"], manager)
    out = lm_eval.evaluator.evaluate(lm, tasks, limit=12, log_samples=True)
    gen = out["results"]["probes_synth_arith_gen"]
    for row in ("ece", "ece_scaled", "selective_auroc", "aurc", "selective_acc_50", "lcr_auroc", "lcr_ece", "confidence",
                "reveal_step"):
        assert f"{row},first-integer" in gen, row
    assert 0.0 <= gen["ece,first-integer"] <= 1.0
    mc = out["results"]["probes_synth_logic"]
    assert "ece,none" in mc and "lcr_auroc,none" in mc and "reveal_step,none" not in mc
    # each document's confidence is the geometric mean of its answer's reveal-time probabilities
    task = tasks["probes_synth_arith_gen"]
    by_doc = {s["doc_id"]: s for s in out["samples"]["probes_synth_arith_gen"]}
    for inst in task.instances:
        probe = probe_of(inst.filtered_resps["first-integer"])
        assert probe.reveal_steps is not None and len(probe.reveal_steps) == probe.n_tokens
        assert by_doc[inst.doc_id]["confidence"] == pytest.approx(answer_confidence(probe))
        assert by_doc[inst.doc_id]["reveal_step"] == pytest.approx(answer_reveal_step(probe))  # confidence vs reveal order
        assert 0 <= by_doc[inst.doc_id]["reveal_step"] < 8
        if probe.answer_span is not None:
            start, stop = probe.answer_span
            assert answer_confidence(probe) == pytest.approx(math.exp(np.mean(probe.token_logprobs[start:stop])))


def test_noise_and_detector_tasks_run_with_the_diffusion_model(masked_lm_dir, tmp_path):
    from loader_fixtures import write_data_dir

    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", batch_size=8, diffusion_gen_length=4,
                            diffusion_mc_samples=2, diffusion_mc_batch_size=2)
    manager = ProbeTaskManager(include_path=TASKS_DIR, metadata={"probes_data_dir": str(write_data_dir(tmp_path, n=12))})
    names = ["probes_proofwriter_gen_detect", "probes_proofwriter_gen_noise_swap", "probes_proofwriter_noise_swap"]
    out = lm_eval.evaluator.evaluate(lm, lm_eval.tasks.get_task_dict(names, manager), limit=12, log_samples=True)
    detect = out["results"]["probes_proofwriter_gen_detect"]
    assert {"corruption_auroc,answer", "corruption_confidence_auroc,answer", "ece,answer", "lcr_auroc,answer"} <= set(detect)
    assert 0.0 <= detect["corruption_auroc,answer"] <= 1.0
    docs = [s["doc"] for s in out["samples"]["probes_proofwriter_gen_noise_swap"]]
    assert any(d["theory"] != d["clean_theory"] or d["question"] != d["clean_question"] for d in docs)
    assert "ece,none" in out["results"]["probes_proofwriter_noise_swap"]


@pytest.fixture
def bidirectional_llama(monkeypatch, tmp_path):
    """A tiny Llama made bidirectional: its causal mask is replaced by transformers' bidirectional (padding-only)
    mask and no attention layer asks SDPA for causality; saved with a mask token in its config."""
    from transformers.masking_utils import create_bidirectional_mask
    from transformers.models.llama import modeling_llama

    def bidirectional(config, inputs_embeds, attention_mask, cache=None, position_ids=None, **kwargs):
        return create_bidirectional_mask(config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)

    monkeypatch.setattr(modeling_llama, "create_causal_mask", bidirectional)
    tokenizer = mask_tokenizer()
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      initializer_range=0.3, pad_token_id=tokenizer.pad_token_id,
                                      eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    config.mask_token_id = tokenizer.mask_token_id
    torch.manual_seed(11)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)

    def load_lm(**kwargs) -> DiffusionProbeHFLM:
        lm = DiffusionProbeHFLM(pretrained=str(tmp_path), device="cpu", **kwargs)
        for layer in lm.model.model.layers:
            layer.self_attn.is_causal = False
        return lm

    return load_lm


def test_a_llama_made_bidirectional_decodes_like_the_reference_and_batches_invariantly(bidirectional_llama):
    one, many = bidirectional_llama(batch_size=1, **MODEL_ARGS), bidirectional_llama(batch_size=4, **MODEL_ARGS)
    ids = torch.tensor([one.tok_encode("The bear is red. The cat")])
    with torch.no_grad():  # bidirectional: a later token changes an earlier position's output
        changed = ids.clone()
        changed[0, -1] = one.mask_token_id
        assert not torch.allclose(one.model(input_ids=ids).logits[0, 0], one.model(input_ids=changed).logits[0, 0])
    assert one.mask_token_id == one.config.mask_token_id  # read from the model config
    got = masked_diffusion_decode(one._forward(None), ids, mask_token_id=one.mask_token_id, gen_length=8,
                                  block_length=4, steps=4)
    tokens, reveal_steps, logprobs = reference_decode(one.model, ids[0].tolist(), one.mask_token_id, 8, 4, 4)
    assert got.tokens[0].tolist() == tokens and got.reveal_step[0].tolist() == reveal_steps
    np.testing.assert_allclose(got.reveal_logprob[0].numpy(), logprobs, rtol=1e-9, atol=1e-12)
    alone, batched = generate(one, ["<never>"]), generate(many, ["<never>"])
    assert [str(t) for t in alone] == [str(t) for t in batched]
    for a, b in zip(alone, batched, strict=True):
        assert a.probe.reveal_steps == b.probe.reveal_steps
        np.testing.assert_allclose(a.probe.token_logprobs, b.probe.token_logprobs, rtol=1e-4, atol=1e-6)


def test_answer_reveal_step_reads_the_answer_span():
    probe = ResponseProbe(n_tokens=4, mean_token_logprob=-1.0, reveal_steps=(3, 0, 1, 2), answer_span=(2, 4))
    assert answer_reveal_step(probe) == 1.5 and answer_reveal_step(probe, whole=True) == 1.5
    assert answer_reveal_step(ResponseProbe(**{**probe.__dict__, "answer_span": (0, 1)})) == 3.0
    assert answer_reveal_step(ResponseProbe(**{**probe.__dict__, "answer_span": None})) == 1.5
    assert answer_reveal_step(ResponseProbe(n_tokens=1, mean_token_logprob=0.0)) is None


def test_plain_lm_eval_cli_finds_the_model(masked_lm_dir, tmp_path, run_cli, monkeypatch):
    """A regular install registers hf-probes-diffusion at interpreter start (the .pth autoload), for plain lm_eval:
    in a fresh interpreter the name is in lm_eval's registry before anything imports the plugin, and lm_eval's
    CLI (run here in this process; ``tests/test_cli.py`` runs a whole fresh ``lm_eval`` with hf-probes) resolves it."""
    import json
    import subprocess
    import sys

    from lm_eval_probes.harness.registry import DIFFUSION_MODEL_NAME

    if importlib.util.find_spec("_lm_eval_probes_autoload") is None:
        pytest.skip("the plain lm_eval CLI needs the .pth of a regular (non-editable) install; `make test` does one")
    code = ("import sys; from lm_eval.api.registry import model_registry; "
            f"print({DIFFUSION_MODEL_NAME!r} in model_registry, 'lm_eval_probes.models' in sys.modules)")
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert fresh.stdout.split() == ["True", "False"]  # registered lazily: nothing heavy imported at start-up
    args = f"pretrained={masked_lm_dir('bert')},diffusion_gen_length=4,diffusion_steps=4"
    monkeypatch.chdir(tmp_path)
    status, _, err = run_cli("lm_eval", [
        "run", "--model", "hf-probes-diffusion", "--model_args", args, "--device", "cpu", "--tasks",
        "probes_synth_arith_gen", "--include_path", TASKS_DIR, "--limit", "4", "--output_path", str(tmp_path)])
    assert status == 0, err[-3000:]
    (results_file,) = tmp_path.rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]["probes_synth_arith_gen"]
    assert "ece,first-integer" in results and "reveal_step,first-integer" in results


def test_use_cache_replays_answers_with_their_records_per_configuration(masked_lm_dir, manager, tmp_path):
    cache = str(tmp_path / "cache")
    tasks = ["probes_synth_arith_gen", "probes_synth_logic"]

    def run(steps: int) -> dict:
        lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", batch_size=4, diffusion_gen_length=4,
                                diffusion_steps=steps, diffusion_mc_samples=2, diffusion_mc_batch_size=2)
        return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=4, use_cache=cache,
                                       bootstrap_iters=0, log_samples=True)

    first, replayed, other = run(4), run(4), run(2)
    for task in tasks:
        assert first["results"][task] == replayed["results"][task]
    assert all("reveal_step" in s for s in replayed["samples"]["probes_synth_arith_gen"])  # records came back too
    # another schedule reads and writes a table of its own: its records come from 2 steps (0 and 1), not from the 4-step run
    assert max(s["reveal_step"] for s in other["samples"]["probes_synth_arith_gen"]) <= 1
