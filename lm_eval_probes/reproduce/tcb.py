"""``reproduce tcb``: δ_TCB against its baselines ("Beyond Confidence: The Rhythms of Reasoning", arXiv 2602.10816).

The paper (Llama-3.1-8B, one next-token prediction per prompt): Pearson Corr(δ_TCB, √V_eff) = 0.95 and
Corr(δ_TCB, top-2 logit margin) = −0.40 on 309 diverse prompts; 0.08 and 0.62 on 360 low-V_eff prompts; and the
cluster/disperse ablation (o held fixed, the competing tokens' embeddings moved toward or away from their centre):
δ_cluster > δ_orig > δ_disperse in 90 % of cases, 95 % when V_eff < 20.

The paper's prompt sets are not published. The default variant, ``next-token``, reads one greedy next-token
prediction per document of ``probes_next_token`` (prompts from seven sources, cut after a word, inside a word or
before the answer: the next token ranges from open to nearly determined); its low-V_eff set is the documents whose
V_eff is below the paper's own threshold of 20 (the paper's selection of its 360 prompts is not stated: INFERRED).
The variant ``stand-in`` reads the response of four multiple-choice tasks instead (a single-token option is one
prediction; a longer one gives means over its positions). Per document: δ_TCB = 10^(mean log10 δ), V_eff = 1/Σo², the
top-1 − top-2 logit margin and whether δ_cluster > δ > δ_disperse (``probe_tcb_ablation=0.5``: the competitors'
rows moved by ×0.5 and ×2; the paper's factor is not stated: INFERRED) — the ``probes=tcb`` record fields
``tcb_log10_mean``, ``v_eff_ipr``, ``logit_margin``, ``tcb_ablation_ordered`` on the in-memory responses. Pearson
correlations and the ordered fraction with percentile-bootstrap CIs over documents.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lm_eval_probes.reproduce.claims import Claim, Measurement, PaperInInterval
from lm_eval_probes.reproduce.protocol import MAIN, ReproductionProtocol, Variant
from lm_eval_probes.reproduce.statistics import Run, measured_with, percentile_ci

PROBE_NAME = "tcb"
"""The probe reproduced (its paper is the protocol's source, read from the registry)."""
LOW_VEFF = 20.0
"""The low-V_eff set: documents with V_eff below this (the paper's threshold for its ablation's low-V_eff row)."""
ABLATION_FACTOR = 0.5
"""``probe_tcb_ablation``: the competitors' rows are moved by ×0.5 (cluster) and ×2 (disperse); INFERRED."""
PAPER = {  # set: (Corr(δ, √V_eff), Corr(δ, margin), prompts, fraction ordered by the ablation)
    "diverse": (0.95, -0.40, 309, 0.90),
    "low V_eff": (0.08, 0.62, 360, 0.95),
}
COLUMNS = ("δ_TCB", "√V_eff", "logit margin", "ordered")


def _values(sample: Mapping[str, Any]) -> tuple[float, float, float, float] | None:
    """(δ_TCB, √V_eff, logit margin, fraction ordered by the ablation — NaN without it) of the response the task
    read, or ``None`` when the record lacks the first three."""
    for response in sample.get("filtered_resps") or ():
        probe = getattr(response, "probe", None)
        if probe is None or probe.get("tcb_log10_mean") is None or probe.get("v_eff_ipr") is None or probe.get("logit_margin") is None:
            continue
        values = (10.0 ** probe.get("tcb_log10_mean"), math.sqrt(probe.get("v_eff_ipr")), probe.get("logit_margin"))
        if all(math.isfinite(v) for v in values):
            ordered = probe.get("tcb_ablation_ordered")
            return (*values, math.nan if ordered is None else float(ordered))
    return None


def document_values(run: Run, tasks: Sequence[str], filter_key: str) -> np.ndarray:
    """``[n, 4]``: (δ_TCB, √V_eff, logit margin, ordered fraction) of every document of ``tasks`` that has the first
    three, task by task."""
    rows = [values for task in tasks for sample in run.documents(task, filter_key)
            if (values := _values(sample)) is not None]
    return np.array(rows, dtype=float).reshape(-1, len(COLUMNS))


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float((x * x).sum() * (y * y).sum()))
    return float((x * y).sum() / denominator) if denominator > 0 else math.nan


def correlation(run: Run, values: np.ndarray, column: int, key: str, *, label: str, note: str) -> Measurement:
    """Pearson r of δ_TCB (column 0) with ``column``, with a bootstrap CI over the documents (resamples keyed by
    the model, ``label`` and the filter: both correlations of one set share them)."""
    if len(values) < 3:
        return Measurement(None, n_documents=len(values), note=f"{note}; fewer than 3 documents")
    r = _pearson(values[:, 0], values[:, column])
    resampled = np.array([_pearson(values[i, 0], values[i, column])
                          for i in run.indices(len(values), label, key)])
    return measured_with(r if math.isfinite(r) else None, percentile_ci(resampled, len(values)), len(values), note)


def ordered_fraction(run: Run, values: np.ndarray, key: str, *, label: str, note: str) -> Measurement:
    """The mean over documents of the fraction of their positions where δ_cluster > δ > δ_disperse (one position
    per document: the fraction of cases), with a bootstrap CI."""
    ordered = values[:, 3][np.isfinite(values[:, 3])] if len(values) else values
    if len(ordered) == 0:
        return Measurement(None, n_documents=0, note=f"{note}; no ablation values (probe_tcb_ablation unset?)")
    resampled = np.array([ordered[i].mean() for i in run.indices(len(ordered), label, key)])
    return measured_with(float(ordered.mean()), percentile_ci(resampled, len(ordered)), len(ordered), note)


def tcb_claims(runs: Mapping[str, Run], variant: Variant) -> list[Claim]:
    """The δ_TCB paper's claims from a run of ``variant``'s tasks: the correlations on all documents and on the
    low-V_eff ones, and the ablation's ordered fraction on each."""
    run, key = runs[MAIN], variant.filter_key
    diverse = document_values(run, variant.tasks, key)
    low = diverse[diverse[:, 1] ** 2 < LOW_VEFF] if len(diverse) else diverse
    claims = []
    for name, values, note in (("diverse", diverse, f"all {len(diverse)} documents of {', '.join(variant.tasks)}"),
                               ("low V_eff", low, f"the {len(low)} of them with V_eff < {LOW_VEFF:g}")):
        with_veff, with_margin, prompts, ordered = PAPER[name]
        claims.append(Claim(f"{name} prompts: Corr(δ_TCB, √V_eff)", with_veff,
                            correlation(run, values, 1, key, label=f"tcb {name}", note=note), PaperInInterval(),
                            f"{with_veff:.2f} ({prompts} prompts)"))
        claims.append(Claim(f"{name} prompts: Corr(δ_TCB, top-2 logit margin)", with_margin,
                            correlation(run, values, 2, key, label=f"tcb {name}", note=note), PaperInInterval(),
                            f"{with_margin:.2f} ({prompts} prompts)"))
        claims.append(Claim(f"{name} prompts: ablation δ_cluster > δ_orig > δ_disperse (×{ABLATION_FACTOR:g} / "
                            f"×{1 / ABLATION_FACTOR:g}), fraction", ordered,
                            ordered_fraction(run, values, key, label=f"tcb ablation {name}", note=note),
                            PaperInInterval(), f"{ordered:.0%} of cases"))
    return claims


PROTOCOL = ReproductionProtocol(
    name="tcb",
    summary="δ_TCB against √V_eff and the top-2 logit margin on diverse and low-V_eff next-token predictions, and "
            "the cluster/disperse ablation (stand-in prompt sets: the paper's are not published)",
    probe=PROBE_NAME,
    pretrained={"hf-probes": "meta-llama/Llama-3.1-8B"},
    default_model="hf-probes",
    model_args={"probes": PROBE_NAME, "probe_tcb_ablation": f"{ABLATION_FACTOR:g}"},
    variants=(
        Variant("next-token", ("probes_next_token",), "none",
                "one greedy next token per prompt (probes_next_token: GSM8K, MATH-500, ProofWriter, StepGame and "
                "synthetic texts cut after a word, inside a word or before the answer); low V_eff: V_eff < 20"),
        Variant("stand-in", ("probes_synth_arith", "probes_synth_logic", "probes_proofwriter", "probes_stepgame"),
                "none", "the chosen option of four multiple-choice tasks (synthetic arithmetic and logic, ProofWriter, "
                        "StepGame); low V_eff: V_eff < 20"),
    ),
    claims=tcb_claims,
)
