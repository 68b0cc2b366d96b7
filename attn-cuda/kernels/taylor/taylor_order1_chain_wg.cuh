// Order 1, causal, every sequence with as many queries as keys, bf16, D = Dv = 64, sm_90a: the single-pass
// forward of taylor_order1_chain.cuh (the same tickets, rounds, fold blocks, flags and chain of inclusive
// sums; read its header first) with every product of a chunk on wgmma, one warpgroup per block.
// In the mma.sync kernel each warp runs ~800 dependent mma.sync and shared loads per chunk;
// here a chunk is 24 asynchronous wgmma issued by the warpgroup, and the warps' own work is the
// element-wise part (f and the mask, the scale of the state read, o = num/den, the state's bf16 split).
//
// With Ṽ = [V | 1 …] (72 columns: the 64 values, then the denominator's column 8 times) and the state of the
// keys before a chunk F[f][n] = Σ_j k̂_jf Ṽ_jn (64 linear features × 72), Σv[n] = Σ_j v_jn:
//   O = Q·Srᵀ                     m64n72k16 × 4, twice: Sr = F as bf16 hi and lo tiles [72][64] (16
//                                 significant bits; the mma.sync kernel's tf32 has 11)
//   S = Q·K̂ᵀ                     m64n64k16 × 4 (group 1, issued first)
//   O ← a1 r_z·O + a0 [Σv, i0]    (i0: the keys before the chunk, the const feature's den)
//   P = f(r_z S) = a0 + a1 r_z S   for j ≤ i, else 0, rounded to bf16 in the A registers
//   O += P·Ṽ                      m64n72k16 × 4, A from registers
//   F += K̂ᵀ·Ṽ                     m64n72k16 × 4, both operands MN-major from the stage's tiles
//   Σv += Vᵀ·1                    m64n8k16 × 4 (A = V MN-major, B = the ones tile), with the fold
//   o = O[:, :64] / O[:, 64], the denominator O[:, 64] saved as the statistic.
// Ṽ's columns 64 … 71 come from a constant 8 KiB tile (columns 0 … 7 = 1 in every row) that the MN-major
// descriptors of V reach as their second 64-column block (LBO = its distance from V): the den column 64 and
// seven unused copies of it. A chain state is F in the accumulators' thread order ([9][128] float4) and Σv
// in its m64n8 accumulators ([128] float4: value columns 16w + g and 16w + g + 8 of warp w, each twice).
#pragma once
#include "taylor_order1_chain.cuh"
#include "taylor_wg.cuh"

namespace attn {

// The layout (mirrored by taylor::heuristics::{ORDER1_CHAIN_WG_SMEM, ORDER1_CHAIN_WG_STATE_FLOATS}): sw128
// tiles of [64][64] bf16 from a 1024-aligned base (1 KiB of slack in kBytes).
struct Taylor1ChainWg {
    static constexpr int C = 64, D = 64, N = 72;  // keys and queries per chunk, features, Ṽ's columns
    static constexpr int kTile = C * D * 2;       // 8 KiB
    // Forward block: two stages of Q, K̂, V; then Sr [2 buffers][hi, lo][N][64]; then the ones tile.
    static constexpr int kQ = 0, kK = kTile, kV = 2 * kTile, kStage = 3 * kTile;
    static constexpr int kSrTile = N * 128, kSr = 2 * kStage;
    static constexpr int kOnes = kSr + 4 * kSrTile;
    // Fold block: FS stages of K̂, V in the same memory before the ones tile.
    static constexpr int kFStage = 2 * kTile, FS = kOnes / kFStage < 4 ? kOnes / kFStage : 4;
    static constexpr int kBytes = kOnes + kTile + 1024;
    static constexpr int kStateF4 = N / 8 * 128, kStateFloats = (kStateF4 + 128) * 4;
    static_assert(kSrTile % 1024 == 0 && kStage % 1024 == 0 && FS >= 2, "1024-aligned sw128 tiles");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
struct Taylor1ChainWgOps {
    using T = __nv_bfloat16;
    using L = Taylor1ChainWg;
    static constexpr int C = L::C, N = L::N, NJ = N / 8;

    // The ones tile: columns 0 … 7 of every row 1, the rest 0 (only columns 0 … 7 are read: Ṽ's columns
    // 64 … 71, so F's, Sr's and O's columns 65 … 71 repeat column 64, unused; and B of Σv).
    static __device__ __forceinline__ void init_ones(unsigned char* ones, int tid) {
        for (int idx = tid; idx < C * 8; idx += kTaylorThreads) {
            const int r = idx / 8, ch = idx % 8;
            *reinterpret_cast<uint4*>(ones + r * 128 + ch * 16) = ch == (r & 7) ? make_uint4(0x3F803F80u, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u)
                                                                            : make_uint4(0u, 0u, 0u, 0u);
        }
    }

    // Rows of a K tile scaled to unit norm in place (k̂ = k / max(‖k‖, eps)); a barrier before they are read.
    static __device__ __forceinline__ void l2norm_rows(unsigned char* tile, float eps, int tid) {
        uint4 chunk[4];
        wg_scale_key_rows(tile, wg_key_inv_norm(tile, eps, tid, chunk), chunk, tid);
    }

    // k16 step kk of Ṽ as an MN-major B operand: V's 64 columns, then the ones tile's.
    static __device__ __forceinline__ uint64_t vt_desc(uint32_t v_addr, uint32_t ones_addr, int kk) {
        return Sw128Desc(v_addr, ones_addr - v_addr, 1024).at16(kk * 128);
    }

    // F += K̂ᵀ·Ṽ and Σv += Vᵀ·1 (m64n8, B = the ones tile's first 8 columns: every column of sv holds Σv
    // of rows 16w + g, + 8): eight wgmma, one commit group.
    static __device__ __forceinline__ void fold(float (&F)[NJ][4], float (&sv)[1][4], uint32_t k_addr, uint32_t v_addr,
                                                uint32_t ones) {
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk) Wgmma<T, N>::ss_tt(F, mnmajor_desc<C>(k_addr, kk), vt_desc(v_addr, ones, kk), 1);
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk) Wgmma<T, 8>::ss_tt(sv, mnmajor_desc<C>(v_addr, kk), mnmajor_desc<C>(ones, kk), 1);
        wg_commit();
    }

    // Sr[n][f] ← F[f][n] as bf16 hi = bf16(F) and lo = bf16(F − hi) (the tiles at sr and sr + kSrTile),
    // one transposed stmatrix per n8 tile; Σv to sc (row g = 0's lanes).
    static __device__ __forceinline__ void publish(const float (&F)[NJ][4], const float (&sv)[1][4], uint32_t sr,
                                                   float* sc, int warp, int lane) {
        const int r = lane % 8, m = lane / 8;  // lane: row r of matrix m = (tile m / 2, feature half m % 2)
        const uint32_t at = sr + (m / 2) * L::kSrTile + r * 128 + (((2 * warp + m % 2) ^ r) << 4);
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            uint32_t x[4];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float x0 = F[j][2 * h], x1 = F[j][2 * h + 1];
                x[h] = pack2<T>(x0, x1);
                x[2 + h] = pack2<T>(x0 - bf16_lo(x[h]), x1 - bf16_hi(x[h]));
            }
            stsm_x4_trans(at + j * 1024, x);
        }
        if (lane % 4 == 0) {
            sc[16 * warp + lane / 4] = sv[0][0];
            sc[16 * warp + lane / 4 + 8] = sv[0][2];
        }
    }

    // One forward chunk of 64 queries at i0 (the products of the top, f and the causal mask, o = num / den
    // and the den statistic): q in the sw128 tile sQ (its rows then stage o), K̂ and V at k_addr and
    // k_addr + kTile, the state of the keys before the chunk in Sr (at sr) and sc (Σv), inv_q the q rows'
    // inverse norms where l2. F, sv take the chunk's keys (the fold); `publish` runs once that fold has
    // landed (the next chunk's state to its Sr), before o's epilogue.
    template <class Publish>
    static __device__ __forceinline__ void forward_chunk(float (&F)[NJ][4], float (&sv)[1][4], unsigned char* sQ,
                                                         uint32_t k_addr, uint32_t sr, const float* sc,
                                                         const float* inv_q, uint32_t ones_addr, const AttnParams& P,
                                                         const SeqInfo& si, int h, T* o0, int i0, int c_hi, float a0,
                                                         float a1s, bool l2, Publish publish) {
        const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
        const uint32_t q_addr = smem_addr(sQ), v_addr = k_addr + L::kTile;
        float S[C / 8][4], O[NJ][4];
        const int wrow = warp * 16;
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
        fold(F, sv, k_addr, v_addr, ones_addr);  // (the last chunk's is never read: a branch would serialise)

        float c1[2];  // a1·r_z of rows wrow + g, + 8: order 1's f(r_z s) = a0 + c1 s
#pragma unroll
        for (int r = 0; r < 2; ++r) c1[r] = a1s * (l2 ? inv_q[wrow + g + 8 * r] : 1.f);

        // P = f(r_z S) for j ≤ i, rounded to bf16 as the A fragments of P·Ṽ.
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
        // O ← a1 r_z·(Q·Srᵀ) + a0·[Σv, i0, 0 …], then O += P·Ṽ.
        wg_wait<1>();
        fence_regs(O);
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            float2 cs = make_float2(j == C / 8 && t4 == 0 ? (float)i0 : 0.f, 0.f);
            if (j < C / 8) cs = *reinterpret_cast<const float2*>(&sc[8 * j + 2 * t4]);
#pragma unroll
            for (int e = 0; e < 4; ++e) O[j][e] = fmaf(c1[e / 2], O[j][e], a0 * ((e & 1) ? cs.y : cs.x));
        }
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < C / 16; ++kk) Wgmma<T, N>::rs(O, pa[kk], vt_desc(v_addr, ones_addr, kk), 1);
        wg_commit();

        // The next chunk's state (this chunk's keys folded in) to the other buffer.
        wg_wait<1>();
        fence_regs(F);
        fence_regs(sv);
        publish();
        wg_wait<0>();
        fence_regs(O);
        fence_regs(pa);

        store_o(O, sQ, P, si, h, o0, i0, c_hi);
    }

    // o = num / den of the chunk of 64 queries at i0 (O's columns 0 … 63 over its column 64) staged in the
    // warp's rows of the q tile sQ (their products are done), den to the statistics; then 16-byte stores of
    // the rows (those before c_hi).
    static __device__ __forceinline__ void store_o(const float (&O)[NJ][4], unsigned char* sQ, const AttnParams& P,
                                                   const SeqInfo& si, int h, T* o0, int i0, int c_hi) {
        const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
        const int wrow = warp * 16;
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
            // Lane: rows wrow + lane / 8 + 4k, chunk lane % 8 (row % 8 = lane / 8 + 4·(k % 2)); a whole chunk
            // (all but a sequence's last) loads its four rows first, then stores them.
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

    static __device__ __forceinline__ float4* slot(float* state, int idx, int tid) {
        return reinterpret_cast<float4*>(state) + idx * kTaylorThreads + tid;
    }
    static __device__ __forceinline__ void load_state(float (&F)[NJ][4], float (&sv)[1][4], float* state, int tid) {
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const float4 s = __ldcg(slot(state, j, tid));  // (written by another block: not via L1)
            F[j][0] += s.x;
            F[j][1] += s.y;
            F[j][2] += s.z;
            F[j][3] += s.w;
        }
        const float4 s = __ldcg(slot(state, NJ, tid));
        sv[0][0] += s.x;
        sv[0][1] += s.y;
        sv[0][2] += s.z;
        sv[0][3] += s.w;
    }
    static __device__ __forceinline__ void store_state(const float (&F)[NJ][4], const float (&sv)[1][4], float* state,
                                                       int tid) {
#pragma unroll
        for (int j = 0; j < NJ; ++j) __stcg(slot(state, j, tid), make_float4(F[j][0], F[j][1], F[j][2], F[j][3]));
        __stcg(slot(state, NJ, tid), make_float4(sv[0][0], sv[0][1], sv[0][2], sv[0][3]));
    }
};
#endif

// One launch, the tickets and grid of taylor1_forward_chain, tp.st the chain states
// [B][Hkv][R][Taylor1ChainWg::kStateFloats]. The body is empty for targets other than sm_90a (the host
// launches it on compute capability 9.0 only).
__device__ __forceinline__ void taylor1_forward_chain_wg(const TaylorParams& tp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using T = __nv_bfloat16;
    using L = Taylor1ChainWg;
    using Ops = Taylor1ChainWgOps;
    constexpr int C = L::C, NJ = Ops::NJ;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* base = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    __shared__ int sTicket;
    __shared__ float sInv[C];
    __shared__ __align__(16) float sC[2][C];  // Σv of the keys before the chunks of parity 0, 1
    if (dynamic_smem_bytes() < (unsigned)L::kBytes) __trap();

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int* flags = tp.chain_flags();
    taylor1_chain_ticket(tp, &sTicket);
    const Taylor1ChainWork<T> w(tp, sTicket);
    const int round = w.role.round, h = w.role.h, len = w.len, seg = w.seg, n_seg = w.n_seg, c_lo = w.c_lo;
    const SeqInfo& si = w.si;
    const long long at = w.at;
    const T *k0 = w.k0, *v0 = w.v0;
    const bool l2 = P.l2norm != 0;
    unsigned char* ones = base + L::kOnes;
    const uint32_t ones_addr = smem_addr(ones);

    float F[NJ][4], sv[1][4];
#pragma unroll
    for (int j = 0; j < NJ; ++j) F[j][0] = F[j][1] = F[j][2] = F[j][3] = 0.f;
    sv[0][0] = sv[0][1] = sv[0][2] = sv[0][3] = 0.f;

    if (w.role.fold) {
        if (round + 1 >= n_seg) return;  // no later segment reads I_round
        constexpr int FS = L::FS;
        const int n_chunks = seg / C;  // whole: segment round + 1 exists
        Ops::init_ones(ones, tid);
        auto issue = [&](int c) {
            if (c < n_chunks) {
                unsigned char* st = base + (c % FS) * L::kFStage;
                const int j0 = c_lo + c * C;
                load_tile_sw128<T, C, L::D, kTaylorThreads>(reinterpret_cast<T*>(st), k0, P.k_seq, j0, len, tid);
                load_tile_sw128<T, C, L::D, kTaylorThreads>(reinterpret_cast<T*>(st + L::kTile), v0, P.v_seq, j0, len,
                                                            tid);
            }
            cp_async_commit();  // (also past the last chunk: every iteration waits for the same count)
        };
#pragma unroll
        for (int c = 0; c < FS - 1; ++c) issue(c);
#pragma unroll 1
        for (int c = 0; c < n_chunks; ++c) {
            cp_async_wait<FS - 2>();
            fence_proxy_async();
            __syncthreads();  // chunk c has landed for every thread; chunk c − 1's stage is no longer read
            issue(c + FS - 1);
            unsigned char* kt = base + (c % FS) * L::kFStage;
            if (l2) {
                Ops::l2norm_rows(kt, P.eps, tid);
                fence_proxy_async();
                __syncthreads();
            }
            const uint32_t k_addr = smem_addr(kt);
            wg_fence();
            Ops::fold(F, sv, k_addr, k_addr + L::kTile, ones_addr);
            wg_wait<0>();
            fence_regs(F);
            fence_regs(sv);
        }
        cp_async_wait<0>();
        const bool ok = round == 0 || taylor1_chain_wait(tp, flags + at - 1);
        if (round > 0 && ok) Ops::load_state(F, sv, tp.st + (at - 1) * L::kStateFloats, tid);
        w.release(tp, ok, [&] { Ops::store_state(F, sv, tp.st + at * L::kStateFloats, tid); });
        return;
    }

    // Forward block.
    if (round >= n_seg) return;
    const int c_hi = min(c_lo + seg, len);
    const int n_chunks = (c_hi - c_lo + C - 1) / C;
    const T* q0 = static_cast<const T*>(P.q) + si.q_off(P, 0, h);
    T* o0 = static_cast<T*>(P.o) + si.o_off(P, 0, h);
    auto stage = [&](int st) { return base + st * L::kStage; };
    auto issue = [&](int c) {  // chunk c, in order
        unsigned char* st = stage(c & 1);
        const int i0 = c_lo + c * C;
        load_tile_sw128<T, C, L::D, kTaylorThreads>(reinterpret_cast<T*>(st + L::kQ), q0, P.q_seq, i0, c_hi, tid);
        load_tile_sw128<T, C, L::D, kTaylorThreads>(reinterpret_cast<T*>(st + L::kK), k0, P.k_seq, i0, c_hi, tid);
        load_tile_sw128<T, C, L::D, kTaylorThreads>(reinterpret_cast<T*>(st + L::kV), v0, P.v_seq, i0, c_hi, tid);
        cp_async_commit();
    };
    issue(0);
    Ops::init_ones(ones, tid);
    if (round > 0) {
        if (!taylor1_chain_wait(tp, flags + at - 1)) {
            cp_async_wait<0>();  // (chunk 0's copies land before the block ends)
            return;
        }
        Ops::load_state(F, sv, tp.st + (at - 1) * L::kStateFloats, tid);
    }
    const uint32_t sr0 = smem_addr(base + L::kSr);
    Ops::publish(F, sv, sr0, sC[0], warp, lane);

    const float a0 = tp.a0, a1s = tp.a1 * P.scale;
#pragma unroll 1
    for (int c = 0; c < n_chunks; ++c) {
        const int st = c & 1, i0 = c_lo + c * C;
        cp_async_wait<0>();
        fence_proxy_async();  // (the copies, the published Sr: to wgmma's reads)
        __syncthreads();      // chunk c and Sr[st] are ready; stage c + 1 and Sr[st ^ 1] are free
        if (c + 1 < n_chunks) issue(c + 1);
        unsigned char* sQ = stage(st) + L::kQ;
        unsigned char* sK = stage(st) + L::kK;
        const uint32_t k_addr = smem_addr(sK), sr = sr0 + st * 2 * L::kSrTile;
        if (l2) {
            Ops::l2norm_rows(sK, P.eps, tid);
            uint4 chunk[4];
            const float rq = wg_key_inv_norm(sQ, P.eps, tid, chunk);
            if (tid % 2 == 0) sInv[tid / 2] = rq;
            fence_proxy_async();
            __syncthreads();
        }

        Ops::forward_chunk(F, sv, sQ, k_addr, sr, sC[st], sInv, ones_addr, P, si, h, o0, i0, c_hi, a0, a1s, l2, [&] {
            if (c + 1 < n_chunks) Ops::publish(F, sv, sr0 + (st ^ 1) * 2 * L::kSrTile, sC[st ^ 1], warp, lane);
        });
    }
#endif
}

}  // namespace attn
