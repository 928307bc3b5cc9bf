"""``hf-probes-diffusion``'s family switch: stop rules against each harness's post-processing, Dream's likelihood
estimator against its formula, family detection, and the authors' argument names (aliases and refusals)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from lm_eval.api.instance import Instance

from lm_eval_probes.models.diffusion_decoding import dream_masks, dream_mc_loglikelihood, masked_diffusion_decode, mc_loglikelihood, request_seed
from lm_eval_probes.models.diffusion_config import ALIASES, REFUSED, DiffusionConfig, detect_family
from lm_eval_probes.models.diffusion import DiffusionProbeHFLM
from test_diffusion_samplers import bert_dir  # noqa: F401  (the module's tiny BERT fixture)


def load_lm(folder: str, **kwargs) -> DiffusionProbeHFLM:
    return DiffusionProbeHFLM(pretrained=folder, device="cpu", probes="none", **kwargs)


# ------------------------------------------------------------------------------------------ stop rules

def llada_harness_text(tokenizer, canvas: list[int], until: list[str]) -> str:
    """``eval_llada.py``'s ``generate_until`` post-processing."""
    answer = tokenizer.decode(canvas, skip_special_tokens=False)
    for stop in until:
        if stop in answer:
            answer = answer.split(stop)[0]
    return tokenizer.decode(tokenizer(answer)["input_ids"], skip_special_tokens=True)


def dream_harness_text(tokenizer, canvas: list[int], until: list[str]) -> str:
    """Dream's harness (``eval.py`` / ``diffllm.py``): decode, cut at the EOS text, then at each stop string."""
    answer = tokenizer.decode(canvas).split(tokenizer.eos_token)[0]
    for stop in until:
        answer = answer.split(stop)[0]
    return answer


def canvases(tokenizer) -> list[list[int]]:
    eos, enc = tokenizer.eos_token_id, lambda text: tokenizer(text)["input_ids"]
    return [enc("The cat is") + [eos] + enc(" big. The bear") + [eos, eos],
            [eos] + enc(" The cat is big.") + [eos],
            enc("The cat is big. The bear is red"),
            enc("The cat") + [eos, eos] + enc(" is. big")]


@pytest.mark.parametrize("until", [[], ["bear"], ["."], ["is", "cat"]])
def test_family_stop_rules_are_their_harnesses_post_processing(bert_dir, until):  # noqa: F811
    llada, dream = load_lm(bert_dir, diffusion_family="llada"), load_lm(bert_dir, diffusion_family="dream")
    tokenizer = llada.tokenizer
    for canvas in canvases(tokenizer):
        positions, text, _ = llada._kept(canvas, until)
        assert text == llada_harness_text(tokenizer, canvas, until)
        assert all(canvas[i] != tokenizer.eos_token_id for i in positions)
        assert tokenizer.decode([canvas[i] for i in positions]).startswith(text)
        positions, text, _ = dream._kept(canvas, until)
        assert text == dream_harness_text(tokenizer, canvas, until)
        assert positions == list(range(canvas.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in canvas else len(canvas)))
    # EOS mid-canvas: LLaDA keeps the text after it, Dream and lm_eval do not
    canvas = canvases(tokenizer)[0]
    if not until:
        assert llada._kept(canvas, until)[1] == "The cat is big. The bear"
        assert dream._kept(canvas, until)[1] == "The cat is"


@pytest.mark.parametrize("family", ["llada", "dream", "generic"])
def test_generate_until_keeps_each_family_text_with_eos_revealed_mid_canvas(bert_dir, family):  # noqa: F811
    lm = load_lm(bert_dir, diffusion_family=family, diffusion_gen_length=8, diffusion_steps=8, batch_size=2)
    eos = lm.tokenizer.eos_token_id
    plain = lm._forward

    def eos_at_2(mask):  # the canvas's third position is EOS, revealed first
        forward = plain(mask)

        def boosted(ids, want_states):
            logits, states = forward(ids, want_states)
            logits[:, ids.shape[1] - 8 + 2, eos] += 60
            return logits, states
        return boosted

    lm._forward = eos_at_2
    prompts = ["The bear is red.", "Question: 0 1 2 3 Answer:"]
    kwargs = {"until": ["<never>"], "max_gen_toks": 8, "do_sample": False}
    requests = [Instance("generate_until", {}, (p, dict(kwargs)), idx=0, metadata=("t", i, 1)) for i, p in enumerate(prompts)]
    texts = lm.generate_until(requests)
    for prompt, text in zip(prompts, texts, strict=True):
        decoded = masked_diffusion_decode(eos_at_2(None), torch.tensor([lm.tok_encode(prompt)]), mask_token_id=lm.mask_token_id,
                                          gen_length=8, block_length=8, steps=8, sampler=lm.sampler)
        canvas = decoded.tokens[0].tolist()
        assert canvas[2] == eos and decoded.reveal_step[0, 2] == decoded.reveal_step[0].min() and canvas[3:] != [eos] * 5
        want = {"llada": llada_harness_text, "dream": dream_harness_text}.get(family)
        if want is None:  # lm_eval: the canvas up to its first EOS, decoded
            assert str(text) == lm.tok_decode(canvas[:2])
        else:
            assert str(text) == want(lm.tokenizer, canvas, ["<never>"])
        kept = [i for i in range(8) if canvas[i] != eos][: text.probe.n_tokens]
        if family != "llada":
            kept = kept[:2]
        np.testing.assert_allclose(text.probe.token_logprobs, decoded.reveal_logprob[0, kept].numpy(), atol=1e-5)
        assert list(text.probe.reveal_steps) == decoded.reveal_step[0, kept].tolist()
        if family == "llada":
            assert text.probe.n_tokens > 2  # tokens after the EOS are part of LLaDA's answer


# ------------------------------------------------------------------------------------------ Dream's likelihood

def test_dream_likelihood_matches_its_formula_in_expectation(bert_dir):  # noqa: F811
    """E_t[Σ_S p^|S| (1−p)^(L−|S|) Σ_{i∈S} ln p(x_i | x∖S) / p], p = (1−eps) t + eps, t ~ U[0, 1], EOS never masked:
    enumerated over subsets, integrated exactly (a polynomial in t) by Gauss–Legendre; the estimate within 4 SE."""
    lm = load_lm(bert_dir, diffusion_family="generic")
    model, tokenizer, mask = lm.model, lm.tokenizer, lm.mask_token_id
    context = torch.tensor(tokenizer("Question: 1 + 2 =")["input_ids"])
    target = torch.tensor(tokenizer(" 3 .")["input_ids"][:2] + [tokenizer.eos_token_id])
    n, eps = 2, 1e-3
    p_len = context.numel()

    def logprobs(subset):
        ids = torch.cat([context, target]).clone()
        ids[[p_len + i for i in subset]] = mask
        with torch.no_grad():
            out = torch.log_softmax(model(input_ids=ids[None]).logits[0].double(), -1)
        return sum(float(out[p_len + i, target[i]]) for i in subset)

    subsets = [(0,), (1,), (0, 1)]
    values = {s: logprobs(s) for s in subsets}
    nodes, weights = np.polynomial.legendre.leggauss(8)
    t = (nodes + 1) / 2
    p = (1 - eps) * t + eps
    integrand = sum(p ** len(s) * (1 - p) ** (n - len(s)) * values[s] / p for s in subsets)
    exact = float((weights / 2) @ integrand)
    forward = lm._forward(None)
    estimates = [dream_mc_loglikelihood(forward, context, target, mask_token_id=mask, samples=128, batch_size=64, seed=seed)
                 for seed in range(24)]
    standard_error = np.std(estimates, ddof=1) / np.sqrt(len(estimates))
    assert abs(np.mean(estimates) - exact) < 4 * standard_error
    # LLaDA's estimator, E_m[(L/m) mean_{|S|=m} Σ_{i∈S}], has the same expectation Σ_m (1/m) mean_{|S|=m}[…] up to eps
    # (∫ C(L,m) p^(m−1) (1−p)^(L−m) dt = 1/m): the estimators differ in variance, eps and the appended EOS, not in target
    llada_exact = (values[(0,)] + values[(1,)]) / 2 + values[(0, 1)] / 2
    assert abs(exact - llada_exact) < 0.01 * abs(exact)


def test_dream_masks_never_hide_the_appended_eos_and_stratify_time():
    mask, p = dream_masks(5, 64, 1e-3, torch.Generator().manual_seed(0))
    assert not mask[:, -1].any() and mask[:, :-1].any()
    ordered = torch.sort((p - 1e-3) / (1 - 1e-3)).values
    np.testing.assert_allclose(np.diff(ordered.numpy()), 1 / 64, atol=1e-5)  # t_j = (u + j / b) mod 1
    first, _ = dream_masks(5, 64, 1e-3, torch.Generator().manual_seed(0), first_fixed=True)
    assert not first[:, 0].any()


def test_loglikelihood_uses_the_family_estimator(bert_dir):  # noqa: F811
    request = Instance("loglikelihood", {}, ("The bear is", " red"), idx=0, metadata=("t", 0, 1))
    dream = load_lm(bert_dir, diffusion_family="dream", diffusion_mc_samples=8, diffusion_mc_batch_size=4)
    llada = load_lm(bert_dir, diffusion_family="llada", diffusion_mc_samples=8, diffusion_mc_batch_size=4, diffusion_cfg_scale=0.5)
    context_ids, continuation_ids = dream._encode_pair(*request.args)
    seed = request_seed(1234, context_ids, continuation_ids)
    want = dream_mc_loglikelihood(dream._forward(None), torch.tensor(context_ids),
                                  torch.tensor(continuation_ids + [dream.tokenizer.eos_token_id]),
                                  mask_token_id=dream.mask_token_id, samples=8, batch_size=4, seed=seed)
    assert dream.loglikelihood([request])[0][0] == pytest.approx(want)
    want = mc_loglikelihood(llada._forward(None), torch.tensor(context_ids), torch.tensor(continuation_ids),
                            mask_token_id=llada.mask_token_id, samples=8, batch_size=4, seed=seed, cfg_scale=0.5)
    unguided = mc_loglikelihood(llada._forward(None), torch.tensor(context_ids), torch.tensor(continuation_ids),
                                mask_token_id=llada.mask_token_id, samples=8, batch_size=4, seed=seed)
    assert llada.loglikelihood([request])[0][0] == pytest.approx(want) and want != pytest.approx(unguided)


# ------------------------------------------------------------------------------------------ family and options

def test_family_detection_and_defaults():
    assert detect_family(SimpleNamespace(model_type="llada")) == "llada"
    assert detect_family(SimpleNamespace(model_type="x", architectures=["LLaDAModelLM"])) == "llada"
    assert detect_family(SimpleNamespace(model_type="Dream", architectures=["DreamModel"])) == "dream"
    assert detect_family(transformers.BertConfig()) is None
    dream = DiffusionConfig().resolved(SimpleNamespace(model_type="Dream", auto_map={"AutoModel": "m.D"}))
    assert (dream.family, dream.logits_shift, dream.alg, dream.stop_rule, dream.likelihood) == ("dream", True, "entropy", "dream", "dream")
    llada = DiffusionConfig().resolved(SimpleNamespace(model_type="llada", auto_map={"AutoModel": "m.L"}))
    assert (llada.logits_shift, llada.alg, llada.stop_rule, llada.likelihood) == (False, "low_confidence", "llada", "llada")
    assert DiffusionConfig().resolved(transformers.BertConfig()).family == "generic"
    override = DiffusionConfig(logits_shift=False, alg="origin").resolved(SimpleNamespace(model_type="Dream"))
    assert (override.logits_shift, override.alg, override.stop_rule) == (False, "origin", "dream")
    remote = SimpleNamespace(model_type="mdm", auto_map={"AutoModel": "m.M"})
    with pytest.raises(ValueError, match="diffusion_family=llada|dream"):
        DiffusionConfig().resolved(remote)
    assert DiffusionConfig(logits_shift=True).resolved(remote).family == "generic"
    with pytest.raises(ValueError, match="no semi-autoregressive blocks"):
        DiffusionConfig(gen_length=8, block_length=4).resolved(SimpleNamespace(model_type="Dream"))


BAD_VALUES = [
    ({"diffusion_alg": "greedy"}, "Did you mean|Valid: low_confidence"),
    ({"diffusion_family": "gpt"}, "diffusion_family value"),
    ({"diffusion_top_p": 1.5, "diffusion_family": "dream"}, r"diffusion_top_p must be in \(0, 1\]"),
    ({"diffusion_top_p": 0.9, "diffusion_family": "llada"}, "are Dream's"),
    ({"diffusion_confidence_eos_eot_inf": True, "diffusion_family": "dream"}, "ranks LLaDA's low_confidence"),
    ({"diffusion_family": "dream", "diffusion_gen_length": 8, "diffusion_block_length": 4}, "no semi-autoregressive blocks"),
    ({"diffusion_ranking_dtype": "float16"}, "diffusion_ranking_dtype value"),
    ({"diffusion_stop_rule": "eos"}, "diffusion_stop_rule value"),
    ({"diffusion_temperature": -1}, "diffusion_temperature must be >= 0"),
    ({"diffusion_temperature": "hot"}, "must be a number"),
    ({"diffusion_eps": 0}, "diffusion_eps must be in"),
    ({"steps": 4, "diffusion_steps": 4}, "both given"),
    ({"model_path": "x"}, "pretrained="),
    ({"classifier_free_guidance": 2.0}, "diffusion_cfg_scale"),
    ({"nll_type": "ar_ftb"}, "diffusion_likelihood"),
    ({"log_type": "union"}, "diffusion_likelihood=dream"),
    ({"escape_until": True}, "diffusion_stop_rule"),
    ({"remasking": "top_k"}, "diffusion_alg value"),
]


class Loading(Exception):
    """Raised where the model config would load: the options were accepted."""


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise Loading

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", refuse)


@pytest.mark.parametrize("options,message", BAD_VALUES)
def test_bad_and_refused_options_fail_clearly_before_loading(no_loading, options, message):
    with pytest.raises(ValueError, match=message):
        DiffusionProbeHFLM(pretrained="/does/not/exist", device="cpu", **options)


ALIAS_VALUES = {"steps": 4, "gen_length": 8, "block_length": 8, "mask_id": 5, "cfg": 0.5, "cfg_scale": 0.5,
                "remasking": "random", "alg": "entropy", "alg_temp": 0.1, "temperature": 0.2, "top_p": 0.95, "top_k": 5,
                "mc_num": 1, "logits_eos_inf": True, "confidence_eos_eot_inf": True, "is_check_greedy": False,
                "max_new_tokens": 8, "sampling_eps": 1e-3}


@pytest.mark.parametrize("name", sorted(set(ALIASES) | set(REFUSED)))
def test_authors_names_never_reach_the_model_class(no_loading, name, tmp_path):
    """Each author's name is read as the plugin's option or refused with a ValueError: never a TypeError."""
    value = ALIAS_VALUES.get(name, "x")
    family = "dream" if name in ("alg", "alg_temp", "top_p", "top_k") else "llada"
    (tmp_path / "config.json").write_text("{}")  # a model folder: the load (refused here) is reached
    with pytest.raises((Loading, ValueError)) as raised:
        DiffusionProbeHFLM(pretrained=str(tmp_path), device="cpu", diffusion_family=family, **{name: value})
    assert (raised.type is Loading) == (name in ALIASES), raised.value


def test_aliases_are_read_as_the_plugin_options_with_a_notice(bert_dir, caplog):  # noqa: F811
    with caplog.at_level(logging.WARNING, logger="lm_eval_probes.models.diffusion_config"):
        lm = load_lm(bert_dir, steps=4, gen_length=8, block_length=4, remasking="random", mc_num=1, cfg=0.5)
    config = lm.diffusion_config
    assert (config.steps, config.gen_length, config.block_length, config.alg, config.mc_samples, config.mc_batch_size,
            config.cfg_scale) == (4, 8, 4, "random", 1, 1, 0.5)
    notices = [r.getMessage() for r in caplog.records if "read as" in r.getMessage()]
    assert len(notices) == 6 and "steps=4 read as diffusion_steps" in notices[0]


def test_reader_tail_states_fall_back_to_float32_beyond_float16():
    """The tail states both wrappers keep (``compact_states``, which replaced the diffusion model's own helper)."""
    from lm_eval_probes.probes.reader.probe import compact_states

    small = torch.tensor([[[1.5, -2.25]]])  # [k layers, m positions, H]
    assert compact_states((2,), small).values.dtype == np.float16
    large = torch.tensor([[[1.5, 1e6]]])  # beyond float16's ±65504 (e.g. Gemma's residual stream)
    kept = compact_states((2,), large)
    assert kept.values.dtype == np.float32 and kept.values[0, 0, 1] == 1e6 and kept.layers == (2,)
