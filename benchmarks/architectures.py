"""Every decoder-only model type of the installed transformers, built tiny and run with ``probes=all``.

    python benchmarks/architectures.py                    # every type: the Markdown table
    python benchmarks/architectures.py --check            # and each run's per-document values checked independently
    python benchmarks/architectures.py --types llama gpt2 --docs 2

Each ``model_type`` of transformers' causal-LM mapping that is neither an encoder(-decoder) nor a multimodal
config is built from its own config class at small widths (:data:`SIZES`: width 64, 3 layers, 4 experts, …), with
every kind of layer the family mixes (one of each kind its default ``layer_types`` lists) and its logit transforms
set off 1 (:data:`TRANSFORMS`), random weights, the tests' 360-token tokenizer. ``hf-probes`` then runs
``probes=all`` on a few documents of ``probes_synth_logic``. The table says per type: runs (and which probes were
skipped, why), refused (the one-line reason), or could not be built small (bigger than :data:`MAX_PARAMETERS`, or
its config or forward failed at these widths).

``--check``: for each run, every document's δ_TCB (final layer) and BTE's transition at the middle layer are
recomputed independently — from the model's own forward (``output_hidden_states``; the final norm's input replaced
by a layer's states, so that the model's own norm, head and logit transform read it out) and an autograd Jacobian of
its softmax — and must agree to :data:`CHECK_TOLERANCE` (relative). Exit status 1 when one does not.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import sys
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
TASK = "probes_synth_logic"

SIZES: dict[str, Any] = {
    "vocab_size": 360, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "moe_shared_expert_intermediate_size": 32,
    "shared_intermediate_size": 32, "num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4,
    "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_num_heads": 4, "linear_head_dim": 16,
    "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "ssm_state_size": 16, "state_size": 16,
    "mamba_num_heads": 8, "mamba_head_dim": 16, "n_mamba_heads": 8, "mamba_chunk_size": 16, "chunk_size": 16,
    "mamba_d_ssm": 128, "n_groups": 1, "mamba_n_groups": 1, "mamba_ngroups": 1, "time_step_rank": 8,
    "sliding_window": 8, "attention_chunk_size": 8, "adapter_rank": 8, "block_multiple_of": 16,
    "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 360, "laurel_rank": 8, "rotary_dim": 8,
    "num_kv_shared_layers": 1,
}
"""Config field → its small value (set where the family's config has the field; a field it leaves unset, ``None``,
stays unset but for the few listed in :data:`SET_EVEN_IF_UNSET`)."""

SET_EVEN_IF_UNSET = ("q_lora_rank", "sliding_window", "head_dim", "num_key_value_heads", "num_experts_per_tok",
                     "n_routed_experts")
"""Fields set even where the family's default leaves them unset (DeepSeek-V2 and dots1 have routed experts but no
default count or top-k)."""

TRANSFORMS: dict[str, float] = {"logits_scaling": 4.0, "lm_head_multiplier": 0.5}
"""Logit transforms set off their identity default, so that the lens must read them (Cohere's ``logit_scale`` and
Gemma's soft-capping are already off it)."""

FAMILY_FIELDS: dict[str, dict[str, Any]] = {
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention", "linear_attention"]},
    "mamba2": {"num_heads": 8},
    "dory": {"n_input_layers": 1, "n_output_layers": 1},
    "dots1": {"n_shared_experts": 1},
    "gpt_neo": {"attention_types": [[["global", "local"], 1], [["global"], 1]]},
    "kolibri1_1": {"index_num_heads": 2, "index_layers": [1]},
    "zaya": {"num_experts_per_tok": 1},
    "bert-generation": {"is_decoder": True},
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "lfm2_moe": {"layer_types": ["conv", "full_attention", "full_attention"], "num_dense_layers": 1},
    "qwen4_exp_text": {"indexer_budget": 64, "indexer_compress_ratio": 4, "indexer_n_heads": 2, "indexer_kv_heads": 1,
                       "indexer_head_dim": 16},
    "xlstm": {"qk_dim_factor": 1.0},
    "dots3_note_text": {"per_layer_config": {layer: {"num_attention_heads": 2, "num_key_value_heads": 2,
                                                     "kv_lora_rank": 32, "qk_nope_head_dim": 12, "head_dim": 20}
                                             for layer in (1, 2)}},
}
"""The few families that need fields of their own. Their mix of layers (or SSM heads), set by fields of their own: one
layer of each kind in 3 (Dory: one input, one recurrent and one output layer; its defaults of 8 input and 8 output
layers leave -13 recurrent ones). A pattern the config refuses fails the build (not small, with the config's reason):
it is never dropped silently (Granite-MoE-Hybrid's default is every layer linear attention, which no cached forward of
transformers runs). dots1: no default count of shared experts. GPT-Neo: its layers' attention kinds by
``attention_types`` (global, local, global). Kolibri-1.1: its indexer's heads at most the query heads per key head (2),
on one layer of 3. Zaya: one expert per token (the only count it runs). BERT-generation: a decoder (causal attention; its
default attends both ways). Cohere-Compass: rotary parameters per layer
type (its default has none). LFM2-MoE: no default ``layer_types`` (a convolution and two attention layers, one dense).
Qwen4-exp: no default token budget, compression and heads of its indexer (64 tokens, 4 to 1, 2 heads). dots3's sliding layers (1 and 2 of its small
``layer_types``) have half the heads, twice the key-value latent and ``head_dim = qk_nope_head_dim +
qk_rope_head_dim``, a sum that :func:`_small_per_layer_config`'s ratios do not keep. xLSTM: its keys as wide as its
values (its cached forward builds its state with the values' width for both: narrower keys, its default's half, fail
there)."""

ONE_PER_BATCH: dict[str, str] = {
    "cpmant": "its forward builds its attention mask from the ids, not from the mask it is given: a right-padded row's "
              "values are not those of the row alone",
}
"""The families run one document per batch (the table's others take two), and why: the check recomputes each document
alone, which a model whose own output depends on its batch's padding does not give."""

LAYER_LISTS = ("layer_types", "mlp_layer_types", "layers_block_type")
MAX_PARAMETERS = 20_000_000
CHECK_TOLERANCE = 1e-3


def decoder_only_types() -> list[str]:
    """Model types of the installed transformers' causal-LM mapping that are decoder-only text models (not an
    encoder-decoder, not a masked LM used as a decoder, no sub-configs: vision or audio towers, or the target's text
    config of a drafter such as Gemma-4's assistant, whose forward reads the target model's embeddings and KV states)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

    out = []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES or model_type not in CONFIG_MAPPING:
            continue
        if getattr(CONFIG_MAPPING[model_type], "sub_configs", None):  # declared, even where its defaults fail
            continue
        try:
            config = CONFIG_MAPPING[model_type]()
        except Exception:  # a config class with no valid defaults: still a type to report
            out.append(model_type)
            continue
        if not getattr(config, "is_encoder_decoder", False) and not getattr(config, "sub_configs", None):
            out.append(model_type)
    return out


def small_config(model_type: str, *, vocab_size: int = 360, pad: int = 1, eos: int = 0) -> Any:
    """``model_type``'s config at :data:`SIZES`, with one layer of each kind its default mixes (and, where the family
    sets fields per layer, each small layer given the overrides of the family's first layer of its kind, at the same
    ratio to the small width as the family's to its own: :func:`_small_per_layer_config`)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    base = cls()
    if getattr(base, "is_heterogeneous", False):  # per-layer fields: their global values, read knowingly
        base.allow_global_per_layer_attribute_access = True
    aliases = getattr(cls, "attribute_map", {}) or {}
    kwargs: dict[str, Any] = {}
    per_layer: list[str] = []
    for key, value in {**SIZES, "vocab_size": vocab_size, "vocab_size_per_layer_input": vocab_size,
                       "unpadded_vocab_size": vocab_size}.items():  # Inkling-2 pads its vocabulary to vocab_size
        name = aliases.get(key, key)
        if not hasattr(base, name) or _read_only(cls, name) or not _settable(base, name, value):
            continue  # a width the family derives (xLSTM's v_head_dim), a limit it has not (XLNet's positions)
        current = getattr(base, name)
        if current is None and key not in SET_EVEN_IF_UNSET:
            continue
        if current is None or (isinstance(current, int) and not isinstance(current, bool)):
            kwargs[name] = value
        elif _per_layer_ints(base, current):  # one value per layer (Gemma-3n's intermediate_size): set below
            per_layer.append(name)
            kwargs[name] = value
    for key, value in TRANSFORMS.items():
        if getattr(base, key, None) is not None and not _read_only(cls, key):  # MiniCPM3 derives logits_scaling
            kwargs[key] = value
    for key in dict.fromkeys(aliases.get(key, key) for key in LAYER_LISTS):  # one list under its own name, not an alias
        kinds = list(dict.fromkeys(getattr(base, key, None) or ()))
        if kinds and not _read_only(cls, key):  # a list the family derives from other fields (Mamba-2) is left to it
            layers = max(3, len(kinds))
            kwargs[key] = (kinds + [kinds[-1]] * layers)[:layers]
            kwargs["num_hidden_layers"] = layers
    if getattr(base, "qk_rope_head_dim", None):  # multi-head latent attention: the rotary part is the head_dim, and
        kwargs["head_dim"] = SIZES["qk_rope_head_dim"]  # the latent is expanded to every head (no grouped keys)
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", SIZES["num_attention_heads"])
    for name in per_layer:
        kwargs[name] = [kwargs[name]] * kwargs.get("num_hidden_layers", SIZES["num_hidden_layers"])
    kwargs.update(FAMILY_FIELDS.get(model_type, {}))
    if getattr(base, "is_heterogeneous", False) and "per_layer_config" not in kwargs:
        kwargs["per_layer_config"] = _small_per_layer_config(base, kwargs)
    for key, value in (("pad_token_id", pad), ("bos_token_id", eos), ("eos_token_id", eos)):
        if hasattr(base, key):
            kwargs[key] = value
    try:
        return cls(**kwargs)
    except Exception:  # a layer list or head width the family derives itself (but not a pattern set for it)
        for key in (*LAYER_LISTS, "head_dim"):
            if key not in FAMILY_FIELDS.get(model_type, {}):
                kwargs.pop(key, None)
        return cls(**kwargs)


def _settable(config: Any, name: str, value: Any) -> bool:
    """Whether ``config``'s class lets ``name`` be set to ``value`` (a property whose setter raises, XLNet's
    ``max_position_embeddings``: it has no sequence length limit, is not); tried on a copy."""
    if not isinstance(getattr(type(config), name, None), property):
        return True
    try:
        setattr(copy.deepcopy(config), name, value)
    except Exception:
        return False
    return True


def _per_layer_ints(base: Any, value: Any) -> bool:
    """Whether ``value`` is a list of one integer per layer of ``base``."""
    layers = getattr(base, "num_hidden_layers", None)
    return isinstance(value, list) and len(value) == layers and all(type(v) is int for v in value)


def _read_only(cls: type, name: str) -> bool:
    """Whether the config class computes ``name`` (a property without a setter)."""
    attribute = getattr(cls, name, None)
    return isinstance(attribute, property) and attribute.fset is None


def _small_per_layer_config(base: Any, kwargs: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The ``per_layer_config`` of the small config ``kwargs`` (transformers' heterogeneous configs: Gemma-4's
    full-attention layers have twice the head width, dots3's sliding ones fewer heads): small layer ``i`` takes the
    overrides of ``base``'s first layer of its kind (in ``layer_types``, else the first layer list it has; layer ``i``
    where the family has no list), an integer field that the small config sets scaled by the family's own ratio
    (override / global) where that gives a whole number, else the small global value (no override)."""
    overrides = {int(layer): fields for layer, fields in (base.to_dict().get("per_layer_config") or {}).items()}
    key = next((key for key in LAYER_LISTS if key in kwargs), None)
    out: dict[int, dict[str, Any]] = {}
    for i in range(kwargs.get("num_hidden_layers", SIZES["num_hidden_layers"])):
        kinds = list(getattr(base, key)) if key else []
        source = kinds.index(kwargs[key][i]) if key else i
        fields = {}
        for name, value in overrides.get(source, {}).items():
            if name in kwargs and isinstance(value, int) and not isinstance(value, bool):
                scaled = kwargs[name] * value / getattr(base, name)
                if scaled == int(scaled) and scaled >= 1 and int(scaled) != kwargs[name]:
                    fields[name] = int(scaled)
            else:
                fields[name] = value
        if fields:
            out[i] = fields
    return out


class NotSmall(Exception):
    """The family could not be built small (the reason: its config, its size or its forward at small widths)."""


def build(model_type: str, folder: Path, *, seed: int = 0) -> str:
    """A tiny random ``model_type`` saved with the tests' tokenizer into ``folder``; :class:`NotSmall` otherwise."""
    import transformers

    sys.path.insert(0, str(REPO / "tests"))
    from tiny_models import build_tokenizer

    tokenizer = build_tokenizer()
    try:
        config = small_config(model_type, vocab_size=len(tokenizer), pad=tokenizer.pad_token_id,
                              eos=tokenizer.eos_token_id)
        with torch.device("meta"):
            size = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())
    except Exception as error:
        raise NotSmall(f"config: {type(error).__name__}: {_line(error)}") from None
    if size > MAX_PARAMETERS:
        raise NotSmall(f"{size / 1e6:.1f}M parameters at these widths")
    torch.manual_seed(seed)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():  # without a cache, and as HFLM's loglikelihood calls it (the config's use_cache)
            model(torch.arange(2, 14).unsqueeze(0), use_cache=False)
            model(torch.arange(2, 14).unsqueeze(0))
    except Exception as error:
        raise NotSmall(f"forward: {type(error).__name__}: {_line(error)}") from None
    try:
        model.save_pretrained(folder)
    except Exception as error:
        raise NotSmall(f"save: {type(error).__name__}: {_line(error)}") from None
    tokenizer.save_pretrained(folder)
    return str(folder)


def _line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:200]


@dataclass
class Outcome:
    """One model type's row of the table."""

    model_type: str
    status: str  # runs, refused, not small
    reason: str = ""
    skipped: dict[str, str] = field(default_factory=dict)
    rows: dict[str, float] = field(default_factory=dict)
    checked: float | None = None  # the largest relative difference of --check


HEADLINE_ROWS = ("tcb_log10", "bte_energy", "omega", "confidence", "ece", "margin")


@functools.cache
def _task_manager() -> Any:
    """The plugin's task manager (its index of the task folders made once)."""
    import lm_eval_probes

    lm_eval_probes.register()
    return lm_eval_probes.ProbeTaskManager(include_path=lm_eval_probes.TASKS_DIR)


def run(folder: str, docs: int, *, batch_size: int = 2) -> tuple[dict[str, Any], dict[str, Any]]:
    """``hf-probes`` with ``probes=all`` (BTE's full profile) on ``docs`` documents of :data:`TASK`, ``batch_size`` at a
    time: lm_eval's results and samples (JSON-native)."""
    import lm_eval
    from lm_eval.utils import handle_non_serializable

    result = lm_eval.simple_evaluate(
        model="hf-probes", model_args={"pretrained": folder, "probes": "all", "probe_bte_profile": "full",
                                       "device": "cpu"},
        tasks=[TASK], task_manager=_task_manager(), limit=docs, batch_size=batch_size, bootstrap_iters=0,
        log_samples=True)
    return result, json.loads(json.dumps(result["samples"][TASK], default=handle_non_serializable))


def headline_rows(result: dict[str, Any]) -> dict[str, float]:
    """The task's values of :data:`HEADLINE_ROWS` (``nan`` where absent or not a number)."""
    rows = result["results"][TASK]
    out = {}
    for name in HEADLINE_ROWS:
        value = next((v for k, v in rows.items() if k.split(",")[0] == name), None)
        out[name] = float(value) if isinstance(value, (int, float)) else math.nan
    return out


# ----------------------------------------------------------------------------- the independent check


def _final_norm(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model's final norm (``None`` where it has none: its head reads the last block's output)."""
    from lm_eval_probes.capture.parts import architecture_of, get_path

    path = architecture_of(model).final_norm
    return get_path(model, path) if path else None


@functools.cache
def _readout(model: torch.nn.Module) -> Any:
    """The plugin's lens readout of ``model``, checked at load (what it found: the final norm under another name,
    a merge of streams, a prediction head)."""
    from lm_eval_probes.capture.readouts import LensReadout, check_lens

    readout = LensReadout(model)
    check_lens(model, readout)
    return readout


def _lens_input(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module whose input is the last block's output: the final norm (CPM-Ant's under another name, the module its
    head's input comes from), or the model's own merge of several residual streams before it (DeepSeek-V4's
    ``hc_head``, the module the final norm's input comes from), or the head where the model has no final norm;
    ``None`` where the model merges its streams in its forward's own code (Gemma-3n)."""
    readout = _readout(model)
    if readout.lens_input is not None:
        return readout.lens_input
    return None if readout.merge is not None else model.get_output_embeddings()


@torch.no_grad()
def _lens_logprobs(model: torch.nn.Module, ids: torch.Tensor, layer_states: torch.Tensor) -> torch.Tensor:
    """The model's own log-probabilities when its final norm (or its merge of residual streams before the norm) reads
    ``layer_states`` (the forward's ``hidden_states`` entry of a layer, one row) instead of the last block's output (the
    model's own merge, norm, head and logit transform: the lens, computed by the model); where the model merges its
    streams in its forward's own code, the last block's output is replaced by them."""
    from lm_eval_probes.capture.parts import blocks_of

    reader = _lens_input(model)
    if reader is None:
        last = blocks_of(model)[-1]
        handle = last.register_forward_hook(lambda _module, _args, output: layer_states.to(output.dtype))
    else:
        def replace(_module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            states = args[0].clone()  # the last positions: a model's own before them stay (CPM-Ant's prompt)
            states[:, states.shape[1] - layer_states.shape[1]:] = layer_states[0].to(states.dtype)
            return (states, *args[1:])

        handle = reader.register_forward_pre_hook(replace)
    try:
        logits = model(ids, use_cache=False).logits[0]
    finally:
        handle.remove()
    return torch.log_softmax(logits.double(), -1)


def _delta_tcb(model: torch.nn.Module, ids: torch.Tensor, final: torch.Tensor, *, at_head: bool = False) -> torch.Tensor:
    """δ = 1 / ‖∂softmax(logits)/∂h‖_F at each of ``final``'s ``[n, d]`` post-norm states, the Jacobian by autograd
    through the model's own head and logit transform (the final norm's output replaced by h; ``at_head``: the
    unembedding's input, where a prediction head lies between them)."""
    norm = None if at_head else _final_norm(model)
    out = []
    for h in final:
        def probabilities(state: torch.Tensor) -> torch.Tensor:
            replaced = state.view(1, 1, -1).expand(1, ids.shape[1], -1)
            handle = (norm.register_forward_hook(lambda _m, _a, _o: replaced) if norm is not None else  # the head's input
                      model.get_output_embeddings().register_forward_pre_hook(lambda _m, _a: (replaced,)))
            try:
                logits = model(ids, use_cache=False).logits[0, -1]
            finally:
                handle.remove()
            return torch.softmax(logits.double(), -1)

        jacobian = torch.autograd.functional.jacobian(probabilities, h.detach().double().to(final.dtype))
        out.append(1.0 / torch.linalg.matrix_norm(jacobian.double()))
    return torch.stack(out)


def _jsd(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Jensen–Shannon divergence (nats) of rows of two log-probability tensors."""
    m = torch.logaddexp(logp, logq) - math.log(2.0)
    return 0.5 * (logp.exp() * (logp - m)).sum(-1) + 0.5 * (logq.exp() * (logq - m)).sum(-1)


def _seen_in_a_forward(model: torch.nn.Module, ids: torch.Tensor, register: Any) -> torch.Tensor:
    """What the hook ``register(keep)`` installs hands ``keep`` in one more forward of ``model`` on ``ids`` (its last
    call's), the hook removed after."""
    seen: list[torch.Tensor] = []
    handle = register(seen.append)
    try:
        with torch.no_grad():
            model(ids, use_cache=False)
    finally:
        handle.remove()
    return seen[-1]


def check_documents(folder: str, samples: Sequence[dict[str, Any]]) -> float:
    """The largest relative difference, over the documents, between the run's ``tcb_log10`` and BTE's middle
    transition ``bte_profile[L // 2]`` and their independent recomputation on the option the task read (the one with
    the largest log-likelihood): the request tokenized as HFLM does (context, continuation), one forward with
    ``output_hidden_states``."""
    import transformers

    from lm_eval_probes.capture.parts import blocks_of

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():  # a looped model's forward gives one state per pass of a block
        passes = len(model(torch.arange(2, 8).unsqueeze(0), output_hidden_states=True, use_cache=False).hidden_states) - 1
    layers = max(len(blocks_of(model)), passes)
    middle = layers // 2
    worst = 0.0
    for sample in samples:
        logliks = [float(resp[0][0] if isinstance(resp[0], (list, tuple)) else resp[0]) for resp in sample["resps"]]
        context, continuation = sample["arguments"][max(range(len(logliks)), key=logliks.__getitem__)]
        context, continuation = _moved_space(context, continuation)
        whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
        start = len(tokenizer(context, add_special_tokens=False)["input_ids"])
        ids = torch.tensor([whole[:-1]])
        positions = slice(start - 1, len(whole) - 1)
        with torch.no_grad():
            out = model(ids, output_hidden_states=True, use_cache=False)
        states = out.hidden_states
        if len(states) != layers + 1:
            raise RuntimeError(f"{len(states)} hidden states for {layers} blocks")
        final, at_head = states[layers], _readout(model).head_transform is not None
        if at_head:  # a prediction head between the final norm and the unembedding: δ at the unembedding's input
            final = _seen_in_a_forward(model, ids, lambda keep: model.get_output_embeddings().register_forward_pre_hook(
                lambda _module, args: keep(args[0])))
        elif final.ndim > 3:  # the last block's streams (Gemma-3n's), not the final norm's output: the norm's own
            final = _seen_in_a_forward(model, ids, lambda keep: _final_norm(model).register_forward_hook(
                lambda _module, _args, output: keep(output)))
        delta = _delta_tcb(model, ids, final[0, positions], at_head=at_head)
        tcb = float(torch.log10(delta).mean())
        lower = _lens_logprobs(model, ids, states[middle])[positions]
        upper = (torch.log_softmax(out.logits[0].double(), -1) if middle + 1 == layers
                 else _lens_logprobs(model, ids, states[middle + 1]))[positions]
        bte = float(_jsd(lower, upper).mean())
        got = sample["tcb_log10"], sample["bte_profile"][middle]
        for value, want in zip(got, (tcb, bte), strict=True):
            worst = max(worst, abs(float(value) - want) / max(abs(want), 1e-12))
    return worst


def _moved_space(context: str, continuation: str) -> tuple[str, str]:
    """HFLM's ``_encode_pair``: the context's trailing spaces move to the continuation."""
    spaces = len(context) - len(context.rstrip())
    return (context[:-spaces], context[-spaces:] + continuation) if spaces else (context, continuation)


# ----------------------------------------------------------------------------- the table


def outcome_of(model_type: str, *, docs: int, check: bool) -> Outcome:
    """Build, run and (``check``) check one model type."""
    with tempfile.TemporaryDirectory(prefix=f"tiny-{model_type}-") as folder:
        try:
            path = build(model_type, Path(folder))
        except NotSmall as reason:
            return Outcome(model_type, "not small", str(reason))
        try:
            result, samples = run(path, docs, batch_size=1 if model_type in ONE_PER_BATCH else 2)
        except Exception as error:
            return Outcome(model_type, "refused", f"{type(error).__name__}: {_line(error)}")
        outcome = Outcome(model_type, "runs", skipped=dict(result["config"].get("probes_skipped") or {}),
                          rows=headline_rows(result))
        if check:
            try:
                outcome.checked = check_documents(path, samples)
            except Exception as error:  # the reference itself cannot read this model: the run is not checked
                outcome.checked = math.inf
                outcome.reason = f"not checked: {type(error).__name__}: {_line(error)}"
        return outcome


TABLE_HEADER = ("| model_type | outcome | checked | probes skipped / reason | δ_TCB | BTE | Ω | confidence | ECE | margin |\n"
                "|---|---|---|---|---|---|---|---|---|---|")


def table_row(o: Outcome) -> str:
    """One outcome as a row of the Markdown table (``checked``: the largest relative difference of ``--check``)."""
    values = " | ".join(f"{o.rows[name]:.3g}" if name in o.rows else "" for name in HEADLINE_ROWS)
    why = "; ".join([*(f"{p}: {r}" for p, r in o.skipped.items()), *([o.reason] if o.reason else [])])
    checked = "" if o.checked is None else f"{o.checked:.1g}"
    return f"| {o.model_type} | {o.status} | {checked} | {why.replace('|', '/')} | {values} |"


def summary(outcomes: Sequence[Outcome]) -> str:
    """A count of each status."""
    counts = {status: sum(o.status == status for o in outcomes) for status in ("runs", "refused", "not small")}
    return (f"{counts['runs']} run, {counts['refused']} refused, {counts['not small']} could not be built small "
            f"(of {len(outcomes)} decoder-only model types).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", nargs="*", help="model types (default: every decoder-only type)")
    parser.add_argument("--docs", type=int, default=4, help="documents of the task per model (default 4)")
    parser.add_argument("--check", action="store_true", help="check each run's per-document values independently")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    outcomes = []
    print(f"transformers {transformers.__version__}, torch {torch.__version__}\n\n{TABLE_HEADER}", flush=True)
    for model_type in args.types or decoder_only_types():
        outcome = outcome_of(model_type, docs=args.docs, check=args.check)
        print(table_row(outcome), flush=True)  # row by row: an interrupted run keeps what it measured
        outcomes.append(outcome)
    print(f"\n{summary(outcomes)}")
    failed = [o.model_type for o in outcomes if o.checked is not None and not o.checked <= CHECK_TOLERANCE]
    if failed:
        print(f"\nper-document values differ from the independent computation: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
