"""The reproduction script runs end to end at a tiny size on its offline corpus (no file needed)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "support_tokens_repro.py"


def load_script():
    spec = importlib.util.spec_from_file_location("support_tokens_repro", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_quick_reproduction_writes_table_json_and_plot(tmp_path):
    repro = load_script()
    report = repro.main(["--quick", "--steps", "4", "--lambdas", "0.05", "--sigmas", "0,0.5", "--out", str(tmp_path)])
    assert [r["weight"] for r in report["results"]] == [0.0, 0.05]
    for result in report["results"]:
        assert all(math.isfinite(v) and v > 0 for v in result["bpc"].values())
    table = (tmp_path / "repro.md").read_text()
    assert "CE only" in table and "| 0.05 |" in table and "σ=0.5" in table
    assert json.loads((tmp_path / "repro.json").read_text())["data"] == "synthetic"
    assert (tmp_path / "repro.png").stat().st_size > 1000


def test_same_seed_same_initialisation_and_batches():
    """CE-only and barrier runs start from one initialisation and see the same batches (only the loss differs)."""
    repro = load_script()
    data, chars = repro.encode(repro.quick_corpus())
    size = repro.RunSize(**{**repro.asdict(repro.QUICK), "steps": 0})
    first = repro.train(data, len(chars), size, weight=0.0, seed=3, log_every=0)
    second = repro.train(data, len(chars), size, weight=0.1, seed=3, log_every=0)
    assert all((a == b).all() for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True))
