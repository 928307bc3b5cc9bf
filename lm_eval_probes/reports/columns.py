"""What each column of the leaderboard means, read from the declarations (:mod:`lm_eval_probes.declarations`).

For a results row this module gives its one-line description (a header's ``title``), its direction and
whether it has one (``Row.scored``: baselines and counts have none, so they get no arrow and never win a
comparison), whether it is a headline column of a task table's compact view, and the glossary: every row
shown, grouped by the probe or family that makes it, with the probe's summary, formula, what it reads and
its paper.

Nothing here names a plugin row: the names, descriptions and directions are the declarations', read from the
registry (:mod:`lm_eval_probes.registry`) when a function is called, so that a probe registered after this module was
imported gets its column's meaning and its glossary entry. lm_eval's own correctness metrics (:data:`STOCK_METRICS`)
are described here, since nothing of the plugin declares them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lm_eval_probes import registry
from lm_eval_probes.declarations import (
    BASELINE_ROWS,
    CONFIDENCE,
    CONFIDENCE_ROWS,
    ECE,
    RESPONSE_ROWS,
    SELECTIVE_AUROC,
    TRAJECTORY_ROWS,
    Row,
    detector_rows,
)
from lm_eval_probes.rows import all_rows, rows_by_name

STOCK_SOURCE = "lm-evaluation-harness (EleutherAI): the task's own metric"

STOCK_METRICS: dict[str, str] = {
    "acc": "accuracy: fraction of documents whose most likely option (summed log-likelihood) is the gold one",
    "acc_norm": "accuracy with each option's log-likelihood divided by its length in characters",
    "exact_match": "fraction of documents whose (filtered) generated answer equals the reference",
}
"""lm_eval's correctness metrics (higher is better), which the plugin reports beside but does not declare."""

ARROWS: dict[bool | None, str] = {True: "↑", False: "↓", None: ""}


@dataclass(frozen=True)
class ColumnMeaning:
    """What one metric's column means.

    Attributes:
        name: the metric name (``<name>,<filter>`` in lm_eval's results).
        description: one line (the declaration's, lm_eval's correctness metrics' here, else a fallback).
        higher_is_better: the declared direction (a metric nothing declares: the results file's).
        scored: whether that direction makes a better value (``False``: a baseline or a count; no arrow, no win).
        declared: whether the plugin declares the row.
    """

    name: str
    description: str
    higher_is_better: bool | None
    scored: bool
    declared: bool

    @property
    def direction(self) -> bool | None:
        """``higher_is_better`` where the row has a better direction, else ``None``."""
        return self.higher_is_better if self.scored else None

    @property
    def arrow(self) -> str:
        return ARROWS[self.direction]

    @property
    def direction_text(self) -> str:
        if self.direction is None:
            return "none: a baseline or a count" if not self.scored else "not given in the results file"
        return "higher is better" if self.direction else "lower is better"


def paired_test(metric: str) -> str:
    """How the leaderboard compares two models on ``metric`` (:mod:`.pairwise`), in a few words."""
    from lm_eval_probes.reports.corpus_rows import corpus_row

    row = rows_by_name().get(metric)
    if row is None or row.aggregation == "mean":
        return ("McNemar's exact test when 0/1, else a paired permutation test; paired bootstrap interval"
                if row is None else "paired permutation test; paired bootstrap interval")
    corpus = corpus_row(metric)
    if corpus is not None and corpus.resampled is not None:
        return "recomputed on each resample: paired permutation test, paired bootstrap interval"
    return "not compared"


def meaning(metric: str, results_direction: bool | None = None) -> ColumnMeaning:
    """The meaning of ``metric``'s column; ``results_direction`` (the results file's ``higher_is_better``) is used
    only for a metric the plugin does not declare (lm_eval's correctness metrics: higher is better without it)."""
    row = rows_by_name().get(metric)
    if row is not None:
        return ColumnMeaning(metric, row.description, row.higher_is_better, row.scored, True)
    if metric in STOCK_METRICS:
        return ColumnMeaning(metric, STOCK_METRICS[metric], True if results_direction is None else results_direction,
                             True, False)
    return ColumnMeaning(metric, f"lm_eval metric {metric} (not declared by lm-eval-probes; direction from the "
                                 "results file)", results_direction, True, False)


def headline_rows() -> frozenset[str]:
    """The rows of a task table's compact view (beside the task's correctness row): confidence, ECE and selective
    AUROC, each probe's headline row (its first ``float`` row; a probe without one: the first row of each family
    it feeds, i.e. the reader's AUROC and the detector's) and each probe's ρ with difficulty, of the probes registered
    now."""
    names = {CONFIDENCE.name, ECE.name, SELECTIVE_AUROC.name}
    for probe in registry.probes():
        headline = next((row for row in probe.rows if row.value == "float"), None)  # ProbeDeclaration.row("float")
        if headline is not None:
            names.add(headline.name)
        first_of_family: dict[str, Row] = {}
        for row in probe.feeds:
            first_of_family.setdefault(row.family, row)
        names |= {row.name for row in first_of_family.values()}
        names |= {row.name for row in probe.difficulty_rows()[:1]}
    return frozenset(names)


@dataclass(frozen=True)
class GlossaryGroup:
    """The glossary's rows of one probe or family, with what the declarations say of it."""

    key: str
    title: str
    summary: str
    formula: str
    reads: str
    paper: str
    entries: tuple[ColumnMeaning, ...]


@dataclass(frozen=True)
class _Family:
    key: str
    title: str
    summary: str
    rows: tuple[Row, ...]
    formula: str = ""
    reads: str = ""
    paper: str = ""


def _families() -> tuple[_Family, ...]:
    """The glossary's groups, in order, of the probes registered now: the response, calibration, each probe, the
    difficulty baselines, the detector's baseline, the denoising trajectory, and any other row of the plugin."""
    found = registry.probes()
    fed = {row.name for probe in found for row in probe.feeds}
    families = [
        _Family("response", "The response", "What every model reports, whichever probes: the answer's confidence "
                "and what was probed.", RESPONSE_ROWS),
        _Family("calibration", "Calibration and selective prediction",
                f"How well {CONFIDENCE.name} tracks correctness (tasks whose correctness is defined): its calibration "
                "error, and how well it ranks right above wrong answers (selective prediction). PRR with tied "
                "confidences: the expectation over every order of the tied documents (as AURC and the coverage area); "
                "on a task whose documents are all right or all wrong it is undefined (the oracle is no better than "
                "random), as selective AUROC is. lm-polygraph's own `prr` key is the raw prediction-rejection area, "
                "which is this project's selective_cov_acc_area; this project's prr is the normalised ratio.",
                CONFIDENCE_ROWS,
                paper="\"Unsure but Certain\" (arXiv 2608.08791) for the set; ECE and temperature scaling: Guo et al., "
                      "\"On Calibration of Modern Neural Networks\" (ICML 2017); AURC: Geifman et al. (ICLR 2019); the "
                      "prediction rejection ratio: Malinin et al., as lm-polygraph computes it (Fadeeva et al. 2023); "
                      "ece_10_bin and selective_cov_acc_area: HELM (Liang et al. 2022)"),
    ]
    families += [_Family(f"probe-{probe.name}", f"probes={probe.name}", probe.summary,
                         probe.rows + probe.difficulty_rows() + probe.feeds, probe.formula, probe.reads, probe.paper)
                 for probe in found]
    families += [
        _Family("baselines", "Difficulty baselines", "What every ρ with difficulty is read against: the response's "
                "and the prompt's length ranked against the same labels. No better direction.", BASELINE_ROWS),
        _Family("detector", "Corruption detection from confidence", "Paired clean/noised tasks: the output "
                "confidence as the detector's baseline.", tuple(row for row in detector_rows() if row.name not in fed),
                paper="\"Unsure but Certain\" (arXiv 2608.08791)"),
        _Family("trajectory", "Denoising trajectory", "Masked-diffusion generations (hf-probes-diffusion): "
                "calibration of the confidence at points along the denoising steps.", TRAJECTORY_ROWS,
                paper="reveal-time confidence: \"Unsure but Certain\" (arXiv 2608.08791); its calibration along the "
                      "denoising trajectory is this plugin's"),
    ]
    grouped = {row.name for family in families for row in family.rows}
    others = tuple(row for row in all_rows() if row.name not in grouped)
    if others:
        families.append(_Family("other", "Other rows", "Rows of the plugin outside the families above.", others))
    return tuple(families)


def glossary(metrics: Iterable[str]) -> tuple[GlossaryGroup, ...]:
    """The glossary of the metrics shown: lm_eval's own first, then the plugin's families in declaration order,
    each with its rows in declaration order. Each metric appears once; a metric the plugin does not declare now
    (no row of :func:`~lm_eval_probes.rows.all_rows`) is lm_eval's."""
    shown = set(metrics)
    groups = []
    stock = tuple(meaning(name) for name in sorted(shown - set(rows_by_name()),
                                                 key=lambda n: (list(STOCK_METRICS).index(n) if n in STOCK_METRICS
                                                                else len(STOCK_METRICS), n)))
    if stock:
        groups.append(GlossaryGroup("lm-eval", "lm_eval's own metrics", "The task's correctness rows, as lm_eval "
                                    "computes them.", "", "", STOCK_SOURCE, stock))
    for family in _families():
        entries = tuple(meaning(row.name) for row in family.rows if row.name in shown)
        if entries:
            groups.append(GlossaryGroup(family.key, family.title, family.summary, family.formula, family.reads,
                                        family.paper, entries))
    return tuple(groups)
