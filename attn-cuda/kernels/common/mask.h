// Per-batch-entry lengths, row offsets and the mask, the device image of AttnSpec::seq_lens,
// AttnSpec::key_range and the *_offset functions (attn-core owns the definitions; this mirrors
// them exactly). The keys query i may attend to are one contiguous range [key_lo(i), key_hi(i)),
// and both ends are non-decreasing in i, which is what lets a tile decide "fully allowed",
// "partly allowed" or "skip" from its corners.
#pragma once
#include "params.h"

struct SeqInfo {
    int b;
    int len_q, len_k;
    long long row_q, row_k;  // first packed row (varlen), else 0
    int diag;                // query i sits on key i + diag
    bool varlen;

    __device__ __forceinline__ SeqInfo(const AttnParams& p, int b_) : b(b_) {
        varlen = p.cu_q != nullptr;
        if (varlen) {
            row_q = p.cu_q[b];
            len_q = p.cu_q[b + 1] - p.cu_q[b];
            row_k = p.cu_k[b];
            len_k = p.cu_k[b + 1] - p.cu_k[b];
        } else {
            row_q = 0;
            row_k = 0;
            len_q = p.seq_q;
            len_k = p.key_lens ? p.key_lens[b] : p.seq_k;
        }
        diag = p.causal == 1 ? 0 : len_k - len_q;
    }

    __device__ __forceinline__ long long off(long long sb, long long ss, long long sh, long long row0, int n,
                                             int h) const {
        return varlen ? (row0 + n) * ss + (long long)h * sh : (long long)b * sb + (long long)n * ss + (long long)h * sh;
    }
    __device__ __forceinline__ long long q_off(const AttnParams& p, int i, int h) const {
        return off(p.q_batch, p.q_seq, p.q_head, row_q, i, h);
    }
    __device__ __forceinline__ long long k_off(const AttnParams& p, int j, int hk) const {
        return off(p.k_batch, p.k_seq, p.k_head, row_k, j, hk);
    }
    __device__ __forceinline__ long long v_off(const AttnParams& p, int j, int hk) const {
        return off(p.v_batch, p.v_seq, p.v_head, row_k, j, hk);
    }
    __device__ __forceinline__ long long o_off(const AttnParams& p, int i, int h) const {
        return off(p.o_batch, p.o_seq, p.o_head, row_q, i, h);
    }
    __device__ __forceinline__ long long dq_off(const AttnParams& p, int i, int h) const {
        return off(p.dq_batch, p.dq_seq, p.dq_head, row_q, i, h);
    }
    // dq_acc of the warp-specialised fused backward (p.dq_acc_tiled): column c of query i of head h at
    // ((c / 64)·stats_len + stats_index(h, i))·64 + (((c % 64) / 8) ^ (i % 8))·8 + c % 8. For each
    // 64-column half, the rows of a (head, sequence) follow each other as in the statistics layout, so
    // 16 rows × 64 columns are one contiguous 4 KiB run (one bulk reduction per warp), and the 8-float
    // chunks of a row are swizzled by i % 8 so that the kernel's fragment stores into its shared copy
    // hit distinct banks. The dq row kernels read it back (dq_acc_at).
    __device__ __forceinline__ long long dq_acc_index(const AttnParams& p, int h, int i, int c) const {
        const long long stats_len = (long long)p.total_q * p.heads_q;
        return ((c >> 6) * stats_len + stats_index(p, h, i)) * 64 + ((((c & 63) >> 3) ^ (i & 7)) << 3) + (c & 7);
    }
    // Element c of query i's dQ in p.dq_acc, whichever layout it has (`off`: the row's dq offset).
    __device__ __forceinline__ float dq_acc_at(const AttnParams& p, int h, int i, long long off, int c) const {
        return p.dq_acc_tiled ? p.dq_acc[dq_acc_index(p, h, i, c)] : p.dq_acc[off + c];
    }
    __device__ __forceinline__ long long dk_off(const AttnParams& p, int j, int hk) const {
        return off(p.dk_batch, p.dk_seq, p.dk_head, row_k, j, hk);
    }
    __device__ __forceinline__ long long dv_off(const AttnParams& p, int j, int hk) const {
        return off(p.dv_batch, p.dv_seq, p.dv_head, row_k, j, hk);
    }
    // AttnSpec::stats_index.
    __device__ __forceinline__ long long stats_index(const AttnParams& p, int h, int i) const {
        return varlen ? (long long)h * p.total_q + row_q + i : ((long long)b * p.heads_q + h) * p.seq_q + i;
    }
    // AttnSpec::bias_index (the bias is never combined with varlen).
    __device__ __forceinline__ long long bias_index(const AttnParams& p, int h, int i, int j) const {
        const int bb = p.bias_batch == 1 ? 0 : b;
        const int bh = p.bias_heads == 1 ? 0 : h;
        return (((long long)bb * p.bias_heads + bh) * p.seq_q + i) * p.seq_k + j;
    }
    // Per-key-row scalars (hyperbolic k0, ‖k‖, log γ): [Hkv, total_k] packed, else [B, Hkv, Nk],
    // contiguous along j so a key tile's scalars are one run of memory.
    __device__ __forceinline__ long long key_index(const AttnParams& p, int hk, int j) const {
        return varlen ? (long long)hk * p.total_k + row_k + j : ((long long)b * p.heads_kv + hk) * p.seq_k + j;
    }
    // Index into the full [B, Hq, Nq, Nk] dS scratch.
    __device__ __forceinline__ long long ds_index(const AttnParams& p, int h, int i, int j) const {
        return (((long long)b * p.heads_q + h) * p.seq_q + i) * p.seq_k + j;
    }

    // Key rows of this batch entry that dk and dv hold: the packed length, or all seq_k rows under
    // key padding (rows past key_lens[b] get zero gradients, so they must still be written).
    __device__ __forceinline__ int key_rows(const AttnParams& p) const { return varlen ? len_k : p.seq_k; }

    // AttnSpec::key_range(b, i) = [key_lo, key_hi).
    __device__ __forceinline__ int key_lo(const AttnParams& p, int i) const {
        int lo = 0;
        if (p.window_left >= 0) lo = max(lo, i + diag - p.window_left);
        return min(lo, len_k);
    }
    __device__ __forceinline__ int key_hi(const AttnParams& p, int i) const {
        const int d = i + diag;
        int hi = len_k;
        if (p.causal != 0) hi = min(hi, d + 1);
        if (p.window_right >= 0) hi = min(hi, d + p.window_right + 1);
        hi = max(hi, 0);
        return max(hi, key_lo(p, i));
    }
    // A superset of the queries whose key range meets keys [j0, j1): [query_lo, query_hi).
    __device__ __forceinline__ int query_lo(const AttnParams& p, int j0) const {
        int lo = 0;
        if (p.causal != 0) lo = max(lo, j0 - diag);
        if (p.window_right >= 0) lo = max(lo, j0 - diag - p.window_right);
        return min(lo, len_q);
    }
    __device__ __forceinline__ int query_hi(const AttnParams& p, int j1) const {
        int hi = len_q;
        if (p.window_left >= 0) hi = min(hi, j1 - diag + p.window_left);
        return max(hi, 0);
    }
    // True when every (i, j) of queries [i0, i1) × keys [j0, j1) is allowed and in range, so the
    // tile needs no per-element mask.
    __device__ __forceinline__ bool tile_full(const AttnParams& p, int i0, int i1, int j0, int j1) const {
        if (i1 > len_q || j1 > len_k) return false;
        return key_lo(p, i1 - 1) <= j0 && key_hi(p, i0) >= j1;
    }
};

// The query blocks of BM rows that see the keys [j0, min(j0 + BN, len_k)) of this sequence (the dK/dV
// kernels: mma.sync, wgmma, warp-specialised): the first one, m_first, and how many, m_count (0 when none
// does), from the superset [query_lo(j0), query_hi(j1)).
template <int BM, int BN>
__device__ __forceinline__ void key_tile_query_blocks(const AttnParams& p, const SeqInfo& si, int j0, int& m_first,
                                                      int& m_count) {
    const int j1 = min(j0 + BN, si.len_k);
    m_first = si.query_lo(p, j0) / BM;
    const int q_end = si.query_hi(p, j1);
    m_count = q_end > m_first * BM ? (q_end - 1) / BM - m_first + 1 : 0;
}

// The query tile m_block of the forward and dQ kernels: rows i0.. of BM, the kv head hk of query head
// h, and the key blocks [n_first, n_first + n_count) of BN keys it visits (0 when every row's key range
// is empty; both ends of the key range are non-decreasing, so the first row's lower end and the last
// row's upper end bound them). False when the tile starts past this sequence: nothing to do.
template <int BM, int BN>
__device__ __forceinline__ bool query_tile_at(const AttnParams& p, const SeqInfo& si, int h, int m_block, int& i0,
                                              int& hk, int& n_first, int& n_count) {
    i0 = m_block * BM;
    if (i0 >= si.len_q) return false;
    hk = h / p.group;
    const int i_last = min(i0 + BM, si.len_q) - 1;
    const int j_begin = si.key_lo(p, i0), j_end = si.key_hi(p, i_last);
    n_first = j_begin / BN;
    n_count = j_end > j_begin ? (j_end - 1) / BN - n_first + 1 : 0;
    return true;
}

// The work order of a flash grid: the t-th block in launch order of `tiles` tiles per (batch entry,
// head) pair, `heads` heads and `pairs` pairs in all takes batch entry b, head h and tile rank r.
// Without a causal mask every tile of a pair has the same work, and the launch order stands: tiles
// fastest, pair by pair, so the blocks at work share one or two heads' streamed rows in L2. Under a
// causal mask rank 0 has the most work (a query tile's keys, a key tile's queries) and the last rank
// the least: pair by pair, the heaviest tiles of the last pairs would start near the end of the grid
// and run on alone. So the pairs go in sections of `section` (heuristics::causal_sections: as many as
// share the L2) with the ranks slowest inside one: every pair's heaviest tile first, the lightest
// last (longest-processing-time-first, which keeps the tail short). section = 1 is pair by pair.
__device__ __forceinline__ void tile_order(const AttnParams& p, int t, int tiles, int heads, int pairs, int section,
                                           int& b, int& h, int& r) {
    int bh;
    if (p.causal == 0 || section <= 1) {
        r = t % tiles;
        bh = t / tiles;
    } else {
        const int first = t / (section * tiles) * section;  // the section's first pair
        const int count = min(section, pairs - first);
        const int i = t - first * tiles;
        r = i / count;
        bh = first + i % count;
    }
    h = bh % heads;
    b = bh / heads;
}

// This block's batch entry b, head h (query head, or kv head for key tiles) and tile of a (tiles,
// heads, batch) grid (tile_order). Query tiles (forward, dQ) count from the last under a causal mask
// (it has the most keys); key tiles (dK/dV) from the first (it has the most queries).
template <bool kQueryTiles>
__device__ __forceinline__ int grid_tile(const AttnParams& p, int& b, int& h) {
    const int t = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int r;
    tile_order(p, t, gridDim.x, gridDim.y, gridDim.y * gridDim.z, kQueryTiles ? p.section_q : p.section_k, b, h, r);
    return kQueryTiles && p.causal != 0 ? gridDim.x - 1 - r : r;
}

// The warp-specialised forward's tile t of the (query tile, head, batch) space (tile_order; the last
// query tiles first under a causal mask): batch entry b, query head h and query tile m_block.
__device__ __forceinline__ void persistent_tile(const AttnParams& p, int t, int& b, int& h, int& m_block) {
    int r;
    tile_order(p, t, p.tiles_q, p.heads_q, p.heads_q * p.batch, p.section_q, b, h, r);
    m_block = p.causal != 0 ? p.tiles_q - 1 - r : r;
}
