// f32 kernels on CUDA cores (SIMT), for f32 inputs: tensor-core tf32 is not f32-accurate. They
// compute the same functions as the flash skeleton, with the same score functions, masks and
// scratch buffers, one warp per row: lane l holds elements d = l + 32·c of the row (D ≤ 256), and
// every dot product is a warp reduction. Written for exactness, not speed.
//   forward   (warp = query i):  online softmax over the keys of key_range(i), o_i and LSE_i
//   dQ        (warp = query i):  dq_i = scale·Σ_j dS'_ij k_j (k̂_j for cosine), dS to the bias scratch
//   dK, dV    (warp = key j):    dv_j = Σ_{h∈group} Σ_i P_ij dO_i,  dk_j = scale·Σ Σ dS'_ij q_i
#pragma once
#include <cstdint>

#include "mask.h"
#include "mma.h"
#include "online_softmax.h"
#include "../flash/score.h"

namespace attn {

constexpr int kSimtChunks = 8;  // 8 · 32 lanes = 256 = MAX_HEAD_DIM
constexpr int kSimtRows = 4;    // rows (warps) per block

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// The elements of a row that a lane holds in the row kernels (common.cu, hyperbolic.cu).
// kVec (16-bit rows of D ∈ {16, 32, 64, 128, 256}, 16-byte aligned on the tensor-core path: backend.rs
// checks the inputs' pointers and strides, `store` checks its row): G lanes share a row (D/16, and 2
// at D = 16: at most 16 elements a lane, which keeps the l2-norm backward, two rows of E f32 values
// per lane, under 64 registers), so a warp holds 32/G rows; lane s of the group holds the 8-element
// chunks s, s + G, s + 2G, … of the row (E = D/G elements), one 16-byte access per chunk, the group's
// accesses contiguous, and the same columns of the rows' f32 scratch. The per-row work (indices,
// norms, the statistics' stores) is then shared by 32/G rows per instruction: with one row per warp
// these kernels were bound by issue, not by bandwidth (H100 profile). Otherwise the whole
// warp holds one row, d = lane + 32·i for i < E = kSimtChunks (D ≤ 256), d < D, the layout of the f32
// SIMT kernels below (load_row).
template <int E, bool kVec, int G = 32>
struct LaneRow {
    static constexpr int kE = E;
    static constexpr int kC = 8;  // elements per 16-byte chunk (kVec)
    static_assert(!kVec || (E % kC == 0 && G <= 32 && (G & (G - 1)) == 0), "LaneRow: chunks of 8, groups of 2^k");
    int lane;       // within the row's group
    int D;
    unsigned mask;  // the group's lanes (shuffles)
    __device__ __forceinline__ int col(int i) const { return kVec ? ((i / kC) * G + lane) * kC + i % kC : lane + 32 * i; }
    __device__ __forceinline__ bool has(int i) const { return kVec || col(i) < D; }
    // off / D for an offset of whole rows (a shift where D is fixed by the layout).
    __device__ __forceinline__ long long rows(long long off) const { return kVec ? off / (E * G) : off / D; }

    template <typename X>
    __device__ __forceinline__ X sum(X x) const {
#pragma unroll
        for (int o = G / 2; o > 0; o >>= 1) x += __shfl_xor_sync(mask, x, o);
        return x;
    }
    __device__ __forceinline__ float dot(const float (&a)[E], const float (&b)[E]) const {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < E; ++i) s = fmaf(a[i], b[i], s);
        return sum(s);
    }

    template <typename T>
    __device__ __forceinline__ void load(const T* row, float (&v)[E]) const {
        if constexpr (kVec && sizeof(T) == 2) {
#pragma unroll
            for (int c = 0; c < E / kC; ++c) {
                const uint4 w = *reinterpret_cast<const uint4*>(row + col(c * kC));
                const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
                for (int i = 0; i < kC; ++i) v[c * kC + i] = to_f32(e[i]);
            }
        } else if constexpr (kVec) {
            load_f32_chunks([&](int c0) { return row + c0; }, v);
        } else {
#pragma unroll
            for (int i = 0; i < E; ++i) v[i] = has(i) ? to_f32(row[col(i)]) : 0.f;
        }
    }

    // f32 elements of a row whose 8-column chunks are contiguous, 32-byte aligned runs at chunk(c0)
    // (c0 = the chunk's first column): the f32 scratch rows, and the tiled dq_acc of the fused backward.
    template <class Chunk>
    __device__ __forceinline__ void load_f32_chunks(Chunk&& chunk, float (&v)[E]) const {
        if constexpr (kVec) {
#pragma unroll
            for (int c = 0; c < E / kC; ++c) {
                const float4* s = reinterpret_cast<const float4*>(chunk(col(c * kC)));
                const float4 a = s[0], b = s[1];
                v[c * kC + 0] = a.x, v[c * kC + 1] = a.y, v[c * kC + 2] = a.z, v[c * kC + 3] = a.w;
                v[c * kC + 4] = b.x, v[c * kC + 5] = b.y, v[c * kC + 6] = b.z, v[c * kC + 7] = b.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < E; ++i) v[i] = has(i) ? chunk(col(i) & ~7)[col(i) & 7] : 0.f;
        }
    }

    template <typename T>
    __device__ __forceinline__ void store(T* row, const float (&v)[E]) const {
        if constexpr (kVec && sizeof(T) == 2) {
            // Outputs are checked for 4-byte alignment only (backend.rs): 16-byte stores where the row
            // allows them, else pairs.
            const bool wide = (reinterpret_cast<uintptr_t>(row) & 15) == 0;
#pragma unroll
            for (int c = 0; c < E / kC; ++c) {
                uint4 w;
                T* e = reinterpret_cast<T*>(&w);
#pragma unroll
                for (int i = 0; i < kC; ++i) e[i] = from_f32<T>(v[c * kC + i]);
                T* at = row + col(c * kC);
                if (wide) {
                    *reinterpret_cast<uint4*>(at) = w;
                } else {
                    uint32_t* d = reinterpret_cast<uint32_t*>(at);
                    d[0] = w.x, d[1] = w.y, d[2] = w.z, d[3] = w.w;
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < E; ++i)
                if (has(i)) row[col(i)] = from_f32<T>(v[i]);
        }
    }
};

template <int E, int G, class F>
__device__ __forceinline__ void lane_group(int warp_row, int lane, int D, F& f) {
    const int first = lane & ~(G - 1);
    const unsigned mask = G == 32 ? 0xffffffffu : ((1u << G) - 1u) << first;
    f(LaneRow<E, true, G>{lane - first, D, mask}, warp_row * (32 / G) + lane / G);
}

// The row kernels' thread → row map: f(LaneRow, n) with n the row (position) of this thread's group,
// blocks of kSimtRows warps along blockIdx.x. Rows per warp (host: heuristics::row_kernel_rows_per_warp):
// 32/G for the vector layout (16-bit T, D ∈ {16, 32, 64, 128, 256}), else 1.
template <typename T, class F>
__device__ __forceinline__ void with_lane_row(int D, F&& f) {
    const int lane = threadIdx.x % 32;
    const int w = blockIdx.x * kSimtRows + threadIdx.x / 32;
    if constexpr (sizeof(T) == 2) {
        if (D == 16) return lane_group<8, 2>(w, lane, D, f);
        if (D == 32) return lane_group<16, 2>(w, lane, D, f);
        if (D == 64) return lane_group<16, 4>(w, lane, D, f);
        if (D == 128) return lane_group<16, 8>(w, lane, D, f);
        if (D == 256) return lane_group<16, 16>(w, lane, D, f);
    }
    f(LaneRow<kSimtChunks, false>{lane, D, 0xffffffffu}, w);
}

// Query i's f32 dQ sums in the LaneRow layout, whichever layout p.dq_acc has (SeqInfo::dq_acc_at;
// `off`: the row's dq offset). In the tiled layout a row's 8-column chunks are contiguous runs.
template <class LR>
__device__ __forceinline__ void load_dq_acc(const LR& lr, const AttnParams& p, const SeqInfo& si, int h, int i,
                                            long long off, float (&v)[LR::kE]) {
    if (p.dq_acc_tiled)
        lr.load_f32_chunks([&](int c0) { return p.dq_acc + si.dq_acc_index(p, h, i, c0); }, v);
    else
        lr.load(p.dq_acc + off, v);
}

// Row kernel after the fused Hopper backward (with_lane_row's rows): dq_i from the f32 dQ scratch
// p.dq_acc. kLorentz (hyperbolic scores): dq_i = hyp_grad·(dq_acc_i − (a_i/q0_i)·q_i) with the row
// sums a_i of p.dq_rowsum, the dQ kernel's epilogue (lorentz_dq_epilogue) on the f32 sums.
template <typename T, bool kLorentz>
__device__ __forceinline__ void dq_acc_store_rows(const AttnParams& p) {
    const int b = blockIdx.z, h = blockIdx.y;
    const SeqInfo si(p, b);
    with_lane_row<T>(p.head_dim, [&](auto lr, int i) {
        if (i >= si.len_q) return;
        constexpr int E = decltype(lr)::kE;
        const long long off = si.dq_off(p, i, h);
        float acc[E];
        load_dq_acc(lr, p, si, h, i, off, acc);
        if constexpr (kLorentz) {
            const long long at = si.stats_index(p, h, i);
            const float ratio = p.dq_rowsum[at] / p.x0q[at];
            float q[E];
            lr.load(static_cast<const T*>(p.q) + si.q_off(p, i, h), q);
#pragma unroll
            for (int e = 0; e < E; ++e) acc[e] = p.hyp_grad * fmaf(-ratio, q[e], acc[e]);
        }
        lr.store(static_cast<T*>(p.dq) + off, acc);
    });
}

// A row of T (f32 here; f16/bf16 in the hyperbolic SIMT kernels) widened to f32 in the lanes' chunks.
template <typename T>
__device__ __forceinline__ void load_row(float (&x)[kSimtChunks], const T* row, int D, int lane) {
    LaneRow<kSimtChunks, false>{lane, D, 0xffffffffu}.load(row, x);
}

template <typename T>
__device__ __forceinline__ float row_dot(const float (&x)[kSimtChunks], const T* row, int D, int lane) {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < D) s += x[c] * to_f32(row[d]);
    }
    return warp_sum(s);
}

// x itself if finite, else NaN: the product of a q or k row holding NaN or ±∞ (docs/nan.md).
__device__ __forceinline__ float finite_or_nan(float x) { return fabsf(x) < CUDART_INF_F ? x : CUDART_NAN_F; }

__device__ __forceinline__ float inv_norm(const float (&x)[kSimtChunks], float eps) {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) s += x[c] * x[c];
    const float n = sqrtf(warp_sum(s));
    return 1.f / (n < eps ? eps : n);  // a NaN norm stays NaN (fmaxf would return eps)
}

template <class Score>
__device__ __forceinline__ void simt_fwd(const AttnParams& p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kSimtRows + warp;
    const SeqInfo si(p, b);
    if (i >= si.len_q) return;
    const int hk = h / p.group, D = p.head_dim;
    const bool norms = Score::kNorms && p.l2norm;
    const float* k = static_cast<const float*>(p.k);
    const float* v = static_cast<const float*>(p.v);
    float q[kSimtChunks], acc[kSimtChunks];
    load_row(q, static_cast<const float*>(p.q) + si.q_off(p, i, h), D, lane);
    const float rq = norms ? inv_norm(q, p.eps) : 1.f;
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) acc[c] = 0.f;
    float m = p.running_max ? -CUDART_INF_F : p.max_offset, l = 0.f;
    const int hi = si.key_hi(p, i);
    for (int j = si.key_lo(p, i); j < hi; ++j) {
        const float* kj = k + si.k_off(p, j, hk);
        float kr[kSimtChunks];
        load_row(kr, kj, D, lane);
        const float rk = norms ? inv_norm(kr, p.eps) : 1.f;
        float dtanh;
        // A q or k row holding NaN or ±∞ has no finite product: its score is NaN (docs/nan.md).
        float s = score<Score, true>(p, finite_or_nan(row_dot(q, kj, D, lane)), rq, rk, dtanh);
        if (p.bias != nullptr) s += static_cast<const float*>(p.bias)[si.bias_index(p, h, i, j)];
        const float m_new = p.running_max ? fmax_nan(m, s) : m;
        const float ref = m_new == -CUDART_INF_F ? 0.f : m_new;  // all scores so far −∞ (a −∞ bias)
        const float alpha = expf(m - ref);
        const float pr = expf(s - ref);
        l = l * alpha + pr;
        const float* vj = v + si.v_off(p, j, hk);
#pragma unroll
        for (int c = 0; c < kSimtChunks; ++c) {
            const int d = lane + 32 * c;
            acc[c] = acc[c] * alpha + (d < D ? pr * vj[d] : 0.f);
        }
        m = m_new;
    }
    const float inv = l != 0.f ? 1.f / l : 0.f;  // NaN l: a NaN row
    float* o = static_cast<float*>(p.o) + si.o_off(p, i, h);
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < D) o[d] = acc[c] * inv;
    }
    if (lane == 0) p.lse[si.stats_index(p, h, i)] = l != 0.f ? (m == -CUDART_INF_F ? 0.f : m) + logf(l) : -CUDART_INF_F;
}

template <class Score>
__device__ __forceinline__ void simt_bwd_dq(const AttnParams& p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kSimtRows + warp;
    const SeqInfo si(p, b);
    if (i >= si.len_q) return;
    const int hk = h / p.group, D = p.head_dim;
    const bool norms = Score::kNorms && p.l2norm;
    const float* k = static_cast<const float*>(p.k);
    const float* v = static_cast<const float*>(p.v);
    float q[kSimtChunks], g[kSimtChunks], acc[kSimtChunks];
    load_row(q, static_cast<const float*>(p.q) + si.q_off(p, i, h), D, lane);
    load_row(g, static_cast<const float*>(p.d_o) + si.o_off(p, i, h), D, lane);
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) acc[c] = 0.f;
    const float lse = p.lse[si.stats_index(p, h, i)];
    const float delta = p.delta[si.stats_index(p, h, i)];
    const float rq = norms ? p.rq[si.dq_off(p, i, h) / D] : 1.f;
    const int hi = lse == -CUDART_INF_F ? 0 : si.key_hi(p, i);
    for (int j = si.key_lo(p, i); j < hi; ++j) {
        const float* kj = k + si.k_off(p, j, hk);
        const float rk = norms ? p.rk[si.dk_off(p, j, hk) / D] : 1.f;
        float dtanh;
        float s = score<Score, true>(p, row_dot(q, kj, D, lane), rq, rk, dtanh);
        if (p.bias != nullptr) s += static_cast<const float*>(p.bias)[si.bias_index(p, h, i, j)];
        const float pr = expf(s - lse);
        const float dp = row_dot(g, v + si.v_off(p, j, hk), D, lane);
        const float ds = pr * (dp - delta);
        if (p.ds != nullptr && lane == 0) p.ds[si.ds_index(p, h, i, j)] = ds;
        const float dx = ds * dtanh * rk;
#pragma unroll
        for (int c = 0; c < kSimtChunks; ++c) {
            const int d = lane + 32 * c;
            if (d < D) acc[c] += dx * kj[d];
        }
    }
    const long long off = si.dq_off(p, i, h);
    float* dq = norms ? p.dq_acc + off : static_cast<float*>(p.dq) + off;
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < D) dq[d] = acc[c] * p.scale;
    }
}

template <class Score>
__device__ __forceinline__ void simt_bwd_dkdv(const AttnParams& p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, hk = blockIdx.y, j = blockIdx.x * kSimtRows + warp;
    const SeqInfo si(p, b);
    if (j >= si.key_rows(p)) return;  // padded keys (j ≥ len_k) meet no query: zero gradients
    const int D = p.head_dim;
    const bool norms = Score::kNorms && p.l2norm;
    float kr[kSimtChunks], vr[kSimtChunks], adk[kSimtChunks], adv[kSimtChunks];
    load_row(kr, static_cast<const float*>(p.k) + si.k_off(p, j, hk), D, lane);
    load_row(vr, static_cast<const float*>(p.v) + si.v_off(p, j, hk), D, lane);
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) adk[c] = adv[c] = 0.f;
    const float rk = norms ? p.rk[si.dk_off(p, j, hk) / D] : 1.f;
    const int i_lo = si.query_lo(p, j), i_hi = si.query_hi(p, j + 1);
    for (int gi = 0; gi < p.group; ++gi) {
        const int h = hk * p.group + gi;
        for (int i = i_lo; i < i_hi; ++i) {
            if (j < si.key_lo(p, i) || j >= si.key_hi(p, i)) continue;
            const float lse = p.lse[si.stats_index(p, h, i)];
            if (lse == -CUDART_INF_F) continue;
            const float* qi = static_cast<const float*>(p.q) + si.q_off(p, i, h);
            const float* gi_row = static_cast<const float*>(p.d_o) + si.o_off(p, i, h);
            const float rq = norms ? p.rq[si.dq_off(p, i, h) / D] : 1.f;
            float dtanh;
            float s = score<Score, true>(p, row_dot(kr, qi, D, lane), rq, rk, dtanh);
            if (p.bias != nullptr) s += static_cast<const float*>(p.bias)[si.bias_index(p, h, i, j)];
            const float pr = expf(s - lse);
            const float dp = row_dot(vr, gi_row, D, lane);
            const float ds = pr * (dp - p.delta[si.stats_index(p, h, i)]);
            const float dx = ds * dtanh * rq;
#pragma unroll
            for (int c = 0; c < kSimtChunks; ++c) {
                const int d = lane + 32 * c;
                if (d < D) {
                    adv[c] += pr * gi_row[d];
                    adk[c] += dx * qi[d];
                }
            }
        }
    }
    const long long offk = si.dk_off(p, j, hk);
    float* dk = norms ? p.dk_acc + offk : static_cast<float*>(p.dk) + offk;
    float* dv = static_cast<float*>(p.dv) + si.dv_off(p, j, hk);
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < D) {
            dk[d] = adk[c] * p.scale;
            dv[d] = adv[c];
        }
    }
}

}  // namespace attn
