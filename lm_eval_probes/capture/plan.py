"""One :class:`ProbePlan` per loaded model: what both wrappers probe, built once at load and read by every call.

The plan holds the enabled probes' :class:`~lm_eval_probes.api.PositionProbe` objects (built once, from each probe's
options and the model's depth), the probes skipped on this model with their reasons, the whole-forward captures the
probes ask for (:class:`CaptureRequests`) and the ``hidden_states`` layers a probed forward keeps. The wrappers build it
in ``__init__`` (``hf-probes`` once its lens readout knows the depth, ``hf-probes-diffusion`` from the model's config,
before any weight loads); a capture the loaded model refuses takes its probe out with :meth:`ProbePlan.without`.
The per-call code (:func:`~lm_eval_probes.capture.positions.position_probes`,
:class:`~lm_eval_probes.capture.loglikelihood.LoglikelihoodRows`) reads it and never rebuilds it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lm_eval_probes import registry
from lm_eval_probes.api import FirstAttention, FocalDepth, PositionProbe, PromptMeans
from lm_eval_probes.capture.captures import SetUp, capture_named, registered_captures
from lm_eval_probes.capture.parts import UnsupportedModelError
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.records import LayerStates

__all__ = ["ProbePlan", "CaptureRequests", "layers_of", "position_axis", "reads_lens", "capture_requests", "without_skipped"]

_LOG = logging.getLogger("lm_eval.lm_eval_probes")  # lm_eval's own log (its handler and --verbosity)


@dataclass(frozen=True)
class CaptureRequests:
    """What the enabled probes ask of the wrappers beyond the states at a response's positions: registered capture
    name (:mod:`~lm_eval_probes.capture.captures`) → ``(probe name, request)``, in registration order; at most one
    probe asks for each. The built-ins read as attributes (``None``: not asked)."""

    requests: Mapping[str, tuple[str, Any]] = field(default_factory=dict)

    def of(self, capture: str) -> tuple[str, Any] | None:
        """``(probe name, request)`` of the capture named ``capture`` (``None``: no enabled probe asks for it)."""
        return self.requests.get(capture)

    @property
    def prompt_means(self) -> tuple[str, PromptMeans] | None:
        return self.of("prompt_means")

    @property
    def focal_depth(self) -> tuple[str, FocalDepth] | None:
        return self.of("focal_depth")

    @property
    def first_attention(self) -> tuple[str, FirstAttention] | None:
        return self.of("first_attention")

    @property
    def states_folder(self) -> tuple[str, str] | None:
        return self.of("states_folder")

    def autoregressive(self) -> list[str]:
        """The probes asking for a capture that needs an autoregressive model's blocks."""
        return [probe for name, (probe, _) in self.requests.items() if capture_named(name).autoregressive]

    @property
    def prompt_layers(self) -> tuple[int, ...]:
        """The layers whose prompt means are recorded (none without a prompt-means request)."""
        return () if self.prompt_means is None else tuple(self.prompt_means[1].layers)

    @property
    def prompt_tail(self) -> int:
        return 0 if self.prompt_means is None else self.prompt_means[1].tail

    def prompt_fields(self, states: LayerStates | None) -> dict[str, Any]:
        """The record field of the prompt means (``{}`` without a request or without states)."""
        return {} if self.prompt_means is None or states is None else {self.prompt_means[1].field: states}


def capture_requests(captures: Mapping[str, PositionProbe]) -> CaptureRequests:
    """The registered whole-forward captures ``captures`` (enabled probes by name) ask for; ``ValueError`` when two ask
    for the same one."""
    found: dict[str, tuple[str, Any]] = {}
    for kind in (capture.name for capture in registered_captures()):
        asking = [(name, getattr(capture, kind, None)) for name, capture in captures.items()]
        asking = [(name, request) for name, request in asking if request is not None]
        if len(asking) > 1:
            raise ValueError(f"probes {[name for name, _ in asking]} each ask for the wrappers' {kind} capture; "
                             "enable one of them")
        if asking:
            found[kind] = asking[0]
    return CaptureRequests(found)


def layers_of(capture: PositionProbe) -> frozenset[int]:
    """The ``hidden_states`` indices a position probe reads at a response's positions (its optional ``layers()``;
    none without it)."""
    layers = getattr(capture, "layers", None)
    return frozenset() if layers is None else frozenset(layers())


def reads_lens(capture: Any) -> bool:
    """Whether a position probe (or its class) reads the logit lens (its ``reads_lens``; without one it is taken to:
    it then runs only where a lens exists, and only for a response a row reads)."""
    return bool(getattr(capture, "reads_lens", True))


def position_axis(capture: PositionProbe) -> int:
    """The axis of a position probe's per-position values that indexes the positions (its ``position_axis``; 0)."""
    return int(getattr(capture, "position_axis", 0))


def without_skipped(config: ProbeConfig, skipped: Mapping[str, str], into: dict[str, str]) -> ProbeConfig:
    """``config`` without the probes ``skipped`` (under ``probes=all``; a probe named explicitly raises
    :class:`~lm_eval_probes.config.UnsupportedProbeError`), each logged in one line and added to ``into``."""
    remaining = config.without(skipped)
    for name, reason in skipped.items():
        _LOG.warning("probes=all: probe %s skipped: %s", name, reason)
        into[name] = reason
    return remaining


@dataclass(frozen=True)
class ProbePlan:
    """What a wrapper probes on one loaded model (:meth:`of`; frozen: the calls read it).

    ``config``: the enabled probes (those skipped taken out) and their options; ``num_layers``: the model's blocks L
    (``hidden_states`` has L + 1 entries); ``captures``: each enabled probe's position probe, by name, in registry
    order; ``skipped``: probe → why it cannot run on this model (``probes=all``; the results' ``probes_skipped``);
    ``requested``: the whole-forward captures the probes ask for; ``read_layers``: the ``hidden_states`` indices the
    probes read at a response's positions; ``kept_layers``: those a probed forward keeps (see :meth:`of`).
    """

    config: ProbeConfig
    num_layers: int
    captures: Mapping[str, PositionProbe] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    requested: CaptureRequests = field(default_factory=CaptureRequests)
    read_layers: frozenset[int] = frozenset()
    kept_layers: frozenset[int] = frozenset()

    @classmethod
    def of(cls, config: ProbeConfig, num_layers: int, skipped: Mapping[str, str] | None = None) -> ProbePlan:
        """The plan of ``config`` on a model of ``num_layers`` blocks: every enabled probe's position probe, built
        once from its options (``skipped``: the probes already taken out, with their reasons)."""
        captures = {}
        for probe in registry.probes():
            if probe.name in config.probes and probe.position_probe is not None:
                captures[probe.name] = probe.position_probe(config.options_of(probe.name), num_layers)
        return cls._planned(config, num_layers, captures, dict(skipped or {}))

    @classmethod
    def _planned(cls, config: ProbeConfig, num_layers: int, captures: Mapping[str, PositionProbe],
                 skipped: Mapping[str, str]) -> ProbePlan:
        """The layers: the probes read theirs at a response's positions; a probed forward keeps those, the last one
        (its states tell the positions), the prompt-means layers and the focal-depth source layers at focal depth 0
        (at m >= 1 :class:`~lm_eval_probes.capture.readouts.FocalDepthDecoder` takes them from the blocks' inputs
        itself, and releases them as it decodes them)."""
        requested = capture_requests(captures)
        read = frozenset().union(*(layers_of(capture) for capture in captures.values()))
        kept = set(read) | {num_layers} | set(requested.prompt_layers)
        if requested.focal_depth is not None and requested.focal_depth[1].depth == 0:
            kept |= set(range(*requested.focal_depth[1].source_layers))
        return cls(config, num_layers, dict(captures), dict(skipped), requested, read, frozenset(kept))

    def without(self, skipped: Mapping[str, str]) -> ProbePlan:
        """This plan without the probes ``skipped`` (probe → why the loaded model refused what it asked for; each
        logged in one line; a probe named explicitly raises :class:`~lm_eval_probes.config.UnsupportedProbeError`).
        The remaining probes' position probes are kept as they are."""
        if not skipped:
            return self
        into = dict(self.skipped)
        config = without_skipped(self.config, skipped, into)
        captures = {name: capture for name, capture in self.captures.items() if name in config.probes}
        return self._planned(config, self.num_layers, captures, into)

    def set_up(self, setup: SetUp) -> tuple[ProbePlan, dict[str, Any]]:
        """Set up each whole-forward capture the probes ask for on the loaded model (``setup``), in registration
        order: (this plan without the probes whose capture the model refused — ``probes=all``; a probe
        named explicitly raises the refusal — and what each capture that was set up holds, by capture name)."""
        built: dict[str, Any] = {}
        refused: dict[str, str] = {}  # probe → why the loaded model refused the capture it asked for
        for name, (probe, request) in self.requested.requests.items():
            set_up = capture_named(name).set_up
            if set_up is None:
                continue
            try:
                built[name] = set_up(request, setup)
            except UnsupportedModelError as error:
                if not self.config.every_applicable:
                    raise
                refused[probe] = str(error)
        plan = self.without(refused)
        return plan, {name: held for name, held in built.items() if plan.requested.of(name) is not None}

    def position_captures(self, *, lens: bool = True) -> dict[str, PositionProbe]:
        """The enabled probes' position probes that measure something at a response's positions (their
        ``at_positions``; ``lens=False``: of those that read no logit lens), in registry order."""
        return {name: capture for name, capture in self.captures.items()
                if getattr(capture, "at_positions", None) is not None and (lens or not reads_lens(capture))}

    def layers_read(self, *, lens: bool = True) -> frozenset[int]:
        """The ``hidden_states`` indices the probes of :meth:`position_captures` read at a response's positions."""
        if lens:
            return self.read_layers
        return frozenset().union(*(layers_of(capture) for capture in self.position_captures(lens=False).values()))

    @property
    def state_layers(self) -> tuple[int, ...]:
        """The layers the probes read (at a response's positions, and the prompt means'), ascending; none without a
        position probe."""
        return tuple(sorted(self.read_layers | set(self.requested.prompt_layers))) if self.captures else ()
