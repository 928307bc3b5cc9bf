"""Import direction and installed layout."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import lm_eval_probes

PACKAGE = Path(lm_eval_probes.__file__).parent


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_probes_import_nothing_above_them():
    allowed = {"__future__", "math", "dataclasses", "typing", "collections", "torch", "numpy", "scipy", "sklearn",
               "difflib", "warnings", "operator", "threadpoolctl", "importlib"}
    for path in (PACKAGE / "probes").glob("*.py"):
        extra = imported_modules(path) - allowed
        assert not extra, f"{path.name} imports {extra}"


def test_no_generic_top_level_packages_installed():
    for generic in ("metrics", "tasks", "probes"):
        spec = importlib.util.find_spec(generic)
        assert spec is None or "lm_eval_probes" not in str(spec.origin), generic
    assert importlib.util.find_spec("lm_eval_probes.metrics") is not None
    assert (Path(lm_eval_probes.TASKS_DIR) / "probes_synth_logic.yaml").is_file()


def test_importing_the_package_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, lm_eval_probes; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_probes_package_has_no_side_effects():
    """``import lm_eval_probes.probes`` loads nothing heavy; the numpy modules need neither torch nor lm_eval."""
    import subprocess
    import sys

    code = (  # the .pth autoload of a regular install may already have imported lm_eval: compare before/after
        "import sys; before = set(sys.modules); import lm_eval_probes.probes as p, lm_eval_probes.probes.calibration, "
        "lm_eval_probes.probes.reader, lm_eval_probes.probes.correlation, lm_eval_probes.metrics, lm_eval_probes.rows; "
        "p.spearman_score; new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(new & {'torch', 'lm_eval', 'transformers'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr
