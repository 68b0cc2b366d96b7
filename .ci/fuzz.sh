#!/usr/bin/env bash
# Fuzz the two parsers of user input for a while each (the cargo-fuzz targets in fuzz/):
# - validate: attn-core's AttnProblem::validate on arbitrary shapes, strides, lengths, windows and
#   family parameters (a typed error or a spec whose buffers fit, never a panic);
# - check_safetensors: `attn-bench check`'s parser on arbitrary bytes in memory
#   (`attn_bench::check::parse`: the size limit, safetensors parsing, shape extraction, validation),
#   and `check_bytes` on the CPU reference for whatever validates and is small.
# Any crash, panic, overflow or failed assertion fails the script; libFuzzer saves the input under
# fuzz/artifacts/<target>/ and prints the command that replays it. New inputs go to a scratch
# folder; fuzz/corpus/<target>/ (the committed seeds) is only read.
#
# Usage: .ci/fuzz.sh [seconds per target, default 60]
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-60}"
start=$SECONDS

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz (crates.io)"
  cargo install cargo-fuzz --locked
fi

# cargo-fuzz passes rustc flags that only nightly accepts (-Z sanitizer=address and friends). Use
# the nightly toolchain where rustup has one; otherwise the default toolchain with RUSTC_BOOTSTRAP=1,
# which unlocks the same flags (its rust-std ships the AddressSanitizer runtime too).
toolchain=()
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  toolchain=(+nightly)
  echo "== fuzz toolchain: $(rustup run nightly rustc --version)"
else
  export RUSTC_BOOTSTRAP=1
  echo "== fuzz toolchain: $(rustc --version) with RUSTC_BOOTSTRAP=1 (no nightly toolchain installed)"
fi

# --dev: fuzz/Cargo.toml optimises the crates the targets run and leaves candle and the rest of
# attn-bench's tree unoptimised (a cold build in a quarter of `--release`'s time). Debug assertions
# and overflow checks are on in either profile.
echo "== cargo fuzz build --dev (debug assertions and overflow checks, AddressSanitizer)"
cargo "${toolchain[@]}" fuzz build --dev
echo "build: $((SECONDS - start)) s"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for target in validate check_safetensors; do
  echo "== cargo fuzz run $target (${secs} s)"
  mkdir -p "$scratch/$target"
  # The progress lines (one per new input) are dropped; the crash report and the stats are kept.
  if ! cargo "${toolchain[@]}" fuzz run --dev "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
    -max_total_time="$secs" -timeout=10 -print_final_stats=1 2>&1 |
    { grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)|^[[:space:]]+NEW_FUNC' || true; }; then
    echo "fuzz target $target failed (its input is under fuzz/artifacts/$target/)" >&2
    exit 1
  fi
done
echo "fuzzing done in $((SECONDS - start)) s"
