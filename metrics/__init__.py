"""Probe metrics registered with lm_eval, and the table of what each one is.

Installed as ``lm_eval_probes.metrics``. Importing it registers the aggregations and metric names
(idempotently) so that task YAMLs may name them in ``metric_list``; :class:`ProbeMetric` rows say how
each per-document value is aggregated and which direction is better.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import lm_eval.api.metrics  # noqa: F401  (built-in aggregations such as "mean" first; see integration notes)
from lm_eval.api.registry import (
    aggregation_registry,
    get_aggregation,
    metric_registry,
    register_aggregation,
    register_metric,
)

from lm_eval_probes.probes.correlation import UndefinedMetricWarning, count, partial_spearman_score, spearman_score
from lm_eval_probes.metrics.calibration import CALIBRATION_ROWS, CalibrationOptions

__all__ = [
    "CORRUPTION_METRICS", "PROBE_METRICS", "CalibrationOptions", "ProbeMetric", "UndefinedMetricWarning", "count",
    "partial_spearman_score", "spearman_score", "task_aggregation",
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
    ProbeMetric("ece", "probe_ece", False, "expected calibration error of confidence vs correctness (15 equal-width bins)"),
    ProbeMetric("ece_scaled", "probe_ece_scaled", False, "ECE after temperature scaling fitted out-of-fold"),
    ProbeMetric("selective_auroc", "probe_selective_auroc", True, "AUROC of confidence ranking correct above wrong answers"),
    ProbeMetric("aurc", "probe_aurc", False, "area under the risk–coverage curve of confidence"),
    ProbeMetric("selective_acc_50", "probe_selective_acc_50", True, "accuracy on the 50% most confident documents"),
    ProbeMetric("selective_acc_80", "probe_selective_acc_80", True, "accuracy on the 80% most confident documents"),
    ProbeMetric("lcr_auroc", "probe_lcr_auroc", True, "latent correctness reader: out-of-fold AUROC of P(correct) from answer hidden states"),
    ProbeMetric("lcr_ece", "probe_lcr_ece", False, "latent correctness reader: ECE of its out-of-fold P(correct)"),
    ProbeMetric("answer_unlocated", "probe_count", False, "generations whose filtered answer was not found in the text (whole generation used)"),
)

CORRUPTION_METRICS: tuple[ProbeMetric, ...] = (
    ProbeMetric("corruption_auroc", "probe_corruption_auroc", True, "corruption detector: cross-fitted AUROC of clean vs noised prompts from prompt hidden states"),
    ProbeMetric("corruption_confidence_auroc", "probe_corruption_confidence_auroc", True, "AUROC of (1 − confidence) as a detector of noised prompts"),
)
"""Rows of the paired clean/noised detector tasks (``probes_<task>_detect``)."""

def undefined_as_none(fn):
    """The aggregation with ``nan`` (undefined) reported as ``None``: lm_eval writes its results with
    ``json.dumps``, which turns a float ``nan`` into a bare ``NaN`` (not JSON); ``None`` becomes ``null``."""

    @functools.wraps(fn)
    def aggregate(items, *args, **kwargs):
        value = fn(items, *args, **kwargs)
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)

    return aggregate


_AGGREGATIONS = {
    "probe_spearman": undefined_as_none(spearman_score),
    "probe_partial_spearman": undefined_as_none(partial_spearman_score),
    "probe_count": count,
    **{f"probe_{name}": undefined_as_none(fn) for name, fn in CALIBRATION_ROWS.items()},
}


def _passthrough(items):  # the value is made in process_results; the registry wants a callable
    return items


def _register() -> None:
    for name, fn in _AGGREGATIONS.items():
        if name not in aggregation_registry:
            register_aggregation(name)(fn)
    for metric in PROBE_METRICS + CORRUPTION_METRICS:
        if metric.name not in metric_registry:
            register_metric(
                metric=metric.name, higher_is_better=metric.higher_is_better, aggregation=metric.aggregation
            )(_passthrough)


def aggregation_of(metric: ProbeMetric):
    return get_aggregation(metric.aggregation)


def task_aggregation(metric: ProbeMetric, options: CalibrationOptions):
    """The aggregation of ``metric`` for one task: calibration rows bound to the task's options."""
    row = CALIBRATION_ROWS.get(metric.name)
    if row is None:
        return aggregation_of(metric)
    return functools.partial(undefined_as_none(row), options=options)


_register()
