// Cosine-similarity attention (docs/math.md §2) on tensor cores: forward, dQ and dK/dV kernels for
// f16 and bf16 at head dims 16, 32, 64, 96, 128, 256. The l2-norms of q and k are fused into the
// tiles: the mma.sync kernels scale the raw products by the reciprocal norms; the Hopper kernels read
// the normalised rows k̂ (forward) and q̂, k̂ (backward) that the row kernels of common.cu write
// (backend.rs). The l2-norm's Jacobian is applied by the row kernels of common.cu. Names: attn_cosine_sim_{fwd,bwd_dq,bwd_dkdv}_{dt}_d{D}; the Hopper forward
// and backward (wgmma, sm_90a only) at head dims 64 and 128: attn_cosine_sim_{fwd,bwd_dq,bwd_dkdv}_wg_{dt}_d{D}.
#include "flash_bwd.cuh"
#include "flash_bwd_wg.cuh"
#include "flash_bwd_ws.cuh"
#include "flash_fwd.cuh"
#include "flash_fwd_wg.cuh"
#include "flash_fwd_ws.cuh"

#define ATTN_COSINE(DT, T, D)                                                                                      \
    extern "C" __global__ void __launch_bounds__(attn::kThreads)                                                   \
        attn_cosine_sim_fwd_##DT##_d##D(const __grid_constant__ AttnParams p) {                                     \
        attn::flash_fwd<T, D, attn::CosineScore>(p);                                                               \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(attn::kThreads)                                                   \
        attn_cosine_sim_bwd_dq_##DT##_d##D(const __grid_constant__ AttnParams p) {                                  \
        attn::flash_bwd_dq<T, D, attn::CosineScore>(p);                                                            \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(attn::kThreads)                                                   \
        attn_cosine_sim_bwd_dkdv_##DT##_d##D(const __grid_constant__ AttnParams p) {                                \
        attn::flash_bwd_dkdv<T, D, attn::CosineScore>(p);                                                          \
    }

#define ATTN_COSINE_DTYPES(D)          \
    ATTN_COSINE(f16, __half, D)        \
    ATTN_COSINE(bf16, __nv_bfloat16, D)

ATTN_COSINE_DTYPES(16)
ATTN_COSINE_DTYPES(32)
ATTN_COSINE_DTYPES(64)
ATTN_COSINE_DTYPES(96)
ATTN_COSINE_DTYPES(128)
ATTN_COSINE_DTYPES(256)

ATTN_FLASH_FWD_WG_ALL(attn_cosine_sim, attn::CosineScore)

// The Hopper backward (wgmma, sm_90a only): attn_cosine_sim_bwd_{dq,dkdv}_wg_{dt}_d{64,128} (deterministic), and
// attn_cosine_sim_bwd_fused_wg_{dt}_d128 (dK, dV and dQ by f32 reductions in one kernel).
ATTN_FLASH_BWD_WG_ALL(attn_cosine_sim, attn::CosineScore)
ATTN_FLASH_BWD_FUSED_WG_ALL(attn_cosine_sim, attn::CosineScore)

// The warp-specialised Hopper forward (sm_90a only): attn_cosine_sim_fwd_ws_{dt}_d{64,128}.
ATTN_FLASH_FWD_WS_ALL(attn_cosine_sim, attn::CosineScore)

// The warp-specialised Hopper backward (sm_90a only): attn_cosine_sim_bwd_{dq,dkdv}_ws_{dt}_d{64,128}.
ATTN_FLASH_BWD_WS_ALL(attn_cosine_sim, attn::CosineScore)
ATTN_FLASH_BWD_DQ_WS_ALL(attn_cosine_sim, attn::CosineScore)
// The warp-specialised fused backward (sm_90a only): attn_cosine_sim_bwd_fused_ws_{dt}_d{64,128}.
ATTN_FLASH_BWD_FUSED_WS_ALL(attn_cosine_sim, attn::CosineScore)
