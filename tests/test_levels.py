"""Means per difficulty level (reports/levels.py): each against a mean recomputed from the samples files, intervals
that bracket it and depend only on the model's own documents of that level, and where the report shows them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from lm_eval_probes.reports import build_report
from lm_eval_probes.reports.levels import CORRECT, level_markdown, level_means
from lm_eval_probes.reports.plots import difficulty_figures
from lm_eval_probes.reports.reading import read_runs
from lm_eval_probes.reports.tables import BootstrapSettings
from test_report_readability import MC_ROWS, task_values, write_run

SETTINGS = BootstrapSettings(n_resamples=200, seed=0, level=0.95)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("level-runs")
    for model, shift, seed in (("better", 1.0, 3), ("worse", 0.0, 4)):
        write_run(root, model, {"task_mc": ("none", task_values(MC_ROWS, np.random.default_rng(seed), shift))})
    return root


def _samples(runs: Path, model: str) -> list[dict]:
    (path,) = (runs / model).glob("samples_task_mc_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_level_mean_recomputed_from_the_samples(runs: Path) -> None:
    means = level_means(read_runs([runs]), SETTINGS)
    for model in ("better", "worse"):
        samples = _samples(runs, model)
        levels = [s["tcb_spearman"][1] for s in samples]  # the difficulty rides on every ranked record
        for metric, column in ((CORRECT, "acc"), ("confidence", "confidence"), ("bte_energy", "bte_energy")):
            for level in sorted(set(levels)):
                values = np.array([s[column] for s, lv in zip(samples, levels) if lv == level], dtype=float)
                (entry,) = [m for m in means if (m.model, m.metric, m.level) == (model, metric, level)]
                assert entry.task == "task_mc" and entry.n == len(values)
                assert entry.mean == pytest.approx(values.mean(), abs=1e-12)
                assert values.min() <= entry.low <= entry.mean <= entry.high <= values.max()


def test_intervals_depend_only_on_the_models_own_documents(runs: Path, tmp_path: Path) -> None:
    alone = level_means(read_runs([runs / "better"]), SETTINGS)
    together = [m for m in level_means(read_runs([runs]), SETTINGS) if m.model == "better"]
    assert alone == together
    constant = tmp_path / "constant"
    values = task_values(MC_ROWS, np.random.default_rng(5), 0.0)
    values["acc"] = [1.0] * len(values["acc"])
    write_run(constant, "always", {"task_mc": ("none", values)})
    for entry in level_means(read_runs([constant]), SETTINGS):
        if entry.metric == CORRECT:
            assert (entry.mean, entry.low, entry.high) == (1.0, 1.0, 1.0)


def test_report_lists_levels_in_markdown_and_json_and_draws_error_bars(runs: Path, tmp_path: Path) -> None:
    report = build_report([runs], tmp_path / "out", n_resamples=SETTINGS.n_resamples, plots=False)
    page = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "## By difficulty level" in page and level_markdown(report.by_level, report.overview.models) in page
    by_level = json.loads((tmp_path / "out" / "summary.json").read_text())["by_level"]
    assert by_level == [m.to_json() for m in report.by_level] and len(by_level) == len(report.by_level) > 0
    first = next(m for m in report.by_level if m.metric == CORRECT and m.model == "better")
    assert f"| {first.level:g} | {first.mean:.3f} [{first.low:.3f}, {first.high:.3f}] ({first.n})" in page
    (figure,) = difficulty_figures(report.by_level)
    assert figure.name == "difficulty_task_mc" and figure.png.startswith(b"\x89PNG") and "error bars" in figure.caption
    assert not any(math.isnan(m.mean) for m in report.by_level)
