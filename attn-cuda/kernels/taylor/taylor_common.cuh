// Taylor linear attention (docs/math.md §3): parameters, feature tiles and sweep indexing shared by
// every Taylor kernel. The math is attn-cpu-ref/src/taylor.rs's, with the same symbols.
//
// Every pass is one SWEEP of sources (x_s, y_s) against probes (z_p, w_p): probe p sees the sources
// s < hi_p (hi nondecreasing in p) and gets
//   value_p = Σ_{s<hi_p} f(z_p·x_s) y_s          f(t)  = a0 + a1 t + a2 t²
//   grad_p  = Σ_{s<hi_p} f'(z_p·x_s)(w_p·y_s) x_s   f'(t) = a1 + 2 a2 t
//   forward:  sources (k̂_j, ṽ_j = [v_j, 1]), probes u_i = scale·q̂_i             value → [num_i, den_i]
//   dQ:       same sources, probes (u_i, g̃_i = [ĝ_i, −δ_i])                       grad  → dû_i
//   dV, dK:   sources (u_i, g̃_i) over the queries of the GQA group, in reverse;
//             probes (k̂_j, ṽ_j) in reverse (suffix sums)                          value → dṽ_j, grad → dk̂_j
//
// The polynomial factors through features: f(z·x) = Σ_f ψ_f(z) φ_f(x), with φ (source side,
// unweighted) and ψ (probe side, carrying the coefficients) over tiles of 8 features:
//   const tile:    φ = [1, 0…],          ψ = [a0, 0…]
//   linear tiles:  φ_e = x_{b0+e},       ψ_e = a1 z_{b0+e}                       (b0 = 0, 8, …, D−8)
//   quad tiles:    φ_e = x_a x_{b0+e},   ψ_e = a2 c_{a,b} z_a z_b, b = b0+e, c = 2 (b > a), 1 (b = a),
//                  0 (b < a)             (order 2: every a, b0 = 8⌊a/8⌋, …, D−8)
// The quad tiles cover each pair a ≤ b once (the symmetry of k⊗k); the few b < a inside a diagonal
// 8-block carry weight 0. So the states S[f][·] = Σ_s φ_f(x_s) y_s and
//   value_p = Σ_f ψ_f(z_p) S[f],   grad_p = Σ_f ∇ψ_f(z_p) (S[f]·w_p),
// with ∇ψ = a1 e_b (linear) and a2 c_ab (z_b e_a + z_a e_b) (quad).
#pragma once
#include "../common/mask.h"
#include "../common/mma.h"

// Everything a Taylor kernel needs: the spec (AttnParams: tensors, strides, lengths, mask), the per-row
// scalars and the f32 sums of one call. Mirrored field for field by attn_cuda::taylor::params::TaylorParams
// (#[repr(C)]).
struct TaylorParams {
    AttnParams base;
    // Results per probe row (sweep order, taylor_key_row / taylor_query_row): value [rows][M], grad [rows][D].
    float* out_value;
    float* out_grad;
    // The backward's row scalars (per scratch row), from taylor_prep_grads: the sweeps read q, k, v, dO
    // in the storage dtype and scale them on the fly (TaylorRowRef; the l2-norms of q and k they take
    // from the tiles they load).
    float* rg;      // 1/den_i, 0 for a row with no key              [total_q·Hq]
    float* nd;      // −δ_i = −ĝ_i·o_i                                [total_q·Hq]
    float* nd_rev;  // −T(ĝ_i)·o_i, ĝ rounded to the storage type as the order-1 reversed sweeps hold it
                    // (so that v_j·T(ĝ_i) + nd cancels exactly where o_i = v_j), or null   [total_q·Hq]
    float* acc_q;   // forward: [num, den] [..][M]; backward: dû [..][D]
    float* acc_kv;  // dṽ [total_k·Hkv][M]
    float* acc_k;   // dk̂ [total_k·Hkv][D]
    float* state;   // decode: [B][Hkv][features][M]
    // The state sweep: per (batch entry, kv head) n_seg states Sᵀ [M][f_pad] (segment sums, then, f32,
    // their inclusive prefix in place), per segment the bits of its largest |sum| (a non-negative float
    // as an int), and for f16/bf16 the prefix's storage-type copies (hi, and lo for a gradient read).
    // Decode: st holds the per-feature-block partials of a step.
    float* st;      // [B][Hkv][n_seg][M][f_pad]
    int* st_max;    // [B][Hkv][n_seg]: the largest |segment sum| (f16/bf16); the single-pass order-1 forward
                    // (taylor_order1_chain.cuh): its flags, then its ticket counter
    void* st_t;     // f16/bf16: the states in the storage type, [B][Hkv][n_seg][copies][M][f_pad]
    float* st_vec;  // order 2 on wgmma (taylor_wg.cuh): the read's f32 vector part [B][Hkv][132] (causal:
                    // [B][Hkv][n_seg][132], one per state)
    float a0, a1, a2;
    int order;      // 1 or 2
    int reverse;    // sweep roles: 0 keys → queries (forward, dQ); 1 queries → keys, reversed (dV, dK)
    int n_slabs;    // fold: feature slabs per (batch entry, kv head); decode: feature blocks; the single-pass
                    // order-1 forward: how many rounds its fold blocks run ahead
    int seg_len;    // L: sources per segment (a multiple of the chunk C)
    int n_seg;      // segments of the longest (batch entry, kv head): the st stride
    int f_pad;      // features per state row: 8 · taylor_tiles rounded up to kTaylorStepTiles
    int features;   // decode: feature rows of the state (8 · tiles)
    int copies;     // f16/bf16 state copies: 1 (hi) or 2 (hi, lo: a sweep with a gradient read)
    int rev_raw;    // order-1 reversed sweeps without qk_l2norm: x = q_raw (not scale·q), scale applied by the
                    // reads, so that f there is the forward's f to f32 rounding (it matters where den → 0)
};

namespace attn {

// ṽ = [v, 1] has M = D + 1 columns (values and the denominator), padded to MP for whole mma steps.
template <int D> struct TaylorDims {
    static constexpr int M = D + 1;
    static constexpr int MP = (M + 15) / 16 * 16;
};

// Chunk length C of the state fold (sources folded at a time; the segment length L is a multiple of it)
// and feature tiles NT per fold slab, per head dim.
// Specialisations only: an unsupported head dim does not compile. Mirrored by taylor::heuristics.
template <int D> struct TaylorTile;
template <> struct TaylorTile<16> { static constexpr int C = 64, NT = 28; };
template <> struct TaylorTile<32> { static constexpr int C = 64, NT = 16; };
template <> struct TaylorTile<64> { static constexpr int C = 64, NT = 16; };
template <> struct TaylorTile<128> { static constexpr int C = 32, NT = 8; };

constexpr int kTaylorThreads = 128;
constexpr int kTaylorWarps = 4;
// Feature tiles per step of the state reads (32 features, two k16 mma steps); states are padded to it.
constexpr int kTaylorStepTiles = 4;

enum : int { kTileZero = 0, kTileConst = 1, kTileLinear = 2, kTileQuad = 3 };

struct FeatureTile {
    int kind, a, b0;
};

// Tiles of 8 features per head: const, D/8 linear, and for order 2 4·(D/8)·(D/8 + 1) quad tiles.
__host__ __device__ constexpr int taylor_tiles(int D, int order) {
    return order == 1 ? 1 + D / 8 : 1 + D / 8 + 4 * (D / 8) * (D / 8 + 1);
}

// Tile t of the list [const, linear b0 = 0, 8, …, quad (a, b0) row-major over a ≤ …]; zero past the end.
__device__ __forceinline__ FeatureTile feature_tile(int t, int D, int order) {
    const int w = D / 8;
    if (t == 0) return {kTileConst, 0, 0};
    if (t <= w) return {kTileLinear, 0, 8 * (t - 1)};
    if (order == 1) return {kTileZero, 0, 0};
    int q = t - 1 - w;
    for (int grp = 0; grp < w; ++grp) {  // a ∈ [8 grp, 8 grp + 8) has w − grp tiles each
        const int wg = w - grp;
        if (q < 8 * wg) return {kTileQuad, 8 * grp + q / wg, 8 * grp + 8 * (q % wg)};
        q -= 8 * wg;
    }
    return {kTileZero, 0, 0};
}

__device__ __forceinline__ float quad_weight(int a, int b) { return b > a ? 2.f : (b == a ? 1.f : 0.f); }

// φ of the 8 features of a tile (source side) from an f32 row x.
__device__ __forceinline__ void source_features(float (&out)[8], FeatureTile ft, const float* x) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        float v = 0.f;
        if (ft.kind == kTileConst) v = e == 0 ? 1.f : 0.f;
        else if (ft.kind == kTileLinear) v = x[ft.b0 + e];
        else if (ft.kind == kTileQuad) v = x[ft.a] * x[ft.b0 + e];
        out[e] = v;
    }
}

// ψ of the 8 features of a tile (probe side, with the coefficients) from an f32 row z.
__device__ __forceinline__ void probe_features(float (&out)[8], FeatureTile ft, const float* z, float a0, float a1,
                                               float a2) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        float v = 0.f;
        if (ft.kind == kTileConst) v = e == 0 ? a0 : 0.f;
        else if (ft.kind == kTileLinear) v = a1 * z[ft.b0 + e];
        else if (ft.kind == kTileQuad) v = a2 * quad_weight(ft.a, ft.b0 + e) * z[ft.a] * z[ft.b0 + e];
        out[e] = v;
    }
}

// G += ∇_z Σ_e ψ_e(z) T_e over one tile (T: the tile's 8 entries of S·w; G: one probe's D sums, owned by
// the caller's thread): a linear tile adds a1·T_e to G_{b0+e}; a quad tile (a, b0) adds a2·c_ab z_a T_e to
// G_b and a2 Σ_e c_ab z_b T_e to G_a.
template <typename Acc>
__device__ __forceinline__ void add_probe_tile_grad(Acc* G, FeatureTile ft, const float* z, const float* T, float a1,
                                                    float a2) {
    if (ft.kind == kTileLinear) {
#pragma unroll
        for (int e = 0; e < 8; ++e) G[ft.b0 + e] += a1 * T[e];
    } else if (ft.kind == kTileQuad) {
        const float za = a2 * z[ft.a];
        float sa = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const int b = ft.b0 + e;
            const float te = quad_weight(ft.a, b) * T[e];
            sa += z[b] * te;
            G[b] += za * te;
        }
        G[ft.a] += a2 * sa;
    }
}

__device__ __forceinline__ float taylor_f(const TaylorParams& tp, float s) { return tp.a0 + s * (tp.a1 + tp.a2 * s); }
__device__ __forceinline__ float taylor_df(const TaylorParams& tp, float s) { return tp.a1 + 2.f * tp.a2 * s; }

__device__ __forceinline__ float taylor_warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ double taylor_warp_sum(double x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Scratch rows in sweep order. Keys of (b, kv head hk): one block of len_k rows; queries of (b, kv head
// hk): the G query heads of the group interleaved, row i·G + g for query i of head hk·G + g.
__device__ __forceinline__ long long taylor_key_row(const AttnParams& p, const SeqInfo& si, int hk, int j) {
    const long long stride = si.varlen ? si.len_k : p.seq_k;
    const long long row0 = si.varlen ? si.row_k : (long long)si.b * p.seq_k;
    return row0 * p.heads_kv + hk * stride + j;
}
__device__ __forceinline__ long long taylor_query_row(const AttnParams& p, const SeqInfo& si, int hk, int i, int g) {
    const long long stride = si.varlen ? si.len_q : p.seq_q;
    const long long row0 = si.varlen ? si.row_q : (long long)si.b * p.seq_q;
    return row0 * p.heads_q + (long long)hk * p.group * stride + (long long)i * p.group + g;
}

// One row of a sweep side, read straight from the call's tensors (storage dtype): features
// x = rx·x_raw[0..D) (under qk_l2norm the loaders fold 1/max(‖x_raw‖, eps) into rx) and values
// y = [ry·y_raw[0..Dv), y_last] (y_raw null: no values, zeros).
struct TaylorRowRef {
    const void* x;
    const void* y;
    float rx, ry, y_last;
};

// One (batch entry, kv head) of a sweep: sizes, rows, the prefix length hi_p of every probe, and its
// segments: the sources split into n_seg segments of L (the last one shorter), whose sums the fold
// writes and the prefix turns into st[k] = Σ over the sources [0, min((k+1)·L, n_s)).
// Probe p reads the state of index κ(hi_p) and takes the sources [B_p, hi_p) densely:
//   κ(hi) = n_seg          when hi = n_s, not causal  (the whole sum, nothing dense)
//         = ⌊(hi − 1)/L⌋   when 0 < hi, causal or hi < n_s  (1 to L dense sources)
//         = 0              when hi = 0        (no state, nothing dense)
//   B_p   = min(κ·L, n_s);  the state of index κ ≥ 1 is st[κ − 1].
// (hi − 1 rather than hi keeps the probes of a causal tile on one state: query i of a top-left causal
// sweep has hi = i + 1, so the queries [mL, mL + L) all read st[m − 1]. A causal sweep keeps its
// last sources dense even for hi = n_s: the reversed sweeps end on the first queries, whose small
// denominators make their factorised terms ill-conditioned.)
struct TaylorSweep {
    SeqInfo si;
    int hk, group, n_s, n_p;
    int seg, n_seg;
    long long probe0;
    bool rev, causal;

    __device__ __forceinline__ TaylorSweep(const TaylorParams& tp, int b, int hk_) : si(tp.base, b), hk(hk_) {
        group = tp.base.group;
        rev = tp.reverse != 0;
        causal = tp.base.causal != 0;
        seg = tp.seg_len;
        const long long key0 = taylor_key_row(tp.base, si, hk, 0);
        const long long query0 = taylor_query_row(tp.base, si, hk, 0, 0);
        if (!rev) {
            n_s = si.len_k;
            n_p = group * si.len_q;
            probe0 = query0;
        } else {
            n_s = group * si.len_q;
            n_p = si.len_k;
            probe0 = key0;
        }
        n_seg = (n_s + seg - 1) / seg;
    }
    // κ(hi) and B = min(κ·L, n_s) (see above).
    __device__ __forceinline__ int state_index(int h) const {
        return h <= 0 ? 0 : (!causal && h >= n_s ? n_seg : (h - 1) / seg);
    }
    __device__ __forceinline__ int boundary(int h) const { return min(state_index(h) * seg, n_s); }
    // Scratch row of probe p, where its results go (reverse: the last row first).
    __device__ __forceinline__ long long probe_row(int p) const { return rev ? probe0 + (n_p - 1 - p) : probe0 + p; }
    // Sources probe p sees: keys [0, key_hi(i)) of query i = p / G; or, reversed, the G·(len_q − i0(j)) query
    // rows of the queries i ≥ i0(j) that see key j = len_k − 1 − p.
    __device__ __forceinline__ int hi(const AttnParams& p, int pr) const {
        if (!rev) return si.key_hi(p, pr / group);
        const int j = n_p - 1 - pr;
        const int i0 = p.causal != 0 ? min(max(j - si.diag, 0), si.len_q) : 0;
        return group * (si.len_q - i0);
    }
    // The tensor rows of source s and probe p (reverse: queries i·G + g = n_s − 1 − s as sources, key
    // n_p − 1 − p as the probe).
    template <typename T> __device__ __forceinline__ TaylorRowRef key_ref(const TaylorParams& tp, int j) const;
    template <typename T> __device__ __forceinline__ TaylorRowRef query_ref(const TaylorParams& tp, int i, int g) const;
    template <typename T> __device__ __forceinline__ TaylorRowRef source(const TaylorParams& tp, int s) const {
        if (!rev) return key_ref<T>(tp, s);
        const int r = n_s - 1 - s;
        return query_ref<T>(tp, r / group, r % group);
    }
    template <typename T> __device__ __forceinline__ TaylorRowRef probe(const TaylorParams& tp, int p) const {
        if (!rev) return query_ref<T>(tp, p / group, p % group);
        return key_ref<T>(tp, n_p - 1 - p);
    }
};

// Key j: x = k̂_j = k_j (the loader applies the l2-norm), y = ṽ_j = [v_j, 1].
template <typename T>
__device__ __forceinline__ TaylorRowRef TaylorSweep::key_ref(const TaylorParams& tp, int j) const {
    const AttnParams& p = tp.base;
    TaylorRowRef r;
    r.x = static_cast<const T*>(p.k) + si.k_off(p, j, hk);
    r.y = static_cast<const T*>(p.v) + si.v_off(p, j, hk);
    r.rx = 1.f;
    r.ry = 1.f;
    r.y_last = 1.f;
    return r;
}
// Query i of head hk·G + g: x = u_i = scale·q_i (the loader applies the l2-norm), y = g̃_i = [rg·dO_i, −δ_i]
// (the backward's; no y otherwise).
template <typename T>
__device__ __forceinline__ TaylorRowRef TaylorSweep::query_ref(const TaylorParams& tp, int i, int g) const {
    const AttnParams& p = tp.base;
    const int h = hk * group + g;
    const long long row = taylor_query_row(p, si, hk, i, g);
    TaylorRowRef r;
    r.x = static_cast<const T*>(p.q) + si.q_off(p, i, h);
    r.y = p.d_o != nullptr ? static_cast<const T*>(p.d_o) + si.o_off(p, i, h) : nullptr;
    r.rx = p.scale;
    r.ry = tp.rg != nullptr ? tp.rg[row] : 0.f;
    r.y_last = tp.nd != nullptr ? tp.nd[row] : 0.f;
    return r;
}

// Elements per thread whose global loads a tile loader issues before it stores any of them.
constexpr int kTaylorLoadBatch = 8;

// A stand-in address for the loads a loader does not need (zero, in global memory, never written).
__device__ __align__(16) unsigned int taylor_zero_words[4];

// *p through the read-only path where `pred`, else zero, without a branch: the load always issues (from
// the stand-in when !pred) and a select picks the value. With a C++ `pred ? __ldg(p) : 0` ptxas put each
// load and its conversion inside a branch and waited for the load there, so the loads of a batch ran one
// after another (the fold's SASS at D = 64: 72 serial global-load latencies per chunk).
template <typename T> __device__ __forceinline__ T ldg_or_zero(const T* p, bool pred) {
    const T* a = pred ? p : reinterpret_cast<const T*>(taylor_zero_words);
    return __ldg(a);  // the stand-in reads as zero
}

// For every element idx < N of a tile, `store(idx, v)` with v = *addr(idx) (zero where addr gives null),
// thread tid taking idx ≡ tid (mod the block size) as a plain strided loop would, but kTaylorLoadBatch
// of its loads at a time into registers before the stores: each batch waits for one global-load latency
// instead of one per element (the loads were the chunk loop's critical path, measured on the H100 at commit
// 10252c0). The same elements, values and stores as the strided loop, only in a
// different order across elements. The loaders read the call's inputs, which no kernel writes, through
// the read-only path.
template <typename T, int N, class Addr, class Store>
__device__ __forceinline__ void taylor_batched(int tid, Addr addr, Store store) {
    constexpr int kStep = kTaylorThreads * kTaylorLoadBatch;
    for (int base = 0; base < N; base += kStep) {
        T v[kTaylorLoadBatch];
#pragma unroll
        for (int i = 0; i < kTaylorLoadBatch; ++i) {
            const int idx = base + i * kTaylorThreads + tid;
            const T* a = addr(min(idx, N - 1));  // clamped to a real element; past N the stand-in is loaded
            v[i] = ldg_or_zero(a, idx < N && a != nullptr);
        }
#pragma unroll
        for (int i = 0; i < kTaylorLoadBatch; ++i) {
            const int idx = base + i * kTaylorThreads + tid;
            if (idx < N) store(idx, v[i]);
        }
    }
}

// The refs of rows r < valid of a tile (rows ≥ valid: x, y null); call before the barrier that precedes
// load_x / load_y.
template <int ROWS, class RefFn>
__device__ __forceinline__ void taylor_tile_refs(TaylorRowRef* refs, int valid, RefFn ref, int tid) {
    for (int r = tid; r < ROWS; r += kTaylorThreads) {
        if (r < valid) {
            refs[r] = ref(r);
        } else {
            refs[r].x = nullptr;
            refs[r].y = nullptr;
            refs[r].rx = refs[r].ry = refs[r].y_last = 0.f;
        }
    }
}

// x of tile rows r < ROWS into dst[r·LD + d] as XT (f32 or the storage type): the row factor is
// r_x = rx·(1/max(‖x_raw‖, eps)) under qk_l2norm, else rx (rx: scale for a query, 1 for a key), written
// back to refs[r].rx; the tile holds x = r_x·x_raw (SCALE) or x_raw itself (!SCALE: exact, for the
// dense scores s = r_z·r_x·(z_raw·x_raw), which then round nothing but f32 products). Zero for rows
// without x. The norm is summed as taylor_row_sq does (lanes over d, then the warp butterfly). Under
// qk_l2norm it ends with a barrier; callers put their own barrier after it.
template <typename T, typename XT, int ROWS, int D, int LD, bool SCALE = true>
__device__ __forceinline__ void taylor_load_x(const TaylorParams& tp, XT* dst, TaylorRowRef* refs, int tid) {
    const bool l2 = tp.base.l2norm != 0;
    taylor_batched<T, ROWS * D>(
        tid,
        [&](int idx) {
            const T* x = static_cast<const T*>(refs[idx / D].x);
            return x != nullptr ? x + idx % D : nullptr;
        },
        [&](int idx, T x) {
            const int r = idx / D, d = idx % D;
            const float raw = to_f32(x);
            dst[r * LD + d] = from_f32<XT>(l2 || !SCALE ? raw : raw * refs[r].rx);  // raw: exact in XT (an input)
        });
    if (!l2) return;
    __syncthreads();
    const int warp = tid / 32, lane = tid % 32;
    for (int r = warp; r < ROWS; r += kTaylorWarps) {
        float s = 0.f;
        for (int d = lane; d < D; d += 32) {
            const float v = to_f32(dst[r * LD + d]);
            s += v * v;
        }
        s = taylor_warp_sum(s);
        if (lane == 0 && refs[r].x != nullptr) refs[r].rx = refs[r].rx * (1.f / fmaxf(sqrtf(s), tp.base.eps));
    }
    __syncthreads();
    if constexpr (SCALE) {
        for (int idx = tid; idx < ROWS * D; idx += kTaylorThreads) {
            const int r = idx / D, d = idx % D;
            dst[r * LD + d] = from_f32<XT>(to_f32(dst[r * LD + d]) * refs[r].rx);
        }
    }
}

// x_raw of tile rows r < ROWS into dst[r·LD + d] as T (exact), zero for rows without x; the factors in
// refs are left as they are.
template <typename T, int ROWS, int D, int LD>
__device__ __forceinline__ void taylor_load_raw(T* dst, const TaylorRowRef* refs, int tid) {
    taylor_batched<T, ROWS * D>(
        tid,
        [&](int idx) {
            const T* x = static_cast<const T*>(refs[idx / D].x);
            return x != nullptr ? x + idx % D : nullptr;
        },
        [&](int idx, T x) { dst[(idx / D) * LD + idx % D] = x; });
}

// y = [ry·y_raw, y_last] of tile rows r < ROWS into dst[r·LD + c] as T for c < COLS (zero past Dv + 1 and
// for rows without a ref).
template <typename T, int ROWS, int DV, int COLS, int LD>
__device__ __forceinline__ void taylor_load_y(T* dst, const TaylorRowRef* refs, int tid) {
    taylor_batched<T, ROWS * COLS>(
        tid,
        [&](int idx) {
            const int c = idx % COLS;
            const TaylorRowRef& ref = refs[idx / COLS];
            const T* y = static_cast<const T*>(ref.y);
            return ref.x != nullptr && y != nullptr && c < DV ? y + c : nullptr;
        },
        [&](int idx, T y) {
            const int r = idx / COLS, c = idx % COLS;
            const TaylorRowRef& ref = refs[r];
            float v = 0.f;
            if (ref.x != nullptr) {
                if (c < DV) v = ref.y != nullptr ? to_f32(y) * ref.ry : 0.f;
                else if (c == DV) v = ref.y_last;
            }
            dst[r * LD + c] = from_f32<T>(v);
        });
}

// Eight f32 values stored as T at a 16-byte aligned address.
template <typename T> __device__ __forceinline__ void store8(T* dst, const float (&v)[8]);
template <> __device__ __forceinline__ void store8<float>(float* dst, const float (&v)[8]) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
template <typename T> __device__ __forceinline__ void store8_16(T* dst, const float (&v)[8]) {
    uint4 u;
    u.x = pack2<T>(v[0], v[1]);
    u.y = pack2<T>(v[2], v[3]);
    u.z = pack2<T>(v[4], v[5]);
    u.w = pack2<T>(v[6], v[7]);
    *reinterpret_cast<uint4*>(dst) = u;
}
template <> __device__ __forceinline__ void store8<__half>(__half* dst, const float (&v)[8]) { store8_16(dst, v); }
template <> __device__ __forceinline__ void store8<__nv_bfloat16>(__nv_bfloat16* dst, const float (&v)[8]) {
    store8_16(dst, v);
}

// A fragment (rows = columns of a [k][m] shared tile): A[m0 + r][k0 + c] = tile[(k0 + c)·ld + m0 + r], i.e. the
// transpose of the stored tile, through ldmatrix.trans.
template <typename T>
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const T* tile, int ld, int k0, int m0, int lane) {
    const int q = lane >> 3, r = lane & 7;
    ldsm_x4_trans(a, tile + (k0 + r + (q >> 1) * 8) * ld + m0 + (q & 1) * 8);
}

// S = Z Xᵀ for the 16 rows [row0, row0 + 16) of z [..][ldz] against the BS rows of x [..][ldx], over the
// first K columns of both (mma.sync, f32 accumulate): the dense parts' scores (and the gradient's W Yᵀ).
template <typename T, int K, int BS>
__device__ __forceinline__ void taylor_scores_mma(float (&s)[BS / 8][4], const T* z, int ldz, int row0, const T* x,
                                                  int ldx, int lane) {
#pragma unroll
    for (int n = 0; n < BS / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
        uint32_t a[4];
        load_a(a, z, ldz, row0, kk * 16, lane);
#pragma unroll
        for (int nn = 0; nn < BS / 16; ++nn) {
            uint32_t bf[4];
            load_b_nk(bf, x, ldx, nn * 16, kk * 16, lane);
            mma16816<T>(s[2 * nn], a, bf[0], bf[1]);
            mma16816<T>(s[2 * nn + 1], a, bf[2], bf[3]);
        }
    }
}

// acc += P Y for P the [16][BS] C fragments p (rounded to T for the product) and the first NC columns of
// y [BS][ldy] (mma.sync): the dense parts' weighted sums.
template <typename T, int BS, int NC>
__device__ __forceinline__ void taylor_weights_mma(float (&acc)[NC / 8][4], const float (&p)[BS / 8][4], const T* y,
                                                   int ldy, int lane) {
#pragma unroll
    for (int kk = 0; kk < BS / 16; ++kk) {
        uint32_t a[4];
        pack_a<T>(a, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
        for (int dd = 0; dd < NC / 16; ++dd) {
            uint32_t bf[4];
            load_b_kn(bf, y, ldy, kk * 16, dd * 16, lane);
            mma16816<T>(acc[2 * dd], a, bf[0], bf[1]);
            mma16816<T>(acc[2 * dd + 1], a, bf[2], bf[3]);
        }
    }
}

// The dynamic shared memory this launch got: a launch with less than a kernel's layout traps instead of
// writing past it.
__device__ __forceinline__ unsigned dynamic_smem_bytes() {
    unsigned n;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
    return n;
}

}  // namespace attn
