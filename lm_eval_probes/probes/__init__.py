"""The built-in probes, one folder each, and the math they share (torch / numpy / scipy / scikit-learn only; no
transformers, no lm_eval).

One folder per method, each with its declaration (``probe.py``: the :class:`~lm_eval_probes.api.Probe` exported as
``PROBE``, written with the public API of :mod:`lm_eval_probes.api` only, as a third-party probe is; loading it imports
no torch) and its math (``math.py``, pure functions on tensors): :mod:`.tcb` (Token Constraint Bound), :mod:`.bte`
(Belief-Trajectory Energy), :mod:`.omega` (HyperLens refinement area Ω), :mod:`.margin` (stability margins and support
tokens), :mod:`.reader` (the latent correctness reader / corruption detector). Beside them: :mod:`.confidence` (output
confidence of a response), :mod:`.calibration` (ECE, selective AUROC, AURC, temperature scaling), :mod:`.correlation`
(Spearman and partial Spearman ρ with difficulty), :mod:`.attribution` (detection / attribution classifiers on BTE's
trajectory readouts) and :mod:`.row_blocks`.

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
    "TRANSITION_STATISTIC_NAMES": "bte.math",
    "belief_trajectory_energy": "bte.math",
    "central_window": "bte.math",
    "central_window_energy": "bte.math",
    "consecutive_js_divergences": "bte.math",
    "consecutive_js_divergences_of_logits": "bte.math",
    "depth_profile": "bte.math",
    "js_divergence": "bte.math",
    "transition_statistics": "bte.math",
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
    "ReaderScores": "reader.math",
    "reader_auroc_score": "reader.math",
    "reader_scores": "reader.math",
    "RowBlocks": "row_blocks",
    "attention_covariance": "margin.math",
    "head_margins": "margin.math",
    "layer_margins": "margin.math",
    "margin_dtype": "margin.math",
    "prefix_attention_weights": "margin.math",
    "prior_jacobian": "margin.math",
    "prior_margins": "margin.math",
    "prior_margins_direct": "margin.math",
    "rotate_half": "margin.math",
    "scalar_prior_jacobian": "margin.math",
    "support_tokens": "margin.math",
    "confidence_trajectory": "omega.math",
    "refinement_area": "omega.math",
    "top_k_mass": "omega.math",
    "JacobianTerms": "tcb.math",
    "PredictionBaselines": "tcb.math",
    "TcbReadout": "tcb.math",
    "distribution_baselines": "tcb.math",
    "squared_row_norms": "tcb.math",
    "tcb_competitor_moves": "tcb.math",
    "tcb_readout": "tcb.math",
    "tcb_with_baselines": "tcb.math",
    "token_constraint_bound": "tcb.math",
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
