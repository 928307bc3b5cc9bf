"""Registers the lazy ``hf-probes`` placeholder in lm_eval's model registry at interpreter start.

Imported by ``lm_eval_probes.pth`` from site-packages (lm_eval 0.4.13 has no plugin discovery). The
work is :func:`lm_eval_probes.harness.registry.register_model_placeholder`, which imports no torch. Any
failure is swallowed so that a broken environment never breaks an unrelated Python start-up.
"""


def _register() -> None:
    import importlib.util

    if importlib.util.find_spec("lm_eval") is None:
        return
    from lm_eval_probes.harness.registry import register_model_placeholder

    register_model_placeholder()


try:
    _register()
except Exception:  # pragma: no cover - never break interpreter start-up
    pass
