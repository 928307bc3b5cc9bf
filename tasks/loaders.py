"""Real benchmarks as probe tasks: where their data comes from, one document schema each, answer checks.

Each task YAML names one ``*_dataset`` function here as its ``custom_dataset``. By default it loads the
public hub dataset; a local copy is used instead when the run's metadata says where it is:

* ``--metadata '{"probes_data_dir": "/data"}'`` — a folder laid out as ``gsm8k/test.jsonl``,
  ``gsm8k/train.jsonl``, ``math500/test.jsonl``, ``proofwriter/test.jsonl``, ``stepgame/valid.jsonl``;
* ``--metadata '{"proofwriter_files": {"test": "/x/owa.jsonl"}}'`` — explicit files for one benchmark
  (``<benchmark>_files``: split → path), which win over ``probes_data_dir``.

``process_docs`` functions bring every source to one schema with its difficulty label, and order the
documents round-robin over difficulty levels (in order of first appearance), so that ``--limit N``
is balanced over difficulty.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import datasets


@dataclass(frozen=True)
class BenchmarkSource:
    """Hub location and local file layout of one benchmark; splits are named as the task YAMLs use them."""

    hub_path: str
    hub_name: str | None
    hub_splits: Mapping[str, str]
    local_files: Mapping[str, str]


SOURCES: dict[str, BenchmarkSource] = {
    "gsm8k": BenchmarkSource("openai/gsm8k", "main", {"test": "test", "train": "train"},
                             {"test": "gsm8k/test.jsonl", "train": "gsm8k/train.jsonl"}),
    "math500": BenchmarkSource("HuggingFaceH4/MATH-500", None, {"test": "test"}, {"test": "math500/test.jsonl"}),
    "proofwriter": BenchmarkSource("tasksource/proofwriter", None, {"test": "test"}, {"test": "proofwriter/test.jsonl"}),
    "stepgame": BenchmarkSource("michaelszx/StepGame", None, {"test": "test"}, {"test": "stepgame/valid.jsonl"}),
}

STEPGAME_RELATIONS = ("left", "right", "above", "below", "upper-left", "upper-right", "lower-left", "lower-right", "overlap")


def load_benchmark(name: str, metadata: Mapping[str, Any]) -> datasets.DatasetDict:
    """The benchmark's splits, from local files when the metadata names them, else from the hub."""
    if name not in SOURCES:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(SOURCES)}")
    source = SOURCES[name]
    files = metadata.get(f"{name}_files")
    data_dir = metadata.get("probes_data_dir")
    if files is None and data_dir:
        files = {split: os.path.join(str(data_dir), rel) for split, rel in source.local_files.items()}
    if files is not None:
        if not isinstance(files, Mapping) or not files:
            raise ValueError(f"{name}_files must map split names to files, got {files!r}")
        missing = [str(path) for path in files.values() if not os.path.isfile(str(path))]
        if missing:
            raise FileNotFoundError(f"{name}: no such file(s): {', '.join(missing)}")
        return datasets.load_dataset("json", data_files={split: str(path) for split, path in files.items()})
    return datasets.DatasetDict(
        {split: datasets.load_dataset(source.hub_path, source.hub_name, split=hub_split)
         for split, hub_split in source.hub_splits.items()}
    )


def gsm8k_dataset(**metadata: Any) -> datasets.DatasetDict:
    return load_benchmark("gsm8k", metadata)


def math500_dataset(**metadata: Any) -> datasets.DatasetDict:
    return load_benchmark("math500", metadata)


def proofwriter_dataset(**metadata: Any) -> datasets.DatasetDict:
    return load_benchmark("proofwriter", metadata)


def stepgame_dataset(**metadata: Any) -> datasets.DatasetDict:
    return load_benchmark("stepgame", metadata)


# ----------------------------------------------------------------------------- document schemas


def interleave_by(dataset: datasets.Dataset, key: Callable[[dict[str, Any]], Any]) -> datasets.Dataset:
    """Reorder round-robin over the values of ``key`` (groups in order of first appearance, stable within)."""
    groups: OrderedDict[Any, list[int]] = OrderedDict()
    for index, doc in enumerate(dataset):
        groups.setdefault(key(doc), []).append(index)
    order = [group[i] for i in range(max((len(g) for g in groups.values()), default=0)) for group in groups.values() if i < len(group)]
    return dataset.select(order)


_CALCULATOR = re.compile(r"<<[^>]*>>")


def gsm8k_steps(answer: str) -> int:
    """Reasoning steps of a GSM8K reference solution: its non-empty lines before the ``#### <number>`` line."""
    body = answer.split("####")[0]
    return sum(1 for line in body.splitlines() if line.strip())


def process_gsm8k(dataset: datasets.Dataset) -> datasets.Dataset:
    """Adds ``steps`` (difficulty), ``solution`` (reference without ``<<calc>>`` annotations) and ``target``."""

    def convert(doc: dict[str, Any]) -> dict[str, Any]:
        return {
            "steps": gsm8k_steps(doc["answer"]),
            "solution": _CALCULATOR.sub("", doc["answer"]),
            "target": doc["answer"].split("####")[-1].strip().replace(",", ""),
        }

    return interleave_by(dataset.map(convert), lambda doc: doc["steps"])


def process_math500(dataset: datasets.Dataset) -> datasets.Dataset:
    """Keeps ``level`` (int, difficulty) and ``subject``; orders round-robin over levels."""
    return interleave_by(dataset.map(lambda doc: {"level": int(doc["level"])}), lambda doc: doc["level"])


def process_proofwriter(dataset: datasets.Dataset) -> datasets.Dataset:
    """One schema for RuleTaker/ProofWriter files and the hub dataset.

    ``depth`` (difficulty; the source's ``depth`` or ``QDep``, ``None`` when absent, e.g. Logic-LM's OWA
    sample), ``answer`` normalised to True/False/Unknown, ``choices`` (True/False, plus Unknown when any
    document of the file is Unknown: an open-world file) and ``label``.
    """
    answers = [_truth_value(doc["answer"]) for doc in dataset]
    choices = ["True", "False", "Unknown"] if "Unknown" in answers else ["True", "False"]

    def convert(doc: dict[str, Any], index: int) -> dict[str, Any]:
        depth = doc.get("depth", doc.get("QDep"))
        return {"answer": answers[index], "choices": choices, "label": choices.index(answers[index]),
                "depth": None if depth is None else int(depth)}

    return interleave_by(dataset.map(convert, with_indices=True), lambda doc: doc["depth"])


def _truth_value(answer: Any) -> str:
    text = str(answer).strip().lower()
    mapping = {"true": "True", "false": "False", "unknown": "Unknown", "uncertain": "Unknown", "a": "True", "b": "False", "c": "Unknown"}
    if text not in mapping:
        raise ValueError(f"unrecognised ProofWriter answer {answer!r}")
    return mapping[text]


def process_stepgame(dataset: datasets.Dataset) -> datasets.Dataset:
    """``story`` joined into one text, ``k_hop`` as int (difficulty), ``label`` as an index into the 9 relations."""

    def convert(doc: dict[str, Any]) -> dict[str, Any]:
        story = doc["story"]
        relation = str(doc["label"]).strip()
        if relation not in STEPGAME_RELATIONS:
            raise ValueError(f"unrecognised StepGame relation {relation!r}")
        return {"story_text": " ".join(story) if isinstance(story, list) else str(story),
                "k_hop": int(doc["k_hop"]), "relation": relation, "label": STEPGAME_RELATIONS.index(relation)}

    return interleave_by(dataset.map(convert, remove_columns=["label"]), lambda doc: doc["k_hop"])


def proofwriter_prompt(doc: dict[str, Any]) -> str:
    options = ", ".join(doc["choices"][:-1]) + " or " + doc["choices"][-1]
    return (f"{doc['theory']}\nQuestion: Based only on the facts and rules above, is the statement "
            f"\"{doc['question']}\" {options}?\nAnswer:")


# ----------------------------------------------------------------------------- MATH-500 answer check

_BOXED = re.compile(r"\\boxed\s*\{")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (braces balanced), or ``None``."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return None


def math_answers_match(gold: str, generation: str) -> bool:
    """Whether the generation's final answer equals ``gold``: math-verify when installed, else lm_eval's
    string equivalence on the last ``\\boxed{}`` (or the last ``$...$``) of the generation."""
    try:
        from math_verify import parse, verify
    except ImportError:  # fallback named in the task design
        return _string_equivalent(gold, generation)
    return bool(verify(parse(f"${gold}$"), parse(generation)))


def _string_equivalent(gold: str, generation: str) -> bool:
    from lm_eval.tasks.hendrycks_math.utils import is_equiv

    answer = last_boxed(generation)
    if answer is None:
        dollars = generation.split("$")
        answer = dollars[-2] if len(dollars) >= 3 else generation.strip()
    return bool(is_equiv(answer, gold))


def process_math500_results(doc: dict[str, Any], results: list[Any]) -> dict[str, int]:
    return {"exact_match": int(math_answers_match(str(doc["answer"]), str(results[0])))}
