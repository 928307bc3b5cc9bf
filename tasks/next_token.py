"""Next-token prompts: one prediction per document (``probes_next_token``, the δ_TCB paper's setting).

The δ_TCB paper reads one next-token prediction per prompt, on 309 "diverse" prompts and 360 "low-V_eff" prompts
that are not published. This task is a stand-in built from text the plugin already reads: every document is a prompt
from one of seven sources — GSM8K questions, MATH-500 problems, ProofWriter and StepGame stories (local files or the
hub, as their own tasks), and the synthetic arithmetic, logic and recall documents (offline) — cut in one of three
forms, so that the next token ranges from open to nearly determined:

* ``open``: the text cut after a whole word (at least four words in); the next token starts a new word.
* ``inside``: the text cut inside a word of at least six letters (at least three words in), after its first two
  letters or more; the next token completes the word.
* ``answer``: the whole question followed by ``Answer:``; the next token starts the answer.

The model answers with one greedy token (``max_gen_toks: 1``), so each document's probes are read at exactly one
position, the prompt's last. ``next_token_match`` is 1 when that token agrees with the text: the continuation the
cut removed (``open``, ``inside``) or the answer (``answer``) starts with it, leading spaces aside.
Which form and where a text is cut come from :func:`~lm_eval_probes.tasks.seeded_generation.seeded_random` of
(seed, source, index): the same documents in every process. Documents alternate over the sources, so any
``--limit`` prefix holds them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import datasets

from lm_eval_probes.tasks import loaders
from lm_eval_probes.tasks.seeded_generation import seeded_random
from lm_eval_probes.tasks.synth_arith import generate_arith
from lm_eval_probes.tasks.synth_logic import generate_logic
from lm_eval_probes.tasks.synth_recall import generate_recall

FORMS = ("open", "inside", "answer")
MIN_OPEN_WORDS = 4
MIN_INSIDE_LETTERS = 6
CONTINUATION_CHARS = 40
"""How much of the text after an ``open`` or ``inside`` cut a document keeps as its continuation."""


def _benchmark(name: str, process: Callable[[datasets.Dataset], datasets.Dataset], split: str,
               convert: Callable[[dict[str, Any]], tuple[str, str, str]]) -> Callable[..., list[tuple[str, str, str]]]:
    def load(n: int, seed: int, metadata: dict[str, Any]) -> list[tuple[str, str, str]]:
        dataset = process(loaders.load_benchmark(name, metadata)[split])
        return [convert(doc) for doc in dataset.select(range(min(n, len(dataset))))]

    return load


def _synthetic(generate: Callable[..., list[dict[str, Any]]], levels: int,
               convert: Callable[[dict[str, Any]], tuple[str, str, str]]) -> Callable[..., list[tuple[str, str, str]]]:
    def load(n: int, seed: int, metadata: dict[str, Any]) -> list[tuple[str, str, str]]:
        return [convert(doc) for doc in generate(-(-n // levels), seed=seed)[:n]]

    return load


SOURCES: dict[str, Callable[[int, int, dict[str, Any]], list[tuple[str, str, str]]]] = {
    # name → load(n, seed, metadata) → n × (text, question prompt, answer)
    "gsm8k": _benchmark("gsm8k", loaders.process_gsm8k, "test",
                        lambda d: (d["question"], f"Question: {d['question']}\nAnswer:", d["target"])),
    "math500": _benchmark("math500", loaders.process_math500, "test",
                          lambda d: (d["problem"], f"Problem: {d['problem']}\nAnswer:", d["answer"])),
    "proofwriter": _benchmark("proofwriter", loaders.process_proofwriter, "test",
                              lambda d: (f"{d['theory']} {d['question']}", loaders.proofwriter_prompt(d), d["answer"])),
    "stepgame": _benchmark("stepgame", loaders.process_stepgame, "test",
                           lambda d: (f"{d['story_text']} {d['question']}",
                                      f"{d['story_text']}\nQuestion: {d['question']}\nAnswer:", d["relation"])),
    "synth_arith": _synthetic(generate_arith, 5,
                              lambda d: (d["question"], f"Question: {d['question']}\nAnswer:", d["answer"])),
    "synth_logic": _synthetic(generate_logic, 6,
                              lambda d: (f"{d['theory']} {d['question']}",
                                         f"{d['theory']}\nQuestion: Is the statement \"{d['question']}\" True or "
                                         f"False?\nAnswer:", d["answer"])),
    "synth_recall": _synthetic(generate_recall, 5,
                               lambda d: (f"{d['context']} {d['question']}",
                                          f"{d['context']}\nQuestion: {d['question']}\nAnswer:", d["answer"])),
}
"""Every source of prompts, in the order documents alternate over them."""


def cut(text: str, question: str, answer: str, form: str, rng: Any) -> tuple[str, str] | None:
    """(prompt, continuation) of one text in ``form``, or ``None`` when the text cannot be cut so (too short, or
    no long word)."""
    if form == "answer":
        return question, f" {answer}"
    words = text.split()
    if form == "open":
        if len(words) <= MIN_OPEN_WORDS:
            return None
        k = rng.randrange(MIN_OPEN_WORDS, len(words))
        return " ".join(words[:k]), (" " + " ".join(words[k:]))[:CONTINUATION_CHARS]
    if form == "inside":
        long_words = [i for i, word in enumerate(words) if i >= MIN_OPEN_WORDS - 1 and word[:2].isalpha()
                      and sum(c.isalpha() for c in word) >= MIN_INSIDE_LETTERS]
        if not long_words:
            return None
        i = rng.choice(long_words)
        split = rng.randrange(2, len(words[i]) - 2)
        before = " ".join(words[:i] + [words[i][:split]])
        return before, (words[i][split:] + " " + " ".join(words[i + 1:]))[:CONTINUATION_CHARS]
    raise ValueError(f"unknown form {form!r}; valid: {FORMS}")


def documents(sources: Sequence[str], n_per_source: int, seed: int, metadata: dict[str, Any]) -> list[dict[str, Any]]:
    """``n_per_source`` documents of each source (fewer where a source has fewer texts), alternating over the
    sources; a source's i-th text takes form ``FORMS[i % 3]`` (the next form that can cut it)."""
    unknown = [name for name in sources if name not in SOURCES]
    if unknown:
        raise ValueError(f"probes_next_token: unknown source(s) {unknown}; valid: {', '.join(SOURCES)}")
    if n_per_source < 1:
        raise ValueError(f"probes_next_token: n_per_source must be >= 1, got {n_per_source}")
    per_source = [_source_documents(name, n_per_source, seed, metadata) for name in sources]
    return [docs[i] for i in range(max(map(len, per_source), default=0)) for docs in per_source if i < len(docs)]


def _source_documents(name: str, n: int, seed: int, metadata: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for index, (text, question, answer) in enumerate(SOURCES[name](n, seed, metadata)):
        rng = seeded_random("next_token", seed, name, index)
        for form in _forms_from(index):
            made = cut(text, question, str(answer), form, rng)
            if made is not None:
                prompt, continuation = made
                out.append({"id": f"{name}-{index}", "source": name, "form": form, "prompt": prompt,
                            "continuation": continuation})
                break
    return out


def _forms_from(index: int) -> Iterable[str]:
    return (FORMS[(index + k) % len(FORMS)] for k in range(len(FORMS)))


def next_token_dataset(*, n_per_source: int = 60, seed: int = 1234, sources: Sequence[str] | str | None = None,
                       **metadata: Any) -> datasets.DatasetDict:
    """The task's ``test`` split for lm-eval's ``custom_dataset`` hook (``dataset_kwargs``: ``n_per_source``,
    ``seed``, ``sources``, a list or a ``+``-joined string; the run's metadata: ``probes_data_dir`` and
    ``<benchmark>_files`` for the benchmarks, as their own tasks)."""
    names = list(SOURCES) if sources is None else (sources.split("+") if isinstance(sources, str) else list(sources))
    docs = documents(names, int(n_per_source), int(seed), metadata)
    features = datasets.Features({key: datasets.Value("string")
                                  for key in ("id", "source", "form", "prompt", "continuation")})
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs, features=features)})


def next_token_match(doc: dict[str, Any], results: list[Any]) -> dict[str, int]:
    """``next_token_match``: 1 when the generated token is not blank and the continuation starts with it, leading
    spaces of both aside."""
    generated = str(results[0]).lstrip()
    return {"next_token_match": int(bool(generated.strip()) and doc["continuation"].lstrip().startswith(generated))}
