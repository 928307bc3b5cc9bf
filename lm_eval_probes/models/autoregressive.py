"""``hf-probes``: lm_eval's ``HFLM`` that also probes the hidden states of every response it scores.

Thin by design (like lm_eval's ``hf_steered``): HFLM does all batching, padding, reordering and
generation. The public methods are :class:`~lm_eval_probes.harness.wrapper.ProbeWrapper`'s, shared with
``hf-probes-diffusion`` (``loglikelihood`` and ``generate_until``: this wrapper's capture around HFLM's own, then the
probes attached to the answers; ``get_model_info``; the ``cache_hook`` property for ``--use_cache``); this subclass overrides two private HFLM
methods (``_loglikelihood_tokens``: where the requests' token ids exist; ``_model_generate``: where a generation's
ids and states exist) and reads one :class:`~lm_eval_probes.capture.plan.ProbePlan`, built at load. What one call
collects lives in one object, reachable from those methods while the call runs (nothing per call lives on the wrapper):

* loglikelihood — taps the harness's own forward (no extra pass): a pre-hook on the model tells
  :class:`~lm_eval_probes.capture.loglikelihood.LoglikelihoodRows` each batch (it finds each row's request by its
  ids, and has the model unembed only the positions HFLM reads), and each answered request (a tap on
  ``cache_hook.add_partial``, called once per request with its ``(context, continuation)`` key) takes its
  response positions' states from the latest batch;
* generate_until — probes the kept tokens of every generation (``probe_gen_capture``: one
  teacher-forced forward over prompt + generated ids, or states recorded during decoding). Ω always
  reads the teacher-forced states (its blocks need whole sequences; decoding-time states are single
  positions), so with ``probes`` including ``omega`` and ``probe_gen_capture=generate`` that one extra
  forward runs anyway;
* Ω (``probes=omega``) — the :class:`~lm_eval_probes.capture.readouts.FocalDepthDecoder` re-runs the last
  m blocks on every source layer's states of the same forward (loglikelihood: the harness's own);
* the first softmax-attention layer (a probe's :class:`~lm_eval_probes.api.FirstAttention` request) —
  :class:`~lm_eval_probes.capture.attention.FirstAttentionCapture` keeps that layer's arguments
  in the same forwards (loglikelihood: the harness's own; generation: ``generate``'s own calls, joined into the whole
  sequence), and the probe turns each response's sequence into its record fields;
* returns :class:`~lm_eval_probes.records.ProbeLL` / :class:`~lm_eval_probes.records.ProbeStr`
  responses that carry the per-response :class:`~lm_eval_probes.records.ResponseProbe`.

What a multiple-choice document needs (which option the task reads) comes on the requests
(:class:`~lm_eval_probes.records.ProbeRequest`, set by the task's ``construct_requests``).
"""

from __future__ import annotations

import bisect
import functools
import inspect
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import lm_eval.models  # noqa: F401  (built-in registry entries before ours; see integration notes)
import torch
from lm_eval.api.instance import Instance
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import postprocess_generated_text

from lm_eval_probes.capture.loglikelihood import (
    LensPlan,
    LoglikelihoodRows,
    OptionGroup,
    RequestRows,
    logits_read_only,
    loglikelihood_rows,
)
from lm_eval_probes.capture.memory import model_shapes, reserved_during_forwards
from lm_eval_probes.capture.calls import CallCaptures, with_fields
from lm_eval_probes.capture.captures import SetUp
from lm_eval_probes.capture.plan import ProbePlan, without_skipped
from lm_eval_probes.capture.positions import PositionProbes, hidden_state_tap, position_probes_of_spans, states_request
from lm_eval_probes.capture.readouts import LensReadout, check_lens
from lm_eval_probes.config import ProbeConfig, split_model_args
from lm_eval_probes.harness.hflm import note_unprobed_requests, take_ranks_from_accelerate
from lm_eval_probes.harness.applicability import model_config, not_applying
from lm_eval_probes.harness.wrapper import GenerationCall, ProbeWrapper, Unprobed
from lm_eval_probes.harness.pretrained import check_pretrained, hub_offline
from lm_eval_probes.harness.registry import MODEL_NAME, register_rows
from lm_eval_probes.stack_api import hidden_states_of
from lm_eval_probes.harness.supported_versions import check_supported_versions
from lm_eval_probes.records import ProbeLL, ResponseProbe, probe_request_of

register_rows()  # before any task is built: the model is looked up first

@dataclass
class _PendingGeneration:
    """One generated row of a ``_model_generate`` call, waiting for the text ``generate_until`` answers: its generated
    ids, position probes, prompt tokens, the record fields the captures made of its prompt, the text expected from the
    stop strings with its kept tokens, and what the captures recorded of its forwards (cut to the kept tokens once
    they are known)."""

    generated: list[int]
    probes: PositionProbes
    prompt_tokens: int
    prompt_fields: dict[str, Any]
    predicted: tuple[str, int]
    captured: Any  # what the captures recorded of its forwards: fields(kept)


class _LoglikelihoodCall:
    """One ``loglikelihood`` call: its rows' bookkeeping (:class:`LoglikelihoodRows`; without probes the
    :class:`RequestRows` that tell HFLM's forward which logits it reads) and the captures' per-request bookkeeping
    (:meth:`~lm_eval_probes.capture.calls.CallCaptures.answers`; ``None``: none)."""

    def __init__(self, rows: RequestRows | LoglikelihoodRows, attention: Any = None,
                 lm: ProbeHFLM | None = None) -> None:
        self.rows, self.attention, self.lm = rows, attention, lm
        self.on_answer = None if lm is None else self._on_answer

    def _on_answer(self, attr: str, request_key: Any, answer: Any) -> None:
        self.rows.on_answer(attr, request_key, answer)
        if self.attention is not None:
            self.attention.on_answer(attr, request_key, answer)

    def attach(self, requests: Sequence[Instance], answers: Sequence[Any]) -> list[Any]:
        if self.lm is None:
            return list(answers)
        out = []
        for req, answer in zip(requests, answers, strict=True):
            probe = self.rows.probes.get(tuple(req.args))
            if self.attention is not None and probe is not None:
                probe = with_fields(probe, self.attention.fields(tuple(req.args)))
            out.append(ProbeLL(answer, self.lm._with_trace_tokens(probe)))
        return out


@register_model(MODEL_NAME)
class ProbeHFLM(ProbeWrapper, HFLM):
    """HFLM with hidden-state probes. Plugin ``model_args``: ``probes`` and ``probe_*`` (see ``ProbeConfig``)."""

    def __init__(self, pretrained: Any, **kwargs: Any) -> None:
        check_supported_versions()  # an unsupported lm-eval, transformers or torch: refused in one line
        plugin_args, hf_args = split_model_args(kwargs)
        config = ProbeConfig.from_model_args(plugin_args)  # fails before any model is loaded
        check_pretrained(pretrained, offline=hub_offline(), gguf_file=hf_args.get("gguf_file"),
                         subfolder=hf_args.get("subfolder"),
                         trust_remote_code=hf_args.get("trust_remote_code"))  # says what is missing before anything loads
        skipped: dict[str, str] = {}  # probes=all: probe → why it cannot run on this model
        if config.enabled:  # a probe whose config check fails: skipped (probes=all) or refused, unloaded
            config = without_skipped(config, not_applying(config, lambda: model_config(pretrained, hf_args)), skipped)
        if hf_args.get("think_end_token") is not None and config.enabled:
            raise ValueError("hf-probes cannot yet locate the kept tokens when think_end_token is set")
        self.plan = ProbePlan(config, 0, skipped=skipped)  # no probe yet: the states are planned once the model is loaded
        self._responses_cached = False  # --use_cache: every option goes through the lens (ProbeWrapper.cache_hook)
        super().__init__(pretrained, **hf_args)
        take_ranks_from_accelerate(self)
        if self.backend != "causal":
            raise ValueError(f"hf-probes supports causal LMs only, got backend={self.backend!r}")
        self.readout = LensReadout(self.model) if config.enabled else None
        self.held: dict[str, Any] = {}  # what each whole-forward capture the probes asked for holds, by capture name
        self.captures = CallCaptures(self.plan, {})
        if self.readout is not None:
            check_lens(self.model, self.readout)  # a lens that is not the model's own readout refuses here
            # the one plan of this model; a capture the loaded model refuses takes its probe out (probes=all)
            shapes = model_shapes(self.model, batch=1, tokens=1, vocab=self.readout.vocab_size,
                                  chunk_positions=config.chunk_positions)
            self.plan, self.held = ProbePlan.of(config, self.readout.num_layers, skipped).set_up(
                SetUp(self.model, self.readout, config, shapes, rank=self.rank))
            self.captures = CallCaptures(self.plan, self.held, decode=self._decode_one, traces=self.plan.config.traces)


    @property
    def kept_layers(self) -> frozenset[int]:
        """The ``hidden_states`` indices a probed forward keeps (:attr:`plan`'s; none without probes)."""
        return self.plan.kept_layers if self.readout is not None else frozenset()

    def _cache_fingerprint(self) -> str | None:
        """``--use_cache`` (with probes): a table of the probe configuration, and every option of a multiple-choice
        document goes through the lens: which option a task reads depends on the task's own settings
        (``metadata.confidence``), which a later run replaying the cache may change."""
        return f"{self.probe_config!r} every option" if self.probe_config.enabled else None

    def _capturing(self, kind: str, requests: Sequence[Instance]) -> Any:
        return self._loglikelihood_call(requests) if kind == "loglikelihood" else self._generation_call(requests)

    # ----------------------------------------------------------------------------- loglikelihood

    @contextmanager
    def _loglikelihood_call(self, requests: Sequence[Instance]) -> Iterator[_LoglikelihoodCall]:
        """The harness's own forwards tapped: a pre-hook tells the rows each batch, each answered request takes its
        response positions' states from the latest batch (with a first-attention request: that layer's inputs)."""
        keep_logits = next(iter(self._one_logit), None)
        if self.readout is None:  # no probes: the logits HFLM reads only
            known = RequestRows()
            with logits_read_only(self.model, known.new_batch, keep_logits):
                yield _LoglikelihoodCall(known)
            return
        note_unprobed_requests(requests)
        lens = LensPlan() if self._responses_cached else lens_plan(requests)
        with self._reserved(), loglikelihood_rows(self.model, self.readout, self.plan, self.captures, lens,
                                                  keep_logits_argument=keep_logits) as rows:
            yield _LoglikelihoodCall(rows, self.captures.answers(rows.recorded, locate=rows.locate), self)

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False, override_bs: int | None = None) -> list[Any]:
        """HFLM's, with the tokenized requests noted first (each request's row, by which the rows of every batch
        are found)."""
        call = self._current_call()
        if isinstance(call, _LoglikelihoodCall):
            call.rows.note_requests(requests, self.max_length)
        return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)

    def _reserved(self) -> Any:
        """Under ``batch_size=auto``, each forward holds the enabled probes' declared memory while it runs, so that the
        detected batch size leaves room for them (:func:`~lm_eval_probes.capture.memory.reserved_during_forwards`)."""
        auto = str(self.batch_size).startswith("auto")
        return reserved_during_forwards(self.model, self.probe_config, vocab=self.readout.vocab_size, enabled=auto)

    def _decode_one(self, token: int) -> str:
        return self.tok_decode([token])

    # ----------------------------------------------------------------------------- generation

    @contextmanager
    def _generation_call(self, requests: Sequence[Instance]) -> Iterator[Any]:
        """Each generated row's probes, queued by :meth:`_model_generate` and recorded once HFLM answers its text."""
        if self.readout is None:
            yield Unprobed()
            return
        note_unprobed_requests(requests)
        with self._reserved():
            yield GenerationCall(self._generation_record)

    def _generation_record(self, row: _PendingGeneration, text: str) -> tuple[str, ResponseProbe]:
        """The record of one generated row answered as ``text``: its kept tokens' probes (an empty text: the one
        position that chose to stop)."""
        ends = _LazyDecodedLengths(self, row.generated)
        if text != row.predicted[0] and text and ends[len(ends) - 1] < len(text):
            raise RuntimeError(
                f"hf-probes probed the {len(ends)} generated tokens that cover {row.predicted[0]!r} (the text "
                f"expected from the stop strings), but generate_until answered the longer {text!r}"
            )
        kept = row.predicted[1] if text == row.predicted[0] else _kept_token_count(ends, text)
        empty = kept == 0 and row.probes.num_positions > 0  # probed at the position that chose to stop
        probed = 1 if empty else kept
        probe = row.probes.summarize(
            0, probed, prompt_tokens=row.prompt_tokens, fields=row.prompt_fields,
            generation=True, empty=empty,
            token_ends=[0] if empty else [min(ends[i], len(text)) for i in range(kept)],
            trace_ids=row.generated[:probed] if self.probe_config.traces else None,
        )
        return text, self._with_trace_tokens(with_fields(probe, row.captured.fields(kept)))

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str], **generation_kwargs: Any) -> torch.Tensor:
        call = self._current_call()
        if self.readout is None or not isinstance(call, GenerationCall):
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        attention_mask = generation_kwargs.get("attention_mask")
        during = self.probe_config.gen_capture == "generate"
        tapped = hidden_state_tap(self.model, last_position_only=True, first_call_layers=self.captures.prompt_layers,
                                  layers=self.kept_layers)
        with tapped if during else _nothing() as tap, self.captures.forwards("generate") as recorded:
            sequences = super()._model_generate(context, max_length, stop, **generation_kwargs)
        prompt_len = context.shape[1]
        prompt_mask = attention_mask if attention_mask is not None else torch.ones_like(context)
        generated = sequences[:, prompt_len:]
        predicted = [self._kept_text(row.tolist(), stop) for row in generated]  # what generate_until will answer
        # only the kept tokens are probed (an empty text: the one position that chose to stop)
        bounds = [min(max(kept, 1), generated.shape[1]) for _, kept in predicted]
        captured = self.captures.generated(recorded, prompt_len, bounds)
        teacher_forced, forced = None, {}
        # the response positions of the teacher-forced forward (Ω: decoded while it runs)
        response_spans = [(row, prompt_len - 1, prompt_len - 1 + bound) for row, bound in enumerate(bounds)]
        if not during or self.captures.reads("teacher_forced"):
            with self.captures.forwards("teacher_forced") as forced:
                self.captures.read_at(forced, {row: (start, stop) for row, start, stop in response_spans})
                teacher_forced = self._teacher_forced_states(sequences, attention_mask, prompt_len, max(bounds, default=0))
        if during:
            # step t's last position predicted generated token t (step 0 is the prefill)
            per_layer = [None if tap.steps[0][layer] is None else torch.stack([step[layer] for step in tap.steps], dim=1)
                         for layer in range(len(tap.steps[0]))]
            start = 0
            prompt_layers = tap.first_call
        else:
            per_layer = teacher_forced
            start = prompt_len - 1
            prompt_layers = tuple(per_layer[layer][:, :prompt_len] for layer in self.captures.prompt_layers)
        if self.captures.prompt_layers and (prompt_layers is None or prompt_layers[0].shape[1] != prompt_len):
            raise RuntimeError("the first forward of generate did not cover the whole prompt (chunked prefill?)")
        prompt_fields = self.captures.prompt_fields(dict(zip(self.captures.prompt_layers, prompt_layers or ())),
                                                    prompt_mask)
        spans = [[None if h is None else h[row, start : start + bound] for h in per_layer] for row, bound in enumerate(bounds)]
        token_ids = [generated[row, :bound] for row, bound in enumerate(bounds)]
        rows = position_probes_of_spans(spans, self.readout, self.plan, token_ids)
        rows = self.captures.with_position_values(
            rows, self.captures.position_values(forced, teacher_forced, response_spans))
        prompt_tokens = (
            attention_mask.sum(-1).tolist() if attention_mask is not None else [prompt_len] * len(bounds)
        )
        call.queue([_PendingGeneration(ids.tolist(), probes, int(n), fields, kept, row) for ids, probes, n, fields, kept, row
                    in zip(token_ids, rows, prompt_tokens, prompt_fields, predicted, captured, strict=True)])
        return sequences

    @torch.no_grad()
    def _teacher_forced_states(
        self, sequences: torch.Tensor, attention_mask: torch.Tensor | None, prompt_len: int, max_kept: int
    ) -> tuple[torch.Tensor, ...]:
        """One forward over left-padded prompt + generated ids, with generate's own position ids."""
        length = prompt_len + max(max_kept - 1, 0)
        ids = sequences[:, :length]
        if attention_mask is None:
            attention_mask = torch.ones_like(sequences[:, :prompt_len])
        mask = torch.cat([attention_mask, attention_mask.new_ones(ids.shape[0], length - prompt_len)], dim=1)
        position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
        with torch.autocast(
            device_type=self.device.type, dtype=self.mixed_precision_dtype, enabled=self.mixed_precision_dtype is not None
        ):
            request = states_request(self.model, self.kept_layers)
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                             output_hidden_states=request, use_cache=False, **self._one_logit)
        return hidden_states_of(self.model, request, out.hidden_states, self.kept_layers)

    @functools.cached_property
    def _one_logit(self) -> dict[str, int]:
        """Forward kwargs that spare the ``[B, T, V]`` logits of a forward that only needs hidden states."""
        parameters = inspect.signature(self.model.forward).parameters
        for name in ("logits_to_keep", "num_logits_to_keep"):
            if name in parameters:
                return {name: 1}
        return {}

    def _kept_text(self, tokens: list[int], stop: Sequence[str]) -> tuple[str, int]:
        """The text ``generate_until`` makes of a row's generated ``tokens`` (decoded, cut at the first stop
        string, as HFLM does) and the fewest leading tokens that cover it (at most the :meth:`_generation_bound`)."""
        text = postprocess_generated_text(self.tok_decode(tokens), list(stop), None)
        return text, _kept_token_count(_LazyDecodedLengths(self, tokens[: self._generation_bound(tokens)]), text)

    def _generation_bound(self, tokens: list[int]) -> int:
        """Tokens up to (excluding) the first EOS or pad — an upper bound on the kept tokens — and at least
        one: the first position is probed even when it chose to stop (an empty generation)."""
        stops = {self.eot_token_id, self.tokenizer.pad_token_id} - {None}
        return min(len(tokens), max(1, next((i for i, tok in enumerate(tokens) if tok in stops), len(tokens))))


def lens_plan(requests: Sequence[Instance]) -> LensPlan:
    """The :class:`LensPlan` of one ``loglikelihood`` call: the options of a multiple-choice document form a group
    (its requests' :class:`~lm_eval_probes.records.ProbeRequest` says how many options there are and which one the
    task reads); every other request needs the lens."""
    documents: dict[tuple[str, Any], list[Instance]] = defaultdict(list)
    always = []
    for req in requests:
        probe_request = probe_request_of(req)
        if probe_request is not None and probe_request.options is not None and req.doc_id is not None:
            documents[req.task_name, req.doc_id].append(req)
        else:
            always.append(tuple(req.args))
    groups = []
    for reqs in documents.values():
        reqs.sort(key=lambda req: req.idx)
        probe_request = probe_request_of(reqs[0])
        count = probe_request.options
        if [req.idx for req in reqs[:count]] != list(range(count)):  # not the layout the task reads: probe all
            always.extend(tuple(req.args) for req in reqs)
            continue
        groups.append(OptionGroup(tuple(tuple(req.args) for req in reqs[:count]), probe_request.choose))
        # requests after the options (acc_mutual_info's unconditional ones) are read by no row
        groups.extend(OptionGroup((tuple(req.args),), _never) for req in reqs[count:])
    return LensPlan(groups, always)


def _never(_logliks: Sequence[float]) -> None:
    return None


class _LazyDecodedLengths:
    """``lengths[i]`` = length of the decoding of the first i+1 tokens, decoded once on demand (for bisect)."""

    def __init__(self, lm: HFLM, tokens: list[int]) -> None:
        self._lm, self._tokens, self._known = lm, tokens, {}

    def __len__(self) -> int:
        return len(self._tokens)

    def __getitem__(self, i: int) -> int:
        if i not in self._known:
            self._known[i] = len(self._lm.tok_decode(self._tokens[: i + 1]))
        return self._known[i]


def _kept_token_count(lengths: _LazyDecodedLengths, text: str) -> int:
    """Fewest leading tokens whose decoding covers the kept text (stop strings are cut at string level)."""
    if not text:
        return 0
    return min(bisect.bisect_left(lengths, len(text)) + 1, len(lengths))


@contextmanager
def _nothing() -> Iterator[None]:
    yield None
