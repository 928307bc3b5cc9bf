"""``reproduce calibration``: confident but wrong under noised inputs ("Unsure but Certain", arXiv 2608.08791).

The paper (LLaDA-8B-Instruct, GSM8K, character swaps; autoregressive controls LLaMA-3-8B and Qwen-2.5-7B), clean →
noised: accuracy 0.560 → 0.373, mean confidence 0.988 → 0.982, ECE 0.428 → 0.610, selective AUROC 0.666 → 0.575;
temperature scaling brings the noised ECE to 0.133 with AUROC still 0.575; a reader of the prompt's hidden
states detects the noise at 0.996–0.997.

Tasks: the clean benchmark, its ``_noise_swap`` twin (document *i* is the twin of document *i*) and its
``_detect`` task (each document clean then noised: ``--limit N`` is N/2 pairs). Every number is read from the
rows a user gets: ``ece``, ``selective_auroc``, ``ece_scaled``, ``corruption_auroc`` from the results; accuracy
and mean confidence as the mean of the ``[confidence, correct]`` records the calibration rows read (the task's
own correctness: ``acc`` or ``exact_match`` under the variant's filter); changes as the same statistic on both
twins of the same resampled documents; AUROC after temperature scaling as the plugin's selective AUROC of the
confidences scaled by one temperature (the paper's setting; :func:`scaled_auroc_change`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import numpy as np

from lm_eval_probes.api import Row
from lm_eval_probes.declarations import CONFIDENCE_ROWS, ECE, SELECTIVE_AUROC, detector_rows
from lm_eval_probes.probes.calibration import (
    fit_temperature,
    out_of_fold_temperature_scale,
    selective_auroc_score,
    temperature_scale,
)
from lm_eval_probes.reports.corpus_rows import records
from lm_eval_probes.reproduce.claims import AbsAtMost, AtLeast, Claim, Measurement, PaperInInterval, SameSign
from lm_eval_probes.reproduce.protocol import MAIN, ReproductionProtocol, Variant
from lm_eval_probes.reproduce.statistics import (
    Run,
    column_mean,
    column_mean_measurement,
    paired_change,
    row_measurement,
    row_statistic,
)

ECE_SCALED = next(row for row in CONFIDENCE_ROWS if row.value == "confidence_keyed")


def corruption_auroc() -> Row:
    """The reader's corruption-detector row (a probe's: read from the registry when called)."""
    return next(row for row in detector_rows() if row.value == "reader")


PAPER = {  # quantity: (clean, noised)
    "accuracy": (0.560, 0.373),
    "mean confidence": (0.988, 0.982),
    "ECE": (0.428, 0.610),
    "selective AUROC": (0.666, 0.575),
}
PAPER_SCALED_ECE = 0.133
PAPER_DETECTOR = (0.996, 0.997)
DETECTOR_BOUND = 0.95
"""The detector agrees when its AUROC is at least this (the paper: 0.996–0.997; no interval is given)."""
CONFIDENCE_STEADY = 0.02
"""Mean confidence "barely moves" when |noised − clean| is at most this (the paper: −0.006)."""


def scaled_auroc_change(run: Run, task: str, filter_key: str) -> Measurement:
    """Selective AUROC after temperature scaling minus before, on the documents of the ``ece_scaled`` records.

    The paper's setting: one temperature (here fitted on all the documents) applied to every confidence, a
    monotone map, so the AUROC may move only where scaling merges distinct confidences into one float (ties
    near 0 or 1). The note also gives the AUROC of the out-of-fold scaled confidences ``ece_scaled`` reads: each
    fold has its own temperature, so that map is not monotone across folds and can reorder documents.
    """
    rows = records(run.documents(task, filter_key), ECE_SCALED.name, 3)
    if len(rows) < 3:
        return Measurement(None, n_documents=len(rows), note="fewer than 3 documents")
    options = run.options(task)
    rows = rows[np.argsort(rows[:, 2], kind="stable")]
    confidence, correct = rows[:, 0], rows[:, 1].astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        before = selective_auroc_score(confidence, correct)
        after = selective_auroc_score(temperature_scale(confidence, fit_temperature(confidence, correct)), correct)
        folds = selective_auroc_score(out_of_fold_temperature_scale(
            confidence, correct, n_splits=options.reader_folds, seed=options.reader_seed), correct)
    change = after - before
    if not math.isfinite(change):
        return Measurement(None, n_documents=len(rows), note="AUROC undefined (one class)")
    note = f"AUROC {before:.3f} → {after:.3f} (one T fitted on all documents); out-of-fold T's: {folds:.3f}"
    return Measurement(change, n_documents=len(rows), note=note)


def scaled_ece_change(run: Run, task: str, filter_key: str) -> Measurement:
    """``ece_scaled − ece`` from the results (no interval: ``ece_scaled`` is fitted out-of-fold)."""
    before, after = run.value(task, ECE.name, filter_key), run.value(task, ECE_SCALED.name, filter_key)
    if before is None or after is None:
        return Measurement(None, note="ece or ece_scaled undefined")
    return Measurement(after - before, n_documents=len(run.documents(task, filter_key)),
                       note=f"ECE {before:.3f} → {after:.3f} (no CI: fitted out-of-fold)")


def calibration_claims(runs: Mapping[str, Run], variant: Variant) -> list[Claim]:
    """The paper's claims from a run of ``variant`` (tasks: clean, noised twin, detector)."""
    run = runs[MAIN]
    clean, noised, detect = variant.tasks
    key = variant.filter_key
    claims: list[Claim] = []
    def mean_of(column: int, what: str):
        return lambda task: column_mean_measurement(run, task, ECE.name, column, key, f"the {what} the calibration "
                                                    "rows read")

    read = {  # quantity: (its measurement on one task, the row whose records it reads, its statistic on them)
        "accuracy": (mean_of(1, "correctness"), ECE.name, column_mean(1)),
        "mean confidence": (mean_of(0, "confidence"), ECE.name, column_mean(0)),
        "ECE": (lambda task: row_measurement(run, task, ECE.name, key), ECE.name, row_statistic(ECE.name)),
        "selective AUROC": (lambda task: row_measurement(run, task, SELECTIVE_AUROC.name, key), SELECTIVE_AUROC.name,
                            row_statistic(SELECTIVE_AUROC.name)),
    }
    for quantity, (measure, row, statistic) in read.items():
        paper_clean, paper_noised = PAPER[quantity]
        claims.append(Claim(f"{quantity}, clean", paper_clean, measure(clean), PaperInInterval()))
        claims.append(Claim(f"{quantity}, noised (char swap)", paper_noised, measure(noised), PaperInInterval()))
        rule = AbsAtMost(CONFIDENCE_STEADY) if quantity == "mean confidence" else SameSign()
        claims.append(Claim(f"{quantity}: noised − clean (paired twins)", paper_noised - paper_clean,
                            paired_change(run, clean, noised, row, key, statistic), rule,
                            f"{paper_clean:.3f} → {paper_noised:.3f} ({paper_noised - paper_clean:+.3f})"))
    claims.append(Claim("temperature scaling lowers ECE (noised): ece_scaled − ece", PAPER_SCALED_ECE - PAPER["ECE"][1],
                        scaled_ece_change(run, noised, key), SameSign(),
                        f"{PAPER['ECE'][1]:.3f} → {PAPER_SCALED_ECE:.3f} ({PAPER_SCALED_ECE - PAPER['ECE'][1]:+.3f})"))
    claims.append(Claim("temperature scaling leaves selective AUROC unchanged (noised)", 0.0,
                        scaled_auroc_change(run, noised, key), AbsAtMost(1e-9),
                        f"{PAPER['selective AUROC'][1]:.3f} → {PAPER['selective AUROC'][1]:.3f}"))
    claims.append(Claim("corruption detector AUROC (prompt hidden states, clean vs noised twins)", PAPER_DETECTOR[0],
                        row_measurement(run, detect, corruption_auroc().name, key), AtLeast(DETECTOR_BOUND),
                        f"{PAPER_DETECTOR[0]:.3f}–{PAPER_DETECTOR[1]:.3f}"))
    return claims


def _variant(benchmark: str, filter_key: str, description: str) -> Variant:
    tasks = (f"probes_{benchmark}", f"probes_{benchmark}_noise_swap", f"probes_{benchmark}_detect")
    return Variant(benchmark.replace("_gen", "-gen"), tasks, filter_key, description)


PROTOCOL = ReproductionProtocol(
    name="calibration",
    summary="clean vs char-swap-noised inputs: accuracy, confidence, ECE, selective AUROC, temperature scaling, "
            "the corruption detector",
    citation="Calibration and the corruption detector: \"Unsure but Certain\" (arXiv 2608.08791)",
    pretrained={"hf-probes-diffusion": "GSAI-ML/LLaDA-8B-Instruct", "hf-probes": "meta-llama/Meta-Llama-3-8B-Instruct"},
    default_model="hf-probes-diffusion",
    model_args={"probes": "reader"},
    variants=(
        _variant("gsm8k", "flexible-extract", "GSM8K 5-shot chain of thought, the last number of the generation "
                                              "checked (the paper's benchmark)"),
        _variant("proofwriter", "none", "ProofWriter multiple choice (fast; a stand-in for small models)"),
        _variant("proofwriter_gen", "answer", "ProofWriter as a short generation (reveal-time confidence of a "
                                              "masked-diffusion LM)"),
    ),
    claims=calibration_claims,
)
