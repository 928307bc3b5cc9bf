"""The report's figures (matplotlib, Agg backend, PNG bytes), drawn from the per-document samples.

Each function returns :class:`Figure` objects (or none when the runs lack what it needs):

* :func:`reliability_figures` — reliability diagram per task (accuracy vs mean confidence per bin);
* :func:`risk_coverage_figures` — risk–coverage curve per task;
* :func:`robustness_figures` — clean vs noised accuracy and selective AUROC per clean task and operator;
* :func:`difficulty_figures` — accuracy, confidence, BTE energy, δ_TCB, Ω and margin per difficulty level;
* :func:`omega_figures` — HyperLens confidence trajectories C_i (mean over documents) where samples carry
  ``omega_trajectory`` (``probes=omega``);
* :func:`bte_figures` — BTE depth profiles (mean over documents of e(l)) where samples carry
  ``bte_profile``; otherwise the distribution of the central-window energy ē_M, with a note that the
  samples hold no profile;
* :func:`denoising_figures` — masked-diffusion runs: ECE and selective AUROC along the denoising trajectory
  (``ece_at_step_<k>``, ``selective_auroc_at_step_<k>``) and confidence against reveal step.

Model names go into legends as plain text (``$`` escaped, so mathtext never parses them).
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from lm_eval_probes.probes.calibration import reliability_diagram, risk_coverage_curve  # noqa: E402
from lm_eval_probes.metrics.calibration import CalibrationOptions
from lm_eval_probes.reports.corpus_rows import records  # noqa: E402
from lm_eval_probes.reports.levels import LevelMean, level_metrics  # noqa: E402
from lm_eval_probes.reports.reading import ModelResults, TaskResult  # noqa: E402
from lm_eval_probes.reports.tables import RobustnessRow, primary_metric, primary_samples  # noqa: E402
from lm_eval_probes import registry  # noqa: E402
from lm_eval_probes.declarations import (  # noqa: E402
    ECE,
    REVEAL_STEP,
    SELECTIVE_AUROC,
    TRAJECTORY_PERCENTS,
    TRAJECTORY_ROWS,
)


@dataclass(frozen=True)
class Figure:
    """A rendered figure: ``name`` (file stem, ASCII), ``title``, ``caption``, ``png`` bytes."""

    name: str
    title: str
    caption: str
    png: bytes


def plain_label(text: str) -> str:
    """A model or task name safe as matplotlib text (no mathtext)."""
    return text.replace("$", r"\$")


def _file_stem(*parts: str) -> str:
    raw = "_".join(parts)
    return "".join(ch if ch.isascii() and (ch.isalnum() or ch in "-_") else "_" for ch in raw)[:120]


def _render(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _confidence_records(result: TaskResult) -> tuple[np.ndarray, np.ndarray] | None:
    primary = primary_metric(result)
    if primary is None:
        return None
    rows = records(result.samples_of(primary[1]), ECE.name, 2)
    return (rows[:, 0], rows[:, 1]) if len(rows) else None


def _tasks(models: Sequence[ModelResults]) -> list[str]:
    return sorted({task for m in models for task in m.tasks})


def _confidence_curves(
    models: Sequence[ModelResults],
) -> list[tuple[str, list[tuple[ModelResults, TaskResult, tuple[np.ndarray, np.ndarray]]]]]:
    """Per task (sorted), the models whose samples hold its ``(confidence, correct)`` records; tasks without
    any are left out."""
    out = []
    for task in _tasks(models):
        curves = []
        for model in models:
            result = model.tasks.get(task)
            pairs = _confidence_records(result) if result else None
            if pairs is not None:
                curves.append((model, result, pairs))
        if curves:
            out.append((task, curves))
    return out


RELIABILITY_MARKER_AREA = 360.0
"""Marker area (points²) of the fullest bin of a reliability diagram; the others scale with their documents."""


def marker_areas(counts: np.ndarray) -> np.ndarray:
    """Marker areas proportional to the documents in each bin: the fullest bin gets
    :data:`RELIABILITY_MARKER_AREA` points², a bin with a tenth of its documents a tenth of that (at least 4 points²,
    so that a bin of one document stays visible)."""
    counts = np.asarray(counts, dtype=float)
    if counts.size == 0 or counts.max() <= 0:
        return np.zeros(counts.shape)
    return np.maximum(4.0, RELIABILITY_MARKER_AREA * counts / counts.max())


def reliability_figures(models: Sequence[ModelResults]) -> list[Figure]:
    """One reliability diagram per task with confidence records: per model, accuracy against mean
    confidence of each non-empty bin (the task's ECE binning), marker area ∝ documents in the bin."""
    figures = []
    for task, curves in _confidence_curves(models):
        fig, ax = plt.subplots(figsize=(5.5, 4.2))
        for model, result, pairs in curves:
            options = CalibrationOptions.from_metadata(result.metadata)
            diagram = reliability_diagram(*pairs, n_bins=options.ece_bins, binning=options.ece_binning)
            filled = diagram.count > 0
            line, = ax.plot(diagram.mean_confidence[filled], diagram.accuracy[filled], linewidth=1,
                            label=plain_label(model.name))
            ax.scatter(diagram.mean_confidence[filled], diagram.accuracy[filled], s=marker_areas(diagram.count[filled]),
                       color=line.get_color(), alpha=0.45, edgecolors=line.get_color(), linewidths=0.8)
        ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
        ax.set(xlim=(0, 1), ylim=(-0.02, 1.02), xlabel="mean confidence in bin", ylabel="accuracy in bin",
               title=plain_label(f"Reliability: {task}"))
        ax.legend(fontsize=7)
        figures.append(Figure(_file_stem("reliability", task), f"Reliability diagram — {task}",
                              "Accuracy against mean confidence per confidence bin (the task's ECE bins); "
                              "marker area ∝ documents in the bin (the fullest bin largest); the dashed diagonal is perfect calibration.",
                              _render(fig)))
    return figures


def risk_coverage_figures(models: Sequence[ModelResults]) -> list[Figure]:
    """One risk–coverage plot per task: error rate among the k most confident documents against k/n."""
    figures = []
    for task, curves in _confidence_curves(models):
        fig, ax = plt.subplots(figsize=(5.5, 4.2))
        for model, _result, pairs in curves:
            coverage, risk = risk_coverage_curve(*pairs)
            ax.step(coverage, risk, where="post", label=plain_label(model.name))
        ax.set(xlim=(0, 1), ylim=(-0.02, 1.02), xlabel="coverage (fraction kept, most confident first)",
               ylabel="risk (error rate of the kept)", title=plain_label(f"Risk–coverage: {task}"))
        ax.legend(fontsize=7)
        figures.append(Figure(_file_stem("risk_coverage", task), f"Risk–coverage — {task}",
                              "Lower is better; the area under each curve is AURC.", _render(fig)))
    return figures


def robustness_figures(rows: Sequence[RobustnessRow]) -> list[Figure]:
    """Per clean task: grouped bars of accuracy and selective AUROC, clean and under each operator, one
    bar per model; an undefined value gets no bar and an ``undefined`` mark."""
    figures = []
    for base in sorted({r.base for r in rows}):
        mine = [r for r in rows if r.base == base]
        operators = sorted({r.operator for r in mine})
        model_names = sorted({r.model for r in mine})
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, key, label in zip(axes, ("primary", SELECTIVE_AUROC.name), ("accuracy", "selective AUROC")):
            width = 0.8 / max(1, len(model_names))
            for i, name in enumerate(model_names):
                by_op = {r.operator: r for r in mine if r.model == name}
                first = next(iter(by_op.values()))
                values = [first.clean[key].value] + [by_op[op].noised[key].value if op in by_op else math.nan for op in operators]
                x = np.arange(len(values)) + (i - (len(model_names) - 1) / 2) * width
                heights = [v if math.isfinite(v) else 0.0 for v in values]
                bars = ax.bar(x, heights, width=width, label=plain_label(name))
                for xi, v, bar in zip(x, values, bars):
                    if not math.isfinite(v):
                        bar.set_visible(False)
                        ax.text(xi, 0.02, "undefined", rotation=90, ha="center", va="bottom", fontsize=6)
            ax.set_xticks(np.arange(len(operators) + 1), ["clean", *operators])
            ax.set(ylim=(0, 1.05), ylabel=label, title=plain_label(f"{base}: {label}"))
        axes[0].legend(fontsize=7)
        figures.append(Figure(_file_stem("robustness", base), f"Clean vs noised — {base}",
                              "Accuracy and selective AUROC on the clean task and on each noised twin.", _render(fig)))
    return figures


def difficulty_figures(means: Sequence[LevelMean]) -> list[Figure]:
    """Per task with difficulty labels: accuracy, confidence and each probe's headline value per difficulty level
    (:func:`~lm_eval_probes.reports.levels.level_means`: the mean and its bootstrap interval as an error bar), one
    line per model, one panel per metric (three panels a row)."""
    figures = []
    metrics = level_metrics()
    for task in sorted({m.task for m in means}):
        of_task = [m for m in means if m.task == task]
        shown = [(metric, label) for metric, label in metrics if any(m.metric == metric for m in of_task)]
        models = list(dict.fromkeys(m.model for m in of_task))
        columns = min(3, len(shown))
        rows = -(-len(shown) // columns)
        fig, axes = plt.subplots(rows, columns, figsize=(3.7 * columns, 2.9 * rows + 0.6), squeeze=False,
                                 layout="constrained")
        offsets = np.linspace(-0.08, 0.08, len(models)) if len(models) > 1 else np.zeros(1)
        for ax, (metric, label) in zip(axes.flat, shown):
            for offset, model in zip(offsets, models):
                points = [m for m in of_task if m.model == model and m.metric == metric]
                if not points:
                    continue
                xs = np.array([m.level for m in points]) + offset
                ys = np.array([m.mean for m in points])
                low = np.array([m.mean - m.low if math.isfinite(m.low) else 0.0 for m in points])
                high = np.array([m.high - m.mean if math.isfinite(m.high) else 0.0 for m in points])
                ax.errorbar(xs, ys, yerr=np.vstack([low, high]), marker="o", markersize=3, capsize=2, linewidth=1,
                            label=plain_label(model))
            ax.set_title(label, fontsize=9)
            ax.tick_params(labelsize=8)
            ax.set_xticks(sorted({m.level for m in of_task}))
            ax.set_xlabel("difficulty level", fontsize=8)
        for ax in axes.flat[len(shown):]:
            ax.set_visible(False)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        labels = [textwrap.fill(label, 70) for label in labels]  # a plain run's name carries its model_args
        fig.legend(handles, labels, loc="outside lower center", fontsize=8, frameon=False,
                   ncols=1 if any("\n" in label or len(label) > 35 for label in labels) else min(4, len(labels)))
        fig.suptitle(plain_label(task), fontsize=10)
        figures.append(Figure(_file_stem("difficulty", task), f"Against difficulty — {task}",
                              "Mean per difficulty level of the task's label (steps, depth, hops, people, level); error "
                              "bars: percentile bootstrap interval of the mean over the level's documents.", _render(fig)))
    return figures


def bte_figures(models: Sequence[ModelResults]) -> tuple[list[Figure], bool]:
    """BTE per model: depth profiles when samples carry ``bte_profile``, else ē_M distributions.

    Returns:
        (figures, profiles_found): ``profiles_found`` False means no sample held a profile (lm_eval
        ``--log_samples`` files of this plugin carry only ē_M), so the figures show ē_M per task.
    """
    figures: list[Figure] = []
    bte = registry.probe("bte")
    profiles = _depth_curves(models, bte.row("vector").name)
    if profiles:
        figures.append(_depth_figure(
            profiles, "bte_profiles", "BTE depth profiles", "relative depth (transition l → l+1)", "mean JSD (nats)",
            "transitions", "Mean over documents (each task's correctness filter) of the per-transition JSD e(l)."))
        return figures, True
    for task in _tasks(models):
        data = []
        for model in models:
            result = model.tasks.get(task)
            if result is None:
                continue
            samples = primary_samples(result)
            name = bte.row("float").name
            values = [float(s[name]) for s in samples if isinstance(s.get(name), (int, float)) and math.isfinite(float(s[name]))]
            if values:
                data.append((model.name, values))
        if not data:
            continue
        fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(data) + 2), 3.6))
        ax.boxplot([v for _, v in data])
        ax.set_xticks(range(1, len(data) + 1), [plain_label(n) for n, _ in data], rotation=20, ha="right", fontsize=7)
        ax.set(ylabel="ē_M (nats)", title=plain_label(f"BTE central-window energy: {task}"))
        figures.append(Figure(_file_stem(bte.row("float").name, task), f"BTE energy — {task}",
                              "Per-document ē_M. The samples carry no per-layer profile, so no depth profile is drawn.",
                              _render(fig)))
    return figures, False


def _depth_curves(models: Sequence[ModelResults], key: str) -> dict[str, list[np.ndarray]]:
    """Model name → the per-document vectors under ``key`` (``bte_profile``, ``omega_trajectory``) of every
    task's samples of its correctness filter (one line per document); a ``null`` member stays ``nan``."""
    curves: dict[str, list[np.ndarray]] = {}
    for model in models:
        for result in model.tasks.values():
            for sample in primary_samples(result):
                vector = sample.get(key)
                if isinstance(vector, list) and vector and all(v is None or isinstance(v, (int, float)) for v in vector):
                    curves.setdefault(model.name, []).append(np.array([math.nan if v is None else v for v in vector], dtype=float))
    return curves


def _depth_figure(curves: Mapping[str, list[np.ndarray]], name: str, title: str, xlabel: str, ylabel: str,
                  unit: str, caption: str) -> Figure:
    """One line per model: the mean over documents of its vectors against relative depth (0 = first, 1 = last)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for model, rows in curves.items():
        depth = max(len(r) for r in rows)
        stacked = np.full((len(rows), depth), np.nan)
        for i, r in enumerate(rows):
            stacked[i, : len(r)] = r
        relative = np.arange(depth) / max(1, depth - 1)
        ax.plot(relative, np.nanmean(stacked, axis=0), marker="o", markersize=2,
                label=plain_label(f"{model} ({depth} {unit}, {len(rows)} documents)"))
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=7)
    return Figure(name, title, caption, _render(fig))


def omega_figures(models: Sequence[ModelResults]) -> list[Figure]:
    """HyperLens Ω: the mean confidence trajectory C_i per model, when samples carry ``omega_trajectory``."""
    curves = _depth_curves(models, registry.probe("omega").row("vector").name)
    if not curves:
        return []
    return [_depth_figure(
        curves, "omega_trajectories", "HyperLens confidence trajectories", "relative depth of the source layer i",
        "C_i (top-K mass of the focal-depth decoding)", "source layers",
        "Mean over documents (each task's correctness filter) of C_i; Ω = Σ_i (1 − C_i) is the area above the curve.")]


def denoising_curves(result: TaskResult) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(percent of the steps, ece_at_step_<k>, selective_auroc_at_step_<k>)`` of one masked-diffusion task, in
    its correctness filter (``nan`` where a row is undefined); ``None`` when it has no trajectory row."""
    primary = primary_metric(result)
    if primary is None:
        return None
    at = {(row.aggregation, row.at_percent): row.name for row in TRAJECTORY_ROWS}
    found = [(result.metric(at[ECE.aggregation, p], primary[1]), result.metric(at[SELECTIVE_AUROC.aggregation, p], primary[1]))
             for p in TRAJECTORY_PERCENTS]
    if all(ece is None and auroc is None for ece, auroc in found):
        return None
    values = np.array([[math.nan if m is None else m.value for m in pair] for pair in found], dtype=float)
    return np.array(TRAJECTORY_PERCENTS, dtype=float), values[:, 0], values[:, 1]


def denoising_figures(models: Sequence[ModelResults]) -> list[Figure]:
    """Masked-diffusion runs (``hf-probes-diffusion``): one figure per task with trajectory rows — ECE and
    selective AUROC of the confidence at 25/50/75/100 % of the denoising steps against that progress, one line
    per model, and each document's confidence against the mean step at which its answer was revealed
    (``reveal_step``; correct answers filled, wrong ones hollow)."""
    figures = []
    for task in _tasks(models):
        curves = [(model, model.tasks[task], denoising_curves(model.tasks[task])) for model in models if task in model.tasks]
        curves = [(model, result, curve) for model, result, curve in curves if curve is not None]
        if not curves:
            continue
        fig, (ece_ax, auroc_ax, reveal_ax) = plt.subplots(1, 3, figsize=(13, 3.8))
        for model, result, (percent, ece, auroc) in curves:
            label = plain_label(model.name)
            line, = ece_ax.plot(percent, ece, marker="o", label=label)
            auroc_ax.plot(percent, auroc, marker="o", color=line.get_color(), label=label)
            step, ece = REVEAL_STEP.name, ECE.name
            points = [(float(s[step]), float(s[ece][0]), int(s[ece][1])) for s in primary_samples(result)
                      if isinstance(s.get(step), (int, float)) and isinstance(s.get(ece), list)
                      and len(s[ece]) == 2 and all(isinstance(v, (int, float)) for v in s[ece])]
            if points:
                step, confidence, correct = (np.array(v) for v in zip(*points))
                reveal_ax.scatter(step[correct == 1], confidence[correct == 1], s=10, color=line.get_color(), label=label)
                reveal_ax.scatter(step[correct == 0], confidence[correct == 0], s=10, facecolors="none",
                                  edgecolors=line.get_color())
        auroc_ax.axhline(0.5, color="grey", linestyle="--", linewidth=1, label="chance")
        ece_ax.set(xlabel="denoising progress (% of the steps)", ylabel="ECE", xlim=(0, 105), title="ECE along the trajectory")
        auroc_ax.set(xlabel="denoising progress (% of the steps)", ylabel="selective AUROC", xlim=(0, 105), ylim=(0, 1),
                     title="AUROC along the trajectory")
        reveal_ax.set(xlabel="mean reveal step of the answer (0 = first)", ylabel="reveal-time confidence", ylim=(-0.02, 1.02),
                      title="Confidence against reveal step")
        for ax in (ece_ax, auroc_ax, reveal_ax):
            ax.legend(fontsize=7)
        fig.suptitle(plain_label(task), fontsize=10)
        figures.append(Figure(_file_stem("denoising", task), f"Along the denoising trajectory — {task}",
                              "Left and middle: ECE and selective AUROC of each document's confidence in its final answer "
                              "(geometric mean of the answer tokens' probabilities of their final tokens) at 25/50/75/100 % "
                              "of the denoising steps. Right: each document's reveal-time confidence against the mean step "
                              "that revealed its answer (filled: correct, hollow: wrong).", _render(fig)))
    return figures
