"""Pure probe math on tensors and arrays (torch / numpy / scipy / scikit-learn only; no transformers, no lm_eval).

One module per method: :mod:`.tcb` (Token Constraint Bound), :mod:`.bte` (Belief-Trajectory
Energy), :mod:`.omega` (HyperLens refinement area Ω), :mod:`.margin` (stability margins and support tokens), :mod:`.confidence` (output confidence of a response), :mod:`.calibration` (ECE, selective
AUROC, AURC, temperature scaling), :mod:`.reader` (the latent correctness reader / corruption
detector), :mod:`.correlation` (Spearman and partial Spearman ρ with difficulty) and :mod:`.attribution`
(detection / attribution classifiers on BTE's trajectory readouts).

Importing this package has no side effects and imports nothing heavy: each name loads its module on
first access, so the numpy-only modules (calibration, reader, correlation) work without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_SOURCES: dict[str, str] = {
    "AttributionResult": "attribution",
    "attribution_accuracy": "attribution",
    "profile_vs_features": "attribution",
    "TRANSITION_STATISTIC_NAMES": "bte",
    "belief_trajectory_energy": "bte",
    "central_window": "bte",
    "central_window_energy": "bte",
    "consecutive_js_divergences": "bte",
    "consecutive_js_divergences_of_logits": "bte",
    "depth_profile": "bte",
    "js_divergence": "bte",
    "transition_statistics": "bte",
    "ReliabilityDiagram": "calibration",
    "accuracy_at_coverage_score": "calibration",
    "aurc_error": "calibration",
    "binary_nll_loss": "calibration",
    "coverage_accuracy_area_score": "calibration",
    "prediction_rejection_ratio_score": "calibration",
    "expected_calibration_error": "calibration",
    "fit_temperature": "calibration",
    "out_of_fold_temperature_scale": "calibration",
    "reliability_diagram": "calibration",
    "risk_coverage_curve": "calibration",
    "selective_auroc_score": "calibration",
    "temperature_scale": "calibration",
    "chosen_option_confidence": "confidence",
    "geometric_mean_probability": "confidence",
    "option_probabilities": "confidence",
    "finite_rows": "correlation",
    "partial_spearman_score": "correlation",
    "spearman_score": "correlation",
    "ReaderScores": "reader",
    "reader_auroc_score": "reader",
    "reader_scores": "reader",
    "RowBlocks": "row_blocks",
    "attention_covariance": "margin",
    "head_margins": "margin",
    "layer_margins": "margin",
    "margin_dtype": "margin",
    "prefix_attention_weights": "margin",
    "prior_jacobian": "margin",
    "prior_margins": "margin",
    "prior_margins_direct": "margin",
    "rotate_half": "margin",
    "scalar_prior_jacobian": "margin",
    "support_tokens": "margin",
    "confidence_trajectory": "omega",
    "refinement_area": "omega",
    "top_k_mass": "omega",
    "JacobianTerms": "tcb",
    "PredictionBaselines": "tcb",
    "TcbReadout": "tcb",
    "distribution_baselines": "tcb",
    "squared_row_norms": "tcb",
    "tcb_competitor_moves": "tcb",
    "tcb_readout": "tcb",
    "tcb_with_baselines": "tcb",
    "token_constraint_bound": "tcb",
}
"""Public name → the module that defines it."""

__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SOURCES))
