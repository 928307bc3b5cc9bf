"""A samples line as lm_eval writes it: its prompt, a multiple-choice document's options with their log-likelihoods,
the option the model chose and the gold one(s), and the response as text.

lm_eval (0.4.x, ``EvaluationTracker.save_results_samples``) writes ``arguments`` as ``{"gen_args_<i>": {"arg_0":
context, "arg_1": continuation}}``, passes ``resps`` and ``filtered_resps`` through ``sanitize_list`` (every leaf a
string: an option's ``(log-likelihood, is_greedy)`` becomes ``["-3.7195138931274414", "False"]``) and writes
``target`` as ``str(target)`` (an option's index ``1`` becomes ``"1"``, a list of gold indices ``"[0, 2]"``). Lines
written by hand or by older tools may hold the numbers themselves; both read alike here. Torch-free.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Mapping
from typing import Any

NORMALISED_METRICS = frozenset({"acc_norm"})
"""Correctness rows whose choice is the highest log-likelihood per character of the option (lm_eval's ``acc_norm``)."""


def number(value: Any) -> float | None:
    """A finite number, or a string lm_eval wrote for one (``"-3.71"``); ``None`` for anything else (``nan``, text).
    Booleans and the strings ``"True"``/``"False"`` are no numbers here."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, str):
        try:
            parsed = float(value)
        except ValueError:
            return None
        return parsed if math.isfinite(parsed) else None
    return None


def arguments(line: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The requests' arguments of a samples line, in request order (``{"arg_0": context, "arg_1": continuation}``
    each); lm_eval writes ``{"gen_args_0": {…}, …}``, older files ``[[context, continuation], …]``."""
    found = line.get("arguments")
    if isinstance(found, Mapping):
        def order(key: str) -> int:
            tail = key.rsplit("_", 1)[-1]
            return int(tail) if tail.isdigit() else 0
        return [found[k] for k in sorted(found, key=order) if isinstance(found[k], Mapping)]
    if isinstance(found, list):
        return [{f"arg_{i}": v for i, v in enumerate(item)} for item in found if isinstance(item, list)]
    return []


def prompt_text(line: Mapping[str, Any]) -> str:
    """The context the model saw (its first request's)."""
    found = arguments(line)
    return str(found[0].get("arg_0", "")) if found else ""


def options(line: Mapping[str, Any]) -> list[str]:
    """A multiple-choice document's options (the continuations of its requests, with the task's target delimiter);
    ``[]`` for a generation (whose ``arg_1`` is its generation arguments) or a single request."""
    texts = [a.get("arg_1") for a in arguments(line)]
    return [str(t) for t in texts] if len(texts) > 1 and all(isinstance(t, str) for t in texts) else []


def _loglikelihood(response: Any) -> float | None:
    """One option's log-likelihood from its response: ``[ll, is_greedy]`` (numbers or lm_eval's strings), ``[[ll,
    is_greedy]]`` (``resps``), a bare number, or the text of a tuple (``"(-3.7, False)"``)."""
    if isinstance(response, (list, tuple)):
        if not response:
            return None
        first = response[0]
        return _loglikelihood(first) if isinstance(first, (list, tuple)) else number(first)
    if isinstance(response, str) and response.startswith("("):
        try:
            parsed = ast.literal_eval(response)
        except (ValueError, SyntaxError):
            return None
        return _loglikelihood(parsed) if isinstance(parsed, tuple) else None
    return number(response)


def option_logliks(line: Mapping[str, Any]) -> list[float] | None:
    """Each option's log-likelihood (from ``filtered_resps``, else ``resps``), in option order; ``None`` when the line
    is no multiple-choice document or one of them is missing."""
    count = len(options(line))
    if count < 2:
        return None
    for key in ("filtered_resps", "resps"):
        responses = line.get(key)
        if isinstance(responses, list) and len(responses) == count:
            values = [_loglikelihood(r) for r in responses]
            if all(v is not None for v in values):
                return values  # type: ignore[return-value]
    return None


def chosen_index(line: Mapping[str, Any], metric: str | None = None) -> int | None:
    """The option the model chose: the highest log-likelihood (ties: the first, as ``numpy.argmax``); under a
    length-normalised row (:data:`NORMALISED_METRICS`) the highest per character of the option. ``None`` for no
    multiple choice."""
    logliks = option_logliks(line)
    if logliks is None:
        return None
    if metric in NORMALISED_METRICS:
        texts = options(line)
        logliks = [ll / max(len(text), 1) for ll, text in zip(logliks, texts, strict=True)]
    return max(range(len(logliks)), key=lambda k: (logliks[k], -k))


def _as_index(value: Any, count: int) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < count else None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return _as_index(int(value.strip()), count)
    return None


def gold_indices(line: Mapping[str, Any]) -> list[int] | None:
    """The gold options' indices of a multiple-choice document, from ``target``: an index (``1`` or lm_eval's
    ``"1"``), a list of indices (``[0, 2]`` or ``"[0, 2]"``), or an option's text (a task whose ``doc_to_target``
    gives the text; compared without the target delimiter's spaces). ``None`` when the line is no multiple choice or
    the target names no option."""
    choices = options(line)
    if not choices:
        return None
    target = line.get("target")
    if isinstance(target, str) and target.strip().startswith("["):
        try:
            target = json.loads(target)
        except ValueError:
            pass
    if isinstance(target, list):
        found = [_as_index(t, len(choices)) for t in target]
        return found if found and all(i is not None for i in found) else None  # type: ignore[return-value]
    index = _as_index(target, len(choices))
    if index is not None:
        return [index]
    if isinstance(target, str):
        stripped = [c.strip() for c in choices]
        if target.strip() in stripped:
            return [stripped.index(target.strip())]
    return None


def gold_text(line: Mapping[str, Any]) -> str:
    """The gold answer as text: a multiple-choice document's gold option(s) (``" | "`` between several), otherwise
    lm_eval's ``target`` as it wrote it."""
    indices = gold_indices(line)
    if indices is not None:
        choices = options(line)
        return " | ".join(choices[i] for i in indices)
    target = line.get("target")
    return "" if target is None else str(target)


def response_text(line: Mapping[str, Any], metric: str | None = None) -> str:
    """The generated text; for a multiple-choice document the text of the option the model chose
    (:func:`chosen_index` under the correctness row ``metric``)."""
    chosen = chosen_index(line, metric)
    if chosen is not None:
        return options(line)[chosen]
    filtered = line.get("filtered_resps") or []
    if filtered:
        first = filtered[0]
        while isinstance(first, list) and len(first) == 1:
            first = first[0]
        return first if isinstance(first, str) else json.dumps(first, ensure_ascii=False)
    return ""


def choice_summary(line: Mapping[str, Any], metric: str | None = None) -> dict[str, Any] | None:
    """One model's answer to a multiple-choice document as the documents view shows it: ``logliks`` (each option's,
    6 significant digits) and ``chosen`` (the chosen option's index); ``None`` for a generation."""
    logliks = option_logliks(line)
    if logliks is None:
        return None
    return {"logliks": [float(f"{v:.6g}") for v in logliks], "chosen": chosen_index(line, metric)}
