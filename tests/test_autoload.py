"""Nothing at Python start: the ``.pth`` of a regular install puts a finder on ``sys.meta_path`` and imports nothing;
``hf-probes`` and ``hf-probes-diffusion`` are registered when lm_eval's registry is first imported; an lm_eval that
discovers the ``lm_eval.models`` entry points itself is left to do it. (The plain ``lm_eval --model hf-probes`` run
through that path is ``test_cli.py``'s.)"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types

import pytest

needs_regular_install = pytest.mark.skipif(
    importlib.util.find_spec("_lm_eval_probes_autoload") is None,
    reason="the .pth comes with a regular (non-editable) install; `make test` does one",
)


def imported_at(code: str) -> tuple[set[str], str]:
    """The modules a fresh interpreter of this environment imports for ``code`` (``-X importtime``) and its stdout."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    modules = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return modules, proc.stdout


@needs_regular_install
def test_python_start_imports_neither_lm_eval_nor_torch():
    modules, out = imported_at("import sys; print([type(f).__name__ for f in sys.meta_path])")
    assert "_lm_eval_probes_autoload" in modules  # the .pth ran
    heavy = {m for m in modules if m.split(".")[0] in ("lm_eval", "lm_eval_probes", "torch", "transformers", "numpy")}
    assert not heavy, sorted(heavy)
    assert "RegisterOnRegistryImport" in out


@needs_regular_install
def test_importing_lm_evals_registry_registers_the_models():
    code = ("import sys\nimport lm_eval.api.registry as registry\n"
            "targets = {n: str(registry.model_registry._objs[n]) for n in ('hf', 'hf-probes', 'hf-probes-diffusion')}\n"
            "print(targets)\n"
            "print([type(f).__name__ for f in sys.meta_path])\n")
    modules, out = imported_at(code)
    targets, finders = out.splitlines()
    assert "lm_eval_probes.models.autoregressive:ProbeHFLM" in targets
    assert "lm_eval_probes.models.diffusion:DiffusionProbeHFLM" in targets
    assert "lm_eval.models.huggingface:HFLM" in targets  # lm_eval's own placeholders first: none hidden
    assert "RegisterOnRegistryImport" not in finders  # one registration, then the finder leaves
    assert "torch" not in modules and "lm_eval_probes.models.autoregressive" not in modules  # still lazy


def test_an_lm_eval_that_discovers_entry_points_is_left_alone(monkeypatch):
    autoload = pytest.importorskip("_lm_eval_probes_autoload")
    from lm_eval_probes.harness import registry

    calls: list[str] = []
    monkeypatch.setattr(registry, "register_model_placeholder", lambda: calls.append("registered"))
    autoload._register(types.SimpleNamespace(load_plugins=lambda group, registry: []))  # lm_eval's discovery
    assert calls == []
    autoload._register(types.SimpleNamespace())  # lm_eval 0.4.13
    assert calls == ["registered"]


def test_the_finder_answers_only_for_the_registry(monkeypatch):
    autoload = pytest.importorskip("_lm_eval_probes_autoload")

    finder = autoload.RegisterOnRegistryImport()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    assert finder.find_spec("json") is None and finder in sys.meta_path
    import lm_eval.api

    spec = finder.find_spec("lm_eval.api.registry", lm_eval.api.__path__)
    assert spec is not None and spec.origin.endswith("lm_eval/api/registry.py")
    assert type(spec.loader).__name__ == "_RegisteringLoader" and spec.loader.get_source("lm_eval.api.registry")
    assert finder not in sys.meta_path
