"""The releases of lm-eval, transformers and torch the plugin supports, and the one-line refusal of any other.

Each range starts at the oldest release the plugin serves and has no upper bound: a release newer than the newest one
``make compat`` ran (``benchmarks/compat.py``, table in ``docs/compat.md``) is admitted with one warning line. A
pre-release or local build counts by its release number (``2.13.0a0+nv26.07`` is 2.13.0, ``2.11.0+cu130`` is 2.11.0),
as NVIDIA's and vLLM's images ship them. ``setup.cfg``'s ``install_requires`` states the same floors (a test keeps the
two in step), so ``pip install .`` keeps a torch and transformers already installed in range;
:func:`check_supported_versions` refuses an older one: when the models are registered with lm_eval, when a wrapper is
built, and when ``lm-eval-probes`` starts (before lm_eval is imported). Why each floor: ``docs/compat.md``. Reads
installed metadata only: imports neither torch, transformers nor lm_eval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

from packaging.version import InvalidVersion, Version

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SupportedRange:
    """Releases ``minimum`` and later of one distribution, by release number; ``newest_run``: the newest release
    series ``make compat`` ran (a later one is admitted with a warning)."""

    distribution: str
    minimum: str
    newest_run: str

    @staticmethod
    def _release(version: str) -> Version | None:
        try:
            return Version(Version(version).base_version)
        except InvalidVersion:
            return None

    def admits(self, version: str) -> bool:
        release = self._release(version)
        return release is not None and release >= Version(self.minimum)

    def newer_than_run(self, version: str) -> bool:
        """Whether ``version`` is of a release series after :attr:`newest_run` (``2.15.1`` is not after ``2.15``)."""
        release, newest = self._release(version), Version(self.newest_run)
        return release is not None and release.release[: len(newest.release)] > newest.release

    @property
    def requirement(self) -> str:
        """The range as a pip requirement, as ``setup.cfg`` states it."""
        return f"{self.distribution}>={self.minimum}"


SUPPORTED: tuple[SupportedRange, ...] = (
    SupportedRange("lm-eval", "0.4.10", "0.4.13"),
    SupportedRange("transformers", "4.57", "5.25"),
    SupportedRange("torch", "2.6", "2.15"),
)
_WARNED: set[tuple[str, str]] = set()


class UnsupportedVersionError(RuntimeError):
    """An installed lm-eval, transformers or torch outside :data:`SUPPORTED`."""


def check_supported_versions(installed: Callable[[str], str] | None = None) -> None:
    """Raise :class:`UnsupportedVersionError` (one line: each installed release outside its range, and the range)
    unless every distribution of :data:`SUPPORTED` is installed at a supported release. A release after the newest
    one run is admitted with one warning line (once per process).

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
        elif supported.newer_than_run(version) and (supported.distribution, version) not in _WARNED:
            _WARNED.add((supported.distribution, version))
            log.warning("lm-eval-probes has not been run with %s %s (the newest run: %s; docs/compat.md)",
                        supported.distribution, version, supported.newest_run)
    if outside:
        raise UnsupportedVersionError(f"lm-eval-probes does not support this stack: {'; '.join(outside)}")
