"""The rows of the plugin that are no one probe's, and the probes' rows as the registry has them.

Every probe is one :class:`~lm_eval_probes.api.Probe` (its rows, fields, options and capture), registered by
:mod:`lm_eval_probes.registry`; :data:`PROBES`, :data:`PROBE_NAMES`, :data:`PROBES_BY_NAME`, :data:`READER_ROWS`
(the rows probes feed to the latent correctness reader) and :data:`DETECTOR_ROWS` are read from it each time they are
asked for, as are :func:`probe_rows`, :func:`difficulty_rows`, :func:`reader_rows` and :func:`detector_rows`: a module
that builds something from them calls these when it runs, never when it is imported (a probe registered later would
be missing). Declared here, in the same :class:`~lm_eval_probes.api.Row` form: the response's own rows (confidence,
lengths), the difficulty baselines, calibration and selective prediction, confidence as a corruption detector, and
calibration along the denoising trajectory. Per-document value kinds: :class:`~lm_eval_probes.api.Row`.

Torch-free and lm_eval-free, so that configuration, ``--help`` and the reports can read it.
"""

from __future__ import annotations

import math
from typing import Any

from lm_eval_probes.api import CORRELATION, FAMILIES, NON_NEGATIVE, UNIT_INTERVAL, VALUE_KINDS, Probe, Row

__all__ = ["FAMILIES", "NON_PROBE_ROWS", "Probe", "Row", "VALUE_KINDS", "detector_rows", "difficulty_rows", "probe_rows",
           "reader_rows"]

CORRUPTION_CONFIDENCE_AUROC = Row(
    "corruption_confidence_auroc", "confidence", "probe_corruption_confidence_auroc", True, "detector",
    "AUROC of (1 − confidence) as a detector of noised prompts", bounds=UNIT_INTERVAL)
"""Output confidence as a detector of noised prompts (paired clean/noised tasks): the detector's baseline."""

CONFIDENCE = Row(
    "confidence", "float", "mean", True, "probe",
    "chosen option's probability (MC) / geometric-mean token probability of the answer (generation; an empty "
    "generation: the probability of the token that ended it)", bounds=UNIT_INTERVAL)
REVEAL_STEP = Row(
    "reveal_step", "float", "mean", False, "probe",
    "masked diffusion (hf-probes-diffusion) only: mean over documents of the mean denoising step (0 = first) at "
    "which the tokens the confidence reads were revealed; with `confidence` per document in --log_samples, "
    "confidence against reveal order", diffusion_only=True, scored=False, bounds=NON_NEGATIVE)
RESPONSE_TOKENS = Row(
    "response_tokens", "float", "mean", False, "probe",
    "number of response positions probed (an empty generation: 1, the position that chose to stop)", scored=False,
    bounds=NON_NEGATIVE)
EMPTY_RESPONSES = Row(
    "empty_responses", "flag", "probe_count", False, "probe",
    "generations whose kept text is empty (probed at the position that chose to stop)", scored=False,
    bounds=NON_NEGATIVE)
ANSWER_UNLOCATED = Row(
    "answer_unlocated", "flag", "probe_count", False, "probe",
    "non-empty generations whose filtered answer was not found in the text (whole generation used)", scored=False,
    bounds=NON_NEGATIVE)
TRACE = Row(
    "trace", "trace", "probe_traced", False, "probe",
    "probe_traces=true: documents with a per-token trace in --log_samples (the response's tokens, their "
    "log-probabilities, each probe's per-position values and the logit-lens grid layer by layer)", scored=False, bounds=NON_NEGATIVE)
RESPONSE_ROWS: tuple[Row, ...] = (CONFIDENCE, REVEAL_STEP, RESPONSE_TOKENS, EMPTY_RESPONSES, ANSWER_UNLOCATED, TRACE)
"""The response's own rows (every model, whichever probes)."""

LENGTH_SPEARMAN = Row("length_spearman", "ranked", "probe_spearman", True, "difficulty",
                      "baseline: Spearman ρ of the response length (tokens) with difficulty", scored=False,
                      bounds=CORRELATION)
PROMPT_LENGTH_SPEARMAN = Row("prompt_length_spearman", "ranked", "probe_spearman", True, "difficulty",
                             "baseline: Spearman ρ of the prompt length (tokens) with difficulty", scored=False,
                             bounds=CORRELATION)
DIFFICULTY_MISSING = Row("difficulty_missing", "flag", "probe_count", False, "difficulty",
                         "documents without a difficulty label (skipped for every ρ)", scored=False,
                         bounds=NON_NEGATIVE)
BASELINE_ROWS: tuple[Row, ...] = (LENGTH_SPEARMAN, PROMPT_LENGTH_SPEARMAN, DIFFICULTY_MISSING)
"""The difficulty rows that are no probe's: the length baselines every ρ is read against, and the unlabelled count."""

ECE = Row("ece", "confidence", "probe_ece", False, "confidence",
          "expected calibration error of confidence vs correctness (15 equal-width bins)", bounds=UNIT_INTERVAL)
SELECTIVE_AUROC = Row("selective_auroc", "confidence", "probe_selective_auroc", True, "confidence",
                      "AUROC of confidence ranking correct above wrong answers", bounds=UNIT_INTERVAL)
CONFIDENCE_ROWS: tuple[Row, ...] = (
    ECE,
    Row("ece_scaled", "confidence_keyed", "probe_ece_scaled", False, "confidence",
        "ECE after temperature scaling fitted out-of-fold", bounds=UNIT_INTERVAL),
    SELECTIVE_AUROC,
    Row("aurc", "confidence", "probe_aurc", False, "confidence", "area under the risk–coverage curve of confidence",
        bounds=UNIT_INTERVAL),
    Row("selective_acc_50", "confidence", "probe_selective_acc_50", True, "confidence",
        "accuracy on the 50% most confident documents", bounds=UNIT_INTERVAL),
    Row("selective_acc_80", "confidence", "probe_selective_acc_80", True, "confidence",
        "accuracy on the 80% most confident documents", bounds=UNIT_INTERVAL),
    Row("prr", "confidence", "probe_prr", True, "confidence",
        "prediction rejection ratio (lm-polygraph): (A − accuracy) / (A_oracle − accuracy), A = mean over k of the "
        "accuracy of the k most confident documents; 1 = the oracle's order, 0 = random",
        bounds=(-math.inf, 1.0)),  # no floor: about −ln n with one wrong document of n, ranked first
    Row("ece_10_bin", "confidence", "probe_ece_10_bin", False, "confidence",
        "HELM's ece_10_bin: ECE over 10 equal-mass bins drawn as HELM draws them (boundaries at the midpoints "
        "between chunks of the sorted confidences)", bounds=UNIT_INTERVAL),
    Row("selective_cov_acc_area", "confidence", "probe_selective_cov_acc_area", True, "confidence",
        "HELM's selective_cov_acc_area: area under the coverage–accuracy curve (= 1 − aurc; ties as their "
        "expectation)", bounds=UNIT_INTERVAL),
)
"""Calibration and selective prediction of the response's confidence (tasks whose correctness is defined)."""

TRAJECTORY_PERCENTS: tuple[int, ...] = (25, 50, 75, 100)
"""Points of the denoising trajectory that get calibration rows, in percent of the steps: step
``ceil(p · steps / 100) − 1`` (0-based), so 100 is the last step
(:func:`lm_eval_probes.models.diffusion_decoding.trajectory_steps`)."""

TRAJECTORY_ROWS: tuple[Row, ...] = tuple(row for percent in TRAJECTORY_PERCENTS for row in (
    Row(f"ece_at_step_{percent}", "confidence", "probe_ece", False, "trajectory",
        f"masked diffusion (hf-probes-diffusion) generations only: ECE of the confidence at {percent}% of the denoising "
        "steps (geometric mean over the answer span of each token's probability of its final token at that step, "
        "masked or not) vs correctness", at_percent=percent, diffusion_only=True, bounds=UNIT_INTERVAL),
    Row(f"selective_auroc_at_step_{percent}", "confidence", "probe_selective_auroc", True, "trajectory",
        f"masked diffusion (hf-probes-diffusion) generations only: AUROC of the confidence at {percent}% of the "
        "denoising steps ranking correct above wrong answers", at_percent=percent, diffusion_only=True,
        bounds=UNIT_INTERVAL),
))
"""Calibration along the denoising trajectory (masked-diffusion generations)."""


NON_PROBE_ROWS: tuple[Row, ...] = (
    RESPONSE_ROWS + BASELINE_ROWS + CONFIDENCE_ROWS + (CORRUPTION_CONFIDENCE_AUROC,) + TRAJECTORY_ROWS
)
"""Every row that is no probe's (names no probe may take)."""


def probe_rows() -> tuple[Row, ...]:
    """Every probe's own rows, in registry order."""
    from lm_eval_probes.registry import probes

    return tuple(row for probe in probes() for row in probe.rows)


def difficulty_rows() -> tuple[Row, ...]:
    """Every probe's ρ rows, then the baselines."""
    from lm_eval_probes.registry import probes

    return tuple(row for probe in probes() for row in probe.difficulty_rows()) + BASELINE_ROWS


def reader_rows() -> tuple[Row, ...]:
    """The rows the registered probes feed to the latent correctness reader, in registry order."""
    from lm_eval_probes.registry import probes

    return tuple(row for probe in probes() for row in probe.feeds if row.family == "reader")


def detector_rows() -> tuple[Row, ...]:
    """The corruption-detector rows the registered probes feed, in registry order, then confidence's baseline."""
    from lm_eval_probes.registry import probes

    return tuple(row for probe in probes() for row in probe.feeds if row.family == "detector") + (
        CORRUPTION_CONFIDENCE_AUROC,)


def __getattr__(name: str) -> Any:
    """The registry's views: ``PROBES``, ``PROBE_NAMES``, ``PROBES_BY_NAME``, ``READER_ROWS``, ``DETECTOR_ROWS``."""
    from lm_eval_probes.registry import probes

    if name == "PROBES":
        return probes()
    if name == "PROBE_NAMES":
        return tuple(probe.name for probe in probes())
    if name == "PROBES_BY_NAME":
        return {probe.name: probe for probe in probes()}
    if name == "READER_ROWS":
        return reader_rows()
    if name == "DETECTOR_ROWS":
        return detector_rows()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
