// The hooks of softmax, cosine-sim and Taylor on the flash skeleton (score.h's FlashOps, the default of
// LorentzOps): per-row and per-key scalars, the forward's scores and online-softmax step of one key block,
// the backward's dS' of one tile, the statistic and the epilogues. Each hook is the code of these
// families only; the skeletons call them through `Score::Ops`.
#pragma once
#include "../common/loads.h"
#include "../common/mask.h"
#include "../common/mma.h"
#include "../common/online_softmax.h"
#include "score.h"

namespace attn {

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

template <class Score>
struct FlashOps {
    // Cosine-sim with fused norms: 1/‖q‖, 1/‖k‖ scale the raw products.
    __device__ __forceinline__ static bool norms(const AttnParams& p) { return Score::kNorms && p.l2norm; }
    // The Einstein midpoint's per-key log γ_j (hyperbolic scores only).
    __device__ __forceinline__ static bool midpoint(const AttnParams&) { return false; }
    // The output accumulator is rescaled by α after each key block (a running max).
    __device__ __forceinline__ static bool rescales(const AttnParams& p) { return !Score::kPoly && p.running_max; }
    // Per-key scalars (beside 1/‖k‖) that the warp-specialised forward's consumers read and release.
    static constexpr bool kKeyCols = false;
    // Per-row scalars from the row kernels (q0, k0) and the row sums of their gradients.
    static constexpr bool kRowSums = false;
    // The wgmma dK/dV kernels exist for the score (Taylor has the warp-specialised ones only).
    static constexpr bool kWgDkdv = !Score::kPoly;
    // The time-coordinate panels of the tensor-core products (hyperbolic on bf16): none.
    template <typename T>
    __host__ __device__ static constexpr bool tc_k0() { return false; }
    template <typename T, int D>
    __host__ __device__ static constexpr bool tc_rowsum() { return false; }
    // The warp-specialised dK/dV kernel's own split fast tile (squared Lorentz): none.
    template <int D, bool kEven>
    __host__ __device__ static constexpr bool ws_split_own() { return false; }
    // The warp-specialised dK/dV kernel forms each k16 step's descriptor in full: no.
    template <int D, bool kDq>
    __host__ __device__ static constexpr bool full_descs() { return false; }
    // The warp-specialised dK/dV kernel's split fast tile (Pᵀ while dPᵀ runs): every fast tile but
    // Taylor's (whose f and f' both need Sᵀ); no per-key midpoint term.
    template <int D, bool kEven>
    __device__ __forceinline__ static bool ws_split(const AttnParams& p, bool full) {
        return !Score::kPoly && dkdv_fast<Score>(p, full);
    }
    template <int D, bool kEven>
    __device__ __forceinline__ static bool ws_split_mid(const AttnParams&) { return false; }
    // The per-row scalar of a streamed query (warp-specialised dK/dV producer): none (the slot keeps 1).
    __device__ __forceinline__ static void q_time_async(float*, const AttnParams&, long long) {}
    // A row of a time-coordinate panel (Ops::tc_k0 scores only): none.
    template <typename T, bool kKey>
    __device__ __forceinline__ static void k0_panel_row(T*, int, float) {}
    // The fused backward's factor of dQ (the hyperbolic scores apply theirs in a row kernel).
    __device__ __forceinline__ static float fused_dq_mul(const AttnParams& p) { return p.scale; }

    // The column scalars of key block n into shared memory (cp.async, in the caller's commit group; zero
    // past the sequence): for cosine-sim with fused norms 1/‖k‖ (from the inv-norm row kernel).
    template <int BN, int D>
    __device__ __forceinline__ static void load_key_scalars(const AttnParams& p, const SeqInfo& si, int hk, int n,
                                                            float* col, float*, bool norms, bool, int tid) {
        if (norms && tid < BN) {
            const int j = n * BN + tid;
            const bool valid = j < si.len_k;
            cp_async_4(col + tid, p.rk + (valid ? si.dk_off(p, j, hk) / D : 0), valid);
        }
    }

    // Forward: a row's scalar before the first key block (1: cosine-sim fills 1/‖q‖ later).
    template <bool kQ0>
    __device__ __forceinline__ static void init_q_scalar(const AttnParams&, const SeqInfo&, int, int, float&) {}

    // The wgmma forward's prologue once Q has landed: nothing.
    template <typename T, int D, int BM>
    __device__ __forceinline__ static void wg_fwd_q0(const AttnParams&, const SeqInfo&, const T*, const int (&)[1][2],
                                                     int, int, float (&)[1][2]) {}

    // One key block [j0, j0 + BN) for a warp's MT 16-row tiles (flash_fwd.cuh's fwd_block_scores).
    template <typename T, int MT, int NT, bool kK0>
    __device__ __forceinline__ static void fwd_scores(const AttnParams& p, const SeqInfo& si, int h, int j0, bool full,
                                                      bool norms, float (&s)[MT][NT][4], float (&m)[MT][2],
                                                      float (&l)[MT][2], float (&alpha)[MT][2],
                                                      const float (&rq)[MT][2], const int (&row)[MT][2],
                                                      const int (&lo)[MT][2], const int (&hi)[MT][2], const float* rk,
                                                      const float*, const float*, int t4) {
        // Fast path (a tile with no mask, bias or softcap): keep the raw products (times 1/‖k‖ for
        // cosine-sim) and fold scale·log2 e (times 1/‖q‖) into the exponential's FMA. General path:
        // s = score + bias, masked → −∞, in log2 units.
        if constexpr (Score::kPoly) {  // the weights themselves: no max, no rescale, 0 where masked
            const Poly f(p);
    #pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                alpha[mt][0] = alpha[mt][1] = 1.f;
    #pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float cr = p.scale * rq[mt][r];
                    // Fast path (a tile with no mask, no per-key norms): the row's factor folded into the
                    // coefficients, f = a0 + s (a1 cr + a2 cr² s): two FMAs per element.
                    const float b1 = f.a1 * cr, b2 = f.a2 * cr * cr;
                    float sum = 0.f;
    #pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
    #pragma unroll
                        for (int e = 2 * r; e < 2 * r + 2; ++e) {
                            float w;
                            if (full && !norms) {
                                w = fmaf(fmaf(b2, s[mt][nt][e], b1), s[mt][nt][e], f.a0);
                            } else {
                                const int cl = nt * 8 + 2 * t4 + (e & 1);
                                const int col = j0 + cl;
                                const bool allowed = full || (col >= lo[mt][r] && col < hi[mt][r]);
                                const float x = s[mt][nt][e] * cr * (norms ? rk[cl] : 1.f);
                                w = allowed ? f.f(x) : 0.f;
                            }
                            s[mt][nt][e] = w;
                            sum += w;
                        }
                    l[mt][r] += sum;  // thread-partial, as softmax_rows
                }
            }
            return;
        }
        const bool fast = full && p.bias == nullptr && !(Score::kSoftcap && p.softcap > 0.f);
        float c[MT][2];
        if (fast) {
    #pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                c[mt][0] = p.scale * kLog2e * rq[mt][0];
                c[mt][1] = p.scale * kLog2e * rq[mt][1];
                if (norms) {
    #pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
    #pragma unroll
                        for (int e = 0; e < 4; ++e) s[mt][nt][e] *= rk[nt * 8 + 2 * t4 + (e & 1)];
                }
            }
        } else {
    #pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                c[mt][0] = c[mt][1] = 1.f;
    #pragma unroll
                for (int nt = 0; nt < NT; ++nt)
    #pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int r = e / 2;
                        const int cl = nt * 8 + 2 * t4 + (e & 1);
                        const int col = j0 + cl;
                        const bool allowed = full || (col >= lo[mt][r] && col < hi[mt][r]);
                        float dtanh;
                        float x = score<Score>(p, s[mt][nt][e], rq[mt][r], norms ? rk[cl] : 1.f, dtanh);
                        if (allowed && p.bias != nullptr)
                            x += to_f32(static_cast<const T*>(p.bias)[si.bias_index(p, h, row[mt][r], col)]);
                        s[mt][nt][e] = allowed ? x * kLog2e : -CUDART_INF_F;
                    }
            }
        }

    #pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            if (Score::kGeodesic && fast)  // c = −β/√c < 0: the row max comes from the smallest log2 w
                softmax_rows<NT, true>(s[mt], m[mt], l[mt], true, c[mt], alpha[mt]);
            else
                softmax_rows<NT>(s[mt], m[mt], l[mt], Score::kGeodesic || p.running_max != 0, c[mt], alpha[mt]);
        }
    }

    // The statistic of a row: LSE = m + ln l (−∞ for an empty row, NaN for a NaN row); TaylorScore:
    // the denominator l.
    __device__ __forceinline__ static float row_stat(const AttnParams& p, float m, float lsum) {
        if (Score::kPoly) return lsum;
        const float ref = m == -CUDART_INF_F ? 0.f : m;
        return lsum != 0.f ? (ref + log2f(lsum)) * kLn2 : -CUDART_INF_F;
    }
    // 1/l for the output (0 for an empty row; NaN for a NaN row; TaylorScore: 0 where l ≤ 0, NaN
    // for a NaN l: `l > 0` would turn a NaN denominator into 0 and launder the row, docs/nan.md).
    __device__ __forceinline__ static float inv_sum(float lsum) {
        if (Score::kPoly) return !(lsum <= 0.f) ? 1.f / lsum : 0.f;
        return lsum != 0.f ? 1.f / lsum : 0.f;
    }

    // LSE in log2 units, +∞ for rows that must get P = 0 (past the sequence, or with no allowed key).
    // TaylorScore: 1/den instead (the statistic is den), 0 for those rows.
    __device__ __forceinline__ static float lse_log2(const AttnParams& p, const SeqInfo& si, int h, int i) {
        if (Score::kPoly) {
            const float den = i < si.len_q ? p.lse[si.stats_index(p, h, i)] : 0.f;
            return !(den <= 0.f) ? 1.f / den : 0.f;  // a NaN denominator stays NaN
        }
        if (i >= si.len_q) return CUDART_INF_F;
        const float lse = p.lse[si.stats_index(p, h, i)];
        return lse == -CUDART_INF_F ? CUDART_INF_F : lse * kLog2e;
    }

    // Backward: a query row's (or a streamed query column's) scalars after the generic ones: nothing.
    __device__ __forceinline__ static void bwd_q_row(const AttnParams&, const SeqInfo&, int, int, bool, float&,
                                                     float&) {}
    // Backward: a key row's scalars after 1/‖k‖: nothing.
    __device__ __forceinline__ static void bwd_k_row(const AttnParams&, const SeqInfo&, int, int, bool, float&,
                                                     float&) {}

    // A dK/dV tile with no mask element, no bias, no softcap (dkdv_fast).
    __device__ __forceinline__ static bool fast_tile(const AttnParams& p, bool full) {
        return dkdv_fast<Score>(p, full);
    }

    // dQ kernels, one key block (flash_bwd.cuh's dq_block_ds).
    template <typename T, int MT, int NT, bool kRowSum>
    __device__ __forceinline__ static void dq_ds(const AttnParams& p, const SeqInfo& si, int h, int j0, bool full,
                                                 bool norms, float (&s)[MT][NT][4], const float (&dp)[MT][NT][4],
                                                 float (&)[MT][2], const float (&rq)[MT][2], const float (&cq)[MT][2],
                                                 const float (&lse2)[MT][2], const float (&delta)[MT][2],
                                                 const int (&row)[MT][2], const int (&lo)[MT][2],
                                                 const int (&hi)[MT][2], const float* sRk, const float*,
                                                 const float*, int t4) {
        const bool fast = full && p.bias == nullptr && !(Score::kSoftcap && p.softcap > 0.f);
        if (Score::kPoly && fast && !norms) {  // dS = f'(s)/den ∘ (dP − δ); lse2 holds 1/den
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

    // dK/dV kernels, one streamed query block (flash_bwd.cuh's dkdv_block_pds).
    template <typename T, int MT, int QT, bool kRowSum>
    __device__ __forceinline__ static void dkdv_pds(const AttnParams& p, const SeqInfo& si, int h, int i0, bool full,
                                                    bool norms, float (&st)[MT][QT][4], float (&dpt)[MT][QT][4],
                                                    float (&)[MT][2], float (&)[MT][2], const float (&rk)[MT][2],
                                                    const float (&)[MT][2], const int (&key)[MT][2],
                                                    const float* sRq, const float* sLse, const float* sDelta,
                                                    int t4) {
        const bool fast = dkdv_fast<Score>(p, full);
        if (Score::kPoly && fast && !norms) {  // sLse holds 1/den
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

    // The Hopper dK/dV kernels' split fast tile: Pᵀ while dPᵀ runs, then dS'ᵀ (dkdv_fast_p, dkdv_fast_ds).
    template <int D, bool kEven, int MT, int QT>
    __device__ __forceinline__ static void split_p(const AttnParams& p, bool, float (&st)[MT][QT][4],
                                                   const float (&rk)[MT][2], const float (&)[MT][2], const float* sRq,
                                                   const float* sLse, int t4) {
        dkdv_fast_p<MT, QT>(p, false, st, rk, sRq, sLse, t4);
    }
    template <int D, bool kEven, typename T, int MT, int QT, bool kRowSum>
    __device__ __forceinline__ static void split_ds(bool, const float (&st)[MT][QT][4], float (&dpt)[MT][QT][4],
                                                    float (&)[MT][2], float (&)[MT][2], const float* sRq,
                                                    const float* sDelta, int t4) {
        dkdv_fast_ds<MT, QT>(false, st, dpt, sRq, sDelta, t4);
    }

    // dQ epilogue: dq = scale·acc (dq_store). q_at: element (r, c) of the resident Q tile (unused here).
    template <typename T, int MT, int DT, class QAt>
    __device__ __forceinline__ static void dq_epilogue(const AttnParams& p, const SeqInfo& si, int h,
                                                       const float (&acc)[MT][DT][4], const float (&)[MT][2],
                                                       const float (&)[MT][2], const int (&row)[MT][2], const QAt&,
                                                       int, int, bool norms, int t4) {
        dq_store<T, MT, DT>(p, si, h, acc, row, norms, t4);
    }

    // dK/dV epilogue for columns [d0, d0 + 8·AT) (dkdv_store).
    template <typename T, int MT, int AT, bool kProject, class KAt, class VAt>
    __device__ __forceinline__ static void dkdv_epilogue(const AttnParams& p, const SeqInfo& si, int hk, int d0,
                                                         const float (&acc_dk)[MT][AT][4],
                                                         const float (&acc_dv)[MT][AT][4], const float (&)[MT][2],
                                                         const float (&)[MT][2], const float (&)[MT][2],
                                                         const int (&key)[MT][2], const KAt&, const VAt&, int, int,
                                                         bool, bool norms, int t4) {
        dkdv_store<T, MT, AT, kProject>(p, si, hk, d0, acc_dk, acc_dv, key, norms, t4);
    }
};

}  // namespace attn
