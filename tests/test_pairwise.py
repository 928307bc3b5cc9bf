"""Paired comparisons in the leaderboard: McNemar, paired-bootstrap CIs, Holm, significant-only win rates, on
small synthetic runs written here (results and samples files as lm_eval writes them; no model)."""

from __future__ import annotations

import json
import math
import shutil
from math import comb
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from lm_eval_probes.reports import build_report
from lm_eval_probes.reports.corpus_rows import CalibrationOptions, corpus_row
from lm_eval_probes.reports.pairwise import RowSpec, comparison_family, holm_adjusted, mcnemar_exact, paired_difference

N_DOCS = 80


def write_run(root: Path, model: str, tasks: dict[str, dict[str, list]], date: str = "2026-01-01T00-00-00") -> Path:
    """One lm_eval run of ``model``: ``tasks[task][metric]`` = per-document values (doc_id = position). Mean rows
    get lm_eval's mean and stderr; ``selective_auroc`` records ``[confidence, correct]`` get the row's value."""
    folder = root / model
    folder.mkdir(parents=True)
    results, higher, configs, n_samples = {}, {}, {}, {}
    for task, metrics in tasks.items():
        rows: dict[str, object] = {"alias": task}
        lines = [{"doc_id": i, "filter": "none"} for i in range(len(next(iter(metrics.values()))))]
        for metric, values in metrics.items():
            for line, value in zip(lines, values):
                line[metric] = value
            row = corpus_row(metric)
            if row is None:
                array = np.asarray(values, dtype=float)
                rows[f"{metric},none"] = float(array.mean())
                rows[f"{metric}_stderr,none"] = float(array.std(ddof=1) / math.sqrt(len(array)))
            else:
                rows[f"{metric},none"] = row.statistic(np.asarray(values, dtype=float), CalibrationOptions())
                rows[f"{metric}_stderr,none"] = "N/A"
        results[task] = rows
        higher[task] = {metric: True for metric in metrics}
        configs[task] = {"metadata": {}}
        n_samples[task] = {"original": len(lines), "effective": len(lines)}
        with (folder / f"samples_{task}_{date}.jsonl").open("w") as handle:
            handle.writelines(json.dumps(line) + "\n" for line in lines)
    data = {"results": results, "higher_is_better": higher, "configs": configs, "n-samples": n_samples,
            "model_name": model, "config": {"model": "hf-probes", "model_args": f"pretrained={model}"}}
    (folder / f"results_{date}.json").write_text(json.dumps(data))
    return folder


def correctness(accuracy: float, seed: int, n: int = N_DOCS) -> list[float]:
    """0/1 outcomes with exactly round(accuracy·n) ones, in a seeded order."""
    ones = round(accuracy * n)
    return np.random.default_rng(seed).permutation([1.0] * ones + [0.0] * (n - ones)).tolist()


def flipped(values: list[float], at: list[int]) -> list[float]:
    return [1.0 - v if i in at else v for i, v in enumerate(values)]


# ---------------------------------------------------------------------------------------------- the statistics


def test_holm_against_a_hand_computed_example():
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → max(0.06, 0.04) = 0.06 (step-down monotone)
    got = holm_adjusted([0.01, 0.04, 0.03, 0.005])
    np.testing.assert_allclose(got, [0.03, 0.06, 0.06, 0.02], rtol=1e-12)
    # capped at 1; an undefined p-value is not counted in m (m = 2 here: 0.2·2 = 0.4, 0.6·1 → 0.6)
    got = holm_adjusted([0.6, math.nan, 0.2])
    assert got[0] == pytest.approx(0.6) and math.isnan(got[1]) and got[2] == pytest.approx(0.4)
    assert holm_adjusted([0.5, 0.7]).tolist() == [1.0, 1.0]


def test_rows_without_a_direction_form_their_own_family():
    """Baselines and counts (``higher_is_better`` None) are compared but adjusted apart and never win."""
    assert comparison_family(RowSpec("t", "acc", "none", True, True)) == "overview"
    assert comparison_family(RowSpec("t_detect", "acc", "none", True, True)) == "t_detect/lm_eval"
    assert comparison_family(RowSpec("t_detect", "acc", "none", True, True), include_auxiliary_tasks=True) == "overview"
    assert comparison_family(RowSpec("t", "ece", "none", False, False)) == "t/confidence"
    assert comparison_family(RowSpec("t", "tcb_log10", "none", True, False)) == "t/probe"
    assert comparison_family(RowSpec("t", "length_spearman", "none", None, False)) == "t/difficulty (no direction)"


def test_mcnemar_against_a_hand_count_and_scipy():
    # 7 documents only a gets right, 2 only b, 11 both, 5 neither
    a = np.array([1] * 7 + [0] * 2 + [1] * 11 + [0] * 5)
    b = np.array([0] * 7 + [1] * 2 + [1] * 11 + [0] * 5)
    hand = 2 * (comb(9, 0) + comb(9, 1) + comb(9, 2)) / 2**9  # two-sided exact binomial, 9 discordant at 1/2
    assert hand == pytest.approx(92 / 512)
    assert mcnemar_exact(a, b) == pytest.approx(hand, rel=1e-12)
    assert mcnemar_exact(a, b) == pytest.approx(stats.binomtest(2, 9, 0.5).pvalue, rel=1e-12)
    assert mcnemar_exact(b, a) == pytest.approx(hand, rel=1e-12)
    assert mcnemar_exact(a, a) == 1.0  # no discordant document
    result = paired_difference(a, b, n_resamples=200, seed=0, key=("a", "b", "t", "none"))
    assert result.test == "mcnemar_exact" and result.p_value == pytest.approx(hand)
    assert result.diff == pytest.approx(5 / 25) and result.n_documents == 25


def test_paired_bootstrap_interval_covers_a_known_difference():
    """Synthetic paired data with a known difference 0.3 and a large shared per-document effect: the paired
    interval covers 0.3 about 95 % of the time and is far narrower than an unpaired one would be; the paired
    permutation test holds its level when there is no difference."""
    rng = np.random.default_rng(1)
    covered, widths, null_rejections, n = 0, [], 0, 60
    repeats = 200
    for k in range(repeats):
        shared = rng.normal(0, 3.0, n)
        a = shared + 0.3 + rng.normal(0, 0.5, n)
        b = shared + rng.normal(0, 0.5, n)
        result = paired_difference(a, b, n_resamples=400, seed=k, key=("a", "b", "t", "none"))
        assert result.test == "paired_permutation" and result.diff == pytest.approx(np.mean(a - b))
        covered += result.ci_low <= 0.3 <= result.ci_high
        widths.append(result.ci_high - result.ci_low)
        null = paired_difference(shared + rng.normal(0, 0.5, n), b, n_resamples=400, seed=k, key=("a", "b", "t", "none"))
        null_rejections += null.p_value < 0.05
    assert 0.89 <= covered / repeats <= 0.99
    unpaired_width = 2 * 1.96 * math.sqrt(2 * (9.0 + 0.25) / n)  # what ignoring the pairing would give
    assert np.mean(widths) < unpaired_width / 4
    assert null_rejections / repeats <= 0.1
    # the interval is the percentile interval of the mean difference over resampled documents: checked by hand
    a, b = np.array([1.0, 2.0, 4.0, 7.0]), np.array([0.5, 2.5, 3.0, 5.0])
    from lm_eval_probes.reports.bootstrap import resample_indices

    indices = resample_indices(4, n_resamples=100, seed=3, key=("a", "b", "t", "none"))
    low, high = np.quantile((a - b)[indices].mean(axis=1), [0.025, 0.975])
    result = paired_difference(a, b, n_resamples=100, seed=3, key=("a", "b", "t", "none"))
    assert (result.ci_low, result.ci_high) == pytest.approx((low, high), rel=1e-12)


def test_a_corpus_row_is_compared_on_both_models_records():
    rng = np.random.default_rng(0)
    correct = rng.integers(0, 2, 50).astype(float)
    good = np.c_[np.where(correct == 1, 0.8, 0.3) + rng.normal(0, 0.1, 50), correct]  # confidence tracks correctness
    bad = np.c_[rng.uniform(0, 1, 50), correct]
    row = corpus_row("selective_auroc")
    result = paired_difference(good, bad, n_resamples=300, seed=0, key=("g", "b", "t", "none"), row=row)
    options = CalibrationOptions()
    assert result.diff == pytest.approx(row.statistic(good, options) - row.statistic(bad, options), rel=1e-12)
    assert result.test == "paired_permutation" and result.p_value < 0.01 and result.ci_low > 0


# ---------------------------------------------------------------------------------------------- the report


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """strong (0.9) ≫ weak (0.3) on two tasks; close = weak with 3 documents flipped to right (0.3375: not
    significant); on the detector and reference tasks weak ≫ strong. close ran only the first 60 documents of
    task_b. Confidence (a non-0/1 mean row) on task_a."""
    root = tmp_path_factory.mktemp("pairwise-runs")
    weak_a, weak_b = correctness(0.3, 1), correctness(0.3, 2)
    rng = np.random.default_rng(5)
    zeros_a = [i for i, v in enumerate(weak_a) if v == 0][:3]
    zeros_b = [i for i, v in enumerate(weak_b) if v == 0][:3]
    auxiliary = {"task_detect": {"acc": correctness(0.2, 3)}, "task_ref": {"acc": correctness(0.2, 4)}}
    write_run(root, "strong", {"task_a": {"acc": correctness(0.9, 1), "confidence": rng.uniform(0.5, 1, N_DOCS).tolist()},
                               "task_b": {"acc": correctness(0.9, 2)}, **auxiliary})
    auxiliary = {"task_detect": {"acc": correctness(0.95, 3)}, "task_ref": {"acc": correctness(0.95, 4)}}
    write_run(root, "weak", {"task_a": {"acc": weak_a, "confidence": rng.uniform(0, 0.5, N_DOCS).tolist()},
                             "task_b": {"acc": weak_b}, **auxiliary})
    write_run(root, "close", {"task_a": {"acc": flipped(weak_a, zeros_a), "confidence": rng.uniform(0, 0.5, N_DOCS).tolist()},
                              "task_b": {"acc": flipped(weak_b, zeros_b)[:60]}})
    return root


@pytest.fixture(scope="module")
def report(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("pairwise-report")
    built = build_report([runs], out, n_resamples=300, seed=0, plots=False)
    return built, out, json.loads((out / "summary.json").read_text())


def entry(summary: dict, a: str, b: str, task: str, metric: str = "acc") -> dict:
    (found,) = [e for e in summary["pairwise"] if {e["model_a"], e["model_b"]} == {a, b} and e["task"] == task
                and e["metric"] == metric]
    return found


def samples(runs: Path, model: str, task: str) -> dict[int, dict]:
    (path,) = (runs / model).glob(f"samples_{task}_*.jsonl")
    return {line["doc_id"]: line for line in map(json.loads, path.read_text().splitlines())}


def test_pairwise_entries_pair_documents_and_count_discordant_ones(runs, report):
    _, _, summary = report
    keys = {"model_a", "model_b", "task", "metric", "diff", "ci_low", "ci_high", "p_value", "p_holm", "n_documents"}
    assert summary["pairwise"] and all(keys <= set(e) for e in summary["pairwise"])
    found = entry(summary, "close", "weak", "task_b")
    assert (found["model_a"], found["model_b"]) == ("close", "weak")  # models in name order
    close, weak = samples(runs, "close", "task_b"), samples(runs, "weak", "task_b")
    shared = sorted(set(close) & set(weak))
    assert found["n_documents"] == len(shared) == 60
    only_close = sum(close[d]["acc"] == 1 and weak[d]["acc"] == 0 for d in shared)
    only_weak = sum(close[d]["acc"] == 0 and weak[d]["acc"] == 1 for d in shared)
    assert (only_close, only_weak) == (3, 0)  # the three flipped documents
    assert found["diff"] == pytest.approx((only_close - only_weak) / len(shared))
    assert found["test"] == "mcnemar_exact"
    assert found["p_value"] == pytest.approx(stats.binomtest(only_close, only_close + only_weak, 0.5).pvalue)
    assert found["ci_low"] <= found["diff"] <= found["ci_high"]
    confidence = entry(summary, "strong", "weak", "task_a", "confidence")
    assert confidence["test"] == "paired_permutation" and confidence["p_value"] < 0.01 and confidence["family"] == "task_a/probe"


def test_holm_is_applied_across_the_overview_table(report):
    _, _, summary = report
    family = [e for e in summary["pairwise"] if e["family"] == "overview"]
    assert {e["task"] for e in family} == {"task_a", "task_b"} and len(family) == 6  # 3 pairs × 2 tasks
    np.testing.assert_allclose([e["p_holm"] for e in family], holm_adjusted([e["p_value"] for e in family]), rtol=1e-12)
    assert all(e["p_holm"] >= e["p_value"] for e in summary["pairwise"])
    assert summary["pairwise_settings"]["alpha"] == 0.05 and summary["pairwise_settings"]["correction"] == "holm"


def test_the_win_rate_counts_only_significant_wins(report):
    built, out, summary = report
    rates = dict(zip(built.overview.models, built.overview.win_rate))
    # close is above weak on both tasks, but not significantly: no win (HELM's plain rate would give it 0.5)
    assert rates == {"strong": 1.0, "close": 0.0, "weak": 0.0}
    assert entry(summary, "close", "weak", "task_a")["significant_winner"] is None
    assert entry(summary, "strong", "weak", "task_a")["significant_winner"] == "strong"
    names = list(built.overview.models)
    strong, weak = names.index("strong"), names.index("weak")
    assert (built.overview.wins[strong][weak], built.overview.compared[strong][weak]) == (2, 2)
    assert built.overview.wins[weak][strong] == 0
    markdown = (out / "leaderboard.md").read_text()
    assert "## Paired comparisons" in markdown and "| strong | — | 2/2 | 2/2 |" in markdown
    assert "counts 0, not ½" in markdown and "Holm" in markdown


def test_detector_and_reference_tasks_stay_out_of_the_win_rate(runs, report, tmp_path):
    built, out, summary = report
    assert entry(summary, "strong", "weak", "task_detect")["family"] == "task_detect/lm_eval"
    assert entry(summary, "strong", "weak", "task_ref")["significant_winner"] == "weak"  # computed, not counted
    assert "task_detect: acc ↑ (not in win rate)" in (out / "leaderboard.md").read_text()
    included = build_report([runs], tmp_path, n_resamples=300, seed=0, plots=False, include_auxiliary_tasks=True)
    rates = dict(zip(included.overview.models, included.overview.win_rate))
    # strong: beats weak and close on task_a/b (1, 1), loses to weak on detect/ref and is not compared with close
    # there (close did not run them): (1 + 1 + 0 + 0) / 4
    assert rates["strong"] == pytest.approx(0.5) and rates["weak"] == pytest.approx(0.5)
    with_aux = json.loads((tmp_path / "summary.json").read_text())
    assert entry(with_aux, "strong", "weak", "task_detect")["family"] == "overview"


def test_pairwise_seeding_ignores_paths_and_other_models(runs, report, tmp_path):
    _, _, summary = report
    moved = tmp_path / "elsewhere" / "runs"
    for model in ("strong", "weak"):
        shutil.copytree(runs / model, moved / model)
    build_report([moved], tmp_path / "out", n_resamples=300, seed=0, plots=False)
    alone = json.loads((tmp_path / "out" / "summary.json").read_text())
    for e in alone["pairwise"]:
        same = entry(summary, e["model_a"], e["model_b"], e["task"], e["metric"])
        assert {k: e[k] for k in ("diff", "ci_low", "ci_high", "p_value")} == {k: same[k] for k in ("diff", "ci_low", "ci_high", "p_value")}


def test_the_page_shows_the_matrix_and_the_rule(report):
    _, out, _ = report
    page = (out / "index.html").read_text()
    assert 'id="pairwise-matrix"' in page and 'id="pairwise"' in page and "Paired comparisons" in page
    assert "Holm" in page and "counts 0, not ½" in page and "not counted" in page


def test_the_cli_options(runs, tmp_path, capsys):
    from lm_eval_probes.reports.report import main

    assert main([str(runs), "--out", str(tmp_path / "a"), "--resamples", "50", "--no-plots", "--include-auxiliary-tasks",
                 "--alpha", "0.01"]) == 0
    settings = json.loads((tmp_path / "a" / "summary.json").read_text())["pairwise_settings"]
    assert settings["include_auxiliary_tasks"] is True and settings["alpha"] == 0.01
    assert main([str(runs), "--out", str(tmp_path / "b"), "--alpha", "1.5", "--no-plots"]) == 2
    assert "alpha must be in (0, 1)" in capsys.readouterr().err
