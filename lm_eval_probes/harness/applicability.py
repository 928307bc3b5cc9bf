"""Which enabled probes apply to the model: ``probes=all`` skips the others, a probe named explicitly refuses.

Two checks, both generic (no probe is named here): before any weight loads, each enabled probe's own
:attr:`~lm_eval_probes.api.Probe.applies` on the model's config; once the model is loaded, each whole-forward capture a
probe asked for (its set-up and load-time self-check raise
:class:`~lm_eval_probes.capture.parts.UnsupportedModelError`: :meth:`~lm_eval_probes.capture.plan.ProbePlan.set_up`). A skipped probe is logged in one line and listed in
the results' config as ``probes_skipped`` (probe → reason), which the report shows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lm_eval_probes import registry
from lm_eval_probes.capture.plan import ProbePlan
from lm_eval_probes.config import ProbeConfig

__all__ = ["SkippedProbes", "model_config", "not_applying"]


def model_config(pretrained: Any, hf_args: Mapping[str, Any]) -> Any:
    """The model's config, read as HFLM reads it (``AutoConfig`` with the same ``revision``, ``trust_remote_code``,
    ``gguf_file`` and ``subfolder``; a model object's own), before HFLM loads any weight."""
    if not isinstance(pretrained, str):
        return pretrained.config
    import transformers

    return transformers.AutoConfig.from_pretrained(
        pretrained, revision=str(hf_args.get("revision", "main")), trust_remote_code=hf_args.get("trust_remote_code", False),
        gguf_file=hf_args.get("gguf_file"), subfolder=hf_args.get("subfolder") or "",
    )


def not_applying(config: ProbeConfig, model: Callable[[], Any]) -> dict[str, str]:
    """Enabled probe → why it cannot run on a model of config ``model()`` (its
    :meth:`~lm_eval_probes.api.Probe.unsupported`; the config is read only when an enabled probe declares a check)."""
    probes = [registry.probe(name) for name in config.probes]
    if not any(probe.applies is not None for probe in probes):
        return {}
    read = model()
    reasons = {probe.name: probe.unsupported(read) for probe in probes}
    return {name: reason for name, reason in reasons.items() if reason}


class SkippedProbes:
    """Mixed into both wrappers (before ``HFLM``): their :class:`~lm_eval_probes.capture.plan.ProbePlan` (``plan``, set
    in ``__init__``) read as ``probe_config`` and ``probes_skipped`` (probe → why it cannot run on this model), which
    joins HFLM's ``get_model_info``, which lm_eval writes into the results' config; for a looped model (a block run
    more than once) ``probe_layers`` too: the name of each ``hidden_states`` index, by block and pass (``block 1,
    pass 2``), which the per-layer values (BTE's profile, Ω's trajectory) follow."""

    plan: ProbePlan

    @property
    def probe_config(self) -> ProbeConfig:
        """The enabled probes (those skipped on this model taken out) and their options."""
        return self.plan.config

    @property
    def probes_skipped(self) -> dict[str, str]:
        return dict(self.plan.skipped)

    def get_model_info(self) -> dict[str, Any]:
        info = {**super().get_model_info(), "probes_skipped": self.probes_skipped}  # type: ignore[misc]
        readout = getattr(self, "readout", None)
        if getattr(readout, "looped", False):  # a looped model: each layer of the per-layer values named by its pass
            info["probe_layers"] = readout.layer_names()
        return info
