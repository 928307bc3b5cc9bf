"""``hf-probes-diffusion`` with ``probe_traces=true``: each response's trace and its lens grid at reveal.

The masked-LM lens is checked against each model's own head written out by hand (BERT, ModernBERT, a Llama made
bidirectional); the grid of a generation against a replay of the canvas each position was revealed from (its tokens
revealed before that step, the rest masked: the forward the decoding ran then); the grid of a multiple-choice option
against one forward over the unmasked request. Tiny random models built from configs.
"""

from __future__ import annotations

import math

import lm_eval.evaluator
import numpy as np
import pytest
import torch
import transformers
from lm_eval.api.instance import Instance

from test_diffusion import MODEL_ARGS, PROMPTS, generate, manager, masked_lm_dir, mask_tokenizer, tiny_config  # noqa: F401
from lm_eval_probes.capture.masked_readout import lens_grid_of, masked_lm_readout
from lm_eval_probes.models.diffusion import DiffusionProbeHFLM
from lm_eval_probes.models.diffusion_decoding import masked_diffusion_decode
from lm_eval_probes.records import probe_of

LENS_KEYS = ("top_token", "top_prob", "emitted_prob")


def hand_written_lens(model, arch: str):
    """layer index, its states ``[n, d]`` → logits ``[n, V]``, written from each family's modelling code."""
    num_layers = model.config.num_hidden_layers
    if arch == "bert":  # every block ends in its own norm: the MLM head reads any layer as it reads the last
        return lambda layer, h: model.cls(h)
    if arch == "modernbert":  # hidden_states[L] is post final norm; the head, then the decoder
        return lambda layer, h: model.decoder(model.head(h if layer == num_layers else model.model.final_norm(h)))
    return lambda layer, h: model.lm_head(h if layer == num_layers else model.model.norm(h))


@pytest.mark.parametrize("arch", ["bert", "modernbert", "llama"])
def test_the_masked_lm_lens_is_each_models_own_readout(arch):
    tokenizer = mask_tokenizer()
    torch.manual_seed(3)
    if arch == "llama":
        config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=3, num_attention_heads=4, initializer_range=0.3)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    else:
        model = transformers.AutoModelForMaskedLM.from_config(tiny_config(arch, tokenizer)).eval()
    readout = masked_lm_readout(model)
    assert readout.num_layers == 3 and readout.vocab_size == len(tokenizer)
    ids = torch.tensor([[5, 17, 40, 2, 99, 63, 7]])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
        want = hand_written_lens(model, arch)
        for layer, states in enumerate(out.hidden_states):
            got = readout.logits(states[0], normalized=layer == 3)
            torch.testing.assert_close(got, want(layer, states[0]).float(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(readout.logits(out.hidden_states[-1][0], normalized=True), out.logits[0],
                                   rtol=1e-5, atol=1e-5)
        emitted = ids[0]
        grid = lens_grid_of({layer: out.hidden_states[layer][0] for layer in (1, 3)}, readout, emitted,
                            chunk_positions=3)  # chunks of 3 positions: the grid does not depend on them
        for row, layer in enumerate((1, 3)):
            probs = torch.softmax(want(layer, out.hidden_states[layer][0]).double(), dim=-1)
            torch.testing.assert_close(grid.emitted_prob[row].double(), probs.gather(-1, emitted[:, None])[:, 0],
                                       rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(grid.top_prob[row].double(), probs.max(-1).values, rtol=1e-5, atol=1e-7)
            assert grid.top_token[row].tolist() == probs.argmax(-1).tolist()


def test_a_model_whose_head_cannot_be_found_is_refused_in_one_line():
    from lm_eval_probes.capture.parts import UnsupportedModelError

    class Opaque(torch.nn.Module):  # logits made in the forward itself, by no module
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(50, 8)
            self.config = transformers.PretrainedConfig()

        def get_input_embeddings(self):
            return self.embed

        def get_output_embeddings(self):
            return None

        def forward(self, input_ids, output_hidden_states=False):
            h = self.embed(input_ids)
            return transformers.modeling_outputs.MaskedLMOutput(logits=h @ self.embed.weight.T, hidden_states=(h,))

    with pytest.raises(UnsupportedModelError, match="reads hidden_states\\[L\\] into its logits"):
        masked_lm_readout(Opaque())


def replayed_lens(lm: DiffusionProbeHFLM, prompt_ids: list[int], canvas: list[int], steps: list[int], n: int,
                  layers: list[int], *, shift: bool, ruled_out: tuple[int, ...] = ()) -> dict[str, list[list]]:
    """The first ``n`` canvas tokens' lens at their reveal steps, recomputed: the canvas of that step rebuilt (tokens
    revealed at an earlier step in place, the rest masked), one forward, each layer's state at the column whose logits
    score the token (one earlier with the logits shift) through BERT's own head (``cls``)."""
    cells: dict[str, list[list]] = {key: [] for key in LENS_KEYS}
    for position in range(n):
        row = [token if step < steps[position] else lm.mask_token_id for token, step in zip(canvas, steps, strict=True)]
        with torch.no_grad():
            out = lm.model(input_ids=torch.tensor([prompt_ids + row]), output_hidden_states=True)
        column = len(prompt_ids) + position - (1 if shift else 0)
        probs = []
        for layer in layers:
            logits = lm.model.cls(out.hidden_states[layer][0, column : column + 1])[0].double()
            logits[list(ruled_out)] = -math.inf
            probs.append(torch.softmax(logits, dim=-1))
        cells["top_token"].append([int(p.argmax()) for p in probs])
        cells["top_prob"].append([float(p.max()) for p in probs])
        cells["emitted_prob"].append([float(p[canvas[position]]) for p in probs])
    return {key: [list(column) for column in zip(*rows, strict=True)] for key, rows in cells.items()}


@pytest.mark.parametrize("options", [{}, {"diffusion_logits_shift": True}, {"diffusion_logits_eos_inf": True}],
                         ids=["plain", "logits_shift", "eos_inf"])
def test_a_generation_trace_reads_the_lens_at_each_tokens_reveal(masked_lm_dir, options):
    """Shapes ``[kept layer][position]``, the layers the probes keep and the last; at the last layer ``emitted_prob``
    is the model's own probability of the token at its reveal step (``exp`` of its reveal-time log-probability, the
    trace's ``logprob``); every cell equals a replay of the canvas the token was revealed from."""
    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", batch_size=2, probe_traces="true",
                            **MODEL_ARGS, **options)
    layers = sorted({*lm.state_layers, lm.num_layers})
    assert lm.num_layers in layers and len(layers) < lm.num_layers + 2  # the kept layers only (and L)
    ruled_out = tuple(lm.sampler.eos_ids) if options.get("diffusion_logits_eos_inf") else ()
    for prompt, text in zip(PROMPTS, generate(lm, ["<never>"]), strict=True):
        probe, trace = text.probe, text.probe.trace
        n = probe.n_tokens
        assert trace["lens_layers"] == layers and len(trace["tokens"]) == n
        for key in LENS_KEYS:
            assert len(trace["lens"][key]) == len(layers) and all(len(row) == n for row in trace["lens"][key])
        assert trace["logprob"] == pytest.approx(list(probe.token_logprobs), rel=1e-3)
        assert trace["lens"]["emitted_prob"][-1] == pytest.approx([math.exp(v) for v in probe.token_logprobs], rel=2e-3)
        ids = lm.tok_encode(prompt)  # the replay: each token's canvas at its reveal step
        decoded = masked_diffusion_decode(lm._forward(None), torch.tensor([ids]), mask_token_id=lm.mask_token_id,
                                          gen_length=8, block_length=4, steps=4, sampler=lm.sampler)
        assert decoded.reveal_step[0, :n].tolist() == list(probe.reveal_steps)
        assert trace["tokens"] == [lm.tok_decode([t]) for t in decoded.tokens[0, :n].tolist()]
        want = replayed_lens(lm, ids, decoded.tokens[0].tolist(), decoded.reveal_step[0].tolist(), n, layers,
                             shift=bool(options.get("diffusion_logits_shift")), ruled_out=ruled_out)
        assert trace["lens"]["top_token"] == want["top_token"]
        for key in ("top_prob", "emitted_prob"):
            for got_row, want_row in zip(trace["lens"][key], want[key], strict=True):
                assert got_row == pytest.approx(want_row, rel=2e-3, abs=1e-7), key


def test_a_multiple_choice_trace_is_the_scoring_forward_at_the_continuation(masked_lm_dir):
    """A loglikelihood request's trace: the continuation's tokens, their log-probabilities in the one forward over the
    unmasked request the probes read (not the Monte-Carlo estimate), and the lens of that forward's kept layers at the
    continuation's positions; at the last layer ``emitted_prob`` is ``exp(logprob)``."""
    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", probe_traces="true", diffusion_mc_samples=2)
    requests = [Instance("loglikelihood", {}, ("The bear is", " red and big"), idx=0, metadata=("t", 0, 1))]
    (answer,) = lm.loglikelihood(requests)
    probe = probe_of(answer)
    trace = probe.trace
    context, continuation = lm._encode_pair(*requests[0].args)
    n = len(continuation)
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([context + continuation]), output_hidden_states=True)
    logprobs = torch.log_softmax(out.logits[0, -n:].double(), dim=-1).gather(-1, torch.tensor(continuation)[:, None])[:, 0]
    assert trace["logprob"] == pytest.approx(logprobs.tolist(), rel=1e-3)
    assert trace["tokens"] == [lm.tok_decode([t]) for t in continuation]
    assert probe.mean_token_logprob == pytest.approx(answer[0] / n)  # the record keeps the estimate
    for row, layer in enumerate(trace["lens_layers"]):
        probs = torch.softmax(lm.model.cls(out.hidden_states[layer][0, -n:]).double(), dim=-1)
        assert trace["lens"]["emitted_prob"][row] == pytest.approx(
            probs.gather(-1, torch.tensor(continuation)[:, None])[:, 0].tolist(), rel=2e-3, abs=1e-7)
        assert trace["lens"]["top_token"][row] == probs.argmax(-1).tolist()
    assert trace["lens"]["emitted_prob"][-1] == pytest.approx([math.exp(v) for v in trace["logprob"]], rel=2e-3)


def count_forwards(lm):
    calls = []
    handle = lm.model.register_forward_hook(lambda *_: calls.append(1))
    return calls, handle


def test_traces_read_no_extra_forward_and_change_nothing_else(masked_lm_dir):
    """The same forwards with traces on and off (a model's forward counted by a hook), and the same records but the
    trace."""
    kwargs = dict(pretrained=masked_lm_dir("bert"), device="cpu", batch_size=2, diffusion_mc_samples=2, **MODEL_ARGS)
    off, on = DiffusionProbeHFLM(**kwargs), DiffusionProbeHFLM(**kwargs, probe_traces="true")
    requests = [Instance("loglikelihood", {}, ("The bear is", option), idx=i, metadata=("t", 0, 1))
                for i, option in enumerate((" red", " big"))]
    results = {}
    for name, lm in (("off", off), ("on", on)):
        calls, handle = count_forwards(lm)
        try:
            texts = generate(lm, ["<never>"])
            generated = len(calls)
            answers = lm.loglikelihood(requests)
        finally:
            handle.remove()
        results[name] = (texts, answers, generated, len(calls) - generated)
    (texts_off, answers_off, gen_off, ll_off), (texts_on, answers_on, gen_on, ll_on) = results["off"], results["on"]
    assert (gen_on, ll_on) == (gen_off, ll_off) and gen_off > 0 and ll_off > 0
    for a, b in [*zip(texts_off, texts_on, strict=True), *zip(answers_off, answers_on, strict=True)]:
        left, right = probe_of(a).to_dict(), probe_of(b).to_dict()
        assert "trace" not in left and "trace" in right
        right.pop("trace")
        assert left.keys() == right.keys()
        for key in left:
            np.testing.assert_array_equal(np.asarray(left[key], dtype=object), np.asarray(right[key], dtype=object),
                                          err_msg=key)
    assert [str(t) for t in texts_off] == [str(t) for t in texts_on] and \
        [a[0] for a in answers_off] == [a[0] for a in answers_on]


def test_probes_none_writes_no_trace(masked_lm_dir):
    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", probes="none", probe_traces="true",
                            **MODEL_ARGS)
    assert lm.lens_readout is None
    assert all(text.probe.trace is None for text in generate(lm, ["<never>"]))


def test_use_cache_keeps_traced_and_untraced_runs_apart_and_replays_the_traces(masked_lm_dir, manager, tmp_path):
    """``--use_cache``: a traced run reads and writes a table of its own (a run without traces cached first does not
    answer it), and replaying it gives back every trace."""
    cache = str(tmp_path / "cache")
    tasks = ["probes_synth_arith_gen", "probes_synth_logic"]

    def run(traces: bool) -> dict:
        lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", batch_size=4, diffusion_gen_length=4,
                                diffusion_steps=4, diffusion_mc_samples=2, diffusion_mc_batch_size=2,
                                probe_traces=str(traces).lower())
        return lm_eval.evaluator.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=3,
                                                 use_cache=cache, bootstrap_iters=0, log_samples=True)

    plain, traced, replayed = run(False), run(True), run(True)
    for task in tasks:
        assert all("trace" not in line for line in plain["samples"][task])
        assert all(line["trace"]["lens"] for line in traced["samples"][task])
        assert [line["trace"] for line in replayed["samples"][task]] == [line["trace"] for line in traced["samples"][task]]
        assert plain["results"][task] == {k: v for k, v in traced["results"][task].items() if "trace" not in k}


def test_an_empty_generation_is_traced_at_the_position_that_chose_to_stop(masked_lm_dir):
    """A stop string at the text's first character: the kept text is empty and its record (probed at the canvas
    start) carries a one-token trace whose last-layer ``emitted_prob`` is that token's reveal-time probability."""
    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", batch_size=2, probe_traces="true",
                            **MODEL_ARGS)
    first = next(t for t in generate(lm, ["<never>"]) if str(t))
    empty = next(t for t in generate(lm, [str(first)[0]]) if not str(t))
    trace = empty.probe.trace
    assert empty.probe.empty and empty.probe.n_tokens == 1 and len(trace["tokens"]) == 1
    assert all(len(row) == 1 for row in trace["lens"]["emitted_prob"])
    assert trace["lens"]["emitted_prob"][-1] == pytest.approx([math.exp(empty.probe.token_logprobs[0])], rel=2e-3)


def test_a_bfloat16_models_last_layer_is_its_reveal_time_probability(masked_lm_dir):
    """In bfloat16 the lens reads ``hidden_states[L]`` through the model's own head in the model's dtype: L's
    ``emitted_prob`` is still the reveal-time probability within the trace's tolerance."""
    lm = DiffusionProbeHFLM(pretrained=masked_lm_dir("bert"), device="cpu", dtype="bfloat16", batch_size=2,
                            probe_traces="true", **MODEL_ARGS)
    for text in generate(lm, ["<never>"]):
        emitted = text.probe.trace["lens"]["emitted_prob"][-1]
        assert emitted == pytest.approx([math.exp(v) for v in text.probe.token_logprobs], rel=2e-3)
