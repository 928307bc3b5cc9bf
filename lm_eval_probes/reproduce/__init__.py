"""``lm-eval-probes reproduce PROTOCOL``: each paper's headline results as one command.

A protocol (:mod:`.protocol`) names the paper's model, the plugin's tasks that run its protocol and the claims
read from the run; :mod:`.runner` evaluates the tasks once through ``lm_eval`` with the plugin (the rows and
samples a user gets), :mod:`.statistics` reads each claim's number and its bootstrap CI from them (the report's
helpers), :mod:`.claims` decides agreement by the rule each claim states, :mod:`.tables` writes the table
(Markdown, JSON) and :mod:`.cli` is the command. Protocols: :mod:`.bte`, :mod:`.calibration`, :mod:`.omega`, :mod:`.tcb`
(:data:`.registry.PROTOCOLS`); :mod:`.margins` runs its training engine (:mod:`.margins_engine`, torch) or reads an
earlier run's report (:data:`.registry.ENGINE_PROTOCOLS`). docs/reproduce.md.
"""

from __future__ import annotations

from lm_eval_probes.reproduce.claims import Claim, Measurement
from lm_eval_probes.reproduce.cli import main, reproduce
from lm_eval_probes.reproduce.registry import ENGINE_PROTOCOLS, PROTOCOLS

__all__ = ["ENGINE_PROTOCOLS", "PROTOCOLS", "Claim", "Measurement", "main", "reproduce"]
