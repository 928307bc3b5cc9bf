"""A real two-process run: ``torchrun --nproc_per_node 2`` on CPUs (gloo) against the one-process run (the torchrun
starts when the session starts: see ``conftest.fresh_command``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lm_eval
import pytest
from lm_eval.utils import handle_non_serializable

from conftest import fresh_command
from per_document import largest_differences
from lm_eval_probes import TASKS_DIR, rows
from lm_eval_probes.tasks.manager import ProbeTaskManager
from lm_eval_probes.models.autoregressive import ProbeHFLM

TASKS = ["probes_synth_logic", "probes_synth_arith_gen"]  # multiple choice and generation
LIMIT = 9  # odd: rank 1 holds one document fewer, so lm_eval pads its requests


def _samples(out: Path, task: str) -> list[dict]:
    (path,) = out.rglob(f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@fresh_command
def torchrun_two_processes(tiny_model_dir, folder: Path) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "lm_eval_probes", "run", "--model", "hf-probes",
            "--model_args", f"pretrained={tiny_model_dir('llama')},probes=all",
            "--tasks", ",".join(TASKS), "--limit", str(LIMIT), "--batch_size", "3", "--gen_kwargs", "max_gen_toks=6",
            "--output_path", str(folder / "two"), "--log_samples"], env


@pytest.mark.fresh_process("torchrun_two_processes")
def test_two_processes_split_the_documents_and_equal_one_process(tiny_model_dir, fresh_processes):
    folder = tiny_model_dir("llama")
    proc, workdir = fresh_processes.result("torchrun_two_processes")
    out = workdir / "two"
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    for rank in (0, 1):  # both processes took their rank from accelerate and built their share of each task
        assert f"rank {rank} of 2 on cpu" in log, log[-4000:]
        assert all(f"Building contexts for {task} on rank {rank}" in log for task in TASKS)
    (results_file,) = out.rglob("results_*.json")  # rank 0 alone writes
    two = json.loads(results_file.read_text())

    lm = ProbeHFLM(pretrained=folder, device="cpu", batch_size=3, probes="all")
    one = lm_eval.simple_evaluate(model=lm, tasks=TASKS, task_manager=ProbeTaskManager(include_path=TASKS_DIR),
                                  limit=LIMIT, log_samples=True, gen_kwargs="max_gen_toks=6")
    for task in TASKS:
        assert two["n-samples"][task]["effective"] == LIMIT
        samples = _samples(out, task)
        assert sorted(s["doc_id"] for s in samples if s["filter"] == samples[0]["filter"]) == list(range(LIMIT))
        written = json.loads(json.dumps(one["samples"][task], default=handle_non_serializable))  # as lm_eval writes them
        moved = largest_differences(samples, written)
        assert {"bte_energy", "tcb_log10", "confidence", "omega", "margin"} <= set(moved)
        assert max(moved.values()) <= 1e-4, {k: v for k, v in moved.items() if v > 1e-4}
        want = {k: v for k, v in one["results"][task].items() if k.split(",")[0] in rows.ROWS_BY_NAME}
        got = {k: v for k, v in two["results"][task].items() if k.split(",")[0] in rows.ROWS_BY_NAME}
        assert set(got) == set(want)
        for key, value in want.items():
            if isinstance(value, float):  # the margins' float32 products follow the padded length (docs/precision.md)
                tolerance = 1e-5 if key.startswith("margin") else 1e-6
                assert got[key] == pytest.approx(value, rel=tolerance, abs=tolerance, nan_ok=True), key
            elif not isinstance(value, str):
                assert got[key] == value, key
