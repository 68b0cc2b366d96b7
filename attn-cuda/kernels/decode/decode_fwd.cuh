// Split-KV decode forward (docs/kernels/decode.md). One block per (key chunk, row tile, kv head,
// sequence): the g = Hq/Hkv query heads that read one kv head, times the few queries of the call,
// are the rows of one 16-row tile (row r = query r / g of head hk·g + r % g), so each K/V tile is read
// once for all of them. Each of the block's 4 warps streams its own 16-key tiles of the chunk (warp w
// takes tiles w, w + 4, ...: the warps read neighbouring keys at the same time) through its own ring
// of kStages K/V stages, with no block barrier inside the key loop: on sm_90 at D >= 128 (where the
// host sets `bulk`) one bulk copy per lane and tile (lanes 0–15 the K rows, 16–31 the V rows)
// completing on the stage's mbarrier, elsewhere coalesced 16-byte cp.async. Per tile: S = Q·Kᵀ on mma.sync m16n8k16 (Q's fragments held in
// registers up to D = 128), the score and mask (skipped on tiles every row sees whole), the online
// softmax in base 2 (o rescaled only when a row max moved), then P·V with P straight from registers.
// The warps merge their (max, sum, o) through shared memory at the end. With one chunk the block
// writes o and the LSE; with S chunks it writes its partial o (f32, normalised within the chunk) and
// LSE into the workspace, and decode_combine merges them through the LSEs.
#pragma once
#include "../common/mma.h"
#include "decode_params.h"
#include "decode_score.h"

namespace attn_decode {

using namespace attn;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 16;            // rows of the tile (one mma M)
constexpr int kWarpKeys = 16;        // keys of one warp's K/V tile
constexpr int kKeys = kWarpKeys * kWarps;  // keys the block's warps take per round: the chunk unit
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D> struct Cfg {
    static constexpr int ld = D + 8;  // padded smem row: ldmatrix rows hit distinct bank groups
    // Stages per warp ring (plan::stages): H200, bf16, Nq = 1 (docs/kernels/decode.md): at D = 128
    // three stages (two blocks per SM) beat two (three blocks per SM); at D = 64 two stages keep
    // four blocks per SM and beat three.
    static constexpr int kStages = (D == 64 || D >= 256) ? 2 : 3;
    // Blocks per SM the registers are capped for (__launch_bounds__): four at D ≤ 64 (what the
    // shared memory allows there), two at D = 96 and 128 (their shared-memory limit).
    static constexpr int kMinBlocks = D <= 64 ? 4 : (D <= 128 ? 2 : 1);
    static constexpr int kTileElems = kWarpKeys * ld;  // one warp's K (or V) tile
    static constexpr int kRingElems = kWarps * kStages * 2 * kTileElems;
    // Q tile, then the warps' rings; the f32 per-row scalars and merge maxima and sums after them;
    // then one mbarrier per (warp, stage), 8-byte aligned.
    static constexpr int kElems = kRows * ld + kRingElems;
    static constexpr int kFloats = kRows + 2 * kWarps * kRows;
    static constexpr int kBarsAt = (kElems * 2 + kFloats * 4 + 7) / 8 * 8;
    static constexpr int kBytes = kBarsAt + kWarps * kStages * 8;
    // The merge reuses the rings for kWarps × 16 × D floats.
    static_assert(kWarps * kRows * D * 4 <= kRingElems * 2, "merge scratch fits the rings");
};

// The keys of the sequence query i may attend to: [lo, hi) (AttnSpec::key_range).
struct Mask {
    int len_k, diag;
    __device__ __forceinline__ int lo(const DecodeParams& p, int i) const {
        int l = 0;
        if (p.window_left >= 0) l = max(l, i + diag - p.window_left);
        return min(l, len_k);
    }
    __device__ __forceinline__ int hi(const DecodeParams& p, int i) const {
        const int d = i + diag;
        int h = len_k;
        if (p.causal != 0) h = min(h, d + 1);
        if (p.window_right >= 0) h = min(h, d + p.window_right + 1);
        h = max(h, 0);
        return max(h, lo(p, i));
    }
};

__device__ __forceinline__ int key_len(const DecodeParams& p, int b) {
    return p.key_lens ? p.key_lens[b] + p.key_len_add : p.seq_k;
}

// Element offset of key row j of sequence b, kv head hk (contiguous strides, or through the block
// table of a paged cache).
__device__ __forceinline__ long long kv_row(const DecodeParams& p, int b, int j, long long sb, long long ss,
                                            long long sh, int hk) {
    if (p.page_size) {
        const long long page = p.block_table[(long long)b * p.pages_per_seq + (j >> p.page_shift)];
        return (page * p.page_size + (j & (p.page_size - 1))) * ss + (long long)hk * sh;
    }
    return (long long)b * sb + (long long)j * ss + (long long)hk * sh;
}

// One warp's tile: keys [j0, j0 + 16) of K and V (rows at or past j_stop zero-filled) into its stage
// by cp.async, consecutive lanes on consecutive 16-byte pieces of a row. j0 is a multiple of 16 and
// pages hold at least 16 slots (a power of two), so the tile's rows are consecutive slots of one page:
// the block table is read once per tile, and row r sits r sequence strides past row j0.
template <typename T, int D>
__device__ __forceinline__ void load_tile(const DecodeParams& p, T* sk, T* sv, int b, int hk, int j0, int j_stop,
                                          int lane) {
    constexpr int kChunks = D * 2 / 16;  // 16-byte pieces per row
    constexpr int ld = Cfg<D>::ld;
    const T* k = static_cast<const T*>(p.k);
    const T* v = static_cast<const T*>(p.v);
    const bool any = j0 < j_stop;
    const T* k0 = any ? k + kv_row(p, b, j0, p.k_batch, p.k_seq, p.k_head, hk) : k;
    const T* v0 = any ? v + kv_row(p, b, j0, p.v_batch, p.v_seq, p.v_head, hk) : v;
#pragma unroll
    for (int c = lane; c < kWarpKeys * kChunks; c += 32) {
        const int r = c / kChunks, col = (c % kChunks) * 8;
        const bool valid = j0 + r < j_stop;
        const T* ks = k;
        const T* vs = v;
        if (valid) {
            ks = k0 + (long long)r * p.k_seq + col;
            vs = v0 + (long long)r * p.v_seq + col;
        }
        cp_async_16(sk + r * ld + col, ks, valid);
        cp_async_16(sv + r * ld + col, vs, valid);
    }
}

// The bulk-copy ring (sm_90): each stage has an mbarrier whose phase completes once its tile's bytes
// have landed. Compiled to nothing below sm_90, where `bulk` is never set.
__device__ __forceinline__ void bar_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
#endif
}
// The initialised barriers visible to the async proxy (the copies' complete-tx), before the block
// barrier that publishes them to the other threads.
__device__ __forceinline__ void bar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// The stage's one arrival, announcing `bytes` of copies (issued after it, so the count never
// goes below zero).
__device__ __forceinline__ void bar_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
#endif
}
__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t addr = smem_addr(bar);
    uint32_t done = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(addr), "r"(parity)
                     : "memory");
    } while (!done);
#endif
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
#endif
}
__device__ __forceinline__ void fence_proxy_async_smem() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// One warp's tile by bulk copies, one row per lane (lanes 0–15 K, 16–31 V), completing on `bar`;
// lane 0 announces the valid rows' bytes first. Rows at or past j_stop are zeroed by their lane (and
// fenced for the bulk copies that later reuse the stage).
template <typename T, int D>
__device__ __forceinline__ void load_tile_bulk(const DecodeParams& p, T* sk, T* sv, int b, int hk, int j0,
                                               int j_stop, int lane, uint64_t* bar) {
    constexpr int ld = Cfg<D>::ld;
    const int r = lane & (kWarpKeys - 1);
    const bool is_v = lane >= kWarpKeys;
    const int j = j0 + r;
    T* dst = (is_v ? sv : sk) + r * ld;
    if (lane == 0) bar_expect(bar, (uint32_t)max(0, min(j_stop - j0, kWarpKeys)) * (uint32_t)(D * 2 * 2));
    __syncwarp();  // the expect before any copy completes
    if (j < j_stop) {
        const T* base = static_cast<const T*>(is_v ? p.v : p.k);
        const long long off = is_v ? kv_row(p, b, j, p.v_batch, p.v_seq, p.v_head, hk)
                                   : kv_row(p, b, j, p.k_batch, p.k_seq, p.k_head, hk);
        bulk_copy(dst, base + off, D * 2, bar);
    } else {
#pragma unroll
        for (int c = 0; c < D * 2 / 16; ++c) reinterpret_cast<uint4*>(dst)[c] = make_uint4(0u, 0u, 0u, 0u);
        fence_proxy_async_smem();
    }
}

// kPlain: softmax without softcap (the score is scale·q·k; no key or query scalars).
template <typename T, int D, bool kPlain>
__device__ __forceinline__ void decode_fwd_body(const DecodeParams& p) {
    using C = Cfg<D>;
    constexpr int ld = C::ld;
    constexpr int kSt = C::kStages;
    constexpr bool kQRegs = D <= 128;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sq = reinterpret_cast<T*>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    T* ring = sq + kRows * ld + warp * kSt * 2 * C::kTileElems;
    float* s_rows = reinterpret_cast<float*>(sq + C::kElems);
    float* s_keys = s_rows + kRows;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem_raw + C::kBarsAt) + warp * kSt;
    const int split = blockIdx.x / p.row_tiles, tile = blockIdx.x % p.row_tiles;
    const int hk = blockIdx.y, b = blockIdx.z;
    const int g = p.group;
    const int rows = p.seq_q * g;
    const int r0 = tile * kRows;
    Mask m;
    m.len_k = key_len(p, b);
    m.diag = p.causal == 1 ? 0 : m.len_k - p.seq_q;
    const int i_first = r0 / g, i_last = (min(r0 + kRows, rows) - 1) / g;
    const int blk_lo = m.lo(p, i_first), blk_hi = m.hi(p, i_last);
    // Keys every row of the block sees: [all_lo, all_hi).
    const int all_lo = m.lo(p, i_last), all_hi = m.hi(p, i_first);
    const int chunk_lo = split * p.chunk;
    const int chunk_hi = min(chunk_lo + p.chunk, p.seq_k);
    const int j_stop = min(chunk_hi, blk_hi);
    const int j_start = blk_lo > chunk_lo ? chunk_lo + (blk_lo - chunk_lo) / kWarpKeys * kWarpKeys : chunk_lo;
    const int n_all = j_stop > j_start ? (j_stop - j_start + kWarpKeys - 1) / kWarpKeys : 0;
    const int n_tiles = n_all > warp ? (n_all - warp + kWarps - 1) / kWarps : 0;
    const bool bulk = p.bulk != 0;
    {
        const T* q = static_cast<const T*>(p.q);
        constexpr int kChunks = D * 2 / 16;
        for (int c = tid; c < kRows * kChunks; c += kThreads) {
            const int rr = c / kChunks, col = (c % kChunks) * 8;
            const int r = r0 + rr;
            const bool valid = r < rows;
            const T* src = q;
            if (valid) {
                const int i = r / g, h = hk * g + r % g;
                src = q + (long long)b * p.q_batch + (long long)i * p.q_seq + (long long)h * p.q_head + col;
            }
            cp_async_16(sq + rr * ld + col, src, valid);
        }
        cp_async_commit();
    }
    if (bulk) {
        if (lane == 0) {
            for (int s = 0; s < kSt; ++s) bar_init(&bars[s]);
            bar_init_fence();
        }
        __syncwarp();
        for (int s = 0; s < kSt - 1 && s < n_tiles; ++s)
            load_tile_bulk<T, D>(p, ring + 2 * s * C::kTileElems, ring + (2 * s + 1) * C::kTileElems, b, hk,
                               j_start + (s * kWarps + warp) * kWarpKeys, j_stop, lane, &bars[s]);
    } else {
#pragma unroll
        for (int s = 0; s < kSt - 1; ++s) {
            if (s < n_tiles)
                load_tile<T, D>(p, ring + 2 * s * C::kTileElems, ring + (2 * s + 1) * C::kTileElems, b, hk,
                                 j_start + (s * kWarps + warp) * kWarpKeys, j_stop, lane);
            cp_async_commit();
        }
    }
    if (bulk)
        cp_async_wait<0>();  // Q (the tiles complete on their barriers)
    else
        cp_async_wait<kSt - 1>();  // Q (the tiles' groups may still be in flight)
    __syncthreads();  // Q visible to every warp
    const bool norms = needs_norms(p);
    const int gr = lane >> 2, tq = lane & 3;
    float qs[2] = {1.f, 1.f};
    if (norms) {
        const int rr = tid >> 3, part = tid & 7;
        float a = 0.f;
        if (rr < kRows)
            for (int d = part; d < D; d += 8) {
                const float x = to_f32(sq[rr * ld + d]);
                a += x * x;
            }
#pragma unroll
        for (int off = 4; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
        if (part == 0 && rr < kRows) s_rows[rr] = row_scalar(p, a);
        __syncthreads();
        qs[0] = s_rows[gr];
        qs[1] = s_rows[gr + 8];
    }
    uint32_t qa[kQRegs ? D / 16 : 1][4];
    if constexpr (kQRegs) {
#pragma unroll
        for (int kd = 0; kd < D / 16; ++kd) load_a<T>(qa[kd], sq, ld, 0, kd * 16, lane);
    }
    int lo_r[2], hi_r[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        const int r = r0 + gr + 8 * x;
        if (r < rows) {
            lo_r[x] = m.lo(p, r / g);
            hi_r[x] = m.hi(p, r / g);
        } else {
            lo_r[x] = hi_r[x] = 0;
        }
    }
    const float qk_scale = p.scale * kLog2e;
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float mx[2] = {-INFINITY, -INFINITY};
    float sum[2] = {0.f, 0.f};
    for (int n = 0; n < n_tiles; ++n) {
        const int nl = n + kSt - 1;
        const int sl = nl % kSt;
        const int st = n % kSt;
        if (bulk) {
            bar_wait(&bars[st], (uint32_t)(n / kSt) & 1u);
            __syncwarp();  // every lane done with tile n - 1 (the stage refilled below)
            fence_proxy_async_smem();
            if (nl < n_tiles)
                load_tile_bulk<T, D>(p, ring + 2 * sl * C::kTileElems, ring + (2 * sl + 1) * C::kTileElems, b, hk,
                                   j_start + (nl * kWarps + warp) * kWarpKeys, j_stop, lane, &bars[sl]);
        } else {
            cp_async_wait<kSt - 2>();
            __syncwarp();
            if (nl < n_tiles)
                load_tile<T, D>(p, ring + 2 * sl * C::kTileElems, ring + (2 * sl + 1) * C::kTileElems, b, hk,
                                 j_start + (nl * kWarps + warp) * kWarpKeys, j_stop, lane);
            cp_async_commit();
        }
        const T* sk = ring + 2 * st * C::kTileElems;
        const T* sv = ring + (2 * st + 1) * C::kTileElems;
        const int j0 = j_start + (n * kWarps + warp) * kWarpKeys;
        float ks[4] = {1.f, 1.f, 1.f, 1.f};
        float lg[4] = {0.f, 0.f, 0.f, 0.f};
        if (!kPlain && (norms || p.midpoint)) {
            const int kk = lane >> 1, half = lane & 1;
            float a = 0.f, c = 0.f;
            for (int d = half; d < D; d += 2) {
                const float x = to_f32(sk[kk * ld + d]);
                a += x * x;
                if (p.midpoint) {
                    const float y = to_f32(sv[kk * ld + d]);
                    c += y * y;
                }
            }
            a += __shfl_xor_sync(0xffffffffu, a, 1);
            c += __shfl_xor_sync(0xffffffffu, c, 1);
            const float kv_s = row_scalar(p, a);
            const float kv_g = p.midpoint ? log_gamma(p, c) : 0.f;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = (e >> 1) * 8 + 2 * tq + (e & 1);
                ks[e] = __shfl_sync(0xffffffffu, kv_s, 2 * key);
                lg[e] = __shfl_sync(0xffffffffu, kv_g, 2 * key);
            }
        }
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kd = 0; kd < D / 16; ++kd) {
            uint32_t bb[4];
            load_b_nk<T>(bb, sk, ld, 0, kd * 16, lane);
            if constexpr (kQRegs) {
                mma16816<T>(s[0], qa[kd], bb[0], bb[1]);
                mma16816<T>(s[1], qa[kd], bb[2], bb[3]);
            } else {
                uint32_t a[4];
                load_a<T>(a, sq, ld, 0, kd * 16, lane);
                mma16816<T>(s[0], a, bb[0], bb[1]);
                mma16816<T>(s[1], a, bb[2], bb[3]);
            }
        }
        const bool whole = j0 >= all_lo && j0 + kWarpKeys <= all_hi && j0 + kWarpKeys <= chunk_hi;
        float mnew[2] = {mx[0], mx[1]};
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int x = e >> 1;
                const int kc = t * 2 + (e & 1);
                float v;
                if constexpr (kPlain)
                    v = s[t][e] * qk_scale;  // softmax without softcap: scale·q·k in log2 units
                else
                    v = (score(p, s[t][e], qs[x], ks[kc]) + lg[kc]) * kLog2e;
                if (!whole) {
                    const int j = j0 + t * 8 + 2 * tq + (e & 1);
                    if (j < lo_r[x] || j >= hi_r[x] || j >= chunk_hi) v = -INFINITY;
                }
                s[t][e] = v;
                mnew[x] = nan_max(mnew[x], v);
            }
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            mnew[x] = nan_max(mnew[x], __shfl_xor_sync(0xffffffffu, mnew[x], 1));
            mnew[x] = nan_max(mnew[x], __shfl_xor_sync(0xffffffffu, mnew[x], 2));
        }
        float alpha[2], base[2];
        bool moved = false;
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            base[x] = mnew[x] == -INFINITY ? 0.f : mnew[x];
            alpha[x] = exp2f(mx[x] - base[x]);
            moved |= !(alpha[x] == 1.f);
            mx[x] = mnew[x];
            sum[x] *= alpha[x];
        }
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int x = e >> 1;
                s[t][e] = exp2f(s[t][e] - base[x]);
                sum[x] += s[t][e];
            }
        if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
            for (int nd = 0; nd < D / 8; ++nd) {
                o[nd][0] *= alpha[0];
                o[nd][1] *= alpha[0];
                o[nd][2] *= alpha[1];
                o[nd][3] *= alpha[1];
            }
        }
        uint32_t pa[4];
        pack_a<T>(pa, s[0], s[1]);
#pragma unroll
        for (int dn = 0; dn < D / 16; ++dn) {
            uint32_t bb[4];
            load_b_kn<T>(bb, sv, ld, 0, dn * 16, lane);
            mma16816<T>(o[2 * dn], pa, bb[0], bb[1]);
            mma16816<T>(o[2 * dn + 1], pa, bb[2], bb[3]);
        }
    }
    if (!bulk) cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        sum[x] += __shfl_xor_sync(0xffffffffu, sum[x], 1);
        sum[x] += __shfl_xor_sync(0xffffffffu, sum[x], 2);
    }
    float* s_m = s_keys;
    float* s_l = s_keys + kWarps * kRows;
    float* s_o = reinterpret_cast<float*>(sq + kRows * ld);
    if (tq == 0) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            s_m[warp * kRows + gr + 8 * x] = mx[x];
            s_l[warp * kRows + gr + 8 * x] = sum[x];
        }
    }
    __syncthreads();
    float f[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        const int row = gr + 8 * x;
        float mm = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) mm = nan_max(mm, s_m[w * kRows + row]);
        const float bse = mm == -INFINITY ? 0.f : mm;
        f[x] = exp2f(mx[x] - bse);
    }
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
        const int col = nd * 8 + 2 * tq;
        float* dst = s_o + (warp * kRows + gr) * D + col;
        dst[0] = o[nd][0] * f[0];
        dst[1] = o[nd][1] * f[0];
        dst[8 * D] = o[nd][2] * f[1];
        dst[8 * D + 1] = o[nd][3] * f[1];
    }
    __syncthreads();
    const bool direct = p.splits == 1;
    constexpr int kPerRow = kThreads / kRows;
    const int rr = tid / kPerRow, part = tid % kPerRow;
    const int r = r0 + rr;
    if (r < rows) {
        const int i = r / g, h = hk * g + r % g;
        float mm = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) mm = nan_max(mm, s_m[w * kRows + rr]);
        const float bse = mm == -INFINITY ? 0.f : mm;
        float l = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) l += s_l[w * kRows + rr] * exp2f(s_m[w * kRows + rr] - bse);
        const bool empty = mm == -INFINITY || l == 0.f;
        const float inv = empty ? 0.f : 1.f / l;
        const float lse = empty ? -INFINITY : (mm + log2f(l)) * kLn2;
        const long long stat = ((long long)b * p.heads_q + h) * p.seq_q + i;
        if (direct) {
            T* out = static_cast<T*>(p.o) + (long long)b * p.o_batch + (long long)i * p.o_seq + (long long)h * p.o_head;
            for (int c = part * 2; c < D; c += kPerRow * 2) {
                float a0 = 0.f, a1 = 0.f;
#pragma unroll
                for (int w = 0; w < kWarps; ++w) {
                    a0 += s_o[(w * kRows + rr) * D + c];
                    a1 += s_o[(w * kRows + rr) * D + c + 1];
                }
                *reinterpret_cast<uint32_t*>(out + c) = pack2<T>(a0 * inv, a1 * inv);
            }
            if (part == 0) p.lse[stat] = lse;
        } else {
            const long long row = (long long)split * p.batch * p.heads_q * p.seq_q + stat;
            float* out = p.ws_o + row * D;
            for (int c = part * 2; c < D; c += kPerRow * 2) {
                float a0 = 0.f, a1 = 0.f;
#pragma unroll
                for (int w = 0; w < kWarps; ++w) {
                    a0 += s_o[(w * kRows + rr) * D + c];
                    a1 += s_o[(w * kRows + rr) * D + c + 1];
                }
                *reinterpret_cast<float2*>(out + c) = make_float2(a0 * inv, a1 * inv);
            }
            if (part == 0) p.ws_lse[row] = lse;
        }
    }
}
// The forward, with the plain softmax score (no softcap, no row scalars) compiled apart.
template <typename T, int D>
__device__ __forceinline__ void decode_fwd(const DecodeParams& p) {
    const bool plain = p.score == kSoftmax && p.softcap == 0.f;
    if (plain)
        decode_fwd_body<T, D, true>(p);
    else
        decode_fwd_body<T, D, false>(p);
}
// Merge the S partial outputs of each row through their LSEs: LSE = M + log Σ_s exp(LSE_s − M),
// o = Σ_s exp(LSE_s − LSE)·o_s; a row whose every chunk is empty is zeros with LSE −∞. One block per
// row (b, h, i): the S LSEs into shared memory and their max and sum over the block, then each
// thread sums its columns over the chunks with independent loads (the weights from shared memory).
constexpr int kMaxSplits = 1024;  // decode::plan::MAX_SPLITS

__device__ __forceinline__ float block_reduce(float x, bool is_max, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float y = __shfl_xor_sync(0xffffffffu, x, off);
        x = is_max ? nan_max(x, y) : x + y;
    }
    __syncthreads();  // `red` is free (a previous reduction's readers are done)
    if (lane == 0) red[warp] = x;
    __syncthreads();
    x = red[0];
    for (int w = 1; w < warps; ++w) x = is_max ? nan_max(x, red[w]) : x + red[w];
    return x;
}

template <typename T>
__device__ __forceinline__ void decode_combine(const DecodeParams& p) {
    __shared__ float s_w[kMaxSplits];
    __shared__ float red[32];
    const long long rows = (long long)p.batch * p.heads_q * p.seq_q;
    const long long stat = blockIdx.x;
    const int S = min(p.splits, kMaxSplits);
    float mm = -INFINITY;
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const float l = p.ws_lse[(long long)s * rows + stat];
        s_w[s] = l;
        mm = nan_max(mm, l);
    }
    mm = block_reduce(mm, true, red);
    const float bse = mm == -INFINITY ? 0.f : mm;
    float l = 0.f;
    for (int s = threadIdx.x; s < S; s += blockDim.x) l += expf(s_w[s] - bse);
    l = block_reduce(l, false, red);
    const bool empty = mm == -INFINITY || l == 0.f;
    const float lse = empty ? -INFINITY : bse + logf(l);
    // Each thread turns the LSEs it read into weights (an empty chunk: 0; its o is zeros).
    for (int s = threadIdx.x; s < S; s += blockDim.x) s_w[s] = s_w[s] == -INFINITY ? 0.f : expf(s_w[s] - lse);
    __syncthreads();
    const int i = (int)(stat % p.seq_q);
    const int h = (int)((stat / p.seq_q) % p.heads_q);
    const int b = (int)(stat / ((long long)p.seq_q * p.heads_q));
    const int dv = p.head_dim_v;
    T* out = static_cast<T*>(p.o) + (long long)b * p.o_batch + (long long)i * p.o_seq + (long long)h * p.o_head;
    const float* src = p.ws_o + stat * dv;
    const long long step = rows * dv;  // one chunk's rows
    for (int c = threadIdx.x; c < dv; c += blockDim.x) {
        float acc = 0.f;
#pragma unroll 8
        for (int s = 0; s < S; ++s) acc += s_w[s] * src[(long long)s * step + c];
        out[c] = from_f32<T>(empty ? 0.f : acc);
    }
    if (threadIdx.x == 0) p.lse[stat] = lse;
}

// Append k_new, v_new of sequence b at cache positions key_lens[b] + t (t < new_tokens), kv head
// blockIdx.y, token blockIdx.x: 4-byte words (rows are whole words: head dims are even).
__device__ __forceinline__ void kv_append(const DecodeParams& p, int elem_bytes) {
    const int t = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int j = p.key_lens[b] + t;
    const long long es = elem_bytes;
    const long long kd = kv_row(p, b, j, p.k_batch, p.k_seq, p.k_head, hk) * es;
    const long long vd = kv_row(p, b, j, p.v_batch, p.v_seq, p.v_head, hk) * es;
    const long long ks = ((long long)b * p.kn_batch + (long long)t * p.kn_seq + (long long)hk * p.kn_head) * es;
    const long long vs = ((long long)b * p.vn_batch + (long long)t * p.vn_seq + (long long)hk * p.vn_head) * es;
    const int kw = p.head_dim * elem_bytes / 4, vw = p.head_dim_v * elem_bytes / 4;
    const unsigned char* kn = static_cast<const unsigned char*>(p.k_new);
    const unsigned char* vn = static_cast<const unsigned char*>(p.v_new);
    unsigned char* kc = static_cast<unsigned char*>(p.k_cache);
    unsigned char* vc = static_cast<unsigned char*>(p.v_cache);
    for (int w = threadIdx.x; w < kw; w += blockDim.x)
        reinterpret_cast<uint32_t*>(kc + kd)[w] = reinterpret_cast<const uint32_t*>(kn + ks)[w];
    for (int w = threadIdx.x; w < vw; w += blockDim.x)
        reinterpret_cast<uint32_t*>(vc + vd)[w] = reinterpret_cast<const uint32_t*>(vn + vs)[w];
}

}  // namespace attn_decode
