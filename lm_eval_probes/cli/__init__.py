"""The command-line front: the demo (``lm-eval-probes-demo``, ``make demo``) and the console of the plugin's commands
(lm_eval's repeated notices folded, warnings naming the pair and row). ``lm-eval-probes`` itself is
:mod:`lm_eval_probes.__main__`; its ``sweep`` and ``report`` subcommands are :mod:`lm_eval_probes.sweep.cli` and
:mod:`lm_eval_probes.reports.report`."""
