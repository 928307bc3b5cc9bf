"""``probe_save_states=DIR``: every answered request's reader states on disk (safetensors + a JSON-lines index),
equal to the states the run's records carry."""

from __future__ import annotations

import json

import lm_eval.tasks
import numpy as np
import pytest
from safetensors.numpy import load_file

from lm_eval_probes import TASKS_DIR
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.tasks.manager import ProbeTaskManager
from lm_eval_probes.models.autoregressive import ProbeHFLM


@pytest.fixture(scope="module")
def manager() -> ProbeTaskManager:
    return ProbeTaskManager(include_path=TASKS_DIR)


def instances_of(manager: ProbeTaskManager, name: str, limit: int) -> list:
    task = lm_eval.tasks.get_task_dict([name], manager)[name]
    task.build_all_requests(limit=limit, rank=0, world_size=1)
    return task.instances


def read(folder) -> tuple[list[dict], dict[str, np.ndarray]]:
    entries = [json.loads(line) for line in (folder / "index-rank0.jsonl").read_text().splitlines()]
    tensors: dict[str, np.ndarray] = {}
    for name in sorted({entry["file"] for entry in entries}):
        tensors.update(load_file(str(folder / name)))
    return entries, tensors


def test_every_request_s_states_are_saved_as_its_record_holds_them(tiny_model_dir, manager, tmp_path):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=3, probe_save_states=str(tmp_path))
    choice = instances_of(manager, "probes_synth_arith", 4)
    generation = instances_of(manager, "probes_synth_arith_gen", 3)
    for instance in generation:
        instance.arguments[1]["max_gen_toks"] = 8
    answers = lm.loglikelihood(choice) + lm.generate_until(generation)
    entries, tensors = read(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["states-rank0-00000.safetensors",
                                                                      "states-rank0-00001.safetensors"]
    assert len(entries) == len(choice) + len(generation)  # every option of every document, every generation
    layers = list(lm.plan.requested.prompt_layers)
    hidden = lm.model.config.hidden_size
    by_request = {(e["task"], e["doc_id"], e["idx"]): e for e in entries}
    for instance, answer in zip(choice + generation, answers):
        entry = by_request[instance.task_name, instance.doc_id, instance.idx]
        key, probe = entry["key"], answer.probe
        assert key == f"{instance.task_name}/{instance.doc_id}/{instance.idx}/0" and entry["layers"] == layers
        assert entry["request_type"] == instance.request_type and entry["response_tokens"] == probe.n_tokens
        np.testing.assert_array_equal(tensors[f"{key}/answer"], probe.get("answer_states").values)
        np.testing.assert_array_equal(tensors[f"{key}/prompt"], probe.get("prompt_states").values)
        assert tensors[f"{key}/answer"].shape == (len(layers), hidden) and tensors[f"{key}/answer"].dtype == np.float32
        if instance.request_type == "generate_until":
            assert entry["kinds"] == ["answer", "prompt", "tail"]
            np.testing.assert_array_equal(tensors[f"{key}/tail"], probe.get("tail_states").values)
        else:
            assert entry["kinds"] == ["answer", "prompt"]


def test_a_second_run_appends_and_a_repeated_request_gets_its_own_key(tiny_model_dir, manager, tmp_path):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2, probe_save_states=str(tmp_path))
    choice = instances_of(manager, "probes_synth_logic", 2)
    lm.loglikelihood(choice + choice[:1])  # the first option of the first document twice
    lm.loglikelihood(choice)
    entries, tensors = read(tmp_path)
    assert len(list(tmp_path.glob("*.safetensors"))) == 2 and len(entries) == 2 * len(choice) + 1
    first = choice[0]
    prefix = f"{first.task_name}/{first.doc_id}/{first.idx}"
    assert {f"{prefix}/0/answer", f"{prefix}/1/answer", f"{prefix}/2/answer"} <= set(tensors)
    # the same request in another place of a batch: the same states to float32 rounding (rows of a product may round apart)
    np.testing.assert_allclose(tensors[f"{prefix}/0/answer"], tensors[f"{prefix}/1/answer"], rtol=1e-5, atol=1e-6)


def test_save_states_needs_the_reader_and_changes_no_configuration_identity(tmp_path):
    with pytest.raises(ValueError, match="add reader to probes"):
        ProbeConfig.from_model_args({"probes": "tcb+bte", "probe_save_states": str(tmp_path)})
    saving = ProbeConfig.from_model_args({"probe_save_states": str(tmp_path)})
    assert saving.options_of("reader").save_states == str(tmp_path) and repr(saving) == repr(ProbeConfig()) and saving == ProbeConfig()
    assert ProbeConfig.from_model_args({"probe_save_states": "none"}).options_of("reader").save_states is None
