"""The margins of every decoder-only type against the eager-attention reference, in one run.

    python benchmarks/margins_eager.py [--types T ...] [--tokens 12]

Each type of ``benchmarks/architectures.py`` is built small with eager attention (seed 0); its margins as the capture
computes them (``tests/test_margin_capture.py``'s ``captured_margins``: this machine's precision, float64 on a CPU)
are compared position by position with ``eager_margins`` (an autograd Jacobian through the layer's own eager attention;
DeepSeek-V4's compressed key that reads x_t left out at t, ``tests/test_last_families.py``'s ``compressed_reads_own``;
CPM-Ant's, which attends both ways over its prompt positions and the input's, its ``bidirectional_eager_margins``),
at 1e-4 relative and 1e-5 absolute. Prints one line per type (``agrees``, ``differs`` with the largest difference,
``nan`` where both are, or the one-line reason the capture or the reference could not run) and the counts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", nargs="*", help="model types (default: every decoder-only type)")
    parser.add_argument("--tokens", type=int, default=12)
    args = parser.parse_args(argv)
    from test_margin_capture import _eager_built, captured_margins, eager_margins

    import importlib.util

    spec = importlib.util.spec_from_file_location("lm_eval_probes_bench_architectures", REPO / "benchmarks" / "architectures.py")
    architectures = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(architectures)
    from test_last_families import bidirectional_eager_margins, compressed_reads_own
    counts: dict[str, int] = {}
    ids = list(range(3, 3 + args.tokens))
    for model_type in args.types or architectures.decoder_only_types():
        try:
            model = _eager_built(model_type)
            captured = captured_margins(model, ids)[0][0]
            reference = bidirectional_eager_margins(model, ids) if model_type == "cpmant" else \
                eager_margins(model, ids, reads_own=compressed_reads_own(model))
        except Exception as error:  # a type that cannot be built, captured or referenced: its reason, one line
            outcome, detail = "skipped", f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
        else:
            both = torch.isfinite(captured) & torch.isfinite(reference)
            if not both.any():
                outcome, detail = "nan", ""
            else:
                close = torch.isclose(captured[both], reference[both], rtol=1e-4, atol=1e-5).all()
                diff = (captured[both] - reference[both]).abs().max().item()
                same_nan = bool((torch.isnan(captured) == torch.isnan(reference)).all())
                outcome = "agrees" if close and same_nan else "differs"
                detail = f"max |diff| {diff:.2g}" + ("" if same_nan else ", nan at other positions")
        counts[outcome] = counts.get(outcome, 0) + 1
        print(f"{model_type}\t{outcome}\t{detail}", flush=True)
    print(counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
