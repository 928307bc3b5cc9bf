"""Paired comparisons of two models on the documents both ran: difference, paired-bootstrap CI, p-value, Holm.

For a pair (a, b) and a task row, the documents are paired by ``doc_id`` in the samples files (the row's
filter); documents only one model ran, or where either record is undefined, are left out.

* **Difference** ``diff`` = row(a) − row(b) on the paired documents: the mean of the per-document
  differences for mean rows, the row recomputed on each model's paired records for corpus rows
  (:mod:`.corpus_rows`, every resample at once).

  Mean rows (lm_eval's acc, acc_norm, exact_match, … and the plugin's):
  `tcb_log10`, `tcb_log10_min`, `tcb_ablation_ordered`, `tcb_cluster_log10`, `tcb_disperse_log10`, `bte_energy`,
  `omega`, `margin`, `margin_min`, `confidence`, `reveal_step`, `response_tokens`.

  Corpus rows, recomputed from the per-document records on every resample and permutation:
  `tcb_spearman`, `tcb_spearman_partial`, `tcb_spearman_partial_prompt`, `bte_spearman`, `bte_spearman_partial`,
  `bte_spearman_partial_prompt`, `omega_spearman`, `omega_spearman_partial`, `omega_spearman_partial_prompt`,
  `margin_spearman`, `margin_spearman_partial`, `margin_spearman_partial_prompt`, `length_spearman`,
  `prompt_length_spearman`, `ece`, `selective_auroc`, `aurc`, `selective_acc_50`, `selective_acc_80`, `prr`,
  `ece_10_bin`, `selective_cov_acc_area`, `corruption_confidence_auroc`, `ece_at_step_25`,
  `selective_auroc_at_step_25`, `ece_at_step_50`, `selective_auroc_at_step_50`, `ece_at_step_75`,
  `selective_auroc_at_step_75`, `ece_at_step_100`, `selective_auroc_at_step_100`.

  Not compared: `bte_profile`, `omega_trajectory`, `margin_support` (lists per document, no single number),
  `empty_responses`, `answer_unlocated`, `difficulty_missing` (counts), `trace` (the per-token trace of
  ``probe_traces=true``: no single number), `ece_scaled` (fitted out-of-fold: a resample repeats documents across
  folds), `lcr_auroc`, `lcr_ece`, `corruption_auroc` (the reader's features are not in the samples).

* **Interval**: the paired percentile bootstrap (:mod:`.bootstrap`): one set of document indices per
  resample, applied to both models, so what the documents share cancels out of the difference.
  Seeded by (seed, "paired", model a's label, model b's label, task, filter): never a path, and independent
  of the other models.
* **p-value** (two-sided): McNemar's exact test for 0/1 rows (both models' values all 0 or 1: ``acc``,
  ``exact_match``): under H0 the discordant documents split 50/50, so p = ``binomtest(n_ab, n_ab + n_ba,
  0.5)`` (McNemar, Psychometrika 1947; the exact binomial form); 1 when no document is discordant.
  Other rows: a paired permutation test (Good, "Permutation Tests", 2000): each permutation swaps the two
  models' records of each document with probability ½ and recomputes the difference; p = (1 + #{|d*| ≥
  |d|}) / (1 + #defined permutations), ``n_resamples`` permutations (for mean rows this is the sign-flip
  test of the per-document differences).
* **Holm** (Holm, Scand. J. Statist. 1979): step-down adjusted p-values within a family — the headline
  rows of the tasks that enter the win rate form one family (the overview table); every other row is
  adjusted within its task and its row family (``Row.family`` of its declaration: ``probe``, ``confidence``,
  ``difficulty``, …; lm_eval's own rows: ``lm_eval``), all pairs together — the family ``"<task>/<family>"``;
  the rows without a better direction (baselines and counts, ``Row.scored`` False: ``higher_is_better``
  ``None``) form ``"<task>/<family> (no direction)"`` and never name a winner. Directions are the
  declarations' (``rows_by_name()[name].higher_is_better`` where ``.scored``).

Detector tasks (``*_detect``: clean and noised copies of one task's documents) and reference tasks
(``*_ref``) do not enter the win rate unless asked (:data:`AUXILIARY_TASK`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import stats

from lm_eval_probes.metrics.calibration import CalibrationOptions
from lm_eval_probes.reports.bootstrap import model_seed_label, percentile_interval, resample_indices, stable_key
from lm_eval_probes.reports.corpus_rows import CorpusRow, corpus_row
from lm_eval_probes.reports.reading import ModelResults, TaskResult
from lm_eval_probes.rows import rows_by_name

DEFAULT_ALPHA = 0.05
AUXILIARY_SUFFIXES: tuple[str, ...] = ("_detect", "_ref")
"""Task-name endings of detector and reference tasks, left out of the win rate by default."""
OVERVIEW_FAMILY = "overview"
NO_DIRECTION_SUFFIX = " (no direction)"
STOCK_FAMILY = "lm_eval"
"""The row family of lm_eval's own rows (``acc``, ``exact_match``, …) in a Holm family name."""
MCNEMAR = "mcnemar_exact"
PERMUTATION = "paired_permutation"


def is_auxiliary_task(task: str) -> bool:
    """True for detector (``*_detect``) and reference (``*_ref``) tasks."""
    return task.endswith(AUXILIARY_SUFFIXES)


@dataclass(frozen=True)
class PairedComparison:
    """Model a against model b on one task row, over the ``n_documents`` both ran.

    ``diff`` = a − b (``nan`` when undefined); ``ci_low``/``ci_high``: the paired-bootstrap interval of the
    difference; ``p_value``: two-sided, from ``test`` (:data:`MCNEMAR` or :data:`PERMUTATION`); ``p_holm``:
    Holm-adjusted within ``family`` (:data:`OVERVIEW_FAMILY` or the task's name).
    """

    model_a: str
    model_b: str
    task: str
    metric: str
    filter: str
    higher_is_better: bool | None
    diff: float
    ci_low: float
    ci_high: float
    p_value: float
    p_holm: float
    n_documents: int
    test: str
    family: str

    def winner(self, alpha: float = DEFAULT_ALPHA) -> str | None:
        """The model that is significantly better (``p_holm`` < alpha, in the row's direction); ``None`` when
        the difference is not significant, zero, undefined or the row has no direction."""
        if self.higher_is_better is None or not math.isfinite(self.p_holm) or self.p_holm >= alpha or not self.diff:
            return None
        a_better = (self.diff > 0) == self.higher_is_better
        return self.model_a if a_better else self.model_b

    def to_json(self, alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
        def number(value: float) -> float | None:
            return float(value) if math.isfinite(value) else None

        return {"model_a": self.model_a, "model_b": self.model_b, "task": self.task, "metric": self.metric,
                "filter": self.filter, "diff": number(self.diff), "ci_low": number(self.ci_low),
                "ci_high": number(self.ci_high), "p_value": number(self.p_value), "p_holm": number(self.p_holm),
                "n_documents": self.n_documents, "test": self.test, "family": self.family,
                "higher_is_better": self.higher_is_better, "significant_winner": self.winner(alpha)}


def holm_adjusted(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values: with the m defined p-values sorted p₍₁₎ ≤ … ≤ p₍ₘ₎,
    p̃₍ᵢ₎ = max_{j ≤ i} min(1, (m − j + 1) p₍ⱼ₎). Rejecting p̃ < α controls the family-wise error at α under
    any dependence. ``nan`` entries stay ``nan`` and do not count in m."""
    p = np.asarray(p_values, dtype=float)
    adjusted = np.full(p.shape, np.nan)
    defined = np.flatnonzero(np.isfinite(p))
    m = len(defined)
    running = 0.0
    for rank, i in enumerate(defined[np.argsort(p[defined], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def mcnemar_exact(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided exact McNemar p-value of paired 0/1 outcomes ``a``, ``b`` (``[n]`` each): the binomial test
    of n_ab = #(a=1, b=0) out of the n_ab + n_ba discordant documents at ½; 1 when none is discordant."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be 1-D of one length, got shapes {a.shape} and {b.shape}")
    a_only, b_only = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    if a_only + b_only == 0:
        return 1.0
    return float(stats.binomtest(a_only, a_only + b_only, 0.5).pvalue)


@dataclass(frozen=True)
class PairedResult:
    """What :func:`paired_difference` computed: ``diff`` (a − b), its interval, two-sided p and the test."""

    diff: float
    ci_low: float
    ci_high: float
    p_value: float
    n_documents: int
    test: str


def paired_difference(
    a: np.ndarray,
    b: np.ndarray,
    *,
    n_resamples: int,
    seed: int,
    key: Sequence[str],
    level: float = 0.95,
    row: CorpusRow | None = None,
    options: CalibrationOptions | None = None,
) -> PairedResult:
    """Paired difference a − b of one row over the same documents, with its bootstrap CI and p-value.

    Args:
        a, b: per-document values ``[n]`` (a mean row) or records ``[n, width]`` (a corpus row), document i
            of ``a`` paired with document i of ``b``; all finite.
        n_resamples: bootstrap resamples, and permutations for the permutation test.
        seed, key: the resamples come from ``SeedSequence([seed, crc32(key)...])`` (:func:`resample_indices`);
            the permutations from the same key with ``"swap"`` prepended.
        level: interval coverage.
        row: the corpus row to recompute on each model's records; ``None`` for a mean row.
        options: the task's calibration options (corpus rows).

    Returns:
        The difference (``nan`` when the row is undefined on the paired documents), the percentile bootstrap
        interval of the difference, and the p-value: exact McNemar when a mean row's values are all 0/1,
        otherwise the paired permutation test.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired values must have one shape, got {a.shape} and {b.shape}")
    n = len(a)
    options = options or CalibrationOptions()
    both = np.concatenate([a, b])
    indices = resample_indices(n, n_resamples=n_resamples, seed=seed, key=key)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), *stable_key("swap", *key)]))
    swap = rng.integers(0, 2, size=(n_resamples, n)).astype(bool)
    own = np.arange(n)

    def difference(a_indices: np.ndarray, b_indices: np.ndarray) -> np.ndarray:
        """``[B]`` row(both[a_indices[k]]) − row(both[b_indices[k]]): rows of ``both`` are a's then b's."""
        if row is None:
            return both[a_indices].mean(axis=1) - both[b_indices].mean(axis=1)
        return row.on_resamples(both, a_indices, options) - row.on_resamples(both, b_indices, options)

    if n == 0:
        return PairedResult(math.nan, math.nan, math.nan, math.nan, 0, PERMUTATION)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        diff = float(difference(own[None], own[None] + n)[0])
        interval = percentile_interval(difference(indices, indices + n), n_documents=n, level=level)
        binary = row is None and bool(np.isin(both, (0.0, 1.0)).all())
        if binary:
            p, test = mcnemar_exact(a, b), MCNEMAR
        elif not math.isfinite(diff):
            p, test = math.nan, PERMUTATION
        else:
            permuted = difference(np.where(swap, own + n, own), np.where(swap, own, own + n))
            permuted = permuted[np.isfinite(permuted)]
            tolerance = 1e-12 * max(1.0, abs(diff))
            p, test = (1 + int((np.abs(permuted) >= abs(diff) - tolerance).sum())) / (1 + len(permuted)), PERMUTATION
    return PairedResult(diff, interval.low, interval.high, float(p), n, test)


def _by_document(result: TaskResult, filter_name: str) -> dict[Any, Mapping[str, Any]]:
    return {s["doc_id"]: s for s in result.samples_of(filter_name) if "doc_id" in s}


def _number(value: Any) -> float | None:
    if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
        return float(value)
    return None


def _record(value: Any, width: int) -> list[float] | None:
    if not isinstance(value, (list, tuple)) or len(value) != width:
        return None
    numbers = [_number(v) for v in value]
    return None if any(v is None for v in numbers) else numbers  # type: ignore[misc]


def is_mean_row(result: TaskResult, metric: str, filter_name: str) -> bool:
    """True when the row is a mean of per-document numbers: the plugin's ``mean`` rows, and any other row
    (lm_eval's ``acc``, ``exact_match``, …) whose value equals the mean of its numeric per-document values."""
    declared = rows_by_name().get(metric)
    if declared is not None:
        return declared.aggregation == "mean"
    found = result.metric(metric, filter_name)
    values = [_number(s.get(metric)) for s in result.samples_of(filter_name)]
    values = [v for v in values if v is not None]
    if found is None or not values or not math.isfinite(found.value):
        return False
    return abs(float(np.mean(values)) - found.value) <= 1e-9 * max(1.0, abs(found.value))


def compare_models(
    a: ModelResults,
    b: ModelResults,
    task: str,
    metric: str,
    filter_name: str,
    *,
    higher_is_better: bool | None,
    n_resamples: int,
    seed: int,
    level: float,
) -> PairedComparison | None:
    """Model ``a`` against ``b`` on one task row over the documents both ran (paired by ``doc_id``);
    ``None`` when the row cannot be paired: no samples, neither a mean row nor a corpus row, or a corpus row
    without an all-resamples-at-once form (a loop over resamples and permutations would cost seconds per pair
    and task; every corpus row of :mod:`lm_eval_probes.rows` has one).
    ``p_holm`` is left equal to ``p_value``: :func:`pairwise_comparisons` adjusts it within its family."""
    result_a, result_b = a.tasks.get(task), b.tasks.get(task)
    if result_a is None or result_b is None or not result_a.samples or not result_b.samples:
        return None
    row = corpus_row(metric)
    if row is not None and row.resampled is None:
        return None  # no all-resamples-at-once form: 4 × n_resamples recomputations per pair would take seconds
    if row is None and not (is_mean_row(result_a, metric, filter_name) and is_mean_row(result_b, metric, filter_name)):
        return None
    docs_a, docs_b = _by_document(result_a, filter_name), _by_document(result_b, filter_name)
    pairs = []
    for doc_id in sorted(set(docs_a) & set(docs_b), key=lambda d: (str(type(d)), d)):
        if row is None:
            x, y = _number(docs_a[doc_id].get(metric)), _number(docs_b[doc_id].get(metric))
        else:
            x, y = _record(docs_a[doc_id].get(metric), row.width), _record(docs_b[doc_id].get(metric), row.width)
        if x is not None and y is not None:
            pairs.append((x, y))
    if not pairs:
        return None
    values_a = np.array([x for x, _ in pairs], dtype=float)
    values_b = np.array([y for _, y in pairs], dtype=float)
    key = ("paired", model_seed_label(a.name), model_seed_label(b.name), task, filter_name)
    paired = paired_difference(values_a, values_b, n_resamples=n_resamples, seed=seed, key=key, level=level, row=row,
                               options=CalibrationOptions.from_metadata(result_a.metadata))
    return PairedComparison(a.name, b.name, task, metric, filter_name, higher_is_better, paired.diff, paired.ci_low,
                            paired.ci_high, paired.p_value, paired.p_value, paired.n_documents, paired.test, task)


@dataclass(frozen=True)
class RowSpec:
    """A task row to compare: (task, metric, filter, direction) and whether it is the task's headline row.

    ``higher_is_better`` is ``None`` for a row without a better direction (a baseline or a count,
    ``Row.scored`` False): its comparisons are made but name no winner.
    """

    task: str
    metric: str
    filter: str
    higher_is_better: bool | None
    headline: bool


def comparison_family(spec: RowSpec, include_auxiliary_tasks: bool = False) -> str:
    """The Holm family of a row's comparisons: :data:`OVERVIEW_FAMILY` for the headline rows of the tasks in the
    win rate; ``"<task>/<row family>"`` for its other rows with a direction (the row's declared family, lm_eval's
    rows :data:`STOCK_FAMILY`); ``"<task>/<row family> (no direction)"`` for its rows without one (baselines,
    counts), so that these descriptive comparisons do not weaken the others."""
    if spec.headline and spec.higher_is_better is not None and (include_auxiliary_tasks or not is_auxiliary_task(spec.task)):
        return OVERVIEW_FAMILY
    declared = rows_by_name().get(spec.metric)
    family = f"{spec.task}/{declared.family if declared is not None else STOCK_FAMILY}"
    return family if spec.higher_is_better is not None else f"{family}{NO_DIRECTION_SUFFIX}"


def pairwise_comparisons(
    models: Sequence[ModelResults],
    rows: Sequence[RowSpec],
    *,
    n_resamples: int,
    seed: int,
    level: float,
    include_auxiliary_tasks: bool = False,
) -> tuple[PairedComparison, ...]:
    """Every pair of models (in the order of ``models``: a before b) on every row both can be paired on,
    with Holm-adjusted p-values: the headline rows of the tasks in the win rate (detector and reference tasks
    only with ``include_auxiliary_tasks``) form the family :data:`OVERVIEW_FAMILY`; every other row is adjusted
    within its task, rows without a direction apart (:func:`comparison_family`)."""
    found: list[PairedComparison] = []
    for spec in rows:
        family = comparison_family(spec, include_auxiliary_tasks)
        for i, a in enumerate(models):
            for b in models[i + 1:]:
                comparison = compare_models(a, b, spec.task, spec.metric, spec.filter, higher_is_better=spec.higher_is_better,
                                            n_resamples=n_resamples, seed=seed, level=level)
                if comparison is not None:
                    found.append(replace(comparison, family=family))
    adjusted = list(found)
    for family in dict.fromkeys(c.family for c in found):
        members = [k for k, c in enumerate(found) if c.family == family]
        for k, p in zip(members, holm_adjusted([found[k].p_value for k in members])):
            adjusted[k] = replace(found[k], p_holm=float(p))
    return tuple(adjusted)
