"""``ProbeTask``: a ConfigurableTask that reports probe metrics next to the task's own metrics.

Use it from a task YAML with ``class: !function lm_eval_probes.tasks.probe_task.ProbeTask``
(``NoisedProbeTask`` for noised-input variants), or give a built stock task the same rows with
:func:`with_probe_metrics`. It

* re-attaches each response's probe after lm_eval's filters (regex filters build new plain strings);
* adds the probe rows of :data:`lm_eval_probes.metrics.PROBE_METRICS` to the task's own per-document
  metrics (rows appear only when the model is ``hf-probes``; with plain ``hf`` the task is the stock task);
* reads the document's difficulty label from the field named by ``metadata: {difficulty: <field>}``.

Which response a document's probe describes: multiple choice — the option the model chose (highest
log-likelihood); generation — the (first) generation; loglikelihood — the target continuation.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any

from lm_eval.api.task import ConfigurableTask, Task
from lm_eval.tasks import TaskManager

from lm_eval_probes.metrics import PROBE_METRICS, aggregation_of
from lm_eval_probes.probes.confidence import chosen_option_confidence
from lm_eval_probes.records import ResponseProbe, probe_of, with_probe

eval_logger = logging.getLogger(__name__)


class ProbeResults(Task):
    """Mixin for a ``ConfigurableTask`` (or any subclass, e.g. a stock Python task): adds the probe rows."""

    # a Task subclass adding no instance layout, so that a built task's class can be swapped in place
    # (with_probe_metrics); CPython refuses __class__ assignment across a mixin with another base chain
    __slots__ = ()

    def _add_probe_metrics(self) -> None:
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


class ProbeTask(ProbeResults, ConfigurableTask):
    """A YAML task plus probe metrics (see module docstring)."""

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        config = dict(config or {})
        config.pop("class", None)
        super().__init__(config=config, **kwargs)
        self._add_probe_metrics()


class NoisedProbeTask(ProbeTask):
    """A probe task whose evaluated documents are noised; few-shot examples stay clean.

    Task metadata (each overridable for a run with ``--metadata '{"noise_eta": 0.3}'``):
    ``noise`` (operator: swap, keyboard, insert, delete), ``noise_fields`` (document fields to noise),
    ``noise_eta`` (default 0.10; the paper's grid is 0.05, 0.10, 0.15, 0.30), ``noise_seed`` (default
    1234), ``noise_protect_numbers`` (default true) and ``noise_protect`` (regexes of spans kept intact).
    Documents keep their order, so doc ``i`` here is the noised twin of doc ``i`` of the clean task;
    each keeps ``clean_<field>`` and records ``noise_operator/eta/seed/eligible/corrupted``.
    """

    DEFAULT_ETA = 0.10
    DEFAULT_SEED = 1234

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        from lm_eval_probes.tasks.noise import OPERATORS

        # read before ConfigurableTask.__init__, which already asks for eval_docs
        meta = dict((config or {}).get("metadata") or {})
        name = (config or {}).get("task")
        self.noise_operator = meta.get("noise")
        if self.noise_operator not in OPERATORS:
            raise ValueError(f"task {name!r}: metadata.noise must be one of {OPERATORS}, got {self.noise_operator!r}")
        self.noise_fields = list(meta.get("noise_fields") or [])
        if not self.noise_fields:
            raise ValueError(f"task {name!r}: metadata.noise_fields names no document field")
        self.noise_eta = float(meta.get("noise_eta", self.DEFAULT_ETA))
        self.noise_seed = int(meta.get("noise_seed", self.DEFAULT_SEED))
        self.noise_protect_numbers = bool(meta.get("noise_protect_numbers", True))
        self.noise_protect = tuple(meta.get("noise_protect") or ())
        self._noised_docs: Any = None
        super().__init__(config=config, **kwargs)

    @property
    def eval_docs(self) -> Any:
        if self._noised_docs is None:
            from lm_eval_probes.tasks.noise import noise_fields

            def noised(doc: dict[str, Any]) -> dict[str, Any]:
                return noise_fields(doc, self.noise_fields, operator=self.noise_operator, eta=self.noise_eta,
                                    global_seed=self.noise_seed, protect_numbers=self.noise_protect_numbers,
                                    protect=self.noise_protect)

            docs = super().eval_docs
            self._noised_docs = docs.map(noised) if hasattr(docs, "map") else [noised(d) for d in docs]
        return self._noised_docs


def with_probe_metrics(task: Any) -> Any:
    """Give an already built task (a stock lm_eval task, say) the probe rows, keeping everything it has.

    The instance's class becomes a subclass of its own class with :class:`ProbeResults` mixed in, so its
    prompts, filters, metrics and any Python overrides stay as they were. Idempotent.
    """
    if isinstance(task, ProbeResults):
        return task
    if not isinstance(task, ConfigurableTask):
        raise TypeError(f"probe metrics need a ConfigurableTask, got {type(task).__name__}")
    task.__class__ = _probed_class(type(task))
    task._add_probe_metrics()
    return task


@functools.cache
def _probed_class(cls: type) -> type:
    return type(f"Probe{cls.__name__}", (ProbeResults, cls), {"__module__": __name__, "__slots__": ()})


class ProbeTaskManager(TaskManager):
    """A ``TaskManager`` whose loaded tasks all report probe rows (stock tasks keep their prompts,
    filters and metrics). ``simple_evaluate(..., task_manager=ProbeTaskManager(include_path=TASKS_DIR))``."""

    def load(self, task_list: Any) -> Any:
        loaded = super().load(task_list)
        for name, task in loaded["tasks"].items():
            if isinstance(task, ConfigurableTask):
                with_probe_metrics(task)
            else:
                eval_logger.warning("task %s is not a ConfigurableTask: no probe rows", name)
        return loaded


def probe_metric_values(
    probe: ResponseProbe, confidence: float, difficulty: float | None, *, declared: bool = False
) -> dict[str, Any]:
    """Per-document values of the probe rows; non-finite values are left out (so ``mean`` skips them).

    With a declared difficulty: ρ records ``(value, difficulty)`` and length-controlled records
    ``(value, difficulty, response tokens)`` and ``(value, difficulty, prompt tokens)``, the baselines ``(response / prompt tokens, difficulty)``,
    plus ``difficulty_missing`` (1 for a document without a
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
        if labelled and probe.prompt_tokens is not None:
            values["prompt_length_spearman"] = (probe.prompt_tokens, difficulty)
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
            if probe.prompt_tokens is not None:
                values[f"{name}_spearman_partial_prompt"] = (value, difficulty, probe.prompt_tokens)
    return values
