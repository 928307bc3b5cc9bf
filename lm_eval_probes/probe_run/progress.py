"""``probe-run``'s per-document progress: ``<output_path>/.probe-run/``, so that a killed run resumes where it stopped.

* ``run.json`` — what the answers depend on (the source files, the probing model's arguments, the plugin's and
  lm_eval's versions); a rerun with anything else refuses to mix its answers in.
* ``<task>.<rank>.answers`` — appended once per finished chunk of documents: one pickle frame ``{doc_id: {(request
  type, idx, repeat): response}}`` with each response's probe record (the objects lm_eval gathers across processes),
  one file per process (:attr:`ProgressFolder.rank`). A frame cut by a kill is ignored, and its documents are probed
  again; a resume reads every process's files.

The folder is removed once the run's results and samples are written.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lm_eval_probes.probe_run.logged import ProbeRunError

__all__ = ["PROGRESS_FOLDER", "ProgressFolder"]

PROGRESS_FOLDER = ".probe-run"


class ProgressFolder:
    """The per-document progress of one probe-run (see the module docstring); a
    :class:`~lm_eval_probes.models.replay.ReplayProgress`.

    Args:
        output_path: the run's ``--output_path``.
        fingerprint: what the answers depend on (JSON-native).

    Raises:
        ProbeRunError: the folder holds the progress of another probe-run.
    """

    def __init__(self, output_path: Path, fingerprint: Mapping[str, Any]) -> None:
        self.folder = Path(output_path) / PROGRESS_FOLDER
        self.fingerprint = json.loads(json.dumps(dict(fingerprint), sort_keys=True))
        self.rank = 0  # the process that appends (set once the model knows it)
        self._answers: dict[str, dict[int, dict[tuple[str, int, int], Any]]] = {}
        stamp = self.folder / "run.json"
        if stamp.is_file() and any(self.folder.glob("*.answers")):
            earlier = json.loads(stamp.read_text(encoding="utf-8"))
            if earlier != self.fingerprint:
                changed = sorted(k for k in set(earlier) | set(self.fingerprint) if earlier.get(k) != self.fingerprint.get(k))
                raise ProbeRunError(f"{self.folder}: holds the progress of another probe-run (it differs in "
                                    f"{', '.join(changed)}); remove that folder or choose another --output_path")
        else:  # nothing stored yet (a first run, or one refused before it probed anything): this run's
            self.folder.mkdir(parents=True, exist_ok=True)
            temporary = stamp.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(self.fingerprint, indent=2, sort_keys=True), encoding="utf-8")
            os.replace(temporary, stamp)

    def _path(self, task: str) -> Path:
        return self.folder / f"{task}.{self.rank}.answers"

    def _load(self, task: str) -> dict[int, dict[tuple[str, int, int], Any]]:
        if task in self._answers:
            return self._answers[task]
        answers: dict[int, dict[tuple[str, int, int], Any]] = {}
        for path in sorted(self.folder.glob(f"{glob.escape(task)}.*.answers")):
            if not path.name[len(task) + 1 : -len(".answers")].isdigit():
                continue  # another task whose name starts with this one's
            good = 0
            with path.open("rb") as frames:
                while True:
                    try:
                        frame = pickle.load(frames)  # noqa: S301  (this run's own files)
                    except EOFError:
                        break
                    except (pickle.UnpicklingError, ValueError, AttributeError, IndexError, TypeError):
                        break  # a frame cut by a kill: its documents are probed again
                    answers.update(frame)
                    good = frames.tell()
            if good != path.stat().st_size and path == self._path(task):
                with path.open("r+b") as cut:
                    cut.truncate(good)
        self._answers[task] = answers
        return answers

    def answered(self, task: str, doc_id: int) -> Mapping[tuple[str, int, int], Any] | None:
        return self._load(task).get(int(doc_id))

    def save(self, task: str, answers: Mapping[int, Mapping[tuple[str, int, int], Any]]) -> None:
        frame = {int(doc_id): dict(values) for doc_id, values in answers.items()}
        self._load(task).update(frame)
        with self._path(task).open("ab") as out:
            pickle.dump(frame, out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()
            os.fsync(out.fileno())

    def documents(self, task: str) -> int:
        """How many documents of ``task`` are stored."""
        return len(self._load(task))

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
