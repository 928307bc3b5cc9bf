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


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _lm_eval_probes_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports, at any depth of its code (functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("lm_eval_probes"):
            subs = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            found |= subs if subs else {node.module}
    return found


def test_no_import_cycles_not_even_inside_functions():
    """Data flows one way: no module imports (at module level or inside a function) one that imports it back."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: _lm_eval_probes_imports(path, set(paths)) - {name} for name, path in paths.items()}
    assert "lm_eval_probes.harness.registry" in graph["lm_eval_probes.tasks.probe_task"]  # the graph sees imports
    assert "lm_eval_probes.tasks.probe_task" in graph["lm_eval_probes.harness.tasks"]
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph.get(name, ())):
            if state.get(other) == 1:
                raise AssertionError("import cycle: " + " → ".join(trail[trail.index(other):] + [name, other]))
            if other not in state:
                visit(other, trail + [name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_each_row_name_is_spelled_in_at_most_two_modules():
    """A row's name is written in its declaration and, at most, where its value is computed; everything else reads
    the declarations. Names that are also a probe's, a value kind's or a ProbeConfig option's are not counted."""
    import dataclasses
    import re

    from lm_eval_probes.config import ProbeConfig
    from lm_eval_probes.declarations import PROBE_NAMES, VALUE_KINDS
    from lm_eval_probes.rows import ROWS

    shared = set(PROBE_NAMES) | set(VALUE_KINDS) | {field.name for field in dataclasses.fields(ProbeConfig)}
    texts = {path: path.read_text() for path in PACKAGE.rglob("*.py")}
    for row in ROWS:
        if row.name in shared:
            continue
        spelled = [str(path.relative_to(PACKAGE)) for path, text in texts.items()
                   if re.search(rf"[\"']{re.escape(row.name)}[\"']", text)]
        assert len(spelled) <= 2, (row.name, spelled)
