"""Reading a finished lm_eval run for ``probe-run``: its results file and its ``--log_samples`` files, checked.

lm_eval (0.4.13) writes ``<output_path>/<model>/results_<date>.json`` and, with ``--log_samples``, one
``samples_<task>_<date>.jsonl`` per task beside it: one line per document and filter, with ``doc_id``, ``arguments``
(``{"gen_args_<i>": {"arg_0": context, "arg_1": continuation or generation kwargs}}``, one per request in ``idx``
order) and ``resps`` (per request, its answers as strings: a generated text, or ``["<loglik>", "<is_greedy>"]``).
Any model type writes them alike (``hf``, ``vllm``, ``sglang``, ``hf-probes``). Every refusal is a
:class:`ProbeRunError` that names the file and what does not match.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm_eval_probes.models.replay import LoggedDocument

__all__ = ["LoggedRun", "LoggedTask", "ProbeRunError", "read_run"]

RESULTS_PATTERN = re.compile(r"^results_(?P<date>.+)\.json$")
SAMPLES_PATTERN = re.compile(r"^samples_(?P<task>.+)_(?P<date>\d{4}-\d{2}-\d{2}T[\d\-.]+)\.jsonl$")
NOT_AUTOREGRESSIVE = ("hf-probes-diffusion",)
"""Model types whose responses were not generated left to right: a teacher-forced forward does not see what their
generation saw."""
PROBED_OUTPUT_TYPES = ("generate_until", "multiple_choice", "loglikelihood")


class ProbeRunError(ValueError):
    """A run that ``probe-run`` cannot probe: the message names the file and the mismatch."""


@dataclass(frozen=True)
class LoggedTask:
    """One task of a finished run.

    Attributes:
        name: the task's name (as in the results file's ``configs``).
        samples: its samples file.
        output_type: ``generate_until``, ``multiple_choice`` or ``loglikelihood``.
        documents: ``doc_id → LoggedDocument``, in ``doc_id`` order.
    """

    name: str
    samples: Path
    output_type: str
    documents: Mapping[int, LoggedDocument]


@dataclass(frozen=True)
class LoggedRun:
    """A finished run: its results file (parsed) and its tasks' samples.

    Attributes:
        results_path: the ``results_<date>.json`` file.
        results: its content.
        tasks: ``task name → LoggedTask`` (the tasks asked for, or every task with samples).
    """

    results_path: Path
    results: Mapping[str, Any]
    tasks: Mapping[str, LoggedTask]

    @property
    def folder(self) -> Path:
        return self.results_path.parent

    @property
    def config(self) -> Mapping[str, Any]:
        return self.results.get("config") or {}

    @property
    def model_type(self) -> str:
        """The run's ``--model`` (``hf``, ``vllm``, …); for a run of a model object, its name or path."""
        source = self.results.get("model_source")
        return str(source if source and source != "CUSTOM" else self.config.get("model", "?"))

    def check_tokenizer(self, tokenizer: Any, eot_token_id: int) -> None:
        """The probing model's tokenizer is the one that generated the run (EOS and BOS tokens and ids, the
        end-of-text id, as lm_eval records them).

        Raises:
            ProbeRunError: a difference, named.
        """
        recorded = {key: self.results.get(key) for key in ("tokenizer_eos_token", "tokenizer_bos_token", "eot_token_id")}
        if all(value is None for value in recorded.values()):
            raise ProbeRunError(f"{self.results_path}: records no tokenizer (tokenizer_eos_token, eot_token_id): "
                                "cannot check that the probing model's tokenizer is the run's")
        mine = {
            "tokenizer_eos_token": [tokenizer.eos_token, str(tokenizer.eos_token_id)],
            "tokenizer_bos_token": [tokenizer.bos_token, str(tokenizer.bos_token_id)],
            "eot_token_id": eot_token_id,
        }
        for key, value in recorded.items():
            if value is None:
                continue
            want = [str(v) for v in value] if isinstance(value, list) else value
            have = [str(v) for v in mine[key]] if isinstance(mine[key], list) else mine[key]
            if want != have:
                raise ProbeRunError(f"{self.results_path}: the run's tokenizer differs from the probing model's: {key} "
                                    f"is {value!r} there, {mine[key]!r} here (another model or tokenizer?)")


def _results_date(path: Path) -> str:
    match = RESULTS_PATTERN.match(path.name)
    if match is None:
        raise ProbeRunError(f"{path}: not an lm_eval results file (results_<date>.json)")
    return match.group("date")


def _find_results(paths: Sequence[Path]) -> tuple[Path, list[Path] | None]:
    """The one results file the paths name (a folder holding exactly one, the file itself, or samples files beside
    theirs) and the samples files named explicitly (``None``: every one of that run)."""
    if not paths:
        raise ProbeRunError("name a run: an lm_eval output folder, its results file or its samples files")
    for path in paths:
        if not path.exists():
            raise ProbeRunError(f"{path}: no such file or folder")
    if len(paths) == 1 and paths[0].is_dir():
        found = sorted(paths[0].rglob("results_*.json"))
        if not found:
            raise ProbeRunError(f"{paths[0]}: holds no lm_eval results file (results_<date>.json)")
        if len(found) > 1:
            listed = ", ".join(str(p.relative_to(paths[0])) for p in found[:6])
            raise ProbeRunError(f"{paths[0]}: holds {len(found)} runs ({listed}); name one results file or folder")
        return found[0], None
    if len(paths) == 1 and RESULTS_PATTERN.match(paths[0].name):
        return paths[0], None
    samples = []
    for path in paths:
        match = SAMPLES_PATTERN.match(path.name)
        if path.is_dir() or match is None:
            raise ProbeRunError(f"{path}: not an lm_eval samples file (samples_<task>_<date>.jsonl); give one run "
                                "folder, one results file, or samples files of one run")
        samples.append(path)
    results = {path.parent / f"results_{SAMPLES_PATTERN.match(path.name).group('date')}.json" for path in samples}
    if len(results) > 1:
        raise ProbeRunError(f"the samples files come from {len(results)} runs ({', '.join(sorted(map(str, results)))})")
    result = results.pop()
    if not result.is_file():
        raise ProbeRunError(f"{samples[0]}: the results file of its run ({result.name}) is not beside it: it names the "
                            "model, its tokenizer and the few-shot and generation settings that made the samples")
    return result, samples


def _parse_response(value: Any, output_type: str, where: str) -> Any:
    if output_type == "generate_until":
        if not isinstance(value, str):
            raise ProbeRunError(f"{where}: a generation's response must be a text, got {value!r:.80}")
        return value
    if isinstance(value, list) and len(value) == 2:
        try:
            loglik = float(value[0])
        except ValueError:
            loglik = math.nan
        if math.isfinite(loglik) and str(value[1]) in ("True", "False"):
            return loglik, str(value[1]) == "True"
    raise ProbeRunError(f"{where}: a log-likelihood response must be [loglik, is_greedy], got {value!r:.80}")


def _document(line: Mapping[str, Any], output_type: str, where: str) -> LoggedDocument:
    missing = [key for key in ("doc_id", "arguments", "resps") if key not in line]
    if missing:
        hint = " (the run's responses are not logged)" if "resps" in missing else ""
        raise ProbeRunError(f"{where}: no {', '.join(missing)}{hint}")
    arguments = line["arguments"]
    if not isinstance(arguments, dict) or not all(re.fullmatch(r"gen_args_\d+", k) and isinstance(v, dict)
                                                  for k, v in arguments.items()):
        raise ProbeRunError(f"{where}: 'arguments' is {type(arguments).__name__}, not lm_eval 0.4.13's "
                            "{\"gen_args_<i>\": {\"arg_0\": ..., \"arg_1\": ...}}: a samples file from an older lm_eval")
    requests = [arguments[f"gen_args_{i}"] for i in range(len(arguments)) if f"gen_args_{i}" in arguments]
    if len(requests) != len(arguments):
        raise ProbeRunError(f"{where}: 'arguments' keys are not gen_args_0 … gen_args_{len(arguments) - 1}")
    args = tuple(tuple(request[f"arg_{j}"] for j in range(len(request))) for request in requests)
    resps = line["resps"]
    if not isinstance(resps, list) or len(resps) != len(args) or not all(isinstance(r, list) and r for r in resps):
        raise ProbeRunError(f"{where}: 'resps' must hold one non-empty list per request ({len(args)}), got "
                            f"{resps!r:.80} (the run's responses are not logged)")
    responses = tuple(tuple(_parse_response(answer, output_type, where) for answer in answers) for answers in resps)
    return LoggedDocument(source=where.split(" line ")[0], doc_id=int(line["doc_id"]), arguments=args,
                          responses=responses)


def _read_samples(path: Path, output_type: str) -> dict[int, LoggedDocument]:
    documents: dict[int, LoggedDocument] = {}
    with path.open(encoding="utf-8") as lines:
        for number, text in enumerate(lines, 1):
            if not text.strip():
                continue
            where = f"{path} line {number}"
            try:
                line = json.loads(text)
            except json.JSONDecodeError as error:
                raise ProbeRunError(f"{where}: not JSON ({error})") from None
            if not isinstance(line, dict):
                raise ProbeRunError(f"{where}: not a samples record")
            document = _document(line, output_type, where)
            earlier = documents.get(document.doc_id)
            if earlier is not None and earlier.responses != document.responses:
                raise ProbeRunError(f"{where}: doc_id {document.doc_id} logged other responses on another line")
            documents.setdefault(document.doc_id, document)
    if not documents:
        raise ProbeRunError(f"{path}: holds no samples")
    return dict(sorted(documents.items()))


def read_run(paths: Sequence[str | Path], tasks: Iterable[str] | None = None) -> LoggedRun:
    """Read and check the run that ``paths`` name (a folder with one results file, that file, or samples files of one
    run), keeping ``tasks`` (``None``: every task of the run).

    Raises:
        ProbeRunError: no run or several; a results file that is not JSON; a model that is not autoregressive; a task
            without samples (the run had no ``--log_samples``) or not asked for by the run; a perplexity task; a
            samples file in an older lm_eval's format, without responses, or unreadable.
    """
    results_path, named = _find_results([Path(p) for p in paths])
    try:
        results = json.loads(results_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ProbeRunError(f"{results_path}: not a readable results file ({error})") from None
    if not isinstance(results, dict) or not isinstance(results.get("configs"), dict):
        raise ProbeRunError(f"{results_path}: not an lm_eval results file (no 'configs')")
    config = results.get("config") or {}
    model = " ".join(str(name) for name in (results.get("model_source"), config.get("model")) if name)
    if any(name in model for name in NOT_AUTOREGRESSIVE) or "diffusion" in model:
        raise ProbeRunError(f"{results_path}: was made by {config.get('model')!r}, a masked-diffusion model: its responses were not "
                            "generated left to right, so one teacher-forced forward does not see what its decoding saw")
    date = _results_date(results_path)
    available = {}
    for path in results_path.parent.glob(f"samples_*_{date}.jsonl"):
        match = SAMPLES_PATTERN.match(path.name)
        if match is not None and match.group("date") == date:
            available[match.group("task")] = path
    if named is not None:
        wanted = [SAMPLES_PATTERN.match(p.name).group("task") for p in named]
    else:
        wanted = list(tasks) if tasks is not None else sorted(results["configs"])
    if tasks is not None and named is not None:
        wanted = [t for t in wanted if t in set(tasks)]
    if not available:
        raise ProbeRunError(f"{results_path}: no samples files beside it (samples_<task>_{date}.jsonl): run lm_eval "
                            "with --log_samples")
    out: dict[str, LoggedTask] = {}
    for task in wanted:
        if task not in results["configs"]:
            raise ProbeRunError(f"{results_path}: the run has no task {task!r} (it ran {', '.join(sorted(results['configs']))})")
        if task not in available:
            raise ProbeRunError(f"{results_path}: task {task!r} has no samples file (samples_{task}_{date}.jsonl): its "
                                "responses were not logged")
        output_type = str(results["configs"][task].get("output_type", ""))
        if output_type not in PROBED_OUTPUT_TYPES:
            raise ProbeRunError(f"{available[task]}: task {task!r} is {output_type!r}: probe-run probes "
                                f"{', '.join(PROBED_OUTPUT_TYPES)} tasks (a perplexity task has no response to probe)")
        out[task] = LoggedTask(task, available[task], output_type, _read_samples(available[task], output_type))
    if not out:
        raise ProbeRunError(f"{results_path}: none of the tasks asked for has samples")
    return LoggedRun(results_path, results, out)
