"""``probes=all`` is every probe that applies: the others are skipped (one log line each, ``probes_skipped`` in the
results' config and on the report); a probe named explicitly that cannot run refuses in one line."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from lm_eval_probes import registry
from lm_eval_probes.config import ProbeConfig, UnsupportedProbeError
from lm_eval_probes.models.autoregressive import ProbeHFLM


def test_a_capture_the_model_refuses_skips_its_probe_under_all(tiny_model_dir, caplog, monkeypatch):
    """A first attention layer the capture cannot read (here: a refusal put in its place): probes=all runs the rest
    and records why."""
    from lm_eval_probes.capture import attention
    from lm_eval_probes.capture.readouts import UnsupportedModelError

    def refused(model):
        raise UnsupportedModelError(f"model_type {model.config.model_type!r}: no layer calls the attention interface")

    monkeypatch.setattr(attention, "FirstAttentionCapture", refused)  # the registered capture's set-up builds it
    with caplog.at_level(logging.WARNING, logger="lm_eval.lm_eval_probes"):
        lm = ProbeHFLM(pretrained=tiny_model_dir("gpt2"), device="cpu", batch_size=1, probes="all")
    assert "margin" not in lm.probe_config.probes and "omega" in lm.probe_config.probes
    assert set(lm.probes_skipped) == {"margin"} and "model_type 'gpt2'" in lm.probes_skipped["margin"]
    assert lm.get_model_info()["probes_skipped"] == lm.probes_skipped
    assert [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()] == [
        f"probes=all: probe margin skipped: {lm.probes_skipped['margin']}"]
    assert lm.held.get("first_attention") is None and lm.plan.requested.first_attention is None


def test_the_margins_run_on_gpt2_and_their_config_check_skips_a_model_without_softmax_attention(tiny_model_dir):
    """GPT-2 calls transformers' attention interface: probes=all keeps the margins; a config without attention heads
    (or whose layer_types hold no softmax attention) is skipped by the margins' ``applies``."""
    import transformers

    lm = ProbeHFLM(pretrained=tiny_model_dir("gpt2"), device="cpu", batch_size=1, probes="all")
    assert "margin" in lm.probe_config.probes and not lm.probes_skipped and lm.held.get("first_attention") is not None
    applies = registry.probe("margin").applies
    assert applies(transformers.LlamaConfig(num_attention_heads=2, hidden_size=16)) is None
    assert "no attention heads" in applies(transformers.MambaConfig())
    linear = transformers.Qwen3NextConfig(layer_types=["linear_attention"], num_hidden_layers=1)
    assert "no softmax-attention layer" in applies(linear)


def test_a_probes_config_check_skips_or_refuses_before_any_weight_loads(monkeypatch, tmp_path):
    """A probe declaring ``applies`` is checked on the config alone: the folder holds no weights at all."""
    import transformers

    transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                             num_attention_heads=2).save_pretrained(tmp_path)
    real = registry.probe
    fussy = dataclasses.replace(real("bte"), applies=lambda config: f"not for {config.model_type}")
    monkeypatch.setattr(registry, "probe", lambda name: fussy if name == "bte" else real(name))
    with pytest.raises(UnsupportedProbeError, match=r"^probes=bte: not for llama$"):
        ProbeHFLM(pretrained=str(tmp_path), device="cpu", probes="tcb+bte")
    with pytest.raises(Exception) as loading:  # probes=all: bte skipped, then HFLM finds no weights to load
        ProbeHFLM(pretrained=str(tmp_path), device="cpu", probes="all")
    assert not isinstance(loading.value, UnsupportedProbeError)


def test_without_keeps_every_applicable_only_for_all():
    every = ProbeConfig.from_model_args({"probes": "all"})
    assert every.every_applicable and every.probes == registry.names()
    assert "omega" not in every.without({"omega": "why"}).probes
    named = ProbeConfig.from_model_args({"probes": "tcb+omega"})
    assert not named.every_applicable
    with pytest.raises(UnsupportedProbeError, match="^probes=omega: why$"):
        named.without({"omega": "why"})
    assert named.without({}) is named
    assert repr(every) == repr(ProbeConfig(probes=registry.names()))  # the --use_cache fingerprint is the probes'
