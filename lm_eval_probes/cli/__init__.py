"""The command-line front: the demo (``lm-eval-probes-demo``, ``make demo``) and the preflight of ``lm-eval-probes
run``. ``lm-eval-probes`` itself is :mod:`lm_eval_probes.__main__`; its ``sweep``, ``probe-run`` and ``report``
subcommands are :mod:`lm_eval_probes.sweep.cli`, :mod:`lm_eval_probes.probe_run.cli` and
:mod:`lm_eval_probes.reports.report`. The console and Ctrl-C handling they share live below them, in
:mod:`lm_eval_probes.terminal`."""
