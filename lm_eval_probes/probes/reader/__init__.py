"""The latent correctness reader and the corruption detector: :mod:`.probe`, the built-in probe's declaration (options, position
probe, rows, memory: the public API of :mod:`lm_eval_probes.api` only, as a third-party probe is written), and
:mod:`.math`, its math on tensors. Importing the package imports neither; a name of :mod:`.math` read from here loads it
(``lm_eval_probes.probes.reader.X`` is ``lm_eval_probes.probes.reader.math.X``)."""

from __future__ import annotations

from .._lazy import forwarded

__getattr__, __dir__ = forwarded(__name__, "math")
