"""Probe rows on stock lm_eval tasks (their prompts, filters and metrics kept), by Python and by the console
script's entry point (in this process; ``tests/test_cli.py`` runs it in a fresh one)."""

from __future__ import annotations

import json

from loader_fixtures import gsm8k_rows


def stock_specs(tmp_path) -> list[dict]:
    arc = tmp_path / "arc.jsonl"
    arc.write_text("".join(
        json.dumps({"id": str(i), "question": f"Which number is bigger, {i} or {i + 1}?",
                    "choices": {"text": [str(i), str(i + 1)], "label": ["A", "B"]}, "answerKey": "B"}) + "\n"
        for i in range(6)))
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text("".join(json.dumps(row) + "\n" for row in gsm8k_rows(6)))
    local = {"dataset_path": "json", "dataset_name": None, "training_split": None, "validation_split": None, "test_split": "test"}
    return [{"group": "stock_local", "task": [
        {"task": "arc_easy", **local, "dataset_kwargs": {"data_files": {"test": str(arc)}}},
        {"task": "gsm8k", **local, "dataset_kwargs": {"data_files": {"test": str(gsm), "train": str(gsm)}},
         "training_split": "train", "fewshot_split": "train", "num_fewshot": 1},
    ]}]


def test_python_api_adds_probe_rows_to_stock_tasks(tiny_model_dir, tmp_path):
    import lm_eval

    from lm_eval_probes.tasks.manager import ProbeTaskManager
    from lm_eval_probes.tasks.probe_task import ProbeResults

    manager = ProbeTaskManager()
    loaded = manager.load(stock_specs(tmp_path))
    arc, gsm = loaded["tasks"]["arc_easy"], loaded["tasks"]["gsm8k"]
    assert isinstance(arc, ProbeResults) and arc.config.doc_to_text == "Question: {{question}}\nAnswer:"
    assert [f["name"] for f in gsm.config.filter_list] == ["strict-match", "flexible-extract"]
    out = lm_eval.simple_evaluate(
        model="hf-probes", model_args={"pretrained": tiny_model_dir("llama"), "device": "cpu"},
        tasks=stock_specs(tmp_path), task_manager=manager, gen_kwargs={"max_gen_toks": 6}, bootstrap_iters=0,
    )
    results = out["results"]
    assert {"acc,none", "acc_norm,none", "tcb_log10,none", "bte_energy,none"} <= set(results["arc_easy"])
    for key in ("exact_match", "tcb_log10", "bte_energy", "confidence"):
        assert f"{key},strict-match" in results["gsm8k"] and f"{key},flexible-extract" in results["gsm8k"]
    assert not any("spearman" in key for key in results["arc_easy"])  # stock tasks declare no difficulty


def test_console_script_probes_stock_tasks(tiny_model_dir, tmp_path, run_cli, monkeypatch):
    import yaml

    (group_file := tmp_path / "stock_local.yaml").write_text(yaml.safe_dump(stock_specs(tmp_path)[0]))
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("lm-eval-probes", [
        "run", "--model", "hf-probes", "--model_args", f"pretrained={tiny_model_dir('gpt2')},probes=tcb",
        "--tasks", str(group_file), "--limit", "4", "--device", "cpu", "--gen_kwargs", "max_gen_toks=4",
        "--output_path", str(out)])
    assert code == 0, err[-3000:]
    (results_file,) = out.rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]
    assert "tcb_log10,none" in results["arc_easy"] and "tcb_log10,strict-match" in results["gsm8k"]
    assert "bte_energy,none" not in results["arc_easy"]
