// f32 inputs, both families, any supported head dim (runtime D ≤ 256), on CUDA cores.
// Names: attn_{softmax,cosine_sim}_{fwd,bwd_dq,bwd_dkdv}_f32.
#include "simt_f32.cuh"

#define ATTN_SIMT(NAME, SCORE)                                                                                     \
    extern "C" __global__ void __launch_bounds__(128) attn_##NAME##_fwd_f32(const __grid_constant__ AttnParams p) { \
        attn::simt_fwd<SCORE>(p);                                                                                  \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                                              \
        attn_##NAME##_bwd_dq_f32(const __grid_constant__ AttnParams p) {                                            \
        attn::simt_bwd_dq<SCORE>(p);                                                                               \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                                              \
        attn_##NAME##_bwd_dkdv_f32(const __grid_constant__ AttnParams p) {                                          \
        attn::simt_bwd_dkdv<SCORE>(p);                                                                             \
    }

ATTN_SIMT(softmax, attn::SoftmaxScore)
ATTN_SIMT(cosine_sim, attn::CosineScore)
