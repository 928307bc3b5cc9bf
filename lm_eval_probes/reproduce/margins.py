"""``reproduce margins``: the log-barrier experiment of "Support Tokens, Stability Margins, …" (arXiv 2602.22271),
read from its engine's output.

The engine is ``benchmarks/support_tokens_repro.py`` (a character-level GPT whose first attention layer is the
embedding-level prior, trained CE-only and CE + λ · log-barrier at each λ on the same batches; BPC on held-out text
with Gaussian noise σ on the embeddings). It trains models rather than evaluating one through ``lm_eval``, so this
protocol reads the ``repro.json`` the script writes (``lm-eval-probes reproduce margins --engine_output
DIR/repro.json``); moving the script's loop into the package, so that the command also runs it, is the next step
(docs/reproduce.md).

The paper (SmallGPT, WikiText-2): clean BPC 2.168 (CE only) vs 2.198 (barrier, ≈ 1.4 % worse); degradation
BPC(σ = 0.5) / BPC(0) 2.68× vs 2.56×; a U-shaped curve over λ with the best near 0.05.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lm_eval_probes.reproduce.claims import AbsAtMost, Claim, InteriorMinimum, Measurement, SameSign
from lm_eval_probes.reproduce.runner import ReproduceError

PAPER_CLEAN_BPC = (2.168, 2.198)
PAPER_DEGRADATION = (2.68, 2.56)
PAPER_LAMBDA = 0.05
CLEAN_COST_BOUND = 0.05
"""The barrier's clean cost agrees when it is at most this, relative (the paper: +1.4 %)."""


def _bpc(result: Mapping[str, Any]) -> dict[float, float]:
    """``{σ: BPC}`` of one λ's result (JSON keys are strings)."""
    return {float(sigma): float(value) for sigma, value in result["bpc"].items()}


def margins_claims(report: Mapping[str, Any]) -> list[Claim]:
    """The paper's claims from the engine's report (``repro.json``: ``sigmas``, ``seeds`` and ``results``, one per
    λ with ``weight`` (0 = CE only) and ``bpc`` per σ, averaged over seeds).

    Raises:
        ReproduceError: a report without a CE-only result and at least one barrier weight, or without σ = 0.
    """
    results = sorted(report.get("results", ()), key=lambda r: float(r["weight"]))
    if len(results) < 2 or float(results[0]["weight"]) != 0.0:
        raise ReproduceError("the engine's report needs a CE-only result (weight 0) and at least one barrier weight")
    sigmas = sorted(float(s) for s in report.get("sigmas", ()))
    if not sigmas or sigmas[0] != 0.0:
        raise ReproduceError(f"the engine's report needs σ = 0 among its sigmas, got {sigmas}")
    top = sigmas[-1]
    curves = [(float(r["weight"]), _bpc(r)) for r in results]
    degradation = [(weight, bpc[top] / bpc[0.0]) for weight, bpc in curves]
    barrier = min(curves[1:], key=lambda wc: abs(wc[0] - PAPER_LAMBDA))  # the λ nearest the paper's
    base = curves[0][1]
    n_seeds = len(report.get("seeds", ())) or None
    seeds_note = f"{n_seeds} seed(s), no CI" if n_seeds else "no CI"
    clean_cost = barrier[1][0.0] / base[0.0] - 1.0
    paper_cost = PAPER_CLEAN_BPC[1] / PAPER_CLEAN_BPC[0] - 1.0
    degradation_gap = dict(degradation)[barrier[0]] - degradation[0][1]
    weights = ", ".join(f"{w:g}" for w, _ in degradation)
    return [
        Claim(f"clean BPC cost of the barrier (λ = {barrier[0]:g}), relative", paper_cost,
              Measurement(clean_cost, n_documents=None, note=f"BPC {base[0.0]:.3f} → {barrier[1][0.0]:.3f}; {seeds_note}"),
              AbsAtMost(CLEAN_COST_BOUND), f"{PAPER_CLEAN_BPC[0]:.3f} → {PAPER_CLEAN_BPC[1]:.3f} ({paper_cost:+.1%})"),
        Claim(f"degradation BPC(σ = {top:g}) / BPC(0): barrier (λ = {barrier[0]:g}) − CE only",
              PAPER_DEGRADATION[1] - PAPER_DEGRADATION[0],
              Measurement(degradation_gap, note=f"{degradation[0][1]:.3f}× → {dict(degradation)[barrier[0]]:.3f}×; "
                                                f"{seeds_note}"),
              SameSign(), f"{PAPER_DEGRADATION[0]:.2f}× → {PAPER_DEGRADATION[1]:.2f}×"),
        Claim(f"degradation over λ = {weights} is U-shaped (best inside the range)", None,
              Measurement(tuple(value for _, value in degradation),
                          note=f"lowest at λ = {min(degradation, key=lambda wd: wd[1])[0]:g}"),
              InteriorMinimum(), f"U, best near λ = {PAPER_LAMBDA:g}"),
    ]


def read_engine_output(path: str | Path) -> dict[str, Any]:
    """The engine's ``repro.json`` (a folder holding it, or the file).

    Raises:
        ReproduceError: no such file, or not JSON.
    """
    path = Path(path)
    path = path / "repro.json" if path.is_dir() else path
    if not path.is_file():
        raise ReproduceError(f"no engine output at {path}: run python benchmarks/support_tokens_repro.py --data FILE "
                             "(or --quick) first")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ReproduceError(f"{path} is not JSON: {error}") from None


def engine_header(report: Mapping[str, Any], path: str | Path) -> dict[str, Any]:
    """What the table's header says about the engine's run."""
    return {"protocol": "margins", "paper": "Stability margins: \"Support Tokens, Stability Margins, and a New "
            "Foundation for Robust LLMs\" (arXiv 2602.22271)", "engine": "benchmarks/support_tokens_repro.py",
            "engine_output": str(path), "data": report.get("data"), "size": report.get("size"),
            "seeds": report.get("seeds"), "sigmas": report.get("sigmas"),
            "weights": [r.get("weight") for r in report.get("results", ())]}

