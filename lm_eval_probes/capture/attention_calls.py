"""Transformers' attention interface, recorded: what the first softmax-attention layer of a model hands its attention
function, and which layer that is (the discovery of :class:`~lm_eval_probes.capture.attention.FirstAttentionCapture`).

Read through transformers' attention interface (``AttentionInterface``, its public extension point): every
attention module of a current transformers model hands its queries, keys and values to the function registered under
its ``config._attn_implementation`` (``eager`` falls back to the module's own; transformers 4.57 calls it without the
interface). A recording function is registered there once, under a name of the plugin's (:data:`RECORDING`).
For a short while — a few forwards of a handful of tokens at load, each stopped at that call
(:func:`first_softmax_attention`: the first module that calls it is the first softmax-attention layer;
linear-attention and SSM layers of a hybrid do not), and each re-run below — :func:`attention_calls_recorded` hands
the modules it records (all of the model's, or the layer's) a copy of their config that names it, then gives them
their own back. The model's own config is left as it is, so transformers builds the attention masks of the model's
implementation, and the name reads as that implementation's wherever the layer's code tests it (DeepSeek-V3.2 folds
its indexer's selection into the mask for ``eager`` and ``sdpa`` only): only the interface's lookup finds the
recording function (:class:`_RecordedName`). The harness's own forwards run untouched: a pre-hook on the layer
(:meth:`FirstAttentionCapture.capture`) only keeps its arguments.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["RECORDING", "AttentionCall", "attention_calls_recorded", "first_softmax_attention", "stopped",
           "token_ids"]


@dataclass
class AttentionCall:
    """What the attention interface was handed: ``queries [B, H, T, p]``, ``keys [B, KV, T, p]``, the logit
    ``scaling`` (``None``: p^-½), ``softcap`` (logits c·tanh(z/c); ``None``: none), ``sliding_window`` (s attended
    from t only when t − s < W; ``None``: none), its attention sinks (``s_aux``: one logit per head that takes part
    in the softmax and has no value: ``[H]`` one per head, gpt-oss's ``s_aux``, or ``[B, H, T, 1]`` one per query,
    Inkling-2's ``sinks``; ``None``: none), the ``mask`` it was handed (bool: attended; float: added to the logits;
    ``None``: causal only, or a mask of another kind) and its ``bias`` (``[B, H, T, S]`` added to the logits before
    the mask, Inkling's ``position_bias``, which its layer computes from each query's input; ``None``: none)."""

    module: nn.Module
    queries: torch.Tensor
    keys: torch.Tensor
    scaling: float | None
    softcap: float | None
    sliding_window: int | None
    sinks: torch.Tensor | None
    mask: torch.Tensor | None = None
    bias: torch.Tensor | None = None


class _Stop(Exception):
    """Ends a forward at its first attention call."""


RECORDING = "lm_eval_probes.recording"
"""The name of the recording attention function in transformers' ``AttentionInterface`` (registered once, at the first
:func:`attention_calls_recorded`)."""

_recorder: ContextVar[tuple[Callable[[AttentionCall], None], bool] | None] = ContextVar("_recorder", default=None)
"""What the innermost :func:`attention_calls_recorded` block records with, and whether it stops the forward."""


def _recording(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The attention function registered as :data:`RECORDING`: hands its call to the innermost
    :func:`attention_calls_recorded` block's ``record``, then returns zeros, or with ``stop`` ends the forward."""
    recorder = _recorder.get()
    if recorder is None:
        raise RuntimeError(f"the attention implementation {RECORDING!r} records calls only inside "
                           "attention_calls_recorded()")
    record, stop = recorder
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))
    bias = kwargs.get("position_bias")
    record(AttentionCall(module, query, key, scaling, kwargs.get("softcap"), kwargs.get("sliding_window"),
                         sinks if isinstance(sinks, torch.Tensor) else None,
                         attention_mask if isinstance(attention_mask, torch.Tensor) else None,
                         bias if isinstance(bias, torch.Tensor) else None))
    if stop:
        raise _Stop
    batch, _, length, _ = query.shape
    return query.new_zeros(batch, length, query.shape[1], value.shape[-1]), None


@functools.cache
def _registered() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(RECORDING, _recording)


class _RecordedName(str):
    """A module's ``config._attn_implementation`` while its calls are recorded. Its text is the name of the model's
    own implementation, so every test the module's code makes of the name (``== "sdpa"``, ``in ("eager", "sdpa")``:
    DeepSeek-V3.2's indexer folds its selection into the mask for these only; ``"flash" in``) takes the branch it takes
    unrecorded; it hashes as, and equals, :data:`RECORDING` too, so the attention interface's lookup by the name
    (``get_interface(name, eager_attention_forward)``, ``ALL_ATTENTION_FUNCTIONS[name]``) finds the recording
    function (a dict or set looked up by it finds :data:`RECORDING` only: the mask functions have none, so a mask
    built by a module's own config while it is recorded is none; the models' masks are built by the model's config,
    :func:`_switch_configs`)."""

    def __hash__(self) -> int:
        return hash(RECORDING)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and (str.__eq__(other, RECORDING) or str.__eq__(self, other))

    def __ne__(self, other: object) -> bool:
        return not self == other


def _switch_configs(root: nn.Module, switched: list[tuple[nn.Module, Any]]) -> None:
    """Give each module of ``root`` (itself and its submodules) that keeps a transformers config a shallow copy of it
    whose ``_attn_implementation`` is a :class:`_RecordedName`, one copy per config, and append the module with its
    own config to ``switched`` (for :func:`attention_calls_recorded` to give back). A ``PreTrainedModel`` keeps its
    own: transformers builds the attention masks by its config's name."""
    from transformers import PretrainedConfig, PreTrainedModel

    views: dict[int, Any] = {}
    for module in root.modules():
        config = vars(module).get("config")
        if isinstance(module, PreTrainedModel) or not isinstance(config, PretrainedConfig):
            continue
        if id(config) not in views:
            view = copy.copy(config)
            # the dict form sets this config's name alone: its sub-configs are the model's own
            view._attn_implementation = {"": _RecordedName(config._attn_implementation or "eager")}
            views[id(config)] = view
        switched.append((module, config))
        module.config = views[id(config)]


@contextmanager
def attention_calls_recorded(root: nn.Module, record: Callable[[AttentionCall], None], *,
                             stop: bool = False) -> Iterator[None]:
    """While the block runs, every module of ``root`` that calls transformers' attention interface calls the function
    registered as :data:`RECORDING` instead, which records the call with ``record`` and returns zeros (``stop``: ends
    the forward instead): each module's config is a copy that names it (:func:`_switch_configs`); the model's own
    config, and so its attention masks, stay as they are. The modules get their own configs back when the block ends."""
    _registered()
    switched: list[tuple[nn.Module, Any]] = []
    token = _recorder.set((record, stop))
    try:
        _switch_configs(root, switched)
        yield
    finally:
        _recorder.reset(token)
        for module, config in switched:
            module.config = config


def stopped(run: Callable[[], Any]) -> None:
    """``run()`` inside :func:`attention_calls_recorded` with ``stop``: ends at the attention call."""
    try:
        run()
    except _Stop:
        pass


def token_ids(model: nn.Module, rows: int, length: int) -> torch.Tensor:
    """``[rows, length]`` token ids of ``model``'s vocabulary (1, 2, …; never 0) for the forwards at load."""
    device = next(model.parameters()).device
    vocab = model.config.get_text_config().vocab_size
    return (torch.arange(1, length + 1, device=device) % (vocab - 1) + 1).expand(rows, length).contiguous()


@torch.no_grad()
def first_softmax_attention(model: nn.Module) -> nn.Module | None:
    """The first module of ``model`` that calls the attention interface in a two-token forward (``None``: none
    does — no softmax attention, or attention written without the interface)."""
    found: list[nn.Module] = []
    with attention_calls_recorded(model, lambda call: found.append(call.module), stop=True):
        stopped(lambda: model(input_ids=token_ids(model, 1, 2), use_cache=False))
    return found[0] if found else None
