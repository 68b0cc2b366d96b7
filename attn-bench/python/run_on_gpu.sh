#!/usr/bin/env bash
# PyTorch baselines for the whole default grid on the GPU machine, in one call (~7 minutes).
# Run from the repository root; writes $OUT/baselines.json (rows + skipped, schema 1) and
# $OUT/baselines.log. Extra arguments go to run_baselines.py (e.g. --deadline-s 300).
# Back on a development machine, merge the rows into a table and plots:
#   cargo run --release -p attn-bench -- run --impls none --merge baselines.json
set -euo pipefail
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
python3 -c 'import fla; print("fla", fla.__version__)' 2>/dev/null || echo "fla not installed: fla_parallel_based will be skipped"
python3 "$(dirname "$0")/run_baselines.py" --out "$OUT/baselines.json" "$@" 2>&1 | tee "$OUT/baselines.log"
