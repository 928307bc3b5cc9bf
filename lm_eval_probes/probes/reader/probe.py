"""The reader's hidden states (``probes=reader``; the math of the readers fitted on them:
:mod:`lm_eval_probes.probes.reader.math`): the mean states of a few layers over the answer (and the prompt), on which the
latent correctness reader and the corruption detector are fitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lm_eval_probes.api import (UNIT_INTERVAL, LayerStates, Probe, ProbeOptions, PromptMeans, Row, Shapes, as_int_list,
                                option)

LAYER_FRACTIONS: tuple[float, ...] = (1 / 2, 2 / 3, 5 / 6)
"""Default reader layers: round(f · L) for these f (mid to late layers)."""


def _folder(_key: str, value: Any) -> str | None:
    text = "" if value is None else str(value).strip()
    return None if text.lower() in ("", "none") else text


@dataclass(frozen=True)
class ReaderOptions(ProbeOptions):
    """The reader's options."""

    layers: tuple[int, ...] | None = option(
        None, "hidden_states indices (0 = embeddings … L) whose mean states are recorded, e.g. 12+16+20; "
              "auto = round(f·L) for f in 1/2, 2/3, 5/6", parse=as_int_list)
    tail: int = option(16, "generation only: the last positions whose states are kept one by one (float16), so the "
                           "reader can average over the answer span the task's filter extracts")
    prompt_tail: int = option(0, "the prompt states are the mean over the last this-many prompt positions (0 = the "
                                 "whole prompt)")
    save_states: str | None = option(
        None, "a folder where the reader layers' answer and prompt states of every answered request are written "
              "(safetensors, with an index), for your own probes", parse=_folder, shown="none",
        key="probe_save_states", requires_probe=True, identity=False)

    def __post_init__(self) -> None:
        if self.layers is not None and (not self.layers or min(self.layers) < 0):
            raise ValueError(f"probe_reader_layers must be hidden_states indices >= 0, got {self.layers}")
        if self.tail < 0:
            raise ValueError(f"probe_reader_tail must be >= 0, got {self.tail}")
        if self.prompt_tail < 0:
            raise ValueError(f"probe_reader_prompt_tail must be >= 0 (0 = the whole prompt), got {self.prompt_tail}")

    def resolved_layers(self, num_layers: int) -> tuple[int, ...]:
        """The reader layers for a model with ``num_layers`` blocks (``hidden_states`` has L+1 entries)."""
        if self.layers is None:
            return tuple(sorted({min(num_layers, max(1, round(f * num_layers))) for f in LAYER_FRACTIONS}))
        too_deep = [layer for layer in self.layers if layer > num_layers]
        if too_deep:
            raise ValueError(f"probe_reader_layers {too_deep} exceed the model's {num_layers} layers (0..{num_layers})")
        return tuple(self.layers)


class ReaderPositions:
    """The reader's :class:`~lm_eval_probes.api.PositionProbe`: per position the reader layers' states (float32); per
    response their mean and (generations) the last positions' states one by one. Reads no lens: every answered request
    keeps them, also an option the model did not choose."""

    reads_lens = False
    position_axis = 1

    def __init__(self, options: ReaderOptions, num_layers: int) -> None:
        self.reader_layers = options.resolved_layers(num_layers)
        self.tail = options.tail
        self.prompt_means = PromptMeans(self.reader_layers, "prompt_states", options.prompt_tail)
        self.states_folder = options.save_states

    def layers(self) -> frozenset[int]:
        return frozenset(self.reader_layers)

    def at_positions(self, chunk: Any) -> dict[str, Any]:
        """``states [k, n, H]``: the k reader layers' states, float32."""
        import torch

        return {"states": torch.stack([chunk.states(layer).detach().float().cpu() for layer in self.reader_layers])}

    def reduce(self, values: Mapping[str, Any], *, positions: int, generation: bool) -> dict[str, Any]:
        """``answer_states``: ``[k, H]`` the mean hidden state over the response positions at the reader layers;
        ``tail_states`` (generations, ``probe_reader_tail`` > 0): ``[k, m, H]`` the states of the last m = ``tail``
        response positions (float16; float32 when a value exceeds float16's range), so that the reader can average
        over the answer span the task's filter extracts later. Neither without positions. (``prompt_states``, the mean
        over the prompt, is measured by the wrappers: :attr:`prompt_means`.)"""
        states = values["states"]
        tail = self.tail if generation else 0
        fields: dict[str, Any] = {}
        if positions:
            fields["answer_states"] = answer_mean_states(self.reader_layers, states)
        if positions and tail:
            fields["tail_states"] = compact_states(self.reader_layers, states[:, -tail:])
        return fields


def answer_mean_states(layers: Any, states: Any) -> LayerStates:
    """The reader's answer states: ``[k, n, H]`` states of the response positions, averaged over positions in float64."""
    return LayerStates(tuple(layers), states.double().mean(1).float().numpy())


def compact_states(layers: Any, states: Any) -> LayerStates:
    """``[k, m, H]`` states kept one by one: float16, or float32 where a value exceeds float16's range (±65504, as in
    Gemma's residual stream)."""
    import torch

    packed = states.half()
    if not torch.isfinite(packed).all().tolist():  # host values (tolist: no single-value read)
        packed = states.float()
    return LayerStates(tuple(layers), packed.numpy())


def reader_states(record: Any, field: str, *, answer_span: bool = False) -> LayerStates | None:
    """The states a reader row reads from ``record`` (a :class:`~lm_eval_probes.records.ResponseProbe`): its field
    ``field``; for ``answer_states`` with ``answer_span`` (generations whose confidence reads the located answer), the
    mean over the answer span of the last positions' states the record kept one by one (``tail_states``), or the whole
    response's mean when there is no span or the answer begins before the tail."""
    if answer_span and field == "answer_states":
        span, tail = record.answer_span, record.get("tail_states")
        if span is not None and tail is not None:
            start, stop = span
            offset = record.n_tokens - tail.values.shape[1]  # response index of the tail's first position
            if start >= offset:
                return tail.mean_positions(start - offset, stop - offset)
    value = record.get(field)
    return value if isinstance(value, LayerStates) else None


def reader_memory(options: ReaderOptions, shapes: Shapes) -> float:
    """The reader layers' float32 states at the response positions, twice (its k distinct layers' states per chunk of
    positions, then their concatenation over the response's chunks: 2·k, as measured), and the prompt means' batch of
    weights."""
    try:
        layers = 2 * len(options.resolved_layers(shapes.layers))
    except ValueError:  # layers beyond this model's: the run refuses them
        layers = 2 * len(options.layers)
    return layers * shapes.batch * (shapes.response_tokens + 1) * shapes.width * 4 + shapes.batch * shapes.tokens * 4


@dataclass(frozen=True)
class ReaderStates:
    """The reader's states of one response (:meth:`ReaderPositions.reduce`; ``prompt_states``: the wrappers' prompt
    means; ``None``: not computed)."""

    answer_states: LayerStates | None = None
    prompt_states: LayerStates | None = None
    tail_states: LayerStates | None = None


PROBE = Probe(
    name="reader",
    summary="the mean hidden states (answer and prompt positions, a few layers) that the latent correctness "
            "reader and the corruption detector are fitted on",
    paper="Latent Correctness Reader and corruption detector: \"Unsure but Certain\" (arXiv 2608.08791)",
    formula="mean hidden state over the answer (prompt) positions at the reader layers (L/2, 2L/3, 5L/6) → "
            "standardised L2 logistic regression, out-of-fold P(correct) (P(noised))",
    reads="the reader layers' states at the response (answer) and prompt positions",
    record=ReaderStates,
    position_probe=ReaderPositions,
    options=ReaderOptions,
    memory=reader_memory,
    default_enabled=True,
    feed_states=reader_states,
    feeds=(
        Row("lcr_auroc", "reader", "probe_lcr_auroc", True, "reader",
            "latent correctness reader: out-of-fold AUROC of P(correct) from answer hidden states", "answer_states",
            bounds=UNIT_INTERVAL),
        Row("lcr_ece", "reader", "probe_lcr_ece", False, "reader",
            "latent correctness reader: ECE of its out-of-fold P(correct)", "answer_states", bounds=UNIT_INTERVAL),
        Row("corruption_auroc", "reader", "probe_corruption_auroc", True, "detector",
            "corruption detector: cross-fitted AUROC of clean vs noised prompts from prompt hidden states",
            "prompt_states", bounds=UNIT_INTERVAL),
    ),
)
