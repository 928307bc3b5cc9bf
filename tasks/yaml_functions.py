"""What the task YAMLs name with ``!function``: each is ``!function yaml_functions.<name>``, this file beside them.

lm_eval resolves ``!function a.b.name`` by loading the file ``a.b.py`` (0.4.9–0.4.11) or ``a/b.py`` (0.4.12 and
later) beside the YAML by its path, and only 0.4.12 and later fall back to importing the dotted module. A plain
file name beside the YAMLs is found by both, so the YAMLs name this file; loaded by path, it is a module of its own
(not ``lm_eval_probes.tasks.yaml_functions``), which is why it re-exports the package's own objects by absolute
imports: a YAML's ``class`` is then the very ``ProbeTask`` that ``lm_eval_probes`` checks for.
"""

from lm_eval_probes.tasks.loaders import (
    gsm8k_dataset,
    math500_dataset,
    process_gsm8k,
    process_math500,
    process_math500_results,
    process_proofwriter,
    process_stepgame,
    proofwriter_dataset,
    proofwriter_prompt,
    stepgame_dataset,
)
from lm_eval_probes.tasks.next_token import next_token_dataset, next_token_match
from lm_eval_probes.tasks.probe_task import NoisedPairProbeTask, NoisedProbeTask, ProbeTask
from lm_eval_probes.tasks.synth_arith import arith_dataset
from lm_eval_probes.tasks.synth_logic import logic_dataset
from lm_eval_probes.tasks.synth_recall import recall_dataset

__all__ = [
    "NoisedPairProbeTask", "NoisedProbeTask", "ProbeTask", "arith_dataset", "gsm8k_dataset", "logic_dataset",
    "math500_dataset", "next_token_dataset", "next_token_match", "process_gsm8k", "process_math500",
    "process_math500_results", "process_proofwriter", "process_stepgame", "proofwriter_dataset", "proofwriter_prompt",
    "recall_dataset", "stepgame_dataset",
]
