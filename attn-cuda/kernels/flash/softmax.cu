// Softmax attention (docs/math.md §1) on tensor cores: forward, dQ and dK/dV kernels for
// f16 and bf16 at head dims 32, 64, 96, 128, 256. Names: attn_softmax_{fwd,bwd_dq,bwd_dkdv}_{dt}_d{D}; the
// Hopper forward and backward (wgmma, sm_90a only) at head dims 64 and 128: attn_softmax_fwd_wg_{dt}_d{D},
// attn_softmax_bwd_{dq,dkdv}_wg_{dt}_d{D}.
#include "flash_bwd.cuh"
#include "flash_bwd_wg.cuh"
#include "flash_bwd_ws.cuh"
#include "flash_fwd.cuh"
#include "flash_fwd_wg.cuh"
#include "flash_fwd_ws.cuh"

#define ATTN_SOFTMAX(DT, T, D)                                                                                     \
    extern "C" __global__ void __launch_bounds__(attn::kThreads)                                                   \
        attn_softmax_fwd_##DT##_d##D(const __grid_constant__ AttnParams p) {                                        \
        attn::flash_fwd<T, D, attn::SoftmaxScore>(p);                                                              \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(attn::kThreads)                                                   \
        attn_softmax_bwd_dq_##DT##_d##D(const __grid_constant__ AttnParams p) {                                     \
        attn::flash_bwd_dq<T, D, attn::SoftmaxScore>(p);                                                           \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(attn::kThreads)                                                   \
        attn_softmax_bwd_dkdv_##DT##_d##D(const __grid_constant__ AttnParams p) {                                   \
        attn::flash_bwd_dkdv<T, D, attn::SoftmaxScore>(p);                                                         \
    }

#define ATTN_SOFTMAX_DTYPES(D)          \
    ATTN_SOFTMAX(f16, __half, D)        \
    ATTN_SOFTMAX(bf16, __nv_bfloat16, D)

ATTN_SOFTMAX_DTYPES(32)
ATTN_SOFTMAX_DTYPES(64)
ATTN_SOFTMAX_DTYPES(96)
ATTN_SOFTMAX_DTYPES(128)
ATTN_SOFTMAX_DTYPES(256)

ATTN_FLASH_FWD_WG_ALL(attn_softmax, attn::SoftmaxScore)

// The Hopper backward (wgmma, sm_90a only): attn_softmax_bwd_{dq,dkdv}_wg_{dt}_d{64,128} (deterministic), and
// attn_softmax_bwd_fused_wg_{dt}_d128 (dK, dV and dQ by f32 reductions in one kernel).
ATTN_FLASH_BWD_WG_ALL(attn_softmax, attn::SoftmaxScore)
ATTN_FLASH_BWD_FUSED_WG_ALL(attn_softmax, attn::SoftmaxScore)

// The warp-specialised Hopper forward (sm_90a only): attn_softmax_fwd_ws_{dt}_d{64,128}.
ATTN_FLASH_FWD_WS_ALL(attn_softmax, attn::SoftmaxScore)

// The warp-specialised Hopper backward (sm_90a only): attn_softmax_bwd_{dq,dkdv}_ws_{dt}_d{64,128}.
ATTN_FLASH_BWD_WS_ALL(attn_softmax, attn::SoftmaxScore)
ATTN_FLASH_BWD_DQ_WS_ALL(attn_softmax, attn::SoftmaxScore)
// The warp-specialised fused backward (sm_90a only): attn_softmax_bwd_fused_ws_{dt}_d{64,128}.
ATTN_FLASH_BWD_FUSED_WS_ALL(attn_softmax, attn::SoftmaxScore)
