// Taylor row kernels: one warp per row, lanes over the features. They write the backward's per-row
// scalars (the sweeps read q, k, v, dO themselves and take the l2-norms from their tiles), and turn
// the sweeps' f32 sums back into outputs.
//   prep_grads     rg_i = 1/den_i, ĝ_i = rg_i·dO_i, δ_i = ĝ_i·o_i: g̃_i = [ĝ_i, −δ_i]   → rg, nd = −δ
//                  (both 0 for a row with no key; δ summed in f64, rounded once); with nd_rev also
//                  −T(ĝ_i)·o_i (ĝ rounded to T)
//   finalize_fwd   o_i = num_i / den_i, stats = den_i                          (o = 0, den = 0 for an empty row)
//   finalize_dq    dq = J(q)ᵀ (scale·dû_i)       J: the l2-norm's Jacobian, the identity without qk_l2norm
//   finalize_dkdv  dk = J(k)ᵀ dk̂_j, dv = dṽ_j[0..Dv)                           (0 for keys past key_lens)
// Grids: (rows / 4, heads, batch), rows over queries (q heads) or keys (kv heads).
#pragma once
#include "taylor_common.cuh"

namespace attn {

// Σ x_d² of a row, every lane gets the total.
template <typename T>
__device__ __forceinline__ float taylor_row_sq(const T* x, int D, int lane) {
    float s = 0.f;
    for (int d = lane; d < D; d += 32) {
        const float v = to_f32(x[d]);
        s += v * v;
    }
    return taylor_warp_sum(s);
}

// dx = (dx̂ − x̂ (x̂·dx̂)) / ‖x‖ where ‖x‖ > eps, else dx̂ / eps; dx̂ is `dxh` (f32 row), written as T.
template <typename T>
__device__ __forceinline__ void taylor_l2norm_bwd(T* dx, const float* dxh, float scale, const T* x, int D, float eps,
                                                  bool l2norm, int lane) {
    if (!l2norm) {
        for (int d = lane; d < D; d += 32) dx[d] = from_f32<T>(scale * dxh[d]);
        return;
    }
    const float norm = sqrtf(taylor_row_sq(x, D, lane));
    if (norm > eps) {
        const float inv = 1.f / norm;
        float dot = 0.f;
        for (int d = lane; d < D; d += 32) dot += to_f32(x[d]) * inv * scale * dxh[d];
        const float proj = taylor_warp_sum(dot);  // x̂·dx̂
        for (int d = lane; d < D; d += 32) dx[d] = from_f32<T>((scale * dxh[d] - to_f32(x[d]) * inv * proj) * inv);
    } else {
        for (int d = lane; d < D; d += 32) dx[d] = from_f32<T>(scale * dxh[d] / eps);
    }
}

template <typename T>
__device__ __forceinline__ void taylor_prep_grads(const TaylorParams& tp) {
    const AttnParams& p = tp.base;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kTaylorWarps + warp;
    const SeqInfo si(p, b);
    if (i >= si.len_q) return;
    const long long row = taylor_query_row(p, si, h / p.group, i, h % p.group);
    if (si.key_hi(p, i) == 0) {  // no allowed key: no gradient flows through this row
        if (lane == 0) {
            tp.rg[row] = tp.nd[row] = 0.f;
            if (tp.nd_rev != nullptr) tp.nd_rev[row] = 0.f;
        }
        return;
    }
    const float inv = 1.f / p.lse[si.stats_index(p, h, i)];
    const T* o = static_cast<const T*>(p.o) + si.o_off(p, i, h);
    const T* g = static_cast<const T*>(p.d_o) + si.o_off(p, i, h);
    // δ in f64 (exact f32 products), rounded once: taylor_dense_simt's gradient sums ĝ·v the same way.
    double delta = 0.0;
    float delta_r = 0.f;
    for (int d = lane; d < p.head_dim; d += 32) {
        const float gh = to_f32(g[d]) * inv;
        delta += (double)gh * to_f32(o[d]);
        delta_r += to_f32(from_f32<T>(gh)) * to_f32(o[d]);
    }
    delta = taylor_warp_sum(delta);
    delta_r = taylor_warp_sum(delta_r);
    if (lane == 0) {
        tp.rg[row] = inv;
        tp.nd[row] = -(float)delta;
        if (tp.nd_rev != nullptr) tp.nd_rev[row] = -delta_r;
    }
}

template <typename T>
__device__ __forceinline__ void taylor_finalize_fwd(const TaylorParams& tp) {
    const AttnParams& p = tp.base;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kTaylorWarps + warp;
    const SeqInfo si(p, b);
    if (i >= si.len_q) return;
    const int D = p.head_dim, M = D + 1;
    const float* acc = tp.acc_q + taylor_query_row(p, si, h / p.group, i, h % p.group) * M;
    T* o = static_cast<T*>(p.o) + si.o_off(p, i, h);
    const bool empty = si.key_hi(p, i) == 0;
    const float den = empty ? 0.f : acc[D];
    // num / den exactly as computed (order 1 may pass through den = 0; see attn-cpu-ref taylor.rs).
    for (int d = lane; d < D; d += 32) o[d] = from_f32<T>(empty ? 0.f : acc[d] / den);
    if (lane == 0) p.lse[si.stats_index(p, h, i)] = den;
}

template <typename T>
__device__ __forceinline__ void taylor_finalize_dq(const TaylorParams& tp) {
    const AttnParams& p = tp.base;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kTaylorWarps + warp;
    const SeqInfo si(p, b);
    if (i >= si.len_q) return;
    const int D = p.head_dim;
    const float* du = tp.acc_q + taylor_query_row(p, si, h / p.group, i, h % p.group) * D;
    const T* q = static_cast<const T*>(p.q) + si.q_off(p, i, h);
    T* dq = static_cast<T*>(p.dq) + si.dq_off(p, i, h);
    taylor_l2norm_bwd<T>(dq, du, p.scale, q, D, p.eps, p.l2norm != 0, lane);
}

template <typename T>
__device__ __forceinline__ void taylor_finalize_dkdv(const TaylorParams& tp) {
    const AttnParams& p = tp.base;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, hk = blockIdx.y, j = blockIdx.x * kTaylorWarps + warp;
    const SeqInfo si(p, b);
    if (j >= si.key_rows(p)) return;
    const int D = p.head_dim, M = D + 1;
    T* dk = static_cast<T*>(p.dk) + si.dk_off(p, j, hk);
    T* dv = static_cast<T*>(p.dv) + si.dv_off(p, j, hk);
    if (j >= si.len_k) {  // key padding: rows past key_lens[b] have zero gradients
        for (int d = lane; d < D; d += 32) {
            dk[d] = from_f32<T>(0.f);
            dv[d] = from_f32<T>(0.f);
        }
        return;
    }
    const long long row = taylor_key_row(p, si, hk, j);
    const T* k = static_cast<const T*>(p.k) + si.k_off(p, j, hk);
    taylor_l2norm_bwd<T>(dk, tp.acc_k + row * D, 1.f, k, D, p.eps, p.l2norm != 0, lane);
    for (int d = lane; d < D; d += 32) dv[d] = from_f32<T>(tp.acc_kv[row * M + d]);
}

}  // namespace attn
