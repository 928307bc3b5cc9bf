"""The stability margins and support tokens: :mod:`.probe`, the built-in probe's declaration (options, position
probe, rows, memory: the public API of :mod:`lm_eval_probes.api` only, as a third-party probe is written), and
:mod:`.math`, its math on tensors. Importing the package imports neither; a name of :mod:`.math` read from here loads it
(``lm_eval_probes.probes.margin.X`` is ``lm_eval_probes.probes.margin.math.X``)."""

from __future__ import annotations

from .._lazy import forwarded

__getattr__, __dir__ = forwarded(__name__, "math")
