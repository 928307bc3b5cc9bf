"""Pure probe math on tensors (torch / numpy / scipy only; no transformers, no lm_eval).

One module per method: :mod:`.tcb` (Token Constraint Bound), :mod:`.bte` (Belief-Trajectory
Energy), :mod:`.confidence` (output confidence of a response).
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
from .confidence import chosen_option_confidence, geometric_mean_probability, option_probabilities
from .tcb import PredictionBaselines, distribution_baselines, token_constraint_bound

__all__ = [
    "PredictionBaselines",
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
