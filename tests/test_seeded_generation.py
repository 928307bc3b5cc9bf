"""Tests of ``tasks/seeded_generation.py``: the SHA-256 seed recipe and the round-robin scaffolding."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import pytest

from lm_eval_probes.tasks import seeded_generation
from lm_eval_probes.tasks.noise import document_seed


def test_sha256_seed_matches_an_independent_digest_and_the_noise_seed() -> None:
    digest = hashlib.sha256(b'["hello",0,"swap"]').digest()
    assert seeded_generation.sha256_seed("hello", 0, "swap") == int.from_bytes(digest[:8], "big")
    assert seeded_generation.sha256_seed("hello", 0, "swap") == document_seed("hello", 0, "swap") == 9802641028349171258
    assert seeded_generation.sha256_seed("a|b") != seeded_generation.sha256_seed("a", "b")
    assert seeded_generation.sha256_seed("a", 1) != seeded_generation.sha256_seed(1, "a")
    first, again = seeded_generation.seeded_random("x", 3), seeded_generation.seeded_random("x", 3)
    assert [first.random() for _ in range(3)] == [again.random() for _ in range(3)]
    for bad in (1.5, True, None, b"x"):
        with pytest.raises(TypeError, match="seed parts"):
            seeded_generation.sha256_seed("x", bad)


def test_checks_name_the_argument_and_the_value() -> None:
    assert seeded_generation.check_levels([3, 1], name="depths", minimum=0, maximum=5) == (3, 1)
    with pytest.raises(ValueError, match=r"depths must be ints in \[0, 5\], got 6"):
        seeded_generation.check_levels([6], name="depths", minimum=0, maximum=5)
    with pytest.raises(ValueError, match="levels must be distinct"):
        seeded_generation.check_levels([1, 1], name="levels", minimum=1, maximum=5)
    with pytest.raises(ValueError, match="levels must not be empty"):
        seeded_generation.check_levels([], name="levels", minimum=1, maximum=5)
    with pytest.raises(ValueError, match="n_per_level must be an int >= 1, got True"):
        seeded_generation.check_count("n_per_level", True, minimum=1)
    with pytest.raises(ValueError, match="seed must be an int"):
        seeded_generation.check_seed("7")


def _toy_document(rng: random.Random, *, level: int, index: int, round_fraction: float) -> dict[str, Any] | None:
    value = rng.randrange(6)
    if value == 0:  # a rejected candidate
        return None
    return {"level": level, "index": index, "text": f"{level}:{value}", "round": round_fraction}


TOY = seeded_generation.LeveledGenerator(
    name="toy", make_document=_toy_document, identity=lambda d: d["text"], level_name="levels", min_level=1, max_level=2
)


def test_round_robin_order_rejection_distinctness_and_round_fraction() -> None:
    docs = seeded_generation.generate_round_robin(TOY, 4, seed=1, levels=(2, 1))
    assert [(d["level"], d["index"]) for d in docs] == [(level, i) for i in range(4) for level in (2, 1)]
    for level in (1, 2):
        texts = [d["text"] for d in docs if d["level"] == level]
        assert len(set(texts)) == 4 and not any(text.endswith(":0") for text in texts)
    start = seeded_generation.seeded_random("toy", "main", 1, "rounds").random()
    for i in range(4):  # one round fraction per index, whatever the level
        expected = seeded_generation.round_fraction(i, start)
        assert docs[2 * i]["round"] == docs[2 * i + 1]["round"] == expected
    assert seeded_generation.generate_round_robin(TOY, 2, seed=1, levels=(2, 1)) == docs[:4]
    assert seeded_generation.generate_round_robin(TOY, 0, seed=1, levels=(1,)) == []
    with pytest.raises(RuntimeError, match="toy: could not generate 7 distinct documents of level 1"):
        seeded_generation.generate_round_robin(TOY, 7, seed=1, levels=(1,))
    with pytest.raises(ValueError, match=r"levels must be ints in \[1, 2\], got 3"):
        seeded_generation.generate_round_robin(TOY, 1, seed=1, levels=(3,))


def test_dataset_splits_keep_the_fewshot_pool_apart() -> None:
    test, fewshot = seeded_generation.dataset_splits(TOY, n_per_level=3, fewshot_per_level=2, seed=5)
    assert [d["level"] for d in test] == [1, 2] * 3 and [d["level"] for d in fewshot] == [1, 2] * 2
    assert {d["text"] for d in test}.isdisjoint(d["text"] for d in fewshot)
    assert test == seeded_generation.generate_round_robin(TOY, 3, seed=5, levels=(1, 2))
    with pytest.raises(ValueError, match="fewshot_per_level"):
        seeded_generation.dataset_splits(TOY, n_per_level=1, fewshot_per_level=-1, seed=5)
    with pytest.raises(ValueError, match="n_per_level must be an int >= 1"):
        seeded_generation.dataset_splits(TOY, n_per_level=0, fewshot_per_level=1, seed=5)


@pytest.mark.parametrize("start", (0.0, 0.3, 0.77))
def test_round_fractions_cover_every_prefix_evenly(start: float) -> None:
    for n in range(5, 41):
        points = sorted(seeded_generation.round_fraction(i, start) for i in range(n))
        gaps = [b - a for a, b in zip(points, points[1:])] + [points[0] + 1 - points[-1]]
        assert all(0 <= p < 1 for p in points) and max(gaps) < 2.7 / n, (n, max(gaps))


def test_closest_fill_greedy_then_swaps() -> None:
    candidates = [("a", 26), ("b", 30), ("c", 33), ("d", 41)]
    assert seeded_generation.closest_fill(candidates, 60) == ["a", "c"]  # greedy a+b = 56, a swap gives 59
    assert seeded_generation.closest_fill(candidates, 0) == []
    assert seeded_generation.closest_fill(candidates, 12) == []  # 26 is farther from 12 than nothing
    assert seeded_generation.closest_fill(candidates, 130) == ["a", "b", "c", "d"]


def test_prompt_size_counts_characters_words_and_digits() -> None:
    text = "Mia has 12 apples."
    assert seeded_generation.prompt_size(text) == len(text) + seeded_generation.WORD_WEIGHT * 4 + seeded_generation.DIGIT_WEIGHT * 2
