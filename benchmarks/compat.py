"""``make compat``: the plugin on the stacks people have, release by release, each in a throwaway virtual environment.

    python benchmarks/compat.py [--stacks "LABEL;..."] [--groups transformers,torch,lm-eval,named] [--workdir DIR]
                                [--keep] [--json OUT]

The reference is this interpreter's stack (the repository's ``.venv`` under ``make compat``). :data:`STACKS` holds
every transformers minor release from 4.57 to the newest (its newest patch; torch 2.13.0, lm-eval 0.4.13), every torch
minor from the floor 2.6 to the newest (transformers 5.25.0; 2.6 also with 4.57.6), each lm-eval release in range
(and 0.4.9, refused), and the stacks named in ``docs/compat.md``. Stacks of one torch share an environment, made
when the first of them runs and deleted after the last (one CUDA build of several GB on disk at a time): its torch
first, alone (``torch==2.13.0`` is a CPU build on this machine's disk; any other torch is a CUDA build from PyPI,
fetched without pip's cache); then, per stack, its lm-eval and transformers releases (pip picks datasets and
huggingface-hub) together with the plugin's wheel (built once from this checkout); then ``compat_run.py``: the tiny
random Llama of the tests, Qwen3, Gemma-3 and Mixtral (saved once by this interpreter, so every stack loads the same
weights), ``hf-probes`` with ``probes=all``. Every row (absolute difference) and per-document value (relative
difference) is compared with the reference run's; a stack that fails to install or run shows the last line of its
error. The table is printed as Markdown (``docs/compat.md``); ``--json`` also writes the outcomes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
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

from batch_invariance import difference, row_values  # noqa: E402
from per_document import largest_differences  # noqa: E402

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
MODELS = ("llama", "qwen3", "gemma3_text", "mixtral")
"""The tiny random families every stack runs (the first on every task; ``compat_run.py``)."""


@dataclass(frozen=True)
class Stack:
    """One combination: pip requirements of torch and of the rest (each an exact release)."""

    label: str
    torch: str
    others: tuple[str, ...]
    group: str


TRANSFORMERS_MINORS = ("4.57.6", "5.0.0", "5.1.0", "5.2.0", "5.3.0", "5.4.0", "5.5.4", "5.6.2", "5.7.0", "5.8.1",
                       "5.9.0", "5.10.4", "5.11.0", "5.12.1", "5.13.1", "5.14.1", "5.15.1", "5.16.1", "5.17.0",
                       "5.18.0", "5.19.0", "5.20.2", "5.21.1", "5.22.2", "5.23.0", "5.24.0", "5.25.0")
"""The newest patch of every transformers minor release from the floor to the newest (PyPI, 2026-12-04)."""
TORCH_MINORS = ("2.6.0", "2.7.1", "2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
LM_EVAL_RELEASES = ("0.4.9", "0.4.10", "0.4.11", "0.4.12", "0.4.13")
NEWEST_TRANSFORMERS = TRANSFORMERS_MINORS[-1]
STACKS: tuple[Stack, ...] = (
    *(Stack(f"transformers {v}", "torch==2.13.0", ("lm-eval==0.4.13", f"transformers=={v}"), "transformers")
      for v in TRANSFORMERS_MINORS),
    *(Stack(f"torch {v}", f"torch=={v}", ("lm-eval==0.4.13", f"transformers=={NEWEST_TRANSFORMERS}"), "torch")
      for v in TORCH_MINORS if v != "2.13.0"),
    *(Stack(f"lm-eval {v}", "torch==2.13.0", (f"lm-eval=={v}", f"transformers=={NEWEST_TRANSFORMERS}"), "lm-eval")
      for v in LM_EVAL_RELEASES[:-1]),
    Stack("torch 2.6.0, transformers 4.57.6", "torch==2.6.0", ("lm-eval==0.4.13", "transformers==4.57.6"), "named"),
    Stack("torch 2.11.0, transformers 5.17.0", "torch==2.11.0", ("lm-eval==0.4.13", "transformers==5.17.0"), "named"),
    Stack("torch 2.6.0, transformers 4.57.6, lm-eval 0.4.10", "torch==2.6.0",
          ("lm-eval==0.4.10", "transformers==4.57.6"), "named"),
)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("WARNING: Location")]
    return lines[-1][:200] if lines else "(no output)"


def pip(python: Path, *arguments: str) -> None:
    """``pip install`` into the environment of ``python``, without this machine's cap on torch (``/etc/xdg/pip``); a
    failure raises with pip's last line."""
    free = Path(tempfile.gettempdir()) / "lm-eval-probes-no-constraints.txt"
    free.write_text("")
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *arguments], capture_output=True, text=True,
                          env={**_environment(), "PIP_CONSTRAINT": str(free)})
    if done.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(arguments)}: {last_line(done.stderr)}")


def run_in(python: Path, models: list[str], out: Path, workdir: Path, light: bool = False) -> dict[str, Any]:
    """``compat_run.py`` under ``python``, from ``workdir`` (outside the repository, so that the installed plugin is
    the one imported)."""
    done = subprocess.run([str(python), str(REPO / "benchmarks" / "compat_run.py"), str(out),
                           *(["--light"] if light else []), *models], cwd=workdir,
                          capture_output=True, text=True, env={**_environment(), **OFFLINE})
    if done.returncode != 0:
        raise RuntimeError(f"run: {last_line(done.stderr)}")
    return json.loads(out.read_text())


def _environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}


def differences(now: dict[str, Any], reference: dict[str, Any]) -> tuple[float, float]:
    """The largest absolute difference of any row and relative difference of any per-document value over every
    model's run; ``inf`` when the runs hold other models, rows, documents or value shapes."""
    if set(now) != set(reference):
        return float("inf"), float("inf")
    rows, documents = 0.0, 0.0
    for name, base_run in reference.items():
        got_run = now[name]
        for task, results in base_run["results"].items():
            configs = base_run["configs"]
            own = {m["metric"] for m in configs[task]["metric_list"]} if task in configs else set()
            base, got = row_values(results, own), row_values(got_run["results"].get(task, {}), own)
            if set(base) != set(got):
                return float("inf"), float("inf")
            rows = max([rows, *(difference(base[key], got[key]) for key in base)])
        for task, samples in base_run["samples"].items():
            try:
                worst = largest_differences(got_run["samples"][task], samples)
            except (AssertionError, KeyError):
                return rows, float("inf")
            documents = max([documents, *worst.values()])
    return rows, documents


def portable(model: str) -> str:
    """A saved tiny model that transformers 4.57 to 5.x all read the same way: the tokenizer's class named as both
    know it (5.x writes ``TokenizersBackend``, which 4.57 lacks, and calls that class ``PreTrainedTokenizerFast``
    too), and the rotary bases of 5.x's ``rope_parameters`` also written where 4.x reads them (``rope_theta``,
    Gemma-3's ``rope_local_base_freq``)."""
    config = Path(model) / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.write_text(json.dumps(settings))
    model_config = Path(model) / "config.json"
    settings = json.loads(model_config.read_text())
    rope = settings.get("rope_parameters") or {}
    if "rope_theta" in rope:
        settings.setdefault("rope_theta", rope["rope_theta"])
    for layer_type, legacy in (("full_attention", "rope_theta"), ("sliding_attention", "rope_local_base_freq")):
        if isinstance(rope.get(layer_type), dict) and "rope_theta" in rope[layer_type]:
            settings.setdefault(legacy, rope[layer_type]["rope_theta"])
    model_config.write_text(json.dumps(settings, indent=2))
    return model


def tiny_models(folder: Path, families: tuple[str, ...] = MODELS) -> list[str]:
    """``families`` (of :data:`MODELS`) saved into ``folder`` (the tests' Llama and Gemma-3; Qwen3 and Mixtral by the architectures'
    builder), each :func:`portable`."""
    from architectures import build
    from tiny_models import TINY_ARCHS, save_tiny_model

    saved = []
    for arch in families:
        target = folder / f"tiny-{arch}"
        saved.append(portable(save_tiny_model(target, arch) if arch in TINY_ARCHS else build(arch, target)))
    return saved


def requested_versions(stack: Stack) -> dict[str, str]:
    return {requirement.split("==")[0]: requirement.split("==")[1] for requirement in (stack.torch, *stack.others)}


class Environments:
    """One virtual environment per torch requirement at a time: made for the first stack that asks for it, deleted
    when a stack asks for another torch (or at :meth:`close`), unless ``keep``."""

    def __init__(self, workdir: Path, keep: bool) -> None:
        self.workdir, self.keep = workdir, keep
        self.torch: str | None = None
        self.folder: Path | None = None

    def python_for(self, torch: str) -> Path:
        if torch != self.torch:
            self.close()
            self.torch, self.folder = torch, self.workdir / f"venv-{torch.replace('==', '-')}"
            subprocess.run([sys.executable, "-m", "venv", str(self.folder)], check=True)
            python = self.folder / "bin" / "python"
            pip(python, "--upgrade", "pip")
            pip(python, "--no-cache-dir", torch)  # a CUDA build: several GB, not kept in pip's cache
        return self.folder / "bin" / "python"

    def close(self) -> None:
        if self.folder is not None and not self.keep:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.torch, self.folder = None, None


def measure(stack: Stack, environments: Environments, wheel: Path, models: list[str], reference: dict[str, Any],
            workdir: Path, light: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    try:
        python = environments.python_for(stack.torch)
        pip(python, *stack.others, str(wheel))  # the stack's releases, what they need, and the plugin as built
        out = workdir / f"{stack.label.replace(' ', '_').replace(',', '')}.json"
        now = run_in(python, models, out, workdir, light)
        rows, documents = differences(now["runs"], reference["runs"])
        return {"versions": now["versions"], "rows": rows, "documents": documents,
                "minutes": (time.monotonic() - started) / 60}
    except (RuntimeError, subprocess.CalledProcessError) as error:
        environments.close()  # a half-installed environment is not reused
        return {"versions": requested_versions(stack), "error": str(error), "minutes": (time.monotonic() - started) / 60}


def table(reference: dict[str, str], measured: list[tuple[str, dict[str, Any]]], commit: str = "") -> str:
    names = ("torch", "transformers", "lm-eval", "datasets", "huggingface-hub")
    lines = ["| " + " | ".join(names) + " | result | rows (max abs. diff.) | per-document (max rel. diff.) | commit |",
             "|" + "---|" * (len(names) + 4)]
    lines.append("| " + " | ".join(reference[n] for n in names) + f" | reference | — | — | {commit} |")
    for _, outcome in measured:
        versions = " | ".join(outcome["versions"].get(n, "—") for n in names)
        if "error" in outcome:
            lines.append(f"| {versions} | fails: {outcome['error'].replace('|', '/')} | — | — | {commit} |")
        else:
            rows, documents = outcome["rows"], outcome["documents"]
            result = ("identical" if rows == documents == 0 else
                      "other rows, documents or shapes" if math.inf in (rows, documents) else
                      "runs (float rounding)" if rows <= 1e-4 else "runs, rows differ")
            lines.append(f"| {versions} | {result} | {rows:.3g} | {documents:.3g} | {commit} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", default=None,
                        help="labels of STACKS to run, separated by semicolons (default: all): "
                             + "; ".join(s.label for s in STACKS))
    parser.add_argument("--groups", default=None,
                        help="groups of STACKS to run, separated by commas: transformers, torch, lm-eval, named")
    parser.add_argument("--workdir", type=Path, default=None, help="folder for the environments (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the environments")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"tiny families each stack runs, the first on every task (default: {','.join(MODELS)})")
    parser.add_argument("--light", action="store_true",
                        help="every model on 3 documents of the multiple-choice and the generation task only")
    parser.add_argument("--json", type=Path, default=None, help="also write the outcomes here, as each stack ends")
    args = parser.parse_args(argv)
    chosen = STACKS
    if args.stacks:
        wanted = [label.strip() for label in args.stacks.split(";")]
        unknown = sorted(set(wanted) - {s.label for s in STACKS})
        if unknown:
            parser.error(f"unknown stacks {unknown}; known: {[s.label for s in STACKS]}")
        chosen = tuple(s for s in STACKS if s.label in wanted)
    if args.groups:
        groups = {g.strip() for g in args.groups.split(",")}
        unknown = sorted(groups - {s.group for s in STACKS})
        if unknown:
            parser.error(f"unknown groups {unknown}; known: transformers, torch, lm-eval, named")
        chosen = tuple(s for s in chosen if s.group in groups)
    chosen = tuple(sorted(chosen, key=lambda s: s.torch))  # one environment per torch, each made once
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="lm-eval-probes-compat-"))
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "source"  # setuptools builds beside the sources: a copy, so that runs at once do not collide
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "results", "tests", "docs",
                                                                "benchmarks", "examples", "__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(workdir / "wheel"), str(source)], check=True, cwd=workdir)
    wheel = next((workdir / "wheel").glob("lm_eval_probes-*.whl"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    families = tuple(m.strip() for m in args.models.split(","))
    if not families or set(families) - set(MODELS):
        parser.error(f"--models: some of {', '.join(MODELS)}")
    models = tiny_models(workdir, families)  # deleted with the workdir
    reference = run_in(Path(sys.executable), models, workdir / "reference.json", workdir, args.light)
    environments = Environments(workdir, args.keep)
    measured = []
    try:
        for stack in chosen:
            outcome = measure(stack, environments, wheel, models, reference, workdir, args.light)
            measured.append((stack.label, outcome))
            print(f"{stack.label}: {outcome.get('error', 'ran')} ({outcome['minutes']:.1f} min)", flush=True)
            if args.json:
                args.json.write_text(json.dumps({"reference": reference["versions"], "commit": commit,
                                                 "models": families, "light": args.light,
                                                 "measured": measured}, indent=1))
    finally:
        environments.close()
    print(table(reference["versions"], measured, commit))
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
