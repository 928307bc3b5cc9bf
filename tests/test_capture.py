"""Integration: captured probes equal a teacher-forced recomputation; loglikelihoods equal stock ``hf``."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from conftest import TINY_ARCHS
from lm_eval_probes.capture.readouts import LensReadout
from lm_eval_probes.capture.positions import position_probes
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.estimators import response_confidence
from lm_eval_probes.models.autoregressive import ProbeHFLM
from lm_eval_probes.probes.bte.probe import BteOptions
from lm_eval_probes.probes import central_window
from lm_eval_probes.records import LayerStates

LL_REQUESTS = [
    ("Question: Mia has 7 apples.", " True"),
    ("Question: Mia has 7 apples.", " False"),  # one-token continuations of one context: grouped by HFLM
    ("Anne is kind. If someone is kind then they are smart.", " Anne is smart."),
    ("The bear", " is red"),
    ("Question: Mia has 7 apples.", " True"),  # a repeated request
    ("0 1 2 3", " 4 5 6 7 8 9 10 11 12"),
]
PROMPTS = ["Question: Mia has 7 apples. Answer:", "Anne is kind.", "The cat is big. All smart people are quiet. The bear"]


def ll_instances() -> list[Instance]:
    return [Instance("loglikelihood", {}, req, 0, ("t", i, 1)) for i, req in enumerate(LL_REQUESTS)]


def gen_instances(until: list[str], max_gen_toks: int = 10) -> list[Instance]:
    kwargs = {"until": until, "max_gen_toks": max_gen_toks, "do_sample": False}
    return [Instance("generate_until", {}, (p, dict(kwargs)), 0, ("t", i, 1)) for i, p in enumerate(PROMPTS)]


def recompute(lm: ProbeHFLM, context_ids: list[int], response_ids: list[int], config: ProbeConfig):
    """Independent teacher-forced pass over one unpadded sequence; states at the response positions."""
    ids = torch.tensor([context_ids + response_ids])
    with torch.no_grad():
        out = lm.model(ids, output_hidden_states=True)
    start = len(context_ids) - 1
    states = [h[0, start : start + len(response_ids)] for h in out.hidden_states]
    readout = LensReadout(lm.model)
    layers = config.options_of("reader").resolved_layers(readout.num_layers)
    prompt = torch.stack([out.hidden_states[layer][0, : len(context_ids)].mean(0) for layer in layers])
    probes = position_probes(states, readout, config, torch.tensor(response_ids))
    return probes.summarize(0, len(response_ids), fields={"prompt_states": LayerStates(layers, prompt.numpy())})


def assert_same_states(got, want, rtol: float) -> None:
    assert got is not None and want is not None
    assert got.layers == want.layers and got.values.shape == want.values.shape
    np.testing.assert_allclose(got.values, want.values, rtol=rtol, atol=rtol * float(np.abs(want.values).max()))


def assert_same_answers(got, want) -> None:
    """hf-probes' loglikelihood answers equal stock ``hf``'s: greedy flags exactly, log-likelihoods to float32
    rounding (hf-probes unembeds only the positions HFLM reads, so its matmul has other shapes)."""
    assert [bool(a[1]) for a in got] == [bool(b[1]) for b in want]
    assert [float(a[0]) for a in got] == pytest.approx([float(b[0]) for b in want], rel=1e-6, abs=1e-6)


def assert_same_probe(got, want, rel: float = 1e-4) -> None:
    assert got is not None
    assert got.n_tokens == want.n_tokens
    if want.n_tokens == 0:
        assert math.isnan(got.get("tcb_log10_mean")) and math.isnan(got.get("bte_energy"))
        return
    assert got.mean_token_logprob == pytest.approx(want.mean_token_logprob, rel=rel, abs=1e-6)
    for name in ("tcb_log10_mean", "tcb_log10_min", "entropy", "bte_energy"):
        assert got.get(name) == pytest.approx(want.get(name), rel=rel, abs=1e-6), name
    assert got.get("tcb_argmin") == want.get("tcb_argmin")
    if want.get("bte_profile") is None:
        assert got.get("bte_profile") is None
    else:
        assert got.get("bte_profile") == pytest.approx(want.get("bte_profile"), rel=rel, abs=1e-7)
    assert_same_states(got.get("answer_states"), want.get("answer_states"), rtol=max(rel, 1e-4))
    assert_same_states(got.get("prompt_states"), want.get("prompt_states"), rtol=max(rel, 1e-4))


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("batch_size", [1, 3, "auto"])
def test_loglikelihood_capture_matches_teacher_forced_and_stock_hf(tiny_model_dir, arch, batch_size):
    folder = tiny_model_dir(arch)
    lm = ProbeHFLM(pretrained=folder, device="cpu", batch_size=batch_size, max_batch_size=4)
    stock = HFLM(pretrained=folder, device="cpu", batch_size=batch_size, max_batch_size=4)
    answers = lm.loglikelihood(ll_instances())
    assert_same_answers(answers, stock.loglikelihood(ll_instances()))
    for (context, continuation), answer in zip(LL_REQUESTS, answers):
        ctx_ids, cont_ids = lm._encode_pair(context, continuation)
        want = recompute(lm, ctx_ids, cont_ids, lm.probe_config)
        assert_same_probe(answer.probe, want)
        assert answer.probe.mean_token_logprob * len(cont_ids) == pytest.approx(answer[0], rel=1e-5)


@pytest.mark.parametrize("probes", ["none", "tcb+bte+reader"])
def test_only_the_positions_hflm_reads_are_unembedded(tiny_model_dir, probes):
    """The forward unembeds from the first position a row of the batch reads on (``logits_to_keep``); HFLM's
    answers stay those of stock ``hf``, which unembeds every position."""
    folder = tiny_model_dir("llama")
    lm = ProbeHFLM(pretrained=folder, device="cpu", batch_size=3, probes=probes)
    seen: list[tuple[int, int]] = []  # (positions in, positions unembedded) per forward
    inputs: list[int] = []
    hooks = [lm.model.register_forward_pre_hook(lambda _m, args: inputs.append(args[0].shape[1])),
             lm.model.get_output_embeddings().register_forward_hook(
                 lambda _m, args, _out: seen.append((inputs[-1], args[0].shape[1])))]
    context = "Anne is kind. If someone is kind then they are smart. The bear is red. All red things are big. Is Anne smart?"
    requests = [(context[: len(context) - 7 * i], option) for i in range(3) for option in (" True", " False", " Unknown")]
    instances = lambda: [Instance("loglikelihood", {}, r, 0, ("t", i, 1)) for i, r in enumerate(requests)]  # noqa: E731
    try:
        answers = lm.loglikelihood(instances())
    finally:
        for hook in hooks:
            hook.remove()
    assert_same_answers(answers, HFLM(pretrained=folder, device="cpu", batch_size=3).loglikelihood(instances()))
    assert seen and all(kept <= total for total, kept in seen)
    assert sum(kept for _, kept in seen) < sum(total for total, _ in seen) / 4, seen


def test_logits_cache_off_gives_the_same_probes(tiny_model_dir):
    folder = tiny_model_dir("llama")
    grouped = ProbeHFLM(pretrained=folder, device="cpu", batch_size=2).loglikelihood(ll_instances())
    ungrouped = ProbeHFLM(pretrained=folder, device="cpu", batch_size=2, logits_cache=False).loglikelihood(ll_instances())
    for a, b in zip(grouped, ungrouped):
        assert_same_probe(a.probe, b.probe)


def _prompt_ids(lm: ProbeHFLM, prompt: str) -> list[int]:
    ids, _ = lm.tok_batch_encode([prompt])
    return ids[0].tolist()


def _free_generation(lm: ProbeHFLM, prompt: str, n: int) -> list[int]:
    ids = torch.tensor([_prompt_ids(lm, prompt)])
    with torch.no_grad():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                pad_token_id=lm.tokenizer.pad_token_id)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("mode", ["teacher_forced", "generate"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_generation_capture_covers_exactly_the_kept_tokens(tiny_model_dir, mode, batch_size, monkeypatch):
    import lm_eval_probes.models.autoregressive

    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=batch_size, probe_gen_capture=mode)
    # stop strings taken from the free-running text, so that rows stop early and at different points
    free = [lm.tok_decode(_free_generation(lm, p, 10)) for p in PROMPTS]
    until = [free[0][len(free[0]) // 2 :][:2], free[2][3:5]]
    probed = []  # the positions that went through the lens, per row
    lens = lm_eval_probes.capture.positions.position_probes_of_spans

    def counting(spans, *args, **kwargs):
        probed.extend(lm_eval_probes.capture.positions.span_positions(span) for span in spans)  # unread layers: None
        return lens(spans, *args, **kwargs)

    monkeypatch.setattr(lm_eval_probes.models.autoregressive, "position_probes_of_spans", counting)
    texts = lm.generate_until(gen_instances(until))
    # only the kept tokens go through the lens (the batch order is lm_eval's: compare as multisets)
    assert sorted(probed) == sorted(max(t.probe.n_tokens, 1) for t in texts)
    for prompt, text in zip(PROMPTS, texts):
        generated = _free_generation(lm, prompt, 10)
        n = text.probe.n_tokens
        assert lm.tok_decode(generated[:n]).startswith(text), "kept tokens must cover the kept text"
        assert n == 0 or len(lm.tok_decode(generated[: n - 1])) < len(text), "no token beyond the kept text"
        want = recompute(lm, _prompt_ids(lm, prompt), generated[:n], lm.probe_config)
        rel = 1e-4 if mode == "teacher_forced" else 2e-3  # KV-cache decoding vs one full pass
        if n:
            assert_same_probe(text.probe, want, rel=rel)
            # generation keeps what the answer-span confidence and reader need after filtering
            probe = text.probe
            assert len(probe.token_logprobs) == len(probe.token_ends) == n
            assert np.mean(probe.token_logprobs) == pytest.approx(probe.mean_token_logprob, rel=1e-6)
            assert list(probe.token_ends) == sorted(probe.token_ends) and probe.token_ends[-1] == len(text)
            tail = probe.get("tail_states").values
            assert tail.shape[:2] == (len(probe.get("answer_states").layers), min(n, lm.probe_config.options_of("reader").tail))
            if n <= lm.probe_config.options_of("reader").tail:  # the tail is the whole response: its mean is answer_states
                assert_same_states(probe.get("tail_states").mean_positions(0, n), probe.get("answer_states"), rtol=2e-3)
    assert any(t.probe.n_tokens < 10 for t in texts), "the stop strings should have cut some rows"


def test_generation_stops_at_early_eos(tiny_model_dir):
    lm = ProbeHFLM(pretrained=tiny_model_dir("qwen2"), device="cpu", batch_size=3, probe_gen_capture="teacher_forced")
    generated = _free_generation(lm, PROMPTS[1], 10)
    head = lm.model.get_output_embeddings().weight
    trigger = generated[3]
    with torch.no_grad():
        original = head[lm.eot_token_id].clone()
        head[lm.eot_token_id] = head[trigger] * 2.0  # EOS now wins wherever `trigger` would have been argmax
        lm.readout = LensReadout(lm.model)  # the readout caches row norms of W
        try:
            texts = lm.generate_until(gen_instances(until=[]))
            eos_rows = [t for t, p in zip(texts, PROMPTS) if t.probe.n_tokens < 10]
            assert eos_rows, "at least one row should end at EOS"
            for prompt, text in zip(PROMPTS, texts):
                generated = _free_generation(lm, prompt, 10)
                n = text.probe.n_tokens
                assert lm.eot_token_id not in generated[:n] or (text.probe.empty and n == 1)
                assert_same_probe(text.probe, recompute(lm, _prompt_ids(lm, prompt), generated[:n], lm.probe_config))
        finally:
            head[lm.eot_token_id] = original


def test_repeats_each_get_their_probe(tiny_model_dir):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2, probe_gen_capture="teacher_forced")
    inst = gen_instances(until=["\n"])
    texts = lm.generate_until([inst[0], inst[0], inst[1]])
    assert all(t.probe is not None for t in texts)
    assert texts[0] == texts[1]
    assert_same_probe(texts[0].probe, texts[1].probe)


@pytest.mark.parametrize("mode", ["generate", "teacher_forced"])
def test_empty_generation_is_probed_at_the_position_that_chose_to_stop(tiny_model_dir, mode):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=1, probe_gen_capture=mode)
    first_token = _free_generation(lm, PROMPTS[0], 1)
    (text,) = lm.generate_until(gen_instances(until=[lm.tok_decode(first_token)])[:1])
    probe = text.probe
    assert text == "" and probe.empty and probe.n_tokens == 1 and probe.token_ends == (0,)
    assert_same_probe(probe, recompute(lm, _prompt_ids(lm, PROMPTS[0]), first_token, lm.probe_config))
    with torch.no_grad():
        logits = lm.model(torch.tensor([_prompt_ids(lm, PROMPTS[0])])).logits[0, -1].double()
    p_stop = float(torch.softmax(logits, -1)[first_token[0]])
    assert response_confidence(probe) == pytest.approx(p_stop, rel=1e-5)
    assert math.isfinite(probe.get("tcb_log10_mean")) and math.isfinite(probe.get("bte_energy"))


def test_final_layer_readout_equals_model_logprobs(tiny_model_dir):
    for arch in TINY_ARCHS:
        lm = ProbeHFLM(pretrained=tiny_model_dir(arch), device="cpu")
        ids = torch.tensor([_prompt_ids(lm, PROMPTS[2])])
        with torch.no_grad():
            out = lm.model(ids, output_hidden_states=True)
        readout = LensReadout(lm.model)
        got = readout.logprobs(out.hidden_states[-1][0], normalized=True)
        want = torch.log_softmax(out.logits[0].float(), -1)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        if arch == "gemma3_text":
            assert readout.logit_softcap == 5.0


def test_parts_found_by_convention_or_override():
    """OPT keeps its final norm one level down (its ARCHITECTURES row); GPT-1 has no final norm (post-norm blocks): its
    head reads the last block's output, and the lens reproduces the model's log-probabilities."""
    import transformers as tf

    from lm_eval_probes.capture.readouts import UnsupportedModelError, check_lens

    torch.manual_seed(0)
    opt = tf.OPTForCausalLM(tf.OPTConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, ffn_dim=32,
                                         num_attention_heads=2, word_embed_proj_dim=16, max_position_embeddings=32)).eval()
    readout = LensReadout(opt)
    assert readout.final_norm is opt.model.decoder.final_layer_norm and readout.num_layers == 2
    assert check_lens(opt, readout) < 1e-4
    gpt1 = tf.OpenAIGPTLMHeadModel(tf.OpenAIGPTConfig(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    readout = LensReadout(gpt1.eval())
    assert not readout.has_final_norm and isinstance(readout.final_norm, torch.nn.Identity)
    assert check_lens(gpt1, readout) < 1e-4


@pytest.mark.parametrize("attribute, value", [("logit_scale", 0.5), ("logits_scaling", 4.0), ("lm_head_multiplier", 3.0),
                                              ("final_logit_softcapping", 2.0)])
def test_logit_transforms_read_from_the_config(tiny_model_dir, attribute, value):
    """Cohere multiplies the logits by ``logit_scale``, Granite divides them by ``logits_scaling``, Falcon-H1 multiplies
    them by ``lm_head_multiplier``, Gemma soft-caps them: the lens reads each from the config and reproduces the
    model's log-probabilities; a lens that misses one is refused at load, naming the model type and the mismatch."""
    import transformers as tf

    from lm_eval_probes.capture.readouts import UnsupportedModelError, check_lens

    family = {"logit_scale": "cohere", "logits_scaling": "granite", "lm_head_multiplier": "falcon_h1",
              "final_logit_softcapping": "gemma2"}[attribute]
    extra = {"falcon_h1": dict(mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_chunk_size=8),
             "gemma2": dict(head_dim=8)}.get(family, {})
    config = tf.AutoConfig.for_model(family, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, **{attribute: value}, **extra)
    torch.manual_seed(1)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    readout = LensReadout(model)
    assert check_lens(model, readout) < 1e-4
    assert (readout.logit_softcap if attribute == "final_logit_softcapping" else readout.logit_scale) == pytest.approx(
        1 / value if attribute == "logits_scaling" else value)
    readout.logit_scale, readout.logit_softcap = 1.0, None  # a lens that misses the transform
    with pytest.raises(UnsupportedModelError, match=rf"^model_type '{family}': the logit lens .* differs from the "
                                                    r"model's own log-probabilities by up to [0-9.e-]+ \(allowed"):
        check_lens(model, readout)


HALF_PRECISION_CLASS = {"bfloat16": 0.1, "float16": 0.02}
"""Largest relative difference of a probe value from the same model in float32 (tiny random Llama, every probe),
the class each precision is tested against. Measured: bfloat16 7.9e-2 for the top-2 logit margin (a difference
of two logits), ≤ 1.9e-2 for BTE and the margins, ≤ 3.1e-3 for δ_TCB, entropy and Ω; float16 ten times less."""

_PROBE_VALUES = ("tcb_log10_mean", "entropy", "logit_margin", "bte_energy", "omega", "margin_mean", "margin_min")


def _relative(a: float, b: float) -> float:
    return 0.0 if a == b else abs(a - b) / max(abs(a), abs(b))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_models_probe_every_signal(tiny_model_dir, dtype):
    """A half-precision model's states go through the lens, δ_TCB, BTE, Ω and the margins (loglikelihood and
    generation): finite values, its loglikelihoods those of plain ``hf`` in that dtype, every probe within its
    precision's class of the same model in float32."""
    folder = tiny_model_dir("llama")
    lm = ProbeHFLM(pretrained=folder, device="cpu", batch_size=3, dtype=dtype, probes="all")
    assert lm.model.dtype == getattr(torch, dtype)
    answers = lm.loglikelihood(ll_instances())
    stock = HFLM(pretrained=folder, device="cpu", batch_size=3, dtype=dtype)
    assert [tuple(a) for a in answers] == [tuple(s) for s in stock.loglikelihood(ll_instances())]
    fp32 = ProbeHFLM(pretrained=folder, device="cpu", batch_size=3, probes="all")
    worst = 0.0
    for low, full in zip(answers, fp32.loglikelihood(ll_instances())):
        for name in _PROBE_VALUES:
            value, reference = low.probe.get(name), full.probe.get(name)
            assert value is not None and math.isfinite(value), (name, value)
            worst = max(worst, _relative(value, reference))
        assert np.isfinite(low.probe.get("answer_states").values).all()
    texts = lm.generate_until(gen_instances(["\n"], max_gen_toks=6))
    references = fp32.generate_until(gen_instances(["\n"], max_gen_toks=6))
    compared = 0
    for text, reference in zip(texts, references):
        for name in _PROBE_VALUES:
            assert text.probe.get(name) is None or math.isfinite(text.probe.get(name)), name
        if str(text) == str(reference):  # the same tokens: comparable values
            compared += 1
            worst = max(worst, *(_relative(text.probe.get(n), reference.probe.get(n)) for n in _PROBE_VALUES
                                 if reference.probe.get(n) is not None))
    assert compared >= 1
    assert worst <= HALF_PRECISION_CLASS[dtype], worst


def test_prompt_token_counts(tiny_model_dir):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=3)
    for (context, continuation), answer in zip(LL_REQUESTS, lm.loglikelihood(ll_instances())):
        ctx_ids, _ = lm._encode_pair(context, continuation)
        assert answer.probe.prompt_tokens == len(ctx_ids)
    for prompt, text in zip(PROMPTS, lm.generate_until(gen_instances(until=["\n"]))):
        assert text.probe.prompt_tokens == len(_prompt_ids(lm, prompt))


@pytest.mark.parametrize("mode", ["generate", "teacher_forced"])
def test_prompt_states_over_the_prompt_tail(tiny_model_dir, mode):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=3, probe_reader_prompt_tail=3,
                   probe_gen_capture=mode)
    layers = lm.plan.requested.prompt_layers

    def want(context_ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            out = lm.model(torch.tensor([context_ids]), output_hidden_states=True)
        return torch.stack([out.hidden_states[layer][0, -3:].mean(0) for layer in layers]).numpy()

    for (context, continuation), answer in zip(LL_REQUESTS, lm.loglikelihood(ll_instances())):
        ctx_ids, _ = lm._encode_pair(context, continuation)
        np.testing.assert_allclose(answer.probe.get("prompt_states").values, want(ctx_ids), rtol=1e-4, atol=1e-5)
    for prompt, text in zip(PROMPTS, lm.generate_until(gen_instances(until=["\n"]))):  # left-padded batch of 3
        np.testing.assert_allclose(text.probe.get("prompt_states").values, want(_prompt_ids(lm, prompt)), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="probe_reader_prompt_tail must be >= 0"):
        ProbeConfig.from_model_args({"probe_reader_prompt_tail": -1})


@pytest.mark.parametrize("chunk", [1, 64])
def test_loglikelihood_rows_bookkeeping_alone(tiny_model_dir, chunk):
    """Without HFLM: two batches of right-padded rows, a row answering two grouped requests, each request gets its
    trailing slice; each batch's rows are found by their ids (a real trailing id 0 included; unknown rows keep every
    logit); the lens queue goes through the lens once it holds ``chunk_positions`` positions, or at the end."""
    import dataclasses

    from lm_eval_probes.capture.loglikelihood import LoglikelihoodRows
    from lm_eval_probes.capture.plan import ProbePlan
    from lm_eval_probes.capture.positions import hidden_state_tap, position_probes

    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=1)
    config, readout = dataclasses.replace(lm.probe_config, chunk_positions=chunk), lm.readout
    plan = ProbePlan.of(config, readout.num_layers)
    layers = lm.plan.requested.prompt_layers
    rows_in = [torch.tensor([[5, 6, 7, 8, 9, 0], [11, 12, 13, 14, 15, 0]]), torch.tensor([[20, 21, 22, 23, 24]])]
    with hidden_state_tap(lm.model) as tap:
        rows = LoglikelihoodRows(tap, readout, plan)
        cut = LoglikelihoodRows(tap, readout, plan)
        cut.note_requests([(("d", " z"), [30, 0], [31]), (("e", " cut"), [40, 41, 42, 43], [44, 45])], max_length=4)
        assert cut.new_batch(torch.ones(2, 4, dtype=torch.long)) == 0  # rows of no request (batch-size search)
        assert cut.new_batch(torch.tensor([[30, 0, 0]])) == 1  # [30, 0]: a real trailing 0, reads 1 position
        assert cut.new_batch(torch.tensor([[41, 42, 43, 44]])) == 2  # the request's last max_length + 1 ids but one
        rows.note_requests([(("a", " x y"), [5, 6, 7, 8], [9, 10]), (("a", " y"), [5, 6, 7, 8, 9], [10]),
                            (("b", " q r s"), [11, 12, 13], [14, 15, 16]), (("c", " t"), [20, 21, 22, 23, 24], [25])],
                           max_length=64)
        assert rows.new_batch(rows_in[0]) == 2  # row 0 reads positions 3-4, row 1 (three tokens) 2-4
        with torch.no_grad():
            first = lm.model(rows_in[0], output_hidden_states=True).hidden_states
        assert rows.locate(("b", " q r s")) == (1, 5, 3) and rows.locate(("c", " t")) is None
        rows.on_answer("loglikelihood", ("a", " x y"), (-3.0, False))
        rows.on_answer("loglikelihood", ("a", " y"), (-1.0, True))  # the same row, a one-token suffix
        rows.on_answer("generate_until", ("a", " y"), "ignored")
        rows.on_answer("loglikelihood", ("b", " q r s"), (-4.5, False))
        # the first batch's answers take their states before the next forward replaces them
        assert rows.new_batch(rows_in[1]) == 4
        assert tap.latest is None
        assert set(rows.probes) == ({("a", " x y"), ("a", " y"), ("b", " q r s")} if chunk == 1 else set())
        with torch.no_grad():
            lm.model(rows_in[1], output_hidden_states=True)
        rows.on_answer("loglikelihood", ("c", " t"), (-0.5, True))
        rows.flush()
    want = position_probes([h[0, 3:5] for h in first], readout, config).summarize(0, 2)
    got = rows.probes[("a", " x y")]
    assert got.n_tokens == 2 and got.mean_token_logprob == -1.5 and got.prompt_tokens == 4
    assert got.get("tcb_log10_mean") == pytest.approx(want.get("tcb_log10_mean"), rel=1e-6)
    assert got.get("bte_energy") == pytest.approx(want.get("bte_energy"), rel=1e-6)
    suffix = rows.probes[("a", " y")]  # the trailing slice: only the last position
    want_suffix = position_probes([h[0, 4:5] for h in first], readout, config).summarize(0, 1)
    assert suffix.n_tokens == 1 and suffix.prompt_tokens == 5
    assert suffix.get("tcb_log10_mean") == pytest.approx(want_suffix.get("tcb_log10_mean"), rel=1e-6)
    assert rows.probes[("b", " q r s")].n_tokens == 3 and rows.probes[("c", " t")].n_tokens == 1
    np.testing.assert_allclose(got.get("prompt_states").values,
                               torch.stack([first[layer][0, :4].mean(0) for layer in layers]).numpy(), rtol=1e-5)


def test_position_probes_need_only_the_layers_they_read(tiny_model_dir):
    """States kept for the layers the plan's probes read only (what the loglikelihood bookkeeping keeps of an
    answered option) give the same probes; a layer the probes read but that was not kept fails clearly."""
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=1)
    config, readout, num_layers = lm.probe_config, lm.readout, lm.readout.num_layers
    with torch.no_grad():
        states = [h[0, 2:6] for h in lm.model(torch.tensor([[5, 6, 7, 8, 9, 10]]), output_hidden_states=True).hidden_states]
    layers = lm.plan.read_layers
    first, last = central_window(num_layers, config.options_of("bte").window)
    assert layers == {num_layers, *range(first, last + 1), *config.options_of("reader").resolved_layers(num_layers)}
    assert 0 not in layers  # the embeddings are read by no default probe
    want = position_probes(states, readout, config).summarize(0, 4)
    got = position_probes([h if layer in layers else None for layer, h in enumerate(states)], readout, config)
    got = got.summarize(0, 4)
    # the lens may group other layers into one product (another shape): equal to float32 rounding, not bitwise
    for field in ("tcb_log10_mean", "bte_energy"):
        assert got.get(field) == pytest.approx(want.get(field), rel=1e-5, abs=1e-7), field
    np.testing.assert_array_equal(got.get("answer_states").values, want.get("answer_states").values)
    readers = [h if layer in lm.plan.layers_read(lens=False) else None for layer, h in enumerate(states)]
    assert position_probes(readers, readout, config, lens=False).summarize(0, 4).get("tcb_log10_mean") is None
    missing = sorted(layers - lm.plan.layers_read(lens=False))
    with pytest.raises(ValueError, match=rf"layers {re.escape(str(missing))} are needed .* not kept"):
        position_probes(readers, readout, config)


def test_lens_plan_gives_the_lens_to_the_chosen_option_only():
    from lm_eval_probes.capture.loglikelihood import LensPlan, OptionGroup

    def argmax(logliks):
        return max(range(len(logliks)), key=lambda i: logliks[i])

    plan = LensPlan([OptionGroup(("a", "b", "c"), argmax), OptionGroup(("u",), lambda _: None)], always=["x"])
    assert plan.answered("a", -3.0) == []  # its document's other options are not in yet
    assert plan.answered("z", -1.0) == [("z", True)]  # outside every group: at once
    assert plan.answered("b", -1.0) == []
    assert plan.answered("b", -1.0) == []  # a repeated request counts once
    assert sorted(plan.answered("c", -2.0)) == [("a", False), ("b", True), ("c", False)]
    assert plan.answered("u", -0.5) == [("u", False)]  # read by no row (acc_mutual_info's unconditional request)
    assert plan.answered("x", -0.5) == [("x", True)]


def test_a_key_shared_by_two_documents_gets_the_lens_when_either_chooses_it():
    from lm_eval_probes.capture.loglikelihood import LensPlan, OptionGroup

    first = OptionGroup(("yes", "no"), lambda logliks: 0)
    second = OptionGroup(("yes", "maybe"), lambda logliks: 1)
    plan = LensPlan([first, second])
    assert plan.answered("yes", -1.0) == []
    assert plan.answered("no", -2.0) == [("no", False)]  # "yes" waits for its second document
    assert sorted(plan.answered("maybe", -3.0)) == [("maybe", True), ("yes", True)]


def test_window_readout_gives_the_full_profile_values(tiny_model_dir):
    """``probe_bte_profile=window`` reads out only the window's layers: the same ē_M, δ_TCB and baselines."""
    import dataclasses

    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=1)
    ids = torch.tensor([_prompt_ids(lm, PROMPTS[2])])
    with torch.no_grad():
        states = [h[0] for h in lm.model(ids, output_hidden_states=True).hidden_states]
    config = lm.probe_config
    window = position_probes(states, lm.readout, config).summarize(0, ids.shape[1])
    full_config = dataclasses.replace(config, options={**config.options, "bte": BteOptions(profile="full")})
    full = position_probes(states, lm.readout, full_config).summarize(0, ids.shape[1])
    assert window.get("bte_profile") is None and len(full.get("bte_profile")) == lm.readout.num_layers
    start, stop = central_window(lm.readout.num_layers)
    assert window.get("bte_energy") == pytest.approx(float(np.mean(full.get("bte_profile")[start:stop])), rel=1e-6)
    for name in ("bte_energy", "tcb_log10_mean", "entropy", "logit_margin", "v_eff_ipr"):
        assert window.get(name) == pytest.approx(full.get(name), rel=1e-6), name


def test_bte_features_are_the_transition_statistics_of_the_full_energies(tiny_model_dir):
    import dataclasses

    from lm_eval_probes.probes import transition_statistics

    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=1, probe_bte_features=1)
    assert lm.probe_config.options_of("bte").features
    ids = torch.tensor([_prompt_ids(lm, PROMPTS[2])])
    with torch.no_grad():
        states = [h[0] for h in lm.model(ids, output_hidden_states=True).hidden_states]
    n, num_layers = ids.shape[1], lm.readout.num_layers
    got = position_probes(states, lm.readout, lm.probe_config).summarize(0, n)
    full = position_probes(states, lm.readout, dataclasses.replace(
        lm.probe_config, options={**lm.probe_config.options, "bte": BteOptions(profile="full")}))
    want = transition_statistics(full.of("bte")["energy"].double()).reshape(-1)
    assert len(got.get("bte_features")) == 11 * num_layers and len(got.get("bte_profile")) == num_layers
    np.testing.assert_allclose(got.get("bte_features"), want.numpy(), rtol=1e-6, atol=1e-9)
    assert got.get("bte_features")[0] == pytest.approx(got.get("bte_profile")[0], rel=1e-6)  # transition 0's mean
    with pytest.raises(ValueError, match="probe_bte_features must be 1/0"):
        ProbeConfig.from_model_args({"probe_bte_features": "maybe"})


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "gemma3_text"])
def test_a_probed_forward_keeps_only_the_layers_the_probes_read(tiny_model_dir, arch):
    """``output_hidden_states=[indices]`` (:func:`~lm_eval_probes.capture.positions.states_request`): transformers keeps
    the asked layers only — the same tensors as with every layer — and the wrappers ask for their plan's ``kept_layers``."""
    from lm_eval_probes.capture.plan import ProbePlan
    from lm_eval_probes.capture.positions import hidden_state_tap, states_request

    lm = ProbeHFLM(pretrained=tiny_model_dir(arch), device="cpu", batch_size=2, probes="tcb")
    last = lm.readout.num_layers
    assert lm.kept_layers == lm.plan.kept_layers == ProbePlan.of(lm.probe_config, last).kept_layers == {last}
    ids = torch.tensor([_prompt_ids(lm, PROMPTS[0])])
    with torch.no_grad():
        every = lm.model(ids, output_hidden_states=True).hidden_states
        some = lm.model(ids, output_hidden_states=states_request(lm.model, {0, last})).hidden_states
        with hidden_state_tap(lm.model, layers=lm.kept_layers) as tap:
            lm.model(ids)
    assert len(some) == len(every) == last + 1
    assert [h is None for h in some] == [layer not in (0, last) for layer in range(last + 1)]
    assert torch.equal(some[0], every[0]) and torch.equal(some[last], every[last])
    assert [h is not None for h in tap.latest] == [layer == last for layer in range(last + 1)]
    assert torch.equal(tap.latest[last], every[last])
