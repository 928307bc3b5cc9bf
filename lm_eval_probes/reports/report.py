"""``lm-eval-probes report RUN_DIR... --out DIR``: the leaderboard of any lm_eval runs of the plugin.

Reads every ``results_*.json`` under the given folders (and the ``samples_*.jsonl`` beside them), merges
the runs of each model, and writes into ``--out``:

* ``leaderboard.md`` — the overview (each task's correctness row, size, mean win rate), the robustness
  table for noised twins, the support tokens (``probes=margin``), and one table per task with every row;
* ``leaderboard.csv`` — one row per model, one column per task/metric (plus stderr and CI columns);
* ``summary.json`` — everything above with stderr, CIs, sources, merges and the bootstrap settings;
* ``index.html`` — one self-contained page (tables sortable, figures embedded);
* ``plots/*.png`` — the figures.

Torch-free and lm_eval-free: only json, numpy/scipy/scikit-learn, matplotlib and jinja2.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm_eval_probes.reports.bootstrap import DEFAULT_LEVEL, DEFAULT_RESAMPLES
from lm_eval_probes.reports.reading import ModelResults, read_runs
from lm_eval_probes.reports.tables import (
    BootstrapSettings,
    Overview,
    RobustnessRow,
    SupportRow,
    TaskTable,
    leaderboard_csv,
    markdown_escape,
    overview,
    overview_markdown,
    robustness_markdown,
    robustness_rows,
    support_markdown,
    support_rows,
    task_markdown,
    task_table,
)

logger = logging.getLogger(__name__)

VERSION = "0.1.0"


@dataclass(frozen=True)
class Report:
    """What :func:`build_report` computed and where it wrote it."""

    out: Path
    models: tuple[ModelResults, ...]
    overview: Overview
    tables: tuple[TaskTable, ...]
    robustness: tuple[RobustnessRow, ...]
    support: tuple[SupportRow, ...]
    notes: tuple[str, ...]


def _notes(models: Sequence[ModelResults], bte_profiles: bool) -> list[str]:
    notes = []
    for model in models:
        for task, result in sorted(model.tasks.items()):
            if result.samples_file is None:
                notes.append(f"{model.name} / {task}: no samples file (run with --log_samples): no bootstrap "
                             "intervals and no plots for it.")
    if not bte_profiles:
        notes.append("BTE depth profiles: the --log_samples files hold each document's central-window energy ē_M, "
                     "not its per-layer profile (run with probe_bte_profile=full for that), so the BTE plots show the "
                     "distribution of ē_M per model.")
    notes.append("The reader rows (lcr_auroc, lcr_ece, corruption_auroc) are shown without an interval: their "
                 "hidden-state features are not written to the samples files. ece_scaled has none either: its "
                 "temperature is fitted out-of-fold, and a resample that repeats a document would put it in a "
                 "training and a test fold at once.")
    return notes


def summary_json(report: Report, settings: BootstrapSettings) -> dict[str, Any]:
    """The JSON summary (undefined values are ``null``, missing ones absent)."""
    models = []
    for model in report.models:
        tasks: dict[str, Any] = {}
        for table in report.tables:
            if model.name not in table.models:
                continue
            cells = table.cells[table.models.index(model.name)]
            tasks[table.task] = {
                "results_file": str(model.tasks[table.task].results_file),
                "samples_file": None if model.tasks[table.task].samples_file is None else str(model.tasks[table.task].samples_file),
                "n_documents": model.tasks[table.task].n_documents,
                "metrics": {f"{c.metric},{c.filter}": {**cell.to_json(), "higher_is_better": c.higher_is_better}
                            for c, cell in zip(table.columns, cells) if cell.present},
            }
        at = report.overview.models.index(model.name)
        win = report.overview.win_rate[at]
        models.append({"name": model.name, "model_args": model.model_args, "num_parameters": model.num_parameters,
                       "mean_win_rate": win if math.isfinite(win) else None, "rank": at + 1,
                       "sources": model.sources, "merged_duplicates": model.replaced, "tasks": tasks})
    robustness = [{"model": r.model, "task": r.base, "operator": r.operator, "metric": r.primary_metric, "filter": r.filter,
                   "clean": {k: v.to_json() for k, v in r.clean.items()},
                   "noised": {k: v.to_json() for k, v in r.noised.items()},
                   "delta_noised_minus_clean": {k: (v if math.isfinite(v) else None) for k, v in r.delta.items()}}
                  for r in report.robustness]
    support = [{"model": r.model, "task": r.task, "n_documents": r.n_documents, "k": r.k,
                "mean_margin": r.mean_margin if math.isfinite(r.mean_margin) else None,
                "top_tokens": [{"token": token, "documents": n} for token, n in r.top]} for r in report.support]
    return {
        "generator": f"lm-eval-probes {VERSION} report",
        "bootstrap": {"method": "percentile bootstrap over documents", "n_resamples": settings.n_resamples,
                      "seed": settings.seed, "level": settings.level},
        "ranking": [m for m in report.overview.models],
        "models": models,
        "robustness": robustness,
        "support_tokens": support,
        "notes": list(report.notes),
    }


def markdown_page(report: Report, settings: BootstrapSettings) -> str:
    parts = [
        "# Leaderboard", "",
        f"Values: lm_eval's value ± its standard error where it gives one, otherwise "
        f"[{settings.level:.0%} percentile bootstrap interval over documents] ({settings.n_resamples} resamples, "
        f"seed {settings.seed}). `undefined`: the row is undefined for the run; `—`: not run.", "",
        overview_markdown(report.overview), "",
    ]
    if report.robustness:
        parts += ["## Robustness to noised inputs", "", "Δ = noised − clean.", "", robustness_markdown(report.robustness), ""]
    if report.support:
        parts += ["## Support tokens", "", "`probes=margin`: the k smallest-margin tokens of each document, and how many "
                  "documents each token is a support token of.", "", support_markdown(report.support), ""]
    for table in report.tables:
        parts += [f"## {markdown_escape(table.task)}", "", task_markdown(table), ""]
    if report.notes:
        parts += ["## Notes", ""] + [f"- {markdown_escape(n)}" for n in report.notes] + [""]
    return "\n".join(parts)


def build_report(
    run_dirs: Sequence[str | Path],
    out: str | Path,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
    title: str = "lm-eval-probes leaderboard",
    plots: bool = True,
) -> Report:
    """Read the runs, compute the tables, CIs and figures, and write the report files into ``out``.

    Raises:
        FileNotFoundError: a run folder that does not exist or holds no results file.
        ValueError: ``n_resamples`` < 1 or ``level`` outside (0, 1).
    """
    from lm_eval_probes.reports import html, plots as plotting

    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    settings = BootstrapSettings(n_resamples=n_resamples, seed=seed, level=level)
    models = read_runs(run_dirs)
    logger.info("read %d model(s) from %s", len(models), ", ".join(map(str, run_dirs)))
    task_names = sorted({t for m in models for t in m.tasks})
    tables = tuple(task_table(models, task, settings) for task in task_names)
    view = overview(models, tables)
    robustness = tuple(robustness_rows(models, settings))
    support = tuple(support_rows(models))
    sections: list[html.FigureSection] = []
    bte_profiles = False
    if plots:
        bte, bte_profiles = plotting.bte_figures(models)
        figure_groups = [
            ("BTE depth profiles" if bte_profiles else "BTE central-window energy",
             "" if bte_profiles else "The samples carry ē_M per document but no per-layer profile (probe_bte_profile=full).", bte),
            ("HyperLens Ω", "", plotting.omega_figures(models)),
            ("Reliability diagrams", "", plotting.reliability_figures(models)),
            ("Risk–coverage curves", "", plotting.risk_coverage_figures(models)),
            ("Clean vs noised", "", plotting.robustness_figures(robustness)),
            ("Against difficulty", "", plotting.difficulty_figures(models)),
        ]
        plot_dir = Path(out) / "plots"
        plot_dir.mkdir(parents=True, exist_ok=True)
        for title_, note, figures in figure_groups:
            for figure in figures:
                (plot_dir / f"{figure.name}.png").write_bytes(figure.png)
            sections.append(html.figure_section(title_, note, figures))
    report = Report(Path(out), tuple(models), view, tables, robustness, support, tuple(_notes(models, bte_profiles or not plots)))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "leaderboard.md").write_text(markdown_page(report, settings), encoding="utf-8")
    parameters = {m.name: m.num_parameters for m in models}
    (out_dir / "leaderboard.csv").write_text(leaderboard_csv(view, tables, parameters), encoding="utf-8")
    (out_dir / "summary.json").write_text(json.dumps(summary_json(report, settings), indent=2, ensure_ascii=False,
                                                     allow_nan=False), encoding="utf-8")
    page = html.render_page(title=title, version=VERSION, view=view, tables=tables, robustness=robustness,
                            support=support, sections=sections, models=models, notes=report.notes, n_resamples=n_resamples,
                            seed=seed, level=level)
    (out_dir / "index.html").write_text(page, encoding="utf-8")
    return report


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lm-eval-probes report",
        description="Write a leaderboard (Markdown, CSV, JSON summary, one self-contained HTML page, PNG plots) from "
                    "lm_eval results_*.json and samples_*.jsonl files (a sweep's output folder, or runs of "
                    "`lm_eval --model hf-probes --log_samples`). Runs of the same model are merged. Needs no torch.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="folders searched recursively for results_*.json (or the files)")
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES,
                   help=f"bootstrap resamples per interval (default {DEFAULT_RESAMPLES})")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0); recorded in summary.json")
    p.add_argument("--level", type=float, default=DEFAULT_LEVEL, help="interval coverage (default 0.95)")
    p.add_argument("--title", default="lm-eval-probes leaderboard", help="page title")
    p.add_argument("--no-plots", action="store_true", help="skip the figures (faster)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        report = build_report(args.run_dirs, args.out, n_resamples=args.resamples, seed=args.seed, level=args.level,
                              title=args.title, plots=not args.no_plots)
    except (FileNotFoundError, ValueError) as error:
        print(f"lm-eval-probes report: error: {error}", file=sys.stderr)
        return 2
    print(f"{len(report.models)} model(s), {len(report.tables)} task(s): {report.out.resolve() / 'index.html'}")
    return 0
