// Taylor linear attention of order 2 on the flash skeleton (docs/math.md §3, the quadratic form: the
// weights f(s) = a0 + a1 s + a2 s² of every pair, normalised by their row sum, no running max): where
// the sequences are short enough that the N² products on tensor cores cost less than the factorised
// states (attn_cuda::taylor::heuristics::dense_on_flash). The Hopper kernels only (sm_90a), f16 and
// bf16 at head dims 64 and 128: the wgmma and warp-specialised forwards and the warp-specialised dQ and
// dK/dV kernels (deterministic, as the state kernels: no fused backward). The forward saves the denominators (the Taylor
// statistic, which the factorised kernels save too); q̂, k̂ under qk_l2norm come from cosine-sim's row
// kernels (common.cu), and so does the l2-norm's Jacobian.
// Names: attn_taylor2_{fwd_wg,fwd_ws,bwd_dq_ws,bwd_dkdv_ws}_{dt}_d{64,128}.
#include "../flash/flash_bwd.cuh"
#include "../flash/flash_bwd_ws.cuh"
#include "../flash/flash_fwd.cuh"
#include "../flash/flash_fwd_wg.cuh"
#include "../flash/flash_fwd_ws.cuh"

ATTN_FLASH_FWD_WG_ALL(attn_taylor2, attn::TaylorScore)

ATTN_FLASH_FWD_WS_ALL(attn_taylor2, attn::TaylorScore)
ATTN_FLASH_BWD_WS_ALL(attn_taylor2, attn::TaylorScore)
ATTN_FLASH_BWD_DQ_WS_ALL(attn_taylor2, attn::TaylorScore)
