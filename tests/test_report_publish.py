"""What makes the leaderboard publishable: rank intervals and tie groups, every corpus row compared, the Every Eval
Ever export, the Parquet details, the failed pairs of a sweep (synthetic runs written here; one sweep on the tiny
model)."""

from __future__ import annotations

import csv
import io
import json
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest

from cached_envs import cached_wheel
from lm_eval_probes.metrics.calibration import CalibrationOptions
from lm_eval_probes.reports import build_report
from lm_eval_probes.reports.corpus_rows import corpus_row
from lm_eval_probes.reports.pairwise import paired_difference
from lm_eval_probes.reports.ranks import OVERVIEW_TASK, rank_intervals, ranks_of, tie_groups
from lm_eval_probes.rows import ROWS, ROWS_BY_NAME
from test_pairwise import correctness, write_run

N = 200


def ranks_of_summary(summary: dict, task: str) -> dict[str, dict]:
    return {r["model"]: r for r in summary["ranks"] if r["task"] == task}


# ---------------------------------------------------------------------------------------------- ranks


def test_rank_on_a_resample_counts_the_strictly_better_models():
    assert ranks_of(np.array([0.5, 0.9, 0.5, 0.1])).tolist() == [2, 1, 2, 4]  # ties share the better rank
    assert ranks_of(np.array([[1.0, 2.0], [2.0, 1.0]])).tolist() == [[2, 1], [1, 2]]
    # groups: connected runs of overlapping intervals, visited by their low end
    assert tie_groups([1, 1, 3, 4], [2, 3, 4, 4], [0, 1, 2, 3]) == [1, 1, 1, 1]
    assert tie_groups([1, 2, 3], [1, 2, 3], [0, 1, 2]) == [1, 2, 3]
    ranked = rank_intervals("t", ["a", "b"], np.array([[1.0, 0.0]] * 10), np.array([1.0, 0.0]), level=0.95, n_documents=5)
    assert [(r.model, r.rank, r.rank_low, r.rank_high, r.group) for r in ranked] == [("a", 1, 1, 1, 1), ("b", 2, 2, 2, 2)]


@pytest.fixture(scope="module")
def rank_runs(tmp_path_factory) -> Path:
    """copy_a and copy_b: the same outcomes on every document; best: right on all 200 documents, worst wrong on
    all; worst_b: right where worst is wrong on task_b only for 40 documents."""
    root = tmp_path_factory.mktemp("rank-runs")
    shared = correctness(0.5, 11, N)
    write_run(root, "copy_a", {"task_a": {"acc": shared}})
    write_run(root, "copy_b", {"task_a": {"acc": shared}})
    write_run(root, "best", {"task_a": {"acc": [1.0] * N}})
    write_run(root, "worst", {"task_a": {"acc": [0.0] * N}})
    return root


@pytest.fixture(scope="module")
def rank_report(rank_runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("rank-report")
    built = build_report([rank_runs], out, n_resamples=200, seed=3, plots=False)
    return built, out, json.loads((out / "summary.json").read_text())


def test_exact_copies_share_one_group_and_the_same_interval(rank_report):
    _, _, summary = rank_report
    for task in ("task_a", OVERVIEW_TASK):
        ranks = ranks_of_summary(summary, task)
        assert set(ranks) == {"copy_a", "copy_b", "best", "worst"}
        a, b = ranks["copy_a"], ranks["copy_b"]
        assert (a["rank_low"], a["rank_high"], a["group"]) == (b["rank_low"], b["rank_high"], b["group"]) == (2, 2, 2)
        assert a["rank"] == b["rank"] == 2


def test_a_model_right_wherever_the_other_is_wrong_is_ranked_alone(rank_report):
    built, out, summary = rank_report
    ranks = ranks_of_summary(summary, "task_a")
    assert (ranks["best"]["rank_low"], ranks["best"]["rank_high"]) == (1, 1)
    assert (ranks["worst"]["rank_low"], ranks["worst"]["rank_high"]) == (4, 4)
    groups = [r["group"] for r in ranks.values()]
    assert groups.count(ranks["best"]["group"]) == 1 and groups.count(ranks["worst"]["group"]) == 1
    assert summary["rank_settings"]["overview_task"] == OVERVIEW_TASK and summary["rank_settings"]["seed"] == 3
    assert all(set(r) >= {"task", "model", "rank_low", "rank_high", "group"} for r in summary["ranks"])
    assert list(built.overview.models) == ["best", "copy_a", "copy_b", "worst"]  # sorted by the overview's rank
    markdown = (out / "leaderboard.md").read_text()
    assert "| best | unknown | 1 | 1 (alone) |" in markdown and "2 (tied with 1 other)" in markdown
    rows = list(csv.DictReader(io.StringIO((out / "leaderboard.csv").read_text())))
    assert {r["model"]: (r["rank_low"], r["rank_high"], r["group"]) for r in rows}["worst"] == ("4", "4", "3")
    assert {r["model"]: r["task_a rank_low"] for r in rows}["best"] == "1"
    page = (out / "index.html").read_text()
    assert "mean win rate 0.000" not in page and ">tie group<" in page


def test_ranks_are_seeded_and_overlap_where_the_documents_cannot_tell(tmp_path):
    """Two models 3 documents apart out of 200: their intervals overlap, one group; the same seed gives the same
    intervals, which are recorded."""
    base = correctness(0.5, 5, N)
    zeros = [i for i, v in enumerate(base) if v == 0][:3]
    write_run(tmp_path / "runs", "near", {"t": {"acc": [1.0 if i in zeros else v for i, v in enumerate(base)]}})
    write_run(tmp_path / "runs", "far", {"t": {"acc": base}})
    summaries = []
    for k in range(2):
        build_report([tmp_path / "runs"], tmp_path / f"out{k}", n_resamples=200, seed=9, plots=False)
        summaries.append(json.loads((tmp_path / f"out{k}" / "summary.json").read_text())["ranks"])
    assert summaries[0] == summaries[1]
    ranks = {r["model"]: r for r in summaries[0] if r["task"] == "t"}
    assert ranks["near"]["group"] == ranks["far"]["group"] == 1
    assert ranks["near"]["rank_high"] == 2 or ranks["far"]["rank_low"] == 1


# ---------------------------------------------------------------------------------------------- corpus rows compared


CONFIDENCE_ROWS = ("ece", "ece_10_bin", "aurc", "prr", "selective_auroc", "selective_cov_acc_area")


@pytest.mark.parametrize("binning", ["uniform", "quantile", "helm"])
def test_resampled_corpus_rows_equal_the_project_functions(binning):
    """The all-resamples-at-once forms against the rows' own aggregation, resample by resample (ties, one class)."""
    rng = np.random.default_rng(0)
    options = CalibrationOptions(ece_binning=binning, ece_bins=7)
    for n, rounded, one_class in ((1, False, False), (9, True, False), (40, False, False), (40, True, True)):
        records = np.c_[np.round(rng.random(n), 1) if rounded else rng.random(n),
                        np.ones(n) if one_class else rng.integers(0, 2, n)]
        indices = rng.integers(0, n, (30, n))
        for name in (*CONFIDENCE_ROWS, "selective_acc_50", "selective_acc_80"):
            row = corpus_row(name)
            assert row is not None and row.resampled is not None, name
            fast = row.on_resamples(records, indices, options)
            slow = np.array([row.statistic(records[i], options) for i in indices])
            np.testing.assert_allclose(fast, slow, atol=1e-12, err_msg=f"{name} n={n}")


def confidence_records(accuracy: float, calibrated: bool, seed: int) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    correct = rng.random(N) < accuracy
    confidence = np.where(correct, rng.uniform(0.6, 1.0, N), rng.uniform(0.0, 0.4, N)) if calibrated \
        else rng.uniform(0.0, 1.0, N)
    return [[float(c), float(y)] for c, y in zip(confidence, correct)]


def test_every_trust_row_is_compared_with_its_declared_direction(tmp_path):
    """A model whose confidence separates right from wrong against one whose confidence is noise: every trust row
    is compared, in the declared direction, Holm-adjusted within the task's confidence family, and counted in the
    trust matrix."""
    good = confidence_records(0.6, True, 1)
    noise = confidence_records(0.6, False, 2)
    rows = {name: None for name in CONFIDENCE_ROWS}
    write_run(tmp_path / "runs", "good", {"t": {"acc": [y for _, y in good], **{r: good for r in rows}}})
    write_run(tmp_path / "runs", "noise", {"t": {"acc": [y for _, y in noise], **{r: noise for r in rows}}})
    built = build_report([tmp_path / "runs"], tmp_path / "out", n_resamples=200, seed=0, plots=False)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    found = {e["metric"]: e for e in summary["pairwise"] if e["task"] == "t"}
    for name in CONFIDENCE_ROWS:
        entry = found[name]
        assert entry["higher_is_better"] is ROWS_BY_NAME[name].higher_is_better, name
        assert entry["family"] == "t/confidence" and entry["test"] == "paired_permutation", name
        assert entry["significant_winner"] == "good", (name, entry)
        assert entry["ci_low"] <= entry["diff"] <= entry["ci_high"]
    family = [e for e in summary["pairwise"] if e["family"] == "t/confidence"]
    from lm_eval_probes.reports.pairwise import holm_adjusted

    np.testing.assert_allclose([e["p_holm"] for e in family], holm_adjusted([e["p_value"] for e in family]))
    names = list(built.overview.models)
    assert built.overview.trust_wins[names.index("good")][names.index("noise")] == len(CONFIDENCE_ROWS)
    page = (tmp_path / "out" / "index.html").read_text()
    assert 'id="trust-matrix"' in page and 'id="task-pairwise-1"' in page


def test_a_corpus_row_difference_recomputes_the_row_on_each_model():
    good, noise = np.array(confidence_records(0.6, True, 1)), np.array(confidence_records(0.6, False, 2))
    options = CalibrationOptions()
    row = corpus_row("ece")
    result = paired_difference(good, noise, n_resamples=100, seed=0, key=("a", "b", "t", "none"), row=row, options=options)
    assert result.diff == pytest.approx(row.statistic(good, options) - row.statistic(noise, options))


# ---------------------------------------------------------------------------------------------- Every Eval Ever, details


def every_eval_ever_schemas() -> tuple[dict, dict]:
    """The schemas of the every-eval-ever 0.3.0 wheel (for Python 3.12; downloaded once per machine into the user's
    cache by :func:`cached_envs.cached_wheel`); never copied into the project."""
    with zipfile.ZipFile(cached_wheel("every-eval-ever==0.3.0", "3.12")) as archive:
        return tuple(json.loads(archive.read(f"every_eval_ever/schemas/{name}.schema.json"))  # type: ignore[return-value]
                     for name in ("eval", "instance_level_eval"))


@pytest.fixture(scope="module")
def export_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("export-runs")
    records = confidence_records(0.6, True, 1)
    write_run(root, "org/model-a", {"t": {"acc": [y for _, y in records], "confidence": [c for c, _ in records],
                                          "ece": records, "selective_auroc": records}})
    write_run(root, "model-b", {"t": {"acc": correctness(0.4, 3, N)}})
    out = tmp_path_factory.mktemp("export-report")
    built = build_report([root], out, n_resamples=100, seed=0, plots=False)
    return built, out


def test_every_eval_ever_aggregate_fields_and_types(export_report):
    built, out = export_report
    files = sorted((out / "every_eval_ever").rglob("*.json"))
    assert len(files) == 2
    record = json.loads(next(f for f in files if "model-a" in f.parent.name).read_text())
    assert record["schema_version"] == "0.3.0" and record["evaluation_id"].startswith("t/org/model-a/")
    assert record["model_info"]["id"] == "org/model-a" and record["model_info"]["developer"] == "org"
    assert record["model_info"]["additional_details"]["deployment_type"] == "self_deployed"
    assert record["source_metadata"]["source_type"] == "evaluation_run"
    by_metric = {r["metric_config"]["metric_name"]: r for r in record["evaluation_results"]}
    assert set(by_metric) == {"acc", "confidence", "ece", "selective_auroc"}
    ece = by_metric["ece"]
    assert ece["metric_config"]["lower_is_better"] is True and ece["metric_config"]["metric_id"] == "lm-eval-probes.ece"
    assert ece["metric_config"]["evaluation_description"] == ROWS_BY_NAME["ece"].description
    assert (ece["metric_config"]["min_score"], ece["metric_config"]["max_score"]) == (0.0, 1.0)
    interval = ece["score_details"]["uncertainty"]["confidence_interval"]
    assert interval["lower"] <= ece["score_details"]["score"] <= interval["upper"] and interval["confidence_level"] == 0.95
    assert isinstance(ece["score_details"]["uncertainty"]["num_bootstrap_samples"], int)
    acc = by_metric["acc"]
    assert acc["metric_config"]["lower_is_better"] is False and acc["score_details"]["uncertainty"]["standard_error"]["value"] > 0
    assert (acc["metric_config"]["min_score"], acc["metric_config"]["max_score"]) == (0.0, 1.0)
    assert all(isinstance(v, str) for r in record["evaluation_results"]
               for v in r["generation_config"]["additional_details"].values())
    pointer = record["detailed_evaluation_results"]
    lines = [json.loads(line) for line in (out / "every_eval_ever" / pointer["file_path"]).read_text().splitlines()]
    assert pointer["total_rows"] == len(lines) == N and pointer["file_path"].startswith("data/t/org/model-a/")
    line = lines[0]
    assert line["evaluation_id"] == record["evaluation_id"] and line["evaluation_result_id"] == "acc"
    assert isinstance(line["evaluation"]["is_correct"], bool) and isinstance(line["evaluation"]["score"], float)
    assert all(isinstance(v, str) for v in line["metadata"].values())
    model = next(m for m in built.models if m.name == "org/model-a")
    original = {str(s["doc_id"]): s for s in model.tasks["t"].samples}
    assert json.loads(line["metadata"]["probe.ece"]) == original[line["sample_id"]]["ece"]
    assert json.loads(line["metadata"]["probe.confidence"]) == original[line["sample_id"]]["confidence"]


def test_every_eval_ever_bounds_are_the_declarations_in_strict_json():
    from lm_eval_probes.reports.every_eval_ever import json_bound, metric_bounds

    assert metric_bounds("prr") == (-math.inf, 1.0) and metric_bounds("tcb_spearman_partial") == (-1.0, 1.0)
    assert metric_bounds("bte_energy") == (0.0, math.log(2)) and metric_bounds("tcb_log10") == (-math.inf, math.inf)
    assert metric_bounds("perplexity") == (1.0, math.inf)  # lm_eval's, by its definition
    assert metric_bounds("a_metric_nothing_declares") == (-math.inf, math.inf)
    assert [json_bound(b) for b in (-math.inf, 0, math.inf)] == ["-Infinity", 0.0, "Infinity"]


def test_every_eval_ever_files_validate_against_the_wheels_schemas(export_report):
    import jsonschema

    schemas = every_eval_ever_schemas()
    aggregate, instance = (jsonschema.Draft7Validator(schema) for schema in schemas)
    _, out = export_report
    aggregates = sorted((out / "every_eval_ever").rglob("*.json"))
    lines = [json.loads(line) for path in (out / "every_eval_ever").rglob("*_samples.jsonl")
             for line in path.read_text().splitlines()]
    assert len(aggregates) == 2 and len(lines) == 2 * N
    for path in aggregates:
        aggregate.validate(json.loads(path.read_text()))
    for line in lines:
        instance.validate(line)


def test_details_parquet_load_with_datasets(export_report):
    datasets = pytest.importorskip("datasets")
    built, out = export_report
    path = out / "details" / "org__model-a" / "samples_t.parquet"
    loaded = datasets.load_dataset("parquet", data_files=str(path), split="train")
    assert loaded.num_rows == N
    assert {"doc_id", "prompt_hash", "target", "response", "correct", "confidence", "ece"} <= set(loaded.column_names)
    model = next(m for m in built.models if m.name == "org/model-a")
    original = {str(s["doc_id"]): s for s in model.tasks["t"].samples}
    for row in loaded.select(range(5)):
        assert row["correct"] == original[row["doc_id"]]["acc"]
        assert row["ece"] == pytest.approx(original[row["doc_id"]]["ece"])
    card = (out / "details" / "README.md").read_text()
    assert 'config_name: "org__model-a__t"' in card and "split: latest" in card
    page = (out / "index.html").read_text()
    assert f'href="{path.relative_to(out).as_posix()}"' in page


# ---------------------------------------------------------------------------------------------- the sweep's failures


@pytest.mark.slow
def test_failed_sweep_pairs_are_listed_and_take_no_rank(tiny_model_dir, tmp_path):
    """A real sweep (a tiny model and a model folder that does not exist): ~1 min, so `make test-slow`;
    ``test_report.py`` checks the same on the sweep's own status files without running one."""
    from lm_eval_probes.sweep.config import parse_config
    from lm_eval_probes.sweep.runner import run_sweep
    from test_sweep import config_dict

    out = tmp_path / "sweep"
    models = [{"name": "llama", "model_args": {"pretrained": tiny_model_dir("llama")}},
              {"name": "broken", "model_args": {"pretrained": str(tmp_path / "no-such-model")}}]
    config = parse_config(config_dict(out, models, tasks=["probes_synth_logic"]))
    status = run_sweep(config)
    assert status["counts"]["failed"] == 1
    (error,) = [p["error"] for p in status["pairs"] if p["state"] == "failed"]
    for runs in (out / "runs", out):  # the runs folder or the sweep's folder
        report_dir = tmp_path / f"report-{runs.name}"
        built = build_report([runs], report_dir, n_resamples=20, plots=False)
        assert [m.name for m in built.models] == ["llama"]
        summary = json.loads((report_dir / "summary.json").read_text())
        assert summary["failed"] == [{"model": "broken", "task": "probes_synth_logic", "error": error.splitlines()[0]}]
        assert all(r["model"] != "broken" for r in summary["ranks"])
        markdown = (report_dir / "leaderboard.md").read_text()
        assert "## Attempted without a result" in markdown and "| broken | probes_synth_logic |" in markdown
        rows = {r["model"]: r for r in csv.DictReader(io.StringIO((report_dir / "leaderboard.csv").read_text()))}
        assert rows["broken"]["failed"].startswith("probes_synth_logic: ") and rows["broken"]["rank_low"] == ""
        assert rows["llama"]["failed"] == ""
        page = (report_dir / "index.html").read_text()
        assert 'id="failed-table"' in page and ">broken<" in page


def test_a_newer_status_file_wins_and_unknown_fields_are_ignored(tmp_path):
    from lm_eval_probes.reports.sweep_status import failed_pairs, one_line

    (tmp_path / "status").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "sweep_status.json").write_text(json.dumps({"counts": {}, "pairs": [
        {"model": "m", "task": "a", "state": "failed", "error": "old error"},
        {"model": "m", "task": "b", "state": "pending"}]}))
    (tmp_path / "status" / "m__a.json").write_text(json.dumps({"model": "m", "task": "a", "state": "failed",
                                                                "error": "OSError: no model folder at /x\nmore", "new": 1}))
    (tmp_path / "status" / "m__c.json").write_text(json.dumps({"model": "m", "task": "c", "state": "interrupted"}))
    found = failed_pairs([tmp_path / "runs"], [])
    assert [f.to_json() for f in found] == [
        {"model": "m", "task": "a", "error": "OSError: no model folder at /x"},
        {"model": "m", "task": "c", "error": "state 'interrupted'"}]
    assert one_line("x" * 400).endswith("…") and len(one_line("x" * 400)) == 300


# ---------------------------------------------------------------------------------------------- words match the code


def backticked(text: str) -> list[str]:
    import re

    return re.findall(r"`([a-z0-9_]+)`", text)


def paragraph(text: str, start: str) -> str:
    """From ``start`` to the end of its paragraph or list item."""
    at = text.index(start)
    ends = [end for end in (text.find(mark, at) for mark in ("\n\n", "\n- ", "\n* ", "\n  - ")) if end >= 0]
    return text[at:min(ends) if ends else None]


def compared_rows() -> tuple[list[str], list[str], list[str]]:
    means = [r.name for r in ROWS if r.aggregation == "mean"]
    corpus = [r.name for r in ROWS if (c := corpus_row(r.name)) is not None and c.resampled is not None]
    rest = [r.name for r in ROWS if r.name not in means and r.name not in corpus]
    return means, corpus, rest


def test_the_row_lists_in_the_docs_and_the_docstring_match_the_declarations():
    from lm_eval_probes.reports import pairwise

    means, corpus, rest = compared_rows()
    doc = pairwise.__doc__ or ""
    assert backticked(paragraph(doc, "Mean rows")) == means
    assert backticked(paragraph(doc, "Corpus rows, recomputed")) == corpus
    assert sorted(backticked(paragraph(doc, "Not compared"))) == sorted(rest)
    docs = Path(__file__).resolve().parents[1] / "docs"
    leaderboard = (docs / "leaderboard.md").read_text()
    assert backticked(paragraph(leaderboard, "Mean rows compared")) == means
    assert backticked(paragraph(leaderboard, "Corpus rows compared")) == corpus
    assert sorted(backticked(paragraph(leaderboard, "Rows not compared"))) == sorted(rest)
    demo = (docs / "demo.md").read_text()
    assert backticked(paragraph(demo, "Rows compared pair by pair")) == means + corpus


def test_the_glossary_says_what_prr_does_and_which_test_each_row_gets():
    from lm_eval_probes.reports.columns import glossary, paired_test

    (group,) = [g for g in glossary(["prr", "selective_cov_acc_area"]) if g.key == "calibration"]
    assert "tied confidences" in group.summary and "all right or all wrong" in group.summary
    assert "lm-polygraph's own `prr` key is the raw prediction-rejection area" in group.summary
    assert "selective_cov_acc_area" in group.summary
    assert paired_test("acc").startswith("McNemar") and paired_test("confidence").startswith("paired permutation")
    assert paired_test("prr").startswith("recomputed on each resample") and paired_test("lcr_auroc") == "not compared"
    means, corpus, rest = compared_rows()
    assert {paired_test(name) for name in corpus} == {paired_test("prr")}
    assert {paired_test(name) for name in rest} == {"not compared"}
