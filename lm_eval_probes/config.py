"""The plugin's own ``model_args``, parsed once and strictly into a frozen :class:`ProbeConfig`.

Every plugin option is ``probes`` or starts with ``probe_``; anything else is an HFLM argument and is
passed through untouched. An unknown probe name or ``probe_*`` option raises ``ValueError`` with the
valid values (and a did-you-mean) *before* any model is loaded.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from lm_eval_probes import declarations  # probes=all: every declared probe

DEFAULT_PROBES: tuple[str, ...] = ("tcb", "bte", "reader")
"""The probes of an ``hf-probes`` run that does not name any: the cheap ones (read from the states the
harness's own forward already computes)."""

DEFAULT_OMEGA_DEPTH = 5
"""Focal depth m of Ω when ``probe_omega_depth`` is not given (L for a model with fewer than 5 blocks)."""

READER_LAYER_FRACTIONS: tuple[float, ...] = (1 / 2, 2 / 3, 5 / 6)
"""Default reader layers: round(f · L) for these f (mid to late layers)."""

GEN_CAPTURE_MODES: tuple[str, ...] = ("generate", "teacher_forced")

BTE_PROFILE_MODES: tuple[str, ...] = ("window", "full")
"""``probe_bte_profile``: ``window`` reads out only the layers of ē_M's central window (the cheap default),
``full`` every layer, so each record also carries the whole depth profile (for the reports' plots)."""

MARGIN_HEAD_REDUCTIONS: tuple[str, ...] = ("mean", "min")

_LIST_SEPARATORS = (",", "+", ";", "|", " ")


@dataclass(frozen=True)
class ProbeConfig:
    """What the ``hf-probes`` wrapper computes and how.

    Attributes:
        probes: enabled probes, a subset of the declared :data:`~lm_eval_probes.declarations.PROBE_NAMES` (empty:
            the wrapper behaves like ``hf``).
        tcb_eps: tolerance ε of δ_TCB = ε / ‖J‖_F (``probe_tcb_eps``).
        tcb_ablation: the paper's cluster/disperse ablation (``probe_tcb_ablation=0.5``): at every response position
            δ_TCB is also recomputed with the competing tokens' rows of the unembedding moved toward their
            probability-weighted centre by this factor α (0 < α < 1: cluster) and away from it by 1/α (disperse), the
            distribution held fixed (:func:`lm_eval_probes.probes.tcb.tcb_competitor_moves`); ``None`` (default):
            not computed. Needs the tcb probe.
        bte_window: central window [start, stop) of transitions for the BTE difficulty scalar
            (``probe_bte_window=12:20``); ``None`` = [⌊3L/8⌋, ⌊5L/8⌋).
        bte_profile: which transitions BTE computes (``probe_bte_profile``): ``window`` (default: only the
            central window's, all that ē_M and its rows need) or ``full`` (all L, and the record's
            ``bte_profile``); see :data:`BTE_PROFILE_MODES`.
        bte_features: also record the 11 statistics of every transition over the response positions
            (``probe_bte_features=1``: the 11·L features of the paper's detection/attribution classifiers,
            :mod:`lm_eval_probes.probes.attribution`); computes all L transitions, like ``bte_profile=full``.
        gen_capture: how generations are probed (``probe_gen_capture``): ``generate`` (the default: the
            states that produced each token, recorded by hooks during decoding, no extra forward) or
            ``teacher_forced`` (one extra forward over prompt + generated ids); see README "Design".
        chunk_positions: positions read out through the lens at once (``probe_chunk_positions``); bounds
            the memory of the logit lens to about six ``chunk · V`` float32-sized buffers (24 bytes per
            position and vocabulary entry; one more with soft-capping).
        reader_layers: ``hidden_states`` indices (0 = embeddings … L) whose mean states are recorded
            (``probe_reader_layers=12+16+20``); ``None`` = round(f·L) for f in :data:`READER_LAYER_FRACTIONS`.
        reader_tail: generation only: the last positions whose states are kept one by one (float16; float32 where a
            value exceeds float16's range, as in Gemma's residual stream), so the
            reader can average over the answer span the task's filter extracts (``probe_reader_tail``);
            an answer outside them falls back to the whole generation.
        reader_prompt_tail: the prompt states are the mean over the last this-many prompt positions
            (``probe_reader_prompt_tail``); 0 (default) = the whole prompt. Few-shot examples dilute a
            whole-prompt mean: a detector of noise in the document's own text reads its tail better.
        omega_depth: focal depth m of Ω (``probe_omega_depth``): the source layers' states go through the
            model's last m blocks before the final norm and unembedding; 0 = the logit lens. ``None`` =
            min(5, L); must satisfy 0 <= m <= L (checked once the model is loaded).
        omega_topk: K of Ω's confidence, the top-K probability mass (``probe_omega_topk``), K >= 1.
        omega_layers: source layers ``[start, stop)`` of Ω as ``hidden_states`` indices 0..L
            (``probe_omega_layers=0:33``); ``None`` = all, 0..L.
        omega_chunk_tokens: Ω's memory budget (``probe_omega_chunk_tokens``): at most this many tokens
            (sequences × length, at least one sequence) go through the last m blocks at once.
        margin_support: k, the number of support tokens (smallest margins) kept per response
            (``probe_margin_support``), k >= 0.
        margin_heads: how the first layer's per-head margins combine per position (``probe_margin_heads``):
            ``mean`` (default) or ``min``.
        save_states: a folder (``probe_save_states=DIR``) where the reader layers' answer and prompt states of
            every answered request are written (safetensors keyed by task, doc_id and request, with an index;
            :mod:`lm_eval_probes.capture.saved_states`), for users' own probes; needs the reader probe. Not part
            of the configuration's identity (``--use_cache`` tables): where states are written changes no value.
    """

    probes: tuple[str, ...] = DEFAULT_PROBES
    tcb_eps: float = 1.0
    tcb_ablation: float | None = field(default=None, metadata={"shown": "none"})
    bte_window: tuple[int, int] | None = None
    bte_profile: str = "window"
    bte_features: bool = False
    gen_capture: str = "generate"
    chunk_positions: int = 64
    reader_layers: tuple[int, ...] | None = None
    reader_tail: int = 16
    reader_prompt_tail: int = 0
    omega_depth: int | None = None
    omega_topk: int = 1
    omega_layers: tuple[int, int] | None = None
    omega_chunk_tokens: int = 16384
    margin_support: int = 5
    margin_heads: str = "mean"
    save_states: str | None = field(default=None, compare=False, repr=False, metadata={"shown": "none"})

    def __post_init__(self) -> None:
        unknown = [p for p in self.probes if p not in declarations.PROBE_NAMES]
        if unknown:
            raise ValueError(unknown_message("probe", unknown[0], declarations.PROBE_NAMES))
        if len(set(self.probes)) != len(self.probes):
            raise ValueError(f"probes lists a probe twice: {self.probes}")
        if not (math.isfinite(self.tcb_eps) and self.tcb_eps > 0):
            raise ValueError(f"probe_tcb_eps must be finite and > 0, got {self.tcb_eps!r}")
        if self.tcb_ablation is not None:
            if not (isinstance(self.tcb_ablation, float) and 0.0 < self.tcb_ablation < 1.0):
                raise ValueError(f"probe_tcb_ablation must be a factor 0 < α < 1 (cluster by α, disperse by 1/α), "
                                 f"got {self.tcb_ablation!r}")
            if "tcb" not in self.probes:
                raise ValueError(f"probe_tcb_ablation recomputes δ_TCB: add tcb to probes (got probes="
                                 f"{'+'.join(self.probes) or 'none'})")
        if self.gen_capture not in GEN_CAPTURE_MODES:
            raise ValueError(unknown_message("probe_gen_capture", self.gen_capture, GEN_CAPTURE_MODES))
        if self.bte_profile not in BTE_PROFILE_MODES:
            raise ValueError(unknown_message("probe_bte_profile", self.bte_profile, BTE_PROFILE_MODES))
        if self.bte_window is not None:
            start, stop = self.bte_window
            if not 0 <= start < stop:
                raise ValueError(f"probe_bte_window must be 'start:stop' with 0 <= start < stop, got {self.bte_window}")
        if self.chunk_positions < 1:
            raise ValueError(f"probe_chunk_positions must be >= 1, got {self.chunk_positions}")
        if self.reader_layers is not None and (not self.reader_layers or min(self.reader_layers) < 0):
            raise ValueError(f"probe_reader_layers must be hidden_states indices >= 0, got {self.reader_layers}")
        if self.reader_tail < 0:
            raise ValueError(f"probe_reader_tail must be >= 0, got {self.reader_tail}")
        if self.reader_prompt_tail < 0:
            raise ValueError(f"probe_reader_prompt_tail must be >= 0 (0 = the whole prompt), got {self.reader_prompt_tail}")
        if self.omega_depth is not None and self.omega_depth < 0:
            raise ValueError(f"probe_omega_depth must be an integer 0 <= m <= L (the model's blocks), got {self.omega_depth}")
        if self.omega_topk < 1:
            raise ValueError(f"probe_omega_topk must be an integer K >= 1, got {self.omega_topk}")
        if self.omega_layers is not None:
            start, stop = self.omega_layers
            if not 0 <= start < stop:
                raise ValueError(
                    f"probe_omega_layers must be 'start:stop' with 0 <= start < stop <= L + 1 (hidden_states indices), "
                    f"got {start}:{stop}"
                )
        if self.omega_chunk_tokens < 1:
            raise ValueError(f"probe_omega_chunk_tokens must be >= 1, got {self.omega_chunk_tokens}")
        if self.margin_support < 0:
            raise ValueError(f"probe_margin_support must be an integer k >= 0, got {self.margin_support}")
        if self.margin_heads not in MARGIN_HEAD_REDUCTIONS:
            raise ValueError(unknown_message("probe_margin_heads", self.margin_heads, MARGIN_HEAD_REDUCTIONS))
        if self.save_states is not None and "reader" not in self.probes:
            raise ValueError(f"probe_save_states writes the reader layers' states: add reader to probes (got probes="
                             f"{'+'.join(self.probes) or 'none'})")

    def resolved_reader_layers(self, num_layers: int) -> tuple[int, ...]:
        """The reader layers for a model with ``num_layers`` blocks (``hidden_states`` has L+1 entries)."""
        if self.reader_layers is None:
            return tuple(sorted({min(num_layers, max(1, round(f * num_layers))) for f in READER_LAYER_FRACTIONS}))
        too_deep = [layer for layer in self.reader_layers if layer > num_layers]
        if too_deep:
            raise ValueError(f"probe_reader_layers {too_deep} exceed the model's {num_layers} layers (0..{num_layers})")
        return tuple(self.reader_layers)

    def resolved_omega_depth(self, num_layers: int) -> int:
        """Ω's focal depth m for a model with ``num_layers`` blocks: the option, or min(5, L); 0 <= m <= L."""
        if self.omega_depth is None:
            return min(DEFAULT_OMEGA_DEPTH, num_layers)
        if not 0 <= self.omega_depth <= num_layers:
            raise ValueError(
                f"probe_omega_depth={self.omega_depth} is outside 0..{num_layers} (this model has {num_layers} blocks)"
            )
        return self.omega_depth

    def resolved_omega_layers(self, num_layers: int) -> tuple[int, int]:
        """Ω's source layers ``[start, stop)`` for a model with ``num_layers`` blocks (``hidden_states`` 0..L)."""
        if self.omega_layers is None:
            return 0, num_layers + 1
        start, stop = self.omega_layers
        if stop > num_layers + 1:
            raise ValueError(
                f"probe_omega_layers={start}:{stop} exceeds this model's hidden_states 0..{num_layers}: "
                f"valid ranges are start:stop with 0 <= start < stop <= {num_layers + 1}"
            )
        return start, stop

    @property
    def enabled(self) -> bool:
        return bool(self.probes)

    @classmethod
    def from_model_args(cls, args: Mapping[str, Any]) -> ProbeConfig:
        """Build from the plugin's keys of ``model_args`` (``probes`` and ``probe_*``); see :func:`split_model_args`."""
        options = {f"probe_{f.name}": f.name for f in fields(cls) if f.name != "probes"}
        values: dict[str, Any] = {}
        for key, value in args.items():
            if key == "probes":
                values["probes"] = parse_probe_list(value)
            elif key in options:
                values[options[key]] = value
            else:
                raise ValueError(unknown_message("hf-probes option", key, ("probes", *options)))
        if "tcb_eps" in values:
            values["tcb_eps"] = _as_float("probe_tcb_eps", values["tcb_eps"])
        if "tcb_ablation" in values:
            factor = values["tcb_ablation"]
            unset = factor is None or (isinstance(factor, str) and factor.strip().lower() in ("", "none", "0", "off"))
            values["tcb_ablation"] = None if unset else _as_float("probe_tcb_ablation", factor)
        if "chunk_positions" in values:
            values["chunk_positions"] = _as_int("probe_chunk_positions", values["chunk_positions"])
        if "bte_window" in values:
            values["bte_window"] = _parse_window("probe_bte_window", values["bte_window"])
        if "omega_layers" in values:
            layers = values["omega_layers"]
            all_layers = isinstance(layers, str) and layers.strip().lower() == "all"
            values["omega_layers"] = None if all_layers else _parse_window("probe_omega_layers", layers)
        if "omega_depth" in values:
            depth = values["omega_depth"]
            auto = depth is None or (isinstance(depth, str) and depth.strip().lower() in ("", "none", "auto"))
            values["omega_depth"] = None if auto else _as_int("probe_omega_depth", depth)
        if "bte_features" in values:
            values["bte_features"] = _as_flag("probe_bte_features", values["bte_features"])
        for name in ("gen_capture", "bte_profile", "margin_heads"):
            if name in values:
                values[name] = str(values[name]).strip().lower()
        if "reader_layers" in values:
            values["reader_layers"] = _parse_layers(values["reader_layers"])
        if "save_states" in values:
            folder = values["save_states"]
            unset = folder is None or str(folder).strip().lower() in ("", "none")
            values["save_states"] = None if unset else str(folder).strip()
        for name in ("reader_tail", "reader_prompt_tail", "omega_topk", "omega_chunk_tokens", "margin_support"):
            if name in values:
                values[name] = _as_int(f"probe_{name}", values[name])
        return cls(**values)


def is_plugin_key(key: str) -> bool:
    """Whether a ``model_args`` key belongs to the plugin (``probes`` or ``probe_*``, or a near miss of them)."""
    return key == "probes" or key.startswith("probe") or bool(difflib.get_close_matches(key, ["probes"], cutoff=0.8))


def split_model_args(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``model_args`` into (plugin keys, HFLM keys)."""
    plugin = {k: v for k, v in kwargs.items() if is_plugin_key(k)}
    rest = {k: v for k, v in kwargs.items() if k not in plugin}
    return plugin, rest


LIST_OPTIONS: tuple[str, ...] = ("probes", "probe_reader_layers")
"""``model_args`` keys whose value is a list (joined by :func:`join_probe_names`)."""


def join_probe_names(model_args: str) -> str:
    """``"pretrained=m,probes=tcb,bte,dtype=x"`` → ``"pretrained=m,probes=tcb+bte,dtype=x"``.

    lm_eval splits ``model_args`` strings on every comma; this keeps the bare items that follow a list
    option (:data:`LIST_OPTIONS`) with it. A JSON (``{...}``) string is returned unchanged.
    """
    if model_args.lstrip().startswith("{"):
        return model_args
    items: list[str] = []
    for item in model_args.split(","):
        if "=" not in item and items and items[-1].split("=", 1)[0].strip() in LIST_OPTIONS:
            items[-1] += "+" + item.strip()
        else:
            items.append(item)
    return ",".join(items)


def parse_probe_list(value: Any) -> tuple[str, ...]:
    """``"tcb,bte"``, ``"tcb+bte"``, ``"[tcb,bte]"``, ``["tcb", "bte"]``, ``"none"`` → a tuple of names.

    The plain ``lm_eval`` CLI splits ``--model_args`` on top-level commas, so there ``probes=tcb+bte``
    or ``probes=[tcb,bte]`` is the spelling; the ``lm-eval-probes`` console script and
    ``create_from_arg_string`` also accept ``probes=tcb,bte``.
    """
    if value is None or value is False:
        return ()
    if isinstance(value, str):
        text = value.strip().strip("[](){}")
        for sep in _LIST_SEPARATORS[1:]:
            text = text.replace(sep, ",")
        items: Iterable[Any] = [t.strip().strip("'\"") for t in text.split(",")]
    elif isinstance(value, Iterable):
        items = value
    else:
        raise ValueError(f"probes must be a list of probe names, got {value!r}")
    names = tuple(str(item).strip().lower() for item in items if str(item).strip())
    if names in ((), ("none",)):
        return ()
    if names == ("all",):
        return declarations.PROBE_NAMES
    return names


def _parse_window(name: str, value: Any) -> tuple[int, int] | None:
    """``"12:20"`` (or ``12-20``, a pair) → ``(12, 20)``; ``None``/``auto`` → ``None`` (the default range)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "auto")):
        return None
    if isinstance(value, str):
        parts = value.replace("-", ":").split(":")
    elif isinstance(value, Iterable):
        parts = list(value)
    else:
        parts = []
    if len(parts) != 2:
        raise ValueError(f"{name} must look like '12:20' (a range [start, stop)), got {value!r}")
    return (_as_int(name, parts[0]), _as_int(name, parts[1]))


def _parse_layers(value: Any) -> tuple[int, ...] | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "auto")):
        return None
    if isinstance(value, (int, float)):
        return (_as_int("probe_reader_layers", value),)
    if isinstance(value, str):
        text = value.strip().strip("[](){}")
        for sep in _LIST_SEPARATORS[1:]:
            text = text.replace(sep, ",")
        value = [t for t in text.split(",") if t.strip()]
    if not isinstance(value, Iterable):
        raise ValueError(f"probe_reader_layers must be layer indices like '12+16+20', got {value!r}")
    return tuple(_as_int("probe_reader_layers", item) for item in value)


def _as_flag(name: str, value: Any) -> bool:
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", "none", ""):
        return False
    raise ValueError(f"{name} must be 1/0 (true/false), got {value!r}")


def _as_float(name: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number != int(number):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(number)


def unknown_message(what: str, given: str, valid: Iterable[str]) -> str:
    valid = list(valid)
    close = difflib.get_close_matches(str(given), valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"unknown {what} {given!r}.{hint} Valid: {', '.join(valid)}."
