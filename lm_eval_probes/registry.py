"""Which probes exist: the built-ins, then every probe of the entry-point group ``lm_eval_probes.probes``.

A third-party package registers its probe in its ``pyproject.toml``::

    [project.entry-points."lm_eval_probes.probes"]
    hnorm = "lm_eval_probes_hnorm:PROBE"

(``examples/probe-plugin/``). Each entry point's object is a :class:`~lm_eval_probes.api.Probe`; it is validated
when it registers (:class:`~lm_eval_probes.api.ProbeRegistrationError` names the probe and the row or field): its
name must be new, its record fields unique across probes, its rows' names unique across probes (and, when the rows
are assembled, :func:`lm_eval_probes.rows.all_rows`, across the plugin's own rows and lm_eval's metrics).
``probes=all``, ``--help``, the rows registered with lm_eval, each document's values and the report's columns and
glossary all come from :func:`probes`.

Torch-free: loading the built-ins imports no torch (their per-position code imports it when it runs).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable
from importlib.metadata import entry_points

from lm_eval_probes.api import Probe, ProbeRegistrationError, unknown_message

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "ProbeRegistrationError", "names", "probe", "probes", "validated"]

ENTRY_POINT_GROUP = "lm_eval_probes.probes"

BUILTIN: tuple[str, ...] = (
    "lm_eval_probes.probes.tcb.probe:PROBE",
    "lm_eval_probes.probes.bte.probe:PROBE",
    "lm_eval_probes.probes.reader.probe:PROBE",
    "lm_eval_probes.probes.omega.probe:PROBE",
    "lm_eval_probes.probes.margin.probe:PROBE",
)
"""The built-in probes, in ``probes=all`` and ``--help`` order (each written with :mod:`lm_eval_probes.api` only)."""


def _load(target: str) -> object:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def validated(found: Iterable[object], *, reserved_rows: Iterable[str] = ()) -> tuple[Probe, ...]:
    """``found`` checked as one set of probes: each a :class:`Probe`, names, record fields and row names unique
    (also against ``reserved_rows``, the rows that are no probe's)."""
    out: list[Probe] = []
    fields: dict[str, str] = {}
    rows: dict[str, str] = {name: "the plugin's own rows" for name in reserved_rows}
    for item in found:
        if not isinstance(item, Probe):
            raise ProbeRegistrationError(f"{item!r} is not an lm_eval_probes.api.Probe")
        item.check()
        if any(other.name == item.name for other in out):
            raise ProbeRegistrationError(f"probe {item.name!r} is registered twice")
        for name in item.fields:
            if name in fields:
                raise ProbeRegistrationError(f"probe {item.name!r}: record field {name!r} is already probe "
                                             f"{fields[name]!r}'s")
            fields[name] = item.name
        for row in (*item.rows, *item.difficulty_rows(), *item.feeds):
            if row.name in rows:
                raise ProbeRegistrationError(f"probe {item.name!r}, row {row.name!r}: the name is already "
                                             f"{rows[row.name]}")
            rows[row.name] = f"probe {item.name!r}'s"
        out.append(item)
    return tuple(out)


@functools.cache
def probes() -> tuple[Probe, ...]:
    """Every registered probe: the built-ins, then the entry points of ``lm_eval_probes.probes`` (sorted by name)."""
    found: list[object] = [_load(target) for target in BUILTIN]
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        try:
            item = point.load()
        except Exception as error:  # a broken plugin is named, not hidden
            raise ProbeRegistrationError(f"probe entry point {point.name!r} ({point.value}) failed to load: "
                                         f"{type(error).__name__}: {error}") from error
        if isinstance(item, Probe) and item.name != point.name:
            raise ProbeRegistrationError(f"entry point {point.name!r} ({point.value}) holds probe {item.name!r}: "
                                         "name the entry point as the probe")
        found.append(item)
    return validated(found)


def names() -> tuple[str, ...]:
    """Every registered probe's name (``probes=all``), in :func:`probes` order."""
    return tuple(item.name for item in probes())


def probe(name: str) -> Probe:
    """The probe called ``name``; ``ValueError`` with a did-you-mean otherwise."""
    for item in probes():
        if item.name == name:
            return item
    raise ValueError(unknown_message("probe", name, names()))


def refresh() -> None:
    """Forget the probes found so far (after installing a plugin in this process; tests)."""
    probes.cache_clear()
