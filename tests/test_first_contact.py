"""First contact: what ``lm-eval-probes --help`` shows, the entry points a newer lm_eval discovers, and the
console hygiene of the sweep and demo CLIs (folded lm_eval notices, warnings that name the row, the ETA)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import sys

import pytest

import lm_eval_probes
from lm_eval_probes.__main__ import attribute_docs, main, option_summary, option_table, plugin_help
from lm_eval_probes.config import ProbeConfig
from lm_eval_probes.diffusion_config import DiffusionConfig
from lm_eval_probes.integration import DIFFUSION_MODEL_NAME, DIFFUSION_MODEL_TARGET, MODEL_NAME, MODEL_TARGET

# ----------------------------------------------------------------------------------------- --help


def test_help_presents_the_plugin_before_lm_evals_options(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lm-eval-probes", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code in (0, None)
    out = capsys.readouterr().out
    lm_eval_part = out.index("Language Model Evaluation Harness")  # lm_eval's own help still follows
    plugin = out[:lm_eval_part]
    for text in ("sweep CONFIG.yaml", "report RUN_DIR", "ls tasks", "validate", "run ...",
                 "hf-probes ", "hf-probes-diffusion", lm_eval_probes.TASKS_DIR, "lm_eval_probes.TASKS_DIR",
                 "probes=tcb+bte+reader", "diffusion_steps"):
        assert text in plugin, text
    for field in dataclasses.fields(ProbeConfig):
        if field.name != "probes":
            assert f"probe_{field.name}=" in plugin, field.name


def test_no_arguments_show_the_same_help(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lm-eval-probes"])
    try:
        main([])
    except SystemExit:  # lm_eval prints its help and returns without arguments
        pass
    assert "sweep CONFIG.yaml" in capsys.readouterr().out


def test_probe_options_come_from_the_config_declaration():
    rows = dict(option_table(ProbeConfig, "probe_", skip=("probes",)))
    declared = [f for f in dataclasses.fields(ProbeConfig) if f.name != "probes"]
    assert [key.split("=")[0] for key in rows] == [f"probe_{f.name}" for f in declared]
    assert all(summary for summary in rows.values()), "every option needs a docstring entry"
    assert rows["probe_tcb_eps=1.0"].startswith("tolerance ε of δ_TCB")
    assert "probe_omega_depth=auto" in rows  # None: resolved per model
    assert "probe_bte_features=0" in rows
    assert set(attribute_docs(DiffusionConfig)) >= {f.name for f in dataclasses.fields(DiffusionConfig)}


def test_option_summary_cuts_at_the_first_sentence_outside_parentheses():
    text = "the last positions kept (float16; float32 where needed, e.g. Gemma's) (``probe_reader_tail``); more. Else"
    assert option_summary(text) == "the last positions kept (float16; float32 where needed, e.g. Gemma's)"
    assert option_summary("K of Ω's confidence (``probe_omega_topk``), K >= 1.") == "K of Ω's confidence, K >= 1"
    assert option_summary("see :mod:`lm_eval_probes.probes.bte` for ``x``") == "see lm_eval_probes.probes.bte for x"


def test_plugin_help_imports_neither_torch_nor_lm_eval():
    import subprocess

    code = ("import sys; from lm_eval_probes.__main__ import plugin_help; plugin_help('/t'); "
            "print(sorted(m for m in ('torch', 'lm_eval') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": ":".join(p for p in sys.path if p)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ----------------------------------------------------------------------------------------- entry points


def test_the_installed_distribution_declares_lm_evals_model_entry_points():
    """lm_eval's plugin discovery (main branch after 0.4.13, ``registry.load_plugins``) registers each
    ``lm_eval.models`` entry point as a lazy placeholder; the class's ``@register_model`` then upgrades it
    only when the entry point's value is the class's own ``module:name``."""
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group="lm_eval.models")
             if ep.dist is not None and ep.dist.name == "lm-eval-probes"}
    assert set(found) == {MODEL_NAME, DIFFUSION_MODEL_NAME}
    for name, target in ((MODEL_NAME, MODEL_TARGET), (DIFFUSION_MODEL_NAME, DIFFUSION_MODEL_TARGET)):
        assert found[name].value == target  # the same class the .pth placeholder names (0.4.13)
        cls = found[name].load()
        assert f"{cls.__module__}:{cls.__name__}" == found[name].value

    from lm_eval.api.model import LM
    from lm_eval.api.registry import get_model

    from lm_eval_probes.diffusion_model import DiffusionProbeHFLM
    from lm_eval_probes.models import ProbeHFLM

    assert found[MODEL_NAME].load() is ProbeHFLM and issubclass(ProbeHFLM, LM)
    assert found[DIFFUSION_MODEL_NAME].load() is DiffusionProbeHFLM
    assert get_model(MODEL_NAME) is ProbeHFLM  # and the registry (0.4.13: through the .pth) agrees
    assert get_model(DIFFUSION_MODEL_NAME) is DiffusionProbeHFLM
