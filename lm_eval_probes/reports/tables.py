"""The leaderboard's tables: cells with stderr or bootstrap CI, per-task tables, the overview, robustness,
support tokens.

Everything here is data plus plain-text rendering (Markdown, CSV); :mod:`.html` renders the same
objects as a page. Cells distinguish *missing* (the model has no such task or row) from *undefined*
(the row exists and is ``null``/``NaN``: e.g. AUROC when every answer is wrong); neither is 0.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from dataclasses import dataclass

from lm_eval_probes.reports.bootstrap import ConfidenceInterval, model_seed_label, percentile_interval, resample_indices
from lm_eval_probes.reports.columns import ARROWS, glossary, headline_rows, meaning, paired_test
from lm_eval_probes.metrics.calibration import CalibrationOptions
from lm_eval_probes.reports.corpus_rows import corpus_row, records
from lm_eval_probes.reports.pairwise import DEFAULT_ALPHA, PairedComparison, is_auxiliary_task
from lm_eval_probes.reports.ranks import OVERVIEW_TASK, RankInterval, group_text
from lm_eval_probes.reports.sweep_status import FailedPair
from lm_eval_probes.reports.reading import ModelResults, TaskResult
from lm_eval_probes import registry
from lm_eval_probes.declarations import (
    ANSWER_UNLOCATED,
    CONFIDENCE,
    CONFIDENCE_ROWS,
    DIFFICULTY_MISSING,
    ECE,
    LENGTH_SPEARMAN,
    PROMPT_LENGTH_SPEARMAN,
    RESPONSE_TOKENS,
    SELECTIVE_AUROC,
    detector_rows,
    reader_rows,
)
from lm_eval_probes.rows import support_mean

PRIMARY_METRICS: tuple[str, ...] = ("acc", "exact_match", "acc_norm")
"""The correctness row of a task: the first of these it has."""


def metric_order() -> tuple[str, ...]:
    """Column order inside a task, of the probes registered now: correctness, confidence and its calibration, the
    reader's and the detector's rows, each probe's rows and ρ, then the baselines and counts; rows not listed (stock
    metrics, rows nothing declares) follow alphabetically (:func:`metric_sort_key`)."""
    return ("acc", "acc_norm", "exact_match") + tuple(
        row.name for row in (
            CONFIDENCE, *CONFIDENCE_ROWS, *reader_rows(), *detector_rows(),
            *(row for probe in registry.probes() for row in (*probe.rows, *probe.difficulty_rows())),
            LENGTH_SPEARMAN, PROMPT_LENGTH_SPEARMAN, RESPONSE_TOKENS, DIFFICULTY_MISSING, ANSWER_UNLOCATED,
        )
    )


NOISE_TASK = re.compile(r"^(?P<base>.+)_noise_(?P<operator>[A-Za-z0-9]+)$")
MISSING_TEXT = "—"
UNDEFINED_TEXT = "undefined"


@dataclass(frozen=True)
class Cell:
    """One value of the leaderboard.

    Attributes:
        present: False when the model has no such task/row (shown as missing, ``—``).
        value: the results value; ``nan`` when undefined (``null``/``NaN`` in the file).
        stderr: lm_eval's standard error, if it gave one.
        ci: bootstrap interval from the samples, for rows lm_eval leaves without stderr.
    """

    present: bool
    value: float = math.nan
    stderr: float | None = None
    ci: ConfidenceInterval | None = None

    @property
    def defined(self) -> bool:
        return self.present and math.isfinite(self.value)

    def text(self, digits: int = 3) -> str:
        """``0.512 ± 0.020``, ``0.512 [0.431, 0.590]``, ``undefined`` or ``—``."""
        value, spread = self.parts(digits)
        return f"{value} {spread}" if spread else value

    def parts(self, digits: int = 3) -> tuple[str, str]:
        """The value's text and its spread's (``± 0.020``, ``[0.431, 0.590]`` or empty)."""
        if not self.present:
            return MISSING_TEXT, ""
        if not math.isfinite(self.value):
            return UNDEFINED_TEXT, ""
        if self.stderr is not None:
            return f"{self.value:.{digits}f}", f"± {self.stderr:.{digits}f}"
        if self.ci is not None and self.ci.defined:
            return f"{self.value:.{digits}f}", f"[{self.ci.low:.{digits}f}, {self.ci.high:.{digits}f}]"
        return f"{self.value:.{digits}f}", ""

    def to_json(self) -> dict[str, object] | None:
        if not self.present:
            return None
        ci = None
        if self.ci is not None:
            ci = {"low": _json_float(self.ci.low), "high": _json_float(self.ci.high), "level": self.ci.level,
                  "n_resamples": self.ci.n_resamples, "n_defined": self.ci.n_defined, "n_documents": self.ci.n_documents}
        return {"value": _json_float(self.value), "stderr": self.stderr, "ci": ci}


MISSING = Cell(present=False)


def _json_float(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class Column:
    """A (task, metric, filter) column with its direction.

    ``higher_is_better`` is the declared direction (a row the plugin does not declare: the results file's);
    ``scored`` is False for baselines and counts (``Row.scored``), which have no better value: no arrow, and
    their paired comparisons name no winner.
    """

    task: str
    metric: str
    filter: str
    higher_is_better: bool | None
    scored: bool = True

    @property
    def direction(self) -> bool | None:
        """``higher_is_better`` where a higher (or lower) value is better; ``None`` for baselines and counts."""
        return self.higher_is_better if self.scored else None

    @property
    def name(self) -> str:
        """``metric`` or ``metric [filter]`` (filter ``none`` omitted)."""
        return self.metric if self.filter == "none" else f"{self.metric} [{self.filter}]"

    @property
    def label(self) -> str:
        """:attr:`name` with ↑/↓ where higher/lower is better (none on baselines and counts)."""
        arrow = ARROWS[self.direction]
        return f"{self.name} {arrow}" if arrow else self.name

    @property
    def description(self) -> str:
        """One line: what the column measures (the row's declaration)."""
        return meaning(self.metric).description


@dataclass(frozen=True)
class BootstrapSettings:
    """How CIs are drawn (recorded in summary.json)."""

    n_resamples: int = 1000
    seed: int = 0
    level: float = 0.95


def metric_sort_key(name: str, order: Sequence[str] | None = None) -> tuple[int, str]:
    """``name``'s place in ``order`` (default: :func:`metric_order`, read now; pass it when sorting many), after
    every listed one, by name, when it is not listed."""
    order = metric_order() if order is None else order
    return (order.index(name), "") if name in order else (len(order), name)


def primary_metric(task: TaskResult) -> tuple[str, str] | None:
    """(metric, filter) of the task's correctness row: the first of :data:`PRIMARY_METRICS` present,
    in its first filter (``none`` first); ``None`` when the task has none of them."""
    for name in PRIMARY_METRICS:
        for filter_name in task.filters():
            if task.metric(name, filter_name) is not None:
                return name, filter_name
    return None


def primary_samples(task: TaskResult) -> list[Mapping[str, Any]]:
    """The samples lines of the task's correctness filter (one per document); every line when it has no
    correctness row."""
    primary = primary_metric(task)
    return task.samples_of(primary[1]) if primary else list(task.samples)


def task_cell(model: ModelResults, task: str, metric: str, filter_name: str, settings: BootstrapSettings) -> Cell:
    """The cell of one model's row, with a bootstrap CI when lm_eval gave no stderr and the samples hold
    the row's records (resamples keyed by the model's label, task and filter: never by a path)."""
    result = model.tasks.get(task)
    found = result.metric(metric, filter_name) if result is not None else None
    if result is None or found is None:
        return MISSING
    ci = None
    row = corpus_row(metric)
    if found.stderr is None and row is not None and result.samples:
        rows = records(result.samples_of(filter_name), metric, row.width)
        if len(rows):
            options = CalibrationOptions.from_metadata(result.metadata)
            indices = resample_indices(len(rows), n_resamples=settings.n_resamples, seed=settings.seed,
                                       key=(model_seed_label(model.name), task, filter_name))
            ci = percentile_interval(row.on_resamples(rows, indices, options), n_documents=len(rows), level=settings.level)
    return Cell(present=True, value=found.value, stderr=found.stderr, ci=ci)


@dataclass(frozen=True)
class TaskTable:
    """Models × the task's rows, sorted by the task's correctness row (best first, undefined/missing last)."""

    task: str
    columns: tuple[Column, ...]
    models: tuple[str, ...]
    cells: tuple[tuple[Cell, ...], ...]
    sorted_by: Column | None

    def is_headline(self, column: Column) -> bool:
        """Whether ``column`` is in the compact view: the correctness row, and the headline rows
        (:func:`~.columns.headline_rows`) in the correctness row's filter (every filter when there is none)."""
        if column == self.sorted_by:
            return True
        return column.metric in headline_rows() and (self.sorted_by is None or column.filter == self.sorted_by.filter)

    @property
    def headline_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if self.is_headline(c))


def _sort_models(names: Sequence[str], cells: Sequence[Cell], higher_is_better: bool | None) -> list[int]:
    """Indices of ``names`` ordered best first by ``cells`` (undefined and missing last, ties by name)."""
    sign = -1.0 if higher_is_better is not False else 1.0

    def key(i: int) -> tuple[int, float, str]:
        cell = cells[i]
        return (0, sign * cell.value, names[i]) if cell.defined else (1, 0.0, names[i])

    return sorted(range(len(names)), key=key)


def task_table(models: Sequence[ModelResults], task: str, settings: BootstrapSettings) -> TaskTable:
    """The table of one task over every model that ran it (models without it are left out)."""
    ran = [m for m in models if task in m.tasks]
    keys: dict[tuple[str, str], bool | None] = {}
    for model in ran:
        for metric in model.tasks[task].metrics:
            if keys.get(metric.key) is None:
                keys[metric.key] = metric.higher_is_better
    order = metric_order()
    ordered = sorted(keys, key=lambda k: (metric_sort_key(k[0], order), k[1] != "none", k[1]))
    meanings = [meaning(name, keys[(name, filter_name)]) for name, filter_name in ordered]
    columns = tuple(Column(task, name, filter_name, m.higher_is_better, m.scored)
                    for (name, filter_name), m in zip(ordered, meanings))
    cells = [tuple(task_cell(m, task, c.metric, c.filter, settings) for c in columns) for m in ran]
    primaries = [primary_metric(m.tasks[task]) for m in ran]
    primary = next((p for p in primaries if p is not None), None)
    sorted_by = next((c for c in columns if (c.metric, c.filter) == primary), None)
    names = [m.name for m in ran]
    if sorted_by is not None:
        at = columns.index(sorted_by)
        order = _sort_models(names, [row[at] for row in cells], sorted_by.higher_is_better)
    else:
        order = sorted(range(len(names)), key=lambda i: names[i])
    return TaskTable(task, columns, tuple(names[i] for i in order), tuple(cells[i] for i in order), sorted_by)


@dataclass(frozen=True)
class Overview:
    """Models × each task's correctness row, plus size, the mean win rate and the pairwise win matrix.

    Wins count only where a paired comparison (:mod:`.pairwise`) is significant after Holm correction:
    ``win_rate[m]`` is, over the columns that enter the win rate (``counted``: not detector or reference tasks
    unless asked), the mean fraction of the other models m was compared with (both have the documents in their
    samples) that m beats significantly (Holm-adjusted p < ``alpha``); a non-significant difference or a tie is
    no win for either model (0, not ½). ``nan`` when m was compared on no column. ``wins[i][j]``: the counted
    columns where model i significantly beats model j; ``compared[i][j]``: the counted columns on which they
    were compared. Rows are sorted by win rate (best first), then by name.
    """

    columns: tuple[Column, ...]
    models: tuple[str, ...]
    num_parameters: tuple[int | None, ...]
    win_rate: tuple[float, ...]
    cells: tuple[tuple[Cell, ...], ...]
    counted: tuple[bool, ...] = ()
    wins: tuple[tuple[int, ...], ...] = ()
    compared: tuple[tuple[int, ...], ...] = ()
    alpha: float = DEFAULT_ALPHA
    trust_wins: tuple[tuple[int, ...], ...] = ()
    trust_compared: tuple[tuple[int, ...], ...] = ()
    """The same counts over the trust rows (:func:`is_trust_row`) of the counted tasks, each adjusted in its
    task's row family."""


def overview(models: Sequence[ModelResults], tables: Sequence[TaskTable],
             comparisons: Sequence[PairedComparison] = (), *, alpha: float = DEFAULT_ALPHA,
             include_auxiliary_tasks: bool = False, ranks: Mapping[str, RankInterval] | None = None) -> Overview:
    """The overview from the task tables and the paired comparisons of their headline rows; rows sorted by the
    overview's rank interval (``ranks``: model → its :data:`~.ranks.OVERVIEW_TASK` interval) where given, then by
    mean win rate and name."""
    columns = tuple(t.sorted_by for t in tables if t.sorted_by is not None)
    counted = tuple(include_auxiliary_tasks or not is_auxiliary_task(c.task) for c in columns)
    by_name = {m.name: m for m in models}
    tables_by_task = {t.task: t for t in tables}
    names = [m.name for m in models]
    cells: list[tuple[Cell, ...]] = []
    for name in names:
        row = []
        for column in columns:
            table = tables_by_task[column.task]
            if name in table.models:
                row.append(table.cells[table.models.index(name)][table.columns.index(column)])
            else:
                row.append(MISSING)
        cells.append(tuple(row))
    headline = {(c.task, c.metric, c.filter) for c, n in zip(columns, counted) if n}
    wins, compared = win_counts(names, [c for c in comparisons if (c.task, c.metric, c.filter) in headline], alpha)
    counted_tasks = {c.task for c, n in zip(columns, counted) if n}
    trust_wins, trust_compared = win_counts(
        names, [c for c in comparisons if c.task in counted_tasks and is_trust_row(c)], alpha)
    win = [_win_rate(i, names, comparisons, headline, alpha) for i in range(len(names))]
    ranks = ranks or {}

    def position(i: int) -> tuple[Any, ...]:
        rank = ranks.get(names[i])
        by_rank = (0, rank.rank, rank.rank_low, rank.rank_high) if rank is not None else (1, 0, 0, 0)
        return (*by_rank, 0 if math.isfinite(win[i]) else 1, -win[i] if math.isfinite(win[i]) else 0, names[i])

    order = sorted(range(len(names)), key=position)
    return Overview(columns, tuple(names[i] for i in order), tuple(by_name[names[i]].num_parameters for i in order),
                    tuple(win[i] for i in order), tuple(cells[i] for i in order), counted,
                    tuple(tuple(wins[i][j] for j in order) for i in order),
                    tuple(tuple(compared[i][j] for j in order) for i in order), alpha,
                    tuple(tuple(trust_wins[i][j] for j in order) for i in order),
                    tuple(tuple(trust_compared[i][j] for j in order) for i in order))


def is_trust_row(comparison: PairedComparison) -> bool:
    """A corpus row with a better direction (calibration, selective prediction, ρ with difficulty, …): the rows
    counted in the trust matrix."""
    return comparison.higher_is_better is not None and corpus_row(comparison.metric) is not None


def win_counts(names: Sequence[str], comparisons: Sequence[PairedComparison],
               alpha: float) -> tuple[list[list[int]], list[list[int]]]:
    """``wins[i][j]``: comparisons where ``names[i]`` beats ``names[j]`` significantly; ``compared[i][j]``: the
    comparisons of the two with a defined adjusted p-value."""
    wins = [[0] * len(names) for _ in names]
    compared = [[0] * len(names) for _ in names]
    for comparison in comparisons:
        if not math.isfinite(comparison.p_holm):
            continue
        i, j = names.index(comparison.model_a), names.index(comparison.model_b)
        compared[i][j] += 1
        compared[j][i] += 1
        winner = comparison.winner(alpha)
        if winner is not None:
            wins[i][j] += winner == comparison.model_a
            wins[j][i] += winner == comparison.model_b
    return wins, compared


def _win_rate(i: int, names: Sequence[str], comparisons: Sequence[PairedComparison],
              headline: set[tuple[str, str, str]], alpha: float) -> float:
    """Mean over the headline columns of the fraction of the models compared with ``names[i]`` that it beats
    significantly; ``nan`` when it was compared on none."""
    beaten: dict[tuple[str, str, str], list[bool]] = {}
    for comparison in comparisons:
        column = (comparison.task, comparison.metric, comparison.filter)
        if column in headline and names[i] in (comparison.model_a, comparison.model_b) and math.isfinite(comparison.p_holm):
            beaten.setdefault(column, []).append(comparison.winner(alpha) == names[i])
    rates = [sum(outcomes) / len(outcomes) for outcomes in beaten.values()]
    return sum(rates) / len(rates) if rates else math.nan


ROBUSTNESS_METRICS: tuple[str, ...] = ("primary", CONFIDENCE.name, ECE.name, SELECTIVE_AUROC.name)


@dataclass(frozen=True)
class RobustnessRow:
    """One model on one noised twin ``<base>_noise_<operator>`` against its clean ``<base>``.

    ``clean[k]``/``noised[k]`` for k in :data:`ROBUSTNESS_METRICS` (``primary`` = the correctness row,
    named in ``primary_metric``); ``delta[k]`` = noised − clean (``nan`` when either is undefined or missing).
    """

    model: str
    base: str
    operator: str
    primary_metric: str
    filter: str
    clean: dict[str, Cell]
    noised: dict[str, Cell]
    delta: dict[str, float]


def robustness_rows(models: Sequence[ModelResults], settings: BootstrapSettings) -> list[RobustnessRow]:
    """Every (model, noised twin) whose clean task the model also ran, sorted by base, operator, model."""
    rows = []
    for model in models:
        for task in model.tasks:
            match = NOISE_TASK.match(task)
            if not match or match.group("base") not in model.tasks:
                continue
            base = match.group("base")
            primary = primary_metric(model.tasks[base])
            if primary is None:
                continue
            name, filter_name = primary
            clean, noised, delta = {}, {}, {}
            for key in ROBUSTNESS_METRICS:
                metric = name if key == "primary" else key
                clean[key] = task_cell(model, base, metric, filter_name, settings)
                noised[key] = task_cell(model, task, metric, filter_name, settings)
                both = clean[key].defined and noised[key].defined
                delta[key] = noised[key].value - clean[key].value if both else math.nan
            rows.append(RobustnessRow(model.name, base, match.group("operator"), name, filter_name, clean, noised, delta))
    return sorted(rows, key=lambda r: (r.base, r.operator, r.model))


SUPPORT_TOP = 8
"""Support-token tables list this many of the most frequent tokens per model and task."""


@dataclass(frozen=True)
class SupportRow:
    """One model on one task: the support tokens of ``probes=margin`` (the k smallest-margin tokens per
    document, from the samples' ``margin_support`` records of the task's correctness filter).

    ``top``: (token, documents it is a support token of) for the :data:`SUPPORT_TOP` most frequent, ties by
    token; ``mean_margin``: mean over documents of their support tokens' mean margin (``nan`` if none).
    """

    model: str
    task: str
    n_documents: int
    k: int
    top: tuple[tuple[str, int], ...]
    mean_margin: float


def support_rows(models: Sequence[ModelResults]) -> list[SupportRow]:
    """Every (model, task) whose samples carry support tokens, sorted by task, model."""
    out = []
    name = registry.probe("margin").row("support").name
    for model in models:
        for task, result in model.tasks.items():
            support = [s[name] for s in primary_samples(result) if isinstance(s.get(name), dict)]
            if not support:
                continue
            counts: Counter[str] = Counter()
            for record in support:
                counts.update({str(token) for token in record.get("tokens") or ()})
            top = tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:SUPPORT_TOP])
            k = max(len(record.get("tokens") or ()) for record in support)
            out.append(SupportRow(model.name, task, len(support), k, top, support_mean(support)))
    return sorted(out, key=lambda r: (r.task, r.model))


def format_token(token: str) -> str:
    """A token shown with its quotes and escapes (leading spaces and newlines stay visible)."""
    return json.dumps(token, ensure_ascii=False)


def support_text(row: SupportRow) -> str:
    return ", ".join(f"{format_token(token)} ×{n}" for token, n in row.top)


# --------------------------------------------------------------------------- plain-text rendering


def markdown_escape(text: str) -> str:
    """A string from a model, task or file made inert in a Markdown table cell: HTML special characters
    as entities (Markdown renderers pass raw HTML through), ``|`` and backslash escaped, newlines as spaces."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")
    return " ".join(text.splitlines())


def format_parameters(n: int | None) -> str:
    """``135M``, ``1.2B``; ``unknown`` when lm_eval did not record it."""
    if n is None:
        return "unknown"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def format_delta(value: float, digits: int = 3) -> str:
    return f"{value:+.{digits}f}" if math.isfinite(value) else UNDEFINED_TEXT


def _markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


NOT_COUNTED = " (not in win rate)"


def rank_texts(rank: RankInterval | None, ranks: Mapping[str, RankInterval]) -> tuple[str, str]:
    """(``1–3``, ``1 (tied with 2 others)``) of a model's rank interval and tie group; ``—`` without a rank."""
    if rank is None:
        return MISSING_TEXT, MISSING_TEXT
    return rank.text, f"{rank.group} ({group_text(rank, ranks)})"


def overview_markdown(view: Overview, ranks: Mapping[str, Mapping[str, RankInterval]] | None = None,
                      level: float = 0.95) -> str:
    """Models × each task's correctness row, with the overview's rank interval and tie group."""
    counted = view.counted or (True,) * len(view.columns)
    overview_ranks = (ranks or {}).get(OVERVIEW_TASK, {})
    header = ["model", "size", f"rank ({level:.0%})", "tie group"] + [
        markdown_escape(f"{c.task}: {c.label}" + ("" if n else NOT_COUNTED)) for c, n in zip(view.columns, counted)]
    rows = []
    for name, size, cells in zip(view.models, view.num_parameters, view.cells):
        rows.append([markdown_escape(name), format_parameters(size), *rank_texts(overview_ranks.get(name), overview_ranks)]
                    + [c.text() for c in cells])
    return _markdown_table(header, rows)


def task_markdown(table: TaskTable, ranks: Mapping[str, RankInterval] | None = None) -> str:
    """The task's every row, with each model's rank interval and tie group on its correctness row."""
    ranks = ranks or {}
    header = ["model", "rank", "tie group"] + [markdown_escape(c.label) for c in table.columns]
    return _markdown_table(header, ([markdown_escape(name), *rank_texts(ranks.get(name), ranks)] + [c.text() for c in cells]
                                    for name, cells in zip(table.models, table.cells)))


def robustness_markdown(rows: Sequence[RobustnessRow]) -> str:
    header = ["model", "task", "operator", "metric", "clean acc", "noised acc", "Δ acc", "clean conf", "noised conf",
              "Δ conf", "clean ECE", "noised ECE", "Δ ECE", "clean AUROC", "noised AUROC", "Δ AUROC"]
    out = []
    for r in rows:
        line = [markdown_escape(r.model), markdown_escape(r.base), markdown_escape(r.operator),
                markdown_escape(r.primary_metric if r.filter == "none" else f"{r.primary_metric} [{r.filter}]")]
        for key in ROBUSTNESS_METRICS:
            line += [r.clean[key].text(), r.noised[key].text(), format_delta(r.delta[key])]
        out.append(line)
    return _markdown_table(header, out)


def leaderboard_csv(view: Overview, tables: Sequence[TaskTable], parameters: dict[str, int | None],
                    ranks: Mapping[str, Mapping[str, RankInterval]] | None = None,
                    failed: Sequence[FailedPair] = ()) -> str:
    """Wide CSV: one row per model, one column per (task, metric, filter) point value; then
    ``<column> ci_low``/``ci_high``/``stderr`` where any model has one; then ``<task> rank_low``/``rank_high``/``group``
    per ranked task (the overview's first, as ``rank_low``, ``rank_high``, ``group``), and ``failed``: the model's
    attempted tasks without a result, ``task: error`` joined by `` | `` (a model with no result at all has a row
    with only that). Undefined is ``nan``, missing empty."""
    columns = [c for t in tables for c in t.columns]
    cell_of: dict[tuple[str, Column], Cell] = {}
    for table in tables:
        for name, cells in zip(table.models, table.cells):
            for column, cell in zip(table.columns, cells):
                cell_of[(name, column)] = cell
    def name_of(c: Column) -> str:
        return f"{c.task}/{c.metric}" + ("" if c.filter == "none" else f"[{c.filter}]")

    def value(cell: Cell, part: str) -> str:
        if not cell.present:
            return ""
        number = {"value": cell.value, "stderr": cell.stderr,
                  "ci_low": cell.ci.low if cell.ci else None, "ci_high": cell.ci.high if cell.ci else None}[part]
        if number is None:
            return ""
        return repr(float(number)) if math.isfinite(number) else "nan"

    extra = []
    for column in columns:
        cells = [cell_of.get((n, column), MISSING) for n in view.models]
        if any(c.stderr is not None for c in cells):
            extra.append((column, "stderr"))
        if any(c.ci is not None for c in cells):
            extra += [(column, "ci_low"), (column, "ci_high")]
    ranks = ranks or {}
    overview_ranks = ranks.get(OVERVIEW_TASK, {})
    ranked_tasks = [t.task for t in tables if t.task in ranks]
    failures: dict[str, list[str]] = {}
    for pair in failed:
        failures.setdefault(pair.model, []).append(f"{pair.task}: {pair.error}")

    def rank_values(rank: RankInterval | None) -> list[str]:
        return ["", "", ""] if rank is None else [str(rank.rank_low), str(rank.rank_high), str(rank.group)]

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["model", "num_parameters", "rank_low", "rank_high", "group", "mean_win_rate"]
                    + [name_of(c) for c in columns] + [f"{name_of(c)} {part}" for c, part in extra]
                    + [f"{task} {part}" for task in ranked_tasks for part in ("rank_low", "rank_high", "group")]
                    + ["failed"])
    for name, win in zip(view.models, view.win_rate):
        size = parameters.get(name)
        writer.writerow([name, "" if size is None else size, *rank_values(overview_ranks.get(name)),
                         repr(win) if math.isfinite(win) else "nan"]
                        + [value(cell_of.get((name, c), MISSING), "value") for c in columns]
                        + [value(cell_of.get((name, c), MISSING), part) for c, part in extra]
                        + [v for task in ranked_tasks for v in rank_values(ranks[task].get(name))]
                        + [" | ".join(failures.get(name, []))])
    width = 6 + len(columns) + len(extra) + 3 * len(ranked_tasks)
    for name in sorted(set(failures) - set(view.models)):
        writer.writerow([name] + [""] * (width - 1) + [" | ".join(failures[name])])
    return buffer.getvalue()


def failed_markdown(failed: Sequence[FailedPair]) -> str:
    return _markdown_table(["model", "task", "error"], ([markdown_escape(f.model), markdown_escape(f.task),
                                                         markdown_escape(f.error)] for f in failed))


def _code(name: str) -> str:
    """A row's name as inline code; a name from a results file with other characters than a word's, escaped."""
    return f"`{name}`" if re.fullmatch(r"[\w.\-]+", name) else markdown_escape(name)


def _prose(text: str) -> str:
    """A declaration's text as a Markdown paragraph: HTML special characters and backticks made inert."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("`", "\\`")


DIRECTION_LEGEND = ("↑ higher is better, ↓ lower is better; no arrow: a baseline or a count, which has no better value "
                    "(its paired comparisons name no winner).")


def glossary_markdown(tables: Sequence[TaskTable]) -> str:
    """Every row of the task tables, by the probe or family that makes it: its summary, formula, what it reads
    and its source, then each row's direction and description (:func:`.columns.glossary`)."""
    parts = [DIRECTION_LEGEND]
    for group in glossary(c.metric for t in tables for c in t.columns):
        parts += ["", f"### {markdown_escape(group.title)}", "", _prose(group.summary), ""]
        facts = [(name, text) for name, text in (("Formula", group.formula), ("Reads", group.reads),
                                                 ("Source", group.paper)) if text]
        if facts:
            parts += [f"- {name}: {_prose(text)}" for name, text in facts] + [""]
        parts.append(_markdown_table(["row", "direction", "what it measures", "paired comparison"], (
            [_code(e.name) + (f" {e.arrow}" if e.arrow else ""), e.direction_text, markdown_escape(e.description),
             paired_test(e.name)]
            for e in group.entries)))
    return "\n".join(parts)


def support_markdown(rows: Sequence[SupportRow]) -> str:
    header = ["model", "task", "documents", "k", "mean support margin ↑", f"most frequent support tokens (documents, top {SUPPORT_TOP})"]
    return _markdown_table(header, ([markdown_escape(r.model), markdown_escape(r.task), str(r.n_documents), str(r.k),
                                     f"{r.mean_margin:.4g}" if math.isfinite(r.mean_margin) else UNDEFINED_TEXT,
                                     markdown_escape(support_text(r))] for r in rows))


def win_text(view: Overview, i: int, j: int, trust: bool = False) -> str:
    """``wins/compared`` of model i over model j (on the trust rows with ``trust``); ``—`` on the diagonal and where
    they were never compared."""
    wins, compared = (view.trust_wins, view.trust_compared) if trust else (view.wins, view.compared)
    if i == j or not compared or not compared[i][j]:
        return MISSING_TEXT
    return f"{wins[i][j]}/{compared[i][j]}"


def pairwise_matrix_markdown(view: Overview, trust: bool = False) -> str:
    """Models × models: significant wins of the row's model over the column's model / columns compared (the
    correctness rows, or with ``trust`` the trust rows)."""
    header = ["wins of ↓ over →"] + [markdown_escape(name) for name in view.models]
    return _markdown_table(header, ([markdown_escape(name)] + [win_text(view, i, j, trust) for j in range(len(view.models))]
                                    for i, name in enumerate(view.models)))


def format_p(value: float) -> str:
    if not math.isfinite(value):
        return UNDEFINED_TEXT
    return f"{value:.2g}" if value < 0.001 else f"{value:.3f}"


def comparison_texts(c: PairedComparison, alpha: float) -> list[str]:
    """task, metric, a, b, documents, a − b [CI], p, Holm p, test, significant winner (plain text)."""
    metric = c.metric if c.filter == "none" else f"{c.metric} [{c.filter}]"
    interval = f" [{c.ci_low:+.3f}, {c.ci_high:+.3f}]" if math.isfinite(c.ci_low) and math.isfinite(c.ci_high) else ""
    return [c.task, metric, c.model_a, c.model_b, str(c.n_documents), format_delta(c.diff) + interval, format_p(c.p_value),
            format_p(c.p_holm), c.test, c.winner(alpha) or "none"]


def comparison_header(level: float) -> list[str]:
    return ["task", "metric", "model a", "model b", "documents", f"a − b [{level:.0%} CI]", "p", "p (Holm)", "test",
            "significant winner"]


def pairwise_markdown(comparisons: Sequence[PairedComparison], *, alpha: float, level: float) -> str:
    return _markdown_table(comparison_header(level), ([markdown_escape(t) for t in comparison_texts(c, alpha)]
                                                      for c in comparisons))
