"""Ctrl-C during a sweep: the status being written is finished, ``sweep_status.json`` is written, one line says how
many pairs are done and pending, exit 130, no traceback, nothing left in ``.partial/``; a second Ctrl-C stops at once.

The evaluation is replaced by a stand-in (the pairs' lm_eval runs are the other sweep tests'): in this process for
the sweep's bookkeeping, and in fresh interpreters sent a real SIGINT for the signal handling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lm_eval_probes.terminal.interrupt import deferred_interrupt
from lm_eval_probes.sweep import runner, store
from lm_eval_probes.sweep.config import parse_config
from lm_eval_probes.sweep.runner import SweepInterrupted, run_sweep

TASKS = ["probes_synth_arith", "probes_synth_logic"]


def sweep_config(out: Path, folder: Path) -> dict:
    return {"output_dir": str(out), "tasks": TASKS, "device": "cpu", "limit": 2,
            "models": [{"name": "a", "model_args": {"pretrained": str(folder)}},
                       {"name": "b", "model_args": {"pretrained": str(folder)}}]}


def finish_pair(config, model, task, partial: Path) -> None:
    """A stand-in for the pair's lm_eval run: a file in its attempt folder, then the finished folder."""
    (partial / "scratch.json").write_text("{}")
    final = store.pair_dir(config, model.name, task)
    final.mkdir(parents=True)
    (final / "results_2026.json").write_text("{}")


class TaskIndex:
    """Stands in for :class:`~lm_eval_probes.tasks.manager.ProbeTaskManager`: the task names are all the sweep reads
    before a pair runs (indexing lm_eval's tasks takes a core 15-25 s)."""

    def __init__(self, include_path=None, metadata=None) -> None:
        self.metadata, self.all_tasks = metadata, list(TASKS)


@pytest.fixture(autouse=True)
def light_task_index(monkeypatch):
    from lm_eval_probes.tasks import manager as tasks

    monkeypatch.setattr(tasks, "ProbeTaskManager", TaskIndex)


@pytest.fixture
def stand_in(monkeypatch):
    """The sweep with its model load and pair evaluation replaced; ``stop_at`` names the pair that is interrupted."""
    state = {"stop_at": None, "seen": []}

    def evaluate(config, lm, model, task, task_manager, shard, partial):
        state["seen"].append((model.name, task))
        if (model.name, task) == state["stop_at"]:
            (partial / "half-written.json").write_text("{")
            raise KeyboardInterrupt
        finish_pair(config, model, task, partial)

    monkeypatch.setattr(runner, "_load_model", lambda config, model: object())
    monkeypatch.setattr(runner, "_evaluate_into", evaluate)
    return state


@pytest.fixture
def restore_sigint():
    previous = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_interrupted_sweep_writes_its_status_and_resumes(tmp_path, stand_in, restore_sigint):
    config = parse_config(sweep_config(tmp_path / "out", tmp_path))
    stand_in["stop_at"] = ("a", "probes_synth_logic")
    with pytest.raises(SweepInterrupted) as interrupted:
        run_sweep(config)
    assert isinstance(interrupted.value, KeyboardInterrupt)
    assert str(interrupted.value) == "interrupted: 1 done, 3 pending — rerun the same command to resume"
    status = json.loads((tmp_path / "out" / "sweep_status.json").read_text())
    assert status["interrupted"] is True and status["counts"] == {"done": 1, "failed": 0, "pending": 3}
    assert [p["state"] for p in status["pairs"]] == ["done", "pending", "pending", "pending"]
    assert not (tmp_path / "out" / ".partial").exists(), "the interrupted attempt is removed"
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_DFL  # run_sweep puts the handler back

    stand_in["stop_at"], stand_in["seen"] = None, []
    summary = run_sweep(config)  # the same command again: the finished pair is kept
    assert ("a", "probes_synth_arith") not in stand_in["seen"] and len(stand_in["seen"]) == 3
    assert summary["counts"] == {"done": 4, "failed": 0, "pending": 0} and summary["interrupted"] is False
    assert not (tmp_path / "out" / ".partial").exists(), "a finished sweep leaves no .partial folder"


def test_the_sweep_command_says_one_line_and_exits_130(tmp_path, stand_in, restore_sigint, run_cli):
    path = tmp_path / "sweep.yaml"
    path.write_text(json.dumps(sweep_config(tmp_path / "out", tmp_path)))
    stand_in["stop_at"] = ("b", "probes_synth_arith")
    code, out, err = run_cli("lm-eval-probes", ["sweep", str(path)])
    assert code == 130
    assert "Traceback" not in err and out == ""
    assert err.splitlines()[-1] == (f"interrupted: 2 done, 2 pending — rerun the same command to resume "
                                    f"(status: {tmp_path / 'out' / 'sweep_status.json'})")
    assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL  # while the command exits, a second Ctrl-C stops it

    stand_in["stop_at"] = ("b", "probes_synth_logic")
    with pytest.raises(SweepInterrupted, match="interrupted: 3 done, 1 pending"):  # --debug: the traceback
        run_cli("lm-eval-probes", ["sweep", str(path), "--debug"])


def test_a_missing_model_folder_fails_its_pairs_with_the_same_text_everywhere(tmp_path, restore_sigint, caplog):
    import logging

    missing = tmp_path / "no" / "model"
    raw = sweep_config(tmp_path / "out", missing)
    raw["models"] = raw["models"][:1]
    with caplog.at_level(logging.INFO, logger="lm_eval_probes.sweep"):
        summary = run_sweep(parse_config(raw))
    error = f"model failed to load: no model folder at {missing}"
    assert [p["error"] for p in summary["pairs"]] == [error, error]
    assert all("traceback" not in p for p in summary["pairs"])  # nothing more to say than the line
    lines = [r.getMessage() for r in caplog.records if "FAILED" in r.getMessage()]
    assert len(lines) == 2 and all(f"FAILED ({error})" in line for line in lines)
    status = json.loads((tmp_path / "out" / "sweep_status.json").read_text())
    assert [p["error"] for p in status["pairs"]] == [error, error]


def test_a_deferred_interrupt_arrives_when_the_block_ends(restore_sigint):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append("the block ran to its end")
    assert done == ["the block ran to its end"]


# ----------------------------------------------------------------------------------------- a real SIGINT

SCRIPT = textwrap.dedent("""
    import os, sys, time, types

    class ProbeTaskManager:  # lm_eval's task index is not needed by the stand-in
        def __init__(self, include_path=None, metadata=None):
            self.metadata, self.all_tasks = metadata, ["t1", "t2", "t3"]

    sys.modules["lm_eval_probes.tasks.manager"] = types.SimpleNamespace(ProbeTaskManager=ProbeTaskManager)
    from lm_eval_probes.sweep import cli, runner, store

    def evaluate(config, lm, model, task, task_manager, shard, partial):
        (partial / "scratch.json").write_text("{}")
        if task == "t2":
            print("evaluating", flush=True)
            time.sleep(60)
        final = store.pair_dir(config, model.name, task)
        final.mkdir(parents=True)
        (final / "results_1.json").write_text("{}")

    runner._load_model = lambda config, model: object()
    runner._evaluate_into = evaluate
    if os.environ.get("SLOW_STATUS"):
        collect = runner.collect_status

        def slow(config, **options):
            print("writing the status", flush=True)
            time.sleep(60)
            return collect(config, **options)

        runner.collect_status = slow
    sys.exit(cli.main([sys.argv[1]]))
""")


def start_sweep(tmp_path: Path, **env: str) -> subprocess.Popen:
    path = tmp_path / "sweep.yaml"
    path.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "tasks": ["t1", "t2", "t3"],
                                "models": [{"name": "m", "model_args": {"pretrained": str(tmp_path)}}]}))
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **env})


def wait_for(process: subprocess.Popen, text: str) -> None:
    for line in process.stdout:
        if text in line:
            return
    raise AssertionError(f"the sweep ended before {text!r}: {process.stderr.read()[-3000:]}")


def test_ctrl_c_in_a_sweep_process(tmp_path):
    process = start_sweep(tmp_path)
    try:
        wait_for(process, "evaluating")
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith("interrupted: 1 done, 2 pending — rerun the same command to resume")
    status = json.loads((tmp_path / "out" / "sweep_status.json").read_text())
    assert status["interrupted"] is True and status["counts"] == {"done": 1, "failed": 0, "pending": 2}
    assert not (tmp_path / "out" / ".partial").exists()


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    process = start_sweep(tmp_path, SLOW_STATUS="1")
    try:
        wait_for(process, "evaluating")
        process.send_signal(signal.SIGINT)
        wait_for(process, "writing the status")  # the first Ctrl-C is being answered (slowly)
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        process.kill()
    assert process.returncode == -signal.SIGINT  # ended by the signal itself, no Python code ran
    assert took < 20  # not the 60 s the status writing would have taken
