"""Capture hidden states during the harness's own forward passes and reduce them to per-position probe values.

* :func:`hidden_state_tap` — a context manager holding two hooks on the causal-LM module: a pre-hook
  that asks for ``output_hidden_states`` and a hook that keeps what the forward returned (the latest
  call's states, or only the last position of every call during ``generate``). Hooks never outlive
  the ``with`` block.
* :class:`~lm_eval_probes.api.PositionProbe` — one probe's capture, built from its
  :attr:`~lm_eval_probes.api.Probe.position_probe`: the layers it reads, its per-position values and their reduction
  to its record fields.
* :func:`position_probes` — every enabled probe's per-position values of one response span (all layers → a few
  floats per position and transition), computed in chunks of positions (:class:`LensChunk`) so the logit lens holds
  a few ``chunk · V`` buffers at a time, and only the readouts a probe reads; :meth:`PositionProbes.summarize`
  reduces a slice of them to a :class:`~lm_eval_probes.records.ResponseProbe`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lm_eval_probes.api import FocalDepth, PositionProbe
from lm_eval_probes.capture.plan import ProbePlan, position_axis
from lm_eval_probes.capture.readouts import LensReadout
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.stack_api import hidden_states_of, hidden_states_request
from lm_eval_probes.records import LayerStates, ResponseProbe, trace_values


@dataclass
class HiddenStateTap:
    """What the hooks of :func:`hidden_state_tap` collected.

    ``latest``: the L+1 hidden-state tensors ``[B, T, H]`` of the most recent forward call (``None`` for a layer
    :func:`hidden_state_tap` did not ask for).
    ``steps``: with ``last_position_only``, one tuple of L+1 tensors ``[B, H]`` (or ``None``) per forward call.
    ``first_call``: with ``first_call_layers``, those layers' full ``[B, T, H]`` states of the first
    call (the prefill of ``generate``: the prompt positions).
    """

    last_position_only: bool = False
    first_call_layers: tuple[int, ...] = ()
    latest: tuple[torch.Tensor | None, ...] | None = None
    steps: list[tuple[torch.Tensor | None, ...]] = field(default_factory=list)
    first_call: tuple[torch.Tensor, ...] | None = None
    calls: int = 0

    def _record(self, hidden_states: Sequence[torch.Tensor | None]) -> None:
        self.calls += 1
        if self.calls == 1 and self.first_call_layers:
            self.first_call = tuple(hidden_states[layer].detach() for layer in self.first_call_layers)
        if self.last_position_only:  # a view would keep the whole call's states
            self.steps.append(tuple(None if h is None else h[:, -1].detach().clone() for h in hidden_states))
        else:
            self.latest = tuple(None if h is None else h.detach() for h in hidden_states)


def states_request(model: nn.Module, layers: Iterable[int] | None) -> bool | list[int]:
    """The ``output_hidden_states`` argument that asks ``model`` for the ``hidden_states`` indices ``layers`` only
    (``None``: every layer). ``transformers`` keeps only those (the others are ``None`` in the tuple, never held: the
    states of every layer of a long request would be (L + 1)·B·T·d values) where its release and the model's code
    read a list as :mod:`~lm_eval_probes.stack_api` learnt at load; otherwise every layer. The forward's
    states in the L + 1 convention: :func:`~lm_eval_probes.stack_api.hidden_states_of`."""
    return hidden_states_request(model, layers)


@contextmanager
def hidden_state_tap(
    model: nn.Module, *, last_position_only: bool = False, first_call_layers: Sequence[int] = (),
    layers: Iterable[int] | None = None,
) -> Iterator[HiddenStateTap]:
    """Make every forward of ``model`` inside the block also return and record its hidden states (of ``layers`` only,
    with ``first_call_layers``: :func:`states_request`)."""
    tap = HiddenStateTap(last_position_only=last_position_only, first_call_layers=tuple(first_call_layers))
    asked = None if layers is None else {*layers, *first_call_layers}
    request = states_request(model, asked)

    def ask_for_states(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        return args, {**kwargs, "output_hidden_states": request}

    def keep_states(_module: nn.Module, _args: tuple[Any, ...], output: Any) -> None:
        states = getattr(output, "hidden_states", None)
        if states is None:
            raise RuntimeError(f"{type(model).__name__} returned no hidden_states although asked to")
        tap._record(hidden_states_of(model, request, states, asked))

    handles = [
        model.register_forward_pre_hook(ask_for_states, with_kwargs=True),
        model.register_forward_hook(keep_states),
    ]
    try:
        yield tap
    finally:
        for handle in handles:
            handle.remove()


def lens_cells(logits: torch.Tensor, emitted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's logit-lens cells at ``n`` positions: from its lens logits ``[n, V]`` and the tokens the positions
    emitted ``[n]``, the lens's most likely token ``[n]`` (int64; ties: the lowest id), its probability and the
    probability of the emitted token (float32 ``[n]`` each, in [0, 1]; softmax over the vocabulary, through the
    log-sum-exp: no ``[n, V]`` probabilities are made)."""
    logits = logits.float()
    normaliser = torch.logsumexp(logits, dim=-1)
    top_logit, top = logits.max(dim=-1)
    emitted_logit = logits.gather(-1, emitted.to(logits.device).long().unsqueeze(-1)).squeeze(-1)
    return top, (top_logit - normaliser).exp(), (emitted_logit - normaliser).exp()


class LensChunk:
    """Positions ``[lo, hi)`` of a response span and their readouts, each computed once, when first read.

    ``layer_states``: the span's L+1 ``[n, H]`` states (``None`` for a layer no enabled probe reads; the last one
    post final norm); ``readout``: the model's :class:`~lm_eval_probes.capture.readouts.LensReadout`.
    """

    def __init__(self, layer_states: Sequence[torch.Tensor | None], readout: LensReadout | None, lo: int, hi: int,
                 *, capacity: int | None = None) -> None:
        self.layer_states, self.readout, self.lo, self.hi = layer_states, readout, lo, hi
        self.capacity = hi - lo if capacity is None else capacity
        """Positions a full chunk holds: :meth:`layer_logits` reads out up to ``capacity // (hi − lo)`` layers in one
        pass over a converted unembedding."""
        self.emitted: torch.Tensor | None = None
        """``[hi − lo]`` the tokens the positions emitted (or scored), on the unembedding's device, set when the trace's
        lens grid is wanted (``probe_traces=true``): every layer's logits read out then leave their
        :func:`lens_cells` in :attr:`grid`, so the grid costs no second readout of a layer a probe reads."""
        self.grid: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        """``hidden_states`` index → that layer's :func:`lens_cells` at these positions (with :attr:`emitted` only)."""

    def _noted(self, layer: int, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (layer ``layer``'s), their lens cells noted in :attr:`grid` first (with :attr:`emitted`)."""
        if self.emitted is not None and layer not in self.grid:
            self.grid[layer] = lens_cells(logits, self.emitted)
        return logits

    def lens_grid(self, layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The lens grid of ``layers`` at these positions: ``top_token [k, n]`` (int64), ``top_prob`` and
        ``emitted_prob [k, n]`` (float32), on the CPU; a layer no probe read out is read out here (the last one is
        :attr:`final_logits`: its ``emitted_prob`` is the model's own probability of the token)."""
        if self.emitted is None:
            raise ValueError("a lens grid needs the emitted tokens of its positions (LensChunk.emitted)")
        final = len(self.layer_states) - 1
        for layer in layers:
            if layer not in self.grid:
                logits = (self.final_logits if layer == final
                          else self.readout.logits(self.states(layer), normalized=False))
                self._noted(layer, logits)
        cells = [self.grid[layer] for layer in layers]
        return tuple(torch.stack([c[i] for c in cells]).cpu() for i in range(3))  # type: ignore[return-value]

    def states(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s ``[hi − lo, H]`` states (as kept: their device and dtype)."""
        return self.layer_states[layer][self.lo : self.hi]

    @functools.cached_property
    def final_hidden(self) -> torch.Tensor:
        """The final layer's (post-norm) states, float32 on the unembedding's device."""
        return self.states(-1).to(self.readout.device).float()

    @functools.cached_property
    def raw_logits(self) -> torch.Tensor:
        """The final layer's logits ``W h + b`` before the model's soft-capping (δ_TCB's input)."""
        return self.readout.logits(self.final_hidden, normalized=True, capped=False)

    @functools.cached_property
    def final_logits(self) -> torch.Tensor:
        """The model's own logits (soft-capped where the model caps them; otherwise :attr:`raw_logits` itself)."""
        return self.readout.cap(self.raw_logits)

    def layer_logits(self, first: int, last: int) -> Iterator[torch.Tensor]:
        """The lens logits of layers ``first..last``, written into two alternating buffers
        (:func:`~lm_eval_probes.probes.consecutive_js_divergences_of_logits` is done with layer l's once layer l + 1's
        has arrived, and overwrites them); layer L's are :attr:`final_logits` (left as they are)."""
        n = self.hi - self.lo
        if self.readout.rows.converts and n and self.capacity // n > 1:
            yield from self._grouped_layer_logits(first, last, self.capacity // n)
            return
        buffers: list[torch.Tensor] = []
        for layer in range(first, last + 1):
            if layer == len(self.layer_states) - 1:
                yield self._noted(layer, self.final_logits)
                continue
            if len(buffers) < 2:
                buffers.append(torch.empty(self.hi - self.lo, self.readout.vocab_size, device=self.readout.device))
            yield self._noted(layer, self.readout.logits(self.states(layer), normalized=False,
                                                         out=buffers[(layer - first) % 2]))

    def _grouped_layer_logits(self, first: int, last: int, group: int) -> Iterator[torch.Tensor]:
        """:meth:`layer_logits` for a chunk smaller than its capacity, when W is converted a block at a time (a
        bfloat16 model): ``group`` layers' logits from one pass over W, in two alternating ``[group, n, V]`` buffers
        (the memory of two full-chunk buffers). Each layer's logits are the same dot products as one by one."""
        final = len(self.layer_states) - 1
        readout, n = self.readout, self.hi - self.lo
        buffers: list[torch.Tensor] = []
        for index, start in enumerate(range(first, last + 1, group)):
            layers = [layer for layer in range(start, min(last, start + group - 1) + 1) if layer != final]
            if layers:
                if len(buffers) < 2:
                    buffers.append(torch.empty(group * n, readout.vocab_size, device=readout.device))
                hidden = torch.cat([self.states(layer) for layer in layers])  # the final norm works row by row
                logits = readout.logits(hidden, normalized=False, out=buffers[index % 2][: len(layers) * n])
                for layer, part in zip(layers, logits.split(n), strict=True):
                    yield self._noted(layer, part)
            if start <= final <= start + group - 1 and final <= last:
                yield self._noted(final, self.final_logits)


@dataclass(frozen=True)
class LensGrid:
    """The logit lens of every kept layer at a span's positions (the trace's ``lens``, ``probe_traces=true``).

    ``layers``: the ``hidden_states`` indices (ascending; the last is L, the model's own output); ``top_token [k, n]``
    (int64) the lens's most likely token, ``top_prob [k, n]`` its probability, ``emitted_prob [k, n]`` the
    probability the lens gives the token the position emitted (or scored): :func:`lens_cells` of each layer.
    """

    layers: tuple[int, ...]
    top_token: torch.Tensor
    top_prob: torch.Tensor
    emitted_prob: torch.Tensor

    def span(self, start: int, stop: int) -> LensGrid:
        return LensGrid(self.layers, self.top_token[:, start:stop], self.top_prob[:, start:stop],
                        self.emitted_prob[:, start:stop])

    def trace(self, token_ids: Sequence[int]) -> dict[str, Any]:
        """The trace's ``lens`` (``[kept layer][position]`` lists: ``top_token`` ids, ``top_prob`` and
        ``emitted_prob`` to 4 significant digits; and ``commit_layer [position]``: the first kept layer from which
        the lens's top token is the emitted one at every kept layer up to L, ``None`` where L's top token is not the
        emitted one — a scored option the model would not have generated) and ``lens_layers``."""
        top = self.top_token.tolist()
        commit: list[int | None] = []
        for position, token in enumerate(int(t) for t in token_ids):
            found = None
            for row in range(len(self.layers) - 1, -1, -1):
                if top[row][position] != token:
                    break
                found = self.layers[row]
            commit.append(found)
        return {"lens": {"top_token": top,
                         "top_prob": [trace_values(row) for row in self.top_prob.tolist()],
                         "emitted_prob": [trace_values(row) for row in self.emitted_prob.tolist()],
                         "commit_layer": commit},
                "lens_layers": list(self.layers)}


@dataclass(frozen=True)
class PositionProbes:
    """Per-position probe values of one response span (CPU tensors).

    ``token_logprob [n]``: the log-probability of each token the positions predict (only when token ids were given).
    ``measured``: probe name → its :class:`PositionProbe` and its per-position values (positions on the probe's
    ``position_axis``). ``lens``: the kept layers' logit lens at these positions (``probe_traces=true`` with token
    ids only).
    """

    num_positions: int
    measured: Mapping[str, tuple[PositionProbe, Mapping[str, torch.Tensor]]] = field(default_factory=dict)
    token_logprob: torch.Tensor | None = None
    lens: LensGrid | None = None

    def of(self, probe: str) -> Mapping[str, torch.Tensor]:
        """The per-position values of ``probe``."""
        if probe not in self.measured:
            raise KeyError(f"probe {probe!r} was not measured at these positions (measured: {list(self.measured)})")
        return self.measured[probe][1]

    def with_values(self, probe: str, **values: torch.Tensor) -> PositionProbes:
        """These probes with ``probe``'s per-position values set (those of a reader of its own: Ω's masses)."""
        if probe not in self.measured:
            raise KeyError(f"probe {probe!r} is not enabled here (enabled: {list(self.measured)})")
        capture = self.measured[probe][0]
        for name, value in values.items():
            axis = position_axis(capture)
            if value.shape[axis] != self.num_positions:
                raise ValueError(f"{probe}'s {name} has {value.shape[axis]} positions on axis "
                                 f"{axis} (shape {tuple(value.shape)}), not {self.num_positions}")
        return dataclasses.replace(self, measured={**self.measured, probe: (capture, values)})

    def span(self, start: int, stop: int) -> PositionProbes:
        """The positions ``[start, stop)`` as their own :class:`PositionProbes`."""
        if not 0 <= start <= stop <= self.num_positions:
            raise ValueError(f"span [{start}, {stop}) outside the {self.num_positions} captured positions")
        measured = {
            name: (capture, {key: value.narrow(position_axis(capture), start, stop - start)
                             for key, value in values.items()})
            for name, (capture, values) in self.measured.items()
        }
        token_logprob = None if self.token_logprob is None else self.token_logprob[start:stop]
        lens = None if self.lens is None else self.lens.span(start, stop)
        return PositionProbes(stop - start, measured, token_logprob, lens)

    def trace(self, token_ids: Sequence[int]) -> dict[str, list[Any]]:
        """The per-token trace of these positions (see :meth:`summarize`)."""
        if self.token_logprob is None or len(token_ids) != self.num_positions:
            raise ValueError(f"a trace needs the log-probabilities and the {self.num_positions} token ids of its positions "
                             f"(got {len(token_ids)} ids{'' if self.token_logprob is not None else ', no log-probabilities'})")
        trace: dict[str, list[Any]] = {"token_ids": [int(t) for t in token_ids],
                                       "logprob": trace_values(self.token_logprob.tolist())}
        for capture, measured in self.measured.values():
            per_position = getattr(capture, "per_position", None)
            if per_position is not None:
                trace.update((name, trace_values(value.reshape(-1).tolist())) for name, value in per_position(measured).items())
            focal = getattr(capture, "focal_depth", None)
            if isinstance(focal, FocalDepth) and "mass" in measured:  # a focal-depth reader ran: its depth m
                trace["focal_depth"] = int(focal.depth)
        if self.lens is not None:
            trace.update(self.lens.trace(token_ids))
        return trace

    def summarize(
        self,
        start: int,
        stop: int,
        *,
        mean_token_logprob: float | None = None,
        prompt_tokens: int | None = None,
        fields: Mapping[str, Any] | None = None,
        generation: bool = False,
        token_ends: Sequence[int] | None = None,
        empty: bool = False,
        trace_ids: Sequence[int] | None = None,
    ) -> ResponseProbe:
        """Reduce positions ``[start, stop)`` to a :class:`ResponseProbe`: each measured probe's record fields by its
        :meth:`PositionProbe.reduce`.

        ``mean_token_logprob`` overrides the value from ``token_logprob`` (loglikelihood requests
        already know their summed log-probability). ``fields``: record fields measured by the wrapper itself (the reader's
        states over the prompt), set as they are (``None`` values left out). Generations pass ``generation`` (a probe may keep more of a generation: the
        reader its last positions' states one by one) and ``token_ends`` (character end of each token in the response text); they then also keep every token's
        log-probability. ``empty`` marks a generation whose kept text is empty, summarized at the one position that
        chose to stop. ``trace_ids`` (``probe_traces=true``; positions measured with their token ids): the response's
        token ids; the record then carries its trace: ``token_ids``, ``logprob`` (each token's log-probability) and
        every measured probe's ``per_position`` arrays (:attr:`~lm_eval_probes.api.Probe.traces`), rounded to 4
        significant digits (:func:`~lm_eval_probes.records.trace_values`).
        """
        cut = self.span(start, stop)
        n = cut.num_positions
        if mean_token_logprob is None and cut.token_logprob is not None:
            mean_token_logprob = cut.token_logprob.double().mean().tolist() if n else math.nan  # host values
        values: dict[str, Any] = {}
        for capture, measured in cut.measured.values():
            reduce = getattr(capture, "reduce", None)  # optional: a probe without one gives no fields from here
            if reduce is not None:
                values.update(reduce(measured, positions=n, generation=generation))
        values.update((name, value) for name, value in (fields or {}).items() if value is not None)
        if token_ends is not None:
            if len(token_ends) != n:
                raise ValueError(f"token_ends has {len(token_ends)} offsets for {n} response tokens")
            values["token_ends"] = tuple(int(e) for e in token_ends)
            if cut.token_logprob is not None:
                values["token_logprobs"] = tuple(cut.token_logprob.tolist())
        if trace_ids is not None:
            values["trace"] = cut.trace(trace_ids)
        return ResponseProbe(
            n_tokens=n,
            prompt_tokens=prompt_tokens,
            mean_token_logprob=math.nan if mean_token_logprob is None else float(mean_token_logprob),
            empty=empty,
            **values,
        )


def position_probes_of_spans(
    spans: Sequence[Sequence[torch.Tensor]],
    readout: LensReadout,
    plan: ProbePlan | ProbeConfig,
    token_ids: Sequence[torch.Tensor] | None = None,
    *,
    lens: bool = True,
) -> list[PositionProbes]:
    """:func:`position_probes` of several spans in one pass (the unembedding is read once per chunk, not per span).

    ``spans[i]`` holds L+1 tensors ``[n_i, H]`` (``None`` for a layer no probe reads, in every span alike);
    returns one :class:`PositionProbes` per span.
    """
    if not spans:
        return []
    joined = [None if spans[0][layer] is None else torch.cat([span[layer] for span in spans])
              for layer in range(len(spans[0]))]
    ids = None if token_ids is None else torch.cat([t.reshape(-1) for t in token_ids])
    probes = position_probes(joined, readout, plan, ids, lens=lens)
    out, offset = [], 0
    for span in spans:
        n = span_positions(span)
        out.append(probes.span(offset, offset + n))
        offset += n
    return out


def span_positions(layer_states: Sequence[torch.Tensor | None]) -> int:
    """The positions of a span's states (its first layer that is kept)."""
    kept = next((h for h in layer_states if h is not None), None)
    if kept is None:
        raise ValueError("no layer's states were kept")
    return kept.shape[0]


@torch.no_grad()
def position_probes(
    layer_states: Sequence[torch.Tensor | None],
    readout: LensReadout | None,
    plan: ProbePlan | ProbeConfig,
    token_ids: torch.Tensor | None = None,
    *,
    lens: bool = True,
) -> PositionProbes:
    """Probe values at every position of one response span: each enabled probe's :meth:`PositionProbe.at_positions`,
    ``config.chunk_positions`` positions at a time, so the logit lens holds a few ``chunk · V`` buffers at a time.
    Only the readouts a probe reads are computed (:class:`LensChunk`).

    Args:
        layer_states: L+1 tensors ``[n, H]`` (HF ``hidden_states`` at the response positions; the
            last one post final norm); ``None`` for a layer the plan's probes do not read.
        readout: the model's logit-lens readout (``None`` for a model without one, e.g. a masked-diffusion LM: then
            ``lens`` must be ``False`` and no ``token_ids`` given).
        plan: the model's :class:`~lm_eval_probes.capture.plan.ProbePlan` (which probes, their position probes and
            options; a bare :class:`~lm_eval_probes.config.ProbeConfig` is planned here, for one-off use).
        token_ids: ``[n]`` the tokens these positions predict, for their log-probabilities.
        lens: ``False`` skips every probe that reads the lens (δ_TCB, BTE): for a response whose lens values no
            row reads (an option the model did not choose).
    """
    num_layers = len(layer_states) - 1
    if readout is None and (lens or token_ids is not None):
        raise ValueError("without a lens readout only the probes that read no lens run (lens=False, no token ids)")
    if readout is not None and num_layers != readout.num_layers:
        raise ValueError(f"got {len(layer_states)} hidden-state tensors for a model with {readout.num_layers} layers")
    if not isinstance(plan, ProbePlan):
        plan = ProbePlan.of(plan, num_layers)
    if plan.num_layers != num_layers:
        raise ValueError(f"got {len(layer_states)} hidden-state tensors for a plan of {plan.num_layers} layers")
    config = plan.config
    captures = plan.position_captures(lens=lens)
    needed = plan.layers_read(lens=lens)
    needed |= {num_layers} if token_ids is not None else set()
    missing = sorted(layer for layer in needed if layer_states[layer] is None)
    if missing:
        raise ValueError(f"the states of layers {missing} are needed by the probes {config.probes} but were not kept")
    n = span_positions(layer_states)
    parts: dict[str, dict[str, list[torch.Tensor]]] = {name: {} for name in captures}
    token_logprob: list[torch.Tensor] = []
    # probe_traces=true: the logit lens of every kept layer (the trace's lens grid), from the states already here
    grid_layers = tuple(layer for layer, h in enumerate(layer_states) if h is not None) \
        if config.traces and lens and token_ids is not None else ()
    grid: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for lo in range(0, max(n, 1), config.chunk_positions):  # an empty response: one empty chunk (its values are empty)
        chunk = LensChunk(layer_states, readout, lo, min(n, lo + config.chunk_positions), capacity=config.chunk_positions)
        if token_ids is not None:
            ids = token_ids[lo : chunk.hi].to(readout.device).long()
            if grid_layers:
                chunk.emitted = ids
            token_logprob.append(torch.log_softmax(chunk.final_logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1).cpu())
        for name, capture in captures.items():
            for key, value in capture.at_positions(chunk).items():
                kept = value.detach() if value.requires_grad else value  # under no_grad: no detach op to launch
                parts[name].setdefault(key, []).append(kept.to("cpu"))
        if grid_layers:  # after the probes: a layer they read out left its cells on the way
            grid.append(chunk.lens_grid(grid_layers))
    measured = {
        name: (capture, {key: torch.cat(chunks, dim=position_axis(capture)) for key, chunks in parts[name].items()})
        for name, capture in captures.items()
    }
    lens_grid = None if not grid else LensGrid(grid_layers, *(torch.cat([g[i] for g in grid], dim=1) for i in range(3)))
    return PositionProbes(n, measured, torch.cat(token_logprob) if token_ids is not None else None, lens_grid)
