"""What the plugin's long-running commands share at the terminal, below every command that uses it: the console
while lm_eval runs (:mod:`~lm_eval_probes.terminal.console`), Ctrl-C as an answer
(:mod:`~lm_eval_probes.terminal.interrupt`) and the ``--debug`` switch (:mod:`~lm_eval_probes.terminal.debug`).
``sweep``, ``probe-run``, ``reproduce`` and the front ends (:mod:`lm_eval_probes.cli`, :mod:`lm_eval_probes.__main__`)
import it; it imports none of them."""
