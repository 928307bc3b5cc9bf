"""Synthetic ProofWriter-style reasoning: a short English theory and a True/False statement.

Task format after ProofWriter (Tafjord, Dalvi & Clark, 2021, "ProofWriter: Generating
Implications, Proofs, and Abductive Statements over Natural Language", closed-world variant); no
text is copied from it, every theory is generated here.

A theory is a set of facts ``[entity, attribute]`` ("Anne is kind.", "The bear is red.") and rules
``{"if": [premise, ...], "then": conclusion}`` over such atoms with one or two premises. The entity of
an atom is either a constant (``"Anne"``, ``"the bear"``) or the variable :data:`VARIABLE`
(``"?x"``). A rule is either *general* -- every atom uses ``"?x"``, rendered with
"someone"/"they" (people) or "something"/"it" (animals), and it holds for every entity of the
theory -- or *specific* -- every atom uses the same constant. The entities of a theory are those
named in its facts (an entity without facts can never satisfy a premise, so nothing else matters).

Closed-world assumption with negation as failure: a statement "E is a." is True iff ``[E, a]`` is
derivable; "E is not a." is True iff it is not. Every depth holds four kinds of question in equal
numbers, cycling so that with the default depths 0-5 any prefix of four or more documents (a short
``--limit``) sees all four:

1. plain statement of an atom provable at depth ``d`` -> True;
2. negated statement of an atom provable at depth ``d`` -> False;
3. plain statement of an unprovable atom -> False;
4. negated statement of an unprovable atom -> True.

So the answers are balanced per depth and the word "not" says nothing about the answer: exactly
half of the negated statements of a depth are True.

Depth of a provable query: the minimal number of stacked rule applications in a proof (depth 0 = a
given fact), computed by breadth-first forward chaining (:func:`proof_depths`); the query's minimal
depth is exactly ``d``.

Depth of an unprovable query (our own definition -- ProofWriter's depths for negation-as-failure
questions are defined differently): the length of a *near-miss chain*. The theory contains a chain
of ``d`` rules that would prove the query, but exactly one premise the chain needs, the document's
``missing_atom``, is absent (neither a fact nor derivable); the query is unprovable, and adding
``missing_atom`` as a fact makes it provable with minimal depth exactly ``d``. At ``d = 0`` the
missing atom is the query itself: an attribute not stated (nor derivable) of an entity that has
other facts. The missing fact is replaced by another fact about the same entity, so the number of
facts does not tell provable from unprovable queries.

Prompt length. Every theory is padded with irrelevant facts and rules (about entities other than
the query's, with attributes that appear nowhere else in the theory; see ``_irrelevant_padding``) to
``MAX_DEPTH + 2`` rules and a prompt size set by the document's round of the round-robin order
(:data:`PROMPT_SIZES`), not by its depth, so that the prompt length says nothing about the depth.

Public API: :data:`VARIABLE`, :func:`proof_depths`, :func:`generate_logic`, :func:`logic_dataset`.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

import datasets

from lm_eval_probes.tasks.seeded_generation import (
    LeveledGenerator,
    dataset_splits,
    generate_round_robin,
    closest_fill,
    prompt_size,
)

VARIABLE = "?x"
MIN_DEPTH = 0
MAX_DEPTH = 5
CHOICES = ("True", "False")

Atom = tuple[str, str]  # (entity or VARIABLE, attribute)
Rule = tuple[tuple[Atom, ...], Atom]  # (premises, conclusion)

_PEOPLE = ("Anne", "Bob", "Charlie", "Dave", "Erin", "Fiona", "Gary", "Harry")
_ANIMALS = ("the bear", "the cat", "the cow", "the dog", "the lion", "the mouse", "the rabbit", "the tiger")
_ATTRIBUTES = (
    "big", "blue", "calm", "cold", "gentle", "green", "happy", "kind", "nice", "quiet",
    "red", "rough", "round", "shy", "smart", "strong", "tall", "white", "young",
)  # fmt: skip

_ENTITIES_PER_THEORY = 3
_DISTRACTOR_FACTS = 3
_DISTRACTOR_RULES = 2
#: The ``prompt_size(theory + " " + question)`` (characters + 5 per word) that documents are padded
#: to: document ``i`` of every depth gets the same one, ``PROMPT_SIZES[int(round_fraction * 5)]``, so
#: the prompt length says nothing about the depth. Five sizes about 14 tokens apart, rather than a
#: continuum, keep the word-to-token noise of one document (a few tokens) from ranking documents of
#: neighbouring rounds by chance.
PROMPT_SIZES = (780, 885, 990, 1095, 1200)
_MAX_ATTEMPTS_PER_DOC = 200
_CHAIN_RULE_FORMS = ("general", "general", "specific", "general_and", "specific_and")
# (provable, negated) of document i of depth d is _KIND_CYCLE[(i + d) % 4]: the answer alternates
# True/False, and every 4 consecutive documents of a depth (and the first round over depths 0-5)
# hold all four kinds, so negation is True exactly as often as it is False.
_KIND_CYCLE = ((True, False), (False, False), (False, True), (True, True))


def _is_general(rule: Rule) -> bool:
    premises, conclusion = rule
    return all(entity == VARIABLE for entity, _ in (*premises, conclusion))


def _ground(rules: Sequence[Rule], entities: Iterable[str]) -> list[Rule]:
    """Replace ``VARIABLE`` by every entity in general rules; specific rules are kept as they are."""
    grounded: list[Rule] = []
    entity_list = sorted(set(entities))
    for rule in rules:
        premises, conclusion = rule
        if _is_general(rule):
            for entity in entity_list:
                grounded.append(
                    (tuple((entity, attribute) for _, attribute in premises), (entity, conclusion[1]))
                )
        elif any(entity == VARIABLE for entity, _ in (*premises, conclusion)):
            raise ValueError(f"rule {rule!r} mixes the variable {VARIABLE!r} with constants")
        else:
            grounded.append(rule)
    return grounded


def proof_depths(facts: Iterable[Atom], rules: Sequence[Rule]) -> dict[Atom, int]:
    """Minimal proof depth of every derivable atom, by breadth-first forward chaining.

    Round 0 holds the facts (depth 0). Round ``r`` fires every grounded rule whose premises were all
    known after round ``r - 1``; a conclusion first reached in round ``r`` has minimal depth ``r``,
    which equals ``1 + max(depth of its premises)`` along its shallowest proof. Atoms absent from the
    result are not derivable (False under the closed-world assumption). General rules range over
    the entities named in ``facts``.
    """
    depths: dict[Atom, int] = {(entity, attribute): 0 for entity, attribute in facts}
    if any(entity == VARIABLE for entity, _ in depths):
        raise ValueError(f"facts must be ground, got the variable {VARIABLE!r} in {sorted(depths)}")
    grounded = _ground(rules, (entity for entity, _ in depths))
    round_number = 0
    while True:
        round_number += 1
        derived = {
            conclusion
            for premises, conclusion in grounded
            if conclusion not in depths and all(premise in depths for premise in premises)
        }
        if not derived:
            return depths
        for atom in derived:
            depths[atom] = round_number


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


def _render_fact(atom: Atom) -> str:
    entity, attribute = atom
    return f"{_capitalize(entity)} is {attribute}."


def _render_rule(rng: random.Random, rule: Rule, *, about_people: bool) -> str:
    premises, conclusion = rule
    attributes = [attribute for _, attribute in premises]
    if _is_general(rule):
        someone, they, be, kind = ("someone", "they", "are", "people") if about_people else (
            "something", "it", "is", "things")  # fmt: skip
        if len(attributes) == 1:
            templates = (
                f"If {someone} is {attributes[0]} then {they} {be} {conclusion[1]}.",
                f"All {attributes[0]} {kind} are {conclusion[1]}.",
                f"{_capitalize(attributes[0])} {kind} are {conclusion[1]}.",
            )
        else:
            templates = (
                f"If {someone} is {attributes[0]} and {attributes[1]} then {they} {be} {conclusion[1]}.",
                f"All {attributes[0]}, {attributes[1]} {kind} are {conclusion[1]}.",
            )
        return rng.choice(templates)
    entity = conclusion[0]
    condition = " and ".join(f"{entity} is {attribute}" for attribute in attributes)
    return f"If {condition} then {entity} is {conclusion[1]}."


def _random_rule(
    rng: random.Random, target: str, premise_pool: Sequence[str], conclusion_pool: Sequence[str]
) -> Rule | None:
    """A distractor rule: general or about ``target``, premises and conclusion from the pools."""
    entity = VARIABLE if rng.random() < 0.6 else target
    n_premises = 1 if rng.random() < 0.6 else 2
    conclusion = rng.choice(conclusion_pool)
    candidates = [attribute for attribute in premise_pool if attribute != conclusion]
    if len(candidates) < n_premises:
        return None
    premises = rng.sample(candidates, n_premises)
    return tuple((entity, attribute) for attribute in premises), (entity, conclusion)


def _random_fact(rng: random.Random, target: str, others: Sequence[str], attributes: Sequence[str]) -> Atom:
    """A distractor fact: mostly about another entity, sometimes about ``target``."""
    entity = rng.choice([target, *others]) if rng.random() < 0.3 else rng.choice(others)
    return entity, rng.choice(attributes)


def _sample_theory(
    rng: random.Random, depth: int, *, provable: bool
) -> tuple[list[Atom], list[Rule], Atom, Atom | None, bool]:
    """One candidate theory with a (near-miss) proof chain of ``depth`` rules for the query atom.

    The chain is ``depth`` rules leading from the fact ``[target, chain[0]]`` (plus, for two-premise
    rules, further given facts about ``target``) to the query ``[target, chain[depth]]``. When
    ``provable`` is false, one of the chain's given facts (for ``depth == 0`` the query itself) is
    left out -- the *missing atom* -- and a fact about ``target`` with an attribute off the chain
    takes its place, so that neither the number of facts nor the number about ``target`` tells the
    two apart. Distractor facts and rules are drawn alike in both cases.

    Returns ``(facts, rules, query_atom, missing_atom, about_people)`` (``missing_atom`` is ``None``
    when ``provable``); the caller checks the result with :func:`proof_depths`, since distractors
    may open a shorter proof or restore the missing atom.
    """
    about_people = rng.random() < 0.5
    target, *others = rng.sample(_PEOPLE if about_people else _ANIMALS, _ENTITIES_PER_THEORY)
    attributes = list(_ATTRIBUTES)
    rng.shuffle(attributes)
    chain, spare = attributes[: depth + 1], attributes[depth + 1 :]

    facts: list[Atom] = [(target, chain[0])]
    rules: list[Rule] = []
    for step in range(1, depth + 1):
        form = rng.choice(_CHAIN_RULE_FORMS)
        entity = VARIABLE if form.startswith("general") else target
        premise_attributes = [chain[step - 1]]
        if form.endswith("_and"):
            if step >= 2 and rng.random() < 0.5:  # an earlier link of the chain
                premise_attributes.append(rng.choice(chain[: step - 1]))
            else:  # a given fact about the target
                extra = spare.pop()
                facts.append((target, extra))
                premise_attributes.append(extra)
            rng.shuffle(premise_attributes)
        rules.append((tuple((entity, a) for a in premise_attributes), (entity, chain[step])))
    query = (target, chain[depth])

    missing: Atom | None = None
    if not provable:
        missing = rng.choice(facts)  # a given premise of the chain (the query itself at depth 0)
        facts.remove(missing)
        facts.append((target, rng.choice(spare)))  # same number of facts, and of facts about the target
    n_distractor_facts = _DISTRACTOR_FACTS
    if rng.random() < 0.5:  # the queried attribute, but about another entity (in both kinds alike)
        facts.append((rng.choice(others), query[1]))
        n_distractor_facts -= 1
    for _ in range(n_distractor_facts):
        facts.append(_random_fact(rng, target, others, attributes))
    near_miss_rule = rng.random() < 0.5
    for index in range(_DISTRACTOR_RULES):
        if near_miss_rule and index == 0:  # concludes the queried attribute from off-chain premises (usually absent)
            rule = _random_rule(rng, target, spare, [query[1]])
        else:
            rule = _random_rule(rng, target, attributes, spare)
        if rule is not None:
            rules.append(rule)
    return facts, rules, query, missing, about_people


def _is_well_formed(facts: Sequence[Atom], rules: Sequence[Rule]) -> bool:
    if len(set(facts)) != len(facts):
        return False
    rule_keys = [(frozenset(premises), conclusion) for premises, conclusion in rules]
    if len(set(rule_keys)) != len(rule_keys):
        return False
    return all(conclusion not in premises for premises, conclusion in rules)


def _query_status(
    facts: Sequence[Atom], rules: Sequence[Rule], query: Atom, missing: Atom | None, depth: int
) -> bool:
    """Whether the candidate has the intended depth: minimal proof depth ``depth`` when ``missing``
    is ``None``; otherwise query and ``missing`` not derivable, and the query's minimal depth
    exactly ``depth`` once ``missing`` is added as a fact (the near-miss depth)."""
    depths = proof_depths(facts, rules)
    if missing is None:
        return depths.get(query) == depth
    if query in depths or missing in depths:
        return False
    return proof_depths([*facts, missing], rules).get(query) == depth


def _irrelevant_padding(
    rng: random.Random,
    facts: Sequence[Atom],
    rules: Sequence[Rule],
    query: Atom,
    *,
    depth: int,
    about_people: bool,
    question: str,
    target_size: int,
) -> tuple[list[tuple[Atom, str]], list[tuple[Rule, str]]] | None:
    """The theory's facts and rules with their sentences, padded with irrelevant ones so that the
    prompt ``theory + " " + question`` has about ``prompt_size`` ``target_size``; ``None`` if it is
    already larger.

    Padding keeps the number of rules equal across depths (``MAX_DEPTH - depth`` padding rules, so
    every theory has ``MAX_DEPTH + _DISTRACTOR_RULES`` rules unless a distractor rule was dropped),
    then adds facts while that brings the size closer to ``target_size``. Padding facts are about
    entities other than the query's, and padding facts and rules use only attributes that appear
    nowhere in the given theory nor in the query. A padding rule therefore concludes only such
    attributes and no rule of the given theory has one as a premise: no padding atom can enter a
    proof of the query or of its missing atom, nor make the unprovable query provable, and the query's
    (near-miss) depth is unchanged.
    """
    target = query[0]
    used = {query[1]} | {attribute for _, attribute in facts}
    used |= {attribute for premises, conclusion in rules for _, attribute in (*premises, conclusion)}
    free = [attribute for attribute in _ATTRIBUTES if attribute not in used]
    others = [entity for entity in (_PEOPLE if about_people else _ANIMALS) if entity != target]
    padding_rules: list[Rule] = []
    for _ in range(MAX_DEPTH - depth):
        rule = _random_rule(rng, rng.choice(others), free, free)
        if rule is None:
            return None
        padding_rules.append(rule)
    all_rules = [*rules, *padding_rules]
    rendered_facts = [(fact, _render_fact(fact)) for fact in facts]
    rendered_rules = [(rule, _render_rule(rng, rule, about_people=about_people)) for rule in all_rules]
    size = prompt_size(" ".join(sentence for _, sentence in [*rendered_facts, *rendered_rules]) + " " + question)
    if size > target_size:
        return None
    candidates = [(entity, attribute) for entity in others for attribute in free]
    rng.shuffle(candidates)
    chosen = closest_fill(
        [(fact, prompt_size(" " + _render_fact(fact))) for fact in candidates], target_size - size
    )
    return [*rendered_facts, *((fact, _render_fact(fact)) for fact in chosen)], rendered_rules


def _make_doc(rng: random.Random, *, level: int, index: int, round_fraction: float) -> dict[str, Any] | None:
    depth = level
    provable, negated = _KIND_CYCLE[(index + depth) % len(_KIND_CYCLE)]
    answer_is_true = provable != negated  # closed-world assumption, negation as failure
    target_size = PROMPT_SIZES[int(round_fraction * len(PROMPT_SIZES))]
    for _ in range(_MAX_ATTEMPTS_PER_DOC):
        facts, rules, query, missing, about_people = _sample_theory(rng, depth, provable=provable)
        if not _is_well_formed(facts, rules) or not _query_status(facts, rules, query, missing, depth):
            continue
        entity, attribute = query
        question = f"{_capitalize(entity)} is {'not ' if negated else ''}{attribute}."
        padded = _irrelevant_padding(
            rng, facts, rules, query, depth=depth, about_people=about_people, question=question,
            target_size=target_size,
        )  # fmt: skip
        if padded is None:
            continue
        rendered_facts, rendered_rules = padded
        rng.shuffle(rendered_facts)
        rng.shuffle(rendered_rules)
        facts = [fact for fact, _ in rendered_facts]
        rules = [rule for rule, _ in rendered_rules]
        if not _is_well_formed(facts, rules) or not _query_status(facts, rules, query, missing, depth):
            continue  # a repeated padding rule; the padding never changes the query's depth
        fact_sentences = [sentence for _, sentence in rendered_facts]
        rule_sentences = [sentence for _, sentence in rendered_rules]
        return {
            "id": f"logic-{depth}-{index}",
            "theory": " ".join(fact_sentences + rule_sentences),
            "question": question,
            "answer": CHOICES[0] if answer_is_true else CHOICES[1],
            "label": 0 if answer_is_true else 1,
            "depth": depth,
            "facts": fact_sentences,
            "rules": rule_sentences,
            "fact_atoms": [list(fact) for fact in facts],
            "rule_atoms": [
                {"if": [list(premise) for premise in premises], "then": list(conclusion)}
                for premises, conclusion in rules
            ],
            "query_atom": list(query),
            "query_negated": negated,
            "provable": provable,
            "missing_atom": None if missing is None else list(missing),
        }
    return None


def _prompt_key(doc: dict[str, Any]) -> str:
    return f"{doc['theory']}\n{doc['question']}"


_LOGIC = LeveledGenerator(
    name="synth_logic", make_document=_make_doc, identity=_prompt_key,
    level_name="depths", min_level=MIN_DEPTH, max_level=MAX_DEPTH,
)  # fmt: skip


def generate_logic(
    n_per_level: int, *, seed: int = 0, depths: Iterable[int] = range(MIN_DEPTH, MAX_DEPTH + 1)
) -> list[dict[str, Any]]:
    """``n_per_level`` True/False reasoning problems per proof depth, ordered round-robin.

    Args:
        n_per_level: documents per depth, >= 0.
        seed: any int; the same ``(n_per_level, seed, depths)`` always gives the same documents, and
            document ``i`` of a depth does not depend on ``n_per_level``.
        depths: distinct proof depths in ``[0, 5]``; the output order follows it.

    Returns:
        ``len(depths) * n_per_level`` dicts ordered depth-0 #0, depth-1 #0, ..., depth-0 #1, ...,
        each with keys ``id`` (``"logic-<depth>-<i>"``), ``theory`` (facts then rules, each in
        shuffled order), ``question`` (a statement), ``answer`` (``"True"``/``"False"``), ``label``
        (0 for True, 1 for False, indexing ``["True", "False"]``), ``depth``, ``facts`` and ``rules``
        (the sentences of ``theory``), ``fact_atoms`` (``[entity, attribute]`` in the order of
        ``facts``), ``rule_atoms`` (``{"if": [[entity, attribute], ...], "then": [entity,
        attribute]}`` in the order of ``rules``, entity ``"?x"`` in general rules), ``query_atom``
        ``query_negated``, ``provable`` (whether ``query_atom`` is derivable) and ``missing_atom``
        (for unprovable queries the ``[entity, attribute]`` whose addition as a fact makes the
        query provable at exactly ``depth``; ``None`` for provable ones). Document ``i`` of depth
        ``d`` has kind ``(provable, negated)`` = ``[(True, False), (False, False), (False, True),
        (True, True)][(i + d) % 4]``, so the answer is True iff ``i + d`` is even, the four kinds
        are balanced within a depth (exactly when ``n_per_level`` is a multiple of 4), and the
        first round over depths 0-5 holds all four.
    """
    return generate_round_robin(_LOGIC, n_per_level, seed=seed, levels=depths)


_ATOM_FEATURE = [datasets.Value("string")]
_FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "theory": datasets.Value("string"),
        "question": datasets.Value("string"),
        "answer": datasets.Value("string"),
        "label": datasets.Value("int64"),
        "depth": datasets.Value("int64"),
        "facts": [datasets.Value("string")],
        "rules": [datasets.Value("string")],
        "fact_atoms": [_ATOM_FEATURE],
        "rule_atoms": [{"if": [_ATOM_FEATURE], "then": _ATOM_FEATURE}],
        "query_atom": _ATOM_FEATURE,
        "query_negated": datasets.Value("bool"),
        "provable": datasets.Value("bool"),
        "missing_atom": _ATOM_FEATURE,  # null for provable queries
    }
)


def logic_dataset(
    *, n_per_level: int = 40, seed: int = 1234, fewshot_per_level: int = 1, **_ignored: Any
) -> datasets.DatasetDict:
    """The reasoning task as a ``DatasetDict`` for lm-eval's ``custom_dataset`` hook.

    ``test`` is ``generate_logic(n_per_level, seed=seed)``. ``train`` (the few-shot pool) holds
    ``fewshot_per_level`` problems per depth drawn from a separate random stream of the same seed,
    with no theory+question shared with ``test``. Extra keyword arguments (lm-eval passes task
    metadata and ``model_args`` here) are ignored.
    """
    test_docs, train_docs = dataset_splits(
        _LOGIC, n_per_level=n_per_level, fewshot_per_level=fewshot_per_level, seed=seed
    )
    return datasets.DatasetDict(
        {
            split: datasets.Dataset.from_list(docs, features=_FEATURES)
            for split, docs in (("test", test_docs), ("train", train_docs))
        }
    )
