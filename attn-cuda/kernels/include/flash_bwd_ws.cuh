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
// warpgroup after a named barrier, as hazards against the producer's refill; kernels/NOTES.md, session
// 17). The consumer warpgroups drift apart freely: while one forms Pᵀ and dS'ᵀ, the other's products
// run. Every score: the hyperbolic scores' q0 per query is copied into sRq beside δ and the LSE (1 for
// the others), and the delta kernel's LSE is less their score's constant; the host dispatches the
// hyperbolic scores here at D = 128 only (hyperbolic.cu, heuristics::ws_dkdv_lorentz).
#pragma once
#include "flash_bwd_wg.cuh"

namespace attn {

// One streamed query block of the warp-specialised dK/dV kernel: flash_bwd_dkdv_wg's loop body without
// its copies and barrier (kept apart from it: the wgmma kernel built from this function spilled 36 bytes
// at D = 64 and measured ~2% slower, kernels/NOTES.md, session 17). Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (shared ×
// shared) as two groups; on fast tiles Pᵀ once Sᵀ is done (dPᵀ still runs), dV += Pᵀ dO issued, dS'ᵀ
// once dPᵀ is done (dV still runs); other tiles form Pᵀ and dS'ᵀ together once both products are done;
// then dK += dS'ᵀ Q issued (registers × shared, dO and Q MN-major). Returns with the dV and dK products
// in flight (reading ap, ads and the block's Q and dO): the caller waits for them. k_addr, v_addr: this
// warpgroup's 64 rows of K, V; qb, dob: the block's Q and dO tiles; sRq, sLse, sDelta its scalars.
template <typename T, int D, class Score, int BN, int BM>
__device__ __forceinline__ void dkdv_ws_block(const AttnParams& p, const SeqInfo& si, int h, int i0, int j0,
                                              uint32_t k_addr, uint32_t v_addr, uint32_t qb, uint32_t dob,
                                              const float* sRq, const float* sLse, const float* sDelta,
                                              const float (&rk)[1][2], const float (&lg)[1][2], const int (&key)[1][2],
                                              float (&bsum)[1][2], float (&csum)[1][2], float (&acc_dk)[1][D / 8][4],
                                              float (&acc_dv)[1][D / 8][4], uint32_t (&ap)[BM / 16][4],
                                              uint32_t (&ads)[BM / 16][4], int t4) {
    constexpr int MT = 1, QT = BM / 8;
    auto a_desc = [&](uint32_t addr, int kk) { return sw128_desc(addr + (kk / 4) * BN * 128 + (kk % 4) * 32, 16, 1024); };
    auto b_desc = [&](uint32_t addr, int kk) { return sw128_desc(addr + (kk / 4) * BM * 128 + (kk % 4) * 32, 16, 1024); };
    auto n_desc = [&](uint32_t addr, int kk) { return sw128_desc(addr + kk * 2048, BM * 128, 1024); };

    float st[MT][QT][4], dpt[MT][QT][4];
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) Wgmma<T, BM>::ss(st[0], a_desc(k_addr, kk), b_desc(qb, kk), kk > 0);
    wg_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) Wgmma<T, BM>::ss(dpt[0], a_desc(v_addr, kk), b_desc(dob, kk), kk > 0);
    wg_commit();

    const bool full = si.tile_full(p, i0, i0 + BM, j0, j0 + BN);
    const bool split = !Score::kLorentz && dkdv_fast<Score>(p, full);
    wg_wait<1>();
    fence_regs<QT>(st[0]);
    if (split) {
        dkdv_fast_p<MT, QT>(p, false, st, rk, sRq, sLse, t4);
    } else {
        wg_wait<0>();
        fence_regs<QT>(dpt[0]);
        dkdv_block_pds<T, Score, MT, QT>(p, si, h, i0, full, false, st, dpt, bsum, csum, rk, lg, key, sRq, sLse,
                                         sDelta, t4);
    }
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) pack_a<T>(ap[kk], st[0][2 * kk], st[0][2 * kk + 1]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) Wgmma<T, D>::rs(acc_dv[0], ap[kk], n_desc(dob, kk), 1);
    wg_commit();
    wg_wait<1>();  // dPᵀ
    fence_regs<QT>(dpt[0]);
    if (split) dkdv_fast_ds<MT, QT>(false, st, dpt, sRq, sDelta, t4);
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) pack_a<T>(ads[kk], dpt[0][2 * kk], dpt[0][2 * kk + 1]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) Wgmma<T, D>::rs(acc_dk[0], ads[kk], n_desc(qb, kk), 1);
    wg_commit();
}

template <typename T, int D, class Score, int BN, int BM, int kStages>
__device__ __forceinline__ void flash_bwd_dkdv_ws(const AttnParams& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int MT = 1;
    constexpr int kConsumers = BN * 2, kProducers = 128;
    constexpr int kProducerRegs = 24, kConsumerRegs = 240;
    static_assert(BN == 128, "two consumer warpgroups of 64 keys");
    static_assert(BM <= kProducers, "one query's scalars per producer thread");
    static_assert(kProducerRegs * kProducers + kConsumerRegs * kConsumers <= 65536, "register file");
    constexpr int AT = D / 8;

    // heuristics::ws_dkdv_smem: 1 KiB of slack, K, V, kStages × (Q, dO), kStages × 3 × BM scalars.
    extern __shared__ __align__(1024) unsigned char smem_ws[];
    unsigned char* base = smem_ws + ((1024u - (smem_addr(smem_ws) & 1023u)) & 1023u);
    T* sK = reinterpret_cast<T*>(base);  // [BN × D] sw128
    T* sV = sK + BN * D;                 // [BN × D] sw128
    T* sQ = sV + BN * D;                 // [kStages][BM × D] sw128
    T* sdO = sQ + kStages * BM * D;      // [kStages][BM × D] sw128
    float* sLse = reinterpret_cast<float*>(sdO + kStages * BM * D);  // [kStages][BM] log2 units
    float* sDelta = sLse + kStages * BM;                              // [kStages][BM]
    float* sRq = sDelta + kStages * BM;                               // [kStages][BM] 1 (hyperbolic: q0)
    // full_kv, full[kStages] (producer arrivals); empty[kStages] (consumer threads).
    __shared__ __align__(8) uint64_t bars[1 + 2 * kStages];
    uint64_t* full_kv = bars;
    uint64_t* full = bars + 1;
    uint64_t* empty = full + kStages;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
    const int b = blockIdx.z, hk = blockIdx.y;
    const SeqInfo si(p, b);
    const int j0 = blockIdx.x * BN;
    if (j0 >= si.key_rows(p)) return;
    int m_first, m_count;
    key_tile_query_blocks<BM, BN>(p, si, j0, m_first, m_count);
    const int iters = j0 < si.len_k ? m_count * p.group : 0;  // padded keys: zero gradients
    auto head_of = [&](int it) { return hk * p.group + it / m_count; };
    auto row0_of = [&](int it) { return (m_first + it % m_count) * BM; };
    if (tid == 0) {
        mbar_init(full_kv, kProducers);
        for (int s = 0; s < kStages; ++s) {
            mbar_init(full + s, kProducers);
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
                if (Score::kLorentz && valid) cp_async_4(sRq + s * BM + pt, p.x0q + at, true);
            }
            mbar_arrive_cp_async(full + s);
        }
        cp_async_wait<0>();
        return;
    }
    regs_inc<kConsumerRegs>();

    const bool norms = Score::kNorms && p.l2norm;  // q̂, k̂ given; dkdv_store writes dk̂ in f32
    const bool midpoint = Score::kLorentz && p.midpoint;
    const int g = lane / 4, t4 = lane % 4;
    const int wrow = warp * 16;
    int key[MT][2];
    float rk[MT][2], lg[MT][2], bsum[MT][2], csum[MT][2];
    bwd_k_rows<Score, D, MT>(p, si, hk, j0 + wrow, g, false, midpoint, key, rk, lg, bsum, csum);
    float acc_dk[MT][AT][4], acc_dv[MT][AT][4];
    zero(acc_dk[0]);
    zero(acc_dv[0]);
    const uint32_t k_addr = smem_addr(sK) + wg * 64 * 128, v_addr = smem_addr(sV) + wg * 64 * 128;
    const uint32_t q_addr = smem_addr(sQ), do_addr = smem_addr(sdO);
    constexpr uint32_t kTile = BM * D * 2;

    mbar_wait(full_kv, 0);
    for (int it = 0; it < iters; ++it) {
        const int s = it % kStages;
        mbar_wait(full + s, (it / kStages) & 1);
        fence_proxy_async();  // the producer's cp.async writes, visible to the wgmma reads

        uint32_t ap[BM / 16][4], ads[BM / 16][4];
        dkdv_ws_block<T, D, Score, BN, BM>(p, si, head_of(it), row0_of(it), j0, k_addr, v_addr, q_addr + s * kTile,
                                           do_addr + s * kTile, sRq + s * BM, sLse + s * BM, sDelta + s * BM, rk, lg,
                                           key, bsum, csum, acc_dk, acc_dv, ap, ads, t4);
        wg_wait<0>();
        fence_regs<AT>(acc_dv[0]);
        fence_regs<AT>(acc_dk[0]);
        fence_regs<BM / 16>(ap);
        fence_regs<BM / 16>(ads);
        mbar_arrive(empty + s);
    }

    if constexpr (Score::kLorentz)
        lorentz_dkdv_epilogue<T, MT, AT>(
            p, si, hk, 0, acc_dk, acc_dv, bsum, csum, rk, key,
            [&](int r, int c) { return to_f32(*reinterpret_cast<const T*>(base + sw128_offset<BN>(r, c))); },
            [&](int r, int c) {
                return to_f32(*reinterpret_cast<const T*>(base + BN * D * 2 + sw128_offset<BN>(r, c)));
            },
            wrow, lane, midpoint);
    else
        dkdv_store<T, MT, AT>(p, si, hk, 0, acc_dk, acc_dv, key, norms, t4);
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
    float* sK0 = reinterpret_cast<float*>(sV + kVs * BN * D);  // [kKs][BN] hyperbolic: k0
    float* sLg = sK0 + kKs * BN;                                // [kKs][BN] hyperbolic midpoint: log γ_j
    // full_q; full_k[kKs], full_v[kVs] (producer arrivals); empty_k[kKs], empty_v[kVs] (consumer threads).
    __shared__ __align__(8) uint64_t bars[1 + 2 * (kKs + kVs)];
    uint64_t* full_q = bars;
    uint64_t* full_k = bars + 1;
    uint64_t* full_v = full_k + kKs;
    uint64_t* empty_k = full_v + kVs;
    uint64_t* empty_v = empty_k + kKs;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
    const int b = blockIdx.z, h = blockIdx.y;
    const SeqInfo si(p, b);
    int i0, hk, n_first, n_count;
    if (!query_tile<BM, BN>(p, si, h, i0, hk, n_first, n_count)) return;
    if (tid == 0) {
        mbar_init(full_q, kProducers);
        for (int s = 0; s < kKs; ++s) {
            mbar_init(full_k + s, kProducers);
            mbar_init(empty_k + s, kConsumers);
        }
        for (int s = 0; s < kVs; ++s) {
            mbar_init(full_v + s, kProducers);
            mbar_init(empty_v + s, kConsumers);
        }
    }
    __syncthreads();
    const bool midpoint = Score::kLorentz && p.midpoint;

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
            if (it >= kVs) mbar_wait(empty_v + vs, (it / kVs - 1) & 1);
            load_tile_sw128<T, BN, D, kProducers>(sV + vs * BN * D, v, p.v_seq, n * BN, si.len_k, pt);
            mbar_arrive_cp_async(full_v + vs);
        }
        cp_async_wait<0>();
        return;
    }
    regs_inc<kConsumerRegs>();

    const bool norms = Score::kNorms && p.l2norm;  // q̂, k̂ given; dq_store writes dq̂ in f32
    const int g = lane / 4, t4 = lane % 4;
    const int wrow = warp * 16;
    int row[MT][2], lo[MT][2], hi[MT][2];
    float lse2[MT][2], delta[MT][2], rq[MT][2], cq[MT][2];
    bwd_q_rows<Score, D, MT>(p, si, h, i0, wrow, g, false, row, lo, hi, lse2, delta, rq, cq);
    float acc_dq[MT][DT][4];
    float a[MT][2] = {{0.f, 0.f}};  // hyperbolic: Σ_j w_ij k0_j, thread-partial
    zero(acc_dq[0]);

    // Descriptors as in flash_bwd_dq_wg: A (K-major) Q, dO rows of this warpgroup; B K-major K_j, V_j;
    // B MN-major for dQ += dS' K: K_j with k = keys, n = D.
    const uint32_t q_addr = smem_addr(sQ) + wg * 64 * 128, do_addr = smem_addr(sdO) + wg * 64 * 128;
    const uint32_t k_addr = smem_addr(sK), v_addr = smem_addr(sV);
    constexpr uint32_t kTile = BN * D * 2;
    auto a_desc = [&](uint32_t addr, int kk) { return sw128_desc(addr + (kk / 4) * BM * 128 + (kk % 4) * 32, 16, 1024); };
    auto b_desc = [&](uint32_t addr, int kk) { return sw128_desc(addr + (kk / 4) * BN * 128 + (kk % 4) * 32, 16, 1024); };
    auto kn_desc = [&](int ks, int kk) { return sw128_desc(k_addr + ks * kTile + kk * 2048, BN * 128, 1024); };

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
        if (it > 0) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) Wgmma<T, D>::rs(acc_dq[0], ads[kk], kn_desc(kp, kk), 1);
        }
        wg_commit();  // empty in block 0
        wg_wait<1>();
        fence_regs<NT>(s[0]);
        fence_regs<NT>(dp[0]);
        mbar_arrive(empty_v + vs);

        const int j0 = n * BN;
        dq_block_ds<T, Score, MT, NT>(p, si, h, j0, si.tile_full(p, i0, i0 + BM, j0, j0 + BN), false, s, dp, a, rq, cq,
                                      lse2, delta, row, lo, hi, sK0 + ks * BN, sK0 + ks * BN, sLg + ks * BN, t4);
        wg_wait<0>();
        fence_regs<DT>(acc_dq[0]);
        fence_regs<BN / 16>(ads);
        if (it > 0) mbar_arrive(empty_k + kp);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) pack_a<T>(ads[kk], s[0][2 * kk], s[0][2 * kk + 1]);
    }
    if (n_count > 0) {  // the last block's dQ product
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) Wgmma<T, D>::rs(acc_dq[0], ads[kk], kn_desc((n_count - 1) % kKs, kk), 1);
        wg_commit();
        wg_wait<0>();
        fence_regs<DT>(acc_dq[0]);
        fence_regs<BN / 16>(ads);
    }

    if constexpr (Score::kLorentz)
        lorentz_dq_epilogue<T, MT, DT>(
            p, si, h, acc_dq, a, rq, row,
            [&](int r, int c) { return to_f32(*reinterpret_cast<const T*>(base + sw128_offset<BM>(r, c))); }, wrow, lane);
    else
        dq_store<T, MT, DT>(p, si, h, acc_dq, row, norms, t4);
#else
    __trap();  // launched only on compute capability 9.0 (host dispatch)
#endif
}

}  // namespace attn

// The warp-specialised dK/dV kernel of a score at D = 64 and 128 (tile WsDkvTile) (NAME_bwd_dkdv_ws_{f16,bf16}_d{D}):
// one block per SM, whose launch bound fixes 168 registers per thread at entry for setmaxnreg to split.
#define ATTN_FLASH_BWD_WS(NAME, SCORE, DT, T, D)                                                                   \
    extern "C" __global__ void __launch_bounds__(attn::WsDkvTile<D>::BN * 2 + 128, 1)                             \
        NAME##_bwd_dkdv_ws_##DT##_d##D(const __grid_constant__ AttnParams p) {                                      \
        attn::flash_bwd_dkdv_ws<T, D, SCORE, attn::WsDkvTile<D>::BN, attn::WsDkvTile<D>::BM,                       \
                                attn::kWsDkvStages>(p);                                                            \
    }
// The warp-specialised dQ kernel of a score (NAME_bwd_dq_ws_{f16,bf16}_d{D}), tile WsDqTile.
#define ATTN_FLASH_BWD_DQ_WS(NAME, SCORE, DT, T, D)                                                                \
    extern "C" __global__ void __launch_bounds__(attn::WsDqTile<D>::BM * 2 + 128, 1)                              \
        NAME##_bwd_dq_ws_##DT##_d##D(const __grid_constant__ AttnParams p) {                                        \
        attn::flash_bwd_dq_ws<T, D, SCORE, attn::WsDqTile<D>::BM, attn::WsDqTile<D>::BN, attn::kWsDqKStages,       \
                              attn::kWsDqVStages>(p);                                                              \
    }
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
