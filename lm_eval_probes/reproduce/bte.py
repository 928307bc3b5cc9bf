"""``reproduce bte``: Belief-Trajectory Energy tracks difficulty ("Measuring the Path to a Prediction", 2026).

The paper (Llama-3.1-8B-Instruct scoring each reference solution teacher-forced after its problem): Spearman ρ of
ē_M with difficulty on MATH-500 0.44 [0.37, 0.51] (the problem statement alone teacher-forced: 0.36,
``probes_math500_problem``), ProofWriter depth 0.33 [0.26, 0.40],
StepGame hops 0.65; MATH-500 level means of ē_M rising 0.161, 0.165, 0.167, 0.169, 0.173; a classifier of the
benchmark a document came from at 86.4 % with the L-dim depth profile and 93.2 % with the 11·L transition
statistics.

Every number is read from the run's rows and samples: ``bte_spearman`` and ``bte_spearman_partial`` (ρ with the
response length partialled out) from the results with the report's bootstrap CI over their ``[ē_M, difficulty]``
records, the level means from the same records, and the attribution classifier
(:func:`lm_eval_probes.probes.attribution.profile_vs_features`) on the ``bte_profile`` samples and the records'
``bte_features`` (``probe_bte_features=1``; they ride on the responses of the in-memory samples, not in the
samples files).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lm_eval_probes import registry
from lm_eval_probes.reproduce.claims import (
    Claim,
    IntervalAbove,
    Measurement,
    PaperInInterval,
    SameSign,
    StrictlyIncreasing,
)
from lm_eval_probes.reproduce.protocol import MAIN, ReproductionProtocol, Variant
from lm_eval_probes.reproduce.statistics import Run, level_means, row_measurement

PROBE_NAME = "bte"
"""The probe reproduced; its rows (ρ, ρ partialled, the depth profile) are read from the registry when the claims
are."""

MATH500, PROOFWRITER, STEPGAME = "probes_math500_ref", "probes_proofwriter", "probes_stepgame"
MATH500_PROBLEM = "probes_math500_problem"
"""The problem statements alone, teacher-forced (the paper's problem-only ρ 0.36)."""

PAPER_RHO: dict[str, tuple[str, float, tuple[float, float] | None]] = {
    MATH500: ("MATH-500 reference solutions: ρ(ē_M, level)", 0.44, (0.37, 0.51)),
    PROOFWRITER: ("ProofWriter: ρ(ē_M, depth)", 0.33, (0.26, 0.40)),
    STEPGAME: ("StepGame: ρ(ē_M, hops)", 0.65, None),
}
PAPER_LEVEL_MEANS = (0.161, 0.165, 0.167, 0.169, 0.173)
PAPER_ATTRIBUTION = (0.864, 0.932)
ATTRIBUTION_FOLDS = 5


def _record_features(sample: Mapping[str, Any]) -> tuple[float, ...] | None:
    """The 11·L transition statistics of the response the task read (a multiple-choice document's chosen option:
    the only one that went through the lens)."""
    for response in sample.get("filtered_resps") or ():
        probe = getattr(response, "probe", None)
        if probe is not None and probe.get("bte_features") is not None:
            return tuple(probe.get("bte_features"))
    return None


def attribution_claim(run: Run, tasks: Sequence[str], filter_key: str, *, seed: int = 0) -> Claim:
    """The paper's attribution classifier: which benchmark a document came from, from its L-dim depth profile vs
    its 11·L transition statistics (same documents, same folds); the claim is the gain of the latter."""
    from lm_eval_probes.probes.attribution import profile_vs_features

    profile_row = registry.probe(PROBE_NAME).row("vector").name
    profiles, features, labels = [], [], []
    for task in tasks:
        for sample in run.documents(task, filter_key):
            profile, stats = sample.get(profile_row), _record_features(sample)
            if isinstance(profile, list) and profile and stats is not None:
                profiles.append(profile)
                features.append(stats)
                labels.append(task)
    text = "benchmark attribution: accuracy of 11·L transition statistics − L-dim profile"
    paper_text = f"{PAPER_ATTRIBUTION[0]:.3f} → {PAPER_ATTRIBUTION[1]:.3f}"
    gain = PAPER_ATTRIBUTION[1] - PAPER_ATTRIBUTION[0]
    try:
        result = profile_vs_features(profiles, features, labels, folds=ATTRIBUTION_FOLDS, seed=seed)
    except ValueError as error:
        return Claim(text, gain, Measurement(None, n_documents=len(labels), note=f"not measured: {error}"), SameSign(),
                     paper_text)
    profile, stats = result["profile"], result["features"]
    note = (f"profile {profile.accuracy:.3f} ({profile.n_features} features) → statistics {stats.accuracy:.3f} "
            f"({stats.n_features}); chance {profile.chance:.3f}; {len(set(labels))} benchmarks, {ATTRIBUTION_FOLDS}-fold")
    return Claim(text, gain, Measurement(stats.accuracy - profile.accuracy, n_documents=len(labels), note=note),
                 SameSign(), paper_text)


def bte_claims(runs: Mapping[str, Run], variant: Variant) -> list[Claim]:
    """The BTE paper's claims from a run of ``variant`` (tasks MATH-500 reference and problem only, ProofWriter,
    StepGame; the attribution classifier tells the three benchmarks apart)."""
    run = runs[MAIN]
    key = variant.filter_key
    rho, rho_partial = (row.name for row in registry.probe(PROBE_NAME).difficulty_rows()[:2])
    claims: list[Claim] = []
    benchmarks = [task for task in variant.tasks if task in PAPER_RHO]
    for task in benchmarks:
        text, value, interval = PAPER_RHO[task]
        paper_text = f"{value:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else f"{value:.2f}"
        claims.append(Claim(text, value, row_measurement(run, task, rho, key), PaperInInterval(), paper_text))
        claims.append(Claim(f"{text}, response length partialled out", None,
                            row_measurement(run, task, rho_partial, key), IntervalAbove(0.0),
                            "— (> 0: ρ is not length)"))
        if task == MATH500:
            problem = (row_measurement(run, MATH500_PROBLEM, rho, key) if MATH500_PROBLEM in variant.tasks
                       else Measurement(None, note=f"not measured: {MATH500_PROBLEM} was not run"))
            claims.append(Claim("MATH-500 problem statements alone: ρ(ē_M, level)", 0.36, problem, PaperInInterval()))
            claims.append(Claim("MATH-500: mean ē_M per level 1–5 rises", PAPER_LEVEL_MEANS,
                                level_means(run, task, rho, key), StrictlyIncreasing()))
    claims.append(attribution_claim(run, benchmarks, key, seed=run.seed))
    return claims


PROTOCOL = ReproductionProtocol(
    name="bte",
    summary="BTE ē_M against difficulty (MATH-500 level, ProofWriter depth, StepGame hops), level means, "
            "the profile-vs-statistics attribution classifier",
    probe=PROBE_NAME,
    pretrained={"hf-probes": "meta-llama/Llama-3.1-8B-Instruct"},
    default_model="hf-probes",
    model_args={"probes": PROBE_NAME, "probe_bte_profile": "full", "probe_bte_features": "1"},
    variants=(Variant("paper", (MATH500, MATH500_PROBLEM, PROOFWRITER, STEPGAME), "none",
                      "MATH-500 reference solutions and problem statements teacher-forced, ProofWriter and StepGame "
                      "multiple choice"),),
    claims=bte_claims,
)
