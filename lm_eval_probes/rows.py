"""Every results row of the plugin, declared once: name, per-document value, aggregation, direction.

Everything else is derived from :data:`ROWS`: the registration with lm_eval
(:mod:`lm_eval_probes.integration`), the rows a task adds (:func:`rows_for`), the row families the
task adapter fills (confidence pairs, reader records, difficulty records) and the tests' list.
Torch-free and lm_eval-free, so reports can read it.

Per-document value kinds (what ``process_results`` returns for the row, and what ``--log_samples``
files hold):

* ``float``: a number (``None`` when undefined for the document); aggregated by ``mean``.
* ``flag``: 0/1; aggregated by a sum (``probe_count``).
* ``ranked``: ``(value, difficulty)``; ``partial``: ``(value, difficulty, length)`` (difficulty
  ``None`` when the document has no label: skipped).
* ``confidence``: ``(confidence, correct)``; ``confidence_keyed``: ``(confidence, correct, document)``
  (the document's identity orders the records before a seeded split, so no float decides a fold).
* ``reader``: a :class:`~lm_eval_probes.records.ReaderRecord`.
* ``vector``: a list of floats (a depth profile or trajectory), so that ``--log_samples`` files carry it
  for the reports; aggregated by the mean over documents of its mean (``probe_vector_mean``).
* ``support``: the support tokens, ``{"positions": [...], "tokens": [...], "margins": [...]}`` (smallest
  margin first); aggregated by the mean over documents of the mean support margin (``probe_support_mean``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lm_eval_probes.metrics.calibration import CALIBRATION_ROWS, CalibrationOptions
from lm_eval_probes.probes.correlation import count, partial_spearman_score, spearman_score

VALUE_KINDS = ("float", "flag", "ranked", "partial", "confidence", "confidence_keyed", "reader", "vector", "support")
FAMILIES = ("probe", "difficulty", "confidence", "reader", "detector", "trajectory")


@dataclass(frozen=True)
class Row:
    """One results row.

    Attributes:
        name: the metric name in lm_eval's results (``<name>,<filter>``).
        value: the per-document value kind (see the module docstring).
        aggregation: the registered aggregation name (``mean`` or ``probe_*``).
        higher_is_better: the direction lm_eval shows as an arrow.
        family: ``probe`` (a probe value), ``difficulty`` (ρ with difficulty and its baselines; tasks
            that declare a difficulty), ``confidence`` (calibration and selective prediction; tasks
            whose correctness is defined), ``reader`` (the latent correctness reader; same tasks),
            ``detector`` (paired clean/noised tasks only), ``trajectory`` (calibration along the denoising
            trajectory: masked-diffusion generations, tasks whose correctness is defined).
        description: what the row measures.
    """

    name: str
    value: str
    aggregation: str
    higher_is_better: bool
    family: str
    description: str

    def __post_init__(self) -> None:
        if self.value not in VALUE_KINDS:
            raise ValueError(f"row {self.name!r}: unknown value kind {self.value!r}; valid: {VALUE_KINDS}")
        if self.family not in FAMILIES:
            raise ValueError(f"row {self.name!r}: unknown family {self.family!r}; valid: {FAMILIES}")


TRAJECTORY_PERCENTS: tuple[int, ...] = (25, 50, 75, 100)
"""Points of the denoising trajectory that get calibration rows, in percent of the steps: step
``ceil(p · steps / 100) − 1`` (0-based), so 100 is the last step (:func:`lm_eval_probes.diffusion.trajectory_steps`)."""

ROWS: tuple[Row, ...] = (
    Row("tcb_log10", "float", "mean", True, "probe", "mean over documents of the mean log10 δ_TCB over response positions"),
    Row("tcb_log10_min", "float", "mean", True, "probe", "mean over documents of the smallest log10 δ_TCB of the response"),
    Row("bte_energy", "float", "mean", False, "probe", "mean over documents of the BTE central-window energy ē_M (nats)"),
    Row("omega", "float", "mean", False, "probe", "mean over documents of the HyperLens refinement area Ω = Σ_i (1 − C_i) of the focal-depth confidence trajectory (probes=omega)"),
    Row("margin", "float", "mean", True, "probe", "mean over documents of the mean stability margin log|det(I − Σ_t A)| of the first attention layer over the positions the model saw (probes=margin)"),
    Row("margin_min", "float", "mean", True, "probe", "mean over documents of the smallest margin (the first support token's)"),
    Row("bte_profile", "vector", "probe_vector_mean", False, "probe", "probe_bte_profile=full: mean over documents of the mean JSD e(l) over all L layer transitions (nats); per document the depth profile e(0..L-1) is in --log_samples"),
    Row("omega_trajectory", "vector", "probe_vector_mean", True, "probe", "probes=omega: mean over documents and source layers of the focal-depth confidence C_i (= 1 − Ω / number of source layers); per document the trajectory C_i is in --log_samples"),
    Row("margin_support", "support", "probe_support_mean", True, "probe", "probes=margin: mean over documents of the mean margin of the k support tokens; per document their positions, tokens and margins are in --log_samples"),
    Row("confidence", "float", "mean", True, "probe", "chosen option's probability (MC) / geometric-mean token probability of the answer (generation; an empty generation: the probability of the token that ended it)"),
    Row("reveal_step", "float", "mean", False, "probe", "masked diffusion (hf-probes-diffusion) only: mean over documents of the mean denoising step (0 = first) at which the tokens the confidence reads were revealed; with `confidence` per document in --log_samples, confidence against reveal order"),
    Row("response_tokens", "float", "mean", False, "probe", "number of response positions probed (an empty generation: 1, the position that chose to stop)"),
    Row("empty_responses", "flag", "probe_count", False, "probe", "generations whose kept text is empty (probed at the position that chose to stop)"),
    Row("answer_unlocated", "flag", "probe_count", False, "probe", "non-empty generations whose filtered answer was not found in the text (whole generation used)"),
    Row("tcb_spearman", "ranked", "probe_spearman", True, "difficulty", "Spearman ρ of the document's mean log10 δ_TCB with difficulty"),
    Row("bte_spearman", "ranked", "probe_spearman", True, "difficulty", "Spearman ρ of ē_M with the document's difficulty label"),
    Row("omega_spearman", "ranked", "probe_spearman", True, "difficulty", "Spearman ρ of Ω with the document's difficulty label"),
    Row("margin_spearman", "ranked", "probe_spearman", True, "difficulty", "Spearman ρ of the document's mean margin with difficulty"),
    Row("tcb_spearman_partial", "partial", "probe_partial_spearman", True, "difficulty", "tcb_spearman with response length partialled out"),
    Row("bte_spearman_partial", "partial", "probe_partial_spearman", True, "difficulty", "bte_spearman with response length partialled out"),
    Row("omega_spearman_partial", "partial", "probe_partial_spearman", True, "difficulty", "omega_spearman with response length partialled out"),
    Row("margin_spearman_partial", "partial", "probe_partial_spearman", True, "difficulty", "margin_spearman with response length partialled out"),
    Row("tcb_spearman_partial_prompt", "partial", "probe_partial_spearman", True, "difficulty", "tcb_spearman with prompt length partialled out"),
    Row("bte_spearman_partial_prompt", "partial", "probe_partial_spearman", True, "difficulty", "bte_spearman with prompt length partialled out"),
    Row("omega_spearman_partial_prompt", "partial", "probe_partial_spearman", True, "difficulty", "omega_spearman with prompt length partialled out"),
    Row("margin_spearman_partial_prompt", "partial", "probe_partial_spearman", True, "difficulty", "margin_spearman with prompt length partialled out"),
    Row("length_spearman", "ranked", "probe_spearman", True, "difficulty", "baseline: Spearman ρ of the response length (tokens) with difficulty"),
    Row("prompt_length_spearman", "ranked", "probe_spearman", True, "difficulty", "baseline: Spearman ρ of the prompt length (tokens) with difficulty"),
    Row("difficulty_missing", "flag", "probe_count", False, "difficulty", "documents without a difficulty label (skipped for every ρ)"),
    Row("ece", "confidence", "probe_ece", False, "confidence", "expected calibration error of confidence vs correctness (15 equal-width bins)"),
    Row("ece_scaled", "confidence_keyed", "probe_ece_scaled", False, "confidence", "ECE after temperature scaling fitted out-of-fold"),
    Row("selective_auroc", "confidence", "probe_selective_auroc", True, "confidence", "AUROC of confidence ranking correct above wrong answers"),
    Row("aurc", "confidence", "probe_aurc", False, "confidence", "area under the risk–coverage curve of confidence"),
    Row("selective_acc_50", "confidence", "probe_selective_acc_50", True, "confidence", "accuracy on the 50% most confident documents"),
    Row("selective_acc_80", "confidence", "probe_selective_acc_80", True, "confidence", "accuracy on the 80% most confident documents"),
    Row("lcr_auroc", "reader", "probe_lcr_auroc", True, "reader", "latent correctness reader: out-of-fold AUROC of P(correct) from answer hidden states"),
    Row("lcr_ece", "reader", "probe_lcr_ece", False, "reader", "latent correctness reader: ECE of its out-of-fold P(correct)"),
    Row("corruption_auroc", "reader", "probe_corruption_auroc", True, "detector", "corruption detector: cross-fitted AUROC of clean vs noised prompts from prompt hidden states"),
    Row("corruption_confidence_auroc", "confidence", "probe_corruption_confidence_auroc", True, "detector", "AUROC of (1 − confidence) as a detector of noised prompts"),
    *(row for percent in TRAJECTORY_PERCENTS for row in (
        Row(f"ece_at_step_{percent}", "confidence", "probe_ece", False, "trajectory",
            f"masked diffusion (hf-probes-diffusion) generations only: ECE of the confidence at {percent}% of the denoising "
            "steps (geometric mean over the answer span of each token's probability of its final token at that step, "
            "masked or not) vs correctness"),
        Row(f"selective_auroc_at_step_{percent}", "confidence", "probe_selective_auroc", True, "trajectory",
            f"masked diffusion (hf-probes-diffusion) generations only: AUROC of the confidence at {percent}% of the "
            "denoising steps ranking correct above wrong answers"),
    )),
)
"""Every row the plugin can add to a task's results."""

ROWS_BY_NAME: dict[str, Row] = {row.name: row for row in ROWS}

DIFFUSION_ROWS: tuple[str, ...] = ("reveal_step",) + tuple(row.name for row in ROWS if row.family == "trajectory")
"""Rows that only ``hf-probes-diffusion`` (records with reveal steps) fills."""


def names(*families: str) -> tuple[str, ...]:
    """Names of the rows of these families, in table order."""
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown row families {sorted(unknown)}; valid: {FAMILIES}")
    return tuple(row.name for row in ROWS if row.family in families)


def rows_for(*, difficulty: bool, correctness: bool, detector: bool) -> tuple[Row, ...]:
    """The rows a task reports: probe rows always; difficulty rows when it declares a difficulty;
    confidence, reader and trajectory rows when its correctness is defined; detector rows on paired tasks."""
    wanted = {"probe"} | ({"difficulty"} if difficulty else set())
    wanted |= {"confidence", "reader", "trajectory"} if correctness else set()
    wanted |= {"detector"} if detector else set()
    return tuple(row for row in ROWS if row.family in wanted)


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


AGGREGATIONS: dict[str, Callable[..., Any]] = {
    "probe_vector_mean": undefined_as_none(vector_mean),
    "probe_support_mean": undefined_as_none(support_mean),
    "probe_spearman": undefined_as_none(spearman_score),
    "probe_partial_spearman": undefined_as_none(partial_spearman_score),
    "probe_count": count,
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


def _check_table() -> None:
    unknown = [row.name for row in ROWS if row.aggregation != "mean" and row.aggregation not in AGGREGATIONS]
    if unknown or len(ROWS_BY_NAME) != len(ROWS):
        raise RuntimeError(f"rows without a known aggregation or declared twice: {unknown}")


_check_table()
