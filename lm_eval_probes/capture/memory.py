"""``batch_size=auto`` that counts the probes: each forward of a probed call holds the enabled probes' declared extra
memory (:attr:`~lm_eval_probes.api.Probe.memory`, for that forward's shapes) while it runs.

HFLM sizes ``--batch_size auto`` by running plain forwards of the longest request at halving batch sizes until one
does not run out of memory; no probe computes anything there. :func:`reserved_during_forwards` makes every forward of
the model (those of the detection and, consistently, the run's own) allocate the probes' figure on the model's device
before it runs and free it after, so the batch size that passes detection leaves room for the probes. A forward that
cannot have both fails with the device's own out-of-memory error, which the detection catches and halves on.
Without ``auto`` nothing is reserved.
"""

from __future__ import annotations

import functools

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from lm_eval_probes import registry
from lm_eval_probes.api import Shapes
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.stack_api import float32_products_native


def model_shapes(model: nn.Module, *, batch: int, tokens: int, vocab: int, chunk_positions: int) -> Shapes:
    """The :class:`~lm_eval_probes.api.Shapes` of a forward of ``batch`` × ``tokens`` through ``model`` (a Hugging Face
    ``*ForCausalLM``; every position counted as a response position: the most a forward can ask of the probes)."""
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    width = int(_largest(text, "hidden_size") or 0)
    heads = int(_largest(text, "num_attention_heads") or 1)
    head_dim = int(_largest(text, "head_dim") or (width // heads if heads else 0))
    layers = int(getattr(text, "num_hidden_layers", 0) or 0)
    dtype_bytes = next((p.element_size() for p in model.parameters() if p.is_floating_point()), 4)
    ffn = int(_largest(text, "intermediate_size") or 0)
    layer_types = tuple(getattr(text, "layer_types", None) or ())
    kv_heads = int(_largest(text, "num_key_value_heads") or heads)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    return Shapes(batch=batch, tokens=tokens, response_tokens=tokens, layers=layers, width=width, vocab=vocab,
                  heads=heads, head_dim=head_dim, dtype_bytes=dtype_bytes, chunk_positions=chunk_positions, ffn=ffn,
                  layer_types=layer_types, kv_heads=kv_heads, tensor_cores=float32_products_native(device))


def _largest(config: Any, name: str) -> Any:
    """``config.name``, or, where the config sets it per layer (transformers' heterogeneous configs, whose global
    value raises: Gemma-4's ``head_dim``, dots3's ``num_attention_heads``), its largest value over the layers (the
    most a forward can ask); ``None`` where absent. A list of one value per layer (Gemma-3n's ``intermediate_size``)
    gives its largest too."""
    if name in (getattr(config, "per_layer_attributes", None) or ()):
        values = [getattr(layer, name, None) for layer in config.per_layer_config]
    else:
        value = getattr(config, name, None)
        values = list(value) if isinstance(value, (list, tuple)) else [value]
    return max((v for v in values if v is not None), default=None)


def token_logprob_memory(shapes: Shapes) -> int:
    """The generated tokens' log-probabilities of a chunk of positions (bytes): its final logits and their
    log-softmax, two float32 ``[chunk, V]`` (the final logits stay for the probes that read them)."""
    return 2 * shapes.lens_positions * shapes.vocab * 4


def capture_memory(config: ProbeConfig, shapes: Shapes) -> int:
    """What the wrappers hold for any enabled probe, counted once (bytes): the forward's ``hidden_states`` of the layers
    the probes keep (:attr:`~lm_eval_probes.capture.plan.ProbePlan.kept_layers`, k of them: ``k·B·T·d·b``) and, for a
    model below float32, the lens's float32 block of W's rows (:class:`~lm_eval_probes.probes.row_blocks.RowBlocks`:
    at most 2²⁴ values, 64 MiB)."""
    if not config.probes:
        return 0
    states = _kept_count(config, shapes.layers) * shapes.batch * shapes.tokens * shapes.width * shapes.dtype_bytes
    from lm_eval_probes.probes.row_blocks import ROW_BLOCK_ELEMENTS

    rows = min(shapes.vocab, max(1, ROW_BLOCK_ELEMENTS // max(shapes.width, 1)))
    block = rows * shapes.width * 4 if shapes.dtype_bytes < 4 else 0
    return states + block


@functools.lru_cache(maxsize=32)
def _kept_count(config: ProbeConfig, num_layers: int) -> int:
    """How many ``hidden_states`` a forward keeps under ``config`` (once per configuration and depth: it is asked at
    every forward under ``batch_size=auto``)."""
    from lm_eval_probes.capture.plan import ProbePlan

    try:
        return len(ProbePlan.of(config, num_layers).kept_layers)
    except ValueError:  # options that do not fit this depth (the run refuses them): every layer
        return num_layers + 1


def declared(config: ProbeConfig, shapes: Shapes) -> dict[str, int]:
    """Each enabled probe's own declared extra memory for a forward of ``shapes`` (:attr:`~lm_eval_probes.api.Probe.memory`,
    bytes), by name."""
    return {probe.name: probe.memory_bytes(config.options_of(probe.name), shapes)
            for probe in registry.probes() if probe.name in config.probes}


def probes_memory(config: ProbeConfig, shapes: Shapes) -> int:
    """What ``batch_size=auto`` reserves for a forward of ``shapes`` (bytes): :func:`capture_memory`, the generated
    tokens' log-probabilities (:func:`token_logprob_memory`) and the sum of the enabled probes' declared memory (an
    upper bound: these buffers are not all alive at once)."""
    if not config.probes:
        return 0
    return capture_memory(config, shapes) + token_logprob_memory(shapes) + sum(declared(config, shapes).values())


def expected_peak(config: ProbeConfig, shapes: Shapes) -> int:
    """The memory model of ``docs/performance.md``: the extra peak over ``probes=none`` expected for a forward of
    ``shapes`` (bytes): :func:`capture_memory` and the largest of the enabled probes' declared memory and the generated
    tokens' log-probabilities (each is a phase of its own: the probes run one after the other on each chunk of
    positions, each freeing its buffers)."""
    if not config.probes:
        return 0
    phases = [*declared(config, shapes).values(), token_logprob_memory(shapes)]
    return capture_memory(config, shapes) + max(phases)


def reserve(size: int, device: torch.device) -> torch.Tensor:
    """``size`` bytes on ``device`` (allocated, not written: the device's allocator says whether they fit)."""
    return torch.empty(size, dtype=torch.uint8, device=device)


@contextmanager
def reserved_during_forwards(
    model: nn.Module, config: ProbeConfig, *, vocab: int, enabled: bool = True,
    allocate: Callable[[int, torch.device], Any] | None = None,
) -> Iterator[list[int]]:
    """Hooks on ``model`` that hold :func:`probes_memory` of each forward's ``input_ids`` shape while it runs; yields
    the sizes reserved, forward by forward (for tests and benchmarks). ``enabled=False``: nothing (a fixed batch
    size). ``allocate`` (default :func:`reserve`, looked up at each forward) makes the allocation."""
    reserved: list[int] = []
    held: list[Any] = []
    if not enabled or not config.probes:
        yield reserved
        return

    def before(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        held.clear()  # a forward that ran out of memory left its reservation
        ids = kwargs.get("input_ids", args[0] if args else None)
        if not isinstance(ids, torch.Tensor) or ids.ndim != 2:
            return
        shapes = model_shapes(model, batch=ids.shape[0], tokens=ids.shape[1], vocab=vocab,
                              chunk_positions=config.chunk_positions)
        size = probes_memory(config, shapes)
        if size > 0:
            held.append((allocate or reserve)(size, ids.device))
            reserved.append(size)

    def after(_module: nn.Module, _args: tuple[Any, ...], _output: Any) -> None:
        held.clear()

    handles = [model.register_forward_pre_hook(before, with_kwargs=True), model.register_forward_hook(after)]
    try:
        yield reserved
    finally:
        held.clear()
        for handle in handles:
            handle.remove()
