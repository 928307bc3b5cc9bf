"""Calibration, reader and detector validation on a real model (the issue's "Unsure but Certain" protocol).

    python benchmarks/calibration.py --data_dir ../shared/data [--gsm8k_limit 60] [--proofwriter_limit 300]
        [--pretrained DIR --gguf_file F] [--output_path results/calibration]

Runs ``probes_gsm8k`` and ``probes_gsm8k_noise_swap`` (clean vs noised twins), ``probes_proofwriter``,
and the detector tasks ``probes_proofwriter_detect`` / ``probes_gsm8k_detect`` through ``lm-eval-probes``
(bundled SmolLM2-135M-Instruct by default), then prints one table of accuracy, mean confidence, ECE,
ECE after temperature scaling, selective AUROC, AURC, LCR AUROC / ECE and the corruption rows, read
from the results JSON files lm_eval wrote.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lm_eval_probes.cli.demo import SMOLLM2_GGUF, smollm2_folder

COLUMNS = ("acc", "confidence", "ece", "ece_scaled", "selective_auroc", "aurc", "lcr_auroc", "lcr_ece",
           "corruption_auroc", "corruption_confidence_auroc", "answer_unlocated")


def run(tasks: list[str], limit: int, args: argparse.Namespace) -> Path:
    from lm_eval_probes.__main__ import main as cli_main

    out = Path(args.output_path) / "_".join(tasks)
    model_args = f"pretrained={args.pretrained or smollm2_folder()},probes=tcb+bte+reader"
    if args.gguf_file or not args.pretrained:
        model_args += f",gguf_file={args.gguf_file or SMOLLM2_GGUF}"
    cli_main([
        "--model", "hf-probes", "--model_args", model_args, "--tasks", ",".join(tasks), "--limit", str(limit),
        "--metadata", json.dumps({"probes_data_dir": str(Path(args.data_dir).resolve())}),
        "--device", "cpu", "--batch_size", str(args.batch_size), "--output_path", str(out), "--log_samples",
    ])
    return out


def rows(out: Path) -> dict[str, dict[str, float | None]]:
    (results_file,) = sorted(out.rglob("results_*.json"))[-1:]
    results = json.loads(results_file.read_text())["results"]
    table = {}
    for task, values in results.items():
        filters = sorted({key.split(",", 1)[1] for key in values if "," in key})
        for name in filters:
            label = task if name == "none" else f"{task} ({name})"
            correct = values.get(f"acc,{name}", values.get(f"exact_match,{name}"))
            table[label] = {col: values.get(f"{col},{name}") for col in COLUMNS} | {"acc": correct}
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, help="folder with gsm8k/ and proofwriter/ (probes_data_dir)")
    parser.add_argument("--gsm8k_limit", type=int, default=60)
    parser.add_argument("--proofwriter_limit", type=int, default=300)
    parser.add_argument("--skip_gsm8k_detect", action="store_true", help="skip the (slow, generative) GSM8K detector")
    parser.add_argument("--pretrained")
    parser.add_argument("--gguf_file")
    parser.add_argument("--batch_size", default="8")
    parser.add_argument("--output_path", default="results/calibration")
    args = parser.parse_args(argv)
    outs = [
        run(["probes_gsm8k", "probes_gsm8k_noise_swap"], args.gsm8k_limit, args),
        run(["probes_proofwriter", "probes_proofwriter_detect"], args.proofwriter_limit, args),
    ]
    if not args.skip_gsm8k_detect:
        outs.append(run(["probes_gsm8k_detect"], 2 * args.gsm8k_limit, args))
    table = {label: row for out in outs for label, row in rows(out).items()}
    print("| task | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for label, row in table.items():
        cells = ["" if row[c] is None else f"{row[c]:.3f}" for c in COLUMNS]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
