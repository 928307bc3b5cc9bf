"""Calibration along the denoising trajectory: the records' per-step probabilities of the final tokens and the
``ece_at_step_<k>`` / ``selective_auroc_at_step_<k>`` rows, against plainly written recomputations (a replayed
canvas per step, a hand-binned ECE, scikit-learn's AUROC) on a tiny random masked LM.
"""

from __future__ import annotations

import math

import datasets
import lm_eval.evaluator
import numpy as np
import pytest
import torch
from lm_eval.api.instance import Instance
from sklearn.metrics import roc_auc_score

from conftest import save_tiny_bert
from lm_eval_probes import rows
from lm_eval_probes.models.diffusion_decoding import masked_diffusion_decode, trajectory_steps
from lm_eval_probes.models.diffusion import DiffusionProbeHFLM
from lm_eval_probes.records import ResponseProbe, probe_of
from lm_eval_probes.tasks.probe_task import ProbeTask, trajectory_confidence

PROMPTS = ["Question: Mia has 7 apples. She buys 5 more. How many now? Answer:", "The bear is red.", "0 1 2",
           "Anne is kind. If someone is kind then they are smart. Anne is"]
TRAJECTORY_ROWS = [name for name in rows.DIFFUSION_ROWS if name != "reveal_step"]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert-trajectory"), seed=3, special_tokens={"mask_token": "<|mask|>"})


def replayed_logprobs(model, prompt: list[int], tokens: list[int], reveal_steps: list[int], step: int, mask_id: int) -> list[float]:
    """One prompt alone: the canvas as it stood at ``step`` (tokens revealed at earlier steps, the rest masks), one
    forward, ln p of each final token."""
    canvas = [t if s < step else mask_id for t, s in zip(tokens, reveal_steps, strict=True)]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + canvas])).logits[0, len(prompt):].double()
    return [float(torch.log_softmax(logits[i], dim=-1)[t]) for i, t in enumerate(tokens)]


# ------------------------------------------------------------------------------------------ records

def test_trajectory_at_maps_percent_to_step_and_the_record_round_trips():
    probe = ResponseProbe(n_tokens=2, mean_token_logprob=-1.0, denoising_steps=8, trajectory_steps=(1, 3, 5, 7),
                          trajectory_token_logprobs=((-3.0, -2.0), (-2.0, -1.0), (-1.0, -0.5), (-0.5, -0.1)))
    assert [probe.trajectory_at(p) for p in (25, 50, 75, 100)] == list(probe.trajectory_token_logprobs)
    assert probe.trajectory_at(10) is None  # step 0 was not read
    assert ResponseProbe.from_dict(probe.to_dict()) == probe
    short = ResponseProbe(n_tokens=1, mean_token_logprob=-1.0, denoising_steps=2, trajectory_steps=trajectory_steps(2),
                          trajectory_token_logprobs=((-2.0,), (-1.0,)))
    assert [short.trajectory_at(p) for p in (25, 50, 75, 100)] == [(-2.0,), (-2.0,), (-1.0,), (-1.0,)]
    assert ResponseProbe(n_tokens=1, mean_token_logprob=-1.0).trajectory_at(50) is None
    for steps in range(1, 300):  # the model's steps (trajectory_steps of the fractions) hold every percent's step
        at = trajectory_steps(steps, [p / 100 for p in rows.TRAJECTORY_PERCENTS])
        record = ResponseProbe(n_tokens=1, mean_token_logprob=-1.0, denoising_steps=steps, trajectory_steps=at,
                               trajectory_token_logprobs=tuple((-float(s),) for s in at))
        assert at[-1] == steps - 1
        for percent in rows.TRAJECTORY_PERCENTS:
            assert record.trajectory_at(percent) == (-float(math.ceil(percent * steps / 100) - 1),)
    with pytest.raises(ValueError, match="percent"):
        probe.trajectory_at(0)


def test_trajectory_confidence_reads_the_answer_span():
    steps = ((-3.0, -2.0, -1.0, -0.5),)
    probe = ResponseProbe(n_tokens=4, mean_token_logprob=-1.0, denoising_steps=1, trajectory_steps=(0,),
                          trajectory_token_logprobs=steps, answer_span=(1, 3))
    assert trajectory_confidence(probe, 50) == pytest.approx(math.exp((-2.0 - 1.0) / 2))
    assert trajectory_confidence(probe, 50, whole=True) == pytest.approx(math.exp(-6.5 / 4))
    unlocated = ResponseProbe(**{**probe.__dict__, "answer_span": None})
    assert trajectory_confidence(unlocated, 100) == pytest.approx(math.exp(-6.5 / 4))
    assert trajectory_confidence(ResponseProbe(n_tokens=1, mean_token_logprob=0.0), 100) is None


def test_generation_records_hold_each_steps_probability_of_the_final_tokens(bert_dir):
    """Left-padded batches against each prompt replayed alone: at 25/50/75/100 % of 8 steps (steps 1, 3, 5, 7)."""
    lm = DiffusionProbeHFLM(pretrained=bert_dir, device="cpu", batch_size=4, probes="none", diffusion_gen_length=8,
                            diffusion_block_length=8, diffusion_steps=8)
    requests = [Instance("generate_until", {}, (p, {"until": ["<never>"], "max_gen_toks": 99, "do_sample": False}), idx=0,
                         metadata=("t", i, 1)) for i, p in enumerate(PROMPTS)]
    texts = lm.generate_until(requests)
    moved = False
    for prompt, text in zip(PROMPTS, texts, strict=True):
        probe = probe_of(text)
        n = probe.n_tokens
        assert probe.denoising_steps == 8 and probe.trajectory_steps == (1, 3, 5, 7)
        assert len(probe.trajectory_token_logprobs) == 4 and {len(r) for r in probe.trajectory_token_logprobs} == {n}
        ids = torch.tensor([lm.tok_encode(prompt)])
        alone = masked_diffusion_decode(lm._forward(None), ids, mask_token_id=lm.mask_token_id, gen_length=8,
                                        block_length=8, steps=8)
        canvas, reveal = alone.tokens[0].tolist(), alone.reveal_step[0].tolist()
        assert list(probe.reveal_steps) == reveal[:n]
        for row, step in zip(probe.trajectory_token_logprobs, probe.trajectory_steps, strict=True):
            want = replayed_logprobs(lm.model, ids[0].tolist(), canvas, reveal, step, lm.mask_token_id)[:n]
            np.testing.assert_allclose(row, want, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(probe.trajectory_token_logprobs[-1], probe.final_token_logprobs, rtol=0, atol=1e-12)
        at_reveal = [(probe.trajectory_token_logprobs[probe.trajectory_steps.index(s)][i], probe.token_logprobs[i])
                     for i, s in enumerate(probe.reveal_steps) if s in probe.trajectory_steps]
        assert at_reveal and all(a == pytest.approx(b, rel=1e-4, abs=1e-6) for a, b in at_reveal)
        moved |= not np.allclose(probe.trajectory_token_logprobs[0], probe.trajectory_token_logprobs[-1])
    assert moved  # the belief in the final tokens changes along the way


# ------------------------------------------------------------------------------------------ rows, end to end

def tiny_documents(**_: object) -> datasets.DatasetDict:
    questions = [f"{a} plus {b} is" for a in range(4) for b in range(4)]
    docs = [{"question": q, "answer": "1", "label": i % 2} for i, q in enumerate(questions)]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


class LabelledTask(ProbeTask):
    """A short generation task judged by each document's label (a random network is never right, so correctness
    comes from the documents: both classes, independent of the confidence)."""

    def correctness(self, doc, values, chosen):
        return int(doc["label"])


def labelled_task(**metadata) -> LabelledTask:
    return LabelledTask(config={
        "task": "trajectory_tiny", "custom_dataset": tiny_documents, "output_type": "generate_until", "test_split": "test",
        "doc_to_text": "{{question}}", "doc_to_target": "{{answer}}", "num_fewshot": 0,
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 8, "do_sample": False},
        "filter_list": [{"name": "token", "filter": [{"function": "regex", "regex_pattern": r"(\S+)"},
                                                      {"function": "take_first"}]}],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0, **metadata},
    })


def hand_ece(confidence: np.ndarray, correct: np.ndarray, bins: int = 15) -> float:
    """Equal-width bins (i/bins, (i+1)/bins], confidence 0 in the first: Σ_b n_b/n |acc_b − conf_b|."""
    index = np.clip(np.ceil(confidence * bins).astype(int) - 1, 0, bins - 1)
    total = 0.0
    for b in range(bins):
        inside = index == b
        if inside.any():
            total += inside.sum() / len(confidence) * abs(correct[inside].mean() - confidence[inside].mean())
    return total


def run(bert_dir: str, steps: int, **metadata) -> tuple[dict, LabelledTask, dict]:
    lm = DiffusionProbeHFLM(pretrained=bert_dir, device="cpu", batch_size=8, probes="none", diffusion_gen_length=8,
                            diffusion_block_length=8, diffusion_steps=steps)
    task = labelled_task(**metadata)
    out = lm_eval.evaluator.evaluate(lm, {"trajectory_tiny": task}, log_samples=True)
    return out["results"]["trajectory_tiny"], task, {s["doc_id"]: s for s in out["samples"]["trajectory_tiny"]}


def test_rows_against_sklearn_and_a_hand_binned_ece(bert_dir):
    results, task, samples = run(bert_dir, 8)
    assert {f"{name},token" for name in rows.DIFFUSION_ROWS} <= set(results)  # every diffusion row in a real run
    probes = {inst.doc_id: probe_of(inst.filtered_resps["token"]) for inst in task.instances}
    spans = [p.answer_span for p in probes.values()]
    assert any(s is not None and s != (0, p.n_tokens) for s, p in zip(spans, probes.values()))  # a real answer span
    labels = np.array([samples[d]["doc"]["label"] for d in sorted(probes)])
    assert set(labels) == {0, 1}
    for percent in rows.TRAJECTORY_PERCENTS:
        confidence = []
        for document in sorted(probes):
            probe = probes[document]
            step = math.ceil(percent * 8 / 100) - 1
            logprobs = np.array(probe.trajectory_token_logprobs[probe.trajectory_steps.index(step)])
            start, stop = probe.answer_span or (0, probe.n_tokens)
            confidence.append(math.exp(logprobs[start:stop].mean()))
            assert samples[document][f"ece_at_step_{percent}"] == pytest.approx([confidence[-1], labels[len(confidence) - 1]])
            assert samples[document][f"selective_auroc_at_step_{percent}"] == samples[document][f"ece_at_step_{percent}"]
            if percent == 100:  # the last step is the final denoising pass
                final = np.array(probe.final_token_logprobs)[start:stop]
                assert confidence[-1] == pytest.approx(math.exp(final.mean()), rel=1e-12)
        confidence = np.array(confidence)
        assert results[f"ece_at_step_{percent},token"] == pytest.approx(hand_ece(confidence, labels), rel=1e-9)
        assert results[f"selective_auroc_at_step_{percent},token"] == pytest.approx(roc_auc_score(labels, confidence), rel=1e-9)
    values = [results[f"selective_auroc_at_step_{p},token"] for p in rows.TRAJECTORY_PERCENTS]
    assert len(set(values)) > 1  # the steps differ: a row that read one step for all would fail above or here
    coarse, _, _ = run(bert_dir, 8, ece_bins=3)  # the task's ECE options apply to the trajectory rows too
    assert coarse["ece_at_step_50,token"] == pytest.approx(
        hand_ece(np.array([samples[d]["ece_at_step_50"][0] for d in sorted(probes)]), labels, bins=3), rel=1e-9)


def test_one_step_rows_equal_the_final_answer_rows(bert_dir):
    """With one denoising step every token is revealed by the final pass: each trajectory row is the answer row."""
    results, _, samples = run(bert_dir, 1)
    for percent in rows.TRAJECTORY_PERCENTS:
        assert results[f"ece_at_step_{percent},token"] == results["ece,token"]
        assert results[f"selective_auroc_at_step_{percent},token"] == results["selective_auroc,token"]
        for sample in samples.values():
            assert sample[f"ece_at_step_{percent}"] == pytest.approx(sample["ece"], rel=1e-12)


# ------------------------------------------------------------------------------------------ report figures

def test_denoising_figures_plot_the_rows_and_skip_tasks_without_them(tmp_path):
    from lm_eval_probes.reports.plots import denoising_curves, denoising_figures
    from lm_eval_probes.reports.reading import Metric, ModelResults, TaskResult

    ece, auroc = {25: 0.4, 50: 0.3, 75: None, 100: 0.1}, {25: 0.55, 50: 0.6, 75: 0.7, 100: 0.8}
    metrics = [Metric("exact_match", "strict", 0.5, 0.1, True), Metric("exact_match", "flex", 0.5, 0.1, True)]
    for filter_name, shift in (("strict", 0.0), ("flex", 0.05)):  # only the correctness filter (the first) is read
        metrics += [Metric(f"ece_at_step_{p}", filter_name, math.nan if v is None else v + shift, None, False)
                    for p, v in ece.items()]
        metrics += [Metric(f"selective_auroc_at_step_{p}", filter_name, v + shift, None, True) for p, v in auroc.items()]
    samples = tuple({"filter": "strict", "reveal_step": float(i), "ece": [0.1 * i, i % 2]} for i in range(6))
    diffusion = TaskResult("gen", "2026-12-01", tmp_path / "r.json", None, tuple(metrics), 6, {}, samples)
    plain = TaskResult("mc", "2026-12-01", tmp_path / "r.json", None, (Metric("exact_match", "none", 0.5, 0.1, True),), 6, {})
    percent, got_ece, got_auroc = denoising_curves(diffusion)
    assert percent.tolist() == [25, 50, 75, 100] and got_auroc.tolist() == [0.55, 0.6, 0.7, 0.8]
    assert got_ece[[0, 1, 3]].tolist() == [0.4, 0.3, 0.1] and math.isnan(got_ece[2])
    assert denoising_curves(plain) is None
    model = ModelResults("tiny-llada", "pretrained=x", None, {"gen": diffusion, "mc": plain})
    (figure,) = denoising_figures([model])
    assert figure.name == "denoising_gen" and figure.png.startswith(b"\x89PNG")
    assert denoising_figures([ModelResults("ar", "pretrained=y", None, {"mc": plain})]) == []
