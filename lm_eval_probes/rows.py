"""Every results row of the plugin, assembled from the declarations (:mod:`lm_eval_probes.declarations`), and
their aggregations.

Everything else is derived from :data:`ROWS`: the registration with lm_eval
(:mod:`lm_eval_probes.harness.registry`), the rows a task adds (:func:`rows_for`), the row families the
task adapter fills (confidence pairs, reader records, difficulty records) and the tests' list.
Torch-free and lm_eval-free, so reports can read it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from lm_eval_probes import declarations
from lm_eval_probes.api import FAMILIES, Row
from lm_eval_probes.declarations import CONFIDENCE_ROWS, RESPONSE_ROWS, TRAJECTORY_PERCENTS, TRAJECTORY_ROWS
from lm_eval_probes.metrics.calibration import CALIBRATION_ROWS, CalibrationOptions
from lm_eval_probes.probes.correlation import count, partial_spearman_score, spearman_score

__all__ = ["AGGREGATIONS", "DIFFUSION_ROWS", "ROWS", "ROWS_BY_NAME", "Row", "TRAJECTORY_PERCENTS", "all_rows",
           "bound_aggregation", "names", "rows_by_name", "rows_for"]

# (the registry's probes tuple the table was made from, the table, the table by name)
_TABLE: list[Any] = [None, (), MappingProxyType({})]


def _table() -> list[Any]:
    """:data:`_TABLE`, made again when the registered probes are not those it was made from."""
    from lm_eval_probes.registry import probes, validated

    found = probes()
    if _TABLE[0] is not found:
        validated(found, reserved_rows=(row.name for row in declarations.NON_PROBE_ROWS))
        table = (declarations.probe_rows() + RESPONSE_ROWS + declarations.difficulty_rows() + CONFIDENCE_ROWS
                 + declarations.reader_rows() + declarations.detector_rows() + TRAJECTORY_ROWS)
        _check_table(table)
        _TABLE[:] = [found, table, MappingProxyType({row.name: row for row in table})]
    return _TABLE


def all_rows() -> tuple[Row, ...]:
    """Every row the plugin can add to a task's results, in the report's order: each probe's rows (registry order),
    the response's, the difficulty rows (each probe's ρ, then the baselines), calibration, the reader, the detector
    and the denoising trajectory. Made once per set of registered probes."""
    return _table()[1]


def rows_by_name() -> Mapping[str, Row]:
    """:func:`all_rows` by name, in its order (read-only; made once per set of registered probes): what callers
    that look rows up read when called, so that a probe registered later (``registry.refresh()``) is seen."""
    return _table()[2]


def __getattr__(name: str) -> Any:
    """``ROWS`` (:func:`all_rows`), ``ROWS_BY_NAME`` and ``DIFFUSION_ROWS`` (rows only ``hf-probes-diffusion``
    fills), read from the registered probes when asked for."""
    if name == "ROWS":
        return all_rows()
    if name == "ROWS_BY_NAME":
        return dict(rows_by_name())
    if name == "DIFFUSION_ROWS":
        return tuple(row.name for row in all_rows() if row.diffusion_only)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def names(*families: str) -> tuple[str, ...]:
    """Names of the rows of these families, in table order."""
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown row families {sorted(unknown)}; valid: {FAMILIES}")
    return tuple(row.name for row in all_rows() if row.family in families)


def rows_for(*, difficulty: bool, correctness: bool, detector: bool) -> tuple[Row, ...]:
    """The rows a task reports: probe rows always; difficulty rows when it declares a difficulty;
    confidence, reader and trajectory rows when its correctness is defined; detector rows on paired tasks."""
    wanted = {"probe"} | ({"difficulty"} if difficulty else set())
    wanted |= {"confidence", "reader", "trajectory"} if correctness else set()
    wanted |= {"detector"} if detector else set()
    return tuple(row for row in all_rows() if row.family in wanted)


def undefined_as_none(fn: Callable[..., float]) -> Callable[..., float | None]:
    """The aggregation with an undefined (``nan``) value reported as ``None``, which lm_eval writes as JSON
    ``null`` (a float ``nan`` would become a bare ``NaN``, which is not JSON)."""

    @functools.wraps(fn)
    def aggregate(items: Iterable[Any], *args: Any, **kwargs: Any) -> float | None:
        value = fn(items, *args, **kwargs)
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)

    return aggregate


def vector_mean(items: Iterable[Any]) -> float:
    """Mean over documents of each document's mean of its list of floats (lists with a missing or non-finite
    member are skipped); ``nan`` when no document has one."""
    means = []
    for item in items:
        if isinstance(item, (list, tuple)) and item and all(isinstance(v, (int, float)) for v in item):
            values = [float(v) for v in item]
            if all(math.isfinite(v) for v in values):
                means.append(math.fsum(values) / len(values))
    return math.fsum(means) / len(means) if means else math.nan


def support_mean(items: Iterable[Any]) -> float:
    """Mean over documents of the mean margin of their support tokens (``item["margins"]``)."""
    return vector_mean(item.get("margins") if isinstance(item, dict) else None for item in items)


def traced(items: Iterable[Any]) -> float:
    """The number of documents with a trace (``probe_traces=true``)."""
    return float(sum(1 for item in items if isinstance(item, Mapping)))


AGGREGATIONS: dict[str, Callable[..., Any]] = {
    "probe_vector_mean": undefined_as_none(vector_mean),
    "probe_support_mean": undefined_as_none(support_mean),
    "probe_spearman": undefined_as_none(spearman_score),
    "probe_partial_spearman": undefined_as_none(partial_spearman_score),
    "probe_count": count,
    "probe_traced": traced,
    **{f"probe_{name}": undefined_as_none(fn) for name, fn in CALIBRATION_ROWS.items()},
}
"""The plugin's registered aggregations (``mean`` is lm_eval's own, with its closed-form stderr)."""


def bound_aggregation(row: Row, options: CalibrationOptions) -> Callable[..., Any] | None:
    """The plugin's aggregation of ``row`` for one task (calibration rows bound to the task's options);
    ``None`` for ``mean``, which is lm_eval's own (so that lm_eval computes its stderr)."""
    if row.aggregation == "mean":
        return None
    if row.aggregation.removeprefix("probe_") in CALIBRATION_ROWS:  # the trajectory rows share ece's and AUROC's
        return functools.partial(AGGREGATIONS[row.aggregation], options=options)
    return AGGREGATIONS[row.aggregation]


def _check_table(table: tuple[Row, ...]) -> None:
    unknown = [row.name for row in table if row.aggregation != "mean" and row.aggregation not in AGGREGATIONS]
    names = [row.name for row in table]
    twice = sorted({name for name in names if names.count(name) > 1})
    if unknown or twice:
        raise RuntimeError(f"rows without a known aggregation {unknown} or declared twice {twice}")
