"""A probe from a package of its own: the example plugin ``examples/probe-plugin`` (``hnorm``), found through the
entry-point group ``lm_eval_probes.probes`` with no edit inside ``lm_eval_probes``, runs under ``hf-probes`` next to
the built-ins, is written in the results and per document in ``--log_samples``, listed by ``--help`` and shown by the
report; and probes that cannot produce what they declare are refused when they register."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lm_eval_probes import registry
from lm_eval_probes.api import NoOptions, Probe, ProbeRegistrationError, Row
from plugin_fixtures import EXAMPLE_PLUGIN_SOURCE, installed_plugin
from test_capture import LL_REQUESTS, gen_instances, ll_instances

HNORM = {"hnorm": "lm_eval_probes_hnorm:PROBE"}


@pytest.fixture
def hnorm_installed(tmp_path: Path):
    with installed_plugin(tmp_path / "site", HNORM, [EXAMPLE_PLUGIN_SOURCE]):
        yield


def reference_norms(lm, context_ids: list[int], continuation_ids: list[int]) -> float:
    """Independent: the model's own ``output_hidden_states[-1]`` at the positions predicting the continuation."""
    with torch.no_grad():
        out = lm.model(torch.tensor([context_ids + continuation_ids]), output_hidden_states=True)
    last = out.hidden_states[-1][0].double()
    start = len(context_ids) - 1
    return float(last[start : start + len(continuation_ids)].norm(dim=-1).mean())


def test_the_example_plugin_registers_with_its_options_and_rows(hnorm_installed):
    from lm_eval_probes.config import ProbeConfig
    from lm_eval_probes.rows import ROWS_BY_NAME

    assert registry.names()[-1] == "hnorm" and "hnorm" in ProbeConfig.from_model_args({"probes": "all"}).probes
    assert ROWS_BY_NAME["hnorm"].field == "hnorm"
    config = ProbeConfig.from_model_args({"probes": "tcb+hnorm", "probe_hnorm_ord": "1"})
    assert config.options_of("hnorm").ord == 1.0
    with pytest.raises(ValueError, match="probe_hnorm_ord must be >= 1"):
        ProbeConfig.from_model_args({"probes": "hnorm", "probe_hnorm_ord": "0.5"})
    with pytest.raises(ValueError, match="Did you mean 'probe_hnorm_ord'"):
        ProbeConfig.from_model_args({"probes": "hnorm", "probe_hnorm_order": "1"})


def test_hnorm_equals_the_models_last_hidden_state_norms(hnorm_installed, tiny_model_dir):
    from lm_eval_probes.models.autoregressive import ProbeHFLM

    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2, probes="tcb+hnorm")
    answers = lm.loglikelihood(ll_instances()[:3])
    for (context, continuation), answer in zip(LL_REQUESTS, answers):
        context_ids, continuation_ids = lm._encode_pair(context, continuation)
        assert answer.probe.get("hnorm") == pytest.approx(reference_norms(lm, context_ids, continuation_ids), rel=1e-5)
        assert math.isfinite(answer.probe.get("tcb_log10_mean"))  # the built-in beside it
    text = lm.generate_until(gen_instances(until=["\n"], max_gen_toks=4)[:1])[0]
    assert text.probe.get("hnorm") > 0


def test_hnorm_runs_on_a_masked_diffusion_lm_and_the_lens_probes_are_refused(hnorm_installed, tmp_path):
    """``hf-probes-diffusion`` names no probe: a plugin probe that reads states only runs there, at a loglikelihood
    request's continuation positions of one forward over the unmasked request (a bidirectional pass: no shift)."""
    from conftest import save_tiny_bert

    from lm_eval_probes.models.diffusion import DiffusionProbeHFLM, supported_probes

    bert = save_tiny_bert(tmp_path / "bert", seed=7, special_tokens={"mask_token": "<|mask|>"})
    assert "hnorm" in supported_probes() and "tcb" not in supported_probes()
    lm = DiffusionProbeHFLM(pretrained=bert, device="cpu", batch_size=2, probes="reader+hnorm",
                            diffusion_mc_samples=2)
    (context, continuation), = LL_REQUESTS[:1]
    answer, = lm.loglikelihood(ll_instances()[:1])
    context_ids, continuation_ids = lm._encode_pair(context, continuation)
    with torch.no_grad():
        out = lm.model(torch.tensor([context_ids + continuation_ids]), output_hidden_states=True)
    want = float(out.hidden_states[-1][0, len(context_ids):].double().norm(dim=-1).mean())
    assert answer.probe.get("hnorm") == pytest.approx(want, rel=1e-5)
    assert answer.probe.get("answer_states") is not None  # the reader beside it
    with pytest.raises(ValueError, match="supports probes"):
        DiffusionProbeHFLM(pretrained=bert, device="cpu", probes="tcb+hnorm")


def test_hnorm_in_results_samples_help_and_report(hnorm_installed, tiny_model_dir, tmp_path):
    """The user's path: a run with probes=tcb+hnorm and --log_samples, --help, and the report."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker

    import lm_eval_probes
    from lm_eval_probes.__main__ import plugin_help
    from lm_eval_probes.models.autoregressive import ProbeHFLM

    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=4, probes="tcb+hnorm")
    tracker = EvaluationTracker(output_path=str(tmp_path / "run"))
    results = lm_eval.simple_evaluate(model=lm, tasks=["probes_synth_logic"], limit=6, log_samples=True,
                                      evaluation_tracker=tracker,
                                      task_manager=lm_eval_probes.ProbeTaskManager(include_path=lm_eval_probes.tasks_dir()))
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    tracker.save_results_samples(task_name="probes_synth_logic", samples=samples["probes_synth_logic"])
    row = results["results"]["probes_synth_logic"]
    values = []
    for sample in samples["probes_synth_logic"]:  # per document: the chosen option's value
        logliks = [resp[0][0] for resp in sample["resps"]]
        chosen = max(range(len(logliks)), key=lambda i: (logliks[i], -i))
        arguments = sample["arguments"]  # lm_eval 0.4.13: {"gen_args_0": {"arg_0": context, "arg_1": continuation}, …}
        context, continuation = list(arguments.values())[chosen].values() if isinstance(arguments, dict) \
            else arguments[chosen]
        want = reference_norms(lm, *lm._encode_pair(context, continuation))
        assert sample["hnorm"] == pytest.approx(want, rel=1e-5)
        values.append(sample["hnorm"])
    assert row["hnorm,none"] == pytest.approx(sum(values) / len(values), rel=1e-9)
    written = list((tmp_path / "run").rglob("samples_probes_synth_logic_*.jsonl"))
    assert written and all("hnorm" in json.loads(line) for line in written[0].read_text().splitlines())

    help_text = plugin_help("TASKS")
    assert "hnorm" in help_text and "probe_hnorm_ord=2.0" in help_text and "example plugin" in help_text

    # the report as a user runs it: a new process, the plugin installed (its distribution and source on the path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(EXAMPLE_PLUGIN_SOURCE)])}
    done = subprocess.run([sys.executable, "-m", "lm_eval_probes", "report", str(tmp_path / "run"), "--out",
                           str(tmp_path / "report")], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    page = (tmp_path / "report" / "index.html").read_text()
    assert "hnorm" in (tmp_path / "report" / "leaderboard.md").read_text()
    assert "mean L2 norm of the last hidden state over the response positions" in page
    (export,) = (tmp_path / "report" / "every_eval_ever").rglob("*.json")  # its declared bounds: a norm, 0 or more
    (hnorm,) = [r["metric_config"] for r in json.loads(export.read_text())["evaluation_results"]
                if r["metric_config"]["metric_name"] == "hnorm"]
    assert (hnorm["min_score"], hnorm["max_score"]) == (0.0, "Infinity")


# ----------------------------------------------------------------------------- no silent probe


class _Nothing:
    reads_lens = False
    position_axis = 0

    def __init__(self, options, num_layers):
        pass

    def layers(self):
        return frozenset()

    def at_positions(self, chunk):
        return {}

    def reduce(self, values, *, positions, generation):
        return {}


@dataclasses.dataclass(frozen=True)
class _ToyRecord:
    toy_other: float | None = None


@dataclasses.dataclass(frozen=True)
class _UnsetRecord:
    toy_value: float


def _probe(**overrides) -> Probe:
    spec = dict(name="toy", summary="a toy", fields=("toy_value",), position_probe=_Nothing,
                rows=(Row("toy", "float", "mean", True, "probe", "a toy row", "toy_value"),))
    spec.update(overrides)
    return Probe(**spec)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"rows": (Row("toy", "float", "mean", True, "probe", "reads nothing declared", "toy_other"),)},
     r"probe 'toy', row 'toy': reads record field 'toy_other'"),
    ({"rows": (Row("toy", "float", "mean", True, "probe", "no field", None),)}, r"probe 'toy', row 'toy'"),
    ({"position_probe": None}, r"probe 'toy': rows \['toy'\] read fields that no capture fills"),
    ({"ranked": "toy_rank"}, r"probe 'toy': ranked field 'toy_rank' is not in its fields"),
    ({"name": "Toy Probe"}, r"probe name 'Toy Probe'"),
    ({"name": "all"}, r"reserved"),
    ({"options": dict}, r"options must be a ProbeOptions dataclass"),
    ({"rows": (Row("toy", "float", "mean", True, "confidence", "wrong family", "toy_value"),)}, r"family 'probe'"),
    ({"record": _ToyRecord}, r"probe 'toy': fields \('toy_value',\) differ from its record _ToyRecord's \('toy_other',\)"),
    ({"fields": (), "record": _UnsetRecord}, r"probe 'toy': record _UnsetRecord's fields \['toy_value'\] need a default"),
    ({"fields": (), "record": dict}, r"probe 'toy': record must be a dataclass"),
])
def test_a_probe_that_cannot_produce_its_rows_is_refused(overrides, message):
    with pytest.raises(ProbeRegistrationError, match=message):
        _probe(**overrides)


def test_a_rows_bounds_default_to_unbounded_and_must_be_an_interval():
    assert Row("toy", "float", "mean", True, "probe", "x", "toy_value").bounds == (-math.inf, math.inf)
    assert Row("toy", "float", "mean", True, "probe", "x", "toy_value", bounds=(0, math.inf)).bounds == (0.0, math.inf)
    for bad in ((1.0, 0.0), (0.5, 0.5), (0.0, math.nan), (0.0,), (0.0, "1"), (False, 1.0), None):
        with pytest.raises(ValueError, match=r"row 'toy': bounds must be \(low, high\)"):
            Row("toy", "float", "mean", True, "probe", "x", "toy_value", bounds=bad)


def test_row_names_clash_with_another_probes_and_the_plugins_own_rows():
    builtin = registry.probes()
    with pytest.raises(ProbeRegistrationError, match=r"probe 'toy', row 'tcb_log10': the name is already probe 'tcb'"):
        registry.validated([*builtin, _probe(rows=(Row("tcb_log10", "float", "mean", True, "probe", "x", "toy_value"),))])
    with pytest.raises(ProbeRegistrationError, match=r"row 'ece': the name is already the plugin's own rows"):
        registry.validated([_probe(rows=(Row("ece", "float", "mean", True, "probe", "x", "toy_value"),))],
                           reserved_rows=["ece"])
    with pytest.raises(ProbeRegistrationError, match=r"record field 'entropy' is already probe 'tcb'"):
        registry.validated([*builtin, _probe(fields=("entropy",), rows=())])
    with pytest.raises(ProbeRegistrationError, match="registered twice"):
        registry.validated([*builtin, _probe(name="tcb", fields=("toy_value",))])


def test_a_row_named_like_an_lm_eval_metric_is_refused(tmp_path):
    toy = tmp_path / "src" / "toy_probe.py"
    toy.parent.mkdir(parents=True)
    toy.write_text(
        "from lm_eval_probes.api import Probe, Row\n"
        "class Nothing:\n    reads_lens = False\n    position_axis = 0\n"
        "PROBE = Probe(name='toy', summary='a toy', fields=('toy_value',), position_probe=Nothing,\n"
        "              rows=(Row('acc_mutual_info', 'float', 'mean', True, 'probe', 'x', 'toy_value'),))\n")
    from lm_eval_probes.harness.registry import register_rows

    with installed_plugin(tmp_path / "site", {"toy": "toy_probe:PROBE"}, [toy.parent]):
        with pytest.raises(ProbeRegistrationError, match=r"probe 'toy', row 'acc_mutual_info': lm_eval already has"):
            register_rows()
    register_rows()  # the built-ins again


def test_a_broken_or_misnamed_entry_point_is_named(tmp_path):
    with installed_plugin(tmp_path / "site", {"broken": "no_such_module_anywhere:PROBE"}):
        with pytest.raises(ProbeRegistrationError, match=r"probe entry point 'broken' .* failed to load"):
            registry.probes()
    with installed_plugin(tmp_path / "site2", {"other": "lm_eval_probes_hnorm:PROBE"}, [EXAMPLE_PLUGIN_SOURCE]):
        with pytest.raises(ProbeRegistrationError, match="holds probe 'hnorm'"):
            registry.probes()


def test_a_probe_without_a_ranked_field_still_gets_its_float_rows(hnorm_installed):
    """The silent case of old: float rows were only written inside the ranked branch."""
    from lm_eval_probes.records import ResponseProbe
    from lm_eval_probes.tasks.probe_task import probe_metric_values

    assert registry.probe("hnorm").ranked is None and NoOptions().requiring_probe("x") == []
    values = probe_metric_values(ResponseProbe(n_tokens=2, mean_token_logprob=-0.5, hnorm=3.0), 0.5, 1.0, declared=True)
    assert values["hnorm"] == 3.0 and "hnorm_spearman" not in values
    undefined = probe_metric_values(ResponseProbe(n_tokens=0, mean_token_logprob=math.nan, hnorm=math.nan), 0.5, None)
    assert "hnorm" not in undefined  # nan (no positions) is left out of the mean, as a ranked probe's rows are
