#!/usr/bin/env bash
# Builds what run_on_gpu.sh needs on the GPU machine into target/bench-bundle/ (or $1):
#   attn-bench.xz   release binary, `--features cuda`, kernels compiled (ATTN_REQUIRE_NVCC=1), stripped,
#                   xz-compressed (~23 MB of ~29; the carried tree is limited to 64 MiB in all)
#   cuda_launch.xz  the criterion launch-overhead bench (benches/cuda_launch.rs), likewise
#   wheels/       fla-core 0.6.0 (pure python; its dependencies einops and packaging are on the GPU
#                 image already), from target/wheels/, downloaded there with pip unless present
# nvcc must be on PATH first: eval "$(cargo xtask setup-cuda)". Honours CARGO_TARGET_DIR.
# Then, on the GPU machine, with the bundle carried: bash attn-bench/python/run_on_gpu.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUNDLE="${1:-$ROOT/target/bench-bundle}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
export ATTN_REQUIRE_NVCC=1
cd "$ROOT"
cargo build --release -p attn-bench --features cuda --bin attn-bench
LAUNCH="$(cargo bench -p attn-bench --features cuda --bench cuda_launch --no-run --message-format=json \
  | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cuda_launch" and m.get("executable"):
        print(m["executable"])')"
mkdir -p "$BUNDLE/wheels"
cp "$TARGET/release/attn-bench" "$BUNDLE/attn-bench"
cp "$LAUNCH" "$BUNDLE/cuda_launch"
strip "$BUNDLE/attn-bench" "$BUNDLE/cuda_launch"
"$BUNDLE/attn-bench" info
xz -T2 -6 -f "$BUNDLE/attn-bench" "$BUNDLE/cuda_launch"
if ! ls "$ROOT"/target/wheels/fla_core-0.6.0-*.whl > /dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: fla-core==0.6.0 -d "$ROOT/target/wheels"
fi
cp "$ROOT"/target/wheels/fla_core-0.6.0-*.whl "$BUNDLE/wheels/"
du -sh "$BUNDLE"/* | sed "s|$ROOT/||"
echo "bundle: $BUNDLE (carry it; on the GPU machine: bash attn-bench/python/run_on_gpu.sh)"
