"""What a reproduction is: the paper, its model, the tasks that run its protocol, and the claims read from the run."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from lm_eval_probes import registry
from lm_eval_probes.reproduce.claims import Claim
from lm_eval_probes.reproduce.runner import MODELS, ReproduceError
from lm_eval_probes.reproduce.statistics import Run


@dataclass(frozen=True)
class Variant:
    """One set of tasks that runs a protocol (the paper's, or a cheaper stand-in).

    Attributes:
        name: ``--variant`` value.
        tasks: the plugin's tasks evaluated, in the order the claims read them.
        filter_key: the lm_eval filter whose rows the claims read (``none`` for multiple choice and loglikelihood).
        description: one line for ``--help`` and the table's header.
    """

    name: str
    tasks: tuple[str, ...]
    filter_key: str
    description: str


MAIN = "main"
"""The name of a protocol's only pass (protocols whose claims read one evaluation)."""


@dataclass(frozen=True)
class ReproductionProtocol:
    """A paper's headline results as one command.

    Attributes:
        name: ``lm-eval-probes reproduce NAME``.
        summary: one line.
        pretrained: the paper's model per ``--model`` (a hub name; the default ``pretrained``).
        default_model: the ``--model`` the paper's own results come from.
        model_args: what the protocol needs from the model (its probes, options), merged into the user's.
        variants: the task sets, the first the paper's.
        claims: the claims read from the runs of a variant (``{pass name: Run}``).
        probe: the probe whose paper the protocol reproduces: :attr:`paper` is that probe's, read from the registry
            when asked for (``None``: a protocol of no one probe, whose source is ``citation``).
        citation: the source of a protocol of no one probe.
        passes: evaluations of the same tasks with different ``model_args`` (``{pass name: model_args}``, e.g. one
            per focal depth); one pass, :data:`MAIN`, by default.
    """

    name: str
    summary: str
    pretrained: Mapping[str, str]
    default_model: str
    model_args: Mapping[str, str]
    variants: tuple[Variant, ...]
    claims: Callable[[Mapping[str, Run], Variant], list[Claim]]
    probe: str | None = None
    citation: str = ""
    passes: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: {MAIN: {}})

    def __post_init__(self) -> None:
        if self.default_model not in self.pretrained or set(self.pretrained) - set(MODELS):
            raise ValueError(f"protocol {self.name!r}: pretrained must name models from {MODELS}, the default among them")
        if not self.variants or not self.passes:
            raise ValueError(f"protocol {self.name!r} needs at least one variant and one pass")
        if (self.probe is None) == (not self.citation):
            raise ValueError(f"protocol {self.name!r} needs either a probe (its paper is the source) or a citation, "
                             f"not both: probe={self.probe!r}, citation={self.citation!r}")

    @property
    def paper(self) -> str:
        """The source: the paper of :attr:`probe` as the registry has it now, else :attr:`citation`."""
        return registry.probe(self.probe).paper if self.probe is not None else self.citation

    def variant(self, name: str | None) -> Variant:
        """The variant called ``name`` (``None``: the paper's, the first).

        Raises:
            ReproduceError: an unknown name, with the valid ones.
        """
        if name is None:
            return self.variants[0]
        for variant in self.variants:
            if variant.name == name:
                return variant
        valid = [v.name for v in self.variants]
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ReproduceError(f"protocol {self.name!r} has no variant {name!r}.{hint} Valid: {', '.join(valid)}")

    def supports(self, model: str) -> bool:
        return model in self.pretrained
