"""One stack's run for ``benchmarks/compat.py``: the saved tiny models, ``hf-probes`` with ``probes=all``, every row
and per-document value written as JSON, with the installed versions.

    python compat_run.py OUT_JSON [--light] MODEL_DIR [MODEL_DIR ...]

The first model runs every task of :data:`TASKS` on :data:`LIMIT` documents each; the others (other families) the
multiple-choice and the generation task on :data:`OTHERS_LIMIT`; with ``--light`` every model runs those two. Run by each stack's own interpreter (the installed
``lm_eval_probes``, never this repository's sources: the driver runs it from a folder outside the repository). Needs
only lm_eval and the plugin.
"""

from __future__ import annotations

import json
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from samples_snapshot import numbers_of  # noqa: E402  (it puts the repository's tests/, not its sources, on the path)

TASKS = ("probes_synth_logic", "probes_synth_arith_gen", "probes_synth_logic_detect", "compat_plain_logic")
OTHERS_TASKS = ("probes_synth_logic", "probes_synth_arith_gen")
PLAIN_TASK = """task: compat_plain_logic
custom_dataset: !function compat_plain_functions.logic_dataset
dataset_kwargs: {n_per_level: 40, seed: 1234}
output_type: multiple_choice
test_split: test
doc_to_text: "{{theory}}\\nQuestion: is the statement \\"{{question}}\\" True or False?\\nAnswer:"
doc_to_choice: ["True", "False"]
doc_to_target: label
metric_list: [{metric: acc, aggregation: mean, higher_is_better: true}]
metadata: {version: 1.0}
"""
"""A task of the user's own, not a ``ProbeTask``: the task manager gives it the probe rows (``TaskManager.load``, or
``load_task_or_group`` on lm_eval 0.4.9–0.4.11)."""
LIMIT = 8
OTHERS_LIMIT = 3
DISTRIBUTIONS = ("torch", "transformers", "lm-eval", "datasets", "huggingface-hub")


def run(model: str, tasks: tuple[str, ...], limit: int) -> dict[str, Any]:
    import lm_eval
    from lm_eval.utils import handle_non_serializable

    import lm_eval_probes

    lm_eval_probes.register()
    own = Path(tempfile.mkdtemp(prefix="compat-task-"))
    (own / "compat_plain_logic.yaml").write_text(PLAIN_TASK)
    (own / "compat_plain_functions.py").write_text("from lm_eval_probes.tasks.synth_logic import logic_dataset\n")
    manager = lm_eval_probes.ProbeTaskManager(include_path=[lm_eval_probes.TASKS_DIR, str(own)])
    result = lm_eval.simple_evaluate(model="hf-probes", model_args={"pretrained": model, "probes": "all",
                                                                    "device": "cpu"},
                                     tasks=list(tasks), task_manager=manager, limit=limit, batch_size=3,
                                     gen_kwargs={"max_gen_toks": 16}, bootstrap_iters=0, log_samples=True)
    run = {"results": result["results"], "samples": result["samples"], "configs": result["configs"]}
    return json.loads(json.dumps(run, default=numbers_of(handle_non_serializable)))


def main() -> None:
    out, models = Path(sys.argv[1]), sys.argv[2:]
    light = models[:1] == ["--light"]
    models = models[1:] if light else models
    versions = {name: metadata.version(name) for name in DISTRIBUTIONS}
    runs = {Path(model).name: run(model, *((TASKS, LIMIT) if k == 0 and not light else (OTHERS_TASKS, OTHERS_LIMIT)))
            for k, model in enumerate(models)}
    out.write_text(json.dumps({"versions": versions, "runs": runs}))


if __name__ == "__main__":
    main()
