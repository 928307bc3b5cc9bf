"""Small, picklable, JSON-native records that carry probe values from the model to ``process_results``, and what a
task tells the model about its requests (:class:`ProbeRequest`).

``process_results(doc, results)`` sees neither the ``Instance`` nor the ``doc_id``, so the probe rides
*inside* the response objects: :class:`ProbeLL` (a ``(loglik, is_greedy)`` tuple) and :class:`ProbeStr`
(a generation string), each with a ``.probe`` attribute holding a :class:`ResponseProbe`. Both behave
exactly like the plain objects for every stock metric and filter, survive pickling (lm_eval's
cross-rank ``gather_object``), and lose the attribute only when stringified (``--log_samples``).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, NamedTuple

from lm_eval_probes import declarations
from lm_eval_probes.api import LayerStates


class _Declared(NamedTuple):
    """What the records read of the registered probes, once per ``declarations.PROBES`` tuple."""

    probes: tuple[Any, ...] | None
    fields: tuple[str, ...]
    owners: Mapping[str, Any]  # record field → its probe
    by_name: Mapping[str, Any]  # probe name → the probe


_DECLARED = [_Declared(None, (), {}, {})]


def _declared() -> _Declared:
    if _DECLARED[0].probes is not declarations.PROBES:
        probes = declarations.PROBES
        owners = {name: probe for probe in probes for name in probe.fields}
        _DECLARED[0] = _Declared(probes, tuple(owners), owners, {probe.name: probe for probe in probes})
    return _DECLARED[0]


def declared_fields() -> tuple[str, ...]:
    """Every registered probe's record fields (:attr:`~lm_eval_probes.api.Probe.fields`), in declaration order. Read
    once per ``declarations.PROBES`` tuple (every record's construction and reads ask for them)."""
    return _declared().fields


def field_owners() -> Mapping[str, Any]:
    """Record field → the registered :class:`~lm_eval_probes.api.Probe` that declares it."""
    return _declared().owners


def _unknown_field(name: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _merged(by_probe: Mapping[str, Any], flat: Mapping[str, Any]) -> dict[str, Any]:
    """``by_probe`` (probe name → its record) with the flat ``field → value`` updates applied, each to its probe's
    record (made when missing); a record whose every field is ``None`` is left out."""
    declared = _declared()
    owners, by_name = declared.owners, declared.by_name
    out = {}
    for name, record in by_probe.items():
        probe = by_name.get(name)
        if probe is None:
            raise TypeError(f"ResponseProbe: no registered probe is called {name!r}")
        if not isinstance(record, probe.record):
            raise TypeError(f"ResponseProbe: probe {name!r}'s values must be a {probe.record.__name__}, got "
                            f"{type(record).__name__}")
        out[name] = record
    updates: dict[str, dict[str, Any]] = {}
    for name, value in flat.items():
        updates.setdefault(owners[name].name, {})[name] = value
    for name, changes in updates.items():
        current = out.get(name)
        out[name] = (dataclasses.replace(current, **changes) if current is not None
                     else by_name[name].record(**changes))
    return {name: record for name, record in out.items()
            if any(getattr(record, f.name) is not None for f in fields(record))}


@dataclass(frozen=True, init=False)
class ResponseProbe:
    """Probe values of one response, reduced over its response positions.

    Response positions are those whose next-token prediction scores a response token (teacher
    forcing): from the last prompt position to the position predicting the last response token.

    Each enabled probe's values are one instance of its typed record (:attr:`Probe.record
    <lm_eval_probes.api.Probe.record>`), held in :attr:`by_probe` under the probe's name and read with :meth:`of`
    (``probe.of("tcb").tcb_log10_mean``) or, by field name, :meth:`get`: ``None`` when the probe is disabled, ``nan``
    when undefined (empty response). Their meaning is documented where they are computed, the ``reduce`` of each
    probe's capture (the modules of each built-in's ``probe`` module under :mod:`lm_eval_probes.probes`; the first-attention capture: :mod:`~lm_eval_probes.capture.attention`).
    A record is made with the probes' fields as keyword arguments like the attributes below (``ResponseProbe(n_tokens=3,
    mean_token_logprob=-0.5, tcb_log10_mean=2.5)``, ``dataclasses.replace(probe, margin_mean=0.1)``: each goes to its
    probe's record), or with :attr:`by_probe`; a name no probe declares raises.

    Attributes:
        n_tokens: number of response tokens (= response positions).
        mean_token_logprob: mean natural-log probability of the response tokens (its exp is the
            geometric-mean token probability).
        prompt_tokens: number of context tokens the model saw before the response (after any truncation).
        by_probe: probe name → that probe's record (only the probes that filled a value).
        token_logprobs: generation only: the log-probability of every response token.
        token_ends: generation only: the character offset where each response token ends in the text.
        answer_span: ``[start, stop)`` response-token indices of the filter-extracted answer (set by the
            task after filtering; ``None``: not located).
        empty: a generation whose kept text is empty: the probed span is then the one position that chose
            to stop (its token: EOS or the first token of a stop string), so its confidence is the
            probability of stopping there and every probe value describes that position.
        document: the document's index in its task (lm_eval's ``doc_id``, set by the task after filtering):
            the identity that orders records before a seeded split.
        reveal_steps: masked-diffusion generation only (``hf-probes-diffusion``): the denoising step (0-based,
            over all blocks) that revealed each response token; ``token_logprobs`` then hold each token's
            log-probability at that step (its reveal-time confidence), so confidence can be read against
            reveal order.
        final_token_logprobs: masked-diffusion generation only: each response token's log-probability under
            the final denoising pass (equal to the reveal-time value for the tokens revealed at the last step).
        denoising_steps: masked-diffusion generation only: the number of denoising steps of the decoding.
        trajectory_steps: masked-diffusion generation only: the steps (0-based, increasing) at which
            ``trajectory_token_logprobs`` were read: :func:`~lm_eval_probes.models.diffusion_decoding.trajectory_steps` of
            :data:`~lm_eval_probes.declarations.TRAJECTORY_PERCENTS` (the last one is ``denoising_steps − 1``).
        trace: ``probe_traces=true``: the response's per-token trace (JSON-native: the response's ``tokens``, their
            ``logprob``, each enabled probe's per-position arrays by :class:`~lm_eval_probes.api.TraceField` name, and
            the first attention layer's margins over the sequence with its ``sequence_tokens``), values rounded to 4
            significant digits (:func:`trace_values`); ``None`` without traces.
        trajectory_token_logprobs: masked-diffusion generation only: one tuple per ``trajectory_steps`` entry,
            each response token's log-probability of its final token under that step's forward, whether the
            position was still masked or already revealed (calibration along the denoising trajectory). At a
            token's reveal step it is its reveal-time value; at the last step, the final pass's.
    """

    n_tokens: int
    mean_token_logprob: float
    prompt_tokens: int | None = None
    by_probe: Mapping[str, Any] = field(default_factory=dict, hash=False)
    token_logprobs: tuple[float, ...] | None = None
    token_ends: tuple[int, ...] | None = None
    answer_span: tuple[int, int] | None = None
    empty: bool = False
    document: int | None = None
    reveal_steps: tuple[int, ...] | None = None
    final_token_logprobs: tuple[float, ...] | None = None
    denoising_steps: int | None = None
    trajectory_steps: tuple[int, ...] | None = None
    trajectory_token_logprobs: tuple[tuple[float, ...], ...] | None = None
    trace: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)

    def __init__(self, n_tokens: int, mean_token_logprob: float, **values: Any) -> None:
        owners = field_owners()
        by_probe = values.pop("by_probe", None) or {}
        flat = {name: values.pop(name) for name in list(values) if name in owners}
        own = {f.name: f for f in fields(self)}
        unknown = sorted(set(values) - own.keys())
        if unknown:
            raise TypeError(f"ResponseProbe has no field {unknown[0]!r} (not its own, no declared probe's)."
                            f"{_unknown_field(unknown[0], [*own, *owners])}")
        values.update(n_tokens=n_tokens, mean_token_logprob=mean_token_logprob, by_probe=_merged(by_probe, flat))
        for name, f in own.items():
            value = values[name] if name in values else f.default_factory() if f.default_factory is not MISSING else f.default
            object.__setattr__(self, name, value)

    def of(self, probe: str) -> Any:
        """Probe ``probe``'s record of this response (its :attr:`~lm_eval_probes.api.Probe.record`), or ``None`` (the
        probe was disabled, or filled nothing)."""
        by_name = _declared().by_name
        if probe not in by_name:
            raise KeyError(f"no registered probe is called {probe!r}.{_unknown_field(probe, list(by_name))}")
        return self.by_probe.get(probe)

    def get(self, name: str) -> Any:
        """The value of the declared probe field ``name``, or ``None`` (its probe was disabled, or filled nothing)."""
        owner = field_owners().get(name)
        if owner is None:
            raise KeyError(f"no registered probe declares the record field {name!r}."
                           f"{_unknown_field(name, declared_fields())}")
        record = self.by_probe.get(owner.name)
        return None if record is None else getattr(record, name)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling; a record pickled before :attr:`by_probe` existed (its probe fields in one flat ``probe_fields``
        mapping, or one attribute per probe field, as in an older ``--use_cache`` table) has them moved to their
        probes' records."""
        state = dict(state)
        if "by_probe" not in state:
            flat = dict(state.pop("probe_fields", None) or {})
            flat.update((name, state.pop(name)) for name in declared_fields() if name in state)
            state["by_probe"] = _merged({}, {name: value for name, value in flat.items() if value is not None})
        self.__dict__.update(state)

    def trajectory_at(self, percent: int) -> tuple[float, ...] | None:
        """The response tokens' log-probabilities at ``percent`` % of the denoising steps (step
        ``ceil(percent · steps / 100) − 1``); ``None`` for a record without a trajectory or without that step."""
        if self.trajectory_token_logprobs is None or self.trajectory_steps is None or not self.denoising_steps:
            return None
        if not 0 < percent <= 100:
            raise ValueError(f"percent must be in (0, 100], got {percent}")
        step = max(0, -(-percent * self.denoising_steps // 100) - 1)
        if step not in self.trajectory_steps:
            return None
        return self.trajectory_token_logprobs[self.trajectory_steps.index(step)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form, one key per field and per declared probe field (lists, numbers, ``None``; states as
        :meth:`LayerStates.to_dict`)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "by_probe":
                out.update((name, _json_native(self.get(name))) for name in declared_fields())
            elif f.name == "trace":  # only where traced (the form of a record without one is unchanged)
                if self.trace is not None:
                    out["trace"] = dict(self.trace)
            else:
                out[f.name] = _json_native(getattr(self, f.name))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResponseProbe:
        """Inverse of :meth:`to_dict`."""
        known = {f.name for f in fields(cls)} - {"by_probe"} | set(declared_fields())
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown ResponseProbe fields: {sorted(unknown)}")
        values: dict[str, Any] = {}
        for name, value in data.items():
            if name == "trace":
                values[name] = value
                continue
            if isinstance(value, dict):  # the only mapping a record holds: hidden states (LayerStates.to_dict)
                value = LayerStates.from_dict(value)
            elif isinstance(value, list):
                value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
            values[name] = value
        return cls(**values)


TRACE_DIGITS = 4
"""Significant digits of the values of a trace."""


def trace_values(values: Sequence[float]) -> list[float | None]:
    """Numbers rounded to :data:`TRACE_DIGITS` significant digits (a non-finite one: ``None``, JSON ``null``)."""
    return [float(f"{v:.{TRACE_DIGITS}g}") if v == v and abs(v) != float("inf") else None for v in map(float, values)]


def _json_native(value: Any) -> Any:
    if isinstance(value, LayerStates):
        return value.to_dict()
    if isinstance(value, tuple):
        return [list(v) if isinstance(v, tuple) else v for v in value]
    return value


class ProbeLL(tuple):
    """A loglikelihood response ``(loglik, is_greedy)`` that also carries ``.probe``."""

    probe: ResponseProbe | None

    def __new__(cls, answer: tuple[float, bool], probe: ResponseProbe | None = None) -> ProbeLL:
        obj = super().__new__(cls, answer)
        obj.probe = probe
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProbeLL, (tuple(self), self.probe))


class ProbeStr(str):
    """A generated string that also carries ``.probe``."""

    probe: ResponseProbe | None

    def __new__(cls, text: str, probe: ResponseProbe | None = None) -> ProbeStr:
        obj = super().__new__(cls, text)
        obj.probe = probe
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProbeStr, (str(self), self.probe))


@dataclass(frozen=True)
class ProbeRequest:
    """What a task with probe rows tells the model wrapper about one of its requests: data flows from the task to
    the model on the requests (the task's ``construct_requests`` sets it as the ``Instance``'s ``probe_request``
    attribute), never back through a registry of tasks. A request without one belongs to a task that shows no
    probe rows.

    Attributes:
        options: multiple choice: the document's number of options (its first requests, in option order);
            ``None`` for other requests.
        choose: multiple choice: from the options' log-likelihoods, the index of the option whose record the task
            reads (the one the model chose), or ``None``: the wrapper gives the logit lens to that option only.
    """

    options: int | None = None
    choose: Callable[[Sequence[float]], int | None] | None = None


PROBE_REQUEST = "probe_request"
"""The ``Instance`` attribute that holds a request's :class:`ProbeRequest`."""


def probe_request_of(instance: Any) -> ProbeRequest | None:
    """The :class:`ProbeRequest` a task attached to ``instance``, or ``None`` (a task without probe rows)."""
    return getattr(instance, PROBE_REQUEST, None)


def probe_of(response: Any) -> ResponseProbe | None:
    """The probe a response carries, or ``None`` (plain responses, e.g. from stock ``hf``)."""
    return getattr(response, "probe", None)


def with_probe(response: Any, probe: ResponseProbe | None) -> Any:
    """Re-attach ``probe`` to a (filtered) response; values of other types are returned unchanged."""
    if probe is None or probe_of(response) is probe:
        return response
    if isinstance(response, str):
        return ProbeStr(response, probe)
    if isinstance(response, tuple) and len(response) == 2:
        return ProbeLL(response, probe)
    return response


@dataclass(frozen=True)
class ReaderRecord:
    """One document's input to the correctness reader / corruption detector (a per-document metric value).

    ``features``: the hidden-state summary the reader reads (``[k, H]``); ``label``: 0/1 (correct, or
    noised); ``group``: documents sharing a group (a clean prompt and its noised twin) never straddle a
    train/test split; ``document``: the document's index in its task, which puts the records in a
    canonical order before any seeded split (so no float value decides a fold). Pickles in full through lm_eval's gather; its ``str`` (what ``--log_samples``
    writes) is one short line.
    """

    features: LayerStates | None
    label: int
    group: Any = None
    document: int | None = None

    def __post_init__(self) -> None:
        if self.label not in (0, 1):
            raise ValueError(f"ReaderRecord label must be 0 or 1, got {self.label!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"features": None if self.features is None else self.features.to_dict(), "label": self.label,
                "group": self.group, "document": self.document}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReaderRecord:
        features = data.get("features")
        return cls(None if features is None else LayerStates.from_dict(features), int(data["label"]), data.get("group"),
                   data.get("document"))


def with_generation_probes(
    requests: Sequence[Any], texts: Sequence[str], probes: Mapping[tuple[str, str], deque[ResponseProbe]]
) -> list[ProbeStr]:
    """Each generated text with its probe: the probes were queued by (context, text) as lm_eval answered them
    (in its own order); identical answers to identical contexts take them first come, first served."""
    out = []
    for req, text in zip(requests, texts, strict=True):
        queue = probes.get((req.args[0], text))
        out.append(ProbeStr(text, queue.popleft() if queue else None))
    return out
