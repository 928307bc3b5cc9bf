"""Small benchmark-shaped files written by the tests themselves (made-up content, same fields as the sources)."""

from __future__ import annotations

import json
from pathlib import Path


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def gsm8k_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        steps = 1 + i % 4
        lines = [f"Step {k + 1}: add {k + 2} to get <<{k}+{k + 2}={2 * k + 2}>>{2 * k + 2}." for k in range(steps)]
        rows.append({"question": f"Tom has {i + 2} marbles and finds {steps} more. How many marbles now?",
                     "answer": "\n".join(lines) + f"\n#### {i + 2 + steps}"})
    return rows


def math500_rows(n: int) -> list[dict]:
    return [{"problem": f"What is ${i} + {i + 1}$?", "solution": f"We add: ${i} + {i + 1} = \\boxed{{{2 * i + 1}}}$.",
             "answer": str(2 * i + 1), "subject": "Prealgebra", "level": 1 + i % 5, "unique_id": f"test/x/{i}.json"}
            for i in range(n)]


def proofwriter_rows(n: int, *, open_world: bool = False) -> list[dict]:
    answers = ["True", "False", "Unknown"] if open_world else ["True", "False"]
    return [{"id": f"T-{i}", "theory": "The cat is big. If something is big then it is red.",
             "question": "The cat is red." if i % 2 == 0 else "The cat is not red.",
             "answer": answers[i % len(answers)], "depth": None if open_world else i % 6}
            for i in range(n)]


def stepgame_rows(n: int) -> list[dict]:
    relations = ["left", "right", "above", "below", "upper-left", "upper-right", "lower-left", "lower-right", "overlap"]
    return [{"id": f"s{i}", "story": ["A is to the left of B.", "C is above B."],
             "question": "What is the relation of the agent A to the agent C?",
             "label": relations[i % 9], "k_hop": 1 + i % 10} for i in range(n)]


def write_data_dir(root: Path, n: int = 12) -> Path:
    """A folder in the layout ``probes_data_dir`` expects."""
    _write(root / "gsm8k" / "test.jsonl", gsm8k_rows(n))
    _write(root / "gsm8k" / "train.jsonl", gsm8k_rows(8))
    _write(root / "math500" / "test.jsonl", math500_rows(n))
    _write(root / "proofwriter" / "test.jsonl", proofwriter_rows(n))
    _write(root / "proofwriter" / "owa.jsonl", proofwriter_rows(n, open_world=True))
    _write(root / "stepgame" / "valid.jsonl", stepgame_rows(n))
    return root
