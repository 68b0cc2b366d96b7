// Order 1, causal, where every sequence has as many queries as keys (query i sees the keys j ≤ i in both
// alignments), f16/bf16, rows 16-byte aligned, D ≤ 64: the whole forward in one kernel that reads q, k, v
// from DRAM once and writes o once. The two-pass path (taylor1_fold and
// the prefix, then taylor1_forward_causal) reads k and v twice.
//
// The sequences are cut into segments of L keys (and as many queries). Blocks take tickets from a counter
// in the order they start: the fold blocks of the first la rounds, then per round r the fold blocks of
// round r + la (F = B·Hkv of them) and the forward blocks of round r (Q = B·Hq):
//   fold block (b, hk, r), when segment r + 1 exists: T_r = the sums of segment r's keys (whole chunks of
//     64, the fold of taylor1_fold: Sᵀ[v][f] = Σ_j ṽ_j[v] φ_f(k̂_j), φ = [1, k̂]), then it waits for
//     flag r − 1, writes I_r = I_{r−1} + T_r (I_0 = T_0) and raises flag r. The inclusive sums are one
//     chain in a fixed order: the same bits every run.
//   forward block (b, h, r): waits for flag r − 1 of kv head hk = h / G (r > 0), takes I_{r−1} into the
//     fold's accumulators (registers, f32), and runs segment r's chunks in order. Chunk c (64 queries,
//     one m16 row tile per warp; its 64 keys are the dense part):
//       [num, den] = a1 r_z (q_raw · Sr_lin) + a0 S_const + Σ_{j ≤ i} f(r_z q_raw·k̂_j) ṽ_j,  o = num/den,
//     with Sr the state of the keys before the chunk rounded to tf32 (taylor1_state_tf32, as the two-pass
//     forward reads it); then the chunk's keys are folded into the accumulators and the owners write the
//     next chunk's Sr into the other of two buffers: one barrier per chunk. The chunk's q, k and v rows
//     come by cp.async into two stages, the next chunk's in flight during this one.
// A block waits only for the flag of round r − 1, whose fold block took a smaller ticket: it is running or
// done, and a fold block waits only for an earlier fold block, so every wait ends. A forward block reads
// the keys that the fold block la rounds before it read: from L2 when la is small (la = 0: its own
// round's), and its wait is short when la is large (the fold of round r − 1 started la + 1 rounds earlier).
// Every wait is bounded (taylor1_chain_wait): a flag not raised within kChainWaitNs of global time ends
// the block, so a broken chain fails instead of hanging. The status word after the ticket counter says
// how: 0 (the default) traps, which fails the launch (the next synchronisation on the context returns a
// launch failure); kChainReport (set by the host under ATTN_CUDA_CHECK_LAUNCHES=1) records kChainTimedOut
// there, the block raises its own flag as kChainFailed so that the blocks after it end at once, and the
// host, which synchronises after every launch in that mode, returns a typed error naming the kernel.
// The states I_r are the fold's accumulators in thread order ([NPW][MT][threads] float4: each thread
// writes and reads its own), so they move in 16-byte coalesced accesses and need no layout of their own.
#pragma once
#include "taylor_order1_causal.cuh"

namespace attn {

// The tiles. Mirrored by taylor::heuristics::{order1_chain_smem, order1_chain_state_floats}.
template <typename T, int D> struct Taylor1Chain {
    static constexpr int C = 64;                         // queries and keys per chunk
    static constexpr int M = TaylorDims<D>::M, MP = TaylorDims<D>::MP;
    static constexpr int MT = MP / 16;                   // m16 tiles of v in the fold (the last holds den)
    static constexpr int NO = MP / 8;                    // n8 tiles of v in the reads
    static constexpr int NT = 1 + D / 8;                 // n8 feature tiles of the fold: const, then linear
    static constexpr int NPW = (NT + kTaylorWarps - 1) / kTaylorWarps;  // warp w: tiles w, w + 4, …
    static constexpr int LD = SmemRow<D>::ld;            // q, k rows, T
    static constexpr int LDY = MP + 8;                   // ṽ rows, T: v, then 1 (den), then zeros
    static constexpr int LDS = D + 8;                    // Sr rows, f32: the linear features 0..D−1
    static constexpr int CPR = D * 2 / 16;               // 16-byte copies per row
    // Forward block: two stages of Q [C][LD], X [C][LD] (k̂), Y [C][LDY] (ṽ), then Sr [2][MP][LDS] f32.
    static constexpr int kQ = 0, kX = kQ + C * LD * 2, kY = kX + C * LD * 2, kStage = kY + C * LDY * 2;
    static constexpr int kS = 2 * kStage;
    static constexpr int kBytes = kS + 2 * MP * LDS * 4;
    // Fold block: FS stages of X, Y in the same memory (more chunks in flight: it has no q, o or Sr).
    static constexpr int kFStage = C * LD * 2 + C * LDY * 2;
    static constexpr int FS = kBytes / kFStage < 4 ? kBytes / kFStage : 4;
    static constexpr int kStateFloats = NPW * MT * 4 * kTaylorThreads;
    static_assert(kStage % 16 == 0 && kFStage % 16 == 0 && FS >= 2, "16-byte aligned stages");
};

__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release_gpu(int* p, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// A chain flag: 0 until its fold block raises it, then 1, or kChainFailed where that block gave up.
constexpr int kChainRaised = 1, kChainFailed = 2;
// The status word (after the ticket counter): 0 traps on a timed-out wait; kChainReport records
// kChainTimedOut instead (ATTN_CUDA_CHECK_LAUNCHES=1); kChainReportStall also keeps round 0's flags
// down, so that a test sees the bound end a wait (the host sets it only for that test).
constexpr int kChainTrap = 0, kChainReport = 1, kChainTimedOut = 2, kChainReportStall = 3;
// How long a block waits for a flag, in ns of %globaltimer: 2 s. A link of the chain takes microseconds
// (a 1024-key segment's fold); the bound is there to turn a bug into an error, and stays far above the
// slowdown of compute-sanitizer.
constexpr unsigned long long kChainWaitNs = 2000000000ull;

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The calling thread waits until *flag is set (acquire) or kChainWaitNs have passed (then kChainFailed);
// a barrier after it passes its view on. The clock is read only while the flag is down.
__device__ __forceinline__ int taylor1_chain_poll(const int* flag) {
    int v = ld_acquire_gpu(flag);
    if (v != 0) return v;
    const unsigned long long t0 = global_ns();
    while ((v = ld_acquire_gpu(flag)) == 0) {
        __nanosleep(64);
        if (global_ns() - t0 > kChainWaitNs) return kChainFailed;
    }
    return v;
}

// The status word of the chain kernels' launch: after the flags [B][Hkv][R] and the ticket counter.
__device__ __forceinline__ int* taylor1_chain_status(const TaylorParams& tp) {
    const AttnParams& P = tp.base;
    return tp.chain_flags() + (long long)P.batch * P.heads_kv * tp.n_seg + 1;
}

// Thread 0 waits until *flag is set (acquire), then the barrier passes its view to the block. False where
// the wait failed (timed out, or the flag was raised as failed): the caller ends the block. In the default
// mode a timeout traps here.
__device__ __forceinline__ bool taylor1_chain_wait(const TaylorParams& tp, const int* flag) {
    __shared__ int sFlag;
    if (threadIdx.x == 0) {
        const int v = taylor1_chain_poll(flag);
        if (v != kChainRaised) {
            int* status = taylor1_chain_status(tp);
            if (*status == kChainTrap) __trap();
            atomicExch(status, kChainTimedOut);
        }
        sFlag = v;
    }
    __syncthreads();
    return sFlag == kChainRaised;
}

// The chain state I of (b, hk, r) and its flag; the ticket counter sits after the flags.
__device__ __forceinline__ long long taylor1_chain_index(const TaylorParams& tp, int b, int hk, int r) {
    return ((long long)b * tp.base.heads_kv + hk) * tp.n_seg + r;
}

// A chain state's publication: `store` writes it, then the block raises flags[at] (the state visible
// first: fence, barrier, release). `ok` false: the block's own wait failed; it raises the flag as failed,
// without a state.
template <class Store>
__device__ __forceinline__ void taylor1_chain_publish(const TaylorParams& tp, long long at, bool ok, Store store) {
    if (ok) store();
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int* flags = tp.chain_flags();
        // The test of the bound (kChainReportStall): round 0's flags stay down.
        if (ok && at % tp.n_seg == 0 && *taylor1_chain_status(tp) == kChainReportStall) return;
        st_release_gpu(flags + at, ok ? kChainRaised : kChainFailed);
    }
}

// This block's ticket, the order in which it started (thread 0 takes it; every thread reads it after the
// barrier).
__device__ __forceinline__ void taylor1_chain_ticket(const TaylorParams& tp, int* ticket) {
    const AttnParams& P = tp.base;
    if (threadIdx.x == 0) *ticket = atomicAdd(tp.chain_flags() + (long long)P.batch * P.heads_kv * tp.n_seg, 1);
    __syncthreads();
}

// What a ticket runs. Tickets: the fold blocks of rounds 0 … la − 1 first, then per round r the fold
// blocks of round r + la and the forward blocks of round r (la = tp.lookahead(): how many rounds the folds run
// ahead); h is the query head of a forward block and the kv head of a fold block.
struct Taylor1ChainRole {
    int round, b, h, hk;
    bool fold;
    __device__ __forceinline__ Taylor1ChainRole(const TaylorParams& tp, int ticket) {
        const AttnParams& P = tp.base;
        const int n_fold = P.batch * P.heads_kv, n_fwd = P.batch * P.heads_q, la = tp.lookahead();
        int k = ticket;
        fold = true;
        if (k < la * n_fold) {
            round = k / n_fold;
            k %= n_fold;
        } else {
            k -= la * n_fold;
            round = k / (n_fold + n_fwd);
            k %= n_fold + n_fwd;
            fold = k < n_fold;
            if (fold) round += la;
            else k -= n_fold;
        }
        const int heads = fold ? P.heads_kv : P.heads_q;
        b = k / heads;
        h = k % heads;
        hk = fold ? h : h / P.group;
    }
};

// What a block of the chain works on: its role, sequence, segment [c_lo, c_lo + L) and chain slot `at`,
// the sequence's key and value rows of kv head hk. Every sequence has as many queries as keys (the host
// routes only such calls here; anything else traps).
template <typename T> struct Taylor1ChainWork {
    Taylor1ChainRole role;
    SeqInfo si;
    int len, seg, n_seg, c_lo;
    long long at;
    const T *k0, *v0;
    __device__ __forceinline__ Taylor1ChainWork(const TaylorParams& tp, int ticket)
        : role(tp, ticket), si(tp.base, role.b), len(si.len_k), seg(tp.seg_len), n_seg((len + seg - 1) / seg),
          c_lo(role.round * seg), at(taylor1_chain_index(tp, role.b, role.hk, role.round)),
          k0(static_cast<const T*>(tp.base.k) + si.k_off(tp.base, 0, role.hk)),
          v0(static_cast<const T*>(tp.base.v) + si.v_off(tp.base, 0, role.hk)) {
        if (si.len_q != len) __trap();
    }
    // A fold block's end: `store` writes I_round into its chain state, then flag `at` is raised (as failed
    // where `ok` is false: the block's wait failed).
    template <class Store>
    __device__ __forceinline__ void release(const TaylorParams& tp, bool ok, Store store) const {
        taylor1_chain_publish(tp, at, ok, store);
    }
};

template <typename T, int D> struct Taylor1ChainBlock {
    using L = Taylor1Chain<T, D>;
    static constexpr int C = L::C, MT = L::MT, NT = L::NT, NPW = L::NPW, LD = L::LD, LDY = L::LDY;
    static constexpr int LDS = L::LDS, CPR = L::CPR, RPP = kTaylorThreads / CPR;

    // The den column (1) and the zero columns past it of a Y tile; the copies never write them.
    static __device__ __forceinline__ void init_y(T* y, int tid) {
        for (int idx = tid; idx < C * (L::MP - D); idx += kTaylorThreads) {
            const int r = idx / (L::MP - D), c = D + idx % (L::MP - D);
            y[r * LDY + c] = from_f32<T>(c == D ? 1.f : 0.f);
        }
    }

    // This thread's 16-byte copies of one tensor's chunks: rows r0 + k·RPP (k < RPT) of each chunk, column
    // 8·ch, r0 = tid / CPR, ch = tid % CPR, into a tile [C][LDT] of a stage, by cp_async_column: the row
    // address advances by one 64-bit add per chunk and per row (the addresses as a multiply and a select
    // per copy took ~50 instructions each in the chunk loop's SASS).
    template <int LDT> struct Copies {
        static constexpr int RPT = C / RPP;
        const T* row;     // row r0 of the next chunk, column 8·ch
        long long step;   // RPP rows, in elements
        long long chunk;  // C rows, in elements
        uint32_t dst;     // shared address of row r0, column 8·ch of the first stage's tile
        __device__ __forceinline__ Copies(const T* src, long long stride, int j0, const T* tile, int tid)
            : row(src + (long long)(j0 + tid / CPR) * stride + 8 * (tid % CPR)), step(RPP * stride),
              chunk(C * stride), dst(smem_addr(tile + (tid / CPR) * LDT + 8 * (tid % CPR))) {}
        // The next chunk into the tile `stage_bytes` past the first one's (rows r with r0 + k·RPP < n_valid;
        // the others zero-filled from `stand_in`, a valid address), no commit.
        __device__ __forceinline__ void issue(uint32_t stage_bytes, int n_valid, const T* stand_in, int tid) {
            cp_async_column<RPT, RPP, RPP * LDT * 2>(dst + stage_bytes, row, step, n_valid - tid / CPR, stand_in);
            row += chunk;
        }
    };

    // acc[j][m] += the chunk's Sᵀ (taylor1_fold_chunk: every m-tile, the warp's static n-tiles).
    static __device__ __forceinline__ void fold(float (&acc)[NPW][MT][4], const T* x, const T* y, int warp, int lane) {
        taylor1_fold_chunk<T, D, C, MT, NPW, LD, LDY>(acc, x, y, 0, warp, lane);
    }

    // Sr ← the accumulators: linear features rounded to tf32 (the read's B); Sc ← the const one as it is.
    template <bool W0>
    static __device__ __forceinline__ void publish_tiles(const float (&acc)[NPW][MT][4], float* S, float* Sc, int warp,
                                                         int lane) {
        const int g = lane / 4, t4 = lane % 4;
#pragma unroll
        for (int j = 0; j < Taylor1FoldTiles<D, NPW, W0>::kCount; ++j) {
            const int n = (W0 ? 0 : warp) + kTaylorWarps * j;
            if (Taylor1FoldTiles<D, NPW, W0>::kMayPassNt && n >= NT) continue;
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int v = 16 * m + g + 8 * r;
                    if (W0 && j == 0) {
                        if (t4 == 0) Sc[v] = acc[j][m][2 * r];
                    } else {
                        *reinterpret_cast<float2*>(S + v * LDS + 8 * (n - 1) + 2 * t4) =
                            make_float2(round_tf32(acc[j][m][2 * r]), round_tf32(acc[j][m][2 * r + 1]));
                    }
                }
        }
    }
    static __device__ __forceinline__ void publish(const float (&acc)[NPW][MT][4], float* S, float* Sc, int warp,
                                                   int lane) {
        if (warp == 0) publish_tiles<true>(acc, S, Sc, warp, lane);
        else publish_tiles<false>(acc, S, Sc, warp, lane);
    }

    // The accumulators' slots of this thread in a chain state: float4 (j·MT + m)·threads + tid.
    static __device__ __forceinline__ float4* slot(float* state, int j, int m, int tid) {
        return reinterpret_cast<float4*>(state) + (j * MT + m) * kTaylorThreads + tid;
    }
    static __device__ __forceinline__ void load_state(float (&acc)[NPW][MT][4], float* state, int warp, int tid,
                                                      bool add) {
#pragma unroll
        for (int j = 0; j < NPW; ++j) {
            if (warp + kTaylorWarps * j >= NT) continue;
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                const float4 s = __ldcg(slot(state, j, m, tid));  // (written by another block: not via L1)
                acc[j][m][0] = add ? acc[j][m][0] + s.x : s.x;
                acc[j][m][1] = add ? acc[j][m][1] + s.y : s.y;
                acc[j][m][2] = add ? acc[j][m][2] + s.z : s.z;
                acc[j][m][3] = add ? acc[j][m][3] + s.w : s.w;
            }
        }
    }
    static __device__ __forceinline__ void store_state(const float (&acc)[NPW][MT][4], float* state, int warp, int tid) {
#pragma unroll
        for (int j = 0; j < NPW; ++j) {
            if (warp + kTaylorWarps * j >= NT) continue;
#pragma unroll
            for (int m = 0; m < MT; ++m)
                __stcg(slot(state, j, m, tid), make_float4(acc[j][m][0], acc[j][m][1], acc[j][m][2], acc[j][m][3]));
        }
    }
};

// One launch of la·F + R·(F + Q) blocks of 128 threads (see the top); tp.seg_len = L, tp.n_seg = R (the
// segments of the longest sequence), tp.lookahead() = la, tp.st the chain states [B][Hkv][R][kStateFloats],
// tp.chain_flags() the flags [B][Hkv][R] and the ticket counter, zeroed.
template <typename T, int D>
__device__ __forceinline__ void taylor1_forward_chain(const TaylorParams& tp) {
    using L = Taylor1Chain<T, D>;
    using Blk = Taylor1ChainBlock<T, D>;
    constexpr int C = L::C, MP = L::MP, NO = L::NO, MT = L::MT, NPW = L::NPW, LD = L::LD, LDY = L::LDY;
    constexpr int LDS = L::LDS, CPR = L::CPR;
    static_assert(MP % 8 == 0, "float2 reads of Sc");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ int sTicket;
    __shared__ float sInv[C];
    __shared__ __align__(8) float sC[2][MP];  // the const feature's sums of Sr[0], Sr[1]
    if (dynamic_smem_bytes() < (unsigned)L::kBytes) __trap();

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    int* flags = tp.chain_flags();
    taylor1_chain_ticket(tp, &sTicket);
    const Taylor1ChainWork<T> w(tp, sTicket);
    const bool fold_block = w.role.fold;
    const int round = w.role.round, h = w.role.h, len = w.len, seg = w.seg, n_seg = w.n_seg, c_lo = w.c_lo;
    const SeqInfo& si = w.si;
    const long long at = w.at;
    const T *k0 = w.k0, *v0 = w.v0;
    const bool l2 = P.l2norm != 0;

    float acc_s[NPW][MT][4];
#pragma unroll
    for (int j = 0; j < NPW; ++j)
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[j][m][e] = 0.f;

    if (fold_block) {
        if (round + 1 >= n_seg) return;  // no later segment reads I_round
        constexpr int FS = L::FS;
        auto stage_x = [&](int st) { return reinterpret_cast<T*>(smem_raw + st * L::kFStage); };
        auto stage_y = [&](int st) { return reinterpret_cast<T*>(smem_raw + st * L::kFStage + C * LD * 2); };
        for (int st = 0; st < FS; ++st) Blk::init_y(stage_y(st), tid);
        const int n_chunks = seg / C;  // whole: segment round + 1 exists
        typename Blk::template Copies<LD> cx(k0, P.k_seq, c_lo, stage_x(0), tid);
        typename Blk::template Copies<LDY> cy(v0, P.v_seq, c_lo, stage_y(0), tid);
        auto issue = [&](int c) {
            if (c < n_chunks) {
                cx.issue((c % FS) * L::kFStage, C, k0, tid);
                cy.issue((c % FS) * L::kFStage, C, k0, tid);
            }
            cp_async_commit();  // (also past the last chunk: every iteration waits for the same count)
        };
#pragma unroll
        for (int c = 0; c < FS - 1; ++c) issue(c);
        for (int c = 0; c < n_chunks; ++c) {
            cp_async_wait<FS - 2>();
            __syncthreads();  // chunk c has landed for every thread; chunk c − 1's stage is no longer read
            issue(c + FS - 1);
            T* x = stage_x(c % FS);
            if (l2) {
                taylor1_scale_rows<T, C, D>(x, true, P.eps, [](int) { return 1.f; }, tid);
                __syncthreads();
            }
            Blk::fold(acc_s, x, stage_y(c % FS), warp, lane);
        }
        cp_async_wait<0>();
        const bool ok = round == 0 || taylor1_chain_wait(tp, flags + at - 1);
        if (round > 0 && ok) Blk::load_state(acc_s, tp.st + (at - 1) * L::kStateFloats, warp, tid, true);
        w.release(tp, ok, [&] { Blk::store_state(acc_s, tp.st + at * L::kStateFloats, warp, tid); });
        return;
    }

    // Forward block.
    if (round >= n_seg) return;
    const int c_hi = min(c_lo + seg, len);
    const int n_chunks = (c_hi - c_lo + C - 1) / C;
    const T* q0 = static_cast<const T*>(P.q) + si.q_off(P, 0, h);
    T* o0 = static_cast<T*>(P.o) + si.o_off(P, 0, h);
    auto stage_q = [&](int st) { return reinterpret_cast<T*>(smem_raw + st * L::kStage + L::kQ); };
    auto stage_x = [&](int st) { return reinterpret_cast<T*>(smem_raw + st * L::kStage + L::kX); };
    auto stage_y = [&](int st) { return reinterpret_cast<T*>(smem_raw + st * L::kStage + L::kY); };
    auto sr = [&](int bf) { return reinterpret_cast<float*>(smem_raw + L::kS) + bf * MP * LDS; };
    typename Blk::template Copies<LD> cq(q0, P.q_seq, c_lo, stage_q(0), tid);
    typename Blk::template Copies<LD> cx(k0, P.k_seq, c_lo, stage_x(0), tid);
    typename Blk::template Copies<LDY> cy(v0, P.v_seq, c_lo, stage_y(0), tid);
    auto issue = [&](int c) {  // chunk c, in order
        const uint32_t st = (c & 1) * L::kStage;
        const int n_valid = c_hi - (c_lo + c * C);
        cq.issue(st, n_valid, k0, tid);
        cx.issue(st, n_valid, k0, tid);
        cy.issue(st, n_valid, k0, tid);
        cp_async_commit();
    };
    issue(0);
    Blk::init_y(stage_y(0), tid);
    Blk::init_y(stage_y(1), tid);
    if (round > 0) {
        if (!taylor1_chain_wait(tp, flags + at - 1)) {
            cp_async_wait<0>();  // (chunk 0's copies land before the block ends)
            return;
        }
        Blk::load_state(acc_s, tp.st + (at - 1) * L::kStateFloats, warp, tid, false);
    }
    Blk::publish(acc_s, sr(0), sC[0], warp, lane);  // (rows v past M: zero, as the accumulators' are)

    const int wrow = warp * 16;
    // This lane's o rows: wrow + lane / CPR + k·(32 / CPR) of each chunk, column 8·(lane % CPR).
    T* o_row = o0 + (long long)(c_lo + wrow + lane / CPR) * P.o_seq + 8 * (lane % CPR);
    const long long o_step = (32 / CPR) * P.o_seq, o_chunk = C * P.o_seq;
    for (int c = 0; c < n_chunks; ++c) {
        const int st = c & 1, i0 = c_lo + c * C;
        cp_async_wait<0>();
        __syncthreads();  // chunk c and Sr[c & 1] are ready; stage c + 1 and Sr[(c + 1) & 1] are free
        if (c + 1 < n_chunks) issue(c + 1);
        T* sQ = stage_q(st);
        T* x = stage_x(st);
        const T* y = stage_y(st);
        if (l2) {
            taylor1_scale_rows<T, C, D>(x, true, P.eps, [](int) { return 1.f; }, tid);
            __syncthreads();
        }
        // The next chunk's state: this chunk's keys folded in (the last chunk's are never needed).
        if (c + 1 < n_chunks) {
            Blk::fold(acc_s, x, y, warp, lane);
            Blk::publish(acc_s, sr(st ^ 1), sC[st ^ 1], warp, lane);
        }

        // r_z = scale (/‖q‖) of this warp's rows.
        if (l2) {
            taylor1_row_inv_norms<T, D, 16>(sInv, sQ, wrow, P.eps, lane);
            __syncwarp();
        }
        float c1[2];  // a1·r_z: order 1's f(r_z s) = a0 + c1 s (a2 = 0)
#pragma unroll
        for (int r = 0; r < 2; ++r) c1[r] = tp.a1 * P.scale * (l2 ? sInv[wrow + g + 8 * r] : 1.f);

        // [num, den] = a1 r_z (Q_raw Sr_linᵀ) + a0 S_const on tf32 mma.
        float acc[NO][4];
        taylor1_state_tf32<T, D, NO, false, false>(acc, sQ, wrow, sr(st), lane);
#pragma unroll
        for (int nn = 0; nn < NO; ++nn) {
            const float2 c = *reinterpret_cast<const float2*>(&sC[st][8 * nn + 2 * t4]);
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nn][e] = fmaf(c1[e / 2], acc[nn][e], tp.a0 * ((e & 1) ? c.y : c.x));
        }

        // The chunk's keys densely: f(r_z q_raw·k̂_j) for j ≤ i.
        float s[C / 8][4];
        taylor_scores_mma<T, D, C>(s, sQ, LD, wrow, x, LD, lane);
#pragma unroll
        for (int nn = 0; nn < C / 8; ++nn)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e / 2, row = wrow + g + 8 * r, col = nn * 8 + 2 * t4 + (e & 1);
                s[nn][e] = col <= row ? fmaf(c1[r], s[nn][e], tp.a0) : 0.f;
            }
        taylor_weights_mma<T, C, MP>(acc, s, y, LDY, lane);
        __syncwarp();  // this warp's q rows are read; o goes in their place

        // o = num·(1/den) staged as T in this warp's q rows, den to the statistics; 16-byte stores.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = wrow + g + 8 * r, i = i0 + row;
            const float den = __shfl_sync(0xffffffffu, acc[D / 8][2 * r], lane & ~3);
            const float inv = 1.f / den;
#pragma unroll
            for (int nn = 0; nn < D / 8; ++nn)
                *reinterpret_cast<uint32_t*>(sQ + row * LD + nn * 8 + 2 * t4) =
                    pack2<T>(acc[nn][2 * r] * inv, acc[nn][2 * r + 1] * inv);
            if (t4 == 0 && i < c_hi) P.lse[si.stats_index(P, h, i)] = den;
        }
        __syncwarp();
        {
            T* op = o_row;  // row wrow + lane / CPR of the chunk, column 8·(lane % CPR)
#pragma unroll
            for (int idx = lane; idx < 16 * CPR; idx += 32) {
                const int row = wrow + idx / CPR, ch = idx % CPR;
                if (i0 + row < c_hi)
                    *reinterpret_cast<uint4*>(op) = *reinterpret_cast<const uint4*>(sQ + row * LD + 8 * ch);
                op += o_step;
            }
            o_row += o_chunk;
        }
    }
}

}  // namespace attn
