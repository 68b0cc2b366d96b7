// Warp-specialised forward of the flash skeleton on Hopper (sm_90a): the scores, masks, online softmax,
// epilogue and wgmma products of flash_fwd_wg.cuh, with the loads moved to a producer warpgroup, so the
// consumer warpgroups never meet at a block barrier and carry no copy work.
//
// One block per tile (batch b, query head h, query tile of BM = 64·NC rows): the grid is flat, blockIdx.x
// the tile in mask.h's order (persistent_tile; host: dispatch, tiles_q). One block = BM·2 + 128 threads:
//   warpgroups 0..NC−1: consumers, rows 64w..64w+63 (so every per-warp helper of the other forward
//     kernels applies unchanged); after setmaxnreg 232 registers each for NC = 2 (D = 128), 160 for
//     NC = 3 (D = 64);
//   warpgroup NC: producer (40 or 32 registers); cp.async of Q (full_q) and of K_j, V_j into two
//     stages each, and of the score's key scalars (Ops::kKeyCols: hyperbolic k0, log γ) into three;
//     where the score has time-coordinate panels (Ops::tc_k0: hyperbolic on bf16), also the panels of
//     q0's and −k0's pieces beside Q and each K stage (generic stores, a proxy fence and a second
//     arrival on full_q / full_k), whose k16 step adds −q0 k0 to S. Cosine-sim
//     with the l2-norm reads K as the host's normalised copy k̂ (backend.rs; rounded to T as
//     l2-normalise-then-attend has it), so its scores read no per-key scalar; 1/‖q‖ scales the rows.
// No block barrier after the start: each stage has a full barrier (the producer's 128 threads arrive
// when their copies have landed) and an empty one (each consumer warp arrives once, from lane 0,
// when it is done with it); the producer waits on empty before refilling a stage. The hyperbolic
// key scalars are read by the scores after S_j, so they have their own ring of three stages
// (released after the scores, by every consumer thread: they are plain shared loads): K_j's stage is
// free as soon as S_j is done, as for softmax, and the producer's refill of scalar stage j+2 mod 3
// waits for the scores of block j−1, long done.
//
// Consumer warpgroup, per key block j (the same overlap of softmax and P·V as flash_fwd_wg):
//   wait K_j and V_{j−1} full
//   issue S_j = Q K_jᵀ, then O += P_{j−1} V_{j−1}
//   wait for S_j → K_j empty; scores and online softmax of block j → its scalars' stage empty
//   wait for P_{j−1} V_{j−1} → V_{j−1} empty; rescale O by α_j; P_j → A fragments
// The consumer warpgroups drift apart freely. Ordering their products (FlashAttention-3's
// ping-pong, named barriers) measured no faster on the H100.
#pragma once
#include "flash_fwd_wg.cuh"

namespace attn {

template <typename T, int D, class Score, int BM, int BN>
__device__ __forceinline__ void flash_fwd_ws(const AttnParams& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int MT = 1;
    constexpr int kNc = BM / 64;  // consumer warpgroups; the producer is warpgroup kNc
    constexpr int kConsumers = BM * 2, kProducers = 128, kConsumerWarps = kConsumers / 32;
    // Registers after setmaxnreg: the block holds 65536 / (BM·2 + 128) per thread at entry (the
    // launch bound); the producer gives most of its share to the consumers.
    constexpr int kProducerRegs = kNc == 2 ? 40 : 32, kConsumerRegs = kNc == 2 ? 232 : 160;
    static_assert(BM == 128 || BM == 192, "two or three consumer warpgroups");
    static_assert(kProducerRegs * kProducers + kConsumerRegs * kConsumers <= 65536, "register file");
    constexpr int NT = BN / 8;  // n8 tiles of S per warp
    constexpr int DT = D / 8;   // n8 tiles of O per warp
    static_assert(BN % 64 == 0 && BN <= kProducers, "whole sw128 row groups; one scalar per producer thread");
    constexpr int kCs = 3;  // stages of the key scalars
    static_assert(kCs * BN <= 2 * BN + BM, "the scalar ring fits wg_fwd_smem's scalars");
    constexpr int kKs = 2;  // stages of K
    using Ops = typename Score::Ops;
    constexpr bool kK0 = Ops::template tc_k0<T>();  // q0 k0 on the tensor cores: panels beside Q and K

    // The same layout as flash_fwd_wg (host: heuristics::wg_fwd_smem), stages in place of buffers.
    extern __shared__ __align__(1024) unsigned char smem_ws[];
    unsigned char* base = smem_ws + ((1024u - (smem_addr(smem_ws) & 1023u)) & 1023u);
    T* sQ = reinterpret_cast<T*>(base);  // [BM × D] sw128
    T* sK = sQ + BM * D;                 // [kKs][BN × D] sw128
    T* sV = sK + kKs * BN * D;           // [2][BN × D] sw128
    T* sQ0p = sV + 2 * BN * D;           // kK0: [BM × 64] sw128, q0's pieces (Ops::k0_panel_row)
    T* sK0p = sQ0p + BM * 64;            // kK0: [kKs][BN × 64] sw128, −k0's pieces
    float* sK0 = reinterpret_cast<float*>(sV + 2 * BN * D + (kK0 ? (BM + kKs * BN) * 64 : 0));  // [3][BN] k0
    float* sLg = sK0 + 2 * BN + BM;  // [3][BN] hyperbolic midpoint: log γ_j (host: ws_fwd_smem)
    // full_q; full_k[kKs], full_v[2] (producer arrivals; full_k also covers the scalars loaded
    // with K_j; with kK0 full_q and full_k take a second, plain arrival per producer thread after its
    // panel rows); empty_k[kKs], empty_v[2], empty_c[3] (consumer arrivals).
    __shared__ __align__(8) uint64_t bars[1 + 2 * kKs + 4 + kCs];
    uint64_t* full_q = bars;
    uint64_t* full_k = bars + 1;
    uint64_t* full_v = full_k + kKs;
    uint64_t* empty_k = full_v + 2;
    uint64_t* empty_v = empty_k + kKs;
    uint64_t* empty_c = empty_v + 2;

    const int tid = threadIdx.x, lane = tid % 32;
    // Warp and warpgroup through a shuffle from lane 0: warp-uniform to the compiler, so the Q
    // descriptors of the warpgroup's rows live in uniform registers.
    const int warp = __shfl_sync(0xffffffffu, tid / 32, 0), wg = warp / 4;
    constexpr int kFullArrivals = kProducers * (kK0 ? 2 : 1);
    if (tid == 0) {
        mbar_init(full_q, kFullArrivals);
        for (int s = 0; s < kKs; ++s) {
            mbar_init(full_k + s, kFullArrivals);
            mbar_init(empty_k + s, kConsumerWarps);
        }
        for (int s = 0; s < 2; ++s) {
            mbar_init(full_v + s, kProducers);
            mbar_init(empty_v + s, kConsumerWarps);
        }
        // The key scalars are read with plain shared loads: every consumer thread releases its own
        // (racecheck reports one release per warp against the producer's refill, as it did for the
        // backward's stages).
        for (int c = 0; c < kCs; ++c) mbar_init(empty_c + c, kConsumers);
    }
    __syncthreads();

    const bool norms = Ops::norms(p);  // K holds k̂ (the host's copy); rows scaled by 1/‖q‖
    const bool midpoint = Ops::midpoint(p);
    constexpr bool cols = Ops::kKeyCols;  // key scalars the consumers read and release
    int b, h, m_block, i0, hk, n_first, n_count;
    persistent_tile(p, blockIdx.x, b, h, m_block);
    const SeqInfo si(p, b);
    if (!query_tile_at<BM, BN>(p, si, h, m_block, i0, hk, n_first, n_count)) return;  // past its sequence

    if (wg == kNc) {  // producer
        regs_dec<kProducerRegs>();
        const int pt = tid - kConsumers;
        // kK0: the time coordinates of the tile's rows and of the first key block, loaded before the
        // copies are issued (their panels are written once the copies are in flight), and each later
        // key block's one block ahead.
        constexpr int kQRows = (BM + kProducers - 1) / kProducers;
        float q0r[kQRows], k0n = 0.f;
        if constexpr (kK0) {
#pragma unroll
            for (int r = 0; r < kQRows; ++r) {
                const int i = i0 + pt + r * kProducers;
                q0r[r] = pt + r * kProducers < BM && i < si.len_q ? Ops::q_time(p, si, h, i) : 0.f;
            }
            if (n_count > 0) k0n = Ops::k_time(p, si, hk, n_first * BN + pt);
        }
        // The Q panel (after the first key block's copies, or at once without one), then the second
        // arrival on full_q.
        auto q_panel = [&] {
#pragma unroll
            for (int r = 0; r < kQRows; ++r)
                if (pt + r * kProducers < BM) Ops::template k0_panel_row<T, false>(sQ0p, pt + r * kProducers, q0r[r]);
            fence_proxy_async();
            mbar_arrive(full_q);
        };
        const T* q = static_cast<const T*>(p.q) + si.q_off(p, 0, h);
        const T* k = static_cast<const T*>(p.k) + si.k_off(p, 0, hk);
        const T* v = static_cast<const T*>(p.v) + si.v_off(p, 0, hk);
        load_tile_sw128<T, BM, D, kProducers>(sQ, q, p.q_seq, i0, si.len_q, pt);
        mbar_arrive_cp_async(full_q);
        for (int it = 0; it < n_count; ++it) {
            const int s = it % kKs, use = it / kKs, n = n_first + it, c = it % kCs, use_c = it / kCs;
            if (use > 0) mbar_wait(empty_k + s, (use - 1) & 1);
            load_tile_sw128<T, BN, D, kProducers>(sK + s * BN * D, k, p.k_seq, n * BN, si.len_k, pt);
            if (cols && use_c > 0) mbar_wait(empty_c + c, (use_c - 1) & 1);
            load_key_scalars<Score, BN, D>(p, si, hk, n, sK0 + c * BN, sLg + c * BN, false, midpoint, pt);
            mbar_arrive_cp_async(full_k + s);
            if constexpr (kK0) {
                // K_j's panel row pt (its stage was released before K_j's copy above).
                const float k0 = k0n;
                if (it + 1 < n_count) k0n = Ops::k_time(p, si, hk, (n + 1) * BN + pt);
                Ops::template k0_panel_row<T, true>(sK0p + s * BN * 64, pt, k0);
                fence_proxy_async();
                mbar_arrive(full_k + s);
                if (it == 0) q_panel();
            }
            const int vs = it & 1, use_v = it >> 1;
            if (use_v > 0) mbar_wait(empty_v + vs, (use_v - 1) & 1);
            load_tile_sw128<T, BN, D, kProducers>(sV + vs * BN * D, v, p.v_seq, n * BN, si.len_k, pt);
            mbar_arrive_cp_async(full_v + vs);
        }
        if (kK0 && n_count == 0) q_panel();
        cp_async_wait<0>();
        return;
    }
    regs_inc<kConsumerRegs>();

    const int g = lane / 4, t4 = lane % 4;
    const WgFwdOperands<T, D, BM, BN, kK0> ops(sQ, sK, sV, wg, sQ0p, sK0p);  // stages in place of buffers
    mbar_wait(full_q, 0);
    // The key blocks through shuffles too: the lengths come from global memory, which the compiler
    // cannot prove warp-uniform, and the stages' descriptors follow.
    n_first = __shfl_sync(0xffffffffu, n_first, 0);
    n_count = __shfl_sync(0xffffffffu, n_count, 0);
    int row[MT][2], lo[MT][2], hi[MT][2];
    float acc_o[MT][DT][4];
    float m[MT][2], l[MT][2], rq[MT][2];
    wg_fwd_rows_init<Score, D>(p, si, h, i0, warp * 16, g, norms, row, lo, hi, acc_o, m, l, rq);

    uint32_t pa[BN / 16][4];  // P of the previous key block as A fragments
    for (int it = 0; it < n_count; ++it) {
        const int n = n_first + it, s = it % kKs, c = it % kCs, vp = (it - 1) & 1;  // vp: V_{j−1}
        mbar_wait(full_k + s, (it / kKs) & 1);
        if (it > 0) mbar_wait(full_v + vp, ((it - 1) >> 1) & 1);
        fence_proxy_async();  // the producer's cp.async writes, visible to the wgmma reads

        float sc[MT][NT][4];
        ops.products(sc[0], acc_o[0], pa, s, vp, it > 0);  // no P·V in the first block
        wg_wait<1>();
        fence_regs<NT>(sc[0]);
        mbar_arrive_warp(empty_k + s, lane);

        const int j0 = n * BN;
        const bool full = si.tile_full(p, i0, i0 + BM, j0, j0 + BN);
        float alpha[MT][2];
        // K_j holds k̂: the scores see unit key norms (rq still scales the rows).
        fwd_block_scores<T, Score, MT, NT, kK0>(p, si, h, j0, full, false, sc, m, l, alpha, rq, row, lo, hi,
                                                sK0 + c * BN, sK0 + c * BN, sLg + c * BN, t4);
        if (cols) mbar_arrive(empty_c + c);
        wg_wait<0>();
        fence_regs<DT>(acc_o[0]);
        fence_regs<BN / 16>(pa);
        if (it > 0) mbar_arrive_warp(empty_v + vp, lane);
        wg_fwd_next_p<T, Score, D, BN>(p, acc_o[0], alpha[0], sc[0], pa);
    }
    if (n_count > 0) {  // the last block's P·V
        const int s = (n_count - 1) & 1;
        mbar_wait(full_v + s, ((n_count - 1) >> 1) & 1);
        fence_proxy_async();
        ops.last_pv(acc_o[0], pa, s);
        mbar_arrive_warp(empty_v + s, lane);
    }
    fwd_epilogue<T, Score, MT, DT>(p, si, h, acc_o, m, l, row, t4);
#else
    __trap();  // launched only on compute capability 9.0 (host dispatch)
#endif
}

}  // namespace attn

// The warp-specialised forward of a score at D = 64 and 128 (NAME_fwd_ws_{f16,bf16}_d{D}): one
// block per SM, whose launch bound fixes the registers at entry (168 for D = 128's 384 threads, 128
// for D = 64's 512) for setmaxnreg to split.
#define ATTN_FLASH_FWD_WS(NAME, SCORE, DT, T, D)                                                                   \
    extern "C" __global__ void __launch_bounds__(attn::WsFwdTile<D>::BM * 2 + 128, 1)                             \
        NAME##_fwd_ws_##DT##_d##D(const __grid_constant__ AttnParams p) {                                           \
        attn::flash_fwd_ws<T, D, SCORE, attn::WsFwdTile<D>::BM, attn::WsFwdTile<D>::BN>(p);                       \
    }
#define ATTN_FLASH_FWD_WS_ALL(NAME, SCORE)                  \
    ATTN_FLASH_FWD_WS(NAME, SCORE, f16, __half, 64)         \
    ATTN_FLASH_FWD_WS(NAME, SCORE, bf16, __nv_bfloat16, 64) \
    ATTN_FLASH_FWD_WS(NAME, SCORE, f16, __half, 128)        \
    ATTN_FLASH_FWD_WS(NAME, SCORE, bf16, __nv_bfloat16, 128)
