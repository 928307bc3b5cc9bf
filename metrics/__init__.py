"""Probe metrics registered with lm_eval, and the table of what each one is.

Installed as ``lm_eval_probes.metrics``. Importing it registers the aggregations and metric names
(idempotently) so that task YAMLs may name them in ``metric_list``; :class:`ProbeMetric` rows say how
each per-document value is aggregated and which direction is better.
"""

from __future__ import annotations

from dataclasses import dataclass

import lm_eval.api.metrics  # noqa: F401  (built-in aggregations such as "mean" first; see integration notes)
from lm_eval.api.registry import (
    aggregation_registry,
    get_aggregation,
    metric_registry,
    register_aggregation,
    register_metric,
)

from lm_eval_probes.metrics.aggregations import UndefinedMetricWarning, count, partial_spearman_score, spearman_score

__all__ = [
    "PROBE_METRICS", "ProbeMetric", "UndefinedMetricWarning", "count", "partial_spearman_score", "spearman_score",
]


@dataclass(frozen=True)
class ProbeMetric:
    """A results-table row: per-document value → ``aggregation`` → float."""

    name: str
    aggregation: str
    higher_is_better: bool
    description: str


PROBE_METRICS: tuple[ProbeMetric, ...] = (
    ProbeMetric("tcb_log10", "mean", True, "mean over documents of the mean log10 δ_TCB over response positions"),
    ProbeMetric("tcb_log10_min", "mean", True, "mean over documents of the smallest log10 δ_TCB of the response"),
    ProbeMetric("tcb_spearman", "probe_spearman", True, "Spearman ρ of the document's mean log10 δ_TCB with difficulty"),
    ProbeMetric("bte_energy", "mean", False, "mean over documents of the BTE central-window energy ē_M (nats)"),
    ProbeMetric("bte_spearman", "probe_spearman", True, "Spearman ρ of ē_M with the document's difficulty label"),
    ProbeMetric("bte_spearman_partial", "probe_partial_spearman", True, "bte_spearman with response length partialled out"),
    ProbeMetric("tcb_spearman_partial", "probe_partial_spearman", True, "tcb_spearman with response length partialled out"),
    ProbeMetric("bte_spearman_partial_prompt", "probe_partial_spearman", True, "bte_spearman with prompt length partialled out"),
    ProbeMetric("tcb_spearman_partial_prompt", "probe_partial_spearman", True, "tcb_spearman with prompt length partialled out"),
    ProbeMetric("length_spearman", "probe_spearman", True, "baseline: Spearman ρ of the response length (tokens) with difficulty"),
    ProbeMetric("prompt_length_spearman", "probe_spearman", True, "baseline: Spearman ρ of the prompt length (tokens) with difficulty"),
    ProbeMetric("difficulty_missing", "probe_count", False, "documents without a difficulty label (skipped for every ρ)"),
    ProbeMetric("confidence", "mean", True, "chosen option's probability (MC) / geometric-mean token probability (generation)"),
    ProbeMetric("response_tokens", "mean", False, "number of response tokens probed"),
)

_AGGREGATIONS = {
    "probe_spearman": spearman_score,
    "probe_partial_spearman": partial_spearman_score,
    "probe_count": count,
}


def _passthrough(items):  # the value is made in process_results; the registry wants a callable
    return items


def _register() -> None:
    for name, fn in _AGGREGATIONS.items():
        if name not in aggregation_registry:
            register_aggregation(name)(fn)
    for metric in PROBE_METRICS:
        if metric.name not in metric_registry:
            register_metric(
                metric=metric.name, higher_is_better=metric.higher_is_better, aggregation=metric.aggregation
            )(_passthrough)


def aggregation_of(metric: ProbeMetric):
    return get_aggregation(metric.aggregation)


_register()
