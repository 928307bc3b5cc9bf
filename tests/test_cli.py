"""End to end: the plain ``lm_eval`` CLI with ``--model hf-probes``, the console script, and the Python API.

The plain CLI and the console script run in fresh interpreters (started when the session starts: see
``conftest.fresh_command``); the refused options go through lm_eval's CLI in this process."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
from pathlib import Path

import pytest
from scipy import stats

import lm_eval_probes
from conftest import fresh_command

REPO = Path(__file__).resolve().parents[1]
"""The clone's root."""
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
needs_regular_install = pytest.mark.skipif(
    importlib.util.find_spec("_lm_eval_probes_autoload") is None,
    reason="the plain lm_eval CLI needs the .pth of a regular (non-editable) install; `make test` does one",
)


def load_outputs(out: Path) -> tuple[dict, list[dict]]:
    (results_file,) = out.rglob("results_*.json")
    (samples_file,) = out.rglob("samples_probes_synth_logic_*.jsonl")
    results = json.loads(results_file.read_text(), parse_constant=_not_json)  # must be valid JSON (no bare NaN)
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    return results, samples


def _not_json(token: str) -> None:
    raise ValueError(f"results JSON holds the non-JSON constant {token}")


@fresh_command
def plain_lm_eval(tiny_model_dir, folder: Path) -> tuple[list[str], dict[str, str], Path]:
    """``python -m lm_eval`` run from the clone's root, where the source folder ``lm_eval_probes/`` comes before the
    installed package on ``sys.path`` (its ``metrics``/``tasks`` are the root's folders)."""
    return [sys.executable, "-m", "lm_eval", "run", "--model", "hf-probes",
            "--model_args", f"pretrained={tiny_model_dir('llama')},probes=all",
            "--tasks", "probes_synth_logic", "--include_path", lm_eval_probes.TASKS_DIR,
            "--limit", "12", "--device", "cpu", "--batch_size", "4", "--output_path", str(folder / "out"),
            "--log_samples"], ENV, REPO


@needs_regular_install
@pytest.mark.fresh_process("plain_lm_eval")
def test_plain_lm_eval_cli_reports_probe_rows(fresh_processes):
    proc, folder = fresh_processes.result("plain_lm_eval")
    out = folder / "out"
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, samples = load_outputs(out)
    row = results["results"]["probes_synth_logic"]
    assert len(samples) == 12
    for name in ("tcb_log10", "bte_energy"):
        per_doc = [s[name] for s in samples]
        assert row[f"{name},none"] == pytest.approx(sum(per_doc) / len(per_doc), rel=1e-9)
        assert all(math.isfinite(v) for v in per_doc)
    assert 0 < row["bte_energy,none"] < math.log(2)
    pairs = [s["bte_spearman"] for s in samples]
    assert [p[1] for p in pairs] == [s["doc"]["depth"] for s in samples]
    assert row["bte_spearman,none"] == pytest.approx(stats.spearmanr(*zip(*pairs)).statistic, rel=1e-9)
    assert results["higher_is_better"]["probes_synth_logic"]["tcb_log10"] is True
    assert "bte_profile" not in json.dumps(samples[0]), "no vectors in --log_samples files"
    assert row["length_spearman,none"] is None  # one-token answers: undefined, written as null
    assert {"ece,none", "selective_auroc,none", "lcr_auroc,none"} <= set(row)
    assert all(len(json.dumps(s["lcr_auroc"])) < 200 for s in samples)  # the reader's vectors stay out of samples
    assert "tcb_log10" in proc.stdout and "bte_spearman" in proc.stdout  # the printed table


@needs_regular_install
def test_bad_model_args_fail_before_loading_with_the_valid_values(tmp_path, run_cli, monkeypatch):
    """In this process: the placeholder the .pth registered is what ``lm_eval`` resolves (the test above runs it
    in a fresh interpreter); the model that does not exist is never loaded."""
    monkeypatch.chdir(tmp_path)
    for model_args, message in (
        ("pretrained=/does/not/exist,probes=tcb+bet",
         "unknown probe 'bet'. Did you mean 'bte'? Valid: tcb, bte, reader, omega, margin."),
        ("pretrained=/does/not/exist,probe_tcb_epsilon=2",
         "unknown hf-probes option 'probe_tcb_epsilon'. Did you mean 'probe_tcb_eps'?"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            run_cli("lm_eval", ["run", "--model", "hf-probes", "--model_args", model_args,
                                "--tasks", "probes_synth_logic", "--include_path", lm_eval_probes.TASKS_DIR,
                                "--device", "cpu"])


@fresh_command
def console_script(tiny_model_dir, folder: Path) -> tuple[list[str], dict[str, str]]:
    return [sys.executable, "-m", "lm_eval_probes", "--model", "hf-probes",
            "--model_args", f"pretrained={tiny_model_dir('gpt2')},probes=tcb,bte",
            "--tasks", "probes_synth_logic,probes_synth_arith_gen", "--limit", "5", "--device", "cpu",
            "--output_path", str(folder / "out"), "--log_samples"], ENV


@pytest.mark.fresh_process("console_script")
def test_console_script_adds_tasks_and_keeps_probe_names_together(fresh_processes):
    proc, folder = fresh_processes.result("console_script")
    out = folder / "out"
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, _ = load_outputs(out)
    gen = results["results"]["probes_synth_arith_gen"]
    assert "exact_match,first-integer" in gen and "tcb_log10,first-integer" in gen and "bte_energy,first-integer" in gen


def test_python_api(tiny_model_dir):
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="hf-probes",
        model_args={"pretrained": tiny_model_dir("qwen2"), "probes": "tcb", "device": "cpu"},
        tasks=["probes_synth_arith"],
        limit=10,
        task_manager=TaskManager(include_path=lm_eval_probes.TASKS_DIR),
    )
    row = results["results"]["probes_synth_arith"]
    assert "acc,none" in row and "tcb_log10,none" in row and "tcb_spearman,none" in row
    assert "bte_energy,none" not in row  # bte disabled
