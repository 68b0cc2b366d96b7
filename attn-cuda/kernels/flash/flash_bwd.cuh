// Backward pass of the flash skeleton (FlashAttention-2), tensor cores, deterministic (no atomics).
// P is recomputed from the saved LSE: P_ij = exp(s_ij − LSE_i); with δ_i = dO_i·o_i (a separate
// row kernel) the gradients are
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − δ),  dQ = scale·dS' K,  dK = scale·dS'ᵀ Q,
// where dS' = dS ∘ (1 − tanh²) under a softcap, and for cosine-sim dS'_ij also carries the
// reciprocal norm of the other side (dq̂ = scale·Σ_j dS_ij k̂_j with k̂_j = rk_j·k_j); the l2-norm's
// own Jacobian is applied afterwards by a row kernel on the f32 dq̂ / dk̂.
// Hyperbolic scores (score.h, lorentz_tile.cuh): dq_i = hyp_grad·[Σ_j w_ij k_j − (Σ_j w_ij k0_j) q_i/q0_i]
// and dk_j = hyp_grad·[Σ_i w_ij q_i − (Σ_i w_ij q0_i) k_j/k0_j] with w = dS·ψ (the time coordinate
// moves with its row: ∂x0/∂x = x/x0); the row sums are reduced in registers and applied in the
// epilogues, reading q (k) from the resident shared tile. The Einstein midpoint adds
// (Σ_i dS_ij)·c γ_j² v_j to dv_j (the gradient through log γ_j), reduced by the dK/dV kernel, which
// owns its key tile over the whole GQA group.
//
// Two kernels, each the sole writer of its outputs:
// - flash_bwd_dq: one block per (b, h, query tile); K/V stream through shared memory. It also
//   writes dS (f32) for the bias gradient when the call has a bias.
// - flash_bwd_dkdv: one block per (b, kv head, key tile, column split); it loops over every query
//   head of its GQA group and every query tile that can see its keys, so dK and dV of a kv head
//   are summed over the group inside one block.
#pragma once
#include "../common/loads.h"
#include "../common/mask.h"
#include "../common/online_softmax.h"
#include "score.h"
#include "../hyperbolic/lorentz_tile.cuh"
#include "../common/tiles.h"

namespace attn {

template <int NT, int DT>
__device__ __forceinline__ void zero(float (&a)[NT][DT]) {
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int j = 0; j < DT; ++j) a[i][j] = 0.f;
}

// LSE in log2 units, +∞ for rows that must get P = 0 (past the sequence, or with no allowed key).
// TaylorScore: 1/den instead (the statistic is den), 0 for those rows.
template <class Score>
__device__ __forceinline__ float lse_log2(const AttnParams& p, const SeqInfo& si, int h, int i) {
    if (Score::kPoly) {
        const float den = i < si.len_q ? p.lse[si.stats_index(p, h, i)] : 0.f;
        return den > 0.f ? 1.f / den : 0.f;
    }
    if (i >= si.len_q) return CUDART_INF_F;
    const float lse = p.lse[si.stats_index(p, h, i)];
    return lse == -CUDART_INF_F ? CUDART_INF_F : lse * kLog2e;
}

// Per-row state of a query tile (dQ kernels): row index, allowed key range, LSE (log2 units, less a
// hyperbolic score's constant), δ, and rq = 1/‖q‖ (cosine) or q0 (hyperbolic), cq = scale·log2 e·rq.
template <class Score, int D, int MT>
__device__ __forceinline__ void bwd_q_rows(const AttnParams& p, const SeqInfo& si, int h, int i0, int wrow, int g,
                                           bool norms, int (&row)[MT][2], int (&lo)[MT][2], int (&hi)[MT][2],
                                           float (&lse2)[MT][2], float (&delta)[MT][2], float (&rq)[MT][2],
                                           float (&cq)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int i = i0 + wrow + mt * 16 + g + 8 * r;
            const bool valid = i < si.len_q;
            row[mt][r] = i;
            lo[mt][r] = valid ? si.key_lo(p, i) : 0;
            hi[mt][r] = valid ? si.key_hi(p, i) : 0;
            lse2[mt][r] = lse_log2<Score>(p, si, h, i);
            delta[mt][r] = valid ? p.delta[si.stats_index(p, h, i)] : 0.f;
            rq[mt][r] = norms && valid ? p.rq[si.dq_off(p, i, h) / D] : 1.f;
            cq[mt][r] = p.scale * kLog2e * rq[mt][r];
            if constexpr (Score::kLorentz) {  // rq: q0; LSE less the score's constant
                rq[mt][r] = valid ? p.x0q[si.stats_index(p, h, i)] : 1.f;
                lse2[mt][r] -= p.hyp_lse * kLog2e;
            }
        }
}

// Per-key state of a key tile (dK/dV kernels): key index, rk = 1/‖k‖ (cosine) or k0 (hyperbolic),
// log γ_j (Einstein midpoint), and the hyperbolic row sums zeroed.
template <class Score, int D, int MT>
__device__ __forceinline__ void bwd_k_rows(const AttnParams& p, const SeqInfo& si, int hk, int j0, int g, bool norms,
                                           bool midpoint, int (&key)[MT][2], float (&rk)[MT][2], float (&lg)[MT][2],
                                           float (&bsum)[MT][2], float (&csum)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            key[mt][r] = j0 + mt * 16 + g + 8 * r;
            rk[mt][r] = norms && key[mt][r] < si.len_k ? p.rk[si.dk_off(p, key[mt][r], hk) / D] : 1.f;
            lg[mt][r] = bsum[mt][r] = csum[mt][r] = 0.f;
            if constexpr (Score::kLorentz) {  // rk: k0
                const bool valid = key[mt][r] < si.len_k;
                const long long at = si.key_index(p, hk, key[mt][r]);
                rk[mt][r] = valid ? p.x0k[at] : 1.f;
                if (midpoint && valid) lg[mt][r] = p.lgk[at];
            }
        }
}

// dQ kernels, one key block at j0 (`full`: no element of the tile is masked): s holds S = QKᵀ, dp
// holds dP = dO Vᵀ; on return s holds dS' (P = exp(s − LSE), dS = P ∘ (dP − δ), times the softcap's
// tanh' and, for cosine-sim, the key's reciprocal norm; TaylorScore: dS = f'(s)/den ∘ (dP − δ), lse2
// holding 1/den). Hyperbolic scores: lorentz_dq_tile. Fast path (no mask, bias, softcap or bias
// gradient in the tile): one FMA and one exp2 per element (TaylorScore: one FMA). sRk, sK0, sLg: the
// block's 1/‖k‖, k0 and log γ in shared memory.
template <typename T, class Score, int MT, int NT, bool kLorentzRowSum = true>
__device__ __forceinline__ void dq_block_ds(const AttnParams& p, const SeqInfo& si, int h, int j0, bool full,
                                            bool norms, float (&s)[MT][NT][4], const float (&dp)[MT][NT][4],
                                            float (&a)[MT][2], const float (&rq)[MT][2], const float (&cq)[MT][2],
                                            const float (&lse2)[MT][2], const float (&delta)[MT][2],
                                            const int (&row)[MT][2], const int (&lo)[MT][2], const int (&hi)[MT][2],
                                            const float* sRk, const float* sK0, const float* sLg, int t4) {
    const bool fast = full && p.bias == nullptr && !(Score::kSoftcap && p.softcap > 0.f);
    if constexpr (Score::kLorentz) {
        lorentz_variant<Score>(p, fast, [&](auto mid, auto recip, auto fc) {
            lorentz_dq_tile<Score, decltype(mid)::value, T, MT, NT, decltype(recip)::value, decltype(fc)::value,
                            kLorentzRowSum>(p, si, h, j0, full, s, dp, a, rq, lse2, delta, row, lo, hi, sK0, sLg, t4);
        });
    } else if (Score::kPoly && fast && !norms) {  // dS = f'(s)/den ∘ (dP − δ); lse2 holds 1/den
        const Poly f(p);
        // f'(x)/den = c1 + c2 s per row (x = scale·rq·s): one FMA, then one FADD and one FMUL.
        float c1[MT][2], c2[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                c1[mt][r] = f.a1 * lse2[mt][r];
                c2[mt][r] = f.a2x2 * p.scale * rq[mt][r] * lse2[mt][r];
            }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e / 2;
                    const float g = fmaf(c2[mt][r], s[mt][nt][e], c1[mt][r]);
                    s[mt][nt][e] = g * (dp[mt][nt][e] - delta[mt][r]);
                }
    } else if (fast && !Score::kPoly) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            // This thread's two columns of the n8 tile: one 8-byte load of their 1/‖k‖ for all rows.
            const float2 rk2 = norms ? *reinterpret_cast<const float2*>(sRk + nt * 8 + 2 * t4) : make_float2(1.f, 1.f);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e / 2;
                    const float rk = (e & 1) ? rk2.y : rk2.x;
                    const float pr = exp2_fast(fmaf(s[mt][nt][e] * rk, cq[mt][r], -lse2[mt][r]));
                    s[mt][nt][e] = pr * (dp[mt][nt][e] - delta[mt][r]) * rk;
                }
        }
    } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e / 2;
                    const int cl = nt * 8 + 2 * t4 + (e & 1);
                    const int col = j0 + cl;
                    const bool allowed = full || (col >= lo[mt][r] && col < hi[mt][r]);
                    const float rk = norms ? sRk[cl] : 1.f;
                    float dtanh;
                    float x = score<Score>(p, s[mt][nt][e], rq[mt][r], rk, dtanh);
                    if (allowed && p.bias != nullptr)
                        x += to_f32(static_cast<const T*>(p.bias)[si.bias_index(p, h, row[mt][r], col)]);
                    // dS's weight: P, or TaylorScore's f'(s)/den.
                    float w = 0.f;
                    if (allowed) w = Score::kPoly ? Poly(p).df(x) * lse2[mt][r] : exp2_fast(x * kLog2e - lse2[mt][r]);
                    const float ds = w * (dp[mt][nt][e] - delta[mt][r]);
                    if (allowed && p.ds != nullptr) p.ds[si.ds_index(p, h, row[mt][r], col)] = ds;
                    s[mt][nt][e] = ds * dtanh * rk;
                }
    }
}

// The fast path of a dK/dV block (softmax, cosine-sim): no mask element inside the tile, no bias, no
// softcap. Its two halves are separate so that the Hopper kernel can form Pᵀ while dPᵀ is still on the
// tensor cores, and dS'ᵀ while dV's product runs.
template <class Score>
__device__ __forceinline__ bool dkdv_fast(const AttnParams& p, bool full) {
    return full && p.bias == nullptr && !(Score::kSoftcap && p.softcap > 0.f);
}

// st: Sᵀ → Pᵀ = exp2(s·scale·log2 e (cosine: ·rq_i·rk_j) − LSE_i).
template <int MT, int QT>
__device__ __forceinline__ void dkdv_fast_p(const AttnParams& p, bool norms, float (&st)[MT][QT][4],
                                            const float (&rk)[MT][2], const float* sRq, const float* sLse, int t4) {
    const float c0 = p.scale * kLog2e;
    float ck[MT][2];  // c0 times the key's 1/‖k‖
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ck[mt][0] = c0 * rk[mt][0], ck[mt][1] = c0 * rk[mt][1];
#pragma unroll
    for (int qt = 0; qt < QT; ++qt) {
        // This thread's two query columns: one 8-byte load each of 1/‖q‖ and the LSE.
        const float2 rq2 = norms ? *reinterpret_cast<const float2*>(sRq + qt * 8 + 2 * t4) : make_float2(1.f, 1.f);
        const float2 lse2 = *reinterpret_cast<const float2*>(sLse + qt * 8 + 2 * t4);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float f = norms ? ck[mt][e / 2] * ((e & 1) ? rq2.y : rq2.x) : c0;
                st[mt][qt][e] = exp2_fast(fmaf(st[mt][qt][e], f, -((e & 1) ? lse2.y : lse2.x)));
            }
    }
}

// dpt: dPᵀ → dS'ᵀ = Pᵀ ∘ (dPᵀ − δ_i) (cosine: ·rq_i), with st holding Pᵀ.
template <int MT, int QT>
__device__ __forceinline__ void dkdv_fast_ds(bool norms, const float (&st)[MT][QT][4], float (&dpt)[MT][QT][4],
                                             const float* sRq, const float* sDelta, int t4) {
#pragma unroll
    for (int qt = 0; qt < QT; ++qt) {
        const float2 rq2 = norms ? *reinterpret_cast<const float2*>(sRq + qt * 8 + 2 * t4) : make_float2(1.f, 1.f);
        const float2 d2 = *reinterpret_cast<const float2*>(sDelta + qt * 8 + 2 * t4);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float ds = st[mt][qt][e] * (dpt[mt][qt][e] - ((e & 1) ? d2.y : d2.x));
                dpt[mt][qt][e] = norms ? ds * ((e & 1) ? rq2.y : rq2.x) : ds;
            }
    }
}

// dK/dV kernels, one streamed query block of 8·QT queries at i0 (query head h): st holds Sᵀ = K Qᵀ,
// dpt holds dPᵀ = V dOᵀ (rows: this thread's keys); on return st holds Pᵀ and dpt holds dS'ᵀ.
// Hyperbolic scores: lorentz_dkdv_tile. sRq, sLse, sDelta: the query block's 1/‖q‖ (hyperbolic: q0),
// LSE (log2 units; TaylorScore: 1/den) and δ in shared memory.
template <typename T, class Score, int MT, int QT, bool kLorentzRowSum = true>
__device__ __forceinline__ void dkdv_block_pds(const AttnParams& p, const SeqInfo& si, int h, int i0, bool full,
                                               bool norms, float (&st)[MT][QT][4], float (&dpt)[MT][QT][4],
                                               float (&bsum)[MT][2], float (&csum)[MT][2], const float (&rk)[MT][2],
                                               const float (&lg)[MT][2], const int (&key)[MT][2], const float* sRq,
                                               const float* sLse, const float* sDelta, int t4) {
    const bool fast = dkdv_fast<Score>(p, full);
    if constexpr (Score::kLorentz) {
        lorentz_variant<Score>(p, fast, [&](auto mid, auto recip, auto fc) {
            lorentz_dkdv_tile<Score, decltype(mid)::value, T, MT, QT, decltype(recip)::value, decltype(fc)::value,
                              kLorentzRowSum>(p, si, h, i0, full, st, dpt, bsum, csum, rk, lg, key, sRq, sLse, sDelta,
                                              t4);
        });
    } else if (Score::kPoly && fast && !norms) {  // sLse holds 1/den
        const Poly f(p);
        // Pᵀ = (a0 + s (A1 + A2 s))/den and dS'ᵀ = (a1 + B2 s)(dP/den − δ/den), with A1 = a1·scale,
        // A2 = a2·scale², B2 = 2 a2·scale (the Hopper kernels' rows are q̂, k̂ or raw: no norms).
        const float A1 = f.a1 * p.scale, A2 = f.a2 * p.scale * p.scale, B2 = f.a2x2 * p.scale;
#pragma unroll
        for (int qt = 0; qt < QT; ++qt) {
            const float2 inv2 = *reinterpret_cast<const float2*>(sLse + qt * 8 + 2 * t4);
            const float2 d2 = *reinterpret_cast<const float2*>(sDelta + qt * 8 + 2 * t4);
            const float nd0 = -d2.x * inv2.x, nd1 = -d2.y * inv2.y;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float x = st[mt][qt][e];
                    const float inv = (e & 1) ? inv2.y : inv2.x;
                    st[mt][qt][e] = fmaf(fmaf(A2, x, A1), x, f.a0) * inv;
                    dpt[mt][qt][e] = fmaf(B2, x, f.a1) * fmaf(dpt[mt][qt][e], inv, (e & 1) ? nd1 : nd0);
                }
        }
    } else if (fast && !Score::kPoly) {
        dkdv_fast_p<MT, QT>(p, norms, st, rk, sRq, sLse, t4);
        dkdv_fast_ds<MT, QT>(norms, st, dpt, sRq, sDelta, t4);
    } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int qt = 0; qt < QT; ++qt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e / 2;
                    const int cl = qt * 8 + 2 * t4 + (e & 1);
                    const int i = i0 + cl;
                    const int j = key[mt][r];
                    const bool allowed =
                        full || (i < si.len_q && j < si.len_k && j >= si.key_lo(p, i) && j < si.key_hi(p, i));
                    const float rqi = sRq[cl];
                    float dtanh;
                    float x = score<Score>(p, st[mt][qt][e], rqi, rk[mt][r], dtanh);
                    if (allowed && p.bias != nullptr)
                        x += to_f32(static_cast<const T*>(p.bias)[si.bias_index(p, h, i, j)]);
                    // P, and dS's weight: P itself, or TaylorScore's f(s)/den and f'(s)/den.
                    float pr = 0.f, w = 0.f;
                    if (allowed && Score::kPoly) {
                        const Poly f(p);
                        pr = f.f(x) * sLse[cl];
                        w = f.df(x) * sLse[cl];
                    } else if (allowed) {
                        pr = w = exp2_fast(x * kLog2e - sLse[cl]);
                    }
                    const float ds = w * (dpt[mt][qt][e] - sDelta[cl]);
                    st[mt][qt][e] = pr;
                    dpt[mt][qt][e] = ds * dtanh * rqi;
                }
    }
}

// dq = scale · acc for this thread's rows (cosine-sim: dq̂ in f32, projected through the l2-norm by a
// row kernel).
template <typename T, int MT, int DT>
__device__ __forceinline__ void dq_store(const AttnParams& p, const SeqInfo& si, int h, const float (&acc)[MT][DT][4],
                                         const int (&row)[MT][2], bool norms, int t4) {
    using V2 = typename Vec2<T>::type;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (row[mt][r] >= si.len_q) continue;
            const long long off = si.dq_off(p, row[mt][r], h);
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                const float x0 = acc[mt][dt][2 * r] * p.scale, x1 = acc[mt][dt][2 * r + 1] * p.scale;
                const int col = dt * 8 + 2 * t4;
                if (norms) {
                    *reinterpret_cast<float2*>(p.dq_acc + off + col) = make_float2(x0, x1);
                } else {
                    const uint32_t packed = pack2<T>(x0, x1);
                    *reinterpret_cast<V2*>(static_cast<T*>(p.dq) + off + col) = *reinterpret_cast<const V2*>(&packed);
                }
            }
        }
}

// dv = acc_dv, dk = scale · acc_dk for columns [d0, d0 + 8·AT) of this thread's keys. Padded keys
// (rows dk holds past len_k) get the zeros they hold. Cosine-sim (norms): dk̂ goes through the
// l2-norm, dk = (dk̂ − k̂ (k̂·dk̂))·r with r = 1/max(‖k‖, eps) (dk̂·r where ‖k‖ ≤ eps, r = 1/eps):
//   kProject (the Hopper kernels, whose four lanes of a quad hold a key's whole row: d0 = 0, 8·AT = D):
//     here, with k̂ the normalised copy the kernel read (p.k) and r from the inv-norm row kernel;
//   otherwise (the mma.sync kernel, which may split the columns): dk̂ in f32 into p.dk_acc, projected
//     by the l2norm_bwd_k row kernel.
template <typename T, int MT, int AT, bool kProject = false>
__device__ __forceinline__ void dkdv_store(const AttnParams& p, const SeqInfo& si, int hk, int d0,
                                           const float (&acc_dk)[MT][AT][4], const float (&acc_dv)[MT][AT][4],
                                           const int (&key)[MT][2], bool norms, int t4) {
    using V2 = typename Vec2<T>::type;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const bool valid = key[mt][r] < si.key_rows(p);
            const long long offk = valid ? si.dk_off(p, key[mt][r], hk) + d0 : 0;
            const T* kh = static_cast<const T*>(p.k) + (valid ? si.k_off(p, key[mt][r], hk) : 0);
            // Cosine-sim here: k̂·dk̂ over the quad (every lane of the warp takes part in the shuffles).
            float kd = 0.f, rk = 1.f;
            if (kProject && norms) {
                if (valid) {
#pragma unroll
                    for (int at = 0; at < AT; ++at) {
                        const V2 k2 = *reinterpret_cast<const V2*>(kh + at * 8 + 2 * t4);
                        kd = fmaf(to_f32(k2.x), acc_dk[mt][at][2 * r], kd);
                        kd = fmaf(to_f32(k2.y), acc_dk[mt][at][2 * r + 1], kd);
                    }
                    rk = p.rk[offk / p.head_dim];
                }
                kd = quad_sum(kd) * p.scale;
            }
            if (!valid) continue;
            const long long offv = si.dv_off(p, key[mt][r], hk) + d0;
            // ‖k‖ > eps: the projection; else dk̂/eps (rk = 1/eps).
            const bool project = rk * p.eps < 1.f;
#pragma unroll
            for (int at = 0; at < AT; ++at) {
                const int col = at * 8 + 2 * t4;
                const uint32_t pv = pack2<T>(acc_dv[mt][at][2 * r], acc_dv[mt][at][2 * r + 1]);
                *reinterpret_cast<V2*>(static_cast<T*>(p.dv) + offv + col) = *reinterpret_cast<const V2*>(&pv);
                float x0 = acc_dk[mt][at][2 * r] * p.scale, x1 = acc_dk[mt][at][2 * r + 1] * p.scale;
                if (norms && !kProject) {
                    *reinterpret_cast<float2*>(p.dk_acc + offk + col) = make_float2(x0, x1);
                    continue;
                }
                if (kProject && norms) {
                    if (project) {
                        const V2 k2 = *reinterpret_cast<const V2*>(kh + col);  // L1 hit: read above
                        x0 = fmaf(-to_f32(k2.x), kd, x0);
                        x1 = fmaf(-to_f32(k2.y), kd, x1);
                    }
                    x0 *= rk;
                    x1 *= rk;
                }
                const uint32_t pk = pack2<T>(x0, x1);
                *reinterpret_cast<V2*>(static_cast<T*>(p.dk) + offk + col) = *reinterpret_cast<const V2*>(&pk);
            }
        }
}

template <typename T, int D, class Score>
__device__ __forceinline__ void flash_bwd_dq(const AttnParams& p) {
    using Tile = DqTileOf<Score, D>;
    constexpr int MT = Tile::MT, BM = Tile::BM, BN = Tile::BN;
    constexpr int ld = SmemRow<D>::ld;
    constexpr int NT = BN / 8, DT = D / 8;
    static_assert(BM == 16 * MT * kWarps, "MT 16-row mma tiles per warp");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sQ = reinterpret_cast<T*>(smem_raw);  // [BM][ld]
    T* sdO = sQ + BM * ld;                   // [BM][ld]
    T* sK = sdO + BM * ld;                   // [2][BN][ld]
    T* sV = sK + 2 * BN * ld;                // [2][BN][ld]
    float* sRk = reinterpret_cast<float*>(sV + 2 * BN * ld);  // [2][BN]
    float* sK0 = sRk;                                          // [2][BN] hyperbolic: k0
    float* sLg = sRk + 2 * BN;                                 // [2][BN] hyperbolic midpoint: log γ_j

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int b, h;
    const int m_block = grid_tile<true>(p, b, h);
    const SeqInfo si(p, b);
    int i0, hk, n_first, n_count;
    if (!query_tile_at<BM, BN>(p, si, h, m_block, i0, hk, n_first, n_count)) return;
    const bool norms = Score::kNorms && p.l2norm;
    constexpr bool kHyp = Score::kLorentz;
    const bool midpoint = kHyp && p.midpoint;

    const T* q = static_cast<const T*>(p.q) + si.q_off(p, 0, h);
    const T* d_o = static_cast<const T*>(p.d_o) + si.o_off(p, 0, h);
    const T* k = static_cast<const T*>(p.k) + si.k_off(p, 0, hk);
    const T* v = static_cast<const T*>(p.v) + si.v_off(p, 0, hk);

    auto load_kv = [&](int n, int buf) {
        load_tile_async<T, BN, D, kThreads>(sK + buf * BN * ld, k, p.k_seq, n * BN, si.len_k, tid);
        load_tile_async<T, BN, D, kThreads>(sV + buf * BN * ld, v, p.v_seq, n * BN, si.len_k, tid);
        if (norms && tid < BN) {
            const int j = n * BN + tid;
            sRk[buf * BN + tid] = j < si.len_k ? p.rk[si.dk_off(p, j, hk) / D] : 0.f;
        }
        if (kHyp && tid < BN) {
            const int j = n * BN + tid;
            const bool valid = j < si.len_k;
            const long long at = valid ? si.key_index(p, hk, j) : 0;
            cp_async_4(sK0 + buf * BN + tid, p.x0k + at, valid);
            if (midpoint) cp_async_4(sLg + buf * BN + tid, p.lgk + at, valid);
        }
    };
    load_tile_async<T, BM, D, kThreads>(sQ, q, p.q_seq, i0, si.len_q, tid);
    load_tile_async<T, BM, D, kThreads>(sdO, d_o, p.o_seq, i0, si.len_q, tid);
    if (n_count > 0) load_kv(n_first, 0);
    cp_async_commit();

    const int g = lane / 4, t4 = lane % 4;
    const int wrow = warp * 16 * MT;
    int row[MT][2], lo[MT][2], hi[MT][2];
    float lse2[MT][2], delta[MT][2], rq[MT][2], cq[MT][2];  // cq: scale·log2 e·rq (fast path)
    bwd_q_rows<Score, D, MT>(p, si, h, i0, wrow, g, norms, row, lo, hi, lse2, delta, rq, cq);
    float acc_dq[MT][DT][4];
    float a[MT][2];  // hyperbolic: Σ_j w_ij k0_j, thread-partial
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        zero(acc_dq[mt]);
        a[mt][0] = a[mt][1] = 0.f;
    }

    for (int it = 0; it < n_count; ++it) {
        const int n = n_first + it, buf = it & 1;
        const T* sKb = sK + buf * BN * ld;
        const T* sVb = sV + buf * BN * ld;
        cp_async_wait<0>();
        __syncthreads();  // block it's tiles have landed; every warp is done with block it − 1's buffers
        if (it + 1 < n_count) load_kv(n + 1, buf ^ 1);
        cp_async_commit();

        // S = Q Kᵀ and dP = dO Vᵀ   [16·MT, BN] per warp
        float s[MT][NT][4], dp[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            zero(s[mt]);
            zero(dp[mt]);
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t aq[MT][4], ado[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                load_a(aq[mt], sQ, ld, wrow + mt * 16, kk * 16, lane);
                load_a(ado[mt], sdO, ld, wrow + mt * 16, kk * 16, lane);
            }
#pragma unroll
            for (int nn = 0; nn < BN / 16; ++nn) {
                uint32_t bk[4], bv[4];
                load_b_nk(bk, sKb, ld, nn * 16, kk * 16, lane);
                load_b_nk(bv, sVb, ld, nn * 16, kk * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816<T>(s[mt][2 * nn], aq[mt], bk[0], bk[1]);
                    mma16816<T>(s[mt][2 * nn + 1], aq[mt], bk[2], bk[3]);
                    mma16816<T>(dp[mt][2 * nn], ado[mt], bv[0], bv[1]);
                    mma16816<T>(dp[mt][2 * nn + 1], ado[mt], bv[2], bv[3]);
                }
            }
        }

        const int j0 = n * BN;
        dq_block_ds<T, Score, MT, NT>(p, si, h, j0, si.tile_full(p, i0, i0 + BM, j0, j0 + BN), norms, s, dp, a, rq, cq,
                                      lse2, delta, row, lo, hi, sRk + buf * BN, sK0 + buf * BN, sLg + buf * BN, t4);

        // dQ += dS' K   [16·MT, D] per warp
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) pack_a<T>(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
            for (int dd = 0; dd < D / 16; ++dd) {
                uint32_t bf[4];
                load_b_kn(bf, sKb, ld, kk * 16, dd * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816<T>(acc_dq[mt][2 * dd], a[mt], bf[0], bf[1]);
                    mma16816<T>(acc_dq[mt][2 * dd + 1], a[mt], bf[2], bf[3]);
                }
            }
        }
    }
    cp_async_wait<0>();

    if constexpr (kHyp)
        lorentz_dq_epilogue<T, MT, DT>(p, si, h, acc_dq, a, rq, row, [&](int r, int c) { return to_f32(sQ[r * ld + c]); },
                                       wrow, lane);
    else
        dq_store<T, MT, DT>(p, si, h, acc_dq, row, norms, t4);
}

template <typename T, int D, class Score>
__device__ __forceinline__ void flash_bwd_dkdv(const AttnParams& p) {
    using Tile = DkvTileOf<Score, D>;
    constexpr int MT = Tile::MT, BN = Tile::BN, BM = Tile::BM, DA = Tile::DA;
    constexpr int ld = SmemRow<D>::ld;
    constexpr int QT = BM / 8;   // n8 tiles of Sᵀ per 16-key tile (queries)
    constexpr int AT = DA / 8;   // n8 tiles of the dK, dV accumulators
    constexpr int kSplits = D / DA;
    static_assert(BN == 16 * MT * kWarps, "MT 16-key mma tiles per warp");
    static_assert(D % DA == 0 && DA % 16 == 0 && BM % 16 == 0, "whole k16 steps");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sK = reinterpret_cast<T*>(smem_raw);  // [BN][ld]
    T* sV = sK + BN * ld;                    // [BN][ld]
    T* sQ = sV + BN * ld;                    // [2][BM][ld]
    T* sdO = sQ + 2 * BM * ld;               // [2][BM][ld]
    float* sLse = reinterpret_cast<float*>(sdO + 2 * BM * ld);  // [2][BM] log2 units
    float* sDelta = sLse + 2 * BM;                              // [2][BM]
    float* sRq = sDelta + 2 * BM;                               // [2][BM] (hyperbolic: q0)

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int b, hk;
    const int split_tile = grid_tile<false>(p, b, hk);
    const int n_block = split_tile / kSplits, d0 = (split_tile % kSplits) * DA;
    const SeqInfo si(p, b);
    const int j0 = n_block * BN;
    if (j0 >= si.key_rows(p)) return;
    int m_first, m_count;
    key_tile_query_blocks<BM, BN>(p, si, j0, m_first, m_count);
    const int iters = j0 < si.len_k ? m_count * p.group : 0;  // padded keys: zero gradients
    const bool norms = Score::kNorms && p.l2norm;
    constexpr bool kHyp = Score::kLorentz;
    const bool midpoint = kHyp && p.midpoint;

    const T* k = static_cast<const T*>(p.k) + si.k_off(p, 0, hk);
    const T* v = static_cast<const T*>(p.v) + si.v_off(p, 0, hk);
    load_tile_async<T, BN, D, kThreads>(sK, k, p.k_seq, j0, si.len_k, tid);
    load_tile_async<T, BN, D, kThreads>(sV, v, p.v_seq, j0, si.len_k, tid);

    auto load_q = [&](int it, int buf) {
        const int h = hk * p.group + it / m_count;
        const int i0 = (m_first + it % m_count) * BM;
        load_tile_async<T, BM, D, kThreads>(sQ + buf * BM * ld, static_cast<const T*>(p.q) + si.q_off(p, 0, h), p.q_seq,
                                            i0, si.len_q, tid);
        load_tile_async<T, BM, D, kThreads>(sdO + buf * BM * ld, static_cast<const T*>(p.d_o) + si.o_off(p, 0, h),
                                            p.o_seq, i0, si.len_q, tid);
        if (tid < BM) {
            const int i = i0 + tid;
            const bool valid = i < si.len_q;
            sLse[buf * BM + tid] = lse_log2<Score>(p, si, h, i);
            sDelta[buf * BM + tid] = valid ? p.delta[si.stats_index(p, h, i)] : 0.f;
            sRq[buf * BM + tid] = norms && valid ? p.rq[si.dq_off(p, i, h) / D] : 1.f;
            if constexpr (kHyp) {
                sLse[buf * BM + tid] -= p.hyp_lse * kLog2e;
                sRq[buf * BM + tid] = valid ? p.x0q[si.stats_index(p, h, i)] : 1.f;
            }
        }
    };
    if (iters > 0) load_q(0, 0);
    cp_async_commit();

    const int g = lane / 4, t4 = lane % 4;
    const int wrow = warp * 16 * MT;
    int key[MT][2];
    float rk[MT][2];
    float lg[MT][2], bsum[MT][2], csum[MT][2];  // hyperbolic: log γ_j, Σ_i w_ij q0_i, Σ_i dS_ij
    bwd_k_rows<Score, D, MT>(p, si, hk, j0 + wrow, g, norms, midpoint, key, rk, lg, bsum, csum);
    float acc_dk[MT][AT][4], acc_dv[MT][AT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        zero(acc_dk[mt]);
        zero(acc_dv[mt]);
    }

    for (int it = 0; it < iters; ++it) {
        const int buf = it & 1;
        const int h = hk * p.group + it / m_count;
        const int i0 = (m_first + it % m_count) * BM;
        const T* sQb = sQ + buf * BM * ld;
        const T* sdOb = sdO + buf * BM * ld;
        cp_async_wait<0>();
        __syncthreads();  // block it's tiles have landed; every warp is done with block it − 1's buffers
        if (it + 1 < iters) load_q(it + 1, buf ^ 1);
        cp_async_commit();

        // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ   [16·MT keys, BM queries] per warp
        float st[MT][QT][4], dpt[MT][QT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            zero(st[mt]);
            zero(dpt[mt]);
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t ak[MT][4], av[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                load_a(ak[mt], sK, ld, wrow + mt * 16, kk * 16, lane);
                load_a(av[mt], sV, ld, wrow + mt * 16, kk * 16, lane);
            }
#pragma unroll
            for (int mm = 0; mm < BM / 16; ++mm) {
                uint32_t bq[4], bo[4];
                load_b_nk(bq, sQb, ld, mm * 16, kk * 16, lane);
                load_b_nk(bo, sdOb, ld, mm * 16, kk * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816<T>(st[mt][2 * mm], ak[mt], bq[0], bq[1]);
                    mma16816<T>(st[mt][2 * mm + 1], ak[mt], bq[2], bq[3]);
                    mma16816<T>(dpt[mt][2 * mm], av[mt], bo[0], bo[1]);
                    mma16816<T>(dpt[mt][2 * mm + 1], av[mt], bo[2], bo[3]);
                }
            }
        }

        dkdv_block_pds<T, Score, MT, QT>(p, si, h, i0, si.tile_full(p, i0, i0 + BM, j0, j0 + BN), norms, st, dpt, bsum,
                                         csum, rk, lg, key, sRq + buf * BM, sLse + buf * BM, sDelta + buf * BM, t4);

        // dV += Pᵀ dO and dK += dS'ᵀ Q   [16·MT keys, DA] per warp
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
            uint32_t ap[MT][4], ads[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                pack_a<T>(ap[mt], st[mt][2 * kk], st[mt][2 * kk + 1]);
                pack_a<T>(ads[mt], dpt[mt][2 * kk], dpt[mt][2 * kk + 1]);
            }
#pragma unroll
            for (int dd = 0; dd < DA / 16; ++dd) {
                uint32_t bo[4], bq[4];
                load_b_kn(bo, sdOb, ld, kk * 16, d0 + dd * 16, lane);
                load_b_kn(bq, sQb, ld, kk * 16, d0 + dd * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816<T>(acc_dv[mt][2 * dd], ap[mt], bo[0], bo[1]);
                    mma16816<T>(acc_dv[mt][2 * dd + 1], ap[mt], bo[2], bo[3]);
                    mma16816<T>(acc_dk[mt][2 * dd], ads[mt], bq[0], bq[1]);
                    mma16816<T>(acc_dk[mt][2 * dd + 1], ads[mt], bq[2], bq[3]);
                }
            }
        }
    }
    cp_async_wait<0>();

    if constexpr (kHyp)
        lorentz_dkdv_epilogue<T, MT, AT>(
            p, si, hk, d0, acc_dk, acc_dv, bsum, csum, rk, key, [&](int r, int c) { return to_f32(sK[r * ld + c]); },
            [&](int r, int c) { return to_f32(sV[r * ld + c]); }, wrow, lane, midpoint);
    else
        dkdv_store<T, MT, AT>(p, si, hk, d0, acc_dk, acc_dv, key, norms, t4);
}

}  // namespace attn
