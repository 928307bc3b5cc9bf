"""Synthetic lm_eval runs whose samples look like ``hf-probes``' with ``probe_traces=true`` (the documents view's
tests, its screenshots and ``benchmarks/documents_view.py``): multiple-choice documents (``arguments`` of one request
per option, ``filtered_resps`` their ``[loglik, is_greedy]``, ``acc`` of the highest log-likelihood against the target
index) and generations (``exact_match`` of the text against the target), each with its confidence, probe values and
a trace whose arrays reduce to them (``logprob`` sums to the chosen option's log-likelihood)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

DATE = "2026-01-01T00-00-00"
MARKUP = '<script>window.__injected = 1</script><img src="x" onerror="window.__injected = 2">'
"""Text that a page inserting documents as markup would run."""

WORDS = ("the", "cat", "sat", "on", "a", "mat", "if", "then", "all", "birds", "fly", "is", "red", "Tom", "true")


def _tokens(rng: np.random.Generator, n: int) -> list[str]:
    return [" " + str(rng.choice(WORDS)) for _ in range(n)]


def _mean_to(rng: np.random.Generator, n: int, mean: float, spread: float) -> list[float]:
    """``n`` numbers (4 significant digits) whose mean is ``mean`` (the last one takes the rest)."""
    values = list(mean + spread * rng.standard_normal(n - 1)) if n > 1 else []
    values.append(mean * n - math.fsum(values))
    return [float(f"{v:.4g}") for v in values]


def trace_of(rng: np.random.Generator, tokens: list[str], loglik: float, values: dict[str, float],
             prompt_tokens: list[str]) -> dict[str, Any]:
    """A trace of ``tokens``: ``logprob`` summing to ``loglik``; each probe array averaging to its value; margins over
    the prompt and the response's inputs."""
    n = len(tokens)
    per_token = loglik / n
    logprob = [min(0.0, v) for v in _mean_to(rng, n, per_token, 0.2 * abs(per_token) + 0.01)]
    logprob[-1] = float(f"{loglik - math.fsum(logprob[:-1]):.4g}")
    trace: dict[str, Any] = {"tokens": tokens, "logprob": logprob,
                             "tcb_log10": _mean_to(rng, n, values["tcb_log10"], 0.3),
                             "bte_step": _mean_to(rng, n, values["bte_energy"], 0.02)}
    sequence = prompt_tokens + tokens[:-1]
    trace["margin"] = [None] + [float(f"{v:.4g}") for v in rng.normal(2.0, 1.0, len(sequence) - 1)]
    trace["sequence_tokens"] = sequence
    trace.update(lens_of(rng, tokens, [math.exp(v) for v in logprob]))
    return trace


LENS_LAYERS = 12
"""L of the synthetic traces' lens grids (every layer 0..L kept, as with ``probe_bte_profile=full``)."""


def lens_of(rng: np.random.Generator, tokens: list[str], final_prob: list[float]) -> dict[str, Any]:
    """A lens grid shaped like ``hf-probes``' (``lens``, ``lens_layers``, ``lens_tokens``, ``focal_depth``): at each
    position the emitted token's probability rises with depth to ``final_prob`` at L; below a commitment layer the
    lens's top token is another word. Token ids: the words' 100 + index, each emitted token 5000 + its position."""
    layers = list(range(LENS_LAYERS + 1))
    top, top_prob, emitted_prob = [[] for _ in layers], [[] for _ in layers], [[] for _ in layers]
    commit: list[int | None] = []
    for position, final in enumerate(final_prob):
        committed = int(rng.integers(LENS_LAYERS // 2, LENS_LAYERS + 1))
        wins_at_end = final > 0.2 or rng.random() < 0.5
        commit.append(committed if wins_at_end else None)
        for layer in layers:
            p = final / (1.0 + math.exp(-(layer - committed + 1.5)))  # rises towards the final probability
            p = final if layer == LENS_LAYERS else p
            if wins_at_end and layer >= committed:
                top[layer].append(5000 + position)
                top_prob[layer].append(float(f"{p:.4g}"))
            else:
                top[layer].append(100 + int(rng.integers(len(WORDS))))
                top_prob[layer].append(float(f"{min(1.0, p + 0.05 + 0.4 * rng.random()):.4g}"))
            emitted_prob[layer].append(float(f"{p:.4g}"))
    names = {str(100 + k): " " + word for k, word in enumerate(WORDS)}
    names.update({str(5000 + position): token for position, token in enumerate(tokens)})
    used = {str(t) for row in top for t in row}
    return {"focal_depth": 5, "lens": {"top_token": top, "top_prob": top_prob, "emitted_prob": emitted_prob,
                                       "commit_layer": commit},
            "lens_layers": layers, "lens_tokens": {k: v for k, v in names.items() if k in used}}


def multiple_choice_line(rng: np.random.Generator, doc_id: int, skill: float, *, traces: bool, prompt: str,
                         options: Sequence[str], prompt_tokens: list[str], target: int) -> dict[str, Any]:
    """One model's line of a multiple-choice document whose gold option is ``target`` (the document's, the same for
    every model)."""
    logliks = [float(f"{v:.4g}") for v in -rng.gamma(2.0, 2.0, len(options))]
    if rng.random() < skill:  # the model prefers the gold option
        logliks[target] = max(logliks) + float(rng.gamma(1.0, 1.0))
    chosen = int(np.argmax(logliks))
    shifted = np.exp(np.array(logliks) - max(logliks))
    confidence = float(shifted[chosen] / shifted.sum())
    values = {"tcb_log10": float(rng.normal(2.0, 0.5)), "bte_energy": float(rng.uniform(0.05, 0.4))}
    tokens = [" " + part for part in options[chosen].split()] or [options[chosen]]
    line: dict[str, Any] = {
        "doc_id": doc_id, "doc": {"question": prompt}, "target": target,
        "arguments": {f"gen_args_{k}": {"arg_0": prompt, "arg_1": option} for k, option in enumerate(options)},
        "resps": [[[v, False]] for v in logliks], "filtered_resps": [[v, False] for v in logliks],
        "filter": "none", "metrics": ["acc", "confidence", "tcb_log10", "bte_energy", "response_tokens"],
        "acc": int(chosen == target), "confidence": confidence, **values, "response_tokens": len(tokens),
    }
    if traces:
        line["trace"] = trace_of(rng, tokens, logliks[chosen], values, prompt_tokens)
        line["metrics"].append("trace")
    return line


def generation_line(rng: np.random.Generator, doc_id: int, skill: float, *, traces: bool, prompt: str,
                    answer: str, prompt_tokens: list[str], text: str | None = None) -> dict[str, Any]:
    right = rng.random() < skill
    text = text if text is not None else answer if right else str(int(rng.integers(100)))
    tokens = [text] + _tokens(rng, int(rng.integers(1, 6)))
    text = "".join(tokens)
    loglik = float(-rng.gamma(2.0, 1.0)) * len(tokens)
    values = {"tcb_log10": float(rng.normal(2.0, 0.5)), "bte_energy": float(rng.uniform(0.05, 0.4))}
    line: dict[str, Any] = {
        "doc_id": doc_id, "doc": {"question": prompt}, "target": answer,
        "arguments": {"gen_args_0": {"arg_0": prompt, "arg_1": {"until": ["\n"], "max_gen_toks": 16}}},
        "resps": [[text]], "filtered_resps": [text], "filter": "none",
        "metrics": ["exact_match", "confidence", "tcb_log10", "bte_energy", "response_tokens"],
        "exact_match": float(text.strip() == answer), "confidence": math.exp(loglik / len(tokens)), **values,
        "response_tokens": len(tokens),
    }
    if traces:
        line["trace"] = trace_of(rng, tokens, loglik, values, prompt_tokens)
        line["metrics"].append("trace")
    return line


def task_lines(task: str, kind: str, n_docs: int, skill: float, seed: int, *, traces: bool = True,
               prompt_length: int = 24, markup_doc: int | None = None) -> list[dict[str, Any]]:
    """``n_docs`` samples lines of one model on ``task`` (``mc`` or ``gen``); the prompt of ``markup_doc`` (and, for a
    generation, its response) holds :data:`MARKUP`. Documents' prompts, options and gold answers depend on the task only."""
    rng = np.random.default_rng(seed)
    lines = []
    for doc_id in range(n_docs):
        text_rng = np.random.default_rng([doc_id, len(task)])
        prompt_tokens = ["Question", " " + str(doc_id), ":", *_tokens(text_rng, prompt_length), "\n", "Answer", ":"]
        if doc_id == markup_doc:
            prompt_tokens = [MARKUP, " ", *prompt_tokens]
        prompt = "".join(prompt_tokens)
        if kind == "mc":
            options = [" True", " False", " Unknown", " " + (MARKUP if doc_id == markup_doc else "Maybe")]
            line = multiple_choice_line(rng, doc_id, skill, traces=traces, prompt=prompt, options=options,
                                        prompt_tokens=prompt_tokens, target=int(text_rng.integers(len(options))))
        else:
            line = generation_line(rng, doc_id, skill, traces=traces, prompt=prompt, answer=str(doc_id % 97),
                                   prompt_tokens=prompt_tokens, text=MARKUP if doc_id == markup_doc else None)
        lines.append(line)
    return lines


def as_lm_eval_writes(line: dict[str, Any]) -> dict[str, Any]:
    """``line`` as lm_eval's ``EvaluationTracker.save_results_samples`` writes it: ``resps`` and ``filtered_resps``
    through its ``sanitize_list`` (every leaf a string), ``target`` as ``str(target)``."""
    from lm_eval.utils import sanitize_list

    return {**line, "resps": sanitize_list(line["resps"]), "filtered_resps": sanitize_list(line["filtered_resps"]),
            "target": str(line["target"])}


def write_document_run(root: Path, model: str, tasks: dict[str, list[dict[str, Any]]]) -> Path:
    """One lm_eval run folder of ``model``: ``results_<date>.json`` (each row the mean of its per-document values)
    and one samples file per task, its lines as lm_eval writes them (:func:`as_lm_eval_writes`)."""
    folder = root / model.replace("/", "__")
    folder.mkdir(parents=True)
    results, higher, configs, n_samples = {}, {}, {}, {}
    for task, lines in tasks.items():
        rows: dict[str, Any] = {"alias": task}
        correctness = "acc" if "acc" in lines[0] else "exact_match"
        for metric in (correctness, "confidence", "tcb_log10", "bte_energy", "response_tokens"):
            values = np.array([line[metric] for line in lines], dtype=float)
            rows[f"{metric},none"] = float(values.mean())
            rows[f"{metric}_stderr,none"] = float(values.std(ddof=1) / math.sqrt(len(values)))
        results[task] = rows
        higher[task] = {correctness: True, "confidence": True, "tcb_log10": True, "bte_energy": False,
                        "response_tokens": False}
        configs[task] = {"metadata": {}}
        n_samples[task] = {"original": len(lines), "effective": len(lines)}
        with (folder / f"samples_{task}_{DATE}.jsonl").open("w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(as_lm_eval_writes(line), ensure_ascii=False) + "\n" for line in lines)
    data = {"results": results, "higher_is_better": higher, "configs": configs, "n-samples": n_samples,
            "model_name": model, "config": {"model": "hf-probes", "model_args": f"pretrained={model},probe_traces=true"}}
    (folder / f"results_{DATE}.json").write_text(json.dumps(data), encoding="utf-8")
    return folder


def write_document_runs(root: Path, models: int, tasks: int, documents: int, *, traces: bool = True,
                        prompt_length: int = 24, markup_doc: int | None = None) -> list[str]:
    """``models`` runs over ``tasks`` tasks (alternately multiple choice and generation) of ``documents`` documents
    each; returns the model names."""
    names = [f"model-{m:02d}" for m in range(models)]
    for m, name in enumerate(names):
        skill = 0.3 + 0.6 * m / max(models - 1, 1)
        runs = {}
        for t in range(tasks):
            kind = "mc" if t % 2 == 0 else "gen"
            task = f"synthetic_{kind}_{t:02d}"
            runs[task] = task_lines(task, kind, documents, skill, seed=1000 * m + t, traces=traces,
                                    prompt_length=prompt_length, markup_doc=markup_doc)
        write_document_run(root, name, runs)
    return names


def write_lm_eval_runs(root: Path, model_dirs: dict[str, str], data_dir: Path, *, tasks: Sequence[str], limit: int,
                       probes: str = "tcb+bte", model: str = "hf-probes", **model_args: str) -> dict[str, Path]:
    """Runs that lm_eval itself writes (``simple_evaluate`` then its ``EvaluationTracker``, as ``lm-eval-probes run
    --log_samples --output_path``): ``model`` (``hf-probes``, or ``hf-probes-diffusion`` on a masked LM) with
    ``probe_traces=true`` on each of ``model_dirs`` (label → tiny model folder), one output folder per label under
    ``root``; its samples hold lm_eval's strings (a log-likelihood ``"-3.71"``, a target ``"1"``)."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker

    import lm_eval_probes

    out = {}
    for label, model_dir in model_dirs.items():
        tracker = EvaluationTracker(output_path=str(root / label))
        results = lm_eval.simple_evaluate(
            model=model, model_args={"pretrained": model_dir, "probes": probes, "probe_traces": "true", **model_args},
            tasks=list(tasks), limit=limit, device="cpu", batch_size=4, log_samples=True, evaluation_tracker=tracker,
            gen_kwargs={"max_gen_toks": 4},
            task_manager=lm_eval_probes.ProbeTaskManager(include_path=lm_eval_probes.tasks_dir(),
                                                         metadata={"probes_data_dir": str(data_dir)}))
        samples = results.pop("samples")
        tracker.save_results_aggregated(results=results, samples=samples)
        for task in results["configs"]:
            tracker.save_results_samples(task_name=task, samples=samples[task])
        out[label] = root / label
    return out
