// Order 1, causal, every sequence with as many queries as keys, bf16, D = Dv = 64, sm_90a: the single-pass
// forward with each block's keys resident in shared memory, so that k and v come from DRAM once
// (NOTES_taylor.md, "Session 33"). taylor_order1_chain_wg.cuh reads them twice: its fold blocks sum a
// segment's keys la rounds before the forward blocks read the same keys, and the L2 does not keep them in
// between (s33a: 119 of its 387 MB at 16k).
//
// A segment of 1024 keys is two blocks of 512 (j = 0, 1), each of two warpgroups (256 threads, one block
// per SM: the block's K̂ and V are 128 KiB). Tickets: per round r, the j = 0 blocks of every (b, h), then
// the j = 1 ones. A block
//   1. copies its 512 keys' k and v into shared memory (zero rows past the sequence) and folds them,
//      warpgroup w chunks 4w … 4w + 3, into T = T_w0 + T_w1 (the l2-norm of the keys in place first);
//   2. j = 0: publishes T (flag `part`) where block j = 1 of its segment has keys, and takes I_{r−1} (flag
//      `inc` of round r − 1; 0 at r = 0) as its start state;
//      j = 1: takes (I_{r−1} + T_{j=0}) as its start state and, where a later segment exists, publishes
//      I_r = start + T (flag `inc`): one link per 1024 keys, in a fixed order, the same bits every run;
//   3. runs its 8 chunks of 64 queries as the wgmma chain kernel does (the same products and
//      epilogue), warpgroup w the chunks w, w + 2, …, each warpgroup carrying its own running state and
//      folding every chunk into it (its own and the other's: the keys are resident), with one Sr buffer
//      per warpgroup and q copied per warpgroup into two stages.
// Every wait is on a block with a smaller ticket (running or done), so every wait ends.
#pragma once
#include "taylor_order1_chain_wg.cuh"

namespace attn {

struct Taylor1ChainRes {
    static constexpr int C = 64, D = 64, N = 72, KEYS = 512, CHUNKS = KEYS / C, SEG = 2 * KEYS;
    static constexpr int kThreads = 256;
    static constexpr int kTile = C * D * 2;  // 8 KiB
    // K̂ and V of chunk c at kKV + c·kChunk (V kTile after K̂); per warpgroup two q stages then Sr hi, lo;
    // the ones tile last.
    static constexpr int kKV = 0, kChunk = 2 * kTile;
    static constexpr int kSrTile = N * 128;
    static constexpr int kWg = 2 * kTile + 2 * kSrTile;
    static constexpr int kWgBase = kKV + CHUNKS * kChunk;
    static constexpr int kOnes = kWgBase + 2 * kWg;
    static constexpr int kBytes = kOnes + kTile + 1024;
    // Warpgroup 1's q stage 1 and Sr: the scratch through which the warpgroups exchange a state.
    static constexpr int kScratch = kWgBase + kWg + kTile;
    static constexpr int kStateFloats = Taylor1ChainWg::kStateFloats;
    static_assert(kWg % 1024 == 0 && kSrTile % 1024 == 0, "1024-aligned sw128 tiles");
    static_assert(kWg - kTile >= kStateFloats * 4, "the scratch holds a state");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A state in the accumulators' thread order, to and from shared memory (the exchange between warpgroups).
__device__ __forceinline__ void taylor1_res_put(const float (&F)[9][4], const float (&sv)[1][4], float* s, int t) {
    float4* p = reinterpret_cast<float4*>(s);
#pragma unroll
    for (int j = 0; j < 9; ++j) p[j * kTaylorThreads + t] = make_float4(F[j][0], F[j][1], F[j][2], F[j][3]);
    p[9 * kTaylorThreads + t] = make_float4(sv[0][0], sv[0][1], sv[0][2], sv[0][3]);
}
__device__ __forceinline__ void taylor1_res_add(float (&F)[9][4], float (&sv)[1][4], const float* s, int t) {
    const float4* p = reinterpret_cast<const float4*>(s);
#pragma unroll
    for (int j = 0; j < 9; ++j) {
        const float4 x = p[j * kTaylorThreads + t];
        F[j][0] += x.x;
        F[j][1] += x.y;
        F[j][2] += x.z;
        F[j][3] += x.w;
    }
    const float4 x = p[9 * kTaylorThreads + t];
    sv[0][0] += x.x;
    sv[0][1] += x.y;
    sv[0][2] += x.z;
    sv[0][3] += x.w;
}
template <int N> __device__ __forceinline__ void cp_async_wait_upto(int n) {
    if constexpr (N == 0) {
        cp_async_wait<0>();
    } else {
        if (n >= N) cp_async_wait<N>();
        else cp_async_wait_upto<N - 1>(n);
    }
}
#endif

// One launch of R·2·B·Hq blocks of 256 threads (R = the 1024-key segments of the longest sequence);
// tp.st: the states I [B·Hq·R] then the parts T_{j=0} [B·Hq·R], each kStateFloats; tp.st_max: the
// flags inc [B·Hq·R], part [B·Hq·R], then the ticket counter, zeroed. The body is empty for targets other
// than sm_90a.
__device__ __forceinline__ void taylor1_forward_chain_res(const TaylorParams& tp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using T = __nv_bfloat16;
    using L = Taylor1ChainRes;
    using Ops = Taylor1ChainWgOps;
    constexpr int C = L::C, N = L::N, NJ = Ops::NJ, SF = L::kStateFloats;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* base = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    __shared__ int sTicket;
    __shared__ float sInv[2][C];
    __shared__ __align__(16) float sC[2][C];  // Σv of the keys before each warpgroup's next chunk
    if (dynamic_smem_bytes() < (unsigned)L::kBytes) __trap();

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, wg = tid / kTaylorThreads, wt = tid % kTaylorThreads;
    const int warp = wt / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    if (tid == 0) sTicket = atomicAdd(tp.st_max + 2LL * P.batch * P.heads_q * tp.n_seg, 1);
    __syncthreads();
    const int per = P.batch * P.heads_q, ticket = sTicket;
    const int round = ticket / (2 * per), j = ticket % (2 * per) / per, bh = ticket % per;
    const int b = bh / P.heads_q, h = bh % P.heads_q, hk = h / P.group;
    const SeqInfo si(P, b);
    const int len = si.len_k;
    if (si.len_q != len) __trap();
    const int c_lo = round * L::SEG + j * L::KEYS;
    if (c_lo >= len) return;
    const int c_hi = min(c_lo + L::KEYS, len), n_chunks = (c_hi - c_lo + C - 1) / C;
    const long long chains = (long long)per * tp.n_seg;
    const long long at = (long long)bh * tp.n_seg + round;
    float* inc = tp.st;
    float* part = tp.st + chains * SF;
    int* flag_inc = tp.st_max;
    int* flag_part = tp.st_max + chains;
    const T* k0 = static_cast<const T*>(P.k) + si.k_off(P, 0, hk);
    const T* v0 = static_cast<const T*>(P.v) + si.v_off(P, 0, hk);
    const T* q0 = static_cast<const T*>(P.q) + si.q_off(P, 0, h);
    T* o0 = static_cast<T*>(P.o) + si.o_off(P, 0, h);
    const bool l2 = P.l2norm != 0;
    unsigned char* wbase = base + L::kWgBase + wg * L::kWg;
    unsigned char* ones = base + L::kOnes;
    const uint32_t ones_addr = smem_addr(ones);
    const uint32_t sr = smem_addr(wbase + 2 * L::kTile);
    float* scratch = reinterpret_cast<float*>(base + L::kScratch);
    auto kv_addr = [&](int c) { return smem_addr(base + L::kKV + c * L::kChunk); };
    auto q_stage = [&](int s) { return wbase + s * L::kTile; };
    auto issue_q = [&](int c) {  // chunk c's q rows into stage (c / 2) % 2 of this warpgroup
        load_tile_sw128<T, C, L::D, kTaylorThreads>(reinterpret_cast<T*>(q_stage((c / 2) & 1)), q0, P.q_seq,
                                                    c_lo + c * C, c_hi, wt);
        cp_async_commit();
    };

    // 1. K̂ and V of the 8 chunks, in 4 commit groups (chunks s and 4 + s), the first q of each warpgroup.
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
        for (int c = s; c < L::CHUNKS; c += 4) {
            unsigned char* kt = base + L::kKV + c * L::kChunk;
            load_tile_sw128<T, C, L::D, L::kThreads>(reinterpret_cast<T*>(kt), k0, P.k_seq, c_lo + c * C, c_hi, tid);
            load_tile_sw128<T, C, L::D, L::kThreads>(reinterpret_cast<T*>(kt + L::kTile), v0, P.v_seq, c_lo + c * C,
                                                     c_hi, tid);
        }
        cp_async_commit();
    }
    if (wg < n_chunks) issue_q(wg);
    else cp_async_commit();
    if (wg == 0) Ops::init_ones(ones, wt);

    float F[NJ][4], sv[1][4];
#pragma unroll
    for (int q = 0; q < NJ; ++q) F[q][0] = F[q][1] = F[q][2] = F[q][3] = 0.f;
    sv[0][0] = sv[0][1] = sv[0][2] = sv[0][3] = 0.f;
#pragma unroll 1
    for (int s = 0; s < 4; ++s) {
        cp_async_wait_upto<4>(4 - s);  // (the q group is the newest)
        fence_proxy_async();
        __syncthreads();  // chunks s and 4 + s (and the ones tile) have landed for every thread
        const int c = 4 * wg + s;
        unsigned char* kt = base + L::kKV + c * L::kChunk;
        if (l2) {
            Ops::l2norm_rows(kt, P.eps, wt);
            fence_proxy_async();
            named_bar_sync(1 + wg, kTaylorThreads);
        }
        wg_fence();
        Ops::fold(F, sv, kv_addr(c), kv_addr(c) + L::kTile, ones_addr);
        wg_wait<0>();
        fence_regs(F);
        fence_regs(sv);
    }
    // T = T_w0 + T_w1 in warpgroup 0's registers.
    if (wg == 1) taylor1_res_put(F, sv, scratch, wt);
    __syncthreads();
    if (wg == 0) taylor1_res_add(F, sv, scratch, wt);
    __syncthreads();  // (the scratch is free again)

    // 2. The start state (warpgroup 0: T in F, the start in S0).
    float S0[NJ][4], s0v[1][4];
#pragma unroll
    for (int q = 0; q < NJ; ++q) S0[q][0] = S0[q][1] = S0[q][2] = S0[q][3] = 0.f;
    s0v[0][0] = s0v[0][1] = s0v[0][2] = s0v[0][3] = 0.f;
    const bool sibling = j == 0 && c_lo + L::KEYS < len;
    const bool later = (round + 1) * L::SEG < len;
    if (sibling) {
        if (wg == 0) Ops::store_state(F, sv, part + at * SF, wt);
        __threadfence();
        __syncthreads();
        if (tid == 0) st_release_gpu(flag_part + at, 1);
    }
    if (round > 0) {
        taylor1_chain_wait(flag_inc + at - 1);
        if (wg == 0) Ops::load_state(S0, s0v, inc + (at - 1) * SF, wt);
    }
    if (j == 1) {
        taylor1_chain_wait(flag_part + at);
        if (wg == 0) Ops::load_state(S0, s0v, part + at * SF, wt);
        if (later) {
            if (wg == 0) {
#pragma unroll
                for (int q = 0; q < NJ; ++q)
#pragma unroll
                    for (int e = 0; e < 4; ++e) F[q][e] = S0[q][e] + F[q][e];
#pragma unroll
                for (int e = 0; e < 4; ++e) sv[0][e] = s0v[0][e] + sv[0][e];
                Ops::store_state(F, sv, inc + at * SF, wt);
            }
            __threadfence();
            __syncthreads();
            if (tid == 0) st_release_gpu(flag_inc + at, 1);
        }
    }
    // Both warpgroups start from S0.
    if (wg == 0) taylor1_res_put(S0, s0v, scratch, wt);
    __syncthreads();
#pragma unroll
    for (int q = 0; q < NJ; ++q) F[q][0] = F[q][1] = F[q][2] = F[q][3] = 0.f;
    sv[0][0] = sv[0][1] = sv[0][2] = sv[0][3] = 0.f;
    taylor1_res_add(F, sv, scratch, wt);
    __syncthreads();  // (the scratch is warpgroup 1's q stage 1 and Sr from here)

    // 3. The chunks w, w + 2, … of this warpgroup.
    const int bar = 1 + wg;
    if (wg == 1) {  // its first chunk is 1: chunk 0 folded in first
        wg_fence();
        Ops::fold(F, sv, kv_addr(0), kv_addr(0) + L::kTile, ones_addr);
        wg_wait<0>();
        fence_regs(F);
        fence_regs(sv);
    }
    Ops::publish(F, sv, sr, sC[wg], warp, lane);
    const int wrow = warp * 16;
    const float a0 = tp.a0, a1s = tp.a1 * P.scale;
#pragma unroll 1
    for (int c = wg; c < n_chunks; c += 2) {
        const int i0 = c_lo + c * C;
        cp_async_wait<0>();
        fence_proxy_async();  // (the copies, the published Sr: to wgmma's reads)
        named_bar_sync(bar, kTaylorThreads);  // q(c) and Sr are ready; the other stage is free
        if (c + 2 < n_chunks) issue_q(c + 2);
        unsigned char* sQ = q_stage((c / 2) & 1);
        const uint32_t q_addr = smem_addr(sQ), k_addr = kv_addr(c), v_addr = k_addr + L::kTile;
        const uint32_t k1_addr = kv_addr(min(c + 1, L::CHUNKS - 1));
        if (l2) {
            uint4 chunk[4];
            const float rq = wg_key_inv_norm(sQ, P.eps, wt, chunk);
            if (wt % 2 == 0) sInv[wg][wt / 2] = rq;
            named_bar_sync(bar, kTaylorThreads);
        }

        float S[C / 8][4], O[NJ][4];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < L::D / 16; ++kk)
            Wgmma<T, C>::ss(S, kmajor_desc<C>(q_addr, kk), kmajor_desc<C>(k_addr, kk), kk > 0);
        wg_commit();
#pragma unroll
        for (int kk = 0; kk < L::D / 16; ++kk)
            Wgmma<T, N>::ss(O, kmajor_desc<C>(q_addr, kk), kmajor_desc<N>(sr, kk), kk > 0);
#pragma unroll
        for (int kk = 0; kk < L::D / 16; ++kk)
            Wgmma<T, N>::ss(O, kmajor_desc<C>(q_addr, kk), kmajor_desc<N>(sr + L::kSrTile, kk), 1);
        wg_commit();
        // This chunk and the next (the other warpgroup's) into the running state: the state of chunk c + 2.
        // (At the last chunks they are never read: a branch would serialise.)
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk)
            Wgmma<T, N>::ss_tt(F, mnmajor_desc<C>(k_addr, kk), Ops::vt_desc(v_addr, ones_addr, kk), 1);
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk)
            Wgmma<T, 8>::ss_tt(sv, mnmajor_desc<C>(v_addr, kk), mnmajor_desc<C>(ones_addr, kk), 1);
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk)
            Wgmma<T, N>::ss_tt(F, mnmajor_desc<C>(k1_addr, kk), Ops::vt_desc(k1_addr + L::kTile, ones_addr, kk), 1);
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk)
            Wgmma<T, 8>::ss_tt(sv, mnmajor_desc<C>(k1_addr + L::kTile, kk), mnmajor_desc<C>(ones_addr, kk), 1);
        wg_commit();

        float c1[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) c1[r] = a1s * (l2 ? sInv[wg][wrow + g + 8 * r] : 1.f);

        uint32_t pa[C / 16][4];
        wg_wait<2>();
        fence_regs(S);
#pragma unroll
        for (int n = 0; n < C / 8; ++n)
#pragma unroll
            for (int rh = 0; rh < 2; ++rh) {
                const int row = wrow + g + 8 * rh, col = 8 * n + 2 * t4;
                const float f0 = col <= row ? fmaf(c1[rh], S[n][2 * rh], a0) : 0.f;
                const float f1 = col + 1 <= row ? fmaf(c1[rh], S[n][2 * rh + 1], a0) : 0.f;
                pa[n / 2][2 * (n % 2) + rh] = pack2<T>(f0, f1);
            }
        wg_wait<1>();
        fence_regs(O);
#pragma unroll
        for (int q = 0; q < NJ; ++q) {
            float2 cs = make_float2(q == C / 8 && t4 == 0 ? (float)i0 : 0.f, 0.f);
            if (q < C / 8) cs = *reinterpret_cast<const float2*>(&sC[wg][8 * q + 2 * t4]);
#pragma unroll
            for (int e = 0; e < 4; ++e) O[q][e] = fmaf(c1[e / 2], O[q][e], a0 * ((e & 1) ? cs.y : cs.x));
        }
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk) Wgmma<T, N>::rs(O, pa[kk], Ops::vt_desc(v_addr, ones_addr, kk), 1);
        wg_commit();

        // The state of chunk c + 2 into the Sr buffer once every warp's state read is done.
        wg_wait<1>();
        fence_regs(F);
        fence_regs(sv);
        named_bar_sync(bar, kTaylorThreads);
        if (c + 2 < n_chunks) Ops::publish(F, sv, sr, sC[wg], warp, lane);
        wg_wait<0>();
        fence_regs(O);
        fence_regs(pa);

#pragma unroll
        for (int rh = 0; rh < 2; ++rh) {
            const int row = wrow + g + 8 * rh, i = i0 + row;
            const float den = __shfl_sync(0xffffffffu, O[C / 8][2 * rh], lane & ~3);
            const float inv = 1.f / den;
#pragma unroll
            for (int n = 0; n < C / 8; ++n)
                *reinterpret_cast<uint32_t*>(sQ + sw128_offset<C>(row, 8 * n + 2 * t4)) =
                    pack2<T>(O[n][2 * rh] * inv, O[n][2 * rh + 1] * inv);
            if (t4 == 0 && i < c_hi) P.lse[si.stats_index(P, h, i)] = den;
        }
        __syncwarp();
        {
            const int r0 = wrow + lane / 8, ch = lane % 8;
            const uint32_t ib = r0 * 128 + ((ch ^ (lane / 8)) << 4);
            T* op = o0 + (long long)(i0 + r0) * P.o_seq + 8 * ch;
            const long long step = 4 * P.o_seq;
            uint4 x[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) x[k] = *reinterpret_cast<const uint4*>(sQ + ((ib + 512 * k) ^ ((k & 1) << 6)));
            if (i0 + C <= c_hi) {
#pragma unroll
                for (int k = 0; k < 4; ++k) *reinterpret_cast<uint4*>(op + k * step) = x[k];
            } else {
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    if (i0 + r0 + 4 * k < c_hi) *reinterpret_cast<uint4*>(op + k * step) = x[k];
            }
        }
    }
#endif
}

}  // namespace attn
