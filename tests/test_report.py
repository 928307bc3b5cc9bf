"""``lm-eval-probes report``: leaderboard files from recorded lm_eval runs (tiny random models, real files)."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from loader_fixtures import write_data_dir
from lm_eval_probes.reports import build_report
from lm_eval_probes.reports.bootstrap import model_seed_label, percentile_interval, resample_indices
from lm_eval_probes.reports.corpus_rows import (
    CalibrationOptions,
    auroc_resampled,
    corpus_row,
    partial_spearman_resampled,
    records,
    spearman_resampled,
)
from lm_eval_probes.reports.reading import RunFile, find_results_files, merge_runs, read_results_file, read_runs
from lm_eval_probes.reports.tables import Cell, markdown_escape

LIMIT = 12
EVIL = '<script>alert("x")</script>'


ALL_PROBES = {"probes": "all", "probe_bte_profile": "full"}


def record_run(model_dir: str, tasks: list[str], out: Path, data_dir: Path, **probe_args: str) -> Path:
    """What ``lm-eval-probes --log_samples --output_path out`` writes, done in-process (faster)."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker

    import lm_eval_probes

    tracker = EvaluationTracker(output_path=str(out))
    results = lm_eval.simple_evaluate(
        model="hf-probes", model_args={"pretrained": model_dir, "probes": "tcb+bte+reader", **probe_args}, tasks=tasks, limit=LIMIT,
        device="cpu", batch_size=4, log_samples=True, evaluation_tracker=tracker, gen_kwargs={"max_gen_toks": 4},
        task_manager=lm_eval_probes.ProbeTaskManager(include_path=lm_eval_probes.tasks_dir(),
                                                     metadata={"probes_data_dir": str(data_dir)}),
    )
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task in results["configs"]:
        tracker.save_results_samples(task_name=task, samples=samples[task])
    return out


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """Run a: llama on synth_logic + proofwriter + its swap twin; run b: llama again later (synth_logic again
    + synth_arith_gen); both with every probe and the full BTE profile. Run c: gpt2 on synth_logic only,
    default probes."""
    root = tmp_path_factory.mktemp("runs")
    data = write_data_dir(root / "data")
    llama, gpt2 = tiny_model_dir("llama"), tiny_model_dir("gpt2")
    out = {
        "a": record_run(llama, ["probes_synth_logic", "probes_proofwriter", "probes_proofwriter_noise_swap"], root / "a", data,
                        **ALL_PROBES),
    }
    time.sleep(1.1)  # a later date id
    out["b"] = record_run(llama, ["probes_synth_logic", "probes_synth_arith_gen"], root / "b", data, **ALL_PROBES)
    out["c"] = record_run(gpt2, ["probes_synth_logic"], root / "c", data)
    return out


@pytest.fixture(scope="module")
def report(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    built = build_report([runs["a"], runs["b"], runs["c"]], out, n_resamples=300, seed=7)
    return built, out


def results_json(run: Path) -> tuple[Path, dict]:
    (path,) = run.rglob("results_*.json")
    return path, json.loads(path.read_text())


# ---------------------------------------------------------------------------------------------- reading


def test_samples_records_match_the_results_rows(runs):
    """The report's reading of the samples files recomputes lm_eval's own corpus-level values."""
    path, data = results_json(runs["a"])
    run = read_results_file(path)
    result = run.tasks["probes_proofwriter"]
    assert result.samples_file is not None and len(result.samples) == LIMIT
    options = CalibrationOptions.from_metadata(result.metadata)
    checked = 0
    for metric in result.metrics:
        row = corpus_row(metric.name)
        if row is None or not math.isfinite(metric.value):
            continue
        rows = records(result.samples_of(metric.filter), metric.name, row.width)
        assert row.statistic(rows, options) == pytest.approx(metric.value, abs=1e-12), metric.name
        checked += 1
    assert checked >= 8  # ece, selective_auroc, aurc, selective_acc_50/80, several ρ
    assert run.num_parameters == data["config"]["model_num_parameters"] > 0
    assert result.metric("length_spearman", "none").value != result.metric("length_spearman", "none").value  # null → nan


def test_bare_nan_and_null_read_as_undefined(runs, tmp_path):
    path, data = results_json(runs["c"])
    text = path.read_text().replace('"acc,none": ' + json.dumps(data["results"]["probes_synth_logic"]["acc,none"]),
                                    '"acc,none": NaN')
    copy = tmp_path / path.name
    copy.write_text(text)
    run = read_results_file(copy)
    assert math.isnan(run.tasks["probes_synth_logic"].metric("acc", "none").value)
    assert math.isnan(run.tasks["probes_synth_logic"].metric("length_spearman", "none").value)  # null
    assert run.tasks["probes_synth_logic"].samples_file is None  # the samples stayed beside the original


def test_two_runs_of_one_model_are_merged_newest_task_kept(runs):
    models = read_runs([runs["a"], runs["b"], runs["c"]])
    assert len(models) == 2
    llama = next(m for m in models if "llama" in m.name)
    assert set(llama.tasks) == {"probes_synth_logic", "probes_proofwriter", "probes_proofwriter_noise_swap",
                                "probes_synth_arith_gen"}
    assert len(llama.sources) == 2
    (note,) = llama.replaced
    assert note["task"] == "probes_synth_logic" and str(runs["b"]) in note["kept"] and str(runs["a"]) in note["dropped"]
    assert str(runs["b"]) in str(llama.tasks["probes_synth_logic"].results_file)


def test_models_come_back_sorted_by_name_whatever_the_dates_of_their_runs(tmp_path):
    """Shards of a sweep finish in any order: the report's model order must not follow the file dates."""
    def run(name: str, date: str) -> RunFile:
        return RunFile(path=tmp_path / name / f"results_{date}.json", date=date, model_name=name,
                       model_args="pretrained=x", num_parameters=None, tasks={})

    b_first = [run("b", "2026-01-01T00-00-00"), run("a", "2026-01-02T00-00-00"), run("c", "2026-01-03T00-00-00")]
    assert [m.name for m in merge_runs(b_first)] == ["a", "b", "c"]
    assert [m.name for m in merge_runs(b_first[::-1])] == ["a", "b", "c"]


def test_missing_run_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no lm_eval results"):
        find_results_files([tmp_path])
    with pytest.raises(FileNotFoundError, match="no such file"):
        find_results_files([tmp_path / "nope"])


# ---------------------------------------------------------------------------------------------- bootstrap


def test_resampled_statistics_equal_the_project_functions():
    rng = np.random.default_rng(0)
    n = 15
    rows = np.c_[rng.integers(0, 5, n) / 4, rng.integers(0, 2, n), rng.integers(1, 4, n)].astype(float)
    indices = resample_indices(n, n_resamples=60, seed=1, key=("m", "t"))
    options = CalibrationOptions()
    for name, batched in (("selective_auroc", auroc_resampled), ("bte_spearman", spearman_resampled),
                          ("bte_spearman_partial", partial_spearman_resampled)):
        row = corpus_row(name)
        width_rows = rows[:, : row.width]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # undefined resamples warn and give nan
            expected = np.array([row.statistic(width_rows[i], options) for i in indices])
        got = batched(width_rows[indices], options)
        np.testing.assert_allclose(got, expected, atol=1e-12, equal_nan=True, err_msg=name)
    constant_length = np.c_[rows[:, :2], np.ones(n)]
    np.testing.assert_allclose(partial_spearman_resampled(constant_length[indices]),
                               spearman_resampled(rows[:, :2][indices]), equal_nan=True)
    one_class = np.c_[rows[:, 0], np.ones(n)]
    assert np.isnan(auroc_resampled(one_class[indices])).all()


def test_resample_indices_are_seeded_and_keyed():
    a = resample_indices(10, n_resamples=5, seed=3, key=("m", "t"))
    assert np.array_equal(a, resample_indices(10, n_resamples=5, seed=3, key=("m", "t")))
    assert not np.array_equal(a, resample_indices(10, n_resamples=5, seed=4, key=("m", "t")))
    assert not np.array_equal(a, resample_indices(10, n_resamples=5, seed=3, key=("m", "u")))
    with pytest.raises(ValueError, match="n_resamples"):
        resample_indices(10, n_resamples=0, seed=0, key=())


def test_the_bootstrap_key_names_no_folder():
    assert model_seed_label("/scratch/u/models/tiny-llama") == "tiny-llama" == model_seed_label("/home/v/clone/tiny-llama/")
    assert model_seed_label("HuggingFaceTB/SmolLM2-135M") == "SmolLM2-135M"
    assert model_seed_label("C:\\models\\m") == "m"
    assert model_seed_label("m (dtype=float32,pretrained=/a/b/m)") == "m (dtype=float32,pretrained=m)"
    assert model_seed_label("SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"  # a sweep label


def test_a_plain_run_moved_elsewhere_keeps_its_intervals(runs, tmp_path):
    """A plain ``lm_eval`` run is named after its ``pretrained`` path: the same files with the weights at
    another path give the same values and intervals (only the name and ``model_args`` name the path)."""
    original = results_json(runs["c"])[0]
    data = json.loads(original.read_text())
    weights = data["model_name"]
    elsewhere = f"/elsewhere/clone/{Path(weights).name}"
    moved = tmp_path / "moved"
    shutil.copytree(original.parent, moved)
    path = moved / original.name
    path.write_text(original.read_text().replace(weights, elsewhere))
    assert json.loads(path.read_text())["model_name"] == elsewhere
    summaries = []
    for folder in (original.parent, moved):
        build_report([folder], tmp_path / f"report-{folder.name}", n_resamples=100, plots=False)
        summaries.append(json.loads((tmp_path / f"report-{folder.name}" / "summary.json").read_text()))
    (before,), (after,) = (s["models"] for s in summaries)
    assert (before["name"], after["name"]) == (weights, elsewhere)
    assert after["tasks"].keys() == before["tasks"].keys()
    cis = 0
    for task, cells in before["tasks"].items():
        assert after["tasks"][task]["metrics"] == cells["metrics"], task
        cis += sum(cell["ci"] is not None and cell["ci"]["low"] is not None for cell in cells["metrics"].values())
    assert cis >= 3


def test_percentile_interval_undefined_cases():
    assert not percentile_interval(np.array([0.1, np.nan, np.nan]), n_documents=10).defined
    assert not percentile_interval(np.array([0.1, 0.2]), n_documents=1).defined
    ci = percentile_interval(np.arange(101) / 100, n_documents=10, level=0.9)
    assert (ci.low, ci.high) == pytest.approx((0.05, 0.95))
    with pytest.raises(ValueError, match="level"):
        percentile_interval(np.arange(3.0), n_documents=3, level=1.0)


def test_ci_reproducible_for_a_seed_and_covering_the_point(runs, report, tmp_path):
    _, out = report
    first = json.loads((out / "summary.json").read_text())
    assert first["bootstrap"] == {"method": "percentile bootstrap over documents", "n_resamples": 300, "seed": 7,
                                  "level": 0.95}
    again = tmp_path / "again"
    build_report([runs["a"], runs["b"], runs["c"]], again, n_resamples=300, seed=7, plots=False)
    assert json.loads((again / "summary.json").read_text())["models"] == first["models"]
    other = tmp_path / "other"
    build_report([runs["a"], runs["b"], runs["c"]], other, n_resamples=300, seed=8, plots=False)
    assert json.loads((other / "summary.json").read_text())["models"] != first["models"]
    intervals = 0
    for model in first["models"]:
        for task in model["tasks"].values():
            for key, cell in task["metrics"].items():
                name = key.split(",")[0]
                if corpus_row(name) is None:
                    assert cell["ci"] is None, key
                    continue
                assert cell["stderr"] is None
                if cell["value"] is None or cell["ci"] is None or cell["ci"]["low"] is None:
                    continue
                assert cell["ci"]["low"] <= cell["value"] <= cell["ci"]["high"], (model["name"], key, cell)
                intervals += 1
    assert intervals >= 20


# ---------------------------------------------------------------------------------------------- tables


def markdown_section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def markdown_rows(section: str) -> list[list[str]]:
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]


def test_task_table_contents_and_sort_order(runs, report):
    built, out = report
    text = (out / "leaderboard.md").read_text()
    header, *rows = markdown_rows(markdown_section(text, "probes_synth_logic"))
    assert header[:6] == ["model", "rank", "tie group", "acc ↑", "confidence ↑", "ece ↓"] and "bte_energy ↓" in header
    assert len(rows) == 2
    accs = [float(r[3].split(" ")[0]) for r in rows]
    assert accs == sorted(accs, reverse=True)  # best first
    table = next(t for t in built.tables if t.task == "probes_synth_logic")
    for name, row in zip(table.models, rows):
        model = next(m for m in built.models if m.name == name)
        expected = model.tasks["probes_synth_logic"].metric("acc", "none")
        assert row[0] == markdown_escape(name)
        assert row[3] == f"{expected.value:.3f} ± {expected.stderr:.3f}"
    ece = header.index("ece ↓")
    assert re.fullmatch(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]", rows[0][ece])  # a CI where lm_eval gives no stderr
    assert rows[0][header.index("lcr_auroc ↑")].count("[") == 0  # reader rows: no CI
    assert rows[0][header.index("length_spearman")] == "undefined"  # null in the results: never 0; a baseline: no arrow


def test_overview_missing_tasks_and_csv(runs, report):
    built, out = report
    text = (out / "leaderboard.md").read_text()
    header, *rows = markdown_rows(text.split("\n## ", 1)[0])
    assert header[:4] == ["model", "size", "rank (95%)", "tie group"]
    gpt2 = next(r for r in rows if "gpt2" in r[0])
    proofwriter = header.index("probes_proofwriter: acc ↑")
    assert gpt2[proofwriter] == "—"  # not run: missing, not 0
    assert re.fullmatch(r"\d+(\.\d+)?K", gpt2[1])  # size from model_num_parameters
    assert [r[0] for r in rows] == [markdown_escape(m) for m in built.overview.models]
    assert all(r[2] != "—" for r in rows)  # both ranked on the tasks both ran
    table = list(csv.reader(io.StringIO((out / "leaderboard.csv").read_text())))
    head, body = table[0], table[1:]
    gpt2_csv = next(r for r in body if "gpt2" in r[0])
    assert gpt2_csv[head.index("probes_proofwriter/acc")] == ""  # missing
    assert gpt2_csv[head.index("probes_synth_logic/length_spearman")] == "nan"  # undefined
    assert float(gpt2_csv[head.index("probes_synth_logic/acc")]) >= 0
    assert "probes_synth_logic/ece ci_low" in head


def test_robustness_table(report):
    built, out = report
    (row,) = built.robustness
    assert (row.base, row.operator, row.primary_metric) == ("probes_proofwriter", "swap", "acc")
    clean = next(m for m in built.models if row.model == m.name).tasks["probes_proofwriter"].metric("acc", "none").value
    assert row.clean["primary"].value == clean
    assert row.delta["primary"] == pytest.approx(row.noised["primary"].value - clean)
    header, line = markdown_rows(markdown_section((out / "leaderboard.md").read_text(), "Robustness to noised inputs"))
    assert line[1:4] == ["probes_proofwriter", "swap", "acc"]
    assert line[header.index("Δ acc")] == f"{row.delta['primary']:+.3f}"


def test_summary_json_is_strict_json_with_merges(report):
    _, out = report
    summary = json.loads((out / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}"))
    llama = next(m for m in summary["models"] if "llama" in m["name"])
    assert [d["task"] for d in llama["merged_duplicates"]] == ["probes_synth_logic"]
    assert llama["tasks"]["probes_synth_logic"]["metrics"]["length_spearman,none"]["value"] is None
    assert summary["ranking"] == [m["name"] for m in sorted(summary["models"], key=lambda m: m["rank"])]


def test_cell_text_never_shows_zero_for_missing_or_undefined():
    assert Cell(present=False).text() == "—"
    assert Cell(present=True, value=math.nan).text() == "undefined"
    assert Cell(present=True, value=0.0).text() == "0.000"


# ---------------------------------------------------------------------------------------------- escaping, html


def test_script_in_a_model_name_is_inert(runs, tmp_path):
    path, data = results_json(runs["c"])
    evil_dir = tmp_path / "evil" / "m"
    evil_dir.mkdir(parents=True)
    data["model_name"] = EVIL
    data["results"]["probes_synth_logic"]["acc,none"] = None
    (evil_dir / path.name).write_text(json.dumps(data))
    for samples in path.parent.glob("samples_*.jsonl"):
        shutil.copy(samples, evil_dir / samples.name)
    out = tmp_path / "out"
    build_report([evil_dir], out, n_resamples=20)
    page = (out / "index.html").read_text()
    assert EVIL not in page and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page
    assert page.count("<script>") == 1  # the page's own sort script only
    markdown = (out / "leaderboard.md").read_text()
    assert "<script>" not in markdown and "&lt;script&gt;" in markdown
    assert "undefined" in markdown  # acc null


def test_every_column_of_a_real_run_is_explained(report):
    """On lm_eval's own files: each task table's header carries its row's description as title, the glossary lists
    it, and only rows with a better direction show an arrow."""
    from lm_eval_probes.reports.columns import meaning

    built, out = report
    page = (out / "index.html").read_text()
    glossary = page.split('<h2 id="glossary">', 1)[1]
    for number, table in enumerate(built.tables, start=1):
        section = page.split(f'id="task-table-{number}"', 1)[1].split("</thead>", 1)[0]
        titles = re.findall(r'<th class="[^"]*" title="([^"]*)"', section)
        assert titles[3:] == [html_escape(c.description) for c in table.columns], table.task
        for column in table.columns:
            assert f'id="row-{column.metric}"' in glossary, column.metric
            assert column.label.endswith(("↑", "↓")) == meaning(column.metric).scored, column.label


def html_escape(text: str) -> str:
    """jinja2's autoescape."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;")
            .replace("'", "&#39;"))


def test_a_sweeps_failed_pairs_are_listed_and_take_no_rank(runs, tmp_path):
    """A sweep folder whose llama pair finished (the tiny model's run) and whose other model failed to load: the
    status files are written by the sweep's own store; the report lists the failure and ranks only llama."""
    from lm_eval_probes.sweep.config import parse_config
    from lm_eval_probes.sweep.store import collect_status, pair_dir, record_status

    out = tmp_path / "sweep"
    config = parse_config({"output_dir": str(out), "tasks": ["probes_synth_logic"], "probes": "tcb+bte",
                           "models": [{"name": "llama", "model_args": {"pretrained": "x"}},
                                      {"name": "broken", "model_args": {"pretrained": "y"}}]})
    finished = pair_dir(config, "llama", "probes_synth_logic")
    shutil.copytree(next(runs["c"].rglob("results_*.json")).parent, finished)
    record_status(config, "llama", "probes_synth_logic", "done")
    error = "model failed to load: OSError: no model folder at /tmp/no-such-model\nTraceback (most recent call last): ..."
    record_status(config, "broken", "probes_synth_logic", "failed", error=error, traceback="...")
    assert collect_status(config)["counts"] == {"done": 1, "failed": 1, "pending": 0}
    for given in (out / "runs", out):  # the runs folder or the sweep's folder
        folder = tmp_path / f"report-{given.name}"
        built = build_report([given], folder, n_resamples=20, plots=False)
        assert len(built.models) == 1
        summary = json.loads((folder / "summary.json").read_text())
        expected = {"model": "broken", "task": "probes_synth_logic", "error": error.splitlines()[0]}
        assert summary["failed"] == [expected] and [f.to_json() for f in built.failed] == [expected]
        assert {r["model"] for r in summary["ranks"]} == {built.models[0].name}
        markdown = (folder / "leaderboard.md").read_text()
        assert "## Attempted without a result" in markdown
        assert f"| broken | probes_synth_logic | {markdown_escape(expected['error'])} |" in markdown
        rows = {r["model"]: r for r in csv.DictReader(io.StringIO((folder / "leaderboard.csv").read_text()))}
        assert rows["broken"]["failed"] == f"probes_synth_logic: {expected['error']}" and rows["broken"]["rank_low"] == ""
        assert rows[built.models[0].name]["failed"] == ""
        page = (folder / "index.html").read_text()
        assert 'id="failed-table"' in page and "no model folder at /tmp/no-such-model" in page


def test_the_exports_of_real_runs(report):
    """lm_eval's own samples files (multiple choice and generation): one Parquet row per document of the
    correctness filter with the response; Every Eval Ever files that validate where the wheel's schemas are at hand."""
    import pyarrow.parquet as pq

    from lm_eval_probes.reports.tables import primary_samples
    from test_report_publish import every_eval_ever_schemas

    built, out = report
    for model in built.models:
        for task, result in model.tasks.items():
            path = out / "details" / model_seed_label(model.name).replace("/", "__") / f"samples_{task}.parquet"
            if not path.is_file():
                path = next((out / "details").glob(f"*/samples_{task}.parquet"))
            table = pq.read_table(path).to_pylist()
            assert len(table) == len(primary_samples(result))
            assert all(isinstance(row["response"], str) and row["prompt_hash"] for row in table)
    files = sorted((out / "every_eval_ever").rglob("*.json"))
    assert len(files) == sum(len(m.tasks) for m in built.models)
    bounded = 0
    for path in files:  # every metric declares both bounds (every-eval-ever's validator requires them) and keeps to them
        for result in json.loads(path.read_text())["evaluation_results"]:
            config, score = result["metric_config"], result["score_details"]["score"]
            low, high = (float(bound) for bound in (config["min_score"], config["max_score"]))  # "-Infinity" → -inf
            assert low <= score <= high, (path.name, config["metric_name"], low, score, high)
            bounded += math.isfinite(low) + math.isfinite(high)
    assert bounded > 0
    import jsonschema

    schemas = every_eval_ever_schemas()
    aggregate, instance = (jsonschema.Draft7Validator(schema) for schema in schemas)
    for path in files:
        aggregate.validate(json.loads(path.read_text()))
    for path in (out / "every_eval_ever").rglob("*_samples.jsonl"):
        for line in path.read_text().splitlines():
            instance.validate(json.loads(line))


def test_html_is_self_contained(report):
    _, out = report
    page = (out / "index.html").read_text()
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    images = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    pngs = sorted((out / "plots").glob("*.png"))
    assert len(images) == len(pngs) >= 8
    kinds = {p.name.split("_probes_")[0] for p in pngs}
    assert {"reliability", "risk_coverage", "robustness", "difficulty", "bte_profiles.png", "omega_trajectories.png"} <= kinds
    assert "no per-layer profile" not in page


def test_without_profiles_the_bte_plots_show_the_window_energy(runs, tmp_path):
    build_report([runs["c"]], tmp_path, n_resamples=20)
    names = {p.name for p in (tmp_path / "plots").glob("*.png")}
    assert "bte_profiles.png" not in names and "omega_trajectories.png" not in names
    assert any(name.startswith("bte_energy_probes_") for name in names)
    assert "no per-layer profile" in (tmp_path / "index.html").read_text()
    assert "Support tokens" not in (tmp_path / "leaderboard.md").read_text()


def test_support_tokens_table_counts_the_samples(runs, report):
    built, out = report
    rows = {(r.model, r.task): r for r in built.support}
    llama = next(m for m in built.models if m.tasks.get("probes_synth_arith_gen"))
    assert set(rows) == {(llama.name, task) for task in llama.tasks}  # gpt2's run had no margin probe
    for (_, task), row in rows.items():
        lines = [json.loads(line) for line in llama.tasks[task].samples_file.read_text().splitlines()]
        records = [r["margin_support"] for r in lines if r["filter"] == lines[0]["filter"]]
        assert row.n_documents == len(records) == LIMIT and row.k == 5
        want: dict[str, int] = {}
        for record in records:
            for token in set(record["tokens"]):
                want[token] = want.get(token, 0) + 1
        assert list(row.top) == sorted(want.items(), key=lambda item: (-item[1], item[0]))[: len(row.top)]
        assert row.mean_margin == pytest.approx(np.mean([np.mean(r["margins"]) for r in records]), rel=1e-12)
    markdown = (out / "leaderboard.md").read_text()
    section = markdown_section(markdown, "Support tokens")
    assert len(markdown_rows(section)) == 1 + len(rows)  # the header, then a row per (model, task)
    summary = json.loads((out / "summary.json").read_text())
    assert {(s["model"], s["task"]) for s in summary["support_tokens"]} == set(rows)
    assert "<h2>Support tokens</h2>" in (out / "index.html").read_text()


@pytest.fixture(scope="module")
def report_subprocess_modules(runs, tmp_path_factory) -> list[str]:
    """Heavy modules loaded by ``import lm_eval_probes.reports`` plus a full report, in a fresh interpreter."""
    out = tmp_path_factory.mktemp("subprocess-report")
    code = (
        # a regular install's .pth autoload may have imported lm_eval at start-up: count what the report adds
        "import sys\nbefore = set(sys.modules)\nimport lm_eval_probes.reports as r\n"
        f"r.build_report([{str(runs['c'])!r}], {str(out)!r}, n_resamples=5)\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(m for m in ('torch', 'lm_eval', 'transformers') if m in new))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "index.html").is_file()
    return json.loads(proc.stdout.strip().splitlines()[-1].replace("'", '"'))


def test_reports_do_not_import_torch(report_subprocess_modules):
    assert "torch" not in report_subprocess_modules and "transformers" not in report_subprocess_modules


def test_reports_do_not_import_lm_eval(report_subprocess_modules):
    assert "lm_eval" not in report_subprocess_modules


def test_cli_writes_the_report_and_fails_cleanly(runs, tmp_path):
    out = tmp_path / "cli"
    proc = subprocess.run([sys.executable, "-m", "lm_eval_probes", "report", str(runs["c"]), "--out", str(out),
                           "--resamples", "20", "--no-plots"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert str(out / "index.html") in proc.stdout
    assert {p.name for p in out.iterdir()} >= {"leaderboard.md", "leaderboard.csv", "summary.json", "index.html"}
    proc = subprocess.run([sys.executable, "-m", "lm_eval_probes", "report", str(tmp_path / "nowhere"), "--out",
                           str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "no such file or folder" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "lm_eval_probes", "report", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "--resamples" in proc.stdout and "RUN_DIR" in proc.stdout


# ---------------------------------------------------------------------------------------------- headless Chromium

PAGE_CHECK = """<script>
window.pageErrors = [];
window.addEventListener("error", function (e) { window.pageErrors.push(String(e.message || e.type)); }, true);
var pageConsoleError = console.error;
console.error = function () { window.pageErrors.push(Array.prototype.join.call(arguments, " ")); pageConsoleError.apply(console, arguments); };
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var broken = images.filter(function (im) { return !im.complete || im.naturalWidth === 0; }).length;
  var th = document.querySelectorAll("#overview thead th")[1];
  th.click(); var bestFirst = document.querySelector("#overview tbody tr td").textContent;
  th.click(); var worstFirst = document.querySelector("#overview tbody tr td").textContent;
  var out = document.createElement("pre"); out.id = "page-check";
  out.textContent = JSON.stringify({images: images.length, broken: broken,
    tables: document.querySelectorAll("table.sortable").length,
    overviewRows: document.querySelectorAll("#overview tbody tr").length,
    bestFirst: bestFirst, worstFirst: worstFirst, sortedClass: th.className, errors: window.pageErrors});
  document.body.appendChild(out);
  console.log("page-check done");
});
</script>"""


def chromium_binary() -> str | None:
    return next((path for path in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if path), None)


def test_page_renders_in_headless_chromium(report, tmp_path):
    """The page loaded in headless Chromium: every image decodes, the tables are there, sorting works and the
    console shows no error. ``make test`` installs Chromium with apt-get where it can."""
    import html as html_module

    browser = chromium_binary()
    if browser is None:
        pytest.skip("chromium is not installed (Debian package `chromium`; `make test` installs it where apt-get is available)")
    built, out = report
    page = (out / "index.html").read_text()
    checked = tmp_path / "checked.html"
    checked.write_text(page.replace("<head>", "<head>\n" + PAGE_CHECK, 1))
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom", checked.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    match = re.search(r'<pre id="page-check">(.*?)</pre>', proc.stdout, re.S)
    assert match, proc.stderr[-3000:]
    check = json.loads(html_module.unescape(match.group(1)))
    pngs = list((out / "plots").glob("*.png"))
    assert check["images"] == len(pngs) and check["broken"] == 0
    # overview, pairwise matrix, trust matrix (where a trust row was compared), pairwise comparisons, robustness,
    # support tokens, per task: its table, and its comparisons of every row where two models ran it
    compared = sum(len(set(t.models)) > 1 for t in built.tables)
    trust = any(any(row) for row in built.overview.trust_compared)
    assert check["tables"] == 5 + trust + len(built.tables) + compared
    assert check["overviewRows"] == len(built.overview.models) == 2
    # the size column, largest first on the first click (the win rates of two tiny random models may tie at 0)
    sizes = dict(zip(built.overview.models, built.overview.num_parameters))
    assert len(set(sizes.values())) == 2 and None not in sizes.values()
    assert check["bestFirst"] == max(sizes, key=sizes.get) and check["worstFirst"] == min(sizes, key=sizes.get)
    assert check["sortedClass"].endswith("sorted-asc")
    assert check["errors"] == []
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line]
    assert any("page-check done" in line for line in console), proc.stderr[-3000:]
    assert not [line for line in console if "page-check done" not in line], console


def test_probes_skipped_are_shown_on_the_report(runs, tmp_path):
    """A run's ``probes_skipped`` (results' config) is listed under its model in the Markdown and HTML pages."""
    import shutil as _shutil

    copy = tmp_path / "c"
    _shutil.copytree(runs["c"], copy)
    path, data = results_json(copy)
    data["config"]["probes_skipped"] = {"margin": "model_type 'gpt2' is not one of llama"}
    path.write_text(json.dumps(data))
    build_report([copy], tmp_path / "out", n_resamples=20, seed=1)
    markdown = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "## Probes skipped" in markdown and "probe margin — model_type 'gpt2' is not one of llama" in markdown
    page = next((tmp_path / "out").glob("*.html")).read_text()
    assert "probe margin skipped (probes=all): model_type &#39;gpt2&#39; is not one of llama" in page
