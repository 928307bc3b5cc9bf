"""A fixed run's every row and per-document value, saved before a structural change and compared after it.

    python benchmarks/samples_snapshot.py save DIR       # before the change
    python benchmarks/samples_snapshot.py compare DIR    # after it: prints every key that moved, exits 1 if any did

The run: the tests' tiny random Llama (``hf-probes``, ``probes=all``, ``probe_bte_profile=full``) on the synthetic
tasks — multiple choice, generation and a clean/noised detector pair — and the tests' tiny random BERT
(``hf-probes-diffusion``) on a multiple-choice and a generation task, ``--log_samples`` on, batch size 3. Rows are
compared by absolute difference, per-document values (vectors and records element by element, the reader records'
hidden states included) by relative difference; both must stay within ``--tolerance`` (default 0: identical).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from batch_invariance import difference, row_values, tiny_llama  # noqa: E402
from per_document import largest_differences  # noqa: E402

AUTOREGRESSIVE_TASKS = ("probes_synth_arith", "probes_synth_logic", "probes_synth_arith_gen",
                        "probes_synth_logic_detect")
DIFFUSION_TASKS = ("probes_synth_arith", "probes_synth_arith_gen")


def tiny_bert() -> str:
    """The diffusion tests' tiny random BERT with a mask token, saved into a temporary folder."""
    from tiny_models import save_tiny_bert

    return save_tiny_bert(Path(tempfile.mkdtemp(prefix="tiny-bert-")), seed=7, special_tokens={"mask_token": "<|mask|>"})


def numbers_of(fallback):
    """JSON for the samples with the reader records' hidden states as numbers (``--log_samples`` writes one line)."""
    def default(value: Any) -> Any:
        features = getattr(value, "features", None)
        if hasattr(value, "label") and hasattr(value, "document"):
            return {"features": None if features is None else features.values.astype(float).tolist(),
                    "layers": None if features is None else list(features.layers), "label": value.label,
                    "group": value.group, "document": value.document}
        return fallback(value)

    return default


def runs() -> dict[str, dict[str, Any]]:
    import lm_eval
    from lm_eval.utils import handle_non_serializable

    import lm_eval_probes

    lm_eval_probes.register()
    manager = lm_eval_probes.ProbeTaskManager(include_path=lm_eval_probes.TASKS_DIR)
    plans = {
        "hf-probes": ("hf-probes", {"pretrained": tiny_llama(), "probes": "all", "probe_bte_profile": "full"},
                      AUTOREGRESSIVE_TASKS, 12),
        "hf-probes-diffusion": ("hf-probes-diffusion", {"pretrained": tiny_bert(), "diffusion_gen_length": 8,
                                                        "diffusion_steps": 4, "diffusion_mc_samples": 2},
                                DIFFUSION_TASKS, 6),
    }
    out = {}
    for label, (model, model_args, tasks, limit) in plans.items():
        result = lm_eval.simple_evaluate(model=model, model_args={**model_args, "device": "cpu"}, tasks=list(tasks),
                                         task_manager=manager, limit=limit, batch_size=3,
                                         gen_kwargs={"max_gen_toks": 16}, bootstrap_iters=0, log_samples=True)
        out[label] = json.loads(json.dumps({"results": result["results"], "samples": result["samples"],
                                            "configs": result["configs"]}, default=numbers_of(handle_non_serializable)))
    return out


def compare(now: dict, saved: dict, tolerance: float, *, allow_added: bool = False) -> list[str]:
    """What moved from ``saved`` to ``now``: rows and per-document values beyond ``tolerance``, and rows or sample keys
    added or lost (added ones are only listed, with ``allow_added``: a change that adds rows keeps every old one)."""
    moved = []
    for label, run in saved.items():
        for task, results in run["results"].items():
            own = {m["metric"] for m in run["configs"][task]["metric_list"]} if task in run["configs"] else set()
            base, rows = row_values(results, own), row_values(now[label]["results"][task], own)
            lost, added = sorted(set(base) - set(rows)), sorted(set(rows) - set(base))
            if lost or (added and not allow_added):
                moved.append(f"{label} {task}: rows lost {lost}, added {added}")
            elif added:
                print(f"{label} {task}: rows added {added}")
            for key in sorted(set(base) & set(rows)):
                if difference(base[key], rows[key]) > tolerance:
                    moved.append(f"{label} {task} row {key}: {base[key]} -> {rows[key]}")
        for task, samples in run["samples"].items():
            current = now[label]["samples"][task]
            if allow_added:  # the keys the saved samples had
                current = [{key: value for key, value in sample.items() if key in samples[0]} for sample in current]
            try:
                worst = largest_differences(current, samples)
            except AssertionError as error:
                moved.append(f"{label} {task}: samples differ in shape: {error}")
                continue
            moved += [f"{label} {task} per-document {key}: {value:.3g}" for key, value in sorted(worst.items())
                      if value > tolerance]
    return moved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("save", "compare"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.0)
    parser.add_argument("--allow_added", action="store_true",
                        help="compare: new rows and sample keys are listed, not counted as moved (every old one must stay)")
    args = parser.parse_args(argv)
    now = runs()
    target = args.folder / "snapshot.json"
    if args.action == "save":
        args.folder.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(now))
        counts = {label: sum(len(s) for s in run["samples"].values()) for label, run in now.items()}
        print(f"saved {target}: samples {counts}")
        return 0
    moved = compare(now, json.loads(target.read_text()), args.tolerance, allow_added=args.allow_added)
    print("\n".join(moved) if moved else f"every row and per-document value as in {target}")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
