"""Sweeps on any machine, at any path, in any number of shards give the same report (tiny random models,
real runs): no ``device`` lets lm_eval choose as its CLI does, the bootstrap seed names no path, and two
shards run into two output roots and copied into one equal the unsharded sweep."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from lm_eval_probes.sweep import cli as sweep_cli, config as sweep_config
from lm_eval_probes.reports import build_report
from lm_eval_probes.sweep.config import Shard, SweepConfig, parse_config
from lm_eval_probes.sweep.runner import model_device, run_sweep

TASKS = ["probes_synth_logic", "probes_synth_arith"]
MODELS = ("gpt2", "llama")
PROVENANCE_KEYS = ("model_args", "sources", "merged_duplicates", "results_file", "samples_file")
"""summary.json keys that name where the weights or the results files are: the only ones allowed to differ."""
INTERVAL = re.compile(r"\d \[-?\d\.\d{3}, -?\d\.\d{3}\]")
"""A value with its bootstrap interval in the Markdown: ``0.512 [0.431, 0.590]``."""


def config_dict(out: Path, model_dirs: dict[str, str]) -> dict:
    """No ``device``: lm_eval chooses, as on any machine."""
    return {"output_dir": str(out), "models": [{"name": name, "model_args": {"pretrained": path}} for name, path in model_dirs.items()],
            "tasks": TASKS, "limit": 6, "batch_size": 3, "probes": "tcb+bte", "bootstrap_iters": 0}


def report_of(runs: Path, out: Path) -> dict[str, object]:
    """The report's files, without the provenance in summary.json and the page's sources list."""
    build_report([runs], out, n_resamples=200, plots=True)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    for model in summary["models"]:
        for key in PROVENANCE_KEYS:
            model.pop(key, None)
        for task in model["tasks"].values():
            for key in PROVENANCE_KEYS:
                task.pop(key, None)
    page = (out / "index.html").read_text(encoding="utf-8")
    page, sources = re.subn(r"<h2>Models and sources</h2>\s*<ul class=\"notes\">.*?</ul>", "", page, flags=re.S)
    assert sources == 1
    return {"leaderboard.md": (out / "leaderboard.md").read_text(encoding="utf-8"),
            "leaderboard.csv": (out / "leaderboard.csv").read_text(encoding="utf-8"),
            "summary.json": summary, "index.html": page,
            "plots": {p.name: p.read_bytes() for p in sorted((out / "plots").iterdir())}}


def assert_same_report(got: dict[str, object], expected: dict[str, object]) -> None:
    for name in ("leaderboard.md", "leaderboard.csv", "summary.json", "index.html", "plots"):
        assert got[name] == expected[name], f"{name} differs"


@pytest.fixture(scope="module")
def task_manager():
    """The plugin's tasks only (lm_eval's own take half a minute to index), shared by every sweep here."""
    import lm_eval_probes

    return lm_eval_probes.ProbeTaskManager(include_path=lm_eval_probes.tasks_dir(), include_defaults=False)


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory, task_manager) -> tuple[SweepConfig, dict[str, object]]:
    """One unsharded sweep of two models × two tasks without ``device``, and its report."""
    root = tmp_path_factory.mktemp("reference")
    config = parse_config(config_dict(root / "sweep", {name: tiny_model_dir(name) for name in MODELS}))
    summary = run_sweep(config, task_manager=task_manager)
    assert summary["counts"] == {"done": 4, "failed": 0, "pending": 0}, [p.get("error") for p in summary["pairs"]]
    return config, report_of(config.output_dir / "runs", root / "report")


def test_without_device_the_sweep_chooses_as_the_lm_eval_cli(reference, monkeypatch):
    """The CLI without --device passes its default (cuda:0), which HFLM reads as "not specified" on a
    machine without that GPU: the sweep passes the same, so each pair ran (on the CPU without CUDA) instead
    of failing with "Torch not compiled with CUDA enabled"."""
    import torch
    from lm_eval._cli.harness import HarnessCLI
    from lm_eval.config.evaluate_config import EvaluatorConfig

    config, _ = reference
    assert config.device is None
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "hf-probes", "--model_args", "pretrained=x", "--tasks", TASKS[0]])
    cli = EvaluatorConfig.from_cli(HarnessCLI().parse_args())
    assert model_device(config) == cli.device
    ran = "cuda" if torch.cuda.is_available() else "cpu"
    for path in (config.output_dir / "runs").glob("*/*/results_*.json"):
        results = json.loads(path.read_text(encoding="utf-8"))
        assert results["config"]["device"] == cli.device  # recorded as the CLI records it
        assert results[sweep_config.SWEEP_KEY]["device"].split(":")[0] == ran, path  # where the model went
    assert model_device(parse_config({**config_dict(config.output_dir, {"m": "p"}), "device": "cpu"})) == "cpu"


def test_the_same_models_at_other_paths_give_the_same_report(reference, tiny_model_dir, task_manager, tmp_path):
    """A clone elsewhere: the weights in other folders, the sweep in another output root; the intervals
    (bootstrap seeds) depend on the labels, tasks and filters, not on the ``pretrained`` paths."""
    _, expected = reference
    moved = {}
    for name in MODELS:
        moved[name] = str(tmp_path / "elsewhere" / "weights" / f"{name}-copy")
        shutil.copytree(tiny_model_dir(name), moved[name])
    config = parse_config(config_dict(tmp_path / "clone" / "sweep", moved))
    assert run_sweep(config, task_manager=task_manager)["counts"]["done"] == 4
    got = report_of(config.output_dir / "runs", tmp_path / "report")
    assert len(INTERVAL.findall(str(expected["leaderboard.md"]))) >= 10, "too few intervals to see the bootstrap seed"
    assert_same_report(got, expected)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text(encoding="utf-8"))
    assert {m["name"]: m["model_args"] for m in summary["models"]} == {
        name: f"pretrained={moved[name]},probes=tcb+bte" for name in MODELS}  # the paths did differ, and only here


def test_two_shards_on_two_machines_merged_equal_the_unsharded_sweep(reference, task_manager, tmp_path, capsys):
    """Shards 1/2 and 0/2 into two output roots (two machines' own disks; shard 1 first), their ``runs/``
    folders copied into one root: the report equals the unsharded sweep's, and ``sweep --check
    --output_dir <merged root>`` sees every pair done."""
    config, expected = reference
    for shard in (Shard(1, 2), Shard(0, 2)):
        machine = dataclasses.replace(config, output_dir=tmp_path / f"machine-{shard.index}")
        assert run_sweep(machine, shard=shard, task_manager=task_manager)["counts"]["done"] == 2
    pairs = {shard: sorted(f"{p.parent.name}/{p.name}" for p in (tmp_path / f"machine-{shard}" / "runs").glob("*/*"))
             for shard in "01"}
    assert pairs == {str(k): [f"{m}/{t}" for m, t in Shard(k, 2).select(config.pairs())] for k in (0, 1)}
    merged = tmp_path / "merged"
    for shard in "01":
        shutil.copytree(tmp_path / f"machine-{shard}" / "runs", merged / "runs", dirs_exist_ok=True)
    assert_same_report(report_of(merged / "runs", tmp_path / "report"), expected)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(config_dict(Path("elsewhere"), {m.name: m.model_args["pretrained"] for m in config.models})))
    capsys.readouterr()
    assert sweep_cli.main([str(path), "--check", "--output_dir", str(merged)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{m}\t{t}\tdone" for m, t in config.pairs()]


def test_a_task_manager_from_elsewhere_is_refused(task_manager, tmp_path):
    config = parse_config(config_dict(tmp_path / "out", {"m": str(tmp_path / "no-such-model")}))
    with pytest.raises(ValueError, match="must be a ProbeTaskManager"):
        run_sweep(config, task_manager=object())
    with pytest.raises(ValueError, match=re.escape("task metadata None, the sweep config {'noise_eta': 0.1}")):
        run_sweep(dataclasses.replace(config, metadata={"noise_eta": 0.1}), task_manager=task_manager)
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_the_help_examples_are_valid_configs_with_and_without_device(tmp_path):
    """``sweep --help`` shows a config without ``device`` (any machine) and one with it; both parse."""
    paragraphs = [p for p in sweep_cli.EXAMPLE.split("\n\n") if p.startswith("example config")]
    blocks = ["\n".join(line for line in p.splitlines() if line.startswith("  ")) for p in paragraphs]
    configs = [parse_config(yaml.safe_load(block), base_dir=tmp_path) for block in blocks]
    assert [c.device for c in configs] == [None, "cpu"]
    assert "--output_dir" in sweep_cli.parser().format_help() and "--shard 1/2 --output_dir" in sweep_cli.EXAMPLE
