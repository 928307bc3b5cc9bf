"""Corpus-level aggregations of per-document probe records (installed as ``lm_eval_probes.metrics``).

:mod:`.calibration` holds the calibration, selective-prediction, reader and detector rows; the rank
correlations are :mod:`lm_eval_probes.probes.correlation`. Which row uses which aggregation is declared
once in :mod:`lm_eval_probes.rows`; registering them with lm_eval is :mod:`lm_eval_probes.harness.registry`'s
job. Importing this package imports neither torch nor lm_eval.
"""

from __future__ import annotations

from lm_eval_probes.metrics.calibration import CALIBRATION_ROWS, CalibrationOptions
from lm_eval_probes.probes.correlation import UndefinedMetricWarning, count, partial_spearman_score, spearman_score

__all__ = [
    "CALIBRATION_ROWS", "CalibrationOptions", "UndefinedMetricWarning", "count", "partial_spearman_score",
    "spearman_score",
]
