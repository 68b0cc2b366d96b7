// Warp-specialised dK/dV kernel of the Hopper backward (sm_90a): flash_bwd_dkdv_wg's blocks
// (dkdv_ws_block: the same products, per-element code and epilogues), with the loads moved to a
// producer warpgroup, so the two consumer warpgroups never meet at a block barrier and carry no copy
// work (the change that made the forward 15–20% faster at D = 128, flash_fwd_ws.cuh).
//
// One block = BN·2 + 128 threads = (batch b, kv head, key tile of BN = 128 keys):
//   warpgroups 0, 1: consumers, keys 64w..64w+63 (the wgmma kernel's warpgroups); 240 registers each
//     after setmaxnreg;
//   warpgroup 2: producer (24 registers): cp.async of K and V once, then of each query block's Q, dO,
//     δ, LSE (and hyperbolic q0) into kStages stages; then it exits. The LSE in log2 units comes from
//     the delta kernel (common.cu, after δ in the same buffer), so every byte a consumer reads lands by
//     cp.async.
// Each stage has a full barrier (each producer thread arrives through cp.async.mbarrier.arrive when its
// copies have landed) and an empty one (each consumer thread arrives once, after the block's last
// product, which reads Q and dO: an mbarrier arrival releases only the arriving thread's own accesses,
// and compute-sanitizer's racecheck reported the forward's one-arrival-per-warp form, and one per
// warpgroup after a named barrier, as hazards against the producer's refill. The consumer warpgroups drift apart freely: while one forms Pᵀ and dS'ᵀ, the other's products
// run. Every score: the hyperbolic scores' q0 per query is copied into sRq beside δ and the LSE (1 for
// the others), and the delta kernel's LSE is less their score's constant; the host dispatches the
// hyperbolic scores here with their own tile (LorentzWsDkvTile: 64 queries per block at D = 64).
//
// The same kernel with kDq is the fused backward of softmax, cosine-sim and the hyperbolic scores (the
// default; ATTN_CUDA_WG_FUSED=0 turns it off): per query block the consumer warps also store dS'ᵀ (stmatrix), meet at a
// named barrier, each warpgroup forms a 64 × 64 tile of dQ = dS' K, and each warp adds its 16 × 64 f32
// rows into p.dq_acc with one cp.reduce.async.bulk in dq_acc's tiled layout (SeqInfo::dq_acc_index).
// The hyperbolic scores' tile at D = 64 has 64 queries: there each warpgroup forms the block's whole dQ
// over its own 64 keys (kKeySplit, a barrier per warpgroup), and both add into the same rows.
// Hyperbolic scores: dQ's row sums a_i = Σ_j w_ij k0_j go into p.dq_rowsum by f32 atomics, on bf16
// from the dQ product itself where dK's come off the tensor cores too (kTcDq: 8 more columns of B over
// a panel of the keys' k0 pieces; one atomic per row and warpgroup at D = 64, per row from warpgroup 0
// at D = 128, whose dQ columns split between the warpgroups), else (f16; the geodesic at D = 128) per
// element (lorentz_rowsum_add); attn_hyp_dq_store finishes
// dq_i = hyp_grad·(Σ_j w_ij k_j − (a_i/q0_i)·q_i).
#pragma once
#include "flash_bwd_wg.cuh"

namespace attn {

// One streamed query block of the warp-specialised dK/dV kernel: flash_bwd_dkdv_wg's loop body without
// its copies and barrier (kept apart from it: the wgmma kernel built from this function spilled 36 bytes
// at D = 64 and measured ~2% slower on the H100). Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (shared ×
// shared) as two groups; on fast tiles Pᵀ once Sᵀ is done (dPᵀ still runs), dV += Pᵀ dO issued, dS'ᵀ
// once dPᵀ is done (dV still runs); other tiles form Pᵀ and dS'ᵀ together once both products are done;
// then dK += dS'ᵀ Q issued (registers × shared, dO and Q MN-major). Returns with the dV and dK products
// in flight (reading ap, ads and the block's Q and dO): the caller waits for them. k_addr, v_addr: this
// warpgroup's 64 rows of K, V; qb, dob: the block's Q and dO tiles; sRq, sLse, sDelta its scalars.
// The hyperbolic scores on bf16 take Σ_i w_ij q0_i (the dK epilogue's bsum) on tensor cores: q0 as three
// bf16 pieces (hi, mid, lo: 24 bits, exact products) in columns 0..2 of a 64 × 8 MN-major panel beside each
// Q stage, written by the producer, and one m64n8k16 product per k-step beside dK's over the very packed
// w dK reads; lorentz_dkdv_tile then neither rounds w nor sums it per element (at D = 128 too for the
// squared Lorentz score, whose tile splits there: unsplit, the accumulators took the dK/dV kernel's spill from 84 to 140 bytes, and the geodesic's
// from 240 to 312); f16 keeps the per-element sums (q0 may pass f16's range). The dQ kernel takes
// Σ_j w_ij k0_j the same way at both head dims (lorentz_tile.cuh's kLorentzTcK0), and the fused kernel
// in its dQ product (kTcDq). The score says where (Ops::tc_rowsum, Ops::tc_k0).

template <typename T, int D, class Score, int BN, int BM, bool kFull, bool kEven>
__device__ __forceinline__ void dkdv_ws_block(const AttnParams& p, const SeqInfo& si, int h, int i0, int j0,
                                              uint32_t k_addr, uint32_t v_addr, uint32_t qb, uint32_t dob,
                                              uint32_t q0b, float (&acc_b)[1][4],
                                              const float* sRq, const float* sLse, const float* sDelta,
                                              const float (&rk)[1][2], const float (&lg)[1][2], const int (&key)[1][2],
                                              float (&bsum)[1][2], float (&csum)[1][2], float (&acc_dk)[1][D / 8][4],
                                              float (&acc_dv)[1][D / 8][4], uint32_t (&ap)[BM / 16][4],
                                              uint32_t (&ads)[BM / 16][4], int t4) {
    constexpr int MT = 1, QT = BM / 8;
    auto a_desc = [&](uint32_t addr, int kk) {
        return kFull ? sw128_desc(addr + (kk / 4) * BN * 128 + (kk % 4) * 32, 16, 1024) : kmajor_desc<BN>(addr, kk);
    };
    auto b_desc = [&](uint32_t addr, int kk) {
        return kFull ? sw128_desc(addr + (kk / 4) * BM * 128 + (kk % 4) * 32, 16, 1024) : kmajor_desc<BM>(addr, kk);
    };
    auto n_desc = [&](uint32_t addr, int kk) {
        return kFull ? sw128_desc(addr + kk * 2048, BM * 128, 1024) : mnmajor_desc<BM>(addr, kk);
    };

    float st[MT][QT][4], dpt[MT][QT][4];
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) Wgmma<T, BM>::ss(st[0], a_desc(k_addr, kk), b_desc(qb, kk), kk > 0);
    wg_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) Wgmma<T, BM>::ss(dpt[0], a_desc(v_addr, kk), b_desc(dob, kk), kk > 0);
    wg_commit();

    const bool full = si.tile_full(p, i0, i0 + BM, j0, j0 + BN);
    // TaylorScore needs f(s) and f'(s) from one Sᵀ: both once dPᵀ is done (the split held
    // both beside the products in flight and spilled 240 bytes at D = 64). So does the geodesic (ψ).
    // The squared Lorentz score splits like softmax at D = 128 (lorentz_fast_p, lorentz_fast_ds), and
    // in the kernel for calls whose every tile is fast and whose aggregation is Euclidean (kEven: no
    // general tile and no midpoint compiled; the host routes only such calls there, and the kernel traps
    // on any other at its start).
    // The score's split (Ops::ws_split_own, Ops::ws_split: the squared Lorentz score's lorentz_fast_p,
    // lorentz_fast_ds).
    using Ops = typename Score::Ops;
    constexpr bool kOwnSplit = Ops::template ws_split_own<D, kEven>();
    constexpr bool kRowSum = !Ops::template tc_rowsum<T, D>();
    static_assert(!kEven || kOwnSplit, "the every-tile-fast kernel: the squared Lorentz score");
    bool split, mid;
    if constexpr (kEven) {
        split = true;
        mid = false;
    } else {
        split = Ops::template ws_split<D, kEven>(p, full);
        mid = Ops::template ws_split_mid<D, kEven>(p);
    }
    wg_wait<1>();
    fence_regs<QT>(st[0]);
    if (split) {
        Ops::template split_p<D, kEven, MT, QT>(p, mid, st, rk, lg, sRq, sLse, t4);
    } else if constexpr (!kEven) {
        wg_wait<0>();
        fence_regs<QT>(dpt[0]);
        dkdv_block_pds<T, Score, MT, QT, kRowSum>(p, si, h, i0, full, false, st, dpt, bsum, csum, rk, lg, key, sRq,
                                                  sLse, sDelta, t4);
    }
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) pack_a<T>(ap[kk], st[0][2 * kk], st[0][2 * kk + 1]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) Wgmma<T, D>::rs(acc_dv[0], ap[kk], n_desc(dob, kk), 1);
    wg_commit();
    wg_wait<1>();  // dPᵀ
    fence_regs<QT>(dpt[0]);
    if (split) Ops::template split_ds<D, kEven, T, MT, QT, kRowSum>(mid, st, dpt, bsum, csum, sRq, sDelta, t4);
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) pack_a<T>(ads[kk], dpt[0][2 * kk], dpt[0][2 * kk + 1]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) Wgmma<T, D>::rs(acc_dk[0], ads[kk], n_desc(qb, kk), 1);
    if constexpr (!kRowSum) {
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) Wgmma<T, 8>::rs(acc_b, ads[kk], mnmajor_desc<BM>(q0b, kk), 1);
    }
    wg_commit();
}

template <typename T, int D, class Score, int BN, int BM, int kStages, bool kDq = false, bool kEven = false>
__device__ __forceinline__ void flash_bwd_dkdv_ws(const AttnParams& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int MT = 1;
    constexpr int kConsumers = BN * 2, kProducers = 128;
    constexpr int kProducerRegs = 24, kConsumerRegs = 240;
    static_assert(BN == 128, "two consumer warpgroups of 64 keys");
    static_assert(BM <= kProducers, "one query's scalars per producer thread");
    static_assert(kProducerRegs * kProducers + kConsumerRegs * kConsumers <= 65536, "register file");
    // kDq (the fused backward): each consumer warpgroup also forms one 64 × 64 tile of the block's
    // dQ = dS' K (D = 128, BM = 64: columns 64w.. over all BN keys; D = 64, BM = 128: queries 64w.. over
    // all BN keys; D = 64, BM = 64, kKeySplit: all of it over keys 64w..).
    static_assert(!kDq || (D == 128 && BM == 64) || (D == 64 && (BM == 128 || BM == 64)),
                  "fused dQ: one 64 × 64 dQ tile per warpgroup");
    // The hyperbolic scores' fused kernel: 64-query blocks (lorentz_rowsum_add), or at D = 64 the
    // every-tile-fast squared Lorentz kernel's 128 (kEven; the row sums in the dQ product, kTcDq).
    using Ops = typename Score::Ops;
    static_assert(!kDq || !Ops::kRowSums || BM == 64 || kEven, "fused dQ's row sums: the tiles above");
    constexpr bool kKeySplit = kDq && D == 64 && BM == 64;
    constexpr int AT = D / 8;
    // kDq: a warp's 16 × 64 f32 dQ tile in shared memory, in dq_acc's tiled layout (SeqInfo::
    // dq_acc_index: rows of 64, 8-float chunks swizzled by the row): 4 KiB, one bulk reduction.
    constexpr int kDqLd = 64;

    // heuristics::ws_dkdv_smem (kDq: ws_fused_smem): 1 KiB of slack, K, V, kStages × (Q, dO), kDq: two
    // dS'ᵀ tiles, kStages × 3 × BM scalars, kDq: 8 warps × 16 × 64 f32.
    extern __shared__ __align__(1024) unsigned char smem_ws[];
    unsigned char* base = smem_ws + ((1024u - (smem_addr(smem_ws) & 1023u)) & 1023u);
    T* sK = reinterpret_cast<T*>(base);  // [BN × D] sw128
    T* sV = sK + BN * D;                 // [BN × D] sw128
    T* sQ = sV + BN * D;                 // [kStages][BM × D] sw128
    T* sdO = sQ + kStages * BM * D;      // [kStages][BM × D] sw128
    constexpr bool kTc = Ops::template tc_rowsum<T, D>();
    // kTcDq (the fused kernel with kTc): dQ's row sums a_i = Σ_j w_ij k0_j in the dQ product, as 8 more
    // columns of its B operand K: a second sw128 column block of the keys' k0 pieces (hi, mid, lo in
    // columns 0..2, written by the producer), LBO bytes past K. Its
    // chunks 1..kStages hold the stages' q0 panels (rows = the block's queries), which the unfused
    // kernel keeps in panels of their own (sQ0p): 16 KiB less, which the fused kernel at D = 128 needs.
    constexpr bool kTcDq = kDq && kTc;
    static_assert(!kTcDq || kKeySplit || D == 128 || BM == 128, "fused dQ row sums on tensor cores: the tiles above");
    static_assert(!kEven || kTcDq, "the every-tile-fast kernel: bf16, fused");
    static_assert(!kTcDq || (kStages < 8 && BM <= BN), "the q0 panels in chunks 1..kStages of the k0 panel");
    T* sQ0p = sdO + kStages * BM * D;  // kTc && !kTcDq: [kStages][BM × 64] sw128, q0's pieces in columns 0..2
    T* sK0p = sQ0p + (kTc && !kTcDq ? kStages * BM * 64 : 0);  // kTcDq: [BN × 64] sw128
    // Stage s's q0 panel: its own, or chunk 1 + s of the k0 panel (address and the producer's chunk).
    auto q0_panel = [&](int s) { return kTcDq ? sK0p : sQ0p + s * BM * 64; };
    auto q0_chunk = [&](int s) { return kTcDq ? 1 + s : 0; };
    T* sdS = sK0p + (kTcDq ? BN * 64 : 0);  // kDq: [2][BN × BM] sw128, dS'ᵀ (rows = keys) of alternate blocks
    float* sLse = reinterpret_cast<float*>(sdS + (kDq ? 2 * BN * BM : 0));  // [kStages][BM] log2 units
    float* sDelta = sLse + kStages * BM;                                     // [kStages][BM]
    float* sRq = sDelta + kStages * BM;                                      // [kStages][BM] 1 (hyperbolic: q0)
    float* sdQ = sRq + kStages * BM;                                         // kDq: [8][16 × kDqLd]
    // full_kv, full[kStages] (producer arrivals); empty[kStages] (consumer threads).
    __shared__ __align__(8) uint64_t bars[1 + 2 * kStages];
    uint64_t* full_kv = bars;
    uint64_t* full = bars + 1;
    uint64_t* empty = full + kStages;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
    int b, hk;
    const int n_block = grid_tile<false>(p, b, hk);
    const SeqInfo si(p, b);
    const int j0 = n_block * BN;
    if (j0 >= si.key_rows(p)) return;
    if constexpr (kEven) {  // every tile fast (dispatch::fused_even): a routing error traps, never a wrong result
        if (p.causal != 0 || p.window_left >= 0 || p.window_right >= 0 || p.bias != nullptr || p.midpoint != 0 ||
            si.len_q % BM != 0 || si.len_k % BN != 0)
            __trap();
    }
    int m_first, m_count;
    key_tile_query_blocks<BM, BN>(p, si, j0, m_first, m_count);
    const int iters = j0 < si.len_k ? m_count * p.group : 0;  // padded keys: zero gradients
    // kDq: each key tile starts at its own query block (n_block ahead, wrapping), so the blocks of
    // one head reduce into different rows of dq_acc at any one time rather than all into the same 64.
    const int rot = kDq && m_count > 0 ? n_block % m_count : 0;
    auto head_of = [&](int it) { return hk * p.group + it / m_count; };
    auto row0_of = [&](int it) {
        const int m = it % m_count;
        return (m_first + (kDq ? (m + rot) % m_count : m)) * BM;
    };
    if (tid == 0) {
        mbar_init(full_kv, kProducers * (kTcDq ? 2 : 1));  // kTcDq: also the k0 panel's plain arrivals
        for (int s = 0; s < kStages; ++s) {
            mbar_init(full + s, kProducers + (kTc ? BM : 0));  // kTc: also the panel writers' plain arrivals
            mbar_init(empty + s, kConsumers);
        }
    }
    for (int r = tid; r < kStages * BM; r += kConsumers + kProducers) sRq[r] = 1.f;  // softmax, cosine-sim: 1
    __syncthreads();
    const long long stats_len = (long long)p.total_q * p.heads_q;

    if (wg == 2) {  // producer
        regs_dec<kProducerRegs>();
        const int pt = tid - kConsumers;
        load_tile_sw128<T, BN, D, kProducers>(sK, static_cast<const T*>(p.k) + si.k_off(p, 0, hk), p.k_seq, j0,
                                              si.len_k, pt);
        load_tile_sw128<T, BN, D, kProducers>(sV, static_cast<const T*>(p.v) + si.v_off(p, 0, hk), p.v_seq, j0,
                                              si.len_k, pt);
        mbar_arrive_cp_async(full_kv);
        if constexpr (kTcDq) {
            // Row pt of the k0 panel, chunk 0: key j0 + pt's pieces (zeros past the sequence), by a generic
            // store made visible to the wgmma by the proxy fence and a plain (release) arrival.
            static_assert(BN == kProducers, "one panel row per producer thread");
            const int j = j0 + pt;
            Ops::template pieces_panel_row<T>(sK0p, pt, Ops::k_time(p, si, hk, j));
            fence_proxy_async();
            mbar_arrive(full_kv);
        }
        for (int it = 0; it < iters; ++it) {
            const int s = it % kStages, use = it / kStages, h = head_of(it), i0 = row0_of(it);
            if (use > 0) mbar_wait(empty + s, (use - 1) & 1);
            load_tile_sw128<T, BM, D, kProducers>(sQ + s * BM * D, static_cast<const T*>(p.q) + si.q_off(p, 0, h),
                                                  p.q_seq, i0, si.len_q, pt);
            load_tile_sw128<T, BM, D, kProducers>(sdO + s * BM * D, static_cast<const T*>(p.d_o) + si.o_off(p, 0, h),
                                                  p.o_seq, i0, si.len_q, pt);
            if (pt < BM) {  // δ and the log2 LSE of the delta kernel (rows past the sequence: zeros, never read)
                const int i = i0 + pt;
                const bool valid = i < si.len_q;
                const long long at = valid ? si.stats_index(p, h, i) : 0;
                cp_async_4(sDelta + s * BM + pt, p.delta + at, valid);
                cp_async_4(sLse + s * BM + pt, p.delta + stats_len + at, valid);
                // Hyperbolic: q0 of the row (past the sequence the slot keeps a finite earlier q0 or the
                // initial 1: such rows are masked, and their score only needs to stay finite).
                if (Ops::kRowSums && valid) Ops::q_time_async(sRq + s * BM + pt, p, at);
                if constexpr (kTc) {
                    // Row pt of the stage's panel (chunk 0 of its own panel, or chunk 1 + s of the fused
                    // kernel's k0 panel): q0's pieces (zeros past the sequence: those rows' w are 0), by a
                    // generic store made visible to the consumers' wgmma by the proxy fence and a plain
                    // (release) arrival.
                    Ops::template pieces_panel_row<T>(q0_panel(s), pt, valid ? Ops::q_time_at(p, at) : 0.f, q0_chunk(s));
                    fence_proxy_async();
                    mbar_arrive(full + s);
                }
            }
            mbar_arrive_cp_async(full + s);
        }
        cp_async_wait<0>();
        return;
    }
    regs_inc<kConsumerRegs>();

    const bool norms = Ops::norms(p);  // q̂, k̂ given; dkdv_store projects dk̂
    const bool midpoint = Ops::midpoint(p);
    const int g = lane / 4, t4 = lane % 4;
    const int wrow = warp * 16;
    int key[MT][2];
    float rk[MT][2], lg[MT][2], bsum[MT][2], csum[MT][2];
    bwd_k_rows<Score, D, MT>(p, si, hk, j0 + wrow, g, false, midpoint, key, rk, lg, bsum, csum);
    float acc_dk[MT][AT][4], acc_dv[MT][AT][4];
    float acc_b[1][4] = {{0.f, 0.f, 0.f, 0.f}};  // kTc: Σ_i w_ij q0_i per piece (rows g, g + 8; columns 2·t4..)
    zero(acc_dk[0]);
    zero(acc_dv[0]);
    const uint32_t k_addr = smem_addr(sK) + wg * 64 * 128, v_addr = smem_addr(sV) + wg * 64 * 128;
    const uint32_t q_addr = smem_addr(sQ), do_addr = smem_addr(sdO);
    constexpr uint32_t kTile = BM * D * 2;
    // kDq: this warpgroup's dQ tile: queries q0.., columns c0.. of the block; A = dS'ᵀ (MN-major: k =
    // keys, m = queries) from the stored tile, B = K (MN-major: k = keys, n = D) of columns c0...
    // kKeySplit: A = rows 64w.. of dS'ᵀ, B = rows 64w.. of K.
    const int q0 = BM == 128 ? 64 * wg : 0, c0 = D == 128 ? 64 * wg : 0;
    const uint32_t ds_addr = smem_addr(sdS) + (BM == 128 ? wg * BN * 128 : kKeySplit ? wg * 64 * 128 : 0);
    const uint32_t kn_addr = smem_addr(sK) + (D == 128 ? wg * BN * 128 : kKeySplit ? wg * 64 * 128 : 0);
    const float dq_mul = Ops::fused_dq_mul(p);  // the hyperbolic scores: hyp_grad in attn_hyp_dq_store
    // kTcDq: the panel as the second column block of this warpgroup's B (kKeySplit: rows 64w.. of both).
    const uint32_t k0p_lbo = smem_addr(sK0p) + (kKeySplit ? wg * 64 * 128 : 0) - kn_addr;
    float* wdq = sdQ + warp * 16 * kDqLd;  // this warp's 16 rows of the dQ tile

    mbar_wait(full_kv, 0);
    for (int it = 0; it < iters; ++it) {
        const int s = it % kStages;
        mbar_wait(full + s, (it / kStages) & 1);
        fence_proxy_async();  // the producer's cp.async writes, visible to the wgmma reads

        uint32_t ap[BM / 16][4], ads[BM / 16][4];
        const int h = head_of(it), i0 = row0_of(it);
        // The shared addresses of the block's operands, opaque: the descriptors of every k16 step are
        // formed from them per block (ptxas spilled the hoisted ones: 172 bytes in the fused kernel at
        // D = 128, reloaded from L2 before every product). The hyperbolic
        // scores' unfused kernel at D = 128 spills more that way (72 → 180 bytes) and forms each step's
        // descriptor in full (kFull); their fused kernel there spills less the opaque way (64 + 80
        // bytes, against 124 + 140).
        constexpr bool kFull = Ops::template full_descs<D, kDq>();
        uint32_t ka = k_addr, va = v_addr, qa = q_addr + s * kTile, doa = do_addr + s * kTile;
        if constexpr (!kFull) {
            opaque(ka);
            opaque(va);
            opaque(qa);
            opaque(doa);
        }
        dkdv_ws_block<T, D, Score, BN, BM, kFull, kEven>(p, si, h, i0, j0, ka, va, qa, doa,
                                           smem_addr(q0_panel(s)) + 16 * q0_chunk(s), acc_b, sRq + s * BM, sLse + s * BM,
                                           sDelta + s * BM, rk, lg, key, bsum, csum, acc_dk, acc_dv, ap, ads, t4);
        if constexpr (kDq) {
            // dS'ᵀ of this warp's 16 keys (the dK product's A fragments, which it only reads) into the
            // block's tile; the tile of block it − 2 is free: both warpgroups passed block it − 1's
            // barrier after waiting for their dQ product of block it − 2.
            // One stmatrix per k16 step: lane l addresses row l % 8 of 8 × 8 matrix l / 8 (rows +8 for
            // odd matrices, columns +8 for the upper two), in the sw128 layout (16-byte chunk c of row r
            // at c ^ (r % 8)).
            // The lane is opaque here so that the addresses are formed per block (hoisted, they spill).
            const uint32_t tile = (it & 1) * BN * BM * 2;
            uint32_t l = lane;
            opaque(l);
            const uint32_t ds_row = smem_addr(sdS) + tile + (wrow + (l & 7) + 8 * ((l >> 3) & 1)) * 128;
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk) {
                const uint32_t chunk = 2 * kk + (l >> 4);  // 16-byte chunk of the row, before the swizzle
                stsm_x4(ds_row + (chunk / 8) * BN * 128 + (((chunk % 8) ^ (l & 7)) << 4), ads[kk]);
            }
            if constexpr (Ops::kRowSums && !kTcDq) Ops::template ws_fused_rowsum<T, BM>(p, si, h, i0, ads, rk, lane);
            fence_proxy_async();
            if constexpr (kKeySplit)
                named_bar_sync(2 + wg, kConsumers / 2);  // this warpgroup's keys of dS'ᵀ are stored
            else
                named_bar_sync(1, kConsumers);  // both warpgroups' keys of dS'ᵀ are stored
            wg_wait<1>();  // the dV product: Pᵀ's registers are free before dQ's accumulators live
            fence_regs<AT>(acc_dv[0]);
            fence_regs<BM / 16>(ap);
            constexpr int kDqN = kTcDq ? 72 : 64;
            float acc_q[kDqN / 8][4];
            uint32_t dsa = ds_addr + tile, kna = kn_addr;
            opaque(dsa);
            opaque(kna);
            dq_tile_product<T, BN, kKeySplit ? 64 : BN, kDqN>(acc_q, dsa, kna, kTcDq ? k0p_lbo : BN * 128);
            wg_wait<0>();
            fence_regs<kDqN / 8>(acc_q);
            fence_regs<AT>(acc_dk[0]);
            fence_regs<1>(acc_b);
            fence_regs<BM / 16>(ads);
            mbar_arrive(empty + s);
            // The warp's 16 rows × 64 columns of dQ, scaled, into its shared tile in dq_acc's tiled
            // layout (row r's chunk j at j ^ (r % 8): the row index of the sequence is a multiple of
            // 16 plus r), once the bulk reduction of the previous block has read it; then one 4 KiB
            // bulk f32 reduction by lane 0, or at a sequence's end one 256-byte reduction per valid
            // row by lanes 0..15.
            const int iw = i0 + q0 + (warp % 4) * 16;  // the warp's first query row
            const int rows = min(16, si.len_q - iw);
            if constexpr (kTcDq) {
                // Columns 64 + 2·t4 + {0, 1} of rows g, g + 8: the pieces' sums at t4 = 0 (hi, mid) and 1
                // (lo, 0); the other columns are zero. One atomic per row and warpgroup (kKeySplit: each
                // over its keys; BM = 128: each for its own queries), or at D = 128 warpgroup 0's (each
                // has all the keys, for its columns).
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float a = acc_q[8][2 * r] + acc_q[8][2 * r + 1];
                    a += __shfl_xor_sync(0xffffffffu, a, 1);
                    if ((kKeySplit || BM == 128 || wg == 0) && t4 == 0 && g + 8 * r < rows)
                        atomicAdd(p.dq_rowsum + si.stats_index(p, h, iw + g + 8 * r), a);
                }
            }
            if (lane < 16) bulk_wait_read<0>();
            __syncwarp();
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    *reinterpret_cast<float2*>(wdq + (g + 8 * r) * kDqLd + ((j ^ g) << 3) + 2 * t4) =
                        make_float2(acc_q[j][2 * r] * dq_mul, acc_q[j][2 * r + 1] * dq_mul);
            fence_proxy_async();
            __syncwarp();
            if (lane < 16) {
                float* dst = p.dq_acc + si.dq_acc_index(p, h, iw, c0) + lane * 64;  // row iw + lane, chunk 0
                if (rows == 16) {
                    if (lane == 0) bulk_reduce_add_f32(dst, smem_addr(wdq), 16 * 64 * 4);
                } else if (lane < rows) {
                    bulk_reduce_add_f32(dst, smem_addr(wdq + lane * kDqLd), 64 * 4);
                }
                bulk_commit();
            }
        } else {
            wg_wait<0>();
            fence_regs<AT>(acc_dv[0]);
            fence_regs<AT>(acc_dk[0]);
            fence_regs<1>(acc_b);
            fence_regs<BM / 16>(ap);
            fence_regs<BM / 16>(ads);
            mbar_arrive(empty + s);
        }
    }
    if constexpr (kDq) {
        if (lane < 16) bulk_wait<0>();  // the shared rows stay until read, the sums land before exit
    }

    if constexpr (kTc) {  // the pieces' columns 2·t4, 2·t4 + 1 (0..2 hold q0): the epilogue sums the quad
#pragma unroll
        for (int r = 0; r < 2; ++r) bsum[0][r] = acc_b[0][2 * r] + acc_b[0][2 * r + 1];
    }
    Ops::template dkdv_epilogue<T, MT, AT, true>(
        p, si, hk, 0, acc_dk, acc_dv, bsum, csum, rk, key,
        [&](int r, int c) { return to_f32(*reinterpret_cast<const T*>(base + sw128_offset<BN>(r, c))); },
        [&](int r, int c) { return to_f32(*reinterpret_cast<const T*>(base + BN * D * 2 + sw128_offset<BN>(r, c))); },
        wrow, lane, midpoint, norms, t4);
#else
    __trap();  // launched only on compute capability 9.0 (host dispatch)
#endif
}

// Warp-specialised dQ kernel: flash_bwd_dq_wg's blocks with the copies in a producer warpgroup. One block
// = BM·2 + 128 threads = (batch b, query head h, query tile of BM = 128 rows): two consumer warpgroups
// (64 query rows each, 240 registers) and the producer (24 registers), which copies Q and dO once, then
// K_j with its key scalars (1/‖k‖ is not needed: cosine-sim reads k̂; hyperbolic k0, log γ) into kKs
// stages and V_j into kVs stages. Per key block j a consumer warpgroup:
//   waits for K_j and V_j; issues S_j = Q K_jᵀ and dP_j = dO V_jᵀ, then dQ += dS'_{j−1} K_{j−1};
//   waits for S_j, dP_j → V_j's stage empty; dS'_j (dq_block_ds, reading K_j's scalars);
//   waits for the dQ product → K_{j−1}'s stage empty (its scalars were read in block j − 1).
// So K_j's stage is held from block j to the end of block j + 1: with kKs = 4 the producer is two
// blocks ahead. Every score (the hyperbolic key scalars ride with K_j, by cp.async).
template <typename T, int D, class Score, int BM, int BN, int kKs, int kVs>
__device__ __forceinline__ void flash_bwd_dq_ws(const AttnParams& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int MT = 1;
    constexpr int kConsumers = BM * 2, kProducers = 128;
    constexpr int kProducerRegs = 24, kConsumerRegs = 240;
    static_assert(BM == 128, "two consumer warpgroups of 64 query rows");
    static_assert(BN <= kProducers && kKs >= 3 && kVs >= 2, "one key's scalars per producer thread; stages");
    static_assert(kProducerRegs * kProducers + kConsumerRegs * kConsumers <= 65536, "register file");
    constexpr int NT = BN / 8, DT = D / 8;

    // heuristics::ws_dq_smem: 1 KiB of slack, Q, dO, kKs K stages, kVs V stages, kKs × BN of k0 and of log γ.
    extern __shared__ __align__(1024) unsigned char smem_ws[];
    unsigned char* base = smem_ws + ((1024u - (smem_addr(smem_ws) & 1023u)) & 1023u);
    T* sQ = reinterpret_cast<T*>(base);  // [BM × D] sw128
    T* sdO = sQ + BM * D;                // [BM × D] sw128
    T* sK = sdO + BM * D;                // [kKs][BN × D] sw128
    T* sV = sK + kKs * BN * D;           // [kVs][BN × D] sw128
    // kTc (the hyperbolic scores on bf16): dQ's row sums a_i = Σ_j w_ij k0_j on tensor cores, an m64n8
    // product beside dQ's over the same dS' fragments and a panel of K_j's k0 pieces per K stage (hi,
    // mid, lo in columns 0..2; the producer writes it), instead of an FMA per element.
    using Ops = typename Score::Ops;
    constexpr bool kTc = Ops::template tc_k0<T>();
    T* sK0p = sV + kVs * BN * D;                                               // kTc: [kKs][BN × 64] sw128
    float* sK0 = reinterpret_cast<float*>(sK0p + (kTc ? kKs * BN * 64 : 0));  // [kKs][BN] hyperbolic: k0
    float* sLg = sK0 + kKs * BN;  // [kKs][BN] hyperbolic midpoint: log γ_j
    // full_q; full_k[kKs], full_v[kVs] (producer arrivals); empty_k[kKs], empty_v[kVs] (consumer threads).
    __shared__ __align__(8) uint64_t bars[1 + 2 * (kKs + kVs)];
    uint64_t* full_q = bars;
    uint64_t* full_k = bars + 1;
    uint64_t* full_v = full_k + kKs;
    uint64_t* empty_k = full_v + kVs;
    uint64_t* empty_v = empty_k + kKs;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
    int b, h;
    const int m_block = grid_tile<true>(p, b, h);
    const SeqInfo si(p, b);
    int i0, hk, n_first, n_count;
    if (!query_tile_at<BM, BN>(p, si, h, m_block, i0, hk, n_first, n_count)) return;
    if (tid == 0) {
        mbar_init(full_q, kProducers);
        for (int s = 0; s < kKs; ++s) {
            mbar_init(full_k + s, kProducers + (kTc ? BN : 0));  // kTc: also the panel writers' plain arrivals
            mbar_init(empty_k + s, kConsumers);
        }
        for (int s = 0; s < kVs; ++s) {
            mbar_init(full_v + s, kProducers);
            mbar_init(empty_v + s, kConsumers);
        }
    }
    __syncthreads();
    const bool midpoint = Ops::midpoint(p);

    if (wg == 2) {  // producer
        regs_dec<kProducerRegs>();
        const int pt = tid - kConsumers;
        const T* k = static_cast<const T*>(p.k) + si.k_off(p, 0, hk);
        const T* v = static_cast<const T*>(p.v) + si.v_off(p, 0, hk);
        load_tile_sw128<T, BM, D, kProducers>(sQ, static_cast<const T*>(p.q) + si.q_off(p, 0, h), p.q_seq, i0,
                                              si.len_q, pt);
        load_tile_sw128<T, BM, D, kProducers>(sdO, static_cast<const T*>(p.d_o) + si.o_off(p, 0, h), p.o_seq, i0,
                                              si.len_q, pt);
        mbar_arrive_cp_async(full_q);
        for (int it = 0; it < n_count; ++it) {
            const int n = n_first + it, ks = it % kKs, vs = it % kVs;
            if (it >= kKs) mbar_wait(empty_k + ks, (it / kKs - 1) & 1);
            load_tile_sw128<T, BN, D, kProducers>(sK + ks * BN * D, k, p.k_seq, n * BN, si.len_k, pt);
            load_key_scalars<Score, BN, D>(p, si, hk, n, sK0 + ks * BN, sLg + ks * BN, false, midpoint, pt);
            mbar_arrive_cp_async(full_k + ks);
            if constexpr (kTc) {
                if (pt < BN) {  // row pt of the stage's panel, chunk 0 (as the fused kernel's k0 panel)
                    const int j = n * BN + pt;
                    Ops::template pieces_panel_row<T>(sK0p + ks * BN * 64, pt, Ops::k_time(p, si, hk, j));
                    fence_proxy_async();
                    mbar_arrive(full_k + ks);
                }
            }
            if (it >= kVs) mbar_wait(empty_v + vs, (it / kVs - 1) & 1);
            load_tile_sw128<T, BN, D, kProducers>(sV + vs * BN * D, v, p.v_seq, n * BN, si.len_k, pt);
            mbar_arrive_cp_async(full_v + vs);
        }
        cp_async_wait<0>();
        return;
    }
    regs_inc<kConsumerRegs>();

    const bool norms = Ops::norms(p);  // q̂, k̂ given; dq_store writes dq̂ in f32
    const int g = lane / 4, t4 = lane % 4;
    const int wrow = warp * 16;
    int row[MT][2], lo[MT][2], hi[MT][2];
    float lse2[MT][2], delta[MT][2], rq[MT][2], cq[MT][2];
    bwd_q_rows<Score, D, MT>(p, si, h, i0, wrow, g, false, row, lo, hi, lse2, delta, rq, cq);
    float acc_dq[MT][DT][4];
    float a[MT][2] = {{0.f, 0.f}};  // hyperbolic: Σ_j w_ij k0_j, thread-partial
    float acc_a[1][4] = {{0.f, 0.f, 0.f, 0.f}};  // kTc: Σ_j w_ij k0_j per piece (rows g, g + 8; columns 2·t4..)
    zero(acc_dq[0]);

    // Descriptors as in flash_bwd_dq_wg: A (K-major) Q, dO rows of this warpgroup; B K-major K_j, V_j;
    // B MN-major for dQ += dS' K: K_j with k = keys, n = D.
    const uint32_t q_addr = smem_addr(sQ) + wg * 64 * 128, do_addr = smem_addr(sdO) + wg * 64 * 128;
    const uint32_t k_addr = smem_addr(sK), v_addr = smem_addr(sV);
    constexpr uint32_t kTile = BN * D * 2;
    auto a_desc = [&](uint32_t addr, int kk) { return kmajor_desc<BM>(addr, kk); };
    auto b_desc = [&](uint32_t addr, int kk) { return kmajor_desc<BN>(addr, kk); };
    auto kn_desc = [&](int ks, int kk) { return mnmajor_desc<BN>(k_addr + ks * kTile, kk); };
    auto k0p_desc = [&](int ks, int kk) { return mnmajor_desc<BN>(smem_addr(sK0p) + ks * BN * 128, kk); };

    mbar_wait(full_q, 0);
    uint32_t ads[BN / 16][4];  // dS' of the previous key block as A fragments
    for (int it = 0; it < n_count; ++it) {
        const int n = n_first + it, ks = it % kKs, vs = it % kVs, kp = (it + kKs - 1) % kKs;  // kp: K_{j−1}
        mbar_wait(full_k + ks, (it / kKs) & 1);
        mbar_wait(full_v + vs, (it / kVs) & 1);
        fence_proxy_async();  // the producer's cp.async writes, visible to the wgmma reads

        float s[MT][NT][4], dp[MT][NT][4];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) Wgmma<T, BN>::ss(s[0], a_desc(q_addr, kk), b_desc(k_addr + ks * kTile, kk), kk > 0);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            Wgmma<T, BN>::ss(dp[0], a_desc(do_addr, kk), b_desc(v_addr + vs * kTile, kk), kk > 0);
        wg_commit();
        // Block 0 has no dQ product. At D = 128 it commits no group for it (ptxas fills an empty group
        // with a dummy HGMMA that ran every block: 3–8% of the kernel's stall samples in an H100
        // profile); at D = 64 the two paths spill 40 bytes, so it keeps the empty group.
        constexpr bool kNoEmptyGroup = D == 128;
        if (it > 0 || !kNoEmptyGroup) {
            if (it > 0) {
#pragma unroll
                for (int kk = 0; kk < BN / 16; ++kk) Wgmma<T, D>::rs(acc_dq[0], ads[kk], kn_desc(kp, kk), 1);
                if constexpr (kTc) {
#pragma unroll
                    for (int kk = 0; kk < BN / 16; ++kk) Wgmma<T, 8>::rs(acc_a, ads[kk], k0p_desc(kp, kk), 1);
                }
            }
            wg_commit();
            wg_wait<1>();
        } else {
            wg_wait<0>();
        }
        fence_regs<NT>(s[0]);
        fence_regs<NT>(dp[0]);
        mbar_arrive(empty_v + vs);

        const int j0 = n * BN;
        dq_block_ds<T, Score, MT, NT, !kTc>(p, si, h, j0, si.tile_full(p, i0, i0 + BM, j0, j0 + BN), false, s, dp, a,
                                            rq, cq, lse2, delta, row, lo, hi, sK0 + ks * BN, sK0 + ks * BN,
                                            sLg + ks * BN, t4);
        wg_wait<0>();
        fence_regs<DT>(acc_dq[0]);
        fence_regs<1>(acc_a);
        fence_regs<BN / 16>(ads);
        if (it > 0) mbar_arrive(empty_k + kp);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) pack_a<T>(ads[kk], s[0][2 * kk], s[0][2 * kk + 1]);
    }
    if (n_count > 0) {  // the last block's dQ product
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) Wgmma<T, D>::rs(acc_dq[0], ads[kk], kn_desc((n_count - 1) % kKs, kk), 1);
        if constexpr (kTc) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) Wgmma<T, 8>::rs(acc_a, ads[kk], k0p_desc((n_count - 1) % kKs, kk), 1);
        }
        wg_commit();
        wg_wait<0>();
        fence_regs<DT>(acc_dq[0]);
        fence_regs<1>(acc_a);
        fence_regs<BN / 16>(ads);
    }

    if constexpr (kTc) {  // the pieces' columns 2·t4, 2·t4 + 1 (0..2 hold k0): the epilogue sums the quad
#pragma unroll
        for (int r = 0; r < 2; ++r) a[0][r] = acc_a[0][2 * r] + acc_a[0][2 * r + 1];
    }
    Ops::template dq_epilogue<T, MT, DT>(
        p, si, h, acc_dq, a, rq, row,
        [&](int r, int c) { return to_f32(*reinterpret_cast<const T*>(base + sw128_offset<BM>(r, c))); }, wrow, lane,
        norms, t4);
#else
    __trap();  // launched only on compute capability 9.0 (host dispatch)
#endif
}

}  // namespace attn

// The warp-specialised dK/dV kernel of a score at D = 64 and 128 (tile WsDkvTile) (NAME_bwd_dkdv_ws_{f16,bf16}_d{D}):
// one block per SM, whose launch bound fixes 168 registers per thread at entry for setmaxnreg to split.
#define ATTN_FLASH_BWD_WS(NAME, SCORE, DT, T, D)                                                                   \
    extern "C" __global__ void __launch_bounds__(attn::WsDkvTileOf<SCORE, D>::BN * 2 + 128, 1)                    \
        NAME##_bwd_dkdv_ws_##DT##_d##D(const __grid_constant__ AttnParams p) {                                      \
        attn::flash_bwd_dkdv_ws<T, D, SCORE, attn::WsDkvTileOf<SCORE, D>::BN, attn::WsDkvTileOf<SCORE, D>::BM,     \
                                attn::kWsDkvStages>(p);                                                            \
    }
// The warp-specialised dQ kernel of a score (NAME_bwd_dq_ws_{f16,bf16}_d{D}), tile WsDqTile.
#define ATTN_FLASH_BWD_DQ_WS(NAME, SCORE, DT, T, D)                                                                \
    extern "C" __global__ void __launch_bounds__(attn::WsDqTile<D>::BM * 2 + 128, 1)                              \
        NAME##_bwd_dq_ws_##DT##_d##D(const __grid_constant__ AttnParams p) {                                        \
        attn::flash_bwd_dq_ws<T, D, SCORE, attn::WsDqTile<D>::BM, attn::WsDqTile<D>::BN, attn::kWsDqKStages,       \
                              attn::kWsDqVStages>(p);                                                              \
    }
// The warp-specialised fused backward of a score (NAME_bwd_fused_ws_{f16,bf16}_d{D}): the dK/dV kernel that
// also reduces each query block's dQ into p.dq_acc, tile WsDkvTileOf (the hyperbolic scores' own), kWsFusedStages.
#define ATTN_FLASH_BWD_FUSED_WS(NAME, SCORE, DT, T, D)                                                             \
    extern "C" __global__ void __launch_bounds__(attn::WsDkvTileOf<SCORE, D>::BN * 2 + 128, 1)                    \
        NAME##_bwd_fused_ws_##DT##_d##D(const __grid_constant__ AttnParams p) {                                     \
        attn::flash_bwd_dkdv_ws<T, D, SCORE, attn::WsDkvTileOf<SCORE, D>::BN, attn::WsDkvTileOf<SCORE, D>::BM,     \
                                attn::kWsFusedStages, true>(p);                                                    \
    }
// The fused backward for calls whose every tile is fast (no mask, no bias, every sequence's lengths
// multiples of 128: dispatch::fused_even) and whose aggregation is Euclidean, on bf16 at D = 64 with
// 128-query blocks (NAME_bwd_fused_ws_even_bf16_d64): without the general tile's code and the midpoint
// the 128-query tile spills 76 + 84 bytes (softmax's fused kernel: 120 + 92); with both, 408 + 384, and
// with the midpoint alone 236 + 280 (ptxas, sm_90a).
#define ATTN_FLASH_BWD_FUSED_WS_EVEN(NAME, SCORE)                                                            \
    extern "C" __global__ void __launch_bounds__(128 * 2 + 128, 1)                                           \
        NAME##_bwd_fused_ws_even_bf16_d64(const __grid_constant__ AttnParams p) {                            \
        attn::flash_bwd_dkdv_ws<__nv_bfloat16, 64, SCORE, 128, 128, attn::kWsFusedStages, true, true>(p); \
    }
#define ATTN_FLASH_BWD_FUSED_WS_ALL(NAME, SCORE)                  \
    ATTN_FLASH_BWD_FUSED_WS(NAME, SCORE, f16, __half, 64)         \
    ATTN_FLASH_BWD_FUSED_WS(NAME, SCORE, bf16, __nv_bfloat16, 64) \
    ATTN_FLASH_BWD_FUSED_WS(NAME, SCORE, f16, __half, 128)        \
    ATTN_FLASH_BWD_FUSED_WS(NAME, SCORE, bf16, __nv_bfloat16, 128)
#define ATTN_FLASH_BWD_DQ_WS_ALL(NAME, SCORE)                  \
    ATTN_FLASH_BWD_DQ_WS(NAME, SCORE, f16, __half, 64)         \
    ATTN_FLASH_BWD_DQ_WS(NAME, SCORE, bf16, __nv_bfloat16, 64) \
    ATTN_FLASH_BWD_DQ_WS(NAME, SCORE, f16, __half, 128)        \
    ATTN_FLASH_BWD_DQ_WS(NAME, SCORE, bf16, __nv_bfloat16, 128)
#define ATTN_FLASH_BWD_WS_ALL(NAME, SCORE)                  \
    ATTN_FLASH_BWD_WS(NAME, SCORE, f16, __half, 64)         \
    ATTN_FLASH_BWD_WS(NAME, SCORE, bf16, __nv_bfloat16, 64) \
    ATTN_FLASH_BWD_WS(NAME, SCORE, f16, __half, 128)        \
    ATTN_FLASH_BWD_WS(NAME, SCORE, bf16, __nv_bfloat16, 128)
