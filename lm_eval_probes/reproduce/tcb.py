"""``reproduce tcb``: δ_TCB against its baselines ("Beyond Confidence: The Rhythms of Reasoning", arXiv 2602.10816).

The paper (Llama-3.1-8B, one next-token prediction per prompt): Pearson Corr(δ_TCB, √V_eff) = 0.95 and
Corr(δ_TCB, top-2 logit margin) = −0.40 on 309 diverse prompts; 0.08 and 0.62 on 360 low-V_eff prompts; and the
cluster/disperse ablation, δ_cluster > δ_orig > δ_disperse in 90 % of cases.

A **stand-in**: the paper's prompt sets are not in the plugin. Its documents are those of four of the plugin's
tasks (arithmetic and logic, synthetic and real, multiple choice: the prompts are diverse in form and length),
each document's values those of the response the task read (the chosen option; a single-token option is one
prediction, as in the paper; a longer one gives means over its positions), and the low-V_eff set is the third of
those documents with the smallest V_eff (the paper's selection is not stated: INFERRED). Per document: δ_TCB =
10^(mean log10 δ), V_eff = 1/Σo² and the top-1 − top-2 logit margin — the ``probes=tcb`` record fields
``tcb_log10_mean``, ``v_eff_ipr``, ``logit_margin`` on the in-memory responses (they are not rows, so the samples
files do not hold them). Pearson correlations with percentile-bootstrap CIs over documents. The ablation moves
rows of the unembedding, which needs each prediction's final state: not measured here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lm_eval_probes.declarations import PROBES_BY_NAME
from lm_eval_probes.reproduce.claims import Claim, Measurement, PaperInInterval
from lm_eval_probes.reproduce.protocol import MAIN, ReproductionProtocol, Variant
from lm_eval_probes.reproduce.statistics import Run, measured_with, percentile_ci

TCB = PROBES_BY_NAME["tcb"]
LOW_VEFF_FRACTION = 1 / 3
"""The low-V_eff set: this fraction of the documents, those with the smallest V_eff (INFERRED)."""
PAPER = {  # set: (Corr(δ, √V_eff), Corr(δ, margin), prompts)
    "diverse": (0.95, -0.40, 309),
    "low V_eff": (0.08, 0.62, 360),
}
PAPER_ABLATION = 0.90


def _values(sample: Mapping[str, Any]) -> tuple[float, float, float] | None:
    """(δ_TCB, √V_eff, logit margin) of the response the task read, or ``None`` when the record lacks them."""
    for response in sample.get("filtered_resps") or ():
        probe = getattr(response, "probe", None)
        if probe is None or probe.tcb_log10_mean is None or probe.v_eff_ipr is None or probe.logit_margin is None:
            continue
        values = (10.0 ** probe.tcb_log10_mean, math.sqrt(probe.v_eff_ipr), probe.logit_margin)
        if all(math.isfinite(v) for v in values):
            return values
    return None


def document_values(run: Run, tasks: Sequence[str], filter_key: str) -> np.ndarray:
    """``[n, 3]``: (δ_TCB, √V_eff, logit margin) of every document of ``tasks`` that has them, task by task."""
    rows = [values for task in tasks for sample in run.documents(task, filter_key)
            if (values := _values(sample)) is not None]
    return np.array(rows, dtype=float).reshape(-1, 3)


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float((x * x).sum() * (y * y).sum()))
    return float((x * y).sum() / denominator) if denominator > 0 else math.nan


def correlation(run: Run, values: np.ndarray, column: int, key: str, *, label: str, note: str) -> Measurement:
    """Pearson r of δ_TCB (column 0) with ``column``, with a bootstrap CI over the documents (resamples keyed by
    the model, ``label`` and the filter: both correlations of one set share them)."""
    if len(values) < 3:
        return Measurement(None, n_documents=len(values), note="fewer than 3 documents")
    r = _pearson(values[:, 0], values[:, column])
    resampled = np.array([_pearson(values[i, 0], values[i, column])
                          for i in run.indices(len(values), label, key)])
    return measured_with(r if math.isfinite(r) else None, percentile_ci(resampled, len(values)), len(values), note)


def tcb_claims(runs: Mapping[str, Run], variant: Variant) -> list[Claim]:
    """The δ_TCB paper's correlation claims from a run of ``variant``'s tasks (stand-in prompt sets)."""
    run, key = runs[MAIN], variant.filter_key
    diverse = document_values(run, variant.tasks, key)
    size = max(3, int(round(len(diverse) * LOW_VEFF_FRACTION)))
    low = diverse[np.argsort(diverse[:, 1], kind="stable")[:size]] if len(diverse) else diverse
    threshold = f"V_eff ≤ {low[-1, 1] ** 2:.3g}" if len(low) else "no documents"
    claims = []
    for name, values, note in (("diverse", diverse, f"all {len(diverse)} documents of {len(variant.tasks)} tasks"),
                               ("low V_eff", low, f"the {len(low)} with the smallest V_eff ({threshold})")):
        with_veff, with_margin, prompts = PAPER[name]
        claims.append(Claim(f"{name} prompts: Corr(δ_TCB, √V_eff)", with_veff,
                            correlation(run, values, 1, key, label=f"tcb {name}", note=note), PaperInInterval(),
                            f"{with_veff:.2f} ({prompts} prompts)"))
        claims.append(Claim(f"{name} prompts: Corr(δ_TCB, top-2 logit margin)", with_margin,
                            correlation(run, values, 2, key, label=f"tcb {name}", note=note), PaperInInterval(),
                            f"{with_margin:.2f} ({prompts} prompts)"))
    claims.append(Claim("ablation: δ_cluster > δ_orig > δ_disperse", PAPER_ABLATION,
                        Measurement(None, note="not measured: needs each prediction's final state and the unembedding"),
                        PaperInInterval(), "90 % of cases"))
    return claims


PROTOCOL = ReproductionProtocol(
    name="tcb",
    summary="δ_TCB against √V_eff and the top-2 logit margin on diverse and low-V_eff documents (a stand-in for "
            "the paper's prompt sets)",
    paper=TCB.paper,
    pretrained={"hf-probes": "meta-llama/Llama-3.1-8B"},
    default_model="hf-probes",
    model_args={"probes": TCB.name},
    variants=(Variant("stand-in", ("probes_synth_arith", "probes_synth_logic", "probes_proofwriter", "probes_stepgame"),
                      "none", "the plugin's multiple-choice tasks (synthetic arithmetic and logic, ProofWriter, "
                              "StepGame) as the diverse set, their lowest-V_eff third as the low-V_eff set"),),
    claims=tcb_claims,
)
