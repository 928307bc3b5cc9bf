"""Corpus-level calibration, selective-prediction, reader and detector rows (aggregations of records).

Per-document values come from ``ProbeResults.process_results`` (gathered across ranks by lm_eval):

* ``(confidence, correct)`` pairs for ``ece``, ``selective_auroc``, ``aurc``, ``selective_acc_50/80``, ``prr``,
  ``ece_10_bin`` and ``selective_cov_acc_area``,
  ``(confidence, correct, document)`` for ``ece_scaled`` and ``(1 − confidence, noised)`` for
  ``corruption_confidence_auroc``;
* :class:`~lm_eval_probes.records.ReaderRecord` for ``lcr_auroc``, ``lcr_ece`` and ``corruption_auroc``.

Options come from the task's ``metadata`` (:class:`CalibrationOptions`), bound per task when the
task adds its rows. Records are put in a canonical order — by the document's index in its task, never
by a float value — before any seeded split, so a run's rows depend neither on how many ranks produced
the records nor on the batch size (which moves hidden states and confidences by an ulp). The math lives in :mod:`lm_eval_probes.probes.calibration` and
:mod:`lm_eval_probes.probes.reader.math`; this module only collects records, skips incomplete ones and
fits the reader once per record set (the two reader rows share one fit).
"""

from __future__ import annotations

import hashlib
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from sklearn.exceptions import UndefinedMetricWarning

from lm_eval_probes.config import unknown_message
from lm_eval_probes.probes.correlation import finite_rows
from lm_eval_probes.probes.calibration import (
    BINNINGS,
    accuracy_at_coverage_score,
    aurc_error,
    coverage_accuracy_area_score,
    expected_calibration_error,
    out_of_fold_temperature_scale,
    prediction_rejection_ratio_score,
    selective_auroc_score,
)
from lm_eval_probes.probes.reader.math import ReaderScores, reader_auroc_score, reader_scores
from lm_eval_probes.records import ReaderRecord

READER_PROTOCOLS = ("cross_fit", "split")


@dataclass(frozen=True)
class CalibrationOptions:
    """Options of the calibration and reader rows, read from a task's ``metadata`` (all optional).

    Attributes:
        ece_bins: number of ECE bins (``ece_bins``, default 15 as in the paper).
        ece_binning: ``uniform`` (equal width, the paper), ``quantile`` (equal mass, by rank, ties kept whole) or
            ``helm`` (equal mass as HELM draws them; the ``ece_10_bin`` row is HELM's ECE whatever this says).
        reader_protocol: ``cross_fit`` (5-fold out-of-fold over the run's documents) or ``split``
            (the paper's fixed calibration / test split).
        reader_folds: outer folds of ``cross_fit`` (``reader_folds``).
        reader_seed: seed of every split (recorded with the task config).
        reader_calibration_size / reader_test_size: documents of the ``split`` protocol (200 / 400).
    """

    ece_bins: int = 15
    ece_binning: str = "uniform"
    reader_protocol: str = "cross_fit"
    reader_folds: int = 5
    reader_seed: int = 0
    reader_calibration_size: int = 200
    reader_test_size: int = 400

    def __post_init__(self) -> None:
        if self.ece_binning not in BINNINGS:
            raise ValueError(unknown_message("metadata ece_binning", self.ece_binning, BINNINGS))
        if self.reader_protocol not in READER_PROTOCOLS:
            raise ValueError(unknown_message("metadata reader_protocol", self.reader_protocol, READER_PROTOCOLS))
        for name in ("ece_bins", "reader_calibration_size", "reader_test_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"metadata {name} must be >= 1, got {getattr(self, name)}")
        if self.reader_folds < 2:
            raise ValueError(f"metadata reader_folds must be >= 2, got {self.reader_folds}")

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any] | None) -> CalibrationOptions:
        """The known keys of a task's metadata (other keys belong to the task and are ignored)."""
        metadata = metadata or {}
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in metadata:
                value = metadata[f.name]
                try:
                    values[f.name] = int(value) if f.type == "int" else str(value)
                except (TypeError, ValueError):
                    raise ValueError(f"metadata {f.name} must be an integer, got {value!r}") from None
        return cls(**values)


def confidence_pairs(items: Iterable[Sequence[Any]]) -> tuple[np.ndarray, np.ndarray]:
    """``(confidence, label)`` records → two arrays, skipping records with a missing or non-finite member."""
    rows = finite_rows(items, 2)
    return rows[:, 0], rows[:, 1].astype(int)


def ece_row(items: Iterable[Sequence[Any]], options: CalibrationOptions = CalibrationOptions()) -> float:
    c, y = confidence_pairs(items)
    return expected_calibration_error(c, y, n_bins=options.ece_bins, binning=options.ece_binning)


def scaled_ece_row(items: Iterable[Sequence[Any]], options: CalibrationOptions = CalibrationOptions()) -> float:
    """ECE after temperature scaling fitted out-of-fold (each document scaled by a T fitted without it).

    ``items``: ``(confidence, correct, document)`` records; the folds follow the documents' order.
    Fewer than 3 usable records (a fold needs another fold to fit on, with at least 2 documents):
    :class:`UndefinedMetricWarning` and ``nan``.
    """
    rows = finite_rows(items, 3)
    if len(rows) < 3:
        warnings.warn(f"ece_scaled is undefined for {len(rows)} documents (needs >= 3)", UndefinedMetricWarning,
                      stacklevel=2)
        return float("nan")
    rows = rows[np.argsort(rows[:, 2], kind="stable")]
    c, y = rows[:, 0], rows[:, 1].astype(int)
    scaled = out_of_fold_temperature_scale(c, y, n_splits=options.reader_folds, seed=options.reader_seed)
    return expected_calibration_error(scaled, y, n_bins=options.ece_bins, binning=options.ece_binning)


def auroc_row(items: Iterable[Sequence[Any]], options: CalibrationOptions = CalibrationOptions()) -> float:
    return selective_auroc_score(*confidence_pairs(items))


def aurc_row(items: Iterable[Sequence[Any]], options: CalibrationOptions = CalibrationOptions()) -> float:
    return aurc_error(*confidence_pairs(items))


def prr_row(items: Iterable[Sequence[Any]], options: CalibrationOptions = CalibrationOptions()) -> float:
    return prediction_rejection_ratio_score(*confidence_pairs(items))


def helm_ece_row(items: Iterable[Sequence[Any]], options: CalibrationOptions = CalibrationOptions()) -> float:
    """HELM's ``ece_10_bin``: 10 equal-mass bins drawn as HELM draws them, whatever the task's ECE options."""
    c, y = confidence_pairs(items)
    return expected_calibration_error(c, y, n_bins=10, binning="helm")


def coverage_accuracy_row(items: Iterable[Sequence[Any]], options: CalibrationOptions = CalibrationOptions()) -> float:
    return coverage_accuracy_area_score(*confidence_pairs(items))


def coverage_row(coverage: float) -> Callable[..., float]:
    def row(items: Iterable[Sequence[Any]], options: CalibrationOptions = CalibrationOptions()) -> float:
        return accuracy_at_coverage_score(*confidence_pairs(items), coverage=coverage)

    row.__name__ = f"selective_acc_{round(coverage * 100)}_row"
    return row


def reader_fit(items: Iterable[ReaderRecord], options: CalibrationOptions = CalibrationOptions()) -> ReaderScores:
    """The reader fitted on these records (cached: the AUROC and ECE rows of one run share one fit).

    Records without features are skipped; none at all gives empty scores (the rows are then undefined).
    """
    records = [item for item in items if item is not None and item.features is not None]
    if not records:
        return _no_scores(options)
    records.sort(key=_record_key)  # a canonical order: the folds depend neither on ranks nor on float values
    shapes = {(r.features.layers, r.features.values.shape) for r in records}
    if len(shapes) != 1:
        raise ValueError(f"reader records of different layers or shapes in one task: {sorted(map(str, shapes))}")
    features = np.stack([r.features.values for r in records]).astype(np.float32)
    labels = np.asarray([int(r.label) for r in records])
    groups = None if all(r.group is None for r in records) else np.asarray([str(r.group) for r in records])
    if options.reader_protocol == "split" and len(records) < options.reader_calibration_size + 2:
        warnings.warn(f"reader_protocol 'split' needs more than reader_calibration_size + 1 = "
                      f"{options.reader_calibration_size + 1} documents, got {len(records)}: the reader rows are "
                      "undefined (use cross_fit or a smaller reader_calibration_size)", UndefinedMetricWarning, stacklevel=2)
        return _no_scores(options)
    key = _digest(features, labels, groups, options)
    if key not in _READER_CACHE:
        _READER_CACHE[key] = reader_scores(features, labels, **_reader_kwargs(options, groups))
        while len(_READER_CACHE) > _READER_CACHE_SIZE:
            _READER_CACHE.popitem(last=False)
    return _READER_CACHE[key]


def _no_scores(options: CalibrationOptions) -> ReaderScores:
    empty = np.zeros(0)
    return ReaderScores(scores=empty, labels=empty.astype(np.int64), scored=empty.astype(bool), layers=(), Cs=(),
                        protocol=options.reader_protocol, fold=empty.astype(np.int64))


def reader_auroc_row(items: Iterable[ReaderRecord], options: CalibrationOptions = CalibrationOptions()) -> float:
    return reader_auroc_score(reader_fit(items, options))


def reader_ece_row(items: Iterable[ReaderRecord], options: CalibrationOptions = CalibrationOptions()) -> float:
    fit = reader_fit(items, options)
    return expected_calibration_error(
        fit.scores[fit.scored], fit.labels[fit.scored], n_bins=options.ece_bins, binning=options.ece_binning
    )


def _reader_kwargs(options: CalibrationOptions, groups: np.ndarray | None) -> dict[str, Any]:
    return {
        "groups": groups,
        "protocol": options.reader_protocol,
        "n_splits": options.reader_folds,
        "seed": options.reader_seed,
        "calibration_size": options.reader_calibration_size,
        "test_size": options.reader_test_size,
    }


def _record_key(record: ReaderRecord) -> tuple[int, str, int]:
    """The document's index first; records without one (built by hand) by their group and label."""
    document = -1 if record.document is None else int(record.document)
    return (document, repr(record.group), record.label)


_READER_CACHE: OrderedDict[str, ReaderScores] = OrderedDict()
_READER_CACHE_SIZE = 8


def _digest(features: np.ndarray, labels: np.ndarray, groups: np.ndarray | None, options: CalibrationOptions) -> str:
    h = hashlib.sha256()
    for part in (features, labels):
        h.update(str(part.shape).encode())
        h.update(np.ascontiguousarray(part).tobytes())
    h.update(repr(None if groups is None else groups.tolist()).encode())
    h.update(repr(options).encode())
    return h.hexdigest()


CALIBRATION_ROWS: dict[str, Callable[..., float]] = {
    "ece": ece_row,
    "ece_scaled": scaled_ece_row,
    "selective_auroc": auroc_row,
    "aurc": aurc_row,
    "selective_acc_50": coverage_row(0.5),
    "selective_acc_80": coverage_row(0.8),
    "prr": prr_row,
    "ece_10_bin": helm_ece_row,
    "selective_cov_acc_area": coverage_accuracy_row,
    "lcr_auroc": reader_auroc_row,
    "lcr_ece": reader_ece_row,
    "corruption_auroc": reader_auroc_row,
    "corruption_confidence_auroc": auroc_row,
}
"""Row name → aggregation ``fn(items, options)``."""
