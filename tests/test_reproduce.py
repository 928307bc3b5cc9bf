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
    (["margins"], "trains its own models: give --data FILE"),
    (["bte", "--engine_output", "x.json"], "--engine_output is for margins; 'bte' runs through lm_eval"),
    (["calibration", "--quick", "--seeds", "0,1"], "--quick, --seeds are for margins; 'calibration' runs through lm_eval"),
    (["omega", "--steps", "0"], "--steps is for margins; 'omega' runs through lm_eval"),
    (["margins", "--engine_output", "/no/such/repro.json"], "no engine output at"),
    (["margins", "--engine_output", "x.json", "--steps", "5"], "--steps run the engine: give one or the other"),
    (["margins", "--steps", "5"], "trains its own models: give --data FILE"),
    (["margins", "--data", "/no/such/corpus.txt"], "no corpus file at /no/such/corpus.txt"),
    (["margins", "--quick", "--sigmas", "0.1,0.5"], "sigmas must start at 0 and increase"),
    (["margins", "--quick", "--seeds", "0,one"], "--seeds must be comma-separated ints"),
    (["margins", "--quick", "--threads", "0"], "--threads must be >= 1"),
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
    assert not (tmp_path / "lm_eval").exists() and not (tmp_path / "engine").exists()  # nothing ran


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
    assert "trust_remote_code" not in header["model_args"] and "probes=reader" in header["model_args"]  # never set for you
    confidence = next(c for c in claims if c.claim == "mean confidence, clean")
    assert confidence.measured.value is not None and 0.0 <= confidence.measured.value <= 1.0
    assert math.isfinite(np.float64(confidence.measured.n_documents))


def test_omega_end_to_end_over_four_focal_depths(data_dir, tmp_path, monkeypatch):
    """Four passes, four models built one after the other: no earlier one is alive when the next is built."""
    import weakref

    import torch
    import transformers

    from lm_eval_probes.models.autoregressive import ProbeHFLM

    alive: list[weakref.ref] = []
    real_init = ProbeHFLM.__init__

    def init(self, *args, **kwargs):
        assert all(ref() is None for ref in alive), "an earlier pass's model is alive"
        real_init(self, *args, **kwargs)
        alive.extend([weakref.ref(self), weakref.ref(self.model)])

    monkeypatch.setattr(ProbeHFLM, "__init__", init)

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
    assert len(alive) == 2 * 4
    for depth in ("m0", "m5"):  # one lm_eval output folder per pass
        assert next((tmp_path / "out" / "lm_eval" / depth).rglob("results_*.json"))
    rises = claims[0]
    assert len(rises.measured.value) == 4 and all(0.0 <= v <= 1.0 for v in rises.measured.value)
    assert rises.agrees == all(b > a for a, b in zip(rises.measured.value, rises.measured.value[1:]))
    assert claims[1].measured.value is not None and claims[1].measured.n_documents == 12
    assert claims[-1].paper == pytest.approx(3.05 - 1.78) and "level" in claims[-1].measured.note


def engine_report(degradations: dict[float, float], clean: dict[float, float]) -> dict:
    """A report shaped as the engine wrote it before it kept per-seed values (σ keys as JSON strings)."""
    return {"data": "made up", "seeds": [0, 1], "sigmas": [0.0, 0.5], "results": [
        {"weight": w, "bpc": {"0.0": clean[w], "0.5": clean[w] * degradations[w]}} for w in degradations]}


def t_interval(values: list[float]) -> tuple[float, float]:
    """The 95 % Student-t interval of the mean, computed apart from the code under test."""
    from scipy import stats

    return stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))


def test_margins_claims_from_the_engines_output(tmp_path, capsys):
    from lm_eval_probes.reproduce.margins import margins_claims

    paper_like = margins_claims(engine_report({0.0: 2.68, 0.02: 2.60, 0.05: 2.56, 0.1: 2.62},
                                              {0.0: 2.168, 0.02: 2.18, 0.05: 2.198, 0.1: 2.21}))
    assert [c.agrees for c in paper_like] == [True, True, True]
    assert paper_like[0].measured.value == pytest.approx(2.198 / 2.168 - 1)
    assert paper_like[1].measured.value == pytest.approx(2.56 - 2.68)
    assert not paper_like[1].measured.has_interval and "no per-seed values: no CI" in paper_like[1].measured.note
    unlike = margins_claims(engine_report({0.0: 2.5, 0.05: 2.6, 0.1: 2.7}, {0.0: 2.0, 0.05: 2.3, 0.1: 2.4}))
    assert [c.agrees for c in unlike] == [False, False, False]  # 15 % clean cost, worse degradation, best at λ = 0
    path = tmp_path / "repro.json"
    for report, message in [({"results": [{"weight": 0.0}]}, "needs a CE-only result (weight 0) and at least one"),
                            ({"sigmas": [0.0], "results": [{"weight": 0.0}, {"weight": 0.1}]}, "is not the engine's report"),
                            ({"seeds": [0, 1], "sigmas": [0.0], "results": [
                                {"weight": w, "bpc": {"0.0": 2.0}, "per_seed": [{"bpc": {"0.0": 2.0}}]} for w in (0.0, 0.1)]},
                             "1 per-seed results for 2 seeds")]:
        path.write_text(json.dumps(report))
        assert main(["margins", "--engine_output", str(path), "--out", str(tmp_path)]) == 2
        assert message in capsys.readouterr().err


def seeded_report(clean: dict[float, list[float]], noised: dict[float, list[float]], *, named: bool = True) -> dict:
    """A report with per-seed BPCs (seeds 3, 5, 9), the seed named in each entry or (older reports) not."""
    seeds = [3, 5, 9][: len(clean[0.0])]
    results = []
    for w in clean:
        per_seed = [{**({"seed": s} if named else {}), "bpc": {"0.0": c, "0.5": n}}
                    for s, c, n in zip(seeds, clean[w], noised[w])]
        results.append({"weight": w, "bpc": {"0.0": float(np.mean(clean[w])), "0.5": float(np.mean(noised[w]))},
                        "per_seed": per_seed})
    return {"seeds": seeds, "sigmas": [0.0, 0.5], "results": results}


def test_margins_intervals_over_seeds_are_t_intervals_of_the_paired_differences():
    from lm_eval_probes.reproduce.margins import margins_claims, seed_interval

    clean = {0.0: [2.50, 2.60, 2.55], 0.05: [2.60, 2.66, 2.70], 0.1: [2.70, 2.80, 2.75]}
    noised = {0.0: [3.90, 4.00, 3.80], 0.05: [3.10, 3.30, 3.25], 0.1: [3.40, 3.60, 3.50]}
    for named in (True, False):  # older reports list per-seed results in the order of their seeds
        cost, gap, shape = margins_claims(seeded_report(clean, noised, named=named))
        costs = [b / a - 1 for a, b in zip(clean[0.0], clean[0.05])]  # the same seed's barrier over CE only
        gaps = [nb / cb - na / ca for ca, cb, na, nb in zip(clean[0.0], clean[0.05], noised[0.0], noised[0.05])]
        assert cost.measured.value == pytest.approx(np.mean(costs))
        assert (cost.measured.ci_low, cost.measured.ci_high) == pytest.approx(t_interval(costs))
        assert gap.measured.value == pytest.approx(np.mean(gaps))
        assert (gap.measured.ci_low, gap.measured.ci_high) == pytest.approx(t_interval(gaps))
        assert "3 seeds" in cost.measured.note and "the rule reads the estimate" in cost.measured.note
        assert cost.measured.ci_high > 0.05 and cost.agrees is True  # decided on the estimate, 0.041
        assert t_interval(gaps)[1] < 0 and gap.agrees is True
        assert shape.measured.value == pytest.approx(
            [np.mean([n / c for c, n in zip(clean[w], noised[w])]) for w in (0.0, 0.05, 0.1)])
        assert shape.agrees is True and "mean over its 3 seeds" in shape.measured.note
    one = margins_claims(seeded_report({w: v[:1] for w, v in clean.items()}, {w: v[:1] for w, v in noised.items()}))
    assert [c.measured.ci_low for c in one[:2]] == [None, None] and "1 seed: no CI" in one[1].measured.note
    assert one[0].measured.value == pytest.approx(2.60 / 2.50 - 1)
    assert seed_interval([0.2, 0.2]) == (0.2, 0.2) and seed_interval([0.1]) is None
    with pytest.raises(ValueError, match="must be finite"):
        seed_interval([0.1, float("nan")])


def test_margins_runs_its_engine_end_to_end(tmp_path, capsys, caplog):
    out = tmp_path / "out"
    argv = ["margins", "--quick", "--steps", "3", "--lambdas", "0.05,0.1", "--sigmas", "0,0.5", "--seeds", "0,1"]
    assert main([*argv, "--out", str(out)]) == 0
    assert "clean BPC cost of the barrier (λ = 0.05)" in capsys.readouterr().out
    assert "λ=0.1 seed 1: trained in" in caplog.text  # the engine's progress
    assert {path.name for path in (out / "engine").iterdir()} == {"repro.json", "repro.md", "repro.png"}
    document = json.loads((out / "claims.json").read_text())
    assert document["engine"] == "lm_eval_probes.reproduce.margins_engine" and document["seeds"] == [0, 1]
    assert document["engine_output"] == str(out / "engine" / "repro.json") and len(document["claims"]) == 3
    assert all(CLAIM_KEYS <= set(entry) for entry in document["claims"])
    report = json.loads((out / "engine" / "repro.json").read_text())
    ce, barrier = ({s["seed"]: s["bpc"] for s in r["per_seed"]} for r in report["results"][:2])
    costs = [barrier[s]["0.0"] / ce[s]["0.0"] - 1 for s in (0, 1)]
    gaps = [barrier[s]["0.5"] / barrier[s]["0.0"] - ce[s]["0.5"] / ce[s]["0.0"] for s in (0, 1)]
    cost, gap, _ = document["claims"]
    assert cost["measured"] == pytest.approx(np.mean(costs)) and gap["measured"] == pytest.approx(np.mean(gaps))
    assert (cost["ci_low"], cost["ci_high"]) == pytest.approx(t_interval(costs))
    assert (gap["ci_low"], gap["ci_high"]) == pytest.approx(t_interval(gaps))
    assert "2 seeds" in cost["note"] and "t-interval" in gap["note"]
    # the same report read back through --engine_output gives the same claims
    assert main(["margins", "--engine_output", str(out / "engine"), "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "claims.json").read_text())
    assert again["claims"] == document["claims"]


def test_tcb_end_to_end_on_next_token_prompts(tiny_model_dir, data_dir, tmp_path, monkeypatch):
    """Every claim equals its statistic recomputed here from the documents' records and the samples files."""
    import lm_eval_probes.reproduce.tcb as tcb

    monkeypatch.setattr(tcb, "LOW_VEFF", 1e9)  # a tiny random model is never confident: every document is "low"
    claims, header = reproduce("tcb", model_args=f"pretrained={tiny_model_dir('llama')}", data_dir=str(data_dir),
                               limit=14, out=tmp_path, device="cpu", batch_size="8", n_resamples=100)
    assert header["tasks"] == ["probes_next_token"] and "probe_tcb_ablation=0.5" in header["model_args"]
    assert len(claims) == 6
    (samples_file,) = (tmp_path / "lm_eval").rglob("samples_probes_next_token_*.jsonl")
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    assert len(samples) == 14 and all(sample["response_tokens"] == 1 for sample in samples)  # one prediction each
    ordered = np.array([sample["tcb_ablation_ordered"] for sample in samples])
    assert set(ordered) <= {0.0, 1.0}
    for offset in (0, 3):  # the diverse set and the (here: the same) low-V_eff set
        veff, margin, ablation = claims[offset : offset + 3]
        assert veff.measured.n_documents == 14 and ablation.measured.n_documents == 14
        assert ablation.measured.value == pytest.approx(ordered.mean())
        assert ablation.measured.ci_low <= ablation.measured.value <= ablation.measured.ci_high
        for made in (veff, margin):
            assert -1.0 <= made.measured.value <= 1.0 and made.measured.ci_low <= made.measured.ci_high


def test_tcb_stand_in_variant_reads_the_multiple_choice_tasks(tiny_model_dir, data_dir, tmp_path):
    claims, header = reproduce("tcb", variant="stand-in", model_args=f"pretrained={tiny_model_dir('llama')}",
                               data_dir=str(data_dir), limit=6, out=tmp_path, device="cpu", batch_size="8",
                               n_resamples=100)
    assert len(header["tasks"]) == 4
    diverse_veff, _, diverse_ablation, low_veff, _, low_ablation = claims
    assert diverse_veff.measured.n_documents == 24 and diverse_ablation.measured.n_documents == 24
    assert 0.0 <= diverse_ablation.measured.value <= 1.0
    assert low_veff.measured.value is None and low_ablation.measured.value is None  # no document with V_eff < 20
    assert "fewer than 3 documents" in low_veff.measured.note
