#!/usr/bin/env bash
# attn-bench on the GPU machine, in one call: our kernels (attn-bench run, attn-cuda) and the PyTorch /
# fla baselines (run_baselines.py) on the same plan, the launch-overhead bench, then one merged table.
# Run from the repository root. The last thing printed is a short summary table.
#
#   bash attn-bench/python/run_on_gpu.sh [--preset h100|decode] [--sections flash,taylor,memory]
#        [--budget-s 540] [--merge earlier.json ...] [--no-launch-bench] [--families taylor1,...]
#        [--device cpu]
#
# --preset      h100 (the default: sections flash, taylor, memory) or decode (sections decode and
#               decode-paged: few queries against a KV cache, with the SDPA backends on the same
#               shapes and each row's share of the measured copy bandwidth; --device cpu runs
#               decode-smoke)
# --sections    sections of the h100 plan (default all three; split across two calls with e.g.
#               `--sections flash`, then `--sections taylor,memory --merge <first call's JSON>`)
# --budget-s    wall-clock budget of the whole call; ours gets about 40% of it (attn-bench
#               --max-seconds, one process per section, each an equal share of what is left), the
#               baselines what is left
#               (run_baselines.py --deadline-s); a point that does not fit is a skipped row with
#               that reason. All three sections take about two calls of 540 s: flash in one,
#               taylor and memory in the other
# --merge       earlier results (either side's JSON) folded into the merged table
# --families    only these families of the sections (attn-bench's --families: e.g. taylor1), for a
#               short call after a change to one family's kernels
# --device cpu  dry run on a machine without a GPU: the gpu-smoke preset (same sections at toy
#               sizes) with attn-cpu-ref beside attn-cuda (skipped, with the reason), the baselines
#               through the same code path on the CPU (skipped where PyTorch is missing)
#
# Inputs ($ATTN_BENCH_BUNDLE, default target/bench-bundle, made by attn-bench/python/make_bundle.sh):
#   attn-bench[.xz]   release binary built with `--features cuda` and the kernels (ATTN_REQUIRE_NVCC=1)
#   cuda_launch[.xz]  the criterion launch-overhead bench (optional)
#   wheels/*.whl    fla-core (pure python), unpacked into a folder appended to the baselines' sys.path
# $ATTN_BENCH_BIN overrides the binary (e.g. target/release/attn-bench for a dry run).
#
# Outputs in $OUT (at most 7 files): <stem>.json, <stem>.md, <stem>.png, <stem>-crossover.png,
# <stem>-memory.png (the merged table and its main plots), run.log (everything printed) and
# extras.tar.gz (both sides' JSON, the plan, every other plot, the baselines' and the launch bench's
# logs). <stem> is <date>-<gpu>-attn; the other plots can be redrawn from <stem>.json with
# `attn-bench run --impls none --merge <stem>.json`.
set -uo pipefail

SECTIONS=""
PLAN=h100
BUDGET_S=540
DEVICE=cuda
LAUNCH_BENCH=1
MERGE=()
FAMILIES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sections) SECTIONS="$2"; shift 2 ;;
    --preset) PLAN="$2"; shift 2 ;;
    --budget-s) BUDGET_S="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --no-launch-bench) LAUNCH_BENCH=0; shift ;;
    --families) FAMILIES=(--families "$2"); shift 2 ;;
    --merge) shift; while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do MERGE+=("$1"); shift; done ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "run_on_gpu.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

HERE="$(cd "$(dirname "$0")" && pwd)"
BUNDLE="${ATTN_BENCH_BUNDLE:-target/bench-bundle}"
OUT="${OUT:-target/gpu-bench-out}"
WORK="$(mktemp -d)"
# A bundle executable as is, or unpacked from its .xz (what make_bundle.sh writes, to fit the carry limit).
unpack() {
  if [ -x "$BUNDLE/$1" ]; then echo "$BUNDLE/$1"
  elif [ -f "$BUNDLE/$1.xz" ] && xz -dc "$BUNDLE/$1.xz" > "$WORK/$1" && chmod +x "$WORK/$1"; then echo "$WORK/$1"
  fi
}
BIN="${ATTN_BENCH_BIN:-$(unpack attn-bench)}"
LAUNCH="$(unpack cuda_launch)"
mkdir -p "$OUT"
LOG="$OUT/run.log"
: > "$LOG"
T0=$SECONDS
say() { echo "$@" | tee -a "$LOG"; }
left() { echo $(( BUDGET_S - (SECONDS - T0) )); }

if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
  say "run_on_gpu.sh: no attn-bench binary at $BIN (build the bundle with attn-bench/python/make_bundle.sh)"
  exit 1
fi

case "$PLAN" in
  h100) [ -n "$SECTIONS" ] || SECTIONS="flash,taylor,memory"; SMOKE=gpu-smoke ;;
  decode) [ -n "$SECTIONS" ] || SECTIONS="decode,decode-paged"; SMOKE=decode-smoke ;;
  *) say "run_on_gpu.sh: unknown --preset $PLAN (h100 or decode)"; exit 2 ;;
esac
if [ "$DEVICE" = cpu ]; then
  PRESET=$SMOKE; IMPLS=attn-cpu-ref,attn-cuda; RUNS=3; WARMUP=2
else
  PRESET=$PLAN; IMPLS=attn-cuda; RUNS=30; WARMUP=3
fi

{
  echo "== machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null \
    || echo "torch not importable: the baselines will be skipped rows"
  "$BIN" info
} 2>&1 | tee -a "$LOG"
ATTN_COMMIT="$("$BIN" info | sed -n 's/^commit: //p')"
export ATTN_COMMIT PYTHONUNBUFFERED=1

say "== plan: preset $PRESET, sections $SECTIONS"
"$BIN" plan --preset "$PRESET" --sections "$SECTIONS" "${FAMILIES[@]}" --out "$WORK/plan.json" 2>&1 | tee -a "$LOG"

# One process per section: a kernel fault poisons its CUDA context, and only that section's later
# points are lost (each is then a skipped row with the driver's error).
# Each section gets an equal share of what is left of ours' budget (time a section does not use passes
# to the next), so a long first section cannot starve the next one.
OURS_END=$(( SECONDS + $(left) * 2 / 5 ))
OURS_FILES=()
read -r -a SECTION_LIST <<< "${SECTIONS//,/ }"
SECTIONS_LEFT=${#SECTION_LIST[@]}
for SECTION in "${SECTION_LIST[@]}"; do
  SEC_S=$(( (OURS_END - SECONDS) / SECTIONS_LEFT ))
  SECTIONS_LEFT=$(( SECTIONS_LEFT - 1 ))
  [ "$SEC_S" -lt 1 ] && SEC_S=1
  say "== ours, section $SECTION: attn-bench run ($IMPLS, budget ${SEC_S} s)"
  "$BIN" run --preset "$PRESET" --sections "$SECTION" "${FAMILIES[@]}" --impls "$IMPLS" --runs "$RUNS" --warmup "$WARMUP" \
    --max-seconds "$SEC_S" --out "$WORK" --name "ours-$SECTION" --no-plots --summary 2>&1 | tee -a "$LOG"
  OURS_FILES+=("$WORK/ours-$SECTION.json")
done

if [ "$LAUNCH_BENCH" = 1 ] && [ -n "$LAUNCH" ]; then
  say "== launch overhead (criterion, B=1 H=1 D=64 N=64/128)"
  CRITERION_HOME="$WORK/criterion" timeout 120 "$LAUNCH" --bench --noplot 2>&1 \
    | tee "$WORK/cuda_launch.log" | grep -E "^attn-cuda|time:|skipped" | tee -a "$LOG"
fi

SITE="$WORK/site"
mkdir -p "$SITE"
for whl in "$BUNDLE"/wheels/*.whl; do
  [ -e "$whl" ] || continue
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$whl" 2>>"$LOG" \
    || python3 -m zipfile -e "$whl" "$SITE"
done
python3 -c "import sys; sys.path.append('$SITE'); import fla; print('fla', fla.__version__)" 2>&1 | tail -n 1 | tee -a "$LOG"

BASE_S=$(( $(left) - 40 ))
[ "$BASE_S" -lt 30 ] && BASE_S=30
say "== baselines: run_baselines.py (deadline ${BASE_S} s)"
python3 "$HERE/run_baselines.py" --points "$WORK/plan.json" --device "$DEVICE" --runs "$RUNS" \
  --warmup "$WARMUP" --deadline-s "$BASE_S" --pythonpath "$SITE" --check-bin "$BIN" --out "$WORK/baselines.json" \
  > "$WORK/baselines.log" 2>&1
grep -E "^check " "$WORK/baselines.log" | tee -a "$LOG"
tail -n 3 "$WORK/baselines.log" | tee -a "$LOG"

say "== merge"
PARTS=()
for f in "${OURS_FILES[@]}" "$WORK/baselines.json" "${MERGE[@]}"; do
  if [ -s "$f" ]; then PARTS+=("$f"); else say "missing result file $f: left out of the merge"; fi
done
if [ ${#PARTS[@]} -eq 0 ]; then
  say "run_on_gpu.sh: nothing to merge"
  exit 1
fi
"$BIN" run --impls none --merge "${PARTS[@]}" --out "$WORK" --name merged --summary \
  > "$WORK/merge.log" 2>&1
STATUS=$?
[ $STATUS -ne 0 ] && tail -n 5 "$WORK/merge.log" | tee -a "$LOG"
STEM="$(python3 - "$WORK/merged.json" <<'EOF'
import json, re, sys
f = json.load(open(sys.argv[1]))
print("%s-%s-attn" % (f["date"], re.sub(r"[^a-z0-9]+", "-", f["device"].lower()).strip("-")))
EOF
)"
for f in "$WORK"/merged*; do mv "$f" "$WORK/$STEM${f#"$WORK/merged"}"; done
for f in "$STEM.json" "$STEM.md" "$STEM.png" "$STEM-crossover.png" "$STEM-memory.png"; do
  [ -e "$WORK/$f" ] && cp "$WORK/$f" "$OUT/"
done
tar -C "$WORK" -czf "$OUT/extras.tar.gz" --exclude site --exclude "$STEM.json" --exclude "$STEM.md" . 2>>"$LOG"
say "== done in $(( SECONDS - T0 )) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
# Last: the short table.
sed -n '/^summary:/,$p' "$WORK/merge.log" | tee -a "$LOG"
rm -rf "$WORK"
exit $STATUS
