"""HyperLens Ω (``probes=omega``): the refinement area of the focal-depth confidence trajectory (the math:
:mod:`lm_eval_probes.probes.omega.math`).

Its per-position values, the top-K masses of the focal-depth decodings of every source layer, need the whole sequence
of each source layer (the model's last m blocks run on it): the wrappers' whole-forward capture ``focal_depth``
(:class:`~lm_eval_probes.capture.readouts.FocalDepthDecoder`, built from :class:`OmegaOptions`) reads them from the
wrapper's own forward and attaches them as ``mass``; here they become the record fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lm_eval_probes.api import (NON_NEGATIVE, UNIT_INTERVAL, FocalDepth, Probe, ProbeOptions, Row, Shapes, TraceField,
                                as_int, as_range, option, or_none)

DEFAULT_DEPTH = 5
"""Focal depth m of Ω when ``probe_omega_depth`` is not given (L for a model with fewer than 5 blocks)."""


@dataclass(frozen=True)
class OmegaOptions(ProbeOptions):
    """Ω's options."""

    depth: int | None = option(None, "focal depth m: the source layers' states go through the model's last m blocks "
                                     "(0 = the logit lens); auto = min(5, L)", parse=or_none(as_int))
    topk: int = option(1, "K of the confidence, the top-K probability mass (K >= 1)")
    layers: tuple[int, int] | None = option(
        None, "source layers [start, stop) as hidden_states indices 0..L (e.g. 0:33); auto/all = every layer",
        parse=or_none(as_range, "", "none", "auto", "all"))
    chunk_tokens: int | None = option(
        None, "memory budget: at most this many tokens (sequences × length, at least one sequence) go through the last "
              "m blocks at once; auto = as many as fit in 512 MiB of their activations, at most 16384",
        parse=or_none(as_int))

    def __post_init__(self) -> None:
        if self.depth is not None and self.depth < 0:
            raise ValueError(f"probe_omega_depth must be an integer 0 <= m <= L (the model's blocks), got {self.depth}")
        if self.topk < 1:
            raise ValueError(f"probe_omega_topk must be an integer K >= 1, got {self.topk}")
        if self.layers is not None:
            start, stop = self.layers
            if not 0 <= start < stop:
                raise ValueError(
                    f"probe_omega_layers must be 'start:stop' with 0 <= start < stop <= L + 1 (hidden_states indices), "
                    f"got {start}:{stop}")
        if self.chunk_tokens is not None and self.chunk_tokens < 1:
            raise ValueError(f"probe_omega_chunk_tokens must be >= 1, got {self.chunk_tokens}")

    def resolved_depth(self, num_layers: int) -> int:
        """The focal depth m for a model with ``num_layers`` blocks: the option, or min(5, L); 0 <= m <= L."""
        if self.depth is None:
            return min(DEFAULT_DEPTH, num_layers)
        if not 0 <= self.depth <= num_layers:
            raise ValueError(
                f"probe_omega_depth={self.depth} is outside 0..{num_layers} (this model has {num_layers} blocks)")
        return self.depth

    def resolved_layers(self, num_layers: int) -> tuple[int, int]:
        """The source layers ``[start, stop)`` for a model with ``num_layers`` blocks (``hidden_states`` 0..L)."""
        if self.layers is None:
            return 0, num_layers + 1
        start, stop = self.layers
        if stop > num_layers + 1:
            raise ValueError(
                f"probe_omega_layers={start}:{stop} exceeds this model's hidden_states 0..{num_layers}: "
                f"valid ranges are start:stop with 0 <= start < stop <= {num_layers + 1}")
        return start, stop


class OmegaPositions:
    """Ω's :class:`~lm_eval_probes.api.PositionProbe`: per position ``mass [S, n]`` (attached from the focal-depth
    capture); per response the confidence trajectory and its refinement area."""

    reads_lens = False  # the focal-depth decoder reads every answered request, an option not chosen too
    position_axis = -1

    def __init__(self, options: OmegaOptions, num_layers: int) -> None:
        """Ω's options (focal depth, source layers, K) are the focal-depth capture's; validated against L here."""
        self.focal_depth = FocalDepth(depth=options.resolved_depth(num_layers),
                                      source_layers=options.resolved_layers(num_layers), top_k=options.topk,
                                      chunk_tokens=options.chunk_tokens)

    def layers(self) -> frozenset[int]:
        return frozenset()  # read by the focal-depth decoder from the whole forward, not at the span's positions

    def at_positions(self, chunk: Any) -> dict[str, Any]:
        return {}

    def per_position(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The trace's ``omega`` ``[n]``: at each position Σ_i (1 − its top-K mass of source layer i) (their mean over
        the positions is Ω: C_i is a mean over the positions); nothing before the masses are attached."""
        if "mass" not in values:
            return {}
        return {"omega": (1.0 - values["mass"].double()).sum(dim=0)}

    def reduce(self, values: Mapping[str, Any], *, positions: int, generation: bool) -> dict[str, Any]:
        """``omega_trajectory``: the confidence trajectory C_i over the source layers (default i = 0..L: L+1 floats),
        the mean over the response positions of the top-K mass of the focal-depth decoding of layer i; ``omega``: its
        refinement area Ω = Σ_i (1 − C_i). Nothing before the masses are attached."""
        from lm_eval_probes.probes.omega.math import confidence_trajectory, refinement_area

        if "mass" not in values:
            return {}
        trajectory = confidence_trajectory(values["mass"].double())  # nan for an empty span
        return {"omega_trajectory": tuple(trajectory.tolist()), "omega": refinement_area(trajectory)}


def omega_memory(options: OmegaOptions, shapes: Shapes) -> float:
    """The source layers' states Ω holds, and the larger of two phases of a chunk of n (source layer, sequence) pairs —
    at most ``chunk_tokens`` tokens (auto: :meth:`~lm_eval_probes.api.FocalDepth.tokens_per_chunk`, 512 MiB of
    activations), at least one sequence: the last m blocks re-run on it, holding per token the states, queries, keys,
    values and attention output (4·d) and the feed-forward's gate, up and product (3·F) in the model's dtype (the
    attention itself through PyTorch's fused kernel: no T² weights held); then, with only the blocks' output left (d per
    token), the lens of a chunk of positions (one ``[chunk, V]`` float32 buffer, the readout: the top-K and the
    log-sum-exp add nothing of that size, as measured).

    The states: at 0 < m < L the decoder decodes a chunk as soon as it is full, during the forward, and lets its
    states go — it holds the ⌈n/B⌉ + 1 source layers of a chunk and its successor, and before the first block of
    every attention type the re-run blocks use has run (Gemma-3's first full-attention block is its sixth), the w
    source layers before it; at m = 0 or m = L (a re-run of every block: decoded after the forward) all S of them.
    Measured at real widths in ``docs/performance.md``."""
    try:
        start, stop = options.resolved_layers(shapes.layers)
        depth = options.resolved_depth(shapes.layers)
    except ValueError:  # source layers or depth beyond this model's: the run refuses them; count every layer
        start, stop, depth = 0, shapes.layers + 1, shapes.layers
    length = max(shapes.tokens, 1)
    batch = max(shapes.batch, 1)
    sources = stop - start
    focal = FocalDepth(depth=depth, source_layers=(start, stop), top_k=options.topk, chunk_tokens=options.chunk_tokens)
    chunk_tokens = focal.tokens_per_chunk(shapes.width, shapes.ffn, shapes.dtype_bytes)
    sequences = min(sources * batch, max(1, chunk_tokens // length))
    if 0 < depth < shapes.layers:
        types = shapes.layer_types if len(shapes.layer_types) == shapes.layers else ("",) * shapes.layers
        waiting = max(types.index(kind) for kind in set(types[shapes.layers - depth:]))
        sources = min(sources, -(-sequences // batch) + 1 + waiting)
    states = sources * batch * length * shapes.width * shapes.dtype_bytes
    blocks = sequences * length * focal.rerun_bytes_per_token(shapes.width, shapes.ffn, shapes.dtype_bytes)
    lens = sequences * length * shapes.width * shapes.dtype_bytes + 4 * shapes.lens_positions * shapes.vocab
    return states + max(blocks, lens)


@dataclass(frozen=True)
class OmegaRecord:
    """Ω's values of one response (:meth:`OmegaPositions.reduce`; ``None``: not computed)."""

    omega: float | None = None
    omega_trajectory: tuple[float, ...] | None = None


PROBE = Probe(
    name="omega",
    summary="Ω: HyperLens refinement area of the focal-depth confidence trajectory (runs the model's last m "
            "blocks again on every source layer's states)",
    paper="HyperLens refinement area: \"HyperLens: Quantifying Cognitive Effort …\" (arXiv 2605.05741)",
    formula="C_i = mean over response positions of the top-K mass of D_m(H_i) = softmax(W_U norm(f_N ∘ … ∘ "
            "f_N−m+1(H_i))); Ω = Σ_i (1 − C_i)",
    reads="every source layer's states at the response positions, and the last m blocks' inputs",
    record=OmegaRecord,
    position_probe=OmegaPositions,
    traces=(TraceField("omega", "omega"),),
    options=OmegaOptions,
    memory=omega_memory,
    rows=(
        Row("omega", "float", "mean", False, "probe",
            "mean over documents of the HyperLens refinement area Ω = Σ_i (1 − C_i) of the focal-depth "
            "confidence trajectory (probes=omega)", "omega",
            bounds=NON_NEGATIVE),  # at most S·(1 − K/V) for S source layers: a model's, not the row's, so no ceiling
        Row("omega_trajectory", "vector", "probe_vector_mean", True, "probe",
            "probes=omega: mean over documents and source layers of the focal-depth confidence C_i "
            "(= 1 − Ω / number of source layers); per document the trajectory C_i is in --log_samples",
            "omega_trajectory", bounds=UNIT_INTERVAL),
    ),
    ranked="omega",
    ranked_text="Ω",
    label="HyperLens Ω",
)
