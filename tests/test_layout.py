"""Import direction and installed layout."""

from __future__ import annotations

import ast
import re
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
    """The probes' math imports the scientific stack and, of the package, only ``lm_eval_probes.stack_api`` (the
    release differences of torch's products, in the same lowest layer)."""
    allowed = {"__future__", "math", "dataclasses", "typing", "collections", "torch", "numpy", "scipy", "sklearn",
               "difflib", "warnings", "operator", "threadpoolctl", "importlib", "sys"}
    for path in (PACKAGE / "probes").rglob("*.py"):
        if path.name == "probe.py":  # a built-in's declaration: test_the_built_in_probes_use_only_the_public_api
            continue
        extra = imported_modules(path) - allowed
        package = {node.module for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                   and node.module.split(".")[0] == "lm_eval_probes"}
        if package <= {"lm_eval_probes.stack_api"}:
            extra -= {"lm_eval_probes"}
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
        "lm_eval_probes.probes.reader.math, lm_eval_probes.probes.correlation, lm_eval_probes.metrics, lm_eval_probes.rows; "
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
    assert "lm_eval_probes.tasks.probe_task" in graph["lm_eval_probes.tasks.manager"]
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


def _package(module: str) -> str:
    """The package a module belongs to: ``lm_eval_probes.<first level>`` (a top-level module is its own)."""
    return ".".join(module.split(".")[:2])


def test_no_import_cycles_between_packages():
    """Packages import one way too (lazy imports included): the front ends (``cli``, ``__main__``) sit above
    ``sweep`` and ``probe_run``, which sit above ``terminal``; no package reaches one that reaches it back."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        for other in _lm_eval_probes_imports(path, set(paths)):
            if _package(other) not in (_package(name), "lm_eval_probes"):
                graph.setdefault(_package(name), set()).add(_package(other))
    assert "lm_eval_probes.terminal" in graph["lm_eval_probes.sweep"]  # the graph sees lazy and package imports
    assert "lm_eval_probes.sweep" in graph["lm_eval_probes.cli"]
    reach = {package: set(others) for package, others in graph.items()}
    grown = True
    while grown:  # the transitive closure
        grown = False
        for package, others in reach.items():
            more = set().union(*(reach.get(other, set()) for other in others)) - others
            if more:
                others |= more
                grown = True
    cycles = sorted(f"{a} ⇄ {b}" for a, others in reach.items() for b in others if a <= b and a in reach.get(b, ()))
    assert not cycles, cycles


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


LAYERS: tuple[tuple[str, ...], ...] = (
    ("lm_eval_probes.api", "lm_eval_probes.probes", "lm_eval_probes.stack_api"),
    ("lm_eval_probes.declarations", "lm_eval_probes.registry", "lm_eval_probes.config",
     "lm_eval_probes.records", "lm_eval_probes.rows", "lm_eval_probes.metrics", "lm_eval_probes.estimators"),
    ("lm_eval_probes.capture",),
    ("lm_eval_probes.models", "lm_eval_probes.harness"),
    ("lm_eval_probes.tasks", "lm_eval_probes.terminal"),
    ("lm_eval_probes.reports", "lm_eval_probes.sweep", "lm_eval_probes.reproduce", "lm_eval_probes.cli",
     "lm_eval_probes.probe_run",
     "lm_eval_probes.__main__"),
)
"""The layers, lowest first: a module imports its own layer's and the layers below, never one above
(``docs/design.md``, "The layers"). The package itself (``lm_eval_probes/__init__.py``: ``__version__``,
``TASKS_DIR`` and lazy entry points, importing nothing at import time) stands outside them."""


def _layer(module: str) -> int:
    matches = [(len(prefix), index) for index, layer in enumerate(LAYERS) for prefix in layer
               if module == prefix or module.startswith(prefix + ".")]
    if not matches:
        raise AssertionError(f"{module} is in no layer of LAYERS")
    return max(matches)[1]


def test_imports_go_one_way_through_the_layers_even_inside_functions():
    """probes → capture → models/harness → tasks glue → reports: no module imports a layer above its own, at module
    level or inside a function (``TYPE_CHECKING`` blocks count too)."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    upward = []
    for name, path in sorted(paths.items()):
        if name == "lm_eval_probes":
            continue
        for other in sorted(_lm_eval_probes_imports(path, set(paths)) - {"lm_eval_probes"}):
            if _layer(other) > _layer(name):
                upward.append(f"{name} imports {other}")
    assert not upward, upward
    assert _layer("lm_eval_probes.tasks.manager") > _layer("lm_eval_probes.harness.registry")


def test_the_built_in_probes_use_only_the_public_api():
    """Each built-in probe's declaration (``probes/<name>/probe.py``) imports ``lm_eval_probes.api`` and the math
    (``lm_eval_probes.probes``)."""
    paths = sorted((PACKAGE / "probes").glob("*/probe.py"))
    assert {path.parent.name for path in paths} == {"tcb", "bte", "omega", "margin", "reader"}
    for path in paths:
        imported = _lm_eval_probes_imports(path, {_module_name(p) for p in PACKAGE.rglob("*.py")})
        outside = {m for m in imported if m != "lm_eval_probes.api" and not m.startswith("lm_eval_probes.probes")}
        assert not outside, (path.name, outside)


NO_PROBE_NAMES = ("config.py", "rows.py", "records.py", "declarations.py", "estimators.py", "capture/positions.py",
                  "capture/readouts.py", "capture/loglikelihood.py", "capture/reader.py", "capture/attention.py",
                  "harness/registry.py", "harness/hflm.py", "models/autoregressive.py", "models/replay.py",
                  "models/diffusion.py")
"""Modules of the host that name no probe and no probe's record field in code (docstrings and row family names
aside): what they do for a probe comes from the registry and the probes' whole-forward requests. ``registry.py``
lists the built-ins; ``capture/saved_states.py`` is the reader's own."""


def _code_names(path: Path) -> set[str]:
    """String constants and identifiers of ``path``, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", node.value))
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    return names


def test_the_host_names_no_probe():
    from lm_eval_probes.api import FAMILIES
    from lm_eval_probes.registry import probes

    named = {probe.name for probe in probes()} | {field for probe in probes() for field in probe.fields}
    named -= set(FAMILIES)  # the row family "reader" (the latent correctness reader's rows) is no probe's name
    offenders = {}
    for relative in [*NO_PROBE_NAMES, "../tasks/probe_task.py"]:
        path = (PACKAGE / relative).resolve()
        if not path.exists():  # the installed package: tasks/ is lm_eval_probes/tasks
            path = PACKAGE / "tasks" / Path(relative).name
        found = _code_names(path) & named
        if found:
            offenders[relative] = sorted(found)
    assert not offenders, offenders


def test_the_wrappers_override_few_hflm_methods():
    """Thin wrappers (lm_eval's ``hf_steered`` overrides three): each wrapper at most 6 HFLM methods besides
    ``__init__``, counted over its whole MRO (the shared ``ProbeWrapper`` included), 2 of them private
    (``tests/test_wrapper_overrides.py`` names them). Nothing per call lives on either
    (:class:`~lm_eval_probes.harness.hflm.CallScope`)."""
    from test_wrapper_overrides import hflm_overrides

    from lm_eval_probes.models.autoregressive import ProbeHFLM
    from lm_eval_probes.models.diffusion import DiffusionProbeHFLM

    for cls in (ProbeHFLM, DiffusionProbeHFLM):
        overridden = hflm_overrides(cls)
        assert len(overridden) <= 6 and sum(name.startswith("_") for name in overridden) <= 2, (cls, overridden)
    for module in ("models/autoregressive.py", "models/diffusion.py"):
        assert "self._call" not in (PACKAGE / module).read_text(), module


REGISTRY_VIEWS = ("PROBES", "PROBE_NAMES", "PROBES_BY_NAME", "READER_ROWS", "DETECTOR_ROWS", "ROWS", "ROWS_BY_NAME",
                  "DIFFUSION_ROWS")
"""The registry's views that ``lm_eval_probes.declarations`` and ``lm_eval_probes.rows`` compute on each access."""

REGISTRY_READERS = ("probes", "probe", "names", "all_rows", "rows_by_name", "rows_for", "probe_rows", "difficulty_rows",
                    "reader_rows", "detector_rows")
"""Functions of ``lm_eval_probes.registry``, ``.rows`` and ``.declarations`` that return what is registered now."""


def _import_time_code(tree: ast.Module) -> list[ast.AST]:
    """The nodes of ``tree`` that run when the module is imported: its statements and class bodies, and of each
    function its decorators and default values (not its body)."""
    found: list[ast.AST] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [*node.decorator_list, *node.args.defaults, *filter(None, node.args.kw_defaults)]
        elif isinstance(node, ast.ClassDef):
            found += [*node.decorator_list, *node.bases, *node.keywords]
            pending += node.body
        else:
            found.append(node)
    return found


def test_reports_and_reproduce_read_the_registry_when_they_run():
    """A probe registered after the report was imported (a plugin installed into a running process,
    ``registry.refresh()``) gets its columns and glossary entry only if nothing under ``reports/`` or ``reproduce/``
    holds a copy of a registry view made at import: no ``from … import PROBES`` (the name is bound to the registry of
    that moment), and no view read by module-level code (``ORDER = tuple(… declarations.PROBES …)``,
    ``BTE = registry.probe("bte")``)."""
    offenders = []
    for folder in ("reports", "reproduce"):
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            where = path.relative_to(PACKAGE)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    named = sorted({alias.name for alias in node.names} & {*REGISTRY_VIEWS, "*"})
                    if named:
                        offenders.append(f"{where}:{node.lineno} imports {', '.join(named)} from {node.module}")
            for code in _import_time_code(tree):
                for node in ast.walk(code):
                    if isinstance(node, ast.Attribute) and node.attr in REGISTRY_VIEWS:
                        offenders.append(f"{where}:{node.lineno} reads {node.attr} at import")
                    elif isinstance(node, ast.Call):
                        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                        if called in REGISTRY_READERS:
                            offenders.append(f"{where}:{node.lineno} calls {called}() at import")
    assert not offenders, offenders


def test_the_source_tree_imports_from_the_clones_root():
    """Run in the clone's root (a notebook, ``python -m lm_eval …``), ``import lm_eval_probes`` finds the source folder
    before any install: its ``metrics`` and ``tasks`` subpackages are the root's folders, as an install maps them."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    code = ("import sys, lm_eval_probes, lm_eval_probes.rows, lm_eval_probes.metrics, lm_eval_probes.tasks.noise; "
            "print(lm_eval_probes.__file__); print(lm_eval_probes.metrics.__file__); print(lm_eval_probes.TASKS_DIR); "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(root / "lm_eval_probes" / "__init__.py"), str(root / "metrics" / "__init__.py"),
                                   str(root / "tasks"), "False"]
