"""The plugin's own ``model_args``, parsed once and strictly into a frozen :class:`ProbeConfig`.

Every plugin option is ``probes`` or starts with ``probe_``; anything else is an HFLM argument and is
passed through untouched. An unknown probe name or ``probe_*`` option raises ``ValueError`` with the
valid values (and a did-you-mean) *before* any model is loaded.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

from lm_eval_probes import registry
from lm_eval_probes.api import (
    LIST_SEPARATORS,
    ProbeOptions,
    as_choice,
    as_flag,
    as_float,
    as_int,
    as_int_list,
    as_range,
    option,
    unknown_message,
)

__all__ = ["GEN_CAPTURE_MODES", "ProbeConfig", "UnsupportedProbeError", "default_probes", "join_probe_names", "joined_list_args", "parse_probe_list",
           "split_model_args", "unknown_message"]

GEN_CAPTURE_MODES: tuple[str, ...] = ("generate", "teacher_forced")

_LIST_SEPARATORS = LIST_SEPARATORS
_as_int, _as_float, _as_flag, _parse_window = as_int, as_float, as_flag, as_range  # the options' own parsers


class UnsupportedProbeError(ValueError):
    """A probe named explicitly in ``probes`` cannot run on this model (the message says which and why)."""


def default_probes() -> tuple[str, ...]:
    """The probes of an ``hf-probes`` run that does not name any: those registered with ``default_enabled`` (the cheap
    ones, read from the states the harness's own forward already computes)."""
    return tuple(probe.name for probe in registry.probes() if probe.default_enabled)


def __getattr__(name: str) -> Any:
    """``DEFAULT_PROBES``: :func:`default_probes`."""
    if name == "DEFAULT_PROBES":
        return default_probes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class WrapperOptions(ProbeOptions):
    """The options of the wrapper itself, not of one probe (``probe_<field>``)."""

    gen_capture: str = option(
        "generate", "how generations are probed: generate (the states that produced each token, recorded during "
                    "decoding) or teacher_forced (one extra forward over prompt + generated ids)",
        parse=as_choice(*GEN_CAPTURE_MODES), key="probe_gen_capture")
    chunk_positions: int = option(
        64, "positions read out through the logit lens at once (about six chunk · V float32 buffers)",
        key="probe_chunk_positions")
    traces: bool = option(
        False, "write a per-token trace into each document of the samples (--log_samples): the response's tokens, "
               "their log-probabilities, every enabled probe's per-position values and the logit-lens grid of the kept layers "
               "(each layer's top token, its probability and the emitted token's), rounded to 4 significant digits",
        key="probe_traces")

    def __post_init__(self) -> None:
        if self.chunk_positions < 1:
            raise ValueError(f"probe_chunk_positions must be >= 1, got {self.chunk_positions}")


@dataclass(frozen=True)
class ProbeConfig:
    """What the ``hf-probes`` wrapper computes and how.

    Attributes:
        probes: enabled probes, names of :func:`lm_eval_probes.registry.probes` (empty: the wrapper behaves like
            ``hf``); default :func:`default_probes`.
        gen_capture: how generations are probed (``probe_gen_capture``): ``generate`` (the default: the states that
            produced each token, recorded by hooks during decoding, no extra forward) or ``teacher_forced`` (one extra
            forward over prompt + generated ids).
        chunk_positions: positions read out through the lens at once (``probe_chunk_positions``); bounds the memory
            of the logit lens to about six ``chunk · V`` float32-sized buffers.
        traces: whether each response carries its per-token trace (``probe_traces``; :func:`~lm_eval_probes.capture.
            positions.PositionProbes.summarize`): part of the configuration's identity (``--use_cache`` tables).
        options: every registered probe's options (its :class:`~lm_eval_probes.api.ProbeOptions`, defaults where
            ``model_args`` sets none), by probe name: :meth:`options_of`.
        every_applicable: ``probes=all``: a probe that cannot run on the model is skipped (:meth:`without`), not
            refused.
    """

    probes: tuple[str, ...] = field(default_factory=default_probes)
    gen_capture: str = "generate"
    chunk_positions: int = 64
    traces: bool = False
    options: Mapping[str, ProbeOptions] = field(default_factory=dict, hash=False)
    every_applicable: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        known = registry.names()
        unknown = [p for p in self.probes if p not in known]
        if unknown:
            raise ValueError(unknown_message("probe", unknown[0], known))
        if len(set(self.probes)) != len(self.probes):
            raise ValueError(f"probes lists a probe twice: {self.probes}")
        WrapperOptions(gen_capture=self.gen_capture, chunk_positions=self.chunk_positions)  # validates them
        given = dict(self.options)
        strays = sorted(set(given) - set(known))
        if strays:
            raise ValueError(unknown_message("probe", strays[0], known))
        filled = {}
        for probe in registry.probes():
            options = given.get(probe.name) or probe.options()
            if not isinstance(options, probe.options):
                raise TypeError(f"options of probe {probe.name!r} must be {probe.options.__name__}, got {options!r}")
            needing = options.requiring_probe(probe.name)
            if needing and probe.name not in self.probes:
                raise ValueError(f"{needing[0]} is an option of probe {probe.name!r}: add {probe.name} to probes (got "
                                 f"probes={'+'.join(self.probes) or 'none'})")
            filled[probe.name] = options
        object.__setattr__(self, "options", filled)

    def without(self, skipped: Mapping[str, str]) -> ProbeConfig:
        """This configuration without the probes ``skipped`` (name → why it cannot run on the model); under
        ``probes=all`` only: a probe named explicitly that cannot run raises ``UnsupportedProbeError`` (one line)."""
        if not skipped:
            return self
        if not self.every_applicable:
            name, reason = next(iter(skipped.items()))
            raise UnsupportedProbeError(f"probes={name}: {reason}")
        return dataclasses.replace(self, probes=tuple(p for p in self.probes if p not in skipped))

    def options_of(self, probe: str) -> ProbeOptions:
        """The options of ``probe`` (enabled or not)."""
        if probe not in self.options:
            raise KeyError(unknown_message("probe", probe, self.options))
        return self.options[probe]

    @property
    def enabled(self) -> bool:
        return bool(self.probes)

    @classmethod
    def from_model_args(cls, args: Mapping[str, Any]) -> ProbeConfig:
        """Build from the plugin's keys of ``model_args`` (``probes`` and ``probe_*``); see :func:`split_model_args`.

        Each probe's options are ``probe_<probe>_<option>`` (its :class:`~lm_eval_probes.api.ProbeOptions`), parsed
        by the probe's own declaration; an unknown key raises ``ValueError`` with a did-you-mean."""
        owners = {key: None for key in WrapperOptions.keys("")}
        for probe in registry.probes():
            owners.update(dict.fromkeys(probe.options.keys(probe.name), probe.name))
        probes = None
        per_owner: dict[str | None, dict[str, Any]] = {}
        for key, value in args.items():
            if key == "probes":
                probes = parse_probe_list(value)
            elif key in owners:
                per_owner.setdefault(owners[key], {})[key] = value
            else:
                raise ValueError(unknown_message("hf-probes option", key, ("probes", *owners)))
        wrapper = WrapperOptions.parse("", per_owner.pop(None, {}))
        options = {name: registry.probe(name).options.parse(name, values) for name, values in per_owner.items()}
        kwargs: dict[str, Any] = {"probes": probes} if probes is not None else {}
        every = parse_probe_list(args["probes"], expand_all=False) == ("all",) if "probes" in args else False
        return cls(**kwargs, gen_capture=wrapper.gen_capture, chunk_positions=wrapper.chunk_positions,
                   traces=wrapper.traces, options=options, every_applicable=every)

    @staticmethod
    def option_help() -> list[tuple[str, str, str, str | None]]:
        """``(model_args key, default as shown, help, probe or None)`` of every option, the wrapper's first."""
        out: list[tuple[str, str, str, str | None]] = [(*entry, None) for entry in WrapperOptions.help("")]
        for probe in registry.probes():
            out.extend((*entry, probe.name) for entry in probe.options.help(probe.name))
        return out


def is_plugin_key(key: str) -> bool:
    """Whether a ``model_args`` key belongs to the plugin (``probes`` or ``probe_*``, or a near miss of them)."""
    return key == "probes" or key.startswith("probe") or bool(difflib.get_close_matches(key, ["probes"], cutoff=0.8))


def split_model_args(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``model_args`` into (plugin keys, HFLM keys), a list option split at its commas joined first
    (:func:`joined_list_args`)."""
    kwargs = joined_list_args(kwargs)
    plugin = {k: v for k, v in kwargs.items() if is_plugin_key(k)}
    rest = {k: v for k, v in kwargs.items() if k not in plugin}
    return plugin, rest


def list_options() -> tuple[str, ...]:
    """``model_args`` keys whose value is a list (joined by :func:`join_probe_names`): ``probes`` and every option
    parsed as a list of integers."""
    keys = ["probes"]
    for probe in registry.probes():
        keys.extend(key for key, name in probe.options.keys(probe.name).items()
                    if next(f for f in fields(probe.options) if f.name == name).metadata.get("parse") is as_int_list)
    return tuple(keys)


def joined_list_args(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``{"probes": "tcb", "bte": ""}`` → ``{"probes": "tcb+bte"}``: lm_eval's parser of a ``model_args`` string splits
    it at every comma, and gives a bare item (``bte`` of ``probes=tcb,bte``) as a key with an empty value, in order;
    each such item right after a list option (:func:`list_options`) joins it again, as :func:`join_probe_names` joins
    the string."""
    if not any(isinstance(value, str) and value == "" for value in kwargs.values()):
        return dict(kwargs)
    lists = list_options()
    out: dict[str, Any] = {}
    joining: str | None = None  # the list option the bare items that follow belong to
    for key, value in kwargs.items():
        if isinstance(value, str) and value == "" and joining is not None:
            out[joining] = f"{out[joining]}+{str(key).strip()}"
            continue
        out[key] = value
        joining = key if key in lists else None
    return out


def join_probe_names(model_args: str) -> str:
    """``"pretrained=m,probes=tcb,bte,dtype=x"`` → ``"pretrained=m,probes=tcb+bte,dtype=x"``.

    lm_eval splits ``model_args`` strings on every comma; this keeps the bare items that follow a list
    option (:func:`list_options`) with it. A JSON (``{...}``) string is returned unchanged.
    """
    if model_args.lstrip().startswith("{"):
        return model_args
    items: list[str] = []
    for item in model_args.split(","):
        if "=" not in item and items and items[-1].split("=", 1)[0].strip() in list_options():
            items[-1] += "+" + item.strip()
        else:
            items.append(item)
    return ",".join(items)


def parse_probe_list(value: Any, *, expand_all: bool = True) -> tuple[str, ...]:
    """``"tcb,bte"``, ``"tcb+bte"``, ``"[tcb,bte]"``, ``["tcb", "bte"]``, ``"none"`` → a tuple of names.

    The plain ``lm_eval`` CLI splits ``--model_args`` on top-level commas, so there ``probes=tcb+bte``
    or ``probes=[tcb,bte]`` is the spelling; the ``lm-eval-probes`` console script and a ``model_args`` string
    (``create_from_arg_string``; the wrappers join the split items, :func:`joined_list_args`) also accept
    ``probes=tcb,bte``.
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
    if names == ("all",) and expand_all:
        return registry.names()
    return names
