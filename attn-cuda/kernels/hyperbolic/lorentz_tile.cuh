// The hyperbolic family's per-element work inside the flash skeleton's tiles (score.h has the math):
// the forward's scores of one key block, and the backward's P, dS and weighted dS of one tile with the
// row sums its epilogues need. Each has a fast path (a tile with no mask and no bias: one value y per
// element, the constant multiplier hyp_c folded into the exponential's FMA) and a general path
// (scores in log2 units, masked → −∞). kMid: Einstein-midpoint aggregation, the per-key bias log γ_j.
//
// Gradients leave the tiles as w = dS·ψ rounded to the storage type — the very values the dQ and dK
// MMAs consume — and the row sums Σ_j w_ij k0_j (dQ) and Σ_i w_ij q0_i (dK) are taken over those same
// rounded values, so the epilogue's difference Σ w k − (Σ w k0) q/q0 (which cancels when k/k0 ≈ q/q0,
// i.e. for close points far from the origin) carries f32 rounding only, never the storage type's.
#pragma once
#include <type_traits>
#include "../common/mask.h"
#include "../common/mma.h"
#include "../common/online_softmax.h"
#include "../common/wgmma.h"
#include "../flash/score.h"
#include "../flash/score_ops.cuh"

namespace attn {

// x rounded to the storage type T and widened back.
template <typename T>
__device__ __forceinline__ float round_to(float x) {
    return to_f32(from_f32<T>(x));
}

// x as three pieces of T (hi, mid, lo; for bf16 24 significant bits, so hi + mid + lo = x): the
// operands of the hyperbolic scores' tensor-core products of q0 and k0, whose piece-by-piece products
// are exact in f32.
template <typename T>
__device__ __forceinline__ void split3(float x, float& h0, float& h1, float& h2) {
    h0 = round_to<T>(x);
    const float r1 = x - h0;
    h1 = round_to<T>(r1);
    h2 = round_to<T>(r1 - h1);
}

// The warp-specialised forward (flash_fwd_ws) on bf16 forms y = q·k − q0 k0 on the tensor cores: one
// more k16 step of S = Q Kᵀ, over panels beside Q and each K stage whose rows hold q0 and −k0 as three
// bf16 pieces each (hi, mid, lo: 24 bits) at the columns of the six significant cross products, so the
// product carries q0 k0 to f32's precision and the scores do no FMA and no k0 load per element
// (measured on the H100). f16 keeps the per-element FMA: q0 may pass f16's range. So does the
// wgmma forward (flash_fwd_wg): with the panels its two blocks per SM at D = 64 measured slower. The
// warp-specialised dQ kernel takes its row sums Σ_j w_ij k0_j over such pieces under the same condition
// (flash_bwd_ws.cuh; host mirror of both: dispatch::k0_panels).
template <typename T, class Score>
constexpr bool kLorentzTcK0 = Score::kLorentz && std::is_same<T, __nv_bfloat16>::value;

// Row r of such a panel (sw128, ROWS rows of 128 bytes: the k16 step reads columns 0..15, chunks 0
// and 1 of the row): x's pieces at columns 0..5 in the order of the cross products, hi·hi, hi·mid,
// mid·hi, hi·lo, lo·hi, mid·mid (kKey: −x, paired the other way round), zeros elsewhere.
template <typename T, bool kKey>
__device__ __forceinline__ void lorentz_k0_panel_row(T* panel, int r, float x) {
    if (kKey) x = -x;
    float h0, h1, h2;
    split3<T>(x, h0, h1, h2);
    const uint4 pieces = kKey ? make_uint4(pack2<T>(h0, h1), pack2<T>(h0, h2), pack2<T>(h0, h1), 0u)
                              : make_uint4(pack2<T>(h0, h0), pack2<T>(h1, h0), pack2<T>(h2, h1), 0u);
    unsigned char* row = reinterpret_cast<unsigned char*>(panel) + r * 128;
    *reinterpret_cast<uint4*>(row + ((r & 7) << 4)) = pieces;
    *reinterpret_cast<uint4*>(row + (((r & 7) ^ 1) << 4)) = make_uint4(0u, 0u, 0u, 0u);
}

// Row r of a sw128 panel whose columns 0..2 hold x's three pieces (hi, mid, lo) and 3..7 zeros: the
// MN-major n8 B operand of the backward's tensor-core row sums (q0 beside each Q stage, k0 beside K),
// 16-byte chunk `chunk` of the row (before the swizzle), the only part the products read: a panel's
// other chunks may hold other panels (the fused kernel keeps its q0 panels in chunks 1.. of its k0
// panel; the swizzle is of the address, so an operand may start at any chunk). A generic store: the
// writer fences the proxy and arrives on the stage's barrier before a consumer's wgmma reads it.
template <typename T>
__device__ __forceinline__ void lorentz_pieces_panel_row(T* panel, int r, float x, int chunk = 0) {
    float h0, h1, h2;
    split3<T>(x, h0, h1, h2);
    *reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(panel) + r * 128 + ((chunk ^ (r & 7)) << 4)) =
        make_uint4(pack2<T>(h0, h1), pack2<T>(h2, 0.f), 0u, 0u);
}

// Calls f(kMid, kRecip, kFast) (std::integral_constant<bool, ..>) with the tile variant of this call:
// kFast for a tile with no mask and no bias (decided per tile at run time, but a compile-time branch
// inside the tiles: a per-element test of it costs more than the score itself); kMid for the
// Einstein midpoint; kRecip for the geodesic at β/√c = 1 (hyp_c exactly −1) on a fast tile, whose
// weight is the reciprocal 1/w (no LG2/EX2 per element).
template <class Score, class F>
__device__ __forceinline__ void lorentz_variant(const AttnParams& p, bool fast, F&& f) {
    using Yes = std::true_type;
    using No = std::false_type;
    auto with_mid = [&](auto recip, auto fastc) {
        if (p.midpoint)
            f(Yes{}, recip, fastc);
        else
            f(No{}, recip, fastc);
    };
    if (!fast) {
        with_mid(No{}, No{});
        return;
    }
    if constexpr (Score::kGeodesic) {
        if (p.hyp_c == -1.f) {
            with_mid(Yes{}, Yes{});
            return;
        }
    }
    with_mid(No{}, Yes{});
}

// Forward scores of one key block of BN = 8·NT keys starting at j0 for MT 16-row tiles: raw products
// in s → fast-path values y with c = hyp_c, or log2-unit scores with c = 1 (general path).
// q0: this thread's rows' time coordinates; sK0, sLg: the block's k0 and log γ_j in shared memory.
// kRecip (geodesic, hyp_c = −β/√c = −1, fast path): the weight 2^(c·y) = 1/w (times γ_j) itself, for
// softmax_rows<.., kLinear>: RSQ and RCP per element instead of RSQ, LG2 and EX2.
// kK0: s holds q·k − q0 k0 already (kLorentzTcK0).
template <class Score, bool kMid, typename T, int MT, int NT, bool kRecip, bool kFast, bool kK0 = false>
__device__ __forceinline__ void lorentz_scores(const AttnParams& p, const SeqInfo& si, int h, int j0, bool full,
                                               float (&s)[MT][NT][4], float (&c)[MT][2], const float (&q0)[MT][2],
                                               const int (&row)[MT][2], const int (&lo)[MT][2], const int (&hi)[MT][2],
                                               const float* sK0, const float* sLg, int t4) {
    static_assert(kFast || !kRecip, "the reciprocal weight is a fast-tile variant");
    const Lorentz L(p);
    const float lg_fast = kLog2e / L.fast;  // log γ (natural) → the fast path's units
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int cl = nt * 8 + 2 * t4;
        const float2 k0 = kK0 ? make_float2(0.f, 0.f) : *reinterpret_cast<const float2*>(sK0 + cl);
        const float2 lg = kMid ? *reinterpret_cast<const float2*>(sLg + cl) : make_float2(0.f, 0.f);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e / 2;
                const float k0j = (e & 1) ? k0.y : k0.x, lgj = (e & 1) ? lg.y : lg.x;
                float psi;
                if constexpr (kRecip) {
                    const float w = lorentz_value<Score, false, true, kK0>(s[mt][nt][e], q0[mt][r], k0j, L, psi);
                    s[mt][nt][e] = kMid ? rcp_fast(w) * exp2_fast(lgj * kLog2e) : rcp_fast(w);
                    continue;
                }
                const float y = lorentz_value<Score, false, false, kK0>(s[mt][nt][e], q0[mt][r], k0j, L, psi);
                if constexpr (kFast) {
                    s[mt][nt][e] = kMid ? fmaf(lgj, lg_fast, y) : y;
                } else {
                    const int col = j0 + cl + (e & 1);
                    const bool allowed = full || (col >= lo[mt][r] && col < hi[mt][r]);
                    float x = fmaf(L.fast, y, kMid ? lgj * kLog2e : 0.f);
                    if (allowed && p.bias != nullptr)
                        x += to_f32(static_cast<const T*>(p.bias)[si.bias_index(p, h, row[mt][r], col)]) * kLog2e;
                    s[mt][nt][e] = allowed ? x : -CUDART_INF_F;
                }
            }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) c[mt][0] = c[mt][1] = kFast ? L.fast : 1.f;
}

// dQ kernel, one key block: s holds S = QKᵀ, dp holds dP = dO Vᵀ. On return s holds w = dS·ψ rounded
// to T, and a[mt][r] (thread-partial) has gained Σ_j w_ij k0_j. lse2: LSE_i in log2 units less the
// score's constant (+∞ for rows that must get P = 0). With a bias, dS goes to the bias scratch.
// kRecip (geodesic, hyp_c = −1, fast tiles only): P = (1/w)·γ_j·2^(−lse2_i), no LG2 or EX2 per element.
// kRowSum = false (the warp-specialised dQ kernel on bf16, whose dQ product takes Σ_j w_ij k0_j on tensor
// cores beside it): a is left alone and w is not rounded here (packing rounds it).
template <class Score, bool kMid, typename T, int MT, int NT, bool kRecip, bool kFast, bool kRowSum = true>
__device__ __forceinline__ void lorentz_dq_tile(const AttnParams& p, const SeqInfo& si, int h, int j0, bool full,
                                                float (&s)[MT][NT][4], const float (&dp)[MT][NT][4],
                                                float (&a)[MT][2], const float (&q0)[MT][2], const float (&lse2)[MT][2],
                                                const float (&delta)[MT][2], const int (&row)[MT][2],
                                                const int (&lo)[MT][2], const int (&hi)[MT][2], const float* sK0,
                                                const float* sLg, int t4) {
    static_assert(kFast || !kRecip, "the reciprocal weight is a fast-tile variant");
    const Lorentz L(p);
    const float lg_fast = kLog2e / L.fast;
    float er[MT][2];  // kRecip: 2^(−lse2) per row (0 for rows that must get P = 0)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) er[mt][0] = er[mt][1] = 0.f;
    if (kRecip) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) er[mt][r] = exp2_fast(-lse2[mt][r]);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int cl = nt * 8 + 2 * t4;
        const float2 k0 = *reinterpret_cast<const float2*>(sK0 + cl);
        const float2 lg = kMid ? *reinterpret_cast<const float2*>(sLg + cl) : make_float2(0.f, 0.f);
        float2 gam = make_float2(1.f, 1.f);  // kRecip with the midpoint: γ_j
        if (kRecip && kMid) gam = make_float2(exp2_fast(lg.x * kLog2e), exp2_fast(lg.y * kLog2e));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e / 2;
                const float k0j = (e & 1) ? k0.y : k0.x, lgj = (e & 1) ? lg.y : lg.x;
                float psi;
                float y = lorentz_value<Score, true, kRecip>(s[mt][nt][e], q0[mt][r], k0j, L, psi);
                float ds;
                if constexpr (kRecip) {  // y is w
                    const float pr = rcp_fast(y) * ((e & 1) ? gam.y : gam.x) * er[mt][r];
                    ds = pr * (dp[mt][nt][e] - delta[mt][r]);
                } else if constexpr (kFast) {
                    const float pr = exp2_fast(fmaf(kMid ? fmaf(lgj, lg_fast, y) : y, L.fast, -lse2[mt][r]));
                    ds = pr * (dp[mt][nt][e] - delta[mt][r]);
                } else {
                    const int col = j0 + cl + (e & 1);
                    const bool allowed = full || (col >= lo[mt][r] && col < hi[mt][r]);
                    float x = fmaf(L.fast, y, kMid ? lgj * kLog2e : 0.f);
                    if (allowed && p.bias != nullptr)
                        x += to_f32(static_cast<const T*>(p.bias)[si.bias_index(p, h, row[mt][r], col)]) * kLog2e;
                    const float pr = allowed ? exp2_fast(x - lse2[mt][r]) : 0.f;
                    ds = pr * (dp[mt][nt][e] - delta[mt][r]);
                    if (allowed && p.ds != nullptr) p.ds[si.ds_index(p, h, row[mt][r], col)] = ds;
                }
                const float w = kRowSum ? round_to<T>(ds * psi) : ds * psi;
                if (kRowSum) a[mt][r] = fmaf(w, k0j, a[mt][r]);
                s[mt][nt][e] = w;
            }
    }
}

// dK/dV kernel, one streamed query block of BM = 8·QT queries starting at i0 (query head h): st holds
// Sᵀ = K Qᵀ, dpt holds dPᵀ = V dOᵀ (rows = this thread's keys). On return st holds Pᵀ and dpt holds
// wᵀ rounded to T; bsum gains Σ_i w_ij q0_i and, with kMid, csum gains Σ_i dS_ij. k0 and lg: the
// keys' time coordinates and log γ_j; sQ0, sLse, sDelta: the query block's q0, LSE (log2 units, less
// the score's constant) and δ.
// kRecip: as for lorentz_dq_tile, with 2^(−LSE) per query column and γ_j per key row.
// kRowSum = false (the warp-specialised kernels on bf16, whose dK product takes Σ_i w_ij q0_i on tensor
// cores beside it, flash_bwd_ws.cuh): bsum is left alone and w is not rounded here (packing rounds it).
template <class Score, bool kMid, typename T, int MT, int QT, bool kRecip, bool kFast, bool kRowSum = true>
__device__ __forceinline__ void lorentz_dkdv_tile(const AttnParams& p, const SeqInfo& si, int h, int i0, bool full,
                                                  float (&st)[MT][QT][4], float (&dpt)[MT][QT][4],
                                                  float (&bsum)[MT][2], float (&csum)[MT][2], const float (&k0)[MT][2],
                                                  const float (&lg)[MT][2], const int (&key)[MT][2],
                                                  const float* sQ0, const float* sLse, const float* sDelta, int t4) {
    static_assert(kFast || !kRecip, "the reciprocal weight is a fast-tile variant");
    const Lorentz L(p);
    const float lg_fast = kLog2e / L.fast;
    float gam[MT][2];  // kRecip with the midpoint: γ_j of this thread's keys
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) gam[mt][r] = kRecip && kMid ? exp2_fast(lg[mt][r] * kLog2e) : 1.f;
#pragma unroll
    for (int qt = 0; qt < QT; ++qt) {
        const int cl = qt * 8 + 2 * t4;
        const float2 q0 = *reinterpret_cast<const float2*>(sQ0 + cl);
        const float2 lse = *reinterpret_cast<const float2*>(sLse + cl);
        const float2 delta = *reinterpret_cast<const float2*>(sDelta + cl);
        float2 eq = make_float2(0.f, 0.f);  // kRecip: 2^(−LSE) per query
        if (kRecip) eq = make_float2(exp2_fast(-lse.x), exp2_fast(-lse.y));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e / 2;
                const float q0i = (e & 1) ? q0.y : q0.x;
                const float lsei = (e & 1) ? lse.y : lse.x, di = (e & 1) ? delta.y : delta.x;
                float psi;
                float y = lorentz_value<Score, true, kRecip>(st[mt][qt][e], q0i, k0[mt][r], L, psi);
                float pr;
                if constexpr (kRecip) {  // y is w
                    pr = rcp_fast(y) * gam[mt][r] * ((e & 1) ? eq.y : eq.x);
                } else if constexpr (kFast) {
                    pr = exp2_fast(fmaf(kMid ? fmaf(lg[mt][r], lg_fast, y) : y, L.fast, -lsei));
                } else {
                    const int i = i0 + cl + (e & 1);
                    const int j = key[mt][r];
                    const bool allowed =
                        full || (i < si.len_q && j < si.len_k && j >= si.key_lo(p, i) && j < si.key_hi(p, i));
                    float x = fmaf(L.fast, y, kMid ? lg[mt][r] * kLog2e : 0.f);
                    if (allowed && p.bias != nullptr)
                        x += to_f32(static_cast<const T*>(p.bias)[si.bias_index(p, h, i, j)]) * kLog2e;
                    pr = allowed ? exp2_fast(x - lsei) : 0.f;
                }
                const float ds = pr * (dpt[mt][qt][e] - di);
                const float w = kRowSum ? round_to<T>(ds * psi) : ds * psi;
                if (kRowSum) bsum[mt][r] = fmaf(w, q0i, bsum[mt][r]);
                if (kMid) csum[mt][r] += ds;
                st[mt][qt][e] = pr;
                dpt[mt][qt][e] = w;
            }
    }
}

// The squared Lorentz score's fast dK/dV tile in two halves, as dkdv_fast_p / dkdv_fast_ds for softmax:
// the warp-specialised kernel at D = 128 forms Pᵀ once Sᵀ is done while dPᵀ is still on the tensor cores,
// and wᵀ while dV's product runs (lorentz_dkdv_tile forms both after both products); there it frees the
// registers of the tensor-core row sums. Per element the same operations
// as lorentz_dkdv_tile<SqLorentzScore, kMid, .., kFast = true>, so the same bits. The geodesic keeps the
// one-piece tile: its ψ comes from Sᵀ, which Pᵀ overwrites.
// st: Sᵀ → Pᵀ. k0, lg: the thread's keys' time coordinates and log γ_j; sQ0, sLse: the query block's
// q0 and LSE (log2 units, less the score's constant).
template <bool kMid, int MT, int QT>
__device__ __forceinline__ void lorentz_fast_p(const AttnParams& p, float (&st)[MT][QT][4], const float (&k0)[MT][2],
                                               const float (&lg)[MT][2], const float* sQ0, const float* sLse,
                                               int t4) {
    const Lorentz L(p);
    const float lg_fast = kLog2e / L.fast;
#pragma unroll
    for (int qt = 0; qt < QT; ++qt) {
        const int cl = qt * 8 + 2 * t4;
        const float2 q0 = *reinterpret_cast<const float2*>(sQ0 + cl);
        const float2 lse = *reinterpret_cast<const float2*>(sLse + cl);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e / 2;
                const float y = fmaf(-((e & 1) ? q0.y : q0.x), k0[mt][r], st[mt][qt][e]);
                st[mt][qt][e] =
                    exp2_fast(fmaf(kMid ? fmaf(lg[mt][r], lg_fast, y) : y, L.fast, -((e & 1) ? lse.y : lse.x)));
            }
    }
}

// dpt: dPᵀ → wᵀ = Pᵀ ∘ (dPᵀ − δ_i) (ψ = 1), with st holding Pᵀ; the row sums as lorentz_dkdv_tile's.
template <bool kMid, typename T, int MT, int QT, bool kRowSum>
__device__ __forceinline__ void lorentz_fast_ds(const float (&st)[MT][QT][4], float (&dpt)[MT][QT][4],
                                                float (&bsum)[MT][2], float (&csum)[MT][2], const float* sQ0,
                                                const float* sDelta, int t4) {
#pragma unroll
    for (int qt = 0; qt < QT; ++qt) {
        const int cl = qt * 8 + 2 * t4;
        const float2 q0 = kRowSum ? *reinterpret_cast<const float2*>(sQ0 + cl) : make_float2(0.f, 0.f);
        const float2 delta = *reinterpret_cast<const float2*>(sDelta + cl);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e / 2;
                const float ds = st[mt][qt][e] * (dpt[mt][qt][e] - ((e & 1) ? delta.y : delta.x));
                const float w = kRowSum ? round_to<T>(ds) : ds;
                if (kRowSum) bsum[mt][r] = fmaf(w, (e & 1) ? q0.y : q0.x, bsum[mt][r]);
                if (kMid) csum[mt][r] += ds;
                dpt[mt][qt][e] = w;
            }
    }
}

// dQ epilogue: dq_i = hyp_grad·(acc_i − (a_i/q0_i)·q_i), q_i read from the resident Q tile: q_at(r, c)
// is element c of the tile's row r as f32 (the tile's layout is the kernel's). Every thread of the
// block calls it after its own cp.async copies completed; it starts with a barrier, since the tile's
// rows were copied by other threads and a query tile without a key block ran no barrier of the loop.
template <typename T, int MT, int DT, class QAt>
__device__ __forceinline__ void lorentz_dq_epilogue(const AttnParams& p, const SeqInfo& si, int h,
                                                    const float (&acc)[MT][DT][4], const float (&a)[MT][2],
                                                    const float (&q0)[MT][2], const int (&row)[MT][2], const QAt& q_at,
                                                    int wrow, int lane) {
    using V2 = typename Vec2<T>::type;
    const int g = lane / 4, t4 = lane % 4;
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float ai = quad_sum(a[mt][r]);  // every lane of the quad takes part
            if (row[mt][r] >= si.len_q) continue;
            const float ratio = ai / q0[mt][r];
            const int tr = wrow + mt * 16 + g + 8 * r;
            T* dq = static_cast<T*>(p.dq) + si.dq_off(p, row[mt][r], h);
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                const int col = dt * 8 + 2 * t4;
                const float x0 = p.hyp_grad * fmaf(-ratio, q_at(tr, col), acc[mt][dt][2 * r]);
                const float x1 = p.hyp_grad * fmaf(-ratio, q_at(tr, col + 1), acc[mt][dt][2 * r + 1]);
                const uint32_t packed = pack2<T>(x0, x1);
                *reinterpret_cast<V2*>(dq + col) = *reinterpret_cast<const V2*>(&packed);
            }
        }
}

// dK/dV epilogue for columns [d0, d0 + 8·AT): dk_j = hyp_grad·(acc_dk − (b_j/k0_j)·k_j) and
// dv_j = acc_dv + (Σ_i dS_ij)·c γ_j²·v_j (Einstein midpoint), k_j and v_j read from the resident tiles
// through k_at(r, c) and v_at(r, c) (row r, column c of the tile, as f32). Padded keys (j ≥ len_k, rows
// dk and dv still hold) get zeros. Called by every thread of the block after its own cp.async copies
// completed; it starts with a barrier, since other threads copied the tiles and a key tile without a
// query block (padded keys, a window or causal mask) ran no barrier of the loop.
template <typename T, int MT, int AT, class KAt, class VAt>
__device__ __forceinline__ void lorentz_dkdv_epilogue(const AttnParams& p, const SeqInfo& si, int hk, int d0,
                                                      const float (&acc_dk)[MT][AT][4],
                                                      const float (&acc_dv)[MT][AT][4], const float (&bsum)[MT][2],
                                                      const float (&csum)[MT][2], const float (&k0)[MT][2],
                                                      const int (&key)[MT][2], const KAt& k_at, const VAt& v_at,
                                                      int wrow, int lane, bool midpoint) {
    using V2 = typename Vec2<T>::type;
    const int g = lane / 4, t4 = lane % 4;
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float bj = quad_sum(bsum[mt][r]);
            const float cj = quad_sum(csum[mt][r]);
            const int j = key[mt][r];
            if (j >= si.key_rows(p)) continue;
            const bool valid = j < si.len_k;
            const float ratio = valid ? bj / k0[mt][r] : 0.f;
            const float mid = midpoint && valid ? cj * p.dgk[si.key_index(p, hk, j)] : 0.f;
            const int tr = wrow + mt * 16 + g + 8 * r;
            T* dk = static_cast<T*>(p.dk) + si.dk_off(p, j, hk) + d0;
            T* dv = static_cast<T*>(p.dv) + si.dv_off(p, j, hk) + d0;
#pragma unroll
            for (int at = 0; at < AT; ++at) {
                const int col = at * 8 + 2 * t4;
                const uint32_t pk = pack2<T>(p.hyp_grad * fmaf(-ratio, k_at(tr, d0 + col), acc_dk[mt][at][2 * r]),
                                             p.hyp_grad * fmaf(-ratio, k_at(tr, d0 + col + 1), acc_dk[mt][at][2 * r + 1]));
                // Without the midpoint dv is the product alone: 0·v would make a NaN v's own dv NaN,
                // which dV = Pᵀ·dO never reads (docs/nan.md).
                const uint32_t pv =
                    midpoint ? pack2<T>(fmaf(mid, v_at(tr, d0 + col), acc_dv[mt][at][2 * r]),
                                        fmaf(mid, v_at(tr, d0 + col + 1), acc_dv[mt][at][2 * r + 1]))
                             : pack2<T>(acc_dv[mt][at][2 * r], acc_dv[mt][at][2 * r + 1]);
                *reinterpret_cast<V2*>(dk + col) = *reinterpret_cast<const V2*>(&pk);
                *reinterpret_cast<V2*>(dv + col) = *reinterpret_cast<const V2*>(&pv);
            }
        }
}

// Hyperbolic scores: k0 (and, for the Einstein midpoint, log γ_j) of the BN keys of key block n
// into shared memory (cp.async, in the caller's commit group; zero past the sequence).
template <int BN>
__device__ __forceinline__ void load_key_cols(const AttnParams& p, const SeqInfo& si, int hk, int n, float* k0,
                                              float* lg, bool midpoint, int tid) {
    if (tid < BN) {
        const int j = n * BN + tid;
        const bool valid = j < si.len_k;
        const long long at = valid ? si.key_index(p, hk, j) : 0;
        cp_async_4(k0 + tid, p.x0k + at, valid);
        if (midpoint) cp_async_4(lg + tid, p.lgk + at, valid);
    }
}

// q0 = √(1/c + ‖q‖²) of a thread's two rows (r0 and r0 + 8 of the sw128 Q tile of BM rows in shared
// memory; row: their indices in the sequence) into rq, valid rows only, as attn_hyp_rows forms it: the
// squares summed in f64 and rounded once to f32. The four lanes of a quad split the row's 16-byte chunks
// (t4, t4 + 4, …) and add their sums by two shuffles: the whole warp calls it. The wgmma forward forms
// q0 so, from the tile it loads anyway, and the row kernel reads only the keys. For 16-bit inputs every square and every partial sum is exact in f64 unless the row's
// magnitudes span more than ~2^30, so the sum's order does not change the result.
template <typename T, int D, int BM>
__device__ __forceinline__ void lorentz_q0_from_tile(const AttnParams& p, const SeqInfo& si, const T* sQ,
                                                     const int (&row)[1][2], int r0, int t4, float (&rq)[1][2]) {
    const unsigned char* base = reinterpret_cast<const unsigned char*>(sQ);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        double s = 0.0;
#pragma unroll
        for (int c = t4; c < D / 8; c += 4) {
            const uint4 w = *reinterpret_cast<const uint4*>(base + sw128_offset<BM>(r0 + 8 * r, 8 * c));
            const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const double x = to_f32(e[i]);
                s = fma(x, x, s);
            }
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        if (row[0][r] < si.len_q) rq[0][r] = lorentz_time_coord(p.curvature, s);
    }
}

// Hyperbolic scores, fused backward: a_i += Σ_j w_ij k0_j over this warp's 16 keys for the block's 64
// queries, w as the dQ product takes it (dS'ᵀ rounded to T: the dK product's A fragments, rows = keys g
// and g + 8 of the warp, k0 of those keys in k0). Per thread its two keys for its 16 columns 8c + 2·t4 +
// {0, 1}, then a reduce-scatter over the 8 lanes of a column quad (lane bits 4, 3, 2: halves of the
// column groups c) leaves lane (g, t4) the sums of columns 8g + 2·t4 + {0, 1}: 14 shuffles, then two f32
// atomics per lane.
template <typename T, int BM>
__device__ __forceinline__ void lorentz_rowsum_add(const AttnParams& p, const SeqInfo& si, int h, int i0,
                                                   const uint32_t (&ads)[BM / 16][4], const float (&k0)[1][2],
                                                   int lane) {
    static_assert(BM == 64, "8 column groups: one per lane of a column quad after the reduce-scatter");
    float v[8][2];
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {  // columns 16kk + 8hh + 2·t4: registers 2hh (key g), 2hh + 1 (g + 8)
            const float2 w0 = unpack2<T>(ads[kk][2 * hh]), w1 = unpack2<T>(ads[kk][2 * hh + 1]);
            v[2 * kk + hh][0] = fmaf(w0.x, k0[0][0], w1.x * k0[0][1]);
            v[2 * kk + hh][1] = fmaf(w0.y, k0[0][0], w1.y * k0[0][1]);
        }
#pragma unroll
    for (int step = 0; step < 3; ++step) {
        const int half = 4 >> step, mask = 16 >> step;  // lane bit 4 − step: keep the upper or lower half
        const bool upper = lane & mask;
#pragma unroll
        for (int c = 0; c < half; ++c)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float send = upper ? v[c][e] : v[c + half][e];
                const float keep = upper ? v[c + half][e] : v[c][e];
                v[c][e] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
            }
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int i = i0 + 8 * (lane / 4) + 2 * (lane % 4) + e;
        if (i < si.len_q) atomicAdd(p.dq_rowsum + si.stats_index(p, h, i), v[0][e]);
    }
}

// The hyperbolic scores' hooks on the flash skeleton (score.h's Score::Ops): the row and key scalars are
// the time coordinates q0, k0 (and log γ_j of the Einstein midpoint) from the row kernels, the tiles are
// the functions above, the statistic carries the score's constant, and the epilogues apply the row sums
// of the time coordinates' gradients. What this family does not override is FlashOps' (no norms, no
// softcap, no Taylor weights).
template <class Score>
struct LorentzOps : FlashOps<Score> {
    __device__ __forceinline__ static bool midpoint(const AttnParams& p) { return p.midpoint; }
    __device__ __forceinline__ static bool rescales(const AttnParams& p) {
        return Score::kGeodesic || (!Score::kPoly && p.running_max);
    }
    static constexpr bool kKeyCols = true;
    static constexpr bool kRowSums = true;
    template <typename T>
    __host__ __device__ static constexpr bool tc_k0() { return kLorentzTcK0<T, Score>; }
    // The backward's row sums on tensor cores (flash_bwd_ws.cuh): bf16, and for the geodesic D = 64 only.
    template <typename T, int D>
    __host__ __device__ static constexpr bool tc_rowsum() {
        return std::is_same<T, __nv_bfloat16>::value && (D == 64 || !Score::kGeodesic);
    }
    // The squared Lorentz score splits its fast dK/dV tile at D = 128 and in the every-tile-fast kernel.
    template <int D, bool kEven>
    __host__ __device__ static constexpr bool ws_split_own() { return !Score::kGeodesic && (D == 128 || kEven); }
    template <int D, bool kDq>
    __host__ __device__ static constexpr bool full_descs() { return D == 128 && !kDq; }
    template <int D, bool kEven>
    __device__ __forceinline__ static bool ws_split(const AttnParams& p, bool full) {
        return ws_split_own<D, kEven>() && !Score::kPoly && dkdv_fast<Score>(p, full);
    }
    template <int D, bool kEven>
    __device__ __forceinline__ static bool ws_split_mid(const AttnParams& p) {
        return ws_split_own<D, kEven>() && p.midpoint;
    }
    __device__ __forceinline__ static float fused_dq_mul(const AttnParams&) { return 1.f; }

    // The time coordinates: of key j (0 past the sequence), of query i, of stats index at.
    __device__ __forceinline__ static float k_time(const AttnParams& p, const SeqInfo& si, int hk, int j) {
        return j < si.len_k ? p.x0k[si.key_index(p, hk, j)] : 0.f;
    }
    __device__ __forceinline__ static float q_time(const AttnParams& p, const SeqInfo& si, int h, int i) {
        return p.x0q[si.stats_index(p, h, i)];
    }
    __device__ __forceinline__ static float q_time_at(const AttnParams& p, long long at) { return p.x0q[at]; }
    __device__ __forceinline__ static void q_time_async(float* dst, const AttnParams& p, long long at) {
        cp_async_4(dst, p.x0q + at, true);
    }
    template <typename T, bool kKey>
    __device__ __forceinline__ static void k0_panel_row(T* panel, int r, float x) {
        lorentz_k0_panel_row<T, kKey>(panel, r, x);
    }
    template <typename T>
    __device__ __forceinline__ static void pieces_panel_row(T* panel, int r, float x, int chunk = 0) {
        lorentz_pieces_panel_row<T>(panel, r, x, chunk);
    }

    template <int BN, int D>
    __device__ __forceinline__ static void load_key_scalars(const AttnParams& p, const SeqInfo& si, int hk, int n,
                                                            float* col, float* lg, bool, bool midpoint, int tid) {
        load_key_cols<BN>(p, si, hk, n, col, lg, midpoint, tid);
    }
    template <bool kQ0>
    __device__ __forceinline__ static void init_q_scalar(const AttnParams& p, const SeqInfo& si, int h, int i,
                                                         float& rq) {
        if (kQ0 && i < si.len_q) rq = p.x0q[si.stats_index(p, h, i)];
    }
    // Before the wgmma forward's loop (inside it, its registers made the kernel spill): q0 from the Q tile.
    template <typename T, int D, int BM>
    __device__ __forceinline__ static void wg_fwd_q0(const AttnParams& p, const SeqInfo& si, const T* sQ,
                                                     const int (&row)[1][2], int r0, int t4, float (&rq)[1][2]) {
        cp_async_wait<0>();
        __syncthreads();  // Q (and K_0) have landed
        lorentz_q0_from_tile<T, D, BM>(p, si, sQ, row, r0, t4, rq);
    }

    template <typename T, int MT, int NT, bool kK0>
    __device__ __forceinline__ static void fwd_scores(const AttnParams& p, const SeqInfo& si, int h, int j0, bool full,
                                                      bool, float (&s)[MT][NT][4], float (&m)[MT][2],
                                                      float (&l)[MT][2], float (&alpha)[MT][2],
                                                      const float (&rq)[MT][2], const int (&row)[MT][2],
                                                      const int (&lo)[MT][2], const int (&hi)[MT][2], const float*,
                                                      const float* k0, const float* lg, int t4) {
        const bool fast = full && p.bias == nullptr && !(Score::kSoftcap && p.softcap > 0.f);
        float c[MT][2];
        {
            bool recip = false;  // the geodesic at β/√c = 1: the scores are already the weights 1/w
            lorentz_variant<Score>(p, fast, [&](auto mid, auto rc, auto fc) {
                lorentz_scores<Score, decltype(mid)::value, T, MT, NT, decltype(rc)::value, decltype(fc)::value, kK0>(
                    p, si, h, j0, full, s, c, rq, row, lo, hi, k0, lg, t4);
                recip = decltype(rc)::value;
            });
            if (recip) {
    #pragma unroll
                for (int mt = 0; mt < MT; ++mt) softmax_rows<NT, false, true>(s[mt], m[mt], l[mt], true, c[mt], alpha[mt]);
                return;
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

    // The statistic: LSE plus the score's constant (2β/c; −(β/√c) ln c); NaN for a NaN row.
    __device__ __forceinline__ static float row_stat(const AttnParams& p, float m, float lsum) {
        const float ref = m == -CUDART_INF_F ? 0.f : m;
        const float lse = lsum != 0.f ? (ref + log2f(lsum)) * kLn2 : -CUDART_INF_F;
        return lse + p.hyp_lse;
    }
    // A query's LSE less the score's constant, and q0.
    __device__ __forceinline__ static void bwd_q_row(const AttnParams& p, const SeqInfo& si, int h, int i, bool valid,
                                                     float& lse2, float& rq) {
        lse2 -= p.hyp_lse * kLog2e;
        rq = valid ? p.x0q[si.stats_index(p, h, i)] : 1.f;
    }
    // A key's k0 and log γ_j.
    __device__ __forceinline__ static void bwd_k_row(const AttnParams& p, const SeqInfo& si, int hk, int j,
                                                     bool midpoint, float& rk, float& lg) {
        const bool valid = j < si.len_k;
        const long long at = si.key_index(p, hk, j);
        rk = valid ? p.x0k[at] : 1.f;
        if (midpoint && valid) lg = p.lgk[at];
    }

    template <typename T, int MT, int NT, bool kRowSum>
    __device__ __forceinline__ static void dq_ds(const AttnParams& p, const SeqInfo& si, int h, int j0, bool full, bool,
                                                 float (&s)[MT][NT][4], const float (&dp)[MT][NT][4],
                                                 float (&a)[MT][2], const float (&rq)[MT][2], const float (&)[MT][2],
                                                 const float (&lse2)[MT][2], const float (&delta)[MT][2],
                                                 const int (&row)[MT][2], const int (&lo)[MT][2],
                                                 const int (&hi)[MT][2], const float*, const float* sK0,
                                                 const float* sLg, int t4) {
        const bool fast = full && p.bias == nullptr && !(Score::kSoftcap && p.softcap > 0.f);
        lorentz_variant<Score>(p, fast, [&](auto mid, auto recip, auto fc) {
            lorentz_dq_tile<Score, decltype(mid)::value, T, MT, NT, decltype(recip)::value, decltype(fc)::value,
                            kRowSum>(p, si, h, j0, full, s, dp, a, rq, lse2, delta, row, lo, hi, sK0, sLg, t4);
        });
    }

    template <typename T, int MT, int QT, bool kRowSum>
    __device__ __forceinline__ static void dkdv_pds(const AttnParams& p, const SeqInfo& si, int h, int i0, bool full,
                                                    bool, float (&st)[MT][QT][4], float (&dpt)[MT][QT][4],
                                                    float (&bsum)[MT][2], float (&csum)[MT][2],
                                                    const float (&rk)[MT][2], const float (&lg)[MT][2],
                                                    const int (&key)[MT][2], const float* sRq, const float* sLse,
                                                    const float* sDelta, int t4) {
        const bool fast = dkdv_fast<Score>(p, full);
        lorentz_variant<Score>(p, fast, [&](auto mid, auto recip, auto fc) {
            lorentz_dkdv_tile<Score, decltype(mid)::value, T, MT, QT, decltype(recip)::value, decltype(fc)::value,
                              kRowSum>(p, si, h, i0, full, st, dpt, bsum, csum, rk, lg, key, sRq, sLse, sDelta, t4);
        });
    }

    template <int D, bool kEven, int MT, int QT>
    __device__ __forceinline__ static void split_p(const AttnParams& p, bool mid, float (&st)[MT][QT][4],
                                                   const float (&rk)[MT][2], const float (&lg)[MT][2],
                                                   const float* sRq, const float* sLse, int t4) {
        if constexpr (ws_split_own<D, kEven>()) {
            if (mid)
                lorentz_fast_p<true, MT, QT>(p, st, rk, lg, sRq, sLse, t4);
            else
                lorentz_fast_p<false, MT, QT>(p, st, rk, lg, sRq, sLse, t4);
        } else {
            dkdv_fast_p<MT, QT>(p, false, st, rk, sRq, sLse, t4);
        }
    }
    template <int D, bool kEven, typename T, int MT, int QT, bool kRowSum>
    __device__ __forceinline__ static void split_ds(bool mid, const float (&st)[MT][QT][4], float (&dpt)[MT][QT][4],
                                                    float (&bsum)[MT][2], float (&csum)[MT][2], const float* sRq,
                                                    const float* sDelta, int t4) {
        if constexpr (ws_split_own<D, kEven>()) {
            if (mid)
                lorentz_fast_ds<true, T, MT, QT, kRowSum>(st, dpt, bsum, csum, sRq, sDelta, t4);
            else
                lorentz_fast_ds<false, T, MT, QT, kRowSum>(st, dpt, bsum, csum, sRq, sDelta, t4);
        } else {
            dkdv_fast_ds<MT, QT>(false, st, dpt, sRq, sDelta, t4);
        }
    }

    template <typename T, int MT, int DT, class QAt>
    __device__ __forceinline__ static void dq_epilogue(const AttnParams& p, const SeqInfo& si, int h,
                                                       const float (&acc)[MT][DT][4], const float (&a)[MT][2],
                                                       const float (&q0)[MT][2], const int (&row)[MT][2],
                                                       const QAt& q_at, int wrow, int lane, bool, int) {
        lorentz_dq_epilogue<T, MT, DT>(p, si, h, acc, a, q0, row, q_at, wrow, lane);
    }
    template <typename T, int MT, int AT, bool kProject, class KAt, class VAt>
    __device__ __forceinline__ static void dkdv_epilogue(const AttnParams& p, const SeqInfo& si, int hk, int d0,
                                                         const float (&acc_dk)[MT][AT][4],
                                                         const float (&acc_dv)[MT][AT][4], const float (&bsum)[MT][2],
                                                         const float (&csum)[MT][2], const float (&k0)[MT][2],
                                                         const int (&key)[MT][2], const KAt& k_at, const VAt& v_at,
                                                         int wrow, int lane, bool midpoint, bool, int) {
        lorentz_dkdv_epilogue<T, MT, AT>(p, si, hk, d0, acc_dk, acc_dv, bsum, csum, k0, key, k_at, v_at, wrow, lane,
                                         midpoint);
    }

    // The wgmma fused backward: a_i += Σ_j w_ij k0_j over the tile's keys, w as stored in sdS (rounded to
    // T, as the dQ product takes it): warp w sums keys 16w.. for the query pair 2·lane, 2·lane + 1.
    template <typename T, int BN>
    __device__ __forceinline__ static void wg_fused_rowsum(const AttnParams& p, const SeqInfo& si, int h, int i0,
                                                           const T* sdS, const float* sKey0, int warp, int lane) {
        const unsigned char* dst = reinterpret_cast<const unsigned char*>(sdS);
        float a0 = 0.f, a1 = 0.f;
#pragma unroll
        for (int jj = 0; jj < 16; ++jj) {
            const int j = warp * 16 + jj;
            const T* w = reinterpret_cast<const T*>(dst + sw128_offset<BN>(j, 2 * lane));
            a0 = fmaf(to_f32(w[0]), sKey0[j], a0);
            a1 = fmaf(to_f32(w[1]), sKey0[j], a1);
        }
        const int i = i0 + 2 * lane;
        if (i < si.len_q) atomicAdd(p.dq_rowsum + si.stats_index(p, h, i), a0);
        if (i + 1 < si.len_q) atomicAdd(p.dq_rowsum + si.stats_index(p, h, i + 1), a1);
    }
    // The warp-specialised fused backward's (lorentz_rowsum_add).
    template <typename T, int BM>
    __device__ __forceinline__ static void ws_fused_rowsum(const AttnParams& p, const SeqInfo& si, int h, int i0,
                                                           const uint32_t (&ads)[BM / 16][4], const float (&k0)[1][2],
                                                           int lane) {
        lorentz_rowsum_add<T, BM>(p, si, h, i0, ads, k0, lane);
    }
};

}  // namespace attn
