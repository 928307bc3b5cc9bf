"""Calibration, reader and detector rows: wiring into tasks, valid results JSON, small samples, two-rank gather."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import lm_eval.evaluator
import lm_eval.tasks
import numpy as np
import pytest
import torch

from loader_fixtures import write_data_dir
from lm_eval_probes import TASKS_DIR, rows
from lm_eval_probes.estimators import answer_confidence, locate_answer, response_confidence
from lm_eval_probes.metrics import CalibrationOptions
from lm_eval_probes.models.autoregressive import ProbeHFLM
from lm_eval_probes.probes.calibration import expected_calibration_error, out_of_fold_temperature_scale
from lm_eval_probes.records import LayerStates, ResponseProbe
from lm_eval_probes.tasks.manager import ProbeTaskManager


def answer_confidence_and_states(probe: ResponseProbe):
    from lm_eval_probes.probes.reader.probe import reader_states

    return answer_confidence(probe), reader_states(probe, "answer_states", answer_span=True)

ROWS = rows.names("confidence", "reader")


# ------------------------------------------------------------------------------------------ answer spans

def test_locate_answer_finds_the_tokens_of_the_last_occurrence():
    text = "So 12 + 30 = 42.\n#### 42"
    # tokens: "So" " 12" " +" " 30" " =" " 42" "." "\n####" " 42"
    ends = [2, 5, 7, 10, 12, 15, 16, 21, 24]
    assert locate_answer(text, "42", ends) == (8, 9)
    assert locate_answer(text, " 30 ", ends) == (3, 4)  # stripped: "30"
    assert locate_answer(text, "2 + 3", ends) == (1, 4)  # partial tokens at both ends are included
    assert locate_answer(text, "[invalid]", ends) is None
    assert locate_answer(text, "", ends) is None and locate_answer(text, None, ends) is None


def test_answer_confidence_uses_the_answer_tokens_and_their_states():
    rng = np.random.default_rng(0)
    per_position = rng.normal(size=(2, 6, 4)).astype(np.float16)  # k=2 layers, 6 kept positions
    logprobs = (-0.1, -2.0, -0.5, -0.3, -0.05, -1.0)
    probe = ResponseProbe(
        n_tokens=6, mean_token_logprob=float(np.mean(logprobs)), token_logprobs=logprobs, token_ends=(1, 2, 3, 4, 5, 6),
        answer_states=LayerStates((2, 3), per_position.astype(np.float32).mean(1)),
        tail_states=LayerStates((2, 3), per_position[:, 2:]), answer_span=(3, 5),
    )
    confidence, states = answer_confidence_and_states(probe)
    assert confidence == pytest.approx(math.exp((-0.3 - 0.05) / 2))
    np.testing.assert_allclose(states.values, per_position[:, 3:5].astype(np.float64).mean(1), rtol=1e-6)
    # an answer beginning before the kept tail: whole-generation states; no span: whole-generation confidence
    early = answer_confidence_and_states(ResponseProbe(**{**probe.__dict__, "answer_span": (1, 3)}))
    assert early[0] == pytest.approx(math.exp((-2.0 - 0.5) / 2)) and early[1] is probe.get("answer_states")
    unlocated = answer_confidence_and_states(ResponseProbe(**{**probe.__dict__, "answer_span": None}))
    assert unlocated == (response_confidence(probe), probe.get("answer_states"))


def test_calibration_options_from_metadata():
    options = CalibrationOptions.from_metadata({"ece_bins": "10", "ece_binning": "quantile", "difficulty": "x"})
    assert (options.ece_bins, options.ece_binning, options.reader_protocol) == (10, "quantile", "cross_fit")
    with pytest.raises(ValueError, match="Did you mean 'quantile'"):
        CalibrationOptions.from_metadata({"ece_binning": "quantil"})
    with pytest.raises(ValueError, match="reader_protocol"):
        CalibrationOptions.from_metadata({"reader_protocol": "kfold"})
    with pytest.raises(ValueError, match="ece_bins must be an integer"):
        CalibrationOptions.from_metadata({"ece_bins": "many"})


# ------------------------------------------------------------------------------------------ end to end

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data_dir(tmp_path_factory.mktemp("data"), n=24)


def evaluate(lm: ProbeHFLM, tasks: list[str], data_dir: Path, limit: int, metadata: dict | None = None) -> dict:
    manager = ProbeTaskManager(include_path=TASKS_DIR, metadata={"probes_data_dir": str(data_dir), **(metadata or {})})
    task_dict = lm_eval.tasks.get_task_dict(tasks, manager)
    return lm_eval.evaluator.evaluate(lm, task_dict, limit=limit, log_samples=True)


@pytest.fixture(scope="module")
def llama(tiny_model_dir) -> ProbeHFLM:
    return ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=1)


def test_rows_match_an_independent_recomputation_from_the_samples(llama, data_dir):
    out = evaluate(llama, ["probes_synth_logic"], data_dir, limit=40)
    results = out["results"]["probes_synth_logic"]
    json.dumps(out["results"], allow_nan=False)  # undefined rows are null, never a bare NaN
    samples = out["samples"]["probes_synth_logic"]
    for row in ROWS:
        assert f"{row},none" in results, row
    pairs = np.array([s["ece"] for s in samples], dtype=float)
    assert [tuple(s["ece"]) for s in samples] == [(s["confidence"], s["acc"]) for s in samples]
    assert results["ece,none"] == pytest.approx(expected_calibration_error(pairs[:, 0], pairs[:, 1].astype(int)))
    keyed = np.array([s["ece_scaled"] for s in samples], dtype=float)
    assert keyed[:, 2].tolist() == [s["doc_id"] for s in samples]  # the document's identity orders the folds
    order = np.argsort(keyed[:, 2])
    scaled = out_of_fold_temperature_scale(keyed[order, 0], keyed[order, 1].astype(int), n_splits=5, seed=0)
    assert results["ece_scaled,none"] == pytest.approx(expected_calibration_error(scaled, keyed[order, 1].astype(int)))
    # --log_samples stays small: the reader's vectors appear as one short line per document
    for sample in samples:
        assert len(json.dumps(sample["lcr_auroc"], default=str)) < 200
        assert len(json.dumps({k: v for k, v in sample.items() if k not in ("doc", "arguments")}, default=str)) < 3000


def test_length_normalised_option_confidence(llama, data_dir):
    out = evaluate(llama, ["probes_synth_logic"], data_dir, limit=12, metadata={"confidence": "option_norm"})
    for sample in out["samples"]["probes_synth_logic"]:
        lls = np.array([float(r[0][0]) for r in sample["resps"]])
        normalised = lls / np.array([len("True"), len("False")], dtype=float)  # the task's choices
        p = np.exp(normalised - normalised.max())
        assert sample["confidence"] == pytest.approx(p.max() / p.sum(), rel=1e-9)
        assert sample["ece"][1] == int(normalised.argmax() == sample["doc"]["label"])  # judged on its own choice
    with pytest.raises(ValueError, match="metadata.confidence must be one of"):
        evaluate(llama, ["probes_synth_logic"], data_dir, limit=2, metadata={"confidence": "answer"})


def test_detector_task_pairs_clean_and_noised_documents(llama, data_dir):
    out = evaluate(llama, ["probes_proofwriter_detect"], data_dir, limit=24)
    samples = out["samples"]["probes_proofwriter_detect"]
    docs = [s["doc"] for s in samples]
    assert [d["noise_pair"] for d in docs] == [i // 2 for i in range(24)]
    for clean, noised in zip(docs[::2], docs[1::2]):
        assert clean["noised"] == 0 and clean["question"] == clean["clean_question"]
        assert noised["noised"] == int(noised["theory"] != clean["theory"] or noised["question"] != clean["question"])
    results = out["results"]["probes_proofwriter_detect"]
    assert "corruption_auroc,none" in results and "corruption_confidence_auroc,none" in results
    assert 0.0 <= results["corruption_auroc,none"] <= 1.0
    json.dumps(out["results"], allow_nan=False)


def test_two_simulated_ranks_give_the_same_rows_as_one_process(llama, data_dir):
    """Each rank evaluates its shard; rank 0 receives rank 1's pickled records, as torch.distributed would send them."""
    tasks = ["probes_synth_logic", "probes_proofwriter_detect"]
    single = evaluate(llama, tasks, data_dir, limit=24)
    sent: list[bytes] = []
    try:
        llama._world_size = 2
        llama.all_gather = lambda t: torch.stack([t, t])  # equal shards: no padding requests
        llama.barrier = lambda: None
        llama._rank = 1
        llama.gather_object = lambda obj, dst=0: sent.append(pickle.dumps(obj))
        assert evaluate(llama, tasks, data_dir, limit=24) is None
        received = iter(sent)
        llama._rank = 0
        llama.gather_object = lambda obj, dst=0: [pickle.loads(pickle.dumps(obj)), pickle.loads(next(received))]
        gathered = evaluate(llama, tasks, data_dir, limit=24)
    finally:
        llama._world_size, llama._rank = 1, 0
        del llama.all_gather, llama.gather_object, llama.barrier
    assert len(sent) == 2  # samples, then metric values
    assert [len(pickle.loads(sent[0])[task]) for task in tasks] == [12, 12]  # rank 1 evaluated its half
    for task in tasks:
        want, got = single["results"][task], gathered["results"][task]
        assert set(got) == set(want)
        for key, value in want.items():
            if isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (task, key)
            else:
                assert got[key] == value, (task, key)
        assert len(gathered["samples"][task]) == len(single["samples"][task])


def test_reader_rows_from_records_and_the_split_protocol_on_too_few_documents():
    from lm_eval_probes.metrics.calibration import reader_auroc_row, reader_ece_row
    from lm_eval_probes.records import ReaderRecord
    from sklearn.exceptions import UndefinedMetricWarning

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 120)
    features = rng.normal(size=(120, 2, 8)).astype(np.float32)
    features[:, 1, 0] += 3.0 * labels  # layer 1 knows the label
    records = [ReaderRecord(LayerStates((4, 6), f), int(y), document=i) for i, (f, y) in enumerate(zip(features, labels))]
    assert reader_auroc_row(records) > 0.9  # the folds follow the documents: 0.946 here
    assert 0.0 <= reader_ece_row(records) < 0.2
    shuffled = [records[i] for i in rng.permutation(len(records))]
    assert reader_auroc_row(shuffled) == reader_auroc_row(records)  # canonical order: gather order is irrelevant
    with pytest.warns(UndefinedMetricWarning, match="split"):
        assert math.isnan(reader_auroc_row(records, CalibrationOptions(reader_protocol="split")))


def test_correctness_metric_must_be_zero_one(llama, data_dir, caplog):
    out = evaluate(llama, ["probes_synth_logic"], data_dir, limit=6, metadata={"correctness": "confidence"})
    results = out["results"]["probes_synth_logic"]
    assert "ece,none" not in results and "lcr_auroc,none" not in results and "bte_energy,none" in results
    assert "is not 0/1 per document" in caplog.text
    named = evaluate(llama, ["probes_synth_logic"], data_dir, limit=6, metadata={"correctness": "acc"})
    assert [s["ece"][1] for s in named["samples"]["probes_synth_logic"]] == [
        s["acc"] for s in named["samples"]["probes_synth_logic"]]
