"""The releases of lm-eval, transformers and torch the plugin supports, and the one-line refusal of any other.

Each range is what ``make compat`` (``benchmarks/compat.py``, table in ``docs/compat.md``) ran: a tiny random Llama
with ``probes=all`` in a fresh virtual environment, every row and per-document value compared with the main stack's.
``setup.cfg``'s ``install_requires`` states the same ranges (a test keeps the two in step), so pip installs a
supported stack; :func:`check_supported_versions` refuses one that was changed afterwards: when the models are
registered with lm_eval, when a wrapper is built, and when ``lm-eval-probes`` starts (before lm_eval is imported).
lm-eval 0.4.9 is outside: its registry has no lazy entries and its ``lm_eval.models.utils`` no
``postprocess_generated_text``; with transformers 5 it fails at its own import. Reads installed metadata only:
imports neither torch, transformers nor lm_eval.
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
    SupportedRange("lm-eval", "0.4.10", "0.4.14"),
    SupportedRange("transformers", "4.57", "5.26"),
    SupportedRange("torch", "2.13", "2.15"),
)


class UnsupportedVersionError(RuntimeError):
    """An installed lm-eval, transformers or torch outside :data:`SUPPORTED`."""


def check_supported_versions(installed: Callable[[str], str] | None = None) -> None:
    """Raise :class:`UnsupportedVersionError` (one line: each installed release outside its range, and the range)
    unless every distribution of :data:`SUPPORTED` is installed at a supported release.

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
    if outside:
        raise UnsupportedVersionError(f"lm-eval-probes does not support this stack: {'; '.join(outside)}")
