"""Adding a probe is one object of the public API (:mod:`lm_eval_probes.api`) registered by entry point: a toy probe
declared in this file alone is accepted by ``probes=``, captured by ``hf-probes`` at the response positions, carried by
the records (``get``, ``to_dict``/``from_dict``, pickling) and given its rows' per-document values and its ρ rows — by
the code that runs the built-ins.
"""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from lm_eval_probes import declarations
from lm_eval_probes.api import Probe, Row
from lm_eval_probes.capture.positions import LensChunk
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.models.autoregressive import ProbeHFLM
from lm_eval_probes.records import ResponseProbe
from lm_eval_probes.tasks.probe_task import probe_metric_values
from plugin_fixtures import installed_plugin
from test_capture import LL_REQUESTS, gen_instances, ll_instances


class TopProbability:
    """The toy probe's capture: per position the top-1 probability of the model's own next-token distribution; per
    response its mean."""

    reads_lens = True
    position_axis = -1

    def __init__(self, options: object, num_layers: int) -> None:
        self.num_layers = num_layers

    def layers(self) -> frozenset[int]:
        return frozenset({self.num_layers})

    def at_positions(self, chunk: LensChunk) -> dict[str, torch.Tensor]:
        return {"top1": torch.softmax(chunk.final_logits, dim=-1).amax(-1)}

    def reduce(self, values, *, positions: int, generation: bool) -> dict[str, float]:
        return {"toy_top1_mean": float(values["top1"].double().mean()) if positions else math.nan}


TOY = Probe(
    name="toy",
    summary="top-1 probability of the final distribution",
    paper="(a test)",
    formula="max_i softmax(z)_i per response position; per document the mean",
    reads="the final layer's state at every response position",
    fields=("toy_top1_mean",),
    position_probe=TopProbability,
    rows=(Row("toy_top1", "float", "mean", True, "probe", "mean over documents of the mean top-1 probability",
              "toy_top1_mean"),),
    ranked="toy_top1_mean",
    ranked_text="the mean top-1 probability",
)


@pytest.fixture
def toy_declared(tmp_path):
    """``TOY`` installed as a plugin (an entry point of group ``lm_eval_probes.probes``)."""
    with installed_plugin(tmp_path, {"toy": f"{__name__}:TOY"}):
        yield


def test_an_undeclared_field_is_refused():
    with pytest.raises(TypeError, match="toy_top1_mean"):
        ResponseProbe(n_tokens=1, mean_token_logprob=0.0, toy_top1_mean=0.5)
    with pytest.raises(KeyError, match="toy_top1_mean"):
        ResponseProbe(n_tokens=1, mean_token_logprob=0.0).get("toy_top1_mean")


def test_a_probe_declared_here_is_captured_recorded_and_given_its_rows(toy_declared, tiny_model_dir):
    assert ProbeConfig.from_model_args({"probes": "all"}).probes[-1] == "toy"
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2, probes="toy")
    assert lm.plan.read_layers == {lm.readout.num_layers}
    requests = ll_instances()[:3]
    answers = lm.loglikelihood(requests)
    for (context, continuation), answer in zip(LL_REQUESTS, answers):
        context_ids, continuation_ids = lm._encode_pair(context, continuation)
        with torch.no_grad():  # independent: the model's own logits at the response positions
            logits = lm.model(torch.tensor([context_ids + continuation_ids])).logits[0]
        start = len(context_ids) - 1
        want = torch.softmax(logits[start : start + len(continuation_ids)].double(), -1).amax(-1).mean()
        probe = answer.probe
        assert probe.get("toy_top1_mean") == pytest.approx(float(want), rel=1e-5)
        assert isinstance(probe.of("toy"), TOY.record) and probe.of("toy").toy_top1_mean == probe.get("toy_top1_mean")
        assert probe.get("tcb_log10_mean") is None and probe.get("answer_states") is None  # the other probes stay off
        assert ResponseProbe.from_dict(probe.to_dict()) == probe == pickle.loads(pickle.dumps(probe))
        values = probe_metric_values(probe, 0.5, 2.0, declared=True)
        assert values["toy_top1"] == probe.get("toy_top1_mean")
        assert values["toy_spearman"] == (probe.get("toy_top1_mean"), 2.0)
        assert values["toy_spearman_partial"] == (probe.get("toy_top1_mean"), 2.0, len(continuation_ids))
    generated = lm.generate_until(gen_instances(until=["\n"], max_gen_toks=4)[:1])[0]
    assert 0.0 < generated.probe.get("toy_top1_mean") <= 1.0
    assert TOY.row("float") in declarations.probe_rows() and TOY.difficulty_rows()[0] in declarations.difficulty_rows()
