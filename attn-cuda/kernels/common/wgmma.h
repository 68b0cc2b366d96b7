// Hopper (sm_90a) warpgroup MMA: wgmma.mma_async m64nNk16 with f32 accumulation, shared-memory
// matrix descriptors for the 128-byte-swizzled tile layout, and the async-proxy fences they need.
// Compiled only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); the kernels that use it are launched only
// on compute capability 9.0.
//
// Accumulator of m64nN (per warp w of the warpgroup: rows 16w..16w+15): d[j][0..3] holds the
// mma.sync m16n8 C fragment of columns 8j..8j+7 (g = lane / 4, t = lane % 4: d[j][0], d[j][1] at
// (g, 8j + 2t + {0, 1}), d[j][2], d[j][3] at (g + 8, …)). The register A fragment of one k16 step is
// the mma.sync m16n8k16 A fragment (pack_a), so softmax's P feeds P·V straight from registers.
//
// Shared-memory layout (sw128): a [ROWS][D] tile of 16-bit elements is stored as D / 64 column
// blocks of [ROWS][64] elements (128-byte rows); within each group of 8 rows (1024 bytes, aligned
// to 1024) the 16-byte chunk c of row r sits at chunk c ^ (r % 8). The same layout serves a K-major
// operand (Q and K: rows = M or N, 64 contiguous k per block; SBO = 1024 between 8-row groups, the
// k16 steps advance the start address by 32 bytes inside the swizzled row, the column blocks by
// ROWS·128) and an MN-major one (V for P·V: rows = k, 64 contiguous n per block; SBO = 1024 between
// 8-row groups of k, LBO = ROWS·128 between column blocks, the k16 steps advance by 2048 bytes).
#pragma once
#include "mma.h"

namespace attn {

// Descriptor of a 128-byte-swizzled operand starting at shared address `addr` (bytes).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

// A sw128 descriptor split into its two 32-bit words, advanced by byte offsets: the start-address
// field (bits 0–13: address / 16) of the low word moves by offset / 16. Every operand lies in shared
// memory (below 256 KiB), so start + offset stays inside the field and nothing carries out of it: one
// 32-bit add per k16 step where sw128_desc costs about five instructions.
struct Sw128Desc {
    uint32_t lo, hi;
    __device__ __forceinline__ Sw128Desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
        const uint64_t d = sw128_desc(addr, lbo, sbo);
        lo = (uint32_t)d;
        hi = (uint32_t)(d >> 32);
    }
    // The descriptor of the operand `units` · 16 bytes past this one (offsets given in 16-byte units,
    // so a run-time part and a constant part add without a shift).
    __device__ __forceinline__ uint64_t at16(uint32_t units) const {
        return ((uint64_t)hi << 32) | (uint64_t)(lo + units);
    }
};

// k16 step kk of a K-major sw128 operand of ROWS rows at `addr` (64-column blocks of ROWS·128 bytes,
// +32 bytes per step inside a block) and of an MN-major one (rows = k: 16 rows = 2048 bytes per step;
// LBO = ROWS·128 between its column blocks). The base descriptor is the same expression for every
// step, so the compiler forms it once and each step costs one add.
template <int ROWS>
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t addr, int kk) {
    return Sw128Desc(addr, 16, 1024).at16((kk / 4) * ROWS * 8 + (kk % 4) * 2);
}
template <int ROWS>
__device__ __forceinline__ uint64_t mnmajor_desc(uint32_t addr, int kk) {
    return Sw128Desc(addr, ROWS * 128, 1024).at16(kk * 128);
}

// Byte offset of element (r, c) in a sw128 tile of ROWS rows.
template <int ROWS>
__device__ __forceinline__ int sw128_offset(int r, int c) {
    return (c / 64) * ROWS * 128 + r * 128 + ((((c % 64) / 8) ^ (r & 7)) * 16) + (c % 8) * 2;
}

// cp.async a ROWS×D tile into the sw128 layout (16-byte chunks; rows at or past rows_valid zero).
// Each thread copies one 16-byte column of rows r, r + P, r + 2P, ... (P = THREADS / chunks per row, a
// multiple of 8, so every copy keeps the thread's swizzle phase): one row address and one shared
// address per call, then a 64-bit add and a compare per copy.
template <typename T, int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_sw128(T* smem, const T* base, long long row_stride, int row0,
                                                int rows_valid, int tid) {
    constexpr int kChunksPerRow = D / 8;
    static_assert(sizeof(T) == 2 && D % 64 == 0 && ROWS % 8 == 0, "sw128 tiles: 16-bit, 64-column blocks");
    static_assert(THREADS % kChunksPerRow == 0, "whole rows per pass");
    constexpr int kRowsPerPass = THREADS / kChunksPerRow;
    static_assert(kRowsPerPass % 8 == 0 && ROWS % kRowsPerPass == 0, "passes keep the swizzle phase");
    const int r = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
    const uint32_t dst = smem_addr(smem) + sw128_offset<ROWS>(r, col);
    const T* src = base + (long long)(row0 + r) * row_stride + col;
    const long long step = (long long)kRowsPerPass * row_stride;
    cp_async_column<ROWS / kRowsPerPass, kRowsPerPass, kRowsPerPass * 128>(dst, src, step, rows_valid - row0 - r,
                                                                          base);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared-memory writes of the generic proxy (cp.async, st.shared) visible to wgmma's async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Shared-memory barriers (mbarrier) of a producer/consumer pipeline. A phase of a full barrier completes once each producer thread's copies
// issued before its cp_async_arrive have landed; a waiter passes once the phase of the given parity
// has completed.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// One arrival for the calling warp (a barrier counted in warps): lane 0 arrives once every lane has
// reached it (__syncwarp orders the lanes' earlier accesses before the arrival), so a release costs
// one shared-memory atomic per warp rather than 32.
__device__ __forceinline__ void mbar_arrive_warp(uint64_t* bar, int lane) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
}
// The barrier counts this thread's arrival once every cp.async it issued so far has completed
// (.noinc: the arrival is one of the count given to mbar_init).
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    const uint32_t addr = smem_addr(bar);
    uint32_t done = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(addr), "r"(parity)
                     : "memory");
    } while (!done);
}
// Named barrier `id` (1..15; 0 is __syncthreads) over `count` threads, a multiple of 32.
// `bar.sync` is the aligned form: every thread of a warp must execute it together, so the warp is
// reconverged first (the mbarrier spin loops before it let the lanes leave at different times; synccheck
// reported "divergent thread(s)" without this).
__device__ __forceinline__ void named_bar_sync(int id, int count) {
    __syncwarp();
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// Bulk asynchronous reduction global[dst, dst + bytes) += shared[src, src + bytes) in f32 (sm_90; bytes
// a multiple of 16, both addresses 16-byte aligned), in the calling thread's bulk group: the copy engine
// reads the shared bytes and adds them at L2, off the issuing thread's instruction stream. The shared
// source must be written (and made visible to the async proxy by fence_proxy_async) before the issue,
// and must not be rewritten before bulk_wait_read says the reads are done.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// At most N of this thread's committed bulk groups still read their shared source.
template <int N> __device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// At most N of this thread's committed bulk groups are still incomplete (their global writes included).
template <int N> __device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// Hand registers between the warpgroups of a warp-specialised block (sm_90a; the kernel's launch
// bounds fix the register count at entry).
template <int N> __device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> __device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

// dst[0..1] += (x, y) in global memory, one vector reduction (sm_90), no return value.
__device__ __forceinline__ void red_add_v2(float* dst, float x, float y) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(x), "f"(y) : "memory");
}

// Hide x's value from the optimiser at this point: what is derived from it below is recomputed here
// rather than hoisted out of the loop. The wgmma descriptors of a loop's k16 steps are cheap to form
// from one shared address (an add and a shift), while hoisted they take a register each and spill.
__device__ __forceinline__ void opaque(uint32_t& x) { asm volatile("" : "+r"(x)); }

// Keep the compiler from moving accesses of registers that an in-flight wgmma reads or writes
// across the wait that completes it.
template <int N> __device__ __forceinline__ void fence_regs(float (&d)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
template <int N> __device__ __forceinline__ void fence_regs(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[j][e])::"memory");
}

// d (+)= A·B for one k16 step: ss = A and B from shared memory (both K-major), ss_tt = both from
// shared memory and MN-major (transposed), rs = A from registers and B MN-major from shared memory.
// accumulate = 0 overwrites d.
template <typename T, int N> struct Wgmma;

// The accumulator operands of m64nN: N / 2 floats d[j][e], and their PTX register lists.
#define ATTN_WG_D64 \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
    "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
    "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
    "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
    "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
    "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
    "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define ATTN_WG_D128 \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
    "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
    "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
    "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
    "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
    "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
    "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
    "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
    "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
    "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), \
    "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
    "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), \
    "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
    "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), \
    "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define ATTN_WG_D72 ATTN_WG_D64, "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3])
#define ATTN_WG_D8 "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
#define ATTN_WG_R8 "{%0, %1, %2, %3}"
#define ATTN_WG_R64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define ATTN_WG_R72 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}"
#define ATTN_WG_R128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// One specialisation per element type (PTX name TAG) and N; NA = N / 2 accumulator operands, so the
// descriptors and the A registers follow them as %NA, %NA+1, ...
#define ATTN_WGMMA(T, TAG, N, NA, A1, A2, A3, A4, A5)                                                              \
    template <> struct Wgmma<T, N> {                                                                               \
        /* kTrans: both operands MN-major (the transpose flags of A and B, an immediate). */                     \
        template <int kTrans>                                                                                      \
        static __device__ __forceinline__ void ss_t(float (&d)[N / 8][4], uint64_t a, uint64_t b, int accumulate) {\
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #A2 ", 0;\n"                                        \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TAG "." TAG " " ATTN_WG_R##N           \
                         ", %" #NA ", %" #A1 ", p, 1, 1, %" #A3 ", %" #A3 ";\n}\n"                                \
                         : ATTN_WG_D##N                                                                         \
                         : "l"(a), "l"(b), "r"(accumulate), "n"(kTrans));                                       \
        }                                                                                                          \
        static __device__ __forceinline__ void ss(float (&d)[N / 8][4], uint64_t a, uint64_t b, int accumulate) {  \
            ss_t<0>(d, a, b, accumulate);                                                                          \
        }                                                                                                          \
        static __device__ __forceinline__ void ss_tt(float (&d)[N / 8][4], uint64_t a, uint64_t b, int accumulate) {\
            ss_t<1>(d, a, b, accumulate);                                                                          \
        }                                                                                                          \
        static __device__ __forceinline__ void rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b,        \
                                                  int accumulate) {                                                \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #A5 ", 0;\n"                                        \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TAG "." TAG " " ATTN_WG_R##N           \
                         ", {%" #NA ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #A4 ", p, 1, 1, 1;\n}\n"                   \
                         : ATTN_WG_D##N                                                                         \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));                \
        }                                                                                                          \
    };

ATTN_WGMMA(__nv_bfloat16, "bf16", 8, 4, 5, 6, 7, 8, 9)
ATTN_WGMMA(__nv_bfloat16, "bf16", 64, 32, 33, 34, 35, 36, 37)
ATTN_WGMMA(__nv_bfloat16, "bf16", 128, 64, 65, 66, 67, 68, 69)
// m64n72: the fused backward's dQ product with the keys' k0 pieces as 8 more columns (flash_bwd_ws.cuh), and
// the single-pass causal order-1 forward's products with the denominator as the 65th column
// (taylor_order1_chain_wg.cuh).
ATTN_WGMMA(__nv_bfloat16, "bf16", 72, 36, 37, 38, 39, 40, 41)
ATTN_WGMMA(__half, "f16", 8, 4, 5, 6, 7, 8, 9)
ATTN_WGMMA(__half, "f16", 64, 32, 33, 34, 35, 36, 37)
ATTN_WGMMA(__half, "f16", 128, 64, 65, 66, 67, 68, 69)

#undef ATTN_WGMMA
#undef ATTN_WG_D8
#undef ATTN_WG_R8
#undef ATTN_WG_D72
#undef ATTN_WG_R72
#undef ATTN_WG_D64
#undef ATTN_WG_D128
#undef ATTN_WG_R64
#undef ATTN_WG_R128

}  // namespace attn
