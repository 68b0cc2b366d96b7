// The f32 decode forward: exact f32 on the CUDA cores (tf32 tensor cores are not f32-accurate), the
// same grid, split, masks, scores and outputs as decode_fwd (decode_fwd.cuh), without its tiles:
// each of the 4 warps takes 4 rows of the block's 16 and scans the chunk's keys one at a time, its
// lanes holding D/32 columns of each row's q and o; every key's K and V row is read once per warp
// (the other warps' reads hit L1/L2). Slow next to the tensor-core kernels; it exists so that f32
// calls and f32 caches get the same results as the flash path.
#pragma once
#include "decode_fwd.cuh"

namespace attn_decode {

template <int D>
__device__ __forceinline__ void decode_fwd_simt(const DecodeParams& p) {
    constexpr int kE = (D + 31) / 32;  // columns per lane
    constexpr int kR = kRows / kWarps;  // rows per warp
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int split = blockIdx.x / p.row_tiles, tile = blockIdx.x % p.row_tiles;
    const int hk = blockIdx.y, b = blockIdx.z;
    const int g = p.group, rows = p.seq_q * g;
    Mask m;
    m.len_k = key_len(p, b);
    m.diag = p.causal == 1 ? 0 : m.len_k - p.seq_q;
    const int chunk_lo = split * p.chunk;
    const int chunk_hi = min(chunk_lo + p.chunk, p.seq_k);
    const float* q = static_cast<const float*>(p.q);
    const float* k = static_cast<const float*>(p.k);
    const float* v = static_cast<const float*>(p.v);
    const bool norms = needs_norms(p);

    float qv[kR][kE], o[kR][kE], mx[kR], sum[kR], qs[kR];
    int lo[kR], hi[kR], ii[kR], hh[kR];
    bool valid[kR];
    int j_begin = chunk_hi, j_end = chunk_lo;
#pragma unroll
    for (int x = 0; x < kR; ++x) {
        const int r = tile * kRows + warp * kR + x;
        valid[x] = r < rows;
        ii[x] = valid[x] ? r / g : 0;
        hh[x] = hk * g + (valid[x] ? r % g : 0);
        lo[x] = valid[x] ? max(m.lo(p, ii[x]), chunk_lo) : 0;
        hi[x] = valid[x] ? min(m.hi(p, ii[x]), chunk_hi) : 0;
        if (hi[x] > lo[x]) {
            j_begin = min(j_begin, lo[x]);
            j_end = max(j_end, hi[x]);
        }
        float n2 = 0.f;
#pragma unroll
        for (int e = 0; e < kE; ++e) {
            const int d = lane + 32 * e;
            qv[x][e] = valid[x] && d < D
                           ? q[(long long)b * p.q_batch + (long long)ii[x] * p.q_seq + (long long)hh[x] * p.q_head + d]
                           : 0.f;
            n2 += qv[x][e] * qv[x][e];
            o[x][e] = 0.f;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) n2 += __shfl_xor_sync(0xffffffffu, n2, off);
        qs[x] = row_scalar(p, n2);
        mx[x] = -INFINITY;
        sum[x] = 0.f;
    }
    for (int j = j_begin; j < j_end; ++j) {
        const long long ko = kv_row(p, b, j, p.k_batch, p.k_seq, p.k_head, hk);
        const long long vo = kv_row(p, b, j, p.v_batch, p.v_seq, p.v_head, hk);
        float kr[kE], vr[kE];
        float kn2 = 0.f, vn2 = 0.f;
#pragma unroll
        for (int e = 0; e < kE; ++e) {
            const int d = lane + 32 * e;
            kr[e] = d < D ? k[ko + d] : 0.f;
            vr[e] = d < D ? v[vo + d] : 0.f;
            kn2 += kr[e] * kr[e];
            vn2 += vr[e] * vr[e];
        }
        float ks = 1.f, lg = 0.f;
        if (norms || p.midpoint) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                kn2 += __shfl_xor_sync(0xffffffffu, kn2, off);
                vn2 += __shfl_xor_sync(0xffffffffu, vn2, off);
            }
            ks = row_scalar(p, kn2);
            lg = p.midpoint ? log_gamma(p, vn2) : 0.f;
        }
#pragma unroll
        for (int x = 0; x < kR; ++x) {
            float dot = 0.f;
#pragma unroll
            for (int e = 0; e < kE; ++e) dot += qv[x][e] * kr[e];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
            if (j < lo[x] || j >= hi[x]) continue;  // uniform across the warp
            // Natural units, the max subtracted before the scaling by log2 e (as the f32 flash kernel
            // does): at |s| ≈ 1e4 the product s·log2 e alone is rounded by up to 6e-4, which every
            // weight would carry.
            const float s = score(p, dot, qs[x], ks, true) + lg;
            const float mn = nan_max(mx[x], s);
            const float base = mn == -INFINITY ? 0.f : mn;
            const float alpha = exp2f((mx[x] - base) * kLog2e);
            const float w = exp2f((s - base) * kLog2e);
            mx[x] = mn;
            sum[x] = sum[x] * alpha + w;
#pragma unroll
            for (int e = 0; e < kE; ++e) o[x][e] = o[x][e] * alpha + w * vr[e];
        }
    }
#pragma unroll
    for (int x = 0; x < kR; ++x) {
        if (!valid[x]) continue;
        const bool empty = mx[x] == -INFINITY || sum[x] == 0.f;
        const float inv = empty ? 0.f : 1.f / sum[x];
        const float lse = empty ? -INFINITY : mx[x] + logf(sum[x]);
        const long long stat = ((long long)b * p.heads_q + hh[x]) * p.seq_q + ii[x];
        if (p.splits == 1) {
            float* out = static_cast<float*>(p.o) + (long long)b * p.o_batch + (long long)ii[x] * p.o_seq +
                         (long long)hh[x] * p.o_head;
#pragma unroll
            for (int e = 0; e < kE; ++e)
                if (lane + 32 * e < D) out[lane + 32 * e] = o[x][e] * inv;
            if (lane == 0) p.lse[stat] = lse;
        } else {
            const long long row = (long long)split * p.batch * p.heads_q * p.seq_q + stat;
#pragma unroll
            for (int e = 0; e < kE; ++e)
                if (lane + 32 * e < D) p.ws_o[row * D + lane + 32 * e] = o[x][e] * inv;
            if (lane == 0) p.ws_lse[row] = lse;
        }
    }
}

}  // namespace attn_decode
