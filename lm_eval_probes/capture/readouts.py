"""The logit lens of a causal LM and the re-run of its last blocks (HyperLens Ω).

Hugging Face ``hidden_states`` has L+1 entries: ``[0]`` the embedding output, ``[1..L-1]`` raw block
outputs and ``[L]`` already *post* final norm. The logit-lens readout of layer l is therefore
``g(s · lm_head(final_norm(h_l)))`` for l < L and ``g(s · lm_head(h_L))`` for l = L, where s is the model's logit
scale and g its soft-capping (:class:`~lm_eval_probes.capture.parts.LogitTransform`; identity for most families).
Where a model keeps those parts is found by :mod:`lm_eval_probes.capture.parts`, and checked at load against the
model's own log-probabilities (:func:`check_lens`).

:class:`FocalDepthDecoder` decodes a layer's states at focal depth m (HyperLens Ω): through the model's own
last m blocks, with the block arguments (mask, rotary embeddings, position ids) its hooks captured during
the model's own forward, then the :class:`LensReadout`.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections import UserDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lm_eval_probes.capture.forward_replay import ForwardReplay, block_calls, output_state
from lm_eval_probes.capture.parts import (
    ARCHITECTURES,
    FINAL_NORM_NAMES,
    STREAM_MERGES,
    ArchitectureSpec,
    UnsupportedModelError,
    architecture_of,
    blocks_of,
    get_path,
    logit_transform_of,
    model_type_of,
)
from lm_eval_probes.stack_api import learn_hidden_states_selection, read_states_through
from lm_eval_probes.probes import RowBlocks, squared_row_norms, top_k_mass

__all__ = ["ARCHITECTURES", "ArchitectureSpec", "BlockInputs", "FocalDepthDecoder", "LensReadout",
           "UnsupportedModelError", "architecture_of", "check_lens"]


class LensReadout:
    """Logit-lens readout of a causal LM: hidden state of any layer → log-probabilities.

    Holds the final norm, the unembedding ``W [V, d]`` (the model's own tensor, in the model's dtype) and
    :attr:`rows`, W read in float32 (a bfloat16 W is converted a block of rows at a time into one reused 64 MiB
    buffer: no float32 copy of W, which would take 4·V·d bytes, 1.96 GiB for Llama-3-8B), its bias, the
    soft-capping constant and cached squared row norms ‖w_i‖².
    """

    def __init__(self, model: nn.Module) -> None:
        spec = architecture_of(model)
        self.model_type = model_type_of(model)
        self.num_layers = len(blocks_of(model, spec))
        self.num_blocks = self.num_layers
        """The model's blocks (:attr:`num_layers` counts their passes: more in a looped model)."""
        self.passes: tuple[int, ...] = tuple(range(self.num_blocks))
        """The block of each pass, in the order the forward runs them (found by :func:`check_lens`): block k more than
        once in a looped model (Dory), whose ``hidden_states`` then hold one state per pass."""
        self.final_norm = get_path(model, spec.final_norm) if spec.final_norm else nn.Identity()
        """The final norm (an identity where the model has none: the head reads the last block's output)."""
        self.has_final_norm = bool(spec.final_norm)
        self.last_block = blocks_of(model, spec)[-1]
        norm_params = list(self.final_norm.parameters())
        self._norm_device = norm_params[0].device if norm_params else torch.device("cpu")
        head = model.get_output_embeddings()
        if not isinstance(head, nn.Linear):
            raise UnsupportedModelError(f"model_type {self.model_type!r}: expected an nn.Linear output embedding, got "
                                        f"{type(head).__name__}")
        self.device = head.weight.device
        self.unembed = head.weight.detach()
        self.rows = RowBlocks(self.unembed, torch.float32)
        self.bias = None if head.bias is None else head.bias.detach().float()
        transform = logit_transform_of(model.config)
        self.logit_scale: float = transform.scale
        """s of logits = g(s · (W h + b)) (1 for most families)."""
        self.logit_softcap: float | None = transform.softcap
        self.row_sq_norms = squared_row_norms(self.unembed)  # in float64, without a float64 copy of W
        self.merge: Callable[[torch.Tensor], torch.Tensor] | None = None
        """The model's own merge of several residual streams before its final norm, ``[1, n, *stream_shape] → [1, n,
        d]``, found and checked at load by :func:`check_lens`: the module the final norm's input comes from
        (DeepSeek-V4's and HY-V4's ``hc_head``: :attr:`merge_module`), or the merge its forward's own code does run on
        its own modules (:data:`~lm_eval_probes.capture.parts.STREAM_MERGES`: Gemma-3n's AltUp); ``None``: the blocks'
        states are what the final norm reads."""
        self.merge_module: nn.Module | None = None
        """:attr:`merge` where it is a module of the model (whose input is the last block's output)."""
        self.stream_shape: tuple[int, ...] = ()
        """A block's state per token where :attr:`merge` is set (``(streams, d)``)."""
        self.head_transform: nn.Module | None = None
        """The module between the final norm and the unembedding, where the model has one (ModernBERT-decoder's
        prediction head: dense, activation, norm), found and checked at load by :func:`check_lens`: the lens reads
        ``W · head_transform(final_norm(h))``, and ``hidden_states[L]`` (the final norm's output) through it."""
        self.prepended = 0
        """Positions the model puts before the sequence's own in its blocks and drops before its head (CPM-Ant's
        prompt), found by :func:`check_lens`: the blocks' states there are not the sequence's."""
        self.streams_first = False
        """Whether the blocks keep their streams before the batch (Gemma-3n's ``[streams, B, T, d]``): the forward's
        states are then read batch first, ``[B, T, streams, d]`` (:meth:`batch_first`, :meth:`own_states`)."""
        self.last_state_is_block_output = False
        """Whether the forward's ``hidden_states[L]`` is the last block's output (its streams) rather than the final
        norm's output (Gemma-3n's): :meth:`own_states` then reads it out through the merge and the final norm."""

    def use_final_norm(self, norm: nn.Module) -> None:
        """Read through ``norm`` as the final norm (found by :func:`check_lens` where the conventional names find none:
        the module between the last block and the head)."""
        self.final_norm, self.has_final_norm = norm, True
        parameters = list(norm.parameters())
        self._norm_device = parameters[0].device if parameters else self._norm_device

    @property
    def looped(self) -> bool:
        """Whether a block runs more than once in a forward (:attr:`passes`)."""
        return len(self.passes) != self.num_blocks

    def layer_names(self) -> list[str]:
        """The name of each ``hidden_states`` index: ``embeddings``, then each block's output by its index, with its
        pass where the model runs a block more than once (``block 1, pass 2``)."""
        seen: dict[int, int] = {}
        names = ["embeddings"]
        for block in self.passes:
            seen[block] = seen.get(block, 0) + 1
            names.append(f"block {block}" + (f", pass {seen[block]}" if self.passes.count(block) > 1 else ""))
        return names

    @property
    def lens_input(self) -> nn.Module | None:
        """The module of the model whose input is the last block's output: the stream merge where the model has one as
        a module, else the final norm; ``None`` where none is (no final norm, or a merge in the forward's own code)."""
        if self.merge is not None:
            return self.merge_module
        return self.final_norm if self.has_final_norm else None

    def batch_first(self, states: torch.Tensor) -> torch.Tensor:
        """A block's states as the lens reads them, ``[B, T, *stream_shape]`` (a view): the streams moved after the
        positions where the blocks keep them first (:attr:`streams_first`); unchanged otherwise."""
        return states.movedim(0, -2) if self.streams_first else states

    def block_layout(self, states: torch.Tensor) -> torch.Tensor:
        """:meth:`batch_first`'s inverse: ``[B, T, *stream_shape]`` → the layout the blocks take."""
        return states.movedim(-2, 0) if self.streams_first else states

    def own_states(self, hidden_states: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor | None, ...]:
        """A forward's L + 1 ``hidden_states`` (``None`` where not kept) as every probe reads them: each block's
        :meth:`batch_first`, and ``[L]`` the final norm's output where the forward gives the last block's instead
        (:attr:`last_state_is_block_output`: read out here through the model's own merge and final norm, as the
        model does), through the prediction head where the model has one (:attr:`head_transform`: ``[L]`` is then
        what the unembedding reads)."""
        states = [None if state is None else self.batch_first(state) for state in hidden_states]
        if self.last_state_is_block_output and states[-1] is not None:
            last = states[-1]
            states[-1] = self.final_norm(self.merged(last.to(self._norm_device)))
        if self.head_transform is not None and states[-1] is not None:
            states[-1] = self.head_transform(states[-1])
        return tuple(states)

    @property
    def reads_own_states(self) -> bool:
        """Whether the forward's ``hidden_states`` must go through :meth:`own_states` before a probe reads them."""
        return self.streams_first or self.last_state_is_block_output or self.head_transform is not None

    def merged(self, hidden: torch.Tensor) -> torch.Tensor:
        """Block states ``[..., *stream_shape]`` → ``[..., d]`` through the model's own :attr:`merge` (called as the
        model calls it, on ``[1, n, *stream_shape]``: the merge works token by token); unchanged without one."""
        if self.merge is None:
            return hidden
        lead = hidden.shape[: hidden.ndim - len(self.stream_shape)]
        if tuple(hidden.shape[len(lead):]) != self.stream_shape:
            raise ValueError(f"the lens reads block states [..., {', '.join(map(str, self.stream_shape))}] of model_type "
                             f"{self.model_type!r}, got {tuple(hidden.shape)}")
        merged = self.merge(hidden.reshape(1, -1, *self.stream_shape).to(self._norm_device))
        return merged.reshape(*lead, merged.shape[-1])

    @property
    def vocab_size(self) -> int:
        return self.unembed.shape[0]

    def logits(
        self, hidden: torch.Tensor, *, normalized: bool, capped: bool = True, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[..., d]`` → float32 logits ``[..., V]``; ``normalized`` says the final norm (and the prediction head
        after it, :attr:`head_transform`) is already applied: ``hidden`` is what the unembedding reads;
        ``capped=False`` returns ``s · (W h + b)`` before the soft-capping (δ_TCB's input); ``out``: a float32
        ``[..., V]`` tensor to write them into (and return), instead of a new one."""
        if not normalized:
            hidden = self.final_norm(self.merged(hidden).to(self._norm_device))
            if self.head_transform is not None:
                hidden = self.head_transform(hidden)
        hidden = hidden.to(self.device).float()
        if out is None and not self.rows.converts:
            logits = torch.nn.functional.linear(hidden, self.unembed, self.bias)
        else:
            logits = self.rows.times_transposed(hidden, out=out)
            if self.bias is not None:
                logits.add_(self.bias)
        if self.logit_scale != 1.0:
            logits.mul_(self.logit_scale)
        return self.cap(logits, inplace=True) if capped else logits  # the logits are this call's own tensor

    def cap(self, logits: torch.Tensor, *, inplace: bool = False) -> torch.Tensor:
        """The model's logit transform g (soft-capping ``c·tanh(z/c)``, or the identity); ``inplace`` overwrites
        ``logits``."""
        if self.logit_softcap is None:
            return logits
        if not inplace:
            logits = logits.clone()
        return logits.div_(self.logit_softcap).tanh_().mul_(self.logit_softcap)

    def logprobs(self, hidden: torch.Tensor, *, normalized: bool) -> torch.Tensor:
        return torch.log_softmax(self.logits(hidden, normalized=normalized), dim=-1)


LENS_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-6, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (2e-2, 4e-3),
    torch.bfloat16: (1e-1, 3e-2),
}
"""Unembedding dtype → ``(atol, rtol)`` of :func:`check_lens`: the lens may differ from the model's own log-probabilities
by ``atol + rtol · max |z|`` at most (z the model's logits). The model computes its logits in its own dtype, the lens in
float32: one rounding of each logit (2⁻¹¹ of |z| in float16, 2⁻⁸ in bfloat16), then the log-softmax's of their sum; a
missed logit transform moves them by a fraction of |z| itself."""

CHECK_TOKENS = 16
"""Tokens of :func:`check_lens`'s forward."""

CHECK_FLOOR = -50.0
""":func:`check_lens` compares the log-probabilities above this (p > 2e-22), renormalised over those tokens: a token the
model rules out (a logit of -1e4 set after its head, which the lens does not see) is compared no further."""


def _check_one_state_per_block(
    hidden_states: Sequence[torch.Tensor], norm_input: torch.Tensor, num_layers: int, where: str
) -> None:
    """What every probe assumes of the forward's ``hidden_states``: L + 1 of them (the embeddings, then one per block)
    and each of the shape the final norm reads, so that the lens reads any layer as it reads the last. A looped model
    (a block run more than once) or one whose blocks carry other states than the final norm reads (several residual
    streams merged before it) is refused in one line."""
    if len(hidden_states) != num_layers + 1:
        raise UnsupportedModelError(
            f"{where}: its forward gives {len(hidden_states)} hidden states for {num_layers} blocks, not one per block "
            "(a block runs more than once: a looped model), so a layer's state is not one block's output")
    shapes = {tuple(state.shape) for state in hidden_states[:-1]} - {tuple(norm_input.shape)}
    if shapes:
        shape = sorted(shapes)[0]
        why = ("its blocks keep the positions before the batch, [T, B, d] (XLNet), its hidden_states the batch first"
               if sorted(shape) == sorted(norm_input.shape) else "the model first merges them, e.g. residual streams, "
               "by no module of its own that the lens could call")
        raise UnsupportedModelError(
            f"{where}: the logit lens cannot read its blocks' states {shape}: its final norm reads "
            f"{tuple(norm_input.shape)} ({why})")


def _stream_merge(model: nn.Module, readout: LensReadout, ids: torch.Tensor,
                  block_shape: tuple[int, ...]) -> tuple[nn.Module, torch.Tensor] | None:
    """The module the final norm's input comes from (the head's, where the model has no final norm), where the blocks'
    states are not what the norm reads (several residual streams): one forward of ``ids`` with a hook on every module,
    and the module whose output is the final norm's input (its last call) and whose input has the blocks' shape ``block_shape``, with that input (the last
    block's output). ``None`` where no module gives it (a merge written in the model's forward itself)."""
    norm_inputs: list[torch.Tensor] = []
    reader = readout.final_norm if readout.has_final_norm else model.get_output_embeddings()  # no norm: the head
    calls = _module_calls(model, ids, skip=(reader,), hooks=[
        reader.register_forward_pre_hook(lambda _module, args: norm_inputs.append(args[0]))])
    if not norm_inputs:
        return None
    target = norm_inputs[-1]  # the same tensor, or a whole view of it (the head's input sliced to every position)
    return next(((module, states.detach()) for module, states, output in reversed(calls)
                 if (output is target or (output.data_ptr() == target.data_ptr() and output.shape == target.shape))
                 and tuple(states.shape) == block_shape), None)


def _module_calls(model: nn.Module, ids: torch.Tensor, *, skip: Sequence[nn.Module],
                  hooks: Sequence[Any]) -> list[tuple[nn.Module, torch.Tensor, torch.Tensor]]:
    """One forward of ``ids`` with a hook on every module (but ``model`` and ``skip``): each call's ``(module, first
    input, output)`` where both are tensors, in the order they returned. ``hooks`` (handles the caller registered for
    the same forward) are removed with them."""
    calls: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []

    def record(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if isinstance(output, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
            calls.append((module, args[0], output))

    handles = list(hooks) + [module.register_forward_hook(record) for module in model.modules()
                             if module is not model and all(module is not other for other in skip)]
    try:
        model(input_ids=ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def _views_of_one_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are one tensor or views of one storage (the head's input sliced from a norm's output)."""
    return a is b or a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _module_between(model: nn.Module, ids: torch.Tensor, source: nn.Module, reader: nn.Module) -> nn.Module | None:
    """The module of one forward of ``ids`` whose input is ``source``'s output (its last call's; a block's first
    output) and whose output is what ``reader`` reads (its last call's input: that tensor or a view of it), the outermost
    where several are (the last to return); ``None`` where none is. The final norm under another name (the module
    between the last block and the head: CPM-Ant's ``output_layernorm``), or a prediction head between the final norm
    and the unembedding (ModernBERT-decoder's ``lm_head``: dense, activation, norm)."""
    sources: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []

    def take_source(_module: nn.Module, _args: tuple[Any, ...], output: Any) -> None:
        sources.append(output[0] if isinstance(output, (tuple, list)) else output)

    calls = _module_calls(model, ids, skip=(reader, source), hooks=[
        source.register_forward_hook(take_source),
        reader.register_forward_pre_hook(lambda _module, args: targets.append(args[0]))])
    if not sources or not targets or not isinstance(sources[-1], torch.Tensor):
        return None
    return next((module for module, states, output in reversed(calls)
                 if _views_of_one_storage(output, targets[-1]) and _views_of_one_storage(states, sources[-1])), None)


@torch.no_grad()
def check_lens(model: nn.Module, readout: LensReadout, *, tokens: int = CHECK_TOKENS) -> float:
    """Check at load that the :class:`LensReadout` found for ``model`` is the model's own readout: one forward of
    ``tokens`` fixed token ids; the lens applied to the final norm's input (the last block's output) and to
    ``hidden_states[L]`` (read as post-norm) must both reproduce the model's own log-probabilities (those above
    :data:`CHECK_FLOOR`) within :data:`LENS_TOLERANCE` of the unembedding's dtype; the forward must give one hidden
    state per block (per pass of a block: a looped model's forward that runs block k several times gives one state per
    pass, and :attr:`LensReadout.num_layers` counts the passes, :attr:`LensReadout.passes` names their blocks), each of
    the shape the final norm reads (:func:`_check_one_state_per_block`). A model with no final norm by its conventional
    names must have its head (or its merge) read its last block's output itself, else it is refused (a norm under
    another name). Where the blocks'
    states are not (several residual streams, DeepSeek-V4's and HY-V4's ``hc_head``), the module the final norm's input
    comes from is the model's merge (:func:`_stream_merge`): it becomes the readout's :attr:`LensReadout.merge`, and the
    lens on the last block's output (through the merge, the final norm and the head) must reproduce the model's own
    log-probabilities as above. Where no module gives it (a merge in the forward's own code), the family's
    :data:`~lm_eval_probes.capture.parts.STREAM_MERGES` entry, run on the model's own modules, is the merge, checked the
    same way; streams kept before the batch (Gemma-3n's ``[streams, B, T, d]``) are read batch first, and a
    ``hidden_states[L]`` that is the last block's output through the merge and the final norm
    (:meth:`LensReadout.own_states`, which :func:`~lm_eval_probes.stack_api.hidden_states_of` then applies to every
    forward's states of the model).
    A model with no final norm by its conventional names whose head does not read its last block's output has the
    module between them as its final norm (:func:`_module_between`: CPM-Ant's ``output_layernorm``; positions the
    model puts before the sequence's own in its blocks and drops before its head, CPM-Ant's prompt, are
    :attr:`LensReadout.prepended`). Where the lens differs from the model's own log-probabilities and the unembedding
    reads no view of the final norm's output, the module between them (a prediction head: ModernBERT-decoder's) is
    :attr:`LensReadout.head_transform`, and the lens is checked again through it.
    Two or three more forwards of the same ids learn how the model reads a list of ``hidden_states`` indices
    (:func:`~lm_eval_probes.stack_api.learn_hidden_states_selection`).

    Returns the largest difference ``max |Δ log p|``; raises :class:`UnsupportedModelError` in one line naming the
    model type and the size of the mismatch otherwise."""
    if not 1 <= tokens <= CHECK_TOKENS:
        raise ValueError(f"the lens check runs 1..{CHECK_TOKENS} tokens, got {tokens}")
    embeddings = model.get_input_embeddings()
    vocab = min(readout.vocab_size, embeddings.weight.shape[0] if hasattr(embeddings, "weight") else readout.vocab_size)
    ids = ((torch.arange(tokens) * 7919 + 11) % vocab).unsqueeze(0)
    if hasattr(embeddings, "weight"):
        ids = ids.to(embeddings.weight.device)
    taken: list[torch.Tensor] = []
    passes: list[int] = []
    last_outputs: list[Any] = []
    head = model.get_output_embeddings()
    head_inputs: list[torch.Tensor] = []
    norm_outputs: list[torch.Tensor] = []
    handles = [readout.final_norm.register_forward_pre_hook(lambda _module, args: taken.append(args[0].detach())),
               readout.final_norm.register_forward_hook(lambda _module, _args, output: norm_outputs.append(output)),
               head.register_forward_pre_hook(lambda _module, args: head_inputs.append(args[0])),
               readout.last_block.register_forward_hook(lambda _module, _args, output: last_outputs.append(output))]
    handles += [block.register_forward_pre_hook(lambda _module, _args, index=index: passes.append(index))
                for index, block in enumerate(blocks_of(model))]
    try:
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    where = f"model_type {readout.model_type!r}"
    if not readout.has_final_norm:  # the head reads the last block's output: hidden_states[L] itself
        taken.append(out.hidden_states[-1])
    if not taken:
        raise UnsupportedModelError(f"{where}: its forward never called the final norm {type(readout.final_norm).__name__}")
    readout.passes, readout.num_layers = tuple(range(readout.num_blocks)), readout.num_blocks
    if len(passes) > readout.num_blocks and len(out.hidden_states) == len(passes) + 1:  # a looped model
        readout.passes, readout.num_layers = tuple(passes), len(passes)
    lens_input, read = taken[-1], "the final norm's input"
    last = last_outputs[-1][0] if last_outputs and isinstance(last_outputs[-1], (tuple, list)) else \
        (last_outputs[-1] if last_outputs else None)
    readout.merge, readout.merge_module, readout.stream_shape = None, None, ()
    readout.streams_first = readout.last_state_is_block_output = False
    if len(out.hidden_states) == readout.num_layers + 1 and out.hidden_states[-2].shape != lens_input.shape:
        block_shape = tuple(out.hidden_states[-2].shape)  # several residual streams
        found = _stream_merge(model, readout, ids, block_shape)
        if found is not None:
            readout.merge_module, lens_input = found
            readout.merge = readout.merge_module
            readout.stream_shape = tuple(lens_input.shape[2:])
            read = f"the last block's output (merged by its {type(readout.merge_module).__name__})"
        elif (readout.model_type in STREAM_MERGES and isinstance(last, torch.Tensor)
              and tuple(last.shape) == block_shape and len(block_shape) == lens_input.ndim + 1):
            merge = STREAM_MERGES[readout.model_type]  # the merge the forward's own code does
            readout.merge = functools.partial(merge, model)
            readout.streams_first = block_shape[1:3] == tuple(lens_input.shape[:2]) != block_shape[:2]
            lens_input = last.detach()
            readout.stream_shape = tuple(readout.batch_first(lens_input).shape[2:])
            readout.last_state_is_block_output = (out.hidden_states[-1].shape == last.shape
                                                  and torch.equal(out.hidden_states[-1], last))
            read = f"the last block's output (merged by {merge.__name__} on the model's own modules)"
    if not readout.has_final_norm:  # the head (or the merge) must read the last block's output itself
        if not (isinstance(last, torch.Tensor) and last.shape == lens_input.shape
                and torch.equal(last, lens_input)):  # a norm between them, not found by its name
            norm = _module_between(model, ids, readout.last_block, head)  # the module whose output the head reads
            if norm is None or not isinstance(last, torch.Tensor):
                raise UnsupportedModelError(
                    f"{where}: its last block's output is not what its head reads, and no module between them (nor a "
                    f"final norm by a conventional name: {', '.join(FINAL_NORM_NAMES)}) is; add a row to "
                    "lm_eval_probes.capture.parts.ARCHITECTURES")
            readout.use_final_norm(norm)
            lens_input, read = last.detach(), f"the final norm's input (its {type(norm).__name__}, read by its head)"
    readout.prepended = max(0, readout.batch_first(lens_input).shape[1] - out.logits.shape[1])
    if readout.prepended:  # the blocks' positions that are the sequence's (after CPM-Ant's prompt)
        lens_input = lens_input[:, readout.prepended :]
    _check_one_state_per_block(out.hidden_states, lens_input, readout.num_layers, where)
    learn_hidden_states_selection(  # how this model reads a list of hidden_states indices (its release's reading)
        model, lambda request: model(input_ids=ids, output_hidden_states=request, use_cache=False).hidden_states,
        out.hidden_states)
    # the final norm's last call is the model's (a model may call the same norm on its embeddings first)
    want = torch.log_softmax(out.logits[0].float(), dim=-1).to(readout.device)
    compared = want > CHECK_FLOOR  # a token the model rules out (log p of -1e4) is out of every probe's reach
    want = want.masked_fill(~compared, -math.inf).log_softmax(-1)  # renormalised over the tokens compared
    atol, rtol = LENS_TOLERANCE.get(readout.unembed.dtype, LENS_TOLERANCE[torch.bfloat16])
    bound = atol + rtol * float(out.logits[0].float().to(readout.device)[compared].abs().max())
    transform = f"logit scale {readout.logit_scale:g}, soft-capping {readout.logit_softcap}"
    readout.head_transform = None
    while True:
        largest, failure = 0.0, None
        read_states_through(model, readout.own_states if readout.reads_own_states else None)
        for hidden, normalized, read in ((readout.batch_first(lens_input), False, read),
                                         (readout.own_states(out.hidden_states)[-1], True,
                                          "hidden_states[L] (read as post-norm)")):
            got = readout.logprobs(hidden[0], normalized=normalized)
            if got.shape != want.shape:
                raise UnsupportedModelError(f"{where}: the lens on {read} gives {tuple(got.shape)} log-probabilities, "
                                            f"the model {tuple(want.shape)}")
            got = got.masked_fill(~compared, -math.inf).log_softmax(-1)
            difference = float((got - want)[compared].abs().max())
            if not difference <= bound:
                failure = (f"{where}: the logit lens ({transform}) on {read} differs from the model's own "
                           f"log-probabilities by up to {difference:.3g} (allowed {bound:.3g} in "
                           f"{str(readout.unembed.dtype).removeprefix('torch.')})")
                break
            largest = max(largest, difference)
        if failure is None:
            return largest
        if readout.head_transform is not None or not (readout.has_final_norm and norm_outputs and head_inputs) \
                or _views_of_one_storage(norm_outputs[-1], head_inputs[-1]):
            raise UnsupportedModelError(failure)
        # the head reads no view of the final norm's output: a module between them (a prediction head), read through
        readout.head_transform = _module_between(model, ids, readout.final_norm, head)
        if readout.head_transform is None:
            raise UnsupportedModelError(failure)
        transform += f", through its {type(readout.head_transform).__name__}"


_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past", "cache_params")

try:  # transformers' collector of hidden states and attentions (its hooks on every block)
    from transformers.utils.output_capturing import _active_collector as _OUTPUT_COLLECTOR
except ImportError:  # another transformers: Ω then decodes after the forward only
    _OUTPUT_COLLECTOR = None


@dataclass
class BlockInputs:
    """What :meth:`FocalDepthDecoder.capture` records during the model's latest forward, and what it decodes then.

    ``block_kwargs``: the keyword arguments each of the last m blocks was called with (masks, rotary
    ``position_embeddings``, position ids; the KV cache and ``use_cache`` already neutralised).
    ``final_norm_input``: ``[B, T, H]`` the input of the final norm (block L's output before the norm:
    HF ``hidden_states[L]`` is after it). ``batch_size``: B of that forward. ``device_type`` and
    ``autocast_dtype``: the autocast the forward ran under (HFLM's mixed precision; ``None``: none), which
    the re-run of the blocks repeats.

    ``windows`` (set before a forward by :meth:`FocalDepthDecoder.read_at`): batch row → the positions
    ``[start, stop)`` the caller will ask about; with them the source layers are decoded while the forward runs.
    The rest is the decoder's own bookkeeping of one forward: ``sources`` (source index → its ``[B, T, H]``
    states, held until every row of it is decoded), ``pending`` ((source index, row) pairs not decoded yet, in
    source-major order), ``masses`` ((source index, row) → the top-K masses of the row's window),
    ``type_kwargs`` (attention type → the keyword arguments of the latest block of that type) and ``borrowed``
    (what each mid-forward decoding gave each re-run block, checked against the block's own after the forward).
    Where the decoder replays the model's forward (:attr:`FocalDepthDecoder.replay`): ``body_call`` (the model's call
    of its body: positional and keyword arguments, the KV cache neutralised) and ``earlier_outputs`` (call index → the
    output of each block call before the focal depth).
    """

    block_kwargs: list[dict[str, Any]] = field(default_factory=list)
    final_norm_input: torch.Tensor | None = None
    batch_size: int = 0
    device_type: str = "cpu"
    autocast_dtype: torch.dtype | None = None
    windows: dict[int, tuple[int, int]] | None = None
    sources: dict[int, torch.Tensor] = field(default_factory=dict)
    pending: list[tuple[int, int]] = field(default_factory=list)
    masses: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    type_kwargs: dict[Any, dict[str, Any]] = field(default_factory=dict)
    borrowed: list[list[dict[str, Any]]] = field(default_factory=list)
    decoded_during_forward: int = 0
    decoding: bool = False
    body_call: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    earlier_outputs: dict[int, Any] = field(default_factory=dict)

    @property
    def body_kwargs(self) -> dict[str, Any]:
        """The keyword arguments the model gave its body (:attr:`FocalDepthDecoder.replay`; ``{}``: not captured)."""
        return {} if self.body_call is None else self.body_call[1]

    def new_forward(self, batch_size: int, device_type: str, autocast_dtype: torch.dtype | None, blocks: int) -> None:
        """Forget the previous forward's records, for a forward that re-runs ``blocks`` blocks (the windows stay: they
        were set for this one)."""
        self.block_kwargs = [{} for _ in range(blocks)]
        self.final_norm_input = None
        self.batch_size, self.device_type, self.autocast_dtype = batch_size, device_type, autocast_dtype
        self.sources, self.pending, self.masses = {}, [], {}
        self.type_kwargs, self.borrowed = {}, []
        self.decoded_during_forward = 0
        self.body_call, self.earlier_outputs = None, {}


def _rows_of(value: Any, index: torch.Tensor, batch_size: int,
             axes: dict[tuple[Any, ...], tuple[int, int]] | None = None, path: tuple[Any, ...] = (),
             shared: dict[int, Any] | None = None) -> Any:
    """``value`` with its batch dimension gathered at ``index``.

    ``axes`` (found at load by :func:`_batch_axes`): argument path → ``(axis, per row)``, an axis that holds
    ``per row`` consecutive entries per batch row (BLOOM's ALiBi bias ``[B · heads, 1, T]``: ``heads`` per row); each
    row's entries are gathered there. Elsewhere a leading dimension of size ``batch_size`` is the batch; tensors whose
    first dimension is not (size-1 broadcast masks or rotary tables, scalars) are returned unchanged; tuples, lists and
    dicts are mapped. A ``UserDict`` the blocks share and fill as they run (Gemma-3n's keys and values shared between
    blocks) becomes a new one of its rows, the forward's left as it is; ``shared`` (the forward's ``id`` → its new
    one) gives every block of one re-run the same new one, as the forward gives every block its own.
    """
    if isinstance(value, torch.Tensor):
        if axes and path in axes:
            axis, per_row = axes[path]
            if value.ndim > axis and value.shape[axis] == batch_size * per_row:
                rows = index.to(value.device)
                gathered = (rows.unsqueeze(1) * per_row + torch.arange(per_row, device=value.device)).flatten()
                return value.index_select(axis, gathered)
            return value
        if value.ndim >= 2 and value.shape[0] == batch_size:
            return value.index_select(0, index.to(value.device))
        return value
    if isinstance(value, tuple):
        return tuple(_rows_of(v, index, batch_size, axes, (*path, i), shared) for i, v in enumerate(value))
    if isinstance(value, list):
        return [_rows_of(v, index, batch_size, axes, (*path, i), shared) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _rows_of(v, index, batch_size, axes, (*path, k), shared) for k, v in value.items()}
    if isinstance(value, UserDict):
        if shared is not None and id(value) in shared:
            return shared[id(value)]
        rows = type(value)({k: _rows_of(v, index, batch_size, axes, (*path, k), shared) for k, v in value.items()})
        if shared is not None:
            shared[id(value)] = rows
        return rows
    return value


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], torch.Tensor]]:
    """``(path, tensor)`` of every tensor in an argument tree of tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))


def _batch_axes(one: Sequence[dict[str, Any]], two: Sequence[dict[str, Any]]) -> dict[tuple[Any, ...], tuple[int, int]]:
    """The batch axis of each block argument, from the arguments of the same blocks in a forward of one row (``one``)
    and of two (``two``): the first axis whose size doubles, holding that many entries per row (1 for most; BLOOM's ALiBi
    bias ``[B · heads, 1, T]`` holds ``heads``). Paths are a block's argument names, then the indices and keys within."""
    axes: dict[tuple[Any, ...], tuple[int, int]] = {}
    for first, second in zip(one, two, strict=True):
        shapes = {path: tuple(value.shape) for path, value in _leaves(first)}
        for path, value in _leaves(second):
            small = shapes.get(path)
            if small is None or len(small) != value.ndim:
                continue
            axis = next((a for a, (s, t) in enumerate(zip(small, value.shape, strict=True)) if t == 2 * s and s), None)
            if axis is not None:
                axes.setdefault(path, (axis, small[axis]))
    return axes


def _same_argument(a: Any, b: Any) -> bool:
    """Whether two block arguments are the same: the same tensor objects (not equal values), containers mapped."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same_argument, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_argument(a[k], b[k]) for k in a)
    return a is b or a == b


def _neutralised(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A block's keyword arguments with the KV cache (by its conventional names, or any transformers ``Cache``)
    replaced by ``None`` and ``use_cache=False``."""
    kept = dict(kwargs)
    for name, value in kept.items():
        if name in _CACHE_KWARGS or any(cls.__name__ == "Cache" for cls in type(value).__mro__):
            kept[name] = None
    if "use_cache" in kept:
        kept["use_cache"] = False
    return kept


_SIGNATURES: dict[type, inspect.Signature] = {}


def block_call(block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """A block's call ``block(*args, **kwargs)`` as ``(hidden states, every other argument by name)``: positional
    arguments (GPT-2's cache and mask) are bound to their names by the signature of ``block.forward``, so that
    ``block(hidden, **others)`` repeats the call; the KV cache is neutralised (:func:`_neutralised`)."""
    kind = type(block)
    if kind not in _SIGNATURES:
        _SIGNATURES[kind] = inspect.signature(block.forward)
    signature = _SIGNATURES[kind]
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:
        raise UnsupportedModelError(f"Ω cannot name the arguments of {kind.__name__}: {error}") from None
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        parameter = signature.parameters[name]
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        elif parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                raise UnsupportedModelError(f"Ω cannot name {len(value)} extra positional arguments of {kind.__name__}")
        else:
            named[name] = value
    first = next(iter(signature.parameters))
    hidden = named.pop(first, None)
    if not isinstance(hidden, torch.Tensor):
        raise UnsupportedModelError(f"{kind.__name__}'s first argument {first!r} is not the hidden states")
    return hidden, _neutralised(named)


class FocalDepthDecoder:
    """Top-K confidence of HyperLens focal-depth decodings D_m(H_i) at the response positions of a batch.

    D_m(H_i) = softmax(g(W_U · norm(f_L ∘ … ∘ f_{L−m+1}(H_i)))): the states of source layer i over the
    whole sequence go through the model's own last m blocks, called with the keyword arguments they got
    during the model's own forward (attention mask incl. sliding windows, rotary embeddings, position
    ids; the KV cache argument replaced by ``None`` and ``use_cache=False``, so the main pass's cache is
    never touched), then the :class:`LensReadout` (final norm, unembedding, soft-capping) at the response
    positions only. m = 0 is exactly the logit lens of :class:`LensReadout`. For source layer L and
    m ≥ 1 the input is block L's pre-norm output (captured on the final norm), not ``hidden_states[L]``.

    The (source layer, row) pairs are stacked along the batch dimension in chunks of at most
    ``chunk_tokens`` tokens (at least one sequence; the wrappers give :meth:`FocalDepth.tokens_per_chunk`, 512 MiB of
    the blocks' activations by default), in source-major order, and the m blocks run once per
    chunk: about m · S / L extra forwards of the batch for S source layers.

    For m ≥ 1 the decoder's hooks take each source layer's states as the forward makes them (the input of
    block i; the final norm's input for layer L) — the forward's ``hidden_states`` need not hold them. When
    the caller said beforehand which positions of which rows it will ask about (:meth:`read_at`), a chunk
    is decoded as soon as it is full, inside the forward (before the next block runs), and its states are
    released: the decoder then holds about one chunk's states instead of every source layer's, S·B·T·d
    values (1.09 GiB for the Llama-3-8B shape at T = 4096). The re-run blocks then get the keyword arguments
    of the latest block of their attention type (``config.layer_types``; the same objects the model passes
    to every block of that type, checked against each block's own after the forward), transformers' own
    output hooks are paused meanwhile (so the forward's ``hidden_states`` stay the forward's), and a chunk
    waits until a block of every attention type the re-run blocks use has run. The chunks, and so the
    values, are the same whether decoded during the forward or after it.

    The depth axis is the forward's sequence of block calls (:attr:`LensReadout.passes`: a looped model's block once
    per pass), state i the output of call i. Where the last m calls alone are not the model's remaining computation
    (a looped model; blocks whose other arguments or the code between them follow the states: found by :meth:`check`),
    the decoder instead replays the model's own body from state L − m (:attr:`replay`, :attr:`replays`), after the
    forward.
    """

    def __init__(
        self,
        model: nn.Module,
        readout: LensReadout,
        *,
        depth: int,
        source_layers: tuple[int, int],
        top_k: int = 1,
        chunk_tokens: int = 16384,
        chunk_positions: int = 64,
    ) -> None:
        num_layers = readout.num_layers
        if not 0 <= depth <= num_layers:
            raise ValueError(f"focal depth m={depth} is outside 0..{num_layers} (this model has {num_layers} blocks)")
        start, stop = source_layers
        if not 0 <= start < stop <= num_layers + 1:
            raise ValueError(f"source layers {start}:{stop} must satisfy 0 <= start < stop <= {num_layers + 1}")
        if not 1 <= top_k <= readout.vocab_size:
            raise ValueError(f"top-K must satisfy 1 <= K <= {readout.vocab_size} (the vocabulary), got {top_k}")
        if chunk_tokens < 1 or chunk_positions < 1:
            raise ValueError(f"chunk sizes must be >= 1, got {chunk_tokens} tokens, {chunk_positions} positions")
        spec = architecture_of(model)
        self.model = model
        self.readout = readout
        self.depth = depth
        self.source_layers = tuple(range(start, stop))
        self.top_k = top_k
        self.chunk_positions = chunk_positions
        self.all_blocks: list[nn.Module] = blocks_of(model, spec)
        self.calls: list[nn.Module] = [self.all_blocks[block] for block in readout.passes]
        """The block of each call, in the order the forward makes them (a looped model's: a block once per pass)."""
        self.blocks: list[nn.Module] = self.calls[num_layers - depth :] if depth else []
        self.chunk_tokens = chunk_tokens
        types = getattr(model.config, "layer_types", None)
        types = list(types) if types is not None and len(types) == readout.num_blocks else [None] * readout.num_blocks
        self.block_types: list[Any] = [types[block] for block in readout.passes]
        self.rerun_types = frozenset(self.block_types[num_layers - depth :]) if depth else frozenset()
        # during the forward only: transformers' output hooks can be paused, and no other probe hooks the first
        # block (margin's capture does), which a re-run of every block would call again
        self.decodes_during_forward = _OUTPUT_COLLECTOR is not None and 0 < depth < num_layers and not readout.looped
        self.batch_axes: dict[tuple[Any, ...], tuple[int, int]] = {}
        """Block argument path → its batch axis and entries per row, where not a leading axis of the batch's size
        (:func:`_batch_axes`; found by :meth:`check`)."""
        self.replay = ForwardReplay.of(model, self.calls, readout.lens_input, readout.batch_first,
                                       readout.block_layout)
        """The model's own forward from the focal depth (:class:`~lm_eval_probes.capture.forward_replay.ForwardReplay`),
        where the model has a body of its own; used where :meth:`check` finds that the re-run of the last m block calls
        is not the model's remaining computation (:attr:`replays`)."""
        self.replays = False
        """Whether the decoder re-runs the model's own forward from the focal depth (:attr:`replay`) instead of the
        last m block calls alone: decided by :meth:`check` (a looped model, or blocks whose other arguments or the code
        between them depend on the states)."""
        self.replay_why = ""
        """Why :attr:`replays` (:meth:`check`'s finding), for the log."""
        self.body_axes: dict[tuple[Any, ...], tuple[int, int]] = {}
        """As :attr:`batch_axes`, of the body's arguments (:attr:`replay`)."""
        self.skips_earlier = False
        """Whether the replay gives the calls before the focal depth their captured outputs instead of running them
        (decided by :meth:`check`: unless the replay then differs, as where a block leaves something for later ones)."""

    @torch.no_grad()
    def check(self, *, tokens: int = CHECK_TOKENS, tolerance: float | None = None) -> float:
        """Check at load that the decoder's re-run from the focal depth is the model's own remaining computation: one
        forward of two rows of ``tokens`` fixed ids inside :meth:`capture`, then, on the second row alone (with that row
        of the arguments the forward gave), the re-run from state L − m (block L − m + 1's input) must give that row of
        the final norm's input, within ``tolerance`` of its largest magnitude (default: 1e-4 in float32, 5e-2 in
        16-bit).

        The re-run is first the last m block calls alone. Where they do not pass, or where on the first row's state
        (with the second row's arguments) they give another output than the model's own forward does from there
        (:attr:`replay`: blocks whose other arguments are built from the states, Inkling-2's block attention
        residuals, or code between the blocks), and always on a looped model (:attr:`LensReadout.passes`: the code
        between its passes, Dory's input injection, HRM's two streams), the decoder re-runs the model's own forward
        from the focal depth instead (:attr:`replays`), which must pass the same check. Also decides whether the
        decoder may borrow a block's arguments during the forward (every block of an attention type got the same
        objects). Returns the relative difference; :class:`UnsupportedModelError` naming the block class otherwise."""
        self.replays, self.replay_why = False, ""
        if not self.blocks:
            return 0.0
        embeddings = self.model.get_input_embeddings()
        vocab = min(self.readout.vocab_size, getattr(embeddings, "num_embeddings", self.readout.vocab_size))
        steps = torch.arange(tokens)
        ids = torch.stack([(steps * 7919 + 11) % vocab, (steps * 104729 + 5) % vocab])
        entry = self.readout.num_layers - self.depth  # the state replaced: hidden_states index
        called: list[dict[str, Any]] = [{} for _ in self.calls]
        states: list[torch.Tensor | None] = [None] * (len(self.calls) + 1)  # state i: call i's output, 0: the input
        outputs: dict[int, Any] = {}

        def take_input(index: int, state: torch.Tensor) -> None:
            if index == 0:
                states[0] = self.readout.batch_first(state.detach())

        def take_output(index: int, output: Any) -> None:
            states[index + 1] = self.readout.batch_first(output_state(output).detach())
            outputs[index] = output

        def take_arguments(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            index = next(i for i, taken in enumerate(called) if not taken and self.calls[i] is module)  # its next call
            called[index] = block_call(module, args, kwargs)[1]

        kinds = ", ".join(sorted({type(block).__name__ for block in self.blocks}))
        where = f"Ω cannot re-run {kinds} of model_type {self.readout.model_type!r}"
        device = getattr(embeddings, "weight", ids).device
        with self.capture() as alone:  # one row: the arguments' batch axes are those that double with two
            self.model(input_ids=ids[:1].to(device), use_cache=False)
        handles = [block.register_forward_pre_hook(take_arguments, with_kwargs=True)
                   for block in dict.fromkeys(self.calls)]
        try:
            with self.capture() as inputs, block_calls(self.calls, on_input=take_input, on_output=take_output):
                self.model(input_ids=ids.to(device), use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        if inputs.final_norm_input is None or states[entry] is None:
            raise UnsupportedModelError(f"{where}: its forward did not call its blocks and final norm as found")
        want = inputs.final_norm_input[1:2]
        if tolerance is None:
            tolerance = 1e-4 if want.dtype in (torch.float32, torch.float64) else 5e-2
        row = torch.tensor([1])
        self.batch_axes = _batch_axes(alone.block_kwargs, inputs.block_kwargs) if not self.readout.looped else {}
        if self.replay is not None:
            self.body_axes = _batch_axes([alone.body_kwargs], [inputs.body_kwargs])
        inputs.earlier_outputs = {index: outputs[index] for index in range(entry)}  # the check's own, as captured
        if self.readout.looped:  # its passes: the code between them is the forward's
            return self._check_replay(states[entry], inputs, want, tolerance,
                                      f"Ω cannot re-run the last {self.depth} of the {self.readout.num_layers} passes of "
                                      f"{self.readout.num_blocks} blocks of model_type {self.readout.model_type!r}",
                                      "a looped model: the forward's own code runs between its passes")
        try:
            difference = self._relative(self._blocks_alone(states[entry], inputs, row, where), want)
            if not difference <= tolerance:
                raise UnsupportedModelError(f"{where}: on its captured input it gives an output {difference:.3g} "
                                            "(relative) away from its captured one")
        except UnsupportedModelError as refusal:
            if self.replay is None:
                raise
            return self._check_replay(states[entry], inputs, want, tolerance, where,
                                      f"its last {self.depth} blocks alone: {str(refusal).split(': ', 1)[-1]}")
        if self.replay is not None:  # the blocks alone on another state: the model's own computation from there?
            other = states[entry][0:1]
            try:
                own = self.replay.run(other, entry, *self._body_rows(inputs, row))  # every call run again
            except Exception:  # the body does not replay on one row: the blocks alone, as checked
                own = None
            if own is not None:
                alone_blocks = self._blocks_alone(states[entry][0:1], inputs, row, where)
                apart = self._relative(alone_blocks, own)
                if not apart <= tolerance:
                    return self._check_replay(
                        states[entry], inputs, want, tolerance, where,
                        f"its last {self.depth} blocks alone give another output than its forward from their input "
                        f"({apart:.3g} relative): their other arguments, or the code between them, depend on the states")
        by_type: dict[Any, dict[str, Any]] = {}
        for kind, kwargs in zip(self.block_types, called, strict=True):
            if not _same_argument(by_type.setdefault(kind, kwargs), kwargs):
                self.decodes_during_forward = False  # blocks of one type got different arguments: decode afterwards
        return difference

    @staticmethod
    def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
        """max |got − want| / max |want| (inf where the shapes differ)."""
        if got.shape != want.shape:
            return math.inf
        return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))

    def _blocks_alone(self, states: torch.Tensor, inputs: BlockInputs, row: torch.Tensor, where: str) -> torch.Tensor:
        """The last m blocks on ``states``' row ``row`` (:meth:`check`), refused in one line where they do not run."""
        try:
            out = self._rerun(states.index_select(0, row.to(states.device)) if states.shape[0] > 1 else states,
                              inputs.block_kwargs, row, inputs.batch_size)
        except Exception as error:  # the arguments do not re-run on a subset of the rows
            raise UnsupportedModelError(f"{where} on one row of its batch: {type(error).__name__}: "
                                        f"{(str(error).splitlines() or [''])[0][:160]}") from None
        want = inputs.final_norm_input
        if out.shape[1:] != want.shape[1:]:
            raise UnsupportedModelError(f"{where}: its last block gives {tuple(out.shape)} states where its final "
                                        f"norm reads {tuple(want.shape)}")
        return out

    def _check_replay(self, entry_states: torch.Tensor, inputs: BlockInputs, want: torch.Tensor, tolerance: float,
                      where: str, why: str) -> float:
        """:meth:`check` of the model's own forward from the focal depth on the second row (:attr:`replays` set): first
        with the calls before the focal depth given their captured outputs (:attr:`skips_earlier`), else run again
        (where a block leaves something for later blocks, as Gemma-3n's shared keys)."""
        if self.replay is None:
            raise UnsupportedModelError(f"{where}: {why}, and its forward cannot be replayed from there (it has no body "
                                        "of its own, model.base_model, holding its blocks)")
        row = torch.tensor([1])
        entry = self.readout.num_layers - self.depth
        failure = ""
        for skips in (True, False):
            self.skips_earlier = skips
            try:
                got = self._replayed(entry_states[1:2], inputs, row)
            except Exception as error:
                failure = (f"its forward replayed on one row of its batch: {type(error).__name__}: "
                           f"{(str(error).splitlines() or [''])[0][:160]}")
                continue
            difference = self._relative(got, want)
            if difference <= tolerance:
                self.replays, self.replay_why = True, why
                self.decodes_during_forward = False  # the replay runs the body: after the forward only
                return difference
            failure = (f"its forward replayed from its captured state {entry} gives an output {difference:.3g} "
                       "(relative) away from its captured one")
        raise UnsupportedModelError(f"{where} ({why}): {failure}")

    def _replayed(self, states: torch.Tensor, inputs: BlockInputs, rows: torch.Tensor) -> torch.Tensor:
        """The model's own forward from the focal depth (:attr:`replay`) on ``states``, rows ``rows`` of the forward's
        batch, with the outputs of the calls before the focal depth as captured where :attr:`skips_earlier`."""
        entry = self.readout.num_layers - self.depth
        earlier = None
        if self.skips_earlier:
            earlier = [_rows_of(inputs.earlier_outputs[index], rows, inputs.batch_size) for index in range(entry)]
        return self.replay.run(states, entry, *self._body_rows(inputs, rows), earlier)

    def _body_rows(self, inputs: BlockInputs, rows: torch.Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The body's call of the forward, cut to ``rows``, its KV cache neutralised and no outputs collected."""
        if inputs.body_call is None:
            raise RuntimeError("no body call was captured for this forward: run it inside FocalDepthDecoder.capture()")
        args, kwargs = inputs.body_call
        args = _rows_of(args, rows, inputs.batch_size, self.body_axes, ("*",))
        kwargs = _neutralised(_rows_of(kwargs, rows, inputs.batch_size, self.body_axes))
        for name in ("output_hidden_states", "output_attentions", "output_router_logits"):
            if name in kwargs:
                kwargs[name] = False
        return args, kwargs

    def read_at(self, inputs: BlockInputs, windows: dict[int, tuple[int, int]]) -> None:
        """Say, before a forward, which positions ``[start, stop)`` of which batch rows the next
        :meth:`confidences` will ask about (its spans lie within them): the source layers are then decoded
        while the forward runs."""
        inputs.windows = dict(sorted(windows.items()))

    @contextmanager
    def capture(self) -> Iterator[BlockInputs]:
        """Hooks that record, for every forward of the model inside the block, the source layers' states, what the
        blocks and the final norm were called with (calls outside the model's forward — the lens, the decoder itself
        — are not recorded), and decode full chunks as the forward goes (:meth:`read_at`); where the decoder replays
        the forward (:attr:`replays`, or a looped model while :meth:`check` decides), the model's call of its body and
        each block call's output as state i instead of block i's input. Nothing is recorded when m = 0."""
        inputs = BlockInputs()
        if not self.blocks:
            yield inputs
            return
        inside = [False]
        first_rerun = len(self.all_blocks) - self.depth
        first_source, stop_source = self.source_layers[0], self.source_layers[-1] + 1

        def enter(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            inside[0] = True
            ids = kwargs.get("input_ids", args[0] if args else None)
            tokens = ids if ids is not None else kwargs.get("inputs_embeds")
            device_type = tokens.device.type
            autocast = torch.is_autocast_enabled(device_type)
            inputs.new_forward(int(tokens.shape[0]), device_type,
                               torch.get_autocast_dtype(device_type) if autocast else None, len(self.blocks))

        def leave(_module: nn.Module, _args: tuple[Any, ...], _output: Any) -> None:
            inside[0] = False

        def block_hook(index: int) -> Any:
            def record(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                if not inside[0] or inputs.decoding:
                    return
                hidden, kept = block_call(module, args, kwargs)
                inputs.type_kwargs[self.block_types[index]] = kept
                if index >= first_rerun:
                    inputs.block_kwargs[index - first_rerun] = kept
                if first_source <= index < stop_source:
                    self._add_source(inputs, index - first_source, self.readout.batch_first(hidden.detach()))

            return record

        replays = self.replays or self.readout.looped  # looped: the blocks alone are never its computation
        entry = self.readout.num_layers - self.depth  # the state the re-run starts from
        last_source = stop_source == self.readout.num_layers + 1  # state L: the final norm's input

        def norm_hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
            if inside[0] and not inputs.decoding:
                inputs.final_norm_input = args[0].detach()
                if last_source and not replays:
                    self._add_source(inputs, len(self.source_layers) - 1, inputs.final_norm_input)

        def leave_replayed(_module: nn.Module, _args: tuple[Any, ...], _output: Any) -> None:
            if inside[0] and last_source and inputs.final_norm_input is not None:  # its last call's (Dory calls it more)
                self._add_source(inputs, len(self.source_layers) - 1, inputs.final_norm_input)
            inside[0] = False

        def body_hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if inside[0]:
                inputs.body_call = (args, _neutralised(kwargs))  # no KV cache held

        def call_input(index: int, state: torch.Tensor) -> None:
            if inside[0] and index == 0 and first_source == 0:
                self._add_source(inputs, 0, self.readout.batch_first(state.detach()))

        def call_output(index: int, output: Any) -> None:  # state index + 1, the last one the final norm's input
            if inside[0] and index < entry:  # what the replay gives instead of running these calls again
                inputs.earlier_outputs[index] = output
            if inside[0] and first_source <= index + 1 < min(stop_source, self.readout.num_layers):
                self._add_source(inputs, index + 1 - first_source, self.readout.batch_first(output_state(output).detach()))

        handles = []
        calls = block_calls(self.calls, on_input=call_input, on_output=call_output, reset_on=self.model)
        with ExitStack() as stack:
            stack.callback(lambda: [handle.remove() for handle in handles])
            handles.append(self.model.register_forward_pre_hook(enter, with_kwargs=True))
            handles.append(self.model.register_forward_hook(leave_replayed if replays else leave, always_call=True))
            if self.replay is not None:
                handles.append(self.replay.body.register_forward_pre_hook(body_hook, with_kwargs=True))
            if self.readout.lens_input is not None:  # the final norm, or the module that merges the streams
                handles.append(self.readout.lens_input.register_forward_pre_hook(norm_hook))
            else:  # no final norm, or a merge in the forward's own code: the last block's output
                handles.append(self.readout.last_block.register_forward_hook(
                    lambda module, _args, output: norm_hook(module, (self.readout.batch_first(
                        output[0] if isinstance(output, (tuple, list)) else output),))))
            if replays:  # the calls counted in order, each call's output a state
                stack.enter_context(calls)
            else:
                for index, block in enumerate(self.all_blocks):
                    handles.append(block.register_forward_pre_hook(block_hook(index), with_kwargs=True))
            yield inputs

    def _add_source(self, inputs: BlockInputs, source: int, states: torch.Tensor) -> None:
        """Source ``source``'s states arrived during the forward; decode the chunks that are full, if the windows are
        known and a block of every re-run attention type has run."""
        if inputs.windows is None:  # the positions are not known yet: hold the states for confidences()
            inputs.sources[source] = states
            return
        if not inputs.windows:  # no row will be asked about (HFLM's batch-size search): nothing to hold
            return
        inputs.sources[source] = states
        inputs.pending.extend((source, row) for row in inputs.windows)
        per_chunk = self._per_chunk(states.shape[1])
        if (not self.decodes_during_forward or not self.rerun_types.issubset(inputs.type_kwargs)
                or len(inputs.pending) < per_chunk):
            return
        borrowed = [inputs.type_kwargs[self.block_types[index]] for index in range(len(self.all_blocks) - self.depth,
                                                                                    len(self.all_blocks))]
        inputs.borrowed.append(borrowed)
        token = _OUTPUT_COLLECTOR.set(None)  # the re-run blocks' outputs are not the forward's hidden_states
        inputs.decoding = True  # nor are their inputs the forward's (this capture's own hooks)
        try:
            while len(inputs.pending) >= per_chunk:
                self._decode_chunk(inputs, inputs.pending[:per_chunk], borrowed)
                del inputs.pending[:per_chunk]
                inputs.decoded_during_forward += 1
        finally:
            inputs.decoding = False
            _OUTPUT_COLLECTOR.reset(token)
        waiting = {source for source, _ in inputs.pending}
        for done in [s for s in inputs.sources if s not in waiting]:
            del inputs.sources[done]

    def _rerun(self, states: torch.Tensor, kwargs_of: Sequence[dict[str, Any]], rows: torch.Tensor,
               batch_size: int) -> torch.Tensor:
        """The last m blocks on ``states [n, T, ...]`` (batch first: :meth:`LensReadout.batch_first`), rows ``rows`` of
        the forward's batch of ``batch_size``, each with those rows of the arguments ``kwargs_of`` it got; batch
        first."""
        states = self.readout.block_layout(states)
        shared: dict[int, Any] = {}  # what the blocks share and fill as they run: one new one for this re-run
        for block, kwargs in zip(self.blocks, kwargs_of, strict=True):
            result = block(states, **_rows_of(kwargs, rows, batch_size, self.batch_axes, shared=shared))
            states = result[0] if isinstance(result, (tuple, list)) else result
        return self.readout.batch_first(states)

    def _per_chunk(self, length: int) -> int:
        return max(1, self.chunk_tokens // max(length, 1))

    def _decode_chunk(self, inputs: BlockInputs, chunk: Sequence[tuple[int, int]], kwargs_of: Sequence[dict[str, Any]]) -> None:
        """Run the last m blocks on the chunk's (source, row) sequences, then the lens at each row's window."""
        first_device = next(self.blocks[0].parameters()).device
        rows = torch.tensor([row for _, row in chunk])
        states = torch.stack([inputs.sources[source][row].to(first_device) for source, row in chunk])
        with torch.no_grad(), torch.autocast(device_type=inputs.device_type,
                                             dtype=inputs.autocast_dtype or torch.float32,
                                             enabled=inputs.autocast_dtype is not None):
            if self.replays:
                states = self._replayed(states, inputs, rows)
            else:
                states = self._rerun(states, kwargs_of, rows, inputs.batch_size)
        windows = [inputs.windows[row] for _, row in chunk]
        first = self.readout.prepended  # the model's own positions before the sequence's (CPM-Ant's prompt)
        picked = torch.cat([states[k, first + start : first + stop] for k, (start, stop) in enumerate(windows)])
        masses = self._masses(picked, normalized=False).cpu()
        offset = 0
        for pair, (start, stop) in zip(chunk, windows, strict=True):
            inputs.masses[pair] = masses[offset : offset + stop - start]
            offset += stop - start

    @torch.no_grad()
    def confidences(
        self, hidden_states: Sequence[torch.Tensor], inputs: BlockInputs, spans: Sequence[tuple[int, int, int]]
    ) -> list[torch.Tensor]:
        """Top-K mass of D_m(H_i) for every source layer i at each span's positions.

        Args:
            hidden_states: the forward's L+1 HF ``hidden_states`` ``[B, T, H]`` (the last one post-norm; ``None`` for a
                layer that is not kept). m = 0 reads the source layers here; m ≥ 1 reads what :meth:`capture` took.
            inputs: what :meth:`capture` recorded during that same forward.
            spans: ``(row, start, stop)``: batch row and its response positions ``[start, stop)`` (within the
                row's window of :meth:`read_at`, when one was given).

        Returns:
            Per span, a float32 CPU tensor ``[S, stop − start]`` in [K/V, 1] (S source layers, in order).
        """
        num_layers = self.readout.num_layers
        if len(hidden_states) != num_layers + 1:
            raise ValueError(f"got {len(hidden_states)} hidden-state tensors for a model with {num_layers} layers")
        lengths = [stop - start for _, start, stop in spans]
        if not spans:
            inputs.windows = None
            return []
        if not self.blocks:
            masses = torch.stack([
                self._masses(
                    torch.cat([hidden_states[layer][row, start:stop] for row, start, stop in spans]),
                    normalized=layer == num_layers,
                )
                for layer in self.source_layers
            ])
            return [part.cpu() for part in masses.split(lengths, dim=1)]
        if self.readout.looped and not self.replays:
            raise RuntimeError("a looped model's Ω replays its forward: run FocalDepthDecoder.check() first")
        captured = inputs.body_call is not None if self.replays else (
            len(inputs.block_kwargs) == len(self.blocks) and all(inputs.block_kwargs))
        if inputs.final_norm_input is None or not captured or len(inputs.sources) + len(inputs.masses) == 0:
            raise RuntimeError("no block inputs were captured for this forward: run it inside FocalDepthDecoder.capture()")
        batch, length = inputs.final_norm_input.shape[:2]
        length -= self.readout.prepended  # the sequence's positions (the blocks' less the model's own before them)
        kept = next((h for h in hidden_states if h is not None), None)
        if inputs.batch_size != batch or (kept is not None and kept.shape[:2] != (batch, length)):
            raise RuntimeError(
                f"the captured block inputs (batch {inputs.batch_size}) belong to another forward than the states "
                f"({batch} x {length})"
            )
        for borrowed in inputs.borrowed:  # what a mid-forward decoding gave each block is what the block itself got
            for position, (used, own) in enumerate(zip(borrowed, inputs.block_kwargs, strict=True)):
                if not _same_argument(used, own):
                    raise RuntimeError(
                        f"Ω re-ran block {num_layers - self.depth + position} during the forward with the arguments of "
                        f"an earlier block of its attention type, but the model gave it others ({sorted(own)}); "
                        "a larger probe_omega_chunk_tokens (at least sources × batch × tokens) decodes after the forward")
        if inputs.windows is None:  # not said beforehand: each row's positions that the spans read
            windows: dict[int, tuple[int, int]] = {}
            for row, start, stop in spans:
                lo, hi = windows.get(row, (start, stop))
                windows[row] = (min(lo, start), max(hi, stop))
            self.read_at(inputs, windows)
            inputs.pending = [(source, row) for source in sorted(inputs.sources) for row in inputs.windows]
        per_chunk = self._per_chunk(length + self.readout.prepended)  # the re-run sequences: the blocks' length
        while inputs.pending:
            self._decode_chunk(inputs, inputs.pending[:per_chunk], inputs.block_kwargs)
            del inputs.pending[:per_chunk]
        out = []
        for row, start, stop in spans:
            lo, hi = inputs.windows.get(row, (start, start))
            if not lo <= start <= stop <= hi:
                raise ValueError(f"span {start}:{stop} of row {row} is outside the positions {lo}:{hi} read_at gave")
            out.append(torch.stack([inputs.masses[source, row][start - lo : stop - lo]
                                    for source in range(len(self.source_layers))]))
        inputs.windows = None
        inputs.sources, inputs.masses = {}, {}
        return out

    def _masses(self, hidden: torch.Tensor, *, normalized: bool) -> torch.Tensor:
        """``[n, H]`` states → ``[n]`` top-K masses of their lens readout, ``chunk_positions`` at a time."""
        parts = [
            top_k_mass(self.readout.logits(hidden[lo : lo + self.chunk_positions], normalized=normalized), self.top_k)
            for lo in range(0, hidden.shape[0], self.chunk_positions)
        ]
        return torch.cat(parts) if parts else torch.empty(0, device=self.readout.device)
