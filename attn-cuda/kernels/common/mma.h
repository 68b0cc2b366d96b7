// Tensor-core building blocks (sm_80+): mma.sync m16n8k16 with f32 accumulation, ldmatrix, cp.async,
// and the register-fragment conventions every kernel here relies on.
//
// Fragments of mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A (16×16, row-major) a0: (g, 2t..2t+1)  a1: (g+8, 2t..)  a2: (g, 2t+8..)  a3: (g+8, 2t+8..)
//   B (16×8, "col")      b0: (k 2t..2t+1, n g)               b1: (k 2t+8.., n g)
//   C (16×8, f32)        c0, c1: (g, 2t..2t+1)               c2, c3: (g+8, 2t..2t+1)
// A C tile of a 16×16 product pair is exactly an A fragment (pack_a), which is how P = softmax(S)
// feeds P·V straight from registers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace attn {

template <typename T> struct Vec2;
template <> struct Vec2<__half> { using type = __half2; };
template <> struct Vec2<__nv_bfloat16> { using type = __nv_bfloat162; };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Two floats rounded to T and packed into one 32-bit register (low half = first).
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// D = A·B + D, f32 accumulate.
template <typename T> __device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A·B + D for tf32 operands (f32 registers; m16n8k8), f32 accumulate. A: a0 (row g, k t4), a1 (row g + 8,
// k t4), a2 (row g, k t4 + 4), a3 (row g + 8, k t4 + 4); B: b0 (k t4, col g), b1 (k t4 + 4, col g); g = lane / 4,
// t4 = lane % 4. The caller rounds its operands to tf32 where they are not exact in it (the unit ignores the
// low 13 mantissa bits).
__device__ __forceinline__ void mma1688_tf32(float (&d)[4], const float (&a)[4], float b0, float b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
          "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8×8 b16 matrices; lane l supplies the address of row (l % 8) of matrix (l / 8).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
// stmatrix x4: the inverse of ldsm_x4. r[m] holds this thread's pair (row lane / 4, columns
// 2·(lane % 4) + {0, 1}) of 8 × 8 matrix m (the mma C/A fragment layout); lane l gives the shared
// address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void stsm_x4(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
                 "r"(r[2]), "r"(r[3])
                 : "memory");
}
// stmatrix x4, transposed: row k of stored matrix m (address from lane 8m + k) takes column k of the
// fragment matrix r[m] (this thread's pair: rows 2·(lane % 4) + {0, 1} of stored row lane / 4).
__device__ __forceinline__ void stsm_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// Two 8×8 b16 matrices, transposed; lanes 0–15 supply the row addresses (lane l: row l % 8 of matrix l / 8).
__device__ __forceinline__ void ldsm_x2_trans(uint32_t (&r)[2], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(p)));
}

// A fragment of rows [r0, r0+16) × cols [c0, c0+16) of a row-major smem tile with row stride ld.
template <typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int ld, int r0, int c0, int lane) {
    ldsm_x4(a, tile + (r0 + (lane & 15)) * ld + c0 + (lane >> 4) * 8);
}
// B fragments of two n8 tiles from a smem tile stored [n][k] (rows = n, e.g. K for Q·Kᵀ):
// n rows [n0, n0+16), k cols [k0, k0+16). b[0], b[1] for n-tile n0; b[2], b[3] for n0 + 8.
template <typename T>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const T* tile, int ld, int n0, int k0, int lane) {
    ldsm_x4(b, tile + (n0 + (lane >> 4) * 8 + (lane & 7)) * ld + k0 + ((lane >> 3) & 1) * 8);
}
// B fragments of two n8 tiles from a smem tile stored [k][n] (rows = k, e.g. V for P·V):
// k rows [k0, k0+16), n cols [n0, n0+16). b[0], b[1] for n-tile n0; b[2], b[3] for n0 + 8.
template <typename T>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const T* tile, int ld, int k0, int n0, int lane) {
    ldsm_x4_trans(b, tile + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ld + n0 + (lane >> 4) * 8);
}

// A fragment (16 rows × 16 cols) from two f32 C tiles: cols [0, 8) from c_lo, [8, 16) from c_hi.
template <typename T>
__device__ __forceinline__ void pack_a(uint32_t (&a)[4], const float (&c_lo)[4], const float (&c_hi)[4]) {
    a[0] = pack2<T>(c_lo[0], c_lo[1]);
    a[1] = pack2<T>(c_lo[2], c_lo[3]);
    a[2] = pack2<T>(c_hi[0], c_hi[1]);
    a[3] = pack2<T>(c_hi[2], c_hi[3]);
}

// cp.async of 16 bytes; when !valid the destination is zero-filled and nothing is read.
// cp_async_16_at: the destination as a shared-state-space address (no conversion per copy).
__device__ __forceinline__ void cp_async_16_at(uint32_t dst, const void* src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
    cp_async_16_at(smem_addr(dst), src, valid);
}
// kCopies 16-byte copies of one tile column: global rows src, src + step, ... into shared memory at dst,
// dst + kDstStep, ...; a row is copied while fewer than `left` rows of the column were (the rest are
// zero-filled from `fallback`, a valid address, without reading it).
template <int kCopies, int kRowsPerCopy, int kDstStep, typename T>
__device__ __forceinline__ void cp_async_column(uint32_t dst, const T* src, long long step, int left, const T* fallback) {
#pragma unroll
    for (int k = 0; k < kCopies; ++k) {
        const bool valid = k * kRowsPerCopy < left;
        cp_async_16_at(dst + k * kDstStep, valid ? src : fallback, valid);
        src += step;
    }
}
// cp.async of one 4-byte word (per-row f32 scalars); when !valid the destination is zero-filled.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

}  // namespace attn
