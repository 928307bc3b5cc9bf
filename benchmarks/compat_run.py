"""One stack's run for ``benchmarks/compat.py``: the saved tiny Llama, ``hf-probes`` with ``probes=all``, every row
and per-document value written as JSON, with the installed versions.

    python compat_run.py MODEL_DIR OUT_JSON

Run by each stack's own interpreter (the installed ``lm_eval_probes``, never this repository's sources: the driver
runs it from a folder outside the repository). Needs only lm_eval and the plugin.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

TASKS = ("probes_synth_logic", "probes_synth_arith_gen", "probes_synth_logic_detect")
LIMIT = 8
DISTRIBUTIONS = ("torch", "transformers", "lm-eval", "datasets", "huggingface-hub")


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


def run(model: str) -> dict[str, Any]:
    import lm_eval
    from lm_eval.utils import handle_non_serializable

    import lm_eval_probes

    lm_eval_probes.register()
    manager = lm_eval_probes.ProbeTaskManager(include_path=lm_eval_probes.TASKS_DIR)
    result = lm_eval.simple_evaluate(model="hf-probes", model_args={"pretrained": model, "probes": "all",
                                                                    "device": "cpu"},
                                     tasks=list(TASKS), task_manager=manager, limit=LIMIT, batch_size=3,
                                     gen_kwargs={"max_gen_toks": 16}, bootstrap_iters=0, log_samples=True)
    run = {"results": result["results"], "samples": result["samples"], "configs": result["configs"]}
    return json.loads(json.dumps(run, default=numbers_of(handle_non_serializable)))


def main() -> None:
    model, out = sys.argv[1], Path(sys.argv[2])
    versions = {name: metadata.version(name) for name in DISTRIBUTIONS}
    out.write_text(json.dumps({"versions": versions, "run": run(model)}))


if __name__ == "__main__":
    main()
