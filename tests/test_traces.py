"""Per-token traces (``probe_traces=true``): what each document of the samples carries, checked against the document's
own logged values — the chosen option's log-likelihood, and each probe's per-document value as its declared
reduction (:class:`~lm_eval_probes.api.TraceField`) of its trace."""

from __future__ import annotations

import math
from pathlib import Path

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
def samples(tiny_model_dir, tmp_path_factory) -> dict[str, list[dict]]:
    from lm_eval_probes.models.autoregressive import ProbeHFLM

    data_dir = write_data_dir(tmp_path_factory.mktemp("data"), n=8)
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2, probes=PROBES, probe_traces="true",
                   probe_bte_profile="full")
    manager = ProbeTaskManager(include_path=TASKS_DIR, metadata={"probes_data_dir": str(data_dir)})
    task_dict = lm_eval.tasks.get_task_dict(["probes_synth_logic", "probes_synth_arith_gen"], manager)
    out = lm_eval.evaluator.evaluate(lm, task_dict, limit=4, log_samples=True)
    return out["samples"]


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


def test_a_record_with_a_trace_round_trips_through_its_dict():
    probe = ResponseProbe(n_tokens=2, mean_token_logprob=-0.5, trace={"tokens": ["a", "b"], "logprob": [-0.4, -0.6]})
    assert ResponseProbe.from_dict(probe.to_dict()).trace == probe.trace
    assert "trace" not in ResponseProbe(n_tokens=1, mean_token_logprob=-0.5).to_dict()


def test_the_diffusion_wrapper_refuses_traces_before_loading():
    from lm_eval_probes.models.diffusion import DiffusionProbeHFLM

    with pytest.raises(ValueError, match="probe_traces=true is an hf-probes option"):
        DiffusionProbeHFLM(pretrained="/nowhere", probe_traces="true", probes="none")
