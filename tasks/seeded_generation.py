"""Seeded generation: the one SHA-256 seed recipe, and level-balanced synthetic documents built on it.

:func:`sha256_seed` turns a tuple of strings and integers into a 64-bit seed that is the same in every
process, on every rank and under every Python version (never ``hash()``). The input-noise operators
(``noise.document_seed``) and the synthetic generators (``synth_arith``, ``synth_logic``) both seed
their private ``random.Random`` instances with it; nothing seeds the global generator.

The synthetic generators share the rest of their scaffolding here: argument checks, per-level
generation with a private generator per candidate document, distinct documents within a level,
round-robin interleaving over the levels (so any prefix, such as a short ``--limit``, is balanced over
difficulty) and the test / few-shot split drawn from two streams of one seed.

This file imports only the standard library and defines no dataclasses: lm-eval may execute the task
files that import it by file path.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

TEST_STREAM = "main"
FEWSHOT_STREAM = "fewshot"

#: Weights of a word and of a digit in :func:`prompt_size` (a word of the generated English has
#: about 5 characters).
WORD_WEIGHT = 5
DIGIT_WEIGHT = 2

_INVERSE_GOLDEN_RATIO = (5**0.5 - 1) / 2

Item = TypeVar("Item")


def sha256_seed(*parts: str | int) -> int:
    """A 64-bit seed from ``parts``: the first 8 bytes (big-endian) of the SHA-256 of their JSON list.

    The key is ``json.dumps(list(parts))`` with ASCII escapes and no spaces, so the seed changes with
    every part and with their order, and ``("a|b",)`` and ``("a", "b")`` never collide.

    Raises:
        TypeError: a part is not a string or an int (a bool is refused too).
    """
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, (str, int)):
            raise TypeError(f"seed parts must be str or int, got {type(part).__name__}: {part!r}")
    key = json.dumps(list(parts), ensure_ascii=True, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(key.encode("ascii")).digest()[:8], "big")


def seeded_random(*parts: str | int) -> random.Random:
    """A private ``random.Random`` seeded with :func:`sha256_seed` of ``parts``."""
    return random.Random(sha256_seed(*parts))


def round_fraction(index: int, start: float) -> float:
    """``frac(start + index / φ)`` (φ the golden ratio): a number in ``[0, 1)`` for round ``index``.

    The golden-ratio sequence spreads every prefix of rounds almost evenly over ``[0, 1)`` (no gap
    longer than about ``2.6 / n`` after ``n`` rounds), so a quantity drawn from it, like a target
    prompt length, covers its range in the first rounds already, not only on average.
    """
    return (start + index * _INVERSE_GOLDEN_RATIO) % 1.0


def prompt_size(text: str) -> int:
    """The prompt length the synthetic generators balance across levels: characters, plus
    :data:`WORD_WEIGHT` per whitespace-separated word and :data:`DIGIT_WEIGHT` per digit.

    Padding to a target of this size keeps the character, the word and a subword token count (about
    one token per word, one per digit) independent of the level: characters alone would let the
    word count follow the mix of sentence kinds. The weights were chosen so that, with the SmolLM2
    tokenizer, all three counts have ``|Spearman ρ| <= 0.1`` with the level on the default tasks.
    """
    return len(text) + WORD_WEIGHT * len(text.split()) + DIGIT_WEIGHT * sum(char.isdigit() for char in text)


def closest_fill(candidates: Sequence[tuple[Item, int]], gap: int) -> list[Item]:
    """Items whose sizes sum close to ``gap``: a greedy pass in the given order, then single swaps.

    The greedy pass takes each candidate ``(item, size)`` that brings the sum closer to ``gap``;
    then, while one exchange of a taken item for an untaken one brings the sum closer, the best such
    exchange is made. The result keeps the order of ``candidates`` (shuffle them for a random pick).
    Sizes must be positive; ``gap <= 0`` gives ``[]``.
    """
    taken = [False] * len(candidates)
    total = 0
    for position, (_, size) in enumerate(candidates):
        if abs(total + size - gap) < abs(total - gap):
            taken[position] = True
            total += size
    while True:
        best = (abs(total - gap), -1, -1)
        for out in (position for position, is_taken in enumerate(taken) if is_taken):
            for into in (position for position, is_taken in enumerate(taken) if not is_taken):
                distance = abs(total - candidates[out][1] + candidates[into][1] - gap)
                if distance < best[0]:
                    best = (distance, out, into)
        _, out, into = best
        if out < 0:
            return [item for (item, _), is_taken in zip(candidates, taken) if is_taken]
        taken[out], taken[into] = False, True
        total += candidates[into][1] - candidates[out][1]


def check_count(name: str, value: Any, *, minimum: int) -> int:
    """``value`` if it is an int ``>= minimum`` (not a bool); otherwise ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_seed(seed: Any) -> int:
    """``seed`` if it is an int (not a bool); otherwise ``ValueError``."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    return seed


def check_levels(levels: Iterable[int], *, name: str, minimum: int, maximum: int) -> tuple[int, ...]:
    """``levels`` as a tuple of distinct ints in ``[minimum, maximum]``, in the given order.

    Raises:
        ValueError: empty, a value that is not an int in range, or a repeated value (the message
            names the argument ``name`` and shows the offending value).
    """
    checked = tuple(levels)
    if not checked:
        raise ValueError(f"{name} must not be empty")
    for level in checked:
        if isinstance(level, bool) or not isinstance(level, int) or not minimum <= level <= maximum:
            raise ValueError(f"{name} must be ints in [{minimum}, {maximum}], got {level!r} in {checked}")
    if len(set(checked)) != len(checked):
        raise ValueError(f"{name} must be distinct, got {checked}")
    return checked


class DocumentMaker(Protocol):
    """Builds one candidate document of a level, or ``None`` to reject the candidate and draw another.

    ``rng`` is private to the candidate. ``round_fraction`` in ``[0, 1)`` is shared by document
    ``index`` of every level (one round of the round-robin order), for choices that must not depend
    on the level, such as a target prompt length.
    """

    def __call__(
        self, rng: random.Random, *, level: int, index: int, round_fraction: float
    ) -> dict[str, Any] | None: ...


class LeveledGenerator(NamedTuple):
    """What a synthetic task supplies to the shared scaffolding (a NamedTuple: no dataclass here).

    ``name`` seeds every stream of the task; ``make_document`` builds one candidate; ``identity`` is the
    text that must be distinct within a level (what the model sees); levels are ints in
    ``[min_level, max_level]``, called ``level_name`` in messages (``"levels"``, ``"depths"``).
    """

    name: str
    make_document: DocumentMaker
    identity: Callable[[dict[str, Any]], str]
    level_name: str
    min_level: int
    max_level: int

    @property
    def all_levels(self) -> tuple[int, ...]:
        return tuple(range(self.min_level, self.max_level + 1))


def generate_round_robin(
    generator: LeveledGenerator,
    n_per_level: int,
    *,
    seed: int,
    levels: Iterable[int],
    stream: str = TEST_STREAM,
    excluded: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """``n_per_level`` documents per level, interleaved level by level: ``[l0 #0, l1 #0, …, l0 #1, …]``.

    Candidate ``attempt`` of a level gets ``seeded_random(generator.name, stream, seed, level,
    attempt)``; document ``index`` of every level gets ``round_fraction(index, start)`` with ``start``
    drawn from ``(generator.name, stream, seed)``. A candidate is kept unless ``make_document`` rejects it (``None``)
    or its ``identity`` repeats a kept document of the level or is in ``excluded``. Document ``i`` of a
    level therefore depends on ``(generator.name, stream, seed, level, i)`` only, not on
    ``n_per_level`` nor on the other levels.

    Raises:
        ValueError: ``n_per_level < 0``, ``seed`` not an int, or bad ``levels`` (see :func:`check_levels`).
        RuntimeError: a level did not yield ``n_per_level`` documents in ``100 * n_per_level + 1000``
            candidates.
    """
    check_count("n_per_level", n_per_level, minimum=0)
    check_seed(seed)
    checked_levels = check_levels(
        levels, name=generator.level_name, minimum=generator.min_level, maximum=generator.max_level
    )
    by_level: dict[int, list[dict[str, Any]]] = {}
    max_attempts = 100 * n_per_level + 1000
    start = seeded_random(generator.name, stream, seed, "rounds").random()
    for level in checked_levels:
        seen = set(excluded)
        documents: list[dict[str, Any]] = []
        attempt = 0
        while len(documents) < n_per_level:
            if attempt >= max_attempts:
                raise RuntimeError(
                    f"{generator.name}: could not generate {n_per_level} distinct documents of level {level} "
                    f"in {max_attempts} attempts"
                )
            index = len(documents)
            document = generator.make_document(
                seeded_random(generator.name, stream, seed, level, attempt),
                level=level,
                index=index,
                round_fraction=round_fraction(index, start),
            )
            attempt += 1
            if document is None or generator.identity(document) in seen:
                continue
            seen.add(generator.identity(document))
            documents.append(document)
        by_level[level] = documents
    return [by_level[level][index] for index in range(n_per_level) for level in checked_levels]


def dataset_splits(
    generator: LeveledGenerator,
    *,
    n_per_level: int,
    fewshot_per_level: int,
    seed: int,
    fewshot_generator: LeveledGenerator | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(test, fewshot)`` documents of a synthetic task over all its levels, both round-robin.

    ``test`` holds ``n_per_level`` documents per level from stream :data:`TEST_STREAM`; the few-shot
    pool holds ``fewshot_per_level`` per level from stream :data:`FEWSHOT_STREAM` of the same seed,
    none with an ``identity`` shared with ``test``, made by ``fewshot_generator`` where given (its
    ``name`` and levels should be ``generator``'s: a few-shot pool drawn from other material).

    Raises:
        ValueError: ``n_per_level < 1``, ``fewshot_per_level < 0`` or ``seed`` not an int.
    """
    check_count("n_per_level", n_per_level, minimum=1)
    check_count("fewshot_per_level", fewshot_per_level, minimum=0)
    test = generate_round_robin(generator, n_per_level, seed=seed, levels=generator.all_levels)
    fewshot = generate_round_robin(
        fewshot_generator or generator,
        fewshot_per_level,
        seed=seed,
        levels=generator.all_levels,
        stream=FEWSHOT_STREAM,
        excluded=frozenset(generator.identity(document) for document in test),
    )
    return test, fewshot
