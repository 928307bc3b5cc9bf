"""The margins engine (``lm_eval_probes.reproduce.margins_engine``) and its script ``benchmarks/support_tokens_repro.py``
at a tiny size on the offline corpus (no file needed): the script is a thin wrapper with the same numbers."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lm_eval_probes.reproduce import margins_engine as engine

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "support_tokens_repro.py"
TINY = ["--quick", "--steps", "3", "--lambdas", "0.05", "--sigmas", "0,0.5"]


def load_script():
    spec = importlib.util.spec_from_file_location("support_tokens_repro", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_quick_reproduction_writes_table_json_and_plot(tmp_path):
    repro = load_script()
    report = repro.main([*TINY, "--out", str(tmp_path), "--threads", str(torch.get_num_threads())])
    assert [r["weight"] for r in report["results"]] == [0.0, 0.05]
    for result in report["results"]:
        assert all(math.isfinite(v) and v > 0 for v in result["bpc"].values())
        assert [entry["seed"] for entry in result["per_seed"]] == [0]
    table = (tmp_path / "repro.md").read_text()
    assert "CE only" in table and "| 0.05 |" in table and "σ=0.5" in table
    written = json.loads((tmp_path / "repro.json").read_text())
    assert written["data"] == "synthetic" and written["engine"] == engine.ENGINE
    assert (tmp_path / "repro.png").stat().st_size > 1000


def test_the_package_engine_and_the_script_give_the_same_numbers(tmp_path):
    """The script (a wrapper) and the package's engine train and score the same models."""
    threads = str(torch.get_num_threads())
    load_script().main([*TINY, "--seeds", "0,1", "--out", str(tmp_path / "script"), "--threads", threads])
    settings = engine.EngineSettings.from_options(quick=True, steps=3, lambdas="0.05", sigmas="0,0.5", seeds="0,1")
    report = engine.run_engine(engine.load_corpus(None, context=settings.size.context), settings, log_every=0)
    engine.write_report(report, tmp_path / "package")
    script = json.loads((tmp_path / "script" / "repro.json").read_text())
    package = json.loads((tmp_path / "package" / "repro.json").read_text())
    for ours, theirs in zip(package["results"], script["results"], strict=True):
        assert ours["bpc"] == theirs["bpc"]  # exactly: same seeds, generators and order of operations
        assert [(s["seed"], s["bpc"], s["margin_mean"]) for s in ours["per_seed"]] == \
               [(s["seed"], s["bpc"], s["margin_mean"]) for s in theirs["per_seed"]]
    assert torch.get_num_threads() == int(threads)  # the script left the thread count as it was


def test_same_seed_same_initialisation_and_batches():
    """CE-only and barrier runs start from one initialisation and see the same batches (only the loss differs)."""
    corpus = engine.load_corpus(None, context=engine.QUICK.context)
    size = replace(engine.QUICK, steps=0)
    first = engine.train(corpus.train, corpus.vocab, size, weight=0.0, seed=3, log_every=0)
    second = engine.train(corpus.train, corpus.vocab, size, weight=0.1, seed=3, log_every=0)
    assert all((a == b).all() for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True))


def test_training_leaves_the_global_generator_alone():
    corpus = engine.load_corpus(None, context=engine.QUICK.context)
    state = torch.random.get_rng_state()
    engine.train(corpus.train, corpus.vocab, replace(engine.QUICK, steps=1), weight=0.05, seed=3, log_every=0)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_the_corpus_split_and_its_errors(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("abcdefghij" * 30, encoding="utf-8")
    corpus = engine.load_corpus(text, context=8, valid_fraction=0.1)
    assert (len(corpus.train), len(corpus.valid), corpus.vocab, corpus.source) == (270, 30, 10, str(text))
    assert "".join(corpus.chars[i] for i in corpus.valid[:3].tolist()) == "abc"  # the file's tail
    with pytest.raises(ValueError, match="no corpus file at"):
        engine.load_corpus(tmp_path / "missing.txt", context=8)
    with pytest.raises(ValueError, match=r"each part needs at least 50"):
        engine.load_corpus(text, context=48)
    with pytest.raises(ValueError, match=r"valid_fraction must be in \(0, 1\)"):
        engine.load_corpus(text, context=8, valid_fraction=1.0)


@pytest.mark.parametrize(("options", "message"), [
    ({"sigmas": "0.1,0.5"}, "sigmas must start at 0 and increase"),
    ({"sigmas": "0,0.5,0.5"}, "sigmas must start at 0 and increase"),
    ({"lambdas": "0,0.05"}, "every λ must be finite and > 0"),
    ({"seeds": "0,0"}, "seeds must be distinct"),
    ({"seeds": "0.5"}, "--seeds must be comma-separated ints"),
    ({"steps": -1}, "steps >= 0"),
])
def test_settings_reject_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        engine.EngineSettings.from_options(quick=True, **options)
