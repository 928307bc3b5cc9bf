"""Detection / attribution classifiers on BTE readouts, against a plain scikit-learn computation."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.preprocessing import StandardScaler

from lm_eval_probes.probes import attribution_accuracy, profile_vs_features


def _problem(n_per_class: int = 30, width: int = 6, shift: float = 3.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = ["gsm8k"] * n_per_class + ["math500"] * n_per_class + ["proofwriter"] * n_per_class
    centres = {"gsm8k": 0.0, "math500": shift, "proofwriter": -shift}
    x = np.stack([rng.normal(centres[label], 1.0, size=width) for label in labels])
    return x, labels


def test_accuracy_equals_a_hand_written_cross_fit():
    x, labels = _problem(shift=0.8)
    got = attribution_accuracy(x, labels, folds=4, seed=3)
    classes = sorted(set(labels), key=repr)
    y = np.array([classes.index(label) for label in labels])
    hits = 0
    for train, test in StratifiedKFold(n_splits=4, shuffle=True, random_state=3).split(x, y):
        scaler = StandardScaler().fit(x[train])
        model = LogisticRegression(C=1.0, max_iter=2000).fit(scaler.transform(x[train]), y[train])
        hits += int((model.predict(scaler.transform(x[test])) == y[test]).sum())
    assert got.accuracy == pytest.approx(hits / len(y))
    assert got.chance == pytest.approx(1 / 3) and got.n_features == 6 and got.labels == tuple(classes)


def test_separable_classes_are_told_apart_and_noise_is_not():
    x, labels = _problem(shift=6.0)
    assert attribution_accuracy(x, labels).accuracy > 0.95
    noise = np.random.default_rng(1).normal(size=x.shape)
    assert attribution_accuracy(noise, labels).accuracy < 0.6


def test_profile_vs_features_uses_the_same_documents():
    x, labels = _problem(shift=1.0, width=4)
    features = np.concatenate([x, np.random.default_rng(2).normal(size=(len(labels), 40))], axis=1)
    both = profile_vs_features(x, features, labels, folds=3)
    assert set(both) == {"profile", "features"}
    assert both["profile"].n_features == 4 and both["features"].n_features == 44
    with pytest.raises(ValueError, match="same documents"):
        profile_vs_features(x, features[:-1], labels)


@pytest.mark.parametrize(
    "features,labels,kwargs,match",
    [
        (np.zeros((4, 2)), ["a"] * 4, {}, "two classes"),
        (np.zeros((4, 2)), ["a", "b"] * 2, {"folds": 5}, "at least folds=5"),
        (np.full((10, 2), np.nan), ["a", "b"] * 5, {}, "finite"),
        (np.zeros(10), ["a", "b"] * 5, {}, r"\[n, f\]"),
        (np.zeros((10, 2)), ["a", "b"] * 4, {}, "labels for 10"),
        (np.zeros((10, 2)), ["a", "b"] * 5, {"folds": 1}, "folds must be"),
    ],
)
def test_validation(features, labels, kwargs, match):
    with pytest.raises(ValueError, match=match):
        attribution_accuracy(features, labels, **kwargs)
