"""Per-document values built from a document's probe records: answer span, confidence, chosen option, correctness.

The task adapter (:mod:`lm_eval_probes.tasks.probe_task`) calls these and nothing else computes them.
Source of the confidence definitions: "Unsure but Certain" (arXiv 2608.08791) — multiple choice: the
chosen option's probability under a softmax over the options' (length-normalised) log-likelihoods;
generation: the geometric mean of the answer tokens' probabilities.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

from lm_eval_probes.probes.confidence import chosen_option_confidence, geometric_mean_probability
from lm_eval_probes.records import ResponseProbe

__all__ = [
    "answer_confidence", "answer_reveal_step", "binary_correctness", "chosen_option", "locate_answer",
    "option_correctness", "response_confidence",
]


def locate_answer(text: str, answer: Any, token_ends: Sequence[int]) -> tuple[int, int] | None:
    """Token span ``[start, stop)`` of the last occurrence of the filter-extracted ``answer`` in ``text``.

    ``token_ends[i]`` is the character offset where token i ends in ``text``. Tokens only partly inside
    the answer are included. ``None`` when the answer is empty or not a substring of the text (e.g. a
    filter's ``[invalid]`` fallback).
    """
    answer = str(answer).strip() if answer is not None else ""
    if not answer:
        return None
    begin = text.rfind(answer)
    if begin < 0:
        return None
    end = begin + len(answer)
    start = bisect.bisect_right(token_ends, begin)  # first token ending after the answer begins
    stop = bisect.bisect_left(token_ends, end) + 1  # through the first token ending at or after its end
    stop = min(stop, len(token_ends))
    return (start, stop) if start < stop else None


def response_confidence(probe: ResponseProbe) -> float:
    """Geometric-mean probability of all the response's probed tokens, exp(mean ln p_t), in [0, 1];
    ``nan`` for a record without positions."""
    if probe.n_tokens == 0:
        return math.nan
    return float(geometric_mean_probability([probe.mean_token_logprob]))


def answer_confidence(probe: ResponseProbe) -> float:
    """Geometric-mean probability of the answer tokens (the located answer span of a generation), else of
    the whole response (:func:`response_confidence`); an empty generation: the probability of the token
    that ended it."""
    span = probe.answer_span
    if span is None or probe.token_logprobs is None:
        return response_confidence(probe)
    start, stop = span
    return float(geometric_mean_probability(probe.token_logprobs[start:stop]))


def answer_reveal_step(probe: ResponseProbe, *, whole: bool = False) -> float | None:
    """Mean denoising step (0 = first) at which the tokens that :func:`answer_confidence` reads were revealed
    (the located answer span, else — or with ``whole`` — the whole response); ``None`` for a record without
    reveal steps (not a masked-diffusion generation)."""
    steps = probe.reveal_steps
    if not steps:
        return None
    start, stop = (0, len(steps)) if whole or probe.answer_span is None else probe.answer_span
    chosen = steps[start:stop] or steps
    return float(sum(chosen) / len(chosen))


def chosen_option(option_logliks: Sequence[float], option_lengths: Sequence[float] | None = None) -> tuple[int, float]:
    """The option the model chooses (highest (length-normalised) log-likelihood; ties → lowest index) and
    its probability under a softmax over the options."""
    return chosen_option_confidence([float(v) for v in option_logliks], option_lengths)


def option_correctness(chosen: int, gold_indices: Sequence[int] | None) -> int | None:
    """1 when ``chosen`` is a gold option, 0 when not; ``None`` when the gold options are unknown."""
    if gold_indices is None:
        return None
    return int(chosen in gold_indices)


def binary_correctness(value: Any) -> int | None:
    """A per-document metric value as 0/1 correctness; ``None`` when it is missing or not 0/1."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number in (0.0, 1.0) else None
