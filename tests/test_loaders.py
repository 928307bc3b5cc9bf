"""Benchmark tasks: data sources, document schemas, answer checks, noised twins — on files the tests write."""

from __future__ import annotations

import json

import datasets
import pytest

from loader_fixtures import gsm8k_rows, proofwriter_rows, stepgame_rows, write_data_dir
from lm_eval_probes.tasks import loaders


def test_interleave_by_is_round_robin_and_stable():
    data = datasets.Dataset.from_list([{"d": d, "i": i} for i, d in enumerate([0, 0, 0, 1, 1, 2])])
    out = loaders.interleave_by(data, lambda doc: doc["d"])
    assert [doc["i"] for doc in out] == [0, 3, 5, 1, 4, 2]


def test_gsm8k_schema():
    answer = "He buys 2 <<2*3=6>>6 apples.\nThen 6+1 = <<6+1=7>>7.\n#### 7"
    assert loaders.gsm8k_steps(answer) == 2
    (doc,) = loaders.process_gsm8k(datasets.Dataset.from_list([{"question": "q", "answer": answer}]))
    assert doc["steps"] == 2 and doc["target"] == "7" and "<<" not in doc["solution"]


def test_proofwriter_schema_closed_and_open_world():
    closed = loaders.process_proofwriter(datasets.Dataset.from_list(proofwriter_rows(12)))
    assert all(doc["choices"] == ["True", "False"] for doc in closed)
    assert [doc["depth"] for doc in closed][:6] == [0, 1, 2, 3, 4, 5]
    assert all(doc["choices"][doc["label"]] == doc["answer"] for doc in closed)
    owa = loaders.process_proofwriter(datasets.Dataset.from_list(proofwriter_rows(6, open_world=True)))
    assert all(doc["choices"] == ["True", "False", "Unknown"] and doc["depth"] is None for doc in owa)
    hub_style = loaders.process_proofwriter(datasets.Dataset.from_list([{"theory": "t", "question": "q", "answer": "Unknown", "QDep": 3}]))
    assert hub_style[0]["depth"] == 3 and hub_style[0]["label"] == 2
    with pytest.raises(ValueError, match="unrecognised ProofWriter answer"):
        loaders.process_proofwriter(datasets.Dataset.from_list([{"theory": "t", "question": "q", "answer": "maybe"}]))


def test_stepgame_schema():
    docs = loaders.process_stepgame(datasets.Dataset.from_list(stepgame_rows(10)))
    assert [doc["k_hop"] for doc in docs] == list(range(1, 11))
    assert all(loaders.STEPGAME_RELATIONS[doc["label"]] == doc["relation"] for doc in docs)
    assert docs[0]["story_text"] == "A is to the left of B. C is above B."


@pytest.mark.parametrize(
    "gold, generation, expected",
    [("\\frac{1}{2}", "so the answer is $\\boxed{0.5}$", True), ("3", "$\\boxed{4}$", False),
     ("(3, \\frac{\\pi}{2})", "We get $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$.", True)],
)
def test_math_answer_check(gold, generation, expected):
    assert loaders.math_answers_match(gold, generation) is expected


def test_math_fallback_string_equivalence():
    assert loaders.last_boxed("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}}") == "x^{2}"
    assert loaders.last_boxed("no box") is None
    assert loaders._string_equivalent("\\frac{1}{2}", "thus $\\boxed{\\frac12}$")
    assert not loaders._string_equivalent("3", "thus $\\boxed{4}$")


def test_local_files_and_errors(tmp_path, monkeypatch):
    root = write_data_dir(tmp_path)
    assert len(loaders.gsm8k_dataset(probes_data_dir=str(root), pretrained="ignored")["test"]) == 12
    files = {"test": str(root / "proofwriter" / "owa.jsonl")}
    assert loaders.proofwriter_dataset(proofwriter_files=files, probes_data_dir="/nowhere")["test"][0]["depth"] is None
    with pytest.raises(FileNotFoundError, match="no such file"):
        loaders.math500_dataset(probes_data_dir=str(tmp_path / "missing"))
    calls = []
    monkeypatch.setattr(loaders.datasets, "load_dataset", lambda *a, **k: calls.append((a, k)) or datasets.Dataset.from_list([{"x": 1}]))
    loaders.stepgame_dataset()  # no local data: the hub dataset
    assert calls == [(("michaelszx/StepGame", None), {"split": "test"})]


def test_benchmark_tasks_end_to_end(tiny_model_dir, tmp_path):
    import lm_eval
    from lm_eval.tasks import TaskManager

    import lm_eval_probes

    root = write_data_dir(tmp_path)
    clean, noised = "probes_gsm8k", "probes_gsm8k_noise_swap"
    tasks = [clean, noised, "probes_gsm8k_ref", "probes_math500_ref", "probes_proofwriter", "probes_stepgame_noise_keyboard"]
    out = lm_eval.simple_evaluate(
        model="hf-probes", model_args={"pretrained": tiny_model_dir("llama"), "device": "cpu"}, tasks=tasks, limit=6,
        gen_kwargs={"max_gen_toks": 4}, num_fewshot=1, log_samples=True, bootstrap_iters=0,
        task_manager=TaskManager(include_path=lm_eval_probes.TASKS_DIR,
                                 metadata={"probes_data_dir": str(root), "noise_eta": 0.3}),
    )
    results = out["results"]
    for task in tasks:
        assert any(key.startswith("bte_spearman,") for key in results[task]), task
        assert any(key.startswith("bte_spearman_partial,") for key in results[task]), task
    assert results["probes_gsm8k_ref"]["difficulty_missing,none"] == 0
    json.dumps(out["samples"][noised][0]["doc"])  # records are JSON-native
    clean_docs = {s["doc_id"]: s["doc"] for s in out["samples"][clean]}
    for sample in out["samples"][noised]:
        doc = sample["doc"]
        assert doc["clean_question"] == clean_docs[sample["doc_id"]]["question"]  # noised twin of the same doc
        assert doc["noise_eta"] == 0.3 and doc["noise_operator"] == "swap" and doc["noise_seed"] == 1234
        prompt = sample["arguments"][0][0]
        assert prompt.endswith(f"Question: {doc['question']}\nAnswer:")
        shot = prompt.split("\n\n")[0]
        assert shot.startswith("Question: ") and shot[len("Question: "):].split("\nAnswer:")[0] in {r["question"] for r in gsm8k_rows(8)}
    assert sum(s["doc"]["noise_corrupted"] for s in out["samples"][noised]) > 0


def test_noised_task_keeps_negations_unless_its_metadata_says_otherwise(tmp_path):
    import lm_eval.tasks

    import lm_eval_probes
    from lm_eval_probes.tasks.manager import ProbeTaskManager

    root = write_data_dir(tmp_path)
    task_name = "probes_proofwriter_noise_delete"

    def noised_docs(**metadata):
        manager = ProbeTaskManager(include_path=lm_eval_probes.TASKS_DIR,
                                   metadata={"probes_data_dir": str(root), "noise_eta": 1.0, **metadata})
        return list(lm_eval.tasks.get_task_dict([task_name], manager)[task_name].eval_docs)

    docs = noised_docs()
    assert {doc["clean_question"] for doc in docs} == {"The cat is red.", "The cat is not red."}
    for doc in docs:  # every other word is deleted, the negation stays
        assert doc["question"] == ("not" if "not" in doc["clean_question"].split() else "")
    assert all(doc["question"] == "" for doc in noised_docs(noise_protect_negations=False))
