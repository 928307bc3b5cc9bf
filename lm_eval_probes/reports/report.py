"""``lm-eval-probes report RUN_DIR... --out DIR``: the leaderboard of any lm_eval runs of the plugin.

Reads every ``results_*.json`` under the given folders (and the ``samples_*.jsonl`` beside them), merges
the runs of each model, and writes into ``--out``:

* ``leaderboard.md`` — the overview (each task's correctness row, size, rank interval and tie group), the
  paired comparisons (:mod:`.pairwise`: the models × models win matrices and each pair's difference, interval and
  Holm-corrected p on every correctness row), the robustness table for noised twins, the support
  tokens (``probes=margin``), one table per task with every row, and the glossary (each row shown: its direction
  and description, and the summary, formula and paper of the probe that makes it; :mod:`.columns`);
* ``leaderboard.csv`` — one row per model, one column per task/metric (plus stderr, CI, rank and ``failed`` columns);
* ``summary.json`` — everything above with stderr, CIs, sources, merges and the bootstrap settings, ``ranks``,
  ``failed``, and ``pairwise``: every pair of models on every row that can be paired;
* ``index.html`` — one self-contained page (tables sortable, headers titled with their row's description, task
  tables in a compact view with the rest one click away, the glossary, figures embedded);
* ``plots/*.png`` — the figures;
* ``details/<model>/samples_<task>.parquet`` — one row per document (:mod:`.details`);
* ``every_eval_ever/data/<task>/<developer>/<model>/<uuid>.json`` (and ``_samples.jsonl``) — the Every Eval Ever
  0.3.0 schema (:mod:`.every_eval_ever`).

Every task and the overview carry each model's rank interval and tie group (:mod:`.ranks`); when the runs come from a
sweep, the models × tasks it attempted without a result are listed (:mod:`.sweep_status`).

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
from lm_eval_probes.reports.pairwise import (
    DEFAULT_ALPHA,
    MCNEMAR,
    NO_DIRECTION_SUFFIX,
    OVERVIEW_FAMILY,
    PERMUTATION,
    STOCK_FAMILY,
    PairedComparison,
    RowSpec,
    is_auxiliary_task,
    pairwise_comparisons,
)
from lm_eval_probes.reports.details import write_details
from lm_eval_probes.reports.documents import write_documents
from lm_eval_probes.reports.every_eval_ever import write_every_eval_ever
from lm_eval_probes.reports.levels import CORRECT, LevelMean, level_markdown, level_means
from lm_eval_probes.reports.ranks import OVERVIEW_TASK, RankColumn, RankInterval, rank_table, ranks_by_task
from lm_eval_probes.reports.sweep_status import FailedPair, failed_pairs
from lm_eval_probes.reports.reading import ModelResults, read_runs
from lm_eval_probes.reports.tables import (
    BootstrapSettings,
    Overview,
    RobustnessRow,
    SupportRow,
    DIRECTION_LEGEND,
    TaskTable,
    failed_markdown,
    glossary_markdown,
    leaderboard_csv,
    markdown_escape,
    overview,
    overview_markdown,
    pairwise_markdown,
    pairwise_matrix_markdown,
    robustness_markdown,
    robustness_rows,
    support_markdown,
    support_rows,
    task_markdown,
    task_table,
)

logger = logging.getLogger(__name__)

VERSION = "0.2.0"


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
    pairwise: tuple[PairedComparison, ...] = ()
    include_auxiliary_tasks: bool = False
    by_level: tuple[LevelMean, ...] = ()
    ranks: tuple[RankInterval, ...] = ()
    failed: tuple[FailedPair, ...] = ()


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
                "metrics": {f"{c.metric},{c.filter}": {**cell.to_json(), "higher_is_better": c.higher_is_better,
                                                       "scored": c.scored}
                            for c, cell in zip(table.columns, cells) if cell.present},
            }
        at = report.overview.models.index(model.name)
        win = report.overview.win_rate[at]
        models.append({"name": model.name, "model_args": model.model_args, "num_parameters": model.num_parameters,
                       "mean_win_rate": win if math.isfinite(win) else None, "rank": at + 1,
                       "sources": model.sources, "merged_duplicates": model.replaced,
                       "probes_skipped": model.probes_skipped, "tasks": tasks})
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
        "rank_settings": {"method": "paired percentile bootstrap of each model's rank over the documents every ranked "
                                    "model ran (the same resamples for every model)",
                          "n_resamples": settings.n_resamples, "seed": settings.seed, "level": settings.level,
                          "resample_key": ["ranks", "<task>", "<filter>"],
                          "rank": "1 + the number of models with a strictly better mean on the resample",
                          "group": "models sorted by their interval; an interval that starts after the highest rank of "
                                   "the group so far opens the next group (connected runs of overlapping intervals)",
                          "overview_task": OVERVIEW_TASK,
                          "overview": "every ranked model on the counted tasks all of them ran with samples, by the mean "
                                      "of its correctness rows over those tasks (lower-is-better rows negated); when "
                                      "there is no such task, the models that ran every counted task"},
        "ranks": [r.to_json() for r in report.ranks],
        "failed": [f.to_json() for f in report.failed],
        "pairwise_settings": pairwise_settings(report, settings),
        "pairwise": [c.to_json(report.overview.alpha) for c in report.pairwise],
        "by_level": [m.to_json() for m in report.by_level],
        "notes": list(report.notes),
    }


PAIRWISE_TEXT = (
    "Wins count only where the paired difference is significant: each pair of models is compared on the documents "
    "both ran (paired by doc_id), with a paired-bootstrap {level:.0%} interval of the difference and a two-sided p-value "
    "(McNemar's exact test for 0/1 rows such as acc and exact_match, otherwise a paired permutation test); the p-values "
    "of the overview's columns are Holm-corrected together, and a model wins a column against another only when the "
    "corrected p < {alpha:g} in its favour. A non-significant difference or a tie is no win for either model (it counts "
    "0, not ½). The mean win rate is the mean over the columns of the fraction of compared models beaten. {auxiliary}")


def pairwise_text(report: Report, settings: BootstrapSettings) -> str:
    auxiliary = ("Detector (*_detect) and reference (*_ref) tasks are counted too (--include-auxiliary-tasks)."
                 if report.include_auxiliary_tasks else
                 "Detector (*_detect) and reference (*_ref) tasks are shown but not counted (--include-auxiliary-tasks "
                 "counts them).")
    return PAIRWISE_TEXT.format(level=settings.level, alpha=report.overview.alpha, auxiliary=auxiliary)


def pairwise_settings(report: Report, settings: BootstrapSettings) -> dict[str, Any]:
    return {"alpha": report.overview.alpha, "correction": "holm",
            "families": {OVERVIEW_FAMILY: "the headline rows of the tasks in the win rate",
                         "<task>/<row family>": "every other row of that task with a better direction, by the family "
                                                "its declaration names (probe, confidence, difficulty, detector, "
                                                f"trajectory; lm_eval's own rows: {STOCK_FAMILY})",
                         f"<task>/<row family>{NO_DIRECTION_SUFFIX}": "its rows without one (baselines, counts): no winner"},
            "tests": {MCNEMAR: "0/1 mean rows: exact binomial test of the discordant documents at 1/2",
                      PERMUTATION: f"other mean rows and every corpus row: {settings.n_resamples} random swaps of the two "
                                   "models' records per document, the row recomputed on each"},
            "interval": f"paired percentile bootstrap over the shared documents, {settings.n_resamples} resamples (corpus "
                        "rows recomputed from the per-document records on each)",
            "directions": "each row's declaration (lm_eval_probes.rows: higher_is_better where scored); lm_eval's rows: "
                          "the results file's higher_is_better",
            "win_rate": "significant wins only (Holm-adjusted p < alpha); non-significant differences and ties count 0",
            "include_auxiliary_tasks": report.include_auxiliary_tasks}


def headline_comparisons(report: Report) -> list[PairedComparison]:
    """The comparisons of each task's correctness row (the overview's columns), in the overview's order."""
    order = {(c.task, c.metric, c.filter): k for k, c in enumerate(report.overview.columns)}
    found = [c for c in report.pairwise if (c.task, c.metric, c.filter) in order]
    return sorted(found, key=lambda c: order[(c.task, c.metric, c.filter)])


def statistics_line(settings: BootstrapSettings) -> str:
    """The one line of statistics wording before the first table (the rest stands beside the paired comparisons)."""
    return (f"Rank: the {settings.level:.0%} bootstrap interval of a model's rank over the documents all ranked models "
            "ran; models in one tie group cannot be told apart. Values: ± lm_eval's standard error, or "
            f"[{settings.level:.0%} bootstrap interval] ({settings.n_resamples} resamples, seed {settings.seed}); "
            "`undefined`: undefined for the run; `—`: not run.")


TRUST_TEXT = ("Trust rows: the corpus rows with a better direction (ECE, ECE 10-bin, AURC, PRR, selective AUROC, "
              "selective accuracy, the coverage area, each ρ with difficulty), recomputed from the per-document records "
              "on each resample and permutation, Holm-adjusted within each task's row family.")


def task_comparisons(report: Report) -> dict[str, list[PairedComparison]]:
    """Each task's every comparison, in the task table's column order, then by pair."""
    order = {(t.task, c.metric, c.filter): k for t in report.tables for k, c in enumerate(t.columns)}
    out: dict[str, list[PairedComparison]] = {}
    for comparison in sorted(report.pairwise, key=lambda c: (order.get((c.task, c.metric, c.filter), 0), c.model_a, c.model_b)):
        out.setdefault(comparison.task, []).append(comparison)
    return out


def markdown_page(report: Report, settings: BootstrapSettings) -> str:
    by_task = ranks_by_task(report.ranks)
    parts = [
        "# Leaderboard", "",
        statistics_line(settings) + f" {DIRECTION_LEGEND} Each row's formula and source: the Glossary at the end.", "",
        overview_markdown(report.overview, by_task, settings.level), "",
    ]
    skipped = [f"- {markdown_escape(model.name)}: probe {probe} — {markdown_escape(reason)}"
               for model in report.models for probe, reason in model.probes_skipped.items()]
    if skipped:
        parts += ["## Probes skipped", "", "`probes=all` skipped these probes, which cannot run on the model:", "",
                  *skipped, ""]
    if report.failed:
        parts += ["## Attempted without a result", "",
                  "The sweep attempted these models × tasks and has no result for them (they take no rank):", "",
                  failed_markdown(report.failed), ""]
    if report.pairwise:
        parts += ["## Paired comparisons", "", pairwise_text(report, settings), "",
                  "Significant wins of the row's model over the column's model / columns compared (the overview's "
                  "counted columns).", "", pairwise_matrix_markdown(report.overview), ""]
        if any(any(row) for row in report.overview.trust_compared):
            parts += [f"The same on the trust rows of the counted tasks. {TRUST_TEXT}", "",
                      pairwise_matrix_markdown(report.overview, trust=True), ""]
        parts += ["Each task's correctness row, a − b on the documents both ran:", "",
                  pairwise_markdown(headline_comparisons(report), alpha=report.overview.alpha, level=settings.level), "",
                  "Every other row's comparisons: summary.json (`pairwise`) and the page, under each task.", ""]
    if any(m.metric == CORRECT for m in report.by_level):
        parts += ["## By difficulty level", "",
                  f"Each task's correctness per difficulty level: mean [{settings.level:.0%} percentile bootstrap interval "
                  "over the level's documents] (documents). Confidence and each probe per level: summary.json "
                  "(`by_level`) and the page's figures.", "",
                  level_markdown(report.by_level, report.overview.models), ""]
    if report.robustness:
        parts += ["## Robustness to noised inputs", "", "Δ = noised − clean.", "", robustness_markdown(report.robustness), ""]
    if report.support:
        parts += ["## Support tokens", "", "`probes=margin`: the k smallest-margin tokens of each document, and how many "
                  "documents each token is a support token of.", "", support_markdown(report.support), ""]
    for table in report.tables:
        parts += [f"## {markdown_escape(table.task)}", "", task_markdown(table, by_task.get(table.task)), ""]
    if report.tables:
        parts += ["## Glossary", "", glossary_markdown(report.tables), ""]
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
    alpha: float = DEFAULT_ALPHA,
    include_auxiliary_tasks: bool = False,
) -> Report:
    """Read the runs, compute the tables, CIs and figures, and write the report files into ``out``.

    Raises:
        FileNotFoundError: a run folder that does not exist or holds no results file.
        ValueError: ``n_resamples`` < 1, or ``level`` or ``alpha`` outside (0, 1).
    """
    from lm_eval_probes.reports import html, plots as plotting

    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    settings = BootstrapSettings(n_resamples=n_resamples, seed=seed, level=level)
    models = read_runs(run_dirs)
    logger.info("read %d model(s) from %s", len(models), ", ".join(map(str, run_dirs)))
    task_names = sorted({t for m in models for t in m.tasks})
    tables = tuple(task_table(models, task, settings) for task in task_names)
    rows = [RowSpec(t.task, c.metric, c.filter, c.direction, c == t.sorted_by) for t in tables for c in t.columns]
    pairwise = pairwise_comparisons(models, rows, n_resamples=n_resamples, seed=seed, level=level,
                                    include_auxiliary_tasks=include_auxiliary_tasks)
    rank_columns = [RankColumn(t.task, t.sorted_by.metric, t.sorted_by.filter, t.sorted_by.direction,
                               include_auxiliary_tasks or not is_auxiliary_task(t.task))
                    for t in tables if t.sorted_by is not None]
    ranks = rank_table(models, rank_columns, n_resamples=n_resamples, seed=seed, level=level)
    failed = failed_pairs(run_dirs, models)
    view = overview(models, tables, pairwise, alpha=alpha, include_auxiliary_tasks=include_auxiliary_tasks,
                    ranks=ranks_by_task(ranks).get(OVERVIEW_TASK))
    robustness = tuple(robustness_rows(models, settings))
    support = tuple(support_rows(models))
    by_level = tuple(level_means(models, settings))
    sections: list[html.FigureSection] = []
    bte_profiles = False
    if plots:
        bte, bte_profiles = plotting.bte_figures(models)
        figure_groups = [
            ("BTE depth profiles" if bte_profiles else "BTE central-window energy",
             "" if bte_profiles else "The samples carry ē_M per document but no per-layer profile (probe_bte_profile=full).", bte),
            ("HyperLens Ω", "", plotting.omega_figures(models)),
            ("Denoising trajectory", "", plotting.denoising_figures(models)),
            ("Reliability diagrams", "", plotting.reliability_figures(models)),
            ("Risk–coverage curves", "", plotting.risk_coverage_figures(models)),
            ("Clean vs noised", "", plotting.robustness_figures(robustness)),
            ("Against difficulty", "", plotting.difficulty_figures(by_level)),
        ]
        plot_dir = Path(out) / "plots"
        plot_dir.mkdir(parents=True, exist_ok=True)
        for title_, note, figures in figure_groups:
            for figure in figures:
                (plot_dir / f"{figure.name}.png").write_bytes(figure.png)
            sections.append(html.figure_section(title_, note, figures))
    report = Report(Path(out), tuple(models), view, tables, robustness, support, tuple(_notes(models, bte_profiles or not plots)),
                    pairwise, include_auxiliary_tasks, by_level, ranks, failed)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "leaderboard.md").write_text(markdown_page(report, settings), encoding="utf-8")
    parameters = {m.name: m.num_parameters for m in models}
    (out_dir / "leaderboard.csv").write_text(leaderboard_csv(view, tables, parameters, ranks_by_task(ranks), failed), encoding="utf-8")
    details = write_details(models, out_dir)
    exported = write_every_eval_ever(models, tables, out_dir, generator=f"lm-eval-probes {VERSION}")
    downloads: dict[str, list[tuple[str, str]]] = {}
    for (model_name, task), path in sorted(details.items()):
        downloads.setdefault(task, []).append((f"{model_name}: details (Parquet)", path.relative_to(out_dir).as_posix()))
    for (model_name, task), paths in sorted(exported.items()):
        downloads.setdefault(task, []).append((f"{model_name}: Every Eval Ever", paths[0].relative_to(out_dir).as_posix()))
    documents = write_documents(models, [t.task for t in tables], out_dir)
    summary = summary_json(report, settings)
    summary["exports"] = {
        "details": [{"model": m, "task": t, "path": p.relative_to(out_dir).as_posix()} for (m, t), p in sorted(details.items())],
        "every_eval_ever": [{"model": m, "task": t, "paths": [p.relative_to(out_dir).as_posix() for p in paths]}
                            for (m, t), paths in sorted(exported.items())],
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False, allow_nan=False),
                                          encoding="utf-8")
    page = html.render_page(title=title, version=VERSION, view=view, tables=tables, robustness=robustness,
                            support=support, sections=sections, models=models, notes=report.notes, n_resamples=n_resamples,
                            seed=seed, level=level, pairwise=headline_comparisons(report),
                            pairwise_text=pairwise_text(report, settings), statistics=statistics_line(settings).replace("`", ""),
                            trust_text=TRUST_TEXT, ranks=ranks_by_task(ranks), failed=failed,
                            task_comparisons=task_comparisons(report), downloads=downloads, documents=documents)
    (out_dir / "index.html").write_text(page, encoding="utf-8")
    return report


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lm-eval-probes report",
        description="Write a leaderboard (Markdown, CSV, JSON summary, one self-contained HTML page, PNG plots, "
                    "per-document details as Parquet under details/, an Every Eval Ever export under every_eval_ever/) "
                    "from lm_eval results_*.json and samples_*.jsonl files (a sweep's output folder, or runs of "
                    "`lm_eval --model hf-probes --log_samples`). Runs of the same model are merged; a sweep's failed "
                    "models x tasks are listed. Needs no torch.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="folders searched recursively for results_*.json (or the files)")
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES,
                   help=f"bootstrap resamples per interval (default {DEFAULT_RESAMPLES})")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0); recorded in summary.json")
    p.add_argument("--level", type=float, default=DEFAULT_LEVEL, help="interval coverage (default 0.95)")
    p.add_argument("--title", default="lm-eval-probes leaderboard", help="page title")
    p.add_argument("--no-plots", action="store_true", help="skip the figures (faster)")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"significance level of a win, after Holm correction (default {DEFAULT_ALPHA})")
    p.add_argument("--include-auxiliary-tasks", action="store_true",
                   help="count detector (*_detect) and reference (*_ref) tasks in the win rate (default: shown, not counted)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        report = build_report(args.run_dirs, args.out, n_resamples=args.resamples, seed=args.seed, level=args.level,
                              title=args.title, plots=not args.no_plots, alpha=args.alpha,
                              include_auxiliary_tasks=args.include_auxiliary_tasks)
    except (FileNotFoundError, ValueError) as error:
        print(f"lm-eval-probes report: error: {error}", file=sys.stderr)
        return 2
    print(f"{len(report.models)} model(s), {len(report.tables)} task(s): {report.out.resolve() / 'index.html'}")
    return 0
