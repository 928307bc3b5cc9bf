"""Small, picklable, JSON-native records that carry probe values from the model to ``process_results``, and what a
task tells the model about its requests (:class:`ProbeRequest`).

``process_results(doc, results)`` sees neither the ``Instance`` nor the ``doc_id``, so the probe rides
*inside* the response objects: :class:`ProbeLL` (a ``(loglik, is_greedy)`` tuple) and :class:`ProbeStr`
(a generation string), each with a ``.probe`` attribute holding a :class:`ResponseProbe`. Both behave
exactly like the plain objects for every stock metric and filter, survive pickling (lm_eval's
cross-rank ``gather_object``), and lose the attribute only when stringified (``--log_samples``).
"""

from __future__ import annotations

import difflib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from lm_eval_probes import declarations
from lm_eval_probes.api import LayerStates


_DECLARED: list[Any] = [None, ()]  # (the declarations.PROBES tuple they were read from, its fields)


def declared_fields() -> tuple[str, ...]:
    """Every registered probe's record fields (:attr:`~lm_eval_probes.api.Probe.fields`), in
    declaration order: the names a :class:`ResponseProbe` carries in :attr:`~ResponseProbe.probe_fields`. Read once
    per ``declarations.PROBES`` tuple (every record's construction and attribute reads ask for them)."""
    if _DECLARED[0] is not declarations.PROBES:
        _DECLARED[:] = [declarations.PROBES,
                        tuple(dict.fromkeys(name for probe in declarations.PROBES for name in probe.fields))]
    return _DECLARED[1]


@dataclass(frozen=True, init=False)
class ResponseProbe:
    """Probe values of one response, reduced over its response positions.

    Response positions are those whose next-token prediction scores a response token (teacher
    forcing): from the last prompt position to the position predicting the last response token.

    Each probe's own values are its declared record fields (:attr:`ProbeDeclaration.fields
    <lm_eval_probes.declarations.ProbeDeclaration.fields>`), held in :attr:`probe_fields` and read as attributes
    (``probe.tcb_log10_mean``): ``None`` when their probe is disabled, ``nan`` when undefined (empty response).
    Their meaning is documented where they are computed, the ``reduce`` of each probe's capture (the modules of
    :mod:`lm_eval_probes.plugins`; the margins: :mod:`~lm_eval_probes.capture.margins`). They are given as
    keyword arguments like the attributes below (``ResponseProbe(n_tokens=3, mean_token_logprob=-0.5,
    tcb_log10_mean=2.5)``, ``dataclasses.replace(probe, margin_mean=0.1)``), or as one ``probe_fields`` mapping; a
    name no probe declares raises.

    Attributes:
        n_tokens: number of response tokens (= response positions).
        mean_token_logprob: mean natural-log probability of the response tokens (its exp is the
            geometric-mean token probability).
        prompt_tokens: number of context tokens the model saw before the response (after any truncation).
        probe_fields: the declared probe fields that were filled (field name → value; no ``None`` values).
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
        trajectory_token_logprobs: masked-diffusion generation only: one tuple per ``trajectory_steps`` entry,
            each response token's log-probability of its final token under that step's forward, whether the
            position was still masked or already revealed (calibration along the denoising trajectory). At a
            token's reveal step it is its reveal-time value; at the last step, the final pass's.
    """

    n_tokens: int
    mean_token_logprob: float
    prompt_tokens: int | None = None
    probe_fields: Mapping[str, Any] = field(default_factory=dict, hash=False)
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

    def __init__(self, n_tokens: int, mean_token_logprob: float, **values: Any) -> None:
        declared = declared_fields()
        probe_fields = dict(values.pop("probe_fields", None) or {})
        probe_fields.update((name, values.pop(name)) for name in declared if name in values)
        own = {f.name: f for f in fields(self)}
        unknown = sorted((set(values) - own.keys()) | (probe_fields.keys() - set(declared)))
        if unknown:
            close = difflib.get_close_matches(unknown[0], [*own, *declared], n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"ResponseProbe has no field {unknown[0]!r} (not its own, no declared probe's).{hint}")
        values.update(n_tokens=n_tokens, mean_token_logprob=mean_token_logprob,
                      probe_fields={name: value for name, value in probe_fields.items() if value is not None})
        for name, f in own.items():
            value = values[name] if name in values else f.default_factory() if f.default_factory is not MISSING else f.default
            object.__setattr__(self, name, value)

    def get(self, name: str) -> Any:
        """The value of the declared probe field ``name``, or ``None`` (its probe was disabled, or filled nothing)."""
        if name not in declared_fields():
            close = difflib.get_close_matches(name, declared_fields(), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise KeyError(f"no registered probe declares the record field {name!r}.{hint}")
        return self.probe_fields.get(name)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling; a record pickled before :attr:`probe_fields` existed (one attribute per probe field, as in an
        older ``--use_cache`` table) has its probe fields moved there."""
        state = dict(state)
        if "probe_fields" not in state:
            moved = {name: state.pop(name) for name in declared_fields() if name in state}
            state["probe_fields"] = {name: value for name, value in moved.items() if value is not None}
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
            if f.name == "probe_fields":
                out.update((name, _json_native(self.probe_fields.get(name))) for name in declared_fields())
            else:
                out[f.name] = _json_native(getattr(self, f.name))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResponseProbe:
        """Inverse of :meth:`to_dict`."""
        known = {f.name for f in fields(cls)} - {"probe_fields"} | set(declared_fields())
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown ResponseProbe fields: {sorted(unknown)}")
        values: dict[str, Any] = {}
        for name, value in data.items():
            if isinstance(value, dict):  # the only mapping a record holds: hidden states (LayerStates.to_dict)
                value = LayerStates.from_dict(value)
            elif isinstance(value, list):
                value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
            values[name] = value
        return cls(**values)


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
