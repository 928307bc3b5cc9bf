"""What each probe setting costs on a GPU, counted on any machine: matmul FLOPs by dtype, aten ops (kernel launches)
and device→host syncs per document, and a predicted H200 time from them.

    python benchmarks/gpu_cost.py                      # Llama-3-8B widths × 4 layers, bf16, batch 1, 2 + 2 documents
    python benchmarks/gpu_cost.py --dry-run            # 1/64 of every width, 2 layers, 1 document (make test)
    python benchmarks/gpu_cost.py --json out.json --check   # also write the rows; exit 1 if a cap of issue 51 fails

A GPU runs bfloat16 products on tensor cores ~15× faster than float32 and float64, pays a launch for every kernel and
stalls at every ``.item()``; a CPU shows none of this in its wall time, so this script counts instead. One process
builds the model (``benchmarks/shapes.py``: random weights, bfloat16, SmolLM2's tokenizer for real text lengths) and,
for plain ``hf`` and each probe setting of ``hf-probes``, multiple choice (``probes_synth_logic``) and generation
(``probes_synth_arith_gen``, ``--max_gen_toks`` new tokens), warms a fresh wrapper on one document (the one after
those counted: the margins reuse the values of a row seen before) and then runs
``--documents`` documents under a :class:`CostCounter` (a ``TorchDispatchMode``) that tallies

* every aten op that reaches the dispatcher (≈ one kernel launch each on a GPU),
* ``aten::_local_scalar_dense``: a tensor value read by the host (``.item()``, ``int(t)``, ``bool(t)``: one
  device→host sync each on a GPU; ``.tolist()``/``.cpu()`` of a CPU tensor are not seen here),
* the products a GPU runs with ``out_dtype=torch.float32`` on tensor cores
  (:mod:`lm_eval_probes.stack_api`) take that path here too (``float32_products_emulated``: computed from
  their float32 values on the CPU, counted as what the GPU runs);
* the FLOPs of every matrix product (``torch.utils.flop_counter``'s formulas: mm, bmm, addmm, baddbmm, matmul's
  decompositions, convolutions, scaled-dot-product attention) by the dtype of its inputs (bfloat16/float16 run on
  tensor cores, even with a float32 output).

**The time model** (stated, not measured here): per document,
``t = F_bf16 / 690 TFLOP/s + F_fp32 / 50 TFLOP/s + F_fp64 / 60 TFLOP/s + ops · c_op + syncs · c_sync``
with the H200's dense rates (bf16 with float32 accumulation measured at 655–693 TFLOP/s in issue 51, float32
without tensor cores ~50, float64 ~60), and c_op, c_sync fitted (:data:`FITTED`) to the first H200 table of
issue 51 (multiple choice, 48 documents, batch 1, 32 layers). The counts are per document at ``--layers``; the
prediction extrapolates them to ``--predict_layers`` (32) from a second count at half the layers (FLOPs and ops are
affine in the depth), so it prints beside that measured table.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SETTINGS = ("hf", "none", "tcb+bte", "reader", "omega", "margin", "all")
TASK_NAMES = {"mc": "probes_synth_logic", "gen": "probes_synth_arith_gen"}
RATES = {"bf16": 690e12, "fp32": 50e12, "fp64": 60e12}
"""Dense matmul rates of one H200 (FLOP/s): bfloat16/float16 on tensor cores with float32 accumulation, float32 and
float64 without."""
FITTED = {"op_s": 1.7e-5, "sync_s": 3.7e-4}
"""Seconds per aten op and per device→host sync on the H200 of issue 51 (torch 2.11, eager mode, batch 1): fitted
(non-negative least squares over the multiple-choice rows of :data:`MEASURED`, FLOP time subtracted) to the counts of
74f2633, the code that was measured, carried to 32 layers (``docs/performance.md``), rounded; ``--fit`` fits again."""
MEASURED = {  # issue 51: one H200, Llama-3-8B shape × 32 layers, bf16, batch 1, warm; seconds per document
    "mc": {"hf": 1.39 / 48, "none": 2.23 / 48, "tcb+bte": 2.42 / 48, "reader": 2.77 / 48, "omega": 5.44 / 48,
           "margin": 24.0 / 48, "all": 4.96 / 8},
    "gen": {"hf": 24.9 / 8, "none": 23.9 / 8, "tcb+bte": 23.7 / 8, "reader": 16.7 / 8, "omega": 16.4 / 8,
            "margin": 25.7 / 8, "all": 26.1 / 8},
}
CAPS = {"tcb+bte": 1.5, "reader": 1.5, "margin": 3.0, "omega": 3.0, "all": 4.0}
"""Issue 51's caps on aten ops per document, × ``probes=none`` of the same task."""


def _dtype_class(dtype: Any) -> str:
    import torch

    if dtype in (torch.bfloat16, torch.float16):
        return "bf16"
    return {torch.float32: "fp32", torch.float64: "fp64"}.get(dtype, str(dtype))


def _counter_mode() -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    scalar = torch.ops.aten._local_scalar_dense
    dtyped = (torch.ops.aten.mm.dtype, torch.ops.aten.bmm.dtype)

    class CostCounter(TorchDispatchMode):
        """Tallies aten ops (and of them the views: metadata only, no kernel on a GPU), ``_local_scalar_dense`` calls
        and matmul FLOPs by input dtype while active."""

        def __init__(self) -> None:
            super().__init__()
            self.ops = 0
            self.views = 0
            self.syncs = 0
            self.flops: dict[str, float] = {"bf16": 0.0, "fp32": 0.0, "fp64": 0.0}

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            self.ops += 1
            self.views += bool(getattr(func, "is_view", False))
            packet = func._overloadpacket
            if packet is scalar:
                self.syncs += 1
            elif packet in flop_registry:
                dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
                if func in dtyped:  # mm/bmm with out_dtype: (a, b, out_dtype)
                    args, kwargs = args[:2], {}
                flops = flop_registry[packet](*args, **kwargs, out_val=out)
                key = _dtype_class(dtype)
                self.flops[key] = self.flops.get(key, 0.0) + float(flops)
            return out

    return CostCounter()


@dataclass
class Count:
    """Per document: matmul FLOPs by input dtype, aten ops, scalar reads (syncs), and of the ops the views (``slice``,
    ``view``, ``select``, ``detach``…: metadata, no kernel launched on a GPU; the caps count every aten op)."""

    task: str
    setting: str
    layers: int
    documents: int
    flops: dict[str, float] = field(default_factory=dict)
    ops: float = 0.0
    views: float = 0.0
    syncs: float = 0.0

    def predicted_s(self, fitted: dict[str, float] = FITTED) -> float:
        compute = sum(self.flops.get(kind, 0.0) / rate for kind, rate in RATES.items())
        return compute + self.ops * fitted["op_s"] + self.syncs * fitted["sync_s"]


def count(lm: Any, task: str, documents: int, args: argparse.Namespace, setting: str, layers: int) -> Count:
    from real_shapes import evaluate

    try:
        from lm_eval_probes.stack_api import float32_products_emulated
    except ImportError:  # an install from before issue 51 (--baseline counts): no tensor-core branch to take
        from contextlib import nullcontext as float32_products_emulated

    # warm-up on the document after the counted ones: one-time copies (the lens's W) and the load's work are not
    # counted, and no counted document was seen before (the margins reuse a row's values for a later row that begins
    # with its tokens)
    evaluate(lm, TASK_NAMES[task], 1, args, skip=documents)
    counter = _counter_mode()
    with float32_products_emulated(), counter:  # the GPU's products: bfloat16 terms, float32 output
        evaluate(lm, TASK_NAMES[task], documents, args)
    per = 1.0 / documents
    return Count(task, setting, layers, documents, {k: v * per for k, v in counter.flops.items()},
                 ops=counter.ops * per, syncs=counter.syncs * per, views=counter.views * per)


def counts_at(shape_name: str, layers: int, args: argparse.Namespace) -> list[Count]:
    import torch

    from real_shapes import wrapper
    from shapes import build_model, offline_tokenizer, resolve

    shape = resolve(shape_name)
    tokenizer = offline_tokenizer(args.tokenizer)
    model = build_model(shape, layers, tokenizer=tokenizer, device="cpu")
    options = argparse.Namespace(batch_size=1, device="cpu", max_length=args.max_length, max_gen_toks=args.max_gen_toks)
    rows = []
    with torch.inference_mode(False):
        for task in args.tasks:
            for setting in args.settings:
                lm = wrapper(setting, model, tokenizer, shape, options)
                row = count(lm, task, args.documents, options, setting, layers)
                rows.append(row)
                print(json.dumps(asdict(row)), file=sys.stderr, flush=True)
                del lm
                gc.collect()
    del model
    gc.collect()
    return rows


def extrapolated(low: Count, high: Count, layers: int) -> Count:
    """``high``'s counts carried to ``layers`` along the line through ``low`` and ``high`` (affine in the depth)."""
    def at(a: float, b: float) -> float:
        return max(0.0, b + (b - a) * (layers - high.layers) / (high.layers - low.layers))

    kinds = set(low.flops) | set(high.flops)
    return Count(high.task, high.setting, layers, high.documents,
                 {k: at(low.flops.get(k, 0.0), high.flops.get(k, 0.0)) for k in kinds},
                 ops=at(low.ops, high.ops), syncs=at(low.syncs, high.syncs), views=at(low.views, high.views))


def fit(rows: list[Count]) -> dict[str, float]:
    """c_op, c_sync by non-negative least squares over the multiple-choice rows of :data:`MEASURED`."""
    import numpy as np
    from scipy.optimize import nnls

    use = [row for row in rows if row.task == "mc" and row.setting in MEASURED["mc"]]
    a = np.array([[row.ops, row.syncs] for row in use])
    b = np.array([MEASURED["mc"][row.setting] - row.predicted_s({"op_s": 0.0, "sync_s": 0.0}) for row in use])
    (op_s, sync_s), _ = nnls(a, b)
    return {"op_s": float(op_s), "sync_s": float(sync_s)}


def checks(rows: list[Count]) -> list[str]:
    """Issue 51's caps per task against ``probes=none``: float64 FLOPs ≤ 0.1 % and float32 ≤ 1 % of none's bf16, syncs ≤
    none's + 4, aten ops ≤ :data:`CAPS` × none's. Returns the failures, one line each."""
    failures = []
    for task in {row.task for row in rows}:
        base = next((row for row in rows if row.task == task and row.setting == "none"), None)
        if base is None:
            continue
        bf16 = base.flops.get("bf16", 0.0)
        for row in rows:
            if row.task != task or row.setting == "hf":
                continue
            where = f"{task} {row.setting}"
            if row.flops.get("fp64", 0.0) > 1e-3 * bf16:
                failures.append(f"{where}: float64 {row.flops['fp64'] / 1e9:.3g} GFLOP > 0.1 % of none's bf16")
            if row.flops.get("fp32", 0.0) > 1e-2 * bf16:
                failures.append(f"{where}: float32 {row.flops['fp32'] / 1e9:.3g} GFLOP > 1 % of none's bf16")
            if row.syncs > base.syncs + 4:
                failures.append(f"{where}: {row.syncs:g} syncs > none's {base.syncs:g} + 4")
            if row.setting in CAPS and row.ops > CAPS[row.setting] * base.ops:
                failures.append(f"{where}: {row.ops:g} ops > {CAPS[row.setting]} × none's {base.ops:g}")
    return failures


def table(rows: list[Count], predicted: dict[tuple[str, str], Count], fitted: dict[str, float], layers: int,
          predict_layers: int | None) -> str:
    head = (f"| task | setting | bf16 GFLOP | float32 GFLOP | float64 GFLOP | aten ops | of them views | scalar reads |"
            + (f" predicted H200 s/doc at {predict_layers} layers (× hf) | measured s/doc (× hf) |" if predict_layers else "")
            + "\n|---|---|---|---|---|---|---|---|" + ("---|---|" if predict_layers else "") + "\n")
    lines = []
    for row in rows:
        line = (f"| {row.task} | {row.setting} | {row.flops.get('bf16', 0) / 1e9:.4g} | {row.flops.get('fp32', 0) / 1e9:.4g} | "
                f"{row.flops.get('fp64', 0) / 1e9:.4g} | {row.ops:,.0f} | {row.views:,.0f} | {row.syncs:,.1f} |")
        if predict_layers:
            full = predicted[row.task, row.setting]
            hf = predicted.get((row.task, "hf"))
            ratio = f" ({full.predicted_s(fitted) / hf.predicted_s(fitted):.2f})" if hf else ""
            measured = MEASURED.get(row.task, {}).get(row.setting)
            measured_hf = MEASURED.get(row.task, {}).get("hf")
            shown = f"{measured:.4f} ({measured / measured_hf:.2f})" if measured else "–"
            line += f" {full.predicted_s(fitted):.4f}{ratio} | {shown} |"
        lines.append(line)
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama3-8b")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--predict_layers", type=int, default=32,
                        help="depth of the predicted time (0: no prediction, no second count)")
    parser.add_argument("--documents", type=int, default=2)
    parser.add_argument("--max_gen_toks", type=int, default=16)
    parser.add_argument("--max_length", type=int, default=2048)
    parser.add_argument("--tasks", nargs="+", default=list(TASK_NAMES), choices=list(TASK_NAMES))
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--tokenizer", default="smollm2", choices=("smollm2", "tiny"))
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--fit", action="store_true", help="fit c_op and c_sync to issue 51's table and use them")
    parser.add_argument("--check", action="store_true", help="exit 1 when a cap of issue 51 fails (printed)")
    parser.add_argument("--json", type=Path, help="write the rows (counts at --layers) as JSON")
    parser.add_argument("--dry-run", action="store_true",
                        help="1/64 of every width, 2 layers, 1 document, 4 new tokens, the tiny tokenizer, no prediction")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.shape, args.layers, args.documents, args.max_gen_toks = f"{args.shape}/64", 2, 1, 4
        args.predict_layers, args.tokenizer, args.max_length = 0, "tiny", 512
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    rows = counts_at(args.shape, args.layers, args)
    predicted: dict[tuple[str, str], Count] = {}
    fitted = dict(FITTED)
    if args.predict_layers:
        low_layers = max(1, args.layers // 2)
        low = {(row.task, row.setting): row for row in counts_at(args.shape, low_layers, args)}
        predicted = {(row.task, row.setting): extrapolated(low[row.task, row.setting], row, args.predict_layers)
                     for row in rows}
        if args.fit:
            fitted = fit(list(predicted.values()))
    print(f"# {args.shape} × {args.layers} layers, bf16, batch 1, {args.documents} documents per task, "
          f"{args.max_gen_toks} new tokens; per document")
    if args.predict_layers:
        print(f"# time model: bf16 {RATES['bf16'] / 1e12:g}, float32 {RATES['fp32'] / 1e12:g}, float64 "
              f"{RATES['fp64'] / 1e12:g} TFLOP/s; {fitted['op_s'] * 1e6:.3g} µs per aten op, "
              f"{fitted['sync_s'] * 1e6:.3g} µs per sync{' (fitted now)' if args.fit else ''}")
    print(table(rows, predicted, fitted, args.layers, args.predict_layers))
    if args.json:  # the counts at --layers, those carried to --predict_layers, the per-op and per-sync costs used
        args.json.write_text(json.dumps({"rows": [asdict(row) for row in rows],
                                         "predicted": [asdict(row) for row in predicted.values()],
                                         "fitted": fitted}, indent=1))
    failures = checks(rows)
    for failure in failures:
        print("over a cap:", failure)
    return 1 if args.check and failures else 0


if __name__ == "__main__":
    sys.exit(main())
