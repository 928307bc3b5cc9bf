"""Shared fixtures: tiny random causal LMs (built from configs by ``tiny_models.py``) with an offline byte-level BPE tokenizer, one
index per packaged task folder for the whole session, command lines run in this process, and the runs in a fresh
interpreter started in the background when the session starts."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tiny_models import TINY_ARCHS, build_tokenizer, save_tiny_bert, save_tiny_model, tiny_config  # noqa: F401  (the tests import them from here too)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """``tiny_model_dir(arch)`` → a folder with a saved tiny random model + tokenizer (made once per arch)."""
    made: dict[str, str] = {}

    def make(arch: str = "llama") -> str:
        if arch not in made:
            made[arch] = save_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}"), arch)
        return made[arch]

    return make


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The session's torch runs on one intra-op thread. The tests' models are tiny (width 32, batches of a few
    hundred tokens): a second thread only adds synchronisation (test_capture.py and test_margin_capture.py: 45 s of
    CPU on one thread, 71 s on two, beside another busy process), and with other work on the cores the waiting
    threads slow every forward. Subprocesses keep their own setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def packaged_task_folders_indexed_once() -> Iterator[None]:
    """Every ``TaskManager`` of the session reuses one index of each packaged task folder.

    A ``TaskManager`` parses every YAML under its folders when it is built: lm_eval's own ~14,000 take 15-25 s of
    a CPU core, and the tests build some thirty managers (most with their own task ``metadata``, which the index
    does not hold). lm_eval's folder and the plugin's installed one are files no test writes, so each is indexed
    once; ``TaskIndex.build`` then merges the folders' indexes as it always does (in order, a later folder's
    entry replacing an earlier one's, with the same warning). Any other folder (a test's own YAML) is indexed
    afresh each time. Task objects are still built anew from the YAML files for every manager."""
    import lm_eval.tasks
    from lm_eval.tasks import _index

    import lm_eval_probes

    build = _index.TaskIndex.build
    packaged = {Path(lm_eval.tasks.__file__).parent.resolve(), Path(lm_eval_probes.TASKS_DIR).resolve()}
    indexed: dict[tuple[Path, bool], dict] = {}

    def folder_index(root: Path, resolve_includes: bool) -> dict:
        key = (Path(root).resolve(), resolve_includes)
        if key[0] not in packaged:
            return build([root], resolve_includes=resolve_includes)
        if key not in indexed:
            indexed[key] = build([root], resolve_includes=resolve_includes)
        return indexed[key]

    def build_reusing_packaged_folders(paths: Iterable[Path], *, resolve_includes: bool = True) -> dict:
        index: dict = {}
        for root in paths:
            for name, entry in folder_index(root, resolve_includes).items():
                if name in index:
                    _index.log.warning("Task '%s' from %s overrides existing task from %s",
                                       name, entry.yaml_path, index[name].yaml_path)
                index[name] = entry
        return index

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_index.TaskIndex, "build", staticmethod(build_reusing_packaged_folders))
        yield


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> Callable[..., tuple[int, str, str]]:
    """``run_cli(program, argv)`` runs ``lm-eval-probes`` or ``lm_eval`` in this process as its console script
    would (``sys.argv`` set; a ``SystemExit`` read as the interpreter reads it) and returns ``(exit code, stdout,
    stderr)``; an exception other than ``SystemExit`` propagates.

    For the checks where a fresh interpreter proves nothing (each one imports torch and lm_eval and indexes
    lm_eval's tasks again: half a minute). What lm_eval's CLI sets for its process — a handler on the ``lm_eval``
    logger that stops propagation, that logger's level, ``TOKENIZERS_PARALLELISM`` — is undone after the test."""
    import logging
    import os
    import sys

    import lm_eval.utils

    lm_eval_logger = logging.getLogger("lm_eval")
    monkeypatch.setattr(lm_eval_logger, "handlers", list(lm_eval_logger.handlers))
    monkeypatch.setattr(lm_eval_logger, "propagate", lm_eval_logger.propagate)
    monkeypatch.setattr(lm_eval_logger, "level", lm_eval_logger.level)
    monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", lm_eval.utils._LOGGING_CONFIGURED)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", os.environ.get("TOKENIZERS_PARALLELISM", "false"))

    def run(program: str, argv: list[str]) -> tuple[int, str, str]:
        from lm_eval.__main__ import cli_evaluate

        from lm_eval_probes.__main__ import main

        entry_points = {"lm-eval-probes": lambda: main(argv), "lm_eval": cli_evaluate}
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", [program, *argv])
        try:
            entry_points[program]()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
            if isinstance(exit_.code, str):
                print(exit_.code, file=sys.stderr)
        out, err = capsys.readouterr()
        return code, out, err

    return run


# ----------------------------------------------------------------------------------- fresh interpreters

FreshCommand = Callable[[Callable[[str], str], Path], "tuple[list[str], dict[str, str]] | tuple[list[str], dict[str, str], Path]"]
"""``(tiny_model_dir, folder) -> (argv, environment[, working directory])``: a command to run in ``folder``, or in the
working directory it gives (e.g. a clone's root)."""

_FRESH_COMMANDS: dict[str, FreshCommand] = {}


def fresh_command(build: FreshCommand) -> FreshCommand:
    """Declare, by its function name, a command that a test runs in a fresh interpreter (a real console script, the
    .pth autoload, torchrun). A test marked ``@pytest.mark.fresh_process("name")`` and selected in this session gets
    it started in the background when the session starts, one command at a time, next to the in-process tests (which
    leave the second core idle); the test runs at the end of the session and awaits it with
    ``fresh_processes.result("name")``. It asserts on the same process, output and files as if it had run the
    command itself. Under pytest-xdist (``make test``: two workers, both cores busy) the command starts only when its
    test asks for it, on the worker that runs that test."""
    _FRESH_COMMANDS[build.__name__] = build
    return build


class FreshProcesses:
    """The session's background runs of the :func:`fresh_command` commands (one at a time, in start order)."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fresh-process")
        self._runs: dict[str, tuple[Future, Path]] = {}
        self._running: list[subprocess.Popen] = []
        self._deferred: dict[str, Callable[[], None]] = {}

    def start(self, name: str, argv: list[str], folder: Path, env: dict[str, str], timeout: float = 600, *,
              cwd: Path | None = None) -> None:
        self._runs[name] = (self._executor.submit(self._run, argv, cwd or folder, env, timeout), folder)

    def defer(self, name: str, start: Callable[[], None]) -> None:
        """Start ``name`` only when a test asks for its result (a pytest-xdist worker: the other core is busy with
        the other worker's tests, and only the worker that runs the test needs the run)."""
        self._deferred[name] = start

    def _run(self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as process:
            self._running.append(process)
            try:
                out, err = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                raise
            return subprocess.CompletedProcess(argv, process.returncode, out, err)

    def result(self, name: str) -> tuple[subprocess.CompletedProcess, Path]:
        """The finished run of ``name`` (waits for it) and its folder; a timeout raises as ``subprocess.run``'s."""
        if name not in self._runs and name in self._deferred:
            self._deferred.pop(name)()
        if name not in self._runs:
            raise KeyError(f"{name!r} was not started: mark its test @pytest.mark.fresh_process({name!r})")
        future, folder = self._runs[name]
        return future.result(), folder

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        for process in self._running:
            if process.poll() is None:
                process.kill()
        self._executor.shutdown(wait=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fresh_process(name): the test awaits the fresh_command `name`, started in "
                                       "the background when the session starts (the test runs last)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that await a fresh process run last (in their order), when their command has long finished."""
    items.sort(key=lambda item: item.get_closest_marker("fresh_process") is not None)


@pytest.fixture(scope="session", autouse=True)
def fresh_processes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshProcesses]:
    """Starts the fresh-interpreter commands of the session's selected (and not skipped) tests; see
    :func:`fresh_command`."""
    wanted: list[str] = []
    for item in request.session.items:
        marker = item.get_closest_marker("fresh_process")
        skipped = any(m.args and m.args[0] is True for m in item.iter_markers("skipif"))
        if marker is not None and not skipped and marker.args[0] not in wanted:
            wanted.append(marker.args[0])
    runs = FreshProcesses()
    model_dir = request.getfixturevalue("tiny_model_dir") if wanted else None

    def start(name: str) -> None:
        folder = tmp_path_factory.mktemp(name)
        argv, env, *cwd = _FRESH_COMMANDS[name](model_dir, folder)
        runs.start(name, argv, folder, env, cwd=cwd[0] if cwd else None)

    for name in wanted:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            runs.defer(name, lambda name=name: start(name))
        else:
            start(name)
    yield runs
    runs.close()
