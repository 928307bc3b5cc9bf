"""The tests' tiny random models and their offline byte-level BPE tokenizer, built from configs (no download).

Imported by ``conftest.py`` and by the benchmarks (``benchmarks/gpu_first_run.py --dry-run``,
``samples_snapshot.py``, ``batch_invariance.py``, ``shapes.py``), so it needs the package's runtime dependencies only
(torch, transformers, tokenizers): no pytest.
"""

from __future__ import annotations

from pathlib import Path

import torch

TINY_ARCHS = ("llama", "qwen2", "gpt2", "gemma3_text")
"""The architectures of ``tiny_config`` (and the tests' ``tiny_model_dir`` fixture)."""

_CORPUS = [
    "Question: Mia has 7 apples. She buys 5 more apples. How many apples does Mia have now? Answer: 12",
    "Anne is kind. If someone is kind then they are smart. Anne is smart. True False",
    "The bear is red. The cat is big. All smart people are quiet. The answer is 42.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 + - * / = ? . , : ; ( ) \n\n Question Answer True False",
]


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=360,
        special_tokens=["<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<pad>"
    )


def tiny_config(arch: str, vocab_size: int, *, eos: int, pad: int):
    import transformers as tf

    common = dict(vocab_size=vocab_size, initializer_range=0.25, eos_token_id=eos, bos_token_id=eos, pad_token_id=pad)
    if arch == "llama":
        return tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=512, **common)
    if arch == "qwen2":
        return tf.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=512, **common)
    if arch == "gpt2":
        return tf.GPT2Config(n_embd=32, n_layer=3, n_head=4, n_positions=512, **common)
    if arch == "gemma3_text":
        return tf.Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                                   sliding_window=16, final_logit_softcapping=5.0, **common)
    raise ValueError(arch)


def save_tiny_bert(folder: Path, *, seed: int, special_tokens: dict) -> str:
    """A tiny random BERT masked LM (2 layers, width 32) with the tests' tokenizer plus ``special_tokens``, saved
    into ``folder``: the bidirectional model of the diffusion tests."""
    import transformers as tf

    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens(special_tokens)
    config = tf.BertConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
                           initializer_range=0.3)
    torch.manual_seed(seed)
    model = tf.AutoModelForMaskedLM.from_config(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def save_tiny_model(folder: Path, arch: str = "llama") -> str:
    """A tiny random causal LM of ``arch`` (:func:`tiny_config`, seeded by the architecture's name) with the tests'
    tokenizer, saved into ``folder``. Query/key norms start at the identity: they get random weights, so tests see
    what they do."""
    import transformers as tf

    tokenizer = build_tokenizer()
    config = tiny_config(arch, len(tokenizer), eos=tokenizer.eos_token_id, pad=tokenizer.pad_token_id)
    torch.manual_seed(sum(map(ord, arch)))
    model = tf.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.add_(0.3 * torch.randn_like(param))
    model.eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
