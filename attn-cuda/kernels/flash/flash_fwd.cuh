// Forward pass of the flash skeleton (FlashAttention-2), tensor cores, f16/bf16 in, f32 accumulate.
//
// One block = one (batch b, query head h, query tile of BM = 64·MT rows: MT 16-row mma tiles per
// warp, so each K/V fragment read from shared memory feeds MT MMAs). The Q tile stays in shared memory;
// K and V blocks of BN keys stream through two shared buffers with cp.async (the next block loads
// while this one computes). Per key block, per warp (16·MT query rows):
//   S = Q Kᵀ            [16, BN]   mma.sync m16n8k16, A and B by ldmatrix
//   s = score(S) + bias, masked → −∞     (Score: softmax, cosine-sim or hyperbolic)
//   online softmax: m, l, P = 2^(s − m)  (registers)
//   O = α·O + P V       [16, D]    P straight from registers, V by ldmatrix.trans
// Epilogue: o = O / l (0 for an empty row), LSE = m + ln l (−∞ for an empty row), f32.
// Per-family steps (scores, row and key scalars, statistic) are the score's hooks (Score::Ops, score.h):
// the skeleton names no family.
#pragma once
#include "../common/loads.h"
#include "../common/mask.h"
#include "../common/online_softmax.h"
#include "score.h"
#include "score_ops.cuh"
#include "../common/tiles.h"

namespace attn {

// The column scalars of key block n into shared memory (cp.async, in the caller's commit group; zero
// past the sequence), the score's (Ops::load_key_scalars): for cosine-sim with fused norms 1/‖k‖, for
// hyperbolic scores k0 and, for the Einstein midpoint, log γ_j. `col` takes 1/‖k‖ or k0 (a score has
// one of them), `lg` log γ_j.
template <class Score, int BN, int D>
__device__ __forceinline__ void load_key_scalars(const AttnParams& p, const SeqInfo& si, int hk, int n, float* col,
                                                 float* lg, bool norms, bool midpoint, int tid) {
    Score::Ops::template load_key_scalars<BN, D>(p, si, hk, n, col, lg, norms, midpoint, tid);
}

// The rows of a warp's MT 16-row tiles that this thread owns (two per tile, g and g + 8, from
// `wrow` within the query tile at i0) and the key range [lo, hi) each may attend to.
template <int MT>
__device__ __forceinline__ void fwd_rows(const AttnParams& p, const SeqInfo& si, int i0, int wrow, int g,
                                         int (&row)[MT][2], int (&lo)[MT][2], int (&hi)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            row[mt][r] = i0 + wrow + mt * 16 + g + 8 * r;
            const bool valid = row[mt][r] < si.len_q;
            lo[mt][r] = valid ? si.key_lo(p, row[mt][r]) : 0;
            hi[mt][r] = valid ? si.key_hi(p, row[mt][r]) : 0;
        }
}

// Running state of those rows before the first key block: m (the fixed offset without a running
// max), l = 0, and rq: 1 (cosine-sim fills 1/‖q‖ later), or the score's row scalar
// (Ops::init_q_scalar: hyperbolic q0 with kQ0; without it the wgmma forward forms q0 from its Q tile).
template <class Score, int MT, bool kQ0 = true>
__device__ __forceinline__ void fwd_state_init(const AttnParams& p, const SeqInfo& si, int h, const int (&row)[MT][2],
                                               float (&m)[MT][2], float (&l)[MT][2], float (&rq)[MT][2]) {
    const float m_init = p.running_max ? -CUDART_INF_F : p.max_offset * kLog2e;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            m[mt][r] = m_init;
            l[mt][r] = 0.f;
            rq[mt][r] = 1.f;
            Score::Ops::template init_q_scalar<kQ0>(p, si, h, row[mt][r], rq[mt][r]);
        }
}

// One key block [j0, j0 + BN) for a warp's MT 16-row tiles: scores from the raw products s, the
// online-softmax step, s replaced by the unnormalised probabilities. alpha receives each row's
// rescale factor for the output accumulator (applied by the caller: the Hopper kernel applies it
// only once the previous block's P·V has landed). rk, k0, lg: this key block's column scalars in
// shared memory (1/‖k‖ for cosine-sim; k0 and log γ_j for hyperbolic scores). full: no row of
// the query tile [i0, i0 + bm) masks any key of the block. kK0 (Ops::tc_k0): the raw products hold
// the score's full bilinear form already (hyperbolic: q·k − q0 k0), and k0 is not read. The score's
// hook (Ops::fwd_scores).
template <typename T, class Score, int MT, int NT, bool kK0 = false>
__device__ __forceinline__ void fwd_block_scores(const AttnParams& p, const SeqInfo& si, int h, int j0, bool full,
                                                 bool norms, float (&s)[MT][NT][4], float (&m)[MT][2],
                                                 float (&l)[MT][2], float (&alpha)[MT][2], const float (&rq)[MT][2],
                                                 const int (&row)[MT][2], const int (&lo)[MT][2],
                                                 const int (&hi)[MT][2], const float* rk, const float* k0,
                                                 const float* lg, int t4) {
    Score::Ops::template fwd_scores<T, MT, NT, kK0>(p, si, h, j0, full, norms, s, m, l, alpha, rq, row, lo, hi, rk, k0,
                                                    lg, t4);
}

// Epilogue of a warp's MT 16-row tiles: o = O / l (0 for an empty row), LSE = m + ln l (−∞ for an
// empty row), f32; the statistic is the score's (Ops::row_stat; TaylorScore: l itself).
template <typename T, class Score, int MT, int DT>
__device__ __forceinline__ void fwd_epilogue(const AttnParams& p, const SeqInfo& si, int h,
                                             const float (&acc_o)[MT][DT][4], const float (&m)[MT][2],
                                             const float (&l)[MT][2], const int (&row)[MT][2], int t4) {
    T* o = static_cast<T*>(p.o);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float lsum = quad_sum(l[mt][r]);
            const int i = row[mt][r];
            if (i >= si.len_q) continue;
            const float inv = Score::Ops::inv_sum(lsum);
            T* orow = o + si.o_off(p, i, h);
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                using V2 = typename Vec2<T>::type;
                const uint32_t packed = pack2<T>(acc_o[mt][dt][2 * r] * inv, acc_o[mt][dt][2 * r + 1] * inv);
                *reinterpret_cast<V2*>(orow + dt * 8 + 2 * t4) = *reinterpret_cast<const V2*>(&packed);
            }
            if (t4 == 0) p.lse[si.stats_index(p, h, i)] = Score::Ops::row_stat(p, m[mt][r], lsum);
        }
}

template <typename T, int D, class Score>
__device__ __forceinline__ void flash_fwd(const AttnParams& p) {
    using Tile = FwdTileOf<Score, D>;
    constexpr int MT = Tile::MT, BM = Tile::BM, BN = Tile::BN;
    constexpr int ld = SmemRow<D>::ld;
    constexpr int NT = BN / 8;  // n8 tiles of S per 16-row tile
    constexpr int DT = D / 8;   // n8 tiles of O per 16-row tile
    static_assert(BM == 16 * MT * kWarps, "MT 16-row mma tiles per warp");
    static_assert(BN % 16 == 0 && D % 16 == 0, "tiles are whole k16 steps");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sQ = reinterpret_cast<T*>(smem_raw);  // [BM][ld]
    T* sK = sQ + BM * ld;                    // [2][BN][ld]
    T* sV = sK + 2 * BN * ld;                // [2][BN][ld]
    float* sRk = reinterpret_cast<float*>(sV + 2 * BN * ld);  // [2][BN] cosine: 1/‖k‖
    float* sRq = sRk + 2 * BN;                                 // [BM]    cosine: 1/‖q‖
    float* sK0 = sRk;                                          // [2][BN] hyperbolic: k0
    float* sLg = sRq + BM;                                     // [2][BN] hyperbolic midpoint: log γ_j

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int b, h;
    const int m_block = grid_tile<true>(p, b, h);
    const SeqInfo si(p, b);
    int i0, hk, n_first, n_count;
    if (!query_tile_at<BM, BN>(p, si, h, m_block, i0, hk, n_first, n_count)) return;

    const T* q = static_cast<const T*>(p.q) + si.q_off(p, 0, h);
    const T* k = static_cast<const T*>(p.k) + si.k_off(p, 0, hk);
    const T* v = static_cast<const T*>(p.v) + si.v_off(p, 0, hk);
    using Ops = typename Score::Ops;
    const bool norms = Ops::norms(p);
    const bool midpoint = Ops::midpoint(p);
    // The score's key scalars with the K tile (hyperbolic: k0 and log γ_j; this kernel forms 1/‖k‖
    // from the tile itself).
    auto load_cols = [&](int n, int buf) {
        load_key_scalars<Score, BN, D>(p, si, hk, n, sK0 + buf * BN, sLg + buf * BN, false, midpoint, tid);
    };

    load_tile_async<T, BM, D, kThreads>(sQ, q, p.q_seq, i0, si.len_q, tid);
    if (n_count > 0) {
        load_tile_async<T, BN, D, kThreads>(sK, k, p.k_seq, n_first * BN, si.len_k, tid);
        load_tile_async<T, BN, D, kThreads>(sV, v, p.v_seq, n_first * BN, si.len_k, tid);
        load_cols(n_first, 0);
    }
    cp_async_commit();

    // This thread's rows (2 per 16-row tile) and their key ranges.
    const int g = lane / 4, t4 = lane % 4;
    const int wrow = warp * 16 * MT;  // first row of this warp within the tile
    int row[MT][2], lo[MT][2], hi[MT][2];
    fwd_rows<MT>(p, si, i0, wrow, g, row, lo, hi);
    float acc_o[MT][DT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;
    float m[MT][2], l[MT][2], rq[MT][2];
    fwd_state_init<Score, MT>(p, si, h, row, m, l, rq);

    for (int it = 0; it < n_count; ++it) {
        const int n = n_first + it, buf = it & 1;
        T* sKb = sK + buf * BN * ld;
        T* sVb = sV + buf * BN * ld;
        cp_async_wait<0>();
        __syncthreads();  // block it's tiles have landed; every warp is done with block it − 1's buffers
        if (it + 1 < n_count) {
            load_tile_async<T, BN, D, kThreads>(sK + (buf ^ 1) * BN * ld, k, p.k_seq, (n + 1) * BN, si.len_k, tid);
            load_tile_async<T, BN, D, kThreads>(sV + (buf ^ 1) * BN * ld, v, p.v_seq, (n + 1) * BN, si.len_k, tid);
            load_cols(n + 1, buf ^ 1);
        }
        cp_async_commit();
        if (norms) {  // prologue of the tile: reciprocal norms of its keys (and, once, of the queries)
            tile_inv_norms<T, BN, D, kThreads>(sRk + buf * BN, sKb, p.eps, tid);
            if (it == 0) tile_inv_norms<T, BM, D, kThreads>(sRq, sQ, p.eps, tid);
            __syncthreads();
            if (it == 0) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int r = 0; r < 2; ++r) rq[mt][r] = sRq[wrow + mt * 16 + g + 8 * r];
            }
        }

        // S = Q Kᵀ   [16·MT, BN] per warp
        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) load_a(a[mt], sQ, ld, wrow + mt * 16, kk * 16, lane);
#pragma unroll
            for (int nn = 0; nn < BN / 16; ++nn) {
                uint32_t bf[4];
                load_b_nk(bf, sKb, ld, nn * 16, kk * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816<T>(s[mt][2 * nn], a[mt], bf[0], bf[1]);
                    mma16816<T>(s[mt][2 * nn + 1], a[mt], bf[2], bf[3]);
                }
            }
        }

        const int j0 = n * BN;
        const bool full = si.tile_full(p, i0, i0 + BM, j0, j0 + BN);
        float alpha[MT][2];
        fwd_block_scores<T, Score, MT, NT>(p, si, h, j0, full, norms, s, m, l, alpha, rq, row, lo, hi,
                                           sRk + buf * BN, sK0 + buf * BN, sLg + buf * BN, t4);
        if (Ops::rescales(p)) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) rescale_rows<DT>(acc_o[mt], alpha[mt]);
        }

        // O += P V   [16·MT, D] per warp
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) pack_a<T>(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
            for (int dd = 0; dd < D / 16; ++dd) {
                uint32_t bf[4];
                load_b_kn(bf, sVb, ld, kk * 16, dd * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816<T>(acc_o[mt][2 * dd], a[mt], bf[0], bf[1]);
                    mma16816<T>(acc_o[mt][2 * dd + 1], a[mt], bf[2], bf[3]);
                }
            }
        }
    }
    cp_async_wait<0>();

    fwd_epilogue<T, Score, MT, DT>(p, si, h, acc_o, m, l, row, t4);
}

}  // namespace attn
