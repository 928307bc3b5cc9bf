"""``lm-eval-probes reproduce PROTOCOL``: a paper's headline results as one command.

    lm-eval-probes reproduce bte --model_args pretrained=meta-llama/Llama-3.1-8B-Instruct,dtype=bfloat16
    lm-eval-probes reproduce calibration [--model hf-probes-diffusion] [--variant gsm8k] --limit 400
    lm-eval-probes reproduce bte --model_args pretrained=DIR,gguf_file=F --data_dir DATA --limit 40 --out results/r
    lm-eval-probes reproduce margins --data wiki.test.raw --seeds 0,1,2 --out results/m   # trains its own models

Runs the protocol's tasks once through ``lm_eval`` with the plugin (the rows a user gets), prints one table —
claim | paper | this run [95 % CI] | agrees? — and writes it to ``OUT/claims.json`` and ``OUT/claims.md``, with
lm_eval's results and samples under ``OUT/lm_eval``. Without ``pretrained`` the paper's model (a hub name) is
used; without ``--data_dir`` the hub datasets. ``margins`` runs its training engine instead of lm_eval (its report
under ``OUT/engine``), or reads an earlier run's report (``--engine_output``). docs/reproduce.md: each protocol's
tasks, statistics and rules.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from lm_eval_probes.harness.release import release_models
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
    merged = merge_model_args(given, dict(chosen.model_args))
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
        release_models()  # each pass builds its own model: the last one goes before the next loads
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


ENGINE_RUN_OPTIONS = ("data", "quick", "lambdas", "sigmas", "seeds", "steps", "threads")
"""The command's options that run the ``margins`` engine (argparse destinations)."""


def from_engine(name: str, engine_output: str | Path | None = None, *, out: str | Path = "results/reproduce",
                **engine_options: Any) -> tuple[list[Claim], dict[str, Any]]:
    """The claims of an engine protocol (``margins``): its engine run here when ``engine_options`` say how
    (``data`` or ``quick``, and :func:`lm_eval_probes.reproduce.margins.run_engine`'s other options; the report
    goes to ``OUT/engine``), or an earlier run's report (``engine_output``: ``repro.json`` or its folder).

    Raises:
        ReproduceError: an lm_eval protocol, both a report and a run or neither, options the engine rejects, or a
            report that is not the engine's.
    """
    given = sorted(f"--{key}" for key, value in engine_options.items() if value is not None and value is not False)
    if name not in ENGINE_PROTOCOLS:
        protocol(name)  # an unknown name says so
        options = ", ".join(given + (["--engine_output"] if engine_output is not None else []))
        raise ReproduceError(f"{options} {'is' if ',' not in options else 'are'} for {', '.join(ENGINE_PROTOCOLS)}; "
                             f"{name!r} runs through lm_eval")
    runs = engine_options.get("data") is not None or bool(engine_options.get("quick"))
    if engine_output is not None and given:
        raise ReproduceError(f"--engine_output reads an earlier run's report, {', '.join(given)} run the engine: "
                             "give one or the other")
    if engine_output is None and not runs:
        raise ReproduceError(f"protocol {name!r} trains its own models: give --data FILE (plain text, e.g. "
                             "wikitext2/wiki.test.raw) or --quick (a tiny offline run) to run its engine, or "
                             "--engine_output DIR to read an earlier run's repro.json")
    from lm_eval_probes.reproduce import margins

    if engine_output is None:
        engine_output = margins.run_engine(Path(out) / "engine", **engine_options)
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
    parser.add_argument("--out", default="results/reproduce",
                        help="claims.json, claims.md and lm_eval/ (margins: engine/, the engine's report) go here")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--batch_size", default="auto")
    parser.add_argument("--num_fewshot", type=int, default=None, help="default: each task's own")
    parser.add_argument("--gen_kwargs", default=None, help="lm_eval's, e.g. max_gen_toks=128")
    parser.add_argument("--apply_chat_template", action="store_true", help="lm_eval's (instruct models' chat format)")
    parser.add_argument("--metadata", default=None, help="more task metadata as JSON, e.g. '{\"noise_eta\": 0.3}'")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    engine = parser.add_argument_group(
        "margins (trains its own models: --data FILE or --quick runs its engine, --engine_output reads a report)")
    engine.add_argument("--data", default=None,
                        help="a plain-text corpus (UTF-8), e.g. wikitext2/wiki.test.raw: its last 10 %% is held out "
                             "(about 11 min per seed on 2 cores at the default size)")
    engine.add_argument("--quick", action="store_true",
                        help="the tiny size (150 steps), on the offline synthetic corpus unless --data is given")
    engine.add_argument("--lambdas", default=None, help="barrier weights λ trained besides CE only (default 0.02,0.05,0.1)")
    engine.add_argument("--sigmas", default=None,
                        help="noise levels on the embeddings, 0 first, increasing (default 0,0.1,0.2,0.3,0.4,0.5)")
    engine.add_argument("--seeds", default=None,
                        help="training seeds (default 0); with two or more, the barrier − CE-only differences get a "
                             "95 %% t-interval over seeds")
    engine.add_argument("--steps", type=int, default=None, help="training steps per model (default 1000; --quick 150)")
    engine.add_argument("--threads", type=int, default=None, help="torch CPU threads for the engine (default: torch's)")
    engine.add_argument("--engine_output", default=None,
                        help="read this repro.json (or its folder) of an earlier engine run instead of training "
                             "(written by reproduce margins under OUT/engine, or by benchmarks/support_tokens_repro.py)")
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


@contextlib.contextmanager
def _engine_progress() -> Iterator[None]:
    """The engine's progress lines (INFO) on stderr while it runs, its logger's level restored afterwards."""
    engine_logger = logging.getLogger("lm_eval_probes.reproduce.margins_engine")
    before = engine_logger.level
    engine_logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        engine_logger.setLevel(before)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    engine_options = {key: getattr(args, key) for key in ENGINE_RUN_OPTIONS}
    engine_asked = any(value is not None and value is not False for value in engine_options.values())
    try:
        if args.protocol in ENGINE_PROTOCOLS or args.engine_output is not None or engine_asked:
            with _engine_progress():
                claims, header = from_engine(args.protocol, args.engine_output, out=args.out, **engine_options)
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
