"""Strict parsing of the plugin's model_args."""

from __future__ import annotations

import pytest

from lm_eval_probes.__main__ import rewrite_argv
from lm_eval_probes.config import ProbeConfig, parse_probe_list, split_model_args
from lm_eval_probes.models.autoregressive import ProbeHFLM
from lm_eval_probes.probes.bte.probe import BteOptions
from lm_eval_probes.probes.tcb.probe import TcbOptions


@pytest.mark.parametrize(
    "value, expected",
    [("tcb,bte", ("tcb", "bte")), ("tcb+bte", ("tcb", "bte")), ("[tcb,bte]", ("tcb", "bte")),
     (["bte"], ("bte",)), ("none", ()), ("all", ("tcb", "bte", "reader", "omega", "margin")), ("TCB", ("tcb",))],
)
def test_probe_lists(value, expected):
    assert parse_probe_list(value) == expected


@pytest.mark.parametrize(
    "args, message",
    [({"probes": "tcb,bet"}, "unknown probe 'bet'. Did you mean 'bte'?"),
     ({"probe_window": "1:2"}, "unknown hf-probes option 'probe_window'"),
     ({"probe_tcb_eps": "0"}, "probe_tcb_eps must be finite and > 0"),
     ({"probe_tcb_eps": "inf"}, "probe_tcb_eps must be finite and > 0"),
     ({"probe_bte_window": "5"}, "probe_bte_window must look like '12:20'"),
     ({"probe_bte_window": "6:2"}, "0 <= start < stop"),
     ({"probe_gen_capture": "during"}, "unknown probe_gen_capture 'during'"),
     ({"probes": "tcb,tcb"}, "lists a probe twice")],
)
def test_bad_values_raise_with_valid_values(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("?", r"\?")):
        ProbeConfig.from_model_args(args)


def test_near_miss_of_probes_key_is_caught():
    plugin, rest = split_model_args({"prbes": "tcb", "pretrained": "x", "dtype": "float32"})
    assert plugin == {"prbes": "tcb"} and rest == {"pretrained": "x", "dtype": "float32"}
    with pytest.raises(ValueError, match="Did you mean 'probes'"):
        ProbeConfig.from_model_args(plugin)


def test_parsed_options():
    cfg = ProbeConfig.from_model_args({"probes": "bte", "probe_bte_window": "2:5", "probe_tcb_eps": 2, "probe_chunk_positions": "8"})
    assert cfg == ProbeConfig(probes=("bte",), chunk_positions=8, options={"tcb": TcbOptions(eps=2.0), "bte": BteOptions(window=(2, 5))})
    assert cfg.options_of("tcb").eps == 2.0 and cfg.options_of("bte").window == (2, 5)


def test_errors_come_before_model_loading():
    with pytest.raises(ValueError, match="unknown probe 'x'"):
        ProbeHFLM.create_from_arg_string("pretrained=/does/not/exist,probes=tcb,x")


def test_console_script_argv_rewrite():
    argv = rewrite_argv(["--model", "hf-probes", "--model_args", "pretrained=m,probes=tcb,bte,dtype=float32", "--tasks", "t"], "/T")
    assert argv == ["--model", "hf-probes", "--model_args", "pretrained=m,probes=tcb+bte,dtype=float32", "--tasks", "t", "--include_path", "/T"]
    assert rewrite_argv(["--tasks", "t", "--include_path", "/mine"], "/T")[-1] == "/mine"
    assert rewrite_argv(["--help"], "/T") == ["--help"]


def test_a_missing_model_folder_is_named_before_anything_loads(tmp_path):
    from lm_eval_probes.harness.pretrained import ModelNotFound
    from lm_eval_probes.models.diffusion import DiffusionProbeHFLM

    for wrapper in (ProbeHFLM, DiffusionProbeHFLM):
        with pytest.raises(ModelNotFound, match=f"no model folder at {tmp_path / 'no' / 'such'}"):
            wrapper(pretrained=str(tmp_path / "no" / "such"), probes="none")
