"""The one table of rows against real runs; rows that never move with batch size, ``--use_cache`` or a crash."""

from __future__ import annotations

import json
import math
from pathlib import Path

import lm_eval
import lm_eval.evaluator
import lm_eval.tasks
import numpy as np
import pytest

from loader_fixtures import write_data_dir
from per_document import largest_differences
from lm_eval_probes import TASKS_DIR, rows
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.tasks.manager import ProbeTaskManager
from lm_eval_probes.records import PROBE_REQUEST
from lm_eval_probes.metrics.calibration import reader_auroc_row, scaled_ece_row
from lm_eval_probes.models.autoregressive import ProbeHFLM
from lm_eval_probes.records import LayerStates, ReaderRecord

MC_TASK, GEN_TASK, DETECTOR_TASK = "probes_synth_logic", "probes_synth_arith_gen", "probes_proofwriter_detect"
GEN_KWARGS = {"max_gen_toks": 6}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data_dir(tmp_path_factory.mktemp("data"), n=24)


def run(lm: ProbeHFLM, tasks: list[str], data_dir: Path, limit: int, **kwargs) -> dict:
    manager = ProbeTaskManager(include_path=TASKS_DIR, metadata={"probes_data_dir": str(data_dir)})
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit, log_samples=True,
                                   gen_kwargs=GEN_KWARGS, bootstrap_iters=0, **kwargs)


def probe_rows(results: dict) -> dict[str, object]:
    """``name,filter`` → value of the plugin's rows (and nothing of the task's own)."""
    return {key: value for key, value in results.items() if key.split(",")[0] in rows.ROWS_BY_NAME}


def test_row_table_is_consistent():
    assert len(rows.ROWS) == len(rows.ROWS_BY_NAME)
    assert set(rows.names(*rows.FAMILIES)) == set(rows.ROWS_BY_NAME)
    assert rows.rows_for(difficulty=False, correctness=False, detector=False) == tuple(
        row for row in rows.ROWS if row.family == "probe")
    with pytest.raises(ValueError, match="unknown row families"):
        rows.names("calibration")


def test_every_declared_row_appears_in_a_real_run_and_every_emitted_row_is_declared(tiny_model_dir, data_dir):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=4, probes="all",  # omega is not default
                   probe_bte_profile="full", probe_tcb_ablation=0.5,  # the depth profile row, the ablation rows
                   probe_traces="true")  # the trace row
    out = run(lm, [MC_TASK, GEN_TASK, DETECTOR_TASK], data_dir, limit=16)
    emitted: set[str] = set()
    for task, results in out["results"].items():
        own = {m["metric"] for m in out["configs"][task]["metric_list"]}
        names = {key.split(",")[0] for key in results if "," in key} - {"alias"}
        names = {name[: -len("_stderr")] if name.endswith("_stderr") else name for name in names}
        undeclared = names - own - set(rows.ROWS_BY_NAME)
        assert not undeclared, (task, undeclared)
        emitted |= names - own
    declared = set(rows.ROWS_BY_NAME) - set(rows.DIFFUSION_ROWS)  # those: tests/test_diffusion.py
    assert emitted == declared, declared ^ emitted
    json.dumps(out["results"], allow_nan=False)
    layers = lm.model.config.num_hidden_layers
    for task in (MC_TASK, GEN_TASK):  # the per-document vectors reach the samples, and their rows are their means
        samples = out["samples"][task]
        profiles = [s["bte_profile"] for s in samples]
        trajectories = [s["omega_trajectory"] for s in samples]
        support = [s["margin_support"] for s in samples]
        assert {len(p) for p in profiles} == {layers} and {len(t) for t in trajectories} == {layers + 1}
        assert all(len(s["positions"]) == len(s["tokens"]) == len(s["margins"]) == 5 for s in support)
        assert all(s["margins"] == sorted(s["margins"]) for s in support)
        assert all(math.isclose(s["omega"], sum(1 - c for c in t), rel_tol=1e-9) for s, t in zip(samples, trajectories))
        results = {key.split(",")[0]: value for key, value in out["results"][task].items()
                   if key.endswith("," + samples[0]["filter"])}
        assert results["bte_profile"] == pytest.approx(np.mean([np.mean(p) for p in profiles]), rel=1e-12)
        assert results["omega_trajectory"] == pytest.approx(np.mean([np.mean(t) for t in trajectories]), rel=1e-12)
        assert results["margin_support"] == pytest.approx(np.mean([np.mean(s["margins"]) for s in support]), rel=1e-12)
        json.dumps([profiles, trajectories, support], allow_nan=False)


def _assert_rows_equal(got: dict, want: dict, where: str) -> None:
    assert set(got) == set(want), (where, set(got) ^ set(want))
    for key, value in want.items():
        if isinstance(value, float) and isinstance(got[key], float):
            # the margins' products are float32, of shapes that follow the padded length (docs/precision.md)
            tolerance = 1e-5 if key.startswith("margin") else 1e-6
            assert got[key] == pytest.approx(value, rel=tolerance, abs=tolerance), (where, key, got[key], value)
        else:
            assert got[key] == value, (where, key)


def test_no_row_depends_on_the_batch_size(tiny_model_dir):
    """Every row, MC and generation, at batch sizes 1, 3 and auto agrees to 1e-6 (margins: 1e-5; batching moves hidden
    states by an ulp: no fold may depend on their bytes), and every per-document value of every sample to 1e-4
    relative (measured: ≤ 3.3e-6, Ω's trajectory; BTE ≤ 4.6e-7, which the entropy-form JSD moved by 6.6e-4)."""
    outs = {}
    for batch_size in (1, 3, "auto"):
        lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=batch_size, probes="all")
        outs[batch_size] = run(lm, [MC_TASK, GEN_TASK], Path("."), limit=20)
    for task in (MC_TASK, GEN_TASK):
        want = probe_rows(outs[1]["results"][task])
        assert "lcr_auroc,none" in want or task == GEN_TASK
        assert {"omega", "omega_spearman", "omega_spearman_partial"} <= {key.split(",")[0] for key in want}
        for batch_size in (3, "auto"):
            _assert_rows_equal(probe_rows(outs[batch_size]["results"][task]), want, f"{task} batch {batch_size}")
            moved = largest_differences(outs[batch_size]["samples"][task], outs[1]["samples"][task])
            assert {"bte_energy", "tcb_log10", "confidence", "omega", "omega_trajectory", "margin"} <= set(moved)
            assert max(moved.values()) <= 1e-4, (task, batch_size, {k: v for k, v in moved.items() if v > 1e-4})


def test_an_ulp_of_noise_moves_no_fold():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 60)
    features = rng.normal(size=(60, 2, 8)).astype(np.float32)
    features[:, 1, 0] += 0.8 * labels
    nudged = np.nextafter(features, np.float32(np.inf))
    make = lambda values: [ReaderRecord(LayerStates((1, 2), f), int(y), document=i)  # noqa: E731
                           for i, (f, y) in enumerate(zip(values, labels))]
    assert reader_auroc_row(make(nudged)) == pytest.approx(reader_auroc_row(make(features)), abs=1e-9)
    confidence = rng.uniform(0.3, 0.9, 60)
    keyed = [(c, int(y), i) for i, (c, y) in enumerate(zip(confidence, labels))]
    nudged_keyed = [(np.nextafter(c, 1.0), y, i) for c, y, i in keyed]
    assert scaled_ece_row(nudged_keyed) == pytest.approx(scaled_ece_row(keyed), abs=1e-9)
    with pytest.warns(UserWarning, match="ece_scaled is undefined"):
        assert math.isnan(scaled_ece_row(keyed[:2]))


def test_use_cache_never_replays_probes_of_another_configuration(tiny_model_dir, tmp_path):
    cache = str(tmp_path / "cache")
    values = {}
    for eps in (1, 100, 1):
        lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2, probe_tcb_eps=eps)
        out = run(lm, [MC_TASK], Path("."), limit=8, use_cache=cache)
        values.setdefault(eps, []).append(out["results"][MC_TASK]["tcb_log10,none"])
    assert values[100][0] == pytest.approx(values[1][0] + 2.0, abs=1e-6)  # δ = ε/‖J‖: log10(100) = 2
    assert values[1][1] == values[1][0]  # the first configuration's table is reused as it was


def test_a_run_killed_mid_way_leaves_no_probe_less_answers_in_the_cache(tiny_model_dir, tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    fresh = run(ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2), [MC_TASK], Path("."), limit=10)
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2)
    calls = {"n": 0}
    original = ProbeHFLM._model_call

    def crash_on_the_fourth_batch(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ProbeHFLM, "_model_call", crash_on_the_fourth_batch)
    with pytest.raises(KeyboardInterrupt):
        run(lm, [MC_TASK], Path("."), limit=10, use_cache=cache)
    monkeypatch.setattr(ProbeHFLM, "_model_call", original)
    again = run(lm, [MC_TASK], Path("."), limit=10, use_cache=cache)
    assert all("tcb_log10" in sample for sample in again["samples"][MC_TASK])
    _assert_rows_equal(probe_rows(again["results"][MC_TASK]), probe_rows(fresh["results"][MC_TASK]), "after a crash")


def test_use_cache_keeps_the_lens_values_of_every_option(tiny_model_dir, tmp_path):
    """Under ``--use_cache`` every option goes through the lens: a later run whose task reads other options
    (``metadata.confidence``) replays the cache with the lens values of the options it now reads."""
    cache = str(tmp_path / "cache")
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2)

    def evaluate(confidence: str, **kwargs) -> dict:
        manager = ProbeTaskManager(include_path=TASKS_DIR, metadata={"confidence": confidence})
        return lm_eval.simple_evaluate(model=lm, tasks=["probes_synth_arith"], task_manager=manager, limit=12,
                                       log_samples=True, bootstrap_iters=0, **kwargs)

    evaluate("option", use_cache=cache)
    replayed, fresh = evaluate("option_norm", use_cache=cache), evaluate("option_norm")
    samples = replayed["samples"]["probes_synth_arith"]
    assert all("tcb_log10" in sample and "bte_energy" in sample for sample in samples)
    _assert_rows_equal(probe_rows(replayed["results"]["probes_synth_arith"]),
                       probe_rows(fresh["results"]["probes_synth_arith"]), "replayed under another confidence rule")


def test_rows_of_tasks_without_correctness_or_labels(tiny_model_dir, data_dir):
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=4)
    out = run(lm, ["probes_gsm8k_ref"], data_dir, limit=6)
    names = {key.split(",")[0] for key in out["results"]["probes_gsm8k_ref"]}
    assert not names & set(rows.names("confidence", "reader")), "a reference's acc judges no answer"
    assert "bte_energy" in names and "bte_spearman" in names
    manager = ProbeTaskManager(include_path=TASKS_DIR, metadata={"difficulty": "no_such_field"})
    unlabelled = lm_eval.simple_evaluate(model=lm, tasks=[MC_TASK], task_manager=manager, limit=6, bootstrap_iters=0)
    results = unlabelled["results"][MC_TASK]
    assert results["difficulty_missing,none"] == 6
    for name in ("bte_spearman", "tcb_spearman_partial", "length_spearman"):
        assert results[f"{name},none"] is None, name  # shown as undefined, not left out


def test_probe_config_rejects_an_infinite_epsilon():
    with pytest.raises(ValueError, match="probe_tcb_eps must be finite and > 0"):
        ProbeConfig.from_model_args({"probe_tcb_eps": "inf"})


def test_a_task_without_probe_rows_warns_once(tiny_model_dir, caplog):
    from lm_eval.api.instance import Instance

    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2)
    requests = [Instance("loglikelihood", {}, ("The bear", " is red"), 0, ("some_stock_task", i, 1)) for i in range(2)]
    with caplog.at_level("WARNING"):
        lm.loglikelihood(requests)
        lm.loglikelihood(requests)
    messages = [r.getMessage() for r in caplog.records if "no probe rows" in r.getMessage()]
    assert len(messages) == 1 and "lm-eval-probes" in messages[0] and "some_stock_task" in messages[0]


@pytest.mark.parametrize("confidence", ["option", "option_norm"])
def test_multiple_choice_gives_the_lens_to_the_option_the_task_reads(tiny_model_dir, confidence):
    """Only the option the task reads (the chosen one, by its confidence rule) goes through the logit lens;
    its values equal those of a run that probes every option."""
    import copy

    manager = ProbeTaskManager(include_path=TASKS_DIR, metadata={"confidence": confidence})
    task = lm_eval.tasks.get_task_dict(["probes_synth_arith"], manager)["probes_synth_arith"]
    task.build_all_requests(limit=6, rank=0, world_size=1)
    instances = task.instances
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=3)
    answers = lm.loglikelihood(instances)
    unplanned = []
    for inst in instances:  # requests without a task's ProbeRequest: every option is probed
        other = copy.copy(inst)
        delattr(other, PROBE_REQUEST)
        other.task_name = "not_a_probed_task"
        unplanned.append(other)
    every = lm.loglikelihood(unplanned)
    by_doc: dict[int, list[int]] = {}
    for i, inst in enumerate(instances):
        by_doc.setdefault(inst.doc_id, []).append(i)
    for indices in by_doc.values():
        indices.sort(key=lambda i: instances[i].idx)
        doc = instances[indices[0]].doc
        chosen = task.chosen_option_index(doc, [answers[i][0] for i in indices])
        for option, i in enumerate(indices):
            probe, reference = answers[i].probe, every[i].probe
            assert probe.get("answer_states") is not None and probe.mean_token_logprob == reference.mean_token_logprob
            if option == chosen:
                for name in ("tcb_log10_mean", "entropy", "logit_margin", "bte_energy"):
                    assert probe.get(name) == pytest.approx(reference.get(name), rel=1e-5), name
            else:
                assert probe.get("tcb_log10_mean") is None and probe.get("bte_energy") is None
