"""The one place that knows where each architecture keeps its final norm, unembedding and logit transform.

Hugging Face ``hidden_states`` has L+1 entries: ``[0]`` the embedding output, ``[1..L-1]`` raw block
outputs and ``[L]`` already *post* final norm. The logit-lens readout of layer l is therefore
``g(lm_head(final_norm(h_l)))`` for l < L and ``g(lm_head(h_L))`` for l = L, where g is the model's
logit transform (Gemma-2/3 soft-capping ``c·tanh(z/c)``; identity elsewhere).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ArchitectureSpec:
    """Where a ``*ForCausalLM`` keeps its parts.

    Attributes:
        final_norm: dotted attribute path of the final norm from the causal-LM module.
        blocks: dotted attribute path of the list of decoder blocks.
        softcap_attr: config attribute holding the final-logit soft-capping constant (or ``None``).
    """

    final_norm: str
    blocks: str
    softcap_attr: str | None = None


_DECODER = ArchitectureSpec("model.norm", "model.layers")
_SOFTCAPPED = ArchitectureSpec("model.norm", "model.layers", "final_logit_softcapping")

ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "llama": _DECODER,
    "mistral": _DECODER,
    "qwen2": _DECODER,
    "qwen3": _DECODER,
    "phi3": _DECODER,
    "olmo2": _DECODER,
    "gemma": _DECODER,
    "gemma2": _SOFTCAPPED,
    "gemma3_text": _SOFTCAPPED,
    "gpt2": ArchitectureSpec("transformer.ln_f", "transformer.h"),
    "gpt_neox": ArchitectureSpec("gpt_neox.final_layer_norm", "gpt_neox.layers"),
}
"""``config.model_type`` → parts. Add a row here (and a tiny-config test) to support a new family."""


class UnsupportedModelError(ValueError):
    """The model's architecture is not in :data:`ARCHITECTURES`."""


def architecture_of(model: nn.Module) -> ArchitectureSpec:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"hf-probes does not know where model_type {model_type!r} keeps its final norm and unembedding. "
            f"Supported: {', '.join(sorted(ARCHITECTURES))}. Add a row to lm_eval_probes.architectures.ARCHITECTURES."
        )
    return ARCHITECTURES[model_type]


def _get_path(root: nn.Module, path: str) -> nn.Module:
    obj: object = root
    for part in path.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, nn.Module):
        raise UnsupportedModelError(f"{type(root).__name__}.{path} is not a module")
    return obj


class LensReadout:
    """Logit-lens readout of a causal LM: hidden state of any layer → log-probabilities.

    Holds the final norm, the unembedding ``W [V, d]`` (a float32 copy when the model is in lower
    precision, made once), its bias, the soft-capping constant and cached squared row norms ‖w_i‖².
    """

    def __init__(self, model: nn.Module) -> None:
        spec = architecture_of(model)
        self.num_layers = len(_get_path(model, spec.blocks))
        self.final_norm = _get_path(model, spec.final_norm)
        norm_params = list(self.final_norm.parameters())
        self._norm_device = norm_params[0].device if norm_params else torch.device("cpu")
        head = model.get_output_embeddings()
        if not isinstance(head, nn.Linear):
            raise UnsupportedModelError(f"expected an nn.Linear output embedding, got {type(head).__name__}")
        self.device = head.weight.device
        self.unembed = head.weight.detach().float()
        self.bias = None if head.bias is None else head.bias.detach().float()
        softcap = getattr(model.config, spec.softcap_attr, None) if spec.softcap_attr else None
        self.logit_softcap: float | None = float(softcap) if softcap else None
        self.row_sq_norms = self.unembed.double().pow(2).sum(-1)

    @functools.cached_property
    def unembed64(self) -> torch.Tensor:
        """A float64 copy of W, made once on first use (δ_TCB reduces in float64: 8·V·d bytes)."""
        return self.unembed.double()

    @property
    def vocab_size(self) -> int:
        return self.unembed.shape[0]

    def logits(self, hidden: torch.Tensor, *, normalized: bool) -> torch.Tensor:
        """``[..., d]`` → float32 logits ``[..., V]``; ``normalized`` says the final norm is already applied."""
        if not normalized:
            hidden = self.final_norm(hidden.to(self._norm_device))
        hidden = hidden.to(self.device)
        logits = torch.nn.functional.linear(hidden.float(), self.unembed, self.bias)
        if self.logit_softcap is not None:
            logits = self.logit_softcap * torch.tanh(logits / self.logit_softcap)
        return logits

    def logprobs(self, hidden: torch.Tensor, *, normalized: bool) -> torch.Tensor:
        return torch.log_softmax(self.logits(hidden, normalized=normalized), dim=-1)
