"""``probe-run`` over an existing generation run against generating with ``hf-probes``: wall time, in one run.

    python benchmarks/probe_run.py [--limit 60] [--batch_size 8] [--task probes_synth_arith_gen] [--out DIR]

SmolLM2-135M-Instruct (its bundled GGUF converted once to a safetensors folder, :func:`model_folder`), in this
process, each wrapper loaded once (load times printed apart; the task index built once, outside the timings) and
warmed up on 2 documents, then timed on ``--limit`` documents:

1. ``hf``: plain lm_eval generation with ``--log_samples`` — the stand-in for the run another backend (vLLM, sglang)
   made; its samples are what probe-run reads;
2. ``hf-probes``: generating and probing at once (the default probes, states recorded during decoding);
3. ``probe-run`` over run 1's samples (the default probes, one teacher-forced forward per document).

Printed: seconds and seconds per document of each, the ratio probe-run / hf-probes and (hf + probe-run) / hf-probes,
then, per document, how far probe-run's values are from hf-probes' (the documents whose response re-encodes without a
flag, :func:`lm_eval_probes.models.replay.replayed_tokens`), and one JSON line with everything.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import CACHE  # noqa: E402  (the benchmarks' cache folder)


def model_folder() -> Path:
    """SmolLM2-135M-Instruct as a plain safetensors folder (converted from its bundled GGUF once; the saved config
    drops the GGUF ``quantization_config``, which transformers 5 keeps and then refuses to load without the file)."""
    folder = CACHE / "smollm2-plain"
    if (folder / "config.json").exists():
        return folder
    import transformers

    from lm_eval_probes.cli.demo import SMOLLM2_GGUF, smollm2_folder

    loaded = transformers.AutoModelForCausalLM.from_pretrained(smollm2_folder(), gguf_file=SMOLLM2_GGUF)
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_folder(), gguf_file=SMOLLM2_GGUF)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    temporary = folder.with_suffix(".tmp")
    model.save_pretrained(temporary)
    tokenizer.save_pretrained(temporary)
    temporary.rename(folder)
    return folder


def evaluate(lm: Any, task: str, limit: int, folder: Path | None, manager: Any) -> tuple[float, dict]:
    """Seconds of one ``simple_evaluate`` (with ``--log_samples`` written into ``folder`` when given)."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker

    tracker = EvaluationTracker(output_path=str(folder)) if folder is not None else None
    started = time.perf_counter()
    out = lm_eval.simple_evaluate(model=lm, model_args={"pretrained": lm.model.name_or_path}, tasks=[task],
                                  task_manager=manager, limit=limit, log_samples=True, bootstrap_iters=0,
                                  evaluation_tracker=tracker)
    seconds = time.perf_counter() - started
    if tracker is not None:
        samples = out.pop("samples")
        tracker.save_results_aggregated(results=out, samples=samples)
        tracker.save_results_samples(task_name=task, samples=samples[task])
        out["samples"] = samples
    return seconds, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--task", default="probes_synth_arith_gen")
    parser.add_argument("--out", type=Path, default=Path("results/bench-probe-run"))
    args = parser.parse_args()

    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    import lm_eval_probes
    from lm_eval_probes.models.autoregressive import ProbeHFLM
    from lm_eval_probes.models.replay import ReplayHFLM
    from lm_eval_probes.probe_run.runner import PROBE_RUN_KEY, SAMPLE_KEY, ProbeRunOptions, probe_run
    from lm_eval_probes.tasks.manager import ProbeTaskManager

    folder = str(model_folder())
    shutil.rmtree(args.out, ignore_errors=True)
    plain, probed = TaskManager(include_path=lm_eval_probes.tasks_dir()), ProbeTaskManager(include_path=lm_eval_probes.tasks_dir())
    common = {"pretrained": folder, "device": "cpu", "batch_size": args.batch_size}
    loads, timed = {}, {}

    started = time.perf_counter()
    hf = HFLM(**common)
    loads["hf"] = time.perf_counter() - started
    evaluate(hf, args.task, 2, None, plain)  # warm-up
    timed["hf"], _ = evaluate(hf, args.task, args.limit, args.out / "hf", plain)
    del hf

    started = time.perf_counter()
    direct = ProbeHFLM(**common)
    loads["hf-probes"] = time.perf_counter() - started
    evaluate(direct, args.task, 2, None, probed)
    timed["hf-probes"], direct_out = evaluate(direct, args.task, args.limit, args.out / "hf-probes", probed)
    del direct

    started = time.perf_counter()
    replay = ReplayHFLM(**common, logged={})
    loads["probe-run"] = time.perf_counter() - started
    options = ProbeRunOptions(run=[args.out / "hf"], output_path=args.out / "warm-up", model_args={"pretrained": folder},
                              batch_size=args.batch_size, device="cpu", limit=2)
    probe_run(options, lm=replay, task_manager=probed)
    options = ProbeRunOptions(run=[args.out / "hf"], output_path=args.out / "probe-run", model_args={"pretrained": folder},
                              batch_size=args.batch_size, device="cpu")
    started = time.perf_counter()
    written = probe_run(options, lm=replay, task_manager=probed)
    timed["probe-run"] = time.perf_counter() - started

    results = json.loads(written.read_text())
    [samples_path] = (args.out / "probe-run").rglob(f"samples_{args.task}_*.jsonl")
    replayed = {s["doc_id"]: s for s in map(json.loads, samples_path.read_text().splitlines())}
    direct_samples = {s["doc_id"]: s for s in direct_out["samples"][args.task]}
    same_text = [d for d in replayed if replayed[d]["resps"] == [[str(direct_samples[d]["resps"][0][0])]]]
    unflagged = [d for d in same_text if not replayed[d][SAMPLE_KEY]["lossy_text"]
                 and not replayed[d][SAMPLE_KEY]["stop_merge"] and replayed[d][SAMPLE_KEY]["text_round_trip"]]
    differences: dict[str, list[float]] = {}
    for doc in unflagged:
        for name in ("confidence", "tcb_log10", "tcb_log10_min", "bte_energy", "response_tokens"):
            a, b = float(replayed[doc][name]), float(direct_samples[doc][name])
            differences.setdefault(name, []).append(abs(a - b) / max(abs(a), abs(b), 1e-30))

    n = args.limit
    print(f"SmolLM2-135M, {args.task}, {n} documents, batch {args.batch_size}, CPU")
    for name in ("hf", "hf-probes", "probe-run"):
        print(f"  {name:<10} {timed[name]:7.1f} s  {timed[name] / n:6.2f} s/doc   (model load {loads[name]:.1f} s)")
    print(f"  probe-run / hf-probes            = {timed['probe-run'] / timed['hf-probes']:.3f}")
    print(f"  (hf + probe-run) / hf-probes     = {(timed['hf'] + timed['probe-run']) / timed['hf-probes']:.3f}")
    print(f"  same response as hf-probes: {len(same_text)} of {n}; of those, {len(unflagged)} without a replay flag")
    for name, values in differences.items():
        values.sort()
        print(f"    {name:<16} relative difference: median {values[len(values) // 2]:.1e}, max {values[-1]:.1e}, "
              f"> 2e-3: {sum(v > 2e-3 for v in values)}")
    print(json.dumps({"task": args.task, "documents": n, "batch_size": args.batch_size, "seconds": timed,
                      "load_seconds": loads, "replay": results[PROBE_RUN_KEY]["tasks"][args.task],
                      "same_response": len(same_text), "unflagged": len(unflagged),
                      "max_relative_difference": {k: max(v) for k, v in differences.items() if v}}))


if __name__ == "__main__":
    main()
