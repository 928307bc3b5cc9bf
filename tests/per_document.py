"""Per-document values of ``--log_samples`` samples, compared document by document (batch sizes, processes)."""

from __future__ import annotations

import math
from typing import Any

NOT_VALUES = frozenset({"doc", "doc_id", "doc_hash", "prompt_hash", "target_hash", "target", "arguments", "resps",
                        "filtered_resps", "filter", "metrics"})
"""Sample keys that hold the document, the request or the response text rather than values."""


def flat_numbers(value: Any, path: str) -> dict[str, float]:
    """Every number inside ``value`` (nested lists, tuples, dicts), by its path; booleans and ``None`` skipped."""
    if isinstance(value, bool) or value is None:
        return {}
    if isinstance(value, (int, float)):
        return {path: float(value)}
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat_numbers(item, f"{path}.{key}").items()}
    if isinstance(value, (list, tuple)):
        return {k: v for i, item in enumerate(value) for k, v in flat_numbers(item, f"{path}[{i}]").items()}
    return {}


def relative_difference(a: float, b: float) -> float:
    """|a − b| / max(|a|, |b|); 0 for equal values (nan equals nan), inf where only one is nan."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if math.isnan(a) or math.isnan(b):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b))


def largest_differences(samples: list[dict], reference: list[dict]) -> dict[str, float]:
    """Per sample key: the largest relative difference of any number in it between the two runs' samples of the
    same document and filter. Both runs must hold the same documents, values and value shapes."""
    def key(sample: dict) -> tuple[int, str]:
        return sample["doc_id"], sample.get("filter", "")

    by_doc = {key(s): s for s in reference}
    assert sorted(by_doc) == sorted(key(s) for s in samples), "the runs hold other documents"
    worst: dict[str, float] = {}
    for sample in samples:
        want = by_doc[key(sample)]
        assert set(sample) == set(want), (key(sample), set(sample) ^ set(want))
        for name in sample:
            if name in NOT_VALUES:
                continue
            got, expected = flat_numbers(sample[name], name), flat_numbers(want[name], name)
            assert set(got) == set(expected), (key(sample), name)
            for path, value in got.items():
                worst[name] = max(worst.get(name, 0.0), relative_difference(value, expected[path]))
    return worst
