"""``probes=margin``: the first attention layer's margins captured in the harness's own passes equal a hand
computation from the layer's weights (rotary, grouped KV heads, biases), at any batch size and padding."""

from __future__ import annotations

import math

import pytest
import torch

from lm_eval_probes.capture.readouts import UnsupportedModelError
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.capture.margins import FirstLayerMargins, summarize_margins
from lm_eval_probes.models.autoregressive import ProbeHFLM
from test_capture import LL_REQUESTS, PROMPTS, _free_generation, _prompt_ids, gen_instances, ll_instances

MARGIN_ARCHS = ("llama", "qwen2", "gemma3_text")  # qwen2: query/key biases; gemma3_text: query/key RMS norms


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_tables(config, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the default rotary embedding, from the paper's formula θ_i = base^(−2i/p) (the first layer's
    base, where the family has one per layer type)."""
    p = head_dim(config)
    rope = config.rope_parameters
    base = rope["rope_theta"] if "rope_theta" in rope else rope[config.layer_types[0]]["rope_theta"]
    inv_freq = 1.0 / base ** (torch.arange(0, p, 2, dtype=torch.float64) / p)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None]
    return torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)


def rotate(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = v.shape[-1] // 2
    return v * cos + torch.cat([-v[half:], v[:half]]) * sin


@torch.no_grad()
def first_layer_inputs(model, ids: list[int]) -> torch.Tensor:
    layer = model.model.layers[0]
    return layer.input_layernorm(model.model.embed_tokens(torch.tensor(ids))).double()


_REFERENCES: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}


def reference_margins(model, ids: list[int]) -> torch.Tensor:
    """:func:`hand_margins`, computed once per (saved model, sequence)."""
    key = (model.config._name_or_path, tuple(ids))
    if key not in _REFERENCES:
        _REFERENCES[key] = hand_margins(model, ids)
    return _REFERENCES[key]


def hand_margins(model, ids: list[int]) -> torch.Tensor:
    """m_t = mean_h log|det(∂e_t/∂x_t)|, the Jacobian by autograd of the residual written from the paper with
    the head's rotated query and keys; x = the first layer's normalised inputs; nan at t = 0."""
    config = model.config
    attn = model.model.layers[0].self_attn
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    p = head_dim(config)
    scale = getattr(config, "query_pre_attn_scalar", p) ** -0.5  # Gemma-3 scales by its own constant

    def norm(v: torch.Tensor, module) -> torch.Tensor:
        """Gemma-3's per-head RMS norm, (1 + w) ⊙ v / rms(v); the identity for families without one."""
        if module is None:
            return v
        return (1.0 + module.weight.double()) * v / torch.sqrt(v.pow(2).mean() + module.eps)

    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    x = first_layer_inputs(model, ids)
    cos, sin = rope_tables(config, len(ids))
    wq, wk = attn.q_proj.weight.double(), attn.k_proj.weight.double()
    bq = attn.q_proj.bias.double() if attn.q_proj.bias is not None else torch.zeros(wq.shape[0], dtype=torch.float64)
    bk = attn.k_proj.bias.double() if attn.k_proj.bias is not None else torch.zeros(wk.shape[0], dtype=torch.float64)
    out = torch.full((len(ids),), math.nan, dtype=torch.float64)
    for t in range(1, len(ids)):
        per_head = []
        for h in range(heads):
            g = h // (heads // kv_heads)
            q_rows, k_rows = slice(h * p, (h + 1) * p), slice(g * p, (g + 1) * p)
            keys = [rotate(norm(wk[k_rows] @ x[s] + bk[k_rows], k_norm), cos[s], sin[s]) for s in range(t)]

            def residual(xt, t=t, q_rows=q_rows, keys=keys):
                query = rotate(norm(wq[q_rows] @ xt + bq[q_rows], q_norm), cos[t], sin[t])
                alpha = torch.softmax(torch.stack([query @ k for k in keys]) * scale, 0)
                return xt - (alpha[:, None] * x[:t]).sum(0)

            jac = torch.autograd.functional.jacobian(residual, x[t])
            per_head.append(torch.linalg.slogdet(jac).logabsdet)
        out[t] = torch.stack(per_head).mean()
    return out


@pytest.mark.parametrize("arch", MARGIN_ARCHS)
def test_reader_equals_the_hand_computation(tiny_model_dir, arch):
    lm = ProbeHFLM(pretrained=tiny_model_dir(arch), device="cpu", batch_size=1, probes="margin")
    reader = FirstLayerMargins(lm.model)
    ids = _prompt_ids(lm, PROMPTS[2])
    with reader.capture() as inputs, torch.no_grad():
        lm.model(torch.tensor([ids]))
    margins, got_ids = reader.of_segment(inputs.latest())
    assert got_ids[0].tolist() == ids
    # the model's rotary tables are float32, the reference's float64: agreement to ~1e-6 relative
    torch.testing.assert_close(margins[0], reference_margins(lm.model, ids), rtol=2e-5, atol=1e-6, equal_nan=True)


def expected_summary(lm: ProbeHFLM, ids: list[int]):
    return summarize_margins(reference_margins(lm.model, ids), torch.tensor(ids), lm.probe_config.options_of("margin").support)


def assert_same_margins(probe, want, lm: ProbeHFLM) -> None:
    assert probe.get("margin_mean") == pytest.approx(want.mean, rel=2e-5, abs=1e-6)
    assert probe.get("margin_min") == pytest.approx(want.minimum, rel=2e-5, abs=1e-6)
    assert probe.get("margin_support_positions") == want.positions
    assert probe.get("margin_support_values") == pytest.approx(want.values, rel=2e-5, abs=1e-6)
    assert probe.get("margin_support_tokens") == tuple(lm.tok_decode([i]) for i in want.token_ids)


@pytest.mark.parametrize("arch", MARGIN_ARCHS)
@pytest.mark.parametrize("batch_size", [1, 3])
def test_loglikelihood_margins_equal_the_hand_computation_at_any_batch_size(tiny_model_dir, arch, batch_size):
    lm = ProbeHFLM(pretrained=tiny_model_dir(arch), device="cpu", batch_size=batch_size, probes="margin",
                   probe_margin_support=3)
    answers = lm.loglikelihood(ll_instances())
    for (context, continuation), answer in zip(LL_REQUESTS, answers, strict=True):
        context_ids, continuation_ids = lm._encode_pair(context, continuation)
        seen = (context_ids + continuation_ids)[:-1]  # the inputs: the last token is only predicted
        assert_same_margins(answer.probe, expected_summary(lm, seen), lm)
        assert len(answer.probe.get("margin_support_positions")) == min(3, len(seen) - 1)


@pytest.mark.parametrize("mode", ["generate", "teacher_forced"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_generation_margins_cover_the_prompt_and_the_kept_tokens_at_any_padding(tiny_model_dir, mode, batch_size):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=batch_size, probes="margin",
                   probe_gen_capture=mode)
    free = [lm.tok_decode(_free_generation(lm, p, 8)) for p in PROMPTS]
    until = [free[0][len(free[0]) // 2 :][:2]]  # cut one row early
    texts = lm.generate_until(gen_instances(until, max_gen_toks=8))
    for prompt, text in zip(PROMPTS, texts, strict=True):
        n = text.probe.n_tokens
        seen = _prompt_ids(lm, prompt) + _free_generation(lm, prompt, 8)[: max(n, 1) - 1]
        # the KV-cached decoding sees the same first-layer inputs as one full pass: no looser tolerance needed
        assert_same_margins(text.probe, expected_summary(lm, seen), lm)


def test_margins_and_rows_only_with_probes_margin(tiny_model_dir):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2)
    assert lm.first_layer is None
    answer = lm.loglikelihood(ll_instances()[:1])[0]
    assert answer.probe.get("margin_mean") is None and answer.probe.get("margin_support_positions") is None


def test_heads_min_reduction(tiny_model_dir):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=1, probes="margin")
    mean_reader, min_reader = FirstLayerMargins(lm.model), FirstLayerMargins(lm.model, heads="min")
    ids = _prompt_ids(lm, PROMPTS[0])
    with mean_reader.capture() as inputs, torch.no_grad():
        lm.model(torch.tensor([ids]))
    mean, _ = mean_reader.of_segment(inputs.latest())
    minimum, _ = min_reader.of_segment(inputs.latest())
    assert torch.all(minimum[0, 1:] <= mean[0, 1:] + 1e-12) and torch.isnan(minimum[0, 0])


def test_unsupported_first_layers_fail_clearly(tiny_model_dir):
    with pytest.raises(UnsupportedModelError, match="probes=margin"):
        ProbeHFLM(pretrained=tiny_model_dir("gpt2"), device="cpu", batch_size=1, probes="margin")


def test_query_key_norms_of_another_form_fail_clearly():
    import transformers

    config = transformers.Qwen3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    with pytest.raises(UnsupportedModelError, match="qwen3"):
        FirstLayerMargins(transformers.Qwen3ForCausalLM(config))


def test_margin_options_are_validated():
    assert ProbeConfig.from_model_args({"probes": "margin", "probe_margin_support": "7"}).options_of("margin").support == 7
    assert ProbeConfig.from_model_args({"probe_margin_heads": "MIN"}).options_of("margin").heads == "min"
    with pytest.raises(ValueError, match="probe_margin_support"):
        ProbeConfig.from_model_args({"probe_margin_support": "-1"})
    with pytest.raises(ValueError, match="probe_margin_heads"):
        ProbeConfig.from_model_args({"probe_margin_heads": "max"})
