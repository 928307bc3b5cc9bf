"""Calibration and selective-prediction metrics against hand-computed numbers, loops and sklearn."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from sklearn.exceptions import UndefinedMetricWarning
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold

from lm_eval_probes.probes.calibration import (
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


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _random_data(seed: int, n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.0, 1.0, n)
    correct = (rng.uniform(0.0, 1.0, n) < conf).astype(int)
    return conf, correct


def _overconfident_data(seed: int, n: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Labels drawn from σ(z), reported confidence σ(3z): the true temperature is 3."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 1.5, n)
    correct = (rng.uniform(0.0, 1.0, n) < _sigmoid(z)).astype(int)
    return _sigmoid(3.0 * z), correct


def _loop_uniform_ece(conf: np.ndarray, correct: np.ndarray, n_bins: int) -> float:
    total = 0.0
    for i in range(n_bins):
        lo, hi = i / n_bins, (i + 1) / n_bins
        members = [j for j in range(len(conf)) if (lo < conf[j] <= hi) or (i == 0 and conf[j] == 0.0)]
        if members:
            acc = sum(correct[j] for j in members) / len(members)
            mean_conf = sum(conf[j] for j in members) / len(members)
            total += len(members) / len(conf) * abs(acc - mean_conf)
    return total


def _loop_quantile_ece(conf: np.ndarray, correct: np.ndarray, n_bins: int) -> float:
    """Distinct confidences only: sorted position p goes to bin floor(p·n_bins/n)."""
    order = sorted(range(len(conf)), key=lambda j: conf[j])
    bins: dict[int, list[int]] = {}
    for p, j in enumerate(order):
        bins.setdefault(p * n_bins // len(conf), []).append(j)
    total = 0.0
    for members in bins.values():
        acc = sum(correct[j] for j in members) / len(members)
        mean_conf = sum(conf[j] for j in members) / len(members)
        total += len(members) / len(conf) * abs(acc - mean_conf)
    return total


# --------------------------------------------------------------------------- ECE


def test_ece_uniform_hand_computed():
    conf = [0.1, 0.2, 0.5, 0.6, 0.9, 1.0]
    correct = [0, 1, 1, 0, 1, 1]
    # 3 equal-width bins (0, 1/3], (1/3, 2/3], (2/3, 1]:
    #   bin 0: {0.1, 0.2}  acc 1/2, conf 0.15  -> |0.5 - 0.15| = 0.35
    #   bin 1: {0.5, 0.6}  acc 1/2, conf 0.55  -> 0.05
    #   bin 2: {0.9, 1.0}  acc 1,   conf 0.95  -> 0.05
    # ECE = 2/6·0.35 + 2/6·0.05 + 2/6·0.05 = 0.45/3 = 0.15
    assert expected_calibration_error(conf, correct, n_bins=3) == pytest.approx(0.15, abs=1e-12)


def test_ece_quantile_hand_computed():
    conf = [0.05, 0.1, 0.15, 0.7, 0.8, 0.95]
    correct = [1, 0, 0, 1, 1, 0]
    # 3 equal-mass bins of 2 each after sorting (equal-width would put 4 points in bin 0):
    #   {0.05, 0.1}  acc 1/2, conf 0.075 -> 0.425
    #   {0.15, 0.7}  acc 1/2, conf 0.425 -> 0.075
    #   {0.8, 0.95}  acc 1/2, conf 0.875 -> 0.375
    # ECE = (0.425 + 0.075 + 0.375)/3 = 0.875/3
    assert expected_calibration_error(conf, correct, n_bins=3, binning="quantile") == pytest.approx(0.875 / 3)
    # equal-width: (0,1/3] = {0.05,0.1,0.15} acc 1/3 conf 0.1 -> 3/6·(1/3 − 0.1); (2/3,1] = {0.7,0.8,0.95}
    # acc 2/3 conf 0.8166… -> 3/6·(0.81666… − 2/3)
    expected_uniform = 0.5 * (1 / 3 - 0.1) + 0.5 * (2.45 / 3 - 2 / 3)
    assert expected_calibration_error(conf, correct, n_bins=3) == pytest.approx(expected_uniform)


def test_ece_bin_edges_and_zero_confidence():
    # 0 joins the first bin (0, 0.5]; 0.5 is the upper edge of bin 0; 1.0 is in the last bin.
    diagram = reliability_diagram([0.0, 0.5, 0.50001, 1.0], [0, 1, 1, 1], n_bins=2)
    np.testing.assert_array_equal(diagram.count, [2, 2])
    np.testing.assert_array_equal(diagram.bin_lower, [0.0, 0.5])
    np.testing.assert_array_equal(diagram.bin_upper, [0.5, 1.0])
    # 0.3·10 = 3.0000000000000004 in float; the edge comparison still puts 0.3 in (0.2, 0.3].
    assert reliability_diagram([0.3], [1], n_bins=10).count[2] == 1


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("n_bins", [1, 10, 15])
def test_ece_matches_loop(seed: int, n_bins: int):
    conf, correct = _random_data(seed, n=150)
    conf = conf ** 0.5  # skew it, so the calibration error is not ~0
    assert expected_calibration_error(conf, correct, n_bins=n_bins) == pytest.approx(
        _loop_uniform_ece(conf, correct, n_bins), abs=1e-12
    )
    assert expected_calibration_error(conf, correct, n_bins=n_bins, binning="quantile") == pytest.approx(
        _loop_quantile_ece(conf, correct, n_bins), abs=1e-12
    )


def test_ece_one_bin_is_accuracy_gap():
    conf, correct = _random_data(5)
    for binning in ("uniform", "quantile"):
        got = expected_calibration_error(conf, correct, n_bins=1, binning=binning)
        assert got == pytest.approx(abs(correct.mean() - conf.mean()), abs=1e-12)


def test_ece_empty_warns_nan():
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(expected_calibration_error([], []))


def test_quantile_bins_equal_mass_when_distinct():
    rng = np.random.default_rng(7)
    for n, n_bins in [(100, 10), (101, 10), (37, 15), (15, 15), (5, 10)]:
        conf = rng.permutation(np.linspace(0.01, 0.99, n))
        count = reliability_diagram(conf, np.ones(n, int), n_bins=n_bins, binning="quantile").count
        assert count.sum() == n
        assert count.max() - count.min() <= 1


def test_quantile_bins_keep_ties_together():
    rng = np.random.default_rng(11)
    conf = rng.choice([0.1, 0.3, 0.35, 0.6, 0.9], size=97)
    correct = rng.integers(0, 2, 97)
    diagram = reliability_diagram(conf, correct, n_bins=10, binning="quantile")
    assert diagram.count.sum() == 97
    filled = diagram.count > 0
    # each non-empty bin spans a single value, and every distinct value has exactly one bin
    np.testing.assert_array_equal(diagram.bin_lower[filled], diagram.bin_upper[filled])
    values, counts = np.unique(conf, return_counts=True)
    np.testing.assert_array_equal(np.sort(diagram.bin_lower[filled]), values)
    np.testing.assert_array_equal(diagram.count[filled][np.argsort(diagram.bin_lower[filled])], counts)
    # and the binning does not depend on input order
    perm = rng.permutation(97)
    again = reliability_diagram(conf[perm], correct[perm], n_bins=10, binning="quantile")
    np.testing.assert_array_equal(again.count, diagram.count)


def test_reliability_diagram_fields_and_to_dict():
    diagram = reliability_diagram([0.1, 0.2, 0.9], [0, 1, 1], n_bins=3)
    assert isinstance(diagram, ReliabilityDiagram)
    np.testing.assert_array_equal(diagram.count, [2, 0, 1])
    assert diagram.count.dtype.kind == "i"
    np.testing.assert_allclose(diagram.mean_confidence[[0, 2]], [0.15, 0.9])
    assert np.isnan(diagram.mean_confidence[1]) and np.isnan(diagram.accuracy[1])
    payload = diagram.to_dict()
    assert json.loads(json.dumps(payload)) == payload
    assert payload["accuracy"] == [0.5, None, 1.0]
    assert payload["count"] == [2, 0, 1] and all(type(v) is int for v in payload["count"])
    assert diagram.expected_calibration_error() == expected_calibration_error([0.1, 0.2, 0.9], [0, 1, 1], n_bins=3)


# --------------------------------------------------------------------------- AUROC


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_selective_auroc_matches_sklearn(seed: int):
    conf, correct = _random_data(seed)
    conf = np.round(conf, 1)  # with ties
    assert selective_auroc_score(conf, correct) == roc_auc_score(correct, conf)
    assert selective_auroc_score(conf, correct.astype(bool)) == roc_auc_score(correct, conf)


def test_selective_auroc_one_class_warns_nan():
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(selective_auroc_score([0.2, 0.9, 0.4], [1, 1, 1]))
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(selective_auroc_score([0.2, 0.9], [False, False]))


def test_selective_auroc_empty_warns_nan():
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(selective_auroc_score([], []))


# --------------------------------------------------------------------------- risk–coverage, AURC


def _plain_aurc(conf: np.ndarray, correct: np.ndarray, order: np.ndarray | None = None) -> float:
    """Sort by confidence descending (ties by the given order), risk_k = cumulative errors / k, mean."""
    if order is None:
        order = np.argsort(-conf, kind="stable")
    errors = 1 - np.asarray(correct)[order]
    return float(np.mean(np.cumsum(errors) / np.arange(1, len(conf) + 1)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aurc_matches_direct_sum_without_ties(seed: int):
    conf, correct = _random_data(seed)
    assert len(np.unique(conf)) == len(conf)
    assert aurc_error(conf, correct) == pytest.approx(_plain_aurc(conf, correct), abs=1e-12)
    coverage, risk = risk_coverage_curve(conf, correct)
    np.testing.assert_allclose(coverage, np.arange(1, 201) / 200)
    assert risk[-1] == pytest.approx(1 - correct.mean())


def test_aurc_ties_equal_average_over_all_tie_orders():
    conf = np.array([0.9, 0.7, 0.7, 0.7, 0.7, 0.4, 0.4, 0.4, 0.2])
    correct = np.array([1, 1, 0, 0, 1, 0, 1, 1, 0])
    groups = [np.flatnonzero(conf == v) for v in sorted(set(conf.tolist()), reverse=True)]
    totals = []
    for orders in itertools.product(*(itertools.permutations(g.tolist()) for g in groups)):
        order = np.array([i for group_order in orders for i in group_order])
        totals.append(_plain_aurc(conf, correct, order))
    assert len(totals) == 1 * 24 * 6 * 1
    assert aurc_error(conf, correct) == pytest.approx(np.mean(totals), abs=1e-12)


def test_risk_coverage_tie_expectation_hand_computed():
    # one tied group of 4 with 2 errors: expected errors after k = 1..4 are k/2, so risk is 1/2 throughout
    _, risk = risk_coverage_curve([0.5, 0.5, 0.5, 0.5], [1, 0, 1, 0])
    np.testing.assert_allclose(risk, [0.5, 0.5, 0.5, 0.5])
    # 0.9 correct, then a tied pair with one error: errors 0, 0.5, 1 -> risk 0, 0.25, 1/3
    _, risk = risk_coverage_curve([0.6, 0.9, 0.6], [0, 1, 1])
    np.testing.assert_allclose(risk, [0.0, 0.25, 1 / 3])


def test_risk_coverage_invariant_to_input_order():
    rng = np.random.default_rng(3)
    conf = rng.choice([0.1, 0.5, 0.55, 0.8, 1.0], size=60)
    correct = rng.integers(0, 2, 60)
    coverage, risk = risk_coverage_curve(conf, correct)
    for _ in range(5):
        perm = rng.permutation(60)
        coverage2, risk2 = risk_coverage_curve(conf[perm], correct[perm])
        np.testing.assert_allclose(coverage2, coverage, rtol=0, atol=1e-15)
        np.testing.assert_allclose(risk2, risk, rtol=0, atol=1e-15)
        assert aurc_error(conf[perm], correct[perm]) == pytest.approx(aurc_error(conf, correct), abs=1e-15)
        assert accuracy_at_coverage_score(conf[perm], correct[perm], coverage=0.5) == pytest.approx(
            accuracy_at_coverage_score(conf, correct, coverage=0.5), abs=1e-15
        )


def test_aurc_and_curve_empty():
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(aurc_error([], []))
    coverage, risk = risk_coverage_curve([], [])
    assert coverage.shape == (0,) and risk.shape == (0,)


# --------------------------------------------------------------------------- accuracy at coverage


def test_accuracy_at_coverage_hand_computed():
    conf = [0.95, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    correct = [1, 1, 0, 1, 1, 0, 0, 1, 0, 0]
    # top 5 (0.95..0.6): 1,1,0,1,1 -> 4/5; top 8: 1,1,0,1,1,0,0,1 -> 5/8
    assert accuracy_at_coverage_score(conf, correct, coverage=0.5) == pytest.approx(0.8)
    assert accuracy_at_coverage_score(conf, correct, coverage=0.8) == pytest.approx(5 / 8)
    # ⌈0.7·10⌉ = 7 despite 0.7·10 = 7.000000000000001 in float: 1,1,0,1,1,0,0 -> 4/7
    assert accuracy_at_coverage_score(conf, correct, coverage=0.7) == pytest.approx(4 / 7)
    # ⌈0.25·10⌉ = 3: 1,1,0 -> 2/3; a tiny coverage keeps one document
    assert accuracy_at_coverage_score(conf, correct, coverage=0.25) == pytest.approx(2 / 3)
    assert accuracy_at_coverage_score(conf, correct, coverage=1e-6) == 1.0


def test_accuracy_at_full_coverage_is_accuracy():
    conf, correct = _random_data(4)
    assert accuracy_at_coverage_score(conf, correct, coverage=1.0) == pytest.approx(correct.mean(), abs=1e-12)


def test_accuracy_at_coverage_ties_and_empty():
    # tied pair at the cut with one error: expected accuracy of the top 2 = (1 + 0.5)/2
    assert accuracy_at_coverage_score([0.9, 0.5, 0.5, 0.1], [1, 0, 1, 1], coverage=0.5) == pytest.approx(0.75)
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(accuracy_at_coverage_score([], []))


@pytest.mark.parametrize("coverage", [0.0, -0.1, 1.5, float("nan")])
def test_accuracy_at_coverage_bad_coverage(coverage: float):
    with pytest.raises(ValueError, match="coverage"):
        accuracy_at_coverage_score([0.5], [1], coverage=coverage)


# --------------------------------------------------------------------------- temperature scaling


def test_temperature_fit_lowers_nll_on_overconfident_data():
    conf, correct = _overconfident_data(0)
    t = fit_temperature(conf, correct)
    assert 2.0 < t < 4.5  # true temperature 3
    scaled = temperature_scale(conf, t)
    assert binary_nll_loss(scaled, correct) < binary_nll_loss(conf, correct)
    # a minimum: nudging T either way does not help
    for other in (t * 0.95, t * 1.05):
        assert binary_nll_loss(temperature_scale(conf, other), correct) >= binary_nll_loss(scaled, correct)
    assert expected_calibration_error(scaled, correct) < expected_calibration_error(conf, correct)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_temperature_scaling_keeps_auroc_exactly(seed: int):
    conf, correct = _overconfident_data(seed, n=500)
    conf = np.concatenate([conf, [0.0, 1.0, 0.5]])
    correct = np.concatenate([correct, [0, 1, 1]])
    raw = selective_auroc_score(conf, correct)
    for t in (0.3, 0.7, 1.0, 1.7, 3.0, 10.0):
        assert selective_auroc_score(temperature_scale(conf, t), correct) == raw


def test_temperature_one_is_identity_and_endpoints_fixed():
    rng = np.random.default_rng(0)
    conf = np.concatenate([rng.uniform(0.0, 1.0, 1000), [1e-300, 1e-8, 0.5, 1 - 1e-8]])
    np.testing.assert_allclose(temperature_scale(conf, 1.0), conf, rtol=1e-12, atol=0)
    for t in (0.01, 1.0, 7.0, 100.0):
        np.testing.assert_array_equal(temperature_scale([0.0, 1.0, 0.5], t), [0.0, 1.0, 0.5])


def test_temperature_direction():
    scaled = temperature_scale([0.2, 0.9], 2.0)
    assert 0.2 < scaled[0] < 0.5 < scaled[1] < 0.9  # T > 1 softens towards 0.5
    sharpened = temperature_scale([0.2, 0.9], 0.5)
    assert sharpened[0] < 0.2 and sharpened[1] > 0.9
    # σ(logit(0.9)/2) = 1/(1 + (1/9)^(1/2)) = 0.75
    assert scaled[1] == pytest.approx(0.75)


@pytest.mark.parametrize("t", [0.0, -1.0, float("inf"), float("nan")])
def test_temperature_bad_values(t: float):
    with pytest.raises(ValueError, match="temperature"):
        temperature_scale([0.5], t)


def test_binary_nll_hand_computed_and_clipping():
    assert binary_nll_loss([0.8, 0.4], [1, 0]) == pytest.approx(-(math.log(0.8) + math.log(0.6)) / 2)
    assert binary_nll_loss([0.0], [1]) == pytest.approx(-math.log(1e-12))
    assert binary_nll_loss([1.0, 0.0], [1, 0]) == pytest.approx(-math.log1p(-1e-12))
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(binary_nll_loss([], []))


def test_fit_temperature_degenerate():
    # one class, all confident and correct: sharper is always better, T runs to the lower bound
    assert fit_temperature([0.7, 0.8, 0.9], [1, 1, 1], bounds=(0.05, 20.0)) == pytest.approx(0.05, rel=1e-6)
    # nothing informative (only 0, 0.5, 1): NLL is flat in T, T = 1
    assert fit_temperature([0.0, 0.5, 1.0], [0, 1, 1]) == 1.0
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(fit_temperature([], []))
    with pytest.raises(ValueError, match="bounds"):
        fit_temperature([0.5], [1], bounds=(2.0, 1.0))


# --------------------------------------------------------------------------- out-of-fold


def test_out_of_fold_never_sees_own_label():
    conf, correct = _overconfident_data(1, n=300)
    seed = 4
    scaled = out_of_fold_temperature_scale(conf, correct, n_splits=5, seed=seed)
    folds = StratifiedKFold(n_splits=5, shuffle=True, random_state=seed).split(conf.reshape(-1, 1), correct)
    n_tested = 0
    for train, test in folds:
        t = fit_temperature(conf[train], correct[train])  # uses only the other folds' labels
        np.testing.assert_allclose(scaled[test], temperature_scale(conf[test], t), rtol=1e-12, atol=0)
        n_tested += len(test)
    assert n_tested == 300
    assert binary_nll_loss(scaled, correct) < binary_nll_loss(conf, correct)
    # the held-out fold's T differs from the in-sample T (it was fitted on different labels)
    assert not np.allclose(scaled, temperature_scale(conf, fit_temperature(conf, correct)), rtol=1e-9)


def test_out_of_fold_kfold_fallback_label_flip():
    # a single wrong document: stratification impossible -> KFold, whose folds ignore the labels,
    # so flipping a document's own label must leave its own scaled value unchanged.
    rng = np.random.default_rng(2)
    conf = rng.uniform(0.05, 0.95, 20)
    correct = np.ones(20, int)
    correct[3] = 0
    scaled = out_of_fold_temperature_scale(conf, correct, n_splits=4, seed=1)
    assert np.all(np.isfinite(scaled)) and scaled.shape == (20,)
    flipped = correct.copy()
    flipped[3] = 1
    np.testing.assert_array_equal(out_of_fold_temperature_scale(conf, flipped, n_splits=4, seed=1)[3], scaled[3])


def test_out_of_fold_small_minority_and_tiny_inputs():
    # minority class of 3 < n_splits: 3 stratified folds, still finite and order-preserving in T
    conf = np.array([0.9, 0.8, 0.85, 0.3, 0.7, 0.95, 0.2, 0.6, 0.75, 0.65])
    correct = np.array([1, 1, 1, 0, 1, 1, 0, 1, 1, 0])
    scaled = out_of_fold_temperature_scale(conf, correct, n_splits=5, seed=0)
    assert np.all((scaled >= 0) & (scaled <= 1))
    with pytest.warns(UndefinedMetricWarning):
        assert np.isnan(out_of_fold_temperature_scale([0.5], [1])).all()
    with pytest.warns(UndefinedMetricWarning):
        assert out_of_fold_temperature_scale([], []).shape == (0,)
    with pytest.raises(ValueError, match="n_splits"):
        out_of_fold_temperature_scale(conf, correct, n_splits=1)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("conf", "correct", "fragment"),
    [
        ([0.1, 0.2, 0.3, 0.4, 1.3], [1, 0, 1, 0, 1], "1.3 at index 4"),
        ([0.1, -0.2], [1, 0], "-0.2 at index 1"),
        ([0.1, float("nan")], [1, 0], "nan at index 1"),
        ([0.1, float("inf")], [1, 0], "inf at index 1"),
        ([0.1, 0.2, 0.3, 0.4, 0.5], [1, 0, 1, 0, 1, 1], "5 vs 6"),
        ([[0.1, 0.2]], [1, 0], r"\(1, 2\)"),
        ([0.1, 0.2], [[1, 0]], r"\(1, 2\)"),
        (0.5, [1], r"shape \(\)"),
        ([0.1, 0.2, 0.3], [1, 2, 0], "2 at index 1"),
        ([0.1, 0.2], [1, 0.5], "0.5 at index 1"),
        (["a", "b"], [1, 0], "dtype"),
    ],
)
def test_validation_errors(conf, correct, fragment: str):
    for fn in (expected_calibration_error, selective_auroc_score, aurc_error, binary_nll_loss, fit_temperature):
        with pytest.raises(ValueError, match=fragment):
            fn(conf, correct)


@pytest.mark.parametrize("n_bins", [0, -3, 2.5, "10", True])
def test_bad_n_bins(n_bins):
    with pytest.raises(ValueError, match="n_bins") as info:
        expected_calibration_error([0.5], [1], n_bins=n_bins)
    assert repr(n_bins) in str(info.value)


def test_unknown_binning_lists_valid_values():
    with pytest.raises(ValueError, match="'quantil'") as info:
        reliability_diagram([0.5], [1], binning="quantil")
    message = str(info.value)
    assert "'uniform'" in message and "'quantile'" in message and "did you mean 'quantile'" in message
    with pytest.raises(ValueError, match="'equal_mass'"):
        expected_calibration_error([0.5], [1], binning="equal_mass")


def test_temperature_scale_validates_confidence():
    with pytest.raises(ValueError, match="1.5 at index 0"):
        temperature_scale([1.5], 1.0)
    with pytest.raises(ValueError, match=r"shape \(2, 1\)"):
        temperature_scale([[0.5], [0.2]], 1.0)
