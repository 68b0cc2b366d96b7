// Order 1, causal, every sequence with as many queries as keys, bf16, D = Dv = 64, sm_90a: the single-pass
// forward with each block's keys resident in shared memory, so that k and v come from DRAM once
// (NOTES_taylor.md, "Session 33"). taylor_order1_chain_wg.cuh reads them twice: its fold blocks sum a
// segment's keys la rounds before the forward blocks read the same keys, and the L2 does not keep them in
// between (s33a: 119 of its 387 MB at 16k).
//
// A segment of 1024 keys is J = 4 blocks of 256 (j = 0 … 3), each one warpgroup with its keys' K̂ and V
// (64 KiB) in shared memory, two blocks per SM. Tickets: per round r, the blocks j = 0 of every (b, h),
// then j = 1, …. A block
//   1. copies its 256 keys' k and v into shared memory (zero rows past the sequence) and folds them into T_j
//      (the l2-norm of the keys in place first; the four folds chain in the accumulators, one wait);
//   2. publishes T_j (flag `part` j) where block j + 1 of its segment has keys; takes as its start state
//      S_j = I_{r−1} + T_0 + … + T_{j−1} (I_{r−1}: flag `inc` of round r − 1, 0 at r = 0), and block
//      j = J − 1 publishes I_r = S_j + T_j (flag `inc`) where a later segment exists: one link per 1024
//      keys, every sum in a fixed order, the same bits every run (every flag awaited first, then the
//      states loaded together);
//   3. runs its 4 chunks of 64 queries as the wgmma chain kernel's forward blocks do (the same products
//      and epilogue), the keys from the resident tiles, q copied into two stages, one Sr buffer.
// Every wait is on a block with a smaller ticket (running or done), so every wait ends.
#pragma once
#include "taylor_order1_chain_wg.cuh"

namespace attn {

struct Taylor1ChainRes {
    static constexpr int C = 64, D = 64, N = 72, KEYS = 256, CHUNKS = KEYS / C, J = 4, SEG = J * KEYS;
    static constexpr int kTile = C * D * 2;  // 8 KiB
    // K̂ and V of chunk c at kKV + c·kChunk (V kTile after K̂); two q stages; Sr hi, lo; the ones tile.
    static constexpr int kKV = 0, kChunk = 2 * kTile;
    static constexpr int kQ = kKV + CHUNKS * kChunk;
    static constexpr int kSrTile = N * 128, kSr = kQ + 2 * kTile;
    static constexpr int kOnes = kSr + 2 * kSrTile;
    static constexpr int kBytes = kOnes + kTile + 1024;
    static constexpr int kStateFloats = Taylor1ChainWg::kStateFloats;
    static_assert(kSr % 1024 == 0 && kSrTile % 1024 == 0 && kOnes % 1024 == 0, "1024-aligned sw128 tiles");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// cp.async.wait_group n for a run-time n ≤ N.
template <int N> __device__ __forceinline__ void cp_async_wait_upto(int n) {
    if constexpr (N == 0) {
        cp_async_wait<0>();
    } else {
        if (n >= N) cp_async_wait<N>();
        else cp_async_wait_upto<N - 1>(n);
    }
}
#endif

// One launch of R·J·B·Hq blocks of 128 threads (R = the 1024-key segments of the longest sequence);
// tp.st: the states I [B·Hq·R] then the parts T_j [B·Hq·R][J − 1], each kStateFloats; tp.st_max: the
// flags inc [B·Hq·R], part [B·Hq·R][J − 1], then the ticket counter, zeroed. The body is empty for targets
// other than sm_90a.
__device__ __forceinline__ void taylor1_forward_chain_res(const TaylorParams& tp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using T = __nv_bfloat16;
    using L = Taylor1ChainRes;
    using Ops = Taylor1ChainWgOps;
    constexpr int C = L::C, NJ = Ops::NJ, SF = L::kStateFloats, J = L::J;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* base = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    __shared__ int sTicket;
    __shared__ float sInv[C];
    __shared__ __align__(16) float sC[C];  // Σv of the keys before the next chunk
    if (dynamic_smem_bytes() < (unsigned)L::kBytes) __trap();

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int per = P.batch * P.heads_q;
    const long long chains = (long long)per * tp.n_seg;
    if (tid == 0) sTicket = atomicAdd(tp.st_max + J * chains, 1);
    __syncthreads();
    const int ticket = sTicket;
    const int round = ticket / (J * per), j = ticket % (J * per) / per, bh = ticket % per;
    const int b = bh / P.heads_q, h = bh % P.heads_q, hk = h / P.group;
    const SeqInfo si(P, b);
    const int len = si.len_k;
    if (si.len_q != len) __trap();
    const int c_lo = round * L::SEG + j * L::KEYS;
    if (c_lo >= len) return;
    const int c_hi = min(c_lo + L::KEYS, len), n_chunks = (c_hi - c_lo + C - 1) / C;
    const long long at = (long long)bh * tp.n_seg + round;
    float* inc = tp.st;
    float* part = tp.st + chains * SF;  // [chains][J − 1]
    int* flag_inc = tp.st_max;
    int* flag_part = tp.st_max + chains;
    const T* k0 = static_cast<const T*>(P.k) + si.k_off(P, 0, hk);
    const T* v0 = static_cast<const T*>(P.v) + si.v_off(P, 0, hk);
    const T* q0 = static_cast<const T*>(P.q) + si.q_off(P, 0, h);
    T* o0 = static_cast<T*>(P.o) + si.o_off(P, 0, h);
    const bool l2 = P.l2norm != 0;
    unsigned char* ones = base + L::kOnes;
    const uint32_t ones_addr = smem_addr(ones);
    const uint32_t sr = smem_addr(base + L::kSr);
    auto kv_addr = [&](int c) { return smem_addr(base + L::kKV + c * L::kChunk); };
    auto q_stage = [&](int c) { return base + L::kQ + (c & 1) * L::kTile; };
    auto issue_q = [&](int c) {
        load_tile_sw128<T, C, L::D, kTaylorThreads>(reinterpret_cast<T*>(q_stage(c)), q0, P.q_seq, c_lo + c * C, c_hi,
                                                    tid);
        cp_async_commit();
    };

    // 1. K̂ and V of the 4 chunks, one commit group each, then the first chunk's q; the fold into T_j (F).
#pragma unroll
    for (int c = 0; c < L::CHUNKS; ++c) {
        unsigned char* kt = base + L::kKV + c * L::kChunk;
        load_tile_sw128<T, C, L::D, kTaylorThreads>(reinterpret_cast<T*>(kt), k0, P.k_seq, c_lo + c * C, c_hi, tid);
        load_tile_sw128<T, C, L::D, kTaylorThreads>(reinterpret_cast<T*>(kt + L::kTile), v0, P.v_seq, c_lo + c * C,
                                                    c_hi, tid);
        cp_async_commit();
    }
    issue_q(0);
    Ops::init_ones(ones, tid);

    float F[NJ][4], sv[1][4];
#pragma unroll
    for (int q = 0; q < NJ; ++q) F[q][0] = F[q][1] = F[q][2] = F[q][3] = 0.f;
    sv[0][0] = sv[0][1] = sv[0][2] = sv[0][3] = 0.f;
#pragma unroll 1
    for (int c = 0; c < L::CHUNKS; ++c) {
        cp_async_wait_upto<L::CHUNKS>(L::CHUNKS - c);  // (the q group is the newest)
        fence_proxy_async();
        __syncthreads();  // chunk c (and the ones tile) has landed for every thread
        if (l2) {
            Ops::l2norm_rows(base + L::kKV + c * L::kChunk, P.eps, tid);
            fence_proxy_async();
            __syncthreads();
        }
        wg_fence();
        Ops::fold(F, sv, kv_addr(c), kv_addr(c) + L::kTile, ones_addr);  // (no wait: the folds chain in F)
    }
    wg_wait<0>();
    fence_regs(F);
    fence_regs(sv);

    // 2. The start state S0 = I_{r−1} + T_0 + … + T_{j−1}; T_j published for the blocks after this one.
    float S0[NJ][4], s0v[1][4];
#pragma unroll
    for (int q = 0; q < NJ; ++q) S0[q][0] = S0[q][1] = S0[q][2] = S0[q][3] = 0.f;
    s0v[0][0] = s0v[0][1] = s0v[0][2] = s0v[0][3] = 0.f;
    if (j + 1 < J && c_lo + L::KEYS < len) {
        const long long slot = at * (J - 1) + j;
        taylor1_chain_publish(flag_part, slot, [&] { Ops::store_state(F, sv, part + slot * SF, tid); });
    }
    // Every flag first (thread 0 acquires, the barrier passes its view on), then the states' loads together:
    // one round trip to L2 instead of one per state. The sums keep their fixed order.
    if (tid == 0) {
        if (round > 0) taylor1_chain_poll(flag_inc + at - 1);
        for (int jj = 0; jj < j; ++jj) taylor1_chain_poll(flag_part + at * (J - 1) + jj);
    }
    __syncthreads();
    if (round > 0) Ops::load_state(S0, s0v, inc + (at - 1) * SF, tid);
#pragma unroll
    for (int jj = 0; jj < J - 1; ++jj)
        if (jj < j) Ops::load_state(S0, s0v, part + (at * (J - 1) + jj) * SF, tid);
    if (j == J - 1 && (round + 1) * L::SEG < len) {
        float I[NJ][4], iv[1][4];
#pragma unroll
        for (int q = 0; q < NJ; ++q)
#pragma unroll
            for (int e = 0; e < 4; ++e) I[q][e] = S0[q][e] + F[q][e];
#pragma unroll
        for (int e = 0; e < 4; ++e) iv[0][e] = s0v[0][e] + sv[0][e];
        taylor1_chain_publish(flag_inc, at, [&] { Ops::store_state(I, iv, inc + at * SF, tid); });
    }
#pragma unroll
    for (int q = 0; q < NJ; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) F[q][e] = S0[q][e];
#pragma unroll
    for (int e = 0; e < 4; ++e) sv[0][e] = s0v[0][e];

    // 3. The chunks.
    Ops::publish(F, sv, sr, sC, warp, lane);
    const float a0 = tp.a0, a1s = tp.a1 * P.scale;
#pragma unroll 1
    for (int c = 0; c < n_chunks; ++c) {
        const int i0 = c_lo + c * C;
        cp_async_wait<0>();
        fence_proxy_async();  // (the copies, the published Sr: to wgmma's reads)
        __syncthreads();      // q(c) and Sr are ready; the other stage is free
        if (c + 1 < n_chunks) issue_q(c + 1);
        unsigned char* sQ = q_stage(c);
        const uint32_t k_addr = kv_addr(c);
        if (l2) {
            uint4 chunk[4];
            const float rq = wg_key_inv_norm(sQ, P.eps, tid, chunk);
            if (tid % 2 == 0) sInv[tid / 2] = rq;
            __syncthreads();
        }

        Ops::forward_chunk(F, sv, sQ, k_addr, sr, sC, sInv, ones_addr, P, si, h, o0, i0, c_hi, a0, a1s, l2, [&] {
            __syncthreads();  // every warp's state read is done: the next chunk's state into the one Sr buffer
            if (c + 1 < n_chunks) Ops::publish(F, sv, sr, sC, warp, lane);
        });
    }
#endif
}

}  // namespace attn
