"""The plugin's own ``model_args``, parsed once and strictly into a frozen :class:`ProbeConfig`.

Every plugin option is ``probes`` or starts with ``probe_``; anything else is an HFLM argument and is
passed through untouched. An unknown probe name or ``probe_*`` option raises ``ValueError`` with the
valid values (and a did-you-mean) *before* any model is loaded.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

PROBE_NAMES: tuple[str, ...] = ("tcb", "bte", "reader")
"""Probes the wrapper can compute: δ_TCB (+ entropy, margin, V_eff baselines), BTE, and ``reader``: the
mean hidden states (answer and prompt positions, a few layers) that the correctness reader and the
corruption detector are fitted on."""

READER_LAYER_FRACTIONS: tuple[float, ...] = (1 / 2, 2 / 3, 5 / 6)
"""Default reader layers: round(f · L) for these f (mid to late layers)."""

GEN_CAPTURE_MODES: tuple[str, ...] = ("generate", "teacher_forced")

_LIST_SEPARATORS = (",", "+", ";", "|", " ")


@dataclass(frozen=True)
class ProbeConfig:
    """What the ``hf-probes`` wrapper computes and how.

    Attributes:
        probes: enabled probes, a subset of :data:`PROBE_NAMES` (empty: the wrapper behaves like ``hf``).
        tcb_eps: tolerance ε of δ_TCB = ε / ‖J‖_F (``probe_tcb_eps``).
        bte_window: central window [start, stop) of transitions for the BTE difficulty scalar
            (``probe_bte_window=12:20``); ``None`` = [⌊3L/8⌋, ⌊5L/8⌋).
        gen_capture: how generations are probed (``probe_gen_capture``): ``generate`` (the default: the
            states that produced each token, recorded by hooks during decoding, no extra forward) or
            ``teacher_forced`` (one extra forward over prompt + generated ids); see README "Design".
        chunk_positions: positions read out through the lens at once (``probe_chunk_positions``); bounds
            the memory of the logit lens to about ``3 · chunk · V`` floats.
        reader_layers: ``hidden_states`` indices (0 = embeddings … L) whose mean states are recorded
            (``probe_reader_layers=12+16+20``); ``None`` = round(f·L) for f in :data:`READER_LAYER_FRACTIONS`.
        reader_tail: generation only: the last positions whose states are kept one by one (float16), so the
            reader can average over the answer span the task's filter extracts (``probe_reader_tail``);
            an answer outside them falls back to the whole generation.
        reader_prompt_tail: the prompt states are the mean over the last this-many prompt positions
            (``probe_reader_prompt_tail``); 0 (default) = the whole prompt. Few-shot examples dilute a
            whole-prompt mean: a detector of noise in the document's own text reads its tail better.
    """

    probes: tuple[str, ...] = PROBE_NAMES
    tcb_eps: float = 1.0
    bte_window: tuple[int, int] | None = None
    gen_capture: str = "generate"
    chunk_positions: int = 64
    reader_layers: tuple[int, ...] | None = None
    reader_tail: int = 16
    reader_prompt_tail: int = 0

    def __post_init__(self) -> None:
        unknown = [p for p in self.probes if p not in PROBE_NAMES]
        if unknown:
            raise ValueError(unknown_message("probe", unknown[0], PROBE_NAMES))
        if len(set(self.probes)) != len(self.probes):
            raise ValueError(f"probes lists a probe twice: {self.probes}")
        if not (math.isfinite(self.tcb_eps) and self.tcb_eps > 0):
            raise ValueError(f"probe_tcb_eps must be finite and > 0, got {self.tcb_eps!r}")
        if self.gen_capture not in GEN_CAPTURE_MODES:
            raise ValueError(unknown_message("probe_gen_capture", self.gen_capture, GEN_CAPTURE_MODES))
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

    def resolved_reader_layers(self, num_layers: int) -> tuple[int, ...]:
        """The reader layers for a model with ``num_layers`` blocks (``hidden_states`` has L+1 entries)."""
        if self.reader_layers is None:
            return tuple(sorted({min(num_layers, max(1, round(f * num_layers))) for f in READER_LAYER_FRACTIONS}))
        too_deep = [layer for layer in self.reader_layers if layer > num_layers]
        if too_deep:
            raise ValueError(f"probe_reader_layers {too_deep} exceed the model's {num_layers} layers (0..{num_layers})")
        return tuple(self.reader_layers)

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
        if "chunk_positions" in values:
            values["chunk_positions"] = _as_int("probe_chunk_positions", values["chunk_positions"])
        if "bte_window" in values:
            values["bte_window"] = _parse_window(values["bte_window"])
        if "gen_capture" in values:
            values["gen_capture"] = str(values["gen_capture"])
        if "reader_layers" in values:
            values["reader_layers"] = _parse_layers(values["reader_layers"])
        for name in ("reader_tail", "reader_prompt_tail"):
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
        return PROBE_NAMES
    return names


def _parse_window(value: Any) -> tuple[int, int] | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "auto")):
        return None
    if isinstance(value, str):
        parts = value.replace("-", ":").split(":")
    elif isinstance(value, Iterable):
        parts = list(value)
    else:
        parts = []
    if len(parts) != 2:
        raise ValueError(f"probe_bte_window must look like '12:20' (transitions [start, stop)), got {value!r}")
    return (_as_int("probe_bte_window", parts[0]), _as_int("probe_bte_window", parts[1]))


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


def _as_float(name: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def _as_int(name: str, value: Any) -> int:
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
