"""``lm-eval-probes reproduce PROTOCOL``: a paper's headline results as one command.

    lm-eval-probes reproduce bte --model_args pretrained=meta-llama/Llama-3.1-8B-Instruct,dtype=bfloat16
    lm-eval-probes reproduce calibration [--model hf-probes-diffusion] [--variant gsm8k] --limit 400
    lm-eval-probes reproduce bte --model_args pretrained=DIR,gguf_file=F --data_dir DATA --limit 40 --out results/r

Runs the protocol's tasks once through ``lm_eval`` with the plugin (the rows a user gets), prints one table —
claim | paper | this run [95 % CI] | agrees? — and writes it to ``OUT/claims.json`` and ``OUT/claims.md``, with
lm_eval's results and samples under ``OUT/lm_eval``. Without ``pretrained`` the paper's model (a hub name) is
used; without ``--data_dir`` the hub datasets. docs/reproduce.md: each protocol's tasks, statistics and rules.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lm_eval_probes.reproduce.claims import Claim
from lm_eval_probes.reproduce.protocol import ReproductionProtocol, Variant
from lm_eval_probes.reproduce.registry import ENGINE_PROTOCOLS, PROTOCOLS, protocol
from lm_eval_probes.reproduce.runner import (
    MODELS,
    ReproduceError,
    RunOptions,
    describe,
    evaluate,
    merge_model_args,
    parse_model_args,
)
from lm_eval_probes.reproduce.tables import markdown_table, summary_line, write


def run_options(chosen: ReproductionProtocol, variant: Variant, *, model: str | None = None, model_args: str = "",
                out: str | Path = "results/reproduce", **kwargs: Any) -> RunOptions:
    """The :class:`RunOptions` of a protocol's variant: the paper's model unless ``model_args`` names one, the
    protocol's probes and options merged into the user's ``model_args``.

    Raises:
        ReproduceError: a model the protocol cannot use, or bad arguments.
    """
    model = model or chosen.default_model
    if model not in MODELS:
        raise ReproduceError(f"--model must be one of {', '.join(MODELS)}, got {model!r}")
    if not chosen.supports(model):
        raise ReproduceError(f"protocol {chosen.name!r} runs with --model {' or '.join(chosen.pretrained)}, not {model!r}")
    given = parse_model_args(model_args)
    given.setdefault("pretrained", chosen.pretrained[model])
    merged = merge_model_args(given, {**chosen.model_defaults.get(model, {}), **chosen.model_args})
    return RunOptions(model=model, model_args=merged, tasks=variant.tasks, out=Path(out), **kwargs)


def reproduce(name: str, *, variant: str | None = None, **kwargs: Any) -> tuple[list[Claim], dict[str, Any]]:
    """Run protocol ``name`` and return its claims and the header written with them (nothing written to disk but
    lm_eval's files; :func:`lm_eval_probes.reproduce.tables.write` writes the table).

    Each of the protocol's passes is one evaluation of the variant's tasks (the pass's ``model_args`` over the
    run's); lm_eval's files go to ``OUT/lm_eval`` (one pass) or ``OUT/lm_eval/<pass>``.

    Args:
        variant: the protocol's variant (``None``: the paper's).
        kwargs: :func:`run_options`' arguments (``model``, ``model_args``, ``out``, ``limit``, ``data_dir``, ...).
    """
    chosen = protocol(name)
    chosen_variant = chosen.variant(variant)
    options = run_options(chosen, chosen_variant, **kwargs)
    several = len(chosen.passes) > 1
    runs, passes = {}, {}
    for pass_name, extra in chosen.passes.items():
        pass_options = dataclasses.replace(options, model_args={**options.model_args, **extra})
        output_dir = options.out / "lm_eval" / pass_name if several else options.out / "lm_eval"
        runs[pass_name] = evaluate(pass_options, output_dir=output_dir)
        passes[pass_name] = pass_options.model_args_text()
    claims = chosen.claims(runs, chosen_variant)
    header = {
        "protocol": chosen.name, "paper": chosen.paper, "variant": chosen_variant.name,
        "variant_description": chosen_variant.description, "filter": chosen_variant.filter_key,
        "model": options.model, "model_args": options.model_args_text(), "tasks": list(options.tasks),
        **({"passes": passes} if several else {}),
        "limit": options.limit, "data_dir": options.data_dir,
        "bootstrap": {"method": "percentile", "level": 0.95, "resamples": options.n_resamples, "seed": options.seed},
        "lm_eval_output": str(options.out / "lm_eval"), "run": describe(options),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    return claims, header


def from_engine(name: str, engine_output: str | None) -> tuple[list[Claim], dict[str, Any]]:
    """The claims of an engine protocol (``margins``) from its engine's output file.

    Raises:
        ReproduceError: an lm_eval protocol given ``--engine_output``, or an engine protocol without it.
    """
    if name not in ENGINE_PROTOCOLS:
        protocol(name)  # an unknown name says so
        raise ReproduceError(f"--engine_output is for {', '.join(ENGINE_PROTOCOLS)}; {name!r} runs through lm_eval")
    if engine_output is None:
        raise ReproduceError(f"protocol {name!r} is {ENGINE_PROTOCOLS[name]}: give --engine_output")
    from lm_eval_probes.reproduce import margins

    report = margins.read_engine_output(engine_output)
    try:
        return margins.margins_claims(report), margins.engine_header(report, engine_output)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        raise ReproduceError(f"{engine_output} is not the engine's report ({type(error).__name__}: {error})") from None


def parser() -> argparse.ArgumentParser:
    protocols = "\n".join(f"  {p.name}: {p.summary}; variants: "
                          + ", ".join(f"{v.name} ({v.description})" for v in p.variants) for p in PROTOCOLS.values())
    engines = "\n".join(f"  {name}: {text}" for name, text in ENGINE_PROTOCOLS.items())
    parser = argparse.ArgumentParser(prog="lm-eval-probes reproduce",
                                     description="a paper's headline results as one command: claim | paper | this run "
                                                 "[95 % CI] | agrees? (docs/reproduce.md)",
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=f"protocols:\n{protocols}\n{engines}")
    parser.add_argument("protocol", help=f"one of {', '.join([*PROTOCOLS, *ENGINE_PROTOCOLS])}")
    parser.add_argument("--model", choices=MODELS, default=None,
                        help="the plugin's model (default: the one the paper's headline comes from)")
    parser.add_argument("--model_args", default="",
                        help="lm_eval model_args; without pretrained= the paper's model (hub name); the protocol's "
                             "probes and options are added")
    parser.add_argument("--variant", default=None, help="the protocol's task set (default: the paper's)")
    parser.add_argument("--data_dir", default=None, help="local benchmark files (gsm8k/, math500/, proofwriter/, "
                                                         "stepgame/); default: the Hugging Face hub")
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    parser.add_argument("--out", default="results/reproduce", help="claims.json, claims.md and lm_eval/ go here")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--batch_size", default="auto")
    parser.add_argument("--num_fewshot", type=int, default=None, help="default: each task's own")
    parser.add_argument("--gen_kwargs", default=None, help="lm_eval's, e.g. max_gen_toks=128")
    parser.add_argument("--apply_chat_template", action="store_true", help="lm_eval's (instruct models' chat format)")
    parser.add_argument("--metadata", default=None, help="more task metadata as JSON, e.g. '{\"noise_eta\": 0.3}'")
    parser.add_argument("--engine_output", default=None,
                        help="margins: the repro.json (or its folder) written by benchmarks/support_tokens_repro.py")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    return parser


def _metadata(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ReproduceError(f"--metadata must be a JSON object: {error}") from None
    if not isinstance(value, dict):
        raise ReproduceError(f"--metadata must be a JSON object, got {type(value).__name__}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    try:
        if args.protocol in ENGINE_PROTOCOLS or args.engine_output is not None:
            claims, header = from_engine(args.protocol, args.engine_output)
        else:
            claims, header = reproduce(
                args.protocol, variant=args.variant, model=args.model, model_args=args.model_args, out=args.out,
                limit=args.limit, data_dir=args.data_dir, metadata=_metadata(args.metadata), device=args.device,
                batch_size=args.batch_size, num_fewshot=args.num_fewshot, gen_kwargs=args.gen_kwargs,
                apply_chat_template=args.apply_chat_template, seed=args.seed, n_resamples=args.resamples)
    except ReproduceError as error:
        print(f"lm-eval-probes reproduce: error: {error}", file=sys.stderr)
        return 2
    json_path, markdown_path = write(claims, header, Path(args.out))
    source = (f"{header['variant']}, {header['model']} {header['model_args']}" if "model" in header
              else f"engine output {header['engine_output']}")
    print(f"\n{header['protocol']} ({source})\n")
    print(markdown_table(claims))
    files = f"; lm_eval's files: {header['lm_eval_output']}" if "lm_eval_output" in header else ""
    print(f"\n{summary_line(claims)}\nwritten: {json_path}, {markdown_path}{files}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
