"""The first GPU run: per-probe time ratios and ``torch.cuda.max_memory_allocated`` at Llama-3-8B and LLaDA-8B widths.

    python benchmarks/gpu_first_run.py --out results/gpu_first_run.md            # on a CUDA machine (full depth)
    python benchmarks/gpu_first_run.py --dry-run --out /tmp/dry.md               # CPU, tiny shapes, seconds

Run by ``benchmarks/gpu_first_run.sh`` (which installs the wheels first). One process: the Llama-3-8B shape (32
layers, bfloat16, random weights built on the device: ``benchmarks/shapes.py``) under plain ``hf`` and every probe
setting of ``hf-probes`` at batch 1 and at ``batch_size=auto``, multiple choice (``probes_synth_logic``) and
generation (``probes_synth_arith_gen``); then the LLaDA-8B shape under ``hf-probes-diffusion`` (``probes=none``
and ``reader``). Each setting: a fresh wrapper, one warm-up document, then ``--limit`` documents timed
(``torch.cuda.synchronize`` around), the device's peak allocation reset before the warm-up. Writes one Markdown
table (and the rows as JSON beside it), row by row, so that a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_shapes import TASKS, evaluate, wrapper  # noqa: E402
from shapes import build_model, offline_tokenizer, resolve  # noqa: E402

AUTOREGRESSIVE_SETTINGS = ("hf", "none", "tcb+bte", "tcb", "bte", "omega", "margin", "reader", "all")
AUTO_SETTINGS = ("hf", "tcb+bte", "all")
DIFFUSION_SETTINGS = ("none", "reader")
DRY_SETTINGS = ("hf", "all")


def measure(name: str, model: Any, tokenizer: Any, shape: Any, task: str, args: argparse.Namespace, batch: str) -> dict:
    import torch

    cuda = args.device.startswith("cuda")
    options = argparse.Namespace(**{**vars(args), "batch_size": int(batch) if batch.isdigit() else batch})
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    lm = wrapper(name, model, tokenizer, shape, options)
    evaluate(lm, TASKS[task], 1, options)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    evaluate(lm, TASKS[task], args.limit, options)
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    row = {"shape": shape.name, "layers": args.layers, "task": task, "setting": name, "batch": batch, "limit": args.limit,
           "wall_s": wall, "batch_used": getattr(lm, "batch_size_per_gpu", None)}
    row["max_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    del lm
    gc.collect()
    return row


def table_line(row: dict, base: dict | None) -> str:
    ratio = f"{row['wall_s'] / base['wall_s']:.2f}" if base else "–"
    memory = "–" if row["max_allocated_gib"] is None else f"{row['max_allocated_gib']:.2f}"
    return (f"| {row['shape']} × {row['layers']} | {row['task']} | {row['setting']} | {row['batch']} ({row['batch_used']}) | "
            f"{row['wall_s']:.2f} | {ratio} | {memory} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the Markdown table (rows as JSON in OUT.jsonl)")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, tiny shapes (1/64 of every width), 2 layers, one document, hf and all, "
                             "all at batch 4 in place of auto")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max_gen_toks", type=int, default=64)
    args = parser.parse_args(argv)
    if args.dry_run:
        args.device, args.limit, args.max_gen_toks = "cpu", 1, 4
    llama, llada = (resolve("llama3-8b/64"), resolve("llada-8b/64")) if args.dry_run else (resolve("llama3-8b"), resolve("llada-8b"))
    settings = DRY_SETTINGS if args.dry_run else AUTOREGRESSIVE_SETTINGS
    kind = "tiny" if args.dry_run else "smollm2"
    # max_length bounds batch_size=auto's detection (HFLM tries its batch at the longest length the model allows)
    defaults = {"max_length": 512 if args.dry_run else 2048, "diffusion_steps": 4 if args.dry_run else 32, "diffusion_mc_samples": 2 if args.dry_run else 8}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    jsonl = args.out.with_suffix(args.out.suffix + ".jsonl")
    jsonl.write_text("")
    with args.out.open("w") as out:
        out.write("| shape × layers | task | setting | batch (used) | wall s | × first row | max allocated GiB |\n"
                  "|---|---|---|---|---|---|---|\n")
        # on a CPU, HFLM's batch-size detection runs minutes of forwards at batch 64: the dry run takes batch 4
        batched = [(s, "4") for s in ("all",)] if args.dry_run else [(s, "auto") for s in AUTO_SETTINGS]
        for shape, plan in ((llama, [(s, "1") for s in settings] + batched),
                            (llada, [(s, "1") for s in DIFFUSION_SETTINGS])):
            args.layers = 2 if args.dry_run else shape.full_layers
            tokenizer = offline_tokenizer(kind, mask=shape.diffusion is not None)
            model = build_model(shape, args.layers, tokenizer=tokenizer, device=args.device)
            run = argparse.Namespace(**{**vars(args), **defaults})
            for task in ("mc", "gen"):
                base = None
                for name, batch in plan:
                    try:
                        row = measure(name, model, tokenizer, shape, task, run, batch)
                    except Exception as error:  # noqa: BLE001  (a failed setting is a row of the table, the run goes on)
                        row = {"shape": shape.name, "task": task, "setting": name, "batch": batch, "failed": repr(error)[:300]}
                        out.write(f"| {shape.name} | {task} | {name} | {batch} | failed: {row['failed']} | | |\n")
                    else:
                        base = base or row
                        out.write(table_line(row, base) + "\n")
                    out.flush()
                    with jsonl.open("a") as lines:
                        lines.write(json.dumps(row) + "\n")
            del model
            gc.collect()
    print(args.out.read_text())


if __name__ == "__main__":
    main()
