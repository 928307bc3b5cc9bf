"""``hf-probes`` over responses another run generated: the probes of a finished run, with one forward per document.

For an autoregressive model the states the probes read while generating are those of one teacher-forced forward over
prompt + response (``probe_gen_capture=teacher_forced``). :class:`ReplayHFLM` is ``hf-probes`` whose generation step
*replays* the response a finished lm_eval run logged for the document instead of sampling one, and whose
loglikelihood answers *the logged* log-likelihoods: lm_eval then builds, filters and scores the requests as usual,
the accuracy and the responses are the original run's, and every probe row is computed as ``hf-probes`` computes it.

* **Generation.** The logged text (lm_eval's ``resps``: the response as ``generate_until`` answered it, cut at the
  stop strings, *before* the task's filters) is re-encoded with the model's tokenizer — as the continuation of its
  prompt (the ids after the prompt's in the encoding of prompt + response), or alone where that encoding merges
  tokens across the boundary — and appended to the prompt's ids in place of ``model.generate``'s; ``hf-probes`` then runs its one teacher-forced
  forward over prompt + response and probes the kept tokens, exactly as after a real generation. The tokens the
  original run generated are not logged: where their re-encoding differs from them (a tokenizer merge the model did
  not generate, a stop string cut inside a token) the probed tokens are the re-encoded ones
  (:func:`replayed_tokens` says where the text itself does not survive the round trip).
* **Multiple choice / loglikelihood.** The harness's own forward feeds the probes as in ``hf-probes``; each request is
  answered with its logged ``(loglik, is_greedy)``, and the option whose record a task reads is the one the logged
  log-likelihoods choose.
* **Per document, resumable.** Requests are answered a chunk of documents at a time; each finished chunk is handed to
  a :class:`ReplayProgress` (which stores it), and documents it already holds are answered from it without a forward.

Nothing here reads files: what a run logged comes in as :class:`LoggedDocument` objects
(:mod:`lm_eval_probes.probe_run` reads and checks the files).
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import postprocess_generated_text

from lm_eval_probes.harness.hflm import CallScope
from lm_eval_probes.models.autoregressive import ProbeHFLM
from lm_eval_probes.records import PROBE_REQUEST, ProbeLL, ProbeStr, probe_of, probe_request_of

__all__ = ["LoggedDocument", "ReplayError", "ReplayHFLM", "ReplayProgress", "ReplayedTokens", "replayed_tokens"]

GENERATE, LOGLIKELIHOOD = "generate_until", "loglikelihood"
_log = logging.getLogger("lm_eval.lm_eval_probes")  # lm_eval's own log (its handler and --verbosity)


class ReplayError(ValueError):
    """A request the logged run cannot answer (another prompt, another option, a document it did not log)."""


@dataclass(frozen=True)
class LoggedDocument:
    """What a finished lm_eval run logged for one document (one line of its samples file per filter, all alike).

    Attributes:
        source: where it was logged (the samples file), for messages.
        doc_id: the document's index in its task (``doc_id`` of the samples line).
        arguments: per request, in ``idx`` order, the logged arguments (``(context, continuation)`` or
            ``(context, generation kwargs)``).
        responses: per request, its answers (one per repeat): a generated text, or ``(loglik, is_greedy)``.
    """

    source: str
    doc_id: int
    arguments: tuple[tuple[Any, ...], ...]
    responses: tuple[tuple[Any, ...], ...]


class ReplayProgress(Protocol):
    """Where finished documents go, and come back from when a run resumes."""

    def answered(self, task: str, doc_id: int) -> Mapping[tuple[str, int, int], Any] | None:
        """The stored answers of a document, ``(request type, idx, repeat) → response``, or ``None``."""

    def save(self, task: str, answers: Mapping[int, Mapping[tuple[str, int, int], Any]]) -> None:
        """Store the answers of finished documents (``doc_id → answers``)."""


@dataclass(frozen=True)
class ReplayedTokens:
    """A logged response as the replay feeds it to the model.

    Attributes:
        ids: the re-encoded response: the ids after the prompt's in the encoding of prompt + response (so a
            tokenizer that marks word starts, such as SentencePiece's, encodes the response as it continues the
            prompt), or the response encoded alone (no special tokens) where that encoding does not begin with the
            prompt's own ids (``boundary_merge``) or no prompt is given.
        text: what ``generate_until`` answers for them (decoded, cut at the stop strings): the text the probes'
            token offsets refer to.
        round_trip: whether ``text`` equals the logged response (a tokenizer whose decoding normalises text may not).
        lossy: the logged response holds U+FFFD (a generation that decoded to incomplete UTF-8 bytes): the generated
            bytes are not in the text, and its re-encoding is another token sequence.
        stop_merge: whether a stop string appended to the response re-encodes the response's last token into
            another one: then the original generation most likely ended with a token the replay cannot know (the
            stop string was cut inside it), and its last probed token differs.
        boundary_merge: whether the tokenizer merges the prompt's end and the response's start into tokens of both:
            the generation, which began after the prompt's own ids, cannot have made those, so the response is encoded
            alone — which may still differ from what was generated.
    """

    ids: tuple[int, ...]
    text: str
    round_trip: bool
    lossy: bool
    stop_merge: bool
    boundary_merge: bool = False

    @property
    def faithful(self) -> bool:
        """Nothing says that the generated tokens were others (they are not logged, so this is no proof)."""
        return self.round_trip and not self.lossy and not self.stop_merge and not self.boundary_merge


def replayed_tokens(lm: HFLM, text: str, stop: Sequence[str], prompt: str | None = None) -> ReplayedTokens:
    """How ``lm`` replays the logged response ``text`` of the request with prompt ``prompt`` (its context as lm_eval
    logged it; ``None``: the response alone) and stop strings ``stop``."""
    alone = tuple(lm.tok_encode(text, add_special_tokens=False)) if text else ()
    ids, boundary = alone, False
    if text and prompt is not None:
        base = lm.tok_encode(prompt)
        joined = lm.tok_encode(prompt + text)
        if joined[: len(base)] == base:
            ids = tuple(joined[len(base):])
        else:
            boundary = True
    decoded = postprocess_generated_text(lm.tok_decode(list(ids)), list(stop), None)
    merge = False
    for string in stop:
        if text and string:
            extended = lm.tok_encode(text + string, add_special_tokens=False)
            merge = merge or tuple(extended[: len(alone)]) != alone
    return ReplayedTokens(ids, decoded, decoded == text, "\ufffd" in text, merge, boundary)


@dataclass
class _ReplayCall:
    """What one ``generate_until`` chunk hands to the generation step: the logged responses' replayed tokens per
    context, first come first served, and the contexts of the batch being encoded."""

    texts: dict[str, deque[ReplayedTokens]] = field(default_factory=lambda: defaultdict(deque))
    batch: list[str] = field(default_factory=list)


_REPLAY: CallScope[_ReplayCall] = CallScope("hf-probes replay")


class _ReplayedGeneration(HFLM):
    """HFLM's generation step, replayed: ``_model_generate`` returns prompt + the logged response's ids (then EOS and
    padding) without running the model. Sits between ``ProbeHFLM`` and ``HFLM`` in :class:`ReplayHFLM`'s MRO, so
    that ``ProbeHFLM._model_generate`` probes the replayed ids as it probes generated ones."""

    def tok_batch_encode(self, strings: list[str], *args: Any, **kwargs: Any) -> Any:
        call = _REPLAY.of(self)
        if call is not None:
            call.batch = list(strings)
        return super().tok_batch_encode(strings, *args, **kwargs)

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str], **generation_kwargs: Any) -> torch.Tensor:
        call = _REPLAY.of(self)
        if call is None:
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        if len(call.batch) != context.shape[0]:
            raise RuntimeError(f"replay: {context.shape[0]} rows to generate for {len(call.batch)} encoded contexts")
        responses = [list(call.texts[prompt].popleft().ids) for prompt in call.batch]
        eos = self.eot_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        width = max(len(ids) for ids in responses) + 1
        tails = [ids + [eos] + [pad] * (width - len(ids) - 1) for ids in responses]
        sequences = torch.cat([context, torch.tensor(tails, dtype=context.dtype, device=context.device)], dim=1)
        if self.captures.reads("generate"):  # a capture reads the inputs of generate's forwards
            self._forward_once(sequences, generation_kwargs.get("attention_mask"), context.shape[1])
        return sequences

    @torch.no_grad()
    def _forward_once(self, sequences: torch.Tensor, attention_mask: torch.Tensor | None, prompt_len: int) -> None:
        """One forward over the whole replayed batch, as generate's calls together see it (left padding, its
        position ids)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(sequences[:, :prompt_len])
        mask = torch.cat([attention_mask, attention_mask.new_ones(sequences.shape[0], sequences.shape[1] - prompt_len)], 1)
        position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
        self.model(input_ids=sequences, attention_mask=mask, position_ids=position_ids, use_cache=False,
                   **self._one_logit)


class ReplayHFLM(ProbeHFLM, _ReplayedGeneration):
    """``hf-probes`` answering every request from a finished run's logged responses (see the module docstring).

    Args:
        pretrained, **kwargs: as ``hf-probes`` (every HFLM argument, ``probes`` and ``probe_*``);
            ``probe_gen_capture`` must be ``teacher_forced`` (its default here): replayed responses have no decoding
            states.
        logged: ``task name → doc_id → LoggedDocument`` of the run to replay.
        doc_ids: ``task name → the doc_ids evaluated, in order`` when lm_eval evaluates a subset by position
            (``simple_evaluate(samples=…)``: its requests' ``doc_id`` is then the position in that list); a task not
            listed uses the requests' ``doc_id`` as is.
        progress: where finished documents are stored and found again (``None``: nowhere).
        documents_per_chunk: documents answered per call of ``hf-probes`` (and stored at once).

    Raises:
        ValueError: ``probe_gen_capture=generate``.
    """

    def __init__(self, pretrained: Any, *, logged: Mapping[str, Mapping[int, LoggedDocument]],
                 doc_ids: Mapping[str, Sequence[int]] | None = None, progress: ReplayProgress | None = None,
                 documents_per_chunk: int = 64, **kwargs: Any) -> None:
        capture = kwargs.setdefault("probe_gen_capture", "teacher_forced")
        if capture != "teacher_forced":
            raise ValueError(f"probe-run replays logged responses, which have no decoding-time states: "
                             f"probe_gen_capture must be teacher_forced, got {capture!r}")
        if documents_per_chunk < 1:  # before the model loads
            raise ValueError(f"documents_per_chunk must be >= 1, got {documents_per_chunk}")
        super().__init__(pretrained, **kwargs)
        self.replay_from(logged, doc_ids=doc_ids, progress=progress, documents_per_chunk=documents_per_chunk)

    def replay_from(self, logged: Mapping[str, Mapping[int, LoggedDocument]], *,
                    doc_ids: Mapping[str, Sequence[int]] | None = None, progress: ReplayProgress | None = None,
                    documents_per_chunk: int = 64) -> None:
        """Answer from another run's logged responses from now on (the model stays loaded); arguments as
        ``__init__``'s."""
        if documents_per_chunk < 1:
            raise ValueError(f"documents_per_chunk must be >= 1, got {documents_per_chunk}")
        self.logged = logged
        self.doc_ids = {task: list(ids) for task, ids in (doc_ids or {}).items()}
        self.progress = progress
        self.documents_per_chunk = documents_per_chunk

    # ----------------------------------------------------------------------------- requests to documents

    def _document_of(self, request: Instance) -> tuple[LoggedDocument, int]:
        """The logged document of ``request`` and the index of its logged request: for generation the request's
        ``idx``, for a log-likelihood the logged request with the same context and continuation."""
        task = request.task_name
        if task not in self.logged:
            raise ReplayError(f"task {task!r}: the run to probe logged no samples for it")
        doc_id = self._true_doc_id(request)
        document = self.logged[task].get(doc_id)
        if document is None:
            source = next(iter(self.logged[task].values())).source if self.logged[task] else "no samples"
            raise ReplayError(f"{source}: doc_id {doc_id} of task {task!r} is not in the logged samples")
        if request.request_type != GENERATE:
            for index, logged in enumerate(document.arguments):
                if len(logged) >= 2 and (str(logged[0]), str(logged[1])) == (str(request.args[0]), str(request.args[1])):
                    return document, index
            if not any(str(logged[0]) == str(request.args[0]) for logged in document.arguments):
                raise ReplayError(self._prompt_mismatch(document, str(document.arguments[0][0]), str(request.args[0])))
            raise ReplayError(f"{document.source}: doc_id {doc_id}: the task asks for the continuation "
                              f"{request.args[1]!r}, which the run did not log (it logged "
                              f"{[logged[1] for logged in document.arguments if len(logged) > 1]!r:.200})")
        if request.idx >= len(document.arguments):
            raise ReplayError(f"{document.source}: doc_id {doc_id} logged {len(document.arguments)} requests, the task "
                              f"builds request {request.idx}")
        logged = str(document.arguments[request.idx][0])
        if logged != str(request.args[0]):
            raise ReplayError(self._prompt_mismatch(document, logged, str(request.args[0])))
        return document, int(request.idx)

    @staticmethod
    def _prompt_mismatch(document: LoggedDocument, logged: str, built: str) -> str:
        return (f"{document.source}: doc_id {document.doc_id}: the logged prompt differs from the task's "
                f"({_first_difference(logged, built)}); another task version, few-shot setting, chat template or "
                f"system instruction?")

    def _true_doc_id(self, request: Instance) -> int:
        ids = self.doc_ids.get(request.task_name)
        return int(request.doc_id) if ids is None else int(ids[request.doc_id])

    def _chunks(self, requests: Sequence[Instance], positions: Sequence[int]) -> Iterator[dict[tuple[str, int], list[int]]]:
        """``positions`` (of ``requests``) grouped by document, a chunk of ``documents_per_chunk`` documents at a time
        (each document whole)."""
        by_document: dict[tuple[str, int], list[int]] = defaultdict(list)
        for position in positions:
            request = requests[position]
            by_document[request.task_name, self._true_doc_id(request)].append(position)
        documents = list(by_document)
        for start in range(0, len(documents), self.documents_per_chunk):
            yield {key: by_document[key] for key in documents[start : start + self.documents_per_chunk]}

    def _answer(self, requests: list[Instance], kind: str, compute: Callable[[list[int]], list[Any]]) -> list[Any]:
        """Each request's answer: stored ones from the progress, the others computed by ``compute(positions)`` (their
        positions in ``requests``) a chunk of documents at a time, each chunk stored when done."""
        repeat = _repeat_numbers(requests)
        keys = [(kind, int(req.idx), repeat[i]) for i, req in enumerate(requests)]
        out: list[Any] = [None] * len(requests)
        todo = []
        for position, request in enumerate(requests):
            stored = None if self.progress is None else self.progress.answered(request.task_name, self._true_doc_id(request))
            if stored is not None and keys[position] in stored:
                out[position] = stored[keys[position]]
            else:
                todo.append(position)
        total = len({(req.task_name, self._true_doc_id(req)) for req in requests})
        done = total - len({(requests[p].task_name, self._true_doc_id(requests[p])) for p in todo})
        if done:
            _log.info("probe-run %s: %d of %d documents answered by an earlier, interrupted run", kind, done, total)
        for documents in self._chunks(requests, todo):
            positions = [p for members in documents.values() for p in members]
            for position, answer in zip(positions, compute(positions), strict=True):
                out[position] = answer
            if self.progress is not None:
                by_task: dict[str, dict[int, dict[tuple[str, int, int], Any]]] = defaultdict(dict)
                for (task, doc_id), members in documents.items():
                    by_task[task][doc_id] = {keys[p]: out[p] for p in members}
                for task, finished in by_task.items():
                    self.progress.save(task, finished)
            done += len(documents)
            _log.info("probe-run %s: %d of %d documents probed", kind, done, total)
        return out

    # ----------------------------------------------------------------------------- loglikelihood

    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[Any]:
        """The logged ``(loglik, is_greedy)`` of each request, carrying the probe of this model's forward; a
        multiple-choice document's record is that of the option its logged log-likelihoods choose."""
        logged = [self._logged_loglikelihood(req) for req in requests]
        self._choose_from_logged(requests, logged)

        def compute(positions: list[int]) -> list[Any]:
            return super(ReplayHFLM, self).loglikelihood([requests[p] for p in positions], disable_tqdm=True)

        answers = self._answer(requests, LOGLIKELIHOOD, compute)
        return [ProbeLL(value, probe_of(answer)) for value, answer in zip(logged, answers, strict=True)]

    def _logged_loglikelihood(self, request: Instance) -> tuple[float, bool]:
        document, index = self._document_of(request)
        answers = document.responses[index]
        if len(answers) < 1 or not isinstance(answers[0], tuple):
            raise ReplayError(f"{document.source}: doc_id {document.doc_id}: request {index} logged "
                              f"{answers!r}, not a log-likelihood")
        return answers[0]

    def _choose_from_logged(self, requests: Sequence[Instance], logged: Sequence[tuple[float, bool]]) -> None:
        """Each multiple-choice request's :class:`~lm_eval_probes.records.ProbeRequest` chooses from the logged
        log-likelihoods of its document's options, not this model's."""
        by_document: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
        for request, (loglik, _greedy) in zip(requests, logged, strict=True):
            by_document[request.task_name, self._true_doc_id(request)][int(request.idx)] = loglik
        for request in requests:
            probe_request = probe_request_of(request)
            if probe_request is None or probe_request.options is None or probe_request.choose is None:
                continue
            options = by_document[request.task_name, self._true_doc_id(request)]
            logliks = [options.get(i) for i in range(probe_request.options)]
            if None in logliks:
                continue
            original = probe_request.choose
            setattr(request, PROBE_REQUEST, replace(probe_request, choose=lambda _computed, o=original, l=logliks: o(l)))

    # ----------------------------------------------------------------------------- generation

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[Any]:
        """The logged text of each request, carrying the probe of this model's teacher-forced forward over prompt +
        its re-encoded tokens."""
        repeat = _repeat_numbers(requests)
        texts = []
        for i, request in enumerate(requests):
            document, index = self._document_of(request)
            answers = document.responses[index]
            if repeat[i] >= len(answers) or not isinstance(answers[repeat[i]], str):
                raise ReplayError(f"{document.source}: doc_id {document.doc_id}: logged {len(answers)} responses "
                                  f"{answers!r:.80}, the task asks for generation {repeat[i] + 1}")
            texts.append(answers[repeat[i]])

        def compute(positions: list[int]) -> list[Any]:
            call = _ReplayCall()
            replayed = {p: replayed_tokens(self, texts[p], _stop_strings(self, requests[p]), requests[p].args[0])
                        for p in positions}  # once per response: the prompt's encoding is the long part
            for p in positions:
                call.texts[requests[p].args[0]].append(replayed[p])
            chunk = [requests[p] for p in positions]
            with _REPLAY.running(self, call):
                answered = super(ReplayHFLM, self).generate_until(chunk, disable_tqdm=True)
            # rows sharing a context may have been given each other's texts: hand each its own text's probe
            probes: dict[tuple[str, str], deque[Any]] = defaultdict(deque)
            for request, answer in zip(chunk, answered, strict=True):
                probes[request.args[0], str(answer)].append(probe_of(answer))
            out = []
            for p in positions:
                queue = probes.get((requests[p].args[0], replayed[p].text))
                out.append(ProbeStr(texts[p], queue.popleft() if queue else None))
            return out

        return self._answer(requests, GENERATE, compute)


def _stop_strings(lm: HFLM, request: Instance) -> list[str]:
    """The stop strings HFLM cuts a request's generation at (its ``until`` and the EOS text)."""
    from lm_eval.models.utils import handle_stop_sequences

    kwargs = request.args[1] if len(request.args) > 1 and isinstance(request.args[1], dict) else {}
    return handle_stop_sequences(kwargs.get("until"), eos=lm.tok_decode(lm.eot_token_id, skip_special_tokens=False))


def _repeat_numbers(requests: Sequence[Instance]) -> list[int]:
    """Which repeat each request is (lm_eval lists a request with ``repeats`` > 1 that many times, the same object)."""
    seen: dict[int, int] = defaultdict(int)
    numbers = []
    for request in requests:
        numbers.append(seen[id(request)])
        seen[id(request)] += 1
    return numbers


def _first_difference(logged: str, built: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(logged, built)) if a != b), min(len(logged), len(built)))
    return (f"first difference at character {at}: logged {logged[max(0, at - 20): at + 20]!r}, "
            f"task {built[max(0, at - 20): at + 20]!r}")
