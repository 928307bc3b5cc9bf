"""Latent Correctness Reader: out-of-fold honesty, layer/C selection, groups, split protocol."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sklearn.exceptions import UndefinedMetricWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import lm_eval_probes.probes.reader.math as reader
from lm_eval_probes.probes.reader.math import DEFAULT_CS, PROTOCOLS, ReaderScores, reader_auroc_score, reader_scores


def _noise(n: int, n_layers: int = 3, d: int = 16, *, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, n_layers, d))


def _labels(n: int, *, seed: int = 0, positive_rate: float = 0.5) -> np.ndarray:
    return (np.random.default_rng(seed + 1000).random(n) < positive_rate).astype(int)


def _separable(n: int = 160, *, informative_layer: int = 1, shift: float = 2.0, seed: int = 0):
    """Noise on every layer; labels shift the mean of the first 4 dims of one layer."""
    x, y = _noise(n, seed=seed), _labels(n, seed=seed)
    x[:, informative_layer, :4] += shift * y[:, None]
    return x, y


def _twins(n_groups: int = 60, *, d: int = 16, shift: float = 1.5, seed: int = 0):
    """Clean (label 0) and noised (label 1) twin per group: near-identical rows, one direction shifted."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n_groups, 2, d))
    twin = base + 0.05 * rng.standard_normal(base.shape)
    twin[:, 1, :3] += shift
    x = np.concatenate([base, twin])
    y = np.repeat([0, 1], n_groups)
    groups = np.concatenate([np.arange(n_groups), np.arange(n_groups)])
    return x, y, groups


@pytest.mark.filterwarnings("error")
def test_random_labels_auroc_near_chance():
    aurocs = []
    for seed in range(3):
        result = reader_scores(_noise(200, seed=seed), _labels(200, seed=seed), seed=seed)
        assert result.scored.all() and np.all((result.scores >= 0) & (result.scores <= 1))
        aurocs.append(reader_auroc_score(result))
    assert abs(np.mean(aurocs) - 0.5) < 0.1, aurocs
    assert all(abs(a - 0.5) < 0.2 for a in aurocs), aurocs


@pytest.mark.filterwarnings("error")
def test_separable_features_high_auroc_and_informative_layer_chosen():
    x, y = _separable(informative_layer=1)
    result = reader_scores(x, y)
    assert reader_auroc_score(result) > 0.95
    assert result.protocol == "cross_fit" and len(result.layers) == len(result.Cs) == 5
    assert sum(layer == 1 for layer in result.layers) >= 4, result.layers
    assert set(result.Cs) <= set(DEFAULT_CS)


def test_every_document_scored_exactly_once_in_one_fold():
    x, y = _separable(n=150)
    result = reader_scores(x, y, n_splits=5)
    assert result.scored.all()
    assert sorted(np.unique(result.fold).tolist()) == [0, 1, 2, 3, 4]
    assert np.bincount(result.fold).sum() == 150
    expected = StratifiedKFold(n_splits=5, shuffle=True, random_state=0).split(np.zeros((150, 1)), y)
    for fold, (_, test_idx) in enumerate(expected):
        np.testing.assert_array_equal(np.flatnonzero(result.fold == fold), test_idx)


def test_fold_scores_match_a_refit_that_excludes_the_fold():
    x, y = _separable(n=150, shift=1.0)
    result = reader_scores(x, y)
    for fold, (layer, C) in enumerate(zip(result.layers, result.Cs)):
        held_out = result.fold == fold
        model = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=1000))
        model.fit(x[~held_out, layer], y[~held_out])
        np.testing.assert_array_equal(result.scores[held_out], model.predict_proba(x[held_out, layer])[:, 1])


def test_swapping_labels_inside_a_held_out_fold_leaves_its_scores_unchanged():
    x, y = _separable(n=150, shift=1.0)
    before = reader_scores(x, y)
    # Adjacent documents with different labels in the same fold keep every class rank, so the
    # shuffled stratified split is identical after swapping their labels (checked below).
    pairs = [i for i in range(len(y) - 1) if y[i] != y[i + 1] and before.fold[i] == before.fold[i + 1]]
    assert pairs
    swapped = y.copy()
    i = pairs[0]
    swapped[[i, i + 1]] = swapped[[i + 1, i]]
    after = reader_scores(x, swapped)
    np.testing.assert_array_equal(after.fold, before.fold)
    held_out = before.fold == before.fold[i]
    np.testing.assert_array_equal(after.scores[held_out], before.scores[held_out])
    assert after.layers[before.fold[i]] == before.layers[before.fold[i]]
    np.testing.assert_array_equal(after.labels, swapped)
    assert not np.array_equal(after.scores[~held_out], before.scores[~held_out])  # other folds saw the swap


def test_twins_never_straddle_train_and_test(monkeypatch):
    x, y, groups = _twins()
    seen: list[tuple[np.ndarray, list]] = []
    real_splits = reader._splits

    def spy(labels, group_codes, *, n_splits, seed):
        splits = list(real_splits(labels, group_codes, n_splits=n_splits, seed=seed))
        seen.append((group_codes, splits))
        return iter(splits)

    monkeypatch.setattr(reader, "_splits", spy)
    result = reader_scores(x, y, groups=[f"doc-{g}" for g in groups])
    assert reader_auroc_score(result) > 0.9
    for g in np.unique(groups):
        assert np.unique(result.fold[groups == g]).size == 1
    assert len(seen) == 1 + 5  # outer split, then one inner split per outer training part
    for group_codes, splits in seen:
        assert group_codes is not None
        for train_idx, test_idx in splits:
            assert not set(group_codes[train_idx]) & set(group_codes[test_idx])


def test_split_protocol_sizes_and_unscored_calibration():
    x, y = _separable(n=260)
    result = reader_scores(x, y, protocol="split")
    assert result.protocol == "split" and len(result.layers) == len(result.Cs) == 1
    assert result.scored.sum() == 60
    assert np.all(result.fold[result.scored] == 0) and np.all(result.fold[~result.scored] == -1)
    assert np.isnan(result.scores[~result.scored]).all()
    assert abs(y[~result.scored].mean() - y.mean()) < 0.02  # calibration part is stratified
    assert reader_auroc_score(result) > 0.95


def test_split_protocol_caps_at_test_size_and_leaves_the_rest_unscored():
    x, y = _noise(640, d=8), _labels(640)
    result = reader_scores(x, y, protocol="split", calibration_size=100, test_size=300)
    assert result.scored.sum() == 300
    assert abs(y[result.scored].mean() - y.mean()) < 0.03


def test_split_protocol_keeps_groups_whole():
    x, y, groups = _twins(n_groups=130)
    result = reader_scores(x, y, groups=groups, protocol="split", calibration_size=100, test_size=100)
    assert result.scored.sum() == 100
    for g in np.unique(groups):
        assert np.unique(result.scored[groups == g]).size == 1


def test_split_protocol_too_few_documents_raises():
    x, y = _noise(201), _labels(201)
    with pytest.raises(ValueError, match=r"calibration_size \+ 2 = 202.*n = 201.*cross_fit"):
        reader_scores(x, y, protocol="split")


def test_same_seed_identical_output_and_seed_matters():
    x, y = _separable(n=120, shift=0.7)
    first, second = reader_scores(x, y, seed=3), reader_scores(x.copy(), y.copy(), seed=3)
    np.testing.assert_array_equal(first.scores, second.scores)
    np.testing.assert_array_equal(first.fold, second.fold)
    assert (first.layers, first.Cs) == (second.layers, second.Cs)
    assert not np.array_equal(first.fold, reader_scores(x, y, seed=4).fold)
    split_a = reader_scores(x, y, protocol="split", calibration_size=60, test_size=40, seed=3)
    split_b = reader_scores(x, y, protocol="split", calibration_size=60, test_size=40, seed=3)
    np.testing.assert_array_equal(split_a.scores, split_b.scores)


@pytest.mark.parametrize("labels", [np.zeros(40, dtype=int), np.r_[np.ones(39, dtype=int), 0]])
def test_fewer_than_two_in_minority_warns_and_returns_nan(labels):
    with pytest.warns(UndefinedMetricWarning, match="minority"):
        result = reader_scores(_noise(40), labels)
    assert np.isnan(result.scores).all() and not result.scored.any()
    assert result.layers == () and result.Cs == () and np.all(result.fold == -1)
    with pytest.warns(UndefinedMetricWarning):
        assert np.isnan(reader_auroc_score(result))


@pytest.mark.filterwarnings("error")
def test_minority_of_three_uses_three_outer_folds():
    x, y = _noise(60), np.zeros(60, dtype=int)
    y[[5, 25, 45]] = 1
    x[y == 1, 0, :3] += 3.0
    result = reader_scores(x, y, n_splits=5)
    assert result.scored.all() and len(result.layers) == 3
    assert sorted(np.unique(result.fold).tolist()) == [0, 1, 2]


@pytest.mark.filterwarnings("error")
def test_minority_of_two_skips_inner_search_last_layer_middle_C():
    x, y = _noise(40), np.zeros(40, dtype=int)
    y[[3, 30]] = 1
    result = reader_scores(x, y)
    assert result.scored.all()
    assert result.layers == (2, 2) and result.Cs == (1e-2, 1e-2)
    assert reader_scores(x, y, Cs=(1.0, 0.1, 10.0, 0.01)).Cs == (0.1, 0.1)  # lower middle of the sorted grid


def test_one_class_training_part_warns_and_leaves_its_fold_unscored(monkeypatch):
    x, y = _separable(n=40)
    positives, negatives = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    bad = (negatives[1::2], np.r_[negatives[::2], positives])  # trains on negatives only
    good = (np.r_[negatives[::2], positives], negatives[1::2])
    real_splits = reader._splits
    calls = iter([[bad, good]])
    monkeypatch.setattr(
        reader, "_splits", lambda labels, groups, **kw: iter(next(calls, None) or real_splits(labels, groups, **kw))
    )
    with pytest.warns(UndefinedMetricWarning, match="outer training part 0 holds one class"):
        result = reader_scores(x, y)
    assert not result.scored[bad[1]].any() and result.scored[good[1]].all()
    assert len(result.layers) == 1 and np.all(result.fold[good[1]] == 1)


def test_ties_go_to_later_layer_and_smaller_C():
    x, y = _separable(n=100, informative_layer=0, shift=1.0)
    same_layers = np.repeat(x[:, :1], 3, axis=1)
    assert reader_scores(same_layers, y).layers == (2,) * 5
    one_dim = x[:, 0, :1]  # a single feature ranks documents identically for every C
    result = reader_scores(one_dim, y, Cs=(10.0, 0.01, 1.0))
    assert result.layers == (0,) * 5 and result.Cs == (0.01,) * 5


@pytest.mark.filterwarnings("error")
def test_constant_columns_two_d_and_float16_features():
    x, y = _separable(n=100)
    x[:, :, 5:9] = 7.0
    result = reader_scores(x.astype(np.float16), y)
    assert result.scored.all() and np.isfinite(result.scores).all()
    flat = reader_scores(x[:, 1], y)
    assert flat.layers == (0,) * 5 and reader_auroc_score(flat) > 0.95
    assert reader_scores(x, y.astype(bool)).labels.dtype == np.int64


def test_reader_auroc_score_matches_sklearn_on_scored_documents():
    x, y = _noise(300, d=8), _labels(300)
    x[:, 2, 0] += y
    result = reader_scores(x, y, protocol="split", calibration_size=100, test_size=150)
    assert reader_auroc_score(result) == pytest.approx(roc_auc_score(y[result.scored], result.scores[result.scored]))


def test_rank_auroc_equals_roc_auc_score_with_ties():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 50)
    score = rng.integers(0, 5, 50).astype(float)  # many ties
    assert reader._binary_auroc(y, score) == pytest.approx(roc_auc_score(y, score), abs=1e-12)


def test_result_is_frozen_and_read_only():
    result = reader_scores(*_separable(n=60))
    assert isinstance(result, ReaderScores)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.protocol = "split"  # type: ignore[misc]
    with pytest.raises(ValueError):
        result.scores[0] = 0.0


_X, _Y = _noise(20, d=4), np.tile([0, 1], 10)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"features": np.zeros(20)}, r"\[n, n_layers, d\], \[n, n_layers, streams, d\] or \[n, d\], got shape \(20,\)"),
        ({"features": np.zeros((20, 1, 1, 1, 4))}, r"got shape \(20, 1, 1, 1, 4\)"),
        ({"features": np.zeros((20, 0, 4))}, "at least one layer"),
        ({"features": np.full((20, 2), "a")}, "real numbers"),
        ({"features": np.where(np.arange(20)[:, None, None] == 3, np.nan, _X)}, "finite; 1 of 20"),
        ({"features": np.where(np.arange(20)[:, None, None] == 3, np.inf, _X)}, "finite"),
        ({"labels": np.tile([0, 1], 9)}, r"shape \(20,\).*got \(18,\)"),
        ({"labels": np.tile([0, 2], 10)}, r"0/1 or bool, got values \[2\]"),
        ({"labels": np.r_[np.tile([0.0, 1.0], 9), np.nan, 1.0]}, "0/1 or bool"),
        ({"groups": list(range(19))}, "groups must have length 20"),
        ({"protocol": "kfold"}, r"one of \('cross_fit', 'split'\), got 'kfold'"),
        ({"n_splits": 1}, "n_splits must be >= 2, got 1"),
        ({"inner_splits": 1}, "inner_splits must be >= 2, got 1"),
        ({"Cs": ()}, "at least one"),
        ({"Cs": (0.1, 0.0)}, r"> 0, got \[0.1, 0.0\]"),
        ({"Cs": (-1.0,)}, "> 0"),
        ({"protocol": "split", "calibration_size": 0}, "calibration_size must be >= 1"),
    ],
)
def test_validation_errors(kwargs, match):
    arguments = {"features": _X, "labels": _Y, **kwargs}
    with pytest.raises(ValueError, match=match):
        reader_scores(arguments.pop("features"), arguments.pop("labels"), **arguments)


def test_public_names():
    assert PROTOCOLS == ("cross_fit", "split")
    assert set(reader.__all__) == {"DEFAULT_CS", "PROTOCOLS", "ReaderScores", "reader_auroc_score", "reader_scores"}
