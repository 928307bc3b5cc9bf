"""``ProbeTask``: a ConfigurableTask that reports probe metrics next to the task's own metrics.

Use it from a task YAML with ``class: !function lm_eval_probes.tasks.probe_task.ProbeTask``. It

* re-attaches each response's probe after lm_eval's filters (regex filters build new plain strings);
* adds the probe rows of :data:`lm_eval_probes.metrics.PROBE_METRICS` to the task's own per-document
  metrics (rows appear only when the model is ``hf-probes``; with plain ``hf`` the task is the stock task);
* reads the document's difficulty label from the field named by ``metadata: {difficulty: <field>}``.

Which response a document's probe describes: multiple choice — the option the model chose (highest
log-likelihood); generation — the (first) generation; loglikelihood — the target continuation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from lm_eval.api.task import ConfigurableTask

from lm_eval_probes.metrics import PROBE_METRICS, aggregation_of
from lm_eval_probes.probes.confidence import chosen_option_confidence
from lm_eval_probes.records import ResponseProbe, probe_of, with_probe


class ProbeTask(ConfigurableTask):
    """A YAML task plus probe metrics (see module docstring)."""

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        config = dict(config or {})
        config.pop("class", None)
        super().__init__(config=config, **kwargs)
        for metric in PROBE_METRICS:
            self._aggregation_list.setdefault(metric.name, aggregation_of(metric))
            self._higher_is_better.setdefault(metric.name, metric.higher_is_better)

    @property
    def difficulty_source(self) -> str | Callable[[dict[str, Any]], Any] | None:
        """``metadata: {difficulty: <doc field name>}`` (or a ``!function`` taking the doc); ``None``: no label."""
        metadata = self.config.metadata if isinstance(self.config.metadata, dict) else {}
        return metadata.get("difficulty")

    def difficulty(self, doc: dict[str, Any]) -> float | None:
        """The document's difficulty label, or ``None`` when the doc lacks one."""
        source = self.difficulty_source
        if source is None:
            return None
        value = source(doc) if callable(source) else doc.get(source)
        if value is None or value == "":
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"difficulty {source!r} of task {self.config.task!r} is not a number: {value!r}") from None

    def apply_filters(self) -> Any:
        out = super().apply_filters()
        for inst in self._instances or []:
            probe = probe_of(inst.resps[0]) if inst.resps else None
            for key, value in inst.filtered_resps.items():
                inst.filtered_resps[key] = with_probe(value, probe)
        return out

    def process_results(self, doc: dict[str, Any], results: list[Any]) -> dict[str, Any]:
        values = dict(super().process_results(doc, results))
        probe, confidence = self._probe_and_confidence(doc, results)
        if probe is None:
            return values
        declared = self.difficulty_source is not None
        values.update(probe_metric_values(probe, confidence, self.difficulty(doc) if declared else None, declared=declared))
        return values

    def _probe_and_confidence(self, doc: dict[str, Any], results: list[Any]) -> tuple[ResponseProbe | None, float]:
        if self.OUTPUT_TYPE == "multiple_choice":
            n_choices = len(self.doc_to_choice(doc))
            options = results[:n_choices]  # acc_mutual_info appends unconditional requests after these
            chosen, confidence = chosen_option_confidence([float(r[0]) for r in options])
            return probe_of(options[chosen]), confidence
        first = results[0] if results else None
        if isinstance(first, list):  # repeats > 1 without take_first
            first = first[0] if first else None
        probe = probe_of(first)
        return probe, math.nan if probe is None else probe.geometric_mean_probability


def probe_metric_values(
    probe: ResponseProbe, confidence: float, difficulty: float | None, *, declared: bool = False
) -> dict[str, Any]:
    """Per-document values of the probe rows; non-finite values are left out (so ``mean`` skips them).

    With a declared difficulty: ρ records ``(value, difficulty)`` and length-controlled records
    ``(value, difficulty, response tokens)``, plus ``difficulty_missing`` (1 for a document without a
    label, which then contributes to no ρ).
    """
    values: dict[str, Any] = {"response_tokens": probe.n_tokens}
    if math.isfinite(confidence):
        values["confidence"] = confidence
    labelled = difficulty is not None
    if declared:
        values["difficulty_missing"] = int(not labelled)
        if labelled and probe.n_tokens:
            values["length_spearman"] = (probe.n_tokens, difficulty)
    for name, value, rows in (
        ("tcb", probe.tcb_log10_mean, {"tcb_log10": probe.tcb_log10_mean, "tcb_log10_min": probe.tcb_log10_min}),
        ("bte", probe.bte_energy, {"bte_energy": probe.bte_energy}),
    ):
        if value is None or not math.isfinite(value):
            continue
        values.update(rows)
        if labelled:
            values[f"{name}_spearman"] = (value, difficulty)
            values[f"{name}_spearman_partial"] = (value, difficulty, probe.n_tokens)
    return values
