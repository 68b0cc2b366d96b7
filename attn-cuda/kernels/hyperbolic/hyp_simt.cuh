// Hyperbolic attention on CUDA cores (SIMT), one warp per row as in simt_f32.cuh: every f32 call, and
// f16/bf16 calls under KernelConfig::hyperbolic_exact (rows widened to f32 as they load, outputs
// rounded once), with
// the CPU reference's cancellation-free Lorentz distance (attn-cpu-ref softmax_like/score.rs): with
// n = ‖x‖, x̂ = x/n (0 for x = 0), x0 = √(1/c + n²) and the gap g = x0 − n = (1/c)/(x0 + n),
//   d²_L = (nq − nk)² (1 − ρ²) + nq nk ‖q̂ − k̂‖²,  1 − ρ² = (gq + gk)(q0 + k0 + nq + nk)/(q0 + k0)²,
//   SqLorentz: s = −β d²_L, σ = −2β;  Geodesic: x = c d²_L/2 clamped at ≥ ACOSH_EPS,
//   s = −β ln(1 + x + √(x (x + 2)))/√c, σ = −β√c/√(x (x + 2)) (0 where clamped),
//   ∂s/∂q = σ G(q, k),  G(x, y) = (y0 nx/x0)(x̂ − ŷ) + T ŷ,
//   T = (nx − ny)·[(nx + ny)(1 + nx/(x0 + y0)) + y0] / (c (y0 + ny)(x0 + nx) x0).
// The only differences left are nq − nk and q̂ − k̂, so identical rows have distance exactly 0 (the
// clamp, zero gradient) and points far from the origin keep their digits. Row scalars n and x0 come
// from the row kernels (f64 sums, rounded once); s includes its constant, so LSE needs no offset.
//   forward   (warp = query i):  o_i, LSE_i
//   dQ        (warp = query i):  dq_i = Σ_j dS_ij σ_ij G(q_i, k_j); dS to the bias scratch
//   dK, dV    (warp = key j):    dk_j = Σ_{h∈group} Σ_i dS_ij σ_ij G(k_j, q_i), dv_j = Σ Σ P_ij dO_i
//                                (+ (Σ Σ dS_ij) c γ_j² v_j for the Einstein midpoint)
#pragma once
#include "../flash/score.h"
#include "../common/simt_f32.cuh"

namespace attn {

// One prepared row in registers: x̂ (lane chunks), n, x0 and the gap g.
struct HypRow {
    float xh[kSimtChunks];
    float n, x0, g;
};

template <typename T>
__device__ __forceinline__ void hyp_row(HypRow& r, const T* x, float n, float x0, float c, int D, int lane) {
    const float inv = n > 0.f ? 1.f / n : 0.f;
#pragma unroll
    for (int k = 0; k < kSimtChunks; ++k) {
        const int d = lane + 32 * k;
        r.xh[k] = d < D ? to_f32(x[d]) * inv : 0.f;
    }
    r.n = n;
    r.x0 = x0;
    r.g = (1.f / c) / (x0 + n);
}

// (s, σ) of a pair of prepared rows (module doc).
template <class Score>
__device__ __forceinline__ float hyp_pair(const AttnParams& p, const HypRow& a, const HypRow& b, float& sigma) {
    float ang = 0.f;
#pragma unroll
    for (int k = 0; k < kSimtChunks; ++k) {
        const float t = a.xh[k] - b.xh[k];
        ang = fmaf(t, t, ang);
    }
    ang = warp_sum(ang);
    const float dn = a.n - b.n;
    const float t0 = a.x0 + b.x0;
    const float one_minus_rho2 = (a.g + b.g) * (t0 + a.n + b.n) / (t0 * t0);
    const float d2 = dn * dn * one_minus_rho2 + a.n * b.n * ang;
    if (!Score::kGeodesic) {
        sigma = -2.f * p.beta;
        return -p.beta * d2;
    }
    const float c = p.curvature, sqrt_c = sqrtf(c);
    float x = 0.5f * c * d2;
    const bool clamped = x < kAcoshEps;
    if (clamped) x = kAcoshEps;
    const float root = sqrtf(x * (x + 2.f));  // √(z² − 1)
    sigma = clamped ? 0.f : -p.beta * sqrt_c / root;
    return -p.beta * log1pf(x + root) / sqrt_c;
}

// acc += w·G(x, y) for the prepared rows x (this gradient's side) and y.
__device__ __forceinline__ void hyp_accumulate(float (&acc)[kSimtChunks], float w, const HypRow& x, const HypRow& y,
                                               float c) {
    const float radial = (x.n + y.n) * (1.f + x.n / (x.x0 + y.x0)) + y.x0;
    const float t = w * (x.n - y.n) * radial / (c * (y.x0 + y.n) * (x.x0 + x.n) * x.x0);
    const float a = w * y.x0 * x.n / x.x0;
#pragma unroll
    for (int k = 0; k < kSimtChunks; ++k) acc[k] += a * (x.xh[k] - y.xh[k]) + t * y.xh[k];
}

// The Einstein midpoint's per-key bias log γ_j (0 for Euclidean aggregation).
__device__ __forceinline__ float hyp_lg(const AttnParams& p, const SeqInfo& si, int hk, int j) {
    return p.midpoint ? p.lgk[si.key_index(p, hk, j)] : 0.f;
}

template <class Score, typename T>
__device__ __forceinline__ void hyp_simt_fwd(const AttnParams& p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kSimtRows + warp;
    const SeqInfo si(p, b);
    if (i >= si.len_q) return;
    const int hk = h / p.group, D = p.head_dim;
    const T* k = static_cast<const T*>(p.k);
    const T* v = static_cast<const T*>(p.v);
    const long long qi = si.stats_index(p, h, i);
    HypRow q, kr;
    hyp_row(q, static_cast<const T*>(p.q) + si.q_off(p, i, h), p.nq[qi], p.x0q[qi], p.curvature, D, lane);
    float acc[kSimtChunks];
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) acc[c] = 0.f;
    float m = -CUDART_INF_F, l = 0.f;
    const int hi = si.key_hi(p, i);
    for (int j = si.key_lo(p, i); j < hi; ++j) {
        const long long kj = si.key_index(p, hk, j);
        hyp_row(kr, k + si.k_off(p, j, hk), p.nk[kj], p.x0k[kj], p.curvature, D, lane);
        float sigma;
        // A q or k row holding NaN or ±∞ makes the score NaN (docs/nan.md).
        float s = finite_or_nan(hyp_pair<Score>(p, q, kr, sigma)) + hyp_lg(p, si, hk, j);
        if (p.bias != nullptr) s += to_f32(static_cast<const T*>(p.bias)[si.bias_index(p, h, i, j)]);
        const float m_new = fmax_nan(m, s);
        const float ref = m_new == -CUDART_INF_F ? 0.f : m_new;
        const float alpha = expf(m - ref);
        const float pr = expf(s - ref);
        l = l * alpha + pr;
        const T* vj = v + si.v_off(p, j, hk);
#pragma unroll
        for (int c = 0; c < kSimtChunks; ++c) {
            const int d = lane + 32 * c;
            acc[c] = acc[c] * alpha + (d < D ? pr * to_f32(vj[d]) : 0.f);
        }
        m = m_new;
    }
    const float inv = l != 0.f ? 1.f / l : 0.f;  // NaN l: a NaN row
    T* o = static_cast<T*>(p.o) + si.o_off(p, i, h);
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < D) o[d] = from_f32<T>(acc[c] * inv);
    }
    if (lane == 0) p.lse[qi] = l != 0.f ? (m == -CUDART_INF_F ? 0.f : m) + logf(l) : -CUDART_INF_F;
}

template <class Score, typename T>
__device__ __forceinline__ void hyp_simt_bwd_dq(const AttnParams& p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kSimtRows + warp;
    const SeqInfo si(p, b);
    if (i >= si.len_q) return;
    const int hk = h / p.group, D = p.head_dim;
    const T* k = static_cast<const T*>(p.k);
    const T* v = static_cast<const T*>(p.v);
    const long long qi = si.stats_index(p, h, i);
    HypRow q, kr;
    hyp_row(q, static_cast<const T*>(p.q) + si.q_off(p, i, h), p.nq[qi], p.x0q[qi], p.curvature, D, lane);
    float g[kSimtChunks], acc[kSimtChunks];
    load_row(g, static_cast<const T*>(p.d_o) + si.o_off(p, i, h), D, lane);
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) acc[c] = 0.f;
    const float lse = p.lse[qi], delta = p.delta[qi];
    const int hi = lse == -CUDART_INF_F ? 0 : si.key_hi(p, i);
    for (int j = si.key_lo(p, i); j < hi; ++j) {
        const long long kj = si.key_index(p, hk, j);
        hyp_row(kr, k + si.k_off(p, j, hk), p.nk[kj], p.x0k[kj], p.curvature, D, lane);
        float sigma;
        float s = hyp_pair<Score>(p, q, kr, sigma) + hyp_lg(p, si, hk, j);
        if (p.bias != nullptr) s += to_f32(static_cast<const T*>(p.bias)[si.bias_index(p, h, i, j)]);
        const float pr = expf(s - lse);
        const float ds = pr * (row_dot(g, v + si.v_off(p, j, hk), D, lane) - delta);
        if (p.ds != nullptr && lane == 0) p.ds[si.ds_index(p, h, i, j)] = ds;
        hyp_accumulate(acc, ds * sigma, q, kr, p.curvature);
    }
    T* dq = static_cast<T*>(p.dq) + si.dq_off(p, i, h);
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < D) dq[d] = from_f32<T>(acc[c]);
    }
}

template <class Score, typename T>
__device__ __forceinline__ void hyp_simt_bwd_dkdv(const AttnParams& p) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, hk = blockIdx.y, j = blockIdx.x * kSimtRows + warp;
    const SeqInfo si(p, b);
    if (j >= si.key_rows(p)) return;  // padded keys (j ≥ len_k) meet no query: zero gradients
    const int D = p.head_dim;
    const long long kj = si.key_index(p, hk, j);
    const T* vrow = static_cast<const T*>(p.v) + si.v_off(p, j, hk);
    HypRow kr, q;
    hyp_row(kr, static_cast<const T*>(p.k) + si.k_off(p, j, hk), p.nk[kj], p.x0k[kj], p.curvature, D, lane);
    float vr[kSimtChunks], adk[kSimtChunks], adv[kSimtChunks];
    load_row(vr, vrow, D, lane);
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) adk[c] = adv[c] = 0.f;
    const bool valid = j < si.len_k;
    const float lg = valid ? hyp_lg(p, si, hk, j) : 0.f;
    float colsum = 0.f;  // Σ_i dS_ij (Einstein midpoint)
    const int i_lo = si.query_lo(p, j), i_hi = valid ? si.query_hi(p, j + 1) : 0;
    for (int gi = 0; gi < p.group; ++gi) {
        const int h = hk * p.group + gi;
        for (int i = i_lo; i < i_hi; ++i) {
            if (j < si.key_lo(p, i) || j >= si.key_hi(p, i)) continue;
            const long long qi = si.stats_index(p, h, i);
            const float lse = p.lse[qi];
            if (lse == -CUDART_INF_F) continue;
            const T* qrow = static_cast<const T*>(p.q) + si.q_off(p, i, h);
            const T* g = static_cast<const T*>(p.d_o) + si.o_off(p, i, h);
            hyp_row(q, qrow, p.nq[qi], p.x0q[qi], p.curvature, D, lane);
            float sigma;
            float s = hyp_pair<Score>(p, kr, q, sigma) + lg;
            if (p.bias != nullptr) s += to_f32(static_cast<const T*>(p.bias)[si.bias_index(p, h, i, j)]);
            const float pr = expf(s - lse);
            const float ds = pr * (row_dot(vr, g, D, lane) - p.delta[qi]);
            colsum += ds;
            hyp_accumulate(adk, ds * sigma, kr, q, p.curvature);
#pragma unroll
            for (int c = 0; c < kSimtChunks; ++c) {
                const int d = lane + 32 * c;
                if (d < D) adv[c] += pr * to_f32(g[d]);
            }
        }
    }
    const float mid = p.midpoint && valid ? colsum * p.dgk[kj] : 0.f;
    T* dk = static_cast<T*>(p.dk) + si.dk_off(p, j, hk);
    T* dv = static_cast<T*>(p.dv) + si.dv_off(p, j, hk);
#pragma unroll
    for (int c = 0; c < kSimtChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < D) {
            dk[d] = from_f32<T>(adk[c]);
            // 0·NaN: a NaN v_j's own dv (docs/nan.md)
            dv[d] = from_f32<T>(p.midpoint ? adv[c] + mid * vr[c] : adv[c]);
        }
    }
}

}  // namespace attn
