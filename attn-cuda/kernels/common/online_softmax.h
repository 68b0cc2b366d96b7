// Online softmax in registers (FlashAttention-2). Each thread owns two rows of its warp's 16-row
// tile (rows g and g + 8 of an mma C fragment) and, per n8 tile, two columns of each. Scores are
// kept in log2 units (s·log2 e) so every exponential is one exp2.
//
// Per key block, for each row: m' = max(m, max_j s_ij) (or the fixed offset), α = 2^(m − m'),
// l ← α·l + Σ_j 2^(s_ij − m'), O ← α·O + P·V. A row whose keys are all masked keeps m = −∞; its
// exponentials use 0 as the reference so no NaN appears, and it ends with l = 0 → o = 0, LSE = −∞.
// The running max propagates NaN (max.NaN; fmaxf drops it, and a row of NaN scores looked fully
// masked): a NaN score makes m, l, o and LSE of its row NaN (docs/nan.md).
#pragma once
#include <math_constants.h>

namespace attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x with one MUFU.EX2 (flushes results below 2^-126 to zero, which the softmax cannot tell from
// an underflow; −∞ → 0). exp2f without fast-math adds range handling around the same instruction.
__device__ __forceinline__ float exp2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// log2 x, √x and 1/√x with one MUFU instruction each (approximate to a few ulp; ftz).
__device__ __forceinline__ float lg2_fast(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float rsqrt_fast(float x) {
    float y;
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float rcp_fast(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// max and min that return NaN when either operand is NaN (one FMNMX.NAN each, sm_80+).
__device__ __forceinline__ float fmax_nan(float a, float b) {
    float y;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
    return y;
}
__device__ __forceinline__ float fmin_nan(float a, float b) {
    float y;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
    return y;
}

// Reductions across the 4 lanes of a quad (the lanes that share an mma row).
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_min(float x) {
    x = fminf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fminf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_max_nan(float x) {
    x = fmax_nan(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmax_nan(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_min_nan(float x) {
    x = fmin_nan(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmin_nan(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Update the running state of this thread's two rows with a block of values x[NT][4] whose scores
// in log2 units are c[r]·x (c > 0: the fast path keeps the raw products and folds the scale into
// the exponential's FMA; the general path passes scores already in log2 units with c = 1; −∞
// where masked), and replace x by the unnormalised probabilities 2^(c·x − m'). alpha[r] receives
// the factor 2^(m − m') by which the row's output accumulator must be rescaled (1 without a running
// max); l is rescaled here. kNeg: c < 0 (the geodesic's fast path keeps log2 of the distance term),
// so the row's largest score comes from its smallest value. kLinear: x already holds 2^score ≥ 0 (the
// geodesic at β/√c = 1, whose weight is a reciprocal: no exponential per element); the running max
// stays in log2 units (one LG2 per row and block) and P = x·2^(−m'), one FMUL.
template <int NT, bool kNeg = false, bool kLinear = false>
__device__ __forceinline__ void softmax_rows(float (&s)[NT][4], float (&m)[2], float (&l)[2], bool running_max,
                                             const float (&c)[2], float (&alpha)[2]) {
    if constexpr (kLinear) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mx = fmax_nan(mx, fmax_nan(s[nt][2 * r], s[nt][2 * r + 1]));
            mx = quad_max_nan(mx);
            const float m_new = !(mx <= 0.f) ? fmax_nan(m[r], lg2_fast(mx)) : m[r];
            const float ref = m_new == -CUDART_INF_F ? 0.f : m_new;
            alpha[r] = exp2_fast(m[r] - ref);
            l[r] *= alpha[r];
            m[r] = m_new;
            const float f = exp2_fast(-ref);
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                s[nt][2 * r] *= f;
                s[nt][2 * r + 1] *= f;
                sum += s[nt][2 * r] + s[nt][2 * r + 1];
            }
            l[r] += sum;
        }
    } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float m_new = m[r];
        if (running_max) {
            if (kNeg) {
                float mn = CUDART_INF_F;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) mn = fmin_nan(mn, fmin_nan(s[nt][2 * r], s[nt][2 * r + 1]));
                m_new = fmax_nan(m[r], quad_min_nan(mn) * c[r]);
            } else {
                float mx = -CUDART_INF_F;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) mx = fmax_nan(mx, fmax_nan(s[nt][2 * r], s[nt][2 * r + 1]));
                m_new = fmax_nan(m[r], quad_max_nan(mx) * c[r]);
            }
        }
        const float ref = m_new == -CUDART_INF_F ? 0.f : m_new;
        alpha[r] = 1.f;
        if (running_max) {
            alpha[r] = exp2_fast(m[r] - ref);
            l[r] *= alpha[r];
        }
        m[r] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            s[nt][2 * r] = exp2_fast(fmaf(s[nt][2 * r], c[r], -ref));
            s[nt][2 * r + 1] = exp2_fast(fmaf(s[nt][2 * r + 1], c[r], -ref));
            sum += s[nt][2 * r] + s[nt][2 * r + 1];
        }
        l[r] += sum;  // thread-partial; reduced across the quad once, at the end
    }
    }
}

// o ← alpha·o for this thread's two rows of an output accumulator o[DT][4].
template <int DT>
__device__ __forceinline__ void rescale_rows(float (&o)[DT][4], const float (&alpha)[2]) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
        o[dt][0] *= alpha[0];
        o[dt][1] *= alpha[0];
        o[dt][2] *= alpha[1];
        o[dt][3] *= alpha[1];
    }
}

}  // namespace attn
