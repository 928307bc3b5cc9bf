"""The releases of lm-eval, transformers and torch the plugin supports, and the one-line refusal of any other.

Each range is what ``make compat`` (``benchmarks/compat.py``, table in ``docs/compat.md``) ran: a tiny random Llama
with ``probes=all`` in a fresh virtual environment, every row and per-document value compared with the main stack's.
``setup.cfg``'s ``install_requires`` states the same ranges (a test keeps the two in step), so pip installs a
supported stack; :func:`check_supported_versions` refuses one that was changed afterwards, or a supported pair that
does not run together (:data:`INCOMPATIBLE`), when a wrapper is built and when ``lm-eval-probes`` starts, before
lm_eval is imported (plain ``lm_eval`` with lm-eval 0.4.9 and transformers 5 fails at its own import, before any
plugin code runs). Reads installed metadata only: imports neither torch, transformers nor lm_eval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class SupportedRange:
    """Releases ``minimum <= version < below`` of one distribution (by its release number: ``2.13.0+cpu`` is
    ``2.13.0``, ``5.0.0rc1`` is ``5.0.0``)."""

    distribution: str
    minimum: str
    below: str

    def admits(self, version: str) -> bool:
        try:
            release = Version(Version(version).base_version)
        except InvalidVersion:
            return False
        return Version(self.minimum) <= release < Version(self.below)

    @property
    def requirement(self) -> str:
        """The range as a pip requirement, as ``setup.cfg`` states it."""
        return f"{self.distribution}>={self.minimum},<{self.below}"


SUPPORTED: tuple[SupportedRange, ...] = (
    SupportedRange("lm-eval", "0.4.9", "0.4.14"),
    SupportedRange("transformers", "4.57", "5.26"),
    SupportedRange("torch", "2.13", "2.15"),
)


@dataclass(frozen=True)
class Incompatible:
    """Releases ``< below`` of ``distribution`` that do not run with releases ``>= other_from`` of ``other``, both
    inside their supported ranges (``reason``: what fails)."""

    distribution: str
    below: str
    other: str
    other_from: str
    reason: str

    def excludes(self, version: str, other_version: str) -> bool:
        try:
            first, second = (Version(Version(v).base_version) for v in (version, other_version))
        except InvalidVersion:
            return False
        return first < Version(self.below) and second >= Version(self.other_from)


INCOMPATIBLE: tuple[Incompatible, ...] = (
    Incompatible("lm-eval", "0.4.10", "transformers", "5",
                 "lm_eval's own import needs transformers.AutoModelForVision2Seq, which transformers 5 removed"),
)


class UnsupportedVersionError(RuntimeError):
    """An installed lm-eval, transformers or torch outside :data:`SUPPORTED`."""


def check_supported_versions(installed: Callable[[str], str] | None = None) -> None:
    """Raise :class:`UnsupportedVersionError` (one line: each installed release outside its range, and the range; each
    pair of :data:`INCOMPATIBLE`) unless every distribution of :data:`SUPPORTED` is installed at a supported release
    and no two of them are an incompatible pair.

    ``installed`` maps a distribution name to its installed version (default ``importlib.metadata.version``, looked
    up at the call; it raises ``PackageNotFoundError`` for one that is not installed, which counts as outside the
    range).
    """
    installed = installed or metadata.version
    outside = []
    for supported in SUPPORTED:
        try:
            version = installed(supported.distribution)
        except metadata.PackageNotFoundError:
            outside.append(f"{supported.distribution} is not installed (supported: {supported.requirement})")
            continue
        if not supported.admits(version):
            outside.append(f"{supported.distribution} {version} is installed (supported: {supported.requirement})")
    for pair in INCOMPATIBLE:
        try:
            version, other_version = installed(pair.distribution), installed(pair.other)
        except metadata.PackageNotFoundError:
            continue  # named above
        if pair.excludes(version, other_version):
            outside.append(f"{pair.distribution} {version} does not run with {pair.other} {other_version} "
                           f"({pair.reason}; use {pair.distribution}>={pair.below} or {pair.other}<{pair.other_from})")
    if outside:
        raise UnsupportedVersionError(f"lm-eval-probes does not support this stack: {'; '.join(outside)}")
