#!/usr/bin/env bash
# Pending run (written in session 11, not yet run: no GPU was lent after run A). Run from the
# repository root on the H100 with the test bundle (cargo xtask gpu-bundle) at target/gpu-bundle.tar.xz.
# the warp-specialised forward at D = 128 after the K-release fix (the stage's key
# scalars are read by the scores, so K_j is released after them): the flash suites with it, with
# the wgmma forward and with the mma.sync kernels; sanitizers at D = 128 (and racecheck at D = 64: its
# three-consumer tile is new, never run); stopwatch ws vs wg at D = 64 and 128.
set -u
mkdir -p /tmp/b && rm -rf /tmp/b/gpu-bundle && tar -xJf target/gpu-bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu-bundle/bin
md5sum target/gpu-bundle.tar.xz
for env in "ATTN_CUDA_WG_WS=1" "X=1" "ATTN_CUDA_WGMMA=0"; do
  for t in gpu_softmax_like gpu_hyperbolic gpu_runtime; do
    env $env timeout 300 $B/$t --ignored --test-threads=1 > $OUT/${t}_${env%%=*}.log 2>&1; echo "$env $t rc=$?"
    grep -E "test result|panicked|differ|failed:" $OUT/${t}_${env%%=*}.log | head -8
  done
done
for t in gpu_softmax_like gpu_hyperbolic; do
  for tool in memcheck racecheck synccheck; do
    ATTN_CUDA_WG_WS=1 ATTN_TEST_DIMS=128 ATTN_TEST_DTYPES=bf16 timeout 200 compute-sanitizer --tool $tool --error-exitcode 99 \
      $B/$t --ignored --test-threads=1 > $OUT/san_${t}_$tool.log 2>&1
    echo "$t $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $OUT/san_${t}_$tool.log | tr '\n' ' ')"
  done
done
for dd in "128 f16" "64 bf16"; do
  set -- $dd
  ATTN_CUDA_WG_WS=1 ATTN_TEST_DIMS=$1 ATTN_TEST_DTYPES=$2 timeout 200 compute-sanitizer --tool racecheck --error-exitcode 99 \
    $B/gpu_softmax_like --ignored --test-threads=1 > $OUT/san_sl_d$1_$2_racecheck.log 2>&1
  echo "gpu_softmax_like D=$1 $2 racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|test result' $OUT/san_sl_d$1_$2_racecheck.log | tr '\n' ' ')"
done
for env in "X=1" "ATTN_CUDA_WG_WS=1"; do
  echo "== $env"; env $env timeout 200 $B/gpu_bench --bench --no-long | grep -v family
done > $OUT/ab.log 2>&1
python3 - "$OUT/ab.log" <<'PY'
import sys
rows, cfg = {}, None
for line in open(sys.argv[1]):
    if line.startswith("=="):
        cfg = line.split()[1]; continue
    f = line.split()
    if len(f) == 8 and f[4] in ("fwd", "fwd_bwd"):
        rows.setdefault(tuple(f[:5]), {})[cfg] = (float(f[5]), float(f[6]), f[7])
print(f"{'family':<22} {'D':>4} {'N':>6} {'causal':>6} {'pass':>8} {'ws ms':>8} {'TF':>6} {'/sm':>5} {'wg ms':>8} {'TF':>6} {'/sm':>5} ws/wg")
for k, v in rows.items():
    a, b = v.get("ATTN_CUDA_WG_WS=1"), v.get("X=1")
    if a and b:
        print(f"{k[0]:<22} {k[1]:>4} {k[2]:>6} {k[3]:>6} {k[4]:>8} {a[0]:8.3f} {a[1]:6.1f} {a[2]:>5} {b[0]:8.3f} {b[1]:6.1f} {b[2]:>5} {a[1]/b[1]:5.2f}")
PY
