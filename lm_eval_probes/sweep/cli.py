"""``lm-eval-probes sweep CONFIG.yaml [--shard K/N] [--output_dir DIR]``: the command line of the sweep."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lm_eval_probes.sweep.config import Shard, SweepConfigError, load_config
from lm_eval_probes.sweep.runner import GENERATE, SAMPLES, UNAVAILABLE, SweepInterrupted, pair_route, run_sweep
from lm_eval_probes.sweep.store import is_finished
from lm_eval_probes.terminal.console import tidy_console
from lm_eval_probes.terminal.interrupt import EXIT_INTERRUPTED, stop_at_next_interrupt


# ----------------------------------------------------------------------------------------- CLI

EXAMPLE = """\
example config (YAML), for any machine: without 'device' each model goes where lm_eval's CLI puts it
without --device (the first GPU when there is one, else the CPU):
  output_dir: results/sweep          # relative to this file
  models:
    - name: smollm2-135m
      model_args: {pretrained: HuggingFaceTB/SmolLM2-135M-Instruct, dtype: float32}
    - name: qwen2.5-0.5b
      model_args: {pretrained: Qwen/Qwen2.5-0.5B-Instruct, dtype: bfloat16, parallelize: true}
  tasks: [probes_synth_arith, probes_synth_logic]
  probes: tcb+bte+reader
  limit: 100
  batch_size: auto
  seeds: 0

example config (YAML) on a chosen device:
  output_dir: results/sweep-cpu
  models:
    - name: smollm2-135m
      model_args: {pretrained: HuggingFaceTB/SmolLM2-135M-Instruct, dtype: float32}
  tasks: [probes_synth_arith, probes_synth_logic]
  limit: 100
  device: cpu                        # or cuda, cuda:1, mps
  seeds: 0

generate with vLLM, then probe (docs/scale-out.md): a model entry may add
    generate_with: vllm        # lm_eval's vllm model generates (--log_samples), then probe-run adds the probes
    fallback: hf-probes        # where vLLM is not installed, hf-probes generates instead (said in the status)
  or, for runs that exist already (any backend, with --log_samples):
    samples: runs/vllm         # probe-run on the newest run there that has each task's samples

across machines (docs/scale-out.md): each runs its shard into its own folder, then copy runs/ into one:
  lm-eval-probes sweep sweep.yaml --shard 0/2 --output_dir /scratch/a     # machine 1
  lm-eval-probes sweep sweep.yaml --shard 1/2 --output_dir /scratch/b     # machine 2
  mkdir -p results/sweep && cp -r /scratch/a/runs /scratch/b/runs results/sweep/   # then, once
  lm-eval-probes report results/sweep/runs --out results/leaderboard
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lm-eval-probes sweep",
        description="Run every model × task of CONFIG.yaml through lm_eval with the same probes, seeds, limit, "
                    "few-shot and batch-size policy, writing lm_eval's results and samples files per pair into "
                    "OUTPUT_DIR/runs/<model>/<task>/. Finished pairs are skipped on a rerun; failures are recorded "
                    "in OUTPUT_DIR/sweep_status.json and the sweep goes on. Then: lm-eval-probes report OUTPUT_DIR/runs --out DIR.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", metavar="CONFIG.yaml", help="the sweep config (see the example below and the README)")
    p.add_argument("--shard", default="0/1", help="K/N: run pair i of the sorted pair list when i mod N = K "
                   "(0 <= K < N; e.g. --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT); default 0/1 = all")
    p.add_argument("--output_dir", metavar="DIR", help="write runs/, status/ and sweep_status.json into DIR instead of "
                   "the config's output_dir (e.g. one folder per shard on a machine's own disk; copy their runs/ folders "
                   "into one afterwards)")
    p.add_argument("--check", action="store_true", help="validate the config and list this shard's pairs and their "
                   "state, load nothing")
    p.add_argument("--debug", action="store_true", help="show the traceback of a Ctrl-C (also LM_EVAL_PROBES_DEBUG=1)")
    return p


def _route_column(model: Any) -> str:
    """``--check``'s fourth column, for a model whose responses another model type makes (``generate_with``) or
    exist (``samples``)."""
    if model.generate_with is None and model.samples is None:
        return ""
    route = pair_route(model)
    if route.kind == GENERATE:
        return f"\tgenerate with {model.generate_with}, then probe-run"
    if route.kind == SAMPLES:
        return f"\tprobe-run on the samples in {model.samples}"
    if route.kind == UNAVAILABLE:
        return f"\tcannot run: {route.note}"
    return f"\thf-probes ({route.note})"


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    try:
        config = load_config(args.config)
        if args.output_dir is not None:
            config = dataclasses.replace(config, output_dir=Path(args.output_dir).resolve())
        shard = Shard.parse(args.shard)
        if args.check:
            for model, task in shard.select(config.pairs()):
                state = "done" if is_finished(config, model, task) else "to run"
                print(f"{model}\t{task}\t{state}{_route_column(config.model(model))}")
            return 0
        with tidy_console():  # lm_eval's repeated notices once; warnings name the pair and the row
            summary = run_sweep(config, shard=shard)
    except (SweepConfigError, FileNotFoundError) as error:
        print(f"lm-eval-probes sweep: error: {error}", file=sys.stderr)
        return 2
    except SweepInterrupted as interrupted:
        from lm_eval_probes.terminal.debug import wants_debug

        if args.debug or wants_debug([]):
            raise
        stop_at_next_interrupt()  # a second Ctrl-C while exiting stops at once
        print(f"{interrupted} (status: {config.output_dir / 'sweep_status.json'})", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # before the first pair (reading lm_eval's task index)
        from lm_eval_probes.terminal.debug import wants_debug

        if args.debug or wants_debug([]):
            raise
        stop_at_next_interrupt()
        print("interrupted before any pair ran — rerun the same command to start", file=sys.stderr)
        return EXIT_INTERRUPTED
    counts = summary["counts"]
    print(f"{counts['done']} done, {counts['failed']} failed, {counts['pending']} pending (all shards): "
          f"{config.output_dir / 'sweep_status.json'}")
    return 1 if counts["failed"] else 0
