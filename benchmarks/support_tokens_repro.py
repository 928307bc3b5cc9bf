"""Reproduction of the log-barrier experiment of "Support Tokens, Stability Margins, …" (arXiv 2602.22271).

    python benchmarks/support_tokens_repro.py --data wiki.test.raw [--out DIR] [--steps N] [--seeds 0,1]
    python benchmarks/support_tokens_repro.py --quick            # a few minutes, no file needed

A small character-level GPT whose first attention layer is the embedding-level prior
(:class:`lm_eval_probes.models.barrier_training.SupportTokenGPT`) is trained on a plain-text file, CE-only and CE + the
log-barrier penalty at each λ (same seeds, same initialisation, same batches, same steps); each model is
then scored on the held-out tail of the file: bits per character (BPC) with Gaussian noise N(0, σ²) added
to the embeddings, σ ∈ {0, 0.1, …, 0.5} (the same noise draws for every model). It prints a Markdown table
(clean BPC, BPC per σ, degradation BPC(σ_max)/BPC(0), mean validation margin), writes it with the raw
numbers as ``repro.md`` / ``repro.json`` and plots ``repro.png`` (BPC against σ) into ``--out``.

Paper (SmallGPT on WikiText-2): clean BPC 2.168 (CE-only) vs 2.198 (barrier); degradation at σ = 0.5
2.68× vs 2.56×; a U-shaped curve over λ with the best near 0.05.

The corpus: the first 90 % of the characters train, the last 10 % validate (``--valid_fraction``). WikiText-2's
train split is not needed: point ``--data`` at any split's raw text (e.g. ``wiki.test.raw``). The vocabulary is
every character of the file. ``--quick`` trains a tiny model on text written offline by the project's
synthetic task generators (arithmetic word problems and logic theories).
Default size: about 11 minutes on 2 idle CPU cores (10 min 42 s measured; it prints the time each model took).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from lm_eval_probes.models.barrier_training import GPTConfig, SupportTokenGPT, barrier_loss, log_barrier_penalty


@dataclass(frozen=True)
class RunSize:
    """Model and training size of one reproduction."""

    context: int
    d_model: int
    layers: int
    heads: int
    batch: int
    steps: int
    lr: float
    eval_chars: int
    margin_positions: int


DEFAULT = RunSize(context=64, d_model=96, layers=2, heads=3, batch=32, steps=1000, lr=5e-3, eval_chars=49152,
                  margin_positions=16)
QUICK = RunSize(context=48, d_model=48, layers=2, heads=2, batch=16, steps=150, lr=5e-3, eval_chars=6144,
                margin_positions=12)


def quick_corpus() -> str:
    """A small corpus made offline: the synthetic tasks' questions and answers."""
    from lm_eval_probes.tasks.synth_arith import generate_arith
    from lm_eval_probes.tasks.synth_logic import generate_logic

    docs = generate_arith(30, seed=7) + generate_logic(20, seed=7)
    return "\n\n".join(f"{doc['question']}\nAnswer: {doc['answer']}" for doc in docs)


def encode(text: str) -> tuple[torch.Tensor, list[str]]:
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), chars


def train(
    data: torch.Tensor, vocab: int, size: RunSize, *, weight: float, seed: int, log_every: int = 100
) -> SupportTokenGPT:
    """CE (+ λ · log-barrier) training; the seed fixes the initialisation and the batches."""
    torch.manual_seed(seed)
    model = SupportTokenGPT(GPTConfig(vocab_size=vocab, context=size.context, d_model=size.d_model,
                                      layers=size.layers, heads=size.heads))
    optimizer = torch.optim.AdamW(model.parameters(), lr=size.lr, weight_decay=0.01)
    warmup = max(1, size.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, size.steps) / max(1, size.steps)))
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
            print(f"  λ={weight:g} step {step + 1}/{size.steps}: CE {float(out['loss'].detach()) / math.log(2):.3f} bits", flush=True)
    return model.eval()


@torch.no_grad()
def evaluate(model: SupportTokenGPT, data: torch.Tensor, size: RunSize, sigmas: list[float], *, seed: int) -> dict:
    """BPC on non-overlapping validation windows at each σ (noise drawn from a per-σ seed), and the clean
    mean margin and penalty."""
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


def table(results: list[dict], sigmas: list[float]) -> str:
    top = sigmas[-1]
    head = ["λ", "clean BPC", *[f"σ={s:g}" for s in sigmas[1:]], f"degradation ×(σ={top:g})", "mean margin", "1% margin (t ≥ 2)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        bpc = r["bpc"]
        cells = [("CE only" if r["weight"] == 0 else f"{r['weight']:g}"), f"{bpc[0.0]:.3f}",
                 *[f"{bpc[s]:.3f}" for s in sigmas[1:]], f"{bpc[top] / bpc[0.0]:.3f}",
                 f"{r['margin_mean']:.3f}", f"{r['margin_p01']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[dict], sigmas: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for r in results:
        label = "CE only" if r["weight"] == 0 else f"λ={r['weight']:g}"
        left.plot(sigmas, [r["bpc"][s] for s in sigmas], marker="o", label=label)
    left.set(xlabel="σ (Gaussian noise on the embeddings)", ylabel="validation BPC", title="BPC under embedding noise")
    left.legend()
    top = sigmas[-1]
    weights = [r["weight"] for r in results]
    right.plot(weights, [r["bpc"][top] / r["bpc"][0.0] for r in results], marker="o")
    right.set(xlabel="λ (0 = CE only)", ylabel=f"degradation BPC(σ={top:g}) / BPC(0)", title="Degradation against λ")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="a plain-text file (UTF-8), e.g. WikiText-2's wiki.test.raw")
    parser.add_argument("--quick", action="store_true", help="tiny size on an offline synthetic corpus (no --data needed)")
    parser.add_argument("--lambdas", default="0.02,0.05,0.1", help="barrier weights λ (besides CE only)")
    parser.add_argument("--sigmas", default="0,0.1,0.2,0.3,0.4,0.5", help="noise levels on the embeddings (first = 0)")
    parser.add_argument("--seeds", default="0", help="training seeds; BPCs are averaged over them")
    parser.add_argument("--steps", type=int, help="training steps (default 1000; --quick 150)")
    parser.add_argument("--margin_positions", type=int,
                        help="positions per sequence whose margins enter each step's penalty (a random sample, fresh each "
                             "step: an unbiased estimate of the mean over positions; default 16, --quick 12)")
    parser.add_argument("--valid_fraction", type=float, default=0.1, help="the file's last fraction of characters held out")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=Path("results/support_tokens_repro"))
    args = parser.parse_args(argv)
    if args.data is None and not args.quick:
        parser.error("give --data FILE (a plain-text corpus) or --quick")
    sigmas = [float(s) for s in args.sigmas.split(",")]
    if sigmas[0] != 0.0 or sorted(sigmas) != sigmas:
        parser.error(f"--sigmas must start at 0 and increase, got {args.sigmas}")
    weights = [0.0] + [float(w) for w in args.lambdas.split(",") if w.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    size = QUICK if args.quick else DEFAULT
    if args.steps is not None:
        size = RunSize(**{**asdict(size), "steps": args.steps})
    if args.margin_positions is not None:
        size = RunSize(**{**asdict(size), "margin_positions": args.margin_positions})
    torch.set_num_threads(args.threads)
    text = quick_corpus() if args.data is None else args.data.read_text(encoding="utf-8")
    data, chars = encode(text)
    cut = int(len(data) * (1 - args.valid_fraction))
    train_data, valid_data = data[:cut], data[cut:]
    print(f"corpus: {args.data or 'synthetic (--quick)'}: {len(data)} chars, vocabulary {len(chars)}; "
          f"train {len(train_data)}, validation {len(valid_data)}; size {size}", flush=True)
    results = []
    for weight in weights:
        per_seed = []
        for seed in seeds:
            began = time.perf_counter()
            model = train(train_data, len(chars), size, weight=weight, seed=seed, log_every=0 if args.quick else 100)
            trained = time.perf_counter() - began
            scores = evaluate(model, valid_data, size, sigmas, seed=seed)
            print(f"λ={weight:g} seed {seed}: trained in {trained:.0f} s; clean BPC {scores['bpc'][0.0]:.3f}, "
                  f"σ={sigmas[-1]:g}: {scores['bpc'][sigmas[-1]]:.3f}", flush=True)
            per_seed.append({**scores, "train_seconds": trained})
        results.append({
            "weight": weight,
            "bpc": {s: sum(r["bpc"][s] for r in per_seed) / len(per_seed) for s in sigmas},
            "margin_mean": sum(r["margin_mean"] for r in per_seed) / len(per_seed),
            "margin_p01": sum(r["margin_p01"] for r in per_seed) / len(per_seed),
            "penalty": sum(r["penalty"] for r in per_seed) / len(per_seed),
            "per_seed": per_seed,
        })
    markdown = table(results, sigmas)
    print("\n" + markdown)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "repro.md").write_text(markdown + "\n", encoding="utf-8")
    report = {"data": str(args.data) if args.data else "synthetic", "size": asdict(size), "seeds": seeds,
              "sigmas": sigmas, "results": results}
    (args.out / "repro.json").write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    plot(results, sigmas, args.out / "repro.png")
    print(f"wrote {args.out}/repro.md, repro.json, repro.png")
    return report


if __name__ == "__main__":
    main()
