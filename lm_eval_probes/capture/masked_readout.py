"""The lens of a masked-diffusion LM (``hf-probes-diffusion``, ``probe_traces=true``): any layer's states read out
through the model's own masked-LM readout, and the lens grid of a response from states already captured.

A masked LM's readout is not always a final norm and one unembedding: BERT's head is a dense layer, an activation and a
norm before its decoder, and its blocks end in their own norm (each layer's output is normalised as the last one is).
So the readout is found by what the model's forward does, not by names: one forward of fixed ids at load
(:func:`masked_lm_readout`) finds the module that reads ``hidden_states[L]`` and returns the logits (LLaDA's
``ff_out``, Dream's ``lm_head``, BERT's ``cls``), or one that reads it and whose output the output embedding turns into
the logits (a head then a decoder). Where the model's final norm (by its conventional names,
:func:`~lm_eval_probes.capture.parts.architecture_of`) gives ``hidden_states[L]`` (Hugging Face's convention: the last
state is post-norm), the lens of a layer l < L is ``head(norm(h_l))``; otherwise ``head(h_l)``. The readout is checked
against the model's own log-probabilities on the same forward (:data:`~lm_eval_probes.capture.readouts.LENS_TOLERANCE`),
so a wrong reading is never silent.

:func:`lens_grid_of` reads the kept layers' states at a few positions into a
:class:`~lm_eval_probes.capture.positions.LensGrid` (three ``[k, n]`` tensors: the per-position reductions only, never
a layer's ``[n, V]`` logits beyond one chunk).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from lm_eval_probes.capture.parts import UnsupportedModelError, architecture_of, get_path, model_type_of
from lm_eval_probes.capture.positions import LensGrid, lens_cells
from lm_eval_probes.capture.readouts import CHECK_FLOOR, CHECK_TOKENS, LENS_TOLERANCE


class MaskedLMReadout:
    """A masked-diffusion LM's lens: ``[n, d]`` states of any layer → float32 logits ``[n, V]`` through the model's own
    readout (``head``, after ``norm`` for a layer below the last where the last state is post-norm). Built and checked
    by :func:`masked_lm_readout`."""

    def __init__(self, head: nn.Module, decoder: nn.Module | None, norm: nn.Module | None, num_layers: int,
                 vocab_size: int) -> None:
        self.head, self.decoder, self.norm = head, decoder, norm
        self.num_layers = num_layers
        self.vocab_size = vocab_size
        parameter = next(head.parameters(), None)
        self.device = parameter.device if parameter is not None else torch.device("cpu")
        self.dtype = parameter.dtype if parameter is not None else torch.float32

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor, *, normalized: bool) -> torch.Tensor:
        """``[n, d]`` → float32 ``[n, V]``; ``normalized``: ``hidden`` is the last layer's (post-norm where the model's
        is) state."""
        hidden = hidden.to(self.device, self.dtype).unsqueeze(0)  # the head is called as the model calls it
        if not normalized and self.norm is not None:
            hidden = self.norm(hidden)
        out = self.head(hidden)
        if self.decoder is not None:
            out = self.decoder(out)
        return out[0].float()


def _equal(a: Any, b: torch.Tensor) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


@torch.no_grad()
def masked_lm_readout(model: nn.Module, *, tokens: int = CHECK_TOKENS) -> MaskedLMReadout:
    """The :class:`MaskedLMReadout` of ``model`` (see the module docstring), found and checked on one forward of
    ``tokens`` fixed ids: the lens on ``hidden_states[L]`` (and, with a norm, on the norm's input: the last block's
    output) must reproduce the model's own log-probabilities within the tolerance of the head's dtype.
    :class:`~lm_eval_probes.capture.parts.UnsupportedModelError` in one line otherwise."""
    where = f"model_type {model_type_of(model)!r}"
    embeddings = model.get_input_embeddings()
    vocab = embeddings.weight.shape[0] if hasattr(embeddings, "weight") else None
    if vocab is None:
        raise UnsupportedModelError(f"{where}: probe_traces=true needs the model's input embedding matrix")
    ids = ((torch.arange(tokens) * 7919 + 11) % vocab).unsqueeze(0).to(embeddings.weight.device)
    calls: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []

    def record(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if args and isinstance(args[0], torch.Tensor) and isinstance(output, torch.Tensor):
            calls.append((module, args[0].detach(), output.detach()))

    handles = [module.register_forward_hook(record) for module in model.modules() if module is not model]
    try:
        out = model(input_ids=ids, output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    states = getattr(out, "hidden_states", None)
    if not states:
        raise UnsupportedModelError(f"{where}: its forward returns no hidden_states")
    last, logits = states[-1].detach(), out.logits.detach()
    num_layers = len(states) - 1
    decoder = model.get_output_embeddings()
    head: nn.Module | None = None
    chained: nn.Module | None = None
    for module, given, output in calls:  # innermost first (a hook runs as its module returns)
        if _equal(given, last) and output.shape == logits.shape and torch.equal(output.to(logits.dtype), logits):
            head = module
            break
    if head is None and decoder is not None:  # a head, then the output embedding (ModernBERT's head → decoder)
        decoder_inputs = [given for module, given, _ in calls if module is decoder]
        for module, given, output in calls:
            if module is not decoder and _equal(given, last) and decoder_inputs and _equal(output, decoder_inputs[-1]):
                head, chained = module, decoder
                break
    if head is None:
        raise UnsupportedModelError(
            f"{where}: probe_traces=true finds no module of {type(model).__name__} that reads hidden_states[L] into "
            "its logits (the masked-LM readout the lens grid needs)")
    norm = None
    try:
        spec = architecture_of(model)
    except UnsupportedModelError:
        spec = None
    if spec is not None and spec.final_norm:
        candidate = get_path(model, spec.final_norm)
        normed = [(given, output) for module, given, output in calls if module is candidate]
        if normed and _equal(normed[-1][1], last):  # the last state is post-norm: the layers below it need the norm
            norm = candidate
    readout = MaskedLMReadout(head, chained, norm, num_layers, logits.shape[-1])
    want = torch.log_softmax(logits[0].float(), dim=-1).to(readout.device)
    compared = want > CHECK_FLOOR
    want = want.masked_fill(~compared, -math.inf).log_softmax(-1)
    atol, rtol = LENS_TOLERANCE.get(readout.dtype, LENS_TOLERANCE[torch.bfloat16])
    bound = atol + rtol * float(logits[0].float().to(readout.device)[compared].abs().max())
    checks = [(last[0], True, "hidden_states[L]")]
    if norm is not None:
        checks.append((normed[-1][0][0], False, "the final norm's input"))
    for hidden, normalized, read in checks:
        got = torch.log_softmax(readout.logits(hidden, normalized=normalized), dim=-1)
        got = got.masked_fill(~compared, -math.inf).log_softmax(-1)
        difference = float((got - want)[compared].abs().max())
        if not difference <= bound:
            raise UnsupportedModelError(
                f"{where}: the masked-LM lens on {read} differs from the model's own log-probabilities by up to "
                f"{difference:.3g} (allowed {bound:.3g})")
    return readout


@torch.no_grad()
def lens_grid_of(
    layer_states: Mapping[int, torch.Tensor],
    readout: MaskedLMReadout,
    emitted: torch.Tensor,
    *,
    chunk_positions: int,
    ruled_out: Sequence[int] = (),
) -> LensGrid:
    """The lens grid of ``n`` positions: ``layer_states`` (``hidden_states`` index → ``[n, H]``, the kept layers; the
    last one, L, read as post-norm) read out by ``readout``, :func:`~lm_eval_probes.capture.positions.lens_cells` of
    each layer against ``emitted`` ``[n]``, ``chunk_positions`` positions at a time. ``ruled_out``: tokens whose logits
    are −inf at every layer (the decoding's EOS suppression, so that the last layer is the probability the decoding
    read)."""
    layers = tuple(sorted(layer_states))
    n = emitted.shape[0]
    emitted = emitted.to(readout.device).long()
    parts: list[tuple[torch.Tensor, ...]] = []
    for lo in range(0, max(n, 1), chunk_positions):
        hi = min(n, lo + chunk_positions)
        cells = []
        for layer in layers:
            logits = readout.logits(layer_states[layer][lo:hi], normalized=layer == readout.num_layers)
            if ruled_out:
                logits[:, list(ruled_out)] = float("-inf")
            cells.append(lens_cells(logits, emitted[lo:hi]))
            del logits
        parts.append(tuple(torch.stack([c[i] for c in cells]).cpu() for i in range(3)))
    return LensGrid(layers, *(torch.cat([p[i] for p in parts], dim=1) for i in range(3)))
