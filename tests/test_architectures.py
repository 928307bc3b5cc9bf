"""``benchmarks/architectures.py`` on a dozen families: dense, MoE, multi-head latent attention, hybrid (linear
attention, SSM) and positional-argument blocks, each with ``probes=all`` on two documents; every document's δ_TCB and
BTE's middle transition agree with their independent recomputation from the model's own forward (the script's
``--check``; ``python benchmarks/architectures.py --check`` runs every decoder-only type)."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
_spec = importlib.util.spec_from_file_location("lm_eval_probes_bench_architectures", BENCHMARKS / "architectures.py")
architectures = importlib.util.module_from_spec(_spec)  # not on sys.path: benchmarks/calibration.py would shadow a package
sys.modules[_spec.name] = architectures  # its dataclasses look their module up
_spec.loader.exec_module(architectures)

FAMILIES = {
    "llama": "dense", "gemma2": "dense, soft-capped logits", "cohere": "dense, logit scale",
    "granite": "dense, logit divider", "opt": "dense, final norm one level down",
    "gpt2": "positional block arguments", "gpt_neox": "positional block arguments (layer_past)",
    "mixtral": "MoE", "qwen3_moe": "MoE", "deepseek_v3": "MLA and MoE",
    "qwen3_next": "hybrid: linear and full attention, MoE", "falcon_h1": "hybrid: SSM and attention, logit multiplier",
    "jamba": "hybrid: Mamba and attention, MoE",
    "gemma4_text": "per-layer config: full-attention layers twice as wide per head; KV shared; per-layer inputs",
}
"""The families ``make test`` runs (≥ 12), each with what it covers."""

ALWAYS_ROWS = ("tcb_log10", "bte_energy", "confidence", "ece")


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_probes_all_runs_and_matches_the_independent_computation(model_type):
    outcome = architectures.outcome_of(model_type, docs=2, check=True)
    assert outcome.status == "runs", outcome.reason
    assert outcome.checked is not None and outcome.checked <= architectures.CHECK_TOLERANCE, outcome.checked
    assert all(math.isfinite(outcome.rows[name]) for name in ALWAYS_ROWS), outcome.rows
    for probe in ("omega", "margin"):  # either its row, or a skip with its reason
        assert math.isfinite(outcome.rows[probe]) or outcome.skipped.get(probe), (probe, outcome)


OMEGA_FAMILIES = {"qwen3_moe": "MoE blocks", "qwen3_next": "linear and full attention, MoE",
                  "jamba": "Mamba and attention, MoE", "openai-gpt": "no final norm: blocks that give lists",
                  "bert-generation": "no final norm, blocks one level down"}
"""The families whose per-document Ω is checked against the model's own blocks (beside the dense ones of
``test_omega_capture.py``), each with the blocks it re-runs."""


@pytest.mark.parametrize("depth", [2, 3])  # 2: decoded during the forward; 3 = L: every block re-run, after it
@pytest.mark.parametrize("model_type", sorted(OMEGA_FAMILIES))
def test_omega_per_document_equals_the_models_own_blocks(model_type, depth, tmp_path):
    """hf-probes' Ω of each request of a right-padded batch: its trajectory (every source layer) and Ω equal the model's
    own forward on the request alone with the input of block L − m + 1 replaced by each source layer's states
    (``test_omega_capture.focal_reference``), within float32 rounding (measured: 5e-6 relative at most). The head is
    scaled 50-fold so that the top-1 masses spread over 0.6–0.9 (at the builder's 0.02 initialisation every one is
    about 1/V, and a wrong re-run moves them little): a focal depth one off moves them by 1e-2 to 1e-1."""
    import transformers
    from test_capture import ll_instances
    from test_omega_capture import assert_omega_matches_the_reference

    from lm_eval_probes.models.autoregressive import ProbeHFLM

    folder = architectures.build(model_type, tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(50.0)
    lm = ProbeHFLM(pretrained=model, tokenizer=folder, device="cpu", batch_size=3, probes="omega",
                   probe_omega_depth=depth)
    assert lm.held["focal_depth"] is not None and len(lm.held["focal_depth"].blocks) == depth
    assert_omega_matches_the_reference(lm, lm.loglikelihood(ll_instances()))


def _without_gemma3n_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    from lm_eval_probes.capture import parts

    monkeypatch.delitem(parts.STREAM_MERGES, "gemma3n_text")


def _without_modules_between(monkeypatch: pytest.MonkeyPatch) -> None:
    from lm_eval_probes.capture import readouts

    monkeypatch.setattr(readouts, "_module_between", lambda *_args: None)


REFUSED = {
    "gemma3n_text": (_without_gemma3n_merge,
                     r"the logit lens cannot read its blocks' states \(4, 1, 16, 64\): its final norm reads \(1, 16, 64\) "
                     r"\(the model first merges them, e\.g\. residual streams, by no module of its own"),
    "cpmant": (_without_modules_between,
               r"its last block's output is not what its head reads, and no module between them \(nor a final norm by "
               r"a conventional name"),
}
"""Families whose layers are not one state per block as the lens reads them, each with what it is run without and the
start of its refusal then: Gemma-3n without its merge of its four AltUp streams (its forward's own code, which
``STREAM_MERGES`` repeats on its own modules), CPM-Ant without the module between its last block and its head (its
final norm, by no conventional name). Each runs with them (``test_last_families.py``)."""


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_a_model_without_one_readable_state_per_block_is_refused_at_load_in_one_line(model_type, monkeypatch):
    """Once a raw RuntimeError of Ω's self-check: now the lens's check at load refuses the model, naming its type and
    why, before any request runs."""
    without, reason = REFUSED[model_type]
    without(monkeypatch)
    outcome = architectures.outcome_of(model_type, docs=2, check=False)
    assert outcome.status == "refused", outcome
    assert re.match(rf"UnsupportedModelError: model_type '{model_type}': {reason}", outcome.reason), outcome


def test_decoder_only_types_and_small_configs():
    """The mapping's decoder-only types include the families people run and leave out encoders and multimodal
    configs; a small config has 3 layers, one of each kind its family mixes."""
    types = architectures.decoder_only_types()
    assert {"llama", "gpt2", "qwen3_next", "deepseek_v3", "mamba"} <= set(types)
    assert not {"bert", "bart", "t5", "gemma3", "mllama"} & set(types)
    config = architectures.small_config("qwen3_next")
    assert config.num_hidden_layers == 3 and set(config.layer_types) == {"linear_attention", "full_attention"}
    assert architectures.small_config("granite").logits_scaling == architectures.TRANSFORMS["logits_scaling"]
    hybrid = architectures.small_config("granitemoehybrid")  # its pattern, not its default of linear attention only
    assert hybrid.layer_types == ["linear_attention", "full_attention", "linear_attention"]
    looped = architectures.small_config("dory")  # one input, one recurrent, one output layer
    assert (looped.n_input_layers, looped.n_recurrent_layers, looped.n_output_layers) == (1, 1, 1)
    assert "gemma4_assistant" not in types  # a drafter: its forward reads a target model's embeddings and KV states
    gemma4 = architectures.small_config("gemma4_text")  # the family's ratio of per-layer widths, at small widths
    assert gemma4.layer_types == ["sliding_attention", "full_attention", "full_attention"]
    assert [layer.head_dim for layer in gemma4.per_layer_config] == [16, 32, 32]
    xlnet = architectures.small_config("xlnet")  # no sequence length limit: its config refuses one, left unset
    assert (xlnet.d_model, xlnet.n_layer, xlnet.max_position_embeddings) == (64, 3, -1)
    xlstm = architectures.small_config("xlstm")  # keys as wide as values: its cached forward's state
    assert (xlstm.hidden_size, xlstm.qk_dim_factor, xlstm.v_dim_factor) == (64, 1.0, 1.0)


def test_model_shapes_of_a_per_layer_config_are_its_largest_layers():
    """Gemma-4's global ``head_dim`` raises (it is set per layer): the memory figure of ``batch_size=auto`` reads the
    widest layer's (its full-attention layers', twice the sliding ones')."""
    import transformers

    from lm_eval_probes.capture.memory import model_shapes

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(architectures.small_config("gemma4_text"))
    shapes = model_shapes(model, batch=1, tokens=4, vocab=360, chunk_positions=4)
    assert (shapes.heads, shapes.head_dim, shapes.width) == (4, 32, 64)


def test_a_layer_that_reads_the_mask_before_its_attention_gives_nan_generation_margins_not_a_crash(tmp_path):
    """DeepSeek-V3.2's indexer reads the attention mask before the attention call, so the calls of one ``generate``
    cannot be re-run as one: a generation's margins are nan (said once in the log), a loglikelihood request's are
    computed."""
    from test_capture import gen_instances, ll_instances

    from lm_eval_probes.models.autoregressive import ProbeHFLM

    lm = ProbeHFLM(pretrained=architectures.build("deepseek_v32", tmp_path), device="cpu", batch_size=2,
                   probes="margin")
    assert lm.held["first_attention"].reads_mask
    assert all(math.isnan(text.probe.get("margin_mean")) for text in lm.generate_until(gen_instances(["\n\n"], 4)))
    assert all(math.isfinite(answer.probe.get("margin_mean")) for answer in lm.loglikelihood(ll_instances()))


@pytest.mark.parametrize("model_type", ["gemma4_text", "qwen3_next"])
def test_generation_margins_equal_one_pass_over_the_sequence(model_type, tmp_path):
    """``generate``'s calls joined (Gemma-4 hands its first layer a dict of shared states; Qwen3-Next's first softmax
    layer follows a linear-attention one) give the margins of one forward over the prompt and the kept tokens."""
    from test_capture import PROMPTS, _free_generation, _prompt_ids, gen_instances
    from test_margin_capture import captured_margins

    from lm_eval_probes.models.autoregressive import ProbeHFLM

    lm = ProbeHFLM(pretrained=architectures.build(model_type, tmp_path), device="cpu", batch_size=3, probes="margin")
    for prompt, text in zip(PROMPTS, lm.generate_until(gen_instances(["\n\n\n\n"], 6)), strict=True):
        seen = _prompt_ids(lm, prompt) + _free_generation(lm, prompt, 6)[: max(text.probe.n_tokens, 1) - 1]
        margins, _ = captured_margins(lm.model, seen)
        assert text.probe.get("margin_mean") == pytest.approx(float(margins[0, 1:].mean()), rel=1e-5)


def test_a_looped_model_gives_one_lens_reading_per_pass_of_a_block(tmp_path):
    """Dory runs its middle block twice: its forward gives one state per pass (4 passes of 3 blocks), the lens reads
    each, the per-layer values have one entry per pass (BTE's profile: 4 transitions) named by pass in the results'
    config (``probe_layers``), and every document's δ_TCB and BTE agree with their independent recomputation. Ω runs
    too, replaying the model's forward from its focal depth (each document's value against the model's own forward:
    ``test_omega_replay``)."""
    import transformers

    from lm_eval_probes.capture.readouts import LensReadout, check_lens

    folder = architectures.build("dory", tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    readout = LensReadout(model)
    check_lens(model, readout)
    assert readout.looped and readout.passes == (0, 1, 1, 2) and readout.num_layers == 4
    assert readout.layer_names() == ["embeddings", "block 0", "block 1, pass 1", "block 1, pass 2", "block 2"]
    result, samples = architectures.run(folder, 2)
    assert result["config"]["probe_layers"] == readout.layer_names()
    assert all(len(sample["bte_profile"]) == 4 for sample in samples)
    assert not result["config"].get("probes_skipped") and math.isfinite(architectures.headline_rows(result)["omega"])
    assert architectures.check_documents(folder, samples) <= architectures.CHECK_TOLERANCE


@pytest.mark.parametrize("model_type", ["jetmoe", "zaya"])
def test_generation_margins_of_routed_and_convolved_queries(model_type, tmp_path):
    """JetMoE (queries of the attention experts its router picks) and Zaya (queries through a causal convolution over
    the positions before their own; its key scale drawn, and both models' query and key weights scaled by 8, so that
    the margins are not ~0) in ``generate`` at batch size 3 (left padding): each row's margins equal one pass over
    its prompt and kept tokens, except Zaya's left-padded rows, which are nan (the joined re-run has no mask, so their
    first queries would read the padding: here the pad token's embedding is zero, which hides it)."""
    import transformers
    from test_capture import PROMPTS, _free_generation, _prompt_ids, gen_instances
    from test_margin_capture import captured_margins

    from lm_eval_probes.models.autoregressive import ProbeHFLM

    folder = architectures.build(model_type, tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "ZayaQKNorm":
                module.temp.normal_(generator=torch.Generator().manual_seed(0))
            for name in ("q_proj", "k_proj", "kv_proj", "input_linear"):
                if isinstance(getattr(getattr(module, name, None), "weight", None), torch.Tensor):
                    getattr(module, name).weight.mul_(8)
    model.save_pretrained(folder)
    lm = ProbeHFLM(pretrained=folder, device="cpu", batch_size=3, probes="margin")
    longest = max(len(_prompt_ids(lm, prompt)) for prompt in PROMPTS)
    for prompt, text in zip(PROMPTS, lm.generate_until(gen_instances(["\n\n\n\n"], 6)), strict=True):
        if model_type == "zaya" and len(_prompt_ids(lm, prompt)) < longest:
            assert math.isnan(text.probe.get("margin_mean"))
            continue
        seen = _prompt_ids(lm, prompt) + _free_generation(lm, prompt, 6)[: max(text.probe.n_tokens, 1) - 1]
        margins, _ = captured_margins(lm.model, seen)
        assert abs(float(margins[0, 1:].mean())) > 1e-3
        assert text.probe.get("margin_mean") == pytest.approx(float(margins[0, 1:].mean()), rel=1e-5)
