"""``ProbeTask``: a ConfigurableTask that reports probe rows next to the task's own metrics (a thin adapter).

Use it from a task YAML with ``class: !function lm_eval_probes.tasks.probe_task.ProbeTask``
(``NoisedProbeTask`` for noised-input variants), or give a built stock task the same rows with
:func:`~lm_eval_probes.tasks.manager.with_probe_metrics` (the ``lm-eval-probes`` command does it for every
task). The rows are those of :func:`lm_eval_probes.rows.rows_for`; each document's values come from
:mod:`lm_eval_probes.estimators`. Rows appear only when the model is ``hf-probes``; with plain ``hf``
the task is the stock task.

Task metadata read here: ``difficulty`` (a document field or a ``!function``; adds the ρ rows),
``confidence`` (the confidence source), ``correctness`` (the 0/1 metric that judges a document, or
``none``), and the calibration options of :class:`~lm_eval_probes.metrics.CalibrationOptions`.

Which response a document's probe describes: multiple choice — the option the model chose (highest
log-likelihood); generation — the (first) generation; loglikelihood — the target continuation.
Correctness is defined for multiple choice (the chosen option is gold) and generation (``exact_match``
or ``acc``); a loglikelihood task's ``acc`` only asks whether the target is the greedy continuation,
so such a task shows calibration, selective and reader rows only when ``metadata.correctness`` names
a metric.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import datasets
from lm_eval.api.task import ConfigurableTask, Task

from lm_eval_probes import estimators, registry, rows
from lm_eval_probes.declarations import (
    ANSWER_UNLOCATED,
    CONFIDENCE,
    CONFIDENCE_ROWS,
    CORRUPTION_CONFIDENCE_AUROC,
    DIFFICULTY_MISSING,
    EMPTY_RESPONSES,
    LENGTH_SPEARMAN,
    PROMPT_LENGTH_SPEARMAN,
    RESPONSE_TOKENS,
    REVEAL_STEP,
    TRACE,
    TRAJECTORY_PERCENTS,
    TRAJECTORY_ROWS,
)
from lm_eval_probes.harness.registry import task_aggregation
from lm_eval_probes.metrics import CalibrationOptions
from lm_eval_probes.probes.confidence import geometric_mean_probability
from lm_eval_probes.records import PROBE_REQUEST, ProbeRequest, ReaderRecord, ResponseProbe, probe_of, with_probe

__all__ = [
    "CONFIDENCE_SOURCES", "NoisedPairProbeTask", "NoisedProbeTask", "ProbeResults", "ProbeTask", "probe_metric_values",
    "trajectory_confidence",
]

eval_logger = logging.getLogger(__name__)

CONFIDENCE_SOURCES: dict[str, tuple[str, ...]] = {"mc": ("option", "option_norm"), "gen": ("answer", "generation")}
"""Confidence sources a task may name in ``metadata.confidence`` (first = default)."""

NO_CORRECTNESS = "none"
"""``metadata: {correctness: none}``: the task's correctness is not defined (no calibration rows)."""


@functools.cache
def _warn_once(message: str) -> None:
    eval_logger.warning(message)


class ProbeResults(Task):
    """Mixin for a ``ConfigurableTask`` (or any subclass, e.g. a stock Python task): adds the probe rows."""

    # a Task subclass adding no instance layout, so that a built task's class can be swapped in place
    __slots__ = ()

    is_detector_task = False
    """Whether the task's documents are clean/noised twins (adds the corruption-detector rows)."""

    def _add_probe_metrics(self) -> None:
        options = CalibrationOptions.from_metadata(self._metadata())
        self.confidence_source  # noqa: B018  (validates metadata.confidence now, not after the model ran)
        for row in self.probe_rows:
            self._aggregation_list.setdefault(row.name, task_aggregation(row, options))
            self._higher_is_better.setdefault(row.name, row.higher_is_better)

    def construct_requests(self, doc: dict[str, Any], ctx: Any, **kwargs: Any) -> Any:
        """The task's own requests, each carrying a :class:`~lm_eval_probes.records.ProbeRequest` for the model
        wrapper (multiple choice: the option count and the rule that picks the option this task reads)."""
        requests = super().construct_requests(doc, ctx, **kwargs)
        if self.OUTPUT_TYPE == "multiple_choice":
            request = ProbeRequest(self.option_count(doc), functools.partial(self.chosen_option_index, doc))
        else:
            request = ProbeRequest()
        for instance in requests if isinstance(requests, list) else [requests]:
            setattr(instance, PROBE_REQUEST, request)
        return requests

    @property
    def probe_rows(self) -> tuple[rows.Row, ...]:
        """The rows this task reports."""
        return rows.rows_for(difficulty=self.difficulty_source is not None, correctness=self.correctness_defined,
                             detector=self.is_detector_task)

    def _metadata(self) -> dict[str, Any]:
        return self.config.metadata if isinstance(self.config.metadata, dict) else {}

    @property
    def confidence_source(self) -> str:
        """``metadata: {confidence: ...}``: multiple choice ``option`` (default) or ``option_norm``
        (softmax over per-character log-likelihoods: lm_eval's ``acc_norm`` choice); generation ``answer``
        (default: the tokens of the filter-extracted answer) or ``generation`` (all generated tokens)."""
        sources = CONFIDENCE_SOURCES["mc" if self.OUTPUT_TYPE in ("multiple_choice", "loglikelihood") else "gen"]
        source = self._metadata().get("confidence", sources[0])
        if source not in sources:
            raise ValueError(f"task {self.config.task!r}: metadata.confidence must be one of {sources} for "
                             f"{self.OUTPUT_TYPE} tasks, got {source!r}")
        return source

    @property
    def correctness_metric(self) -> str | None:
        """``metadata: {correctness: <metric>}``, or ``None`` for the default judgement."""
        name = self._metadata().get("correctness")
        return None if name is None else str(name)

    @property
    def correctness_defined(self) -> bool:
        """Whether a document can be judged right or wrong: multiple choice and generation by default;
        a loglikelihood task only when ``metadata.correctness`` names a metric; never with ``none``."""
        name = self.correctness_metric
        if name is not None:
            return name.lower() != NO_CORRECTNESS
        return self.OUTPUT_TYPE in ("multiple_choice", "generate_until")

    def correctness(self, doc: dict[str, Any], values: dict[str, Any], chosen: int | None) -> int | None:
        """0/1 correctness of the document: the task's own metric named by ``metadata.correctness``; by
        default, multiple choice: whether the option the confidence describes (``chosen``) is a gold option
        (as ``acc`` / ``acc_norm`` judge it); generation: the first of ``exact_match`` / ``acc``."""
        if not self.correctness_defined:
            return None
        name = self.correctness_metric
        if name is None and chosen is not None:
            return estimators.option_correctness(chosen, self._gold_indices(doc))
        if name is None:
            name = next((n for n in ("exact_match", "acc") if n in values), None)
        if name is None or values.get(name) is None:
            return None
        correct = estimators.binary_correctness(values[name])
        if correct is None:
            _warn_once(f"task {self.config.task!r}: metric {name!r} is not 0/1 per document (got {values[name]!r}); "
                       "no calibration rows. Name a 0/1 metric with metadata.correctness")
        return correct

    @property
    def difficulty_source(self) -> str | Callable[[dict[str, Any]], Any] | None:
        """``metadata: {difficulty: <doc field name>}`` (or a ``!function`` taking the doc); ``None``: no label."""
        return self._metadata().get("difficulty")

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

    def _gold_indices(self, doc: dict[str, Any]) -> list[int] | None:
        """The gold option indices of a multiple-choice document, as lm_eval's own ``acc`` reads them."""
        choices = self.doc_to_choice(doc)
        gold = self.doc_to_text(doc) if self.multiple_input else self.doc_to_target(doc)
        golds = gold if isinstance(gold, list) else [gold]
        indices = [choices.index(g) if isinstance(g, str) and g in choices else g for g in golds]
        if not all(isinstance(i, int) and 0 <= i < len(choices) for i in indices):
            return None
        return indices

    def apply_filters(self) -> Any:
        """lm_eval's filters, then each response's probe re-attached (regex filters build plain strings),
        with the document's index and, for generations, the filtered answer's token span."""
        out = super().apply_filters()
        for inst in self._instances or []:
            raw = inst.resps[0] if inst.resps else None
            probe = probe_of(raw)
            if probe is None:
                continue
            probe = replace(probe, document=int(inst.doc_id))
            for key, value in inst.filtered_resps.items():
                located = probe
                if probe.token_ends is not None and isinstance(raw, str) and not probe.empty:
                    answer = value[0] if isinstance(value, list) and value else value
                    located = replace(probe, answer_span=estimators.locate_answer(str(raw), answer, probe.token_ends))
                inst.filtered_resps[key] = with_probe(value, located)
        return out

    def process_results(self, doc: dict[str, Any], results: list[Any]) -> dict[str, Any]:
        values = dict(super().process_results(doc, results))
        response = self._response(doc, results)
        if response is None:
            return values
        probe, confidence, answer_span, chosen = response
        declared = self.difficulty_source is not None
        values.update(probe_metric_values(probe, confidence, self.difficulty(doc) if declared else None, declared=declared))
        if probe.trace is not None:
            values[TRACE.name] = dict(probe.trace)
        if probe.token_ends is not None and self.confidence_source == "answer" and not probe.empty:
            values[ANSWER_UNLOCATED.name] = int(probe.answer_span is None)
        reveal_step = estimators.answer_reveal_step(probe, whole=self.confidence_source == "generation")
        if reveal_step is not None:
            values[REVEAL_STEP.name] = reveal_step
        correct = self.correctness(doc, values, chosen)
        if correct is not None and math.isfinite(confidence):
            for row in CONFIDENCE_ROWS:
                values[row.name] = (confidence, correct, probe.document) if row.value == "confidence_keyed" \
                    else (confidence, correct)
        if correct is not None:
            whole = self.confidence_source == "generation"
            at_steps = {percent: trajectory_confidence(probe, percent, whole=whole) for percent in TRAJECTORY_PERCENTS}
            for row in TRAJECTORY_ROWS:
                at_step = at_steps[row.at_percent]
                if at_step is not None and math.isfinite(at_step):
                    values[row.name] = (at_step, correct)
        noised = int(doc.get("noised", 0)) if self.is_detector_task else None
        for feeding in registry.probes():  # the readers' rows, fitted on a probe's states
            for row in feeding.feeds:
                states = feeding.fed(probe, row, answer_span=answer_span)
                if row.family == "reader" and correct is not None and states is not None:
                    values[row.name] = ReaderRecord(states, correct, document=probe.document)
                elif row.family == "detector" and noised is not None:
                    values[row.name] = ReaderRecord(states, noised, group=doc.get("noise_pair"), document=probe.document)
        if noised is not None and math.isfinite(confidence):  # confidence as the detector's baseline
            values[CORRUPTION_CONFIDENCE_AUROC.name] = (1.0 - confidence, noised)
        return values

    def option_count(self, doc: dict[str, Any]) -> int:
        """Multiple choice: the number of options (the first requests of the document, in option order)."""
        return len(self.doc_to_choice(doc))

    def chosen_option_index(self, doc: dict[str, Any], option_logliks: Sequence[float]) -> int:
        """Multiple choice: the option whose record this task reads (the one the model chooses), from the
        options' log-likelihoods — what the model wrapper asks to give the logit lens to that option only."""
        return estimators.chosen_option(option_logliks, self._option_lengths(doc))[0]

    def _option_lengths(self, doc: dict[str, Any]) -> list[float] | None:
        if self.confidence_source != "option_norm":
            return None
        return [float(len(c)) for c in self.doc_to_choice(doc)]

    def _response(
        self, doc: dict[str, Any], results: list[Any]
    ) -> tuple[ResponseProbe, float, bool, int | None] | None:
        """The probe of the response this document is judged on, its confidence, whether a reader reads the
        located answer span of it (generations whose confidence reads the answer) and (multiple choice) the chosen
        option."""
        if self.OUTPUT_TYPE == "multiple_choice":
            options = results[: self.option_count(doc)]  # acc_mutual_info appends unconditional requests
            chosen, confidence = estimators.chosen_option([r[0] for r in options], self._option_lengths(doc))
            probe = probe_of(options[chosen])
            return None if probe is None else (probe, confidence, False, chosen)
        first = results[0] if results else None
        if isinstance(first, list):  # repeats > 1 without take_first
            first = first[0] if first else None
        probe = probe_of(first)
        if probe is None:
            return None
        if self.OUTPUT_TYPE != "generate_until" or probe.token_ends is None or self.confidence_source == "generation":
            return probe, estimators.response_confidence(probe), False, None
        return probe, estimators.answer_confidence(probe), True, None


class ProbeTask(ProbeResults, ConfigurableTask):
    """A YAML task plus probe rows (see module docstring)."""

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        config = dict(config or {})
        config.pop("class", None)  # lm_eval passes the YAML's `class:` key on, and TaskConfig rejects it
        super().__init__(config=config, **kwargs)
        self._add_probe_metrics()


class NoisedProbeTask(ProbeTask):
    """A probe task whose evaluated documents are noised; few-shot examples stay clean.

    Task metadata (each overridable for a run with ``--metadata '{"noise_eta": 0.3}'``):
    ``noise`` (operator: swap, keyboard, insert, delete), ``noise_fields`` (document fields to noise),
    ``noise_eta`` (default 0.10; the paper's grid is 0.05, 0.10, 0.15, 0.30), ``noise_seed`` (default
    1234), ``noise_protect_numbers`` and ``noise_protect_negations`` (default true: tokens with a digit or
    a negation word are kept intact) and ``noise_protect`` (regexes of spans kept intact).
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
        self.noise_protect_negations = bool(meta.get("noise_protect_negations", True))
        self.noise_protect = tuple(meta.get("noise_protect") or ())
        self._noised_docs: Any = None
        super().__init__(config=config, **kwargs)

    def noised(self, doc: dict[str, Any], *, eta: float | None = None) -> dict[str, Any]:
        """``doc`` with the task's noise applied (``eta`` overrides the task's rate; 0 keeps it clean)."""
        from lm_eval_probes.tasks.noise import noise_fields

        return noise_fields(doc, self.noise_fields, operator=self.noise_operator,
                            eta=self.noise_eta if eta is None else eta, global_seed=self.noise_seed,
                            protect_numbers=self.noise_protect_numbers,
                            protect_negations=self.noise_protect_negations, protect=self.noise_protect)

    @property
    def eval_docs(self) -> Any:
        if self._noised_docs is None:
            docs = super().eval_docs
            self._noised_docs = docs.map(self.noised) if hasattr(docs, "map") else [self.noised(d) for d in docs]
        return self._noised_docs


class NoisedPairProbeTask(NoisedProbeTask):
    """Every document twice, clean then noised: the corruption detector's task form.

    Evaluated documents are ``clean_0, noised_0, clean_1, noised_1, …`` (so ``--limit 60`` is 30 pairs),
    each with ``noise_pair`` (the clean document's index) and ``noised`` (1 when the noise changed the
    prompt; a twin that the noise left unchanged is labelled 0, since nothing tells it apart). Besides
    every probe row over all 2n documents, the task reports ``corruption_auroc`` (the reader on the mean
    prompt hidden state, cross-fitted with both twins of a pair always in the same fold) and
    ``corruption_confidence_auroc`` (how well 1 − output confidence detects the noise).
    """

    is_detector_task = True

    @property
    def eval_docs(self) -> Any:
        if self._noised_docs is None:
            docs = ConfigurableTask.eval_docs.fget(self)
            pairs: list[dict[str, Any]] = []
            for index, doc in enumerate(docs):
                noised = self.noised(doc)
                pairs.append({**self.noised(doc, eta=0.0), "noise_pair": index, "noised": 0})
                pairs.append({**noised, "noise_pair": index, "noised": int(noised["noise_corrupted"] > 0)})
            self._noised_docs = datasets.Dataset.from_list(pairs) if hasattr(docs, "map") else pairs
        return self._noised_docs


def trajectory_confidence(probe: ResponseProbe, percent: int, *, whole: bool = False) -> float | None:
    """A masked-diffusion generation's confidence at ``percent`` % of its denoising steps: the geometric mean,
    over the tokens the answer confidence reads (the located answer span, else — or with ``whole`` — the
    whole response), of each token's probability of its final token at that step, masked or not
    (:meth:`ResponseProbe.trajectory_at`); ``None`` for a record without that step (not a masked-diffusion
    generation). At 100 % it reads the final denoising pass (``final_token_logprobs``)."""
    logprobs = probe.trajectory_at(percent)
    if logprobs is None:
        return None
    start, stop = (0, len(logprobs)) if whole or probe.answer_span is None else probe.answer_span
    return float(geometric_mean_probability(logprobs[start:stop] or logprobs))


def probe_metric_values(
    probe: ResponseProbe, confidence: float, difficulty: float | None, *, declared: bool = False
) -> dict[str, Any]:
    """Per-document values of the probe and difficulty rows, as the declarations (:mod:`lm_eval_probes.declarations`)
    say: each probe's rows read their record field, its ρ rows its ranked field.

    ``response_tokens`` counts the probed positions (an empty generation: its one stop position) and
    ``empty_responses`` flags generations whose kept text is empty. A probe whose ranked value is not finite
    (disabled, or undefined for the document) gets none of its scalar rows (so ``mean`` skips it). With a declared
    difficulty every ρ record is present, with ``None`` for a document without a label (so a run without any label
    shows the ρ rows as ``null``): ρ records ``(value, difficulty)``, length-controlled records ``(value,
    difficulty, response tokens)`` and ``(value, difficulty, prompt tokens)``, the baselines ``(response / prompt
    tokens, difficulty)``, and ``difficulty_missing`` (1 for a document without a label). Vector rows (the BTE depth
    profile, the Ω trajectory) are per-document lists (a non-finite member ``None``); the support tokens a dict.
    """
    values: dict[str, Any] = {RESPONSE_TOKENS.name: probe.n_tokens}
    if probe.token_ends is not None:
        values[EMPTY_RESPONSES.name] = int(probe.empty)
    if math.isfinite(confidence):
        values[CONFIDENCE.name] = confidence
    if declared:
        values[DIFFICULTY_MISSING.name] = int(difficulty is None)
        values[LENGTH_SPEARMAN.name] = (probe.n_tokens, difficulty)
        if probe.prompt_tokens is not None:
            values[PROMPT_LENGTH_SPEARMAN.name] = (probe.prompt_tokens, difficulty)
    for declaration in registry.probes():
        ranked = None if declaration.ranked is None else probe.get(declaration.ranked)
        unranked = declaration.ranked is None
        if unranked or (ranked is not None and math.isfinite(ranked)):
            for row in declaration.rows:
                value = probe.get(row.field) if row.value == "float" else None
                if value is not None and (not unranked or _finite(value)):
                    values[row.name] = value
        if declared and ranked is not None and math.isfinite(ranked):
            spearman, partial, partial_prompt = declaration.difficulty_rows()
            values[spearman.name] = (ranked, difficulty)
            values[partial.name] = (ranked, difficulty, probe.n_tokens)
            if probe.prompt_tokens is not None:
                values[partial_prompt.name] = (ranked, difficulty, probe.prompt_tokens)
        for row in declaration.rows:
            if row.value == "vector" and probe.get(row.field) is not None:
                values[row.name] = [float(v) if math.isfinite(v) else None for v in probe.get(row.field)]
            elif row.value == "support" and probe.get(f"{row.field}_values") is not None:
                values[row.name] = {
                    "positions": list(probe.get(f"{row.field}_positions") or ()),
                    "tokens": list(probe.get(f"{row.field}_tokens") or ()),
                    "margins": [float(v) if math.isfinite(v) else None for v in probe.get(f"{row.field}_values")]}
    return values


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
