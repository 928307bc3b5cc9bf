"""The self-contained HTML page: jinja2 with autoescaping, PNGs inline as base64, CSS and a small sort
script inline; nothing is fetched from the network when the page is viewed.

Every string from a model name, task name, ``model_args`` or file path is inserted through jinja2's
autoescape (``<script>`` becomes ``&lt;script&gt;``); the only values marked safe are none: even the
base64 image data goes through the escaper (it has nothing to escape).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2

from lm_eval_probes.declarations import CONFIDENCE, ECE, SELECTIVE_AUROC
from lm_eval_probes.reports.plots import Figure
from lm_eval_probes.reports.reading import ModelResults
from lm_eval_probes.reports.tables import (
    MISSING_TEXT,
    ROBUSTNESS_METRICS,
    UNDEFINED_TEXT,
    Cell,
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

TEMPLATE = "leaderboard.html.j2"


@dataclass(frozen=True)
class HtmlCell:
    text: str
    sort: str
    css: str = ""
    tooltip: str = ""


@dataclass(frozen=True)
class HtmlHead:
    text: str
    css: str = ""
    tooltip: str = ""


@dataclass(frozen=True)
class HtmlTable:
    header: tuple[HtmlHead, ...]
    rows: tuple[tuple[HtmlCell, ...], ...]
    task: str = ""
    note: str = ""


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
    if cell.ci is not None and cell.ci.defined:
        tooltip = (f"{cell.ci.level:.0%} bootstrap CI over {cell.ci.n_documents} documents, "
                   f"{cell.ci.n_defined}/{cell.ci.n_resamples} resamples defined")
    elif cell.stderr is not None:
        tooltip = "± lm_eval's standard error"
    return HtmlCell(cell.text(), repr(cell.value), "", tooltip)


def _name_cell(name: str) -> HtmlCell:
    return HtmlCell(name, name, "name")


def overview_table(view: Overview) -> HtmlTable:
    counted = view.counted or (True,) * len(view.columns)
    header = (HtmlHead("model", "name"), HtmlHead("size"),
              HtmlHead("mean win rate ↑", "", "mean over the counted columns of the fraction of compared models beaten "
                       f"significantly (Holm-adjusted p < {view.alpha:g}); non-significant differences and ties count 0"),
              *(HtmlHead(f"{c.task}: {c.label}" + ("" if n else " ✗"), "" if n else "uncounted",
                         "" if n else "detector or reference task: shown, not counted in the win rate")
                for c, n in zip(view.columns, counted)))
    rows = []
    for name, size, win, cells in zip(view.models, view.num_parameters, view.win_rate, view.cells):
        size_cell = HtmlCell(format_parameters(size), "" if size is None else str(size), "" if size else "missing")
        win_cell = HtmlCell(f"{win:.3f}", repr(win)) if math.isfinite(win) else HtmlCell(UNDEFINED_TEXT, "", "undefined")
        rows.append((_name_cell(name), size_cell, win_cell, *(value_cell(c) for c in cells)))
    return HtmlTable(header, tuple(rows))


def pairwise_matrix_table(view: Overview) -> HtmlTable:
    """Models × models: significant wins of the row's model over the column's / counted columns compared."""
    header = (HtmlHead("wins of ↓ over →", "name"), *(HtmlHead(name) for name in view.models))
    rows = []
    for i, name in enumerate(view.models):
        line = [_name_cell(name)]
        for j, other in enumerate(view.models):
            text = win_text(view, i, j)
            if text == MISSING_TEXT:
                line.append(HtmlCell(text, "", "missing"))
            else:
                wins = view.wins[i][j]
                line.append(HtmlCell(text, str(wins), "win" if wins else "",
                                     f"{name} beats {other} significantly on {wins} of the {view.compared[i][j]} "
                                     "columns both were compared on"))
        rows.append(tuple(line))
    return HtmlTable(tuple(header), tuple(rows))


def pairwise_html_table(comparisons: Sequence[PairedComparison], *, alpha: float, level: float) -> HtmlTable:
    """One line per pair and task on the task's correctness row."""
    header = tuple(HtmlHead(text, "name" if k < 4 or k >= 8 else "") for k, text in enumerate(comparison_header(level)))
    rows = []
    for c in comparisons:
        texts = comparison_texts(c, alpha)
        numbers = (math.nan, math.nan, math.nan, math.nan, float(c.n_documents), c.diff, c.p_value, c.p_holm)
        line = []
        for k, text in enumerate(texts):
            if k < 4 or k >= 8:
                line.append(HtmlCell(text, text, "name win" if k == 9 and c.winner(alpha) else "name"))
            else:
                line.append(HtmlCell(text, repr(numbers[k]) if math.isfinite(numbers[k]) else "",
                                     "" if math.isfinite(numbers[k]) else "undefined"))
        rows.append(tuple(line))
    return HtmlTable(header, tuple(rows))


def task_html_table(table: TaskTable) -> HtmlTable:
    header = (HtmlHead("model", "name"), *(HtmlHead(c.label, "", f"{c.metric}, filter {c.filter}") for c in table.columns))
    rows = tuple((_name_cell(name), *(value_cell(c) for c in cells)) for name, cells in zip(table.models, table.cells))
    note = f"Sorted by {table.sorted_by.label}." if table.sorted_by else "No correctness row: sorted by name."
    return HtmlTable(header, rows, table.task, note)


def robustness_table(rows: Sequence[RobustnessRow]) -> HtmlTable:
    names = {"primary": "acc", CONFIDENCE.name: "conf", ECE.name: "ECE", SELECTIVE_AUROC.name: "AUROC"}
    header = [HtmlHead("model", "name"), HtmlHead("task", "name"), HtmlHead("operator", "name"), HtmlHead("metric", "name")]
    for key in ROBUSTNESS_METRICS:
        header += [HtmlHead(f"clean {names[key]}"), HtmlHead(f"noised {names[key]}"), HtmlHead(f"Δ {names[key]}")]
    out = []
    for r in rows:
        metric = r.primary_metric if r.filter == "none" else f"{r.primary_metric} [{r.filter}]"
        line = [_name_cell(r.model), _name_cell(r.base), _name_cell(r.operator), _name_cell(metric)]
        for key in ROBUSTNESS_METRICS:
            delta = r.delta[key]
            line += [value_cell(r.clean[key]), value_cell(r.noised[key]),
                     HtmlCell(format_delta(delta), repr(delta), "") if math.isfinite(delta)
                     else HtmlCell(UNDEFINED_TEXT, "", "undefined")]
        out.append(tuple(line))
    return HtmlTable(tuple(header), tuple(out))


def support_table(rows: Sequence[SupportRow]) -> HtmlTable:
    header = (HtmlHead("model", "name"), HtmlHead("task", "name"), HtmlHead("documents"), HtmlHead("k"),
              HtmlHead("mean support margin ↑", "", "mean over documents of their support tokens' mean margin"),
              HtmlHead("most frequent support tokens", "name", "token ×documents whose k smallest margins include it"))
    out = []
    for r in rows:
        margin = (HtmlCell(f"{r.mean_margin:.4g}", repr(r.mean_margin)) if math.isfinite(r.mean_margin)
                  else HtmlCell(UNDEFINED_TEXT, "", "undefined"))
        out.append((_name_cell(r.model), _name_cell(r.task), HtmlCell(str(r.n_documents), str(r.n_documents)),
                    HtmlCell(str(r.k), str(r.k)), margin, HtmlCell(support_text(r), "", "name tokens")))
    return HtmlTable(header, tuple(out))


def figure_section(title: str, note: str, figures: Sequence[Figure]) -> FigureSection:
    return FigureSection(title, note, tuple(
        {"title": f.title, "caption": f.caption, "base64": base64.b64encode(f.png).decode("ascii")} for f in figures))


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
) -> str:
    """The whole page as one string (autoescaped)."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    model_notes = [{"name": m.name, "size": format_parameters(m.num_parameters), "model_args": m.model_args,
                    "sources": m.sources, "replaced": m.replaced} for m in models]
    return environment.get_template(TEMPLATE).render(
        title=title, version=version, overview=overview_table(view),
        task_tables=[task_html_table(t) for t in tables], robustness=robustness_table(robustness),
        support=support_table(support), pairwise_text=pairwise_text,
        pairwise_matrix=pairwise_matrix_table(view) if pairwise else None,
        pairwise=pairwise_html_table(pairwise, alpha=view.alpha, level=level) if pairwise else None,
        figure_sections=[s for s in sections if s.figures or s.note], models=model_notes, tasks=[t.task for t in tables],
        notes=list(notes), n_resamples=n_resamples, seed=seed, level=level,
    )
