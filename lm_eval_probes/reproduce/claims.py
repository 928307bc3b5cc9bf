"""A paper's claim, this run's measurement of it, and the rule that says whether the two agree.

Each claim states its rule in words (printed in the table's notes and written to the JSON), so a reader can
check the verdict by hand. A rule answers ``True`` (agrees), ``False`` (does not) or ``None`` (cannot be
decided: the value or the interval it needs is undefined, e.g. an AUROC with one class).

Torch-free and lm_eval-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, Union

Value = Union[float, tuple[float, ...], None]
"""A claim's number: a scalar, a sequence (level means), or ``None`` (not given / not measured)."""


def _finite(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


@dataclass(frozen=True)
class Measurement:
    """What this run measured for a claim.

    Attributes:
        value: the statistic (a scalar, or a tuple for a sequence such as level means); ``None`` when undefined
            or not measured.
        ci_low, ci_high: its 95 % percentile-bootstrap interval over documents; ``None`` when the statistic has
            none (cross-fitted rows, sequences) or it is undefined.
        n_documents: documents the statistic read.
        note: how it was read, or why it is missing.
    """

    value: Value = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_documents: int | None = None
    note: str = ""

    @property
    def has_interval(self) -> bool:
        return _finite(self.ci_low) and _finite(self.ci_high)


class AgreementRule(Protocol):
    """Decides agreement of a paper's value with a measurement; ``text`` states the rule in one line."""

    @property
    def text(self) -> str: ...

    def decide(self, paper: Value, measured: Measurement) -> bool | None: ...


@dataclass(frozen=True)
class PaperInInterval:
    """Agrees when the paper's value lies inside this run's 95 % CI (undecided without an interval)."""

    @property
    def text(self) -> str:
        return "the paper's value lies inside this run's 95 % CI"

    def decide(self, paper: Value, measured: Measurement) -> bool | None:
        if not _finite(paper) or not measured.has_interval:  # type: ignore[arg-type]
            return None
        return measured.ci_low <= paper <= measured.ci_high  # type: ignore[operator]


@dataclass(frozen=True)
class SameSign:
    """Agrees when the measurement has the paper's sign and, where it has a CI, the CI excludes 0 on that side
    (an effect in the paper's direction that this run resolves); without a CI the point estimate's sign decides."""

    @property
    def text(self) -> str:
        return "same sign as the paper's, and the 95 % CI excludes 0 (sign of the estimate where there is no CI)"

    def decide(self, paper: Value, measured: Measurement) -> bool | None:
        if not _finite(paper) or paper == 0 or not _finite(measured.value):  # type: ignore[arg-type]
            return None
        if measured.has_interval:
            return measured.ci_low > 0 if paper > 0 else measured.ci_high < 0  # type: ignore[operator]
        return (measured.value > 0) == (paper > 0)  # type: ignore[operator]


@dataclass(frozen=True)
class IntervalAbove:
    """Agrees when this run's 95 % CI lies above ``bound`` (the paper gives no value; the claim is a direction)."""

    bound: float = 0.0

    @property
    def text(self) -> str:
        return f"this run's 95 % CI lies above {self.bound:g}"

    def decide(self, paper: Value, measured: Measurement) -> bool | None:
        if not measured.has_interval:
            return None
        return measured.ci_low > self.bound  # type: ignore[operator]


@dataclass(frozen=True)
class AtLeast:
    """Agrees when the measured value is at least ``bound``."""

    bound: float

    @property
    def text(self) -> str:
        return f"the measured value is at least {self.bound:g}"

    def decide(self, paper: Value, measured: Measurement) -> bool | None:
        if not _finite(measured.value):  # type: ignore[arg-type]
            return None
        return measured.value >= self.bound  # type: ignore[operator]


@dataclass(frozen=True)
class AbsAtMost:
    """Agrees when the measured value's magnitude is at most ``bound`` (an effect the paper says is absent)."""

    bound: float

    @property
    def text(self) -> str:
        return f"|measured| ≤ {self.bound:g}"

    def decide(self, paper: Value, measured: Measurement) -> bool | None:
        if not _finite(measured.value):  # type: ignore[arg-type]
            return None
        return abs(measured.value) <= self.bound  # type: ignore[arg-type]


@dataclass(frozen=True)
class StrictlyIncreasing:
    """Agrees when the measured sequence rises at every step, as the paper's does (undecided with fewer than two
    defined values)."""

    @property
    def text(self) -> str:
        return "the measured values rise at every step (as the paper's)"

    def decide(self, paper: Value, measured: Measurement) -> bool | None:
        values = measured.value
        if not isinstance(values, Sequence) or len(values) < 2 or not all(_finite(v) for v in values):
            return None
        return all(b > a for a, b in zip(values, values[1:]))


@dataclass(frozen=True)
class InteriorMinimum:
    """Agrees when the measured sequence is lowest strictly inside it, not at either end (a U over its axis)."""

    @property
    def text(self) -> str:
        return "the measured values are lowest strictly inside the range (a U), not at either end"

    def decide(self, paper: Value, measured: Measurement) -> bool | None:
        values = measured.value
        if not isinstance(values, Sequence) or len(values) < 3 or not all(_finite(v) for v in values):
            return None
        lowest = min(values)
        return values[0] > lowest and values[-1] > lowest


@dataclass(frozen=True)
class Claim:
    """One row of a reproduction's table: claim | paper | this run [95 % CI] | agrees?

    Attributes:
        claim: what the paper states, in one line (task, statistic, condition).
        paper: the paper's value (``None`` where the paper states a direction only).
        measured: this run's :class:`Measurement`.
        rule: the :class:`AgreementRule` that decides ``agrees``.
        paper_text: how the paper's value is shown when a number alone does not say it (``0.560 → 0.373``).
    """

    claim: str
    paper: Value
    measured: Measurement
    rule: AgreementRule
    paper_text: str = ""
    agrees: bool | None = field(init=False)

    def __post_init__(self) -> None:
        if not self.claim.strip():
            raise ValueError("a claim needs its text")
        paper = tuple(float(v) for v in self.paper) if isinstance(self.paper, Sequence) else self.paper
        object.__setattr__(self, "paper", paper)
        object.__setattr__(self, "agrees", self.rule.decide(paper, self.measured))

    def to_json(self) -> dict[str, object]:
        """The JSON form: ``claim``, ``paper``, ``measured``, ``ci_low``, ``ci_high``, ``agrees`` (``null`` =
        undecided), plus ``rule``, ``n_documents``, ``note`` and ``paper_text``; non-finite numbers as ``null``."""

        def clean(value: Value) -> object:
            if isinstance(value, tuple):
                return [clean(v) for v in value]
            return float(value) if _finite(value) else None  # type: ignore[arg-type]

        return {
            "claim": self.claim, "paper": clean(self.paper), "measured": clean(self.measured.value),
            "ci_low": clean(self.measured.ci_low), "ci_high": clean(self.measured.ci_high), "agrees": self.agrees,
            "rule": self.rule.text, "n_documents": self.measured.n_documents, "note": self.measured.note,
            "paper_text": self.paper_text,
        }
