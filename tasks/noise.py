"""Input-noise operators for prompts, after "Unsure but Certain" (arXiv 2608.08791).

Four operators, each applied **independently to every eligible unit with probability** ``eta``
(η; the paper's grid is :data:`ETAS` = 0.05, 0.10, 0.15, 0.30, but any η in ``[0, 1]`` works):

``swap`` (char swap)
    Unit: a *word*, a maximal run of letters (``str.isalpha`` per character). It is eligible when it
    has at least one adjacent pair of *different* letters, so that a swap really changes it. A
    selected word has one such pair, chosen uniformly, transposed (letters move with their case:
    "Natalie" may become "aNtalie").
``keyboard`` (keyboard substitution)
    Unit: a *letter* on the US QWERTY keyboard (ASCII a-z, A-Z). A selected letter is replaced by
    one of its neighbours in :data:`KEYBOARD_NEIGHBOURS` (same row and the adjacent rows of the
    staggered layout), chosen uniformly; an upper-case letter gets an upper-case neighbour.
``insert`` (char insertion)
    Unit: a *letter* (``str.isalpha``, any script). A selected letter gets one random lower-case
    ASCII letter inserted **right after** it (always lower case, also inside all-caps words).
``delete`` (word deletion)
    Unit: a *word*, a maximal run of non-whitespace that contains at least one letter (so trailing
    punctuation goes with it: "April," is one word). A selected word is removed together with one
    adjacent space or tab, the following one if there is one, else the preceding one, so no double
    spaces appear; line breaks are never removed.

Protection. The paper does not say whether numbers are protected; we protect them by default so a
math problem stays the same problem: with ``protect_numbers=True`` every whitespace-delimited token
that contains a digit ("48", "$3.50", "2x", "1,000", "(3)") is left exactly as it is, and none of
its characters is an eligible unit. With ``protect_numbers=False`` digits count as units too:
``keyboard`` replaces a digit by a neighbouring digit on the number row, ``insert`` inserts after
digits as after letters, ``swap`` words are maximal runs of letters *or* digits, and ``delete``
words are tokens with a letter or a digit. Negations are protected by default for the same reason:
deleting "not" from "Gary is not kind." (gold False) turns it into a statement whose gold label is
True, and a garbled "nto" or "nont" leaves a reader unsure. With ``protect_negations=True`` every
whitespace-delimited token that contains a negation word ("not", "Never,", "isn't", "(none)") is
left exactly as it is, from every operator, as a number is. The negation words, matched as whole
words (letters on neither side) in any case, are :data:`NEGATION_WORDS` and every word ending in
"n't" or "n’t" ("isn't", "don't", "can't", "won't", "ain't"); "knot", "note" or "nonetheless" are
not negations. Regular expressions in ``protect`` (for example
``r"\\$[^$]*\\$"`` for inline LaTeX) mark further spans: a character inside a match is never
changed, a unit that touches one is not eligible, and ``delete`` never removes whitespace inside
one. Whitespace (other than the one space ``delete`` takes with a word) and punctuation are never
changed.

Determinism. :func:`noise_text` is a pure function of ``(text, operator, eta, seed, options)``. It
draws only with ``random.Random(seed).random()``, whose sequence Python guarantees across versions,
and it draws the same two numbers (select, detail) for every eligible unit whatever η is, so noise
levels are nested: with one seed, the units corrupted at η = 0.05 are corrupted, in the same way, at
η = 0.30. :func:`document_seed` derives a per-document seed from a SHA-256 of the document and a
global seed (the recipe of :func:`seeded_generation.sha256_seed`, never ``hash()``), so every run and
every rank corrupts a document identically. :func:`noise_fields` applies all this to an lm-eval
document and keeps the clean twin.

This file imports only the standard library and :mod:`seeded_generation` (itself standard library
only) and defines no dataclasses: lm-eval may execute it by file path before registering it in
``sys.modules``.
"""

from __future__ import annotations

import json
import math
import random
import re
import string
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from lm_eval_probes.tasks.seeded_generation import sha256_seed

OPERATORS: tuple[str, ...] = ("swap", "keyboard", "insert", "delete")
ETAS: tuple[float, ...] = (0.05, 0.10, 0.15, 0.30)

#: Neighbours of each key on a US QWERTY keyboard: same row and adjacent rows (rows staggered by a
#: quarter and three quarters of a key). Digits have their number-row neighbours only, so that a
#: substituted digit is still a digit.
KEYBOARD_NEIGHBOURS: Mapping[str, str] = MappingProxyType(
    {
        "q": "wa", "w": "qeas", "e": "wrsd", "r": "etdf", "t": "ryfg",
        "y": "tugh", "u": "yihj", "i": "uojk", "o": "ipkl", "p": "ol",
        "a": "qwsz", "s": "adwezx", "d": "sferxc", "f": "dgrtcv", "g": "fhtyvb",
        "h": "gjyubn", "j": "hkuinm", "k": "jliom", "l": "kop",
        "z": "asx", "x": "zcsd", "c": "xvdf", "v": "cbfg", "b": "vngh", "n": "bmhj", "m": "njk",
        "1": "2", "2": "13", "3": "24", "4": "35", "5": "46",
        "6": "57", "7": "68", "8": "79", "9": "80", "0": "9",
    }
)

INSERTED_LETTERS: str = string.ascii_lowercase

#: Negation words protected by ``protect_negations=True`` (besides every word ending in "n't"/"n’t"):
#: the sentential "not", "no", "nor", "never", "cannot", and the negative pronouns and adverbs.
NEGATION_WORDS: tuple[str, ...] = (
    "not", "no", "nor", "never", "cannot", "none", "nothing", "nobody", "nowhere", "neither",
)  # fmt: skip

# A negation word with no letter right before or after it (digits and "_" are not letters here).
_NEGATION = re.compile(
    r"(?<![^\W\d_])(?:" + "|".join(NEGATION_WORDS) + r"|[^\W\d_]*n['’]t)(?![^\W\d_])", re.IGNORECASE
)

# Characters at which str.splitlines breaks a line: `delete` never removes them.
_LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")


class NoisedText(NamedTuple):
    """The noised text and its unit counts; the realised rate is ``corrupted / eligible``."""

    text: str
    eligible: int
    corrupted: int


def noise_text(
    text: str,
    *,
    operator: str,
    eta: float,
    seed: int,
    protect_numbers: bool = True,
    protect_negations: bool = True,
    protect: Sequence[str] = (),
) -> NoisedText:
    """Corrupt ``text`` with one of the four operators of "Unsure but Certain" (arXiv 2608.08791).

    Args:
        text: the clean text; any string (the empty string gives ``NoisedText("", 0, 0)``).
        operator: one of :data:`OPERATORS`; see the module docstring for the units.
        eta: probability in ``[0, 1]`` that each eligible unit is corrupted, independently.
            ``eta = 0`` returns ``text`` unchanged; ``eta = 1`` corrupts every eligible unit.
        seed: integer seed of a private ``random.Random``; pass :func:`document_seed` per document.
        protect_numbers: leave every whitespace-delimited token containing a digit untouched.
        protect_negations: leave every whitespace-delimited token containing a negation word
            (:data:`NEGATION_WORDS`, or a word ending in "n't") untouched.
        protect: regular expressions whose matches are left untouched.

    Returns:
        ``NoisedText(text, eligible, corrupted)``: the noised text, the number of eligible units and
        the number corrupted (each corrupted unit really changes the text).

    Raises:
        ValueError: unknown operator, η outside ``[0, 1]`` or NaN, an invalid pattern, or a single
            string passed as ``protect``.
        TypeError: ``text`` is not a string or ``seed`` not an integer.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}: {text!r:.80}")
    if operator not in _OPERATOR_FUNCTIONS:
        raise ValueError(f"unknown operator {operator!r}; expected one of {OPERATORS}")
    eta = _check_eta(eta)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}: {seed!r}")
    protected = _protected_mask(
        text, protect_numbers=protect_numbers, protect_negations=protect_negations, patterns=_compile(protect)
    )
    rng = random.Random(seed)
    return _OPERATOR_FUNCTIONS[operator](text, protected, eta, rng, protect_numbers)


def document_seed(content: str, global_seed: int, operator: str = "") -> int:
    """A 64-bit seed for one document, stable across processes, ranks and Python versions.

    The seed is ``sha256_seed(content, global_seed, operator)``: the first 8 bytes (big-endian) of the
    SHA-256 of the canonical JSON string ``[content, global_seed, operator]``; it changes with each of
    the three.

    Raises:
        TypeError: ``content`` or ``operator`` is not a string, or ``global_seed`` not an int.
    """
    if not isinstance(content, str):
        raise TypeError(f"content must be a str, got {type(content).__name__}")
    if not isinstance(operator, str):
        raise TypeError(f"operator must be a str, got {type(operator).__name__}: {operator!r}")
    if isinstance(global_seed, bool) or not isinstance(global_seed, int):
        raise TypeError(f"global_seed must be an int, got {type(global_seed).__name__}: {global_seed!r}")
    return sha256_seed(content, global_seed, operator)


def noise_fields(
    doc: Mapping[str, Any],
    fields: Sequence[str],
    *,
    operator: str,
    eta: float,
    global_seed: int,
    protect_numbers: bool = True,
    protect_negations: bool = True,
    protect: Sequence[str] = (),
) -> dict[str, Any]:
    """Return a new document with the text ``fields`` noised and their clean twins kept.

    Field ``f`` is noised by :func:`noise_text` with seed
    ``document_seed(content, global_seed, f"{operator}:{f}")``, where ``content`` is the JSON list of
    the clean values of all ``fields`` in order: the same document and global seed always get the
    same corruption, and different fields of one document get independent streams. Numbers and
    negations are protected by default (``protect_numbers``, ``protect_negations``, ``protect`` as in
    :func:`noise_text`).

    The result holds every key of ``doc``; each noised field ``f`` plus ``clean_f`` (the original);
    and ``noise_operator``, ``noise_eta``, ``noise_seed`` (= ``global_seed``), ``noise_eligible`` and
    ``noise_corrupted`` (summed over the fields). ``doc`` is not modified.

    Raises:
        KeyError: a field is missing from ``doc`` (the message names it and the doc's keys).
        TypeError: a field's value is not a string.
        ValueError: ``fields`` is empty, a single string or has duplicates; ``clean_<field>`` already
            exists in ``doc``; or any error of :func:`noise_text`.
    """
    if isinstance(fields, str):
        raise ValueError(f"fields must be a sequence of field names, not a single string: {fields!r}")
    fields = list(fields)
    if not fields:
        raise ValueError("fields is empty: name at least one text field to noise")
    if len(set(fields)) != len(fields):
        raise ValueError(f"fields has duplicates: {fields}")
    for field in fields:
        if field not in doc:
            raise KeyError(f"field {field!r} not in the document; its keys are {sorted(map(str, doc))}")
        if not isinstance(doc[field], str):
            raise TypeError(f"field {field!r} must be a str, got {type(doc[field]).__name__}")
        if f"clean_{field}" in doc:
            raise ValueError(f"document already has 'clean_{field}': was it noised already?")
    content = json.dumps([doc[field] for field in fields], ensure_ascii=True)
    out = dict(doc)
    eligible = corrupted = 0
    for field in fields:
        seed = document_seed(content, global_seed, f"{operator}:{field}")
        noised = noise_text(
            doc[field], operator=operator, eta=eta, seed=seed,
            protect_numbers=protect_numbers, protect_negations=protect_negations, protect=protect,
        )  # fmt: skip
        out[f"clean_{field}"] = doc[field]
        out[field] = noised.text
        eligible += noised.eligible
        corrupted += noised.corrupted
    out.update(
        noise_operator=operator,
        noise_eta=float(eta),
        noise_seed=global_seed,
        noise_eligible=eligible,
        noise_corrupted=corrupted,
    )
    return out


# ----------------------------------------------------------------------------------------------
# Validation, protection and drawing


def _check_eta(eta: float) -> float:
    if isinstance(eta, bool) or not isinstance(eta, (int, float)):
        raise ValueError(f"eta must be a number in [0, 1], got {type(eta).__name__}: {eta!r}")
    if math.isnan(eta) or not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be in [0, 1], got {eta!r}")
    return float(eta)


def _compile(protect: Sequence[str]) -> list[re.Pattern[str]]:
    if isinstance(protect, str):
        raise ValueError(f"protect must be a sequence of regular expressions, not a single string: {protect!r}")
    patterns = []
    for pattern in protect:
        try:
            patterns.append(re.compile(pattern))
        except (re.error, TypeError) as error:
            raise ValueError(f"invalid protect pattern {pattern!r}: {error}") from error
    return patterns


def _runs(text: str, inside: Callable[[str], bool]) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` of the maximal runs of characters for which ``inside`` holds."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, char in enumerate(text):
        if inside(char):
            if start is None:
                start = i
        elif start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(text)))
    return runs


def _protected_mask(
    text: str, *, protect_numbers: bool, protect_negations: bool, patterns: Sequence[re.Pattern[str]]
) -> list[bool]:
    """Per character: whether no operator may change it (protected tokens, then pattern matches)."""
    protected = [False] * len(text)
    for start, end in _runs(text, lambda char: not char.isspace()):
        token = text[start:end]
        if (protect_numbers and any(char.isdigit() for char in token)) or (
            protect_negations and _NEGATION.search(token)
        ):
            protected[start:end] = [True] * (end - start)
    for pattern in patterns:
        for match in pattern.finditer(text):
            protected[match.start() : match.end()] = [True] * (match.end() - match.start())
    return protected


def _draw(rng: random.Random, eta: float) -> tuple[bool, float]:
    """Two uniforms per eligible unit, whatever η: (selected?, detail in [0, 1)). Keeps η levels nested."""
    select, detail = rng.random(), rng.random()
    return select < eta, detail


def _pick(options: Sequence[str] | Sequence[int], detail: float) -> Any:
    return options[min(int(detail * len(options)), len(options) - 1)]


def _is_unit_char(char: str, protect_numbers: bool) -> bool:
    return char.isalpha() or (not protect_numbers and char.isdigit())


# ----------------------------------------------------------------------------------------------
# The four operators: (text, protected mask, eta, rng, protect_numbers) -> NoisedText


def _swap(text: str, protected: list[bool], eta: float, rng: random.Random, protect_numbers: bool) -> NoisedText:
    chars = list(text)
    eligible = corrupted = 0
    for start, end in _runs(text, lambda char: _is_unit_char(char, protect_numbers)):
        if any(protected[start:end]):
            continue
        pairs = [i for i in range(start, end - 1) if text[i] != text[i + 1]]
        if not pairs:
            continue
        eligible += 1
        selected, detail = _draw(rng, eta)
        if selected:
            i = _pick(pairs, detail)
            chars[i], chars[i + 1] = chars[i + 1], chars[i]
            corrupted += 1
    return NoisedText("".join(chars), eligible, corrupted)


def _keyboard(text: str, protected: list[bool], eta: float, rng: random.Random, protect_numbers: bool) -> NoisedText:
    chars = list(text)
    eligible = corrupted = 0
    for i, char in enumerate(text):
        key = char.lower()
        if protected[i] or not char.isascii() or key not in KEYBOARD_NEIGHBOURS:
            continue
        if key.isdigit() and protect_numbers:
            continue
        eligible += 1
        selected, detail = _draw(rng, eta)
        if selected:
            neighbour = _pick(KEYBOARD_NEIGHBOURS[key], detail)
            chars[i] = neighbour.upper() if char.isupper() else neighbour
            corrupted += 1
    return NoisedText("".join(chars), eligible, corrupted)


def _insert(text: str, protected: list[bool], eta: float, rng: random.Random, protect_numbers: bool) -> NoisedText:
    pieces: list[str] = []
    eligible = corrupted = 0
    for i, char in enumerate(text):
        pieces.append(char)
        if protected[i] or not _is_unit_char(char, protect_numbers):
            continue
        eligible += 1
        selected, detail = _draw(rng, eta)
        if selected:
            pieces.append(_pick(INSERTED_LETTERS, detail))
            corrupted += 1
    return NoisedText("".join(pieces), eligible, corrupted)


def _delete(text: str, protected: list[bool], eta: float, rng: random.Random, protect_numbers: bool) -> NoisedText:
    tokens = _runs(text, lambda char: not char.isspace())
    keep = [True] * len(text)

    def removable(i: int) -> bool:
        return not protected[i] and text[i] not in _LINE_BREAKS

    # gaps[k]: indices of the whitespace before token k; gaps[-1]: the trailing whitespace.
    bounds = [0] + [end for _, end in tokens]
    gaps = [list(range(bounds[k], start)) for k, (start, _) in enumerate(tokens)]
    gaps.append(list(range(bounds[-1], len(text))))
    eligible = corrupted = 0
    left = gaps[0]
    for k, (start, end) in enumerate(tokens):
        right = gaps[k + 1]
        word = any(_is_unit_char(char, protect_numbers) for char in text[start:end])
        if not word or any(protected[start:end]):
            left = right
            continue
        eligible += 1
        selected, _ = _draw(rng, eta)
        if not selected:
            left = right
            continue
        corrupted += 1
        keep[start:end] = [False] * (end - start)
        if right and removable(right[0]):
            keep[right[0]] = False
            right = right[1:]
        elif left and removable(left[-1]):
            keep[left[-1]] = False
            left = left[:-1]
        left = left + right  # the gaps on both sides of a deleted word merge
    return NoisedText("".join(char for char, kept in zip(text, keep) if kept), eligible, corrupted)


_OPERATOR_FUNCTIONS: Mapping[str, Callable[[str, list[bool], float, random.Random, bool], NoisedText]] = (
    MappingProxyType({"swap": _swap, "keyboard": _keyboard, "insert": _insert, "delete": _delete})
)
