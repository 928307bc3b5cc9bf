"""Capture hidden states during the harness's own forward passes and reduce them at once.

The pieces:

* :func:`hidden_state_tap` — a context manager holding two hooks on the causal-LM module: a pre-hook
  that asks for ``output_hidden_states`` and a hook that keeps what the forward returned (the latest
  call's states, or only the last position of every call during ``generate``). Hooks never outlive
  the ``with`` block.
* :func:`position_probes` — per-position probe values of one response span (all layers → a few floats
  per position and transition), computed in chunks of positions so the logit lens holds a few
  ``chunk · V`` buffers at a time, and only the readouts a row reads; :meth:`PositionProbes.summarize`
  reduces a slice of them to a :class:`~lm_eval_probes.records.ResponseProbe`.
* :class:`LensPlan` — which answered loglikelihood requests need the lens (of a multiple-choice document,
  only the option the task reads), and :class:`LoglikelihoodRows` — the bookkeeping that takes each answered
  request's states out of the harness's own forwards and probes them once the plan has decided.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lm_eval_probes.architectures import BlockInputs, FocalDepthDecoder, LensReadout
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.probes import (
    central_window,
    central_window_energy,
    confidence_trajectory,
    consecutive_js_divergences_of_logits,
    depth_profile,
    refinement_area,
    tcb_with_baselines,
    transition_statistics,
)
from lm_eval_probes.records import LayerStates, ResponseProbe


@dataclass
class HiddenStateTap:
    """What the hooks of :func:`hidden_state_tap` collected.

    ``latest``: the L+1 hidden-state tensors ``[B, T, H]`` of the most recent forward call.
    ``steps``: with ``last_position_only``, one tuple of L+1 tensors ``[B, H]`` per forward call.
    ``first_call``: with ``first_call_layers``, those layers' full ``[B, T, H]`` states of the first
    call (the prefill of ``generate``: the prompt positions).
    """

    last_position_only: bool = False
    first_call_layers: tuple[int, ...] = ()
    latest: tuple[torch.Tensor, ...] | None = None
    steps: list[tuple[torch.Tensor, ...]] = field(default_factory=list)
    first_call: tuple[torch.Tensor, ...] | None = None
    calls: int = 0

    def _record(self, hidden_states: Sequence[torch.Tensor]) -> None:
        self.calls += 1
        if self.calls == 1 and self.first_call_layers:
            self.first_call = tuple(hidden_states[layer].detach() for layer in self.first_call_layers)
        if self.last_position_only:
            self.steps.append(tuple(h[:, -1].detach().clone() for h in hidden_states))  # a view would keep the whole call's states
        else:
            self.latest = tuple(h.detach() for h in hidden_states)


@contextmanager
def hidden_state_tap(
    model: nn.Module, *, last_position_only: bool = False, first_call_layers: Sequence[int] = ()
) -> Iterator[HiddenStateTap]:
    """Make every forward of ``model`` inside the block also return and record its hidden states."""
    tap = HiddenStateTap(last_position_only=last_position_only, first_call_layers=tuple(first_call_layers))

    def ask_for_states(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        return args, {**kwargs, "output_hidden_states": True}

    def keep_states(_module: nn.Module, _args: tuple[Any, ...], output: Any) -> None:
        states = getattr(output, "hidden_states", None)
        if states is None:
            raise RuntimeError(f"{type(model).__name__} returned no hidden_states although asked to")
        tap._record(states)

    handles = [
        model.register_forward_pre_hook(ask_for_states, with_kwargs=True),
        model.register_forward_hook(keep_states),
    ]
    try:
        yield tap
    finally:
        for handle in handles:
            handle.remove()


_PER_POSITION_FIELDS = (
    "token_logprob", "log10_tcb", "entropy", "logit_margin", "v_eff_ipr", "v_eff_exp", "energy", "omega_mass",
)


@dataclass(frozen=True)
class PositionProbes:
    """Per-position probe values of one response span (float32/64 CPU tensors, positions last).

    ``token_logprob [n]`` (only when token ids were given), ``log10_tcb``, ``entropy``,
    ``logit_margin``, ``v_eff_ipr``, ``v_eff_exp`` ``[n]`` (tcb), ``energy [stop - start, n]`` (bte: the
    transitions ``bte_transitions = (start, stop)``, the central window's or all L),
    ``reader_states [k, n, H]`` (reader: the hidden states of the reader layers, float32),
    ``omega_mass [S, n]`` (omega: the top-K mass of the focal-depth decoding of each source layer, from
    :meth:`~lm_eval_probes.architectures.FocalDepthDecoder.confidences`; attached with :meth:`with_omega`).
    """

    num_positions: int
    num_layers: int
    bte_window: tuple[int, int] | None
    bte_transitions: tuple[int, int] | None = None
    bte_features: bool = False
    token_logprob: torch.Tensor | None = None
    log10_tcb: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    logit_margin: torch.Tensor | None = None
    v_eff_ipr: torch.Tensor | None = None
    v_eff_exp: torch.Tensor | None = None
    energy: torch.Tensor | None = None
    reader_layers: tuple[int, ...] = ()
    reader_states: torch.Tensor | None = None
    omega_mass: torch.Tensor | None = None

    def with_omega(self, omega_mass: torch.Tensor) -> PositionProbes:
        """These probes with Ω's per-position masses ``[S, n]`` attached."""
        if omega_mass.ndim != 2 or omega_mass.shape[1] != self.num_positions:
            raise ValueError(f"omega_mass must be [S, {self.num_positions}], got {tuple(omega_mass.shape)}")
        return dataclasses.replace(self, omega_mass=omega_mass)

    def span(self, start: int, stop: int) -> PositionProbes:
        """The positions ``[start, stop)`` as their own :class:`PositionProbes`."""
        cut = {
            name: None if getattr(self, name) is None else getattr(self, name)[..., start:stop]
            for name in _PER_POSITION_FIELDS
        }
        states = None if self.reader_states is None else self.reader_states[:, start:stop]
        return PositionProbes(num_positions=stop - start, num_layers=self.num_layers, bte_window=self.bte_window,
                              bte_transitions=self.bte_transitions, bte_features=self.bte_features,
                              reader_layers=self.reader_layers,
                              reader_states=states, **cut)

    def summarize(
        self,
        start: int,
        stop: int,
        *,
        mean_token_logprob: float | None = None,
        prompt_tokens: int | None = None,
        prompt_states: LayerStates | None = None,
        tail: int = 0,
        token_ends: Sequence[int] | None = None,
        empty: bool = False,
    ) -> ResponseProbe:
        """Reduce positions ``[start, stop)`` to a :class:`ResponseProbe`.

        ``mean_token_logprob`` overrides the value from ``token_logprob`` (loglikelihood requests
        already know their summed log-probability). Generations pass ``tail`` (keep the last ``tail``
        positions' reader states one by one, float16, or float32 where a value exceeds float16's range) and ``token_ends`` (character end of each token
        in the response text); they then also keep every token's log-probability. ``empty`` marks a
        generation whose kept text is empty, summarized at the one position that chose to stop.
        """
        if not 0 <= start <= stop <= self.num_positions:
            raise ValueError(f"span [{start}, {stop}) outside the {self.num_positions} captured positions")
        n = stop - start

        def mean(values: torch.Tensor | None) -> float | None:
            if values is None:
                return None
            return float(values[..., start:stop].double().mean()) if n else math.nan

        if mean_token_logprob is None:
            mean_token_logprob = mean(self.token_logprob)
        values: dict[str, Any] = {}
        if self.log10_tcb is not None:
            span = self.log10_tcb[start:stop]
            values.update(
                tcb_log10_mean=mean(self.log10_tcb),
                tcb_log10_min=float(span.min()) if n else math.nan,
                tcb_argmin=int(span.argmin()) if n else None,
                entropy=mean(self.entropy),
                logit_margin=mean(self.logit_margin),
                v_eff_ipr=mean(self.v_eff_ipr),
                v_eff_exp=mean(self.v_eff_exp),
            )
        if self.energy is not None:
            first, last = self.bte_transitions
            profile = depth_profile(self.energy[:, start:stop].double())  # nan for an empty span
            window_start, window_stop = central_window(self.num_layers, self.bte_window)
            values["bte_energy"] = central_window_energy(profile, (window_start - first, window_stop - first))
            if (first, last) == (0, self.num_layers):
                values["bte_profile"] = tuple(float(v) for v in profile)
                if self.bte_features and n:
                    statistics = transition_statistics(self.energy[:, start:stop].double())  # [L, 11]
                    values["bte_features"] = tuple(float(v) for v in statistics.reshape(-1))
        if self.omega_mass is not None:
            trajectory = confidence_trajectory(self.omega_mass[:, start:stop].double())  # nan for an empty span
            values.update(omega_trajectory=tuple(float(v) for v in trajectory), omega=refinement_area(trajectory))
        if self.reader_states is not None:
            states = self.reader_states[:, start:stop]
            if n:
                values["answer_states"] = LayerStates(self.reader_layers, states.double().mean(1).float().numpy())
            if n and tail:
                kept = states[:, -tail:]
                packed = kept.half()
                if not bool(torch.isfinite(packed).all()):  # beyond float16's ±65504 (Gemma's residual stream)
                    packed = kept.float()
                values["tail_states"] = LayerStates(self.reader_layers, packed.numpy())
            values["prompt_states"] = prompt_states
        if token_ends is not None:
            if len(token_ends) != n:
                raise ValueError(f"token_ends has {len(token_ends)} offsets for {n} response tokens")
            values["token_ends"] = tuple(int(e) for e in token_ends)
            if self.token_logprob is not None:
                values["token_logprobs"] = tuple(float(v) for v in self.token_logprob[start:stop])
        return ResponseProbe(
            n_tokens=n,
            prompt_tokens=prompt_tokens,
            mean_token_logprob=math.nan if mean_token_logprob is None else float(mean_token_logprob),
            empty=empty,
            **values,
        )


def _layer_logits(
    layer_states: Sequence[torch.Tensor],
    readout: LensReadout,
    lo: int,
    hi: int,
    first: int,
    last: int,
    final_logits: torch.Tensor | None,
) -> Iterator[torch.Tensor]:
    """The lens logits of layers ``first..last`` at positions ``[lo, hi)``, written into two alternating buffers
    (:func:`consecutive_js_divergences_of_logits` is done with layer l's once layer l + 1's has arrived, and
    overwrites them); layer L's are ``final_logits`` (already read out; left as they are)."""
    buffers: list[torch.Tensor] = []
    for layer in range(first, last + 1):
        if layer == len(layer_states) - 1:
            yield final_logits
            continue
        if len(buffers) < 2:
            buffers.append(torch.empty(hi - lo, readout.vocab_size, device=readout.device))
        yield readout.logits(layer_states[layer][lo:hi], normalized=False, out=buffers[(layer - first) % 2])


def position_probes_of_spans(
    spans: Sequence[Sequence[torch.Tensor]],
    readout: LensReadout,
    config: ProbeConfig,
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
    probes = position_probes(joined, readout, config, ids, lens=lens)
    out, offset = [], 0
    for span in spans:
        n = _positions(span)
        out.append(probes.span(offset, offset + n))
        offset += n
    return out


def _positions(layer_states: Sequence[torch.Tensor | None]) -> int:
    """The positions of a span's states (its first layer that is kept)."""
    kept = next((h for h in layer_states if h is not None), None)
    if kept is None:
        raise ValueError("no layer's states were kept")
    return kept.shape[0]


def read_layers(num_layers: int, config: ProbeConfig, *, lens: bool = True) -> frozenset[int]:
    """The ``hidden_states`` indices :func:`position_probes` reads under ``config``: the final layer (δ_TCB), the
    layers of BTE's transitions and the reader layers; ``lens=False``: the reader layers only."""
    layers: set[int] = set()
    if lens and "tcb" in config.probes:
        layers.add(num_layers)
    if lens and "bte" in config.probes:
        first, last = bte_transitions(num_layers, config)
        layers.update(range(first, last + 1))
    if "reader" in config.probes:
        layers.update(config.resolved_reader_layers(num_layers))
    return frozenset(layers)


def bte_transitions(num_layers: int, config: ProbeConfig) -> tuple[int, int]:
    """The transitions ``[start, stop)`` BTE computes: the central window's, or all L (``probe_bte_profile=full``)."""
    window = central_window(num_layers, config.bte_window)  # validates the window against L
    return (0, num_layers) if config.bte_profile == "full" or config.bte_features else window


@torch.no_grad()
def position_probes(
    layer_states: Sequence[torch.Tensor],
    readout: LensReadout,
    config: ProbeConfig,
    token_ids: torch.Tensor | None = None,
    *,
    lens: bool = True,
) -> PositionProbes:
    """Probe values at every position of one response span.

    Only the readouts a row needs are computed: the final layer's (δ_TCB, its baselines, the tokens'
    log-probabilities) and those of the layers BTE's transitions touch (:func:`bte_transitions`).

    Args:
        layer_states: L+1 tensors ``[n, H]`` (HF ``hidden_states`` at the response positions; the
            last one post final norm); ``None`` for a layer outside :func:`read_layers`.
        readout: the model's logit-lens readout.
        config: which probes and options.
        token_ids: ``[n]`` the tokens these positions predict, for their log-probabilities.
        lens: ``False`` skips every readout (δ_TCB and BTE stay ``None``): for a response whose lens
            values no row reads (an option the model did not choose).
    """
    num_layers = len(layer_states) - 1
    if num_layers != readout.num_layers:
        raise ValueError(f"got {len(layer_states)} hidden-state tensors for a model with {readout.num_layers} layers")
    needed = read_layers(num_layers, config, lens=lens) | ({num_layers} if token_ids is not None else set())
    missing = sorted(layer for layer in needed if layer_states[layer] is None)
    if missing:
        raise ValueError(f"the states of layers {missing} are needed by the probes {config.probes} but were not kept")
    n = _positions(layer_states)
    want_tcb, want_bte = lens and "tcb" in config.probes, lens and "bte" in config.probes
    first, last = bte_transitions(num_layers, config) if "bte" in config.probes else (0, 0)
    want_final = token_ids is not None or want_tcb or (want_bte and last == num_layers)
    parts: dict[str, list[torch.Tensor]] = {}

    def keep(name: str, value: torch.Tensor) -> None:
        parts.setdefault(name, []).append(value.detach().to("cpu"))

    for lo in range(0, n, config.chunk_positions):
        hi = min(n, lo + config.chunk_positions)
        if want_final:
            final_hidden = layer_states[-1][lo:hi].to(readout.device).float()
            raw_logits = readout.logits(final_hidden, normalized=True, capped=False)
            final_logits = readout.cap(raw_logits)
        if token_ids is not None:
            ids = token_ids[lo:hi].to(readout.device).long().unsqueeze(-1)
            keep("token_logprob", torch.log_softmax(final_logits, dim=-1).gather(-1, ids).squeeze(-1))
        if want_tcb:
            delta, baselines = tcb_with_baselines(
                final_hidden,
                readout.unembed,
                readout.bias,
                eps=config.tcb_eps,
                logit_softcap=readout.logit_softcap,
                row_sq_norms=readout.row_sq_norms,
                logits=raw_logits,
            )
            keep("log10_tcb", torch.log10(delta.double()))
            keep("entropy", baselines.entropy)
            keep("logit_margin", baselines.logit_margin)
            keep("v_eff_ipr", baselines.v_eff_ipr)
            keep("v_eff_exp", baselines.v_eff_exp)
        if want_bte:
            keep("energy", consecutive_js_divergences_of_logits(_layer_logits(layer_states, readout, lo, hi, first, last,
                                                                               final_logits)))
    if n == 0:  # an empty response: enabled probes get empty values (they summarize to nan)
        empty = torch.empty(0, dtype=torch.float64)
        names = (["token_logprob"] if token_ids is not None else []) + (
            ["log10_tcb", "entropy", "logit_margin", "v_eff_ipr", "v_eff_exp"] if want_tcb else []
        )
        parts = {name: [empty] for name in names}
        if want_bte:
            parts["energy"] = [torch.empty(last - first, 0, dtype=torch.float64)]
    tensors = {name: torch.cat(chunks, dim=-1) for name, chunks in parts.items()}
    reader_layers: tuple[int, ...] = ()
    if "reader" in config.probes:
        reader_layers = config.resolved_reader_layers(num_layers)
        tensors["reader_states"] = torch.stack([layer_states[layer].detach().float().cpu() for layer in reader_layers])
    return PositionProbes(num_positions=n, num_layers=num_layers, bte_window=config.bte_window,
                          bte_transitions=(first, last) if want_bte else None, bte_features=config.bte_features,
                          reader_layers=reader_layers, **tensors)


def masked_mean_states(states: Sequence[torch.Tensor], mask: torch.Tensor, layers: Sequence[int]) -> list[LayerStates]:
    """Per row: the mean over the positions where ``mask`` is true of each of ``states`` (``[B, T, H]``).

    Returns one ``[k, H]`` float32 :class:`LayerStates` per row (the prompt states of a batch).
    """
    weights = mask.to(device=states[0].device, dtype=torch.float32)
    weights = (weights / weights.sum(-1, keepdim=True).clamp(min=1)).unsqueeze(1)  # [B, 1, T]
    means = torch.stack([torch.bmm(weights, h.float()).squeeze(1) for h in states], dim=1)  # [B, k, H]
    return [LayerStates(tuple(layers), row.float().cpu().numpy()) for row in means]


@dataclass(frozen=True)
class OptionGroup:
    """The options of one multiple-choice document: their request keys in option order, and the rule that
    picks the option whose record the task reads (``choose(option logliks) -> index``, ``None``: none)."""

    keys: tuple[Any, ...]
    choose: Callable[[Sequence[float]], int | None]


class LensPlan:
    """Which answered requests need the logit lens (δ_TCB, BTE): every request, except the options of a
    multiple-choice document, where only the option the task reads (the chosen one) does.

    :meth:`answered` takes each answer and returns the keys whose need became known: a key outside every
    group (or in ``always``) at once; a group's other keys once all its options are answered.
    """

    def __init__(self, groups: Sequence[OptionGroup] = (), always: Iterable[Any] = ()) -> None:
        self._groups = list(groups)
        self._groups_of: dict[Any, list[int]] = defaultdict(list)
        for index, group in enumerate(self._groups):
            for key in dict.fromkeys(group.keys):
                self._groups_of[key].append(index)
        self._always = set(always)
        self._open = [len(set(group.keys)) for group in self._groups]  # options not answered yet
        self._undecided = {key: len(indices) for key, indices in self._groups_of.items()}
        self._logliks: dict[Any, float] = {}
        self._needed: set[Any] = set()
        self._decided: set[Any] = set()

    def answered(self, key: Any, loglik: float) -> list[tuple[Any, bool]]:
        """``key`` was answered with ``loglik``: the ``(key, needs the lens)`` pairs decided by it."""
        if key in self._logliks:  # a repeated request: counted once
            return []
        self._logliks[key] = loglik
        decided = []
        if key in self._always or key not in self._groups_of:
            decided.append((key, True))
            self._decided.add(key)
        for index in self._groups_of.get(key, ()):
            self._open[index] -= 1
            if self._open[index]:
                continue
            group = self._groups[index]
            chosen = group.choose([self._logliks[k] for k in group.keys])
            if chosen is not None:
                self._needed.add(group.keys[chosen])
            for member in dict.fromkeys(group.keys):
                self._undecided[member] -= 1
                if not self._undecided[member] and member not in self._decided:
                    decided.append((member, member in self._needed))
                    self._decided.add(member)
        return decided


@dataclass
class _PendingAnswer:
    """An answered request whose lens values wait for the plan (or for enough positions to batch)."""

    states: list[torch.Tensor | None]  # L+1: copies [n, H] of the layers a probe reads (the batch's are released)
    loglik: float
    prompt_tokens: int
    prompt_states: LayerStates | None
    omega_mass: torch.Tensor | None


class LoglikelihoodRows:
    """Bookkeeping of one ``loglikelihood`` call: HFLM's rows in, each answered request's probe out.

    HFLM runs one forward per batch (:meth:`new_batch`), then calls ``_select_cont_toks`` once per row
    in row order (:meth:`add_row`), then answers the row's requests (one or, with the logits cache,
    several one-token continuations of one context) through ``cache_hook.add_partial``
    (:meth:`on_answer`). When the next batch starts or the call ends (:meth:`flush`) each answered
    request keeps a copy of its few response positions' states, its reader prompt states and (with a
    ``decoder``: Ω, decoded from the same forward's states of every layer and the block inputs
    ``block_inputs`` its hooks recorded; no extra full forward) its ``[S, n]`` masses; the batch's
    states are then released. The :class:`LensPlan` says which answers need the logit lens; those
    wait in a queue that goes through the lens at once when it holds ``chunk_positions`` positions (the
    unembedding is read once per chunk), the others are recorded without lens values at once.

    Use it through :func:`loglikelihood_rows`, which also holds the hooks.
    """

    def __init__(
        self,
        tap: HiddenStateTap,
        readout: LensReadout,
        config: ProbeConfig,
        reader_layers: Sequence[int],
        decoder: FocalDepthDecoder | None = None,
        block_inputs: BlockInputs | None = None,
        plan: LensPlan | None = None,
    ) -> None:
        if (decoder is None) != (block_inputs is None):
            raise ValueError("a focal-depth decoder needs the block inputs its capture() records, and vice versa")
        self.tap = tap
        self.decoder = decoder
        self.block_inputs = block_inputs
        self.readout = readout
        self.config = config
        self.reader_layers = tuple(reader_layers)
        self.plan = plan or LensPlan()
        self.probes: dict[Any, ResponseProbe] = {}
        """Each answered request's probe, keyed by its ``(context, continuation)``."""
        self._continuation_lengths: dict[Any, int] = {}
        self._next_row = 0
        self._spans: list[tuple[int, int, int]] = []  # per row: (batch row, first, end) of its response positions
        self._answers: list[tuple[Any, int, int, float]] = []  # (request key, row, continuation tokens, loglik)
        self._pending: dict[Any, _PendingAnswer] = {}  # answered, need not yet known
        self._queue: dict[Any, _PendingAnswer] = {}  # need the lens, not yet probed
        self._queued_positions = 0
        # what a chosen option's lens and reader read, and the last layer (which also tells the positions)
        self._kept_layers = read_layers(readout.num_layers, config) | {readout.num_layers}

    def note_requests(self, requests: Sequence[Any]) -> None:
        """HFLM's tokenized requests ``((context, continuation), context ids, continuation ids)``."""
        self._continuation_lengths.update({req[0]: len(req[2]) for req in requests if req[0] is not None})

    def new_batch(self) -> None:
        """A forward is about to replace the states of the previous batch: take what the answers need first."""
        self._take_batch()
        self._next_row = 0

    def add_row(self, input_length: int, continuation_length: int) -> None:
        """The next row of the latest forward scores ``continuation_length`` tokens ending at ``input_length``."""
        if self.tap.latest is None:
            return
        row, self._next_row = self._next_row, self._next_row + 1
        self._spans.append((row, input_length - continuation_length, input_length))

    def on_answer(self, attr: str, request_key: Any, answer: Any) -> None:
        """HFLM answered ``request_key`` from the latest row (a ``cache_hook.add_partial`` call)."""
        if attr == "loglikelihood" and self._spans:
            n = self._continuation_lengths[request_key]
            self._answers.append((request_key, len(self._spans) - 1, n, float(answer[0])))

    def flush(self) -> None:
        """The call ends: take the last batch, probe the queue and every answer still undecided."""
        self._take_batch()
        self._queue.update(self._pending)  # options of documents whose other options never came: probe them
        self._pending = {}
        self._probe_queue()

    def _take_batch(self) -> None:
        states = self.tap.latest
        if states is None or not self._spans:  # no row read this forward (batch-size detection, say)
            self._spans, self._answers, self.tap.latest = [], [], None
            return
        masses = None
        if self.decoder is not None:
            masses = self.decoder.confidences(states, self.block_inputs, self._spans)
        prompt_states: dict[tuple[int, int], LayerStates | None] = {}  # grouped requests of a row share them
        for key, index, n, loglik in self._answers:
            if key in self.probes or key in self._queue:  # a repeated request, already decided
                continue
            row, _, end = self._spans[index]
            prompt_tokens = end - n + 1  # the last context position predicts token 1
            if (row, prompt_tokens) not in prompt_states:
                prompt_states[row, prompt_tokens] = self._prompt_states(states, row, prompt_tokens)
            self._pending[key] = _PendingAnswer(
                states=[h[row, end - n : end].clone() if layer in self._kept_layers else None
                        for layer, h in enumerate(states)],
                loglik=loglik,
                prompt_tokens=prompt_tokens,
                prompt_states=prompt_states[row, prompt_tokens],
                omega_mass=None if masses is None else masses[index][:, -n:] if n else masses[index][:, :0],
            )
            for decided, needs_lens in self.plan.answered(key, loglik):
                answer = self._pending.pop(decided)
                if needs_lens:
                    self._queue[decided] = answer
                    self._queued_positions += _positions(answer.states)
                else:
                    self._record([decided], [answer], lens=False)
        self._spans, self._answers = [], []
        self.tap.latest = None  # the next forward's states are not held beside these
        if self._queued_positions >= self.config.chunk_positions:
            self._probe_queue()

    def _probe_queue(self) -> None:
        keys, answers = list(self._queue), list(self._queue.values())
        self._queue, self._queued_positions = {}, 0
        self._record(keys, answers, lens=True)

    def _record(self, keys: Sequence[Any], answers: Sequence[_PendingAnswer], *, lens: bool) -> None:
        rows = position_probes_of_spans([a.states for a in answers], self.readout, self.config, lens=lens)
        for key, answer, probes in zip(keys, answers, rows, strict=True):
            if answer.omega_mass is not None:
                probes = probes.with_omega(answer.omega_mass)
            n = probes.num_positions
            self.probes[key] = probes.summarize(
                0, n, mean_token_logprob=answer.loglik / n if n else math.nan, prompt_tokens=answer.prompt_tokens,
                prompt_states=answer.prompt_states,
            )

    def _prompt_states(self, states: Sequence[torch.Tensor], row: int, prompt_tokens: int) -> LayerStates | None:
        """Mean of the reader layers' states over the row's first ``prompt_tokens`` positions (or their
        last ``reader_prompt_tail``)."""
        if not self.reader_layers:
            return None
        tail = self.config.reader_prompt_tail
        start = max(0, prompt_tokens - tail) if tail else 0
        means = torch.stack([states[layer][row, start:prompt_tokens].float().mean(0) for layer in self.reader_layers])
        return LayerStates(self.reader_layers, means.cpu().numpy())


@contextmanager
def loglikelihood_rows(
    model: nn.Module,
    readout: LensReadout,
    config: ProbeConfig,
    reader_layers: Sequence[int],
    decoder: FocalDepthDecoder | None = None,
    plan: LensPlan | None = None,
) -> Iterator[LoglikelihoodRows]:
    """Hooks on ``model`` (and the decoder's, for Ω) and a :class:`LoglikelihoodRows` for one
    ``loglikelihood`` call; the last batch is probed when the block ends without an error."""
    with hidden_state_tap(model) as tap, block_inputs_of(decoder) as block_inputs:
        rows = LoglikelihoodRows(tap, readout, config, reader_layers, decoder, block_inputs, plan)
        yield rows
        rows.flush()


@contextmanager
def block_inputs_of(decoder: FocalDepthDecoder | None) -> Iterator[BlockInputs | None]:
    """``decoder.capture()``, or ``None`` without a decoder."""
    if decoder is None:
        yield None
        return
    with decoder.capture() as inputs:
        yield inputs
