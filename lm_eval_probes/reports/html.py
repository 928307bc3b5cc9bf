"""The self-contained HTML page: jinja2 with autoescaping, PNGs inline as base64, CSS and a small sort
script inline; nothing is fetched from the network when the page is viewed.

Every column header carries its row's one-line description as its ``title`` (:mod:`.columns`), and a glossary
(``id="glossary"``) lists every row shown with its direction and the formula and paper of the probe that makes
it. Each task table opens in a compact view (its headline columns, :meth:`.TaskTable.is_headline`); a checkbox
shows the rest (CSS only: no script needed). The first column (the model) stays in view while a table scrolls
inside its box.

Every string from a model name, task name, ``model_args`` or file path is inserted through jinja2's
autoescape (``<script>`` becomes ``&lt;script&gt;``); the only values marked safe are none: even the
base64 image data goes through the escaper (it has nothing to escape).

With samples, the page has a documents view (``id="documents"``): its data are script files beside the page
(:mod:`.documents`), named in a JSON manifest (jinja2's ``tojson``), and its script, ``templates/documents.js``
(included as it is), puts every document's text into the page as text, never as markup.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import jinja2

from lm_eval_probes.declarations import CONFIDENCE, ECE, SELECTIVE_AUROC
from lm_eval_probes.reports.columns import ARROWS, glossary, meaning, paired_test
from lm_eval_probes.reports.plots import Figure
from lm_eval_probes.reports.reading import ModelResults
from lm_eval_probes.reports.tables import (
    MISSING_TEXT,
    ROBUSTNESS_METRICS,
    UNDEFINED_TEXT,
    Cell,
    Column,
    Overview,
    RobustnessRow,
    SupportRow,
    TaskTable,
    comparison_header,
    comparison_texts,
    format_delta,
    format_parameters,
    support_text,
    win_text,
)
from lm_eval_probes.reports.pairwise import PairedComparison
from lm_eval_probes.reports.ranks import OVERVIEW_TASK, RankInterval, group_text
from lm_eval_probes.reports.sweep_status import FailedPair

TEMPLATE = "leaderboard.html.j2"


@dataclass(frozen=True)
class HtmlCell:
    """A table cell: ``text``, and ``detail`` on a second, smaller line (a value's ± stderr or interval, a model
    name's ``model_args``)."""

    text: str
    sort: str
    css: str = ""
    tooltip: str = ""
    detail: str = ""


@dataclass(frozen=True)
class HtmlHead:
    """A column header: ``text`` (breakable after each ``_``), ``detail`` on a second line (a filter), and
    ``tooltip``: what the column measures."""

    text: str
    css: str = ""
    tooltip: str = ""
    detail: str = ""
    href: str = ""


@dataclass(frozen=True)
class HtmlTable:
    """``extra`` (task tables): the number of columns outside the compact view (marked ``css`` ``extra``)."""

    header: tuple[HtmlHead, ...]
    rows: tuple[tuple[HtmlCell, ...], ...]
    task: str = ""
    note: str = ""
    extra: int = 0


@dataclass(frozen=True)
class GlossaryEntry:
    name: str
    arrow: str
    direction: str
    description: str
    test: str = ""


@dataclass(frozen=True)
class GlossarySection:
    key: str
    title: str
    summary: str
    facts: tuple[tuple[str, str], ...]
    entries: tuple[GlossaryEntry, ...]


@dataclass(frozen=True)
class FigureSection:
    title: str
    note: str
    figures: tuple[dict[str, str], ...]


def value_cell(cell: Cell) -> HtmlCell:
    """A leaderboard cell: its text, its sort key (empty for missing/undefined: sorted last) and a class."""
    if not cell.present:
        return HtmlCell(MISSING_TEXT, "", "missing", "not run")
    if not cell.defined:
        return HtmlCell(UNDEFINED_TEXT, "", "undefined", "undefined for this run (null/NaN in the results)")
    tooltip = ""
    if cell.stderr is not None:
        tooltip = "± lm_eval's standard error"
    elif cell.ci is not None and cell.ci.defined:
        tooltip = (f"{cell.ci.level:.0%} bootstrap CI over {cell.ci.n_documents} documents, "
                   f"{cell.ci.n_defined}/{cell.ci.n_resamples} resamples defined")
    value, spread = cell.parts()
    return HtmlCell(value, repr(cell.value), "", tooltip, spread)


def _name_cell(name: str) -> HtmlCell:
    return HtmlCell(name, name, "name")


NameParts = Mapping[str, tuple[str, str]]


def model_name_parts(names: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Each model name as (label, second line). A name that ends in its ``model_args`` (``label (k=v,…)``: what
    :func:`.reading.merge_runs` writes when runs of one label differ in them) shows its label, and on the second
    line only the arguments whose values differ between the models of that label (``k unset`` where it has none
    of them); other names are shown whole."""
    split: dict[str, tuple[str, dict[str, str]]] = {}
    for name in names:
        label, bracket, rest = name.partition(" (")
        if bracket and label and rest.endswith(")") and "=" in rest:
            split[name] = (label, dict(item.partition("=")[::2] for item in rest[:-1].split(",")))
    parts = {name: (name, "") for name in names}
    for name, (label, args) in split.items():
        siblings = [other_args for other_label, other_args in split.values() if other_label == label]
        differing = sorted({k for a in siblings for k in a if any(b.get(k) != a[k] for b in siblings)})
        shown = [f"{k}={args[k]}" if k in args else f"{k} unset" for k in differing]
        parts[name] = (label, ", ".join(shown) if shown else name[len(label) + 2:-1])
    return parts


def _model_cell(name: str, parts: NameParts) -> HtmlCell:
    """A model's cell: its label, the arguments that tell it from its namesakes below, the full name as tooltip."""
    label, detail = parts.get(name, (name, ""))
    return HtmlCell(label, name, "name model", name, detail)


def _model_head(name: str, parts: NameParts) -> HtmlHead:
    label, detail = parts.get(name, (name, ""))
    return HtmlHead(label, "", f"the row's model's significant wins over {name}", detail)


MODEL_TOOLTIP = "the model: its sweep label, else lm_eval's model name (with its model_args where two runs share it)"


RANK_TOOLTIP = ("the bootstrap interval of the model's rank over the documents every ranked model ran (the same "
                "resamples for every model); 1 = best")
GROUP_TOOLTIP = ("tie group: models whose rank intervals overlap (connected runs) cannot be told apart on these "
                 "documents; 1 = the best group")


def rank_cells(rank: RankInterval | None, ranks: Mapping[str, RankInterval]) -> tuple[HtmlCell, HtmlCell]:
    """The rank interval's cell (sorted by its point rank) and the tie group's (``—`` for an unranked model)."""
    if rank is None:
        return (HtmlCell(MISSING_TEXT, "", "missing", "no rank: no samples for the documents the others ran"),
                HtmlCell(MISSING_TEXT, "", "missing"))
    tooltip = (f"rank {rank.rank} on all {rank.n_documents} shared documents; interval {rank.text} over the resamples, "
               f"{rank.n_models} models ranked")
    return (HtmlCell(rank.text, f"{rank.rank}.{rank.rank_high:03d}", "rank", tooltip),
            HtmlCell(str(rank.group), str(rank.group), "group", group_text(rank, ranks), group_text(rank, ranks)))


def overview_table(view: Overview, parts: NameParts | None = None,
                   ranks: Mapping[str, RankInterval] | None = None, anchors: Mapping[str, str] | None = None) -> HtmlTable:
    """Models × each task's correctness row, with the overview's rank interval and tie group; each task's header
    links to its full table (``anchors``: task → fragment)."""
    counted = view.counted or (True,) * len(view.columns)
    ranks = ranks or {}
    anchors = anchors or {}
    header = (HtmlHead("model", "name", MODEL_TOOLTIP),
              HtmlHead("size", "size", "number of parameters (lm_eval's model_num_parameters)"),
              HtmlHead("rank", "", RANK_TOOLTIP + " (the mean of the counted tasks' correctness rows)"),
              HtmlHead("tie group", "", GROUP_TOOLTIP),
              *(HtmlHead(c.task + ("" if n else " ✗"), "" if n else "uncounted",
                         c.description + ("" if n else " (a detector or reference task: shown, not counted in the ranks "
                                                       "or win rate)") + " — click the name for the task's full table",
                         c.label, anchors.get(c.task, ""))
                for c, n in zip(view.columns, counted)))
    rows = []
    parts = parts or model_name_parts(view.models)
    for name, size, cells in zip(view.models, view.num_parameters, view.cells):
        size_cell = HtmlCell(format_parameters(size), "" if size is None else str(size), "size" if size else "size missing")
        rows.append((_model_cell(name, parts), size_cell, *rank_cells(ranks.get(name), ranks),
                     *(value_cell(c) for c in cells)))
    return HtmlTable(header, tuple(rows))


def pairwise_matrix_table(view: Overview, parts: NameParts | None = None, trust: bool = False) -> HtmlTable:
    """Models × models: significant wins of the row's model over the column's / counted columns compared (with
    ``trust``: over the trust rows of the counted tasks)."""
    parts = parts or model_name_parts(view.models)
    wins_of, compared_of = (view.trust_wins, view.trust_compared) if trust else (view.wins, view.compared)
    what = "trust rows" if trust else "columns"
    header = (HtmlHead("wins of ↓ over →", "name", "significant wins of the row's model over the column's model / "
                       "counted columns both were compared on"),
              *(_model_head(name, parts) for name in view.models))
    rows = []
    for i, name in enumerate(view.models):
        line = [_model_cell(name, parts)]
        for j, other in enumerate(view.models):
            text = win_text(view, i, j, trust)
            if text == MISSING_TEXT:
                line.append(HtmlCell(text, "", "missing"))
            else:
                wins = wins_of[i][j]
                line.append(HtmlCell(text, str(wins), "win" if wins else "",
                                     f"{name} beats {other} significantly on {wins} of the {compared_of[i][j]} "
                                     f"{what} both were compared on"))
        rows.append(tuple(line))
    return HtmlTable(tuple(header), tuple(rows))


def pairwise_html_table(comparisons: Sequence[PairedComparison], *, alpha: float, level: float,
                        parts: NameParts | None = None) -> HtmlTable:
    """One line per comparison (pair, task and row)."""
    header = tuple(HtmlHead(text, "name" if k < 4 or k >= 8 else "", tooltip)
                   for k, (text, tooltip) in enumerate(zip(comparison_header(level), COMPARISON_TOOLTIPS)))
    rows = []
    parts = parts or model_name_parts(sorted({name for c in comparisons for name in (c.model_a, c.model_b)}))
    for c in comparisons:
        texts = comparison_texts(c, alpha)
        numbers = (math.nan, math.nan, math.nan, math.nan, float(c.n_documents), c.diff, c.p_value, c.p_holm)
        line = []
        for k, text in enumerate(texts):
            if k in (2, 3):
                line.append(_model_cell(text, parts))
            elif k < 4 or k >= 8:
                line.append(HtmlCell(text, text, "name win" if k == 9 and c.winner(alpha) else "name"))
            else:
                line.append(HtmlCell(text, repr(numbers[k]) if math.isfinite(numbers[k]) else "",
                                     "" if math.isfinite(numbers[k]) else "undefined"))
        rows.append(tuple(line))
    return HtmlTable(header, tuple(rows))


COMPARISON_TOOLTIPS: tuple[str, ...] = (
    "the task", "the row [filter]", "the first model of the pair (by name)", "the second model",
    "documents both ran, paired by doc_id", "difference of the row, a − b, with its paired-bootstrap interval",
    "two-sided p-value of the difference", "p-value after Holm's correction within its family (the overview's "
    "correctness rows together; every other row within its task and row family)",
    "McNemar's exact test (0/1 rows) or a paired permutation test (other mean rows; corpus rows recomputed on each)",
    "the model better with Holm-adjusted p < alpha; none when not significant")


def task_html_table(table: TaskTable, parts: NameParts | None = None,
                    ranks: Mapping[str, RankInterval] | None = None) -> HtmlTable:
    """Every column of the task, after each model's rank interval and tie group on its correctness row; the columns
    outside its compact view (:meth:`TaskTable.is_headline`) get the class ``extra``."""
    ranks = ranks or {}
    extra = ["" if table.is_headline(c) else "extra" for c in table.columns]
    header = (HtmlHead("model", "name", MODEL_TOOLTIP), HtmlHead("rank", "", RANK_TOOLTIP),
              HtmlHead("tie group", "", GROUP_TOOLTIP),
              *(HtmlHead(_heading(c), css, c.description, "" if c.filter == "none" else f"[{c.filter}]")
                for c, css in zip(table.columns, extra)))
    parts = parts or model_name_parts(table.models)
    rows = tuple((_model_cell(name, parts), *rank_cells(ranks.get(name), ranks),
                  *(_with_class(value_cell(c), css) for c, css in zip(cells, extra)))
                 for name, cells in zip(table.models, table.cells))
    note = f"Sorted by {table.sorted_by.label}." if table.sorted_by else "No correctness row: sorted by name."
    return HtmlTable(header, rows, table.task, note, sum(map(bool, extra)))


def _heading(column: Column) -> str:
    """The metric and its arrow (none on baselines and counts), kept on one line."""
    arrow = ARROWS[column.direction]
    return f"{column.metric}\u00a0{arrow}" if arrow else column.metric


def _with_class(cell: HtmlCell, css: str) -> HtmlCell:
    return replace(cell, css=f"{cell.css} {css}".strip()) if css else cell


def glossary_sections(tables: Sequence[TaskTable]) -> tuple[GlossarySection, ...]:
    """The glossary of every row shown in the task tables (:func:`.columns.glossary`)."""
    shown = [c.metric for t in tables for c in t.columns]
    sections = []
    for group in glossary(shown):
        facts = tuple((k, v) for k, v in (("Formula", group.formula), ("Reads", group.reads), ("Source", group.paper)) if v)
        entries = tuple(GlossaryEntry(e.name, e.arrow, e.direction_text, e.description, paired_test(e.name))
                        for e in group.entries)
        sections.append(GlossarySection(group.key, group.title, group.summary, facts, entries))
    return tuple(sections)


def robustness_table(rows: Sequence[RobustnessRow], parts: NameParts | None = None) -> HtmlTable:
    """One line per model, noised twin and row (correctness, confidence, ECE, selective AUROC): clean, noised and
    Δ side by side, narrow enough for any page width."""
    names = {CONFIDENCE.name: CONFIDENCE.name, ECE.name: ECE.name, SELECTIVE_AUROC.name: SELECTIVE_AUROC.name}
    header = (HtmlHead("model", "name", MODEL_TOOLTIP), HtmlHead("task", "name", "the clean task"),
              HtmlHead("operator", "name", "the noise operator of the twin <task>_noise_<operator>"),
              HtmlHead("row", "name", "the task's correctness row [filter], the confidence, its ECE and selective AUROC"),
              HtmlHead("clean", "", "the row on the clean task"), HtmlHead("noised", "", "the row on the noised twin"),
              HtmlHead("Δ", "", "noised − clean"))
    out = []
    parts = parts or model_name_parts(sorted({r.model for r in rows}))
    for r in rows:
        for key in ROBUSTNESS_METRICS:
            if key == "primary":
                metric = r.primary_metric if r.filter == "none" else f"{r.primary_metric} [{r.filter}]"
                direction = ARROWS[True]
            else:
                metric, direction = names[key], meaning(key).arrow
            delta = r.delta[key]
            row_cell = HtmlCell(f"{metric} {direction}".strip(), metric, "name",
                                "the task's correctness row" if key == "primary" else meaning(key).description)
            out.append((_model_cell(r.model, parts), _name_cell(r.base), _name_cell(r.operator), row_cell,
                        value_cell(r.clean[key]), value_cell(r.noised[key]),
                        HtmlCell(format_delta(delta), repr(delta), "") if math.isfinite(delta)
                        else HtmlCell(UNDEFINED_TEXT, "", "undefined")))
    return HtmlTable(header, tuple(out))


def support_table(rows: Sequence[SupportRow], parts: NameParts | None = None) -> HtmlTable:
    header = (HtmlHead("model", "name", MODEL_TOOLTIP), HtmlHead("task", "name", "the task"),
              HtmlHead("documents", "", "documents with support tokens in the samples"),
              HtmlHead("k", "", "support tokens per document"),
              HtmlHead("mean support margin ↑", "", "mean over documents of their support tokens' mean margin"),
              HtmlHead("most frequent support tokens", "name", "token ×documents whose k smallest margins include it"))
    out = []
    parts = parts or model_name_parts(sorted({r.model for r in rows}))
    for r in rows:
        margin = (HtmlCell(f"{r.mean_margin:.4g}", repr(r.mean_margin)) if math.isfinite(r.mean_margin)
                  else HtmlCell(UNDEFINED_TEXT, "", "undefined"))
        out.append((_model_cell(r.model, parts), _name_cell(r.task), HtmlCell(str(r.n_documents), str(r.n_documents)),
                    HtmlCell(str(r.k), str(r.k)), margin, HtmlCell(support_text(r), "", "name tokens")))
    return HtmlTable(header, tuple(out))


def figure_section(title: str, note: str, figures: Sequence[Figure]) -> FigureSection:
    return FigureSection(title, note, tuple(
        {"title": f.title, "caption": f.caption, "base64": base64.b64encode(f.png).decode("ascii")} for f in figures))


def task_anchor(index: int) -> str:
    """The fragment of the ``index``-th (1-based) task section."""
    return f"task-{index}"


def render_page(
    *,
    title: str,
    version: str,
    view: Overview,
    tables: Sequence[TaskTable],
    robustness: Sequence[RobustnessRow],
    support: Sequence[SupportRow],
    sections: Sequence[FigureSection],
    models: Sequence[ModelResults],
    notes: Sequence[str],
    n_resamples: int,
    seed: int,
    level: float,
    pairwise: Sequence[PairedComparison] = (),
    pairwise_text: str = "",
    statistics: str = "",
    trust_text: str = "",
    ranks: Mapping[str, Mapping[str, RankInterval]] | None = None,
    failed: Sequence[FailedPair] = (),
    task_comparisons: Mapping[str, Sequence[PairedComparison]] | None = None,
    downloads: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    documents: Mapping[str, Mapping[str, object]] | None = None,
) -> str:
    """The whole page as one string (autoescaped). ``ranks``: task → model → interval (the overview under
    :data:`~.ranks.OVERVIEW_TASK`); ``task_comparisons``: each task's every comparison; ``downloads``: per task,
    (label, relative link) of the files written beside the page (details Parquet, Every Eval Ever JSON); ``documents``:
    the documents view's manifest (:func:`.documents.write_documents`: task → its script files), embedded as JSON."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    ranks = ranks or {}
    task_comparisons = task_comparisons or {}
    downloads = downloads or {}
    model_notes = [{"name": m.name, "size": format_parameters(m.num_parameters), "model_args": m.model_args,
                    "sources": m.sources, "replaced": m.replaced, "skipped": m.probes_skipped} for m in models]
    parts = model_name_parts([m.name for m in models])
    anchors = {t.task: "#" + task_anchor(k) for k, t in enumerate(tables, start=1)}
    has_trust = any(any(row) for row in view.trust_compared)
    task_views = [{"table": task_html_table(t, parts, ranks.get(t.task)), "anchor": task_anchor(k),
                   "comparisons": pairwise_html_table(task_comparisons[t.task], alpha=view.alpha, level=level, parts=parts)
                   if task_comparisons.get(t.task) else None,
                   "n_comparisons": len(task_comparisons.get(t.task, ())),
                   "downloads": list(downloads.get(t.task, ())), "documents": t.task in (documents or {})}
                  for k, t in enumerate(tables, start=1)]
    return environment.get_template(TEMPLATE).render(
        title=title, version=version, statistics=statistics,
        overview=overview_table(view, parts, ranks.get(OVERVIEW_TASK), anchors),
        task_views=task_views, robustness=robustness_table(robustness, parts),
        support=support_table(support, parts), pairwise_text=pairwise_text, trust_text=trust_text,
        pairwise_matrix=pairwise_matrix_table(view, parts) if pairwise else None,
        trust_matrix=pairwise_matrix_table(view, parts, trust=True) if pairwise and has_trust else None,
        pairwise=pairwise_html_table(pairwise, alpha=view.alpha, level=level, parts=parts) if pairwise else None,
        failed=[f.to_json() for f in failed],
        glossary=glossary_sections(tables),
        figure_sections=[s for s in sections if s.figures or s.note], models=model_notes, tasks=[t.task for t in tables],
        notes=list(notes), n_resamples=n_resamples, seed=seed, level=level, documents=dict(documents or {}),
    )
