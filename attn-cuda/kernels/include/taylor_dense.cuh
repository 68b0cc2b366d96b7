// The dense part of a Taylor sweep: probe p against the fewer than C sources [B_p, hi_p) past its chunk
// boundary B_p = ⌊hi_p / C⌋·C (the state sweep supplies the sources before B_p). It WRITES the result
// rows of every probe (zeros where there is nothing dense), so it runs before the state sweep, which adds.
//
// Tensor cores (f16/bf16): one block = BP = 64 probes (4 warps × 16 rows) of one (batch entry, kv head);
// source blocks of BS = 64 rows stream through shared memory. Per source block, per warp:
//   S = Z Xᵀ                 [16, BS]   mma.sync m16n8k16, f32 accumulate
//   value: P = f(S) masked   O += P Y   [16, MP]   P straight from registers
//   grad:  E = W Yᵀ          [16, BS];  Q = f'(S)∘E masked;  G += Q X   [16, D]
// The mask keeps s ∈ [B_p, hi_p). P, Q are rounded to the storage type for their product (as f(S) would be
// in any f16/bf16 attention), so f16 needs |f(s)| < 65504.
//
// f32 (SIMT, exact f32): one warp per probe, lanes over the features, one source at a time.
#pragma once
#include "taylor_common.cuh"

namespace attn {

template <typename T, int D, bool GRAD>
__device__ __forceinline__ void taylor_dense_mma(const TaylorParams& tp) {
    constexpr int M = TaylorDims<D>::M, MP = TaylorDims<D>::MP, C = TaylorTile<D>::C;
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

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    const int p0 = blockIdx.x * BP;
    if (p0 >= sw.n_p) return;
    const int n_probe = min(BP, sw.n_p - p0);
    const int s_begin = sw.hi(P, p0) / C * C;
    const int s_end = sw.hi(P, p0 + n_probe - 1);

    load_rows_f32<T, BP, D, LDZ>(sZ, tp.probe_z, D, n_probe, [&](int r) { return sw.probe_row(p0 + r); }, tid);
    if (GRAD) load_rows_f32<T, BP, MP, LDW>(sW, tp.probe_w, M, n_probe, [&](int r) { return sw.probe_row(p0 + r); }, tid);

    // This thread's two probe rows and their dense source ranges [lo, hi).
    const int wrow = warp * 16;
    int lo[2], hi[2], prow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        prow[r] = p0 + wrow + g + 8 * r;
        hi[r] = prow[r] < sw.n_p ? sw.hi(P, prow[r]) : 0;
        lo[r] = hi[r] / C * C;
    }
    constexpr int NO = GRAD ? D / 8 : MP / 8;  // n8 tiles of the result
    float acc[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;

    for (int s0 = s_begin; s0 < s_end; s0 += BS) {
        __syncthreads();  // the previous block's X, Y are no longer read
        const int valid = min(BS, sw.n_s - s0);
        load_rows_f32<T, BS, D, LDZ>(sX, tp.src_x, D, valid, [&](int r) { return sw.src_row(s0 + r); }, tid);
        load_rows_f32<T, BS, MP, LDW>(sY, tp.src_y, M, valid, [&](int r) { return sw.src_row(s0 + r); }, tid);
        __syncthreads();

        // S = Z Xᵀ   [16, BS]
        float s[NS][4];
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t a[4];
            load_a(a, sZ, LDZ, wrow, kk * 16, lane);
#pragma unroll
            for (int nn = 0; nn < BS / 16; ++nn) {
                uint32_t bf[4];
                load_b_nk(bf, sX, LDZ, nn * 16, kk * 16, lane);
                mma16816<T>(s[2 * nn], a, bf[0], bf[1]);
                mma16816<T>(s[2 * nn + 1], a, bf[2], bf[3]);
            }
        }

        if (!GRAD) {
            // P = f(S) on [lo, hi), 0 elsewhere
#pragma unroll
            for (int n = 0; n < NS; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e / 2, col = s0 + n * 8 + 2 * t4 + (e & 1);
                    s[n][e] = col >= lo[r] && col < hi[r] ? taylor_f(tp, s[n][e]) : 0.f;
                }
            // O += P Y   [16, MP]
#pragma unroll
            for (int kk = 0; kk < BS / 16; ++kk) {
                uint32_t a[4];
                pack_a<T>(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
                for (int dd = 0; dd < MP / 16; ++dd) {
                    uint32_t bf[4];
                    load_b_kn(bf, sY, LDW, kk * 16, dd * 16, lane);
                    mma16816<T>(acc[2 * dd], a, bf[0], bf[1]);
                    mma16816<T>(acc[2 * dd + 1], a, bf[2], bf[3]);
                }
            }
        } else {
            // E = W Yᵀ   [16, BS]
            float ew[NS][4];
#pragma unroll
            for (int n = 0; n < NS; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) ew[n][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < MP / 16; ++kk) {
                uint32_t a[4];
                load_a(a, sW, LDW, wrow, kk * 16, lane);
#pragma unroll
                for (int nn = 0; nn < BS / 16; ++nn) {
                    uint32_t bf[4];
                    load_b_nk(bf, sY, LDW, nn * 16, kk * 16, lane);
                    mma16816<T>(ew[2 * nn], a, bf[0], bf[1]);
                    mma16816<T>(ew[2 * nn + 1], a, bf[2], bf[3]);
                }
            }
            // Q = f'(S)∘E on [lo, hi)
#pragma unroll
            for (int n = 0; n < NS; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e / 2, col = s0 + n * 8 + 2 * t4 + (e & 1);
                    s[n][e] = col >= lo[r] && col < hi[r] ? taylor_df(tp, s[n][e]) * ew[n][e] : 0.f;
                }
            // G += Q X   [16, D]
#pragma unroll
            for (int kk = 0; kk < BS / 16; ++kk) {
                uint32_t a[4];
                pack_a<T>(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
                for (int dd = 0; dd < D / 16; ++dd) {
                    uint32_t bf[4];
                    load_b_kn(bf, sX, LDZ, kk * 16, dd * 16, lane);
                    mma16816<T>(acc[2 * dd], a, bf[0], bf[1]);
                    mma16816<T>(acc[2 * dd + 1], a, bf[2], bf[3]);
                }
            }
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

// f32: one warp per probe; lane l holds features l + 32·c.
template <int D, bool GRAD>
__device__ __forceinline__ void taylor_dense_simt(const TaylorParams& tp) {
    constexpr int M = TaylorDims<D>::M, C = TaylorTile<D>::C;
    constexpr int CD = (D + 31) / 32, CM = (M + 31) / 32;
    const AttnParams& P = tp.base;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    const int pr = blockIdx.x * kTaylorWarps + warp;
    if (pr >= sw.n_p) return;
    const long long prow = sw.probe_row(pr);
    float z[CD], w[CM], acc[GRAD ? CD : CM];
#pragma unroll
    for (int c = 0; c < CD; ++c) z[c] = lane + 32 * c < D ? tp.probe_z[prow * D + lane + 32 * c] : 0.f;
#pragma unroll
    for (int c = 0; c < CM; ++c) w[c] = GRAD && lane + 32 * c < M ? tp.probe_w[prow * M + lane + 32 * c] : 0.f;
#pragma unroll
    for (int c = 0; c < (GRAD ? CD : CM); ++c) acc[c] = 0.f;
    const int hi = sw.hi(P, pr);
    for (int s = hi / C * C; s < hi; ++s) {
        const long long srow = sw.src_row(s);
        const float* x = tp.src_x + srow * D;
        const float* y = tp.src_y + srow * M;
        float t = 0.f;
#pragma unroll
        for (int c = 0; c < CD; ++c)
            if (lane + 32 * c < D) t += z[c] * x[lane + 32 * c];
        t = taylor_warp_sum(t);
        if (!GRAD) {
            const float f = taylor_f(tp, t);
#pragma unroll
            for (int c = 0; c < CM; ++c)
                if (lane + 32 * c < M) acc[c] += f * y[lane + 32 * c];
        } else {
            float wy = 0.f;
#pragma unroll
            for (int c = 0; c < CM; ++c)
                if (lane + 32 * c < M) wy += w[c] * y[lane + 32 * c];
            const float coef = taylor_df(tp, t) * taylor_warp_sum(wy);
#pragma unroll
            for (int c = 0; c < CD; ++c)
                if (lane + 32 * c < D) acc[c] += coef * x[lane + 32 * c];
        }
    }
    constexpr int W = GRAD ? D : M;
    float* out = (GRAD ? tp.out_grad : tp.out_value) + prow * W;
#pragma unroll
    for (int c = 0; c < (GRAD ? CD : CM); ++c)
        if (lane + 32 * c < W) out[lane + 32 * c] = acc[c];
}

}  // namespace attn
