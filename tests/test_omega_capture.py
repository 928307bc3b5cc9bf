"""Ω captured in the harness's own passes equals an independent focal-depth recomputation.

The reference runs the model's own forward on the unpadded sequence with the input of its block L − m + 1 (of its
final norm for m = 0) replaced by the source layer's states: the model's own forward computes the masks, positions,
rotary embeddings, router choices, linear-attention and SSM states, final norm, unembedding and logit transform, for
any family. The decoder under test instead re-runs the blocks with the kwargs its hooks recorded from a (padded)
batch.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lm_eval_probes.capture.parts import architecture_of, blocks_of
from lm_eval_probes.capture.readouts import FocalDepthDecoder, LensReadout, check_lens
from lm_eval_probes.config import DEFAULT_PROBES, ProbeConfig
from lm_eval_probes.declarations import PROBE_NAMES
from lm_eval_probes.models.autoregressive import ProbeHFLM
from test_capture import LL_REQUESTS, PROMPTS, _free_generation, _prompt_ids, gen_instances, ll_instances
from test_real_shapes import peak_allocated

FOCAL_ARCHS = ("llama", "qwen2", "gemma3_text")
SEQUENCES = [
    [5, 17, 40, 8, 99, 120, 3, 64, 77, 12, 200, 31, 9, 150, 45, 66, 71, 18, 250, 33, 7, 81],  # longer than gemma's window 16
    [21, 22, 23, 24, 25, 26, 27],
    [300, 12, 7, 150, 88, 19, 42, 6, 91, 130, 2, 17],
]
RESPONSE = 4  # the last positions of each sequence are its "response"


def reference_top_k_mass(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Float64 softmax, then the k largest by a full sort."""
    probs = torch.softmax(logits.double(), -1)
    return probs.sort(-1, descending=True).values[..., :k].sum(-1)


def _replacing_input(module: nn.Module, state: torch.Tensor) -> torch.utils.hooks.RemovableHandle:
    """A pre-hook that gives ``module`` ``state`` as its hidden-state argument (its first positional one, else the
    keyword ``hidden_states``)."""
    def replace(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return ((state, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": state})

    return module.register_forward_pre_hook(replace, with_kwargs=True)


@torch.no_grad()
def focal_reference(model: nn.Module, token_ids: list[int], depth: int, k: int, start: int, stop: int) -> torch.Tensor:
    """``[L+1, stop − start]`` top-k masses of D_m(H_i), i = 0..L, on one unpadded sequence: per source layer one
    forward of the model itself, the input of its block L − m + 1 (of its final norm, m = 0) replaced by H_i (layer L:
    the final norm's input, the last block's pre-norm output). The final norm is called once per forward. Where the
    model merges several residual streams before its final norm (DeepSeek-V4's ``hc_head``), the merge's input stands
    for the final norm's; where it has no final norm (GPT-1), the head's; where its forward's own code merges them
    (Gemma-3n), the last block's output stands for it (replaced, m = 0)."""
    spec = architecture_of(model)
    blocks = blocks_of(model, spec)
    readout = LensReadout(model)
    check_lens(model, readout)
    in_forward = readout.lens_input is None and readout.merge is not None  # the streams merged by the forward's code
    norm = blocks[-1] if in_forward else readout.lens_input or model.get_output_embeddings()  # no norm: the head's input
    ids = torch.tensor([token_ids])
    norm_input: list[torch.Tensor] = []
    block_inputs: list[torch.Tensor] = []  # where the model puts positions of its own before the sequence's (CPM-Ant)
    handles = [norm.register_forward_hook(lambda _m, _args, output: norm_input.append(output)) if in_forward else
               norm.register_forward_pre_hook(lambda _m, args: norm_input.append(args[0]))]
    handles += [block.register_forward_pre_hook(lambda _m, args: block_inputs.append(args[0])) for block in blocks]
    try:
        out = model(ids, output_hidden_states=True, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    entry = [*blocks, norm][len(blocks) - depth]
    rows = []  # a source layer's states over the whole sequence: the blocks' own positions too, where the model has them
    for state in [*(block_inputs if readout.prepended else out.hidden_states[:-1]), norm_input[-1]]:
        handle = (norm.register_forward_hook(lambda _m, _args, _output, state=state: state) if in_forward and not depth
                  else _replacing_input(entry, state))
        try:
            logits = model(ids, use_cache=False).logits[0, start:stop]
        finally:
            handle.remove()
        rows.append(reference_top_k_mass(logits, k))
    return torch.stack(rows)


def padded_batch(pad_id: int, *, left: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[int, int, int]]]:
    """SEQUENCES padded to one length: ids, attention mask, position ids and each row's response span."""
    length = max(map(len, SEQUENCES))
    ids = torch.full((len(SEQUENCES), length), pad_id)
    mask = torch.zeros_like(ids)
    spans = []
    for row, seq in enumerate(SEQUENCES):
        lo = length - len(seq) if left else 0
        ids[row, lo : lo + len(seq)] = torch.tensor(seq)
        mask[row, lo : lo + len(seq)] = 1
        spans.append((row, lo + len(seq) - RESPONSE, lo + len(seq)))
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), spans


def _load(tiny_model_dir, arch: str) -> nn.Module:
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(tiny_model_dir(arch))
    return model.eval()


@pytest.mark.parametrize("arch", FOCAL_ARCHS)
@pytest.mark.parametrize("padding", ["left", "right"])
def test_focal_depth_equals_the_models_own_forward_from_that_block(tiny_model_dir, arch, padding):
    model = _load(tiny_model_dir, arch)
    readout = LensReadout(model)
    num_layers = readout.num_layers
    ids, mask, positions, spans = padded_batch(model.config.pad_token_id, left=padding == "left")
    for depth in (0, 1, 2, num_layers):
        for k in (1, 3):
            decoder = FocalDepthDecoder(model, readout, depth=depth, source_layers=(0, num_layers + 1), top_k=k,
                                        chunk_tokens=50)
            with decoder.capture() as inputs, torch.no_grad():
                if padding == "left":  # as generation's teacher-forced forward: a mask and generate's positions
                    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True,
                                use_cache=False)
                else:  # as HFLM's loglikelihood forward: right padding, no mask, a KV cache built
                    out = model(ids, output_hidden_states=True)
            got = decoder.confidences(out.hidden_states, inputs, spans)
            for (row, start, stop), masses in zip(spans, got):
                want = focal_reference(model, SEQUENCES[row], depth, k, len(SEQUENCES[row]) - RESPONSE,
                                       len(SEQUENCES[row]))
                assert masses.shape == (num_layers + 1, RESPONSE)
                torch.testing.assert_close(masses.double(), want, rtol=2e-5, atol=2e-6, msg=f"{arch} m={depth} K={k}")
                # self-check: at source layer L − m the decoding is the model's own output distribution
                own = reference_top_k_mass(out.logits[row, start:stop], k)
                torch.testing.assert_close(masses[num_layers - depth].double(), own, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("arch", [*FOCAL_ARCHS, "gpt2"])
def test_depth_zero_is_exactly_the_lens_readout(tiny_model_dir, arch):
    from lm_eval_probes.probes import top_k_mass

    model = _load(tiny_model_dir, arch)
    readout = LensReadout(model)
    num_layers = readout.num_layers
    ids, _, _, spans = padded_batch(model.config.pad_token_id, left=False)
    decoder = FocalDepthDecoder(model, readout, depth=0, source_layers=(0, num_layers + 1), top_k=2)
    with decoder.capture() as inputs, torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
    got = decoder.confidences(states, inputs, spans)
    for (row, start, stop), masses in zip(spans, got):
        want = torch.stack([top_k_mass(readout.logits(states[i][row, start:stop], normalized=i == num_layers), 2)
                            for i in range(num_layers + 1)])
        torch.testing.assert_close(masses, want.cpu(), rtol=1e-5, atol=1e-7)  # another grouping of rows: float32 rounding


def test_the_main_pass_cache_is_untouched_and_chunks_do_not_matter(tiny_model_dir):
    model = _load(tiny_model_dir, "llama")
    readout = LensReadout(model)
    ids, _, _, spans = padded_batch(model.config.pad_token_id, left=False)
    results = []
    for chunk_tokens in (1, 30, 10_000):  # one sequence per chunk … everything at once
        decoder = FocalDepthDecoder(model, readout, depth=2, source_layers=(1, 4), chunk_tokens=chunk_tokens)
        with decoder.capture() as inputs, torch.no_grad():
            out = model(ids, output_hidden_states=True, use_cache=True)
        keys_before = [layer.keys.clone() for layer in out.cache.layers]
        results.append(decoder.confidences(out.hidden_states, inputs, spans))
        assert out.cache.get_seq_length() == ids.shape[1]
        for layer, before in zip(out.cache.layers, keys_before):
            assert torch.equal(layer.keys, before)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert a.shape == (3, RESPONSE)  # source layers 1, 2, 3
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def _mixed_gemma(tiny_model_dir) -> nn.Module:
    """The tiny Gemma-3 with four blocks of both attention types (sliding, sliding, full, sliding; window 16)."""
    import transformers as tf

    config = tf.AutoConfig.from_pretrained(tiny_model_dir("gemma3_text"))
    config.num_hidden_layers = 4
    config.layer_types = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("arch", [*FOCAL_ARCHS, "gemma3_mixed"])
@pytest.mark.parametrize("chunk_tokens", [1, 50])  # one sequence per chunk; two (T = 22)
def test_sources_decoded_during_the_forward_are_released_and_change_nothing(tiny_model_dir, arch, chunk_tokens):
    """With the positions said beforehand (read_at), full chunks are decoded inside the forward and their states let
    go: the same values, bit for bit, as decoding after the forward; the forward's own hidden_states untouched. A
    chunk waits until a block of every attention type the re-run blocks use has run (the mixed Gemma-3: block 2)."""
    model = _mixed_gemma(tiny_model_dir) if arch == "gemma3_mixed" else _load(tiny_model_dir, arch)
    readout = LensReadout(model)
    num_layers = readout.num_layers
    depth = num_layers - 1  # the first block is never re-run: decoding during the forward applies
    ids, mask, positions, spans = padded_batch(model.config.pad_token_id, left=True)
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "use_cache": False}
    with torch.no_grad():
        plain = model(**batch, output_hidden_states=True)
    got = {}
    for said in (False, True):
        decoder = FocalDepthDecoder(model, readout, depth=depth, source_layers=(0, num_layers + 1),
                                    chunk_tokens=chunk_tokens)
        held = []
        with decoder.capture() as inputs, torch.no_grad():
            watch = [block.register_forward_pre_hook(lambda *_: held.append(len(inputs.sources)))
                     for block in decoder.all_blocks]
            if said:
                decoder.read_at(inputs, {row: (start, stop) for row, start, stop in spans})
            out = model(**batch, output_hidden_states=True)
            for handle in watch:
                handle.remove()
        assert len(out.hidden_states) == num_layers + 1
        for mine, theirs in zip(out.hidden_states, plain.hidden_states):
            assert torch.equal(mine, theirs)
        per_chunk = max(1, chunk_tokens // ids.shape[1])
        if said:
            assert inputs.decoded_during_forward > 0
            waiting = 2 if arch == "gemma3_mixed" else 0  # sources 0..2 wait for the full-attention block's arguments
            assert max(held) <= -(-per_chunk // len(SEQUENCES)) + 1 + waiting
            assert max(held) > waiting or arch != "gemma3_mixed"
        else:
            assert inputs.decoded_during_forward == 0 and held[-1] == num_layers  # every source layer held
        got[said] = decoder.confidences(out.hidden_states, inputs, spans)
        assert not inputs.sources and not inputs.masses  # nothing held past the answer
    for (row, start, stop), before, during in zip(spans, got[False], got[True]):
        assert torch.equal(before, during)
        want = focal_reference(model, SEQUENCES[row], depth, 1, len(SEQUENCES[row]) - RESPONSE, len(SEQUENCES[row]))
        torch.testing.assert_close(during.double(), want, rtol=2e-5, atol=2e-6)


def test_a_forward_whose_rows_no_one_asks_about_holds_no_source_layer(tiny_model_dir):
    """HFLM's batch-size search runs forwards of rows that are no request's (read_at with no rows): Ω keeps nothing."""
    model = _load(tiny_model_dir, "llama")
    readout = LensReadout(model)
    decoder = FocalDepthDecoder(model, readout, depth=2, source_layers=(0, readout.num_layers + 1))
    ids, _, _, _ = padded_batch(model.config.pad_token_id, left=False)
    with decoder.capture() as inputs, torch.no_grad():
        decoder.read_at(inputs, {})
        model(ids)
    assert not inputs.sources and not inputs.pending and inputs.decoded_during_forward == 0
    assert decoder.confidences([None] * (readout.num_layers + 1), inputs, []) == []


def test_a_long_request_holds_a_chunk_of_source_layers_not_all_of_them():
    """hf-probes on a 16-block model, one request of 1024 tokens, one sequence per re-run: Ω decodes each source layer
    as the forward makes it and keeps about one at a time: its extra peak over probes=none stays within its declared
    memory, which holding all 17 (decoding after the forward, as before) exceeds. The values are the same."""
    import transformers as tf

    from conftest import build_tokenizer
    from lm_eval.api.instance import Instance

    from lm_eval_probes.capture.memory import capture_memory, declared, model_shapes

    tokenizer = build_tokenizer()
    config = tf.LlamaConfig(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=128, num_hidden_layers=16,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(config).eval()
    context = " ".join(["Anne is kind. If someone is kind then they are smart."] * 54)
    request = [Instance("loglikelihood", {}, (context, " Anne is smart."), 0, ("t", 0, 1))]
    lm = ProbeHFLM(pretrained=model, tokenizer=tokenizer, device="cpu", batch_size=1, probes="omega",
                   probe_omega_chunk_tokens=1024, max_length=1100)
    length = len(lm.tok_encode(context + " Anne is smart.")) - 1
    assert 900 < length <= 1100
    streamed, streamed_peak = peak_allocated(lambda: lm.loglikelihood(request))
    lm.held["focal_depth"].decodes_during_forward = False  # decoded after the forward, as before: every source layer held
    held, held_peak = peak_allocated(lambda: lm.loglikelihood(request))
    none = ProbeHFLM(pretrained=model, tokenizer=tokenizer, device="cpu", batch_size=1, probes="none", max_length=1100)
    plain, plain_peak = peak_allocated(lambda: none.loglikelihood(request))
    assert streamed[0].probe.get("omega") == held[0].probe.get("omega")
    assert streamed[0][0] == pytest.approx(plain[0][0], rel=1e-6)  # the logits of the continuation only: float32 rounding
    layer = length * 512 * 4  # one source layer's states, float32
    shapes = model_shapes(model, batch=1, tokens=length, vocab=len(tokenizer), chunk_positions=64)
    model_bytes = capture_memory(lm.probe_config, shapes) + declared(lm.probe_config, shapes)["omega"]
    extra = {"streamed": streamed_peak - plain_peak, "held": held_peak - plain_peak}
    assert extra["streamed"] <= model_bytes < extra["held"], ({k: v / layer for k, v in extra.items()}, model_bytes / layer)
    assert extra["held"] - extra["streamed"] > 10 * layer  # about 2.5 layers against 14


def test_a_block_given_other_arguments_than_its_type_fails_loudly(tiny_model_dir):
    """The re-run blocks borrow the arguments of an earlier block of their attention type during the forward; were
    the types wrong (here: Gemma-3's sliding and full blocks taken for one type), the check after the forward says so."""
    model = _mixed_gemma(tiny_model_dir)
    readout = LensReadout(model)
    num_layers = readout.num_layers
    assert len(set(model.config.layer_types[1:])) == 2  # the re-run blocks are of both types
    ids, mask, positions, spans = padded_batch(model.config.pad_token_id, left=True)
    decoder = FocalDepthDecoder(model, readout, depth=num_layers - 1, source_layers=(0, num_layers + 1), chunk_tokens=1)
    decoder.block_types = [None] * num_layers
    decoder.rerun_types = frozenset({None})
    with decoder.capture() as inputs, torch.no_grad():
        decoder.read_at(inputs, {row: (start, stop) for row, start, stop in spans})
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    assert inputs.decoded_during_forward > 0
    with pytest.raises(RuntimeError, match=r"with the arguments of an earlier block of its attention type"):
        decoder.confidences([None] * (num_layers + 1), inputs, spans)
    del out


def test_the_blocks_rerun_under_the_main_pass_autocast(tiny_model_dir):
    """HFLM's mixed precision runs the forward under autocast: the self-check (source layer L − m decodes
    to the model's own output) holds only if the blocks re-run under the same autocast."""
    model = _load(tiny_model_dir, "llama")
    readout = LensReadout(model)
    ids, _, _, spans = padded_batch(model.config.pad_token_id, left=False)
    decoder = FocalDepthDecoder(model, readout, depth=2, source_layers=(0, 4))
    with decoder.capture() as inputs, torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, output_hidden_states=True)
    assert inputs.autocast_dtype == torch.bfloat16
    got = decoder.confidences(out.hidden_states, inputs, spans)
    for (row, start, stop), masses in zip(spans, got):  # the lens (fp32 unembedding) of the model's final state
        own = reference_top_k_mass(readout.logits(out.hidden_states[-1][row, start:stop], normalized=True), 1)
        torch.testing.assert_close(masses[1].double(), own, rtol=1e-5, atol=1e-6)


def _gpt_neox() -> nn.Module:
    import transformers as tf

    config = tf.GPTNeoXConfig(vocab_size=360, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=4, max_position_embeddings=512, initializer_range=0.25,
                              pad_token_id=1, eos_token_id=0, bos_token_id=0)
    torch.manual_seed(3)
    return tf.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox"])
def test_positional_argument_blocks_rerun_to_the_models_own_output(tiny_model_dir, arch):
    """GPT-2's blocks get their cache and mask positionally, GPT-NeoX's a ``layer_past``: re-run with the arguments
    the model's forward gave them, the last m blocks take source layer L − m to the model's own prediction (its top-1
    mass from its own logits), on a left-padded batch with a mask."""
    model = _gpt_neox() if arch == "gpt_neox" else _load(tiny_model_dir, arch)
    readout = LensReadout(model)
    num_layers = readout.num_layers
    ids, mask, positions, spans = padded_batch(model.config.pad_token_id, left=True)
    for depth in (1, num_layers):
        decoder = FocalDepthDecoder(model, readout, depth=depth, source_layers=(0, num_layers + 1), chunk_tokens=40)
        with decoder.capture() as inputs, torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True,
                        use_cache=False)
        got = decoder.confidences(out.hidden_states, inputs, spans)
        for (row, start, stop), masses in zip(spans, got, strict=True):
            own = reference_top_k_mass(out.logits[row, start:stop], 1)
            torch.testing.assert_close(masses[num_layers - depth].double(), own, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- through hf-probes


def _reference_omega(lm: ProbeHFLM, token_ids: list[int], start: int, stop: int) -> tuple[float, ...]:
    config = lm.probe_config
    omega = config.options_of("omega")
    depth = omega.resolved_depth(lm.readout.num_layers)
    masses = focal_reference(lm.model, token_ids, depth, omega.topk, start, stop)
    lo, hi = omega.resolved_layers(lm.readout.num_layers)
    return tuple(float(v) for v in masses[lo:hi].mean(-1))


def assert_omega_matches_the_reference(lm: ProbeHFLM, answers: list, *, rel: float = 2e-5, abs: float = 2e-6) -> None:
    """Each answer of ``lm.loglikelihood(ll_instances())``: its Ω trajectory (every source layer) and Ω equal
    :func:`focal_reference`'s on its request alone, unpadded, within float32 rounding (``rel``, ``abs``)."""
    for (context, continuation), answer in zip(LL_REQUESTS, answers, strict=True):
        ctx_ids, cont_ids = lm._encode_pair(context, continuation)
        want = _reference_omega(lm, ctx_ids + cont_ids, len(ctx_ids) - 1, len(ctx_ids) + len(cont_ids) - 1)
        assert len(answer.probe.get("omega_trajectory")) == lm.readout.num_layers + 1
        assert answer.probe.get("omega_trajectory") == pytest.approx(want, rel=rel, abs=abs)
        assert answer.probe.get("omega") == pytest.approx(sum(1 - c for c in want), rel=rel, abs=abs)


@pytest.mark.parametrize("arch", FOCAL_ARCHS)
def test_loglikelihood_omega_matches_the_reference_at_any_batch_size(tiny_model_dir, arch):
    per_batch = {}
    for batch_size, chunk in ((1, 16384), (3, 16384), (4, 7)):
        lm = ProbeHFLM(pretrained=tiny_model_dir(arch), device="cpu", batch_size=batch_size, probes="omega",
                       probe_omega_depth=2, probe_omega_chunk_tokens=chunk)
        per_batch[(batch_size, chunk)] = answers = lm.loglikelihood(ll_instances())
        if batch_size != 3:
            continue
        assert_omega_matches_the_reference(lm, answers)
        for answer in answers:  # only omega was asked for
            assert answer.probe.get("bte_energy") is None and answer.probe.get("tcb_log10_mean") is None
    reference = per_batch[(3, 16384)]
    for answers in per_batch.values():
        for got, want in zip(answers, reference):
            assert got.probe.get("omega") == pytest.approx(want.probe.get("omega"), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("mode", ["teacher_forced", "generate"])
@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_generation_omega_matches_the_reference_in_a_left_padded_batch(tiny_model_dir, arch, mode):
    lm = ProbeHFLM(pretrained=tiny_model_dir(arch), device="cpu", batch_size=3, probes="omega+bte",
                   probe_gen_capture=mode, probe_omega_layers="1:3", probe_omega_topk=2)
    texts = lm.generate_until(gen_instances(until=["\n"], max_gen_toks=6))
    single = ProbeHFLM(pretrained=tiny_model_dir(arch), device="cpu", batch_size=1, probes="omega",
                       probe_gen_capture=mode, probe_omega_layers="1:3", probe_omega_topk=2)
    alone = single.generate_until(gen_instances(until=["\n"], max_gen_toks=6))
    for prompt, text, unbatched in zip(PROMPTS, texts, alone):
        n = text.probe.n_tokens
        prompt_ids = _prompt_ids(lm, prompt)
        kept = _free_generation(lm, prompt, 6)[: max(n, 1)]
        want = _reference_omega(lm, prompt_ids + kept, len(prompt_ids) - 1, len(prompt_ids) - 1 + max(n, 1))
        assert len(want) == 2 and text.probe.get("omega_trajectory") == pytest.approx(want, rel=2e-5, abs=2e-6)
        assert text.probe.get("omega") == pytest.approx(unbatched.probe.get("omega"), rel=1e-5, abs=1e-6)
        assert math.isfinite(text.probe.get("bte_energy"))


# ----------------------------------------------------------------------------- options


def test_default_probes_leave_omega_out_and_all_includes_it():
    assert ProbeConfig().probes == DEFAULT_PROBES == ("tcb", "bte", "reader")
    assert "omega" in PROBE_NAMES and ProbeConfig.from_model_args({"probes": "all"}).probes == PROBE_NAMES
    focal = ProbeConfig(probes=("omega",)).options_of("omega")
    assert focal.chunk_tokens is None  # auto: 512 MiB of the re-run blocks' activations, at most 16384 tokens
    from lm_eval_probes.api import FocalDepth

    assert FocalDepth(5, (0, 33)).tokens_per_chunk(4096, 14336, 2) == 2**29 // ((4 * 4096 + 3 * 14336) * 2) == 4519
    assert FocalDepth(5, (0, 33)).tokens_per_chunk(64, 256, 4) == 16384
    assert FocalDepth(5, (0, 33), chunk_tokens=7).tokens_per_chunk(4096, 14336, 2) == 7
    config = ProbeConfig.from_model_args({"probes": "omega", "probe_omega_depth": "3", "probe_omega_topk": "5",
                                          "probe_omega_layers": "2:7", "probe_omega_chunk_tokens": 512})
    omega = config.options_of("omega")
    assert (omega.depth, omega.topk, omega.layers, omega.chunk_tokens) == (3, 5, (2, 7), 512)
    assert omega.resolved_depth(32) == 3 and omega.resolved_layers(32) == (2, 7)
    default = ProbeConfig(probes=("omega",)).options_of("omega")
    assert default.resolved_depth(32) == 5 and default.resolved_depth(3) == 3
    assert default.resolved_layers(32) == (0, 33)
    assert ProbeConfig.from_model_args({"probe_omega_layers": "all", "probe_omega_depth": "auto"}).options_of("omega").layers is None


@pytest.mark.parametrize(("key", "value", "message"), [
    ("probe_omega_depth", "-1", r"probe_omega_depth must be an integer 0 <= m <= L"),
    ("probe_omega_depth", "2.5", r"probe_omega_depth must be an integer"),
    ("probe_omega_topk", "0", r"probe_omega_topk must be an integer K >= 1, got 0"),
    ("probe_omega_layers", "5:2", r"0 <= start < stop <= L \+ 1"),
    ("probe_omega_layers", "3", r"probe_omega_layers must look like '12:20'"),
    ("probe_omega_chunk_tokens", "0", r"probe_omega_chunk_tokens must be >= 1"),
    ("probe_omega_dept", "3", r"Did you mean 'probe_omega_depth'"),
])
def test_bad_options_fail_before_the_model_loads(key, value, message):
    with pytest.raises(ValueError, match=message):
        ProbeHFLM(pretrained="/nonexistent/never-loaded", probes="omega", **{key: value})


def test_options_beyond_the_model_fail_naming_the_valid_range(tiny_model_dir):
    folder = tiny_model_dir("llama")  # 3 blocks
    with pytest.raises(ValueError, match=r"probe_omega_depth=4 is outside 0\.\.3"):
        ProbeHFLM(pretrained=folder, device="cpu", probes="omega", probe_omega_depth=4)
    with pytest.raises(ValueError, match=r"0 <= start < stop <= 4"):
        ProbeHFLM(pretrained=folder, device="cpu", probes="omega", probe_omega_layers="1:5")
    with pytest.raises(ValueError, match=r"1 <= K <= \d+"):
        ProbeHFLM(pretrained=folder, device="cpu", probes="omega", probe_omega_topk=100_000)


# ----------------------------------------------------------------------------- rows and records


def test_per_document_values_and_record_of_omega():
    import json

    from lm_eval_probes.records import ResponseProbe
    from lm_eval_probes.tasks.probe_task import probe_metric_values

    probe = ResponseProbe(n_tokens=3, mean_token_logprob=-1.0, prompt_tokens=7, omega=2.5,
                          omega_trajectory=(0.1, 0.4, 1.0))
    values = probe_metric_values(probe, 0.5, 4.0, declared=True)
    assert values["omega"] == 2.5
    assert values["omega_spearman"] == (2.5, 4.0)
    assert values["omega_spearman_partial"] == (2.5, 4.0, 3)
    assert values["omega_spearman_partial_prompt"] == (2.5, 4.0, 7)
    assert not any(key.startswith("omega") for key in probe_metric_values(
        ResponseProbe(n_tokens=3, mean_token_logprob=-1.0), 0.5, 4.0, declared=True))
    undefined = ResponseProbe(n_tokens=0, mean_token_logprob=math.nan, omega=math.nan, omega_trajectory=(math.nan,))
    assert "omega" not in probe_metric_values(undefined, math.nan, 4.0, declared=True)
    record = json.loads(json.dumps(probe.to_dict()))
    assert record["omega_trajectory"] == [0.1, 0.4, 1.0]
    assert ResponseProbe.from_dict(record) == probe
