"""Capture hidden states during the harness's own forward passes and reduce them at once.

Two pieces:

* :func:`hidden_state_tap` — a context manager holding two hooks on the causal-LM module: a pre-hook
  that asks for ``output_hidden_states`` and a hook that keeps what the forward returned (the latest
  call's states, or only the last position of every call during ``generate``). Hooks never outlive
  the ``with`` block.
* :func:`position_probes` — per-position probe values of one response span (all layers → a few floats
  per position and transition), computed in chunks of positions so the logit lens never holds more
  than ``chunk · V`` floats per layer; :meth:`PositionProbes.summarize` reduces a slice of them to a
  :class:`~lm_eval_probes.records.ResponseProbe`.
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

from lm_eval_probes.architectures import BlockInputs, FocalDepthDecoder, LensReadout
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.probes import (
    central_window,
    central_window_energy,
    confidence_trajectory,
    depth_profile,
    distribution_baselines,
    js_divergence,
    refinement_area,
    token_constraint_bound,
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
            self.steps.append(tuple(h[:, -1].detach() for h in hidden_states))
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
    ``logit_margin``, ``v_eff_ipr``, ``v_eff_exp`` ``[n]`` (tcb), ``energy [L, n]`` (bte),
    ``reader_states [k, n, H]`` (reader: the hidden states of the reader layers, float32),
    ``omega_mass [S, n]`` (omega: the top-K mass of the focal-depth decoding of each source layer, from
    :meth:`~lm_eval_probes.architectures.FocalDepthDecoder.confidences`; attached with :meth:`with_omega`).
    """

    num_positions: int
    num_layers: int
    bte_window: tuple[int, int] | None
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
                              reader_layers=self.reader_layers, reader_states=states, **cut)

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
        positions' reader states one by one, float16) and ``token_ends`` (character end of each token
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
            profile = depth_profile(self.energy[:, start:stop].double())  # nan for an empty span
            values.update(
                bte_profile=tuple(float(v) for v in profile),
                bte_energy=central_window_energy(profile, self.bte_window),
            )
        if self.omega_mass is not None:
            trajectory = confidence_trajectory(self.omega_mass[:, start:stop].double())  # nan for an empty span
            values.update(omega_trajectory=tuple(float(v) for v in trajectory), omega=refinement_area(trajectory))
        if self.reader_states is not None:
            states = self.reader_states[:, start:stop]
            if n:
                values["answer_states"] = LayerStates(self.reader_layers, states.double().mean(1).float().numpy())
            if n and tail:
                values["tail_states"] = LayerStates(self.reader_layers, states[:, -tail:].half().numpy())
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


def position_probes_of_spans(
    spans: Sequence[Sequence[torch.Tensor]],
    readout: LensReadout,
    config: ProbeConfig,
    token_ids: Sequence[torch.Tensor] | None = None,
) -> list[PositionProbes]:
    """:func:`position_probes` of several spans in one pass (the unembedding is read once per chunk, not per span).

    ``spans[i]`` holds L+1 tensors ``[n_i, H]``; returns one :class:`PositionProbes` per span.
    """
    if not spans:
        return []
    joined = [torch.cat([span[layer] for span in spans]) for layer in range(len(spans[0]))]
    ids = None if token_ids is None else torch.cat([t.reshape(-1) for t in token_ids])
    probes = position_probes(joined, readout, config, ids)
    out, offset = [], 0
    for span in spans:
        n = span[0].shape[0]
        out.append(probes.span(offset, offset + n))
        offset += n
    return out


@torch.no_grad()
def position_probes(
    layer_states: Sequence[torch.Tensor],
    readout: LensReadout,
    config: ProbeConfig,
    token_ids: torch.Tensor | None = None,
) -> PositionProbes:
    """Probe values at every position of one response span.

    Args:
        layer_states: L+1 tensors ``[n, H]`` (HF ``hidden_states`` at the response positions; the
            last one post final norm).
        readout: the model's logit-lens readout.
        config: which probes and options.
        token_ids: ``[n]`` the tokens these positions predict, for their log-probabilities.
    """
    num_layers = len(layer_states) - 1
    if num_layers != readout.num_layers:
        raise ValueError(f"got {len(layer_states)} hidden-state tensors for a model with {readout.num_layers} layers")
    n = layer_states[0].shape[0]
    want_tcb, want_bte = "tcb" in config.probes, "bte" in config.probes
    if want_bte:
        central_window(num_layers, config.bte_window)  # validates the window against L before any work
    parts: dict[str, list[torch.Tensor]] = {}

    def keep(name: str, value: torch.Tensor) -> None:
        parts.setdefault(name, []).append(value.detach().to("cpu"))

    for lo in range(0, n, config.chunk_positions):
        hi = min(n, lo + config.chunk_positions)
        final_hidden = layer_states[-1][lo:hi].to(readout.device).float()
        final_logits = readout.logits(final_hidden, normalized=True)
        final_logprobs = torch.log_softmax(final_logits, dim=-1)
        if token_ids is not None:
            ids = token_ids[lo:hi].to(readout.device).long().unsqueeze(-1)
            keep("token_logprob", final_logprobs.gather(-1, ids).squeeze(-1))
        if want_tcb:
            delta = token_constraint_bound(
                final_hidden,
                readout.unembed64,
                readout.bias,
                eps=config.tcb_eps,
                logit_softcap=readout.logit_softcap,
                row_sq_norms=readout.row_sq_norms,
            )
            keep("log10_tcb", torch.log10(delta.double()))
            baselines = distribution_baselines(final_logits)
            keep("entropy", baselines.entropy)
            keep("logit_margin", baselines.logit_margin)
            keep("v_eff_ipr", baselines.v_eff_ipr)
            keep("v_eff_exp", baselines.v_eff_exp)
        if want_bte:
            energies = []
            previous = readout.logprobs(layer_states[0][lo:hi], normalized=False)
            for layer in range(1, num_layers + 1):
                current = (
                    final_logprobs
                    if layer == num_layers
                    else readout.logprobs(layer_states[layer][lo:hi], normalized=False)
                )
                energies.append(js_divergence(previous, current))
                previous = current
            keep("energy", torch.stack(energies))
    if n == 0:  # an empty response: enabled probes get empty values (they summarize to nan)
        empty = torch.empty(0, dtype=torch.float64)
        names = (["token_logprob"] if token_ids is not None else []) + (
            ["log10_tcb", "entropy", "logit_margin", "v_eff_ipr", "v_eff_exp"] if want_tcb else []
        )
        parts = {name: [empty] for name in names}
        if want_bte:
            parts["energy"] = [torch.empty(num_layers, 0, dtype=torch.float64)]
    tensors = {name: torch.cat(chunks, dim=-1) for name, chunks in parts.items()}
    reader_layers: tuple[int, ...] = ()
    if "reader" in config.probes:
        reader_layers = config.resolved_reader_layers(num_layers)
        tensors["reader_states"] = torch.stack([layer_states[layer].detach().float().cpu() for layer in reader_layers])
    return PositionProbes(num_positions=n, num_layers=num_layers, bte_window=config.bte_window,
                          reader_layers=reader_layers, **tensors)


def masked_mean_states(states: Sequence[torch.Tensor], mask: torch.Tensor, layers: Sequence[int]) -> list[LayerStates]:
    """Per row: the mean over the positions where ``mask`` is true of each of ``states`` (``[B, T, H]``).

    Returns one ``[k, H]`` float32 :class:`LayerStates` per row (the prompt states of a batch).
    """
    weights = mask.to(device=states[0].device, dtype=torch.float32)
    weights = (weights / weights.sum(-1, keepdim=True).clamp(min=1)).unsqueeze(1)  # [B, 1, T]
    means = torch.stack([torch.bmm(weights, h.float()).squeeze(1) for h in states], dim=1)  # [B, k, H]
    return [LayerStates(tuple(layers), row.float().cpu().numpy()) for row in means]


class LoglikelihoodRows:
    """Bookkeeping of one ``loglikelihood`` call: HFLM's rows in, each answered request's probe out.

    HFLM runs one forward per batch (:meth:`new_batch`), then calls ``_select_cont_toks`` once per row
    in row order (:meth:`add_row`), then answers the row's requests (one or, with the logits cache,
    several one-token continuations of one context) through ``cache_hook.add_partial``
    (:meth:`on_answer`). A batch's rows are probed together when the next batch starts or the call
    ends (:meth:`flush`): all of them go through the lens at once, and only the few response
    positions' states (and the reader layers' prompt states) are kept until then. With a ``decoder``
    (Ω), the flush also decodes the batch's rows at focal depth from the same forward's states of every
    layer and the block inputs ``block_inputs`` recorded by the decoder's hooks (no extra full forward);
    only each row's ``[S, n]`` masses are kept.

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
    ) -> None:
        if (decoder is None) != (block_inputs is None):
            raise ValueError("a focal-depth decoder needs the block inputs its capture() records, and vice versa")
        self.tap = tap
        self.decoder = decoder
        self.block_inputs = block_inputs
        self.readout = readout
        self.config = config
        self.reader_layers = tuple(reader_layers)
        self.probes: dict[Any, ResponseProbe] = {}
        """Each answered request's probe, keyed by its ``(context, continuation)``."""
        self._continuation_lengths: dict[Any, int] = {}
        self._next_row = 0
        self._rows: list[list[torch.Tensor]] = []  # per row: L+1 tensors [contlen, H]
        self._spans: list[tuple[int, int, int]] = []  # per row: (batch row, first, end) of its response positions
        self._input_lengths: list[int] = []  # per row: its input length (the end of its response span)
        self._prompt_layers: list[list[torch.Tensor]] = []  # per row: the reader layers' states [inplen, H]
        self._answers: list[tuple[Any, int, int, float]] = []  # (request key, row, continuation tokens, loglik)

    def note_requests(self, requests: Sequence[Any]) -> None:
        """HFLM's tokenized requests ``((context, continuation), context ids, continuation ids)``."""
        self._continuation_lengths.update({req[0]: len(req[2]) for req in requests if req[0] is not None})

    def new_batch(self) -> None:
        """A forward is about to replace the states of the previous batch: probe that batch first."""
        self.flush()
        self._next_row = 0

    def add_row(self, input_length: int, continuation_length: int) -> None:
        """The next row of the latest forward scores ``continuation_length`` tokens ending at ``input_length``."""
        states = self.tap.latest
        if states is None:
            return
        row, self._next_row = self._next_row, self._next_row + 1
        self._rows.append([h[row, input_length - continuation_length : input_length] for h in states])
        self._spans.append((row, input_length - continuation_length, input_length))
        self._input_lengths.append(input_length)
        self._prompt_layers.append([states[layer][row, :input_length] for layer in self.reader_layers])

    def on_answer(self, attr: str, request_key: Any, answer: Any) -> None:
        """HFLM answered ``request_key`` from the latest row (a ``cache_hook.add_partial`` call)."""
        if attr == "loglikelihood" and self._rows:
            n = self._continuation_lengths[request_key]
            self._answers.append((request_key, len(self._rows) - 1, n, float(answer[0])))

    def flush(self) -> None:
        """Probe the pending rows at once and hand each answered request its trailing slice."""
        rows = position_probes_of_spans(self._rows, self.readout, self.config)
        if self.decoder is not None and self._rows:
            masses = self.decoder.confidences(self.tap.latest, self.block_inputs, self._spans)
            rows = [probes.with_omega(mass) for probes, mass in zip(rows, masses, strict=True)]
        prompt_states: dict[tuple[int, int], LayerStates | None] = {}  # grouped requests of a row share them
        for key, row, n, loglik in self._answers:
            probes = rows[row]
            end = probes.num_positions
            prompt_tokens = self._input_lengths[row] - n + 1  # the last context position predicts token 1
            if (row, prompt_tokens) not in prompt_states:
                prompt_states[row, prompt_tokens] = self._prompt_states(self._prompt_layers[row], prompt_tokens)
            self.probes[key] = probes.summarize(
                end - n, end, mean_token_logprob=loglik / n, prompt_tokens=prompt_tokens,
                prompt_states=prompt_states[row, prompt_tokens],
            )
        self._rows, self._answers, self._input_lengths, self._prompt_layers, self._spans = [], [], [], [], []

    def _prompt_states(self, row_states: list[torch.Tensor], prompt_tokens: int) -> LayerStates | None:
        """Mean of the reader layers' states over the row's first ``prompt_tokens`` positions (or their
        last ``reader_prompt_tail``)."""
        if not self.reader_layers:
            return None
        tail = self.config.reader_prompt_tail
        start = max(0, prompt_tokens - tail) if tail else 0
        means = torch.stack([h[start:prompt_tokens].float().mean(0) for h in row_states])
        return LayerStates(self.reader_layers, means.cpu().numpy())


@contextmanager
def loglikelihood_rows(
    model: nn.Module,
    readout: LensReadout,
    config: ProbeConfig,
    reader_layers: Sequence[int],
    decoder: FocalDepthDecoder | None = None,
) -> Iterator[LoglikelihoodRows]:
    """Hooks on ``model`` (and the decoder's, for Ω) and a :class:`LoglikelihoodRows` for one
    ``loglikelihood`` call; the last batch is probed when the block ends without an error."""
    with hidden_state_tap(model) as tap, block_inputs_of(decoder) as block_inputs:
        rows = LoglikelihoodRows(tap, readout, config, reader_layers, decoder, block_inputs)
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
