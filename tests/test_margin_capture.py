"""``probes=margin``: the first softmax-attention layer's margins captured in the harness's own passes equal a hand
computation from the layer's weights (rotary, grouped KV heads, biases, sliding window), at any batch size and
padding; on other families (fused qkv, query/key norms of every form, soft-capped logits, partial or interleaved
rotary, absolute positions, MoE, MLA, hybrids) they equal an autograd Jacobian through the layer's own eager
attention weights."""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch

from lm_eval_probes.capture.attention import FirstAttentionCapture
from lm_eval_probes.capture.readouts import UnsupportedModelError
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.models.autoregressive import ProbeHFLM
from lm_eval_probes.probes.margin.probe import MarginSummary, margin_unavailable
from lm_eval_probes.registry import probe
from test_capture import LL_REQUESTS, PROMPTS, _free_generation, _prompt_ids, gen_instances, ll_instances

MARGIN_ARCHS = ("llama", "qwen2", "gemma3_text")  # qwen2: query/key biases; gemma3_text: query/key RMS norms, window 16


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
    local = getattr(config, "layer_types", None) and config.layer_types[0] == "sliding_attention"
    window = config.sliding_window if local else len(ids)  # s is attended from t when t − s < window
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
            first = max(0, t - window + 1)
            keys = [rotate(norm(wk[k_rows] @ x[s] + bk[k_rows], k_norm), cos[s], sin[s]) for s in range(first, t)]

            def residual(xt, t=t, q_rows=q_rows, keys=keys, first=first):
                query = rotate(norm(wq[q_rows] @ xt + bq[q_rows], q_norm), cos[t], sin[t])
                alpha = torch.softmax(torch.stack([query @ k for k in keys]) * scale, 0)
                return xt - (alpha[:, None] * x[first:t]).sum(0)

            jac = torch.autograd.functional.jacobian(residual, x[t])
            per_head.append(torch.linalg.slogdet(jac).logabsdet)
        out[t] = torch.stack(per_head).mean()
    return out


def margin_probe(heads: str = "mean", precision: str = "auto"):
    """The margins' position probe with options ``heads`` and ``precision``."""
    config = ProbeConfig.from_model_args({"probes": "margin", "probe_margin_heads": heads,
                                          "probe_margin_precision": precision})
    return probe("margin").position_probe(config.options_of("margin"), 1)


def captured_margins(model, ids: list[int], *, heads: str = "mean",
                     precision: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """``[1, T]`` margins and ids of one sequence through the capture and the margins' position probe."""
    capture = FirstAttentionCapture(model)
    with capture.capture() as inputs, torch.no_grad():
        model(torch.tensor([ids]), use_cache=False)
    batch = capture.batch(inputs.latest())
    return margin_probe(heads, precision).first_attention.values(batch), batch.ids


@pytest.mark.parametrize("arch", MARGIN_ARCHS)
def test_reader_equals_the_hand_computation(tiny_model_dir, arch):
    lm = ProbeHFLM(pretrained=tiny_model_dir(arch), device="cpu", batch_size=1, probes="margin")
    ids = _prompt_ids(lm, PROMPTS[2])
    margins, got_ids = captured_margins(lm.model, ids)
    assert got_ids[0].tolist() == ids
    # the model's rotary tables are float32, the reference's float64: agreement to ~1e-6 relative
    torch.testing.assert_close(margins[0], reference_margins(lm.model, ids), rtol=2e-5, atol=1e-6, equal_nan=True)


@contextlib.contextmanager
def _softmax_at_input_precision():
    """``torch.nn.functional.softmax`` in float64 where a layer's code asks for float32 on float64 logits (Gemma-3n,
    Inkling: ``softmax(z, dtype=torch.float32)``): the float64 reference keeps its precision (in float32 the two
    terms of ∂(α_ts / (1 − α_tt)) cancel only to float32's, a few 1e-4 of a margin at Gemma-3n's unit logit scale)."""
    original = torch.nn.functional.softmax

    def softmax(input, dim=None, _stacklevel=3, dtype=None):
        wide = dtype is not None and input.dtype == torch.float64
        return original(input, dim=dim, dtype=None if wide else dtype)

    torch.nn.functional.softmax = softmax
    try:
        yield
    finally:
        torch.nn.functional.softmax = original


def eager_margins(model, ids: list[int], at=None, reads_own=None) -> torch.Tensor:
    """The margins from the model's own first attention module (the first ``*Attention`` module), copied to float64
    with eager attention: per head, e_t(x_t) = x_t − Σ_{s<t} α_ts x_s with α the module's own attention
    probabilities P at row t without s = t, P_ts / (1 − P_tt) (renormalised over s < t, and an attention sink if any;
    x_t substituted in the module's input, the other rows fixed),
    m_t = mean_h log|det ∂e_t/∂x_t| by autograd; nan at t = 0 (``at``: at these positions only, nan elsewhere).
    Columns of P after the t + 1 positions' (keys without a position of their own: DeepSeek-V4's compressed keys) stay
    in the softmax with no x; ``reads_own(t)``: those among them whose key reads x_t, left out as s = t is:
    P_ts / (1 − P_tt − Σ_c P_tc)."""
    module = next(sub for sub in model.modules() if type(sub).__name__.endswith("Attention"))
    seen = {}
    handle = module.register_forward_pre_hook(lambda _m, args, kwargs: seen.setdefault("call", (args, kwargs)),
                                              with_kwargs=True)  # a looped model's first pass
    with torch.no_grad():
        model(torch.tensor([ids]), use_cache=False)
    handle.remove()
    eager = copy.deepcopy(module).double()
    if hasattr(module, "config"):  # a layer that computes its attention itself has none (BLOOM, XGLM, GPT-1, ...)
        eager.config = copy.deepcopy(module.config)
        eager.config._attn_implementation = "eager"

    def wide(value):
        if isinstance(value, torch.Tensor):
            return value.double() if value.is_floating_point() else value
        if isinstance(value, tuple):
            return tuple(wide(item) for item in value)
        if isinstance(value, dict):  # DeepSeek-V4's rotary tables per rope type
            return {key: wide(item) for key, item in value.items()}
        return None if type(value).__name__.endswith("Cache") else value

    def first(value, n):
        """``value`` cut to the first n positions on every axis of length T (the module then sees positions ≤ t only:
        causal whatever mask it was given)."""
        if isinstance(value, torch.Tensor):
            for axis, size in enumerate(value.shape):
                if size == len(ids):
                    value = value.narrow(axis, 0, n)
            return value
        if isinstance(value, dict):
            return {key: first(item, n) for key, item in value.items()}
        return tuple(first(item, n) for item in value) if isinstance(value, tuple) else value

    all_args, all_kwargs = [wide(a) for a in seen["call"][0]], {k: wide(v) for k, v in seen["call"][1].items()}
    if "output_attentions" in all_kwargs:  # GPT-1's attention returns its weights only when asked
        all_kwargs["output_attentions"] = True
    named = "hidden_states" in all_kwargs
    x = (all_kwargs["hidden_states"] if named else all_args[0])[0]
    out = torch.full((len(ids),), math.nan, dtype=torch.float64)
    for t in range(1, len(ids)) if at is None else [t for t in at if t > 0]:
        args, kwargs = [first(a, t + 1) for a in all_args], {k: first(v, t + 1) for k, v in all_kwargs.items()}

        def residual(xt, t=t, args=args, kwargs=kwargs):
            rows = torch.cat([x[:t], xt[None]])[None]
            if named:
                kwargs["hidden_states"] = rows
            else:
                args[0] = rows
            with _softmax_at_input_precision():
                weights = eager(*args, **kwargs)[1][0][:, t]  # [H, t + 1 (+ E)]: the module's own probabilities
            own = weights[:, [t, *(reads_own(t) if reads_own else ())]].sum(-1, keepdim=True)
            return xt[None] - (weights[:, :t] / (1 - own)) @ x[:t]

        try:  # every column in one batched forward-mode product where the layer's ops allow it (Inkling: 10× faster)
            jacobian = torch.autograd.functional.jacobian(residual, x[t], vectorize=True, strategy="forward-mode")
        except (RuntimeError, NotImplementedError):
            jacobian = torch.autograd.functional.jacobian(residual, x[t])  # [H, d, d]
        out[t] = torch.linalg.slogdet(jacobian).logabsdet.mean()
    return out


def _family_configs():
    import transformers as tf

    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.25)
    return {
        "qwen3": lambda: tf.Qwen3Config(**common, head_dim=8),  # per-head query/key norms
        "phi3": lambda: tf.Phi3Config(**common, pad_token_id=0),  # fused qkv
        "olmo2": lambda: tf.Olmo2Config(**common),  # full-width query/key norms
        "gemma2": lambda: tf.Gemma2Config(**common, head_dim=8, query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                                          sliding_window=6),  # query scalar, soft-capped logits, sliding window
        "gpt2": lambda: tf.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                      initializer_range=0.25),  # absolute positions, Conv1D qkv
        "gpt_neox": lambda: tf.GPTNeoXConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, rotary_pct=0.5,
                                             initializer_range=0.25),  # partial rotary, per-head interleaved qkv
        "opt": lambda: tf.OPTConfig(vocab_size=64, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                    num_attention_heads=4, word_embed_proj_dim=32, init_std=0.25),  # scaled q_proj
        "gptj": lambda: tf.GPTJConfig(vocab_size=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                      initializer_range=0.25),  # interleaved partial rotary
        "mixtral": lambda: tf.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2),  # MoE
        "qwen3_next": lambda: tf.Qwen3NextConfig(  # hybrid: a linear-attention layer first
            **common, head_dim=8, linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8,
            linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            shared_expert_intermediate_size=16, layer_types=["linear_attention", "full_attention"]),
        "deepseek_v3": lambda: tf.DeepseekV3Config(  # multi-head latent attention
            **{**common, "num_key_value_heads": 4}, q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4,
            qk_nope_head_dim=4, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            first_k_dense_replace=1, n_group=1, topk_group=1),
        "gpt_oss": lambda: tf.GptOssConfig(**common, head_dim=8, num_local_experts=4,
                                           num_experts_per_tok=2),  # attention sinks
        "stablelm": lambda: tf.StableLmConfig(**common, qk_layernorm=True, partial_rotary_factor=0.5),  # LayerNorm q/k
        "falcon_h1": lambda: tf.FalconH1Config(  # hybrid: attention beside an SSM in every layer
            **common, head_dim=8, mamba_d_ssm=16, mamba_n_heads=4, mamba_d_head=4, mamba_n_groups=1, mamba_d_state=4,
            mamba_chunk_size=4),
    }


@pytest.mark.parametrize("products", ["float64", "float32", "tensor cores"])
@pytest.mark.parametrize("family", sorted(_family_configs()))
def test_margins_of_every_family_equal_an_autograd_jacobian_of_its_eager_attention(family, products):
    """In float64 (a CPU's ``auto``), on this device's float32 products (``probe_margin_precision=float32``), and on
    a GPU's (``auto`` there: bfloat16 terms with float32 accumulation, emulated here)."""
    from contextlib import nullcontext

    from lm_eval_probes.stack_api import float32_products_emulated

    model, ids = family_model(family), list(range(3, 15))
    with float32_products_emulated() if products == "tensor cores" else nullcontext():
        margins, _ = captured_margins(model, ids, precision="auto" if products == "tensor cores" else products)
    assert torch.isnan(margins[0, 0]) and torch.isfinite(margins[0, 1:]).all()
    # the harness's forward runs in float32 (its rotary tables, positions, norms' inputs): ~1e-6 relative
    torch.testing.assert_close(margins[0], eager_margins(model, ids), rtol=1e-4, atol=1e-5, equal_nan=True)


def _own_attention_configs():
    import transformers as tf

    return {  # layers that compute their attention themselves (no attention-interface call)
        "bloom": lambda: tf.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4,
                                        initializer_range=0.25),  # ALiBi bias in baddbmm, fused qkv
        "xglm": lambda: tf.XGLMConfig(vocab_size=64, d_model=32, ffn_dim=64, num_layers=2, attention_heads=4,
                                      max_position_embeddings=64, init_std=0.25),  # queries scaled before bmm
        "gpt_neo": lambda: tf.GPTNeoConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                                           attention_types=[[["global", "local"], 1]], window_size=6,
                                           max_position_embeddings=64, initializer_range=0.25),  # no scale, where-mask
        "gpt_neox_japanese": lambda: tf.GPTNeoXJapaneseConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_multiple_size=2,
            max_position_embeddings=64, initializer_range=0.25),  # rotary, baddbmm's alpha
        "openai-gpt": lambda: tf.OpenAIGPTConfig(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                 initializer_range=0.25),  # w / √p after matmul, w·b − 1e4(1 − b)
        "trocr": lambda: tf.TrOCRConfig(vocab_size=64, d_model=32, decoder_layers=2, decoder_attention_heads=4,
                                        decoder_ffn_dim=64, max_position_embeddings=64, init_std=0.25),
    }


def own_attention_model(family: str):
    import transformers

    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(_own_attention_configs()[family]()).eval()


def own_eager_margins(model, ids: list[int], at=None, reads_own=None) -> torch.Tensor:
    """:func:`eager_margins` with float64 as the default dtype (XGLM's code fills a tensor of the default dtype with
    its logits' lowest value)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return eager_margins(model, ids, at, reads_own)
    finally:
        torch.set_default_dtype(default)


@pytest.mark.parametrize("precision", ["auto", "float32"])
@pytest.mark.parametrize("family", sorted(_own_attention_configs()))
def test_margins_where_the_layer_computes_its_attention_itself_equal_its_eager_weights(family, precision):
    """No layer calls the attention interface: the first attention is the first module that computes a softmax over
    its positions, stopped there; its queries, keys, logit scale and bias (ALiBi, masks) read from its own code equal an
    autograd Jacobian through its own attention probabilities (BLOOM and GPT-Neo take their softmax in float32: ~1e-6),
    in float64 (this CPU's ``auto``) and on float32 products (a GPU's)."""
    model, ids = own_attention_model(family), list(range(3, 15))
    margins, _ = captured_margins(model, ids, precision=precision)
    assert torch.isnan(margins[0, 0]) and torch.isfinite(margins[0, 1:]).all()
    torch.testing.assert_close(margins[0], own_eager_margins(model, ids), rtol=1e-4, atol=1e-5, equal_nan=True)


def test_the_own_attention_scale_and_bias_are_read_from_the_layers_code():
    """BLOOM: the scale is baddbmm's alpha 1/√p, the bias its ALiBi slopes times the key's position (the causal mask
    beyond); GPT-1: the division by √p after its product."""
    from lm_eval_probes.capture.attention import FirstAttentionCapture

    bloom = own_attention_model("bloom")
    capture = FirstAttentionCapture(bloom)
    assert capture.module is bloom.transformer.h[0].self_attention and capture._own.scale == pytest.approx(8**-0.5)
    ids = list(range(3, 10))
    with capture.capture() as inputs, torch.no_grad():
        bloom(torch.tensor([ids]), use_cache=False)
    row = next(capture.batch(inputs.latest()).rows())
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, len(ids)), 4, torch.float64)  # [heads, 1, T]
    causal = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    torch.testing.assert_close(row.mask.masked_select(causal), alibi.expand(4, len(ids), len(ids)).masked_select(causal),
                               rtol=0, atol=1e-12)
    assert bool((row.mask.masked_select(~causal) < -1e30).all())
    assert FirstAttentionCapture(own_attention_model("openai-gpt"))._own.scale == pytest.approx(8**-0.5)


@pytest.mark.parametrize("family", ["bloom", "gpt_neo"])
def test_own_attention_in_bfloat16_passes_the_loads_check_at_the_models_precision(family):
    """In bfloat16 (GPT-Neo upcasts its queries to float32 before its product, BLOOM its softmax) the load's checks
    take the model's precision, and the margins are those of float32 within bfloat16's rounding (measured: 0.044 at
    most on these models)."""
    model, ids = own_attention_model(family), list(range(3, 15))
    want, _ = captured_margins(model, ids)
    got, _ = captured_margins(model.to(torch.bfloat16), ids)
    torch.testing.assert_close(got, want, rtol=0, atol=0.1, equal_nan=True)


def test_a_self_computed_attention_whose_logits_are_not_affine_in_its_product_is_refused_at_load():
    """The load's self-check of a layer that computes its attention itself: logits soft-capped after the product (no
    scale and query-free bias reproduce them) are refused in one line, not read with the wrong weights."""
    model = own_attention_model("openai-gpt")
    attention = model.transformer.h[0].attn

    class Capped(type(attention)):
        def _attn(self, q, k, v, attention_mask=None, output_attentions=False):
            w = 4 * torch.tanh(torch.matmul(q, k) / 4)
            b = self.bias[:, :, : w.size(-2), : w.size(-1)]
            return [torch.matmul(torch.softmax(w * b - 1e4 * (1 - b), -1), v)]

    attention.__class__ = Capped
    with pytest.raises(UnsupportedModelError, match=r"'openai-gpt': Capped: .*not c · q·k plus a bias that reads no query"):
        FirstAttentionCapture(model)


@pytest.mark.parametrize(("family", "left"), [("bloom", True), ("bloom", False), ("xglm", False)])
def test_own_attention_margins_of_a_padded_batch_equal_each_row_alone(family, left):
    """Padded rows of one batch (BLOOM's ALiBi bias ``[B · heads, 1, T]`` cut to the row's heads; it counts positions
    from the first real token, so left padding too) give each sequence's margins alone."""
    model = own_attention_model(family)
    capture = FirstAttentionCapture(model)
    rows = [list(range(3, 15)), list(range(20, 27))]
    pad = [0] * 5
    ids = torch.tensor([rows[0], pad + rows[1] if left else rows[1] + pad])
    mask = torch.tensor([[1] * 12, [0] * 5 + [1] * 7 if left else [1] * 7 + [0] * 5])
    with capture.capture() as inputs, torch.no_grad():
        model(ids, attention_mask=mask, use_cache=False)
    batch = margin_probe().first_attention.values(capture.batch(inputs.latest()))
    for index, row in enumerate(rows):
        alone, _ = captured_margins(model, row)
        real = slice(12 - len(row), 12) if left else slice(0, len(row))
        torch.testing.assert_close(batch[index, real], alone[0], rtol=1e-6, atol=1e-8, equal_nan=True)
        assert int(torch.isnan(batch[index]).sum()) == 1 + 12 - len(row)


def _eager_built(model_type: str, attn_implementation: str = "eager", **fields):
    """The builder's small ``model_type`` (``benchmarks/architectures.py``, seed 0) with ``fields``, its attention
    ``attn_implementation`` (eager unless asked)."""
    import importlib.util
    import sys
    from pathlib import Path

    import transformers

    name = "lm_eval_probes_bench_architectures"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "benchmarks" / "architectures.py")
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    config = sys.modules[name].small_config(model_type)
    for key, value in fields.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation).eval()


def test_a_chunks_first_position_has_no_margin():
    """Llama-4's chunked attention: a chunk's first position attends only to itself (its float mask holds the lowest
    value everywhere before it), so it has no prefix and no margin, as position 0 (once a number: the masked prefix read
    as attended, all its logits equally low); every other position equals the eager reference."""
    model, ids = _eager_built("llama4_text", attention_chunk_size=8), list(range(3, 23))
    margins, _ = captured_margins(model, ids)
    want = eager_margins(model, ids)
    assert [t for t in range(len(ids)) if torch.isnan(margins[0, t])] == [0, 8, 16]
    torch.testing.assert_close(margins[0], want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_granite_swa_sinks_are_a_softmax_denominator_logit():
    """Granite-SWA applies its attention sink after the softmax, as an output scale sigmoid(logsumexp(z) − sink): the
    same weights as a sink logit in the softmax's denominator (gpt-oss's), which the margins read; its eager attention
    returns the softmax before that scale, so the eager reference differs (by a third at sinks 0: the difference once
    seen in docs/architectures.md). With the sinks at −30 (no mass) the two agree."""
    model, ids = _eager_built("granite_swa"), list(range(3, 23))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(getattr(module, "sinks", None), torch.Tensor):
                module.sinks.fill_(-30.0)
    margins, _ = captured_margins(model, ids)
    torch.testing.assert_close(margins[0], eager_margins(model, ids), rtol=1e-4, atol=1e-5, equal_nan=True)


def test_a_query_projections_bias_beside_attention_sinks_is_no_input_of_the_sinks():
    """gpt-oss's query projection has a bias and its attention sinks take weight with no input of their own (x = 0):
    the prior's Σ_s α_ts x_s then no longer sums to one, so the bias of u = W x + b does not cancel from it; the
    margins read u less its value at a zero input. With the bias and the sinks drawn, they equal the eager
    reference (they were up to 0.05 away when the bias was read as part of u)."""
    model, ids = _eager_built("gpt_oss"), list(range(3, 15))
    module = FirstAttentionCapture(model).module
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name in ("q_proj", "k_proj"):
            bias = getattr(module, name).bias
            bias.copy_(torch.randn(bias.shape, generator=generator))
        module.sinks.copy_(torch.randn(module.sinks.shape, generator=generator))
    margins, _ = captured_margins(model, ids)
    torch.testing.assert_close(margins[0], eager_margins(model, ids), rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("model_type", ["inkling_text", "inkling2_text"])
def test_a_logit_bias_and_sinks_of_each_querys_input_are_differentiated_with_its_queries(model_type, monkeypatch):
    """Inkling's attention adds a relative-position bias that each query computes from its own input
    (``position_bias``: a projection of x_t mixed into one bias per distance), and Inkling-2's also a sink logit per
    query (``sinks``, a projection of x_t): both move with x_t, so ∂z_ts/∂u_t = scale · D_tᵀ k_s + E_ts. The capture
    finds at load that they move (each with its own query's input alone), re-runs a row whole, and reads E_ts from
    the products that give D_t; the margins equal the eager reference (2e-3 away with the bias left out of α and of
    the Jacobian)."""
    from lm_eval_probes.capture import attention

    model, ids = _eager_built(model_type), list(range(3, 15))
    assert FirstAttentionCapture(model)._moving
    margins, _ = captured_margins(model, ids)
    assert torch.isnan(margins[0, 0]) and torch.isfinite(margins[0, 1:]).all()
    torch.testing.assert_close(margins[0], eager_margins(model, ids), rtol=1e-4, atol=1e-5, equal_nan=True)
    if model_type == "inkling_text":  # sdpa (Inkling-2 has none) hands no mask, causal only: the bias opens no later key
        sdpa = _eager_built(model_type, "sdpa")
        torch.testing.assert_close(captured_margins(sdpa, ids)[0], margins, rtol=1e-10, atol=1e-12, equal_nan=True)
    monkeypatch.setattr(attention, "jacobian_chunks", lambda *_args, **_kwargs: (5, 3))  # F_t contracted per chunk
    torch.testing.assert_close(captured_margins(model, ids)[0], margins, rtol=1e-10, atol=1e-12, equal_nan=True)
    float32 = captured_margins(model, ids, precision="float32")[0]  # tensor-core products, the GPU's default
    torch.testing.assert_close(float32, margins, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_routed_query_experts_are_read_through_the_layers_input():
    """JetMoE's attention is a mixture of attention experts: each token's queries come from the query projections of
    the experts its router picks (a method of the experts' module, reading the input rows it gathers), so no submodule
    maps the layer's input to its queries; the capture then takes the layer's input itself as the queries' input
    (u = x, D_t = ∂q_t/∂x_t through the router and the picked experts: the routing is constant near x_t) and
    equals the eager reference."""
    model, ids = _eager_built("jetmoe", initializer_range=0.25), list(range(3, 15))
    capture = FirstAttentionCapture(model)
    assert capture._projections == []
    margins, _ = captured_margins(model, ids)
    assert torch.isnan(margins[0, 0]) and torch.isfinite(margins[0, 1:]).all()
    torch.testing.assert_close(margins[0], eager_margins(model, ids), rtol=1e-4, atol=1e-5, equal_nan=True)


def test_an_indexers_selection_folded_into_the_mask_is_read_from_the_whole_row(monkeypatch):
    """Qwen4-exp's indexer picks blocks of keys per query and folds them into the mask it hands its attention (and
    fails without a mask: the capture's ``reads_mask``); a run over a block of positions would select among that
    block's keys only, so such a layer is re-run a whole row at a time (here: blocks of 4 positions otherwise). With
    a budget of 8 keys the selection drops keys from position 11 on; the margins equal the eager reference."""
    from lm_eval_probes.capture import attention

    monkeypatch.setattr(attention, "PRODUCT_POSITIONS", 4)
    model, ids = _eager_built("qwen4_exp_text", indexer_budget=8, initializer_range=0.25), list(range(3, 17))
    margins, _ = captured_margins(model, ids)
    assert FirstAttentionCapture(model).reads_mask
    assert torch.isnan(margins[0, 0]) and torch.isfinite(margins[0, 1:]).all()
    torch.testing.assert_close(margins[0], eager_margins(model, ids), rtol=1e-4, atol=1e-5, equal_nan=True)


def test_a_query_that_reads_the_positions_before_its_own_is_differentiated_at_its_own():
    """Zaya's queries and keys pass a causal convolution over the last K + 1 positions' projections (CCA; K = 2
    here) and its value projection runs on a zero row too, so no submodule's output alone is u: the capture takes the
    layer's input (u = x), finds at load how many positions before its own a query reads, and differentiates each
    query at its own position (the other rows fixed, as the margins' definition does): per product the prefix with
    tangents K + 1 positions apart. The margins equal the eager reference (its key scale drawn: at its initial zeros
    every key is zero and every margin 0)."""
    model, ids = _eager_built("zaya", initializer_range=0.25, hidden_size=32), list(range(3, 12))
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "ZayaQKNorm":
                module.temp.normal_(generator=torch.Generator().manual_seed(0))
    capture = FirstAttentionCapture(model)
    assert capture._projections == [] and capture._reach == 2
    margins, _ = captured_margins(model, ids)
    assert torch.isnan(margins[0, 0]) and torch.isfinite(margins[0, 1:]).all() and margins[0, 2:].abs().min() > 0.01
    torch.testing.assert_close(margins[0], eager_margins(model, ids), rtol=1e-4, atol=1e-5, equal_nan=True)


def test_a_query_that_reads_every_position_is_refused_at_load():
    """A query map that reads every position of its row (here: the query norm plus its input's mean over the row's
    positions) has no window of positions the capture could differentiate within: refused at load."""
    model = family_model("qwen3")
    attention = model.model.layers[0].self_attn

    class PlusRowMean(torch.nn.Module):
        def __init__(self, norm):
            super().__init__()
            self.norm = norm

        def forward(self, v):  # [B, T, H, p]
            return self.norm(v) + v.mean(1, keepdim=True)

    attention.q_norm = PlusRowMean(attention.q_norm)
    with pytest.raises(UnsupportedModelError, match="qwen3.*does not read each position alone.*with the layer's input "
                                                    "itself.*does not read each position alone"):
        FirstAttentionCapture(model)


def test_keys_that_are_not_their_positions_own_are_refused_at_load():
    """The margins read the first T keys of a layer's attention as its T positions' (any after them as keys without a
    position of their own): a layer whose key at s is another position's (here: each position's key moved one
    position later, a learned key first) is refused at load in one line."""
    model = family_model("qwen3")
    attention = model.model.layers[0].self_attn

    class OneLater(torch.nn.Module):
        def __init__(self, norm):
            super().__init__()
            self.norm, self.first = norm, torch.nn.Parameter(torch.randn(norm.weight.shape[0]))

        def forward(self, v):  # [B, T, KV, p]
            normed = self.norm(v)
            return torch.cat([self.first.expand_as(normed[:, :1]), normed[:, :-1]], 1)

    attention.k_norm = OneLater(attention.k_norm)
    with pytest.raises(UnsupportedModelError, match="qwen3.*reads 5 and 6 keys for 5 and 6 positions; position 0's "
                                                    "input moves keys \\[1\\]: the margins read the first T keys"):
        FirstAttentionCapture(model)


def family_model(family: str):
    import transformers

    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(_family_configs()[family]()).eval()


@pytest.mark.parametrize("family", ["gemma2", "olmo2", "phi3"])
def test_chunks_of_positions_and_groups_of_columns_give_the_whole_rows_margins(family, monkeypatch):
    """The query map's Jacobians a few positions and columns per product (at real widths: 128 MiB and 64 MiB at a
    time) give the margins of one product over the whole row (soft cap and window; shared columns; fused qkv), in
    float64 and, to float32's rounding (other chunks are products of other shapes), in float32."""
    from lm_eval_probes.capture import attention

    model, ids = family_model(family), list(range(3, 15))
    whole, whole32 = captured_margins(model, ids)[0], captured_margins(model, ids, precision="float32")[0]
    monkeypatch.setattr(attention, "jacobian_chunks", lambda *_args, **_kwargs: (5, 3))
    chunked, chunked32 = captured_margins(model, ids)[0], captured_margins(model, ids, precision="float32")[0]
    torch.testing.assert_close(chunked, whole, rtol=1e-10, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(chunked32, whole32, rtol=1e-5, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(whole32, whole, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_a_layer_that_reads_its_input_beside_its_projections_is_refused_at_load():
    """The load's self-check: a layer whose queries read its input other than through the submodules that take it
    (here: added to the queries' projection) is not re-run with the wrong queries; the margins refuse in one line."""
    model = family_model("qwen3")
    attention = model.model.layers[0].self_attn

    class ReadsItsInput(type(attention)):
        def forward(self, hidden_states, *args, **kwargs):
            self.seen = hidden_states
            return super().forward(hidden_states, *args, **kwargs)

    class PlusInput(torch.nn.Module):  # the query norm, plus the layer's mean input
        def __init__(self, norm):
            super().__init__()
            self.norm = norm

        def forward(self, v):
            return self.norm(v) + attention.seen.mean()

    attention.q_norm = PlusInput(attention.q_norm)
    attention.__class__ = ReadsItsInput
    with pytest.raises(UnsupportedModelError, match="qwen3.*ReadsItsInput.*from its own queries"):
        FirstAttentionCapture(model)


def test_a_window_only_in_the_mask_the_model_builds_is_read_from_that_mask():
    """PhiMoE builds a sliding-window mask but hands its attention no ``sliding_window``: the margins read the mask
    the layer hands its attention (eager: additive), and equal the layer's own eager probabilities' Jacobian."""
    import transformers as tf

    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.25)
    torch.manual_seed(0)
    config = tf.PhimoeConfig(**common, num_local_experts=4, num_experts_per_tok=2, sliding_window=5)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    ids = list(range(3, 15))
    margins, _ = captured_margins(model, ids)
    torch.testing.assert_close(margins[0], eager_margins(model, ids), rtol=1e-4, atol=1e-5, equal_nan=True)


def expected_summary(lm: ProbeHFLM, ids: list[int]):
    return MarginSummary.of(reference_margins(lm.model, ids), torch.tensor(ids), lm.probe_config.options_of("margin").support)


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
    assert lm.held.get("first_attention") is None
    answer = lm.loglikelihood(ll_instances()[:1])[0]
    assert answer.probe.get("margin_mean") is None and answer.probe.get("margin_support_positions") is None


def test_heads_min_reduction(tiny_model_dir):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=1, probes="margin")
    ids = _prompt_ids(lm, PROMPTS[0])
    mean, _ = captured_margins(lm.model, ids)
    minimum, _ = captured_margins(lm.model, ids, heads="min")
    assert torch.all(minimum[0, 1:] <= mean[0, 1:] + 1e-12) and torch.isnan(minimum[0, 0])


def test_models_without_softmax_attention_are_refused_in_one_line():
    import transformers as tf

    mamba = tf.MambaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, state_size=4)
    assert "no attention heads" in margin_unavailable(mamba)
    with pytest.raises(UnsupportedModelError, match="no layer calls transformers' attention interface"):
        FirstAttentionCapture(tf.MambaForCausalLM(mamba))
    linear = tf.Qwen3NextConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                layer_types=["linear_attention"])
    assert "no softmax-attention layer" in margin_unavailable(linear)
    assert margin_unavailable(tf.LlamaConfig()) is None
    assert margin_unavailable(tf.FalconH1Config()) is None  # its "hybrid" layers run attention beside an SSM


def test_margin_options_are_validated():
    assert ProbeConfig.from_model_args({"probes": "margin", "probe_margin_support": "7"}).options_of("margin").support == 7
    assert ProbeConfig.from_model_args({"probe_margin_heads": "MIN"}).options_of("margin").heads == "min"
    with pytest.raises(ValueError, match="probe_margin_support"):
        ProbeConfig.from_model_args({"probe_margin_support": "-1"})
    with pytest.raises(ValueError, match="probe_margin_heads"):
        ProbeConfig.from_model_args({"probe_margin_heads": "max"})


def test_the_margins_precision_resolves_per_device_and_refuses_other_values():
    """``auto`` is float64 where the device has no float32 products of bfloat16 terms (this CPU) and float32 where
    it has them (a CUDA GPU: emulated here); ``float32``/``float64`` are taken as they are; anything else is refused
    in one line, at the model argument and at the function."""
    from lm_eval_probes.probes.margin.math import margin_dtype
    from lm_eval_probes.stack_api import float32_products_emulated

    assert margin_dtype("auto", "cpu") == torch.float64
    assert margin_dtype("float32", "cpu") == torch.float32 and margin_dtype("float64", "cpu") == torch.float64
    with float32_products_emulated():
        assert margin_dtype("auto", "cpu") == torch.float32
    with pytest.raises(ValueError, match="probe_margin_precision must be one of auto, float32, float64"):
        margin_dtype("float16", "cpu")
    with pytest.raises(ValueError, match="float16"):
        ProbeConfig.from_model_args({"probes": "margin", "probe_margin_precision": "float16"})


def test_a_position_with_one_key_in_its_prefix_has_margin_zero_exactly_in_float32():
    """C_t is summed from deviations from the position's own weighted mean (docs/precision.md): with one key in the
    prefix every deviation is 0, so the margin is 0 exactly, not float32 rounding that could rank it a support token."""
    model, ids = family_model("qwen3"), list(range(3, 15))
    margins, _ = captured_margins(model, ids, precision="float32")
    assert margins[0, 1].item() == 0.0 and torch.isnan(margins[0, 0])


@pytest.mark.parametrize("family, colors", [("mixtral", 2), ("gptj", 2), ("gpt_neox", 2), ("gpt2", 1), ("opt", 1),
                                            ("qwen3", 8), ("olmo2", None), ("deepseek_v3", None)])
def test_columns_that_move_disjoint_query_entries_share_one_product(family, colors):
    """The query map's input columns are coloured at load (a rotary-only map moves entry i from column i and its
    rotation partner: two colours; no rotation: one; a per-head query norm moves every entry from every column: each
    column alone, ``None``: as many colours as columns), and D_t from the colours equals D_t with every column alone
    (float64, on a longer row than the load's)."""
    from lm_eval_probes.capture.attention import _Coloring

    model, ids = family_model(family), list(range(3, 30))
    capture = FirstAttentionCapture(model)
    coloring = capture._coloring
    assert coloring is not None and coloring.columns is capture._columns
    assert coloring.count == (capture._columns.shape[1] if colors is None else colors)
    with capture.capture() as inputs, torch.no_grad():
        model(torch.tensor([ids]), use_cache=False)
    row = next(capture.batch(inputs.latest()).rows())
    colored = row.query_jacobian(0, len(ids))
    capture._coloring = _Coloring.dense(capture._columns)
    alone = next(capture.batch(inputs.latest()).rows()).query_jacobian(0, len(ids))
    assert colored.shape == alone.shape and alone.abs().max() > 0
    torch.testing.assert_close(colored, alone, rtol=0, atol=1e-12 * float(alone.abs().max()))


@pytest.mark.parametrize("family", ["mixtral", "qwen3"])
def test_a_row_that_begins_like_an_earlier_one_computes_only_the_positions_after_them(family, monkeypatch):
    """The options of a multiple-choice document share its context: the margins' probe takes the earlier row's margins
    of the shared leading tokens (the margin at t reads positions ≤ t only) and asks the capture for the Jacobians from
    the chunk of the first token it does not share (chunks of 5 positions here); the row's margins equal those computed
    on their own exactly (the same chunks: the values do not depend on the rows before)."""
    from lm_eval_probes.capture import attention

    monkeypatch.setattr(attention, "jacobian_chunks", lambda *_args, **_kwargs: (5, 3))
    model = family_model(family)
    context, first, second = list(range(3, 20)), [40, 41, 42], [50, 51]
    capture = FirstAttentionCapture(model)

    def margins_of(probe, ids):
        asked = []
        with capture.capture() as inputs, torch.no_grad():
            model(torch.tensor([ids]), use_cache=False)
        batch = capture.batch(inputs.latest())
        rerun = batch.row

        def recorded(index, work):
            row = rerun(index, work)
            jacobian = row.query_jacobian
            row.query_jacobian = lambda lo, hi: asked.append(lo) or jacobian(lo, hi)
            return row

        batch.row = recorded
        return probe.first_attention.values(batch)[0], asked

    probe = margin_probe()
    _, asked = margins_of(probe, context + first)
    assert asked[0] == 0
    shared, asked = margins_of(probe, context + second)
    assert asked and min(asked) == len(context) - len(context) % 5
    alone, asked = margins_of(margin_probe(), context + second)
    assert asked[0] == 0
    torch.testing.assert_close(shared, alone, rtol=0, atol=0, equal_nan=True)
    again, asked = margins_of(probe, context + second)  # the same tokens again: nothing to compute
    assert not asked and torch.equal(again.isnan(), shared.isnan())
    torch.testing.assert_close(again, shared, rtol=0, atol=0, equal_nan=True)
