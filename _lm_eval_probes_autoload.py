"""Registers a lazy ``hf-probes`` placeholder in lm_eval's model registry at interpreter start.

Imported by ``lm_eval_probes.pth`` from site-packages. It must stay tiny: no torch, no
``lm_eval_probes`` import (that happens on the first ``get_model("hf-probes")``). Any failure is
swallowed so that a broken environment never breaks an unrelated Python start-up.
"""


def _register() -> None:
    import importlib.util

    if importlib.util.find_spec("lm_eval") is None:
        return
    import lm_eval.models  # noqa: F401  (built-in placeholders first; see lm-eval-integration notes)
    from lm_eval.api.registry import model_registry

    if "hf-probes" not in model_registry:
        model_registry.register("hf-probes", target="lm_eval_probes.models:ProbeHFLM")


try:
    _register()
except Exception:  # pragma: no cover - never break interpreter start-up
    pass
