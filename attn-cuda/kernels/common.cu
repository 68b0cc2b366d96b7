// Row kernels shared by every family's backward, for f32, f16 and bf16 storage. One warp per row.
//   attn_bwd_delta_{dt}:       δ_i = dO_i · o_i (f32, statistics layout)
//   attn_inv_norm_{q,k}_{dt}:  r = 1 / max(‖x‖, eps) per row (f32, indexed by dq/dk offset / D)
//   attn_l2norm_bwd_{q,k}_{dt}: dx = (dx̂ − x̂ (x̂·dx̂)) / ‖x‖ where ‖x‖ > eps, else dx̂ / eps
//                              (x̂ = x / max(‖x‖, eps)); reads dx̂ from the f32 scratch
//   attn_dbias_reduce_{dt}:    dbias[bb, bh, i, j] = Σ over broadcast dims of dS[b, h, i, j]
//   attn_dq_store_{dt}:        dq = dq_acc rounded to the storage type (the fused Hopper backward
//                              reduces dQ into the f32 scratch)
#include "include/mask.h"
#include "include/mma.h"
#include "include/simt_f32.cuh"

namespace attn {

template <typename T>
__device__ __forceinline__ float row_sum_sq(const T* x, int D, int lane) {
    float s = 0.f;
    for (int d = lane; d < D; d += 32) {
        const float v = to_f32(x[d]);
        s += v * v;
    }
    return warp_sum(s);
}

template <typename T>
__device__ __forceinline__ void bwd_delta(const AttnParams& p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kSimtRows + warp;
    const SeqInfo si(p, b);
    if (i >= si.len_q) return;
    const long long off = si.o_off(p, i, h);
    const T* o = static_cast<const T*>(p.o) + off;
    const T* g = static_cast<const T*>(p.d_o) + off;
    float s = 0.f;
    for (int d = lane; d < p.head_dim; d += 32) s += to_f32(o[d]) * to_f32(g[d]);
    s = warp_sum(s);
    if (lane == 0) p.delta[si.stats_index(p, h, i)] = s;
}

// Rows of q (kQuery) or k: reciprocal norms into p.rq / p.rk.
template <typename T, bool kQuery>
__device__ __forceinline__ void inv_norm_rows(const AttnParams& p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, h = blockIdx.y, n = blockIdx.x * kSimtRows + warp;
    const SeqInfo si(p, b);
    if (n >= (kQuery ? si.len_q : si.key_rows(p))) return;
    const T* x = static_cast<const T*>(kQuery ? p.q : p.k) + (kQuery ? si.q_off(p, n, h) : si.k_off(p, n, h));
    const float r = 1.f / fmaxf(sqrtf(row_sum_sq(x, p.head_dim, lane)), p.eps);
    if (lane == 0) {
        if (kQuery)
            p.rq[si.dq_off(p, n, h) / p.head_dim] = r;
        else
            p.rk[si.dk_off(p, n, h) / p.head_dim] = r;
    }
}

template <typename T, bool kQuery>
__device__ __forceinline__ void l2norm_bwd_rows(const AttnParams& p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, h = blockIdx.y, n = blockIdx.x * kSimtRows + warp;
    const SeqInfo si(p, b);
    if (n >= (kQuery ? si.len_q : si.key_rows(p))) return;
    const int D = p.head_dim;
    const T* x = static_cast<const T*>(kQuery ? p.q : p.k) + (kQuery ? si.q_off(p, n, h) : si.k_off(p, n, h));
    const long long off = kQuery ? si.dq_off(p, n, h) : si.dk_off(p, n, h);
    const float* dxh = (kQuery ? p.dq_acc : p.dk_acc) + off;
    T* dx = static_cast<T*>(kQuery ? p.dq : p.dk) + off;
    const float norm = sqrtf(row_sum_sq(x, D, lane));
    if (norm > p.eps) {
        float dot = 0.f;
        for (int d = lane; d < D; d += 32) dot += to_f32(x[d]) * dxh[d];
        const float inv = 1.f / norm;
        const float xd = warp_sum(dot) * inv;  // x̂ · dx̂
        for (int d = lane; d < D; d += 32) dx[d] = from_f32<T>((dxh[d] - to_f32(x[d]) * inv * xd) * inv);
    } else {
        for (int d = lane; d < D; d += 32) dx[d] = from_f32<T>(dxh[d] / p.eps);
    }
}

template <typename T>
__device__ __forceinline__ void dbias_reduce(const AttnParams& p) {
    const long long nq = p.seq_q, nk = p.seq_k;
    const long long total = (long long)p.bias_batch * p.bias_heads * nq * nk;
    T* dbias = static_cast<T*>(p.dbias);
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long ij = idx % (nq * nk);
        const long long bh = idx / (nq * nk);
        const int bb = (int)(bh / p.bias_heads), hh = (int)(bh % p.bias_heads);
        const int b_lo = p.bias_batch == 1 ? 0 : bb, b_hi = p.bias_batch == 1 ? p.batch : bb + 1;
        const int h_lo = p.bias_heads == 1 ? 0 : hh, h_hi = p.bias_heads == 1 ? p.heads_q : hh + 1;
        float s = 0.f;
        for (int b = b_lo; b < b_hi; ++b)
            for (int h = h_lo; h < h_hi; ++h) s += p.ds[((long long)b * p.heads_q + h) * nq * nk + ij];
        dbias[idx] = from_f32<T>(s);
    }
}

}  // namespace attn

#define ATTN_COMMON(DT, T)                                                                                          \
    extern "C" __global__ void __launch_bounds__(128) attn_bwd_delta_##DT(const __grid_constant__ AttnParams p) {   \
        attn::bwd_delta<T>(p);                                                                                     \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) attn_inv_norm_q_##DT(const __grid_constant__ AttnParams p) {  \
        attn::inv_norm_rows<T, true>(p);                                                                           \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) attn_inv_norm_k_##DT(const __grid_constant__ AttnParams p) {  \
        attn::inv_norm_rows<T, false>(p);                                                                          \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                                              \
        attn_l2norm_bwd_q_##DT(const __grid_constant__ AttnParams p) {                                              \
        attn::l2norm_bwd_rows<T, true>(p);                                                                         \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                                              \
        attn_l2norm_bwd_k_##DT(const __grid_constant__ AttnParams p) {                                              \
        attn::l2norm_bwd_rows<T, false>(p);                                                                        \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        attn_dbias_reduce_##DT(const __grid_constant__ AttnParams p) {                                              \
        attn::dbias_reduce<T>(p);                                                                                  \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) attn_dq_store_##DT(const __grid_constant__ AttnParams p) {    \
        attn::dq_acc_store_rows<T, false>(p);                                                                               \
    }

ATTN_COMMON(f32, float)
ATTN_COMMON(f16, __half)
ATTN_COMMON(bf16, __nv_bfloat16)
