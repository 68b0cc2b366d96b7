// The state part of a Taylor sweep: probe p reads the sums over the sources before its chunk boundary
// B_p = ⌊hi_p / C⌋·C, S[f][·] = Σ_{s<B_p} φ_f(x_s) y_s, and ADDS (f32 atomics) its value or grad to the rows
// the dense kernel wrote.
//
// The sums of order 2 do not fit on one SM (D = 64: 2.4k features × 65 columns), so they are split:
//   - over features: block slab σ owns the NT tiles [σ·NT, σ·NT + NT) (8·NT features) of every column;
//   - along the sequence: block split k folds the chunks [k·cps, (k+1)·cps) only. A probe whose boundary
//     lies past the split reads the split's sums at the end of the split, one whose boundary lies inside
//     reads them when the sweep reaches it; the reads are linear in the sums, so the adds of all splits
//     and slabs make the whole sum. Only full chunks are ever folded (the dense kernel covers the rest).
// Per block, chunk by chunk:
//   fold:   Φ = φ(X_chunk) [C, F_slab];  Sᵀ += Yᵀ Φ  [MP, F_slab]   (f32 sums in shared memory)
//   value:  Ψ = ψ(Z) [C, F_slab];        O = Ψ S     [C, MP]        → out_value (+=)
//   grad:   T = W Sᵀᵀ  [C, F_slab] (T_pf = S[f]·w_p);  G_pd = Σ_f ∂ψ_f(z_p)/∂z_d T_pf → out_grad (+=)
// Tensor cores (f16/bf16): the products on mma.sync with the sums kept in f32 and copied to the storage
// type for each chunk's reads, scaled by a power of two that brings the largest entry to [2^14, 2^15),
// so f16 holds them for any N and any magnitude of y (values, or the small g̃ of the backward).
// f32: the same steps as exact f32 loops on CUDA cores.
#pragma once
#include "taylor_common.cuh"

namespace attn {

// Shared-memory carve-up of the state sweep (bytes, each offset 16-aligned). Mirrored by
// taylor::heuristics::state_smem. With T = float (f32 inputs) there is no storage-type copy.
template <typename T, int D> struct TaylorStateSmem {
    static constexpr int C = TaylorTile<D>::C, NT = TaylorTile<D>::NT, F = 8 * NT;
    static constexpr int M = TaylorDims<D>::M, MP = TaylorDims<D>::MP;
    static constexpr bool kMma = sizeof(T) == 2;
    static constexpr int kPad = 16 / (int)sizeof(T);  // keeps T rows 16-byte aligned
    static constexpr int LDM = F + 4;                 // sums Sᵀ, f32      [MP][LDM]
    static constexpr int LDC = F + kPad;              // their copy, T     [MP][LDC]
    static constexpr int LDX = D + 4;                 // X, then Z, f32    [C][LDX]
    static constexpr int LDY = MP + kPad;             // Y, then W, T      [C][LDY]
    static constexpr int LDF = F + kPad;              // Φ, then Ψ, T      [C][LDF]
    static constexpr int LDT = F + 4;                 // T = W·S, f32      [C][LDT] (aliases Φ/Ψ)
    static constexpr int kMaster = 0;
    static constexpr int kCopy = kMaster + MP * LDM * 4;
    static constexpr int kX = kCopy + (kMma ? MP * LDC * (int)sizeof(T) : 0);
    static constexpr int kY = kX + C * LDX * 4;
    static constexpr int kFeat = kY + C * LDY * (int)sizeof(T);
    static constexpr int kFeatBytes = C * LDF * (int)sizeof(T) > C * LDT * 4 ? C * LDF * (int)sizeof(T) : C * LDT * 4;
    static constexpr int kDesc = kFeat + kFeatBytes;
    static constexpr int kBytes = kDesc + NT * 16;
    static_assert(NT % 4 == 0 && C % 16 == 0 && D % 16 == 0, "whole mma tiles");
    static_assert(kCopy % 16 == 0 && kX % 16 == 0 && kY % 16 == 0 && kFeat % 16 == 0 && kDesc % 16 == 0,
                  "16-byte aligned regions");
};

// ⌊log2 of the largest x⌋ over the block's threads, clamped to ±100 (0 when every x is 0 or not finite);
// `red` holds one float per warp.
// Ends with a barrier, so `red` may be reused right after.
__device__ __forceinline__ int taylor_block_exponent(float x, float* red, int tid) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    if (tid % 32 == 0) red[tid / 32] = x;
    __syncthreads();
    float mx = red[0];
#pragma unroll
    for (int w = 1; w < kTaylorWarps; ++w) mx = fmaxf(mx, red[w]);
    __syncthreads();
    return mx > 0.f && isfinite(mx) ? max(-100, min(100, ilogbf(mx))) : 0;
}

template <typename T, int D, bool GRAD>
__device__ __forceinline__ void taylor_state(const TaylorParams& tp) {
    using L = TaylorStateSmem<T, D>;
    constexpr int C = L::C, NT = L::NT, F = L::F, M = L::M, MP = L::MP;
    constexpr int MT = C / 16;  // probe (and source) m16 tiles per chunk

    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* sS = reinterpret_cast<float*>(smem_raw + L::kMaster);  // Sᵀ [MP][LDM]
    T* sC = reinterpret_cast<T*>(smem_raw + L::kCopy);            // 2^−e Sᵀ as T (mma)
    float* sX = reinterpret_cast<float*>(smem_raw + L::kX);       // X chunk / Z probes
    T* sY = reinterpret_cast<T*>(smem_raw + L::kY);               // Y chunk / W probes
    T* sF = reinterpret_cast<T*>(smem_raw + L::kFeat);            // Φ / Ψ
    float* sT = reinterpret_cast<float*>(smem_raw + L::kFeat);    // W·S (grad reads)
    FeatureTile* sDesc = reinterpret_cast<FeatureTile*>(smem_raw + L::kDesc);
    __shared__ float s_red[kTaylorWarps];
    if (dynamic_smem_bytes() < (unsigned)L::kBytes) __trap();

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    const int slab = blockIdx.x % tp.n_slabs, split = blockIdx.x / tp.n_slabs;
    const int n_chunks = sw.n_s / C;
    const int c_lo = split * tp.chunks_per_split;
    const int c_hi = min(c_lo + tp.chunks_per_split, n_chunks);
    if (c_lo >= c_hi) return;
    if (sw.first_probe(P, (c_lo + 1) * C) >= sw.n_p) return;  // no probe reads past this split's start

    for (int t = tid; t < NT; t += kTaylorThreads) sDesc[t] = feature_tile(slab * NT + t, D, tp.order);
    for (int idx = tid; idx < MP * L::LDM; idx += kTaylorThreads) sS[idx] = 0.f;
    __syncthreads();

    for (int c = c_lo; c < c_hi; ++c) {
        // ---- fold the sources [c·C, c·C + C) ----
        const int s0 = c * C;
        for (int idx = tid; idx < C * D; idx += kTaylorThreads) {
            const int r = idx / D, d = idx % D;
            sX[r * L::LDX + d] = tp.src_x[sw.src_row(s0 + r) * D + d];
        }
        load_rows_f32<T, C, MP, L::LDY>(sY, tp.src_y, M, C, [&](int r) { return sw.src_row(s0 + r); }, tid);
        __syncthreads();
        // Φ = φ(X)   [C, F]
        for (int idx = tid; idx < C * NT; idx += kTaylorThreads) {
            const int r = idx / NT, t = idx % NT;
            float v[8];
            source_features(v, sDesc[t], sX + r * L::LDX);
            store8<T>(sF + r * L::LDF + 8 * t, v);
        }
        __syncthreads();
        // Sᵀ += Yᵀ Φ   [MP, F]
        if constexpr (L::kMma) {
            constexpr int UNITS = (MP / 16) * (NT / 4);  // (16 columns of y) × (32 features)
            for (int u = warp; u < UNITS; u += kTaylorWarps) {
                const int mv = u % (MP / 16), fq = u / (MP / 16);
                float acc[4][4];
#pragma unroll
                for (int n = 0; n < 4; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
#pragma unroll
                for (int j0 = 0; j0 < C; j0 += 16) {
                    uint32_t a[4];
                    load_a_trans(a, sY, L::LDY, j0, mv * 16, lane);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        uint32_t bf[4];
                        load_b_kn(bf, sF, L::LDF, j0, fq * 32 + h * 16, lane);
                        mma16816<T>(acc[2 * h], a, bf[0], bf[1]);
                        mma16816<T>(acc[2 * h + 1], a, bf[2], bf[3]);
                    }
                }
#pragma unroll
                for (int n = 0; n < 4; ++n)
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        float2* m = reinterpret_cast<float2*>(sS + (mv * 16 + g + 8 * r) * L::LDM + fq * 32 + n * 8 + 2 * t4);
                        float2 x = *m;
                        x.x += acc[n][2 * r];
                        x.y += acc[n][2 * r + 1];
                        *m = x;
                    }
            }
        } else {
            for (int idx = tid; idx < M * (F / 4); idx += kTaylorThreads) {
                const int v = idx / (F / 4), f = 4 * (idx % (F / 4));
                float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
                for (int j = 0; j < C; ++j) {
                    const float y = to_f32(sY[j * L::LDY + v]);
                    const float4 ph = *reinterpret_cast<const float4*>(sF + j * L::LDF + f);
                    acc.x += y * ph.x;
                    acc.y += y * ph.y;
                    acc.z += y * ph.z;
                    acc.w += y * ph.w;
                }
                float4* m = reinterpret_cast<float4*>(sS + v * L::LDM + f);
                float4 x = *m;
                x.x += acc.x;
                x.y += acc.y;
                x.z += acc.z;
                x.w += acc.w;
                *m = x;
            }
        }
        __syncthreads();
        // The copy the reads multiply: 2^−e Sᵀ, the largest |entry| brought into [2^14, 2^15) (exact
        // power-of-two scaling: f16 holds sums of any length and magnitude, small sums keep their digits).
        float up = 1.f;
        if constexpr (L::kMma) {
            float mx = 0.f;
            for (int idx = tid; idx < MP * F; idx += kTaylorThreads) mx = fmaxf(mx, fabsf(sS[(idx / F) * L::LDM + idx % F]));
            const int e = taylor_block_exponent(mx, s_red, tid) - 14;
            up = ldexpf(1.f, e);
            const float down = ldexpf(1.f, -e);
            for (int idx = tid; idx < MP * F; idx += kTaylorThreads) {
                const int v = idx / F, f = idx % F;
                sC[v * L::LDC + f] = from_f32<T>(sS[v * L::LDM + f] * down);
            }
            __syncthreads();
        }

        // ---- read: the probes whose boundary is here (or, at the split's end, beyond) ----
        const int bound = (c + 1) * C;
        const int pa = sw.first_probe(P, bound);
        const int pb = c + 1 < c_hi ? sw.first_probe(P, bound + C) : sw.n_p;
        for (int pt = pa; pt < pb; pt += C) {
            const int np = min(C, pb - pt);
            for (int idx = tid; idx < C * D; idx += kTaylorThreads) {
                const int r = idx / D, d = idx % D;
                sX[r * L::LDX + d] = r < np ? tp.probe_z[sw.probe_row(pt + r) * D + d] : 0.f;
            }
            if constexpr (GRAD)
                load_rows_f32<T, C, MP, L::LDY>(sY, tp.probe_w, M, np, [&](int r) { return sw.probe_row(pt + r); }, tid);
            __syncthreads();
            if constexpr (!GRAD) {
                // Ψ = ψ(Z)   [C, F]
                for (int idx = tid; idx < C * NT; idx += kTaylorThreads) {
                    const int r = idx / NT, t = idx % NT;
                    float v[8];
                    probe_features(v, sDesc[t], sX + r * L::LDX, tp.a0, tp.a1, tp.a2);
                    store8<T>(sF + r * L::LDF + 8 * t, v);
                }
                __syncthreads();
                // O = Ψ S   [C, MP] → out_value
                if constexpr (L::kMma) {
                    constexpr int NVB = MP / 16;
                    constexpr int VS = MT >= kTaylorWarps ? 1 : kTaylorWarps / MT;  // column splits per m-tile
                    constexpr int VB = (NVB + VS - 1) / VS;
                    for (int u = warp; u < MT * VS; u += kTaylorWarps) {
                        const int mt = u % MT, vb0 = (u / MT) * VB;
                        float acc[2 * VB][4];
#pragma unroll
                        for (int n = 0; n < 2 * VB; ++n)
#pragma unroll
                            for (int q = 0; q < 4; ++q) acc[n][q] = 0.f;
#pragma unroll 2
                        for (int k0 = 0; k0 < F; k0 += 16) {
                            uint32_t a[4];
                            load_a(a, sF, L::LDF, mt * 16, k0, lane);
#pragma unroll
                            for (int vb = 0; vb < VB; ++vb) {
                                if (vb0 + vb >= NVB) continue;
                                uint32_t bf[4];
                                load_b_nk(bf, sC, L::LDC, (vb0 + vb) * 16, k0, lane);
                                mma16816<T>(acc[2 * vb], a, bf[0], bf[1]);
                                mma16816<T>(acc[2 * vb + 1], a, bf[2], bf[3]);
                            }
                        }
#pragma unroll
                        for (int n = 0; n < 2 * VB; ++n)
#pragma unroll
                            for (int q = 0; q < 4; ++q) {
                                const int pr = mt * 16 + g + 8 * (q / 2);
                                const int v = (vb0 + n / 2) * 16 + (n % 2) * 8 + 2 * t4 + (q & 1);
                                if (pr < np && v < M)
                                    atomicAdd(tp.out_value + sw.probe_row(pt + pr) * M + v, acc[n][q] * up);
                            }
                    }
                } else {
                    for (int idx = tid; idx < np * M; idx += kTaylorThreads) {
                        const int pr = idx / M, v = idx % M;
                        float s = 0.f;
                        for (int f = 0; f < F; f += 4) {
                            const float4 ps = *reinterpret_cast<const float4*>(sF + pr * L::LDF + f);
                            const float4 ms = *reinterpret_cast<const float4*>(sS + v * L::LDM + f);
                            s += ps.x * ms.x + ps.y * ms.y + ps.z * ms.z + ps.w * ms.w;
                        }
                        atomicAdd(tp.out_value + sw.probe_row(pt + pr) * M + v, s);
                    }
                }
            } else {
                // T = W S   [C, F]: T_pf = S[f]·w_p
                if constexpr (L::kMma) {
                    constexpr int UNITS = MT * (NT / 4);
                    for (int u = warp; u < UNITS; u += kTaylorWarps) {
                        const int mt = u % MT, fq = u / MT;
                        float acc[4][4];
#pragma unroll
                        for (int n = 0; n < 4; ++n)
#pragma unroll
                            for (int q = 0; q < 4; ++q) acc[n][q] = 0.f;
#pragma unroll
                        for (int kv = 0; kv < MP; kv += 16) {
                            uint32_t a[4];
                            load_a(a, sY, L::LDY, mt * 16, kv, lane);
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                uint32_t bf[4];
                                load_b_kn(bf, sC, L::LDC, kv, fq * 32 + h * 16, lane);
                                mma16816<T>(acc[2 * h], a, bf[0], bf[1]);
                                mma16816<T>(acc[2 * h + 1], a, bf[2], bf[3]);
                            }
                        }
#pragma unroll
                        for (int n = 0; n < 4; ++n)
#pragma unroll
                            for (int q = 0; q < 4; ++q) {
                                const int pr = mt * 16 + g + 8 * (q / 2);
                                sT[pr * L::LDT + fq * 32 + n * 8 + 2 * t4 + (q & 1)] = acc[n][q] * up;
                            }
                    }
                } else {
                    for (int idx = tid; idx < np * F; idx += kTaylorThreads) {
                        const int pr = idx / F, f = idx % F;
                        float s = 0.f;
                        for (int v = 0; v < M; ++v) s += to_f32(sY[pr * L::LDY + v]) * sS[v * L::LDM + f];
                        sT[pr * L::LDT + f] = s;
                    }
                }
                __syncthreads();
                // G_pd = Σ_f ∂ψ_f(z_p)/∂z_d T_pf → out_grad
                for (int idx = tid; idx < np * D; idx += kTaylorThreads) {
                    const int pr = idx / D, d = idx % D;
                    const float* z = sX + pr * L::LDX;
                    const float* tr = sT + pr * L::LDT;
                    float gs = 0.f;
                    for (int t = 0; t < NT; ++t) gs += probe_feature_grad(sDesc[t], d, z, tr + 8 * t, tp.a1, tp.a2);
                    atomicAdd(tp.out_grad + sw.probe_row(pt + pr) * D + d, gs);
                }
            }
            __syncthreads();  // Z, W, Ψ or T are rewritten by the next tile or chunk
        }
    }
}

}  // namespace attn
