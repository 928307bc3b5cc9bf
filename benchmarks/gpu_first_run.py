"""The first GPU run: per-probe time ratios, generated tokens and ``torch.cuda.max_memory_allocated`` at Llama-3-8B and
LLaDA-8B widths.

    python benchmarks/gpu_first_run.py --out results/gpu_first_run.md            # on a CUDA machine (full depth)
    python benchmarks/gpu_first_run.py --dry-run --out /tmp/dry.md               # CPU, tiny shapes, seconds

Run by ``benchmarks/gpu_first_run.sh`` (which installs the wheels first). One process: the Llama-3-8B shape (32
layers, bfloat16, random weights built on the device: ``benchmarks/shapes.py``) under plain ``hf`` and every probe
setting of ``hf-probes`` at batch 1 and at ``batch_size=auto``, multiple choice (``probes_synth_logic``,
``--mc_limit`` documents: 200) and generation (``probes_synth_arith_gen``, ``--gen_limit`` documents of
``--max_gen_toks`` new tokens); then the LLaDA-8B shape under ``hf-probes-diffusion`` (``probes=none`` and
``reader``). Plain ``hf`` runs untimed on ``--warm`` documents of each task first (the process's first kernels,
cuBLAS's first shapes). Each setting: a fresh wrapper, one warm-up document, then its documents timed
(``torch.cuda.synchronize`` around), the device's peak allocation reset before the warm-up, and the tokens
``generate`` returned beyond the prompts counted (greedy decoding of one model: settings that stop at other tokens
do other work). No row starts after ``--minutes`` (7: the run ends within 8 minutes on one H200). Writes one
Markdown table (and the rows as JSON beside it), row by row, so that a run cut short keeps what it measured.
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

AUTOREGRESSIVE_SETTINGS = ("hf", "none", "tcb+bte", "reader", "omega", "margin", "all")
AUTO_SETTINGS = ("hf", "tcb+bte", "all")
DIFFUSION_SETTINGS = ("none", "reader")
DRY_SETTINGS = ("hf", "all")


class GeneratedTokens:
    """Counts the tokens ``model.generate`` returns beyond its prompts while installed (an instance attribute)."""

    def __init__(self, model: Any) -> None:
        self.model, self.count, self.original = model, 0, model.generate

        def counted(*args: Any, **kwargs: Any) -> Any:
            out = self.original(*args, **kwargs)
            prompt = kwargs.get("input_ids", args[0] if args else None)
            sequences = getattr(out, "sequences", out)
            if prompt is not None and hasattr(sequences, "shape"):
                self.count += sequences.shape[0] * (sequences.shape[1] - prompt.shape[1])
            return out

        model.generate = counted

    def remove(self) -> None:
        del self.model.generate


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
    limit = args.mc_limit if task == "mc" else args.gen_limit
    generated = GeneratedTokens(model)
    start = time.perf_counter()
    try:
        evaluate(lm, TASKS[task], limit, options)
        if cuda:
            torch.cuda.synchronize()
    finally:
        generated.remove()
    wall = time.perf_counter() - start
    row = {"shape": shape.name, "layers": args.layers, "task": task, "setting": name, "batch": batch, "limit": limit,
           "wall_s": wall, "batch_used": getattr(lm, "batch_size_per_gpu", None),
           "generated_tokens": generated.count if task == "gen" and shape.diffusion is None else None}
    row["max_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    del lm
    gc.collect()
    return row


def table_line(row: dict, base: dict | None) -> str:
    ratio = f"{row['wall_s'] / base['wall_s']:.2f}" if base else "–"
    memory = "–" if row["max_allocated_gib"] is None else f"{row['max_allocated_gib']:.2f}"
    tokens = "–" if row["generated_tokens"] is None else str(row["generated_tokens"])
    return (f"| {row['shape']} × {row['layers']} | {row['task']} | {row['setting']} | {row['batch']} ({row['batch_used']}) | "
            f"{row['limit']} | {row['wall_s']:.2f} | {ratio} | {tokens} | {memory} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the Markdown table (rows as JSON in OUT.jsonl)")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, tiny shapes (1/64 of every width), 2 layers, one document per task, hf and all, "
                             "all at batch 4 in place of auto, no time limit")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--mc_limit", type=int, default=200, help="multiple-choice documents timed per setting")
    parser.add_argument("--gen_limit", type=int, default=4, help="generation documents timed per setting")
    parser.add_argument("--max_gen_toks", type=int, default=64)
    parser.add_argument("--warm", type=int, default=16, help="documents of each task plain hf runs untimed first")
    parser.add_argument("--minutes", type=float, default=7.0, help="no row starts after this many minutes")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.device, args.mc_limit, args.gen_limit, args.max_gen_toks, args.warm, args.minutes = "cpu", 1, 1, 4, 1, 60.0
    llama, llada = (resolve("llama3-8b/64"), resolve("llada-8b/64")) if args.dry_run else (resolve("llama3-8b"), resolve("llada-8b"))
    settings = DRY_SETTINGS if args.dry_run else AUTOREGRESSIVE_SETTINGS
    kind = "tiny" if args.dry_run else "smollm2"
    # max_length bounds batch_size=auto's detection (HFLM tries its batch at the longest length the model allows)
    defaults = {"max_length": 512 if args.dry_run else 2048, "diffusion_steps": 4 if args.dry_run else 32, "diffusion_mc_samples": 2 if args.dry_run else 8}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    jsonl = args.out.with_suffix(args.out.suffix + ".jsonl")
    jsonl.write_text("")
    began = time.perf_counter()
    with args.out.open("w") as out:
        out.write("| shape × layers | task | setting | batch (used) | documents | wall s | × first row | generated tokens "
                  "| max allocated GiB |\n|---|---|---|---|---|---|---|---|---|\n")
        # on a CPU, HFLM's batch-size detection runs minutes of forwards at batch 64: the dry run takes batch 4
        batched = [(s, "4") for s in ("all",)] if args.dry_run else [(s, "auto") for s in AUTO_SETTINGS]
        for shape, plan in ((llama, [(s, "1") for s in settings] + batched),
                            (llada, [(s, "1") for s in DIFFUSION_SETTINGS])):
            args.layers = 2 if args.dry_run else shape.full_layers
            tokenizer = offline_tokenizer(kind, mask=shape.diffusion is not None)
            model = build_model(shape, args.layers, tokenizer=tokenizer, device=args.device)
            run = argparse.Namespace(**{**vars(args), **defaults})
            if shape.diffusion is None:  # warm plain hf first: the process's first kernels and GEMM shapes
                warm = wrapper("hf", model, tokenizer, shape, argparse.Namespace(**{**vars(run), "batch_size": 1}))
                for task in ("mc", "gen"):
                    evaluate(warm, TASKS[task], args.warm, run)
                del warm
            for task in ("mc", "gen"):
                base = None
                for name, batch in plan:
                    if time.perf_counter() - began > 60 * args.minutes:
                        row = {"shape": shape.name, "task": task, "setting": name, "batch": batch,
                               "skipped": f"after {args.minutes:g} minutes"}
                        out.write(f"| {shape.name} | {task} | {name} | {batch} | skipped: {row['skipped']} | | | | |\n")
                        with jsonl.open("a") as lines:
                            lines.write(json.dumps(row) + "\n")
                        continue
                    try:
                        row = measure(name, model, tokenizer, shape, task, run, batch)
                    except Exception as error:  # noqa: BLE001  (a failed setting is a row of the table, the run goes on)
                        row = {"shape": shape.name, "task": task, "setting": name, "batch": batch, "failed": repr(error)[:300]}
                        out.write(f"| {shape.name} | {task} | {name} | {batch} | failed: {row['failed']} | | | | |\n")
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
