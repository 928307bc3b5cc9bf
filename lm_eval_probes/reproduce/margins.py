"""``reproduce margins``: the log-barrier experiment of "Support Tokens, Stability Margins, …" (arXiv 2602.22271),
its claims read from its engine's report.

The engine is :mod:`lm_eval_probes.reproduce.margins_engine` (a character-level GPT whose first attention layer is
the embedding-level prior, trained CE-only and CE + λ · log-barrier at each λ on the same batches, per seed; BPC on
held-out text with Gaussian noise σ on the embeddings). It trains models rather than evaluating one through
``lm_eval``: ``lm-eval-probes reproduce margins --data FILE`` (or ``--quick``) runs it and reads its report,
``--engine_output DIR`` reads the ``repro.json`` of an earlier run (``benchmarks/support_tokens_repro.py`` writes the
same). Torch-free at import: :func:`run_engine` imports the engine when it runs it.

With two or more seeds the two differences (the barrier's relative clean cost, its degradation gap) are the mean over
seeds of each seed's barrier − CE-only difference (the same seed: the same initialisation, batches and noise), with
a 95 % t-interval over those paired differences (:func:`seed_interval`); with one seed they are that seed's, and in a
report without ``per_seed`` (written before the engine kept them) the seed-averaged BPCs', both without an interval.

The paper (SmallGPT, WikiText-2): clean BPC 2.168 (CE only) vs 2.198 (barrier, ≈ 1.4 % worse); degradation
BPC(σ = 0.5) / BPC(0) 2.68× vs 2.56×; a U-shaped curve over λ with the best near 0.05.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from lm_eval_probes.reproduce.claims import AbsAtMost, Claim, InteriorMinimum, Measurement, SameSign
from lm_eval_probes.reproduce.runner import ReproduceError

PAPER_CLEAN_BPC = (2.168, 2.198)
PAPER_DEGRADATION = (2.68, 2.56)
PAPER_LAMBDA = 0.05
CLEAN_COST_BOUND = 0.05
"""The barrier's clean cost agrees when it is at most this, relative (the paper: +1.4 %)."""
LEVEL = 0.95
"""The level of the intervals over seeds."""


def _bpc(result: Mapping[str, Any]) -> dict[float, float]:
    """``{σ: BPC}`` of one λ's result or one seed's (JSON keys are strings)."""
    return {float(sigma): float(value) for sigma, value in result["bpc"].items()}


def _seed_curves(result: Mapping[str, Any], seeds: Sequence[int]) -> dict[int, dict[float, float]]:
    """``{seed: {σ: BPC}}`` from a result's ``per_seed`` (empty without it). Each entry names its ``seed``; reports
    written before they did list them in the order of the report's ``seeds``."""
    per_seed = result.get("per_seed") or []
    if all("seed" in entry for entry in per_seed):
        return {int(entry["seed"]): _bpc(entry) for entry in per_seed}
    if len(per_seed) != len(seeds):
        raise ValueError(f"{len(per_seed)} per-seed results for {len(seeds)} seeds")
    return {seed: _bpc(entry) for seed, entry in zip(seeds, per_seed)}


def seed_interval(differences: Sequence[float], *, level: float = LEVEL) -> tuple[float, float] | None:
    """Student-t interval of the mean of per-seed paired differences: mean ± t_{(1 + level)/2, n − 1} · s / √n
    (s: the sample standard deviation, ddof 1), treating the seeds as independent replications.

    Returns:
        ``(low, high)``; ``None`` with fewer than two differences; ``(mean, mean)`` when they are all equal.

    Raises:
        ValueError: a level outside (0, 1) or a non-finite difference.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    values = np.asarray(differences, dtype=float)
    if not np.isfinite(values).all():
        raise ValueError(f"differences must be finite, got {list(differences)}")
    if values.size < 2:
        return None
    mean = float(values.mean())
    half = float(stats.t.ppf((1 + level) / 2, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size))
    return mean - half, mean + half


def _difference(per_seed: Sequence[float], averaged: float, *, n_seeds: int, read: str) -> Measurement:
    """A barrier − CE-only difference: the mean of the per-seed differences with their t-interval when there are
    any, else the difference of the seed-averaged BPCs; the note starts with ``read`` and says which."""
    if not per_seed:
        how = f"{n_seeds} seed(s) averaged by the engine, no per-seed values: no CI" if n_seeds else "no CI"
        return Measurement(averaged, note=f"{read}; {how}")
    interval = seed_interval(per_seed)
    if interval is None:
        return Measurement(per_seed[0], note=f"{read}; 1 seed: no CI")
    how = (f"mean over {len(per_seed)} seeds of each seed's barrier − CE only (same seed); 95 % t-interval over "
           f"those {len(per_seed)} paired differences")
    return Measurement(float(np.mean(per_seed)), *interval, note=f"{read}; {how}")


def margins_claims(report: Mapping[str, Any]) -> list[Claim]:
    """The paper's claims from the engine's report (``repro.json``: ``sigmas``, ``seeds`` and ``results``, one per
    λ with ``weight`` (0 = CE only), ``bpc`` per σ averaged over seeds and, in reports that keep them, ``per_seed``:
    each seed's ``bpc``).

    Claims: the barrier's relative clean-BPC cost BPC_λ(0) / BPC_CE(0) − 1 (|cost| ≤ 5 %, decided on the estimate;
    the interval is shown), its degradation gap BPC_λ(σ_max)/BPC_λ(0) − BPC_CE(σ_max)/BPC_CE(0) (the paper's sign,
    the interval clear of 0 where there is one), both at the λ nearest 0.05; and the degradation over λ, lowest
    strictly inside the range. With per-seed values, the differences are the mean over seeds of each seed's paired
    difference with a 95 % t-interval over seeds (two or more), and each λ's degradation is the mean of its seeds'.

    Raises:
        ReproduceError: a report without a CE-only result and at least one barrier weight, or without σ = 0.
        ValueError: ``per_seed`` lists that do not match the report's seeds.
    """
    results = sorted(report.get("results", ()), key=lambda r: float(r["weight"]))
    if len(results) < 2 or float(results[0]["weight"]) != 0.0:
        raise ReproduceError("the engine's report needs a CE-only result (weight 0) and at least one barrier weight")
    sigmas = sorted(float(s) for s in report.get("sigmas", ()))
    if not sigmas or sigmas[0] != 0.0:
        raise ReproduceError(f"the engine's report needs σ = 0 among its sigmas, got {sigmas}")
    top = sigmas[-1]
    seeds = [int(seed) for seed in report.get("seeds", ())]
    weights = [float(r["weight"]) for r in results]
    averaged = {float(r["weight"]): _bpc(r) for r in results}
    per_seed = {float(r["weight"]): _seed_curves(r, seeds) for r in results}
    seed_clean = {w: {s: bpc[0.0] for s, bpc in curves.items()} for w, curves in per_seed.items()}
    seed_degradation = {w: {s: bpc[top] / bpc[0.0] for s, bpc in curves.items()} for w, curves in per_seed.items()}
    degradation = [float(np.mean(list(seed_degradation[w].values()))) if seed_degradation[w]
                   else averaged[w][top] / averaged[w][0.0] for w in weights]
    barrier = min(weights[1:], key=lambda w: abs(w - PAPER_LAMBDA))  # the λ nearest the paper's
    base, chosen = averaged[0.0], averaged[barrier]
    paired = sorted(set(per_seed[barrier]) & set(per_seed[0.0]))  # the seeds both were trained with
    cost = _difference([seed_clean[barrier][s] / seed_clean[0.0][s] - 1.0 for s in paired],
                       chosen[0.0] / base[0.0] - 1.0, n_seeds=len(seeds),
                       read=f"BPC {base[0.0]:.3f} → {chosen[0.0]:.3f} (means over seeds)")
    gap = _difference([seed_degradation[barrier][s] - seed_degradation[0.0][s] for s in paired],
                      degradation[weights.index(barrier)] - degradation[0], n_seeds=len(seeds),
                      read=f"{degradation[0]:.3f}× → {degradation[weights.index(barrier)]:.3f}×")
    paper_cost = PAPER_CLEAN_BPC[1] / PAPER_CLEAN_BPC[0] - 1.0
    listed = ", ".join(f"{w:g}" for w in weights)
    lowest = f"lowest at λ = {weights[int(np.argmin(degradation))]:g}"
    if len(seeds) > 1 and all(seed_degradation.values()):
        lowest += f"; each λ's degradation is the mean over its {len(seeds)} seeds"
    return [
        Claim(f"clean BPC cost of the barrier (λ = {barrier:g}), relative", paper_cost,
              dataclasses.replace(cost, note=f"{cost.note}; the rule reads the estimate (the interval is shown, not used)"),
              AbsAtMost(CLEAN_COST_BOUND), f"{PAPER_CLEAN_BPC[0]:.3f} → {PAPER_CLEAN_BPC[1]:.3f} ({paper_cost:+.1%})"),
        Claim(f"degradation BPC(σ = {top:g}) / BPC(0): barrier (λ = {barrier:g}) − CE only",
              PAPER_DEGRADATION[1] - PAPER_DEGRADATION[0], gap,
              SameSign(), f"{PAPER_DEGRADATION[0]:.2f}× → {PAPER_DEGRADATION[1]:.2f}×"),
        Claim(f"degradation over λ = {listed} is U-shaped (best inside the range)", None,
              Measurement(tuple(degradation), note=lowest), InteriorMinimum(), f"U, best near λ = {PAPER_LAMBDA:g}"),
    ]


def read_engine_output(path: str | Path) -> dict[str, Any]:
    """The engine's ``repro.json`` (a folder holding it, or the file).

    Raises:
        ReproduceError: no such file, or not JSON.
    """
    path = Path(path)
    path = path / "repro.json" if path.is_dir() else path
    if not path.is_file():
        raise ReproduceError(f"no engine output at {path}: lm-eval-probes reproduce margins --data FILE (or --quick) "
                             "runs the engine")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ReproduceError(f"{path} is not JSON: {error}") from None


def engine_header(report: Mapping[str, Any], path: str | Path) -> dict[str, Any]:
    """What the table's header says about the engine's run (``engine``: the module that wrote the report; reports
    written before the engine moved into the package name the script)."""
    return {"protocol": "margins", "paper": "Stability margins: \"Support Tokens, Stability Margins, and a New "
            "Foundation for Robust LLMs\" (arXiv 2602.22271)", "engine": report.get("engine", "benchmarks/support_tokens_repro.py"),
            "engine_output": str(path), "data": report.get("data"), "size": report.get("size"),
            "seeds": report.get("seeds"), "sigmas": report.get("sigmas"),
            "weights": [r.get("weight") for r in report.get("results", ())]}


def run_engine(out: str | Path, *, data: str | Path | None = None, quick: bool = False, lambdas: str | None = None,
               sigmas: str | None = None, seeds: str | None = None, steps: int | None = None,
               threads: int | None = None) -> Path:
    """Run the engine (:mod:`lm_eval_probes.reproduce.margins_engine`) and write its report into ``out``.

    Args:
        out: the folder for ``repro.json``, ``repro.md`` and ``repro.png``.
        data: a plain-text file (UTF-8); ``None``: the offline synthetic corpus.
        quick: the tiny size (:data:`~lm_eval_probes.reproduce.margins_engine.QUICK`) instead of the default.
        lambdas, sigmas, seeds: comma-separated lists (``None``: 0.02,0.05,0.1; 0,0.1,…,0.5; 0).
        steps: training steps per model (``None``: the size's).
        threads: torch CPU threads for the run (``None``: as they are; restored afterwards).

    Returns:
        The path of ``repro.json``.

    Raises:
        ReproduceError: options the engine rejects, or a corpus it cannot read or split (nothing is trained).
    """
    from lm_eval_probes.reproduce import margins_engine as engine

    if threads is not None and threads < 1:
        raise ReproduceError(f"--threads must be >= 1, got {threads}")
    try:
        settings = engine.EngineSettings.from_options(quick=quick, lambdas=lambdas, sigmas=sigmas, seeds=seeds,
                                                      steps=steps)
        corpus = engine.load_corpus(data, context=settings.size.context)
    except ValueError as error:
        raise ReproduceError(str(error)) from None
    with engine.torch_threads(threads):
        report = engine.run_engine(corpus, settings, log_every=0 if quick else 100)
    return engine.write_report(report, out)[1]
