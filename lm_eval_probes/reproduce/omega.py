"""``reproduce omega``: HyperLens refinement area Ω ("HyperLens: Quantifying Cognitive Effort …", arXiv 2605.05741).

The paper's claims (8 models × 8 datasets): decoding a layer through more of the model's last blocks raises the
confidence read from it (amplification: focal depth m = 0, 1, 3, 5), and Ω = Σ_i (1 − C_i) is higher on harder
inputs (Qwen2.5-7B, code tasks: easy 1.78, hard 3.05).

Four passes over the same documents, ``probe_omega_depth`` = 0, 1, 3, 5 (the model is loaded once per pass).
Read from the rows: the mean focal-depth confidence per depth (``omega_trajectory``), the per-document change
from m = 0 to m = 5 (the mean of each document's trajectory, paired by document), and at m = 5 ``omega_spearman``,
``omega_spearman_partial`` (response length partialled out) with the report's bootstrap CI, and the mean Ω of
the hardest level minus the easiest from the same ``[Ω, difficulty]`` records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from lm_eval_probes import registry
from lm_eval_probes.reproduce.claims import Claim, IntervalAbove, Measurement, SameSign, StrictlyIncreasing
from lm_eval_probes.reproduce.protocol import ReproductionProtocol, Variant
from lm_eval_probes.reproduce.statistics import Run, level_gap, measured_with, percentile_ci, row_measurement

PROBE_NAME = "omega"
"""The probe reproduced; its rows (the trajectory, ρ, ρ partialled) are read from the registry when the claims are."""
DEPTHS = (0, 1, 3, 5)
PASSES = {f"m{depth}": {"probe_omega_depth": str(depth)} for depth in DEPTHS}
PAPER_EASY_HARD = (1.78, 3.05)


def _trajectory() -> str:
    """The name of Ω's trajectory row (C_i per source layer)."""
    return registry.probe(PROBE_NAME).row("vector").name


def _document_confidences(run: Run, task: str, filter_key: str) -> dict[int, float]:
    """Each document's mean focal-depth confidence (the mean of its trajectory C_i), by ``doc_id``."""
    name = _trajectory()
    out = {}
    for sample in run.documents(task, filter_key):
        trajectory = sample.get(name)
        if isinstance(trajectory, list) and trajectory and all(isinstance(v, (int, float)) for v in trajectory):
            value = float(np.mean(trajectory))
            if math.isfinite(value):
                out[int(sample["doc_id"])] = value
    return out


def amplification_change(runs: Mapping[str, Run], task: str, filter_key: str) -> Measurement:
    """Mean over documents of (confidence at the deepest focal depth − at m = 0), paired by document, with a
    bootstrap CI."""
    shallow, deep = runs[f"m{DEPTHS[0]}"], runs[f"m{DEPTHS[-1]}"]
    low, high = _document_confidences(shallow, task, filter_key), _document_confidences(deep, task, filter_key)
    common = sorted(set(low) & set(high))
    if len(common) < 2:
        return Measurement(None, n_documents=len(common), note="fewer than 2 documents with both trajectories")
    change = np.array([high[d] - low[d] for d in common])
    resampled = change[deep.indices(len(change), task, filter_key)].mean(axis=1)
    return measured_with(float(change.mean()), percentile_ci(resampled, len(change)), len(change))


def omega_claims(runs: Mapping[str, Run], variant: Variant) -> list[Claim]:
    """The HyperLens claims from the four depth passes of ``variant`` (one task with a difficulty label)."""
    (task,) = variant.tasks
    key = variant.filter_key
    trajectory = _trajectory()
    rho, rho_partial = (row.name for row in registry.probe(PROBE_NAME).difficulty_rows()[:2])
    means = tuple(runs[f"m{depth}"].value(task, trajectory, key) for depth in DEPTHS)
    shown = tuple(math.nan if value is None else value for value in means)
    deep = runs[f"m{DEPTHS[-1]}"]
    n = len(deep.documents(task, key))
    depths = ", ".join(map(str, DEPTHS))
    easy, hard = PAPER_EASY_HARD
    return [
        Claim(f"mean focal-depth confidence at m = {depths} rises", None,
              Measurement(shown, n_documents=n, note=f"the {trajectory} row of each pass"), StrictlyIncreasing(),
              "rises with m"),
        Claim(f"confidence at m = {DEPTHS[-1]} − at m = 0, per document", None,
              amplification_change(runs, task, key), IntervalAbove(0.0), "> 0"),
        Claim(f"ρ(Ω, difficulty) at m = {DEPTHS[-1]}", None, row_measurement(deep, task, rho, key),
              IntervalAbove(0.0), f"> 0 (Qwen2.5-7B code: easy {easy}, hard {hard})"),
        Claim(f"ρ(Ω, difficulty) at m = {DEPTHS[-1]}, response length partialled out", None,
              row_measurement(deep, task, rho_partial, key), IntervalAbove(0.0), "> 0 (ρ is not length)"),
        Claim(f"mean Ω, hardest − easiest level at m = {DEPTHS[-1]}", hard - easy,
              level_gap(deep, task, rho, key), SameSign(), f"{easy:.2f} → {hard:.2f} ({hard - easy:+.2f})"),
    ]


PROTOCOL = ReproductionProtocol(
    name="omega",
    summary="HyperLens Ω: focal-depth confidence at m = 0, 1, 3, 5 (amplification) and Ω against difficulty",
    probe=PROBE_NAME,
    pretrained={"hf-probes": "Qwen/Qwen2.5-7B-Instruct"},
    default_model="hf-probes",
    model_args={"probes": PROBE_NAME},
    passes=PASSES,
    variants=(
        Variant("math500-ref", ("probes_math500_ref",), "none", "MATH-500 reference solutions teacher-forced, level 1–5"),
        Variant("proofwriter", ("probes_proofwriter",), "none", "ProofWriter multiple choice, depth 0–5"),
        Variant("stepgame", ("probes_stepgame",), "none", "StepGame multiple choice, hops 1–10"),
        Variant("synthetic", ("probes_synth_recall",), "none",
                "the synthetic recall task (offline, no data; the bundled models go from right to chance), people 1–5"),
    ),
    claims=omega_claims,
)
