"""``lm-eval-probes``: the ``lm_eval`` command line with the plugin loaded and its tasks on the include path.

Takes every ``lm_eval`` argument. Differences from plain ``lm_eval``: the packaged task folder is passed
as ``--include_path`` unless you give one yourself (the flag takes a single folder; then name our tasks
by YAML path), ``--model_args ...,probes=tcb,bte`` keeps the comma-separated probe names together, and
every task gets the probe rows — stock tasks too (``lm-eval-probes run --tasks gsm8k,arc_easy``), with
their own prompts, filters and metrics.

Two subcommands of the plugin come first: ``lm-eval-probes sweep CONFIG.yaml`` (models × tasks, resumable,
sharded; :mod:`lm_eval_probes.sweep.cli`) and ``lm-eval-probes report RUN_DIR... --out DIR`` (the leaderboard;
:mod:`lm_eval_probes.reports.report`).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import textwrap

from lm_eval_probes.config import join_probe_names
from lm_eval_probes.terminal.debug import DEBUG_FLAG, wants_debug


def rewrite_argv(argv: list[str], tasks_dir: str) -> list[str]:
    """Add the packaged task folder and join bare probe names in ``--model_args`` (pure; tested)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--model_args" and i + 1 < len(argv):
            out += [arg, join_probe_names(argv[i + 1])]
            i += 2
            continue
        if arg.startswith("--model_args="):
            out.append("--model_args=" + join_probe_names(arg.split("=", 1)[1]))
        else:
            out.append(arg)
        i += 1
    wants_help = {"-h", "--help"} & set(out)
    has_include = any(a == "--include_path" or a.startswith("--include_path=") for a in out)
    if out and not wants_help and not has_include:
        out += ["--include_path", tasks_dir]
    return out


SUBCOMMANDS: dict[str, str] = {
    "probe-run": "lm_eval_probes.probe_run.cli",
    "report": "lm_eval_probes.reports.report",
    "reproduce": "lm_eval_probes.reproduce.cli",
    "sweep": "lm_eval_probes.sweep.cli",
}
"""The plugin's own subcommands (``lm-eval-probes report ...``); everything else goes to lm_eval's CLI."""


def attribute_docs(cls: type) -> dict[str, str]:
    """The ``Attributes:`` section of a dataclass's docstring as ``{field: text}`` (one entry may document
    several fields: ``top_p, top_k: ...``); whitespace collapsed."""
    lines = (cls.__doc__ or "").splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if line.strip() == "Attributes:"), len(lines))
    docs: dict[str, str] = {}
    names: list[str] = []
    indent = None
    for line in lines[start:]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        entry = re.match(r"^\s*(\w+(?:,\s*\w+)*):\s+(.*)$", line)
        if entry and (indent is None or depth == indent):
            indent = depth
            names = [n.strip() for n in entry.group(1).split(",")]
            for name in names:
                docs[name] = entry.group(2).strip()
        elif indent is not None and depth > indent:
            for name in names:
                docs[name] += " " + line.strip()
        else:
            break
    return docs


def option_summary(text: str) -> str:
    """A docstring entry shortened for ``--help``: the option's own name and Sphinx markup dropped, up to the
    first sentence end."""
    text = re.sub(r"\s*\(``(probe|diffusion)_\w+``\)", "", text)
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "")
    depth = 0
    for i, char in enumerate(text):
        depth += (char in "([") - (char in ")]")
        if depth == 0 and i >= 12 and char in ".;" and (i + 1 == len(text) or text[i + 1] == " ") \
                and not text[max(0, i - 4):i + 1].endswith(("e.g.", "i.e.")):
            return text[:i].strip()
    return text.strip()


def _table(rows: list[tuple[str, str]], width: int = 100) -> str:
    key_width = min(34, max(len(key) for key, _ in rows) + 2)
    out = []
    for key, text in rows:
        body = textwrap.wrap(text, width - key_width - 2, break_on_hyphens=False) or [""]
        first = f"  {key:<{key_width}}" if len(key) < key_width else f"  {key}\n  {'':<{key_width}}"
        out.append(first + body[0])
        out += [f"  {'':<{key_width}}{more}" for more in body[1:]]
    return "\n".join(out)


def plugin_help(tasks_dir: str) -> str:
    """The plugin's part of ``lm-eval-probes --help`` (printed before lm_eval's own): its subcommands, the two
    models, the probe ``model_args`` (generated from :class:`~lm_eval_probes.config.ProbeConfig`) and where the
    tasks are. Imports neither torch nor lm_eval."""
    from lm_eval_probes import registry
    from lm_eval_probes.config import ProbeConfig, default_probes
    from lm_eval_probes.models.diffusion_config import PREFIX, DiffusionConfig

    probes = [(f"probes={'+'.join(default_probes())}",
               f"which probes: {', '.join(registry.names())}, all or none; join several with + (or [a,b])")]
    options = [(f"{key}={shown}", f"{'' if probe is None else probe + ': '}{text}")
               for key, shown, text, probe in ProbeConfig.option_help()]
    diffusion = ", ".join(f"{PREFIX}{f.name}" for f in dataclasses.fields(DiffusionConfig))
    sections = [
        "lm-eval-probes: lm_eval with hidden-state probes (δ_TCB, BTE, a latent correctness reader, Ω, stability\n"
        "margins) and their calibration and difficulty rows reported next to each task's accuracy.",
        "commands:\n" + _table([
            ("run ...", "lm_eval run (the default command) with the plugin loaded and its tasks on the include "
                        "path, e.g. lm-eval-probes run --model hf-probes --model_args pretrained=MODEL,probes=tcb+bte "
                        "--tasks probes_synth_logic --limit 40 --device cpu"),
            ("sweep CONFIG.yaml", "models × tasks with one setup; resumable, sharded (--shard K/N); "
                                  "lm-eval-probes sweep --help shows a config"),
            ("report RUN_DIR... --out DIR", "the leaderboard (HTML, Markdown, CSV, plots, paired comparisons) "
                                            "from lm_eval output folders"),
            ("probe-run RUN --model_args ... --output_path DIR", "the probes added to a finished lm_eval run of any "
                                                                "backend (vllm, sglang, hf) from its --log_samples "
                                                                "files, one forward per document; lm-eval-probes "
                                                                "probe-run --help"),
            ("reproduce PROTOCOL ...", "a paper's headline results as one command (bte, calibration, omega, tcb, "
                                       "margins): claim | paper | this run [95 % CI] | agrees?; docs/reproduce.md"),
            ("ls tasks | validate ...", "lm_eval's own, with the plugin's tasks on the include path"),
            ("lm-eval-probes-demo", "(its own command) the bundled models on the synthetic tasks, then the "
                                    "leaderboard; what make demo runs"),
            ("--debug", "a bad probe, option, model folder or task name ends a run before torch loads, in one line "
                        "(exit 2), and Ctrl-C in one line (exit 130); --debug (or LM_EVAL_PROBES_DEBUG=1) shows "
                        "the traceback instead"),
        ]),
        "models (--model):\n" + _table([
            ("hf-probes", "lm_eval's hf (every hf model_arg: pretrained, dtype, gguf_file, parallelize, ...) "
                          "plus the probes below"),
            ("hf-probes-diffusion", f"masked-diffusion LMs (LLaDA, Dream): probes=reader and {PREFIX}* options"),
        ]),
        "probes (built-in and installed plugins, entry-point group lm_eval_probes.probes; each adds its rows to every "
        "task):\n" + _table([
            (probe.name, f"{probe.summary}. Rows: "
                         f"{', '.join(row.name for row in probe.rows + probe.difficulty_rows() + probe.feeds)}")
            for probe in registry.probes()
        ]),
        "probe model_args (--model_args pretrained=MODEL,probes=tcb+bte,probe_tcb_eps=0.5; key=default):\n"
        + _table(probes + options),
        "hf-probes-diffusion model_args (docs/diffusion.md):\n"
        + textwrap.fill(diffusion, 100, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False),
        f"tasks: the plugin's task YAMLs (probes_*) are in lm_eval_probes.TASKS_DIR = {tasks_dir}\n"
        "  (passed as --include_path unless you give one); list them with: lm-eval-probes ls tasks\n"
        "  Any lm_eval task gets the probe rows too: lm-eval-probes run --tasks arc_easy,gsm8k ...",
        "lm_eval's own commands and options follow (lm-eval-probes run --help for every run option).",
    ]
    return "\n\n".join(sections) + "\n" + "-" * 100 + "\n"


def main(argv: list[str] | None = None) -> None:
    """``lm-eval-probes``: the plugin's subcommands, else lm_eval's CLI after the preflight
    (:mod:`lm_eval_probes.cli.preflight`): a bad probe, option, model folder or task name ends here with one line on
    stderr and exit 2, before torch is imported. Ctrl-C ends with one line and exit 130 (a second one at once)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = wants_debug(args)
    if not args or args[0] not in ("sweep", "probe-run"):  # these read their own --debug
        args = [arg for arg in args if arg != DEBUG_FLAG]
    try:
        _dispatch(args, debug=debug)
    except KeyboardInterrupt:
        if debug:
            raise
        from lm_eval_probes.terminal.interrupt import stop_at_next_interrupt

        stop_at_next_interrupt()
        command = args[0] if args and args[0] in SUBCOMMANDS else "run"
        print(f"lm-eval-probes {command}: interrupted" + (" — lm_eval writes its results when a run finishes, so this "
              "run wrote none" if command == "run" else ""), file=sys.stderr)
        raise SystemExit(130) from None


def _dispatch(args: list[str], *, debug: bool) -> None:
    if not args or args[0] in ("-h", "--help"):
        import lm_eval_probes

        print(plugin_help(lm_eval_probes.tasks_dir()))
        sys.stdout.flush()
    if args and args[0] in SUBCOMMANDS:
        import importlib

        raise SystemExit(importlib.import_module(SUBCOMMANDS[args[0]]).main(args[1:]))

    import lm_eval_probes
    from lm_eval_probes.cli.preflight import PreflightError, preflight
    from lm_eval_probes.harness.pretrained import ModelNotFound
    from lm_eval_probes.harness.supported_versions import UnsupportedVersionError, check_supported_versions

    args = rewrite_argv(args, lm_eval_probes.tasks_dir())
    try:
        check_supported_versions()  # before lm_eval is imported: an unsupported one may fail at its import
        preflight(args, tasks_dir=lm_eval_probes.tasks_dir())  # before torch: one line, exit 2
    except (PreflightError, UnsupportedVersionError) as error:
        if debug:
            raise
        print(f"lm-eval-probes: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None

    from lm_eval.__main__ import cli_evaluate

    from lm_eval_probes.harness.registry import register_model_placeholder, register_rows
    from lm_eval_probes.tasks.manager import every_task_probed

    register_model_placeholder()
    register_rows()  # before any task is built

    sys.argv = ["lm-eval-probes", *args]
    try:
        with every_task_probed():
            cli_evaluate()
    except ModelNotFound as error:  # raised by the wrapper for what the preflight could not see
        if debug:
            raise
        print(f"lm-eval-probes: error: pretrained: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
