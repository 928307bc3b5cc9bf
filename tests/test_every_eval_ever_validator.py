"""every-eval-ever's own validator on the report's export: ``every_eval_ever validate`` (its Pydantic models and
datastore checks) and ``every_eval_ever check-duplicates``, from the 0.3.0 package installed in a throwaway virtual
environment of a Python >= 3.12 found on this machine (the package needs it; the project does not), on a report of
two tiny random models × two tasks (multiple choice and generation) with every probe.

The environment is built once per machine from the package index and kept in the user's cache (:mod:`cached_envs`).
"""

from __future__ import annotations

import glob
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cached_envs import cached_venv
from loader_fixtures import write_data_dir
from lm_eval_probes.reports import build_report
from lm_eval_probes.reports.every_eval_ever import FOLDER
from test_report import ALL_PROBES, record_run

PACKAGE = "every-eval-ever==0.3.0"
MINIMUM = (3, 12)
TASKS = ["probes_synth_logic", "probes_synth_arith_gen"]  # multiple choice, generation
DEVELOPER = "lm-eval-probes-tests"


def version_of(python: str) -> tuple[int, int] | None:
    """``(major, minor)`` of an interpreter, ``None`` when it does not run."""
    try:
        done = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    parts = done.stdout.split()
    return (int(parts[0]), int(parts[1])) if done.returncode == 0 and len(parts) == 2 else None


def find_python() -> str | None:
    """An interpreter >= 3.12: this one, a ``python3.1x`` on the PATH, or one of pyenv's (``~/.pyenv/versions``)."""
    candidates = [sys.executable, *(shutil.which(f"python3.{minor}") for minor in range(20, MINIMUM[1] - 1, -1)),
                  *sorted(glob.glob(str(Path.home() / ".pyenv" / "versions" / "*" / "bin" / "python3")), reverse=True)]
    for python in candidates:
        if python and (version := version_of(python)) is not None and version >= MINIMUM:
            return python
    return None


@pytest.fixture(scope="module")
def validator() -> Path:
    """The ``every_eval_ever`` command of the cached environment with the package installed."""
    python = find_python()
    if python is None:
        pytest.skip(f"no Python >= {MINIMUM[0]}.{MINIMUM[1]} on this machine (tried {sys.executable}, python3.1x on the "
                    f"PATH and ~/.pyenv/versions): {PACKAGE} needs one")
    major, minor = version_of(python)
    venv = cached_venv(f"{PACKAGE.replace('==', '-')}-py{major}.{minor}", python, [[PACKAGE]]).parent.parent
    return venv / "bin" / "every_eval_ever"


@pytest.fixture(scope="module")
def export(tiny_model_dir, tmp_path_factory) -> Path:
    """The report's ``every_eval_ever`` folder: llama and qwen2 (tiny, random) on one multiple-choice and one generation
    task, every probe (the BTE profile in full, the δ_TCB ablation on). The models are loaded as
    ``pretrained=<developer>/<model>`` (a folder of that relative path, as a Hub id reads), so that their records name
    the datastore directory they are filed in: an absolute path names no developer, which the validator warns about."""
    root = tmp_path_factory.mktemp("eee-runs")
    data = write_data_dir(root / "data")
    probe_args = {**ALL_PROBES, "probe_tcb_ablation": "0.5"}
    runs = []
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        for arch in ("llama", "qwen2"):
            model = Path(DEVELOPER, f"tiny-{arch}")
            shutil.copytree(tiny_model_dir(arch), root / model)
            runs.append(record_run(model.as_posix(), TASKS, root / arch, data, **probe_args))
    out = tmp_path_factory.mktemp("eee-report")
    build_report(runs, out, n_resamples=50, seed=0, plots=False)
    return out / FOLDER


def test_every_file_passes_the_packages_validator_and_check_duplicates(validator, export):
    aggregates = sorted(export.rglob("*.json"))
    instances = sorted(export.rglob("*_samples.jsonl"))
    assert len(aggregates) == 4 and len(instances) == 4, (aggregates, instances)
    assert {path.parent.parent.name for path in aggregates} == {DEVELOPER}
    for record in (json.loads(path.read_text()) for path in aggregates):  # what the validator is asked about
        for result in record["evaluation_results"]:
            config = result["metric_config"]
            assert config["min_score"] is not None and config["max_score"] is not None, config["metric_name"]
    validated = subprocess.run([str(validator), "validate", "--format", "json", *map(str, aggregates + instances)],
                               capture_output=True, text=True, cwd=export, timeout=600)
    assert validated.returncode == 0, f"every_eval_ever validate (0 clean, 1 errors, 2 warnings only): " \
                                      f"{validated.returncode}\n{validated.stdout[-6000:]}\n{validated.stderr[-3000:]}"
    reports = json.loads(validated.stdout)
    assert len(reports) == 8 and all(r["valid"] and not r["errors"] and not r["warnings"] for r in reports), reports
    duplicates = subprocess.run([str(validator), "check-duplicates", str(export)], capture_output=True, text=True,
                                timeout=600)
    assert duplicates.returncode == 0, f"every_eval_ever check-duplicates: {duplicates.returncode}\n" \
                                       f"{duplicates.stdout[-6000:]}\n{duplicates.stderr[-3000:]}"
    assert "Checking 4 JSON files" in duplicates.stdout and "No duplicates found." in duplicates.stdout, duplicates.stdout


def test_every_score_lies_within_its_declared_bounds(export):
    """The validator only warns about a score outside its bounds; here it is an error of the declaration."""
    checked = 0
    for path in export.rglob("*.json"):
        for result in json.loads(path.read_text())["evaluation_results"]:
            config, score = result["metric_config"], result["score_details"]["score"]
            low, high = (float(b) if isinstance(b, str) else b for b in (config["min_score"], config["max_score"]))
            assert low <= score <= high and math.isfinite(score), (path.name, config["metric_name"], low, score, high)
            checked += 1
    assert checked >= 4 * 20
