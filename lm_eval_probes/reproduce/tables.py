"""A reproduction's table — claim | paper | this run [95 % CI] | agrees? — as Markdown and JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lm_eval_probes.reproduce.claims import Claim, Value

VERDICTS = {True: "yes", False: "no", None: "—"}
"""``agrees`` as the table shows it (``—``: undecided, e.g. an undefined value or no interval)."""


def format_value(value: Value, digits: int = 3) -> str:
    """A scalar as ``0.123``, a sequence as ``0.161, 0.165, …``, ``None`` / non-finite as ``—``."""
    if isinstance(value, tuple):
        return ", ".join(format_value(v, digits) for v in value) if value else "—"
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:+.{digits}f}" if value < 0 else f"{value:.{digits}f}"


def measured_cell(claim: Claim) -> str:
    """``0.123 [0.050, 0.200]`` (the interval where there is one)."""
    cell = format_value(claim.measured.value)
    if claim.measured.has_interval:
        cell += f" [{format_value(claim.measured.ci_low)}, {format_value(claim.measured.ci_high)}]"
    return cell


def paper_cell(claim: Claim) -> str:
    return claim.paper_text or format_value(claim.paper)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(claims: Sequence[Claim]) -> str:
    """The claims as one Markdown table, with each claim's rule and note below it, numbered."""
    lines = ["| # | claim | paper | this run [95 % CI] | n | agrees? |", "|---|---|---|---|---|---|"]
    for i, claim in enumerate(claims, 1):
        n = "" if claim.measured.n_documents is None else str(claim.measured.n_documents)
        lines.append(f"| {i} | {_escape(claim.claim)} | {_escape(paper_cell(claim))} | {measured_cell(claim)} | {n} | "
                     f"{VERDICTS[claim.agrees]} |")
    lines.append("")
    for i, claim in enumerate(claims, 1):
        note = f"; {claim.measured.note}" if claim.measured.note else ""
        lines.append(f"{i}. agrees if {claim.rule.text}{note}")
    return "\n".join(lines)


def summary_line(claims: Sequence[Claim]) -> str:
    """``3 of 12 claims agree, 7 do not, 2 undecided``."""
    counts = {verdict: sum(claim.agrees is verdict for claim in claims) for verdict in (True, False, None)}
    return f"{counts[True]} of {len(claims)} claims agree, {counts[False]} do not, {counts[None]} undecided"


def markdown_document(claims: Sequence[Claim], header: Mapping[str, Any]) -> str:
    """The Markdown file: what was run (``header``), the table, the rules, the summary."""
    title = f"# lm-eval-probes reproduce {header.get('protocol', '')}"
    setting = "\n".join(f"- {key}: {value}" for key, value in header.items() if key != "protocol")
    return f"{title}\n\n{setting}\n\n{markdown_table(claims)}\n\n{summary_line(claims)}\n"


def json_document(claims: Sequence[Claim], header: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON form: ``header``'s fields and ``claims`` (each :meth:`Claim.to_json`)."""
    return {**header, "claims": [claim.to_json() for claim in claims]}


def write(claims: Sequence[Claim], header: Mapping[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``OUT/claims.json`` and ``OUT/claims.md``; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    json_path, markdown_path = out / "claims.json", out / "claims.md"
    json_path.write_text(json.dumps(json_document(claims, header), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    markdown_path.write_text(markdown_document(claims, header), encoding="utf-8")
    return json_path, markdown_path
