"""Scores users compare against elsewhere: lm-polygraph's prediction rejection ratio and HELM's calibration set
(``ece_10_bin``, ``selective_cov_acc_area``), checked against the library HELM calls (``uncertainty-calibration``)
and a plain transcription of lm-polygraph's area, and as rows of a run."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from sklearn.exceptions import UndefinedMetricWarning

from lm_eval_probes.probes.calibration import (
    aurc_error,
    coverage_accuracy_area_score,
    expected_calibration_error,
    prediction_rejection_ratio_score,
)

calibration = pytest.importorskip("calibration", reason="HELM's calibration library (pip install uncertainty-calibration)")


def polygraph_area(uncertainty: np.ndarray, quality: np.ndarray) -> float:
    """lm-polygraph's PredictionRejectionArea, transcribed: the least uncertain first, mean over k of the mean
    quality of the first k."""
    order = np.argsort(uncertainty, kind="stable")
    scores = np.cumsum(quality[order]) / np.arange(1, len(quality) + 1)
    return float(np.sum(scores) / len(quality))


def polygraph_prr(confidence: np.ndarray, correct: np.ndarray, *, random_orders: int = 0) -> float:
    """PRR as lm-polygraph normalises it: (area − random) / (oracle − random), the oracle ordering by the quality
    itself; random = the accuracy (its exact expectation), or the mean over ``random_orders`` shuffles as
    lm-polygraph's get_random_scores does."""
    quality = correct.astype(float)
    area = polygraph_area(-confidence, quality)
    oracle = polygraph_area(-quality, quality)
    if random_orders:
        rng = np.random.default_rng(42)
        random = float(np.mean([polygraph_area(rng.permutation(len(quality)).astype(float), quality)
                                for _ in range(random_orders)]))
    else:
        random = float(np.mean(quality))
    return (area - random) / (oracle - random)


@pytest.mark.parametrize("n", [7, 10, 23, 40, 301])
def test_ece_10_bin_is_helms(n):
    rng = np.random.default_rng(n)
    confidence = rng.uniform(0.2, 1.0, n)
    correct = (rng.uniform(size=n) < confidence).astype(int)
    helm = calibration.get_ece_em(confidence, correct, num_bins=10)
    assert expected_calibration_error(confidence, correct, n_bins=10, binning="helm") == pytest.approx(helm, abs=1e-12)


def test_ece_10_bin_with_ties_and_boundaries_is_helms():
    confidence = np.array([0.5, 0.5, 0.5, 0.6, 0.6, 0.7, 0.7, 0.7, 0.7, 0.9, 0.95, 1.0, 1.0, 0.55, 0.65])
    correct = np.array([1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 0, 0, 1])
    helm = calibration.get_ece_em(confidence, correct, num_bins=10)
    assert expected_calibration_error(confidence, correct, n_bins=10, binning="helm") == pytest.approx(helm, abs=1e-12)


def test_helms_bins_are_not_the_plugins_equal_mass_bins():
    """15 distinct confidences in 10 bins: HELM's chunks hold 2,2,2,2,2,1,1,1,1,1, the plugin's rank bins
    2,1,2,1,2,1,2,1,2,1, so the two ECEs differ (docs/usage.md says which is which)."""
    confidence = np.linspace(0.3, 0.95, 15)
    correct = np.array([0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1])
    helm = calibration.get_ece_em(confidence, correct, num_bins=10)
    assert expected_calibration_error(confidence, correct, n_bins=10, binning="helm") == pytest.approx(helm, abs=1e-12)
    assert abs(expected_calibration_error(confidence, correct, n_bins=10, binning="quantile") - helm) > 1e-3


@pytest.mark.parametrize("n", [5, 40, 300])
def test_selective_cov_acc_area_is_helms_without_ties(n):
    rng = np.random.default_rng(n + 1)
    confidence = rng.permutation(np.linspace(0.3, 0.99, n))  # distinct: HELM's argsort order is the only one
    correct = (rng.uniform(size=n) < confidence).astype(int)
    area, _ = calibration.get_selective_stats(confidence, correct)
    assert coverage_accuracy_area_score(confidence, correct) == pytest.approx(area, abs=1e-12)
    assert coverage_accuracy_area_score(confidence, correct) == pytest.approx(1 - aurc_error(confidence, correct), abs=1e-12)


def test_ties_are_the_expectation_over_tie_orders():
    confidence = np.array([0.9, 0.9, 0.9, 0.6, 0.6, 0.3])
    correct = np.array([1, 0, 1, 0, 1, 0])
    tied = [np.flatnonzero(confidence == v) for v in (0.9, 0.6)]
    areas, ratios = [], []
    for first, second in itertools.product(itertools.permutations(tied[0]), itertools.permutations(tied[1])):
        order = np.array([*first, *second, 5])
        ranked = np.empty(6)
        ranked[order] = np.arange(6, 0, -1)  # distinct confidences in this tie order
        areas.append(calibration.get_selective_stats(ranked, correct)[0])
        ratios.append(polygraph_prr(ranked, correct))
    assert coverage_accuracy_area_score(confidence, correct) == pytest.approx(np.mean(areas), abs=1e-12)
    assert prediction_rejection_ratio_score(confidence, correct) == pytest.approx(np.mean(ratios), abs=1e-12)


@pytest.mark.parametrize("n", [6, 40, 257])
def test_prr_is_lm_polygraphs(n):
    rng = np.random.default_rng(3 * n)
    confidence = rng.permutation(np.linspace(0.05, 0.95, n))
    correct = (rng.uniform(size=n) < confidence).astype(int)
    assert prediction_rejection_ratio_score(confidence, correct) == pytest.approx(polygraph_prr(confidence, correct), abs=1e-12)
    # lm-polygraph's random baseline is a Monte-Carlo estimate of the accuracy: close, not equal
    assert prediction_rejection_ratio_score(confidence, correct) == pytest.approx(
        polygraph_prr(confidence, correct, random_orders=1000), abs=0.05)


def test_prr_bounds_and_undefined_cases():
    correct = np.array([1, 1, 0, 1, 0, 0, 1, 0])
    oracle = np.where(correct == 1, 0.9, 0.1) + np.linspace(0, 0.01, 8)
    assert prediction_rejection_ratio_score(oracle, correct) == pytest.approx(1.0)
    assert prediction_rejection_ratio_score(1 - oracle, correct) < 0
    assert prediction_rejection_ratio_score(np.full(8, 0.5), correct) == pytest.approx(0.0, abs=1e-12)  # all tied: random
    for bad in (np.ones(8, dtype=int), np.zeros(8, dtype=int)):
        with pytest.warns(UndefinedMetricWarning):
            assert math.isnan(prediction_rejection_ratio_score(oracle, bad))
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(coverage_accuracy_area_score([], []))


def test_the_rows_aggregate_the_records_as_the_functions_do():
    from lm_eval_probes.rows import AGGREGATIONS, ROWS_BY_NAME

    rng = np.random.default_rng(11)
    confidence = rng.uniform(0.1, 1.0, 60)
    correct = (rng.uniform(size=60) < confidence).astype(int)
    items = [(float(c), int(y)) for c, y in zip(confidence, correct)] + [(math.nan, 1), (0.5, None)]  # skipped
    expected = {
        "prr": prediction_rejection_ratio_score(confidence, correct),
        "ece_10_bin": calibration.get_ece_em(confidence, correct, num_bins=10),
        "selective_cov_acc_area": calibration.get_selective_stats(confidence, correct)[0],
    }
    for name, value in expected.items():
        row = ROWS_BY_NAME[name]
        assert row.family == "confidence" and row.value == "confidence"
        assert AGGREGATIONS[row.aggregation](items) == pytest.approx(value, abs=1e-12), name
