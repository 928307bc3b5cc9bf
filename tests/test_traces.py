"""Per-token traces (``probe_traces=true``): what each document of the samples carries, checked against the document's
own logged values — the chosen option's log-likelihood, and each probe's per-document value as its declared
reduction (:class:`~lm_eval_probes.api.TraceField`) of its trace."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lm_eval.evaluator
import lm_eval.tasks
import pytest

from loader_fixtures import write_data_dir
from lm_eval_probes import TASKS_DIR, registry
from lm_eval_probes.api import Probe, ProbeRegistrationError, TraceField
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.estimators import chosen_option
from lm_eval_probes.records import ResponseProbe, trace_values
from lm_eval_probes.tasks.manager import ProbeTaskManager

PROBES = "tcb+bte+omega+margin"


def ascii_of(text: str) -> str:
    return text.encode("ascii", "ignore").decode()


def test_a_trace_field_reduces_its_finite_values():
    values = [1.0, None, 3.0, math.nan, -2.0]
    assert TraceField("x", "x_mean").reduce(values) == pytest.approx(2.0 / 3.0)
    assert TraceField("x", "x_min", "min").reduce(values) == -2.0
    assert math.isnan(TraceField("x", "x_mean").reduce([None, math.nan]))
    with pytest.raises(ValueError, match="unknown reduction 'median'"):
        TraceField("x", "x", "median")
    with pytest.raises(ProbeRegistrationError, match="trace"):
        Probe(name="traced", summary="s", fields=("a",), traces=(TraceField("a", "b"),))


def test_trace_values_keep_four_significant_digits():
    assert trace_values([123456.0, -0.000123456, math.nan, math.inf]) == [123500.0, -0.0001235, None, None]


def test_traces_are_off_by_default_and_part_of_the_configuration():
    assert ProbeConfig().traces is False
    traced = ProbeConfig.from_model_args({"probe_traces": "true"})
    assert traced.traces is True and repr(traced) != repr(ProbeConfig())  # the --use_cache table's fingerprint
    with pytest.raises(ValueError, match="probe_traces must be 1/0"):
        ProbeConfig.from_model_args({"probe_traces": "maybe"})


@pytest.fixture(scope="module")
def evaluated(tiny_model_dir, tmp_path_factory) -> tuple[Any, dict[str, list[dict]]]:
    """The wrapper (``probe_traces=true``, every layer kept: BTE's full profile) and the samples of its run."""
    from lm_eval_probes.models.autoregressive import ProbeHFLM

    data_dir = write_data_dir(tmp_path_factory.mktemp("data"), n=8)
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2, probes=PROBES, probe_traces="true",
                   probe_bte_profile="full")
    manager = ProbeTaskManager(include_path=TASKS_DIR, metadata={"probes_data_dir": str(data_dir)})
    task_dict = lm_eval.tasks.get_task_dict(["probes_synth_logic", "probes_synth_arith_gen"], manager)
    out = lm_eval.evaluator.evaluate(lm, task_dict, limit=4, log_samples=True)
    return lm, out["samples"]


@pytest.fixture(scope="module")
def samples(evaluated) -> dict[str, list[dict]]:
    return evaluated[1]


def test_a_multiple_choice_trace_is_the_chosen_option(samples):
    for line in samples["probes_synth_logic"]:
        trace = line["trace"]
        logliks = [resp[0] for resp in line["filtered_resps"]]
        chosen, _ = chosen_option(logliks, None)
        assert len(trace["tokens"]) == len(trace["logprob"]) == line["response_tokens"] > 0
        assert math.fsum(trace["logprob"]) == pytest.approx(logliks[chosen], abs=1e-3)
        assert all(isinstance(token, str) for token in trace["tokens"])
        # the margins cover every position the model saw: the prompt, then the response's inputs
        assert len(trace["margin"]) == len(trace["sequence_tokens"]) > len(trace["tokens"])


def test_a_generation_trace_covers_its_kept_tokens(samples):
    for line in samples["probes_synth_arith_gen"]:
        trace = line["trace"]
        assert len(trace["tokens"]) == len(trace["logprob"]) == len(trace["tcb_log10"]) == line["response_tokens"]
        assert all(value <= 0 for value in trace["logprob"])
        if not line["empty_responses"]:  # the kept text, token by token (a character split over tokens decodes apart)
            assert ascii_of("".join(trace["tokens"])) == ascii_of(line["resps"][0][0])


@pytest.mark.parametrize("task", ["probes_synth_logic", "probes_synth_arith_gen"])
def test_each_per_document_value_is_its_declared_reduction_of_the_trace(samples, task):
    checked = set()
    for line in samples[task]:
        trace = line["trace"]
        for probe in registry.probes():
            for field in probe.traces:
                rows = [row for row in probe.rows if row.field == field.field and row.value == "float"]
                for row in rows:
                    if row.name not in line:
                        continue
                    assert field.name in trace, (row.name, sorted(trace))
                    assert field.reduce(trace[field.name]) == pytest.approx(line[row.name], rel=1e-3, abs=1e-3), row.name
                    checked.add(row.name)
    assert checked >= {"tcb_log10", "tcb_log10_min", "bte_energy", "omega", "margin", "margin_min"}


def test_every_trace_has_its_lens_grid(evaluated):
    """``lens``: three ``[kept layer][position]`` arrays (every layer 0..L here), probabilities in [0, 1], the top
    token's at least the emitted one's; at the last layer ``emitted_prob`` is the model's own probability of the token
    (``exp(logprob)``); the commitment layer is where the top token stays the emitted one up to L."""
    lm, samples = evaluated
    num_layers = lm.model.config.num_hidden_layers
    for task in ("probes_synth_logic", "probes_synth_arith_gen"):
        for line in samples[task]:
            trace = line["trace"]
            lens, layers, n = trace["lens"], trace["lens_layers"], len(trace["tokens"])
            assert layers == list(range(num_layers + 1)) and trace["focal_depth"] == min(5, num_layers)  # Ω's default m
            for name in ("top_token", "top_prob", "emitted_prob"):
                assert len(lens[name]) == len(layers) and all(len(row) == n for row in lens[name]), name
            for top_row, emitted_row in zip(lens["top_prob"], lens["emitted_prob"], strict=True):
                assert all(0 <= e <= t * (1 + 1e-3) <= 1 + 1e-3 for t, e in zip(top_row, emitted_row, strict=True))
            assert lens["emitted_prob"][-1] == pytest.approx([math.exp(v) for v in trace["logprob"]], rel=2e-3)
            assert set(trace["lens_tokens"]) == {str(t) for row in lens["top_token"] for t in row}
            for position, commit in enumerate(lens["commit_layer"]):
                final_is_emitted = math.isclose(lens["top_prob"][-1][position], lens["emitted_prob"][-1][position],
                                                rel_tol=1e-3)
                assert (commit is None) == (not final_is_emitted)


def test_the_lens_grid_is_the_teacher_forced_lens(evaluated):
    """Each option a multiple-choice trace shows (the chosen one), recomputed by one teacher-forced forward of the
    whole model over context + option: at every layer the probability of the emitted token under
    ``softmax(lm_head(norm(h_l)))`` (l = L: the model's own logits), and the top token's."""
    import torch

    lm, samples = evaluated
    model = lm.model
    checked = 0
    for line in samples["probes_synth_logic"]:
        trace, lens = line["trace"], line["trace"]["lens"]
        logliks = [resp[0] for resp in line["filtered_resps"]]
        chosen, _ = chosen_option(logliks, None)
        context, continuation = line["arguments"][chosen]
        context_ids, continuation_ids = lm._encode_pair(context, continuation)
        ids = torch.tensor([context_ids + continuation_ids][0][:-1]).unsqueeze(0)
        n = len(continuation_ids)
        with torch.no_grad():
            out = model(ids, output_hidden_states=True)
        emitted = torch.tensor(continuation_ids)
        for row, layer in enumerate(trace["lens_layers"]):
            hidden = out.hidden_states[layer][0, -n:]
            logits = out.logits[0, -n:] if layer == model.config.num_hidden_layers else model.lm_head(model.model.norm(hidden))
            probs = torch.softmax(logits.double(), dim=-1)
            assert lens["emitted_prob"][row] == pytest.approx(probs.gather(-1, emitted[:, None]).squeeze(-1).tolist(),
                                                              rel=2e-3, abs=1e-7)
            assert lens["top_prob"][row] == pytest.approx(probs.max(-1).values.tolist(), rel=2e-3)
            top = torch.tensor(lens["top_token"][row])
            assert probs.gather(-1, top[:, None]).squeeze(-1).tolist() == pytest.approx(lens["top_prob"][row], rel=2e-3)
        checked += 1
    assert checked == 4


def test_a_record_with_a_trace_round_trips_through_its_dict():
    probe = ResponseProbe(n_tokens=2, mean_token_logprob=-0.5, trace={"tokens": ["a", "b"], "logprob": [-0.4, -0.6]})
    assert ResponseProbe.from_dict(probe.to_dict()).trace == probe.trace
    assert "trace" not in ResponseProbe(n_tokens=1, mean_token_logprob=-0.5).to_dict()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_lens_grid_is_the_same_whichever_probe_read_the_layers_out(tiny_model_dir, dtype):
    """The grid of a span's kept layers: read out for the grid alone (δ_TCB keeps only L), noted while BTE reads
    every layer out (one by one; a bfloat16 unembedding several layers per pass over W), and computed here from
    the states with the model's own final norm and head — the same cells."""
    import torch
    import transformers as tf

    from lm_eval_probes.capture.positions import position_probes
    from lm_eval_probes.capture.readouts import LensReadout

    model = tf.AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama"), dtype=getattr(torch, dtype)).eval()
    ids = torch.arange(3, 3 + 14).unsqueeze(0)  # 9 positions in chunks of 4: the last one alone (grouped in bfloat16)
    with torch.no_grad():
        states = [h[0, 5:] for h in model(ids, output_hidden_states=True).hidden_states]
    emitted = ids[0, 6:].tolist() + [7]
    readout = LensReadout(model)
    grids = {}
    for probes in ("tcb", "bte"):
        config = ProbeConfig.from_model_args({"probes": probes, "probe_traces": "true", "probe_bte_profile": "full",
                                             "probe_chunk_positions": "4"})
        kept = states if probes == "bte" else [h if layer in (1, len(states) - 1) else None for layer, h in enumerate(states)]
        grids[probes] = position_probes(kept, readout, config, torch.tensor(emitted)).lens
    assert grids["tcb"].layers == (1, len(states) - 1) and grids["bte"].layers == tuple(range(len(states)))
    with torch.no_grad():
        for row, layer in enumerate(grids["bte"].layers):
            hidden = states[layer] if layer == len(states) - 1 else model.model.norm(states[layer])
            probs = torch.softmax(model.lm_head(hidden).double(), dim=-1)
            torch.testing.assert_close(grids["bte"].emitted_prob[row].double(),
                                       probs.gather(-1, torch.tensor(emitted)[:, None]).squeeze(-1),
                                       rtol=2e-2 if dtype == "bfloat16" else 1e-5, atol=1e-6)
            torch.testing.assert_close(grids["bte"].top_prob[row].double(), probs.max(-1).values,
                                       rtol=2e-2 if dtype == "bfloat16" else 1e-5, atol=1e-6)
    for name in ("top_prob", "emitted_prob"):
        both = getattr(grids["bte"], name)[[1, -1]]
        torch.testing.assert_close(getattr(grids["tcb"], name), both, rtol=1e-5, atol=1e-7)
    assert torch.equal(grids["tcb"].top_token, grids["bte"].top_token[[1, -1]])


def test_the_lens_grid_reads_out_no_layer_twice(tiny_model_dir):
    """With BTE's full profile every layer is read out by the probes already: the grid adds no readout of its own
    (the same number of unembedding products with and without traces); with δ_TCB alone it adds one per kept layer
    below L."""
    import torch
    import transformers as tf

    from lm_eval_probes.capture.positions import position_probes
    from lm_eval_probes.capture.readouts import LensReadout

    model = tf.AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama")).eval()
    ids = torch.arange(3, 3 + 12).unsqueeze(0)
    with torch.no_grad():
        states = [h[0, 4:] for h in model(ids, output_hidden_states=True).hidden_states]
    emitted = torch.tensor(ids[0, 5:].tolist() + [9])
    readout = LensReadout(model)
    calls = []
    logits = readout.logits
    readout.logits = lambda *args, **kwargs: calls.append(1) or logits(*args, **kwargs)  # type: ignore[method-assign]

    def readouts(probes: str, traces: str, kept: list) -> int:
        calls.clear()
        config = ProbeConfig.from_model_args({"probes": probes, "probe_traces": traces, "probe_bte_profile": "full"})
        position_probes(kept, readout, config, emitted)
        return len(calls)

    assert readouts("bte", "true", states) == readouts("bte", "false", states) > 0
    sparse = [h if layer in (0, 2, len(states) - 1) else None for layer, h in enumerate(states)]
    assert readouts("tcb", "true", sparse) == readouts("tcb", "false", sparse) + 2
