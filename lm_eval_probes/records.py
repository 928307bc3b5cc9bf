"""Small, picklable, JSON-native records that carry probe values from the model to ``process_results``.

``process_results(doc, results)`` sees neither the ``Instance`` nor the ``doc_id``, so the probe rides
*inside* the response objects: :class:`ProbeLL` (a ``(loglik, is_greedy)`` tuple) and :class:`ProbeStr`
(a generation string), each with a ``.probe`` attribute holding a :class:`ResponseProbe`. Both behave
exactly like the plain objects for every stock metric and filter, survive pickling (lm_eval's
cross-rank ``gather_object``), and lose the attribute only when stringified (``--log_samples``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ResponseProbe:
    """Probe values of one response, reduced over its response positions.

    Response positions are those whose next-token prediction scores a response token (teacher
    forcing): from the last prompt position to the position predicting the last response token.
    Fields are ``None`` when their probe is disabled and ``nan`` when undefined (empty response).

    Attributes:
        n_tokens: number of response tokens (= response positions).
        prompt_tokens: number of context tokens the model saw before the response (after any truncation).
        mean_token_logprob: mean natural-log probability of the response tokens (its exp is the
            geometric-mean token probability).
        tcb_log10_mean / tcb_log10_min: mean / minimum of log10 δ_TCB over positions.
        tcb_argmin: index (0-based, within the response) of the position with the smallest δ.
        entropy / logit_margin / v_eff_ipr / v_eff_exp: means over positions of the final distribution's
            entropy (nats), top-1 minus top-2 logit, 1/Σo², and exp(entropy).
        bte_profile: BTE depth profile e(l), l = 0..L-1 (mean JSD of layer l → l+1 over positions).
        bte_energy: mean of the profile over the central window (the difficulty scalar ē_M).
    """

    n_tokens: int
    mean_token_logprob: float
    prompt_tokens: int | None = None
    tcb_log10_mean: float | None = None
    tcb_log10_min: float | None = None
    tcb_argmin: int | None = None
    entropy: float | None = None
    logit_margin: float | None = None
    v_eff_ipr: float | None = None
    v_eff_exp: float | None = None
    bte_profile: tuple[float, ...] | None = None
    bte_energy: float | None = None

    @property
    def geometric_mean_probability(self) -> float:
        return math.exp(self.mean_token_logprob) if self.n_tokens else math.nan

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ProbeLL(tuple):
    """A loglikelihood response ``(loglik, is_greedy)`` that also carries ``.probe``."""

    probe: ResponseProbe | None

    def __new__(cls, answer: tuple[float, bool], probe: ResponseProbe | None = None) -> ProbeLL:
        obj = super().__new__(cls, answer)
        obj.probe = probe
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProbeLL, (tuple(self), self.probe))


class ProbeStr(str):
    """A generated string that also carries ``.probe``."""

    probe: ResponseProbe | None

    def __new__(cls, text: str, probe: ResponseProbe | None = None) -> ProbeStr:
        obj = super().__new__(cls, text)
        obj.probe = probe
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProbeStr, (str(self), self.probe))


def probe_of(response: Any) -> ResponseProbe | None:
    """The probe a response carries, or ``None`` (plain responses, e.g. from stock ``hf``)."""
    return getattr(response, "probe", None)


def with_probe(response: Any, probe: ResponseProbe | None) -> Any:
    """Re-attach ``probe`` to a (filtered) response; values of other types are returned unchanged."""
    if probe is None or probe_of(response) is probe:
        return response
    if isinstance(response, str):
        return ProbeStr(response, probe)
    if isinstance(response, tuple) and len(response) == 2:
        return ProbeLL(response, probe)
    return response
