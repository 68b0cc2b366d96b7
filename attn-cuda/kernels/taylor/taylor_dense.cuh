// The dense part of a Taylor sweep: probe p against the at most L sources [B_p, hi_p) past its state
// boundary B_p (TaylorSweep::boundary; the state read supplies the sources before B_p). It WRITES the
// result rows of every probe (zeros where there is nothing dense), so it runs before the state read,
// which adds to them.
//
// Tensor cores (f16/bf16): one block = BP = 64 probes (4 warps × 16 rows) of one (batch entry, kv head);
// source blocks of BS = 64 rows stream through shared memory, z and x raw (exact: the inputs) with their
// row factors r (scale, 1/‖·‖) kept in f32. Per source block, per warp:
//   S = r_z r_xᵀ ∘ (Z Xᵀ)    [16, BS]   mma.sync m16n8k16, f32 accumulate (u = scale·q̂ never rounded)
//   value: P = f(S) masked   O += P Y   [16, MP]   P straight from registers
//   grad:  E = W Yᵀ          [16, BS];  Q = f'(S)∘E∘r_x masked;  G += Q X   [16, D]
// The mask keeps s ∈ [B_p, hi_p). P, Q are rounded to the storage type for their product (as f(S) would be
// in any f16/bf16 attention), so f16 needs |f(s)| < 65504.
//
// f32 (SIMT, exact f32): one warp per probe, lanes over the features, one source at a time.
#pragma once
#include "taylor_common.cuh"

namespace attn {

template <typename T, int D, bool GRAD>
__device__ __forceinline__ void taylor_dense_mma(const TaylorParams& tp) {
    constexpr int M = TaylorDims<D>::M, MP = TaylorDims<D>::MP;
    constexpr int BP = 16 * kTaylorWarps, BS = 64;
    constexpr int LDZ = D + 8, LDW = MP + 8;
    constexpr int NS = BS / 8;  // n8 tiles of S per warp
    static_assert(D % 16 == 0 && MP % 16 == 0 && BS % 16 == 0, "whole k16 steps");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sZ = reinterpret_cast<T*>(smem_raw);  // [BP][LDZ] probes z
    T* sX = sZ + BP * LDZ;                   // [BS][LDZ] sources x
    T* sY = sX + BS * LDZ;                   // [BS][LDW] sources y
    T* sW = sY + BS * LDW;                   // [BP][LDW] probes w (grad)
    if (dynamic_smem_bytes() < (unsigned)((2 * BP * LDZ + BS * LDW + (GRAD ? BP * LDW : 0)) * sizeof(T)))
        __trap();

    __shared__ TaylorRowRef sPref[BP], sSref[BS];  // probe and source rows of the tiles

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    const int p0 = blockIdx.x * BP;
    if (p0 >= sw.n_p) return;
    const int n_probe = min(BP, sw.n_p - p0);
    const int s_begin = sw.boundary(sw.hi(P, p0));
    const int s_end = sw.hi(P, p0 + n_probe - 1);

    taylor_tile_refs<BP>(sPref, n_probe, [&](int r) { return sw.probe<T>(tp, p0 + r); }, tid);
    __syncthreads();
    taylor_load_x<T, T, BP, D, LDZ, false>(tp, sZ, sPref, tid);  // raw z; its factor r_z in sPref
    if (GRAD) taylor_load_y<T, BP, D, MP, LDW>(sW, sPref, tid);
    __syncthreads();

    // This thread's two probe rows, their factors r_z and their dense source ranges [lo, hi).
    const int wrow = warp * 16;
    int lo[2], hi[2], prow[2];
    float rz[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        prow[r] = p0 + wrow + g + 8 * r;
        hi[r] = prow[r] < sw.n_p ? sw.hi(P, prow[r]) : 0;
        lo[r] = sw.boundary(hi[r]);
        rz[r] = sPref[wrow + g + 8 * r].rx;
    }
    constexpr int NO = GRAD ? D / 8 : MP / 8;  // n8 tiles of the result
    float acc[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;

    for (int s0 = s_begin; s0 < s_end; s0 += BS) {
        __syncthreads();  // the previous block's X, Y and refs are no longer read
        const int valid = min(BS, sw.n_s - s0);
        taylor_tile_refs<BS>(sSref, valid, [&](int r) { return sw.source<T>(tp, s0 + r); }, tid);
        __syncthreads();
        taylor_load_x<T, T, BS, D, LDZ, false>(tp, sX, sSref, tid);  // raw x; its factor r_x in sSref
        taylor_load_y<T, BS, D, MP, LDW>(sY, sSref, tid);
        __syncthreads();

        // S = r_z r_xᵀ ∘ (Z_raw X_rawᵀ)   [16, BS]: the scores round nothing but f32 products
        float s[NS][4];
        taylor_scores_mma<T, D, BS>(s, sZ, LDZ, wrow, sX, LDZ, lane);
        float rx[NS][2];  // the factors of this thread's source columns
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) rx[n][e] = sSref[n * 8 + 2 * t4 + e].rx;
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = s[n][e] * rz[e / 2] * rx[n][e & 1];

        if constexpr (!GRAD) {
            // P = f(S) on [lo, hi), 0 elsewhere
#pragma unroll
            for (int n = 0; n < NS; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e / 2, col = s0 + n * 8 + 2 * t4 + (e & 1);
                    s[n][e] = col >= lo[r] && col < hi[r] ? taylor_f(tp, s[n][e]) : 0.f;
                }
            // O += P Y   [16, MP]
            taylor_weights_mma<T, BS, MP>(acc, s, sY, LDW, lane);
        } else {
            // E = W Yᵀ   [16, BS]
            float ew[NS][4];
            taylor_scores_mma<T, MP, BS>(ew, sW, LDW, wrow, sY, LDW, lane);
            // Q = f'(S)∘E on [lo, hi), times r_x (G takes the raw x)
#pragma unroll
            for (int n = 0; n < NS; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e / 2, col = s0 + n * 8 + 2 * t4 + (e & 1);
                    s[n][e] = col >= lo[r] && col < hi[r] ? taylor_df(tp, s[n][e]) * ew[n][e] * rx[n][e & 1] : 0.f;
                }
            // G += Q X_raw   [16, D]
            taylor_weights_mma<T, BS, D>(acc, s, sX, LDZ, lane);
        }
    }

    // Write every result row of this block (the state sweep adds to them afterwards).
    constexpr int W = GRAD ? D : M;
    float* out = GRAD ? tp.out_grad : tp.out_value;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (prow[r] >= sw.n_p) continue;
        float* row = out + sw.probe_row(prow[r]) * W;
#pragma unroll
        for (int n = 0; n < NO; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = n * 8 + 2 * t4 + e;
                if (c < W) row[c] = acc[n][2 * r + e];
            }
    }
}

// The factor of a row a warp holds (lane l: elements l + 32·c, zero past D): rx·(1/max(‖x‖, eps)) under
// qk_l2norm (summed as taylor_row_sq does), else rx.
template <int CD>
__device__ __forceinline__ float taylor_row_factor(const TaylorParams& tp, const float (&x)[CD], float rx) {
    if (!tp.base.l2norm) return rx;
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < CD; ++c) s += x[c] * x[c];
    return rx * (1.f / fmaxf(sqrtf(taylor_warp_sum(s)), tp.base.eps));
}

// f32: one warp per probe; lane l holds features l + 32·c.
template <int D, bool GRAD>
__device__ __forceinline__ void taylor_dense_simt(const TaylorParams& tp) {
    constexpr int M = TaylorDims<D>::M;
    constexpr int CD = (D + 31) / 32, CM = (M + 31) / 32;
    const AttnParams& P = tp.base;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    const int pr = blockIdx.x * kTaylorWarps + warp;
    if (pr >= sw.n_p) return;
    const long long prow = sw.probe_row(pr);
    const TaylorRowRef pref = sw.probe<float>(tp, pr);
    const float* zq = static_cast<const float*>(pref.x);
    const float* wq = static_cast<const float*>(pref.y);
    float z[CD], w[CM], acc[GRAD ? CD : CM];
#pragma unroll
    for (int c = 0; c < CD; ++c) z[c] = lane + 32 * c < D ? zq[lane + 32 * c] : 0.f;
    const float rz = taylor_row_factor<CD>(tp, z, pref.rx);
#pragma unroll
    for (int c = 0; c < CD; ++c) z[c] *= rz;
#pragma unroll
    for (int c = 0; c < CM; ++c) {
        const int v = lane + 32 * c;
        w[c] = !GRAD || v > D ? 0.f : (v == D ? pref.y_last : (wq != nullptr ? wq[v] * pref.ry : 0.f));
    }
#pragma unroll
    for (int c = 0; c < (GRAD ? CD : CM); ++c) acc[c] = 0.f;
    const int hi = sw.hi(P, pr);
    for (int s = sw.boundary(hi); s < hi; ++s) {
        const TaylorRowRef sref = sw.source<float>(tp, s);
        const float* xr = static_cast<const float*>(sref.x);
        const float* yr = static_cast<const float*>(sref.y);
        float x[CD], y[CM];
#pragma unroll
        for (int c = 0; c < CD; ++c) x[c] = lane + 32 * c < D ? xr[lane + 32 * c] : 0.f;
        const float rx = taylor_row_factor<CD>(tp, x, sref.rx);
#pragma unroll
        for (int c = 0; c < CD; ++c) x[c] *= rx;
#pragma unroll
        for (int c = 0; c < CM; ++c) {
            const int v = lane + 32 * c;
            y[c] = v > D ? 0.f : (v == D ? sref.y_last : (yr != nullptr ? yr[v] * sref.ry : 0.f));
        }
        // s = z·x in f64 (each f32 product exact), rounded once: an f32 sum of products ~Σ|z_d x_d| that
        // cancel to |s| loses up to ~10 ulp of s, which f(s) turns into ~2δs/s of its weight (gpu_taylor
        // large scores, f32 D = 16: o 7.9e-7 against a bound of 6.4e-7).
        double td = 0.0;
#pragma unroll
        for (int c = 0; c < CD; ++c) td += (double)z[c] * x[c];
        const float t = (float)taylor_warp_sum(td);
        if constexpr (!GRAD) {
            const float f = taylor_f(tp, t);
#pragma unroll
            for (int c = 0; c < CM; ++c) acc[c] += f * y[c];
        } else {
            // w·y = ĝ·v − δ: ĝ·v (the first D columns) in f64 summed exactly as taylor_prep_grads sums
            // δ = ĝ·o (same lanes, same butterfly, rounded once), then the last column's −δ: where o = v
            // (a query of one key, whose exact gradient is 0) the two round alike and the weight is 0. An
            // f32 sum with −δ in one lane before the butterfly left ~1 ulp of δ there, which f'(s)·x made a
            // dq of 4× the bound (gpu_taylor large scores, f32 D = 64).
            double gv = 0.0;
#pragma unroll
            for (int c = 0; c < CD; ++c)
                if (lane + 32 * c < D) gv += (double)w[c] * y[c];
            const float coef = taylor_df(tp, t) * ((float)taylor_warp_sum(gv) + pref.y_last * sref.y_last);
#pragma unroll
            for (int c = 0; c < CD; ++c) acc[c] += coef * x[c];
        }
    }
    constexpr int W = GRAD ? D : M;
    float* out = (GRAD ? tp.out_grad : tp.out_value) + prow * W;
#pragma unroll
    for (int c = 0; c < (GRAD ? CD : CM); ++c)
        if (lane + 32 * c < W) out[lane + 32 * c] = acc[c];
}

}  // namespace attn
