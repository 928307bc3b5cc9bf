"""The ``diffusion_*`` ``model_args`` of ``hf-probes-diffusion``, parsed once and strictly into a frozen
:class:`DiffusionConfig` (torch-free, so it fails before any model is loaded).

Every option starts with ``diffusion_``; a key that starts with ``diffusion`` (or nearly spells one of the
options) but is not an option raises ``ValueError`` with a did-you-mean, instead of reaching
``from_pretrained`` as an unknown keyword.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from lm_eval_probes.config import _as_int, unknown_message

PREFIX = "diffusion_"

DEFAULT_MC_SAMPLES = 128
"""Monte-Carlo samples of a masked log-likelihood estimate (LLaDA's and Dream's ``mc_num`` default)."""

DEFAULT_MC_BATCH_SIZE = 32
"""Samples per forward of that estimate (LLaDA's ``batch_size`` default; must divide the samples)."""

DEFAULT_SEED = 1234
"""Seed of the estimate's random masks (LLaDA's ``set_seed(1234)``); each request derives its own from it."""


@dataclass(frozen=True)
class DiffusionConfig:
    """How ``hf-probes-diffusion`` decodes and scores (the ``diffusion_*`` ``model_args``).

    Attributes:
        steps: denoising steps of a generation (``diffusion_steps``); ``None`` = the canvas length (one
            token revealed per step: LLaDA-Instruct's published setting). Must be a multiple of the
            number of blocks and at most the canvas length.
        gen_length: canvas length, the masked positions after the prompt (``diffusion_gen_length``);
            ``None`` = the task's ``max_gen_toks``.
        block_length: semi-autoregressive block length (``diffusion_block_length``); ``None`` = the whole
            canvas (one block). Must divide the canvas length.
        mask_token_id: id of the mask token (``diffusion_mask_token_id``); ``None`` = the model config's
            ``mask_token_id``, else the tokenizer's mask token, else an error.
        logits_shift: whether position i's logits predict token i + 1 (``diffusion_logits_shift``;
            Dream, adapted from an autoregressive model, does this); the logits are then shifted right by one.
        mc_samples: Monte-Carlo samples of a ``loglikelihood`` request (``diffusion_mc_samples``).
        mc_batch_size: samples per forward of that estimate (``diffusion_mc_batch_size``); divides ``mc_samples``.
        seed: seed of the estimate's masks (``diffusion_seed``); each request derives its own seed from
            it and its token ids, so results depend neither on the request order nor on batching.
        check_greedy: ``loglikelihood``'s ``is_greedy`` (``diffusion_check_greedy``): decode the
            continuation's length one token per step and compare (LLaDA's ``suffix_greedy_prediction``);
            ``False`` (LLaDA's recommendation; no metric of this plugin reads it) answers ``False``.
    """

    steps: int | None = None
    gen_length: int | None = None
    block_length: int | None = None
    mask_token_id: int | None = None
    logits_shift: bool = False
    mc_samples: int = DEFAULT_MC_SAMPLES
    mc_batch_size: int = DEFAULT_MC_BATCH_SIZE
    seed: int = DEFAULT_SEED
    check_greedy: bool = False

    def __post_init__(self) -> None:
        for name in ("steps", "gen_length", "block_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"diffusion_{name} must be an integer >= 1, got {value}")
        if self.mask_token_id is not None and self.mask_token_id < 0:
            raise ValueError(f"diffusion_mask_token_id must be a token id >= 0, got {self.mask_token_id}")
        if self.mc_samples < 1 or self.mc_batch_size < 1 or self.mc_samples % self.mc_batch_size:
            raise ValueError(
                f"diffusion_mc_samples ({self.mc_samples}) must be a positive multiple of diffusion_mc_batch_size "
                f"({self.mc_batch_size})"
            )
        if self.gen_length is not None:
            self.schedule(self.gen_length)  # the explicit canvas must fit the block length and steps now

    def schedule(self, gen_length: int | None = None) -> tuple[int, int, int]:
        """``(gen_length, block_length, steps)`` for a canvas of ``self.gen_length`` or else ``gen_length``
        positions (the task's ``max_gen_toks``); raises ``ValueError`` when they do not fit together."""
        length = self.gen_length if self.gen_length is not None else gen_length
        if length is None or length < 1:
            raise ValueError(f"the diffusion canvas needs a length >= 1, got {length!r}")
        block = self.block_length if self.block_length is not None else length
        steps = self.steps if self.steps is not None else length
        if length % block:
            raise ValueError(f"diffusion_block_length ({block}) must divide the canvas length ({length})")
        blocks = length // block
        if steps % blocks or steps > length:
            raise ValueError(
                f"diffusion_steps ({steps}) must be a multiple of the number of blocks ({length} / {block} = {blocks}) "
                f"and at most the canvas length ({length})"
            )
        return length, block, steps

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
        return cls(**values)


def _parse(key: str, value: Any, kind: Any) -> Any:
    kind = str(kind)
    if kind == "bool":
        return _as_bool(key, value)
    optional = "None" in kind
    if optional and (value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "auto"))):
        return None
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
    """Whether a ``model_args`` key belongs to ``hf-probes-diffusion`` (``diffusion*`` or a near miss of an option)."""
    options = [f"{PREFIX}{f.name}" for f in fields(DiffusionConfig)]
    return key.startswith("diffusion") or bool(difflib.get_close_matches(key, options, cutoff=0.85))


def split_diffusion_args(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``model_args`` into (``diffusion_*`` keys, the rest)."""
    ours = {k: v for k, v in kwargs.items() if is_diffusion_key(k)}
    return ours, {k: v for k, v in kwargs.items() if k not in ours}
