"""``lm-eval-probes probe-run RUN --model hf-probes --model_args ... --output_path DIR``: the command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lm_eval_probes.terminal.console import tidy_console
from lm_eval_probes.terminal.interrupt import EXIT_INTERRUPTED, stop_at_next_interrupt

EXAMPLE = """\
examples:
  # a run made by any backend, with --log_samples (here vLLM on a GPU):
  lm_eval --model vllm --model_args pretrained=meta-llama/Llama-3.1-8B-Instruct --tasks gsm8k \\
      --output_path runs/vllm --log_samples
  # its probes, one teacher-forced forward per document, the accuracy and responses kept:
  lm-eval-probes probe-run runs/vllm --model hf-probes \\
      --model_args pretrained=meta-llama/Llama-3.1-8B-Instruct,dtype=bfloat16,probes=tcb+bte+reader \\
      --batch_size 8 --output_path runs/probed
  lm-eval-probes report runs/probed --out leaderboard

RUN is an lm_eval output folder holding one run (results_<date>.json and its samples_<task>_<date>.jsonl), that
results file, or samples files of one run. Generation tasks: the logged response (lm_eval's resps, before the
task's filters) is re-encoded and teacher-forced after its prompt; multiple choice: the option the logged
log-likelihoods choose. A killed run resumes where it stopped when the same command is run again (finished
documents are kept in DIR/.probe-run/, removed at the end). docs/cli.md, docs/scale-out.md.
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lm-eval-probes probe-run",
        description="Add the probes of hf-probes to a finished lm_eval run of any model type (hf, vllm, sglang, "
                    "hf-probes), with one forward per document: writes a new output folder of lm_eval's usual shape "
                    "(results with every row the tasks get under hf-probes, samples with the per-document probe "
                    "values), keeping the run's accuracy and responses. Nothing is written into RUN.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", nargs="+", metavar="RUN", help="the run's output folder, its results file, or its samples files")
    p.add_argument("--model", default="hf-probes", help="the probing model type: hf-probes (the default; the only one)")
    p.add_argument("--model_args", "-a", default="", help="as lm_eval's: pretrained=MODEL (the run's model or one with "
                   "its tokenizer), any hf argument, probes=tcb+bte+reader and probe_* options (lm-eval-probes --help)")
    p.add_argument("--output_path", "-o", required=True, metavar="DIR", help="where the new run goes (its "
                   "<model>/results_<date>.json and samples files, as lm_eval writes them)")
    p.add_argument("--tasks", "-t", default=None, help="comma-separated: only these of the run's tasks (default: all)")
    p.add_argument("--limit", "-L", type=float, default=None, help="documents per task: the first N the run logged "
                   "(or a fraction in (0, 1))")
    p.add_argument("--batch_size", "-b", default="1", help="as lm_eval's: an integer, auto or auto:N")
    p.add_argument("--max_batch_size", type=int, default=None, help="as lm_eval's (with batch_size auto)")
    p.add_argument("--device", default=None, help="as lm_eval's (cuda, cuda:1, cpu, ...; default: lm_eval's choice)")
    p.add_argument("--include_path", default=None, metavar="DIR", help="a task folder besides the plugin's (where the "
                   "run's own task YAMLs are)")
    p.add_argument("--metadata", default=None, help="task metadata as JSON, as lm_eval's --metadata")
    p.add_argument("--num_fewshot", "-f", type=int, default=None, help="default: the run's (its results' n-shot)")
    p.add_argument("--documents_per_chunk", type=int, default=64, help="documents probed, and kept for a resume, at "
                   "a time (default 64; batches never span two chunks, so keep it a few batches)")
    p.add_argument("--allow_other_model", action="store_true", help="probe with a model of another size than the "
                   "run's (the tokenizer must still be the run's)")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error (also LM_EVAL_PROBES_DEBUG=1)")
    return p


def parse_model_args(text: str) -> dict[str, Any]:
    """``--model_args`` as lm_eval reads it (``k=v,...`` or a JSON object), probe names kept together."""
    from lm_eval.utils import simple_parse_args_string

    from lm_eval_probes.config import join_probe_names

    text = text.strip()
    if text.startswith("{"):
        return dict(json.loads(text))
    return simple_parse_args_string(join_probe_names(text))


def _limit(value: float | None) -> int | float | None:
    if value is None:
        return None
    if value <= 0 or (value >= 1 and value != int(value)):
        raise ValueError(f"--limit must be a positive integer or a fraction in (0, 1), got {value}")
    return int(value) if value >= 1 else value


def _batch_size(value: str) -> int | str:
    return int(value) if value.isdigit() else value


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from lm_eval_probes.terminal.debug import wants_debug

    debug = args.debug or wants_debug([])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    from lm_eval_probes.harness.pretrained import ModelNotFound
    from lm_eval_probes.probe_run.logged import ProbeRunError

    try:
        if args.model != "hf-probes":
            reason = " (a masked-diffusion model does not generate left to right)" if "diffusion" in args.model else ""
            raise ProbeRunError(f"--model must be hf-probes, got {args.model!r}{reason}")
        from lm_eval_probes.probe_run.runner import ProbeRunOptions, probe_run

        options = ProbeRunOptions(
            run=[Path(p) for p in args.run], output_path=Path(args.output_path), model_args=parse_model_args(args.model_args),
            tasks=[t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None,
            limit=_limit(args.limit), batch_size=_batch_size(args.batch_size), max_batch_size=args.max_batch_size,
            device=args.device, include_path=args.include_path,
            metadata=json.loads(args.metadata) if args.metadata else {}, num_fewshot=args.num_fewshot,
            documents_per_chunk=args.documents_per_chunk, allow_other_model=args.allow_other_model,
        )
        with tidy_console():
            written = probe_run(options)
    except (ProbeRunError, ModelNotFound, ValueError, json.JSONDecodeError) as error:
        if debug:
            raise
        print(f"lm-eval-probes probe-run: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        stop_at_next_interrupt()
        print("lm-eval-probes probe-run: interrupted — rerun the same command to resume (finished documents are kept "
              f"in {Path(args.output_path) / '.probe-run'})", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(summary(written))
    return 0


def summary(results_file: Path) -> str:
    """What a finished probe-run did, in one line per task, then the results file."""
    from lm_eval_probes.probe_run.runner import PROBE_RUN_KEY

    note = json.loads(results_file.read_text(encoding="utf-8")).get(PROBE_RUN_KEY, {})
    lines = []
    for task, done in note.get("tasks", {}).items():
        resumed = note.get("resumed_documents", {}).get(task, 0)
        line = f"probe-run: {task}: {done['documents']} documents ({done['output_type']})"
        if resumed:
            line += f", {resumed} of them from the interrupted run"
        if done.get("flagged_documents"):
            line += (f"; {done['flagged_documents']} responses may not re-encode to the generated tokens "
                     "(probe_run.flagged in the samples)")
        lines.append(line)
    return "\n".join([*lines, f"probe-run: {results_file}"])
