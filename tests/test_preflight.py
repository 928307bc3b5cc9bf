"""``lm-eval-probes run`` refuses a bad probe, option, model folder or task name in one line on stderr with exit 2,
before torch is imported or a model is built (:mod:`lm_eval_probes.cli.preflight`); Ctrl-C ends a run with one line
and exit 130. The preflight's speed is checked by what it does not import, in fresh interpreters."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import lm_eval_probes
from lm_eval_probes.__main__ import main
from lm_eval_probes.cli.preflight import PreflightError, folder_task_names, lm_eval_task_names, preflight, yaml_task_names

HEAVY = ("torch", "transformers", "datasets", "accelerate", "lm_eval.evaluator", "lm_eval.api.task", "lm_eval.tasks")
"""What the start-up of a run imports and the preflight must not: the model stack and lm_eval's task machinery."""


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory) -> str:
    """A cache folder for the task names of lm_eval's folder, shared by this module's fresh interpreters."""
    return str(tmp_path_factory.mktemp("cache"))


def _env(cache_home: str, **more: str) -> dict[str, str]:
    import os

    return {**os.environ, "XDG_CACHE_HOME": cache_home, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **more}


def bad_runs(model: str, folder: Path) -> list[tuple[list[str], str]]:
    """(arguments, the expected error line's start) for each case the preflight refuses."""
    task = ["--tasks", "probes_synth_logic", "--device", "cpu"]
    gguf = folder / "gguf"
    return [
        (["run", "--model", "hf-probes", "--model_args", f"pretrained={model},probes=tbc", *task],
         "lm-eval-probes: error: --model_args: unknown probe 'tbc'. Did you mean 'tcb'? Valid: tcb, bte, reader"),
        (["--model", "hf-probes", "--model_args", f"pretrained={model},probe_tcb_epz=1", *task],
         "lm-eval-probes: error: --model_args: unknown hf-probes option 'probe_tcb_epz'. Did you mean 'probe_tcb_eps'?"),
        (["run", "--model", "hf-probes", "--model_args", f"pretrained={model},probe_tcb_eps=wide", *task],
         "lm-eval-probes: error: --model_args: probe_tcb_eps must be a number, got 'wide'"),
        (["run", "--model", "hf-probes-diffusion", "--model_args", f"pretrained={model},diffusion_stepz=8", *task],
         "lm-eval-probes: error: --model_args: unknown hf-probes-diffusion option 'diffusion_stepz'. "
         "Did you mean 'diffusion_steps'?"),
        (["run", "--model", "hf-probes-diffusion", "--model_args", f"pretrained={model}", "diffusion_steps=many", *task],
         "lm-eval-probes: error: --model_args: diffusion_steps must be an integer, got 'many'"),
        (["run", "--model", "hf-probes", "--model_args", f"pretrained={folder / 'no' / 'such' / 'model'}", *task],
         f"lm-eval-probes: error: pretrained: no model folder at {folder / 'no' / 'such' / 'model'}"),
        (["run", "--model", "hf-probes", "--model_args", f"pretrained={gguf}", *task],
         f"lm-eval-probes: error: pretrained: the model folder {gguf} has no config.json but GGUF files: "
         "pass gguf_file=m.gguf"),
        (["run", "--model", "hf-probes", "--model_args", "pretrained=surely-not/cached-model-35", *task],
         "lm-eval-probes: error: pretrained: the model 'surely-not/cached-model-35' is not in the Hugging Face cache"),
        (["run", "--model", "hf-probes", "--model_args", f"pretrained={model}", "--tasks", "probes_synth_lgic"],
         "lm-eval-probes: error: unknown task 'probes_synth_lgic'. Did you mean 'probes_synth_logic'? "
         "lm-eval-probes ls tasks lists every task"),
        (["run", "--model", "hf-probes", "--model_args", f"pretrained={model}", "--tasks", "probes_synth_logic,arc_esy"],
         "lm-eval-probes: error: unknown task 'arc_esy'. Did you mean 'arc_easy'?"),
    ]


def test_bad_runs_end_in_one_line_before_torch(tiny_model_dir, tmp_path, cache_home):
    """Every case in one fresh interpreter (``main`` as the console script calls it), then what it imported."""
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "m.gguf").write_bytes(b"GGUF")
    cases = bad_runs(tiny_model_dir("llama"), tmp_path)
    script = (
        "import contextlib, io, json, sys\n"
        "from lm_eval_probes.__main__ import main\n"
        "out = []\n"
        "for args in json.loads(sys.argv[1]):\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        try:\n            main(args)\n            code = 0\n"
        "        except SystemExit as exit_:\n            code = exit_.code\n"
        "    out.append([code, err.getvalue()])\n"
        f"out.append(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, json.dumps([args for args, _ in cases])], capture_output=True,
                          text=True, timeout=300, env=_env(cache_home), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    *results, imported = json.loads(proc.stdout.splitlines()[-1])
    for (args, expected), (code, err) in zip(cases, results):
        assert code == 2, (args, err)
        assert len(err.splitlines()) == 1 and err.startswith(expected), (args, err)
    assert imported == [], f"the preflight imported {imported}"


def test_the_console_script_prints_one_line_and_exits_2_without_a_traceback(tiny_model_dir, tmp_path, cache_home):
    """The process as a person sees it: ``-X importtime`` lists every module it imported; nothing heavy."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "lm_eval_probes", "run", "--model", "hf-probes", "--model_args",
         f"pretrained={tiny_model_dir('llama')},probes=tbc", "--tasks", "probes_synth_logic"],
        capture_output=True, text=True, timeout=120, env=_env(cache_home), cwd=tmp_path)
    lines = proc.stderr.splitlines()
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}
    said = [line for line in lines if not line.startswith("import time:")]
    assert proc.returncode == 2
    assert said == ["lm-eval-probes: error: --model_args: unknown probe 'tbc'. Did you mean 'tcb'? "
                    "Valid: tcb, bte, reader, omega, margin. (lm-eval-probes --help lists every option)"]
    assert "lm_eval_probes.cli.preflight" in imported
    assert not {m for m in imported if m in HEAVY or m.split(".")[0] in HEAVY}, sorted(imported)


def test_debug_shows_the_traceback(tiny_model_dir, monkeypatch):
    args = ["run", "--model", "hf-probes", "--model_args", f"pretrained={tiny_model_dir('llama')},probes=tbc",
            "--tasks", "probes_synth_logic"]
    with pytest.raises(PreflightError, match="unknown probe 'tbc'"):
        main([*args, "--debug"])
    monkeypatch.setenv("LM_EVAL_PROBES_DEBUG", "1")
    with pytest.raises(PreflightError, match="unknown probe 'tbc'"):
        main(args)


def test_a_good_run_passes_the_preflight(tiny_model_dir, tmp_path):
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "m.gguf").write_bytes(b"GGUF")
    tasks = lm_eval_probes.TASKS_DIR
    for model_args in (f"pretrained={tiny_model_dir('llama')},probes=tcb+bte,probe_tcb_eps=0.5",
                       f"pretrained={tmp_path / 'gguf'},gguf_file=m.gguf", '{"pretrained": "%s"}' % tiny_model_dir("gpt2")):
        preflight(["run", "--model", "hf-probes", "--model_args", model_args, "--tasks", "probes_synth_logic",
                   "--include_path", tasks], tasks_dir=tasks)
    preflight(["run", "--model", "hf-probes-diffusion", "--model_args", f"pretrained={tiny_model_dir('llama')}",
               "diffusion_steps=8", "--tasks", "probes_synth_*"], tasks_dir=tasks)
    preflight(["ls", "tasks"], tasks_dir=tasks)  # not a run: nothing to check
    preflight(["--help"], tasks_dir=tasks)
    config = tmp_path / "run.yaml"
    config.write_text(f"model: hf-probes\nmodel_args: pretrained={tiny_model_dir('llama')},probes=bet\ntasks: probes_synth_logic\n")
    with pytest.raises(PreflightError, match="unknown probe 'bet'"):  # --config is read as lm_eval reads it
        preflight(["run", "--config", str(config)], tasks_dir=tasks)


def test_task_names_read_as_text_cover_lm_evals_index(tmp_path, monkeypatch):
    """Every name lm_eval's task index knows (tasks, groups, tags) is among those the preflight reads from the
    YAML text, so it never refuses a task lm_eval would run."""
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    indexed = set(TaskManager(include_path=lm_eval_probes.TASKS_DIR).all_tasks)
    names = lm_eval_task_names()
    assert list(tmp_path.rglob("lm_eval-task-names-*.json")), "the names are cached"
    assert lm_eval_task_names() == names  # read back from the cache
    read = names | folder_task_names(lm_eval_probes.TASKS_DIR)
    assert len(indexed) > 1000 and not indexed - read, sorted(indexed - read)[:20]
    text = "tag:\n  - t1\n  - t2  # note\ntask: one\ngroup: [g1, 'g2']\nx:\n  task:\n    - task: sub\n      k: 1\n"
    assert yaml_task_names(text) == {"t1", "t2", "one", "g1", "g2", "sub"}


def test_ctrl_c_ends_a_run_in_one_line(tiny_model_dir, monkeypatch, capsys):
    import lm_eval.__main__

    from lm_eval_probes.harness.pretrained import ModelNotFound

    args = ["run", "--model", "hf-probes", "--model_args", f"pretrained={tiny_model_dir('llama')}", "--tasks",
            "probes_synth_logic", "--device", "cpu"]
    previous = signal.getsignal(signal.SIGINT)

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", interrupted)
    try:
        with pytest.raises(SystemExit) as exit_:
            main(args)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL  # a second Ctrl-C stops at once
    finally:
        signal.signal(signal.SIGINT, previous)
    assert exit_.value.code == 130
    err = capsys.readouterr().err
    assert err.splitlines() == ["lm-eval-probes run: interrupted — lm_eval writes its results when a run finishes, "
                                "so this run wrote none"]

    def missing() -> None:  # what the wrapper raises for a folder the preflight could not see
        raise ModelNotFound("no model folder at /gone")

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", missing)
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == ["lm-eval-probes: error: pretrained: no model folder at /gone"]
