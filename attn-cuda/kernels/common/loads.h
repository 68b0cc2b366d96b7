// Global → shared tile loads. A tile is `ROWS` rows of `D` contiguous elements; row r of the tile is
// global row `row0 + r`, at element offset `row_off(row0 + r)`. Rows at or past `rows_valid` are
// zero-filled (sequence tails), so no kernel ever reads past a tensor. Shared rows are padded to
// `D + 8` elements: consecutive rows then start 16 bytes apart modulo 128, so the 8 row addresses
// of one ldmatrix land in 8 different bank groups.
#pragma once
#include "mma.h"

namespace attn {

// Two 16-bit elements packed in a register (mma.h's pack2, or a 4-byte shared-memory load) as f32.
template <typename T> __device__ __forceinline__ float2 unpack2(uint32_t u);
template <> __device__ __forceinline__ float2 unpack2<__half>(uint32_t u) {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
}
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t u) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}

template <int D> struct SmemRow { static constexpr int ld = D + 8; };

// cp.async a ROWS×D tile (16-byte chunks, every thread of the block helps).
template <typename T, int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_async(T* smem, const T* base, long long row_stride, int row0, int rows_valid,
                                                int tid) {
    constexpr int kChunksPerRow = D * (int)sizeof(T) / 16;
    constexpr int kChunks = ROWS * kChunksPerRow;
    constexpr int ld = SmemRow<D>::ld;
    static_assert(D * sizeof(T) % 16 == 0, "rows must be whole 16-byte chunks");
    constexpr int kRowsPerPass = THREADS / kChunksPerRow;
    if constexpr (THREADS % kChunksPerRow == 0 && ROWS % kRowsPerPass == 0) {
        // Each thread copies one 16-byte column of rows r, r + P, ...: one row address per call, then a
        // 64-bit add and a compare per copy.
        const int r = tid / kChunksPerRow, col = (tid % kChunksPerRow) * (16 / (int)sizeof(T));
        const uint32_t dst = smem_addr(smem + r * ld + col);
        const T* src = base + (long long)(row0 + r) * row_stride + col;
        const long long step = (long long)kRowsPerPass * row_stride;
        cp_async_column<ROWS / kRowsPerPass, kRowsPerPass, kRowsPerPass * ld * (int)sizeof(T)>(
            dst, src, step, rows_valid - row0 - r, base);
    } else {
#pragma unroll
        for (int c = tid; c < kChunks; c += THREADS) {
            const int r = c / kChunksPerRow;
            const int col = (c % kChunksPerRow) * (16 / (int)sizeof(T));
            const int row = row0 + r;
            const bool valid = row < rows_valid;
            const T* src = valid ? base + (long long)row * row_stride + col : base;
            cp_async_16(smem + r * ld + col, src, valid);
        }
    }
}

// 1 / max(‖x_r‖, eps) for the ROWS rows of a smem tile, written to out[r] (f32). Each row is summed
// by THREADS / ROWS threads, combined with warp shuffles.
template <typename T, int ROWS, int D, int THREADS>
__device__ __forceinline__ void tile_inv_norms(float* out, const T* smem, float eps, int tid) {
    constexpr int kPerRow = THREADS / ROWS;  // threads per row: 1, 2, 4, ...
    static_assert(kPerRow >= 1 && kPerRow <= 32 && (kPerRow & (kPerRow - 1)) == 0, "threads per row: power of two");
    constexpr int ld = SmemRow<D>::ld;
    const int r = tid / kPerRow;
    const int part = tid % kPerRow;
    float s = 0.f;
    if (r < ROWS) {
        for (int d = part; d < D; d += kPerRow) {
            const float x = to_f32(smem[r * ld + d]);
            s += x * x;
        }
    }
#pragma unroll
    for (int o = kPerRow / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (r < ROWS && part == 0) {
        const float n = sqrtf(s);
        out[r] = 1.f / (n < eps ? eps : n);  // a NaN norm stays NaN (fmaxf would return eps)
    }
}

}  // namespace attn
