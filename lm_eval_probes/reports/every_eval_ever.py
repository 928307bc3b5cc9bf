"""The report's results in the Every Eval Ever schema (``every-eval-ever`` 0.3.0: ``eval.schema.json`` and
``instance_level_eval.schema.json``), ready to pool with other evaluations.

Under ``every_eval_ever/`` in the report folder, laid out as the Every Eval Ever datastore lays out its files
(``data/<evaluation>/<developer>/<model>/<uuid>.json``, so the folder can be copied into it): per model and task

* ``<uuid>.json``, the aggregate: every row of the task as an ``evaluation_results`` entry (rows whose value is
  undefined are left out and named in ``source_metadata.additional_details.undefined_rows``) with its declaration's
  description, its direction (``lower_is_better``; a baseline or count, which has none, says so in
  ``score_details.details.direction``), its bounds (``min_score``/``max_score``: a row's declared
  :attr:`~lm_eval_probes.api.Row.bounds`, lm_eval's metrics' by their definition (:data:`STOCK_BOUNDS`);
  ``"-Infinity"``/``"Infinity"`` where a side is unbounded, both for a metric nothing here declares), lm_eval's
  standard error and the report's bootstrap interval; the plugin's options (``probes``, ``probe_*``) in each result's
  ``generation_config.additional_details`` and the model's ``model_args`` in ``model_info``;
* ``<uuid>_samples.jsonl`` (with ``--log_samples``), one line per document of the correctness filter: prompt,
  reference, choices, the response, its correctness as ``evaluation``, lm_eval's hashes and every per-document
  probe value as JSON text in ``metadata``; ``detailed_evaluation_results`` of the aggregate points at it (its
  datastore path, SHA-256 and row count).

The uuid is a version-4 UUID derived from (model, task), so a report written twice, or from runs moved or sharded,
names its files alike.
Torch-free, and needs no ``every-eval-ever`` (which needs Python ≥ 3.12): plain ``json``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lm_eval_probes.api import CORRELATION, NON_NEGATIVE, UNBOUNDED, UNIT_INTERVAL
from lm_eval_probes.config import split_model_args
from lm_eval_probes.reports.bootstrap import ConfidenceInterval
from lm_eval_probes.reports.columns import meaning
from lm_eval_probes.reports.choices import gold_indices, options, prompt_text, response_text
from lm_eval_probes.reports.reading import ModelResults, TaskResult
from lm_eval_probes.reports.tables import Cell, TaskTable, primary_metric
from lm_eval_probes.rows import rows_by_name

SCHEMA_VERSION = "0.3.0"
FOLDER = "every_eval_ever"
UNBOUNDED_ABOVE = "Infinity"
UNBOUNDED_BELOW = "-Infinity"

STOCK_BOUNDS: dict[str, tuple[float, float]] = {
    "acc": UNIT_INTERVAL, "acc_norm": UNIT_INTERVAL, "exact_match": UNIT_INTERVAL, "next_token_match": UNIT_INTERVAL,
    "mcc": CORRELATION,
    "brier_score": (0.0, 2.0),  # Σ over the options of (p − one-hot)²: 2 when all mass is on one wrong option
    "perplexity": (1.0, math.inf), "word_perplexity": (1.0, math.inf), "byte_perplexity": (1.0, math.inf),  # exp(NLL ≥ 0)
    "bits_per_byte": NON_NEGATIVE,
}
"""The range of lm_eval's metrics (and the next-token task's ``next_token_match``) by their definition: nothing of
the plugin declares them."""


def metric_bounds(metric: str) -> tuple[float, float]:
    """``(low, high)`` of ``metric``: its row's declared bounds (of the probes registered now), else
    :data:`STOCK_BOUNDS`, else unbounded (``-inf``/``inf``: a metric whose range nothing here knows)."""
    row = rows_by_name().get(metric)
    if row is not None:
        return row.bounds
    return STOCK_BOUNDS.get(metric, UNBOUNDED)


def json_bound(value: float) -> float | str:
    """A bound as Every Eval Ever writes it in strict JSON: ``"-Infinity"``/``"Infinity"`` for ∓∞."""
    if math.isinf(value):
        return UNBOUNDED_ABOVE if value > 0 else UNBOUNDED_BELOW
    return float(value)


def file_uuid(*parts: str) -> str:
    """A version-4 UUID from a SHA-256 of ``parts`` (stable across runs)."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


def model_id(model: ModelResults) -> str:
    """The model's ``pretrained`` value (a Hub id) where it is one, else its name: the id Every Eval Ever keys on."""
    args = dict(item.partition("=")[::2] for item in model.model_args.split(",") if "=" in item)
    pretrained = args.get("pretrained", "")
    if pretrained and not pretrained.startswith(("/", ".", "~")) and pretrained.count("/") <= 1:
        return pretrained
    return model.name


def _component(text: str) -> str:
    return re.sub(r"[^\w.\-]+", "_", text).strip("_") or "unknown"


def _strings(values: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for k, v in values.items()}


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _source_data(task: str, config: Mapping[str, Any]) -> dict[str, Any]:
    path = str(config.get("dataset_path") or "")
    if path and "/" in path and not path.startswith(("/", ".", "~")):
        out: dict[str, Any] = {"dataset_name": task, "source_type": "hf_dataset", "hf_repo": path}
        split = config.get("test_split") or config.get("validation_split")
        if split:
            out["hf_split"] = str(split)
        return out
    return {"dataset_name": task, "source_type": "other",
            "additional_details": _strings({"dataset_path": path} if path else {})}


def _uncertainty(cell: Cell, n_documents: int | None) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    if cell.stderr is not None and math.isfinite(cell.stderr):
        out["standard_error"] = {"value": float(cell.stderr), "method": "analytic"}
    ci: ConfidenceInterval | None = cell.ci
    if ci is not None and ci.defined:
        out["confidence_interval"] = {"lower": float(ci.low), "upper": float(ci.high), "confidence_level": float(ci.level),
                                      "method": "percentile bootstrap over documents (lm-eval-probes report)"}
        out["num_bootstrap_samples"] = int(ci.n_resamples)
        out["num_samples"] = int(ci.n_documents)
    elif n_documents:
        out["num_samples"] = int(n_documents)
    return out or None


def aggregate_record(model: ModelResults, table: TaskTable, raw: Mapping[str, Any], *, retrieved: str,
                     samples: Mapping[str, Any] | None, generator: str) -> dict[str, Any]:
    """The aggregate record of one model on one task (``raw``: its results file as read)."""
    task = table.task
    result = model.tasks[task]
    cells = table.cells[table.models.index(model.name)]
    config = (raw.get("configs") or {}).get(task) or {}
    args = dict(item.partition("=")[::2] for item in model.model_args.split(",") if "=" in item)
    plugin, _ = split_model_args(args)
    identifier = model_id(model)
    evaluation_id = f"{task}/{identifier}/{retrieved}"
    generation = {"additional_details": _strings({**plugin, **({"num_fewshot": config["num_fewshot"]}
                                                                if config.get("num_fewshot") is not None else {})})}
    results, undefined = [], []
    for column, cell in zip(table.columns, cells):
        if not cell.present:
            continue
        if not cell.defined:
            undefined.append(column.name)
            continue
        described = meaning(column.metric, column.higher_is_better)
        low, high = (json_bound(bound) for bound in metric_bounds(column.metric))
        direction = described.direction
        results.append({
            "evaluation_result_id": column.metric if column.filter == "none" else f"{column.metric}:{column.filter}",
            "evaluation_name": task if column.filter == "none" else f"{task}/{column.filter}",
            "source_data": _source_data(task, config),
            "metric_config": {
                "evaluation_description": described.description,
                "metric_id": column.metric if not described.declared else f"lm-eval-probes.{column.metric}",
                "metric_name": column.metric,
                "lower_is_better": described.higher_is_better is False,
                "score_type": "continuous", "min_score": low, "max_score": high,
                "additional_details": _strings({"declared_by": "lm-eval-probes" if described.declared else "lm_eval",
                                                "filter": column.filter}),
            },
            "score_details": {
                "score": float(cell.value),
                "details": {"direction": ("higher is better" if direction else "lower is better")
                            if direction is not None else "none: a baseline or a count (no better value)"},
                **({"uncertainty": u} if (u := _uncertainty(cell, result.n_documents)) else {}),
            },
            "generation_config": generation,
        })
    record: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "evaluation_id": evaluation_id,
        "evaluation_timestamp": result.date,
        "retrieved_timestamp": retrieved,
        "source_metadata": {
            "source_name": "lm-eval-probes leaderboard", "source_type": "evaluation_run",
            "source_organization_name": "unknown", "evaluator_relationship": "other",
            "additional_details": _strings({"generator": generator, "results_file": result.results_file.name,
                                            **({"undefined_rows": ", ".join(undefined)} if undefined else {})}),
        },
        "eval_library": {"name": "lm_eval", "version": str(raw.get("lm_eval_version") or "unknown"),
                         "additional_details": _strings({"plugin": generator,
                                                         "model_type": (raw.get("config") or {}).get("model", "")})},
        "model_info": {
            "name": model.name, "id": identifier,
            **({"developer": identifier.split("/")[0]} if "/" in identifier else {}),
            "inference_engine": {"name": "transformers"},
            "additional_details": {"deployment_type": "self_deployed", "model_availability": "unknown",
                                   **_strings({"model_args": model.model_args,
                                               **({"num_parameters": str(model.num_parameters)}
                                                  if model.num_parameters else {})})},
        },
        "evaluation_results": results,
    }
    if samples is not None:
        record["detailed_evaluation_results"] = dict(samples)
    return record


def instance_records(model: ModelResults, result: TaskResult, evaluation_id: str) -> list[dict[str, Any]]:
    """One instance record per document of the task's correctness filter."""
    primary = primary_metric(result)
    if primary is None:
        return []
    metric, filter_name = primary
    identifier = model_id(model)
    declared = rows_by_name()
    out = []
    for line in result.samples_of(filter_name):
        prompt = prompt_text(line)
        choices = options(line) or None
        gold = gold_indices(line)
        reference = [str(line.get("target", ""))] if gold is None or choices is None else [choices[i] for i in gold]
        value = line.get(metric)
        score = float(value) if isinstance(value, (bool, int, float)) and math.isfinite(float(value)) else 0.0
        response = response_text(line, metric)
        probes = {name: line[name] for name, row in declared.items() if name in line and row.value != "trace"}  # no traces
        scored = {m: line.get(m) for m in line.get("metrics") or [] if m in line}
        out.append({
            "schema_version": SCHEMA_VERSION, "evaluation_id": evaluation_id, "model_id": identifier,
            "evaluation_name": result.task if filter_name == "none" else f"{result.task}/{filter_name}",
            "evaluation_result_id": metric if filter_name == "none" else f"{metric}:{filter_name}",
            "sample_id": str(line.get("doc_id", "")),
            "sample_hash": hashlib.sha256(json.dumps({"raw": prompt, "reference": reference},
                                                     sort_keys=True).encode()).hexdigest(),
            "interaction_type": "single_turn",
            "input": {"raw": prompt, "reference": reference, "choices": choices},
            "output": {"raw": [response]},
            "answer_attribution": [{"turn_idx": 0, "source": "output.raw", "extracted_value": response,
                                    "extraction_method": filter_name, "is_terminal": True}],
            "evaluation": {"score": score, "is_correct": score == 1.0},
            "metadata": _strings({"doc_hash": str(line.get("doc_hash", "")), "prompt_hash": str(line.get("prompt_hash", "")),
                                  "target_hash": str(line.get("target_hash", "")), "filter": filter_name,
                                  "lm_eval_metrics": json.dumps(scored, ensure_ascii=False),
                                  **{f"probe.{k}": v for k, v in probes.items()}}),
        })
    return out


def write_every_eval_ever(models: Sequence[ModelResults], tables: Sequence[TaskTable], out: Path, *,
                          generator: str, retrieved: str | None = None) -> dict[tuple[str, str], list[Path]]:
    """Write the aggregate (and instance-level) files of every model and task; returns (model, task) → paths."""
    retrieved = retrieved or str(int(time.time()))
    written: dict[tuple[str, str], list[Path]] = {}
    raws: dict[Path, dict[str, Any]] = {}
    for table in tables:
        for model in models:
            if model.name not in table.models:
                continue
            result = model.tasks[table.task]
            raw = raws.setdefault(result.results_file, json.loads(result.results_file.read_text(encoding="utf-8")))
            identifier = model_id(model)
            developer = identifier.split("/")[0] if "/" in identifier else "unknown"
            relative = Path("data", _component(table.task), _component(developer), _component(identifier.split("/")[-1]))
            name = file_uuid(model.name, table.task)
            folder = out / FOLDER / relative
            folder.mkdir(parents=True, exist_ok=True)
            evaluation_id = f"{table.task}/{identifier}/{retrieved}"
            paths = []
            samples_pointer = None
            instances = instance_records(model, result, evaluation_id) if result.samples else []
            if instances:
                samples_path = folder / f"{name}_samples.jsonl"
                samples_path.write_text("".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n"
                                                for r in instances), encoding="utf-8")
                samples_pointer = {"format": "jsonl", "file_path": (relative / samples_path.name).as_posix(),
                                   "hash_algorithm": "sha256",
                                   "checksum": hashlib.sha256(samples_path.read_bytes()).hexdigest(),
                                   "total_rows": len(instances)}
                paths.append(samples_path)
            record = aggregate_record(model, table, raw, retrieved=retrieved, samples=samples_pointer, generator=generator)
            aggregate = folder / f"{name}.json"
            aggregate.write_text(json.dumps(record, indent=2, ensure_ascii=False, allow_nan=False), encoding="utf-8")
            written[(model.name, table.task)] = [aggregate, *paths]
    return written
