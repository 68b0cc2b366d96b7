// Row kernels shared by every family's backward, for f32, f16 and bf16 storage; rows as
// simt_f32.cuh's with_lane_row lays them out (a group of lanes per 16-bit row, else a warp).
//   attn_bwd_delta_{dt}:       δ_i = dO_i · o_i (f32, statistics layout), and after the stats_len
//                              values of δ the LSE in log2 units (the warp-specialised dK/dV kernel's;
//                              1/den for Taylor on the flash skeleton)
//   attn_inv_norm_{q,k}_{dt}:  r = 1 / max(‖x‖, eps) per row (f32, indexed by dq/dk offset / D)
//   attn_normalise_{q,k}_{f16,bf16}: r as above, and x̂ = x·r rounded to the storage type into p.dq / p.dk
//                              at the dq/dk offsets (the host points them at scratch): the rows the
//                              Hopper kernels of cosine-sim read (backend.rs)
//   attn_l2norm_bwd_{q,k}_{dt}: dx = (dx̂ − x̂ (x̂·dx̂)) / ‖x‖ where ‖x‖ > eps, else dx̂ / eps
//                              (x̂ = x / max(‖x‖, eps)); reads dx̂ from the f32 scratch
//   attn_dbias_reduce_{dt}:    dbias[bb, bh, i, j] = Σ over broadcast dims of dS[b, h, i, j]
//   attn_dq_store_{f16,bf16}:  dq = dq_acc rounded to the storage type (the fused Hopper backward
//                              reduces dQ into the f32 scratch)
#include "mask.h"
#include "mma.h"
#include "online_softmax.h"
#include "simt_f32.cuh"

namespace attn {

template <typename T>
__device__ __forceinline__ void bwd_delta(const AttnParams& p) {
    const int b = blockIdx.z, h = blockIdx.y;
    const SeqInfo si(p, b);
    with_lane_row<T>(p.head_dim, [&](auto lr, int i) {
        if (i >= si.len_q) return;
        constexpr int E = decltype(lr)::kE;
        const long long off = si.o_off(p, i, h);
        float o[E], g[E];
        lr.load(static_cast<const T*>(p.o) + off, o);
        lr.load(static_cast<const T*>(p.d_o) + off, g);
        const float s = lr.dot(o, g);
        if (lr.lane == 0) {
            const long long at = si.stats_index(p, h, i);
            p.delta[at] = s;
            // The LSE in log2 units less the hyperbolic scores' constant (0 for the others; +∞ for a
            // row with no key: P = 0), after δ (the host allocates both halves): what the
            // warp-specialised dK/dV kernel's producer copies with cp.async, the same value the wgmma
            // kernel computes.
            // Taylor on the flash skeleton (p.poly): the statistic is den, and the kernels read 1/den.
            const float lse = p.lse[at];
            const float lse2 = lse == -CUDART_INF_F ? CUDART_INF_F : lse * kLog2e - p.hyp_lse * kLog2e;
            // A NaN denominator stays NaN (`lse > 0` would make it 0 and give finite dv; docs/nan.md).
            p.delta[(long long)p.total_q * p.heads_q + at] = p.poly ? (!(lse <= 0.f) ? 1.f / lse : 0.f) : lse2;
        }
    });
}

// Rows of q (kQuery) or k: reciprocal norms into p.rq / p.rk; with kWrite also the normalised row
// x̂ = x·r, rounded to T, into p.dq / p.dk (scratch of the dq / dk layout).
template <typename T, bool kQuery, bool kWrite>
__device__ __forceinline__ void inv_norm_rows(const AttnParams& p) {
    const int b = blockIdx.z, h = blockIdx.y;
    const SeqInfo si(p, b);
    with_lane_row<T>(p.head_dim, [&](auto lr, int n) {
        if (n >= (kQuery ? si.len_q : si.key_rows(p))) return;
        constexpr int E = decltype(lr)::kE;
        const T* x = static_cast<const T*>(kQuery ? p.q : p.k) + (kQuery ? si.q_off(p, n, h) : si.k_off(p, n, h));
        const long long off = kQuery ? si.dq_off(p, n, h) : si.dk_off(p, n, h);
        float v[E];
        lr.load(x, v);
        const float norm = sqrtf(lr.dot(v, v));
        const float r = 1.f / (norm < p.eps ? p.eps : norm);  // a NaN norm stays NaN (fmaxf would return eps)
        if (lr.lane == 0) (kQuery ? p.rq : p.rk)[lr.rows(off)] = r;
        if (kWrite) {
#pragma unroll
            for (int i = 0; i < E; ++i) v[i] *= r;
            lr.store(static_cast<T*>(kQuery ? p.dq : p.dk) + off, v);
        }
    });
}

template <typename T, bool kQuery>
__device__ __forceinline__ void l2norm_bwd_rows(const AttnParams& p) {
    const int b = blockIdx.z, h = blockIdx.y;
    const SeqInfo si(p, b);
    with_lane_row<T>(p.head_dim, [&](auto lr, int n) {
        if (n >= (kQuery ? si.len_q : si.key_rows(p))) return;
        constexpr int E = decltype(lr)::kE;
        const T* x = static_cast<const T*>(kQuery ? p.q : p.k) + (kQuery ? si.q_off(p, n, h) : si.k_off(p, n, h));
        const long long off = kQuery ? si.dq_off(p, n, h) : si.dk_off(p, n, h);
        float xv[E], g[E];
        lr.load(x, xv);
        if (kQuery)  // dq̂ (the fused backward's tiled layout or the dq layout)
            load_dq_acc(lr, p, si, h, n, off, g);
        else
            lr.load(p.dk_acc + off, g);  // dk̂
        const float norm = sqrtf(lr.dot(xv, xv));
        if (norm > p.eps) {
            const float inv = 1.f / norm;
            const float xd = lr.dot(xv, g) * inv;  // x̂ · dx̂
#pragma unroll
            for (int i = 0; i < E; ++i) g[i] = (g[i] - xv[i] * inv * xd) * inv;
        } else {
#pragma unroll
            for (int i = 0; i < E; ++i) g[i] /= p.eps;
        }
        lr.store(static_cast<T*>(kQuery ? p.dq : p.dk) + off, g);
    });
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
        attn::inv_norm_rows<T, true, false>(p);                                                                    \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) attn_inv_norm_k_##DT(const __grid_constant__ AttnParams p) {  \
        attn::inv_norm_rows<T, false, false>(p);                                                                   \
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
    }

// Only for the Hopper kernels, which read 16-bit rows: the normalised rows of cosine-sim and dq from the
// fused backward's f32 sums.
#define ATTN_COMMON_HOPPER(DT, T)                                                                                   \
    extern "C" __global__ void __launch_bounds__(128) attn_normalise_q_##DT(const __grid_constant__ AttnParams p) { \
        attn::inv_norm_rows<T, true, true>(p);                                                                     \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) attn_normalise_k_##DT(const __grid_constant__ AttnParams p) { \
        attn::inv_norm_rows<T, false, true>(p);                                                                    \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) attn_dq_store_##DT(const __grid_constant__ AttnParams p) {    \
        attn::dq_acc_store_rows<T, false>(p);                                                                               \
    }

ATTN_COMMON(f32, float)
ATTN_COMMON(f16, __half)
ATTN_COMMON(bf16, __nv_bfloat16)
ATTN_COMMON_HOPPER(f16, __half)
ATTN_COMMON_HOPPER(bf16, __nv_bfloat16)
