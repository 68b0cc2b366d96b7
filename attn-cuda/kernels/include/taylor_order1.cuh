// Order 1 (f(s) = a0 + a1 s), f16/bf16: a fold and a non-causal forward built for the order-1 state,
// which is small: the const feature and the D linear ones, times the M = D + 1 columns of ṽ (65 × 65 at
// D = 64). Order 1 is bound by memory (NOTES_taylor.md, "The floor"): these kernels stream their tiles
// with cp.async in 16-byte copies (the call's rows 16-byte aligned: the host checks it and otherwise runs
// the general kernels), and nothing else goes through DRAM but q, k, v, o and the small states.
//
//   taylor1_fold     the same segment sums as taylor_fold (st[k], [M][f_pad] f32, the same feature
//                    layout: f = 0 the const feature, f = 8 + d the linear ones, zero elsewhere; and
//                    st_max), so the prefix and every read take them as they are. Any sweep (forward
//                    or reversed: the row factors rx, ry and y_last of TaylorRowRef are applied in
//                    shared memory when they are not 1). Sᵀ = Yᵀ [1, X] chunk by chunk: the const
//                    feature is a constant B fragment (1 in column 0), the den column of Y (y_last) an
//                    A fragment built in registers from the per-row scalars: neither is a tile.
//   taylor1_forward  non-causal probe tiles: every probe reads the whole sum st[n_seg − 1] (the
//                    prefix's storage-type copy): num, den = up·(a1 r_z (q_raw · S_lin) + a0 S_const),
//                    o = num·(1/den), r_z = scale (/‖q‖), up = 2^e of the copy. A block reads the
//                    state once and streams several probe tiles, two in flight; o is staged in shared
//                    memory and stored in 16-byte rows.
#pragma once
#include "loads.h"
#include "taylor_state.cuh"

namespace attn {

template <typename T> __device__ __forceinline__ float2 unpack2(uint32_t u);
template <> __device__ __forceinline__ float2 unpack2<__half>(uint32_t u) {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
}
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t u) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}
// The 8 elements of a 16-byte shared-memory group as f32.
template <typename T> __device__ __forceinline__ void load8_f32(float (&v)[8], const T* p) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float2 f = unpack2<T>(w[e]);
        v[2 * e] = f.x;
        v[2 * e + 1] = f.y;
    }
}

// 1/max(‖x‖, eps) from ‖x‖² = ss: rsqrt (within 2 ulp of f32, far below the storage type's rounding
// that follows) instead of an IEEE square root and division.
__device__ __forceinline__ float taylor1_inv_norm(float ss, float eps) {
    return ss > eps * eps ? rsqrtf(ss) : 1.f / eps;
}

// Rows r < ROWS of a shared tile [ROWS][LD] (D columns) scaled in place, x ← T(f_r·x) with f_r = factor(r),
// times 1/max(‖x_r‖, eps) when `l2` (as the general loaders scale, in f32, rounded once). Each thread
// takes 8 elements (16 bytes) of a row at a time; the D/8 threads of a row are adjacent lanes, which sum
// the row's squares by shuffles, so there is no barrier inside. Every thread makes the same number of
// passes (the shuffles need the whole warp).
template <typename T, int ROWS, int D, class Factor>
__device__ __forceinline__ void taylor1_scale_rows(T* tile, bool l2, float eps, Factor factor, int tid) {
    constexpr int LD = SmemRow<D>::ld, CPR = D / 8, RPP = kTaylorThreads / CPR;
    static_assert(32 % CPR == 0 && ROWS % RPP == 0, "a row's threads in one warp; whole passes");
    const int ch = tid % CPR;
    for (int r = tid / CPR; r < ROWS; r += RPP) {
        float v[8];
        load8_f32<T>(v, tile + r * LD + 8 * ch);
        float f = factor(r);
        if (l2) {
            float ss = 0.f;
#pragma unroll
            for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
#pragma unroll
            for (int o = CPR / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            f *= taylor1_inv_norm(ss, eps);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] *= f;
        store8<T>(tile + r * LD + 8 * ch, v);
    }
}

// The fold's tiles. Mirrored by taylor::heuristics::{order1_fold_smem, order1_fold_split}.
template <typename T, int D> struct Taylor1Fold {
    static constexpr int C = 64;       // sources per chunk
    static constexpr int STAGES = 2;   // chunks in flight (cp.async groups): 4 blocks per SM
    static constexpr int M = TaylorDims<D>::M, MP = TaylorDims<D>::MP;
    static constexpr int MT = MP / 16;                   // m16 tiles of the columns v; the last holds den (v = D)
    static constexpr int VSPLIT = D == 128 ? 3 : 1;      // blocks per segment, each MT / VSPLIT of those tiles
    static constexpr int MTB = MT / VSPLIT;
    static constexpr int NT = 1 + D / 8;                 // n8 feature tiles: const, then the linear ones
    static constexpr int NPW = (NT + kTaylorWarps - 1) / kTaylorWarps;  // n-tiles per warp (warp w: w, w + 4, …)
    static constexpr int LD = SmemRow<D>::ld;            // X and Y rows in shared memory, T
    static constexpr int CPR = D * 2 / 16;               // 16-byte copies per row
    static constexpr int kStage = 2 * C * LD * 2;        // X [C][LD], then Y [C][LD]
    static constexpr int kBytes = STAGES * kStage;
    static_assert(MT % VSPLIT == 0 && D % 16 == 0 && MT * 16 == D + 16, "the den column opens the last m-tile");
};

// Grid (n_seg · VSPLIT, Hkv, B); block x = k · VSPLIT + part.
template <typename T, int D>
__device__ __forceinline__ void taylor1_fold(const TaylorParams& tp) {
    using L = Taylor1Fold<T, D>;
    constexpr int C = L::C, S = L::STAGES, LD = L::LD, CPR = L::CPR, MTB = L::MTB, NPW = L::NPW;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ float sRy[S][C], sYl[S][C];  // per stage: the rows' ry (reversed sweeps) and y_last
    if (dynamic_smem_bytes() < (unsigned)L::kBytes) __trap();

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    const int part = blockIdx.x % L::VSPLIT, seg = blockIdx.x / L::VSPLIT;
    if (seg >= sw.n_seg) return;
    const int s_lo = seg * sw.seg, s_hi = min(s_lo + sw.seg, sw.n_s);
    const int n_chunks = (s_hi - s_lo + C - 1) / C;
    const bool l2 = P.l2norm != 0;
    const T* stand_in = static_cast<const T*>(P.k);  // a valid address for the zero-filled copies
    auto stage_x = [&](int st) { return reinterpret_cast<T*>(smem_raw + st * L::kStage); };
    auto stage_y = [&](int st) { return reinterpret_cast<T*>(smem_raw + st * L::kStage) + C * LD; };

    // The sources' rows (TaylorSweep::source) as affine functions of the source index: key j at
    // x0 + j·xs, y0 + j·ys (rx = ry = y_last = 1); reversed, query row q = i·G + g (q = n_s − 1 − s) at
    // x0 + i·xs + g·xg, y0 + i·ys + g·yg, rx = scale, ry and y_last from rg, nd at scratch row row0 + q.
    const T* x0;
    const T* y0;
    long long xs, ys, xg = 0, yg = 0, row0 = 0;
    if (!sw.rev) {
        x0 = static_cast<const T*>(P.k) + sw.si.k_off(P, 0, sw.hk);
        y0 = static_cast<const T*>(P.v) + sw.si.v_off(P, 0, sw.hk);
        xs = P.k_seq;
        ys = P.v_seq;
    } else {
        const int h0 = sw.hk * sw.group;
        x0 = static_cast<const T*>(P.q) + sw.si.q_off(P, 0, h0);
        y0 = P.d_o != nullptr ? static_cast<const T*>(P.d_o) + sw.si.o_off(P, 0, h0) : nullptr;
        xs = P.q_seq;
        xg = P.q_head;
        ys = P.o_seq;
        yg = P.o_head;
        row0 = taylor_query_row(P, sw.si, sw.hk, 0, 0);
    }
    const float rx = sw.rev ? P.scale : 1.f;

    // The copies of chunk c into stage c % S (rows past the segment zero-filled, their y_last 0), then
    // one commit (also past the last chunk, so that every iteration waits for the same group count).
    // Thread tid copies the 16 bytes tid % CPR of the rows tid / CPR + k·RPP.
    constexpr int RPP = kTaylorThreads / CPR;
    auto issue = [&](int c) {
        if (c < n_chunks) {
            const int st = c % S, s0 = s_lo + c * C, ch = tid % CPR;
            T* x = stage_x(st);
            T* y = stage_y(st);
            for (int r = tid / CPR; r < C; r += RPP) {
                const int s = s0 + r;
                const bool valid = s < s_hi;
                const T* xp = stand_in;
                const T* yp = stand_in;
                bool has_y = false;
                int q = 0;
                if (valid && !sw.rev) {
                    xp = x0 + s * xs + 8 * ch;
                    yp = y0 + s * ys + 8 * ch;
                    has_y = true;
                } else if (valid) {
                    q = sw.n_s - 1 - s;
                    const int i = q / sw.group, gg = q - i * sw.group;
                    xp = x0 + i * xs + gg * xg + 8 * ch;
                    has_y = y0 != nullptr;
                    if (has_y) yp = y0 + i * ys + gg * yg + 8 * ch;
                }
                cp_async_16(x + r * LD + 8 * ch, xp, valid);
                cp_async_16(y + r * LD + 8 * ch, yp, has_y);
                if (ch == 0) {
                    if (!sw.rev) {
                        sYl[st][r] = valid ? 1.f : 0.f;
                    } else {
                        const float* fs = reinterpret_cast<const float*>(stand_in);
                        const bool has_rg = valid && tp.rg != nullptr, has_nd = valid && tp.nd != nullptr;
                        cp_async_4(&sRy[st][r], has_rg ? tp.rg + row0 + q : fs, has_rg);
                        cp_async_4(&sYl[st][r], has_nd ? tp.nd + row0 + q : fs, has_nd);
                    }
                }
            }
        }
        cp_async_commit();
    };

    float acc[NPW][MTB][4];
#pragma unroll
    for (int j = 0; j < NPW; ++j)
#pragma unroll
        for (int m = 0; m < MTB; ++m)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][m][e] = 0.f;
    const uint32_t one2 = g == 0 ? pack2<T>(1.f, 1.f) : 0u;  // B of the const feature: 1 in column 0

#pragma unroll
    for (int c = 0; c < S - 1; ++c) issue(c);
    for (int c = 0; c < n_chunks; ++c) {
        cp_async_wait<S - 2>();
        __syncthreads();  // chunk c has landed for every thread; chunk c − 1's stage is no longer read
        issue(c + S - 1);
        const int st = c % S;
        T* x = stage_x(st);
        T* y = stage_y(st);
        // x = rx·x_raw (·1/max(‖x_raw‖, eps) under qk_l2norm), y = ry·y_raw, as the general loaders
        // scale them; a key without the l2-norm needs neither.
        if (l2 || sw.rev) {
            taylor1_scale_rows<T, C, D>(x, l2, P.eps, [&](int) { return rx; }, tid);
            if (sw.rev) taylor1_scale_rows<T, C, D>(y, false, P.eps, [&](int r) { return sRy[st][r]; }, tid);
            __syncthreads();
        }
        // Sᵀ[v][f] += Σ_s y_s[v] φ_f(x_s): A = Yᵀ (m = v), B = [1, X] (n = f), k = the chunk's sources.
#pragma unroll
        for (int k0 = 0; k0 < C; k0 += 16) {
            uint32_t a[MTB][4];
#pragma unroll
            for (int m = 0; m < MTB; ++m) {
                const int mt = part * MTB + m;
                if (16 * mt < D) {
                    load_a_trans(a[m], y, LD, k0, 16 * mt, lane);
                } else {  // the den row v = D (row g = 0 of this tile), y_last per source; rows past it zero
                    const float* yl = sYl[st] + k0 + 2 * t4;
                    a[m][0] = g == 0 ? pack2<T>(yl[0], yl[1]) : 0u;
                    a[m][1] = 0u;
                    a[m][2] = g == 0 ? pack2<T>(yl[8], yl[9]) : 0u;
                    a[m][3] = 0u;
                }
            }
#pragma unroll
            for (int j = 0; j < NPW; ++j) {
                const int n = warp + kTaylorWarps * j;
                if (n >= L::NT) continue;  // warp-uniform
                uint32_t b[2] = {one2, one2};
                if (n > 0) ldsm_x2_trans(b, x + (k0 + (lane & 15)) * LD + 8 * (n - 1));
#pragma unroll
                for (int m = 0; m < MTB; ++m) mma16816<T>(acc[j][m], a[m], b[0], b[1]);
            }
        }
    }
    cp_async_wait<0>();  // (only empty groups can be left)

    // st[seg] ← the segment's sums for this block's rows v; the features past the tiles are zero.
    float* out = taylor_state_at(tp, blockIdx.z, blockIdx.y, seg);
    float mx = 0.f;  // the largest |sum| this thread stores
#pragma unroll
    for (int j = 0; j < NPW; ++j) {
        const int n = warp + kTaylorWarps * j;
        if (n >= L::NT) continue;
#pragma unroll
        for (int m = 0; m < MTB; ++m)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int v = 16 * (part * MTB + m) + g + 8 * r;
                if (v >= L::M) continue;
                const float a = acc[j][m][2 * r], c = acc[j][m][2 * r + 1];
                *reinterpret_cast<float2*>(out + (long long)v * tp.f_pad + 8 * n + 2 * t4) = make_float2(a, c);
                if (isfinite(a)) mx = fmaxf(mx, fabsf(a));
                if (isfinite(c)) mx = fmaxf(mx, fabsf(c));
            }
    }
    const int v_lo = 16 * part * MTB, v_hi = min(L::M, 16 * (part + 1) * MTB);
    const int f_zero = 8 * L::NT, n_zero = tp.f_pad - f_zero;
    for (int idx = tid; idx < (v_hi - v_lo) * n_zero; idx += kTaylorThreads)
        out[(long long)(v_lo + idx / n_zero) * tp.f_pad + f_zero + idx % n_zero] = 0.f;
    // st_max[seg] ≥ every |sum| of the segment: non-negative floats order like their bits as ints.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0 && mx > 0.f) atomicMax(taylor_state_max_at(tp, blockIdx.z, blockIdx.y, seg), __float_as_int(mx));
}

// 1/max(‖q‖, eps) of the rows [row0, row0 + ROWS) of a q tile [..][SmemRow<D>::ld] into inv[row]: lane l
// sums row row0 + l (16-byte reads; the caller's warp owns the rows, so there is no barrier). With
// `flag_clamp`, negative (−1/eps) where eps clamps the norm (the l2-norm's backward has no projection there).
template <typename T, int D, int ROWS>
__device__ __forceinline__ void taylor1_row_inv_norms(float* inv, const T* q, int row0, float eps, int lane,
                                                      bool flag_clamp = false) {
    constexpr int LD = SmemRow<D>::ld, CPR = D * 2 / 16;
    for (int row = row0 + lane; row < row0 + ROWS; row += 32) {
        float ss = 0.f;
#pragma unroll
        for (int ch = 0; ch < CPR; ++ch) {
            float v[8];
            load8_f32<T>(v, q + row * LD + 8 * ch);
#pragma unroll
            for (int e = 0; e < 8; e += 2) ss += v[e] * v[e] + v[e + 1] * v[e + 1];
        }
        inv[row] = flag_clamp && !(ss > eps * eps) ? -1.f / eps : taylor1_inv_norm(ss, eps);
    }
}

// The staged o rows [row0, row0 + ROWS) (those < np) of a tile [..][SmemRow<D>::ld] to o + off[row], in
// 16-byte stores by the lanes of the warp that owns them.
template <typename T, int D, int ROWS>
__device__ __forceinline__ void taylor1_store_rows(void* o, const long long* off, const T* tile, int row0, int np,
                                                   int lane) {
    constexpr int LD = SmemRow<D>::ld, CPR = D * 2 / 16;
    for (int idx = lane; idx < ROWS * CPR; idx += 32) {
        const int row = row0 + idx / CPR, ch = idx % CPR;
        if (row < np)
            *reinterpret_cast<uint4*>(static_cast<T*>(o) + off[row] + 8 * ch) =
                *reinterpret_cast<const uint4*>(tile + row * LD + 8 * ch);
    }
}

// The q rows of the probe tile [p0, p0 + BP) into q [BP][LD] by cp.async (zero past p_end): thread tid
// copies the 16 bytes tid % CPR of the rows tid / CPR + k·RPP and, for ch = 0, records the row's o offset
// and statistics index. Probe p = i·G + g is query i of head hk·G + g.
template <typename T, int D, int BP>
__device__ __forceinline__ void taylor1_issue_probes(const TaylorParams& tp, const TaylorSweep& sw, T* q,
                                                     long long* o_off, long long* stat, int p0, int p_end, int tid) {
    constexpr int LD = SmemRow<D>::ld, CPR = D * 2 / 16, RPP = kTaylorThreads / CPR;
    const AttnParams& P = tp.base;
    const int ch = tid % CPR;
    for (int r = tid / CPR; r < BP; r += RPP) {
        const int p = p0 + r;
        const bool valid = p < p_end;
        long long q_off = 0;
        if (valid) {
            const int i = sw.group == 1 ? p : p / sw.group, h = sw.hk * sw.group + (p - i * sw.group);
            q_off = sw.si.q_off(P, i, h) + 8 * ch;
            if (ch == 0) {
                o_off[r] = sw.si.o_off(P, i, h);
                stat[r] = sw.si.stats_index(P, h, i);
            }
        }
        cp_async_16(q + r * LD + 8 * ch, static_cast<const T*>(P.q) + q_off, valid);
    }
}

// acc = A·B over k = 0..D (acc zeroed first): A the warp's 16·RT rows from wrow of a tile [..][LD]; B the
// sum of COPIES tiles `b_stride` elements apart (the state's hi and lo), each [NB·16 rows n][LD] (columns
// k: B is the tile transposed) or, with K_ROWS, [D rows k][LD] (columns n, NB·16 of them).
template <typename T, int D, int RT, int NB, int COPIES, bool K_ROWS = false>
__device__ __forceinline__ void taylor1_rows_mma(float (&acc)[RT][2 * NB][4], const T* a_tile, int wrow, const T* b,
                                                 int b_stride, int lane) {
    constexpr int LD = SmemRow<D>::ld;
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int nn = 0; nn < 2 * NB; ++nn)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[rt][nn][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[RT][4];
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) load_a(a[rt], a_tile, LD, wrow + 16 * rt, kk * 16, lane);
#pragma unroll
        for (int c = 0; c < COPIES; ++c) {
            if constexpr (K_ROWS) {
#pragma unroll
                for (int nn = 0; nn < 2 * NB; ++nn) {
                    uint32_t bf[2];
                    ldsm_x2_trans(bf, b + c * b_stride + (kk * 16 + (lane & 15)) * LD + 8 * nn);
#pragma unroll
                    for (int rt = 0; rt < RT; ++rt) mma16816<T>(acc[rt][nn], a[rt], bf[0], bf[1]);
                }
            } else {
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
                    uint32_t bf[4];
                    load_b_nk(bf, b + c * b_stride, LD, nb * 16, kk * 16, lane);
#pragma unroll
                    for (int rt = 0; rt < RT; ++rt) {
                        mma16816<T>(acc[rt][2 * nb], a[rt], bf[0], bf[1]);
                        mma16816<T>(acc[rt][2 * nb + 1], a[rt], bf[2], bf[3]);
                    }
                }
            }
        }
    }
}

// The forward's tiles. Mirrored by taylor::heuristics::{order1_probes, order1_forward_smem}.
template <typename T, int D> struct Taylor1Forward {
    static constexpr int RT = D <= 64 ? 2 : 1;           // m16 row tiles per warp
    static constexpr int BP = 16 * RT * kTaylorWarps;    // probes per tile
    static constexpr int M = TaylorDims<D>::M, MP = TaylorDims<D>::MP;
    static constexpr int NO = MP / 8;                    // n8 tiles of the columns v
    static constexpr int LD = SmemRow<D>::ld;
    static constexpr int CPR = D * 2 / 16;               // 16-byte copies per row
    static constexpr int kQ = 0;                         // Q [2][BP][LD] T: two tiles in flight (then o)
    static constexpr int kS = kQ + 2 * BP * LD * 2;      // S_lin [MP][LD] T: S_lin[v][d] = state[v][8 + d]
    static constexpr int kBytes = kS + MP * LD * 2;
};

// Grid (blocks per head, Hkv, B): block x takes the probe tiles x, x + gridDim.x, … (BP probes each: query
// rows of the GQA group) of a non-causal forward sweep. It reads the state once, then streams its tiles
// with the next tile's copy in flight during this one's products and stores.
template <typename T, int D>
__device__ __forceinline__ void taylor1_forward(const TaylorParams& tp) {
    using L = Taylor1Forward<T, D>;
    constexpr int BP = L::BP, RT = L::RT, M = L::M, MP = L::MP, NO = L::NO, LD = L::LD, CPR = L::CPR;
    constexpr int RPP = kTaylorThreads / CPR;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sS = reinterpret_cast<T*>(smem_raw + L::kS);
    __shared__ __align__(8) float sConst[MP];  // up·a0·S_const
    __shared__ float sInv[BP];
    __shared__ long long sOo[2][BP], sStat[2][BP];  // per tile in flight: each probe row's o offset, statistics index
    if (dynamic_smem_bytes() < (unsigned)L::kBytes) __trap();

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    const int n_tiles = (sw.n_p + BP - 1) / BP;
    if ((int)blockIdx.x >= n_tiles) return;
    const bool has = sw.n_s > 0;  // no key at all: o = 0, den = 0
    const bool l2 = P.l2norm != 0;
    auto stage_q = [&](int st) { return reinterpret_cast<T*>(smem_raw + L::kQ) + st * BP * LD; };

    // The state: the linear rows by cp.async (their first group is the first tile's), the const column
    // and the copy's power of two directly.
    const T* Sc = has ? taylor_copy_at<T>(tp, blockIdx.z, blockIdx.y, sw.n_seg - 1, 0) : nullptr;
    for (int v = tid / CPR; v < MP; v += RPP) {
        const int ch = tid % CPR;
        const bool valid = has && v < M;
        const T* src = valid ? Sc + (long long)v * tp.f_pad + 8 + 8 * ch : static_cast<const T*>(P.q);
        cp_async_16(sS + v * LD + 8 * ch, src, valid);
    }

    // Tile t into stage st, one commit, also past the last tile (every iteration waits for the same
    // group count).
    auto issue = [&](int t, int st) {
        if (t < n_tiles) taylor1_issue_probes<T, D, BP>(tp, sw, stage_q(st), sOo[st], sStat[st], t * BP, sw.n_p, tid);
        cp_async_commit();
    };

    issue(blockIdx.x, 0);
    const float up = has ? ldexpf(1.f, taylor_state_exponent(tp, blockIdx.z, blockIdx.y, sw.n_seg - 1)) : 0.f;
    for (int v = tid; v < MP; v += kTaylorThreads)  // up·a0·S_const (up is a power of two: exact)
        sConst[v] = has && v < M ? up * tp.a0 * to_f32(Sc[(long long)v * tp.f_pad]) : 0.f;
    const int wrow = warp * 16 * RT;

    for (int t = blockIdx.x, n = 0; t < n_tiles; t += gridDim.x, ++n) {
        const int st = n & 1;
        T* sQ = stage_q(st);
        __syncthreads();  // the other stage (the previous tile's o, offsets) is no longer read
        issue(t + gridDim.x, st ^ 1);
        cp_async_wait<1>();
        __syncthreads();  // this tile (and, the first time, the state) has landed for every thread
        // r_z = scale (/‖q‖) of this warp's rows.
        if (l2) taylor1_row_inv_norms<T, D, 16 * RT>(sInv, sQ, wrow, P.eps, lane);

        // acc = Q_raw S_linᵀ   [16·RT rows of this warp, MP]
        float acc[RT][NO][4];
        taylor1_rows_mma<T, D, RT, MP / 16, 1>(acc, sQ, wrow, sS, 0, lane);
        __syncwarp();  // this warp's Q rows (and norms) are read; no other warp reads them: o goes in their place

        // [num, den] = up·(a1 r_z acc + a0 S_const); o = num·(1/den) staged as T, den to the statistics.
        const int np = min(BP, sw.n_p - t * BP);
#pragma unroll
        for (int rt = 0; rt < RT; ++rt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = wrow + 16 * rt + g + 8 * r;
                const float cz = up * tp.a1 * P.scale * (l2 ? sInv[row] : 1.f);
                // den is column D: n-tile D/8, element 2r of the quad's lane t4 = 0.
                const float den_acc = __shfl_sync(0xffffffffu, acc[rt][D / 8][2 * r], lane & ~3);
                const float den = has ? cz * den_acc + sConst[D] : 0.f;
                const float inv = has ? 1.f / den : 0.f;  // o = num·(1/den): one division per row
#pragma unroll
                for (int nn = 0; nn < D / 8; ++nn) {
                    const int v = nn * 8 + 2 * t4;
                    const float2 c = *reinterpret_cast<const float2*>(sConst + v);
                    *reinterpret_cast<uint32_t*>(sQ + row * LD + v) =
                        pack2<T>((cz * acc[rt][nn][2 * r] + c.x) * inv, (cz * acc[rt][nn][2 * r + 1] + c.y) * inv);
                }
                if (t4 == 0 && row < np) P.lse[sStat[st][row]] = den;
            }
        __syncwarp();
        taylor1_store_rows<T, D, 16 * RT>(P.o, sOo[st], sQ, wrow, np, lane);
    }
    cp_async_wait<0>();  // (only an empty group can be left)
}

// The causal forward's tiles. Mirrored by taylor::heuristics::order1_causal_smem.
template <typename T, int D> struct Taylor1Causal {
    static constexpr int BP = 16 * kTaylorWarps;         // probes per tile: one m16 row tile per warp
    static constexpr int C = 64;                         // sources per block (folded chunk or dense block)
    static constexpr int M = TaylorDims<D>::M, MP = TaylorDims<D>::MP;
    static constexpr int NO = MP / 8;                    // n8 tiles of the columns v
    static constexpr int MT = MP / 16;                   // m16 tiles of v in the fold
    static constexpr int MG = D == 128 ? 3 : MT;         // of those per fold pass (its registers)
    static constexpr int NT = 1 + D / 8;                 // n8 feature tiles of the fold: const, then linear
    static constexpr int NPW = (NT + kTaylorWarps - 1) / kTaylorWarps;
    static constexpr int LD = SmemRow<D>::ld;            // q and k rows, T
    static constexpr int LDY = MP + 8;                   // v rows, T: columns D (den, 1) to MP − 1 constant
    static constexpr int LDS = D + 8;                    // state rows, f32: linear features 0..D−1, const at D
    static constexpr int CPR = D * 2 / 16;               // 16-byte copies per row
    static constexpr int kQ = 0;                         // Q [2][BP][LD] T (then o)
    static constexpr int kX = kQ + 2 * BP * LD * 2;      // X [2][C][LD] T
    static constexpr int kY = kX + 2 * C * LD * 2;       // Y [2][C][LDY] T
    static constexpr int kS = kY + 2 * C * LDY * 2;      // S [MP][LDS] f32: the running state
    static constexpr int kSr = kS + MP * LDS * 4;        // S rounded to tf32 [MP][LDS]: the mma's B
    static constexpr int kBytes = kSr + MP * LDS * 4;
    static_assert(MT % MG == 0 && LDS % 16 == 8, "whole fold passes; B reads of S without bank conflicts");
};

// cp.async.wait_group with a run-time count n ≤ 2.
__device__ __forceinline__ void cp_async_wait_n(int n) {
    if (n <= 0) cp_async_wait<0>();
    else if (n == 1) cp_async_wait<1>();
    else cp_async_wait<2>();
}

// The smallest probe p in [0, n_p) with hi(p) > h ≥ 0 (n_p when none) of a causal forward sweep: hi(p) =
// min(len_k, max(0, i + diag + 1)) for query i = p / G (Taylor specs have no window), so hi(p) > h iff
// len_k > h and i ≥ h − diag.
__device__ __forceinline__ int taylor1_first_probe_past(const TaylorSweep& sw, int h) {
    if (sw.n_s <= h) return sw.n_p;
    const long long p = (long long)sw.group * max(h - sw.si.diag, 0);
    return (int)min(p, (long long)sw.n_p);
}

// x rounded to the nearest tf32 (ties away from zero) by integer arithmetic: two instructions where
// cvt.rna.tf32.f32 takes several on sm_90 (finite x; the state sums are).
__device__ __forceinline__ float round_tf32(float x) {
    return __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
}

// Causal forward, order 1 (f16/bf16, rows 16-byte aligned). Grid (n_seg, Hkv, B): block m takes the probes
// whose state index is m (TaylorSweep::state_index: hi ∈ (mL, (m+1)L], and in block 0 also hi = 0), a
// contiguous range since hi is nondecreasing, in tiles of BP. It carries the state of the sources [0, B)
// in shared memory (f32, and a copy rounded to tf32 for the mma), from the prefix's st[m − 1] (B = mL; zero for m = 0), and per tile
//   1. folds the whole 64-source chunks below the tile's smallest hi into it (B advances by 64 each):
//      S[v][f] += Σ_s ỹ_s[v] φ_f(x̂_s), ỹ = [v, 1], on mma.sync (A = Ỹᵀ, B = [1, X̂]);
//   2. num, den = a1 r_z (q_raw · S_lin) + a0 S_const on tf32 mma (q exact in tf32, S rounded to it);
//   3. adds the sources [B, hi_p) densely: f(r_z (q_raw · x̂_s)) ỹ_s, on mma.sync as taylor_forward_tile;
//   4. o = num·(1/den) (zero when hi_p = 0), den to the statistics.
// Source blocks come by cp.async into two buffers; the block a tile's dense part ends on is kept for the
// next tile's fold (top-left causal, G = 1: each chunk is read once), and the next tile's first dense
// block is fetched during this tile's products when the other buffer is free. The next tile's q rows are
// always in flight during this tile. x̂ = x_raw (·1/max(‖x_raw‖, eps) under qk_l2norm, rounded to T as
// the fold's keys are).
template <typename T, int D>
__device__ __forceinline__ void taylor1_forward_causal(const TaylorParams& tp) {
    using L = Taylor1Causal<T, D>;
    constexpr int BP = L::BP, C = L::C, M = L::M, MP = L::MP, NO = L::NO, MT = L::MT, MG = L::MG, NT = L::NT;
    constexpr int NPW = L::NPW, LD = L::LD, LDY = L::LDY, LDS = L::LDS, CPR = L::CPR;
    constexpr int RPP = kTaylorThreads / CPR;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* sS = reinterpret_cast<float*>(smem_raw + L::kS);
    float* sSr = reinterpret_cast<float*>(smem_raw + L::kSr);
    __shared__ float sInv[BP];
    __shared__ long long sOo[2][BP], sStat[2][BP];
    if (dynamic_smem_bytes() < (unsigned)L::kBytes) __trap();

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    const int m = blockIdx.x, seg = sw.seg;
    if (m > 0 && m >= sw.n_seg) return;
    const int pa = m == 0 ? 0 : taylor1_first_probe_past(sw, m * seg);
    const int pb = m + 1 >= sw.n_seg ? sw.n_p : taylor1_first_probe_past(sw, (m + 1) * seg);
    if (pa >= pb) return;
    const bool l2 = P.l2norm != 0;
    auto stage_q = [&](int st) { return reinterpret_cast<T*>(smem_raw + L::kQ) + st * BP * LD; };
    auto buf_x = [&](int b) { return reinterpret_cast<T*>(smem_raw + L::kX) + b * C * LD; };
    auto buf_y = [&](int b) { return reinterpret_cast<T*>(smem_raw + L::kY) + b * C * LDY; };
    const T* x0 = static_cast<const T*>(P.k) + sw.si.k_off(P, 0, sw.hk);
    const T* y0 = static_cast<const T*>(P.v) + sw.si.v_off(P, 0, sw.hk);

    // The state S of the sources [0, B): st[m − 1] (the prefix's f32 sums, f = 0 the const feature,
    // f = 8 + d the linear ones), zero for m = 0 and in the rows M ≤ v < MP.
    const float* st_prev = m > 0 ? taylor_state_at(tp, blockIdx.z, blockIdx.y, m - 1) : nullptr;
    for (int idx = tid; idx < MP * (D + 1); idx += kTaylorThreads) {
        const int v = idx / (D + 1), c = idx % (D + 1);
        const int f = c < D ? 8 + c : 0;
        const float x = st_prev != nullptr && v < M ? st_prev[(long long)v * tp.f_pad + f] : 0.f;
        sS[v * LDS + c] = x;
        sSr[v * LDS + c] = round_tf32(x);
    }
    // Columns D..MP − 1 of both Y buffers: the den column (1), then zeros. The copies never write them.
    for (int idx = tid; idx < 2 * C * (MP - D); idx += kTaylorThreads) {
        const int b = idx / (C * (MP - D)), rest = idx % (C * (MP - D)), r = rest / (MP - D), c = D + rest % (MP - D);
        buf_y(b)[r * LDY + c] = from_f32<T>(c == D ? 1.f : 0.f);
    }

    // Source block [s0, s0 + C) into buffer b (rows past n_s zero-filled), one commit.
    auto issue_block = [&](int s0, int b) {
        const int ch = tid % CPR;
        T* x = buf_x(b);
        T* y = buf_y(b);
        for (int r = tid / CPR; r < C; r += RPP) {
            const int s = s0 + r;
            const bool valid = s < sw.n_s;
            const T* xp = valid ? x0 + s * P.k_seq + 8 * ch : x0;
            const T* yp = valid ? y0 + s * P.v_seq + 8 * ch : y0;
            cp_async_16(x + r * LD + 8 * ch, xp, valid);
            cp_async_16(y + r * LDY + 8 * ch, yp, valid);
        }
        cp_async_commit();
    };
    // The buffers: `cur` holds block `cached` (landed, keys scaled); the other one may hold block `pending`
    // in flight (issued, not waited for). fetch(s0) makes `cur` hold block s0. Block-uniform.
    int cur = 0, cached = -1, pending = -1;
    auto fetch = [&](int s0) {
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
        if (l2) {
            taylor1_scale_rows<T, C, D>(buf_x(cur), true, P.eps, [](int) { return 1.f; }, tid);
            __syncthreads();
        }
    };

    // The tile's [h_lo, h_hi] and the state boundary it reads: every whole chunk below h_lo folded.
    auto bounds = [&](int t0, int b_run, int& h_lo, int& h_hi, int& target) {
        const int np = min(BP, pb - t0);
        h_lo = sw.hi(P, t0);
        h_hi = sw.hi(P, t0 + np - 1);
        target = h_lo > b_run ? b_run + C * ((h_lo - b_run) / C) : b_run;
    };

    const uint32_t one2 = g == 0 ? pack2<T>(1.f, 1.f) : 0u;  // B of the const feature: 1 in column 0
    const int wrow = warp * 16;
    int b_run = m * seg;
    taylor1_issue_probes<T, D, BP>(tp, sw, stage_q(0), sOo[0], sStat[0], pa, pb, tid);
    cp_async_commit();

    for (int t0 = pa, n = 0; t0 < pb; t0 += BP, ++n) {
        const int stq = n & 1;
        T* sQ = stage_q(stq);
        int h_lo, h_hi, target;
        bounds(t0, b_run, h_lo, h_hi, target);
        __syncthreads();  // the previous tile's reads of S, of its o rows (the other q stage) are done

        // 1. Fold the chunks [b_run, target).
        for (; b_run < target; b_run += C) {
            fetch(b_run);
            const T* x = buf_x(cur);
            const T* y = buf_y(cur);
#pragma unroll
            for (int mg = 0; mg < MT; mg += MG) {
                float fa[NPW][MG][4];
#pragma unroll
                for (int j = 0; j < NPW; ++j)
#pragma unroll
                    for (int mm = 0; mm < MG; ++mm)
#pragma unroll
                        for (int e = 0; e < 4; ++e) fa[j][mm][e] = 0.f;
#pragma unroll
                for (int k0 = 0; k0 < C; k0 += 16) {
                    uint32_t a[MG][4];
#pragma unroll
                    for (int mm = 0; mm < MG; ++mm) load_a_trans(a[mm], y, LDY, k0, 16 * (mg + mm), lane);
#pragma unroll
                    for (int j = 0; j < NPW; ++j) {
                        const int nt = warp + kTaylorWarps * j;
                        if (nt >= NT) continue;  // warp-uniform
                        uint32_t b[2] = {one2, one2};
                        if (nt > 0) ldsm_x2_trans(b, x + (k0 + (lane & 15)) * LD + 8 * (nt - 1));
#pragma unroll
                        for (int mm = 0; mm < MG; ++mm) mma16816<T>(fa[j][mm], a[mm], b[0], b[1]);
                    }
                }
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
                                if (t4 == 0) sS[at + D] += fa[j][mm][2 * r];
                            } else {
                                const int c = at + 8 * (nt - 1) + 2 * t4;
                                const float2 old = *reinterpret_cast<const float2*>(sS + c);
                                const float2 sum = make_float2(old.x + fa[j][mm][2 * r], old.y + fa[j][mm][2 * r + 1]);
                                *reinterpret_cast<float2*>(sS + c) = sum;
                                *reinterpret_cast<float2*>(sSr + c) = make_float2(round_tf32(sum.x), round_tf32(sum.y));
                            }
                        }
                }
            }
        }

        // The dense part starts on block b_run; the next tile's q rows go in flight now, and its first
        // block past b_run when this tile needs no other block than b_run's and the other buffer is free.
        if (b_run < h_hi) fetch(b_run);
        const bool more = t0 + BP < pb;
        if (more) {
            taylor1_issue_probes<T, D, BP>(tp, sw, stage_q(stq ^ 1), sOo[stq ^ 1], sStat[stq ^ 1], t0 + BP, pb, tid);
            cp_async_commit();
            int n_lo, n_hi, n_target;
            bounds(t0 + BP, b_run, n_lo, n_hi, n_target);
            const int next = b_run + C;
            if (pending < 0 && cached == b_run && h_hi <= next && next < sw.n_s && (n_target > b_run || n_hi > next)) {
                issue_block(next, cur ^ 1);  // cur ^ 1: last read before fetch(b_run)'s barriers
                pending = next;
            }
        }
        // This tile's q rows have landed once at most the groups committed after them are in flight: the
        // pending block (from this tile or the previous one) and the next tile's q rows.
        cp_async_wait_n((pending >= 0 ? 1 : 0) + (more ? 1 : 0));
        __syncthreads();

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

        // 2. acc = Q_raw S_linᵀ on tf32 mma: the k16 A fragment of q (ldmatrix) splits into two k8 steps
        // with k permuted (slot t4 ↔ column 2t4, slot t4 + 4 ↔ 2t4 + 1), and B reads S's columns alike.
        float acc[NO][4];
#pragma unroll
        for (int nn = 0; nn < NO; ++nn)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nn][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t a[4];
            load_a(a, sQ, LD, wrow, kk * 16, lane);
            const float2 r0 = unpack2<T>(a[0]), r1 = unpack2<T>(a[1]), r2 = unpack2<T>(a[2]), r3 = unpack2<T>(a[3]);
            const float a_lo[4] = {r0.x, r1.x, r0.y, r1.y}, a_hi[4] = {r2.x, r3.x, r2.y, r3.y};
#pragma unroll
            for (int nn = 0; nn < NO; ++nn) {
                const float* sp = sSr + (8 * nn + g) * LDS + 16 * kk + 2 * t4;
                const float2 b_lo = *reinterpret_cast<const float2*>(sp);
                const float2 b_hi = *reinterpret_cast<const float2*>(sp + 8);
                mma1688_tf32(acc[nn], a_lo, b_lo.x, b_lo.y);
                mma1688_tf32(acc[nn], a_hi, b_hi.x, b_hi.y);
            }
        }
#pragma unroll
        for (int nn = 0; nn < NO; ++nn)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int v = 8 * nn + 2 * t4 + (e & 1);
                acc[nn][e] = tp.a1 * rz[e / 2] * acc[nn][e] + tp.a0 * sS[v * LDS + D];
            }

        // 3. The dense part: the sources [b_run, hi_p), blocks of C from b_run.
        for (int s0 = b_run; s0 < h_hi; s0 += C) {
            fetch(s0);
            const T* x = buf_x(cur);
            const T* y = buf_y(cur);
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
    }
    cp_async_wait<0>();  // (a block fetched ahead that no tile read may still be in flight)
}

}  // namespace attn
