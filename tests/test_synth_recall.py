"""The synthetic recall task (``tasks/synth_recall.py``): documents checked against an independent reading of their text."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from test_synth_tasks import _load_task_module

synth_recall = _load_task_module("synth_recall")

N_PER_LEVEL = 24
LEVELS = tuple(range(1, 6))
FACT = re.compile(r"(\w+) has an? (\w+) (\w+)\.")


@pytest.fixture(scope="module")
def recall_docs() -> list[dict[str, Any]]:
    return synth_recall.generate_recall(N_PER_LEVEL, seed=7)


def _facts(doc: dict[str, Any]) -> dict[str, str]:
    """owner → colour, read back from the context's sentences (every sentence either an owner's or padding)."""
    sentences = re.findall(r"[^.]+\.", doc["context"])
    facts = {}
    for sentence in (s.strip() for s in sentences):
        match = FACT.fullmatch(sentence)
        if match is None:
            assert sentence in doc["irrelevant_sentences"], sentence
            continue
        name, color, object_ = match.groups()
        assert object_ == doc["object"] and name not in facts, (sentence, doc)
        assert sentence.split()[2] == ("an" if color[0] in "aeiou" else "a"), sentence
        facts[name] = color
    return facts


def test_deterministic_seeded_and_prefix_stable(recall_docs: list[dict[str, Any]]) -> None:
    assert synth_recall.generate_recall(N_PER_LEVEL, seed=7) == recall_docs
    assert synth_recall.generate_recall(4, seed=7) == recall_docs[: 4 * len(LEVELS)]
    assert [d["context"] for d in synth_recall.generate_recall(4, seed=8)] != [d["context"] for d in recall_docs[:20]]


def test_round_robin_order_and_balance(recall_docs: list[dict[str, Any]]) -> None:
    assert [d["id"] for d in recall_docs] == [f"recall-{level}-{i}" for i in range(N_PER_LEVEL) for level in LEVELS]
    assert Counter(d["people"] for d in recall_docs) == {level: N_PER_LEVEL for level in LEVELS}
    assert [d["id"] for d in synth_recall.generate_recall(2, seed=1, levels=[4, 2])] == [
        "recall-4-0", "recall-2-0", "recall-4-1", "recall-2-1"]


def test_answer_is_the_asked_owners_colour_read_from_the_text(recall_docs: list[dict[str, Any]]) -> None:
    for doc in recall_docs:
        facts = _facts(doc)
        assert len(facts) == doc["people"] == len(set(facts.values())), doc
        name, object_ = re.fullmatch(r"What color is (\w+)'s (\w+)\?", doc["question"]).groups()
        assert object_ == doc["object"] and facts[name] == doc["answer"] == doc["choices"][doc["label"]], doc
        assert dict(zip(doc["owners"], doc["colors"])) == facts and doc["owners"][doc["asked"]] == name


def test_options_hold_the_context_colours_up_to_three_and_unmentioned_ones(recall_docs: list[dict[str, Any]]) -> None:
    for doc in recall_docs:
        choices, facts = doc["choices"], _facts(doc)
        assert len(set(choices)) == 4 and set(choices) <= set(synth_recall.COLORS), doc
        in_context = [c for c in choices if c in facts.values()]
        assert len(in_context) == min(doc["people"], 4), doc  # the answer and min(people - 1, 3) others
        prompt = doc["context"] + " " + doc["question"]
        for color in set(choices) - set(facts.values()):
            assert not re.search(rf"\b{color}\b", prompt), (color, doc)
    for level in LEVELS:  # every answer position equally often within a level
        assert Counter(d["label"] for d in recall_docs if d["people"] == level) == {p: N_PER_LEVEL // 4 for p in range(4)}


def test_padding_names_no_owner_no_colour_no_object(recall_docs: list[dict[str, Any]]) -> None:
    colors = set(synth_recall.COLORS) | set(synth_recall.SHOT_COLORS)
    for doc in recall_docs:
        assert doc["irrelevant_sentences"], doc  # every document is padded
        for sentence in doc["irrelevant_sentences"]:
            words = set(re.findall(r"\w+", sentence))
            assert not words & (set(doc["owners"]) | colors | set(synth_recall.OBJECTS)), sentence
        assert len(doc["irrelevant_sentences"]) == len(set(doc["irrelevant_sentences"]))


def test_dataset_splits_few_shot_examples_use_other_colours() -> None:
    dataset = synth_recall.recall_dataset(n_per_level=6, seed=3, fewshot_per_level=2, pretrained="x", version=1.0)
    assert dataset["test"].num_rows == 30 and dataset["train"].num_rows == 10
    assert dataset["test"]["context"] == [d["context"] for d in synth_recall.generate_recall(6, seed=3)]
    assert Counter(dataset["train"]["people"]) == {level: 2 for level in LEVELS}
    shot_words = {w for row in dataset["train"] for w in re.findall(r"\w+", row["context"] + " " + " ".join(row["choices"]))}
    assert not shot_words & set(synth_recall.COLORS)
    assert {c for row in dataset["train"] for c in row["colors"]} <= set(synth_recall.SHOT_COLORS)
    assert not set(synth_recall.COLORS) & set(synth_recall.SHOT_COLORS)


@pytest.mark.parametrize("kwargs", [{"n_per_level": -1}, {"n_per_level": 2, "levels": [0]}, {"n_per_level": 2, "levels": [6]},
                                    {"n_per_level": 2, "seed": "7"}])
def test_rejects_bad_arguments(kwargs: dict[str, Any]) -> None:
    n_per_level = kwargs.pop("n_per_level")
    with pytest.raises(ValueError):
        synth_recall.generate_recall(n_per_level, **kwargs)
