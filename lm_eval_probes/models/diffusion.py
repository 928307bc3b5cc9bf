"""``hf-probes-diffusion``: lm_eval's ``HFLM`` for masked-diffusion LMs (LLaDA, Dream, any model whose
forward returns logits for every position of a bidirectional pass), with reveal-time confidence and the
probes on the final denoising pass's hidden states.

Thin by design (like lm_eval's ``hf_steered``): HFLM does the tokenizing, batching, left padding, stop
strings and ``--use_cache``; this subclass only

* reads the model's config first, and from it picks the class that loads it as a masked LM (``AutoModelForMaskedLM``
  for masked-LM configs, else the class its remote code maps; ``trust_remote_code`` only as the user gives it; HFLM
  keeps an ``AUTO_MODEL_CLASS`` already set), decides its family (LLaDA, Dream, generic:
  :meth:`DiffusionConfig.resolved`) and plans its probes, all before any weight loads;
* generate_until — replaces ``_model_generate`` with :func:`~lm_eval_probes.models.diffusion_decoding.masked_diffusion_decode`
  (the family's sampler, one seeded generator per row), keeps the family's text (its harness's stop rule)
  and hands each kept generation a :class:`~lm_eval_probes.records.ResponseProbe` carrying every kept
  token's reveal-time log-probability, reveal step and final-pass log-probability, its probability of
  its final token at 25/50/75/100 % of the steps (:func:`~lm_eval_probes.models.diffusion_decoding.trajectory_logprobs`:
  up to three replayed forwards per batch), and the enabled probes' values at the kept positions, read from the
  final denoising pass's states;
* loglikelihood — replaces ``_loglikelihood_tokens`` with the family's Monte-Carlo masked estimate
  (:func:`~lm_eval_probes.models.diffusion_decoding.mc_loglikelihood`, :func:`~lm_eval_probes.models.diffusion_decoding.dream_mc_loglikelihood`),
  plus, with probes, one forward over the unmasked request for their states.

The probes it runs are any registered probe whose :class:`~lm_eval_probes.api.PositionProbe` reads hidden states
only (no logit lens, no focal-depth or first-attention capture: those read an autoregressive next-token readout),
through the same :func:`~lm_eval_probes.capture.positions.position_probes` as ``hf-probes`` — the reader among the
built-ins. It names no probe.

``probe_traces=true`` writes each response's trace as ``hf-probes`` does (tokens, log-probabilities, the probes'
per-position arrays, the lens grid of the kept layers), through the model's masked-LM readout
(:func:`~lm_eval_probes.capture.masked_readout.masked_lm_readout`, found and checked at load) and from states a
forward already returns (no extra forward):

* a generation's grid is read **at reveal**: each kept token's column holds the kept layers' states of the denoising
  step that revealed it (at the column whose logits scored it), read out as the decoding read that step's logits (EOS
  suppressed under ``diffusion_logits_eos_inf``), against the revealed token; its ``logprob`` is the reveal-time
  log-probability, so at the last layer ``emitted_prob`` is ``exp(logprob)``. With ``diffusion_cfg_scale > 0`` the
  grid reads the conditional pass (the guided probability mixes two forwards);
* a loglikelihood request's (a multiple-choice option's) grid is read from the one forward over the unmasked request
  the probes read: the continuation's tokens scored at their own positions (one earlier under
  ``diffusion_logits_shift``), ``logprob`` their log-probabilities in that forward — not the Monte-Carlo estimate,
  which the record keeps.

``docs/diffusion.md`` describes every option and its source in the authors' code.
"""

from __future__ import annotations

import bisect
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import lm_eval.models  # noqa: F401  (built-in registry entries before ours; see integration notes)
import torch
import transformers
from lm_eval.api.instance import Instance
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from lm_eval_probes import registry
from lm_eval_probes.capture.masked_readout import MaskedLMReadout, lens_grid_of, masked_lm_readout
from lm_eval_probes.capture.plan import ProbePlan, reads_lens, without_skipped
from lm_eval_probes.capture.positions import LensGrid, position_probes
from lm_eval_probes.capture.calls import CallCaptures
from lm_eval_probes.capture.captures import SetUp
from lm_eval_probes.config import ProbeConfig, split_model_args
from lm_eval_probes.models.diffusion_decoding import (
    Decoded,
    Forward,
    Sampler,
    dream_mc_loglikelihood,
    masked_diffusion_decode,
    mc_loglikelihood,
    request_seed,
    trajectory_logprobs,
    trajectory_steps,
)
from lm_eval_probes.models.diffusion_config import DiffusionConfig, split_diffusion_args
from lm_eval_probes.harness.hflm import note_unprobed_requests, take_ranks_from_accelerate
from lm_eval_probes.harness.applicability import model_config, not_applying
from lm_eval_probes.harness.wrapper import GenerationCall, ProbeWrapper, Unprobed
from lm_eval_probes.harness.pretrained import check_pretrained, hub_offline
from lm_eval_probes.harness.registry import DIFFUSION_MODEL_NAME, register_rows
from lm_eval_probes.harness.supported_versions import check_supported_versions
from lm_eval_probes.records import ProbeLL, ResponseProbe
from lm_eval_probes.declarations import TRAJECTORY_PERCENTS

register_rows()  # before any task is built: the model is looked up first

def states_only(probe: Any) -> bool:
    """Whether ``hf-probes-diffusion`` can run a registered probe: it has a position probe that reads no logit lens
    (checked on its class; its whole-forward requests are checked once the model's depth is known)."""
    return probe.position_probe is not None and not reads_lens(probe.position_probe)


def supported_probes() -> tuple[str, ...]:
    """The registered probes ``hf-probes-diffusion`` can run (:func:`states_only`)."""
    return tuple(probe.name for probe in registry.probes() if states_only(probe))


def default_probes() -> tuple[str, ...]:
    """The probes of an ``hf-probes-diffusion`` run that names none: the default ones it can run."""
    return tuple(probe.name for probe in registry.probes() if probe.default_enabled and states_only(probe))

_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layers", "n_layer", "num_layers")


def model_class_for(config: Any) -> type:
    """The ``transformers`` auto class that loads a masked-diffusion LM with its logits head: masked-LM
    configs (BERT, ModernBERT, …) → ``AutoModelForMaskedLM``; remote code → the first of
    ``AutoModelForMaskedLM``, ``AutoModelForCausalLM``, ``AutoModel`` in its ``auto_map`` (LLaDA maps
    ``AutoModel`` and ``AutoModelForCausalLM`` to its LM class, Dream ``AutoModel``); otherwise
    ``AutoModelForCausalLM`` (a bidirectional model registered as a causal LM)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if getattr(config, "model_type", None) in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return transformers.AutoModelForMaskedLM
    auto_map = getattr(config, "auto_map", None) or {}
    for name in ("AutoModelForMaskedLM", "AutoModelForCausalLM", "AutoModel"):
        if name in auto_map:
            return getattr(transformers, name)
    return transformers.AutoModelForCausalLM


def resolve_mask_token_id(option: int | None, config: Any, tokenizer: Any) -> int:
    """The mask token id: the ``diffusion_mask_token_id`` option, else the model config's
    ``mask_token_id``, else the tokenizer's mask token; ``ValueError`` when none is known."""
    for value in (option, getattr(config, "mask_token_id", None), getattr(tokenizer, "mask_token_id", None)):
        if value is not None:
            return int(value)
    raise ValueError(
        "hf-probes-diffusion needs the mask token: neither the model config (mask_token_id) nor the tokenizer "
        "(mask_token) names one; pass diffusion_mask_token_id=<id> (LLaDA: 126336, Dream: 151666)"
    )


class _LikelihoodCall(Unprobed):
    """One ``loglikelihood`` call: each request's record by its ``(context, continuation)``, set by
    ``_loglikelihood_tokens`` (HFLM sends no partial answers there)."""

    def __init__(self) -> None:
        self.probes: dict[tuple[str, str], ResponseProbe] = {}

    def attach(self, requests: Sequence[Any], answers: Sequence[Any]) -> list[Any]:
        return [ProbeLL(answer, self.probes.get(tuple(req.args))) for req, answer in zip(requests, answers, strict=True)]


@dataclass(frozen=True)
class _Generation:
    """One decoded row, waiting for the text lm_eval keeps of it."""

    tokens: list[int]  # the kept candidates: canvas tokens the text is made of, in order
    positions: list[int]  # their canvas positions
    text: str | None  # the family stop rule's text (None: lm_eval's text is kept)
    skip_special: bool  # whether the text decodes ``tokens`` without special tokens
    reveal_logprob: torch.Tensor  # [G] float64
    reveal_step: torch.Tensor  # [G] long
    final_logprob: torch.Tensor  # [G] float64
    steps: int  # denoising steps of the decoding
    trajectory_steps: tuple[int, ...]  # the steps of ``trajectory``'s rows
    trajectory: torch.Tensor  # [S, G] float64: ln p of each final token at each trajectory step
    states: dict[int, torch.Tensor]  # hidden_states index → [G, H] at the canvas positions (final pass; the probes' layers)
    prompt_tokens: int
    prompt_fields: dict[str, Any]  # the record fields the captures made of the prompt's states
    canvas: list[int]  # every canvas token (an empty kept text is traced at the canvas start)
    reveal_lens: tuple[torch.Tensor, ...] = ()  # probe_traces=true: top_token, top_prob, emitted_prob [k, G] at reveal


@register_model(DIFFUSION_MODEL_NAME)
class DiffusionProbeHFLM(ProbeWrapper, HFLM):
    """HFLM for masked-diffusion LMs. Plugin ``model_args``: ``diffusion_*`` (:class:`DiffusionConfig`),
    ``probes`` (those of :func:`supported_probes`, or ``none``; default :func:`default_probes`) and their
    ``probe_<name>_*`` options."""

    def __init__(self, pretrained: Any, **kwargs: Any) -> None:
        check_supported_versions()  # an unsupported lm-eval, transformers or torch: refused in one line
        diffusion_args, rest = split_diffusion_args(kwargs)
        self.diffusion_config = DiffusionConfig.from_model_args(diffusion_args)  # before any model is loaded
        plugin_args, hf_args = split_model_args(rest)
        probe_config = ProbeConfig.from_model_args({"probes": default_probes(), **plugin_args})
        supported = supported_probes()
        unsupported = [p for p in probe_config.probes if p not in supported]
        skipped: dict[str, str] = {}  # probes=all: probe → why it cannot run on this model
        if unsupported and probe_config.every_applicable:
            probe_config = without_skipped(probe_config, dict.fromkeys(
                unsupported, "hf-probes-diffusion has no autoregressive next-token readout"), skipped)
        elif unsupported:
            raise ValueError(
                f"hf-probes-diffusion supports probes {supported} (or none), got {unsupported}: the lens "
                "probes need an autoregressive next-token readout"
            )
        check_pretrained(pretrained, offline=hub_offline(), gguf_file=hf_args.get("gguf_file"),
                         subfolder=hf_args.get("subfolder"), trust_remote_code=hf_args.get("trust_remote_code"))  # says what is missing before anything loads
        if hf_args.get("backend", "default") not in ("default", "causal"):
            raise ValueError(f"hf-probes-diffusion loads one bidirectional model; backend={hf_args['backend']!r} is not supported")
        if hf_args.get("think_end_token") is not None:
            raise ValueError("hf-probes-diffusion cannot yet locate the kept tokens when think_end_token is set")
        config = model_config(pretrained, hf_args)
        probe_config = without_skipped(probe_config, not_applying(probe_config, lambda: config), skipped)
        self.diffusion_config = self.diffusion_config.resolved(config)  # the family, before any weight is loaded
        self.AUTO_MODEL_CLASS = model_class_for(config)  # HFLM's _get_backend keeps a class already set
        self.plan = self._planned(ProbePlan.of(probe_config, _num_layers(config), skipped))
        super().__init__(pretrained, **{**hf_args, "backend": "causal"})
        take_ranks_from_accelerate(self)
        self.mask_token_id = resolve_mask_token_id(self.diffusion_config.mask_token_id, self.config, self.tokenizer)
        self.sampler = self._sampler()
        self._takes_position_ids = "position_ids" in inspect.signature(self.model.forward).parameters
        self.plan, self.held = self.plan.set_up(SetUp(self.model, None, self.probe_config, None, rank=self.rank))
        self.captures = CallCaptures(self.plan, self.held)
        self.lens_readout: MaskedLMReadout | None = None
        """``probe_traces=true`` (with a probe to trace): the model's masked-LM readout, read at every kept layer
        (:attr:`lens_layers`) into each trace's lens grid."""
        if self.probe_config.traces and self.plan.captures:
            self.lens_readout = masked_lm_readout(self.model)
            if self.lens_readout.num_layers != self.num_layers:
                raise ValueError(f"the model's forward gives {self.lens_readout.num_layers + 1} hidden states, its config "
                                 f"{self.num_layers} layers")
        self.lens_layers: tuple[int, ...] = tuple(sorted({*self.state_layers, self.num_layers}))
        """The layers of a trace's lens grid: those the probes keep, and the last (the model's own readout)."""

    @staticmethod
    def _planned(plan: ProbePlan) -> ProbePlan:
        """``plan`` (the model's, before any weight is loaded) without the probes that need an autoregressive capture
        (``probes=all``; a probe named explicitly is refused here)."""
        autoregressive = plan.requested.autoregressive()
        if autoregressive and not plan.config.every_applicable:
            raise ValueError(f"hf-probes-diffusion cannot run probes {autoregressive}: they re-run or hook an "
                             "autoregressive model's blocks")
        return plan.without(dict.fromkeys(autoregressive, "it re-runs or hooks an autoregressive model's blocks"))

    @property
    def num_layers(self) -> int:
        """The model's blocks (``hidden_states`` has one more entry)."""
        return self.plan.num_layers


    @property
    def state_layers(self) -> tuple[int, ...]:
        """The ``hidden_states`` layers the probes read, kept from the final denoising pass (none without a probe)."""
        return self.plan.state_layers

    def _layer_states(self, states: dict[int, torch.Tensor], index: torch.Tensor | slice) -> list[torch.Tensor | None]:
        """The L + 1 ``hidden_states`` entries the probes read, each ``[n, H]`` at ``index`` (``None`` elsewhere)."""
        return [states[layer][index] if layer in states else None for layer in range(self.num_layers + 1)]

    def _probe_record(self, layer_states: list[torch.Tensor | None], fields: dict[str, Any], n: int, *,
                      mean_token_logprob: float, prompt_tokens: int, generation: bool = False,
                      token_ends: tuple[int, ...] | None = None, empty: bool = False,
                      trace: tuple[list[int], torch.Tensor, LensGrid] | None = None) -> ResponseProbe:
        """The record of one response's ``n`` positions, with the enabled probes' values (their states:
        ``layer_states``) and the record ``fields`` the captures made of its prompt; ``trace`` (``probe_traces=true``): the positions' token ids, their log-probabilities and
        their lens grid, written into the record's trace."""
        if not self.plan.captures:
            return ResponseProbe(n_tokens=n, mean_token_logprob=mean_token_logprob, prompt_tokens=prompt_tokens,
                                 token_ends=token_ends, empty=empty)
        probes = position_probes(layer_states, None, self.plan, lens=False)
        trace_ids = None
        if trace is not None:
            trace_ids, token_logprob, grid = trace
            probes = dataclasses.replace(probes, token_logprob=token_logprob, lens=grid)
        record = probes.summarize(0, n, mean_token_logprob=mean_token_logprob, prompt_tokens=prompt_tokens,
                                  fields=fields, generation=generation,
                                  token_ends=token_ends, empty=empty, trace_ids=trace_ids)
        return self._with_trace_tokens(record)

    def _state_columns(self, columns: torch.Tensor) -> torch.Tensor:
        """The columns of a forward's states whose logits score the tokens at ``columns`` (one column earlier under
        ``diffusion_logits_shift``, the first column scoring itself, as :meth:`_forward` shifts the logits)."""
        return (columns - 1).clamp(min=0) if self.diffusion_config.logits_shift else columns

    def _ruled_out(self) -> tuple[int, ...]:
        """The tokens the decoding sets to −inf at every step (``diffusion_logits_eos_inf``)."""
        return tuple(self.sampler.eos_ids) if self.sampler.logits_eos_inf else ()

    def _reveal_cells(self, states: Any, row: int, columns: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The lens grid at reveal (:data:`~lm_eval_probes.models.diffusion_decoding.RevealCells`): the kept layers'
        states of this step at the revealed positions, read out against the revealed tokens."""
        at = self._state_columns(columns)
        grid = lens_grid_of({layer: states[layer][row, at] for layer in self.lens_layers}, self.lens_readout, tokens,
                            chunk_positions=self.probe_config.chunk_positions, ruled_out=self._ruled_out())
        return grid.top_token, grid.top_prob, grid.emitted_prob

    def _cache_fingerprint(self) -> str:
        """``--use_cache``: this run's responses live in a table of their decoding and probe configuration."""
        return f"{self.diffusion_config!r} {self.probe_config!r}"

    def _capturing(self, kind: str, requests: Sequence[Instance]) -> AbstractContextManager[Any]:
        """A ``loglikelihood`` call collects each request's record (from ``_loglikelihood_tokens``); a
        ``generate_until`` call each decoded row (from ``_model_generate``), recorded once HFLM answers its text."""
        note_unprobed_requests(requests)
        if kind == "loglikelihood":
            return nullcontext(_LikelihoodCall())
        return nullcontext(GenerationCall(self._generation_answer))

    def _generation_answer(self, generation: _Generation, text: str) -> tuple[str, ResponseProbe]:
        """The text kept of one decoded row answered as ``text`` (the family stop rule's own, else lm_eval's) and
        its record."""
        kept = text if generation.text is None else generation.text
        return kept, self._generation_probe(generation, kept)

    def _special_ids(self, *names: str) -> tuple[int, ...]:
        """Ids of the named tokens that the tokenizer knows as one token."""
        vocab = self.tokenizer.get_vocab()
        return tuple(sorted({int(vocab[name]) for name in names if name in vocab}))

    def _sampler(self) -> Sampler:
        """The decoding step of this run: the configured algorithm, with EOS = ``<|endoftext|>`` (else the
        tokenizer's EOS) and EoT = ``<|eot_id|>`` (LLaDA's 126081 and 126348) for the EOS options."""
        config = self.diffusion_config
        eos = self._special_ids("<|endoftext|>") or ((int(self.tokenizer.eos_token_id),) if self.tokenizer.eos_token_id is not None else ())
        if (config.logits_eos_inf or config.confidence_eos_eot_inf) and not eos:
            raise ValueError("diffusion_logits_eos_inf / diffusion_confidence_eos_eot_inf need an EOS token; the tokenizer has none")
        return Sampler(
            alg=config.alg, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k, alg_temp=config.alg_temp,
            eps=config.eps, cfg_scale=config.cfg_scale, eos_ids=eos, eot_ids=self._special_ids("<|eot_id|>"),
            logits_eos_inf=config.logits_eos_inf, confidence_eos_eot_inf=config.confidence_eos_eot_inf,
            ranking_dtype=torch.float64 if config.ranking_dtype == "float64" else None,
        )

    def _forward(self, attention_mask: torch.Tensor | None) -> Forward:
        """The model's forward for a batch whose first columns carry ``attention_mask`` (left padding):
        padded rows get the mask and, when the model takes them, position ids counted from their first
        real token, so a row's result does not depend on its batch; shifted logits for Dream-style models
        (``diffusion_logits_shift``). Dream's own model gets the mask as Dream's sampler builds it: 4-D
        ``[B, 1, T, T]`` (query and key both real) with padded positions at position 1."""
        dream = str(getattr(self.config, "model_type", "")).lower() == "dream"

        def forward(ids: torch.Tensor, want_states: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
            kwargs: dict[str, Any] = {}
            if attention_mask is not None and not bool(attention_mask.all()):
                extra = attention_mask.new_ones(ids.shape[0], ids.shape[1] - attention_mask.shape[1])
                mask = torch.cat([attention_mask, extra], dim=1)
                kwargs["attention_mask"] = mask
                if self._takes_position_ids:
                    kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
                if dream:
                    real = mask.bool()
                    kwargs["attention_mask"] = real[:, None, None, :] & real[:, None, :, None]
                    kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).masked_fill(~real, 1)
            if want_states:
                kwargs["output_hidden_states"] = True
            with torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                                enabled=self.mixed_precision_dtype is not None):
                out = self.model(input_ids=ids, **kwargs)
            logits = out.logits
            if self.diffusion_config.logits_shift:
                logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
            return logits, (out.hidden_states if want_states else None)

        return forward

    # ----------------------------------------------------------------------------- generation

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str], **generation_kwargs: Any) -> torch.Tensor:
        """Masked-diffusion decoding of a left-padded batch; returns ``context`` + the canvas. With
        ``diffusion_stop_rule=lm_eval`` every token after a row's first stop token (EOS, pad) is replaced by
        that token, so lm_eval's text ends there; the family rules keep their own text (:meth:`_kept`)."""
        generations: list[_Generation] = []
        attention_mask = generation_kwargs.pop("attention_mask", None)
        if generation_kwargs.get("do_sample") or float(generation_kwargs.get("temperature") or 0.0) > 0:
            raise ValueError(
                "hf-probes-diffusion samples only as its options say (diffusion_temperature, diffusion_top_p, …), as "
                f"LLaDA's and Dream's harnesses do; the task asks for sampling: {generation_kwargs}"
            )
        gen_length, block_length, steps = self.diffusion_config.schedule(max_length - context.shape[1])
        prompt, prompt_mask = context, attention_mask
        room = self.max_length - gen_length
        if room < 1:
            raise ValueError(f"the diffusion canvas ({gen_length}) leaves no room for a prompt in max_length={self.max_length}")
        if prompt.shape[1] > room:  # keep the prompt's last tokens
            prompt = prompt[:, -room:]
            prompt_mask = None if prompt_mask is None else prompt_mask[:, -room:]
        generators = None
        if self.sampler.random:  # one stream per row, from the seed and the row's own prompt tokens
            rows = [row[prompt_mask[i].bool()] if prompt_mask is not None else row for i, row in enumerate(prompt)]
            generators = [torch.Generator().manual_seed(request_seed(self.diffusion_config.seed, row.tolist(), ()))
                          for row in rows]
        decoded = masked_diffusion_decode(
            self._forward(prompt_mask), prompt, mask_token_id=self.mask_token_id, gen_length=gen_length,
            block_length=block_length, steps=steps, state_layers=self.state_layers, sampler=self.sampler,
            generators=generators, reveal_cells=None if self.lens_readout is None else self._reveal_cells,
        )
        at_steps = trajectory_steps(steps, [percent / 100 for percent in TRAJECTORY_PERCENTS])
        trajectory = self._trajectory(decoded, prompt, prompt_mask, at_steps)
        tokens = decoded.tokens.clone()
        eos_text = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        until = list(stop[:-1]) if stop and stop[-1] == eos_text else list(stop)  # without the EOS lm_eval appends
        for row in range(tokens.shape[0]):
            generation = self._pending_generation(decoded, row, prompt, prompt_mask, until, steps, at_steps, trajectory[row])
            generations.append(generation)
            if generation.text is None and len(generation.tokens) < tokens.shape[1]:
                bound = len(generation.tokens)
                tokens[row, bound:] = tokens[row, bound]
        call = self._current_call()
        if isinstance(call, GenerationCall):  # outside generate_until: no records to collect
            call.queue(generations)
        return torch.cat([context, tokens.to(context.device)], dim=1)

    def _trajectory(self, decoded: Decoded, prompt: torch.Tensor, prompt_mask: torch.Tensor | None,
                    at_steps: tuple[int, ...]) -> torch.Tensor:
        """``[B, S, G]`` float64: each canvas position's ln p of its final token at each step of ``at_steps``
        (:func:`~lm_eval_probes.models.diffusion_decoding.trajectory_logprobs`, one replayed forward per step before the last);
        the last step's row is the decoding's own final pass (``decoded.final_logprob``, the same forward)."""
        last = at_steps[-1]  # trajectory_steps always ends at the last step
        earlier = [step for step in at_steps if step != last]
        rows = [decoded.final_logprob.unsqueeze(1)]
        if earlier:
            rows.insert(0, trajectory_logprobs(self._forward(prompt_mask), prompt, decoded, mask_token_id=self.mask_token_id,
                                               at_steps=earlier, sampler=self.sampler))
        return torch.cat(rows, dim=1)

    def _stop_token_ids(self) -> set[int]:
        """Tokens that end a generation under ``diffusion_stop_rule=lm_eval``: the tokenizer's EOS, the model
        config's ``eos_token_id`` (one or a list) and the pad token (when it is not the mask)."""
        ids = {self.eot_token_id, self.tokenizer.pad_token_id}
        eos = getattr(self.config, "eos_token_id", None)
        ids |= set(eos) if isinstance(eos, (list, tuple)) else {eos}
        return {int(i) for i in ids if i is not None and int(i) != self.mask_token_id}

    def _kept(self, canvas: list[int], until: list[str]) -> tuple[list[int], str | None, bool]:
        """(kept canvas positions, the family rule's text or ``None``, whether that text skips special tokens).

        * ``lm_eval``: the canvas up to its first stop token (:meth:`_stop_token_ids`); lm_eval then cuts its
          decoding at the stop strings.
        * ``dream`` (Dream's harnesses): the canvas decoded with its special tokens, cut at the first EOS
          text, then at each stop string; the tokens before the first EOS.
        * ``llada`` (``eval_llada.py``): the whole canvas decoded with its special tokens, cut at each stop
          string in turn, re-encoded and decoded without special tokens (text after a mid-canvas EOS stays);
          the non-special tokens of the fewest leading tokens that cover the cut text.
        """
        rule = self.diffusion_config.stop_rule
        if rule == "lm_eval":
            stops = self._stop_token_ids()
            bound = next((i for i, token in enumerate(canvas) if token in stops), len(canvas))
            return list(range(bound)), None, True
        text = self.tok_decode(canvas, skip_special_tokens=False)
        if rule == "dream":
            eos = self.tokenizer.eos_token
            text = text.split(eos)[0] if eos else text
            for term in until:
                text = text.split(term)[0]
            eos_id = self.tokenizer.eos_token_id
            bound = next((i for i, token in enumerate(canvas) if token == eos_id), len(canvas))
            return list(range(bound)), text, False
        for term in until:
            if term in text:
                text = text.split(term)[0]
        ends = _DecodedLengths(lambda t: self.tok_decode(t, skip_special_tokens=False), canvas)
        covering = 0 if not text else min(bisect.bisect_left(ends, len(text)) + 1, len(ends))
        special = set(self.tokenizer.all_special_ids)
        kept = self.tok_decode(self.tokenizer(text)["input_ids"], skip_special_tokens=True)
        return [i for i in range(covering) if canvas[i] not in special], kept, True

    def _pending_generation(
        self, decoded: Decoded, row: int, prompt: torch.Tensor, prompt_mask: torch.Tensor | None, until: list[str],
        steps: int, at_steps: tuple[int, ...], trajectory: torch.Tensor,
    ) -> _Generation:
        canvas = decoded.tokens[row].tolist()
        positions, text, skip_special = self._kept(canvas, until)
        prompt_len = prompt.shape[1]
        mask = prompt_mask[row : row + 1] if prompt_mask is not None else torch.ones_like(prompt[row : row + 1])
        final = dict(zip(self.state_layers, decoded.final_states, strict=True))
        states = {layer: h[row, prompt_len:].cpu() for layer, h in final.items()}
        prompt_fields = self.captures.prompt_fields(
            {layer: final[layer][row : row + 1, :prompt_len] for layer in self.captures.prompt_layers}, mask)[0]
        prompt_tokens = int(prompt_mask[row].sum()) if prompt_mask is not None else prompt_len
        return _Generation(
            tokens=[canvas[i] for i in positions], positions=positions, text=text, skip_special=skip_special,
            reveal_logprob=decoded.reveal_logprob[row], reveal_step=decoded.reveal_step[row],
            final_logprob=decoded.final_logprob[row], steps=steps, trajectory_steps=at_steps, trajectory=trajectory,
            states=states, prompt_tokens=prompt_tokens,
            prompt_fields=prompt_fields, canvas=canvas,
            reveal_lens=tuple(cells[row] for cells in decoded.reveal_cells),
        )

    def _generation_probe(self, generation: _Generation, text: str) -> ResponseProbe:
        """The record of the kept part of one generation: the fewest kept candidates whose decoding covers
        ``text``; an empty kept text is described by the first candidate (the canvas start when none)."""
        ends = _DecodedLengths(lambda t: self.tok_decode(t, skip_special_tokens=generation.skip_special), generation.tokens)
        kept = 0 if not text or not generation.tokens else min(bisect.bisect_left(ends, len(text)) + 1, len(ends))
        empty = kept == 0
        n = 1 if empty else kept
        token_ends = (0,) if empty else tuple(min(ends[i], len(text)) for i in range(kept))
        index = torch.tensor(generation.positions[:n] if generation.positions else [0], dtype=torch.long)
        reveal = generation.reveal_logprob[index]
        trace = None
        if generation.reveal_lens:  # probe_traces=true: the tokens, their reveal-time log-probabilities and lens grid
            grid = LensGrid(self.lens_layers, *(cells[:, index] for cells in generation.reveal_lens))
            trace = ([generation.canvas[i] for i in index.tolist()], reveal, grid)
        record = self._probe_record(self._layer_states(generation.states, index), generation.prompt_fields, n,
                                    mean_token_logprob=float(reveal.mean()), prompt_tokens=generation.prompt_tokens,
                                    generation=True, token_ends=token_ends, empty=empty, trace=trace)
        return dataclasses.replace(
            record, token_logprobs=tuple(float(v) for v in reveal),
            reveal_steps=tuple(int(s) for s in generation.reveal_step[index]),
            final_token_logprobs=tuple(float(v) for v in generation.final_logprob[index]),
            denoising_steps=generation.steps, trajectory_steps=generation.trajectory_steps,
            trajectory_token_logprobs=tuple(tuple(float(v) for v in step) for step in generation.trajectory[:, index]),
        )

    # ----------------------------------------------------------------------------- loglikelihood

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False, override_bs: int | None = None) -> list[tuple[float, bool]]:
        """Each ``((context, continuation), context ids, continuation ids)`` → ``(estimate, is_greedy)``. HFLM's rolling
        (perplexity) windows come without a key: refused."""
        config = self.diffusion_config
        call = self._current_call()
        out = []
        for key, context_ids, continuation_ids in requests:
            if key is None:
                raise NotImplementedError(
                    "hf-probes-diffusion has no rolling (perplexity) log-likelihood: a masked diffusion LM's likelihood "
                    "is only estimated (Monte Carlo, per request); use generation or multiple-choice tasks"
                )
            if not continuation_ids:
                raise ValueError(f"an empty continuation cannot be scored by hf-probes-diffusion: {key!r}")
            room = self.max_length - len(continuation_ids)
            context_ids = context_ids[-room:] if room > 0 else context_ids[:0]
            context = torch.tensor(context_ids, dtype=torch.long, device=self.device)
            continuation = torch.tensor(continuation_ids, dtype=torch.long, device=self.device)
            forward = self._forward(None)
            seed = request_seed(config.seed, context_ids, continuation_ids)
            if config.likelihood == "dream":  # Dream's harness appends EOS to the target (context only, never masked)
                eos = torch.tensor([self.tokenizer.eos_token_id], dtype=torch.long, device=self.device)
                estimate = dream_mc_loglikelihood(
                    forward, context, torch.cat([continuation, eos]), mask_token_id=self.mask_token_id,
                    samples=config.mc_samples, batch_size=config.mc_batch_size, seed=seed, eps=config.eps,
                    cfg_scale=config.cfg_scale,
                )
            else:
                estimate = mc_loglikelihood(
                    forward, context, continuation, mask_token_id=self.mask_token_id, samples=config.mc_samples,
                    batch_size=config.mc_batch_size, seed=seed, cfg_scale=config.cfg_scale,
                )
            greedy = self._is_greedy(forward, context, continuation) if config.check_greedy else False
            answer = (estimate, greedy)
            if isinstance(call, _LikelihoodCall):  # no cache_hook partials: lm_eval's cache stores the answers with their probes at the end
                call.probes[key] = self._likelihood_probe(forward, context, continuation, estimate)
            out.append(answer)
        return out

    @torch.no_grad()
    def _is_greedy(self, forward: Forward, context: torch.Tensor, continuation: torch.Tensor) -> bool:
        """Whether decoding the continuation's length one token per step gives the continuation."""
        n = continuation.numel()
        decoded = masked_diffusion_decode(forward, context.reshape(1, -1), mask_token_id=self.mask_token_id,
                                          gen_length=n, block_length=n, steps=n,
                                          sampler=Sampler(cfg_scale=self.diffusion_config.cfg_scale))
        return bool(torch.equal(decoded.tokens[0], continuation.cpu()))

    @torch.no_grad()
    def _likelihood_probe(self, forward: Forward, context: torch.Tensor, continuation: torch.Tensor, estimate: float) -> ResponseProbe:
        """The estimate as a record; with probes, their values from one forward over the unmasked request (at the
        continuation's positions; the prompt means over the context's)."""
        n, p = continuation.numel(), context.numel()
        if not self.plan.captures:
            return self._probe_record([], {}, n, mean_token_logprob=estimate / n, prompt_tokens=p)
        logits, states = forward(torch.cat([context, continuation]).reshape(1, -1), True)
        picked = {layer: states[layer][0] for layer in self.state_layers}
        prompt_fields = self.captures.span_fields(picked, p)
        trace = None
        if self.lens_readout is not None:  # probe_traces=true: the continuation's tokens scored by this same forward
            at = self._state_columns(torch.arange(p, p + n, device=logits.device))
            token_logprob = torch.log_softmax(logits[0, p:].double(), dim=-1).gather(
                -1, continuation.unsqueeze(-1)).squeeze(-1).cpu()
            grid = lens_grid_of({layer: states[layer][0, at.to(states[layer].device)] for layer in self.lens_layers},
                                self.lens_readout, continuation, chunk_positions=self.probe_config.chunk_positions)
            trace = (continuation.tolist(), token_logprob, grid)
        del logits
        return self._probe_record(self._layer_states(picked, slice(p, None)), prompt_fields, n,
                                  mean_token_logprob=estimate / n, prompt_tokens=p, trace=trace)


def _num_layers(config: Any) -> int:
    """The number of blocks of a model ``config`` (``hidden_states`` has one more entry)."""
    for key in _LAYER_COUNT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"cannot tell the number of layers of {type(config).__name__} (none of {_LAYER_COUNT_KEYS})")


class _DecodedLengths:
    """``lengths[i]`` = length of the decoding of the first i+1 tokens, decoded once on demand (for bisect)."""

    def __init__(self, decode: Callable[[list[int]], str], tokens: list[int]) -> None:
        self._decode, self._tokens, self._known = decode, tokens, {}

    def __len__(self) -> int:
        return len(self._tokens)

    def __getitem__(self, i: int) -> int:
        if i not in self._known:
            self._known[i] = len(self._decode(self._tokens[: i + 1]))
        return self._known[i]
