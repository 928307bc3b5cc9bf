"""``probe_tcb_ablation``: the cluster/disperse ablation captured in the harness's own passes equals the moved
unembedding itself, applied to a teacher-forced pass's final states."""

from __future__ import annotations

import math

import pytest
import torch
from lm_eval.api.instance import Instance

from conftest import TINY_ARCHS
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.models.autoregressive import ProbeHFLM
from test_probes_tcb import moved_reference

ALPHA = 0.5
PROMPTS = ["Question: Mia has 7 apples. Answer:", "Anne is kind.", "The cat is big. All smart people are quiet. The bear"]
LL_REQUESTS = [("Question: Mia has 7 apples.", " True"), ("The bear", " is red"), ("0 1 2 3", " 4 5 6 7")]


def reference(lm: ProbeHFLM, context_ids: list[int], response_ids: list[int]) -> tuple[float, float, float]:
    """(mean log10 δ_cluster, mean log10 δ_disperse, fraction ordered) over the response positions, from one
    unpadded teacher-forced pass and the moved unembedding built row by row (:func:`moved_reference`)."""
    ids = torch.tensor([context_ids + response_ids])
    with torch.no_grad():
        out = lm.model(ids, output_hidden_states=True)
    head = lm.model.get_output_embeddings()
    weight = head.weight.detach().double()
    bias = None if getattr(head, "bias", None) is None else head.bias.detach().double()
    softcap = getattr(lm.model.config, "final_logit_softcapping", None)
    start = len(context_ids) - 1
    cluster, disperse, ordered = [], [], []
    for position in range(start, start + len(response_ids)):
        h = out.hidden_states[-1][0, position].double()
        values = [math.log10(moved_reference(h, weight, bias, scale=scale, softcap=softcap))
                  for scale in (ALPHA, 1.0, 1.0 / ALPHA)]
        cluster.append(values[0])
        disperse.append(values[2])
        ordered.append(float(values[0] > values[1] > values[2]))
    n = len(response_ids)
    return sum(cluster) / n, sum(disperse) / n, sum(ordered) / n


def assert_ablation(probe, want: tuple[float, float, float]) -> None:
    cluster, disperse, ordered = want
    assert probe.get("tcb_cluster_log10_mean") == pytest.approx(cluster, abs=2e-5)
    assert probe.get("tcb_disperse_log10_mean") == pytest.approx(disperse, abs=2e-5)
    assert probe.get("tcb_ablation_ordered") == pytest.approx(ordered)


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("batch_size", [1, 3])
def test_loglikelihood_ablation_equals_the_moved_unembedding(tiny_model_dir, arch, batch_size):
    lm = ProbeHFLM(pretrained=tiny_model_dir(arch), device="cpu", batch_size=batch_size, probes="tcb",
                   probe_tcb_ablation=ALPHA)
    instances = [Instance("loglikelihood", {}, req, 0, ("t", i, 1)) for i, req in enumerate(LL_REQUESTS)]
    for (context, continuation), answer in zip(LL_REQUESTS, lm.loglikelihood(instances)):
        assert_ablation(answer.probe, reference(lm, *lm._encode_pair(context, continuation)))


@pytest.mark.parametrize("batch_size", [1, 3])
def test_one_token_generation_ablation_is_the_next_token_prediction(tiny_model_dir, batch_size):
    """max_gen_toks=1, the reproduction's next-token prompts: one position, the prompt's last."""
    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=batch_size, probes="tcb",
                   probe_tcb_ablation=ALPHA)
    kwargs = {"until": ["\n\n\n"], "max_gen_toks": 1, "do_sample": False}
    instances = [Instance("generate_until", {}, (p, dict(kwargs)), 0, ("t", i, 1)) for i, p in enumerate(PROMPTS)]
    for prompt, text in zip(PROMPTS, lm.generate_until(instances)):
        ids = lm.tok_batch_encode([prompt])[0][0].tolist()
        with torch.no_grad():
            greedy = int(lm.model(torch.tensor([ids])).logits[0, -1].argmax())
        assert text.probe.n_tokens == 1
        assert_ablation(text.probe, reference(lm, ids, [greedy]))
        assert text.probe.get("tcb_ablation_ordered") in (0.0, 1.0)


def test_without_the_option_nothing_is_computed_and_no_row_is_reported(tiny_model_dir):
    from lm_eval_probes.tasks.probe_task import probe_metric_values

    lm = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2, probes="tcb")
    (answer,) = lm.loglikelihood([Instance("loglikelihood", {}, LL_REQUESTS[0], 0, ("t", 0, 1))])
    probe = answer.probe
    assert probe.get("tcb_cluster_log10_mean") is None and probe.get("tcb_ablation_ordered") is None
    values = probe_metric_values(probe, 0.5, None)
    assert "tcb_log10" in values and not {"tcb_ablation_ordered", "tcb_cluster_log10", "tcb_disperse_log10"} & set(values)
    ablated = ProbeHFLM(pretrained=tiny_model_dir("llama"), device="cpu", batch_size=2, probes="tcb",
                        probe_tcb_ablation="0.25")
    (answer,) = ablated.loglikelihood([Instance("loglikelihood", {}, LL_REQUESTS[0], 0, ("t", 0, 1))])
    values = probe_metric_values(answer.probe, 0.5, None)
    assert {"tcb_ablation_ordered", "tcb_cluster_log10", "tcb_disperse_log10"} <= set(values)
    assert answer.probe.get("tcb_log10_mean") == probe.get("tcb_log10_mean")  # the ablation leaves δ itself alone


@pytest.mark.parametrize("args,match", [
    ({"probes": "tcb", "probe_tcb_ablation": "1.5"}, "probe_tcb_ablation must be a factor 0 < α < 1"),
    ({"probes": "tcb", "probe_tcb_ablation": "-0.5"}, "probe_tcb_ablation must be a factor 0 < α < 1"),
    ({"probes": "tcb", "probe_tcb_ablation": "x"}, "probe_tcb_ablation"),
    ({"probes": "bte", "probe_tcb_ablation": "0.5"}, "add tcb to probes"),
])
def test_bad_ablation_options_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        ProbeConfig.from_model_args(args)


def test_unset_spellings_turn_it_off():
    for unset in ("none", "", "0", "off"):
        assert ProbeConfig.from_model_args({"probes": "tcb", "probe_tcb_ablation": unset}).options_of("tcb").ablation is None
    assert ProbeConfig.from_model_args({"probes": "all", "probe_tcb_ablation": "0.5"}).options_of("tcb").ablation == 0.5
