"""``lm-eval-probes``: the ``lm_eval`` command line with the plugin loaded and its tasks on the include path.

Takes every ``lm_eval`` argument. Differences from plain ``lm_eval``: the packaged task folder is passed
as ``--include_path`` unless you give one yourself (the flag takes a single folder; then name our tasks
by YAML path), ``--model_args ...,probes=tcb,bte`` keeps the comma-separated probe names together, and
every task gets the probe rows — stock tasks too (``lm-eval-probes run --tasks gsm8k,arc_easy``), with
their own prompts, filters and metrics.

Two subcommands of the plugin come first: ``lm-eval-probes sweep CONFIG.yaml`` (models × tasks, resumable,
sharded; :mod:`lm_eval_probes.sweep`) and ``lm-eval-probes report RUN_DIR... --out DIR`` (the leaderboard;
:mod:`lm_eval_probes.reports.report`).
"""

from __future__ import annotations

import sys

from lm_eval_probes.config import join_probe_names


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
    "report": "lm_eval_probes.reports.report",
    "sweep": "lm_eval_probes.sweep",
}
"""The plugin's own subcommands (``lm-eval-probes report ...``); everything else goes to lm_eval's CLI."""


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in SUBCOMMANDS:
        import importlib

        raise SystemExit(importlib.import_module(SUBCOMMANDS[args[0]]).main(args[1:]))
    from lm_eval.__main__ import cli_evaluate

    import lm_eval_probes
    from lm_eval_probes.integration import every_task_probed, register_model_placeholder, register_rows

    register_model_placeholder()
    register_rows()  # before any task is built

    args = rewrite_argv(args, lm_eval_probes.tasks_dir())
    sys.argv = ["lm-eval-probes", *args]
    with every_task_probed():
        cli_evaluate()


if __name__ == "__main__":
    main()
