"""Tests of the input-noise operators ``tasks/noise.py`` ("Unsure but Certain", arXiv 2608.08791).

Eligible-unit counts, keyboard adjacency and the per-operator edit structure are re-derived here with
independent code (regular expressions, key geometry, subsequence checks), never with the module's
own helpers.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import random
import re
import sys
from collections import Counter
from functools import lru_cache
from pathlib import Path
from types import ModuleType

import pytest

NOISE_PATH = Path(__file__).resolve().parents[1] / "tasks" / "noise.py"


def _load(name: str, *, register: bool) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, NOISE_PATH)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {NOISE_PATH}")
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


noise = _load("_test_noise_tasks_noise", register=True)

OPERATORS = ("swap", "keyboard", "insert", "delete")
SENTENCE = "Natalie sold 48 clips in April and then half as many in May."

_WORDS = (
    "the of and to in is was for on that with as by at from his her they have had were but not "
    "which one all their there been when who will more would about into than them some could "
    "time people water number apples books market garden letter friends morning school teacher "
    "bought sold gave left found each every many half twice total remaining minutes hours dollars "
    "cookies marbles pencils trains bottle kitchen village yellow quickly happily better little "
    "Mississippi committee balloon llama aa"
).split()
_NUMBERS = ("48", "$3.50", "2x", "1,000", "12.", "(7)", "3/4", "x=5", "10%")


@lru_cache(maxsize=None)
def corpus(n_words: int = 2500, seed: int = 20260808) -> str:
    """English-like text: sentences of words, some capitalised or all-caps, numbers, lines."""
    rng = random.Random(seed)
    lines, sentence, line = [], [], []
    for _ in range(n_words):
        roll = rng.random()
        if roll < 0.08:
            word = rng.choice(_NUMBERS)
        else:
            word = rng.choice(_WORDS)
            if roll > 0.97:
                word = word.upper()
        if not sentence:
            word = word[:1].upper() + word[1:]
        sentence.append(word)
        if rng.random() < 0.1:
            sentence[-1] += rng.choice(".?!")
            line.append(" ".join(sentence))
            sentence = []
            if rng.random() < 0.3:
                lines.append(" ".join(line))
                line = []
        elif rng.random() < 0.05:
            sentence[-1] += ","
    line.append(" ".join(sentence))
    lines.append(" ".join(line))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Independent references


def has_digit(token: str) -> bool:
    return re.search(r"\d", token) is not None


_NEGATION_WORDS = {"not", "no", "nor", "never", "cannot", "none", "nothing", "nobody", "nowhere", "neither"}


def has_negation(token: str) -> bool:
    """A whitespace token holding a negation word: a letter/apostrophe piece that is one, or ends in n't."""
    pieces = [piece.lower() for piece in re.split(r"[^A-Za-z'’]+", token) if piece]
    return any(piece in _NEGATION_WORDS or piece.endswith(("n't", "n’t")) for piece in pieces)


def is_protected(token: str) -> bool:
    """Protected by default: the token holds a digit or a negation word."""
    return has_digit(token) or has_negation(token)


def expected_eligible(text: str, operator: str) -> int:
    """Eligible units with numbers and negations protected, counted from the definitions in the brief."""
    tokens = [t for t in text.split() if not is_protected(t)]
    if operator == "swap":  # letter runs with at least two distinct letters
        return sum(len(set(run)) > 1 for t in tokens for run in re.findall(r"[^\W\d_]+", t))
    if operator == "keyboard":
        return sum(len(re.findall(r"[A-Za-z]", t)) for t in tokens)
    if operator == "insert":
        return sum(len(re.findall(r"[^\W\d_]", t)) for t in tokens)
    return sum(re.search(r"[^\W\d_]", t) is not None for t in tokens)


def qwerty_neighbours_from_geometry() -> dict[str, set[str]]:
    """Keys at unit spacing, rows staggered by 0, 1/4 and 3/4 key: neighbours are the keys one step
    away on the same row, or less than one key away horizontally on an adjacent row."""
    rows = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
    offsets = (0.0, 0.25, 0.75)
    position = {key: (r, offsets[r] + c) for r, row in enumerate(rows) for c, key in enumerate(row)}
    neighbours: dict[str, set[str]] = {}
    for key, (r, x) in position.items():
        neighbours[key] = {
            other
            for other, (r2, x2) in position.items()
            if other != key
            and ((r2 == r and abs(x2 - x) == 1) or (abs(r2 - r) == 1 and abs(x2 - x) < 1))
        }
    digits = "1234567890"
    for i, d in enumerate(digits):
        neighbours[d] = {digits[j] for j in (i - 1, i + 1) if 0 <= j < len(digits)}
    return neighbours


def is_subsequence(short: list[str] | str, long: list[str] | str) -> bool:
    it = iter(long)
    return all(any(x == y for y in it) for x in short)


def one_adjacent_transposition(a: str, b: str) -> bool:
    if len(a) != len(b):
        return False
    diff = [i for i in range(len(a)) if a[i] != b[i]]
    return len(diff) == 2 and diff[1] == diff[0] + 1 and (a[diff[0]], a[diff[1]]) == (b[diff[1]], b[diff[0]])


def run(text: str, operator: str, eta: float, seed: int = 0, **options):
    return noise.noise_text(text, operator=operator, eta=eta, seed=seed, **options)


# ---------------------------------------------------------------------------------------------
# Rates, determinism


@pytest.mark.parametrize("eta", (0.05, 0.10, 0.15, 0.30))
@pytest.mark.parametrize("operator", OPERATORS)
def test_realised_rate_matches_eta(operator: str, eta: float) -> None:
    text = corpus()
    out = run(text, operator, eta, seed=7)
    assert out.eligible == expected_eligible(text, operator)
    assert out.eligible >= 2000
    standard_error = math.sqrt(eta * (1 - eta) / out.eligible)
    assert abs(out.corrupted / out.eligible - eta) <= 4 * standard_error


def test_constants() -> None:
    assert noise.OPERATORS == OPERATORS
    assert noise.ETAS == (0.05, 0.10, 0.15, 0.30)


@pytest.mark.parametrize("operator", OPERATORS)
def test_eta_zero_changes_nothing(operator: str) -> None:
    text = corpus()
    out = run(text, operator, 0.0)
    assert out.text == text and out.corrupted == 0 and out.eligible == expected_eligible(text, operator)


@pytest.mark.parametrize("operator", OPERATORS)
def test_eta_one_corrupts_every_unit(operator: str) -> None:
    text = corpus()
    out = run(text, operator, 1.0)
    assert out.corrupted == out.eligible == expected_eligible(text, operator)
    if operator == "swap":
        changed = sum(a != b for a, b in zip(text.split(), out.text.split()))
        swappable = [t for t in text.split() if not is_protected(t)]
        assert changed == sum(any(len(set(r)) > 1 for r in re.findall(r"[^\W\d_]+", t)) for t in swappable)
    if operator == "keyboard":
        assert sum(a != b for a, b in zip(text, out.text)) == out.eligible
    if operator == "delete":
        assert out.text.split() == [t for t in text.split() if is_protected(t) or not re.search(r"[^\W\d_]", t)]


def test_empty_and_unit_free_text() -> None:
    for operator in OPERATORS:
        assert run("", operator, 1.0) == ("", 0, 0)
        assert run("48 + 3 = 51 !\n", operator, 1.0) == ("48 + 3 = 51 !\n", 0, 0)
    assert run("aaa zz", "swap", 1.0) == ("aaa zz", 0, 0)  # no pair of different letters


@pytest.mark.parametrize("operator", OPERATORS)
def test_same_seed_same_text_different_seed_different_text(operator: str) -> None:
    text = corpus()
    first, again = run(text, operator, 0.3, seed=1), run(text, operator, 0.3, seed=1)
    other = run(text, operator, 0.3, seed=2)
    assert first == again
    assert first.text != other.text


def test_noise_levels_are_nested() -> None:
    """One seed: what is corrupted at a low η is corrupted the same way at a higher η."""
    text = corpus()
    changes = {}
    for eta in (0.05, 0.10, 0.30):
        out = run(text, "keyboard", eta, seed=3)
        changes[eta] = {i: b for i, (a, b) in enumerate(zip(text, out.text)) if a != b}
    assert changes[0.05].items() <= changes[0.10].items() <= changes[0.30].items()
    deleted = {
        eta: Counter(text.split()) - Counter(run(text, "delete", eta, seed=3).text.split()) for eta in (0.05, 0.3)
    }
    assert deleted[0.05] <= deleted[0.30]


# ---------------------------------------------------------------------------------------------
# Protection


@pytest.mark.parametrize("eta", (0.3, 1.0))
@pytest.mark.parametrize("operator", OPERATORS)
def test_numbers_are_protected_by_default(operator: str, eta: float) -> None:
    text = corpus()
    out = run(text, operator, eta, seed=5)
    assert [t for t in out.text.split() if has_digit(t)] == [t for t in text.split() if has_digit(t)]


@pytest.mark.parametrize("operator", OPERATORS)
def test_regex_protected_spans_survive(operator: str) -> None:
    text = "Let $x + y = 10$ and $ab - cd$ hold; then see \\frac{apple}{pear} twice.\n" * 20
    patterns = (r"\$[^$]*\$", r"\\frac\{[^}]*\}\{[^}]*\}")
    out = run(text, operator, 1.0, protect=patterns)
    spans = [m.group() for p in patterns for m in re.finditer(p, text)]
    assert out.corrupted > 0
    for pattern in patterns:
        assert re.findall(pattern, out.text) == re.findall(pattern, text)
    assert all(span in out.text for span in spans)


PROOFWRITER_LIKE = (
    "Gary is not kind. The bear does not chase the cat. If someone is not big then they are round.\n"
    "Anne isn't green. Nothing is cold. Bob never visits the mouse. The dog cannot see the lion.\n"
    "Nobody is rough, and no cat is blue; neither Erin nor Dave is young. Fiona doesn’t eat none of it.\n"
    "NOT all things are nice. The cow don't like (nowhere) places.\n"
) * 5


def negation_tokens(text: str) -> list[str]:
    return [token for token in text.split() if has_negation(token)]


@pytest.mark.parametrize("eta", (0.5, 1.0))
@pytest.mark.parametrize("operator", OPERATORS)
def test_negations_are_protected_by_default(operator: str, eta: float) -> None:
    out = run(PROOFWRITER_LIKE, operator, eta, seed=23)
    assert len(negation_tokens(PROOFWRITER_LIKE)) == 5 * 16
    assert negation_tokens(out.text) == negation_tokens(PROOFWRITER_LIKE)
    assert out.corrupted > 0 and out.eligible == expected_eligible(PROOFWRITER_LIKE, operator)
    standard_error = math.sqrt(eta * (1 - eta) / out.eligible)
    assert abs(out.corrupted / out.eligible - eta) <= 4 * standard_error


@pytest.mark.parametrize("operator", OPERATORS)
def test_protect_negations_false_lets_negations_change(operator: str) -> None:
    out = run(PROOFWRITER_LIKE, operator, 1.0, seed=23, protect_negations=False)
    clean = negation_tokens(PROOFWRITER_LIKE)
    if operator == "delete":
        assert negation_tokens(out.text) == []
    else:  # tokens keep their places; every negation token is garbled (each has two different letters)
        pairs = list(zip(PROOFWRITER_LIKE.split(), out.text.split(), strict=True))
        assert all(noised != token for token, noised in pairs if has_negation(token)), pairs
    assert out.eligible > run(PROOFWRITER_LIKE, operator, 1.0).eligible


def test_delete_keeps_the_not_of_a_negated_statement() -> None:
    assert run("Gary is not kind.", "delete", 1.0).text == "not"
    assert run("Gary is not kind.", "delete", 1.0, protect_negations=False).text == ""
    lookalikes = "Nora takes notes on the knot, nonetheless: a nose, a notion, an annotation."
    assert run(lookalikes, "delete", 1.0) == ("", 13, 13)  # no negation word in it


def test_protect_numbers_false_lets_numbers_change() -> None:
    keyboard = run(SENTENCE, "keyboard", 1.0, protect_numbers=False)
    clean_digits = [i for i, c in enumerate(SENTENCE) if c.isdigit()]
    assert all(keyboard.text[i] != SENTENCE[i] and keyboard.text[i].isdigit() for i in clean_digits)
    assert keyboard.eligible == run(SENTENCE, "keyboard", 0.0).eligible + 2
    assert run(SENTENCE, "swap", 1.0, protect_numbers=False).text.split()[2] == "84"
    assert "48" not in run(SENTENCE, "delete", 1.0, protect_numbers=False).text
    assert run(SENTENCE, "insert", 1.0, protect_numbers=False).eligible == run(SENTENCE, "insert", 1.0).eligible + 2


# ---------------------------------------------------------------------------------------------
# Each operator does what its name says


def test_swap_transposes_one_adjacent_pair_per_corrupted_word() -> None:
    text = corpus()
    out = run(text, "swap", 0.3, seed=11)
    assert len(out.text) == len(text)
    clean_runs = [(m.start(), m.group()) for m in re.finditer(r"[^\W\d_]+", text)]
    noisy_runs = [(m.start(), m.group()) for m in re.finditer(r"[^\W\d_]+", out.text)]
    assert [s for s, _ in clean_runs] == [s for s, _ in noisy_runs]
    differing = [(a, b) for (_, a), (_, b) in zip(clean_runs, noisy_runs) if a != b]
    assert len(differing) == out.corrupted > 0
    assert all(Counter(a) == Counter(b) and one_adjacent_transposition(a, b) for a, b in differing)
    assert [c for c in text if not c.isalpha()] == [c for c in out.text if not c.isalpha()]


def test_keyboard_table_matches_key_geometry() -> None:
    reference = qwerty_neighbours_from_geometry()
    assert {k: set(v) for k, v in noise.KEYBOARD_NEIGHBOURS.items()} == reference
    assert all(k in reference[v] for k, vs in reference.items() for v in vs)  # symmetric


def test_keyboard_substitutes_qwerty_neighbours_keeping_case() -> None:
    reference = qwerty_neighbours_from_geometry()
    text = corpus()
    out = run(text, "keyboard", 0.3, seed=13)
    assert len(out.text) == len(text)
    changed = [(a, b) for a, b in zip(text, out.text) if a != b]
    assert len(changed) == out.corrupted > 0
    for a, b in changed:
        assert a.isupper() == b.isupper() and a.islower() == b.islower()
        assert b.lower() in reference[a.lower()]


def test_insert_adds_one_lowercase_letter_after_the_unit() -> None:
    text = corpus()
    out = run(text, "insert", 0.3, seed=17)
    assert len(out.text) == len(text) + out.corrupted and out.corrupted > 0
    assert is_subsequence(text, out.text)
    assert [c for c in out.text if not c.isalpha()] == [c for c in text if not c.isalpha()]
    everywhere = run("Cab, DOG!", "insert", 1.0)
    assert everywhere.corrupted == 6
    assert re.fullmatch(r"C[a-z]a[a-z]b[a-z], D[a-z]O[a-z]G[a-z]!", everywhere.text)


def test_delete_removes_whole_words_and_one_space() -> None:
    text = corpus()
    out = run(text, "delete", 0.3, seed=19)
    clean_words, noisy_words = text.split(), out.text.split()
    assert out.corrupted > 0 and len(noisy_words) == len(clean_words) - out.corrupted
    assert is_subsequence(noisy_words, clean_words)
    assert "  " not in out.text and "  " not in text
    assert out.text.count("\n") == text.count("\n")
    assert not any(line.startswith(" ") or line.endswith(" ") for line in out.text.split("\n"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("one two three", ""),
        ("one two\nthree four\n", "\n\n"),
        ("Cost: 48 dollars.", "48"),
        ("a\tb 7", "7"),
    ],
)
def test_delete_whitespace_cases(text: str, expected: str) -> None:
    assert run(text, "delete", 1.0).text == expected


def test_delete_keeps_whitespace_inside_protected_span() -> None:
    out = run("see  $a b$ here", "delete", 1.0, protect=(r" \$[^$]*\$",))
    assert out.text == " $a b$" and out.corrupted == 2


# ---------------------------------------------------------------------------------------------
# Documents and seeds


def test_document_seed_is_stable_and_depends_on_everything() -> None:
    assert noise.document_seed("hello", 0, "swap") == 9802641028349171258
    seeds = {
        noise.document_seed("hello", 0, "swap"),
        noise.document_seed("hello", 1, "swap"),
        noise.document_seed("hellp", 0, "swap"),
        noise.document_seed("hello", 0, "delete"),
        noise.document_seed("hello", 0),
    }
    assert len(seeds) == 5
    assert all(0 <= s < 2**64 for s in seeds)


def test_noise_fields_keeps_clean_copies_and_metadata() -> None:
    doc = {"question": SENTENCE, "context": "Then she bought more clips.", "answer": "72", "id": 3}
    before = dict(doc)
    out = noise.noise_fields(doc, ["question", "context"], operator="keyboard", eta=0.3, global_seed=1234)
    assert doc == before
    assert out is not doc
    assert out["clean_question"] == SENTENCE and out["clean_context"] == doc["context"]
    assert out["answer"] == "72" and out["id"] == 3
    assert out["noise_operator"] == "keyboard" and out["noise_eta"] == 0.3 and out["noise_seed"] == 1234
    per_field = [
        noise.noise_text(
            doc[f],
            operator="keyboard",
            eta=0.3,
            seed=noise.document_seed(f'["{SENTENCE}", "{doc["context"]}"]', 1234, f"keyboard:{f}"),
        )
        for f in ("question", "context")
    ]
    assert [out["question"], out["context"]] == [p.text for p in per_field]
    assert out["noise_eligible"] == sum(p.eligible for p in per_field)
    assert out["noise_corrupted"] == sum(p.corrupted for p in per_field) > 0
    assert "48" in out["question"]
    again = noise.noise_fields(doc, ["question", "context"], operator="keyboard", eta=0.3, global_seed=1234)
    other = noise.noise_fields(doc, ["question", "context"], operator="keyboard", eta=0.3, global_seed=1235)
    assert again == out and other["question"] != out["question"]


def test_noise_fields_errors() -> None:
    doc = {"question": SENTENCE, "answer": 72}
    with pytest.raises(KeyError, match="'problem'.*answer.*question"):
        noise.noise_fields(doc, ["problem"], operator="swap", eta=0.1, global_seed=0)
    with pytest.raises(TypeError, match="answer"):
        noise.noise_fields(doc, ["answer"], operator="swap", eta=0.1, global_seed=0)
    with pytest.raises(ValueError, match="single string"):
        noise.noise_fields(doc, "question", operator="swap", eta=0.1, global_seed=0)
    once = noise.noise_fields(doc, ["question"], operator="swap", eta=0.1, global_seed=0)
    with pytest.raises(ValueError, match="clean_question"):
        noise.noise_fields(once, ["question"], operator="swap", eta=0.1, global_seed=0)


def test_noise_text_validation() -> None:
    with pytest.raises(ValueError, match="'typo'.*swap.*keyboard.*insert.*delete"):
        run(SENTENCE, "typo", 0.1)
    for bad in (-0.01, 1.5, float("nan")):
        with pytest.raises(ValueError, match="eta"):
            run(SENTENCE, "swap", bad)
    with pytest.raises(ValueError, match="single string"):
        run(SENTENCE, "swap", 0.1, protect=r"\d+")
    with pytest.raises(ValueError, match="invalid protect pattern"):
        run(SENTENCE, "swap", 0.1, protect=("(",))
    with pytest.raises(TypeError):
        run(SENTENCE, "swap", 0.1, seed=1.5)
    with pytest.raises(TypeError):
        run(None, "swap", 0.1)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Loader constraints


def _imported_modules(path: Path) -> set[str]:
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    return imported


def test_loads_by_path_without_sys_modules_and_imports_only_stdlib() -> None:
    module = _load("_test_noise_unregistered", register=False)
    assert module.noise_text(SENTENCE, operator="swap", eta=0.3, seed=0) == noise.noise_text(
        SENTENCE, operator="swap", eta=0.3, seed=0
    )
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    seed_module = "lm_eval_probes.tasks.seeded_generation"  # the one SHA-256 seed recipe, itself stdlib only
    imported = _imported_modules(NOISE_PATH)
    assert {name.split(".")[0] for name in imported - {seed_module}} <= stdlib, imported
    seed_module_imports = _imported_modules(NOISE_PATH.parent / "seeded_generation.py")
    assert {name.split(".")[0] for name in seed_module_imports} <= stdlib, seed_module_imports
