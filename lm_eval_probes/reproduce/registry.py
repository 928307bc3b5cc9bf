"""The reproductions ``lm-eval-probes reproduce`` knows."""

from __future__ import annotations

import difflib

from lm_eval_probes.reproduce import bte, calibration, omega, tcb
from lm_eval_probes.reproduce.protocol import ReproductionProtocol
from lm_eval_probes.reproduce.runner import ReproduceError

PROTOCOLS: dict[str, ReproductionProtocol] = {protocol.name: protocol for protocol in (bte.PROTOCOL, calibration.PROTOCOL, omega.PROTOCOL, tcb.PROTOCOL)}
"""Implemented protocols by name."""

ENGINE_PROTOCOLS: dict[str, str] = {
    "margins": "the log-barrier experiment of the support-token paper: trains character-level GPTs with its engine "
               "(--data FILE or --quick; --lambdas, --sigmas, --seeds, --steps) or reads an earlier run's report "
               "(--engine_output DIR)",
}
"""Protocols whose numbers come from an engine other than lm_eval (they train models): run here or read from a
report the engine wrote."""


def protocol(name: str) -> ReproductionProtocol:
    """The protocol called ``name``.

    Raises:
        ReproduceError: an engine protocol (it runs its own engine, not lm_eval) or an unknown name, with the valid
            ones.
    """
    if name in PROTOCOLS:
        return PROTOCOLS[name]
    if name in ENGINE_PROTOCOLS:
        raise ReproduceError(f"protocol {name!r} is {ENGINE_PROTOCOLS[name]}: it does not run through lm_eval")
    close = difflib.get_close_matches(name, list(PROTOCOLS) + list(ENGINE_PROTOCOLS), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ReproduceError(f"unknown protocol {name!r}.{hint} Available: {', '.join([*PROTOCOLS, *ENGINE_PROTOCOLS])}")
