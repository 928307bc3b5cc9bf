"""``make compat``: the plugin on the stacks people have, each in a throwaway virtual environment.

    python benchmarks/compat.py [--stacks "LABEL;..."] [--workdir DIR] [--keep]

The reference is this interpreter's stack (the repository's ``.venv`` under ``make compat``). For each stack of
:data:`STACKS`, in turn: a new virtual environment; its torch first, alone (``torch==2.13.0`` is a CPU build on this
machine's disk; any other torch is a CUDA build from PyPI, several GB, see ``docs/compat.md``); then its lm-eval,
transformers, datasets and huggingface-hub releases together with the plugin's wheel (built once from this
checkout); then ``compat_run.py``: the tests' tiny random Llama (saved once by this interpreter, so every stack
loads the same weights), ``hf-probes`` with ``probes=all`` on 8 documents each of a multiple-choice, a generation
and a clean/noised detector task. Every row (absolute difference) and per-document value (relative difference) is
compared with the reference run's; a stack that fails to install or run shows the last line of its error. The table
is printed as Markdown (``docs/compat.md``); the environments are deleted unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from batch_invariance import difference, row_values, tiny_llama  # noqa: E402
from per_document import largest_differences  # noqa: E402

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True)
class Stack:
    """One combination: pip requirements of torch and of the rest (each an exact release)."""

    label: str
    torch: str
    others: tuple[str, ...]


NEWEST = ("transformers==5.25.0", "datasets==5.2.0", "huggingface-hub==2.4.0")
TRANSFORMERS_4 = ("transformers==4.57.6", "datasets==4.8.5", "huggingface-hub==0.36.2")
STACKS: tuple[Stack, ...] = (
    *(Stack(f"lm-eval {v}", "torch==2.13.0", (f"lm-eval=={v}", *NEWEST)) for v in ("0.4.9", "0.4.10", "0.4.11", "0.4.12")),
    Stack("transformers 4.57, lm-eval 0.4.13", "torch==2.13.0", ("lm-eval==0.4.13", *TRANSFORMERS_4)),
    Stack("transformers 4.57, lm-eval 0.4.10", "torch==2.13.0", ("lm-eval==0.4.10", *TRANSFORMERS_4)),
    Stack("transformers 4.57, lm-eval 0.4.9", "torch==2.13.0", ("lm-eval==0.4.9", *TRANSFORMERS_4)),  # refused
    Stack("torch 2.14.1", "torch==2.14.1", ("lm-eval==0.4.13", *NEWEST)),
)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("WARNING: Location")]
    return lines[-1][:200] if lines else "(no output)"


def pip(python: Path, *arguments: str) -> None:
    """``pip install`` into the environment of ``python``; a failure raises with pip's last line."""
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *arguments], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(arguments)}: {last_line(done.stderr)}")


def run_in(python: Path, model: str, out: Path, workdir: Path) -> dict[str, Any]:
    """``compat_run.py`` under ``python``, from ``workdir`` (outside the repository, so that the installed plugin is
    the one imported)."""
    done = subprocess.run([str(python), str(REPO / "benchmarks" / "compat_run.py"), model, str(out)], cwd=workdir,
                          capture_output=True, text=True, env={**_environment(), **OFFLINE})
    if done.returncode != 0:
        raise RuntimeError(f"run: {last_line(done.stderr)}")
    return json.loads(out.read_text())


def _environment() -> dict[str, str]:
    import os

    return {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}


def differences(now: dict[str, Any], reference: dict[str, Any]) -> tuple[float, float]:
    """The largest absolute difference of any row and relative difference of any per-document value; ``inf`` when
    the runs hold other rows, documents or value shapes."""
    rows, documents = 0.0, 0.0
    for task, results in reference["results"].items():
        own = {m["metric"] for m in reference["configs"][task]["metric_list"]} if task in reference["configs"] else set()
        base, got = row_values(results, own), row_values(now["results"].get(task, {}), own)
        if set(base) != set(got):
            return float("inf"), float("inf")
        rows = max([rows, *(difference(base[key], got[key]) for key in base)])
    for task, samples in reference["samples"].items():
        try:
            worst = largest_differences(now["samples"][task], samples)
        except (AssertionError, KeyError):
            return rows, float("inf")
        documents = max([documents, *worst.values()])
    return rows, documents


def portable(model: str) -> str:
    """The saved tokenizer's class named as transformers 4.x and 5.x both know it: 5.x writes ``TokenizersBackend``,
    which 4.57 lacks, and calls that class ``PreTrainedTokenizerFast`` too."""
    config = Path(model) / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.write_text(json.dumps(settings))
    return model


def measure(stack: Stack, index: int, wheel: Path, model: str, reference: dict[str, Any], workdir: Path,
            keep: bool) -> dict[str, Any]:
    folder = workdir / f"venv-{index}"
    python = folder / "bin" / "python"
    started = time.monotonic()
    try:
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        pip(python, "--upgrade", "pip")
        pip(python, stack.torch)
        pip(python, *stack.others, str(wheel))
        now = run_in(python, model, workdir / f"{folder.name}.json", workdir)
        rows, documents = differences(now["run"], reference["run"])
        return {"versions": now["versions"], "rows": rows, "documents": documents,
                "minutes": (time.monotonic() - started) / 60}
    except (RuntimeError, subprocess.CalledProcessError) as error:
        return {"versions": requested_versions(stack), "error": str(error), "minutes": (time.monotonic() - started) / 60}
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def requested_versions(stack: Stack) -> dict[str, str]:
    return {requirement.split("==")[0]: requirement.split("==")[1] for requirement in (stack.torch, *stack.others)}


def table(reference: dict[str, str], measured: list[tuple[str, dict[str, Any]]]) -> str:
    names = ("torch", "transformers", "lm-eval", "datasets", "huggingface-hub")
    lines = ["| " + " | ".join(names) + " | result | rows (max abs. diff.) | per-document (max rel. diff.) |",
             "|" + "---|" * (len(names) + 3)]
    lines.append("| " + " | ".join(reference[n] for n in names) + " | reference | — | — |")
    for _, outcome in measured:
        versions = " | ".join(outcome["versions"].get(n, "—") for n in names)
        if "error" in outcome:
            lines.append(f"| {versions} | fails: {outcome['error'].replace('|', '/')} | — | — |")
        else:
            rows, documents = outcome["rows"], outcome["documents"]
            result = ("identical" if rows == documents == 0 else
                      "other rows, documents or shapes" if math.inf in (rows, documents) else "runs")
            lines.append(f"| {versions} | {result} | {rows:.3g} | {documents:.3g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", default=None,
                        help="labels of STACKS to run, separated by semicolons (default: all): "
                             + "; ".join(s.label for s in STACKS))
    parser.add_argument("--workdir", type=Path, default=None, help="folder for the environments (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the environments")
    args = parser.parse_args(argv)
    chosen = STACKS
    if args.stacks:
        wanted = [label.strip() for label in args.stacks.split(";")]
        unknown = sorted(set(wanted) - {s.label for s in STACKS})
        if unknown:
            parser.error(f"unknown stacks {unknown}; known: {[s.label for s in STACKS]}")
        chosen = tuple(s for s in STACKS if s.label in wanted)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lm-eval-probes-compat-"))
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(workdir / "wheel"), str(REPO)], check=True, cwd=workdir)
    shutil.rmtree(REPO / "build", ignore_errors=True)  # setuptools builds in the tree; make install removes it too
    wheel = next((workdir / "wheel").glob("lm_eval_probes-*.whl"))
    model = portable(str(shutil.move(tiny_llama(), workdir / "tiny-llama")))  # deleted with the workdir
    reference = run_in(Path(sys.executable), model, workdir / "reference.json", workdir)
    measured = []
    for index, stack in enumerate(chosen):
        outcome = measure(stack, index, wheel, model, reference, workdir, args.keep)
        measured.append((stack.label, outcome))
        print(f"{stack.label}: {outcome.get('error', 'ran')} ({outcome['minutes']:.1f} min)", flush=True)
    print(table(reference["versions"], measured))
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
