#!/usr/bin/env bash
# Pending (written in session 13, not yet run): why cosine-sim gains nothing from the warp-specialised
# forward at D = 128 while softmax gains ~20% (kernels/NOTES.md, version 8, "a static look").
# On the GPU machine, from the repository root, with the bundle of `cargo xtask gpu-bundle` carried:
#   bash attn-cuda/kernels/results/2026-11-23-h100-s13-pending-ncu-ws.sh
# ncu of attn_{softmax,cosine_sim}_fwd_ws_bf16_d128 at N = 16384, non-causal and causal (gpu_bench's
# grid), one launch each: duration, tensor pipe busy, instructions, and the consumers' stall reasons.
set -u
mkdir -p /tmp/b && rm -rf /tmp/b/gpu-bundle && tar -xJf target/gpu-bundle.tar.xz -C /tmp/b
B=/tmp/b/gpu-bundle/bin
OUT=${OUT:-/tmp/ncu-ws}; mkdir -p "$OUT"
# Metric names as in results/2026-11-23-h100-s8c-ncu-order1-stalls.txt, plus the tensor path's ops
# (busy fraction = ops / (cycles × the SM's bf16 dense rate)).
M=gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__ops_path_tensor_src_bf16_dst_fp32.sum,sm__inst_executed.sum,\
smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,\
smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,\
smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,\
smsp__average_warp_latency_issue_stalled_membar.ratio
timeout 300 ncu --metrics "$M" --kernel-name regex:"fwd_ws_bf16_d128" --launch-skip 2 --launch-count 8 \
  "$B/gpu_bench" --bench --families 0,1 --dims 128 --ns 16384 --no-long > "$OUT/ncu_ws.txt" 2>&1
echo "ncu rc=$?"
grep -E "attn_.*fwd_ws|duration|cycles_elapsed|ops_path|inst_executed|stalled" "$OUT/ncu_ws.txt" | head -80
