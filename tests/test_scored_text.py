"""The text every shipped ``loglikelihood`` / ``multiple_choice`` task scores: one separator where the prompt
ends and the answer begins.

lm_eval 0.4.13 builds a multiple-choice request as ``(context, target_delimiter + choice)`` but a
``loglikelihood`` request as ``(context, doc_to_target(doc))``, without the delimiter, so a
``target_delimiter: " "`` there glues the answer to the prompt (``Answer:Janet``). The tasks are built from
files the tests write (loader_fixtures) and the synthetic generators; no model runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lm_eval.api.instance import Instance
from lm_eval.api.task import ConfigurableTask
from lm_eval.tasks import TaskManager

import lm_eval_probes
from loader_fixtures import write_data_dir

SCORED_TYPES = ("loglikelihood", "multiple_choice")
LIMIT = 4


def _scored_task_names() -> list[str]:
    index = TaskManager(include_path=lm_eval_probes.TASKS_DIR, include_defaults=False).task_index
    return sorted(name for name, entry in index.items() if (entry.cfg or {}).get("output_type") in SCORED_TYPES)


SCORED_TASKS = _scored_task_names()


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> TaskManager:
    root = write_data_dir(Path(tmp_path_factory.mktemp("data")), n=LIMIT)
    return TaskManager(include_path=lm_eval_probes.TASKS_DIR, include_defaults=False,
                       metadata={"probes_data_dir": str(root)})


def _requests(manager: TaskManager, name: str, *, num_fewshot: int = 0) -> tuple[ConfigurableTask, list[Instance]]:
    task = manager.load([name])["tasks"][name]
    if num_fewshot:
        task.set_config(key="num_fewshot", value=num_fewshot)
    task.build_all_requests(limit=LIMIT, rank=0, world_size=1)
    requests = [inst for inst in task.instances if inst.request_type == "loglikelihood"]
    assert requests, f"{name} built no loglikelihood request"
    return task, requests


def separator(context: str, continuation: str) -> str:
    """The whitespace between the prompt's last character and the answer's first: the context's trailing
    whitespace followed by the continuation's leading whitespace ('' when the two are glued)."""
    return context[len(context.rstrip()):] + continuation[: len(continuation) - len(continuation.lstrip())]


def _gold_text(task: ConfigurableTask, doc: dict) -> str:
    """A document's prompt and its gold answer joined as a request of the task scores them."""
    if task.OUTPUT_TYPE == "loglikelihood":
        return task.doc_to_text(doc) + task.doc_to_target(doc)
    choices, gold = task.doc_to_choice(doc), task.doc_to_target(doc)
    return task.doc_to_text(doc) + task.config.target_delimiter + (choices[gold] if isinstance(gold, int) else gold)


def test_every_scored_task_is_checked():
    assert {"probes_gsm8k_ref", "probes_math500_ref", "probes_proofwriter", "probes_stepgame",
            "probes_synth_arith", "probes_synth_logic"} <= set(SCORED_TASKS)
    assert any(name.endswith("_detect") for name in SCORED_TASKS) and any("_noise_" in name for name in SCORED_TASKS)


def test_separator_sees_glued_and_doubled_text():
    assert separator("Answer:", " 12") == " " and separator("Answer: ", "12") == " "
    assert separator("Answer:", "12") == "" and separator("Answer: ", " 12") == "  "


@pytest.mark.parametrize("name", SCORED_TASKS)
def test_scored_text_has_one_separator_between_prompt_and_answer(manager, name):
    task, requests = _requests(manager, name)
    for inst in requests:
        context, continuation = inst.args
        assert context.strip() and continuation.strip(), (name, inst.doc_id, inst.args)
        assert len(separator(context, continuation)) == 1, (
            f"{name} document {inst.doc_id} scores {context[-24:]!r} + {continuation[:24]!r}")
        if task.OUTPUT_TYPE == "loglikelihood":  # the reference itself, after its prompt
            assert context + continuation == _gold_text(task, inst.doc)


@pytest.mark.parametrize("name", [n for n in SCORED_TASKS if "_noise_" not in n and not n.endswith("_detect")])
def test_fewshot_examples_show_the_answer_as_requests_score_it(manager, name):
    task, requests = _requests(manager, name, num_fewshot=1)
    shots = {_gold_text(task, doc) for doc in task.fewshot_docs()}
    delimiter = task.config.fewshot_delimiter
    for inst in requests:
        context, prompt = inst.args[0], task.doc_to_text(inst.doc)
        assert context.endswith(delimiter + prompt), (name, context[-80:])
        shot = context[: -len(delimiter + prompt)]
        if shot not in shots:
            at = max(len(os.path.commonprefix([shot, gold])) for gold in shots)
            pytest.fail(f"{name}: the few-shot example differs from its scored text at {shot[max(at - 20, 0):at + 20]!r}")
