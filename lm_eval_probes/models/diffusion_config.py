"""The ``diffusion_*`` ``model_args`` of ``hf-probes-diffusion``, parsed once and strictly into a frozen
:class:`DiffusionConfig` (torch-free, so it fails before any model is loaded).

Every option starts with ``diffusion_``; a key that starts with ``diffusion`` (or nearly spells one of the
options) but is not an option raises ``ValueError`` with a did-you-mean, instead of reaching
``from_pretrained`` as an unknown keyword. The authors' argument names (LLaDA's ``steps``, ``mask_id``,
``cfg``, ``remasking``, ``mc_num``, …; Dream's ``alg``, ``top_p``, ``max_new_tokens``, …) are read as the
option of the same meaning (:data:`ALIASES`) or refused with the option to use (:data:`REFUSED`).
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from lm_eval_probes.config import _as_float, _as_int, unknown_message

logger = logging.getLogger(__name__)

PREFIX = "diffusion_"

DEFAULT_MC_SAMPLES = 128
"""Monte-Carlo samples of a masked log-likelihood estimate (LLaDA's and Dream's ``mc_num`` default)."""

DEFAULT_MC_BATCH_SIZE = 32
"""Samples per forward of that estimate (LLaDA's ``batch_size`` default; must divide the samples)."""

DEFAULT_SEED = 1234
"""Seed of the estimate's random masks and of sampling (LLaDA's ``set_seed(1234)``); each request derives its own."""

LLADA_ALGS: tuple[str, ...] = ("low_confidence", "random")
DREAM_ALGS: tuple[str, ...] = ("origin", "maskgit_plus", "topk_margin", "entropy")
FAMILIES: tuple[str, ...] = ("auto", "llada", "dream", "generic")
STOP_RULES: tuple[str, ...] = ("llada", "dream", "lm_eval")
LIKELIHOODS: tuple[str, ...] = ("llada", "dream")
RANKING_DTYPES: tuple[str, ...] = ("float64", "logits")

FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llada": {"logits_shift": False, "alg": "low_confidence", "stop_rule": "llada", "likelihood": "llada"},
    "dream": {"logits_shift": True, "alg": "entropy", "stop_rule": "dream", "likelihood": "dream"},
    "generic": {"logits_shift": False, "alg": "low_confidence", "stop_rule": "lm_eval", "likelihood": "llada"},
}
"""What each family's own code does: LLaDA's ``generate.py`` / ``eval_llada.py``; Dream's
``generation_utils.py`` (always shifts its logits) and its harnesses (``alg=entropy``; the text cut at the
first EOS); ``generic`` (a masked-LM config such as BERT): LLaDA's sampler, lm_eval's stop rule."""

ALIASES: dict[str, str] = {
    "steps": "steps", "gen_length": "gen_length", "block_length": "block_length", "mask_id": "mask_token_id",
    "cfg": "cfg_scale", "cfg_scale": "cfg_scale", "remasking": "alg", "alg": "alg", "alg_temp": "alg_temp",
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "mc_num": "mc_samples",
    "logits_eos_inf": "logits_eos_inf", "confidence_eos_eot_inf": "confidence_eos_eot_inf",
    "is_check_greedy": "check_greedy", "max_new_tokens": "gen_length", "sampling_eps": "eps",
}
"""The authors' argument names (LLaDA's ``generate`` / ``eval_llada.py``, Dream's ``diffusion_generate`` /
harness) read as the plugin's option of the same meaning, with a one-line notice."""

REFUSED: dict[str, str] = {
    "model_path": "give the checkpoint as pretrained=<path or hub id>",
    "classifier_free_guidance": "Dream's harness guides with un + cfg·(cond − un) (and fails for cfg > 1); "
                                "diffusion_cfg_scale=<cfg − 1> gives that guidance",
    "nll_type": "only the Monte-Carlo estimate is implemented; choose it with diffusion_likelihood=llada|dream",
    "log_type": "only Dream's 'ftb' (the continuation masked) is implemented: diffusion_likelihood=dream",
    "escape_until": "choose the stop rule with diffusion_stop_rule=llada|dream|lm_eval",
}
"""Authors' argument names with no option of the same meaning: a ``ValueError`` naming what to use."""


@dataclass(frozen=True)
class DiffusionConfig:
    """How ``hf-probes-diffusion`` decodes and scores (the ``diffusion_*`` ``model_args``).

    ``None`` fields take the model family's default (:data:`FAMILY_DEFAULTS`) once :meth:`resolved` has
    read the model's config.

    Attributes:
        family: ``llada``, ``dream``, ``generic`` or ``auto`` (``diffusion_family``; from the model config's
            ``model_type`` / ``architectures``): sets ``logits_shift``, ``alg``, ``stop_rule`` and ``likelihood``.
        steps: denoising steps of a generation (``diffusion_steps``); ``None`` = the canvas length (one
            token revealed per step: LLaDA-Instruct's published setting). LLaDA's algorithms: a multiple of
            the number of blocks and at most the canvas length; Dream's: any number >= 1.
        gen_length: canvas length, the masked positions after the prompt (``diffusion_gen_length``);
            ``None`` = the task's ``max_gen_toks``.
        block_length: semi-autoregressive block length (``diffusion_block_length``); ``None`` = the whole
            canvas (one block; the only choice of Dream's algorithms). Must divide the canvas length.
        mask_token_id: id of the mask token (``diffusion_mask_token_id``); ``None`` = the model config's
            ``mask_token_id``, else the tokenizer's mask token, else an error.
        logits_shift: whether position i's logits predict token i + 1 (``diffusion_logits_shift``; Dream,
            adapted from an autoregressive model, does this); the logits are then shifted right by one.
        alg: the sampler (``diffusion_alg``): LLaDA's ``low_confidence`` / ``random`` or Dream's ``origin``
            / ``maskgit_plus`` / ``topk_margin`` / ``entropy`` (:mod:`lm_eval_probes.models.diffusion_decoding`).
        temperature: sampling temperature (``diffusion_temperature``; 0 = greedy); LLaDA: Gumbel-max,
            Dream: a categorical draw, both from generators seeded by ``seed`` and the prompt.
        top_p, top_k: Dream's nucleus / top-k filters (``diffusion_top_p``, ``diffusion_top_k``).
        alg_temp: Dream's ``alg_temp`` (``diffusion_alg_temp``): > 0 draws which positions to reveal.
        eps: Dream's final time and its likelihood's minimum mask probability (``diffusion_eps``, 1e-3).
        cfg_scale: LLaDA's classifier-free guidance (``diffusion_cfg_scale``; 0 = off), generation and likelihood.
        logits_eos_inf: EOS logits set to −inf at every step (``diffusion_logits_eos_inf``, LLaDA).
        confidence_eos_eot_inf: EOS / EoT excluded from ``low_confidence``'s ranking
            (``diffusion_confidence_eos_eot_inf``, LLaDA).
        ranking_dtype: ``float64`` or ``logits`` (``diffusion_ranking_dtype``): the dtype of the ranking
            softmax and scores; ``logits`` is the official codes' rule (ties in bfloat16, see the docs).
        stop_rule: how the kept text is cut (``diffusion_stop_rule``): ``llada`` (decode the whole canvas,
            cut at the task's stop strings, drop special tokens), ``dream`` (cut at the first EOS, then at the
            stop strings) or ``lm_eval`` (cut at the first EOS / pad token, then at the stop strings).
        likelihood: the ``loglikelihood`` estimator (``diffusion_likelihood``): ``llada`` (stratified mask
            counts, weight L/m) or ``dream`` (EOS appended, independent masks with probability t, weight 1/t).
        mc_samples: Monte-Carlo samples of a ``loglikelihood`` request (``diffusion_mc_samples``).
        mc_batch_size: samples per forward of that estimate (``diffusion_mc_batch_size``); divides ``mc_samples``
            (not given: the largest divisor of ``mc_samples`` up to 32 that also divides 32).
        seed: seed of the estimate's masks and of sampling (``diffusion_seed``); each request derives its
            own seed from it and its token ids, so results depend neither on the request order nor on batching.
        check_greedy: ``loglikelihood``'s ``is_greedy`` (``diffusion_check_greedy``): decode the
            continuation's length one token per step and compare (LLaDA's ``suffix_greedy_prediction``);
            ``False`` (LLaDA's recommendation; no metric of this plugin reads it) answers ``False``.
    """

    family: str = "auto"
    steps: int | None = None
    gen_length: int | None = None
    block_length: int | None = None
    mask_token_id: int | None = None
    logits_shift: bool | None = None
    alg: str | None = None
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    alg_temp: float = 0.0
    eps: float = 1e-3
    cfg_scale: float = 0.0
    logits_eos_inf: bool = False
    confidence_eos_eot_inf: bool = False
    ranking_dtype: str = "float64"
    stop_rule: str | None = None
    likelihood: str | None = None
    mc_samples: int = DEFAULT_MC_SAMPLES
    mc_batch_size: int = DEFAULT_MC_BATCH_SIZE
    seed: int = DEFAULT_SEED
    check_greedy: bool = False

    def __post_init__(self) -> None:
        for name, valid in (("family", FAMILIES), ("alg", LLADA_ALGS + DREAM_ALGS), ("stop_rule", STOP_RULES),
                            ("likelihood", LIKELIHOODS), ("ranking_dtype", RANKING_DTYPES)):
            value = getattr(self, name)
            if value is not None and value not in valid:
                raise ValueError(unknown_message(f"diffusion_{name} value", value, valid))
        for name in ("steps", "gen_length", "block_length", "top_k"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"diffusion_{name} must be an integer >= 1, got {value}")
        if self.mask_token_id is not None and self.mask_token_id < 0:
            raise ValueError(f"diffusion_mask_token_id must be a token id >= 0, got {self.mask_token_id}")
        for name in ("temperature", "alg_temp", "cfg_scale"):
            if getattr(self, name) < 0:
                raise ValueError(f"diffusion_{name} must be >= 0, got {getattr(self, name)}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"diffusion_top_p must be in (0, 1], got {self.top_p}")
        if not 0 < self.eps < 1:
            raise ValueError(f"diffusion_eps must be in (0, 1), got {self.eps}")
        if self.mc_samples < 1 or self.mc_batch_size < 1 or self.mc_samples % self.mc_batch_size:
            raise ValueError(
                f"diffusion_mc_samples ({self.mc_samples}) must be a positive multiple of diffusion_mc_batch_size "
                f"({self.mc_batch_size})"
            )
        alg = self.effective_alg
        if alg is None:  # family auto: what fits every family now, the rest once resolved
            if self.gen_length is not None:
                block = self.block_length or self.gen_length
                if self.gen_length % block:
                    raise ValueError(f"diffusion_block_length ({block}) must divide the canvas length ({self.gen_length})")
                if block < self.gen_length:  # semi-autoregressive blocks: LLaDA's sampler
                    replace(self, family="llada")
            return
        if self.confidence_eos_eot_inf and alg != "low_confidence":
            raise ValueError(f"diffusion_confidence_eos_eot_inf ranks LLaDA's low_confidence; diffusion_alg is {alg!r}")
        if alg in LLADA_ALGS and (self.top_p is not None or self.top_k is not None or self.alg_temp > 0):
            raise ValueError(f"diffusion_top_p, diffusion_top_k and diffusion_alg_temp are Dream's; diffusion_alg {alg!r} is LLaDA's")
        if self.gen_length is not None:
            self.schedule(self.gen_length)  # the explicit canvas must fit the block length and steps now

    @property
    def effective_alg(self) -> str | None:
        """``alg``, else the family's default; ``None`` while the family is ``auto`` and no alg was given."""
        if self.alg is not None:
            return self.alg
        return FAMILY_DEFAULTS[self.family]["alg"] if self.family in FAMILY_DEFAULTS else None

    def schedule(self, gen_length: int | None = None) -> tuple[int, int, int]:
        """``(gen_length, block_length, steps)`` for a canvas of ``self.gen_length`` or else ``gen_length``
        positions (the task's ``max_gen_toks``); raises ``ValueError`` when they do not fit together."""
        length = self.gen_length if self.gen_length is not None else gen_length
        if length is None or length < 1:
            raise ValueError(f"the diffusion canvas needs a length >= 1, got {length!r}")
        block = self.block_length if self.block_length is not None else length
        steps = self.steps if self.steps is not None else length
        if self.effective_alg in DREAM_ALGS:
            if block != length:
                raise ValueError(f"Dream's sampler (diffusion_alg={self.effective_alg}) has no semi-autoregressive blocks: "
                                 f"diffusion_block_length ({block}) must be the canvas length ({length})")
            return length, block, steps
        if length % block:
            raise ValueError(f"diffusion_block_length ({block}) must divide the canvas length ({length})")
        blocks = length // block
        if steps % blocks or steps > length:
            raise ValueError(
                f"diffusion_steps ({steps}) must be a multiple of the number of blocks ({length} / {block} = {blocks}) "
                f"and at most the canvas length ({length})"
            )
        return length, block, steps

    def resolved(self, model_config: Any) -> DiffusionConfig:
        """The configuration with the family decided (``auto``: :func:`detect_family` on the model config)
        and every ``None`` family setting filled; ``ValueError`` for a remote-code model of neither family
        without an explicit ``diffusion_logits_shift`` (a wrong shift gives wrong tokens without a word)."""
        family = self.family
        if family == "auto":
            family = detect_family(model_config)
            if family is None:
                if getattr(model_config, "auto_map", None) and self.logits_shift is None:
                    raise ValueError(
                        f"hf-probes-diffusion cannot tell which diffusion family the remote-code model "
                        f"{getattr(model_config, 'model_type', '?')!r} belongs to (neither LLaDA nor Dream): pass "
                        "diffusion_family=llada|dream, or diffusion_logits_shift=true|false (with diffusion_alg, "
                        "diffusion_stop_rule, diffusion_likelihood as needed)"
                    )
                family = "generic"
        defaults = FAMILY_DEFAULTS[family]
        return replace(self, family=family, **{k: v if getattr(self, k) is None else getattr(self, k) for k, v in defaults.items()})

    @classmethod
    def from_model_args(cls, args: Mapping[str, Any]) -> DiffusionConfig:
        """Build from the ``diffusion_*`` keys of ``model_args`` (see :func:`split_diffusion_args`)."""
        options = {f"{PREFIX}{f.name}": f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in args.items():
            if key not in options:
                raise ValueError(unknown_message("hf-probes-diffusion option", key, options))
            f = options[key]
            values[f.name] = _parse(key, value, f.type)
        if "mc_samples" in values and "mc_batch_size" not in values:  # e.g. LLaDA's mc_num=1 for MMLU
            values["mc_batch_size"] = math.gcd(values["mc_samples"], DEFAULT_MC_BATCH_SIZE)
        return cls(**values)


def detect_family(model_config: Any) -> str | None:
    """``llada`` or ``dream`` from a model config's ``model_type`` / ``architectures`` (case ignored),
    else ``None``."""
    names = [str(getattr(model_config, "model_type", "") or "")] + [str(a) for a in getattr(model_config, "architectures", None) or []]
    text = " ".join(names).lower()
    if "llada" in text:
        return "llada"
    if "dream" in text:
        return "dream"
    return None


def _parse(key: str, value: Any, kind: Any) -> Any:
    kind = str(kind)
    optional = "None" in kind
    if optional and (value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "auto"))):
        return None
    if kind.startswith("bool"):
        return _as_bool(key, value)
    if kind.startswith("float"):
        return _as_float(key, value)
    if kind.startswith("str"):
        return str(value).strip().lower()
    return _as_int(key, value)


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def is_diffusion_key(key: str) -> bool:
    """Whether a ``model_args`` key belongs to ``hf-probes-diffusion``: ``diffusion*``, a near miss of an
    option, or one of the authors' argument names (:data:`ALIASES`, :data:`REFUSED`)."""
    options = [f"{PREFIX}{f.name}" for f in fields(DiffusionConfig)]
    return (key.startswith("diffusion") or key in ALIASES or key in REFUSED
            or bool(difflib.get_close_matches(key, options, cutoff=0.85)))


def split_diffusion_args(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``model_args`` into (``diffusion_*`` keys, the rest); the authors' names in :data:`ALIASES`
    become the plugin's option (one notice each), those in :data:`REFUSED` raise ``ValueError``."""
    ours: dict[str, Any] = {}
    for key, value in kwargs.items():
        if not is_diffusion_key(key):
            continue
        if key in REFUSED:
            raise ValueError(f"hf-probes-diffusion does not take {key!r}: {REFUSED[key]}")
        if key in ALIASES:
            option = PREFIX + ALIASES[key]
            if option in kwargs or option in ours:
                raise ValueError(f"{key!r} and {option!r} both given: pass {option!r} only")
            logger.warning("hf-probes-diffusion: %s=%s read as %s", key, value, option)
            ours[option] = value
        else:
            ours[key] = value
    rest = {k: v for k, v in kwargs.items() if not is_diffusion_key(k)}
    return ours, rest
