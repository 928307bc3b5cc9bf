"""The training engine of ``reproduce margins``: the log-barrier experiment of "Support Tokens, Stability Margins, …"
(arXiv 2602.22271).

A small character-level GPT whose first attention layer is the embedding-level prior
(:class:`lm_eval_probes.models.barrier_training.SupportTokenGPT`) is trained on a plain-text corpus, CE-only and
CE + λ · log-barrier at each λ (per seed: the same initialisation, the same batches, the same steps for every λ);
each model is then scored on the corpus's held-out tail: bits per character (BPC) with Gaussian noise N(0, σ²) on
the embeddings, the same noise draws for every model of a seed. The report (:func:`run_engine`) keeps each seed's
numbers (``per_seed``) next to their mean over seeds; :func:`write_report` writes it as ``repro.json``, its table
as ``repro.md`` and BPC against σ as ``repro.png``.

The corpus (:func:`load_corpus`): the first 90 % of the characters train, the last 10 % validate; the vocabulary is
every character of the text. Without a file, :func:`quick_corpus` is text written offline by the project's
synthetic task generators. Sizes: :data:`DEFAULT` (about 11 minutes per seed on 2 idle CPU cores) and :data:`QUICK`.

Randomness comes in as the seeds only: seed s fixes the initialisation (``torch.manual_seed(s)`` inside
``torch.random.fork_rng``, so the caller's global generator is left as it was), the batches (a generator seeded
s + 1), the penalty's sampled positions (s + 2) and the evaluation noise (s · 1000 + the σ's index).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from lm_eval_probes.models.barrier_training import GPTConfig, SupportTokenGPT, barrier_loss, log_barrier_penalty

logger = logging.getLogger(__name__)

ENGINE = "lm_eval_probes.reproduce.margins_engine"
"""The engine's name in the reports it writes and the claims read from them."""


@dataclass(frozen=True)
class RunSize:
    """Model and training size of one reproduction.

    Attributes:
        context: characters per training window and per evaluation window.
        d_model, layers, heads: the GPT's width, blocks and heads.
        batch: windows per training step.
        steps: training steps (0: the initialisation is scored).
        lr: AdamW's peak learning rate (linear warm-up over the first 5 % of steps, then cosine to 0).
        eval_chars: at most this many held-out characters are scored (whole windows).
        margin_positions: positions per window whose margins enter each step's penalty (a fresh random sample per
            step: an unbiased estimate of the mean over positions); ≥ context − 1 means all of them.
    """

    context: int
    d_model: int
    layers: int
    heads: int
    batch: int
    steps: int
    lr: float
    eval_chars: int
    margin_positions: int

    def __post_init__(self) -> None:
        if min(self.context, self.d_model, self.layers, self.heads, self.batch, self.eval_chars,
               self.margin_positions) < 1 or self.steps < 0:
            raise ValueError(f"every size must be >= 1 (steps >= 0), got {self}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be finite and > 0, got {self.lr!r}")


DEFAULT = RunSize(context=64, d_model=96, layers=2, heads=3, batch=32, steps=1000, lr=5e-3, eval_chars=49152,
                  margin_positions=16)
QUICK = RunSize(context=48, d_model=48, layers=2, heads=2, batch=16, steps=150, lr=5e-3, eval_chars=6144,
                margin_positions=12)
DEFAULT_LAMBDAS = (0.02, 0.05, 0.1)
DEFAULT_SIGMAS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
DEFAULT_VALID_FRACTION = 0.1


@dataclass(frozen=True)
class EngineSettings:
    """What one engine run trains and scores.

    Attributes:
        size: the :class:`RunSize`.
        lambdas: the barrier weights λ > 0 trained besides CE only (λ = 0).
        sigmas: the noise levels σ on the embeddings, 0 first, increasing.
        seeds: the training seeds (distinct); every λ is trained once per seed.
    """

    size: RunSize = DEFAULT
    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    sigmas: tuple[float, ...] = DEFAULT_SIGMAS
    seeds: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        if not all(math.isfinite(w) and w > 0 for w in self.lambdas):
            raise ValueError(f"every λ must be finite and > 0 (CE only, λ = 0, is always trained), got {self.lambdas}")
        if not self.sigmas or self.sigmas[0] != 0.0 or any(b <= a for a, b in zip(self.sigmas, self.sigmas[1:])) \
                or not all(math.isfinite(s) for s in self.sigmas):
            raise ValueError(f"sigmas must start at 0 and increase, got {self.sigmas}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or any(s < 0 for s in self.seeds):
            raise ValueError(f"seeds must be distinct integers >= 0, at least one, got {self.seeds}")

    @property
    def weights(self) -> tuple[float, ...]:
        """CE only (0) and the barrier weights, in training order."""
        return (0.0, *self.lambdas)

    @classmethod
    def from_options(cls, *, quick: bool = False, lambdas: str | None = None, sigmas: str | None = None,
                     seeds: str | None = None, steps: int | None = None,
                     margin_positions: int | None = None) -> EngineSettings:
        """Settings from command-line text: comma-separated ``lambdas``, ``sigmas`` and ``seeds`` (``None``: the
        defaults), :data:`QUICK` or :data:`DEFAULT` size with ``steps`` / ``margin_positions`` replaced where given.

        Raises:
            ValueError: a list that does not parse, or values the settings reject (the message names the option).
        """
        size = QUICK if quick else DEFAULT
        if steps is not None:
            size = replace(size, steps=steps)
        if margin_positions is not None:
            size = replace(size, margin_positions=margin_positions)
        return cls(size=size,
                   lambdas=DEFAULT_LAMBDAS if lambdas is None else _numbers(lambdas, "--lambdas", float),
                   sigmas=DEFAULT_SIGMAS if sigmas is None else _numbers(sigmas, "--sigmas", float),
                   seeds=(0,) if seeds is None else _numbers(seeds, "--seeds", int))


def _numbers(text: str, option: str, kind: type) -> tuple[Any, ...]:
    try:
        return tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{option} must be comma-separated {kind.__name__}s, got {text!r}") from None


@dataclass(frozen=True)
class Corpus:
    """A text encoded per character and split: ``train`` then ``valid`` (int64 ``[n]`` indices into ``chars``)."""

    train: torch.Tensor
    valid: torch.Tensor
    chars: tuple[str, ...]
    source: str
    valid_fraction: float

    @property
    def vocab(self) -> int:
        return len(self.chars)


def quick_corpus() -> str:
    """A small corpus made offline: the synthetic tasks' questions and answers."""
    from lm_eval_probes.tasks.synth_arith import generate_arith
    from lm_eval_probes.tasks.synth_logic import generate_logic

    docs = generate_arith(30, seed=7) + generate_logic(20, seed=7)
    return "\n\n".join(f"{doc['question']}\nAnswer: {doc['answer']}" for doc in docs)


def encode(text: str) -> tuple[torch.Tensor, list[str]]:
    """Character indices (int64 ``[len(text)]``) into the sorted characters of ``text``, and those characters."""
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), chars


def load_corpus(path: str | Path | None, *, context: int, valid_fraction: float = DEFAULT_VALID_FRACTION) -> Corpus:
    """A plain-text (UTF-8) file, or :func:`quick_corpus` for ``None``, encoded and split: the last
    ``valid_fraction`` of the characters held out.

    Raises:
        ValueError: no such file, not UTF-8, a fraction outside (0, 1), or a part too short for one window of
            ``context`` + 1 characters.
    """
    if not 0.0 < valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must be in (0, 1), got {valid_fraction!r}")
    if path is None:
        text, source = quick_corpus(), "synthetic"
    else:
        if not Path(path).is_file():
            raise ValueError(f"no corpus file at {path}")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path} is not UTF-8 text: {error}") from None
        source = str(path)
    data, chars = encode(text)
    cut = int(len(data) * (1 - valid_fraction))
    train_data, valid_data = data[:cut], data[cut:]
    if min(len(train_data), len(valid_data)) < context + 2:
        raise ValueError(f"{source}: {len(data)} characters split into {len(train_data)} + {len(valid_data)}; each part "
                         f"needs at least {context + 2} (one window of {context} and its targets)")
    return Corpus(train_data, valid_data, tuple(chars), source, valid_fraction)


def train(
    data: torch.Tensor, vocab: int, size: RunSize, *, weight: float, seed: int, log_every: int = 100
) -> SupportTokenGPT:
    """CE (+ λ · log-barrier, λ = ``weight``) training on random windows of ``data``; the seed fixes the
    initialisation and the batches (the same for every λ), so runs of one seed differ only in the loss."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SupportTokenGPT(GPTConfig(vocab_size=vocab, context=size.context, d_model=size.d_model,
                                          layers=size.layers, heads=size.heads))
        optimizer = torch.optim.AdamW(model.parameters(), lr=size.lr, weight_decay=0.01)
        warmup = max(1, size.steps // 20)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, size.steps) / max(1, size.steps))),
        )
        batches = torch.Generator().manual_seed(seed + 1)  # the same batches for every λ
        sampled = torch.Generator().manual_seed(seed + 2)  # the penalty's positions: a stream of their own
        model.train()
        for step in range(size.steps):
            starts = torch.randint(0, len(data) - size.context - 1, (size.batch,), generator=batches)
            window = torch.stack([data[s : s + size.context + 1] for s in starts.tolist()])
            positions = None
            if weight > 0 and size.margin_positions < size.context - 1:  # a fresh sample of positions 1..T−1 per step
                positions = (torch.randperm(size.context - 1, generator=sampled)[: size.margin_positions] + 1).sort().values
            out = model(window[:, :-1], labels=window[:, 1:], with_margins=weight > 0, margin_positions=positions)
            loss = barrier_loss(out["loss"], out["margins"], weight=weight) if weight > 0 else out["loss"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            if log_every and (step + 1) % log_every == 0:
                logger.info("  λ=%g step %d/%d: CE %.3f bits", weight, step + 1, size.steps,
                            float(out["loss"].detach()) / math.log(2))
    return model.eval()


@torch.no_grad()
def evaluate(model: SupportTokenGPT, data: torch.Tensor, size: RunSize, sigmas: Sequence[float], *,
             seed: int) -> dict[str, Any]:
    """BPC on non-overlapping windows of ``data`` at each σ (noise from a generator seeded seed · 1000 + the σ's
    index), and the clean margins of the first 256 windows.

    Returns:
        ``bpc`` ``{σ: bits per character}`` (mean CE / ln 2, lower is better), ``margin_mean`` (mean defined
        margin), ``margin_p01`` (1 % quantile from position 2 on: position 1's margin is exactly 0) and ``penalty``
        (the log-barrier penalty of those margins).
    """
    usable = min(len(data) - 1, size.eval_chars) // size.context * size.context
    inputs = data[:usable].view(-1, size.context)
    targets = data[1 : usable + 1].view(-1, size.context)
    bpc = {}
    for k, sigma in enumerate(sigmas):
        noise = torch.Generator().manual_seed(seed * 1000 + k)
        total = 0.0
        for lo in range(0, inputs.shape[0], 64):
            out = model(inputs[lo : lo + 64], labels=targets[lo : lo + 64], noise_std=sigma, generator=noise,
                        with_margins=False)
            total += float(out["loss"]) * inputs[lo : lo + 64].numel()
        bpc[sigma] = total / inputs.numel() / math.log(2)
    margins = torch.cat([model(inputs[lo : lo + 64])["margins"] for lo in range(0, min(256, inputs.shape[0]), 64)])
    defined = margins[~torch.isnan(margins)]
    spread = margins[:, 2:].flatten()  # from position 2 on: position 1's prefix is one token, its margin exactly 0
    return {"bpc": bpc, "margin_mean": float(defined.mean()), "margin_p01": float(spread.quantile(0.01)),
            "penalty": float(log_barrier_penalty(margins))}


def run_engine(corpus: Corpus, settings: EngineSettings, *, log_every: int = 100) -> dict[str, Any]:
    """Train and score every λ (CE only first) for every seed; progress goes to this module's logger (INFO).

    Returns:
        The report: ``data`` (the corpus's source), ``size``, ``seeds``, ``sigmas``, ``valid_fraction``, ``engine``
        and ``results``, one per λ: ``weight`` (0 = CE only), ``bpc`` ``{σ: BPC}``, ``margin_mean``,
        ``margin_p01`` and ``penalty`` (each the mean over seeds), and ``per_seed`` (each seed's ``seed``, those
        numbers and ``train_seconds``, in the order of ``seeds``).
    """
    size, sigmas = settings.size, list(settings.sigmas)
    logger.info("corpus: %s: %d chars, vocabulary %d; train %d, validation %d; size %s",
                corpus.source if corpus.source != "synthetic" else "synthetic (--quick)",
                len(corpus.train) + len(corpus.valid), corpus.vocab, len(corpus.train), len(corpus.valid), size)
    results = []
    for weight in settings.weights:
        per_seed = []
        for seed in settings.seeds:
            began = time.perf_counter()
            model = train(corpus.train, corpus.vocab, size, weight=weight, seed=seed, log_every=log_every)
            trained = time.perf_counter() - began
            scores = evaluate(model, corpus.valid, size, sigmas, seed=seed)
            logger.info("λ=%g seed %d: trained in %.0f s; clean BPC %.3f, σ=%g: %.3f", weight, seed, trained,
                        scores["bpc"][0.0], sigmas[-1], scores["bpc"][sigmas[-1]])
            per_seed.append({"seed": seed, **scores, "train_seconds": trained})
        results.append({
            "weight": weight,
            "bpc": {s: sum(r["bpc"][s] for r in per_seed) / len(per_seed) for s in sigmas},
            "margin_mean": sum(r["margin_mean"] for r in per_seed) / len(per_seed),
            "margin_p01": sum(r["margin_p01"] for r in per_seed) / len(per_seed),
            "penalty": sum(r["penalty"] for r in per_seed) / len(per_seed),
            "per_seed": per_seed,
        })
    return {"data": corpus.source, "size": asdict(size), "seeds": list(settings.seeds), "sigmas": sigmas,
            "valid_fraction": corpus.valid_fraction, "engine": ENGINE, "results": results}


def table(results: Sequence[dict[str, Any]], sigmas: Sequence[float]) -> str:
    """The report's results as Markdown: clean BPC, BPC per σ, degradation BPC(σ_max) / BPC(0) and the margins."""
    top = sigmas[-1]
    head = ["λ", "clean BPC", *[f"σ={s:g}" for s in sigmas[1:]], f"degradation ×(σ={top:g})", "mean margin",
            "1% margin (t ≥ 2)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        bpc = r["bpc"]
        cells = [("CE only" if r["weight"] == 0 else f"{r['weight']:g}"), f"{bpc[0.0]:.3f}",
                 *[f"{bpc[s]:.3f}" for s in sigmas[1:]], f"{bpc[top] / bpc[0.0]:.3f}",
                 f"{r['margin_mean']:.3f}", f"{r['margin_p01']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: Sequence[dict[str, Any]], sigmas: Sequence[float], path: Path) -> None:
    """BPC against σ per λ, and the degradation against λ, side by side (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    try:
        for r in results:
            label = "CE only" if r["weight"] == 0 else f"λ={r['weight']:g}"
            left.plot(sigmas, [r["bpc"][s] for s in sigmas], marker="o", label=label)
        left.set(xlabel="σ (Gaussian noise on the embeddings)", ylabel="validation BPC",
                 title="BPC under embedding noise")
        left.legend()
        top = sigmas[-1]
        weights = [r["weight"] for r in results]
        right.plot(weights, [r["bpc"][top] / r["bpc"][0.0] for r in results], marker="o")
        right.set(xlabel="λ (0 = CE only)", ylabel=f"degradation BPC(σ={top:g}) / BPC(0)",
                  title="Degradation against λ")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def write_report(report: dict[str, Any], out: str | Path) -> tuple[Path, Path, Path]:
    """Write ``OUT/repro.md`` (:func:`table`), ``OUT/repro.json`` (the report; σ keys as strings) and
    ``OUT/repro.png`` (:func:`plot`); returns the three paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    markdown, as_json, figure = out / "repro.md", out / "repro.json", out / "repro.png"
    markdown.write_text(table(report["results"], report["sigmas"]) + "\n", encoding="utf-8")
    as_json.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    plot(report["results"], report["sigmas"], figure)
    return markdown, as_json, figure


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block on ``threads`` torch CPU threads (``None``: as they are), restoring the count afterwards."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
