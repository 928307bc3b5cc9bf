"""The supported lm-eval, transformers and torch releases (:mod:`lm_eval_probes.harness.supported_versions`): an older
one is refused in one line naming the installed release and the range, when a wrapper is built; one newer than the
newest run is admitted with one warning line; ``setup.cfg`` states the same floors and no cap. Installed versions are
monkeypatched: nothing is installed."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from lm_eval_probes.harness import supported_versions
from lm_eval_probes.harness.supported_versions import SUPPORTED, UnsupportedVersionError, check_supported_versions

IN_RANGE = {"lm-eval": "0.4.13", "transformers": "4.57.0", "torch": "2.13.0+cpu"}
NEWEST_RUN = {supported.distribution: supported.newest_run for supported in SUPPORTED}


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
    {"torch": "2.14.1+cu130"}, {"torch": "2.6.0"}, {"torch": "2.11.0+cu130", "transformers": "5.17.0"},
    {"torch": "2.13.0a0+nv26.07"}, {"torch": "2.11.0a0+a1b2c3d"}, {"torch": "2.15.0"},
])
def test_supported_stacks_pass_quietly(stack, caplog):
    with caplog.at_level("WARNING"):
        check_supported_versions(versions(**stack))
    assert not caplog.records


@pytest.mark.parametrize(("name", "version"), [("lm_eval", "0.4.14"), ("transformers", "5.26.0"),
                                               ("transformers", "6.0.0.dev0"), ("torch", "2.16.0+cu130"),
                                               ("torch", "3.0.0")])
def test_a_release_newer_than_the_newest_run_is_admitted_with_one_warning_line(name, version, caplog, monkeypatch):
    monkeypatch.setattr(supported_versions, "_WARNED", set())
    with caplog.at_level("WARNING"):
        check_supported_versions(versions(**{name: version}))
        check_supported_versions(versions(**{name: version}))  # once per process
    distribution = name.replace("_", "-")
    assert [r.getMessage() for r in caplog.records] == [
        f"lm-eval-probes has not been run with {distribution} {version} (the newest run: {NEWEST_RUN[distribution]}; "
        "docs/compat.md)"]


def test_no_published_release_is_capped():
    """No range ends below a release: the newest run is the newest published (``docs/compat.md``'s grid)."""
    for supported in SUPPORTED:
        assert not supported.requirement.count("<"), supported
    assert NEWEST_RUN == {"lm-eval": "0.4.13", "transformers": "5.25", "torch": "2.15"}


@pytest.mark.parametrize(("name", "version", "requirement"), [
    ("lm_eval", "0.4.9.2", "lm-eval>=0.4.10"),
    ("lm_eval", "0.4.9", "lm-eval>=0.4.10"),
    ("transformers", "4.56.2", "transformers>=4.57"),
    ("torch", "2.5.1", "torch>=2.6"),
    ("torch", "2.5.1+cu124", "torch>=2.6"),
    ("torch", "not-a-version", "torch>=2.6"),
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
                                "(supported: transformers>=4.57); torch is not installed (supported: torch>=2.6)")


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

    monkeypatch.setattr(supported_versions.metadata, "version", versions(torch="2.5.1"))
    with pytest.raises(UnsupportedVersionError, match=r"torch 2\.5\.1 is installed \(supported: torch>=2\.6\)$"):
        lm_eval_probes.register()


@pytest.mark.parametrize(("module", "wrapper"), [("lm_eval_probes.models.autoregressive", "ProbeHFLM"),
                                                  ("lm_eval_probes.models.diffusion", "DiffusionProbeHFLM")])
def test_building_a_wrapper_refuses_an_unsupported_stack_before_anything_loads(monkeypatch, tmp_path, module,
                                                                                wrapper):
    import importlib

    cls = getattr(importlib.import_module(module), wrapper)
    monkeypatch.setattr(supported_versions.metadata, "version", versions(transformers="4.56.2"))
    with pytest.raises(UnsupportedVersionError, match=r"transformers 4\.56\.2 is installed \(supported: "
                                                      r"transformers>=4\.57\)$"):
        cls(pretrained=str(tmp_path / "no-model-here"))


def test_lm_eval_probes_refuses_an_unsupported_stack_before_lm_eval_runs(run_cli, monkeypatch):
    monkeypatch.setattr(supported_versions.metadata, "version", versions(lm_eval="0.4.9"))
    code, out, err = run_cli("lm-eval-probes", ["--model", "hf-probes", "--model_args", "pretrained=/nowhere",
                                                "--tasks", "probes_synth_logic"])
    assert code == 2
    assert err == ("lm-eval-probes: error: lm-eval-probes does not support this stack: lm-eval 0.4.9 is installed "
                   "(supported: lm-eval>=0.4.10)\n")


@pytest.mark.parametrize(("torch_version", "transformers_version"), [("2.13.0a0+nv26.07", "5.17.0"),
                                                                      ("2.11.0+cu130", "4.57.6"), ("2.6.0", "5.25.0")])
def test_pip_keeps_an_installed_torch_and_transformers_in_range(tmp_path, torch_version, transformers_version):
    """pip, asked for the plugin's own requirements of torch and transformers in an environment that has a CUDA build
    or an NVIDIA pre-release installed, finds them satisfied and installs nothing (``--no-index``: it may not even
    look): what ``pip install .`` does with them beside an installed stack."""
    import subprocess
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for name, version in (("torch", torch_version), ("transformers", transformers_version)):
        info = Path(site) / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    requirements = [str(r) for r in map(Requirement, metadata.requires("lm-eval-probes"))
                    if r.name in ("torch", "transformers") and not r.marker]
    assert len(requirements) == 2
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                           "--dry-run", "--no-index", *requirements], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Would install" not in done.stdout
    for name, version in (("torch", torch_version), ("transformers", transformers_version)):
        assert f"Requirement already satisfied: {name}>=" in done.stdout, done.stdout
