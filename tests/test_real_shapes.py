"""``benchmarks/shapes.py``: real-width models built in-process (tiny versions here; the real widths in a slow test)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
_spec = importlib.util.spec_from_file_location("lm_eval_probes_bench_shapes", BENCHMARKS / "shapes.py")
shapes = importlib.util.module_from_spec(_spec)  # not on sys.path: benchmarks/calibration.py would shadow a package
sys.modules[_spec.name] = shapes  # its dataclasses look their module up
_spec.loader.exec_module(shapes)
FORBIDDEN_LOGIT, SHAPES, build_model, model_config = shapes.FORBIDDEN_LOGIT, shapes.SHAPES, shapes.build_model, shapes.model_config
offline_tokenizer, peak_allocated, resolve = shapes.offline_tokenizer, shapes.peak_allocated, shapes.resolve


def _load_real_shapes():
    """``benchmarks/real_shapes.py`` as a module, without leaving the benchmarks folder on ``sys.path``."""
    spec = importlib.util.spec_from_file_location("lm_eval_probes_bench_real_shapes", BENCHMARKS / "real_shapes.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


@pytest.fixture(scope="module")
def gemma_one_layer():
    """Gemma-3-4B's real widths (V = 262144, d = 2560, head width 256, bfloat16) with one block."""
    return build_model("gemma3-4b", 1, tokenizer=offline_tokenizer("tiny"))


@pytest.mark.parametrize("name, widths", [
    ("llama3-8b", dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256)),
    ("qwen2.5-7b", dict(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, head_dim=128, intermediate_size=18944, vocab_size=152064)),
    ("gemma3-4b", dict(hidden_size=2560, num_attention_heads=8, num_key_value_heads=4, head_dim=256, intermediate_size=10240, vocab_size=262144)),
    ("llada-8b", dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32, head_dim=128, intermediate_size=12288, vocab_size=126464)),
    ("dream-7b", dict(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, head_dim=128, intermediate_size=18944, vocab_size=152064)),
])
def test_configs_carry_the_published_widths(name, widths):
    config = model_config(SHAPES[name], 3, pad=1, eos=0)
    assert {key: getattr(config, key) for key in widths} == widths and config.num_hidden_layers == 3
    assert config.model_type == {"llama3-8b": "llama", "llada-8b": "llama", "gemma3-4b": "gemma3_text"}.get(name, "qwen2")


@pytest.mark.parametrize("name", ["llama3-8b/64", "qwen2.5-7b/64", "gemma3-4b/32", "llada-8b/64"])
def test_a_scaled_shape_is_built_in_bfloat16_with_random_weights_confined_to_the_tokenizer(name):
    shape = resolve(name)
    tokenizer = offline_tokenizer("tiny", mask=shape.diffusion is not None)
    model = build_model(shape, 2, tokenizer=tokenizer)
    params = list(model.parameters())
    assert {p.dtype for p in params} == {torch.bfloat16}
    assert sum(p.numel() for p in params) == shape.parameters(2)
    weight = model.get_output_embeddings().weight.float()
    assert weight.std().item() == pytest.approx(0.02, rel=0.05) and len(torch.unique(weight[:64], dim=0)) == 64
    ids = torch.tensor([tokenizer("Anne is kind. Is Anne smart?").input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape[-1] == shape.vocab > len(tokenizer)
    assert (logits[..., len(tokenizer):] == FORBIDDEN_LOGIT).all() and (logits[..., : len(tokenizer)] > FORBIDDEN_LOGIT).all()
    out = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert int(out.max()) < len(tokenizer)
    again = build_model(shape, 2, tokenizer=tokenizer)  # seeded: the same weights
    assert torch.equal(again.get_output_embeddings().weight, model.get_output_embeddings().weight)


def test_hflm_takes_the_built_object():
    from lm_eval.models.huggingface import HFLM

    tokenizer = offline_tokenizer("tiny")
    model = build_model("llama3-8b/64", 1, tokenizer=tokenizer)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=2, device="cpu")
    (logprob, _), = lm._loglikelihood_tokens(
        [(("a", "b"), tokenizer("Anne is").input_ids, tokenizer(" kind").input_ids)], disable_tqdm=True)
    assert logprob < 0


@pytest.mark.slow
def test_a_real_width_layer_is_built_without_a_float32_copy():
    """One Llama-3-8B-width layer (2.36 GiB of bfloat16 weights) peaks at the weights plus the imports."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "shapes.py"), "llama3-8b", "--layers", "1"],
                          capture_output=True, text=True, check=True)
    extra = float(done.stdout.split("peak − before − weights = ")[1].split(" GiB")[0])
    assert extra < 0.6, done.stdout  # a float32 copy would add 4.7 GiB


def test_the_lens_probes_stay_within_the_bound_at_the_largest_vocabulary(gemma_one_layer):
    """Gemma-3-4B's real widths (V = 262144, d = 2560, bfloat16; one layer): the lens and δ_TCB + BTE over two chunks
    of positions hold at most 1 GiB (the bound of 7.3 GiB of weights) — a float32 copy of W alone would take 2.5 GiB."""
    from lm_eval_probes.capture.positions import position_probes
    from lm_eval_probes.capture.readouts import LensReadout
    from lm_eval_probes.config import ProbeConfig

    model = gemma_one_layer
    readout, building = peak_allocated(lambda: LensReadout(model))
    assert readout.unembed.dtype == torch.bfloat16 and building < 2**26  # the row norms' buffer and [V] float64
    config = ProbeConfig.from_model_args({"probes": "tcb+bte", "probe_chunk_positions": 8})
    positions = config.chunk_positions + 1
    generator = torch.Generator().manual_seed(0)
    states = [torch.randn(positions, 2560, generator=generator).to(torch.bfloat16) for _ in range(2)]
    probes, probing = peak_allocated(lambda: position_probes(states, readout, config, torch.arange(positions)))
    assert probes.num_positions == positions and probing < 2**30, probing / 2**30



def test_each_probe_declares_the_memory_it_allocates(gemma_one_layer):
    """At Gemma-3-4B's real widths each probe's declared memory (what ``batch_size=auto`` reserves and the memory model
    of docs/performance.md adds up) is within ±20 % of what its own phase allocates (torch's profiler): the lens
    probes on a chunk of 64 positions, the token log-probabilities, Ω's decoding and the margins at T = 256 (this
    CPU's ``auto``: float64; and float32, a GPU's path)."""
    real_shapes = _load_real_shapes()
    rows = real_shapes.declared_rows(gemma_one_layer, offline_tokenizer("tiny"), SHAPES["gemma3-4b"], tokens=256,
                                     margin_precisions=("auto", "float32"))
    assert {row["probe"] for row in rows} == {"logprobs", "tcb", "bte", "reader", "omega", "margin", "margin/float32"}
    for row in rows:
        assert 0.8 <= row["measured"] / row["declared"] <= 1.2, row
