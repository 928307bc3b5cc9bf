"""The whole-forward captures, registered by name: what a probe asks of the wrappers beyond the states at a
response's positions.

A probe asks for one with an attribute of its :class:`~lm_eval_probes.api.PositionProbe` named after it (``None`` or
absent: not asked; at most one enabled probe asks for each). A :class:`WholeForwardCapture` says what the wrappers set
up for it on the loaded model (``set_up``: may refuse the model with
:class:`~lm_eval_probes.capture.parts.UnsupportedModelError`), what it does in their calls (``calls``: its hooks, an object with
the methods it needs, :class:`~lm_eval_probes.capture.calls.CallCaptures` lists them) and whether it needs an
autoregressive model's blocks (``hf-probes-diffusion`` then refuses, or skips, the probe). The four built-ins, in
this order (their hooks: :mod:`~lm_eval_probes.capture.builtin_hooks`):

* ``prompt_means`` (:class:`~lm_eval_probes.api.PromptMeans`) — the mean states over each request's prompt;
* ``focal_depth`` (:class:`~lm_eval_probes.api.FocalDepth`) — set up as the model's self-checked
  :class:`~lm_eval_probes.capture.readouts.FocalDepthDecoder`;
* ``first_attention`` (:class:`~lm_eval_probes.api.FirstAttention`) — set up as the model's
  :class:`~lm_eval_probes.capture.attention.FirstAttentionCapture`;
* ``states_folder`` — a folder where the wrappers write the prompt-means probe's states (set up as its
  :class:`~lm_eval_probes.capture.saved_states.StatesWriter`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lm_eval_probes.api import Shapes
from lm_eval_probes.config import ProbeConfig

__all__ = ["InCalls", "SetUp", "WholeForwardCapture", "capture_named", "register_capture", "registered_captures"]


@dataclass(frozen=True)
class SetUp:
    """What a capture's set-up reads at load: the loaded ``model``, its lens ``readout``, the probe ``config``, the
    model's :class:`~lm_eval_probes.api.Shapes` of a one-token forward (``shapes``: its widths and dtype) and the
    process's ``rank``."""

    model: Any
    readout: Any
    config: ProbeConfig
    shapes: Shapes | None
    rank: int = 0


@dataclass(frozen=True)
class InCalls:
    """What a capture's hooks in the wrappers' calls are built from, once at load: what its set-up ``held``, the
    ``request`` of the ``probe`` that asked for it, ``decode`` (a token id → its text) and ``traces``
    (``probe_traces=true``)."""

    held: Any
    request: Any
    probe: str
    decode: Callable[[int], str] | None = None
    traces: bool = False


@dataclass(frozen=True)
class WholeForwardCapture:
    """One kind of whole-forward capture: ``name`` (the position probe's attribute that asks for it), ``set_up``
    (``(request, SetUp) -> what the wrappers hold for it``, at load; ``None``: nothing to set up), ``calls``
    (``InCalls -> its hooks in the wrappers' calls``: an object with any of the methods that
    :class:`~lm_eval_probes.capture.calls.CallCaptures` calls; ``None``: none) and ``autoregressive`` (it re-runs or
    hooks an autoregressive model's blocks)."""

    name: str
    set_up: Callable[[Any, SetUp], Any] | None = None
    autoregressive: bool = False
    calls: Callable[[InCalls], Any] | None = None


_REGISTERED: dict[str, WholeForwardCapture] = {}


def register_capture(capture: WholeForwardCapture) -> WholeForwardCapture:
    """Register ``capture`` under its name (after the ones registered before it); ``ValueError`` for a name taken."""
    if capture.name in _REGISTERED:
        raise ValueError(f"a whole-forward capture named {capture.name!r} is registered already")
    _REGISTERED[capture.name] = capture
    return capture


def registered_captures() -> tuple[WholeForwardCapture, ...]:
    """Every registered whole-forward capture, in registration order."""
    return tuple(_REGISTERED.values())


def capture_named(name: str) -> WholeForwardCapture:
    return _REGISTERED[name]


def _focal_decoder(request: Any, setup: SetUp) -> Any:
    """The focal-depth capture's decoder of this model, self-checked (its re-run blocks reproduce their own output)."""
    from lm_eval_probes.capture.readouts import FocalDepthDecoder

    widths = setup.shapes
    decoder = FocalDepthDecoder(
        setup.model, setup.readout, depth=request.depth, source_layers=request.source_layers, top_k=request.top_k,
        chunk_tokens=request.tokens_per_chunk(widths.width, widths.ffn, widths.dtype_bytes),
        chunk_positions=setup.config.chunk_positions,
    )
    decoder.check()
    return decoder


def _first_attention(request: Any, setup: SetUp) -> Any:
    """The first softmax-attention layer's capture of this model."""
    from lm_eval_probes.capture.attention import FirstAttentionCapture

    return FirstAttentionCapture(setup.model)


def _states_writer(folder: str, setup: SetUp) -> Any:
    """The writer of the prompt-means probe's states of every answered request into ``folder``
    (``probe_save_states``)."""
    from lm_eval_probes.capture.saved_states import states_writer

    return states_writer(folder, setup.rank)


def _calls(kind: str) -> Callable[[InCalls], Any]:
    """The hooks in the wrappers' calls of a built-in capture: the class ``kind`` of :mod:`.builtin_hooks` (imported
    when the wrappers build them)."""

    def build(context: InCalls) -> Any:
        from lm_eval_probes.capture import builtin_hooks

        return getattr(builtin_hooks, kind)(context)

    return build


register_capture(WholeForwardCapture("prompt_means", calls=_calls("PromptMeansHooks")))
register_capture(WholeForwardCapture("focal_depth", set_up=_focal_decoder, autoregressive=True,
                                     calls=_calls("FocalDepthHooks")))
register_capture(WholeForwardCapture("first_attention", set_up=_first_attention, autoregressive=True,
                                     calls=_calls("FirstAttentionHooks")))
register_capture(WholeForwardCapture("states_folder", set_up=_states_writer, calls=_calls("StatesFolderHooks")))
