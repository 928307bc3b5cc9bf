"""The last families, each built tiny from its own config class here — not by ``benchmarks/architectures.py``'s builder —
and run with ``probes=all``: DeepSeek-V4 and HY-V4 (four residual streams merged by the model's ``hc_head`` before
its final norm: the lens reads each block's streams through that merge), BLOOM (Ω re-runs its blocks on one row of a
batch: the ALiBi bias ``[B · heads, 1, T]`` cut at its batch axis), XGLM, MiniCPM3 (its ``logits_scaling`` derived from
its widths, a divider) and HyperCLOVA X (its μP ``logits_scaling`` multiplies the logits, where Granite's divides) and Gemma-3n (four AltUp streams kept
before the batch, ``[streams, B, T, d]``, merged by its forward's own code before its final norm: the lens reads them
through the same merge on the model's own projections; its ``hidden_states[L]`` the last block's streams, read out
through the merge and the final norm), ModernBERT-decoder (a prediction head — dense, activation, norm — between
its final norm and its unembedding: the module the unembedding's input comes from, read through) and CPM-Ant (its final
norm ``output_layernorm``, by no conventional name: the module whose output its head reads; 32 prompt positions of its
own before the sequence's, dropped before its head). Every document's δ_TCB and BTE agree with their
independent recomputation from the model's own forward (``benchmarks/architectures.py``'s ``check_documents``), and
every document's Ω trajectory with the model's own blocks (``test_omega_capture.focal_reference``)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
_spec = importlib.util.spec_from_file_location("lm_eval_probes_bench_architectures", BENCHMARKS / "architectures.py")
architectures = sys.modules.get(_spec.name) or importlib.util.module_from_spec(_spec)
if _spec.name not in sys.modules:
    sys.modules[_spec.name] = architectures
    _spec.loader.exec_module(architectures)

_MOE = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1}
CONFIGS: dict[str, dict] = {
    "deepseek_v4": {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 1,
                    "head_dim": 32, "q_lora_rank": 32, "o_lora_rank": 32, "o_groups": 2, "index_n_heads": 2,
                    "index_head_dim": 16, "index_topk": 8, "sliding_window": 8, "qk_rope_head_dim": 8,
                    "num_nextn_predict_layers": 0, **_MOE},
    "hy_v4": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 4, "head_dim": 16, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
              "qk_rope_head_dim": 8, "v_head_dim": 16, "index_topk": 2048, "index_head_dim": 16, "index_n_heads": 2,
              **_MOE},
    "bloom": {"hidden_size": 64, "n_layer": 3, "n_head": 4},
    "xglm": {"d_model": 64, "ffn_dim": 128, "num_layers": 3, "attention_heads": 4, "max_position_embeddings": 512},
    "minicpm3": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
                 "num_key_value_heads": 4, "head_dim": 8, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_nope_head_dim": 8,
                 "qk_rope_head_dim": 8, "v_head_dim": 16},
    "hyperclovax": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "logits_scaling": 0.25, "embedding_multiplier": 2.0,
                    "residual_multiplier": 0.5},
    "gemma3n_text": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 8, "hidden_size_per_layer_input": 8,
                     "vocab_size_per_layer_input": 360, "laurel_rank": 8, "num_kv_shared_layers": 1,
                     "layer_types": ["full_attention", "sliding_attention", "full_attention"],
                     "activation_sparsity_pattern": [0.95, 0.0, 0.0]},
    "modernbert-decoder": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
                           "num_attention_heads": 4, "local_attention": 16,
                           "layer_types": ["full_attention", "sliding_attention", "full_attention"]},
}
"""Each family's small config, written here from its config class's fields (3 layers, width 64, 4 experts). HY-V4's
indexer keeps its default top-2048 keys: with fewer than a sequence's length it picks them among the padded batch's
positions too, and the model's own output depends on its batch. Gemma-3n: its four AltUp streams, its first layer's
sparse activations, a sliding layer, and its last layer reading the keys and values of the first (full-attention)
layer; its first layer (the one the margins read) attends to its whole prefix: on a sliding first layer the margins
beyond the window differ from the eager reference, as Gemma-3's do (a matter of the margins' capture, not of the
streams)."""

ROWS = ("tcb_log10", "bte_energy", "omega", "confidence", "ece", "margin")

NAN_MARGINS: dict[str, str] = {}
"""The families whose margin rows are nan (undefined), and why."""


def _read_sequences(samples, tokenizer):
    """Each sample with the ids the margins read: its chosen option's context and continuation, the last token left
    out (it is only predicted), as ``check_documents``."""
    for sample in samples:
        logliks = [float(resp[0][0] if isinstance(resp[0], (list, tuple)) else resp[0]) for resp in sample["resps"]]
        context, continuation = sample["arguments"][max(range(len(logliks)), key=logliks.__getitem__)]
        context, continuation = architectures._moved_space(context, continuation)
        yield sample, tokenizer(context + continuation, add_special_tokens=False)["input_ids"][:-1]


def compressed_reads_own(model):
    """For DeepSeek-V4's first layer, ``reads_own`` of :func:`test_margin_capture.eager_margins`: its compressed key w
    is a gated sum over the block of positions [w·r, (w + 1)·r) (r the layer's compression rate), seen from position
    (w + 1)·r − 1 on; there, the last of the t + 1 positions' row's compressed keys reads x_t (``None`` for other
    families)."""
    config = model.config
    if config.model_type != "deepseek_v4" or config.layer_types[0] == "sliding_attention":
        return None
    rate = config.compress_rates[config.layer_types[0]]
    return lambda t: [t + (t + 1) // rate] if (t + 1) % rate == 0 else []


def build_independently(model_type: str, folder: Path) -> str:
    """A tiny random ``model_type`` from :data:`CONFIGS`, saved with the tests' tokenizer."""
    import transformers
    from tiny_models import build_tokenizer

    tokenizer = build_tokenizer()
    config = transformers.AutoConfig.for_model(model_type, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=tokenizer.eos_token_id,
                                               eos_token_id=tokenizer.eos_token_id, **CONFIGS[model_type])
    return _saved(config, tokenizer, folder)


def _saved(config, tokenizer, folder: Path) -> str:
    """A tiny random model of ``config`` (seed 0, under 3 M parameters) saved into ``folder`` with ``tokenizer``."""
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    assert sum(p.numel() for p in model.parameters()) < 3_000_000
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def assert_margins_equal_the_eager_reference(folder: str, samples) -> None:
    """Each document's support tokens' margins equal an autograd Jacobian through the first attention layer's own
    eager weights (``test_margin_capture.eager_margins``), on the option the task read, as ``check_documents``."""
    import transformers
    from test_margin_capture import own_eager_margins

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,  # a mask built for eager
                                                              attn_implementation="eager").eval()  # (ModernBERT's)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    for sample, seen in _read_sequences(samples, tokenizer):
        support = sample["margin_support"]
        assert len(support["positions"]) == 5
        want = own_eager_margins(model, seen, support["positions"], compressed_reads_own(model))[support["positions"]]
        assert support["margins"] == pytest.approx(want.tolist(), rel=1e-4, abs=1e-6)
        assert sample["margin_min"] == pytest.approx(float(want.min()), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_probes_all_gives_every_row_checked_against_the_model_itself(model_type, tmp_path):
    folder = build_independently(model_type, tmp_path)
    result, samples = architectures.run(folder, 2)
    rows = architectures.headline_rows(result)
    assert not result["config"].get("probes_skipped"), result["config"]["probes_skipped"]
    assert all(math.isfinite(rows[name]) for name in ROWS if name != "margin"), rows
    assert math.isfinite(rows["margin"]) != (model_type in NAN_MARGINS), rows
    assert architectures.check_documents(folder, samples) <= architectures.CHECK_TOLERANCE
    if model_type not in NAN_MARGINS:
        assert_margins_equal_the_eager_reference(folder, samples)


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_omega_of_each_request_equals_the_models_own_blocks(model_type, tmp_path):
    """As ``test_architectures.test_omega_per_document_equals_the_models_own_blocks``, on the independently built
    models (the head scaled 50-fold so that the top-1 masses spread), at focal depth 2 (decoded during the forward)."""
    import transformers
    from test_capture import ll_instances
    from test_omega_capture import assert_omega_matches_the_reference

    from lm_eval_probes.models.autoregressive import ProbeHFLM

    folder = build_independently(model_type, tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(50.0)
    lm = ProbeHFLM(pretrained=model, tokenizer=folder, device="cpu", batch_size=3, probes="omega", probe_omega_depth=2)
    assert lm.held["focal_depth"] is not None and len(lm.held["focal_depth"].blocks) == 2
    assert_omega_matches_the_reference(lm, lm.loglikelihood(ll_instances()))


@pytest.mark.parametrize("model_type", ["deepseek_v4", "hy_v4"])
def test_the_lens_reads_several_residual_streams_through_the_models_own_merge(model_type, tmp_path):
    """The merge found at load is the model's ``hc_head`` (the module the final norm's input comes from), and the lens
    of a middle block's streams equals the model's own forward with that block's streams in place of the last one's."""
    import transformers

    from lm_eval_probes.capture.readouts import LensReadout, check_lens

    model = transformers.AutoModelForCausalLM.from_pretrained(build_independently(model_type, tmp_path)).eval()
    readout = LensReadout(model)
    assert check_lens(model, readout) < 1e-4
    assert readout.merge is model.model.hc_head and readout.stream_shape == (4, 64)
    ids = torch.arange(3, 15).unsqueeze(0)
    with torch.no_grad():
        middle = model(ids, output_hidden_states=True, use_cache=False).hidden_states[1]
        handle = model.model.hc_head.register_forward_pre_hook(lambda _module, _args: (middle,))
        try:
            want = torch.log_softmax(model(ids, use_cache=False).logits[0].float(), -1)
        finally:
            handle.remove()
        got = readout.logprobs(middle[0], normalized=False)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("model_type", ["bloom", "xglm"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_margins_of_layers_that_compute_their_attention_themselves_in_both_modes(model_type, batch_size, tmp_path):
    """BLOOM and XGLM compute their attention themselves (no attention-interface call): the margins of each
    loglikelihood request and of each generation (``generate``'s calls joined: BLOOM's ALiBi bias spans every key so
    far, the last call's covers them all) equal those of the sequence the model saw, captured alone."""
    import transformers
    from test_capture import LL_REQUESTS, PROMPTS, _free_generation, _prompt_ids, gen_instances, ll_instances
    from test_margin_capture import captured_margins

    from lm_eval_probes.models.autoregressive import ProbeHFLM
    from lm_eval_probes.probes.margin.probe import MarginSummary

    folder = build_independently(model_type, tmp_path)
    lm = ProbeHFLM(pretrained=transformers.AutoModelForCausalLM.from_pretrained(folder).eval(), tokenizer=folder,
                   device="cpu", batch_size=batch_size, probes="margin", probe_gen_capture="generate")

    def assert_alone(probe, seen):
        want = MarginSummary.of(captured_margins(lm.model, seen)[0][0], torch.tensor(seen), 5)
        assert probe.get("margin_mean") == pytest.approx(want.mean, rel=1e-6, abs=1e-9)
        assert probe.get("margin_min") == pytest.approx(want.minimum, rel=1e-6, abs=1e-9)
        assert probe.get("margin_support_positions") == want.positions

    for (context, continuation), answer in zip(LL_REQUESTS, lm.loglikelihood(ll_instances()), strict=True):
        context_ids, continuation_ids = lm._encode_pair(context, continuation)
        assert math.isfinite(answer.probe.get("margin_mean"))
        assert_alone(answer.probe, (context_ids + continuation_ids)[:-1])
    if model_type == "xglm" and batch_size > 1:
        return  # XGLM counts positions from the padded batch's first column: a left-padded row is another sequence
    for prompt, text in zip(PROMPTS, lm.generate_until(gen_instances([], max_gen_toks=6)), strict=True):
        seen = _prompt_ids(lm, prompt) + _free_generation(lm, prompt, 6)[: max(text.probe.n_tokens, 1) - 1]
        assert_alone(text.probe, seen)


def test_deepseek_v4_compressed_keys_are_entries_without_an_input_of_their_own(tmp_path, monkeypatch):
    """DeepSeek-V4's first layer (heavily compressed attention by default) attends to its sliding window and, from the
    end of a compression block on, to compressed keys, each a gated sum over a block of positions: they take part in
    the softmax with their logits q_t·k_c and add no x to the prior (as attention sinks), and where a compressed key
    reads x_t itself (t the last position of its block) it is left out at t as x_t's own key is. The margins equal an
    autograd Jacobian through the layer's own eager weights with the same definition at every position, over five
    compression blocks of 8 (its ``compress_rates``), and about the first block's end at its default rate (128)."""
    import transformers
    from test_margin_capture import captured_margins, eager_margins

    folder = build_independently("deepseek_v4", tmp_path)
    config = transformers.AutoConfig.from_pretrained(folder)
    config.compress_rates = {**config.compress_rates, "heavily_compressed_attention": 8}
    torch.manual_seed(0)
    small = transformers.AutoModelForCausalLM.from_config(config).eval()
    assert small.config.layer_types[0] == "heavily_compressed_attention"
    ids = [3 + (7 * i) % 300 for i in range(42)]
    margins, _ = captured_margins(small, ids)
    assert torch.isfinite(margins[0, 1:]).all()
    want = eager_margins(small, ids, reads_own=compressed_reads_own(small))
    torch.testing.assert_close(margins[0], want, rtol=1e-4, atol=1e-5, equal_nan=True)
    # the definition matters where a compressed key reads x_t (t = 7, 15, ...): kept, it would move with x_t
    assert not torch.allclose(eager_margins(small, ids, at=[7, 15])[[7, 15]], want[[7, 15]], rtol=1e-3)
    from lm_eval_probes.capture import attention

    monkeypatch.setattr(attention, "PRODUCT_POSITIONS", 16)  # re-run 16 positions at a time: the keys are the row's
    torch.testing.assert_close(captured_margins(small, ids)[0], margins, rtol=1e-10, atol=1e-12, equal_nan=True)
    monkeypatch.undo()

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert model.config.compress_rates["heavily_compressed_attention"] == 128
    long = [3 + i % 300 for i in range(140)]
    margins, _ = captured_margins(model, long)
    assert torch.isfinite(margins[0, 1:]).all()
    at = [1, 126, 127, 128, 139]
    want = eager_margins(model, long, at=at, reads_own=compressed_reads_own(model))
    torch.testing.assert_close(margins[0, at], want[at], rtol=1e-4, atol=1e-5)


def test_the_lens_reads_gemma3n_streams_through_the_merge_of_its_forward(tmp_path, monkeypatch):
    """Gemma-3n merges its AltUp streams in its forward's own code: the lens runs the same merge on the model's own
    ``altup_unembed_projections``, and a middle block's streams read by it equal the model's own forward with the last
    block's output replaced by them; the probes read the states batch first, and ``[L]`` as the final norm's output.
    A merge that is not the model's (the streams' plain mean) is refused at load."""
    import transformers

    from lm_eval_probes.capture import parts
    from lm_eval_probes.capture.readouts import LensReadout, UnsupportedModelError, check_lens
    from lm_eval_probes.stack_api import hidden_states_of

    model = transformers.AutoModelForCausalLM.from_pretrained(build_independently("gemma3n_text", tmp_path)).eval()
    readout = LensReadout(model)
    assert check_lens(model, readout) < 1e-4
    assert readout.merge.func is parts.altup_merge and readout.lens_input is None
    assert readout.streams_first and readout.stream_shape == (4, 64) and readout.last_state_is_block_output
    ids = torch.arange(3, 15).unsqueeze(0)
    norm_outputs = []
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, use_cache=False)
        middle = out.hidden_states[1]
        assert middle.shape == (4, 1, 12, 64)
        handle = model.model.layers[-1].register_forward_hook(lambda _module, _args, _output: middle)
        try:
            want = torch.log_softmax(model(ids, use_cache=False).logits[0].float(), -1)
        finally:
            handle.remove()
        got = readout.logprobs(middle.movedim(0, 2)[0], normalized=False)
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
        handle = model.model.norm.register_forward_hook(lambda _module, _args, output: norm_outputs.append(output))
        try:
            states = hidden_states_of(model, True, model(ids, output_hidden_states=True, use_cache=False).hidden_states)
        finally:
            handle.remove()
    assert [tuple(state.shape) for state in states] == [(1, 12, 4, 64)] * 3 + [(1, 12, 64)]
    assert torch.equal(states[1], middle.movedim(0, 2))
    torch.testing.assert_close(states[-1], norm_outputs[-1], rtol=1e-6, atol=1e-6)

    monkeypatch.setitem(parts.STREAM_MERGES, "gemma3n_text", lambda _model, streams: streams.mean(-2))
    with pytest.raises(UnsupportedModelError, match="gemma3n_text.*differs from the model's own log-probabilities"):
        check_lens(model, LensReadout(model))


def test_gemma3n_omega_through_every_block_reads_the_keys_its_rerun_stored(tmp_path):
    """Ω at focal depth L on Gemma-3n re-runs every block: its last block reads the keys and values that the re-run of
    its first block stored (a new store per re-run, which every re-run block shares as the forward's blocks share
    theirs), not the forward's — as the model's own forward from a source layer's states does (the reference)."""
    import transformers
    from test_capture import ll_instances
    from test_omega_capture import assert_omega_matches_the_reference

    from lm_eval_probes.models.autoregressive import ProbeHFLM

    folder = build_independently("gemma3n_text", tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert model.config.kv_sharing_modes == ["store", "store", "reuse"]
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(50.0)
    lm = ProbeHFLM(pretrained=model, tokenizer=folder, device="cpu", batch_size=3, probes="omega", probe_omega_depth=3)
    assert len(lm.held["focal_depth"].blocks) == 3
    assert_omega_matches_the_reference(lm, lm.loglikelihood(ll_instances()))


CPMANT = {"hidden_size": 64, "num_attention_heads": 4, "dim_head": 16, "dim_ff": 128, "num_hidden_layers": 3,
          "prompt_types": 4, "prompt_length": 4, "segment_types": 4, "position_bias_num_buckets": 32,
          "position_bias_max_distance": 128, "init_std": 0.1}
"""CPM-Ant's small config (its default initialisation, standard deviation 1, saturates every softmax of a tiny model)."""


def _cpmant(folder: Path) -> str:
    import transformers
    from tiny_models import build_tokenizer

    tokenizer = build_tokenizer()
    return _saved(transformers.AutoConfig.for_model("cpmant", vocab_size=len(tokenizer), **CPMANT), tokenizer, folder)


def test_cpmant_final_norm_is_the_module_its_head_reads(tmp_path):
    """CPM-Ant keeps its final norm as ``encoder.output_layernorm`` (no conventional name): the module between its last
    block and its head is found at load and read through, its 4 prompt positions before the sequence's left out; its
    own forward reads a right-padded row otherwise than that row alone (it builds its attention mask from the ids, not
    from the mask it is given), so the run takes one document per batch, and attends both ways over its input (every
    position is "context"), so the references read the input the harness gave it. δ_TCB and BTE agree with their
    independent recomputation, Ω with the model's own blocks, each document's support tokens' margins with
    :func:`bidirectional_eager_margins`."""
    import transformers
    from test_capture import LL_REQUESTS, ll_instances
    from test_omega_capture import focal_reference

    from lm_eval_probes.capture.readouts import LensReadout, check_lens
    from lm_eval_probes.models.autoregressive import ProbeHFLM

    folder = _cpmant(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    readout = LensReadout(model)
    assert not readout.has_final_norm  # by the conventional names
    assert check_lens(model, readout) < 1e-4
    assert readout.final_norm is model.cpmant.encoder.output_layernorm and readout.prepended == 4

    result, samples = architectures.run(folder, 2, batch_size=1)
    rows = architectures.headline_rows(result)
    assert not result["config"].get("probes_skipped"), result["config"]["probes_skipped"]
    assert all(math.isfinite(rows[name]) for name in ROWS), rows
    assert architectures.check_documents(folder, samples) <= 1e-5
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    for sample, seen in _read_sequences(samples, tokenizer):
        support = sample["margin_support"]
        want = bidirectional_eager_margins(model, seen, support["positions"])[support["positions"]]
        assert support["margins"] == pytest.approx(want.tolist(), rel=1e-4, abs=1e-6)

    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(50.0)
    lm = ProbeHFLM(pretrained=model, tokenizer=folder, device="cpu", batch_size=1, probes="omega", probe_omega_depth=2)
    for (context, continuation), answer in zip(LL_REQUESTS, lm.loglikelihood(ll_instances()), strict=True):
        context_ids, continuation_ids = lm._encode_pair(context, continuation)
        seen = (context_ids + continuation_ids)[:-1]  # its forward attends both ways: the reference on what it saw
        want = focal_reference(model, seen, 2, 1, len(context_ids) - 1, len(seen)).mean(-1)
        assert answer.probe.get("omega_trajectory") == pytest.approx(want.tolist(), rel=2e-5, abs=2e-6)


def bidirectional_eager_margins(model, ids: list[int], at=None) -> torch.Tensor:
    """The margins of CPM-Ant's first attention module (``CpmAntAttention``) at the input's positions, copied to
    float64: it attends both ways over its N = P + T positions (P prompt positions of its own first), so per head
    e_t(x_t) = x_t − Σ_{s≠t} α_ts x_s with α_ts = P_ts / Σ_{r≠t} P_tr (= P_ts / (1 − P_tt), without its rounding where
    P_tt rounds to 1), P the module's own attention probabilities at row t (x_t substituted in its queries' and keys'
    input, the other rows fixed), m_t = mean_h log|det ∂e_t/∂x_t| by autograd; ``[T]``, the last T of the N
    positions (``at``: at these of the T only, nan elsewhere)."""
    import copy

    module = next(sub for sub in model.modules() if type(sub).__name__ == "CpmAntAttention")
    seen = {}
    handle = module.register_forward_pre_hook(lambda _module, args: seen.update(args=args))
    with torch.no_grad():
        model(torch.tensor([ids]), use_cache=False)
    handle.remove()
    eager = copy.deepcopy(module).double()
    hidden, _, mask, bias = seen["args"][:4]
    x, bias = hidden[0].double(), bias.double()
    prepended = x.shape[0] - len(ids)
    out = torch.full((len(ids),), math.nan, dtype=torch.float64)
    for t in (range(prepended, x.shape[0]) if at is None else [prepended + i for i in at]):
        others = torch.cat([x[:t], x[t + 1:]])

        def residual(xt, t=t, others=others):
            rows = torch.cat([x[:t], xt[None], x[t + 1:]])[None]
            weights = eager(rows, rows, mask, bias, True)[1][0][:, t]  # [H, N]: the module's own probabilities
            alpha = torch.cat([weights[:, :t], weights[:, t + 1:]], 1)
            alpha = alpha / alpha.sum(-1, keepdim=True)
            return xt[None] - alpha @ others

        jacobian = torch.autograd.functional.jacobian(residual, x[t])  # [H, d, d]
        out[t - prepended] = torch.linalg.slogdet(jacobian).logabsdet.mean()
    return out


def test_cpmant_margins_attend_both_ways_over_its_prompt_and_input(tmp_path):
    """CPM-Ant's first attention runs over its 4 prompt positions and the input's, every position attending every
    other (its mask, read at load): the margins' prior at t is over every attended s ≠ t, the prompt positions' inputs
    among them, reported at the input's positions; they equal an autograd Jacobian through its own attention module
    with the same definition at every position. Its generations (a cache holds its prompt positions) have none."""
    import transformers
    from test_margin_capture import captured_margins

    from lm_eval_probes.capture.attention import FirstAttentionCapture

    model = transformers.AutoModelForCausalLM.from_pretrained(_cpmant(tmp_path)).eval()
    capture = FirstAttentionCapture(model)
    assert not capture._causal and type(capture.module).__name__ == "CpmAntAttention"
    ids = [3 + (7 * i) % 300 for i in range(13)]
    margins, got_ids = captured_margins(model, ids)
    assert margins.shape == (1, 13) and got_ids[0].tolist() == ids and torch.isfinite(margins).all()
    torch.testing.assert_close(margins[0], bidirectional_eager_margins(model, ids), rtol=1e-4, atol=1e-5)

    from test_capture import gen_instances

    from lm_eval_probes.models.autoregressive import ProbeHFLM

    lm = ProbeHFLM(pretrained=model, tokenizer=str(tmp_path), device="cpu", batch_size=1, probes="margin")
    assert all(math.isnan(text.probe.get("margin_mean")) for text in lm.generate_until(gen_instances([], max_gen_toks=3)))


def test_modernbert_decoder_lens_reads_through_its_prediction_head(tmp_path):
    """The module between ModernBERT-decoder's final norm and its unembedding (``lm_head``: dense, activation, norm) is
    found at load: the lens of the final norm's input equals the model's own log-probabilities only through it, and
    ``hidden_states[L]`` reaches the probes as the unembedding's input."""
    import transformers

    from lm_eval_probes.capture.readouts import LensReadout, check_lens
    from lm_eval_probes.stack_api import hidden_states_of

    model = transformers.AutoModelForCausalLM.from_pretrained(build_independently("modernbert-decoder", tmp_path)).eval()
    readout = LensReadout(model)
    assert check_lens(model, readout) < 1e-4
    assert readout.head_transform is model.lm_head and model.get_output_embeddings() is model.decoder
    ids = torch.arange(3, 15).unsqueeze(0)
    heads = []
    handle = model.decoder.register_forward_pre_hook(lambda _module, args: heads.append(args[0]))
    try:
        with torch.no_grad():
            out = model(ids, output_hidden_states=True, use_cache=False)
    finally:
        handle.remove()
    torch.testing.assert_close(hidden_states_of(model, True, out.hidden_states)[-1], heads[-1], rtol=0, atol=0)
    readout.head_transform = None  # without it the lens is not the model's
    with torch.no_grad():
        got = readout.logprobs(out.hidden_states[-1][0], normalized=True)
    assert not torch.allclose(got, torch.log_softmax(out.logits[0], -1), atol=1e-2)


HRM = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "head_dim": 16, "num_layers_per_stack": 2,
       "H_cycles": 2, "L_cycles": 2, "L_bp_cycles": [1], "num_hidden_layers": 12, "embedding_scale": 8.0}
"""HRM's small config: two stacks of 2 blocks, the low-level one run twice per high-level cycle, two cycles (12 passes;
``num_hidden_layers`` counts them)."""


def test_hrm_two_looped_stacks_give_one_state_per_pass_of_a_block(tmp_path):
    """HRM runs a low-level and a high-level stack of blocks in loops, each stack ending in a norm of its own: the
    blocks are both stacks' (the second a further stack beside the first), one lens reading per pass of a block, named
    by block and pass, the final norm the high-level stack's (the module whose output the head reads). δ_TCB and BTE
    agree with their independent recomputation; Ω runs, replaying the forward from its focal depth (each document's
    value against the model's own forward: ``test_omega_replay``)."""
    import transformers
    from tiny_models import build_tokenizer

    from lm_eval_probes.capture.parts import architecture_of
    from lm_eval_probes.capture.readouts import LensReadout, check_lens

    tokenizer = build_tokenizer()
    config = transformers.AutoConfig.for_model("hrm_text", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=tokenizer.eos_token_id,
                                               eos_token_id=tokenizer.eos_token_id, **HRM)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    spec = architecture_of(model)
    assert (spec.blocks, spec.stacks, spec.final_norm) == ("model.L_module.layers", ("model.H_module.layers",), "")
    readout = LensReadout(model)
    assert check_lens(model, readout) < 1e-4
    assert readout.final_norm is model.model.H_module.final_norm
    assert readout.passes == (0, 1, 0, 1, 2, 3) * 2 and readout.num_layers == 12
    assert readout.layer_names()[1:7] == ["block 0, pass 1", "block 1, pass 1", "block 0, pass 2", "block 1, pass 2",
                                          "block 2, pass 1", "block 3, pass 1"]
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    result, samples = architectures.run(str(tmp_path), 2)
    rows = architectures.headline_rows(result)
    assert not result["config"].get("probes_skipped"), result["config"]["probes_skipped"]
    assert all(math.isfinite(rows[name]) for name in ROWS), rows
    assert architectures.check_documents(str(tmp_path), samples) <= architectures.CHECK_TOLERANCE


def test_xlstm_runs_with_its_output_soft_cap_read(tmp_path):
    """xLSTM (no attention heads: the margins are skipped) soft-caps its logits by ``output_logit_soft_cap``, which the
    lens reads as a final soft-capping; keys as wide as its values (its cached forward builds its state with the values'
    width for both). δ_TCB and BTE agree with their independent recomputation."""
    import transformers
    from tiny_models import build_tokenizer

    from lm_eval_probes.capture.readouts import LensReadout, check_lens

    tokenizer = build_tokenizer()
    config = transformers.AutoConfig.for_model(
        "xlstm", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id, hidden_size=64, embedding_dim=64, num_hidden_layers=3, num_blocks=3,
        num_heads=4, qk_dim_factor=1.0, chunk_size=16, output_logit_soft_cap=2.0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    readout = LensReadout(model)
    assert readout.logit_softcap == 2.0 and check_lens(model, readout) < 1e-4
    readout.logit_softcap = None  # without it the lens is not the model's
    with pytest.raises(Exception, match="differs from the model's own log-probabilities"):
        check_lens(model, readout)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    result, samples = architectures.run(str(tmp_path), 2)
    rows = architectures.headline_rows(result)
    assert set(result["config"].get("probes_skipped") or {}) == {"margin"}
    assert all(math.isfinite(rows[name]) for name in ROWS if name != "margin"), rows
    assert architectures.check_documents(str(tmp_path), samples) <= architectures.CHECK_TOLERANCE
