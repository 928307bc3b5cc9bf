"""The docs date what they measured by what a reader can look up: the commit and the machine, never a numbered work
period. ``session`` appears in the docs and the README only in pytest's sense (a fixture's scope), and every table of
measured figures names, in the paragraph before it or the caption after it, the commit it was measured at (one that
exists in this checkout's history, where there is one) and the machine."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

PYTEST_SENSE = re.compile(r"""scope\s*=\s*["']session["']|session[- ]scoped?|`session`|pytest session""", re.I)
SESSION = re.compile(r"\bsessions?\b", re.I)
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
MACHINE = re.compile(r"\d+-core|\bcores?\b|same machine|any machine|GPU", re.I)
MEASURED = re.compile(r"\d\.\d|\d\s?(?:s|ms|GiB|MiB|GB|MB|%)(?:\W|$)|\d×")
"""What makes a table one of measured figures: a decimal number, a time, a size, a percentage or a ratio."""

NOT_MEASURED = (
    "| claim | paper",  # the papers' figures, quoted (docs/reproduce.md); this run's tables are dated
    "| rule | agrees when |",  # reproduce's rules and their thresholds
    "| probe | Llama-3-8B shape |",  # computed from the memory model (docs/performance.md), not measured
    "| part | extra bytes |", "| where | tensor | size |",  # the memory model's formulas, float64's sizes
    "| command | what it does |", "| folder | modules (lines) |", "| task | type | difficulty |",
    "| model_arg | default | meaning |", "| metric | per document | aggregation |",  # reference tables
    "| distribution | supported",  # the supported releases (docs/compat.md); the measured stacks' table is dated
)
"""Headers of tables with figures that look measured (a decimal, a unit) but are quoted, computed or reference."""


def documents(repo_root: Path) -> list[Path]:
    return sorted((repo_root / "docs").glob("*.md")) + [repo_root / "README.md"]


def blocks(text: str) -> list[list[str]]:
    """The document's blocks: runs of non-blank lines."""
    out: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip():
            out[-1].append(line)
        elif out[-1]:
            out.append([])
    return [block for block in out if block]


def measured_tables(text: str) -> list[tuple[str, str]]:
    """``(header, the paragraph before it + the caption after it)`` of every table of measured figures."""
    found = []
    parts = blocks(text)
    for index, block in enumerate(parts):
        table_at = next((i for i, line in enumerate(block) if line.startswith("|") and i + 1 < len(block)
                         and re.fullmatch(r"\|[-| :]+\|", block[i + 1])), None)
        if table_at is None:
            continue
        header, body = block[table_at], [line for line in block[table_at + 2:] if line.startswith("|")]
        if not body or header.startswith(NOT_MEASURED) or not any(MEASURED.search(line) for line in body):
            continue
        before = block[:table_at] or (parts[index - 1] if index > 0 else [])
        after = parts[index + 1] if index + 1 < len(parts) else []
        found.append((header, " ".join(before + after)))
    return found


def known_commit(repo_root: Path, name: str) -> bool | None:
    """Whether ``name`` is a commit of this checkout (``None``: no git history here to ask)."""
    try:
        done = subprocess.run(["git", "-C", str(repo_root), "cat-file", "-e", f"{name}^{{commit}}"],
                              capture_output=True, timeout=30)
        inside = subprocess.run(["git", "-C", str(repo_root), "rev-parse", "--is-inside-work-tree"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if inside.stdout.strip() != "true":
        return None
    return done.returncode == 0


def test_the_docs_say_session_only_in_pytests_sense(repo_root):
    found = [f"{path.name}:{number}: {line.strip()}" for path in documents(repo_root)
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if SESSION.search(PYTEST_SENSE.sub("", line))]
    assert not found, "date by commit and machine, not by session:\n" + "\n".join(found)


def test_every_table_of_measured_figures_names_its_commit_and_machine(repo_root):
    undated, tables, cited = [], 0, set()
    for path in documents(repo_root):
        for header, context in measured_tables(path.read_text(encoding="utf-8")):
            tables += 1
            commits = COMMIT.findall(context)
            cited.update(commits)
            if not commits or not MACHINE.search(context):
                undated.append(f"{path.name}: {header[:80]}")
    assert tables >= 30, tables  # the docs' tables of measured figures are found at all
    assert not undated, "tables of measured figures without a commit and a machine nearby:\n" + "\n".join(undated)
    unknown = [name for name in sorted(cited) if known_commit(repo_root, name) is False]
    assert not unknown, f"cited commits not in this checkout's history: {unknown}"


@pytest.mark.parametrize(("text", "dated"), [
    ("Measured here:\n\n| a | b |\n|---|---|\n| x | 1.5 s |\n", False),
    ("Measured at 1b0c5bd on a 2-core x86 machine:\n\n| a | b |\n|---|---|\n| x | 1.5 s |\n", True),
    ("| a | b |\n|---|---|\n| x | 1.5 s |\n\n_Measured at 1b0c5bd on a 2-core x86 machine._\n", True),
    ("Measured at 1b0c5bd:\n\n| a | b |\n|---|---|\n| x | 1.5 s |\n", False),  # no machine
])
def test_the_check_finds_an_undated_table(text, dated):
    ((_, context),) = measured_tables(text)
    assert bool(COMMIT.search(context) and MACHINE.search(context)) is dated
