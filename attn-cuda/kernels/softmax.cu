// Softmax attention (REFERENCE.md §1) on tensor cores: forward, dQ and dK/dV kernels for
// f16 and bf16 at head dims 32, 64, 96, 128, 256. Names: attn_softmax_{fwd,bwd_dq,bwd_dkdv}_{dt}_d{D}.
#include "include/flash_bwd.cuh"
#include "include/flash_fwd.cuh"

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
