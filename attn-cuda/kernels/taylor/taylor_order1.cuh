// Order 1 (f(s) = a0 + a1 s), f16/bf16: a fold and a non-causal forward built for the order-1 state,
// which is small: the const feature and the D linear ones, times the M = D + 1 columns of ṽ (65 × 65 at
// D = 64). Order 1 is bound by memory: these kernels stream their tiles
// with cp.async in 16-byte copies (the call's rows 16-byte aligned: the host checks it and otherwise runs
// the general kernels), and nothing else goes through DRAM but q, k, v, o and the small states.
//
//   taylor1_fold     the same segment sums as taylor_fold (st[k], [M][f_pad] f32, the same feature
//                    layout: f = 0 the const feature, f = 8 + d the linear ones, zero elsewhere; and
//                    st_max), so the prefix and every read take them as they are. Any sweep (forward
//                    or reversed: the row factors rx, ry and y_last of TaylorRowRef are applied in
//                    shared memory when they are not 1). Sᵀ = Yᵀ [1, X] chunk by chunk: the const
//                    feature is a constant B fragment (1 in column 0), the den column of Y (y_last) an
//                    A fragment built in registers from the per-row scalars: neither is a tile. The den
//                    column goes in as T and what T left of it (rows D and D + 1, one sum at the store).
//   taylor1_forward  non-causal probe tiles: every probe reads the whole sum st[n_seg − 1] (the
//                    prefix's storage-type copy): num, den = up·(a1 r_z (q_raw · S_lin) + a0 S_const),
//                    o = num·(1/den), r_z = scale (/‖q‖), up = 2^e of the copy. A block reads the
//                    state once and streams several probe tiles, two in flight; o is staged in shared
//                    memory and stored in 16-byte rows.
#pragma once
#include "../common/loads.h"
#include "taylor_state.cuh"

namespace attn {

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

// Rows r < ROWS of a shared tile [ROWS][LD] (the first D columns) scaled in place, x ← T(f_r·x) with f_r = factor(r),
// times 1/max(‖x_r‖, eps) when `l2` (as the general loaders scale, in f32, rounded once). Each thread
// takes 8 elements (16 bytes) of a row at a time; the D/8 threads of a row are adjacent lanes, which sum
// the row's squares by shuffles, so there is no barrier inside. Every thread makes the same number of
// passes (the shuffles need the whole warp).
template <typename T, int ROWS, int D, int LD = SmemRow<D>::ld, class Factor>
__device__ __forceinline__ void taylor1_scale_rows(T* tile, bool l2, float eps, Factor factor, int tid) {
    constexpr int CPR = D / 8, RPP = kTaylorThreads / CPR;
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

// The den rows' A fragment entries of two sources (values a, b): row g = 0 (v = D) holds them as T, row
// g = 1 (v = D + 1) what T left of them, so that the two rows' sums carry the den column to about twice T's
// precision (its terms cancel against the value rows' in a gradient read); other rows zero.
template <typename T> __device__ __forceinline__ uint32_t taylor1_den_pair(float a, float b, int g) {
    const uint32_t hi = pack2<T>(a, b);
    if (g != 1) return g == 0 ? hi : 0u;
    const float2 h = unpack2<T>(hi);
    return pack2<T>(a - h.x, b - h.y);
}

// The sources' rows of a sweep (TaylorSweep::source) as affine functions of the source index: key s at
// x0 + s·xs, y0 + s·ys; reversed, query row q = i·G + g = n_s − 1 − s at x0 + i·xs + g·xg, y0 + i·ys + g·yg
// (y0 null without dO), its scalars (rg, nd) at scratch row row0 + q.
template <typename T> struct Taylor1SourceRows {
    const T* x0;
    const T* y0;
    long long xs, ys, xg, yg, row0;
    __device__ __forceinline__ Taylor1SourceRows(const AttnParams& P, const TaylorSweep& sw) : xg(0), yg(0), row0(0) {
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
    }
    // The 16-byte copy ch of source s < n_s: its x and y rows (y left as it is without dO) and, reversed
    // (rev = sw.rev, a constant where the caller knows it), its query row q.
    __device__ __forceinline__ void at(bool rev, const TaylorSweep& sw, int s, int ch, const T*& xp, const T*& yp,
                                       int& q) const {
        if (!rev) {
            xp = x0 + s * xs + 8 * ch;
            yp = y0 + s * ys + 8 * ch;
        } else {
            q = sw.n_s - 1 - s;
            const int i = q / sw.group, gg = q - i * sw.group;
            xp = x0 + i * xs + gg * xg + 8 * ch;
            if (y0 != nullptr) yp = y0 + i * ys + gg * yg + 8 * ch;
        }
    }
};

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

    // The sources' rows; rx = ry = y_last = 1 for keys; reversed rx = scale, ry and y_last from rg, nd.
    const Taylor1SourceRows<T> src(P, sw);
    const float rx = sw.rev && tp.rev_raw == 0 ? P.scale : 1.f;  // (rev_raw: the reads apply the scale)

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
                int q = 0;
                const bool has_y = valid && src.y0 != nullptr;
                if (valid) src.at(sw.rev, sw, s, ch, xp, yp, q);
                cp_async_16(x + r * LD + 8 * ch, xp, valid);
                cp_async_16(y + r * LD + 8 * ch, yp, has_y);
                if (ch == 0) {
                    if (!sw.rev) {
                        sYl[st][r] = valid ? 1.f : 0.f;
                    } else {
                        const float* fs = reinterpret_cast<const float*>(stand_in);
                        const bool has_rg = valid && tp.rg != nullptr, has_nd = valid && tp.nd != nullptr;
                        cp_async_4(&sRy[st][r], has_rg ? tp.rg + src.row0 + q : fs, has_rg);
                        cp_async_4(&sYl[st][r], has_nd ? tp.nd + src.row0 + q : fs, has_nd);
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
                } else {  // the den row v = D (row g = 0 of this tile), y_last per source as T, and in
                          // row D + 1 what T left of it (added to row D at the store); rows past it zero
                    const float* yl = sYl[st] + k0 + 2 * t4;
                    a[m][0] = taylor1_den_pair<T>(yl[0], yl[1], g);
                    a[m][1] = 0u;
                    a[m][2] = taylor1_den_pair<T>(yl[8], yl[9], g);
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
        for (int m = 0; m < MTB; ++m) {
            // Row D + 1 (the den's remainders, lane + 4) into row D; every lane shuffles (n, part uniform).
            const bool den_tile = 16 * (part * MTB + m) == D;
            const float lo0 = __shfl_down_sync(0xffffffffu, acc[j][m][0], 4);
            const float lo1 = __shfl_down_sync(0xffffffffu, acc[j][m][1], 4);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int v = 16 * (part * MTB + m) + g + 8 * r;
                if (v >= L::M) continue;
                const bool den = den_tile && r == 0;  // (then v = D: g = 0)
                const float a = acc[j][m][2 * r] + (den ? lo0 : 0.f), c = acc[j][m][2 * r + 1] + (den ? lo1 : 0.f);
                *reinterpret_cast<float2*>(out + (long long)v * tp.f_pad + 8 * n + 2 * t4) = make_float2(a, c);
                if (isfinite(a)) mx = fmaxf(mx, fabsf(a));
                if (isfinite(c)) mx = fmaxf(mx, fabsf(c));
            }
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

// One row of J(x_raw)ᵀ y into dst (T): this thread's columns nn·8 + 2t4 + {0, 1} of the row (its quad holds
// the row), y[nn] their values. Under the l2-norm, with inv = 1/max(‖x_raw‖, eps) (negative where eps clamps
// the norm: no projection there, |inv|), (y − x̂ (x̂·y))·inv for x̂ = inv·x_raw; else y, and x is not read. dst
// may be x (each element is read before its own lane writes it). Every lane of the warp calls it.
template <typename T, int NO>
__device__ __forceinline__ void taylor1_store_l2_grad(T* dst, const T* x, const float (&y)[NO][2], bool l2, float inv,
                                                      int t4) {
    float proj = 0.f;
    if (l2) {  // (uniform: a call parameter)
#pragma unroll
        for (int nn = 0; nn < NO; ++nn) {
            const float2 xr = unpack2<T>(*reinterpret_cast<const uint32_t*>(x + nn * 8 + 2 * t4));
            proj += xr.x * y[nn][0] + xr.y * y[nn][1];
        }
        proj += __shfl_xor_sync(0xffffffffu, proj, 1);
        proj += __shfl_xor_sync(0xffffffffu, proj, 2);
        proj *= inv;  // x̂·y
        if (!(inv > 0.f)) proj = 0.f;
        inv = fabsf(inv);
    }
#pragma unroll
    for (int nn = 0; nn < NO; ++nn) {
        const int c = nn * 8 + 2 * t4;
        float o0 = y[nn][0], o1 = y[nn][1];
        if (l2) {
            const float2 xr = unpack2<T>(*reinterpret_cast<const uint32_t*>(x + c));
            o0 = (o0 - xr.x * inv * proj) * inv;
            o1 = (o1 - xr.y * inv * proj) * inv;
        }
        *reinterpret_cast<uint32_t*>(dst + c) = pack2<T>(o0, o1);
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

}  // namespace attn
