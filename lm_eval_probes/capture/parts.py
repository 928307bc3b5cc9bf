"""Where a decoder-only causal LM keeps the parts the lens reads, found from transformers' conventions.

A ``*ForCausalLM`` of transformers keeps its decoder under ``model.base_model`` (its ``base_model_prefix``): the
blocks as a list (``layers``, ``h``, ``blocks``, …), the final norm by a conventional name (``norm``, ``ln_f``,
``final_layernorm``, …), and the unembedding as ``get_output_embeddings()``. What the forward does to the logits after
the unembedding is read from the config: a multiplier (Cohere's ``logit_scale``, Falcon-H1's ``lm_head_multiplier``),
a divider (Granite's ``logits_scaling``) and Gemma's final soft-capping ``c·tanh(z/c)``.

:data:`ARCHITECTURES` lists only the families that break these conventions. Whatever is found is checked against the
model's own log-probabilities at load (:func:`check_lens`), so a wrong reading is never silent.

A model that merges several residual streams before its final norm by a module of its own (DeepSeek-V4's ``hc_head``)
has that module found at load; one that merges them in its forward's own code has the same computation here, run on
the model's own modules and weights (:data:`STREAM_MERGES`: Gemma-3n's AltUp), and checked at load like every lens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


class UnsupportedModelError(ValueError):
    """The model's parts cannot be found, or what was found does not reproduce the model's own output."""


@dataclass(frozen=True)
class ArchitectureSpec:
    """Where a ``*ForCausalLM`` keeps its parts: dotted attribute paths from the causal-LM module.

    Attributes:
        final_norm: the final norm (its input is the last block's output; its output is what the unembedding reads);
            ``""`` where the model has none (blocks that normalise their own output: GPT-1, TrOCR, BERT-generation),
            and the unembedding reads the last block's output.
        blocks: the list of decoder blocks, in order.
        stacks: further lists of blocks the model runs beside :attr:`blocks` (HRM's high-level stack beside its
            low-level one, each run in loops): their blocks follow :attr:`blocks`' (:func:`blocks_of`).
    """

    final_norm: str
    blocks: str
    stacks: tuple[str, ...] = ()


ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "opt": ArchitectureSpec("model.decoder.final_layer_norm", "model.decoder.layers"),
}
"""``config.model_type`` → parts, for the families whose parts the conventions do not find (:func:`architecture_of`)."""

FINAL_NORM_NAMES: tuple[str, ...] = ("norm", "final_layernorm", "final_layer_norm", "ln_f", "norm_f", "final_norm",
                                     "ln_final", "final_ln", "ln_out", "layer_norm", "embedding_norm", "layernorm")
"""Attribute names of the final norm under ``model.base_model``, in the order they are tried."""

BLOCK_LIST_NAMES: tuple[str, ...] = ("layers", "h", "blocks", "block", "layer")
"""Attribute names of the block list under ``model.base_model``, in the order they are tried."""

LOGIT_MULTIPLIERS: tuple[str, ...] = ("logit_scale", "lm_head_multiplier")
"""Config attributes the logits are multiplied by after the unembedding (Cohere, Falcon-H1)."""

LOGIT_DIVIDERS: tuple[str, ...] = ("logits_scaling", "logits_mup_width_multiplier")
"""Config attributes the logits are divided by after the unembedding (Granite; Inkling divides the final states)."""

MULTIPLIED_BY: dict[str, tuple[str, ...]] = {"hyperclovax": ("logits_scaling",)}
"""``model_type`` → config attributes of :data:`LOGIT_DIVIDERS` that this family multiplies its logits by instead
(HyperCLOVA X's μP ``logits_scaling``; Granite divides by it)."""

LOGIT_SOFTCAPS: tuple[str, ...] = ("final_logit_softcapping", "logits_soft_cap", "output_logit_soft_cap")
"""Config attributes holding the final soft-capping constant c of g(z) = c·tanh(z/c) (Gemma-2/3, RecurrentGemma, xLSTM)."""


def model_type_of(model: nn.Module) -> str | None:
    return getattr(getattr(model, "config", None), "model_type", None)


def _path_of(model: nn.Module, target: nn.Module) -> str:
    for name, module in model.named_modules():
        if module is target:
            return name
    raise UnsupportedModelError(f"{type(target).__name__} is not a submodule of {type(model).__name__}")


def architecture_of(model: nn.Module) -> ArchitectureSpec:
    """The parts of ``model``: its :data:`ARCHITECTURES` row, else found under ``model.base_model`` (or one level below
    it) by the conventional names (:data:`FINAL_NORM_NAMES`, :data:`BLOCK_LIST_NAMES`; no final norm by those names:
    ``final_norm=""``, the head reads the last block's output, or :func:`~lm_eval_probes.capture.readouts.check_lens`
    finds the module between them); a block list of the same blocks under another child of the base is a further
    stack (HRM's; ``final_norm=""``: each stack has its own norm, the final one is found by ``check_lens``);
    :class:`UnsupportedModelError` (one line, naming the model type and what is missing) when no block list is
    found."""
    model_type = model_type_of(model)
    if model_type in ARCHITECTURES:
        return ARCHITECTURES[model_type]
    bases = [base for base in (getattr(model, "base_model", None), getattr(model, "model", None))
             if isinstance(base, nn.Module)]
    bases += [child for base in list(bases) for child in base.children()  # one level down: TrOCR's model.decoder
              if not isinstance(child, (nn.ModuleList, nn.Embedding)) and child not in bases]
    blocks = next((getattr(base, name) for base in bases for name in BLOCK_LIST_NAMES
                   if isinstance(getattr(base, name, None), nn.ModuleList) and len(getattr(base, name))), None)
    if blocks is None:
        raise UnsupportedModelError(
            f"model_type {model_type!r}: {type(model).__name__} keeps no block list under model.base_model by any of "
            f"the names {', '.join(BLOCK_LIST_NAMES)}; add a row to lm_eval_probes.capture.parts.ARCHITECTURES")
    base = next(base for base in bases if any(child is blocks for child in base.children()))
    stacks = [getattr(other, name) for other in bases if other is not base for name in BLOCK_LIST_NAMES
              if isinstance(getattr(other, name, None), nn.ModuleList) and len(getattr(other, name))
              and type(getattr(other, name)[0]) is type(blocks[0])]
    if stacks:  # several stacks of the same blocks (HRM's): the final norm is the module its head reads (check_lens)
        paths = tuple(dict.fromkeys(_path_of(model, stack) for stack in stacks))
        return ArchitectureSpec("", _path_of(model, blocks), paths)
    norm = next((getattr(base, name) for name in FINAL_NORM_NAMES if isinstance(getattr(base, name, None), nn.Module)),
                None)
    if norm is None:  # none by name: the head reads the last block's output (check_lens refuses a model that normalises)
        return ArchitectureSpec("", _path_of(model, blocks))
    return ArchitectureSpec(_path_of(model, norm), _path_of(model, blocks))


def blocks_of(model: nn.Module, spec: ArchitectureSpec | None = None) -> list[nn.Module]:
    """The blocks of ``model`` (of ``spec``, default :func:`architecture_of`): those of its block list, then those of
    each further stack."""
    spec = architecture_of(model) if spec is None else spec
    return [block for path in (spec.blocks, *spec.stacks) for block in get_path(model, path)]


def get_path(root: nn.Module, path: str) -> nn.Module:
    """The submodule at dotted ``path`` (list items by index)."""
    obj: object = root
    for part in path.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, nn.Module):
        raise UnsupportedModelError(f"{type(root).__name__}.{path} is not a module")
    return obj


@dataclass(frozen=True)
class LogitTransform:
    """What the model's forward does to ``W h + b``: logits = g(scale · (W h + b)), g the soft-capping
    ``c·tanh(z/c)`` (``softcap`` c; the identity when ``None``)."""

    scale: float = 1.0
    softcap: float | None = None


def logit_transform_of(config: Any) -> LogitTransform:
    """The :class:`LogitTransform` a model's (text) config declares (:data:`LOGIT_MULTIPLIERS`,
    :data:`LOGIT_DIVIDERS` but those :data:`MULTIPLIED_BY` names for its family, :data:`LOGIT_SOFTCAPS`; a ``None`` or 0
    soft-capping is none)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    scale = 1.0
    multiplied = MULTIPLIED_BY.get(getattr(text, "model_type", None), ())
    for name in (*LOGIT_MULTIPLIERS, *multiplied):
        value = getattr(text, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            scale *= float(value)
    for name in LOGIT_DIVIDERS:
        value = getattr(text, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value and name not in multiplied:
            scale /= float(value)
    softcap = next((float(v) for v in (getattr(text, name, None) for name in LOGIT_SOFTCAPS) if v), None)
    return LogitTransform(scale, softcap)


def altup_merge(model: nn.Module, streams: torch.Tensor) -> torch.Tensor:
    """Gemma-3n's merge of its AltUp streams after its last block, as ``Gemma3nTextModel.forward`` writes it, on the
    model's own ``altup_unembed_projections``: ``streams [..., n, d]`` (stream 0 the active one) → ``[..., d]``, the
    mean of stream 0 and of each other stream i projected by the model's (i − 1)-th unembedding projection and
    rescaled to stream 0's root-mean-square (the projection's own clamped at 1e-5 before its square root).

    Alternating Updates (Baykal et al., 2023, https://arxiv.org/abs/2301.13310) as Gemma-3n's forward writes it."""
    owner = next((m for m in model.modules() if isinstance(getattr(m, "altup_unembed_projections", None), nn.ModuleList)),
                 None)
    if owner is None:
        raise UnsupportedModelError(f"{type(model).__name__} keeps no altup_unembed_projections to merge its streams by")
    first = streams[..., 0, :]
    target = torch.mean(first**2, dim=-1, keepdim=True) ** 0.5
    merged = [first]
    for index, projection in enumerate(owner.altup_unembed_projections, start=1):
        projected = projection(streams[..., index, :]).to(dtype=first.dtype, device=target.device)
        magnitude = torch.sqrt(torch.mean(projected**2, dim=-1, keepdim=True).clamp(min=1e-5))
        merged.append(projected * target / magnitude)
    return torch.mean(torch.stack(merged), dim=0)


StreamMerge = Callable[[nn.Module, torch.Tensor], torch.Tensor]
"""``(model, streams [..., n, d]) → [..., d]``: a model's merge of its residual streams before its final norm."""

STREAM_MERGES: dict[str, StreamMerge] = {"gemma3n_text": altup_merge}
"""``model_type`` → the merge its forward's own code does before the final norm (no module of the model does it), for
the families whose blocks carry several residual streams; :func:`~lm_eval_probes.capture.readouts.check_lens` checks
it against the model's own log-probabilities."""
