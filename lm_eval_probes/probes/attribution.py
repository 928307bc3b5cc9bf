"""Detection / attribution classifiers on BTE trajectory readouts ("Measuring the Path to a Prediction").

The paper reads each document's belief trajectory in two ways — the L-dim depth profile e(l) and the
11·L statistics of every transition over the response positions (:func:`~lm_eval_probes.probes.bte.math.
transition_statistics`) — and fits logistic regressions that tell, e.g., which benchmark a document came
from (attribution; the paper: 86.4 % from the 32-dim profile, 93.2 % from the 352 features) or whether
it is of one kind or another (detection). :func:`attribution_accuracy` is that classifier, cross-fitted:
every document is predicted by a model fitted on the other folds, so the accuracy is out of sample.
:func:`profile_vs_features` fits it on both readouts of the same documents.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

__all__ = ["AttributionResult", "attribution_accuracy", "profile_vs_features"]


@dataclass(frozen=True)
class AttributionResult:
    """Out-of-sample accuracy of one readout and what it is compared with.

    Attributes:
        accuracy: fraction of documents whose cross-fitted prediction is their label, in [0, 1].
        chance: the majority label's share (what always guessing it scores).
        n_features: the readout's width.
        n_documents: documents classified.
        labels: the classes, sorted.
    """

    accuracy: float
    chance: float
    n_features: int
    n_documents: int
    labels: tuple[Hashable, ...]


def attribution_accuracy(
    features: ArrayLike, labels: Sequence[Hashable], *, folds: int = 5, seed: int = 0, C: float = 1.0
) -> AttributionResult:
    """Cross-fitted multinomial logistic regression (standardised features, L2 penalty ``C``) of ``labels``
    from ``features``.

    Args:
        features: ``[n, f]`` finite floats, one row per document (a depth profile, or flattened statistics).
        labels: ``n`` hashable labels (e.g. the task each document came from), at least two classes, each
            with at least ``folds`` documents.
        folds: stratified folds (shuffled with ``seed``); each document is predicted by the model fitted on
            the other folds.
        seed: seed of the fold assignment (the fit itself is deterministic).
        C: inverse regularisation strength.

    Returns:
        :class:`AttributionResult`; higher accuracy = the readout tells the classes apart better.
    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"features must be a non-empty [n, f] array, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("features must be finite (drop documents without response positions first)")
    if len(labels) != x.shape[0]:
        raise ValueError(f"got {len(labels)} labels for {x.shape[0]} documents")
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ValueError(f"folds must be an int >= 2, got {folds!r}")
    if not (C > 0 and np.isfinite(C)):
        raise ValueError(f"C must be finite and > 0, got {C!r}")
    classes = sorted(set(labels), key=repr)
    if len(classes) < 2:
        raise ValueError(f"need at least two classes, got {classes}")
    codes = np.array([classes.index(label) for label in labels])
    counts = np.bincount(codes, minlength=len(classes))
    if counts.min() < folds:
        raise ValueError(f"every class needs at least folds={folds} documents; the smallest has {counts.min()}")
    model = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=2000))
    split = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    predicted = cross_val_predict(model, x, codes, cv=split)
    return AttributionResult(
        accuracy=float((predicted == codes).mean()),
        chance=float(counts.max() / counts.sum()),
        n_features=x.shape[1],
        n_documents=x.shape[0],
        labels=tuple(classes),
    )


def profile_vs_features(
    profiles: ArrayLike, features: ArrayLike, labels: Sequence[Hashable], *, folds: int = 5, seed: int = 0
) -> dict[str, AttributionResult]:
    """The paper's comparison: the same classifier on the L-dim depth profiles (``[n, L]``) and on the
    11·L transition statistics (``[n, 11·L]``) of the same documents, on the same folds.

    Returns ``{"profile": ..., "features": ...}``.
    """
    p, f = np.asarray(profiles, dtype=np.float64), np.asarray(features, dtype=np.float64)
    if p.ndim != 2 or f.ndim != 2 or p.shape[0] != f.shape[0]:
        raise ValueError(f"profiles [n, L] and features [n, 11·L] must describe the same documents, got {p.shape} "
                         f"and {f.shape}")
    return {
        "profile": attribution_accuracy(p, labels, folds=folds, seed=seed),
        "features": attribution_accuracy(f, labels, folds=folds, seed=seed),
    }
