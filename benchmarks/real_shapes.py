"""Memory and time of each probe at the real widths of 7–9B models (built in-process: ``benchmarks/shapes.py``).

    python benchmarks/real_shapes.py memory [--shapes llama3-8b ...] [--layers 2 4] [--tasks mc gen] [--probes ...]
    python benchmarks/real_shapes.py time   [--shapes llama3-8b ...] [--layers 2 4] [--tasks mc gen] [--repeats 2]

``memory``: every (shape, layers, task, probes) in a fresh process (one configuration per process: the peak
resident memory is that configuration's own), RSS sampled every 5 ms during ``simple_evaluate``; printed per row:
the peak over the model's loaded RSS, the extra peak over ``probes=none`` of the same shape, layers and task,
and the memory model's figure for it (:func:`predicted_extra`: the probes' own declarations) with the
measured / predicted ratio; the longest request's tokens T and the batch B come from the run itself (a hook on
the model's forward). ``time``: per (shape, layers, task) one process that builds the model once and then, in
each repeat, runs plain ``hf`` and every probe setting one after the other (a fresh wrapper each time, warmed
on one document first, so one-time copies are not timed); the best wall time of the repeats counts; printed:
seconds and the ratio over plain ``hf`` (and over ``probes=none``).

Tasks: ``mc`` = ``probes_synth_logic`` (multiple choice), ``gen`` = ``probes_synth_arith_gen`` (generation,
``--max_gen_toks`` tokens), ``long`` = one two-option document whose context is ``--context_tokens`` tokens (4096:
the bounded-memory check of ``docs/performance.md``; ``--limit`` does not apply). The text is tokenised by SmolLM2's
tokenizer (offline; real lengths); the models keep their real vocabulary (``shapes.confine_to_tokenizer``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import PeakRss  # noqa: E402  (the RSS sampler both benchmarks use)
from shapes import SHAPES, Shape, peak_allocated, resolve  # noqa: E402

TASKS = {"mc": "probes_synth_logic", "gen": "probes_synth_arith_gen", "long": None}
LONG_TEXT = "Anne is kind. If someone is kind then they are smart. The bear is red and the cat is big. "
PROBES = ("none", "tcb+bte", "tcb", "bte", "omega", "margin", "reader", "all")
GIB = 2**30


# --------------------------------------------------------------------------------------------- the memory model

def predicted_extra(probe: str, shape: Shape, *, layers: int, batch: int, tokens: int, dtype_bytes: int,
                    chunk_positions: int = 64) -> float:
    """Bytes a probe setting adds to the peak over ``probes=none``: the memory model of ``docs/performance.md``, which is
    the probes' own declarations (:func:`lm_eval_probes.capture.memory.expected_peak`: the wrappers' states and lens
    block once, plus the largest enabled probe's declared memory) for B = ``batch`` sequences of T = ``tokens``."""
    from lm_eval_probes.api import Shapes
    from lm_eval_probes.capture.memory import expected_peak
    from lm_eval_probes.config import ProbeConfig

    if probe == "none":
        return 0.0
    from shapes import model_config

    config = ProbeConfig.from_model_args({"probes": probe, "probe_chunk_positions": chunk_positions})
    layer_types = tuple(getattr(model_config(shape, layers, pad=0, eos=0), "layer_types", None) or ())
    shapes = Shapes(batch=batch, tokens=tokens, response_tokens=tokens, layers=layers, width=shape.hidden,
                    vocab=shape.vocab, heads=shape.heads, head_dim=shape.head_dim, dtype_bytes=dtype_bytes,
                    chunk_positions=chunk_positions, ffn=shape.ffn, layer_types=layer_types, kv_heads=shape.kv_heads)
    return float(expected_peak(config, shapes))


# --------------------------------------------------------------------------------------------- one process

def build(args: argparse.Namespace) -> tuple[Any, Any, Shape]:
    import torch

    from shapes import build_model, offline_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    shape = resolve(args.shape)
    tokenizer = offline_tokenizer(args.tokenizer, mask=shape.diffusion is not None)
    model = build_model(shape, args.layers, tokenizer=tokenizer, dtype=args.dtype, device=args.device)
    return model, tokenizer, shape


def wrapper(name: str, model: Any, tokenizer: Any, shape: Shape, args: argparse.Namespace) -> Any:
    """Plain ``hf`` (``name == "hf"``), ``hf-probes`` with ``probes=name``, or ``hf-probes-diffusion``."""
    from lm_eval.models.huggingface import HFLM

    common = {"pretrained": model, "tokenizer": tokenizer, "batch_size": args.batch_size, "device": args.device}
    if args.max_length:
        common["max_length"] = args.max_length
    if name == "hf":
        return HFLM(**common)
    probes = {"tcb+bte": "tcb,bte", "all": "all"}.get(name, name)
    if shape.diffusion is not None:
        from lm_eval_probes.models.diffusion import DiffusionProbeHFLM

        return DiffusionProbeHFLM(**common, probes=probes, diffusion_family=shape.diffusion,
                                  diffusion_steps=args.diffusion_steps, diffusion_mc_samples=args.diffusion_mc_samples)
    from lm_eval_probes.models.autoregressive import ProbeHFLM

    return ProbeHFLM(**common, probes=probes)


class LongestForward:
    """A pre-hook on the model: the largest batch and sequence length it was called with."""

    def __init__(self, model: Any) -> None:
        self.batch = self.tokens = 0
        self.handle = model.register_forward_pre_hook(self.seen, with_kwargs=True)

    def seen(self, _module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.ndim == 2:
            self.batch, self.tokens = max(self.batch, ids.shape[0]), max(self.tokens, ids.shape[1])


_TASKS: dict[tuple[str, int], Any] = {}


def evaluate(lm: Any, task: str, limit: int, args: argparse.Namespace, *, skip: int = 0) -> None:
    """``lm_eval.evaluator.evaluate`` on ``task``'s first ``limit`` documents (with ``skip``: the ``limit`` after the
    first ``skip``, e.g. a warm-up on other documents than those measured). The task is built once per process
    (the synthetic tasks generate their documents when built: ~10 s here) and lm_eval's own task folder is not
    indexed (``include_defaults=False``: ~2 min of CPU); what ``simple_evaluate`` adds (the environment report,
    a few more seconds) is left out. ``max_gen_toks`` as ``simple_evaluate``'s ``gen_kwargs`` sets it."""
    import lm_eval.evaluator
    from lm_eval.tasks import TaskManager

    import lm_eval_probes

    key = (task, args.max_gen_toks)
    if key not in _TASKS:
        loaded = TaskManager(include_path=lm_eval_probes.TASKS_DIR, include_defaults=False).load([task])
        for task_obj in loaded["tasks"].values():
            if task_obj.get_config("output_type") == "generate_until":
                task_obj.set_config(key="generation_kwargs", value={"max_gen_toks": args.max_gen_toks}, update=True)
            if task_obj.get_config("num_fewshot") is None:
                task_obj.set_config(key="num_fewshot", value=0)
            task_obj.set_fewshot_seed(seed=1234)
        _TASKS[key] = loaded
    samples = {name: list(range(skip, skip + limit)) for name in _TASKS[key]["tasks"]} if skip else None
    lm_eval.evaluator.evaluate(lm=lm, task_dict=_TASKS[key], limit=None if skip else limit, samples=samples,
                               bootstrap_iters=0, log_samples=False, verbosity="ERROR")


def long_requests(lm: Any, tokens: int) -> list[Any]:
    """One two-option multiple-choice document whose context is ``tokens`` tokens of text (the ``long`` task): the
    probes' buffers at a long request (T ≈ ``tokens``), where they are not hidden in what the forward itself frees."""
    from lm_eval.api.instance import Instance

    ids = lm.tok_encode(LONG_TEXT * (tokens // 8 + 1))[:tokens]
    context = lm.tokenizer.decode(ids)
    return [Instance("loglikelihood", {}, (context, option), 0, ("long", 0, 1)) for option in (" True", " False")]


def run_task(lm: Any, task: str, limit: int, args: argparse.Namespace) -> None:
    if task == "long":
        lm.loglikelihood(long_requests(lm, args.context_tokens), disable_tqdm=True)
    else:
        evaluate(lm, TASKS[task], limit, args)


def memory_worker(args: argparse.Namespace) -> None:
    """One (shape, layers, task, probes) in this process; prints one JSON line."""
    import psutil
    import torch

    model, tokenizer, shape = build(args)
    lm = wrapper(args.probes, model, tokenizer, shape, args)
    longest = LongestForward(model)
    if args.device != "cpu":
        torch.cuda.reset_peak_memory_stats()
    loaded = psutil.Process().memory_info().rss
    sampler = PeakRss()
    sampler.start()
    start = time.perf_counter()
    run_task(lm, args.task, args.limit, args)
    wall = time.perf_counter() - start
    peak = sampler.stop()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    line = {"shape": args.shape, "layers": args.layers, "task": args.task, "probes": args.probes, "limit": args.limit,
            "batch": longest.batch, "tokens": longest.tokens, "dtype": args.dtype, "wall_s": wall,
            "weights_gib": weights / GIB, "loaded_gib": loaded / GIB, "peak_gib": peak / GIB, "delta_gib": (peak - loaded) / GIB}
    if args.device != "cpu":
        line["cuda_max_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
    print(json.dumps(line), flush=True)


def time_worker(args: argparse.Namespace) -> None:
    """One (shape, layers, task): every setting in turn, ``--repeats`` times; prints one JSON line per setting."""
    model, tokenizer, shape = build(args)
    settings = ["hf", *args.probes_list] if shape.diffusion is None else list(args.probes_list)
    best: dict[str, float] = {}
    for _ in range(args.repeats):
        for name in settings:
            lm = wrapper(name, model, tokenizer, shape, args)
            run_task(lm, args.task, 1, args)  # warm-up: the lens's float32 W, kernels, the task's documents
            start = time.perf_counter()
            run_task(lm, args.task, args.limit, args)
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
            del lm
            gc.collect()
    base = best.get("hf", best.get("none"))
    for name in settings:
        print(json.dumps({"shape": args.shape, "layers": args.layers, "task": args.task, "setting": name,
                          "limit": args.limit, "dtype": args.dtype, "wall_s": best[name], "ratio_hf": best[name] / base,
                          "ratio_none": best[name] / best["none"] if "none" in best else None}), flush=True)


def declared_rows(model: Any, tokenizer: Any, shape: Shape, *, tokens: int, batch: int = 1,
                  chunk: int = 64, margin_precisions: tuple[str, ...] = ("auto",)) -> list[dict[str, Any]]:
    """Each probe's own phase on ``model``, its allocations counted by the profiler (:func:`shapes.peak_allocated`),
    beside its declaration (:attr:`~lm_eval_probes.api.Probe.memory`): the generated tokens' log-probabilities and
    the lens probes on one chunk of ``chunk`` positions; Ω's decoding of one forward of ``batch`` × ``tokens`` (the
    source layers' states, held before, left out of both); the margins of one sequence of ``tokens``. One row per
    probe: ``measured`` and ``declared`` bytes; the margins once per ``probe_margin_precision`` of
    ``margin_precisions`` (rows ``margin``, then ``margin/<precision>``)."""
    import torch

    from lm_eval_probes import registry
    from lm_eval_probes.capture.attention import FirstAttentionCapture
    from lm_eval_probes.capture.memory import model_shapes, token_logprob_memory
    from lm_eval_probes.capture.positions import position_probes
    from lm_eval_probes.capture.readouts import FocalDepthDecoder, LensReadout
    from lm_eval_probes.config import ProbeConfig

    readout = LensReadout(model)
    num_layers, width = readout.num_layers, shape.hidden
    dtype = next(model.parameters()).dtype
    generator = torch.Generator().manual_seed(0)
    rows = []

    def row(probe: str, measured: int, declared: int, shapes: Any) -> None:
        rows.append({"probe": probe, "layers": num_layers, "batch": shapes.batch, "tokens": shapes.tokens,
                     "positions": shapes.lens_positions, "measured": measured, "declared": declared})

    def config_of(probe: str, **options: str) -> ProbeConfig:
        return ProbeConfig.from_model_args({"probes": probe, "probe_chunk_positions": chunk, **options})

    def declaration(probe: str, shapes: Any) -> int:
        return int(registry.probe(probe).memory_bytes(config_of(probe).options_of(probe), shapes))

    states = [torch.randn(chunk, width, generator=generator).to(dtype) for _ in range(num_layers + 1)]
    shapes = model_shapes(model, batch=1, tokens=chunk, vocab=readout.vocab_size, chunk_positions=chunk)
    ids = torch.arange(chunk)
    position_probes(states, readout, config_of("none"), ids)  # warm-up: the lens's reused block of W
    _, measured = peak_allocated(lambda: position_probes(states, readout, config_of("none"), ids))
    row("logprobs", measured, token_logprob_memory(shapes), shapes)
    for probe in ("tcb", "bte", "reader"):  # a response's own phase: no token log-probabilities (counted above)
        _, measured = peak_allocated(lambda: position_probes(states, readout, config_of(probe)))
        row(probe, measured, declaration(probe, shapes), shapes)

    shapes = model_shapes(model, batch=batch, tokens=tokens, vocab=readout.vocab_size, chunk_positions=chunk)
    focal = registry.probe("omega").position_probe(config_of("omega").options_of("omega"), num_layers).focal_depth
    decoder = FocalDepthDecoder(model, readout, depth=focal.depth, source_layers=focal.source_layers, top_k=focal.top_k,
                                chunk_tokens=focal.tokens_per_chunk(shapes.width, shapes.ffn, shapes.dtype_bytes),
                                chunk_positions=chunk)
    if decoder.depth == num_layers:  # decoded after the forward: the held source layers are the "before"
        spans = [(r, tokens - chunk, tokens) for r in range(batch)]
        input_ids = torch.randint(0, len(tokenizer), (batch, tokens), generator=generator)
        with decoder.capture() as inputs, torch.no_grad():
            model(input_ids=input_ids, use_cache=False, logits_to_keep=1)
        _, measured = peak_allocated(lambda: decoder.confidences([None] * (num_layers + 1), inputs, spans))
        held = len(decoder.source_layers) * batch * tokens * width * dtype.itemsize
        row("omega", measured, declaration("omega", shapes) - held, shapes)

    capture = FirstAttentionCapture(model)
    input_ids = torch.randint(0, len(tokenizer), (1, tokens), generator=generator)
    with capture.capture() as inputs, torch.no_grad():
        model(input_ids=input_ids, use_cache=False, logits_to_keep=1)
    shapes = model_shapes(model, batch=1, tokens=tokens, vocab=readout.vocab_size, chunk_positions=chunk)
    for index, precision in enumerate(margin_precisions):
        options = config_of("margin", probe_margin_precision=precision).options_of("margin")
        margins = registry.probe("margin").position_probe(options, num_layers)
        _, measured = peak_allocated(lambda: margins.first_attention.values(capture.batch(inputs.latest())))
        row("margin" if index == 0 else f"margin/{precision}", measured,
            int(registry.probe("margin").memory_bytes(options, shapes)), shapes)
    return rows


def declared_worker(args: argparse.Namespace) -> None:
    """:func:`declared_rows` of one (shape, layers) in this process; one JSON line per probe."""
    model, tokenizer, shape = build(args)
    for row in declared_rows(model, tokenizer, shape, tokens=args.context_tokens, batch=args.batch_size):
        ratio = row["measured"] / row["declared"]
        print(json.dumps({"shape": args.shape, **row, "measured_gib": row["measured"] / GIB,
                          "declared_gib": row["declared"] / GIB, "ratio": ratio}), flush=True)


# --------------------------------------------------------------------------------------------- the sweep

def run_worker(mode: str, args: argparse.Namespace, **overrides: Any) -> list[dict[str, Any]]:
    fields = {**vars(args), **overrides}
    command = [sys.executable, __file__, f"--{mode}_worker", "--shape", fields["shape"], "--layers", str(fields["layers"]),
               "--task", fields["task"], "--limit", str(fields["limit"]), "--batch_size", str(fields["batch_size"]),
               "--dtype", fields["dtype"], "--threads", str(fields["threads"]), "--tokenizer", fields["tokenizer"],
               "--max_gen_toks", str(fields["max_gen_toks"]), "--device", fields["device"],
               "--context_tokens", str(fields["context_tokens"]), "--max_length", str(fields["max_length"]),
               "--probes", fields.get("probes_one") or "none", "--repeats", str(fields["repeats"]),
               "--probes_list", *fields["probes"]]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        last = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return [{"failed": last[-1] if last else f"exit status {done.returncode}", **overrides}]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def memory(args: argparse.Namespace) -> None:
    print(f"{'shape':12s} {'L':>2s} {'task':4s} {'probes':8s} {'B':>2s} {'T':>5s} {'Δpeak GiB':>9s} {'extra GiB':>9s} "
          f"{'model GiB':>9s} {'ratio':>6s}")
    for name in args.shapes:
        for layers in args.layers:
            for task in args.tasks:
                base = None
                for probes in ["none", *[p for p in args.probes if p != "none"]]:
                    row = run_worker("memory", args, shape=name, layers=layers, task=task, probes_one=probes)[0]
                    if "failed" in row:
                        print(f"{name:12s} {layers:2d} {task:4s} {probes:8s} failed: {row['failed'][:160]}", flush=True)
                        continue
                    if probes == "none":
                        base = row
                    extra = row["peak_gib"] - base["peak_gib"] if base else float("nan")
                    dtype_bytes = {"bfloat16": 2, "float16": 2, "float32": 4}[args.dtype]
                    model = predicted_extra(probes, resolve(name), layers=layers, batch=row["batch"], tokens=row["tokens"],
                                            dtype_bytes=dtype_bytes) / GIB
                    row.update(extra_gib=extra, model_gib=model, ratio=extra / model if model else None)
                    ratio = f"{extra / model:6.2f}" if model else "     -"
                    print(f"{name:12s} {layers:2d} {task:4s} {probes:8s} {row['batch']:2d} {row['tokens']:5d} "
                          f"{row['delta_gib']:9.2f} {extra:9.2f} {model:9.2f} {ratio}", flush=True)
                    print(json.dumps(row), flush=True)


def declared(args: argparse.Namespace) -> None:
    print(f"{'shape':12s} {'L':>2s} {'probe':8s} {'B':>2s} {'T':>5s} {'n':>3s} {'measured GiB':>12s} "
          f"{'declared GiB':>12s} {'ratio':>6s}")
    for name in args.shapes:
        for layers in args.layers:
            for row in run_worker("declared", args, shape=name, layers=layers, task="long"):
                if "failed" in row:
                    print(f"{name:12s} {layers:2d} failed: {row['failed'][:200]}", flush=True)
                    continue
                print(f"{name:12s} {layers:2d} {row['probe']:8s} {row['batch']:2d} {row['tokens']:5d} "
                      f"{row['positions']:3d} {row['measured_gib']:12.3f} {row['declared_gib']:12.3f} "
                      f"{row['ratio']:6.2f}", flush=True)
                print(json.dumps(row), flush=True)


def timing(args: argparse.Namespace) -> None:
    for name in args.shapes:
        for layers in args.layers:
            for task in args.tasks:
                for row in run_worker("time", args, shape=name, layers=layers, task=task):
                    if "failed" in row:
                        print(f"{name} {layers} {task} failed: {row['failed'][:200]}", flush=True)
                        continue
                    print(f"{name:12s} {layers:2d} {task:4s} {row['setting']:8s} {row['wall_s']:8.1f} s "
                          f"× hf {row['ratio_hf']:5.2f}  × none {row['ratio_none'] or float('nan'):5.2f}", flush=True)
                    print(json.dumps(row), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", choices=("memory", "time", "declared"))
    parser.add_argument("--shapes", nargs="*", default=["llama3-8b"], help=f"of {', '.join(SHAPES)} (NAME/DIVISOR: scaled)")
    parser.add_argument("--layers", nargs="*", type=int, default=[2])
    parser.add_argument("--tasks", nargs="*", default=["mc"], choices=list(TASKS))
    parser.add_argument("--probes", nargs="*", default=list(PROBES), help="probe settings (none first, always run)")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--batch_size", default="4")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max_gen_toks", type=int, default=16)
    parser.add_argument("--max_length", type=int, default=0, help="HFLM's max_length (0: the model's; the long task: "
                                                                   "context_tokens + 64)")
    parser.add_argument("--context_tokens", type=int, default=4096, help="the long task's context length")
    parser.add_argument("--tokenizer", default="smollm2", choices=("smollm2", "tiny"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--diffusion_steps", type=int, default=8)
    parser.add_argument("--diffusion_mc_samples", type=int, default=2)
    for hidden in ("--memory_worker", "--time_worker", "--declared_worker"):
        parser.add_argument(hidden, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--task", help=argparse.SUPPRESS)
    parser.add_argument("--probes_list", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_worker or args.time_worker or args.declared_worker:
        args.layers = args.layers[0]
        if args.task == "long" and not args.max_length:
            args.max_length = args.context_tokens + 64
        args.batch_size = int(args.batch_size) if args.batch_size.isdigit() else args.batch_size
        if args.declared_worker:
            declared_worker(args)
        elif args.memory_worker:
            args.probes = args.probes[0]
            memory_worker(args)
        else:
            args.probes_list = [p for p in args.probes_list if p != "hf"]
            time_worker(args)
        return
    if args.mode is None:
        parser.error("memory, time or declared")
    {"memory": memory, "time": timing, "declared": declared}[args.mode](args)


if __name__ == "__main__":
    main()
