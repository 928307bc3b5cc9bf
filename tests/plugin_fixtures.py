"""A probe plugin installed for one test: a temporary distribution whose ``entry_points.txt`` names it in the group
``lm_eval_probes.probes`` (what ``pip install`` of a plugin package leaves in site-packages), on ``sys.path``."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from lm_eval_probes import registry

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_PLUGIN_SOURCE = REPO / "examples" / "probe-plugin" / "src"


def write_distribution(root: Path, name: str, entry_points: Mapping[str, str]) -> Path:
    """``root/<name>-0.1.dist-info`` with METADATA and the entry points; returns ``root``."""
    info = root / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{lines}")
    return root


@contextmanager
def installed_plugin(root: Path, entry_points: Mapping[str, str], paths: Sequence[Path] = ()) -> Iterator[None]:
    """The probes of ``entry_points`` registered for the ``with`` block (``paths``: where their modules are)."""
    added = [str(path) for path in (*paths, write_distribution(root, "probe-plugin-under-test", entry_points))]
    sys.path[:0] = added
    registry.refresh()
    try:
        yield
    finally:
        for path in added:
            sys.path.remove(path)
        for module in [m for m in sys.modules if m.startswith("lm_eval_probes_hnorm") or m.startswith("toy_probe")]:
            del sys.modules[module]
        registry.refresh()
