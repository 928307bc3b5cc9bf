"""The public probe API: what a probe is, so that the built-in probes and anyone's own are written the same way.

A probe is one :class:`Probe` object exported by one module and registered by name (the built-ins by
:mod:`lm_eval_probes.registry`, others through the entry-point group ``lm_eval_probes.probes``; ``docs/design.md``,
"Writing a probe"). It says:

* its name (``probes=<name>``) and one line of help (``--help``, the report's glossary);
* its options, a frozen :class:`ProbeOptions` dataclass whose fields are made with :func:`option` (default, parser,
  help): ``probe_<name>_<field>`` in ``model_args``, parsed and validated once, before any model loads;
* what it reads: a :class:`PositionProbe` built per model (``position_probe(options, num_layers)``): the layers whose
  states it reads at a response's positions, its per-position values over a :class:`LensChunk` and their reduction to
  its record fields;
* its record: a frozen dataclass of the values it gives each response (its fields, typed; a
  :class:`~lm_eval_probes.records.ResponseProbe` carries one per probe), and its rows (:class:`Row`, typed:
  per-document value kind, aggregation, direction), each reading one field of that record;
* its extra memory as a function of the shapes (:class:`Shapes`; ``batch_size=auto`` reserves it).

Everything here is torch-free and lm_eval-free: ``--help``, option validation and the reports read probes without
loading a model. A probe's per-position code imports torch inside its methods (or its own module may, at the cost of
the import when options are validated).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import base64

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "CORRELATION", "FAMILIES", "JACOBIAN_ELEMENTS", "NON_NEGATIVE", "PRODUCT_ELEMENTS", "PRODUCT_ELEMENTS_TENSOR_CORES",
    "PRODUCT_POSITIONS", "TRACE_REDUCTIONS", "UNBOUNDED", "UNIT_INTERVAL", "VALUE_KINDS", "FirstAttention", "FocalDepth", "LayerStates",
    "LensChunk", "NoOptions", "PromptMeans", "PositionProbe", "Probe", "ProbeOptions", "Row", "Shapes", "TraceField",
    "as_choice", "as_flag", "as_float", "as_int", "as_int_list", "as_range", "jacobian_chunks", "option",
    "unknown_message",
]

VALUE_KINDS = ("float", "flag", "ranked", "partial", "confidence", "confidence_keyed", "reader", "vector", "support",
               "trace")
FAMILIES = ("probe", "difficulty", "confidence", "reader", "detector", "trajectory")
UNBOUNDED: tuple[float, float] = (-math.inf, math.inf)
"""A row's default :attr:`Row.bounds`: no bound on either side."""
UNIT_INTERVAL: tuple[float, float] = (0.0, 1.0)
"""The bounds of a fraction, a probability, an accuracy, an ECE or an AUROC."""
CORRELATION: tuple[float, float] = (-1.0, 1.0)
"""The bounds of a correlation coefficient (Spearman ρ, partial or not)."""
NON_NEGATIVE: tuple[float, float] = (0.0, math.inf)
"""The bounds of a count, a length or a norm."""


@dataclass(frozen=True)
class Row:
    """One results row.

    Per-document value kinds (what ``process_results`` returns for the row, and what ``--log_samples`` files hold):
    ``float`` a number (``None`` when undefined; aggregated by ``mean``); ``flag`` 0/1 (``probe_count``); ``ranked``
    ``(value, difficulty)``; ``partial`` ``(value, difficulty, length)``; ``confidence`` ``(confidence, correct)``;
    ``confidence_keyed`` ``(confidence, correct, document)``; ``reader`` a
    :class:`~lm_eval_probes.records.ReaderRecord`; ``vector`` a list of floats (``probe_vector_mean``); ``support``
    ``{"positions", "tokens", "margins"}`` (``probe_support_mean``); ``trace`` a document's per-token trace
    (``probe_traces=true``: :class:`TraceField`; ``probe_count``: the documents with one).

    Attributes:
        name: the metric name in lm_eval's results (``<name>,<filter>``).
        value: the per-document value kind.
        aggregation: the registered aggregation name (``mean`` or ``probe_*``).
        higher_is_better: the direction lm_eval shows as an arrow.
        family: ``probe`` (a probe value), ``difficulty`` (ρ with difficulty and its baselines), ``confidence``
            (calibration and selective prediction), ``reader`` (the latent correctness reader), ``detector`` (paired
            clean/noised tasks), ``trajectory`` (calibration along the denoising trajectory).
        description: what the row measures (one line; the report's column title and glossary).
        field: the record field its per-document value is read from (``support``: the prefix of the three support
            fields ``<field>_positions``, ``<field>_tokens``, ``<field>_values``); ``None`` for rows made otherwise.
        at_percent: a trajectory row: the point of the denoising trajectory it reads, in percent of the steps.
        diffusion_only: filled only by ``hf-probes-diffusion``.
        scored: whether higher (or lower) is better, so that a report shows its direction and may count it as a win;
            ``False`` for baselines and bookkeeping.
        bounds: ``(low, high)``, the range of the row's value by its definition (``-inf``/``inf`` where a side is
            unbounded; the default, :data:`UNBOUNDED`, is both): e.g. ``(0.0, 1.0)`` for an accuracy, ECE or AUROC,
            ``(-1.0, 1.0)`` for a correlation, ``(0.0, math.inf)`` for a count or a norm. The Every Eval Ever export
            declares it as the metric's ``min_score``/``max_score``.
    """

    name: str
    value: str
    aggregation: str
    higher_is_better: bool
    family: str
    description: str
    field: str | None = None
    at_percent: int | None = None
    diffusion_only: bool = False
    scored: bool = True
    bounds: tuple[float, float] = UNBOUNDED

    def __post_init__(self) -> None:
        if self.value not in VALUE_KINDS:
            raise ValueError(f"row {self.name!r}: unknown value kind {self.value!r}; valid: {VALUE_KINDS}")
        if self.family not in FAMILIES:
            raise ValueError(f"row {self.name!r}: unknown family {self.family!r}; valid: {FAMILIES}")
        bounds = tuple(self.bounds) if isinstance(self.bounds, (tuple, list)) else ()
        if (len(bounds) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
                or not bounds[0] < bounds[1]):
            raise ValueError(f"row {self.name!r}: bounds must be (low, high) numbers with low < high (-inf/inf where "
                             f"unbounded), got {self.bounds!r}")
        object.__setattr__(self, "bounds", (float(bounds[0]), float(bounds[1])))

    def fields(self) -> tuple[str, ...]:
        """The record fields the row reads (a support row: its three)."""
        if self.field is None:
            return ()
        if self.value == "support":
            return tuple(f"{self.field}_{part}" for part in ("positions", "tokens", "values"))
        return (self.field,)


TRACE_REDUCTIONS = ("mean", "min")
"""How a :class:`TraceField` reduces its per-position values (over the positions where the value is defined)."""


@dataclass(frozen=True)
class TraceField:
    """A per-position array a probe writes into a document's trace (``probe_traces=true``), and the reduction that
    makes one of its record fields from it: the record field equals ``reduction`` of the array over its defined
    (finite) positions, up to the trace's rounding to 4 significant digits.

    Attributes:
        name: the key of the array in the trace (several fields may reduce one array).
        field: the record field it reduces to.
        reduction: one of :data:`TRACE_REDUCTIONS`.
        over: ``response`` (one value per response token: the :class:`PositionProbe`'s ``per_position`` makes it) or
            ``sequence`` (one per position the model saw, prompt first: a whole-forward capture's, e.g. the first
            attention layer's margins).
    """

    name: str
    field: str
    reduction: str = "mean"
    over: str = "response"

    def __post_init__(self) -> None:
        if self.reduction not in TRACE_REDUCTIONS:
            raise ValueError(f"trace {self.name!r}: unknown reduction {self.reduction!r}; valid: {TRACE_REDUCTIONS}")
        if self.over not in ("response", "sequence"):
            raise ValueError(f"trace {self.name!r}: over must be 'response' or 'sequence', got {self.over!r}")

    def reduce(self, values: Iterable[float | None]) -> float:
        """The reduction of ``values`` over its finite members (``nan`` when none)."""
        finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
        if not finite:
            return math.nan
        return math.fsum(finite) / len(finite) if self.reduction == "mean" else min(finite)


# ----------------------------------------------------------------------------- options


def unknown_message(what: str, given: str, valid: Iterable[str]) -> str:
    """``unknown <what> '<given>'. Did you mean '<close>'? Valid: a, b, c.``"""
    valid = list(valid)
    close = difflib.get_close_matches(str(given), valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"unknown {what} {given!r}.{hint} Valid: {', '.join(valid)}."


_UNSET_WORDS = ("", "none", "auto")


def _unset(value: Any, words: Iterable[str] = _UNSET_WORDS) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in tuple(words))


def as_int(key: str, value: Any) -> int:
    """An integer (``"8"``, ``8``, ``8.0``); raises ``ValueError`` naming ``key`` otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be an integer, got {value!r}") from None
    if number != int(number):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    return int(number)


def as_float(key: str, value: Any) -> float:
    """A number; raises ``ValueError`` naming ``key`` otherwise."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be a number, got {value!r}") from None


def as_flag(key: str, value: Any) -> bool:
    """``1/0``, ``true/false``, ``yes/no``, ``on/off``."""
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", "none", ""):
        return False
    raise ValueError(f"{key} must be 1/0 (true/false), got {value!r}")


def as_choice(*choices: str) -> Callable[[str, Any], str]:
    """A parser of one of ``choices`` (case-insensitive), with a did-you-mean."""

    def parse(key: str, value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(unknown_message(key, text, choices))
        return text

    return parse


def as_range(key: str, value: Any) -> tuple[int, int] | None:
    """``"12:20"`` (or ``12-20``, a pair) → ``(12, 20)``; ``None``/``auto``/``none`` → ``None``."""
    if _unset(value):
        return None
    if isinstance(value, str):
        parts: list[Any] = value.replace("-", ":").split(":")
    elif isinstance(value, Iterable):
        parts = list(value)
    else:
        parts = []
    if len(parts) != 2:
        raise ValueError(f"{key} must look like '12:20' (a range [start, stop)), got {value!r}")
    return (as_int(key, parts[0]), as_int(key, parts[1]))


LIST_SEPARATORS = (",", "+", ";", "|", " ")


def as_int_list(key: str, value: Any) -> tuple[int, ...] | None:
    """``"12+16+20"`` (``,``/``+``/``;``/``|``/space, brackets allowed), a number or a list → a tuple of integers;
    ``None``/``auto``/``none`` → ``None``."""
    if _unset(value):
        return None
    if isinstance(value, (int, float)):
        return (as_int(key, value),)
    if isinstance(value, str):
        text = value.strip().strip("[](){}")
        for sep in LIST_SEPARATORS[1:]:
            text = text.replace(sep, ",")
        value = [t for t in text.split(",") if t.strip()]
    if not isinstance(value, Iterable):
        raise ValueError(f"{key} must be integers like '12+16+20', got {value!r}")
    return tuple(as_int(key, item) for item in value)


def or_none(parse: Callable[[str, Any], Any], *words: str) -> Callable[[str, Any], Any]:
    """``parse``, with ``None`` for an unset value or one of ``words`` (default: empty, ``none``, ``auto``)."""
    unset_words = words or _UNSET_WORDS

    def parse_or_none(key: str, value: Any) -> Any:
        return None if _unset(value, unset_words) else parse(key, value)

    return parse_or_none


_PARSERS: dict[Any, Callable[[str, Any], Any]] = {int: as_int, float: as_float, bool: as_flag, str: lambda _k, v: str(v).strip()}


def option(default: Any, help: str, *, parse: Callable[[str, Any], Any] | None = None, shown: str | None = None,
           key: str | None = None, requires_probe: bool = False, identity: bool = True) -> Any:
    """A field of a :class:`ProbeOptions` dataclass.

    Args:
        default: its value when ``model_args`` does not set it.
        help: one line for ``--help`` and the docs.
        parse: ``(key, raw value) -> value`` (raises ``ValueError`` naming ``key``); default: by the type of
            ``default`` (int, float, bool, str).
        shown: how ``--help`` shows the default (e.g. ``none`` for an option that is off unless set).
        key: its ``model_args`` key when it is not ``probe_<probe>_<field>`` (kept for an established spelling).
        requires_probe: setting it (to anything but its default) without its probe in ``probes`` is an error (an
            option that asks the probe for extra work); other options of a disabled probe are validated and unused.
        identity: ``False`` for an option that changes no value (where files are written): left out of the
            configuration's identity (``--use_cache`` tables) and its ``repr``.
    """
    if parse is None:
        if type(default) not in _PARSERS:
            raise TypeError(f"option default {default!r}: give parse= for a {type(default).__name__} option")
        parse = _PARSERS[type(default)]
    return field(default=default, compare=identity, repr=identity, metadata={"help": help, "parse": parse, "shown": shown, "key": key,
                                                "requires_probe": requires_probe})


@dataclass(frozen=True)
class ProbeOptions:
    """A probe's options: subclass as a frozen dataclass whose fields are :func:`option` s, and validate in
    ``__post_init__`` (raise ``ValueError`` with the ``model_args`` key and the value)."""

    @classmethod
    def keys(cls, probe: str) -> dict[str, str]:
        """``model_args`` key → field name."""
        return {(f.metadata.get("key") or f"probe_{probe}_{f.name}"): f.name for f in dataclasses.fields(cls)}

    @classmethod
    def parse(cls, probe: str, values: Mapping[str, Any]) -> ProbeOptions:
        """From ``model_args`` items of this probe (keys as in :meth:`keys`)."""
        keys = cls.keys(probe)
        by_name = {f.name: f for f in dataclasses.fields(cls)}
        parsed = {}
        for key, raw in values.items():
            if key not in keys:
                raise ValueError(unknown_message(f"option of probe {probe!r}", key, keys))
            name = keys[key]
            parsed[name] = by_name[name].metadata["parse"](key, raw)
        return cls(**parsed)

    def requiring_probe(self, probe: str) -> list[str]:
        """The ``model_args`` keys of the options set here that need their probe enabled."""
        return [f.metadata.get("key") or f"probe_{probe}_{f.name}" for f in dataclasses.fields(self)
                if f.metadata.get("requires_probe") and getattr(self, f.name) != f.default]

    @classmethod
    def help(cls, probe: str) -> list[tuple[str, str, str]]:
        """``(model_args key, default as shown, help)`` of each option."""
        out = []
        for f in dataclasses.fields(cls):
            key = f.metadata.get("key") or f"probe_{probe}_{f.name}"
            default = f.metadata.get("shown") or ("auto" if f.default is None else _shown(f.default))
            out.append((key, default, f.metadata.get("help", "")))
        return out


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, tuple):
        return "+".join(str(v) for v in value)
    return str(value)


@dataclass(frozen=True)
class NoOptions(ProbeOptions):
    """A probe without options."""


# ----------------------------------------------------------------------------- capture


class LayerStates:
    """Hidden-state vectors of a few layers, reduced at capture time (read by the correctness reader).

    ``values`` is ``[len(layers), H]`` (a mean over positions) or ``[len(layers), n, H]`` (one vector
    per position, e.g. the last positions of a generation). ``layers`` index HF ``hidden_states``
    (0 = embeddings, L = the final layer). Pickles in full (lm_eval's cross-rank gather); ``str`` is
    one short line, which is what ``--log_samples`` files get (they stringify unknown objects);
    :meth:`to_dict` / :meth:`from_dict` are a lossless JSON form (base64 of the raw bytes).
    """

    __slots__ = ("layers", "values")

    def __init__(self, layers: tuple[int, ...] | list[int], values: Any) -> None:
        array = np.asarray(values)
        if array.ndim not in (2, 3) or array.shape[0] != len(layers):
            raise ValueError(f"LayerStates values must be [{len(layers)}, H] or [{len(layers)}, n, H], got {array.shape}")
        if array.dtype not in (np.float16, np.float32, np.float64):
            raise ValueError(f"LayerStates values must be float16/32/64, got {array.dtype}")
        self.layers = tuple(int(layer) for layer in layers)
        self.values = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (LayerStates, (self.layers, self.values))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, LayerStates)
            and self.layers == other.layers
            and self.values.dtype == other.values.dtype
            and np.array_equal(self.values, other.values, equal_nan=True)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shape = "x".join(str(n) for n in self.values.shape)
        return f"LayerStates(layers={list(self.layers)}, {shape} {self.values.dtype})"

    __str__ = __repr__

    def mean_positions(self, start: int, stop: int) -> LayerStates:
        """Mean over positions ``[start, stop)`` of a per-position ``[k, n, H]`` record → ``[k, H]`` float32."""
        if self.values.ndim != 3 or not 0 <= start < stop <= self.values.shape[1]:
            raise ValueError(f"cannot average positions [{start}, {stop}) of {self!r}")
        return LayerStates(self.layers, self.values[:, start:stop].astype(np.float64).mean(axis=1).astype(np.float32))

    def to_dict(self) -> dict[str, Any]:
        data = np.ascontiguousarray(self.values)
        return {
            "layers": list(self.layers),
            "shape": list(data.shape),
            "dtype": str(data.dtype),
            "data": base64.b64encode(data.tobytes()).decode("ascii"),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerStates:
        raw = base64.b64decode(data["data"])
        values = np.frombuffer(raw, dtype=np.dtype(data["dtype"])).reshape(data["shape"]).copy()
        return cls(data["layers"], values)




@dataclass(frozen=True)
class Shapes:
    """The sizes a probe's extra memory depends on (one forward of the wrapper).

    Attributes:
        batch: sequences in the forward.
        tokens: positions per sequence (the longest, padded).
        response_tokens: response positions per sequence that the probes read.
        layers: the model's blocks L (``hidden_states`` has L + 1 entries).
        width: the hidden size d.
        vocab: the unembedding's rows V.
        heads: attention heads of a block.
        head_dim: the width of a head.
        dtype_bytes: bytes of one element of the model's states (2 for bfloat16).
        chunk_positions: positions read out through the lens at once (``probe_chunk_positions``).
        ffn: the width of a block's feed-forward layer (0: unknown, read as 4·d).
        layer_types: each block's attention type (``config.layer_types``: sliding or full; empty: all alike).
        kv_heads: key/value heads of a block (0: unknown, read as :attr:`heads`).
        tensor_cores: whether the model's device has float32 products of bfloat16 terms (a CUDA GPU:
            :func:`~lm_eval_probes.stack_api.float32_products_native`), where a probe may take other paths (the
            margins' ``auto`` precision).
    """

    batch: int
    tokens: int
    response_tokens: int
    layers: int
    width: int
    vocab: int
    heads: int
    head_dim: int
    dtype_bytes: int = 4
    chunk_positions: int = 64
    ffn: int = 0
    layer_types: tuple[str, ...] = ()
    kv_heads: int = 0
    tensor_cores: bool = False

    @property
    def lens_positions(self) -> int:
        """Positions of one lens chunk (at most :attr:`chunk_positions`)."""
        return max(1, min(self.chunk_positions, self.batch * self.response_tokens))


class LensChunk(Protocol):
    """What a :class:`PositionProbe` reads at a chunk of a response span's positions ``[lo, hi)`` (the wrappers'
    :class:`~lm_eval_probes.capture.positions.LensChunk`): their states and, each computed once whoever asks first,
    the final layer's logits and any layer's lens logits."""

    lo: int
    hi: int

    def states(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s ``[hi − lo, H]`` states (``hidden_states`` index; L after the final norm)."""
        ...

    @property
    def final_hidden(self) -> torch.Tensor:
        """The final layer's (post-norm) states, float32 on the unembedding's device."""
        ...

    @property
    def raw_logits(self) -> torch.Tensor:
        """The final layer's logits ``W h + b`` before the model's soft-capping."""
        ...

    @property
    def final_logits(self) -> torch.Tensor:
        """The model's own logits (soft-capped where the model caps them)."""
        ...

    def layer_logits(self, first: int, last: int) -> Iterator[torch.Tensor]:
        """The lens logits of layers ``first..last`` in turn (each buffer reused once the next has arrived)."""
        ...


@runtime_checkable
class PositionProbe(Protocol):
    """A probe's capture (built once per model as ``probe.position_probe(options, num_layers)``, which validates its
    options against the model). Every hook is optional: a probe implements only those it needs.

    At a response's positions, the wrapper reads the ``layers()`` of every enabled probe, a chunk of positions at a
    time (:class:`LensChunk`: their states and, read once whoever asks first, the final layer's logits and any layer's
    lens logits), keeps what ``at_positions(chunk)`` returns, cuts those per-position values to a response and makes
    them the probe's record fields with ``reduce(values, positions=, generation=)``:

    * ``layers() -> frozenset[int]`` — the ``hidden_states`` indices (0 = embeddings … L, L after the final norm) whose
      states it reads at the positions (without it: none);
    * ``at_positions(chunk) -> {name: tensor}`` — its per-position values at the chunk's positions (possibly none: an
      empty response). Without it the probe measures nothing at the positions (and its ``reduce`` is not called);
    * ``reduce(values, *, positions, generation) -> dict`` — its record fields from its per-position ``values`` cut to
      one response of ``positions`` positions (``nan`` where undefined: no positions); ``generation``: the response is
      a generation (a probe may keep more of it, e.g. its last positions' states one by one, for the answer span a
      task's filter extracts later). Without it: no fields from the positions;
    * ``per_position(values) -> {trace name: [n] tensor}`` — for a probe that declares :attr:`Probe.traces` over the
      response: from its per-position ``values`` of one response, the arrays its traces name (``probe_traces=true``).

    A probe whose values need more than the states at a response's positions asks the wrappers for a whole-forward
    capture with an optional attribute (``None`` or absent: not asked): ``prompt_means`` (:class:`PromptMeans`: the
    mean states over the prompt, set as a record field), ``focal_depth`` (:class:`FocalDepth`: top-K masses of the
    model's last blocks re-run on every source layer, given to ``reduce`` as the value ``mass [S, n]``),
    ``first_attention`` (:class:`FirstAttention`: the first softmax-attention layer's queries, keys and query-map
    Jacobian over every position the model saw, turned by the probe into record fields) and ``states_folder`` (a
    folder where the wrappers write the prompt-means probe's states of every answered request). At most one enabled
    probe asks for each. A probe that only asks for one (the margins: ``first_attention``) needs none of the hooks.

    Attributes:
        reads_lens: whether it reads the logit lens: skipped for a response no row reads (an option the model did not
            choose), and not run by ``hf-probes-diffusion``. Without it: taken to read the lens.
        position_axis: the axis of its per-position values that indexes the positions (without it: 0).
    """

    reads_lens: bool


# ----------------------------------------------------------------------------- the probe


@dataclass(frozen=True)
class PromptMeans:
    """A request for the mean hidden states over each request's prompt (the positions before the response).

    Attributes:
        layers: the ``hidden_states`` indices averaged.
        field: the record field the :class:`LayerStates` ``[k, H]`` goes to.
        tail: average the last this-many prompt positions (0 = the whole prompt).
    """

    layers: tuple[int, ...]
    field: str
    tail: int = 0


@dataclass(frozen=True)
class FocalDepth:
    """A request for HyperLens focal-depth decodings (:class:`~lm_eval_probes.capture.readouts.FocalDepthDecoder`):
    each source layer's states go through the model's last ``depth`` blocks, then the final norm and unembedding; the
    top-``top_k`` mass at every response position is given to the probe as ``mass [S, n]``.

    Attributes:
        depth: blocks re-run (0 = the logit lens).
        source_layers: ``[start, stop)`` ``hidden_states`` indices.
        top_k: K of the mass.
        chunk_tokens: at most this many tokens go through the blocks at once (at least one sequence); ``None``: as
            many as :meth:`tokens_per_chunk` gives the model's widths.
    """

    depth: int
    source_layers: tuple[int, int]
    top_k: int = 1
    chunk_tokens: int | None = None

    RERUN_BYTES: ClassVar[int] = 2**29
    """The blocks' activations one re-run may hold when ``chunk_tokens`` is not given (512 MiB)."""
    MAX_CHUNK_TOKENS: ClassVar[int] = 16384

    @staticmethod
    def rerun_bytes_per_token(width: int, ffn: int, dtype_bytes: int) -> int:
        """What one token holds in the re-run blocks: states, queries, keys, values and attention output (4·d) and the
        feed-forward's gate, up and product (3·F; 0: unknown, read as 4·d), in the model's dtype."""
        return (4 * width + 3 * (ffn or 4 * width)) * dtype_bytes

    def tokens_per_chunk(self, width: int, ffn: int, dtype_bytes: int) -> int:
        """``chunk_tokens``, or the most tokens whose re-run activations (:meth:`rerun_bytes_per_token`) fit in
        :attr:`RERUN_BYTES`, at most :attr:`MAX_CHUNK_TOKENS` (a small model: 16384)."""
        if self.chunk_tokens is not None:
            return self.chunk_tokens
        per_token = self.rerun_bytes_per_token(width, ffn, dtype_bytes)
        return max(1, min(self.MAX_CHUNK_TOKENS, self.RERUN_BYTES // max(per_token, 1)))


@dataclass(frozen=True)
class FirstAttention:
    """A request for the first softmax-attention layer over every position the model saw, in the same forwards: each
    captured batch as a :class:`~lm_eval_probes.capture.attention.AttentionBatch` (its token ids, and per row, re-run
    when asked, an :class:`~lm_eval_probes.capture.attention.AttentionRow`: queries and keys as the attention uses
    them, logit scale, soft cap, sliding window, attention sinks, and the Jacobian of its query map a chunk of positions
    at a time), which the probe turns into per-position values; a response's share of them becomes its record fields.

    Attributes:
        values: ``(batch) -> [B, T]`` per-position values of one captured batch (``nan`` = none), on the CPU.
        fields: ``(values [n], token_ids [n], decode) -> record fields`` of one response's sequence: the n positions
            the model saw (its context or prompt, then all but the last response token), their token ids, and
            ``decode(token id) -> str``.
        trace: the name of the values' array in a document's trace (``probe_traces=true``: every position the model
            saw, beside ``sequence_tokens``), or ``None`` for none; a :class:`TraceField` with ``over="sequence"``
            reduces it.
    """

    values: Callable[[Any], Any]
    fields: Callable[[Any, Any, Callable[[int], str]], dict[str, Any]]
    trace: str | None = None


JACOBIAN_ELEMENTS = 1 << 24
"""The most float64 values of one chunk of :class:`FirstAttention`'s query-map Jacobians ``[H, c, p, n]`` (128 MiB):
it sets the chunk c of positions (:func:`jacobian_chunks`); where the Jacobians are float32 (the margins on tensor
cores) the same 128 MiB hold twice as many."""

PRODUCT_ELEMENTS = 1 << 23
"""About the most float64 values one forward-mode product of the first attention layer's query map moves (64 MiB):
its repeated inputs and tangents ``[g·c, m]`` and about eight ``[H, g·c, p]`` (queries, tangents and the layer's own
rotations and norms), g the columns of u one product covers (:func:`jacobian_chunks`)."""


PRODUCT_ELEMENTS_TENSOR_CORES = 1 << 26
""":data:`PRODUCT_ELEMENTS` where the margins' products are float32 (a GPU's: 512 MiB): each product is a run of the
layer's query code, about a hundred kernel launches, so fewer, larger ones where launches are what costs
(``benchmarks/gpu_cost.py``)."""


PRODUCT_POSITIONS = 1024
"""The most positions one forward-mode product runs the query code on (g·c): code that compares positions with each
other before the attention call (DeepSeek-V3.2's indexer) costs their square."""


def jacobian_chunks(tokens: int, heads: int, head_dim: int, columns: int, inputs: int, *,
                    tensor_cores: bool = False) -> tuple[int, int]:
    """``(c, g)``: the positions of one chunk of :class:`FirstAttention`'s query-map Jacobians ``[H, c, p, n]`` (at
    most 256, and :data:`JACOBIAN_ELEMENTS` values, twice as many float32 ones with ``tensor_cores``: 128 MiB either
    way) and the columns one forward-mode product covers (about
    :data:`PRODUCT_ELEMENTS` values moved, :data:`PRODUCT_ELEMENTS_TENSOR_CORES` with ``tensor_cores``, on at most
    :data:`PRODUCT_POSITIONS` positions), for a sequence of ``tokens``, ``heads`` query heads of width ``head_dim``,
    n = ``columns`` read per head and m = ``inputs`` input-projection outputs."""
    elements = 2 * JACOBIAN_ELEMENTS if tensor_cores else JACOBIAN_ELEMENTS  # float32 or float64: 128 MiB
    chunk = max(1, min(tokens, 256, elements // max(1, heads * head_dim * columns)))
    budget = PRODUCT_ELEMENTS_TENSOR_CORES if tensor_cores else PRODUCT_ELEMENTS
    group = max(1, min(columns, PRODUCT_POSITIONS // chunk,
                       budget // max(1, chunk * (2 * inputs + 8 * heads * head_dim))))
    return chunk, group


GENERATED_RECORD = "__lm_eval_probes_generated__"
"""Marks a record class made by :func:`generated_record` (remade when the probe's fields change)."""

_GENERATED: dict[tuple[str, tuple[str, ...]], type] = {}


def record_fields(record: type) -> tuple[str, ...]:
    """The field names of a probe's record class."""
    return tuple(f.name for f in dataclasses.fields(record))


def generated_record(probe: str, fields: tuple[str, ...]) -> type:
    """The record class of a probe that declares only its field names: a frozen dataclass with those fields (typed
    ``Any``, default ``None``), one class per ``(probe, fields)`` in a process; it pickles by value (rebuilt by name
    in the receiving process: lm_eval's cross-rank gather)."""
    key = (probe, tuple(fields))
    if key not in _GENERATED:
        title = "".join(part.capitalize() for part in probe.split("_")) or "Probe"
        cls = dataclasses.make_dataclass(
            f"{title}Record", [(name, Any, field(default=None)) for name in key[1]], frozen=True,
            namespace={"__reduce__": lambda self: (_rebuilt_record, (key[0], key[1], tuple(getattr(self, n) for n in key[1]))),
                       "__doc__": f"Probe {probe!r}'s values of one response (made from its field names).",
                       GENERATED_RECORD: True},
        )
        cls.__module__ = __name__
        _GENERATED[key] = cls
    return _GENERATED[key]


def _rebuilt_record(probe: str, fields: tuple[str, ...], values: tuple[Any, ...]) -> Any:
    return generated_record(probe, fields)(*values)


class ProbeRegistrationError(ValueError):
    """A probe that cannot produce what it declares (named with the probe and the row or field)."""


@dataclass(frozen=True)
class Probe:
    """One probe (see the module docstring).

    Attributes:
        name: its name in ``probes=`` (lower case letters, digits and ``_``).
        summary: one line for ``--help`` and the report's glossary.
        fields: the record fields its capture fills (names unique across all probes): the field names of
            :attr:`record` (give either).
        record: a frozen dataclass, one instance per response: the probe's values, typed, each field defaulting to
            ``None`` (not computed); a :class:`~lm_eval_probes.records.ResponseProbe` carries it under the probe's
            name (:meth:`~lm_eval_probes.records.ResponseProbe.of`). Given :attr:`fields` only, one is made whose
            fields are typed ``Any``.
        rows: its own rows (family ``probe``), each reading one of :attr:`fields`.
        position_probe: ``(options, num_layers) -> PositionProbe``: its capture at a response's positions (a class
            that takes those two arguments serves; it may also ask for a whole-forward capture, see
            :class:`PositionProbe`); required for a probe with rows.
        options: its :class:`ProbeOptions` dataclass.
        memory: ``(options, shapes) -> bytes``: the extra peak memory the probe adds to a forward of those shapes.
        ranked: the record field ranked against the document's difficulty (adds ``<name>_spearman`` and its
            length-partialled twins), or ``None``.
        ranked_text: how the ρ rows' descriptions name that value.
        label: the value's name on a figure axis.
        feeds: rows of other families made from its record fields (each row's ``field``).
        paper, formula, reads: its source, its formula and what it reads, for the docs and the glossary.
        default_enabled: whether ``hf-probes`` computes it when ``probes=`` is not given (the cheap ones: they read
            the states the harness's own forward already computes).
        feed_states: ``(record, field, *, answer_span) -> LayerStates | None``: the states a row of :attr:`feeds` reads
            from a document's record (``answer_span``: the generation's confidence reads its located answer span);
            default: the :class:`LayerStates` in the record's field.
        traces: its per-position arrays in a document's trace (``probe_traces=true``), each with the record field it
            reduces to (:class:`TraceField`; those over the response come from its position probe's ``per_position``).
        applies: ``(model config) -> reason | None``: why the probe cannot run on a model of this (transformers)
            config, checked before any weight loads (``None``: it can; not given: every model). Besides it, a
            whole-forward capture the probe asks for may refuse the loaded model (an ``UnsupportedModelError``). Either
            way ``probes=all`` skips the probe (one log line, ``probes_skipped`` in the results' config) and a probe
            named explicitly refuses the run in one line.
    """

    name: str
    summary: str
    fields: tuple[str, ...] = ()
    rows: tuple[Row, ...] = ()
    position_probe: Callable[[Any, int], PositionProbe] | None = None
    options: type[ProbeOptions] = NoOptions
    memory: Callable[[Any, Shapes], int] | None = None
    ranked: str | None = None
    ranked_text: str = ""
    label: str = ""
    feeds: tuple[Row, ...] = ()
    paper: str = ""
    formula: str = ""
    reads: str = ""
    default_enabled: bool = False
    feed_states: Callable[..., LayerStates | None] | None = None
    record: type | None = None
    traces: tuple[TraceField, ...] = ()
    applies: Callable[[Any], str | None] | None = None

    def __post_init__(self) -> None:
        record = self.record
        generated = getattr(record, GENERATED_RECORD, False)
        fields = tuple(self.fields)
        if record is not None and not generated:
            if not (isinstance(record, type) and dataclasses.is_dataclass(record)):
                raise ProbeRegistrationError(f"probe {self.name!r}: record must be a dataclass, got {record!r}")
            names = record_fields(record)
            if fields and fields != names:
                raise ProbeRegistrationError(f"probe {self.name!r}: fields {fields} differ from its record "
                                             f"{record.__name__}'s {names} (give one of them)")
            unset = [f.name for f in dataclasses.fields(record) if f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING]
            if unset:
                raise ProbeRegistrationError(f"probe {self.name!r}: record {record.__name__}'s fields {unset} need a "
                                             "default (None: not computed for this response)")
            fields = names
        object.__setattr__(self, "fields", fields)
        self.check()
        if record is None or (generated and record_fields(record) != self.fields):
            object.__setattr__(self, "record", generated_record(self.name, self.fields))

    def check(self) -> None:
        """Raises :class:`ProbeRegistrationError` for a probe that cannot produce a row it declares."""
        name = self.name
        if not isinstance(name, str) or not name or not all(c.isalnum() or c == "_" for c in name) or name != name.lower():
            raise ProbeRegistrationError(f"probe name {name!r}: use lower-case letters, digits and '_'")
        if name in ("all", "none"):
            raise ProbeRegistrationError(f"probe name {name!r} is reserved (probes=all, probes=none)")
        if len(set(self.fields)) != len(self.fields):
            raise ProbeRegistrationError(f"probe {name!r} declares a record field twice: {self.fields}")
        if not (isinstance(self.options, type) and issubclass(self.options, ProbeOptions)
                and dataclasses.is_dataclass(self.options)):
            raise ProbeRegistrationError(f"probe {name!r}: options must be a ProbeOptions dataclass, got {self.options!r}")
        for row in (*self.rows, *self.feeds):
            if not isinstance(row, Row):
                raise ProbeRegistrationError(f"probe {name!r}: row {row!r} is not an lm_eval_probes.api.Row")
            missing = [f for f in row.fields() if f not in self.fields]
            if row.field is None or missing:
                raise ProbeRegistrationError(
                    f"probe {name!r}, row {row.name!r}: reads record field {row.field!r}, which the probe does not "
                    f"declare in fields {self.fields}")
        for row in self.rows:
            if row.family != "probe":
                raise ProbeRegistrationError(f"probe {name!r}, row {row.name!r}: a probe's own rows are of family "
                                             f"'probe' (got {row.family!r}; rows of other families go in feeds)")
        for trace in self.traces:
            if not isinstance(trace, TraceField) or trace.field not in self.fields:
                raise ProbeRegistrationError(f"probe {name!r}: trace {trace!r} must be a TraceField reducing to one of "
                                             f"its fields {self.fields}")
        if self.ranked is not None and self.ranked not in self.fields:
            raise ProbeRegistrationError(f"probe {name!r}: ranked field {self.ranked!r} is not in its fields {self.fields}")
        if (self.rows or self.feeds) and self.position_probe is None:
            raise ProbeRegistrationError(
                f"probe {name!r}: rows {[row.name for row in self.rows + self.feeds]} read fields that no capture fills "
                "(give position_probe)")
        if self.position_probe is not None and not callable(self.position_probe):
            raise ProbeRegistrationError(f"probe {name!r}: position_probe must be callable (options, num_layers)")

    def unsupported(self, config: Any) -> str | None:
        """Why the probe cannot run on a model of ``config`` (:attr:`applies`), or ``None``."""
        return None if self.applies is None else self.applies(config)

    def row(self, value: str) -> Row:
        """Its first row of per-document value kind ``value`` (``float``: its headline row; ``vector``, ``support``)."""
        found = next((row for row in self.rows if row.value == value), None)
        if found is None:
            raise KeyError(f"probe {self.name!r} has no {value!r} row")
        return found

    def difficulty_rows(self) -> tuple[Row, ...]:
        """The ρ rows of :attr:`ranked`: with difficulty, and with the response's and the prompt's length
        partialled out."""
        if self.ranked is None:
            return ()
        return (
            Row(f"{self.name}_spearman", "ranked", "probe_spearman", True, "difficulty",
                f"Spearman ρ of {self.ranked_text or self.ranked} with the document's difficulty label", self.ranked,
                bounds=CORRELATION),
            Row(f"{self.name}_spearman_partial", "partial", "probe_partial_spearman", True, "difficulty",
                f"{self.name}_spearman with response length partialled out", self.ranked, bounds=CORRELATION),
            Row(f"{self.name}_spearman_partial_prompt", "partial", "probe_partial_spearman", True, "difficulty",
                f"{self.name}_spearman with prompt length partialled out", self.ranked, bounds=CORRELATION),
        )

    def default_options(self) -> ProbeOptions:
        return self.options()

    def fed(self, record: Any, row: Row, *, answer_span: bool = False) -> LayerStates | None:
        """The states ``row`` (one of :attr:`feeds`) reads from a document's ``record``."""
        if self.feed_states is not None:
            return self.feed_states(record, row.field, answer_span=answer_span)
        value = record.get(row.field)
        return value if isinstance(value, LayerStates) else None

    def memory_bytes(self, options: ProbeOptions, shapes: Shapes) -> int:
        """Its extra peak memory for a forward of ``shapes`` (0 when it declares none)."""
        return 0 if self.memory is None else int(math.ceil(self.memory(options, shapes)))
