"""``benchmarks/gpu_first_run.sh --dry-run``: the GPU script's own code path on CPU with tiny shapes (no install)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_first_run.sh"


def test_the_gpu_script_dry_run_writes_its_table(tmp_path):
    """The dry run needs the package's runtime dependencies alone: a ``pytest`` that cannot be imported (a module of
    that name that raises, first on ``PYTHONPATH``) changes nothing."""
    out = tmp_path / "gpu.md"
    blocked = tmp_path / "no-pytest"
    for name in ("pytest", "_pytest"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text("raise ImportError('pytest is not installed here')\n")
    path = os.pathsep.join(filter(None, [str(blocked), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": path}
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "gpu.md.jsonl").read_text().splitlines()]
    assert not [row for row in rows if "failed" in row], rows
    settings = {(row["shape"], row["task"], row["setting"], row["batch"]) for row in rows}
    for task in ("mc", "gen"):
        for name in ("hf", "all"):
            assert ("llama3-8b/64", task, name, "1") in settings
        assert ("llama3-8b/64", task, "all", "4") in settings  # batch auto on the GPU
        assert ("llada-8b/64", task, "reader", "1") in settings
    assert all(row["wall_s"] > 0 and row["max_allocated_gib"] is None for row in rows)  # CPU: no device memory
    for row in rows:  # the tokens generate returned are recorded per row (the diffusion wrapper does not call it)
        counted = row["task"] == "gen" and row["shape"] == "llama3-8b/64"
        assert (row["generated_tokens"] is not None and 0 < row["generated_tokens"] <= 4) if counted else \
            row["generated_tokens"] is None, row
    table = out.read_text().splitlines()
    assert table[0].startswith("| shape × layers |") and len(table) == 2 + len(rows)
