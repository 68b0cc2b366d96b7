// Order 1, causal (f16/bf16, rows 16-byte aligned, D ≤ 64): the forward and the backward's two probe kernels,
// all in one block structure.
// Grid (n_seg, Hkv, B): block m of a sweep takes the probes whose state index is m (TaylorSweep::state_index:
// hi ∈ (mL, (m+1)L], and in block 0 also hi = 0), a contiguous range since hi is nondecreasing, in tiles of
// BP. It carries the state S of the sources [0, B) in shared memory (f32), from the prefix's st[m − 1]
// (B = mL; zero for m = 0; no storage-type copies), and per tile
//   1. folds the whole 64-source chunks below the tile's smallest hi into it (B advances by 64 each):
//      S[v][f] += Σ_s ỹ_s[v] φ_f(x_s), φ = [1, x], on mma.sync (A = Ỹᵀ, B = [1, X]);
//   2. reads the state on tf32 mma (the probe rows raw: exact in tf32);
//   3. adds the sources [B, hi_p) densely on mma.sync;
//   4. writes its probes' results, staged in shared memory and stored in 16-byte rows.
// Source blocks come by cp.async into two buffers; the block a tile's dense part ends on is kept for the
// next tile's fold, and the next tile's first dense block is fetched during this tile's products when the
// other buffer is free. The next tile's probe rows are always in flight during this tile.
//
// The three kernels (ṽ = [v, 1]; g̃ = [rg·dO, nd], rg = 1/den, nd = −δ: taylor_prep_grads):
//   forward  probes the queries, sources the keys (x = k̂, y = ṽ; S rounded to tf32 once per fold):
//            [num, den] = a0 S_const + a1 r_z (q_raw·S_lin) + Σ_dense f(r_z q_raw·k̂_s) ṽ_s;  o = num/den.
//   dq       probes the queries (w = g̃), the same sources:
//            dû = a1 (rg (dO_raw·S_lin[0..Dv)) + nd S_lin[Dv]) + Σ_dense a1 (rg (dO_raw·v_s) + nd) k̂_s;
//            dq = J(q)ᵀ (scale·dû).
//   dkdv     probes the keys from the last (z = k, w = ṽ), sources the query rows from the last (x = scale·q̂,
//            y = g̃, both rounded to T as taylor1_fold has them); both reads of one state U:
//            dṽ = a0 U_const + a1 r_z (k_raw·U_lin) + Σ_dense f(r_z k_raw·x_s) y_s,
//            dk̂ = a1 (v_raw·U_lin[0..Dv) + U_lin[Dv]) + Σ_dense a1 (v_raw·y_s[0..Dv) + nd_s) x_s;
//            dk = J(k)ᵀ dk̂, dv = dṽ[0..Dv); key rows past len_k get zeros. Without qk_l2norm the sources
//            are q raw and the reads apply the scale (TaylorParams::rev_raw): f is then the forward's f to f32
//            rounding, as dv needs where a denominator nears 0 (f_ji·rg_i is the ratio of two of them).
//            Its folds never take the chunk of the last source (the first queries, whose small denominators
//            make their state terms ill-conditioned: they stay dense for every key, as in the general path).
//            nd is −T(ĝ)·o here (TaylorParams::nd_rev), so that v_j·T(ĝ_i) + nd_i cancels exactly where
//            o_i = v_j (a query that sees one key), and the state's den row is kept as T and its
//            remainder (rows D and D + 1 of S, as taylor1_fold makes the prefix's).
// The gradient reads take S as tf32 hi + lo (two products, about 21 significant bits), since their two
// terms cancel (Σ_j f_ij (g̃_i·ṽ_j) = 0); the row factors apply in f32 after the products.
#pragma once
#include "taylor_order1.cuh"

namespace attn {

// The tiles of the causal kernels. Mirrored by taylor::heuristics::{order1_causal_smem, order1_causal_bwd_smem}.
template <typename T, int D> struct Taylor1Causal {
    static constexpr int BP = 16 * kTaylorWarps;         // probes per tile: one m16 row tile per warp
    static constexpr int C = 64;                         // sources per block (folded chunk or dense block)
    static constexpr int M = TaylorDims<D>::M, MP = TaylorDims<D>::MP;
    static constexpr int NO = MP / 8;                    // n8 tiles of the columns v
    static constexpr int MT = MP / 16;                   // m16 tiles of v in the fold
    static constexpr int MG = D == 128 ? 3 : MT;         // of those per fold pass (its registers)
    static constexpr int NT = 1 + D / 8;                 // n8 feature tiles of the fold: const, then linear
    static constexpr int NPW = (NT + kTaylorWarps - 1) / kTaylorWarps;
    static constexpr int LD = SmemRow<D>::ld;            // q, k, v, dO rows, T
    static constexpr int LDY = MP + 8;                   // y rows of the sources, T: columns D (den) to MP − 1
    static constexpr int LDS = D + 8;                    // state rows, f32: linear features 0..D−1, const at D
    static constexpr int CPR = D * 2 / 16;               // 16-byte copies per row
    // Forward: Q [2][BP][LD] T (then o), X [2][C][LD] T, Y [2][C][LDY] T, S [MP][LDS] f32, Sr (S rounded
    // to tf32, the mma's B) [MP][LDS].
    static constexpr int kQ = 0;
    static constexpr int kX = kQ + 2 * BP * LD * 2;
    static constexpr int kY = kX + 2 * C * LD * 2;
    static constexpr int kS = kY + 2 * C * LDY * 2;
    static constexpr int kSr = kS + MP * LDS * 4;
    static constexpr int kBytes = kSr + MP * LDS * 4;
    // Backward: two probe tiles A [2][BP][LD] (dO or k; then dq or dk), B [2][BP][LD] (q or v; then dv),
    // X, Y, S as the forward's (no Sr).
    static constexpr int kA = 0;
    static constexpr int kB = kA + 2 * BP * LD * 2;
    static constexpr int kXb = kB + 2 * BP * LD * 2;
    static constexpr int kYb = kXb + 2 * C * LD * 2;
    static constexpr int kSb = kYb + 2 * C * LDY * 2;
    static constexpr int kBytesBwd = kSb + MP * LDS * 4;
    // Stage st of the probe tiles at byte offset k (kQ, kA or kB).
    static __device__ __forceinline__ T* stage(unsigned char* smem, int k, int st) {
        return reinterpret_cast<T*>(smem + k) + st * BP * LD;
    }
    static_assert(MT % MG == 0 && LDS % 16 == 8, "whole fold passes; B reads of S without bank conflicts");
};

// cp.async.wait_group with a run-time count n ≤ 2.
__device__ __forceinline__ void cp_async_wait_n(int n) {
    if (n <= 0) cp_async_wait<0>();
    else if (n == 1) cp_async_wait<1>();
    else cp_async_wait<2>();
}

// The smallest probe p in [0, n_p) with hi(p) > h ≥ 0 (n_p when none) of a causal sweep (Taylor specs have no
// window). Forward: hi(p) = min(len_k, max(0, i + diag + 1)) for query i = p / G, so hi(p) > h iff len_k > h
// and i ≥ h − diag. Reversed: key j = n_p − 1 − p sees the query rows of i ≥ i0(j) = clamp(j − diag, 0, len_q),
// hi = G·(len_q − i0) > h iff i0 ≤ c = len_q − 1 − ⌊h/G⌋ iff j ≤ c + diag (none when c < 0, i.e. h ≥ n_s).
__device__ __forceinline__ int taylor1_first_probe_past(const TaylorSweep& sw, int h) {
    if (sw.n_s <= h) return sw.n_p;
    if (!sw.rev) {
        const long long p = (long long)sw.group * max(h - sw.si.diag, 0);
        return (int)min(p, (long long)sw.n_p);
    }
    const long long c = sw.si.len_q - 1 - h / sw.group;
    return (int)min(max((long long)sw.n_p - 1 - c - sw.si.diag, 0ll), (long long)sw.n_p);
}

// x rounded to the nearest tf32 (ties away from zero) by integer arithmetic: two instructions where
// cvt.rna.tf32.f32 takes several on sm_90; ±∞ stay. A NaN is returned as it is: the GPU's NaN
// 0x7fffffff plus the rounding bias would carry into the sign bit and give −0, so a NaN key's state
// sums would read as zeros past its chunk (docs/nan.md). One compare and select more per element.
__device__ __forceinline__ float round_tf32(float x) {
    const uint32_t u = __float_as_uint(x);
    return (u & 0x7fffffffu) > 0x7f800000u ? x : __uint_as_float((u + 0x1000u) & 0xffffe000u);
}

// The fold's n8 feature tiles (NT = 1 + D/8: the const one, then the linear ones) of a warp, static:
// warp w takes n = w + 4j; warp 0 (W0) takes the const tile at j = 0 and NPW of them, the others at most
// (NT + 2) / 4; whether such an n can pass NT (only at D = 16) is known at compile time. (With the checks
// at run time, ptxas kept a branch and a reconvergence point around every tile of the fold and the publish.)
template <int D, int NPW, bool W0> struct Taylor1FoldTiles {
    static constexpr int NT = 1 + D / 8;
    static constexpr int kCount = W0 ? NPW : (NT + 2) / kTaylorWarps;
    static constexpr bool kMayPassNt = (W0 ? 0 : kTaylorWarps - 1) + kTaylorWarps * (kCount - 1) >= NT;
    static_assert(kCount <= NPW, "a warp's tiles fit its accumulators");
};

// acc[j][m] += one chunk of C sources' Sᵀ[v][f] = Σ_s y_s[v] φ_f(x_s) on mma.sync: A = Yᵀ (MG m16 tiles
// of v from 16·m0; y [C][LDY]), B = [1, X] (x [C][LD]; warp w takes the n8 feature tiles w + 4j of
// Taylor1FoldTiles: the const feature at n = 0, a constant fragment with 1 in column 0, then the linear
// ones), k = the sources.
template <typename T, int D, int C, int MG, int NPW, int LD, int LDY, bool W0>
__device__ __forceinline__ void taylor1_fold_chunk_tiles(float (&acc)[NPW][MG][4], const T* x, const T* y, int m0,
                                                         int warp, int lane) {
    using Tiles = Taylor1FoldTiles<D, NPW, W0>;
    const uint32_t one2 = lane / 4 == 0 ? pack2<T>(1.f, 1.f) : 0u;
#pragma unroll
    for (int k0 = 0; k0 < C; k0 += 16) {
        uint32_t a[MG][4];
#pragma unroll
        for (int mm = 0; mm < MG; ++mm) load_a_trans(a[mm], y, LDY, k0, 16 * (m0 + mm), lane);
#pragma unroll
        for (int j = 0; j < Tiles::kCount; ++j) {
            const int nt = (W0 ? 0 : warp) + kTaylorWarps * j;
            if (Tiles::kMayPassNt && nt >= Tiles::NT) continue;  // (warp-uniform)
            uint32_t b[2] = {one2, one2};
            if (!(W0 && j == 0)) ldsm_x2_trans(b, x + (k0 + (lane & 15)) * LD + 8 * (nt - 1));
#pragma unroll
            for (int mm = 0; mm < MG; ++mm) mma16816<T>(acc[j][mm], a[mm], b[0], b[1]);
        }
    }
}
template <typename T, int D, int C, int MG, int NPW, int LD, int LDY>
__device__ __forceinline__ void taylor1_fold_chunk(float (&acc)[NPW][MG][4], const T* x, const T* y, int m0, int warp,
                                                   int lane) {
    if (warp == 0) taylor1_fold_chunk_tiles<T, D, C, MG, NPW, LD, LDY, true>(acc, x, y, m0, warp, lane);
    else taylor1_fold_chunk_tiles<T, D, C, MG, NPW, LD, LDY, false>(acc, x, y, m0, warp, lane);
}

// The sources of one block of a causal order-1 sweep (REV: the reversed one): the two source buffers, the
// running state S (with ROUNDED, also its tf32 copy Sr) and its boundary b_run, and the fold.
template <typename T, int D, bool REV, bool ROUNDED> struct Taylor1CausalSources {
    using L = Taylor1Causal<T, D>;
    static constexpr int C = L::C, M = L::M, MP = L::MP, MT = L::MT, MG = L::MG, NT = L::NT, NPW = L::NPW;
    static constexpr int LD = L::LD, LDY = L::LDY, LDS = L::LDS, CPR = L::CPR, RPP = kTaylorThreads / CPR;

    const TaylorParams& tp;
    const TaylorSweep& sw;
    T* xb;                // X [2][C][LD]: k̂, or (REV) scale·q̂
    T* yb;                // Y [2][C][LDY]: ṽ = [v, 1, 0…], or (REV) g̃ = [rg·dO, nd, 0…]
    float* S;             // [MP][LDS]
    float* Sr;            // [MP][LDS] (ROUNDED)
    float (*ry)[C];       // REV: rg of each buffer's rows
    float (*yl)[C];       // REV: nd of each buffer's rows (Y's columns D, D + 1 hold it as T and remainder)
    Taylor1SourceRows<T> rows;  // the sources' rows
    int tid, cur, cached, pending, b_run, cap;
    bool l2;

    __device__ __forceinline__ T* x(int b) const { return xb + b * C * LD; }
    __device__ __forceinline__ T* y(int b) const { return yb + b * C * LDY; }

    // Block m: S = st[m − 1] (zero for m = 0, and in the rows M ≤ v < MP), B = mL; the constant columns of Y.
    __device__ __forceinline__ Taylor1CausalSources(const TaylorParams& tp_, const TaylorSweep& sw_, unsigned char* smem,
                                                    int k_x, int k_y, int k_s, int k_sr, float (*ry_)[C],
                                                    float (*yl_)[C], int m)
        : tp(tp_), sw(sw_), ry(ry_), yl(yl_), rows(tp_.base, sw_), tid(threadIdx.x), cur(0), cached(-1), pending(-1) {
        const AttnParams& P = tp.base;
        xb = reinterpret_cast<T*>(smem + k_x);
        yb = reinterpret_cast<T*>(smem + k_y);
        S = reinterpret_cast<float*>(smem + k_s);
        Sr = reinterpret_cast<float*>(smem + k_sr);
        l2 = P.l2norm != 0;
        b_run = m * sw.seg;
        // REV: the chunk of the last source is never folded (the prefix's st[m − 1] ends at mL ≤ that chunk's
        // start too: L is a multiple of C and m < n_seg).
        cap = REV ? C * ((sw.n_s - 1) / C) : sw.n_s;
        const float* st_prev = m > 0 ? taylor_state_at(tp, blockIdx.z, blockIdx.y, m - 1) : nullptr;
        for (int idx = tid; idx < MP * (D + 1); idx += kTaylorThreads) {
            const int v = idx / (D + 1), c = idx % (D + 1);
            const int f = c < D ? 8 + c : 0;
            const float s = st_prev != nullptr && v < M ? st_prev[(long long)v * tp.f_pad + f] : 0.f;
            S[v * LDS + c] = s;
            if (ROUNDED) Sr[v * LDS + c] = round_tf32(s);
        }
        // Columns D..MP − 1 of both Y buffers: the den column (1; REV: nd and its remainder in D + 1, set as
        // each block lands), then zeros. The copies never write them.
        for (int idx = tid; idx < 2 * C * (MP - D); idx += kTaylorThreads) {
            const int b = idx / (C * (MP - D)), rest = idx % (C * (MP - D)), r = rest / (MP - D), c = D + rest % (MP - D);
            y(b)[r * LDY + c] = from_f32<T>(c == D && !REV ? 1.f : 0.f);
        }
    }

    // Source block [s0, s0 + C) into buffer b (rows past n_s zero-filled), one commit.
    __device__ __forceinline__ void issue_block(int s0, int b) {
        const int ch = tid % CPR;
        T* xp_ = x(b);
        T* yp_ = y(b);
        for (int r = tid / CPR; r < C; r += RPP) {
            const int s = s0 + r;
            const bool valid = s < sw.n_s;
            const T* xp = rows.x0;
            const T* yp = rows.y0;
            int q = 0;
            if (valid) rows.at(REV, sw, s, ch, xp, yp, q);
            cp_async_16(xp_ + r * LD + 8 * ch, xp, valid);
            cp_async_16(yp_ + r * LDY + 8 * ch, yp, valid);
            if (REV && ch == 0) {
                const float* fs = tp.rg;  // a valid address for the zero fills
                cp_async_4(&ry[b][r], valid ? tp.rg + rows.row0 + q : fs, valid);
                cp_async_4(&yl[b][r], valid ? tp.nd + rows.row0 + q : fs, valid);
            }
        }
        cp_async_commit();
    }

    // Makes `cur` hold block s0 (landed, rows scaled): x = k̂ or scale·q̂ (·1/max(‖x_raw‖, eps) under
    // qk_l2norm), y = ṽ or [rg·dO, nd], rounded to T as taylor1_fold has them. Block-uniform.
    __device__ __forceinline__ void fetch(int s0) {
        if (cached == s0) return;
        if (pending != s0) {
            if (pending >= 0) cp_async_wait<0>();  // (the other buffer's copies land before it is rewritten)
            __syncthreads();                         // the other buffer is no longer read
            issue_block(s0, cur ^ 1);
        }
        cur ^= 1;
        cached = s0;
        pending = -1;
        cp_async_wait<0>();
        __syncthreads();
        if (REV) {
            const AttnParams& P = tp.base;
            const int b = cur;
            const float rx = tp.rev_raw != 0 ? 1.f : P.scale;  // (rev_raw: the reads apply the scale)
            taylor1_scale_rows<T, C, D>(x(b), l2, P.eps, [&](int) { return rx; }, tid);
            taylor1_scale_rows<T, C, D, LDY>(y(b), false, P.eps, [&](int r) { return ry[b][r]; }, tid);
            for (int r = tid; r < C; r += kTaylorThreads) {  // nd as T and what T left of it (see the top)
                const T hi = from_f32<T>(yl[b][r]);
                y(b)[r * LDY + D] = hi;
                y(b)[r * LDY + D + 1] = from_f32<T>(yl[b][r] - to_f32(hi));
            }
            __syncthreads();
        } else if (l2) {
            taylor1_scale_rows<T, C, D>(x(cur), true, tp.base.eps, [](int) { return 1.f; }, tid);
            __syncthreads();
        }
    }

    // The tile [t0, min(t0 + BP, pb))'s h_lo, h_hi and the state boundary it reads: every whole chunk below
    // h_lo folded (REV: below cap).
    __device__ __forceinline__ void bounds(int t0, int np, int& h_lo, int& h_hi, int& target) const {
        const AttnParams& P = tp.base;
        h_lo = sw.hi(P, t0);
        h_hi = sw.hi(P, t0 + np - 1);
        const int lo = min(h_lo, cap);
        target = lo > b_run ? b_run + C * ((lo - b_run) / C) : b_run;
    }

    // Fold the chunks [b_run, target) into S (and Sr).
    __device__ __forceinline__ void fold_to(int target) {
        const int lane = tid % 32, warp = tid / 32, g = lane / 4, t4 = lane % 4;
        for (; b_run < target; b_run += C) {
            fetch(b_run);
            const T* xs_ = x(cur);
            const T* ys_ = y(cur);
#pragma unroll
            for (int mg = 0; mg < MT; mg += MG) {
                float fa[NPW][MG][4];
#pragma unroll
                for (int j = 0; j < NPW; ++j)
#pragma unroll
                    for (int mm = 0; mm < MG; ++mm)
#pragma unroll
                        for (int e = 0; e < 4; ++e) fa[j][mm][e] = 0.f;
                taylor1_fold_chunk<T, D, C, MG, NPW, LD, LDY>(fa, xs_, ys_, mg, warp, lane);
                // S += the chunk's sums; each entry has one owner.
#pragma unroll
                for (int j = 0; j < NPW; ++j) {
                    const int nt = warp + kTaylorWarps * j;
                    if (nt >= NT) continue;
#pragma unroll
                    for (int mm = 0; mm < MG; ++mm)
#pragma unroll
                        for (int r = 0; r < 2; ++r) {
                            const int at = (16 * (mg + mm) + g + 8 * r) * LDS;
                            if (nt == 0) {
                                if (t4 == 0) S[at + D] += fa[j][mm][2 * r];
                            } else {
                                const int c = at + 8 * (nt - 1) + 2 * t4;
                                const float2 old = *reinterpret_cast<const float2*>(S + c);
                                const float2 sum = make_float2(old.x + fa[j][mm][2 * r], old.y + fa[j][mm][2 * r + 1]);
                                *reinterpret_cast<float2*>(S + c) = sum;
                                if (ROUNDED)
                                    *reinterpret_cast<float2*>(Sr + c) = make_float2(round_tf32(sum.x), round_tf32(sum.y));
                            }
                        }
                }
            }
        }
    }

    // The next tile's first block past b_run in flight now, when this tile's dense part needs no other block
    // than b_run's and the other buffer is free (h_hi: this tile's hi; n_hi: the next one's). The next tile
    // reads block b_run + C (folded or dense) iff n_hi > b_run + C, so a pending block is always read by the
    // tile after the one that issued it: the wait counts of taylor1_causal_tiles rely on it.
    __device__ __forceinline__ void prefetch(int h_hi, int n_hi) {
        const int next = b_run + C;
        if (pending < 0 && cached == b_run && h_hi <= next && next < sw.n_s && n_hi > next) {
            issue_block(next, cur ^ 1);  // cur ^ 1: last read before fetch(b_run)'s barriers
            pending = next;
        }
    }
};

// The probe range [pa, pb) of block m (see the top); false when it is empty.
__device__ __forceinline__ bool taylor1_causal_range(const TaylorSweep& sw, int m, int& pa, int& pb) {
    if (m > 0 && m >= sw.n_seg) return false;
    pa = m == 0 ? 0 : taylor1_first_probe_past(sw, m * sw.seg);
    pb = m + 1 >= sw.n_seg ? sw.n_p : taylor1_first_probe_past(sw, (m + 1) * sw.seg);
    return pa < pb;
}

// The tiles of [pa, pb): per tile the fold (1.), the next tile's probe rows in flight, then tile(t0, st, h_hi)
// for 2.–4. once this tile's probe rows have landed. issue_probes(t0, st) issues the copies of the tile at t0
// into probe stage st (no commit). Every thread calls it.
template <class Src, class IssueProbes, class Tile>
__device__ __forceinline__ void taylor1_causal_tiles(Src& src, int pa, int pb, IssueProbes issue_probes, Tile tile) {
    constexpr int BP = Src::L::BP;
    issue_probes(pa, 0);
    cp_async_commit();
    for (int t0 = pa, n = 0; t0 < pb; t0 += BP, ++n) {
        const int stq = n & 1;
        int h_lo, h_hi, target;
        src.bounds(t0, min(BP, pb - t0), h_lo, h_hi, target);
        __syncthreads();  // the previous tile's reads of S, of its result rows (the other probe stage) are done
        src.fold_to(target);
        // The dense part starts on block b_run; the next tile's probe rows go in flight now, and maybe its
        // first block past b_run.
        if (src.b_run < h_hi) src.fetch(src.b_run);
        const bool more = t0 + BP < pb;
        if (more) {
            issue_probes(t0 + BP, stq ^ 1);
            cp_async_commit();
            int n_lo, n_hi, n_target;
            src.bounds(t0 + BP, min(BP, pb - t0 - BP), n_lo, n_hi, n_target);
            src.prefetch(h_hi, n_hi);
        }
        // This tile's probe rows have landed once at most the groups committed after them are in flight:
        // the pending block (from this tile or the previous one) and the next tile's probe rows.
        cp_async_wait_n((src.pending >= 0 ? 1 : 0) + (more ? 1 : 0));
        __syncthreads();
        tile(t0, stq, h_hi);
    }
    cp_async_wait<0>();  // (a block fetched ahead that no tile read may still be in flight)
}

// acc[nn] = Z_raw · B for the n8 tiles nn < NO (16 rows of z [..][LD] from wrow, k over D) on tf32 mma, B
// from the state S [..][D + 8]: its rows (COLS = false: B[k = d][n = v] = S[v][d], k contiguous, float2
// reads) or its columns (COLS: B[k = v][n = e] = S[v][e], v < D). The k16 A fragment of z (ldmatrix)
// splits into two k8 steps with k permuted (slot t4 ↔ column 2t4, slot t4 + 4 ↔ 2t4 + 1), and B is read
// alike. S as it is (already rounded: the forward's Sr), or (SPLIT) as round_tf32(S) + the remainder,
// two products.
template <typename T, int D, int NO, bool COLS, bool SPLIT>
__device__ __forceinline__ void taylor1_state_tf32(float (&acc)[NO][4], const T* z, int wrow, const float* S,
                                                   int lane) {
    constexpr int LD = SmemRow<D>::ld, LDS = D + 8;
    const int g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int nn = 0; nn < NO; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nn][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4];
        load_a(a, z, LD, wrow, kk * 16, lane);
        const float2 r0 = unpack2<T>(a[0]), r1 = unpack2<T>(a[1]), r2 = unpack2<T>(a[2]), r3 = unpack2<T>(a[3]);
        const float a_lo[4] = {r0.x, r1.x, r0.y, r1.y}, a_hi[4] = {r2.x, r3.x, r2.y, r3.y};
#pragma unroll
        for (int nn = 0; nn < NO; ++nn) {
            float b[4];  // k = 2t4, 2t4 + 1, 8 + 2t4, 9 + 2t4 of this step; n = 8nn + g
            if constexpr (COLS) {
                const float* sp = S + (16 * kk + 2 * t4) * LDS + 8 * nn + g;
                b[0] = sp[0];
                b[1] = sp[LDS];
                b[2] = sp[8 * LDS];
                b[3] = sp[9 * LDS];
            } else {
                const float* sp = S + (8 * nn + g) * LDS + 16 * kk + 2 * t4;
                const float2 lo = *reinterpret_cast<const float2*>(sp);
                const float2 hi = *reinterpret_cast<const float2*>(sp + 8);
                b[0] = lo.x;
                b[1] = lo.y;
                b[2] = hi.x;
                b[3] = hi.y;
            }
            if constexpr (SPLIT) {
                float h[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) h[e] = round_tf32(b[e]);
                mma1688_tf32(acc[nn], a_lo, b[0] - h[0], b[1] - h[1]);
                mma1688_tf32(acc[nn], a_hi, b[2] - h[2], b[3] - h[3]);
                mma1688_tf32(acc[nn], a_lo, h[0], h[1]);
                mma1688_tf32(acc[nn], a_hi, h[2], h[3]);
            } else {
                mma1688_tf32(acc[nn], a_lo, b[0], b[1]);
                mma1688_tf32(acc[nn], a_hi, b[2], b[3]);
            }
        }
    }
}

// The probe rows of the tile at t0 (BP rows, zero past pb) into the tiles a and b ([BP][LD] each; b only with
// copy_b) by cp.async, thread tid taking the 16 bytes ch = tid % CPR of the rows tid / CPR + k·RPP.
// rows(p, r, valid, ch, ap, bp) moves the copy sources ap, bp (a0, b0 on entry: valid addresses, which the
// zero-filling copies of a probe past pb keep) to probe p's rows and records what else it needs in slot r.
template <typename T, int D, int BP, class Rows>
__device__ __forceinline__ void taylor1_issue_pair(T* a, T* b, const T* a0, const T* b0, int t0, int pb, bool copy_b,
                                                   Rows rows, int tid) {
    constexpr int LD = SmemRow<D>::ld, CPR = D * 2 / 16, RPP = kTaylorThreads / CPR;
    const int ch = tid % CPR;
    for (int r = tid / CPR; r < BP; r += RPP) {
        const int p = t0 + r;
        const bool valid = p < pb;
        const T* ap = a0;
        const T* bp = b0;
        rows(p, r, valid, ch, ap, bp);
        cp_async_16(a + r * LD + 8 * ch, ap, valid);
        if (copy_b) cp_async_16(b + r * LD + 8 * ch, bp, valid);
    }
}

// Causal forward (f16/bf16, rows 16-byte aligned), the structure above with the q tiles as probes; per tile
//   2. num, den = a1 r_z (q_raw · S_lin) + a0 S_const on tf32 mma (S rounded to it);
//   3. the sources [B, hi_p) densely: f(r_z (q_raw · x̂_s)) ỹ_s, on mma.sync as taylor_forward_tile;
//   4. o = num·(1/den) (zero when hi_p = 0), den to the statistics.
// With the top-left causal mask and G = 1 each chunk is read once. x̂ = x_raw (·1/max(‖x_raw‖, eps) under
// qk_l2norm, rounded to T as the fold's keys are).
template <typename T, int D>
__device__ __forceinline__ void taylor1_forward_causal(const TaylorParams& tp) {
    using L = Taylor1Causal<T, D>;
    constexpr int BP = L::BP, C = L::C, MP = L::MP, NO = L::NO, LD = L::LD, LDY = L::LDY, LDS = L::LDS;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ float sInv[BP];
    __shared__ long long sOo[2][BP], sStat[2][BP];
    if (dynamic_smem_bytes() < (unsigned)L::kBytes) __trap();

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    int pa, pb;
    if (!taylor1_causal_range(sw, blockIdx.x, pa, pb)) return;
    Taylor1CausalSources<T, D, false, true> src(tp, sw, smem_raw, L::kX, L::kY, L::kS, L::kSr, nullptr, nullptr,
                                                blockIdx.x);
    auto stage_q = [&](int st) { return L::stage(smem_raw, L::kQ, st); };
    const bool l2 = P.l2norm != 0;
    const int wrow = warp * 16;

    auto issue = [&](int t0, int st) { taylor1_issue_probes<T, D, BP>(tp, sw, stage_q(st), sOo[st], sStat[st], t0, pb, tid); };
    taylor1_causal_tiles(src, pa, pb, issue, [&](int t0, int stq, int h_hi) {
        T* sQ = stage_q(stq);
        // r_z = scale (/‖q‖) of this warp's rows.
        if (l2) {
            taylor1_row_inv_norms<T, D, 16>(sInv, sQ, wrow, P.eps, lane);
            __syncwarp();
        }
        float rz[2];
        int hi[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = wrow + g + 8 * r, p = t0 + row;
            rz[r] = P.scale * (l2 ? sInv[row] : 1.f);
            hi[r] = p < pb ? sw.hi(P, p) : 0;
        }

        // 2. acc = Q_raw S_linᵀ on tf32 mma, then [num, den] = a1 r_z acc + a0 S_const.
        float acc[NO][4];
        taylor1_state_tf32<T, D, NO, false, false>(acc, sQ, wrow, src.Sr, lane);
#pragma unroll
        for (int nn = 0; nn < NO; ++nn)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int v = 8 * nn + 2 * t4 + (e & 1);
                acc[nn][e] = tp.a1 * rz[e / 2] * acc[nn][e] + tp.a0 * src.S[v * LDS + D];
            }

        // 3. The dense part: the sources [b_run, hi_p), blocks of C from b_run.
        for (int s0 = src.b_run; s0 < h_hi; s0 += C) {
            src.fetch(s0);
            const T* x = src.x(src.cur);
            const T* y = src.y(src.cur);
            float s[C / 8][4];
            taylor_scores_mma<T, D, C>(s, sQ, LD, wrow, x, LD, lane);
#pragma unroll
            for (int nn = 0; nn < C / 8; ++nn)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e / 2, col = s0 + nn * 8 + 2 * t4 + (e & 1);
                    s[nn][e] = col < hi[r] ? taylor_f(tp, rz[r] * s[nn][e]) : 0.f;
                }
            taylor_weights_mma<T, C, MP>(acc, s, y, LDY, lane);
        }
        __syncwarp();  // this warp's q rows are read; o goes in their place

        // 4. o = num·(1/den) staged as T in this warp's q rows, den to the statistics; 16-byte stores.
        const int np = min(BP, pb - t0);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = wrow + g + 8 * r;
            const float den_acc = __shfl_sync(0xffffffffu, acc[D / 8][2 * r], lane & ~3);
            const bool empty = hi[r] == 0;
            const float den = empty ? 0.f : den_acc;
            const float inv = empty ? 0.f : 1.f / den;
#pragma unroll
            for (int nn = 0; nn < D / 8; ++nn)
                *reinterpret_cast<uint32_t*>(sQ + row * LD + nn * 8 + 2 * t4) =
                    pack2<T>(acc[nn][2 * r] * inv, acc[nn][2 * r + 1] * inv);
            if (t4 == 0 && row < np) P.lse[sStat[stq][row]] = den;
        }
        __syncwarp();
        taylor1_store_rows<T, D, 16>(P.o, sOo[stq], sQ, wrow, np, lane);
    });
}

// Causal backward, queries: dq (see the top). Probe stage A holds the tile's dO rows (then dq), B its q rows
// (under qk_l2norm only, for the l2-norm's Jacobian).
template <typename T, int D>
__device__ __forceinline__ void taylor1_dq_causal(const TaylorParams& tp) {
    using L = Taylor1Causal<T, D>;
    constexpr int BP = L::BP, C = L::C, NO = D / 8, LD = L::LD, LDY = L::LDY, LDS = L::LDS;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ float sInv[BP];
    __shared__ float sRg[2][BP], sNd[2][BP];
    __shared__ long long sOff[2][BP];  // each probe row's dq offset
    if (dynamic_smem_bytes() < (unsigned)L::kBytesBwd) __trap();

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    int pa, pb;
    if (!taylor1_causal_range(sw, blockIdx.x, pa, pb)) return;
    Taylor1CausalSources<T, D, false, false> src(tp, sw, smem_raw, L::kXb, L::kYb, L::kSb, L::kSb, nullptr, nullptr,
                                                 blockIdx.x);
    auto stage_a = [&](int st) { return L::stage(smem_raw, L::kA, st); };
    auto stage_b = [&](int st) { return L::stage(smem_raw, L::kB, st); };
    const bool l2 = P.l2norm != 0;
    const int wrow = warp * 16;

    // The tile at t0 into stage st: dO rows (and q rows under qk_l2norm), rg, nd and the dq offsets. Probe
    // p = i·G + g is query i of head hk·G + g.
    auto issue = [&](int t0, int st) {
        auto rows = [&](int p, int r, bool valid, int ch, const T*& ap, const T*& bp) {
            const int i = sw.group == 1 ? p : p / sw.group, gg = p - i * sw.group, h = sw.hk * sw.group + gg;
            if (valid) {
                ap += sw.si.o_off(P, i, h) + 8 * ch;
                bp += sw.si.q_off(P, i, h) + 8 * ch;
            }
            if (ch == 0) {  // rg, nd zero past pb
                const long long row = valid ? taylor_query_row(P, sw.si, sw.hk, i, gg) : 0;
                cp_async_4(&sRg[st][r], tp.rg + row, valid);
                cp_async_4(&sNd[st][r], tp.nd + row, valid);
                if (valid) sOff[st][r] = sw.si.dq_off(P, i, h);
            }
        };
        taylor1_issue_pair<T, D, BP>(stage_a(st), stage_b(st), static_cast<const T*>(P.d_o), static_cast<const T*>(P.q),
                                     t0, pb, l2, rows, tid);
    };
    taylor1_causal_tiles(src, pa, pb, issue, [&](int t0, int stq, int h_hi) {
        T* sW = stage_a(stq);
        const T* sQ = stage_b(stq);
        if (l2) {
            taylor1_row_inv_norms<T, D, 16>(sInv, sQ, wrow, P.eps, lane, true);
            __syncwarp();
        }
        float rg[2], nd[2];
        int hi[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = wrow + g + 8 * r, p = t0 + row;
            rg[r] = sRg[stq][row];
            nd[r] = sNd[stq][row];
            hi[r] = p < pb ? sw.hi(P, p) : 0;
        }

        // 2. dû = a1 (rg (dO_raw · S_lin[0..Dv)) + nd S_lin[Dv]).
        float acc[NO][4];
        taylor1_state_tf32<T, D, NO, true, true>(acc, sW, wrow, src.S, lane);
#pragma unroll
        for (int nn = 0; nn < NO; ++nn)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = 8 * nn + 2 * t4 + (e & 1);
                acc[nn][e] = tp.a1 * (rg[e / 2] * acc[nn][e] + nd[e / 2] * src.S[D * LDS + c]);
            }

        // 3. The dense part: E = dO_raw V_rawᵀ, Q = a1 (rg E + nd) on [b_run, hi_p), dû += Q X̂.
        for (int s0 = src.b_run; s0 < h_hi; s0 += C) {
            src.fetch(s0);
            const T* x = src.x(src.cur);
            const T* y = src.y(src.cur);
            float e[C / 8][4];
            taylor_scores_mma<T, D, C>(e, sW, LD, wrow, y, LDY, lane);
#pragma unroll
            for (int nn = 0; nn < C / 8; ++nn)
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int r = k / 2, col = s0 + nn * 8 + 2 * t4 + (k & 1);
                    e[nn][k] = col < hi[r] ? tp.a1 * (rg[r] * e[nn][k] + nd[r]) : 0.f;
                }
            taylor_weights_mma<T, C, D>(acc, e, x, LD, lane);
        }
        __syncwarp();  // this warp's dO rows are read; dq goes in their place

        // 4. dq = J(q)ᵀ (scale·dû), staged in this warp's dO rows; 16-byte stores.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = wrow + g + 8 * r;
            float y[NO][2];
#pragma unroll
            for (int nn = 0; nn < NO; ++nn) {
                y[nn][0] = P.scale * acc[nn][2 * r];
                y[nn][1] = P.scale * acc[nn][2 * r + 1];
            }
            taylor1_store_l2_grad<T, NO>(sW + row * LD, sQ + row * LD, y, l2, l2 ? sInv[row] : 1.f, t4);
        }
        __syncwarp();
        taylor1_store_rows<T, D, 16>(P.dq, sOff[stq], sW, wrow, min(BP, pb - t0), lane);
    });
}

// Causal backward, keys: dk and dv (see the top). Probe stage A holds the tile's k rows (then dk), B its v
// rows (then dv); the probes are the keys from the last (p = len_k − 1 − j).
template <typename T, int D>
__device__ __forceinline__ void taylor1_dkdv_causal(const TaylorParams& tp) {
    using L = Taylor1Causal<T, D>;
    constexpr int BP = L::BP, C = L::C, NO = D / 8, LD = L::LD, LDY = L::LDY, LDS = L::LDS, CPR = L::CPR;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ float sInv[BP];
    __shared__ float sRy[2][C], sYl[2][C];      // per source buffer: the rows' rg and nd
    __shared__ long long sOk[2][BP], sOv[2][BP];  // each probe row's dk and dv offsets
    if (dynamic_smem_bytes() < (unsigned)L::kBytesBwd) __trap();

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);

    // Key rows past len_k (key padding): zero dk and dv, shared by every block of the sweep.
    {
        const int n_zero = sw.si.key_rows(P) - sw.si.len_k;
        for (int idx = blockIdx.x * kTaylorThreads + tid; idx < n_zero * CPR; idx += gridDim.x * kTaylorThreads) {
            const int j = sw.si.len_k + idx / CPR, ch = idx % CPR;
            const uint4 z = make_uint4(0u, 0u, 0u, 0u);
            *reinterpret_cast<uint4*>(static_cast<T*>(P.dk) + sw.si.dk_off(P, j, sw.hk) + 8 * ch) = z;
            *reinterpret_cast<uint4*>(static_cast<T*>(P.dv) + sw.si.dv_off(P, j, sw.hk) + 8 * ch) = z;
        }
    }
    int pa, pb;
    if (!taylor1_causal_range(sw, blockIdx.x, pa, pb)) return;
    Taylor1CausalSources<T, D, true, false> src(tp, sw, smem_raw, L::kXb, L::kYb, L::kSb, L::kSb, sRy, sYl,
                                                blockIdx.x);
    auto stage_a = [&](int st) { return L::stage(smem_raw, L::kA, st); };
    auto stage_b = [&](int st) { return L::stage(smem_raw, L::kB, st); };
    const bool l2 = P.l2norm != 0;
    const int wrow = warp * 16;

    // The tile at t0 into stage st: k and v rows, the dk and dv offsets.
    auto issue = [&](int t0, int st) {
        auto rows = [&](int p, int r, bool valid, int ch, const T*& ap, const T*& bp) {
            if (!valid) return;
            const int j = sw.n_p - 1 - p;
            ap += sw.si.k_off(P, j, sw.hk) + 8 * ch;
            bp += sw.si.v_off(P, j, sw.hk) + 8 * ch;
            if (ch == 0) {
                sOk[st][r] = sw.si.dk_off(P, j, sw.hk);
                sOv[st][r] = sw.si.dv_off(P, j, sw.hk);
            }
        };
        taylor1_issue_pair<T, D, BP>(stage_a(st), stage_b(st), static_cast<const T*>(P.k), static_cast<const T*>(P.v),
                                     t0, pb, true, rows, tid);
    };
    taylor1_causal_tiles(src, pa, pb, issue, [&](int t0, int stq, int h_hi) {
        T* sZ = stage_a(stq);
        T* sV = stage_b(stq);
        if (l2) {
            taylor1_row_inv_norms<T, D, 16>(sInv, sZ, wrow, P.eps, lane, true);
            __syncwarp();
        }
        // x = scale·q̂ in the tiles, or (rev_raw) q raw with the scale xs applied here.
        const float xs = tp.rev_raw != 0 ? P.scale : 1.f;
        float rz[2];
        int hi[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = wrow + g + 8 * r, p = t0 + row;
            rz[r] = (l2 ? fabsf(sInv[row]) : 1.f) * xs;
            hi[r] = p < pb ? sw.hi(P, p) : 0;
        }

        // 2. dṽ = a0 U_const + a1 r_z (k_raw · U_lin), dk̂ = a1 (v_raw · U_lin[0..Dv) + U_lin[Dv]).
        float dvt[NO][4], dkh[NO][4];
        taylor1_state_tf32<T, D, NO, false, true>(dvt, sZ, wrow, src.S, lane);
        taylor1_state_tf32<T, D, NO, true, true>(dkh, sV, wrow, src.S, lane);
#pragma unroll
        for (int nn = 0; nn < NO; ++nn)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = 8 * nn + 2 * t4 + (e & 1);
                dvt[nn][e] = tp.a1 * rz[e / 2] * dvt[nn][e] + tp.a0 * src.S[c * LDS + D];
                dkh[nn][e] = tp.a1 * (dkh[nn][e] + src.S[D * LDS + c] + src.S[(D + 1) * LDS + c]);
            }

        // 3. The dense part on [b_run, hi_p): P = f(r_z Z_raw Xᵀ), dṽ += P Y; E = V_raw Yᵀ, dk̂ += a1 (E + nd) X.
        for (int s0 = src.b_run; s0 < h_hi; s0 += C) {
            src.fetch(s0);
            const T* x = src.x(src.cur);
            const T* y = src.y(src.cur);
            const float* nd = sYl[src.cur];
            float s[C / 8][4];
            taylor_scores_mma<T, D, C>(s, sZ, LD, wrow, x, LD, lane);
#pragma unroll
            for (int nn = 0; nn < C / 8; ++nn)
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int r = k / 2, col = s0 + nn * 8 + 2 * t4 + (k & 1);
                    s[nn][k] = col < hi[r] ? taylor_f(tp, rz[r] * s[nn][k]) : 0.f;
                }
            taylor_weights_mma<T, C, D>(dvt, s, y, LDY, lane);
            taylor_scores_mma<T, D, C>(s, sV, LD, wrow, y, LDY, lane);
#pragma unroll
            for (int nn = 0; nn < C / 8; ++nn)
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int r = k / 2, c = nn * 8 + 2 * t4 + (k & 1);
                    s[nn][k] = s0 + c < hi[r] ? tp.a1 * (s[nn][k] + nd[c]) : 0.f;
                }
            taylor_weights_mma<T, C, D>(dkh, s, x, LD, lane);
        }
        __syncwarp();  // this warp's k and v rows are read (but the k rows by the Jacobian below)

        // 4. dk = J(k)ᵀ dk̂ in this warp's k rows (each element read before its own lane writes it), dv in
        // its v rows; 16-byte stores.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = wrow + g + 8 * r;
            float y[NO][2];
#pragma unroll
            for (int nn = 0; nn < NO; ++nn) {
                y[nn][0] = xs * dkh[nn][2 * r];
                y[nn][1] = xs * dkh[nn][2 * r + 1];
                *reinterpret_cast<uint32_t*>(sV + row * LD + nn * 8 + 2 * t4) = pack2<T>(dvt[nn][2 * r], dvt[nn][2 * r + 1]);
            }
            taylor1_store_l2_grad<T, NO>(sZ + row * LD, sZ + row * LD, y, l2, l2 ? sInv[row] : 1.f, t4);
        }
        __syncwarp();
        const int np = min(BP, pb - t0);
        taylor1_store_rows<T, D, 16>(P.dk, sOk[stq], sZ, wrow, np, lane);
        taylor1_store_rows<T, D, 16>(P.dv, sOv[stq], sV, wrow, np, lane);
    });
}

}  // namespace attn
