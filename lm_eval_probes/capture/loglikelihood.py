"""The bookkeeping of one ``loglikelihood`` call: each answered request's states taken out of the harness's own
forwards and probed once it is known whether the lens must read them.

* :class:`LensPlan` — which answered requests need the lens (of a multiple-choice document, only the option the
  task reads);
* :class:`RequestRows` — which request each row of a batch holds (found by its ids), and :func:`logits_read_only`, the
  pre-hook that tells it every batch and has the model unembed only the positions HFLM reads;
* :class:`LoglikelihoodRows` — the rows of each forward in, each answered request's probe out (:func:`loglikelihood_rows`
  holds its hooks).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lm_eval_probes.capture.plan import ProbePlan
from lm_eval_probes.capture.positions import HiddenStateTap, hidden_state_tap, position_probes_of_spans, span_positions
from lm_eval_probes.capture.calls import CallCaptures
from lm_eval_probes.capture.readouts import LensReadout
from lm_eval_probes.records import ResponseProbe


@dataclass(frozen=True)
class OptionGroup:
    """The options of one multiple-choice document: their request keys in option order, and the rule that
    picks the option whose record the task reads (``choose(option logliks) -> index``, ``None``: none)."""

    keys: tuple[Any, ...]
    choose: Callable[[Sequence[float]], int | None]


class LensPlan:
    """Which answered requests need the logit lens (δ_TCB, BTE): every request, except the options of a
    multiple-choice document, where only the option the task reads (the chosen one) does.

    :meth:`answered` takes each answer and returns the keys whose need became known: a key outside every
    group (or in ``always``) at once; a group's other keys once all its options are answered.
    """

    def __init__(self, groups: Sequence[OptionGroup] = (), always: Iterable[Any] = ()) -> None:
        self._groups = list(groups)
        self._groups_of: dict[Any, list[int]] = defaultdict(list)
        for index, group in enumerate(self._groups):
            for key in dict.fromkeys(group.keys):
                self._groups_of[key].append(index)
        self._always = set(always)
        self._open = [len(set(group.keys)) for group in self._groups]  # options not answered yet
        self._undecided = {key: len(indices) for key, indices in self._groups_of.items()}
        self._logliks: dict[Any, float] = {}
        self._needed: set[Any] = set()
        self._decided: set[Any] = set()

    def answered(self, key: Any, loglik: float) -> list[tuple[Any, bool]]:
        """``key`` was answered with ``loglik``: the ``(key, needs the lens)`` pairs decided by it."""
        if key in self._logliks:  # a repeated request: counted once
            return []
        self._logliks[key] = loglik
        decided = []
        if key in self._always or key not in self._groups_of:
            decided.append((key, True))
            self._decided.add(key)
        for index in self._groups_of.get(key, ()):
            self._open[index] -= 1
            if self._open[index]:
                continue
            group = self._groups[index]
            chosen = group.choose([self._logliks[k] for k in group.keys])
            if chosen is not None:
                self._needed.add(group.keys[chosen])
            for member in dict.fromkeys(group.keys):
                self._undecided[member] -= 1
                if not self._undecided[member] and member not in self._decided:
                    decided.append((member, member in self._needed))
                    self._decided.add(member)
        return decided


class RequestRows:
    """HFLM's rows of one ``loglikelihood`` call: which request each row of a batch holds.

    HFLM tokenizes the call's requests (:meth:`note_requests`: a request's row is its context and all but the last
    continuation token, cut to the last ``max_length`` tokens; several requests may share a row), then runs one
    forward per batch of rows right-padded with id 0 (:meth:`new_batch` finds each row's request row by its ids) and
    answers the batch's requests (:meth:`locate`: where the latest batch holds one).
    """

    def __init__(self, *, keep_continuations: bool = False) -> None:
        self.continuations: dict[Any, tuple[int, ...]] | None = {} if keep_continuations else None
        """With ``keep_continuations`` (``probe_traces=true``): each request's continuation ids, for its trace."""
        self._requests: dict[Any, tuple[int, int, int]] = {}  # key → (hash of its row's ids, row length, continuation tokens)
        self._reads_from_end: dict[int, int] = {}  # hash of a row's ids → the most positions any of its requests reads
        self._batch_rows: dict[int, int] = {}  # hash of a row's ids → its row in the latest batch
        self.windows: dict[int, tuple[int, int]] = {}
        """Row of the latest batch → the positions ``[start, stop)`` its requests may read (its longest continuation's)."""

    def note_requests(self, requests: Sequence[Any], max_length: int) -> None:
        """HFLM's tokenized requests ``((context, continuation), context ids, continuation ids)``; HFLM's row of a
        request is ``(context + continuation)[-(max_length + 1):][:-1]``."""
        for key, context_ids, continuation_ids in requests:
            row = hash(tuple((list(context_ids) + list(continuation_ids))[-(max_length + 1):][:-1]))
            length = min(len(context_ids) + len(continuation_ids) - 1, max_length)
            if key is not None:
                self._requests[key] = (row, length, len(continuation_ids))
                if self.continuations is not None:
                    self.continuations[key] = tuple(int(t) for t in continuation_ids)
            self._reads_from_end[row] = max(self._reads_from_end.get(row, 0), len(continuation_ids))

    def new_batch(self, input_ids: torch.Tensor) -> int:
        """A forward of the right-padded rows ``input_ids`` ``[B, T]`` is about to run: find each row's request row.
        Returns the first position whose logits any row reads (row i reads the c_i positions before its length
        n_i), or 0 when a row is no known request's (batch-size detection, say): every position."""
        self._batch_rows, self.windows = {}, {}
        if input_ids.dim() != 2 or not self._reads_from_end:
            return 0
        first = input_ids.shape[1]
        for index, ids in enumerate(input_ids.tolist()):  # one transfer of the batch's ids (on a GPU: one sync)
            stripped = len(ids)  # HFLM pads on the right with id 0; a real trailing 0 is tried below
            while stripped and ids[stripped - 1] == 0:
                stripped -= 1
            found = self._request_row(ids, stripped)
            if found is None:
                first = 0
                continue
            row, length = found
            if row not in self._batch_rows:
                self._batch_rows[row] = index
                self.windows[index] = (length - self._reads_from_end[row], length)
            first = min(first, length - self._reads_from_end[row])
        return max(0, first)

    def _request_row(self, ids: list[int], stripped: int) -> tuple[int, int] | None:
        """The hash and length of the request row that these padded ids hold (stripped of trailing zeros first,
        then with the zeros put back one by one: a row may end with real id-0 tokens), or ``None``."""
        for length in range(stripped, len(ids) + 1):
            row = hash(tuple(ids[:length]))
            if row in self._reads_from_end:
                return row, length
        return None

    def locate(self, request_key: Any) -> tuple[int, int, int] | None:
        """Where the latest batch holds an answered request: ``(batch row, row length, continuation tokens)``."""
        known = self._requests.get(request_key)
        if known is None or known[0] not in self._batch_rows:
            return None
        row, length, continuation = known
        return self._batch_rows[row], length, continuation


@dataclass
class _PendingAnswer:
    """An answered request whose lens values wait for the plan (or for enough positions to batch)."""

    states: list[torch.Tensor | None]  # L+1: copies [n, H] of the layers a probe reads (the batch's are released)
    loglik: float
    prompt_tokens: int
    prompt_fields: dict[str, Any]  # the record fields the captures made of the prompt's states
    values: dict[str, dict[str, torch.Tensor]]  # probe → the captures' values at the response positions
    token_ids: tuple[int, ...] | None = None  # probe_traces=true: the continuation's ids (its last positions')


class LoglikelihoodRows:
    """Bookkeeping of one ``loglikelihood`` call: HFLM's batches in, each answered request's probe out.

    HFLM tokenizes the call's requests (:meth:`note_requests`: each request's row is its context and all but the
    last continuation token, cut to the last ``max_length`` tokens), runs one forward per batch of right-padded
    rows (:meth:`new_batch`, from a pre-hook on the model: it finds each row's request row by its ids), then
    answers each row's requests (one or, with the logits cache, several continuations of one row) through
    ``cache_hook.add_partial`` (:meth:`on_answer`): a request's response positions are the last
    ``len(continuation)`` positions of its row in the latest batch (:meth:`locate`). When the next batch starts
    or the call ends (:meth:`flush`) each answered request keeps a copy of its few response positions' states,
    the record fields the captures make of its prompt's states and the values they compute at its positions (from what
    their hooks ``recorded`` of the same forward, Ω's ``[S, n]`` masses: no extra full forward;
    :class:`~lm_eval_probes.capture.calls.CallCaptures`); the
    batch's states are then released. The :class:`LensPlan` says which answers need the logit lens; those wait
    in a queue that goes through the lens at once when it holds ``chunk_positions`` positions (the unembedding
    is read once per chunk), the others are recorded without lens values at once.

    :meth:`new_batch` also returns the first position whose logits any row of the batch reads, so that the model
    unembeds only from there on (``logits_to_keep``; :func:`logits_read_only`).

    Use it through :func:`loglikelihood_rows`, which also holds the hooks.
    """

    def __init__(
        self,
        tap: HiddenStateTap,
        readout: LensReadout,
        plan: ProbePlan,
        captures: CallCaptures | None = None,
        recorded: dict[str, Any] | None = None,
        lens_plan: LensPlan | None = None,
    ) -> None:
        self.tap = tap
        self.captures = captures or CallCaptures(plan, {})
        self.recorded = recorded or {}
        """What the captures' hooks record of this call's forwards, by capture name."""
        self.readout = readout
        self.probe_plan = plan
        self.config = plan.config
        self.plan = lens_plan or LensPlan()
        self.probes: dict[Any, ResponseProbe] = {}
        """Each answered request's probe, keyed by its ``(context, continuation)``."""
        self.requests = RequestRows(keep_continuations=plan.config.traces)
        self._spans: list[tuple[int, int, int]] = []  # (batch row, first, end) of the answered response positions
        self._span_index: dict[tuple[int, int, int], int] = {}
        self._answers: list[tuple[Any, int, int, float]] = []  # (request key, span, continuation tokens, loglik)
        self._pending: dict[Any, _PendingAnswer] = {}  # answered, need not yet known
        self._queue: dict[Any, _PendingAnswer] = {}  # need the lens, not yet probed
        self._queued_positions = 0
        # what a chosen option's lens and reader read, and the last layer (which also tells the positions)
        self._kept_layers = plan.read_layers | {readout.num_layers}

    def note_requests(self, requests: Sequence[Any], max_length: int) -> None:
        """HFLM's tokenized requests (see :meth:`RequestRows.note_requests`)."""
        self.requests.note_requests(requests, max_length)

    def new_batch(self, input_ids: torch.Tensor) -> int:
        """A forward of ``input_ids`` is about to replace the states of the previous batch: take what its answers
        need first; then :meth:`RequestRows.new_batch`."""
        self._take_batch()
        first = self.requests.new_batch(input_ids)
        self.captures.read_at(self.recorded, self.requests.windows)  # Ω decodes them during the forward
        return first

    def locate(self, request_key: Any) -> tuple[int, int, int] | None:
        """See :meth:`RequestRows.locate`."""
        return self.requests.locate(request_key)

    def on_answer(self, attr: str, request_key: Any, answer: Any) -> None:
        """HFLM answered ``request_key`` from the latest batch (a ``cache_hook.add_partial`` call)."""
        located = self.locate(request_key) if attr == "loglikelihood" and self.tap.latest is not None else None
        if located is None:
            return
        row, end, n = located
        span = (row, end - n, end)
        if span not in self._span_index:
            self._span_index[span] = len(self._spans)
            self._spans.append(span)
        self._answers.append((request_key, self._span_index[span], n, float(answer[0])))

    def flush(self) -> None:
        """The call ends: take the last batch, probe the queue and every answer still undecided."""
        self._take_batch()
        self._queue.update(self._pending)  # options of documents whose other options never came: probe them
        self._pending = {}
        self._probe_queue()

    def _take_batch(self) -> None:
        states = self.tap.latest
        if states is None or not self._spans:  # no row read this forward (batch-size detection, say)
            self._spans, self._span_index, self._answers, self.tap.latest = [], {}, [], None
            return
        values = self.captures.position_values(self.recorded, states, self._spans)
        prompt_fields: dict[tuple[int, int], dict[str, Any]] = {}  # grouped requests of a row share them
        for key, index, n, loglik in self._answers:
            if key in self.probes or key in self._queue:  # a repeated request, already decided
                continue
            row, _, end = self._spans[index]
            prompt_tokens = end - n + 1  # the last context position predicts token 1
            if (row, prompt_tokens) not in prompt_fields:
                prompt_fields[row, prompt_tokens] = self.captures.span_fields(
                    {layer: states[layer][row] for layer in self.captures.prompt_layers}, prompt_tokens)
            self._pending[key] = _PendingAnswer(
                states=[h[row, end - n : end].clone() if layer in self._kept_layers and h is not None else None
                        for layer, h in enumerate(states)],
                loglik=loglik,
                prompt_tokens=prompt_tokens,
                prompt_fields=prompt_fields[row, prompt_tokens],
                values={probe: {name: value[..., -n:] if n else value[..., :0] for name, value in named.items()}
                        for probe, named in values[index].items()},
                token_ids=None if self.requests.continuations is None else self.requests.continuations[key][-n:] if n else (),
            )
            for decided, needs_lens in self.plan.answered(key, loglik):
                answer = self._pending.pop(decided)
                if needs_lens:
                    self._queue[decided] = answer
                    self._queued_positions += span_positions(answer.states)
                else:
                    self._record([decided], [answer], lens=False)
        self._spans, self._span_index, self._answers = [], {}, []
        self.tap.latest = None  # the next forward's states are not held beside these
        if self._queued_positions >= self.config.chunk_positions:
            self._probe_queue()

    def _probe_queue(self) -> None:
        keys, answers = list(self._queue), list(self._queue.values())
        self._queue, self._queued_positions = {}, 0
        self._record(keys, answers, lens=True)

    def _record(self, keys: Sequence[Any], answers: Sequence[_PendingAnswer], *, lens: bool) -> None:
        """Probe the answers' states (a trace for each answer the lens reads, under ``probe_traces=true``)."""
        traced = lens and self.config.traces and bool(answers)
        token_ids = [torch.tensor(a.token_ids, dtype=torch.long) for a in answers] if traced else None
        rows = position_probes_of_spans([a.states for a in answers], self.readout, self.probe_plan, token_ids, lens=lens)
        for key, answer, probes in zip(keys, answers, rows, strict=True):
            for probe, named in answer.values.items():
                probes = probes.with_values(probe, **named)
            n = probes.num_positions
            self.probes[key] = probes.summarize(
                0, n, mean_token_logprob=answer.loglik / n if n else math.nan, prompt_tokens=answer.prompt_tokens,
                fields=answer.prompt_fields, trace_ids=answer.token_ids if traced else None,
            )


@contextmanager
def logits_read_only(
    model: nn.Module, on_batch: Callable[[torch.Tensor], int], keep_logits_argument: str | None
) -> Iterator[None]:
    """A pre-hook on ``model``, first of its pre-hooks, that calls ``on_batch(input_ids)`` before every forward (the
    previous batch is still whole then) and, where the model's forward takes ``keep_logits_argument``
    (``logits_to_keep``), asks for the logits from the first position ``on_batch`` says any row reads on: HFLM's
    own arithmetic (``ctx_len = inplen + logits.shape[0] − padding_len_inp``) finds each row's continuation in the
    shorter tensor — the same values, without the ``[B, T, V]`` logits of the prompts (on a 262k vocabulary, most of
    a forward's FLOPs and memory). ``on_batch`` returns 0 for a forward whose rows are not all known requests'
    (HFLM's batch-size search): every logit, the most a batch can need."""

    def each_batch(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any] | None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        first = on_batch(input_ids) if isinstance(input_ids, torch.Tensor) else 0
        if first == 0 or keep_logits_argument is None:
            return None
        return args, {**kwargs, keep_logits_argument: input_ids.shape[1] - first}

    handle = model.register_forward_pre_hook(each_batch, with_kwargs=True, prepend=True)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def loglikelihood_rows(
    model: nn.Module,
    readout: LensReadout,
    plan: ProbePlan,
    captures: CallCaptures | None = None,
    lens_plan: LensPlan | None = None,
    *,
    keep_logits_argument: str | None = None,
) -> Iterator[LoglikelihoodRows]:
    """Hooks on ``model`` (and the captures', around HFLM's forwards: :meth:`CallCaptures.forwards`) and a
    :class:`LoglikelihoodRows` for one ``loglikelihood`` call (its batches told by :func:`logits_read_only`); the last
    batch is probed when the block ends without an error."""
    captures = captures or CallCaptures(plan, {})
    with hidden_state_tap(model, layers=plan.kept_layers) as tap, captures.forwards("loglikelihood") as recorded:
        rows = LoglikelihoodRows(tap, readout, plan, captures, recorded, lens_plan)
        with logits_read_only(model, rows.new_batch, keep_logits_argument):
            yield rows
        rows.flush()
