"""The supported lm-eval, transformers and torch releases (:mod:`lm_eval_probes.harness.supported_versions`): others
are refused in one line naming the installed release and the range, when a wrapper is built; ``setup.cfg`` states the
same ranges. Installed versions are monkeypatched: nothing is installed."""

from __future__ import annotations

from importlib import metadata

import pytest
from packaging.requirements import Requirement

from lm_eval_probes.harness import supported_versions
from lm_eval_probes.harness.supported_versions import SUPPORTED, UnsupportedVersionError, check_supported_versions

IN_RANGE = {"lm-eval": "0.4.13", "transformers": "4.57.0", "torch": "2.13.0+cpu"}


def versions(**changed: str | None):
    """``importlib.metadata.version`` of a stack: IN_RANGE with ``changed`` (underscores for dashes; ``None``: not
    installed)."""
    table = {**IN_RANGE, **{name.replace("_", "-"): value for name, value in changed.items()}}

    def version(name: str) -> str:
        if table.get(name) is None:
            raise metadata.PackageNotFoundError(name)
        return table[name]

    return version


@pytest.mark.parametrize("stack", [
    {}, {"lm_eval": "0.4.10"}, {"lm_eval": "0.4.12"}, {"lm_eval": "0.4.10", "transformers": "5.25.0"},
    {"transformers": "4.57.6"}, {"lm_eval": "0.4.13", "transformers": "5.0.0rc1"}, {"torch": "2.14.1"},
    {"torch": "2.14.1+cu130"},
])
def test_supported_stacks_pass(stack):
    check_supported_versions(versions(**stack))


@pytest.mark.parametrize(("name", "version", "requirement"), [
    ("lm_eval", "0.4.9.2", "lm-eval>=0.4.10,<0.4.14"),
    ("lm_eval", "0.4.14", "lm-eval>=0.4.10,<0.4.14"),
    ("transformers", "4.56.2", "transformers>=4.57,<5.26"),
    ("transformers", "5.26.0", "transformers>=4.57,<5.26"),
    ("torch", "2.12.1", "torch>=2.13,<2.15"),
    ("torch", "2.15.0+cpu", "torch>=2.13,<2.15"),
    ("torch", "not-a-version", "torch>=2.13,<2.15"),
])
def test_an_unsupported_release_is_refused_in_one_line_naming_it_and_the_range(name, version, requirement):
    with pytest.raises(UnsupportedVersionError) as error:
        check_supported_versions(versions(**{name: version}))
    message = str(error.value)
    assert message == (f"lm-eval-probes does not support this stack: {name.replace('_', '-')} {version} is installed "
                       f"(supported: {requirement})")
    assert "\n" not in message


def test_every_release_outside_its_range_is_named_and_a_missing_one_too():
    with pytest.raises(UnsupportedVersionError) as error:
        check_supported_versions(versions(transformers="4.48.0", torch=None))
    assert str(error.value) == ("lm-eval-probes does not support this stack: transformers 4.48.0 is installed "
                                "(supported: transformers>=4.57,<5.26); torch is not installed "
                                "(supported: torch>=2.13,<2.15)")


def test_the_installed_stack_is_supported():
    check_supported_versions()


def test_setup_cfg_states_the_same_ranges():
    """The installed distribution's requirements (``setup.cfg``'s ``install_requires``) hold each range exactly."""
    stated = {(r.name, r.specifier) for r in map(Requirement, metadata.requires("lm-eval-probes")) if not r.marker}
    for supported in SUPPORTED:
        wanted = Requirement(supported.requirement)
        assert [spec for name, spec in stated if name == supported.distribution] == [wanted.specifier], supported


def test_registering_the_models_refuses_an_unsupported_stack(monkeypatch):
    import lm_eval_probes

    monkeypatch.setattr(supported_versions.metadata, "version", versions(torch="2.12.1"))
    with pytest.raises(UnsupportedVersionError, match=r"torch 2\.12\.1 is installed \(supported: torch>=2\.13,<2\.15\)$"):
        lm_eval_probes.register()


@pytest.mark.parametrize(("module", "wrapper"), [("lm_eval_probes.models.autoregressive", "ProbeHFLM"),
                                                  ("lm_eval_probes.models.diffusion", "DiffusionProbeHFLM")])
def test_building_a_wrapper_refuses_an_unsupported_stack_before_anything_loads(monkeypatch, tmp_path, module,
                                                                                wrapper):
    import importlib

    cls = getattr(importlib.import_module(module), wrapper)
    monkeypatch.setattr(supported_versions.metadata, "version", versions(transformers="4.56.2"))
    with pytest.raises(UnsupportedVersionError, match=r"transformers 4\.56\.2 is installed \(supported: "
                                                      r"transformers>=4\.57,<5\.26\)$"):
        cls(pretrained=str(tmp_path / "no-model-here"))


def test_lm_eval_probes_refuses_an_unsupported_stack_before_lm_eval_runs(run_cli, monkeypatch):
    monkeypatch.setattr(supported_versions.metadata, "version", versions(lm_eval="0.4.9"))
    code, out, err = run_cli("lm-eval-probes", ["--model", "hf-probes", "--model_args", "pretrained=/nowhere",
                                                "--tasks", "probes_synth_logic"])
    assert code == 2
    assert err == ("lm-eval-probes: error: lm-eval-probes does not support this stack: lm-eval 0.4.9 is installed "
                   "(supported: lm-eval>=0.4.10,<0.4.14)\n")
