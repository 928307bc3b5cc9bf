"""The plugin on a stack other than ``.venv``'s — torch 2.11.0 (a CUDA build, run on the CPU), transformers 5.17.0 and
lm-eval 0.4.10, as a GPU image ships them — in an environment cached by :mod:`cached_envs` (built once per machine:
several GB from the package index, a few minutes). Installing the plugin's wheel there keeps that torch and
transformers; ``python -m lm_eval_probes --model hf-probes`` with ``probes=all`` on a multiple-choice and a generation
task gives every row of the same run in ``.venv`` within 1e-4 (the release grid of ``make compat`` is in
``docs/compat.md``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from cached_envs import cached_venv
from per_document import largest_differences

REPO = Path(__file__).resolve().parents[1]
STACK = {"torch": "2.11.0", "transformers": "5.17.0", "lm-eval": "0.4.10"}
TASKS = "probes_synth_logic,probes_synth_arith_gen"
ROW_TOLERANCE = 1e-4
DOCUMENT_TOLERANCE = 1e-2
"""Relative, per value: the float32 kernels of two torch releases round differently; the reader's hidden-state
features near zero move most (6e-4 measured for torch 2.6 against 2.13, docs/compat.md)."""
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def stack_python() -> Path:
    name = "stack-" + "-".join(f"{k}{v}" for k, v in STACK.items())
    return cached_venv(name, sys.executable, [[f"torch=={STACK['torch']}"],
                                              [f"{k}=={v}" for k, v in STACK.items() if k != "torch"]])


@pytest.fixture(scope="module")
def plugin_wheel(tmp_path_factory) -> Path:
    """The plugin's wheel, built from a copy of the checkout's sources (setuptools writes ``build/`` beside them)."""
    source = tmp_path_factory.mktemp("source") / "lm-eval-probes"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "results", "tests", "docs",
                                                                "benchmarks", "examples", "__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(source)], check=True, capture_output=True, timeout=600)
    return next(out.glob("lm_eval_probes-*.whl"))


def installed(python: Path, distribution: str) -> str:
    return subprocess.run([str(python), "-c", f"from importlib import metadata; print(metadata.version({distribution!r}))"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def stack_with_plugin(stack_python, plugin_wheel) -> Path:
    """``pip install`` of the wheel with its requirements (what is missing comes from the index; the stack's torch
    and transformers are kept), then the wheel itself over an earlier build of the same version."""
    for extra in ([], ["--no-deps", "--force-reinstall"]):
        done = subprocess.run([str(stack_python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *extra,
                               str(plugin_wheel)], capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
    return stack_python


def test_installing_the_plugin_keeps_the_stacks_torch_and_transformers(stack_with_plugin):
    for distribution, version in STACK.items():
        assert installed(stack_with_plugin, distribution).split("+")[0] == version, distribution


def portable_model(tiny_model_dir, folder: Path) -> str:
    """The tests' tiny Llama with its tokenizer's class named as transformers 5.17 knows it."""
    shutil.copytree(tiny_model_dir("llama"), folder)
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"}))
    return str(folder)


def probed_run(python: Path, model: str, out: Path) -> tuple[dict, dict[str, list[dict]]]:
    """``python -m lm_eval_probes`` (from ``out``, outside the repository): the results' rows and the samples."""
    import os

    command = [str(python), "-m", "lm_eval_probes", "--model", "hf-probes", "--model_args",
               f"pretrained={model},probes=all", "--device", "cpu", "--tasks", TASKS, "--limit", "6", "--batch_size", "3",
               "--gen_kwargs", "max_gen_toks=16", "--log_samples", "--output_path", str(out)]
    environment = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(command, cwd=out, capture_output=True, text=True, timeout=1800,
                          env={**environment, **OFFLINE})
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    samples = {path.name.split("samples_")[1].rsplit("_", 1)[0]: [json.loads(line) for line in path.open()]
               for path in out.rglob("samples_*.jsonl")}
    return results, samples


def test_probes_all_on_the_other_stack_gives_the_reference_rows(stack_with_plugin, tiny_model_dir, tmp_path):
    model = portable_model(tiny_model_dir, tmp_path / "tiny-llama")
    (tmp_path / "reference").mkdir()
    (tmp_path / "stack").mkdir()
    reference, reference_samples = probed_run(Path(sys.executable), model, tmp_path / "reference")
    got, samples = probed_run(stack_with_plugin, model, tmp_path / "stack")
    compared = 0
    for task, rows in reference["results"].items():  # the rows: "metric,filter" (each release adds keys of its own)
        rows = {key: value for key, value in rows.items() if "," in key and "stderr" not in key}
        assert set(rows) <= set(got["results"][task]), (task, set(rows) - set(got["results"][task]))
        for key, value in rows.items():
            other = got["results"][task][key]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert (value != value and other != other) or abs(other - value) <= ROW_TOLERANCE, (task, key, value,
                                                                                                   other)
                compared += 1
    assert compared >= 40
    assert sorted(samples) == sorted(reference_samples)
    for task, task_samples in reference_samples.items():
        worst = largest_differences(samples[task], task_samples)
        assert max(worst.values()) <= DOCUMENT_TOLERANCE, (task, sorted(worst.items(), key=lambda kv: -kv[1])[:3])
    assert metadata.version("torch").split("+")[0] != STACK["torch"] or metadata.version("transformers") != STACK[
        "transformers"], "the reference must be another stack"
