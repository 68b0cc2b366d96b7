// Backward pass of the flash skeleton on Hopper (sm_90a): the two deterministic kernels of
// flash_bwd.cuh (dQ; dK and dV) with warpgroup MMAs (wgmma) instead of mma.sync. Same math, same
// per-element code (dq_block_ds, dkdv_block_pds), same epilogues; only the products and the shared
// tiles differ (the sw128 layout of wgmma.h, loaded by cp.async).
//
// Both kernels take one barrier per streamed block, at its top (its tiles have landed, and every warp
// is done with the previous block's products), and issue the next block's cp.async right after their
// first products, so the copies' address work runs under the tensor cores (measured on the H100).
//
// dQ: one block = BM / 64 warpgroups = one (batch b, query head h, query tile of BM rows); Q and dO
// stay in shared memory, K and V blocks of BN keys stream. Per key block j:
//   barrier; issue S_j = Q K_jᵀ and dP_j = dO V_jᵀ (both operands from shared memory), then
//   dQ += dS'_{j−1} K_{j−1} (dS' from registers, K MN-major: the descriptor transposes it);
//   cp.async K_{j+1}, V_{j+1} (into the buffers of K_{j−2}, V_{j−1});
//   wait for S_j, dP_j; dS'_j in registers (overlaps the dQ product on the tensor cores);
//   wait for the dQ product; dS'_j → A fragments.
// K_{j−1} is still read while K_{j+1} lands, so K takes three buffers, V two. Load groups: 0 = {Q,
// dO, K_0, V_0}, j + 1 = {K_{j+1}, V_{j+1}} (committed in block j), all landed at the top of j + 1.
//
// Cosine-sim with the l2-norm: Q and K are the host's normalised copies q̂ and k̂ (rounded to T, as
// l2-normalise-then-attend has them; backend.rs), so the per-element code is softmax's and the
// products give the normalised gradients dq̂, dk̂, stored in f32 and projected by the row kernels.
//
// dK/dV: one block = BN / 64 warpgroups = one (batch b, kv head, key tile of BN keys); K and V stay,
// blocks of BM queries (every query head of the GQA group, every query tile that sees these keys)
// stream through two buffers. Per query block: barrier; issue Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (shared ×
// shared) as two groups; cp.async the next block; on fast tiles Pᵀ once Sᵀ is done (dPᵀ still runs),
// issue dV += Pᵀ dO, dS'ᵀ once dPᵀ is done (dV still runs), issue dK += dS'ᵀ Q (registers × shared,
// dO and Q MN-major); other tiles form Pᵀ and dS'ᵀ together once both products are done. The
// warp-specialised dK/dV kernel (flash_bwd_ws.cuh) runs the same block with a producer warpgroup doing
// the copies.
#pragma once
#include "flash_bwd.cuh"
#include "flash_fwd_wg.cuh"

namespace attn {

// dQ (64 queries × 64 columns) = dS' K over KEYS keys of a key tile (all BN, or from a row of it), the
// fused backward's product: A = dS'ᵀ from the sw128 tile at ds_addr (rows = keys), B = 64 columns of K
// from the sw128 tile at kn_addr, both MN-major; issued and committed as one group (the caller waits).
// N = 72 (the hyperbolic scores' fused kernel, flash_bwd_ws.cuh): B's columns 64..71 are the first 8 of
// the sw128 column block kn_lbo bytes past kn_addr (by default K's own next column block).
template <typename T, int BN, int KEYS = BN, int N = 64>
__device__ __forceinline__ void dq_tile_product(float (&acc_q)[N / 8][4], uint32_t ds_addr, uint32_t kn_addr,
                                                uint32_t kn_lbo = BN * 128) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; ++kk)
        Wgmma<T, N>::ss_tt(acc_q, mnmajor_desc<BN>(ds_addr, kk), Sw128Desc(kn_addr, kn_lbo, 1024).at16(kk * 128),
                           kk > 0);
    wg_commit();
}

template <typename T, int D, class Score, int BM, int BN>
__device__ __forceinline__ void flash_bwd_dq_wg(const AttnParams& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int MT = 1;
    constexpr int kWgThreads = BM * 2;
    constexpr int NT = BN / 8, DT = D / 8;
    static_assert(BM % 64 == 0 && BN % 64 == 0, "64 rows per warpgroup, whole sw128 row groups");

    extern __shared__ __align__(1024) unsigned char smem_wg[];
    unsigned char* base = smem_wg + ((1024u - (smem_addr(smem_wg) & 1023u)) & 1023u);
    T* sQ = reinterpret_cast<T*>(base);  // [BM × D] sw128
    T* sdO = sQ + BM * D;                // [BM × D] sw128
    T* sK = sdO + BM * D;                // [3][BN × D] sw128
    T* sV = sK + 3 * BN * D;             // [2][BN × D] sw128
    float* sK0 = reinterpret_cast<float*>(sV + 2 * BN * D);  // [3][BN] hyperbolic: k0
    float* sLg = sK0 + 3 * BN;                                // [3][BN] hyperbolic midpoint: log γ_j

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
    int b, h;
    const int m_block = grid_tile<true>(p, b, h);
    const SeqInfo si(p, b);
    int i0, hk, n_first, n_count;
    if (!query_tile_at<BM, BN>(p, si, h, m_block, i0, hk, n_first, n_count)) return;
    using Ops = typename Score::Ops;
    const bool norms = Ops::norms(p);  // q̂, k̂ given; dq_store writes dq̂ in f32
    const bool midpoint = Ops::midpoint(p);

    const T* q = static_cast<const T*>(p.q) + si.q_off(p, 0, h);
    const T* d_o = static_cast<const T*>(p.d_o) + si.o_off(p, 0, h);
    const T* k = static_cast<const T*>(p.k) + si.k_off(p, 0, hk);
    const T* v = static_cast<const T*>(p.v) + si.v_off(p, 0, hk);
    auto load_kv = [&](int it) {
        const int kb = it % 3, n = n_first + it;
        load_tile_sw128<T, BN, D, kWgThreads>(sK + kb * BN * D, k, p.k_seq, n * BN, si.len_k, tid);
        load_tile_sw128<T, BN, D, kWgThreads>(sV + (it & 1) * BN * D, v, p.v_seq, n * BN, si.len_k, tid);
        load_key_scalars<Score, BN, D>(p, si, hk, n, sK0 + kb * BN, sLg + kb * BN, false, midpoint, tid);
    };
    load_tile_sw128<T, BM, D, kWgThreads>(sQ, q, p.q_seq, i0, si.len_q, tid);
    load_tile_sw128<T, BM, D, kWgThreads>(sdO, d_o, p.o_seq, i0, si.len_q, tid);
    if (n_count > 0) load_kv(0);
    cp_async_commit();

    const int g = lane / 4, t4 = lane % 4;
    const int wrow = warp * 16;
    int row[MT][2], lo[MT][2], hi[MT][2];
    float lse2[MT][2], delta[MT][2], rq[MT][2], cq[MT][2];
    bwd_q_rows<Score, D, MT>(p, si, h, i0, wrow, g, false, row, lo, hi, lse2, delta, rq, cq);
    float acc_dq[MT][DT][4];
    float a[MT][2] = {{0.f, 0.f}};  // hyperbolic: Σ_j w_ij k0_j, thread-partial
    zero(acc_dq[0]);

    // Descriptors. A (K-major): Q, dO rows of this warpgroup. B K-major: K_j, V_j (n = keys). B MN-major
    // for dQ += dS' K: K_j with k = keys (16 rows = 2048 bytes per k16 step), n = D.
    const uint32_t q_addr = smem_addr(sQ) + wg * 64 * 128, do_addr = smem_addr(sdO) + wg * 64 * 128;
    const uint32_t k_addr = smem_addr(sK), v_addr = smem_addr(sV);
    constexpr uint32_t kTile = BN * D * 2;
    auto a_desc = [&](uint32_t addr, int kk) { return kmajor_desc<BM>(addr, kk); };
    auto b_desc = [&](uint32_t addr, int kk) { return kmajor_desc<BN>(addr, kk); };
    auto kn_desc = [&](int kb, int kk) { return mnmajor_desc<BN>(k_addr + kb * kTile, kk); };

    uint32_t ads[BN / 16][4];  // dS' of the previous key block as A fragments
    for (int it = 0; it < n_count; ++it) {
        const int n = n_first + it, kb = it % 3, vb = it & 1;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();  // K_j, V_j have landed; every warp is done with block j − 1's products

        float s[MT][NT][4], dp[MT][NT][4];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) Wgmma<T, BN>::ss(s[0], a_desc(q_addr, kk), b_desc(k_addr + kb * kTile, kk), kk > 0);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            Wgmma<T, BN>::ss(dp[0], a_desc(do_addr, kk), b_desc(v_addr + vb * kTile, kk), kk > 0);
        wg_commit();
        if (it > 0) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) Wgmma<T, D>::rs(acc_dq[0], ads[kk], kn_desc((it + 2) % 3, kk), 1);
        }
        wg_commit();  // empty in block 0
        // K_{j+1}, V_{j+1} into the buffers of K_{j−2} and V_{j−1} (their products were waited for in
        // block j − 1), while the products run.
        if (it + 1 < n_count) load_kv(it + 1);
        cp_async_commit();
        wg_wait<1>();
        fence_regs<NT>(s[0]);
        fence_regs<NT>(dp[0]);

        const int j0 = n * BN;
        dq_block_ds<T, Score, MT, NT>(p, si, h, j0, si.tile_full(p, i0, i0 + BM, j0, j0 + BN), false, s, dp, a, rq, cq,
                                      lse2, delta, row, lo, hi, sK0 + kb * BN, sK0 + kb * BN, sLg + kb * BN, t4);
        wg_wait<0>();
        fence_regs<DT>(acc_dq[0]);
        fence_regs<BN / 16>(ads);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) pack_a<T>(ads[kk], s[0][2 * kk], s[0][2 * kk + 1]);
    }
    if (n_count > 0) {  // the last block's dQ product
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) Wgmma<T, D>::rs(acc_dq[0], ads[kk], kn_desc((n_count - 1) % 3, kk), 1);
        wg_commit();
        wg_wait<0>();
        fence_regs<DT>(acc_dq[0]);
        fence_regs<BN / 16>(ads);
    }
    cp_async_wait<0>();

    Ops::template dq_epilogue<T, MT, DT>(
        p, si, h, acc_dq, a, rq, row,
        [&](int r, int c) { return to_f32(*reinterpret_cast<const T*>(base + sw128_offset<BM>(r, c))); }, wrow, lane,
        norms, t4);
#else
    __trap();  // launched only on compute capability 9.0 (host dispatch)
#endif
}

template <typename T, int D, class Score, int BN, int BM, bool kDq = false>
__device__ __forceinline__ void flash_bwd_dkdv_wg(const AttnParams& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int MT = 1;
    constexpr int kWgThreads = BN * 2;
    constexpr int QT = BM / 8, AT = D / 8;
    static_assert(BN % 64 == 0 && BM % 16 == 0, "64 keys per warpgroup, whole k16 steps of queries");
    using Ops = typename Score::Ops;
    static_assert(Ops::kWgDkdv, "TaylorScore has the warp-specialised dK/dV kernels only (taylor_flash.cu)");
    // kDq (the fused backward, D = 128): also dQ += dS' K of each query block, reduced into p.dq_acc
    // with f32 atomics; warpgroup w takes the 64 columns 64w.. of dQ over every key of the tile. The
    // dQ product waits for the whole dS'ᵀ tile (a barrier) and its atomics follow it at once:
    // deferring them under the next block's Sᵀ and dPᵀ (three Q/dO buffers, two dS'ᵀ tiles) was
    // slower on the H100 (more registers live across the products), and at D = 64 (each warpgroup
    // all of D over its own keys) the fused kernel was no faster than the two kernels (H100).
    // Scores with row sums (Ops::kRowSums, the hyperbolic ones): dQ's row sum a_i = Σ_j w_ij k0_j is reduced the same way into p.dq_rowsum
    // (from the stored dS'ᵀ tile, while the dQ product runs), and the row kernel attn_hyp_dq_store
    // finishes dq_i = hyp_grad·(Σ_j w_ij k_j − (a_i/q0_i)·q_i).
    static_assert(!kDq || (BM == 64 && BN == 128 && D == 128), "fused dQ: D = 128 tiles");
    constexpr int kBufs = 2;

    extern __shared__ __align__(1024) unsigned char smem_wg[];
    unsigned char* base = smem_wg + ((1024u - (smem_addr(smem_wg) & 1023u)) & 1023u);
    T* sK = reinterpret_cast<T*>(base);  // [BN × D] sw128
    T* sV = sK + BN * D;                 // [BN × D] sw128
    T* sQ = sV + BN * D;                 // [kBufs][BM × D] sw128
    T* sdO = sQ + kBufs * BM * D;        // [kBufs][BM × D] sw128
    T* sdS = sdO + kBufs * BM * D;       // kDq: [BN × BM] sw128, dS'ᵀ (rows = keys)
    float* sLse = reinterpret_cast<float*>(sdS + (kDq ? BN * BM : 0));  // [kBufs][BM] log2 units
    float* sDelta = sLse + kBufs * BM;                                   // [kBufs][BM]
    float* sRq = sDelta + kBufs * BM;                                    // [kBufs][BM] 1 (hyperbolic: q0)
    float* sKey0 = sRq + kBufs * BM;  // kDq, hyperbolic: [BN] k0 of the tile's keys (BN = kBufs·BM)

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
    int b, hk;
    const int n_block = grid_tile<false>(p, b, hk);
    const SeqInfo si(p, b);
    const int j0 = n_block * BN;
    if (j0 >= si.key_rows(p)) return;
    int m_first, m_count;
    key_tile_query_blocks<BM, BN>(p, si, j0, m_first, m_count);
    const int iters = j0 < si.len_k ? m_count * p.group : 0;  // padded keys: zero gradients
    const bool norms = Ops::norms(p);  // q̂, k̂ given; dkdv_store projects dk̂
    const bool midpoint = Ops::midpoint(p);
    auto head_of = [&](int it) { return hk * p.group + it / m_count; };
    auto row0_of = [&](int it) { return (m_first + it % m_count) * BM; };

    const T* k = static_cast<const T*>(p.k) + si.k_off(p, 0, hk);
    const T* v = static_cast<const T*>(p.v) + si.v_off(p, 0, hk);
    load_tile_sw128<T, BN, D, kWgThreads>(sK, k, p.k_seq, j0, si.len_k, tid);
    load_tile_sw128<T, BN, D, kWgThreads>(sV, v, p.v_seq, j0, si.len_k, tid);
    if constexpr (kDq && Ops::kRowSums) {  // read after the loop's first barrier
        if (tid < BN) sKey0[tid] = Ops::k_time(p, si, hk, j0 + tid);
    }
    auto load_q = [&](int it) {
        const int buf = it % kBufs, h = head_of(it), i0 = row0_of(it);
        load_tile_sw128<T, BM, D, kWgThreads>(sQ + buf * BM * D, static_cast<const T*>(p.q) + si.q_off(p, 0, h),
                                              p.q_seq, i0, si.len_q, tid);
        load_tile_sw128<T, BM, D, kWgThreads>(sdO + buf * BM * D, static_cast<const T*>(p.d_o) + si.o_off(p, 0, h),
                                              p.o_seq, i0, si.len_q, tid);
        if (tid < BM) {
            const int i = i0 + tid;
            const bool valid = i < si.len_q;
            float lse = lse_log2<Score>(p, si, h, i), rq = 1.f;
            Ops::bwd_q_row(p, si, h, i, valid, lse, rq);
            sLse[buf * BM + tid] = lse;
            sDelta[buf * BM + tid] = valid ? p.delta[si.stats_index(p, h, i)] : 0.f;
            sRq[buf * BM + tid] = rq;
        }
    };
    if (iters > 0) load_q(0);
    cp_async_commit();

    const int g = lane / 4, t4 = lane % 4;
    const int wrow = warp * 16;
    int key[MT][2];
    float rk[MT][2], lg[MT][2], bsum[MT][2], csum[MT][2];
    bwd_k_rows<Score, D, MT>(p, si, hk, j0 + wrow, g, false, midpoint, key, rk, lg, bsum, csum);
    float acc_dk[MT][AT][4], acc_dv[MT][AT][4];
    zero(acc_dk[0]);
    zero(acc_dv[0]);

    // Descriptors. A (K-major): K, V rows of this warpgroup. B K-major: Q, dO of the block (n = queries).
    // B MN-major for dV += Pᵀ dO and dK += dS'ᵀ Q: k = queries (2048 bytes per k16 step), n = D.
    const uint32_t k_addr = smem_addr(sK) + wg * 64 * 128, v_addr = smem_addr(sV) + wg * 64 * 128;
    const uint32_t q_addr = smem_addr(sQ), do_addr = smem_addr(sdO);
    constexpr uint32_t kTile = BM * D * 2;
    auto a_desc = [&](uint32_t addr, int kk) { return kmajor_desc<BN>(addr, kk); };
    auto b_desc = [&](uint32_t addr, int kk) { return kmajor_desc<BM>(addr, kk); };
    auto n_desc = [&](uint32_t addr, int kk) { return mnmajor_desc<BM>(addr, kk); };

    // kDq: dQ of a block (64 queries × these 64 columns) into dq_acc, scaled (hyperbolic: by the row
    // kernel), by f32 atomics.
    const int c0 = wg * 64;
    const float dq_mul = Ops::fused_dq_mul(p);
    auto reduce_dq = [&](const float (&acc_q)[8][4], int h, int i0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int i = i0 + (warp % 4) * 16 + g + 8 * r;
            if (i >= si.len_q) continue;
            float* dst = p.dq_acc + si.dq_off(p, i, h) + c0 + 2 * t4;
#pragma unroll
            for (int j = 0; j < 8; ++j) red_add_v2(dst + 8 * j, acc_q[j][2 * r] * dq_mul, acc_q[j][2 * r + 1] * dq_mul);
        }
    };

    for (int it = 0; it < iters; ++it) {
        const int buf = it % kBufs;
        const int h = head_of(it), i0 = row0_of(it);
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();  // Q_it, dO_it have landed; every warp is done with block it − 1 (its buffers, dS'ᵀ)

        // Sᵀ and dPᵀ as two groups, so that Pᵀ is formed while dPᵀ is still on the tensor cores.
        float st[MT][QT][4], dpt[MT][QT][4];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            Wgmma<T, BM>::ss(st[0], a_desc(k_addr, kk), b_desc(q_addr + buf * kTile, kk), kk > 0);
        wg_commit();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            Wgmma<T, BM>::ss(dpt[0], a_desc(v_addr, kk), b_desc(do_addr + buf * kTile, kk), kk > 0);
        wg_commit();
        // The next block into the buffers of block it − 1, while the products run.
        if (it + 1 < iters) load_q(it + 1);
        cp_async_commit();

        // Fast tiles (softmax, cosine-sim): Pᵀ while dPᵀ runs, dV's product issued, then dS'ᵀ while it
        // runs. Other tiles: both once dPᵀ is done (dkdv_block_pds).
        const bool full = si.tile_full(p, i0, i0 + BM, j0, j0 + BN);
        const bool split = !Ops::kRowSums && Ops::fast_tile(p, full);
        wg_wait<1>();
        fence_regs<QT>(st[0]);
        if (split) {
            Ops::template split_p<D, false, MT, QT>(p, false, st, rk, lg, sRq + buf * BM, sLse + buf * BM, t4);
        } else {
            wg_wait<0>();
            fence_regs<QT>(dpt[0]);
            dkdv_block_pds<T, Score, MT, QT>(p, si, h, i0, full, false, st, dpt, bsum, csum, rk, lg, key,
                                             sRq + buf * BM, sLse + buf * BM, sDelta + buf * BM, t4);
        }
        uint32_t ap[BM / 16][4], ads[BM / 16][4];
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) pack_a<T>(ap[kk], st[0][2 * kk], st[0][2 * kk + 1]);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) Wgmma<T, D>::rs(acc_dv[0], ap[kk], n_desc(do_addr + buf * kTile, kk), 1);
        wg_commit();
        wg_wait<1>();  // dPᵀ
        fence_regs<QT>(dpt[0]);
        if (split)
            Ops::template split_ds<D, false, T, MT, QT, true>(false, st, dpt, bsum, csum, sRq + buf * BM,
                                                              sDelta + buf * BM, t4);
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) pack_a<T>(ads[kk], dpt[0][2 * kk], dpt[0][2 * kk + 1]);
        if constexpr (kDq) {
            // dS'ᵀ into shared memory for dQ (the same dS' as dK's: no factor of either side).
            unsigned char* ds = reinterpret_cast<unsigned char*>(sdS);
#pragma unroll
            for (int qt = 0; qt < QT; ++qt)
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    *reinterpret_cast<uint32_t*>(ds + sw128_offset<BN>(wrow + g + 8 * r, qt * 8 + 2 * t4)) =
                        pack2<T>(dpt[0][qt][2 * r], dpt[0][qt][2 * r + 1]);
        }
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) Wgmma<T, D>::rs(acc_dk[0], ads[kk], n_desc(q_addr + buf * kTile, kk), 1);
        wg_commit();
        if constexpr (kDq) {
            // dQ (this block's 64 queries) += dS' K: A = dS'ᵀ and B = K, both MN-major in shared memory.
            fence_proxy_async();
            __syncthreads();  // the whole dS'ᵀ tile is stored
            float acc_q[8][4];
            dq_tile_product<T, BN>(acc_q, smem_addr(sdS), smem_addr(sK) + wg * BN * 128);
            if constexpr (Ops::kRowSums) Ops::template wg_fused_rowsum<T, BN>(p, si, h, i0, sdS, sKey0, warp, lane);
            wg_wait<0>();
            fence_regs<8>(acc_q);
            reduce_dq(acc_q, h, i0);
        } else {
            wg_wait<0>();
        }
        fence_regs<AT>(acc_dv[0]);
        fence_regs<AT>(acc_dk[0]);
        fence_regs<BM / 16>(ap);
        fence_regs<BM / 16>(ads);
    }
    cp_async_wait<0>();

    Ops::template dkdv_epilogue<T, MT, AT, true>(
        p, si, hk, 0, acc_dk, acc_dv, bsum, csum, rk, key,
        [&](int r, int c) { return to_f32(*reinterpret_cast<const T*>(base + sw128_offset<BN>(r, c))); },
        [&](int r, int c) { return to_f32(*reinterpret_cast<const T*>(base + BN * D * 2 + sw128_offset<BN>(r, c))); },
        wrow, lane, midpoint, norms, t4);
#else
    __trap();  // launched only on compute capability 9.0 (host dispatch)
#endif
}

}  // namespace attn

// The Hopper backward kernels of one score: NAME_bwd_{dq,dkdv}_wg_{f16,bf16}_d{64,128}.
#define ATTN_FLASH_BWD_WG(NAME, SCORE, DT, T, D)                                                                   \
    extern "C" __global__ void __launch_bounds__(attn::WgDqTile<D>::BM * 2, 1)                                     \
        NAME##_bwd_dq_wg_##DT##_d##D(const __grid_constant__ AttnParams p) {                                        \
        attn::flash_bwd_dq_wg<T, D, SCORE, attn::WgDqTile<D>::BM, attn::WgDqTile<D>::BN>(p);                      \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(attn::WgDkvTile<D>::BN * 2, 1)                                    \
        NAME##_bwd_dkdv_wg_##DT##_d##D(const __grid_constant__ AttnParams p) {                                      \
        attn::flash_bwd_dkdv_wg<T, D, SCORE, attn::WgDkvTile<D>::BN, attn::WgDkvTile<D>::BM>(p);                  \
    }
#define ATTN_FLASH_BWD_WG_ALL(NAME, SCORE)                  \
    ATTN_FLASH_BWD_WG(NAME, SCORE, f16, __half, 64)         \
    ATTN_FLASH_BWD_WG(NAME, SCORE, bf16, __nv_bfloat16, 64) \
    ATTN_FLASH_BWD_WG(NAME, SCORE, f16, __half, 128)        \
    ATTN_FLASH_BWD_WG(NAME, SCORE, bf16, __nv_bfloat16, 128)

// The fused Hopper backward of a score: one kernel writes dK and dV and reduces dQ (and, for the
// hyperbolic scores, dQ's row sums) into f32 (NAME_bwd_fused_wg_{f16,bf16}_d128).
#define ATTN_FLASH_BWD_FUSED_WG(NAME, SCORE, DT, T, D)                                                             \
    extern "C" __global__ void __launch_bounds__(attn::WgDkvTile<D>::BN * 2, 1)                                    \
        NAME##_bwd_fused_wg_##DT##_d##D(const __grid_constant__ AttnParams p) {                                     \
        attn::flash_bwd_dkdv_wg<T, D, SCORE, attn::WgDkvTile<D>::BN, attn::WgDkvTile<D>::BM, true>(p);            \
    }
#define ATTN_FLASH_BWD_FUSED_WG_ALL(NAME, SCORE)           \
    ATTN_FLASH_BWD_FUSED_WG(NAME, SCORE, f16, __half, 128) \
    ATTN_FLASH_BWD_FUSED_WG(NAME, SCORE, bf16, __nv_bfloat16, 128)
