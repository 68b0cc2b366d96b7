// Backward pass of the flash skeleton (FlashAttention-2), tensor cores, deterministic (no atomics).
// P is recomputed from the saved LSE: P_ij = exp(s_ij − LSE_i); with δ_i = dO_i·o_i (a separate
// row kernel) the gradients are
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − δ),  dQ = scale·dS' K,  dK = scale·dS'ᵀ Q,
// where dS' = dS ∘ (1 − tanh²) under a softcap, and for cosine-sim dS'_ij also carries the
// reciprocal norm of the other side (dq̂ = scale·Σ_j dS_ij k̂_j with k̂_j = rk_j·k_j); the l2-norm's
// own Jacobian is applied afterwards by a row kernel on the f32 dq̂ / dk̂.
// The per-family steps are the score's hooks (Score::Ops: score_ops.cuh, lorentz_tile.cuh).
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
#include "score_ops.cuh"
#include "../common/tiles.h"

namespace attn {

template <int NT, int DT>
__device__ __forceinline__ void zero(float (&a)[NT][DT]) {
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int j = 0; j < DT; ++j) a[i][j] = 0.f;
}

// LSE in log2 units, +∞ for rows that must get P = 0 (past the sequence, or with no allowed key); the
// score's (Ops::lse_log2; TaylorScore: 1/den, 0 for those rows).
template <class Score>
__device__ __forceinline__ float lse_log2(const AttnParams& p, const SeqInfo& si, int h, int i) {
    return Score::Ops::lse_log2(p, si, h, i);
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
            Score::Ops::bwd_q_row(p, si, h, i, valid, lse2[mt][r], rq[mt][r]);  // hyperbolic: q0, LSE less a constant
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
            Score::Ops::bwd_k_row(p, si, hk, key[mt][r], midpoint, rk[mt][r], lg[mt][r]);  // hyperbolic: k0, log γ_j
        }
}

// dQ kernels, one key block at j0 (`full`: no element of the tile is masked): s holds S = QKᵀ, dp
// holds dP = dO Vᵀ; on return s holds dS' (P = exp(s − LSE), dS = P ∘ (dP − δ), times the softcap's
// tanh' and, for cosine-sim, the key's reciprocal norm; TaylorScore: dS = f'(s)/den ∘ (dP − δ), lse2
// holding 1/den). The score's hook (Ops::dq_ds; hyperbolic scores: lorentz_dq_tile; kRowSum = false:
// their row sums are taken on tensor cores by the caller). Fast path (no mask, bias, softcap or bias
// gradient in the tile): one FMA and one exp2 per element (TaylorScore: one FMA). sRk, sK0, sLg: the
// block's 1/‖k‖, k0 and log γ in shared memory.
template <typename T, class Score, int MT, int NT, bool kRowSum = true>
__device__ __forceinline__ void dq_block_ds(const AttnParams& p, const SeqInfo& si, int h, int j0, bool full,
                                            bool norms, float (&s)[MT][NT][4], const float (&dp)[MT][NT][4],
                                            float (&a)[MT][2], const float (&rq)[MT][2], const float (&cq)[MT][2],
                                            const float (&lse2)[MT][2], const float (&delta)[MT][2],
                                            const int (&row)[MT][2], const int (&lo)[MT][2], const int (&hi)[MT][2],
                                            const float* sRk, const float* sK0, const float* sLg, int t4) {
    Score::Ops::template dq_ds<T, MT, NT, kRowSum>(p, si, h, j0, full, norms, s, dp, a, rq, cq, lse2, delta, row,
                                                          lo, hi, sRk, sK0, sLg, t4);
}

// dK/dV kernels, one streamed query block of 8·QT queries at i0 (query head h): st holds Sᵀ = K Qᵀ,
// dpt holds dPᵀ = V dOᵀ (rows: this thread's keys); on return st holds Pᵀ and dpt holds dS'ᵀ.
// The score's hook (Ops::dkdv_pds; hyperbolic scores: lorentz_dkdv_tile). sRq, sLse, sDelta: the query block's 1/‖q‖ (hyperbolic: q0),
// LSE (log2 units; TaylorScore: 1/den) and δ in shared memory.
template <typename T, class Score, int MT, int QT, bool kRowSum = true>
__device__ __forceinline__ void dkdv_block_pds(const AttnParams& p, const SeqInfo& si, int h, int i0, bool full,
                                               bool norms, float (&st)[MT][QT][4], float (&dpt)[MT][QT][4],
                                               float (&bsum)[MT][2], float (&csum)[MT][2], const float (&rk)[MT][2],
                                               const float (&lg)[MT][2], const int (&key)[MT][2], const float* sRq,
                                               const float* sLse, const float* sDelta, int t4) {
    Score::Ops::template dkdv_pds<T, MT, QT, kRowSum>(p, si, h, i0, full, norms, st, dpt, bsum, csum, rk, lg, key, sRq,
                                                      sLse, sDelta, t4);
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
    using Ops = typename Score::Ops;
    const bool norms = Ops::norms(p);
    const bool midpoint = Ops::midpoint(p);

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
        // The score's key scalars (hyperbolic: k0 and log γ_j; 1/‖k‖ above).
        Ops::template load_key_scalars<BN, D>(p, si, hk, n, sK0 + buf * BN, sLg + buf * BN, false, midpoint, tid);
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

    Ops::template dq_epilogue<T, MT, DT>(p, si, h, acc_dq, a, rq, row,
                                         [&](int r, int c) { return to_f32(sQ[r * ld + c]); }, wrow, lane, norms, t4);
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
    using Ops = typename Score::Ops;
    const bool norms = Ops::norms(p);
    const bool midpoint = Ops::midpoint(p);

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
            Ops::bwd_q_row(p, si, h, i, valid, sLse[buf * BM + tid], sRq[buf * BM + tid]);
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

    Ops::template dkdv_epilogue<T, MT, AT, false>(
        p, si, hk, d0, acc_dk, acc_dv, bsum, csum, rk, key, [&](int r, int c) { return to_f32(sK[r * ld + c]); },
        [&](int r, int c) { return to_f32(sV[r * ld + c]); }, wrow, lane, midpoint, norms, t4);
}

}  // namespace attn
