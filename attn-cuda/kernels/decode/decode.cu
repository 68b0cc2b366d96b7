// The decode kernels (decode_fwd.cuh, decode_simt.cuh): split-KV forward for f16/bf16 (tensor cores)
// and f32 (CUDA cores) at the head dims below, the
// combine of its partial outputs, the KV-cache append and the total key lengths of a cache step.
#include "decode_fwd.cuh"
#include "decode_simt.cuh"

using namespace attn_decode;

#define DECODE_FWD(NAME, T, D)                                                                    \
    extern "C" __global__ void __launch_bounds__(kThreads, Cfg<D>::kMinBlocks) NAME(                    \
        const __grid_constant__ DecodeParams p) {                                                       \
        decode_fwd<T, D>(p);                                                                      \
    }

#define DECODE_FWD_F32(NAME, D)                                                                   \
    extern "C" __global__ void __launch_bounds__(kThreads) NAME(const __grid_constant__ DecodeParams p) { \
        decode_fwd_simt<D>(p);                                                                    \
    }

// The head dims of the flash kernels (16: cosine-sim only; routing checks the family's list).
DECODE_FWD(decode_fwd_f16_d16, __half, 16)
DECODE_FWD(decode_fwd_f16_d32, __half, 32)
DECODE_FWD(decode_fwd_f16_d64, __half, 64)
DECODE_FWD(decode_fwd_f16_d96, __half, 96)
DECODE_FWD(decode_fwd_f16_d128, __half, 128)
DECODE_FWD(decode_fwd_f16_d256, __half, 256)
DECODE_FWD(decode_fwd_bf16_d16, __nv_bfloat16, 16)
DECODE_FWD(decode_fwd_bf16_d32, __nv_bfloat16, 32)
DECODE_FWD(decode_fwd_bf16_d64, __nv_bfloat16, 64)
DECODE_FWD(decode_fwd_bf16_d96, __nv_bfloat16, 96)
DECODE_FWD(decode_fwd_bf16_d128, __nv_bfloat16, 128)
DECODE_FWD(decode_fwd_bf16_d256, __nv_bfloat16, 256)
DECODE_FWD_F32(decode_fwd_f32_d16, 16)
DECODE_FWD_F32(decode_fwd_f32_d32, 32)
DECODE_FWD_F32(decode_fwd_f32_d64, 64)
DECODE_FWD_F32(decode_fwd_f32_d96, 96)
DECODE_FWD_F32(decode_fwd_f32_d128, 128)
DECODE_FWD_F32(decode_fwd_f32_d256, 256)

extern "C" __global__ void decode_combine_f16(const __grid_constant__ DecodeParams p) { decode_combine<__half>(p); }
extern "C" __global__ void decode_combine_bf16(const __grid_constant__ DecodeParams p) {
    decode_combine<__nv_bfloat16>(p);
}
extern "C" __global__ void decode_combine_f32(const __grid_constant__ DecodeParams p) { decode_combine<float>(p); }

extern "C" __global__ void kv_append_b2(const __grid_constant__ DecodeParams p) { kv_append(p, 2); }
extern "C" __global__ void kv_append_b4(const __grid_constant__ DecodeParams p) { kv_append(p, 4); }

// total_lens[b] = key_lens[b] + key_len_add (the key lengths of a cache step for the flash kernels).
extern "C" __global__ void kv_total_lens(const __grid_constant__ DecodeParams p) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b < p.batch) p.total_lens[b] = p.key_lens[b] + p.key_len_add;
}
