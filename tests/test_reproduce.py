"""``lm-eval-probes reproduce``: each protocol end to end on tiny models, the JSON schema, the agreement rules, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import build_tokenizer, save_tiny_bert
from loader_fixtures import write_data_dir
from lm_eval_probes.declarations import ECE, PROBES_BY_NAME
from lm_eval_probes.reproduce import PROTOCOLS, reproduce
from lm_eval_probes.reproduce.claims import (
    AbsAtMost,
    AtLeast,
    Claim,
    InteriorMinimum,
    IntervalAbove,
    Measurement,
    PaperInInterval,
    SameSign,
    StrictlyIncreasing,
)
from lm_eval_probes.reproduce.cli import main
from lm_eval_probes.reproduce.runner import ReproduceError, merge_model_args, parse_model_args
from lm_eval_probes.reproduce.tables import markdown_table, write

CLAIM_KEYS = {"claim", "paper", "measured", "ci_low", "ci_high", "agrees"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_data_dir(tmp_path_factory.mktemp("data"), n=24)


# ------------------------------------------------------------------------------------------ agreement rules

def claim(rule, paper, value=None, low=None, high=None) -> Claim:
    return Claim("a hand-made claim", paper, Measurement(value, low, high, 10), rule)


def test_paper_in_interval_agrees_fails_and_is_undecided_without_an_interval():
    assert claim(PaperInInterval(), 0.44, 0.40, 0.37, 0.51).agrees is True
    assert claim(PaperInInterval(), 0.44, 0.10, 0.02, 0.20).agrees is False
    assert claim(PaperInInterval(), 0.44, 0.40).agrees is None  # no CI
    assert claim(PaperInInterval(), None, 0.40, 0.3, 0.5).agrees is None  # the paper gives no value


def test_same_sign_needs_the_interval_to_exclude_zero_on_the_papers_side():
    assert claim(SameSign(), -0.187, -0.20, -0.30, -0.05).agrees is True
    assert claim(SameSign(), -0.187, -0.05, -0.20, 0.10).agrees is False  # right sign, CI straddles 0
    assert claim(SameSign(), -0.187, 0.10, 0.02, 0.20).agrees is False  # opposite sign
    assert claim(SameSign(), 0.068, 0.02).agrees is True and claim(SameSign(), 0.068, -0.02).agrees is False  # no CI
    assert claim(SameSign(), 0.068, None).agrees is None


def test_bounds_and_monotone_rules():
    assert claim(IntervalAbove(0.0), None, 0.2, 0.05, 0.3).agrees is True
    assert claim(IntervalAbove(0.0), None, 0.2, -0.05, 0.3).agrees is False
    assert claim(AtLeast(0.95), 0.996, 0.97).agrees is True and claim(AtLeast(0.95), 0.996, 0.62).agrees is False
    assert claim(AbsAtMost(0.02), -0.006, -0.01).agrees is True and claim(AbsAtMost(0.02), -0.006, 0.05).agrees is False
    assert claim(StrictlyIncreasing(), (0.161, 0.173), (0.1, 0.2, 0.3)).agrees is True
    assert claim(StrictlyIncreasing(), (0.161, 0.173), (0.1, 0.3, 0.2)).agrees is False
    assert claim(StrictlyIncreasing(), (0.161, 0.173), (0.1, float("nan"))).agrees is None
    assert claim(InteriorMinimum(), None, (2.7, 2.5, 2.6)).agrees is True
    assert claim(InteriorMinimum(), None, (2.7, 2.6, 2.5)).agrees is False  # best at the end: no U


def test_claim_json_and_markdown():
    made = [claim(PaperInInterval(), 0.44, 0.40, 0.37, 0.51), claim(StrictlyIncreasing(), (0.1, 0.2), (0.3, 0.2)),
            claim(AtLeast(0.95), 0.996, float("nan"))]
    as_json = [c.to_json() for c in made]
    json.dumps(as_json, allow_nan=False)
    assert all(CLAIM_KEYS <= set(entry) for entry in as_json)
    assert [entry["agrees"] for entry in as_json] == [True, False, None]
    assert as_json[1]["measured"] == [0.3, 0.2] and as_json[2]["measured"] is None
    table = markdown_table(made)
    assert "0.400 [0.370, 0.510]" in table and "| yes |" in table and "| no |" in table and "| — |" in table
    assert "agrees if the paper's value lies inside this run's 95 % CI" in table
    with pytest.raises(ValueError, match="needs its text"):
        Claim(" ", 0.1, Measurement(), AtLeast(0.0))


# ------------------------------------------------------------------------------------------ arguments and errors

def test_model_args_are_parsed_and_merged():
    assert parse_model_args("pretrained=x,probes=tcb,bte,dtype=float32") == {
        "pretrained": "x", "probes": "tcb+bte", "dtype": "float32"}
    merged = merge_model_args({"probes": "tcb", "probe_bte_profile": "window"}, {"probes": "bte", "probe_bte_profile": "full"})
    assert merged == {"probes": "tcb+bte", "probe_bte_profile": "window"}  # the user's option stands
    assert merge_model_args({"probes": "all"}, {"probes": "bte"}) == {"probes": "all"}
    assert merge_model_args({"probes": "none"}, {"probes": "reader"}) == {"probes": "reader"}
    with pytest.raises(ReproduceError, match="expected key=value"):
        parse_model_args("pretrained")


@pytest.mark.parametrize(("argv", "message"), [
    (["tbc"], "unknown protocol 'tbc'. Did you mean 'tcb'"),
    (["margins"], "give --engine_output"),
    (["bte", "--engine_output", "x.json"], "--engine_output is for margins"),
    (["margins", "--engine_output", "/no/such/repro.json"], "no engine output at"),
    (["calibration", "--variant", "gsm"], "no variant 'gsm'. Did you mean 'gsm8k'"),
    (["bte", "--model", "hf-probes-diffusion"], "runs with --model hf-probes"),
    (["bte", "--model_args", "pretrained"], "expected key=value"),
    (["bte", "--limit", "0"], "--limit must be a positive"),
    (["bte", "--data_dir", "/no/such/folder"], "is not a folder"),
    (["calibration", "--metadata", "[1]"], "--metadata must be a JSON object"),
])
def test_bad_protocol_or_arguments_give_a_clear_error(argv, message, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "lm_eval").exists()  # nothing ran


def test_the_subcommand_is_registered():
    from lm_eval_probes.__main__ import SUBCOMMANDS, plugin_help

    assert SUBCOMMANDS["reproduce"] == "lm_eval_probes.reproduce.cli"
    assert "reproduce PROTOCOL" in plugin_help("TASKS")
    with pytest.raises(SystemExit) as exit_info:
        main(["bte", "--model", "hf"])
    assert exit_info.value.code == 2
    assert set(PROTOCOLS) == {"bte", "calibration", "omega", "tcb"}


# ------------------------------------------------------------------------------------------ end to end

def test_bte_end_to_end(tiny_model_dir, data_dir, tmp_path):
    claims, header = reproduce("bte", model_args=f"pretrained={tiny_model_dir('llama')}", data_dir=str(data_dir),
                               limit=10, out=tmp_path, device="cpu", batch_size="4", n_resamples=200)
    assert header["tasks"] == ["probes_math500_ref", "probes_math500_problem", "probes_proofwriter", "probes_stepgame"]
    assert "probes=bte" in header["model_args"] and "probe_bte_features=1" in header["model_args"]
    results = json.loads(next((tmp_path / "lm_eval").rglob("results_*.json")).read_text())["results"]
    rho = PROBES_BY_NAME["bte"].difficulty_rows()[0].name
    by_text = {c.claim: c for c in claims}
    math_rho = by_text["MATH-500 reference solutions: ρ(ē_M, level)"]
    assert math_rho.measured.value == pytest.approx(results["probes_math500_ref"][f"{rho},none"])  # the user's row
    assert math_rho.measured.ci_low <= math_rho.measured.value <= math_rho.measured.ci_high
    assert math_rho.paper == 0.44 and math_rho.measured.n_documents == 10
    # the interval is the report's: the same resamples, keyed by the same model label, task and filter
    from lm_eval_probes.reports.reading import read_runs
    from lm_eval_probes.reports.tables import BootstrapSettings, task_cell

    (model,) = read_runs([tmp_path / "lm_eval"])
    cell = task_cell(model, "probes_math500_ref", rho, "none", BootstrapSettings(n_resamples=200))
    assert (cell.ci.low, cell.ci.high) == pytest.approx((math_rho.measured.ci_low, math_rho.measured.ci_high))
    levels = by_text["MATH-500: mean ē_M per level 1–5 rises"]
    assert len(levels.measured.value) == 5 and levels.agrees in (True, False)
    attribution = next(c for c in claims if c.claim.startswith("benchmark attribution"))
    assert attribution.measured.value is not None and "statistics" in attribution.measured.note
    assert attribution.measured.n_documents == 30 and "3 benchmarks" in attribution.measured.note  # not the problems
    problem_only = by_text["MATH-500 problem statements alone: ρ(ē_M, level)"]
    assert problem_only.measured.value == pytest.approx(results["probes_math500_problem"][f"{rho},none"])
    assert problem_only.paper == 0.36 and problem_only.measured.n_documents == 10
    json_path, markdown_path = write(claims, header, tmp_path)
    document = json.loads(json_path.read_text())
    assert document["protocol"] == "bte" and len(document["claims"]) == len(claims) == 9
    assert all(CLAIM_KEYS <= set(entry) for entry in document["claims"])
    assert "| claim | paper | this run [95 % CI] |" in markdown_path.read_text()


def test_calibration_end_to_end_through_the_command(tiny_model_dir, data_dir, tmp_path, capsys):
    argv = ["calibration", "--model", "hf-probes", "--model_args", f"pretrained={tiny_model_dir('llama')}",
            "--variant", "proofwriter", "--data_dir", str(data_dir), "--limit", "16", "--out", str(tmp_path),
            "--device", "cpu", "--batch_size", "8", "--resamples", "200"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| claim | paper | this run [95 % CI] |" in printed and "claims agree" in printed
    document = json.loads((tmp_path / "claims.json").read_text())
    assert document["tasks"] == ["probes_proofwriter", "probes_proofwriter_noise_swap", "probes_proofwriter_detect"]
    assert len(document["claims"]) == 15 and all(CLAIM_KEYS <= set(entry) for entry in document["claims"])
    by_text = {entry["claim"]: entry for entry in document["claims"]}
    results = json.loads(next((tmp_path / "lm_eval").rglob("results_*.json")).read_text())["results"]
    clean = results["probes_proofwriter"]
    assert by_text["ECE, clean"]["measured"] == pytest.approx(clean[f"{ECE.name},none"])
    assert by_text["accuracy, clean"]["measured"] == pytest.approx(clean["acc,none"])  # the task's correctness
    scaled = by_text["temperature scaling leaves selective AUROC unchanged (noised)"]
    assert scaled["agrees"] in (True, None) and (scaled["measured"] is None or abs(scaled["measured"]) < 1e-9)
    assert scaled["measured"] is None or "out-of-fold" in scaled["note"]
    change = by_text["accuracy: noised − clean (paired twins)"]
    noised_acc = by_text["accuracy, noised (char swap)"]["measured"]
    assert change["measured"] == pytest.approx(noised_acc - by_text["accuracy, clean"]["measured"])
    detector = by_text["corruption detector AUROC (prompt hidden states, clean vs noised twins)"]
    assert detector["measured"] is None or 0.0 <= detector["measured"] <= 1.0
    assert (tmp_path / "claims.md").read_text().startswith("# lm-eval-probes reproduce calibration")


def test_calibration_with_the_diffusion_model(data_dir, tmp_path):
    folder = save_tiny_bert(tmp_path / "bert", seed=3, special_tokens={"mask_token": "<|mask|>"})
    args = f"pretrained={folder},diffusion_gen_length=4,diffusion_steps=4,diffusion_mc_samples=2,diffusion_mc_batch_size=2"
    claims, header = reproduce("calibration", variant="proofwriter-gen", model_args=args, data_dir=str(data_dir),
                               limit=12, out=tmp_path / "out", device="cpu", batch_size="8", n_resamples=100)
    assert header["model"] == "hf-probes-diffusion" and header["filter"] == "answer"
    assert "trust_remote_code=True" in header["model_args"] and "probes=reader" in header["model_args"]
    confidence = next(c for c in claims if c.claim == "mean confidence, clean")
    assert confidence.measured.value is not None and 0.0 <= confidence.measured.value <= 1.0
    assert math.isfinite(np.float64(confidence.measured.n_documents))


def test_omega_end_to_end_over_four_focal_depths(data_dir, tmp_path):
    import torch
    import transformers

    tokenizer = build_tokenizer()  # six blocks, so that m = 5 leaves a layer to decode from
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      initializer_range=0.25, eos_token_id=tokenizer.eos_token_id,
                                      bos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(5)
    transformers.AutoModelForCausalLM.from_config(config).eval().save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    claims, header = reproduce("omega", variant="proofwriter", model_args=f"pretrained={tmp_path / 'model'}",
                               data_dir=str(data_dir), limit=12, out=tmp_path / "out", device="cpu", batch_size="8", n_resamples=100)
    assert set(header["passes"]) == {"m0", "m1", "m3", "m5"} and "probe_omega_depth=5" in header["passes"]["m5"]
    for depth in ("m0", "m5"):  # one lm_eval output folder per pass
        assert next((tmp_path / "out" / "lm_eval" / depth).rglob("results_*.json"))
    rises = claims[0]
    assert len(rises.measured.value) == 4 and all(0.0 <= v <= 1.0 for v in rises.measured.value)
    assert rises.agrees == all(b > a for a, b in zip(rises.measured.value, rises.measured.value[1:]))
    assert claims[1].measured.value is not None and claims[1].measured.n_documents == 12
    assert claims[-1].paper == pytest.approx(3.05 - 1.78) and "level" in claims[-1].measured.note


def engine_report(degradations: dict[float, float], clean: dict[float, float]) -> dict:
    """A report shaped as benchmarks/support_tokens_repro.py writes it (σ keys as JSON strings)."""
    return {"data": "made up", "seeds": [0, 1], "sigmas": [0.0, 0.5], "results": [
        {"weight": w, "bpc": {"0.0": clean[w], "0.5": clean[w] * degradations[w]}} for w in degradations]}


def test_margins_claims_from_the_engines_output(tmp_path, capsys):
    from lm_eval_probes.reproduce.margins import margins_claims

    paper_like = margins_claims(engine_report({0.0: 2.68, 0.02: 2.60, 0.05: 2.56, 0.1: 2.62},
                                              {0.0: 2.168, 0.02: 2.18, 0.05: 2.198, 0.1: 2.21}))
    assert [c.agrees for c in paper_like] == [True, True, True]
    assert paper_like[0].measured.value == pytest.approx(2.198 / 2.168 - 1)
    assert paper_like[1].measured.value == pytest.approx(2.56 - 2.68)
    unlike = margins_claims(engine_report({0.0: 2.5, 0.05: 2.6, 0.1: 2.7}, {0.0: 2.0, 0.05: 2.3, 0.1: 2.4}))
    assert [c.agrees for c in unlike] == [False, False, False]  # 15 % clean cost, worse degradation, best at λ = 0
    path = tmp_path / "repro.json"
    for report, message in [({"results": [{"weight": 0.0}]}, "needs a CE-only result (weight 0) and at least one"),
                            ({"sigmas": [0.0], "results": [{"weight": 0.0}, {"weight": 0.1}]}, "is not the engine's report")]:
        path.write_text(json.dumps(report))
        assert main(["margins", "--engine_output", str(path), "--out", str(tmp_path)]) == 2
        assert message in capsys.readouterr().err


def test_margins_reads_the_engines_real_output(repo_root, tmp_path, capsys, monkeypatch):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("support_tokens_repro", repo_root / "benchmarks" / "support_tokens_repro.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)  # its dataclasses look their module up
    spec.loader.exec_module(script)
    engine = tmp_path / "engine"
    import torch

    script.main(["--quick", "--steps", "2", "--lambdas", "0.05,0.1", "--sigmas", "0,0.5", "--out", str(engine),
                 "--threads", str(torch.get_num_threads())])  # leaves the process's thread count as it was
    capsys.readouterr()
    assert main(["margins", "--engine_output", str(engine), "--out", str(tmp_path / "out")]) == 0
    assert "clean BPC cost of the barrier (λ = 0.05)" in capsys.readouterr().out
    document = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert document["engine"] == "benchmarks/support_tokens_repro.py" and len(document["claims"]) == 3
    assert all(CLAIM_KEYS <= set(entry) for entry in document["claims"])


def test_tcb_end_to_end_with_its_stand_in_prompt_sets(tiny_model_dir, data_dir, tmp_path):
    from lm_eval_probes.reproduce.statistics import Run
    from lm_eval_probes.reproduce.tcb import document_values

    claims, header = reproduce("tcb", model_args=f"pretrained={tiny_model_dir('llama')}", data_dir=str(data_dir),
                               limit=9, out=tmp_path, device="cpu", batch_size="8", n_resamples=100)
    assert "probes=tcb" in header["model_args"] and len(header["tasks"]) == 4
    diverse_veff, diverse_margin, low_veff, low_margin, ablation = claims
    assert diverse_veff.measured.n_documents == 36 and low_veff.measured.n_documents == 12
    for made in (diverse_veff, diverse_margin, low_veff, low_margin):
        assert -1.0 <= made.measured.value <= 1.0 and made.measured.ci_low <= made.measured.ci_high
    assert ablation.measured.value is None and ablation.agrees is None
