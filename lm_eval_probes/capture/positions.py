"""Capture hidden states during the harness's own forward passes and reduce them to per-position probe values.

* :func:`hidden_state_tap` — a context manager holding two hooks on the causal-LM module: a pre-hook
  that asks for ``output_hidden_states`` and a hook that keeps what the forward returned (the latest
  call's states, or only the last position of every call during ``generate``). Hooks never outlive
  the ``with`` block.
* :func:`position_probes` — per-position probe values of one response span (all layers → a few floats
  per position and transition), computed in chunks of positions so the logit lens holds a few
  ``chunk · V`` buffers at a time, and only the readouts a row reads; :meth:`PositionProbes.summarize`
  reduces a slice of them to a :class:`~lm_eval_probes.records.ResponseProbe`.
* :func:`masked_mean_states` — the reader layers' mean states over a mask (the prompt, say).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lm_eval_probes.capture.readouts import LensReadout
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
    :meth:`~lm_eval_probes.capture.readouts.FocalDepthDecoder.confidences`; attached with :meth:`with_omega`).
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
                values["answer_states"] = answer_mean_states(self.reader_layers, states)
            if n and tail:
                values["tail_states"] = compact_states(self.reader_layers, states[:, -tail:])
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
    n = span_positions(layer_states)
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


def span_mean_states(layers: Sequence[int], spans: Sequence[torch.Tensor]) -> LayerStates:
    """The reader's states of one span: per layer of ``layers``, the float32 mean over positions of its ``[n, H]``
    span (the prompt of a loglikelihood request, or a masked-diffusion request's context and continuation)."""
    return LayerStates(tuple(layers), torch.stack([span.float().mean(0) for span in spans]).cpu().numpy())


def answer_mean_states(layers: Sequence[int], states: torch.Tensor) -> LayerStates:
    """The reader's answer states: ``[k, n, H]`` states of the response positions, averaged over positions in float64."""
    return LayerStates(tuple(layers), states.double().mean(1).float().numpy())


def compact_states(layers: Sequence[int], states: torch.Tensor) -> LayerStates:
    """``[k, m, H]`` states kept one by one: float16, or float32 where a value exceeds float16's range (±65504, as in
    Gemma's residual stream)."""
    packed = states.half()
    if not bool(torch.isfinite(packed).all()):
        packed = states.float()
    return LayerStates(tuple(layers), packed.numpy())


def masked_mean_states(states: Sequence[torch.Tensor], mask: torch.Tensor, layers: Sequence[int]) -> list[LayerStates]:
    """Per row: the mean over the positions where ``mask`` is true of each of ``states`` (``[B, T, H]``).

    Returns one ``[k, H]`` float32 :class:`LayerStates` per row (the prompt states of a batch).
    """
    weights = mask.to(device=states[0].device, dtype=torch.float32)
    weights = (weights / weights.sum(-1, keepdim=True).clamp(min=1)).unsqueeze(1)  # [B, 1, T]
    means = torch.stack([torch.bmm(weights, h.float()).squeeze(1) for h in states], dim=1)  # [B, k, H]
    return [LayerStates(tuple(layers), row.float().cpu().numpy()) for row in means]
