"""Pure probe math on tensors and arrays (torch / numpy / scipy / scikit-learn only; no transformers, no lm_eval).

One module per method: :mod:`.tcb` (Token Constraint Bound), :mod:`.bte` (Belief-Trajectory
Energy), :mod:`.confidence` (output confidence of a response), :mod:`.calibration` (ECE, selective
AUROC, AURC, temperature scaling) and :mod:`.reader` (the latent correctness reader / corruption detector).
"""

from .bte import (
    TRANSITION_STATISTIC_NAMES,
    belief_trajectory_energy,
    central_window,
    central_window_energy,
    depth_profile,
    js_divergence,
    transition_statistics,
)
from .calibration import (
    ReliabilityDiagram,
    accuracy_at_coverage_score,
    aurc_error,
    binary_nll_loss,
    expected_calibration_error,
    fit_temperature,
    out_of_fold_temperature_scale,
    reliability_diagram,
    risk_coverage_curve,
    selective_auroc_score,
    temperature_scale,
)
from .confidence import chosen_option_confidence, geometric_mean_probability, option_probabilities
from .reader import ReaderScores, reader_auroc_score, reader_scores
from .tcb import PredictionBaselines, distribution_baselines, token_constraint_bound

__all__ = [
    "PredictionBaselines",
    "ReaderScores",
    "ReliabilityDiagram",
    "accuracy_at_coverage_score",
    "aurc_error",
    "binary_nll_loss",
    "expected_calibration_error",
    "fit_temperature",
    "out_of_fold_temperature_scale",
    "reader_auroc_score",
    "reader_scores",
    "reliability_diagram",
    "risk_coverage_curve",
    "selective_auroc_score",
    "temperature_scale",
    "TRANSITION_STATISTIC_NAMES",
    "belief_trajectory_energy",
    "central_window",
    "central_window_energy",
    "chosen_option_confidence",
    "depth_profile",
    "distribution_baselines",
    "geometric_mean_probability",
    "js_divergence",
    "option_probabilities",
    "token_constraint_bound",
    "transition_statistics",
]
