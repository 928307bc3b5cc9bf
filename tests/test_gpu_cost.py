"""``benchmarks/gpu_cost.py --dry-run``: the counts a GPU's cost is predicted from, on tiny widths, in this process."""

from __future__ import annotations

import json
import sys
from pathlib import Path


_SAVED = list(sys.path)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
try:  # with the modules it imports inside its functions; then the folder leaves sys.path again, where its
    import gpu_cost  # noqa: E402  calibration.py would shadow HELM's calibration package for this worker's other tests
    import real_shapes  # noqa: E402, F401
    import shapes  # noqa: E402, F401
finally:
    sys.path[:] = _SAVED


def test_the_counter_sees_ops_syncs_and_flops_by_dtype():
    import torch

    counter = gpu_cost._counter_mode()
    a = torch.ones(4, 8, dtype=torch.bfloat16)
    with counter:
        (a @ a.T).sum().item()
        torch.ones(3, 5, dtype=torch.float64) @ torch.ones(5, 2, dtype=torch.float64)
    assert counter.flops["bf16"] == 2 * 4 * 8 * 4 and counter.flops["fp64"] == 2 * 3 * 5 * 2
    assert counter.syncs == 1 and counter.ops >= 5
    views = counter.views
    with counter:
        a[:2].T.detach()  # slice, transpose and detach: views, no kernel
        a + 1
    assert counter.views - views == 3


def test_float32_products_count_as_tensor_core_products():
    """A product with ``out_dtype=torch.float32`` from bfloat16 terms counts as bfloat16 work (emulated on the CPU)."""
    import torch

    from lm_eval_probes.stack_api import float32_products_emulated, matmul_float32

    counter = gpu_cost._counter_mode()
    with float32_products_emulated(), counter:
        out = matmul_float32(torch.randn(4, 8), torch.randn(8, 2, dtype=torch.bfloat16))
    assert out.dtype == torch.float32
    assert counter.flops["fp32"] == 0 and counter.flops["bf16"] == 3 * 2 * 4 * 8 * 2  # 3 terms × a bf16 operand


def test_dry_run_prints_every_setting(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert gpu_cost.main(["--dry-run", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(row["task"], row["setting"]) for row in rows} == {(t, s) for t in gpu_cost.TASK_NAMES for s in gpu_cost.SETTINGS}
    assert all(row["ops"] > 0 and row["flops"]["bf16"] > 0 for row in rows)
    printed = capsys.readouterr().out
    assert printed.count("\n| mc |") == len(gpu_cost.SETTINGS) and printed.count("\n| gen |") == len(gpu_cost.SETTINGS)
