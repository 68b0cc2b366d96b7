// Taylor linear attention (REFERENCE.md §3): parameters, feature tiles and sweep indexing shared by
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
#include "mask.h"
#include "mma.h"

// Everything a Taylor kernel needs: the spec (AttnParams: strides, lengths, mask) and the f32 scratch of
// one call. Mirrored field for field by attn_cuda::taylor::params::TaylorParams (#[repr(C)]).
struct TaylorParams {
    AttnParams base;
    // The sweep of one launch: sources x [rows][D], y [rows][M]; probes z [rows][D], w [rows][M]; results
    // per probe row, value [rows][M] and grad [rows][D]. Rows are in sweep order (taylor_key_row, taylor_query_row).
    const float* src_x;
    const float* src_y;
    const float* probe_z;
    const float* probe_w;
    float* out_value;
    float* out_grad;
    // The scratch the row kernels fill and read.
    float* kx;      // k̂_j per (kv head, key)               [total_k·Hkv][D]
    float* ky;      // ṽ_j = [v_j, 1]                        [total_k·Hkv][M]
    float* qz;      // u_i = scale·q̂_i per (query head, query) [total_q·Hq][D]
    float* qw;      // g̃_i = [ĝ_i, −δ_i] (backward)          [total_q·Hq][M]
    float* acc_q;   // forward: [num, den] [..][M]; backward: dû [..][D]
    float* acc_kv;  // dṽ [total_k·Hkv][M]
    float* acc_k;   // dk̂ [total_k·Hkv][D]
    float* state;   // decode: [B][Hkv][features][M]
    float a0, a1, a2;
    int order;             // 1 or 2
    int reverse;           // sweep roles: 0 keys → queries (forward, dQ); 1 queries → keys, reversed (dV, dK)
    int n_slabs;           // state sweep: feature slabs per (batch entry, kv head)
    int chunks_per_split;  // state sweep: source chunks folded per block
    int features;          // decode: feature rows of the state (8 · tiles)
};

namespace attn {

// ṽ = [v, 1] has M = D + 1 columns (values and the denominator), padded to MP for whole mma steps.
template <int D> struct TaylorDims {
    static constexpr int M = D + 1;
    static constexpr int MP = (M + 15) / 16 * 16;
};

// Chunk length C of the state sweep (sources folded at a time; the dense part of a probe covers the
// fewer than C sources past its boundary ⌊hi/C⌋·C) and feature tiles NT per slab, per head dim.
// Specialisations only: an unsupported head dim does not compile. Mirrored by taylor::heuristics.
template <int D> struct TaylorTile;
template <> struct TaylorTile<16> { static constexpr int C = 64, NT = 28; };
template <> struct TaylorTile<32> { static constexpr int C = 64, NT = 16; };
template <> struct TaylorTile<64> { static constexpr int C = 64, NT = 16; };
template <> struct TaylorTile<128> { static constexpr int C = 32, NT = 8; };

constexpr int kTaylorThreads = 128;
constexpr int kTaylorWarps = 4;

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

// ∂/∂z_d of Σ_e ψ_e(z) T_e over one tile (T: the tile's 8 entries of S·w).
__device__ __forceinline__ float probe_feature_grad(FeatureTile ft, int d, const float* z, const float* T, float a1,
                                                    float a2) {
    float g = 0.f;
    if (ft.kind == kTileLinear) {
        if (d >= ft.b0 && d < ft.b0 + 8) g = a1 * T[d - ft.b0];
    } else if (ft.kind == kTileQuad) {
        if (d == ft.a) {
#pragma unroll
            for (int e = 0; e < 8; ++e) g += quad_weight(ft.a, ft.b0 + e) * z[ft.b0 + e] * T[e];
        }
        if (d >= ft.b0 && d < ft.b0 + 8) g += quad_weight(ft.a, d) * z[ft.a] * T[d - ft.b0];
        g *= a2;
    }
    return g;
}

__device__ __forceinline__ float taylor_f(const TaylorParams& tp, float s) { return tp.a0 + s * (tp.a1 + tp.a2 * s); }
__device__ __forceinline__ float taylor_df(const TaylorParams& tp, float s) { return tp.a1 + 2.f * tp.a2 * s; }

__device__ __forceinline__ float taylor_warp_sum(float x) {
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

// One (batch entry, kv head) of a sweep: sizes, rows and the prefix length hi_p of every probe.
struct TaylorSweep {
    SeqInfo si;
    int group, n_s, n_p;
    long long src0, probe0;
    bool rev;

    __device__ __forceinline__ TaylorSweep(const TaylorParams& tp, int b, int hk) : si(tp.base, b) {
        group = tp.base.group;
        rev = tp.reverse != 0;
        const long long key0 = taylor_key_row(tp.base, si, hk, 0);
        const long long query0 = taylor_query_row(tp.base, si, hk, 0, 0);
        if (!rev) {
            n_s = si.len_k;
            n_p = group * si.len_q;
            src0 = key0;
            probe0 = query0;
        } else {
            n_s = group * si.len_q;
            n_p = si.len_k;
            src0 = query0;
            probe0 = key0;
        }
    }
    // Scratch row of source s / probe p (reverse: the last row first).
    __device__ __forceinline__ long long src_row(int s) const { return rev ? src0 + (n_s - 1 - s) : src0 + s; }
    __device__ __forceinline__ long long probe_row(int p) const { return rev ? probe0 + (n_p - 1 - p) : probe0 + p; }
    // Sources probe p sees: keys [0, key_hi(i)) of query i = p / G; or, reversed, the G·(len_q − i0(j)) query
    // rows of the queries i ≥ i0(j) that see key j = len_k − 1 − p.
    __device__ __forceinline__ int hi(const AttnParams& p, int pr) const {
        if (!rev) return si.key_hi(p, pr / group);
        const int j = n_p - 1 - pr;
        const int i0 = p.causal != 0 ? min(max(j - si.diag, 0), si.len_q) : 0;
        return group * (si.len_q - i0);
    }
    // First probe with hi ≥ x (n_p if none); hi is nondecreasing in p.
    __device__ __forceinline__ int first_probe(const AttnParams& p, int x) const {
        int lo = 0, up = n_p;
        while (lo < up) {
            const int mid = (lo + up) / 2;
            if (hi(p, mid) >= x) up = mid;
            else lo = mid + 1;
        }
        return lo;
    }
};

// Copy ROWS rows of `width` f32 values (rows `row(r)` of `src`, r < valid) into a shared tile of T with row
// stride LD, zero-filling columns [width, COLS) and rows ≥ valid.
template <typename T, int ROWS, int COLS, int LD, class RowFn>
__device__ __forceinline__ void load_rows_f32(T* dst, const float* src, int width, int valid, RowFn row, int tid) {
    for (int idx = tid; idx < ROWS * COLS; idx += kTaylorThreads) {
        const int r = idx / COLS, c = idx % COLS;
        float v = 0.f;
        if (r < valid && c < width) v = src[row(r) * width + c];
        dst[r * LD + c] = from_f32<T>(v);
    }
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

// The dynamic shared memory this launch got: a launch with less than a kernel's layout traps instead of
// writing past it.
__device__ __forceinline__ unsigned dynamic_smem_bytes() {
    unsigned n;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
    return n;
}

}  // namespace attn
