"""``hnorm``: the mean L2 norm of the last hidden state over a response's positions — an example probe plugin.

Written with the public API of :mod:`lm_eval_probes.api` only, and registered through the entry-point group
``lm_eval_probes.probes`` (``pyproject.toml``), as any third-party probe is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lm_eval_probes.api import NON_NEGATIVE, Probe, ProbeOptions, Row, Shapes, option


@dataclass(frozen=True)
class HnormOptions(ProbeOptions):
    """``probe_hnorm_<option>`` in ``model_args``."""

    ord: float = option(2.0, "the norm's order p of ‖h‖_p (2: Euclidean)")

    def __post_init__(self) -> None:
        if not self.ord >= 1:
            raise ValueError(f"probe_hnorm_ord must be >= 1 (a norm), got {self.ord!r}")


class HnormPositions:
    """Per response position the p-norm of the last hidden state (``hidden_states[-1]``: after the final norm); per
    response their mean."""

    reads_lens = False  # it reads states only: every answered request keeps it, also an option not chosen
    position_axis = 0

    def __init__(self, options: HnormOptions, num_layers: int) -> None:
        self.order = options.ord
        self.last = num_layers  # hidden_states has L + 1 entries: 0 = embeddings … L = the last

    def layers(self) -> frozenset[int]:
        return frozenset({self.last})

    def at_positions(self, chunk: Any) -> dict[str, Any]:
        """``norm [n]``: ‖h_t‖_p of each position's last hidden state (float64)."""
        return {"norm": chunk.states(self.last).double().norm(p=self.order, dim=-1).cpu()}

    def reduce(self, values: Mapping[str, Any], *, positions: int, generation: bool) -> dict[str, Any]:
        """``hnorm``: the mean of the norms over the response's positions (``nan`` without positions)."""
        return {"hnorm": float(values["norm"].mean()) if positions else math.nan}


def hnorm_memory(options: HnormOptions, shapes: Shapes) -> float:
    """One float64 norm per response position and a float64 copy of a chunk's states."""
    return shapes.batch * shapes.response_tokens * 8 + shapes.lens_positions * shapes.width * 8


@dataclass(frozen=True)
class HnormRecord:
    """``hnorm``'s value of one response (what a :class:`~lm_eval_probes.records.ResponseProbe` carries under
    ``"hnorm"``; ``None``: not computed)."""

    hnorm: float | None = None


PROBE = Probe(
    name="hnorm",
    summary="mean L2 norm of the last hidden state over the response positions (an example plugin)",
    record=HnormRecord,
    rows=(Row("hnorm", "float", "mean", True, "probe",
              "mean over documents of the mean L2 norm of the last hidden state over the response positions",
              "hnorm", scored=False, bounds=NON_NEGATIVE),),  # a norm: 0 or more
    position_probe=HnormPositions,
    options=HnormOptions,
    memory=hnorm_memory,
    formula="‖h_t^(L)‖_2 per response position t (hidden_states[-1], after the final norm); per document the mean",
    reads="the last hidden state at every response position",
    label="mean ‖h‖₂",
)
