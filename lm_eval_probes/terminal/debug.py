"""``--debug``: the traceback of an error the plugin reports in one line, and of a Ctrl-C."""

from __future__ import annotations

import os
from collections.abc import Mapping

DEBUG_FLAG = "--debug"
"""Shows the traceback of an error the plugin reports in one line, and of a Ctrl-C (also ``LM_EVAL_PROBES_DEBUG=1``)."""
DEBUG_VARIABLE = "LM_EVAL_PROBES_DEBUG"


def wants_debug(args: list[str], environ: Mapping[str, str] | None = None) -> bool:
    """``--debug`` among the arguments, or ``LM_EVAL_PROBES_DEBUG`` set to 1/true/yes/on."""
    env = os.environ if environ is None else environ
    return DEBUG_FLAG in args or str(env.get(DEBUG_VARIABLE, "")).strip().lower() in ("1", "true", "yes", "on")
