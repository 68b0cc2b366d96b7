// The scores of the decode kernels, one function of the raw product q·k and the per-row scalars
// (docs/math.md §1, §2, §4), in f32 and natural-log units. Kept here, apart from the flash skeleton's
// score functors, so the decode kernels have one small self-contained definition:
//   softmax         s = scale·q·k, or with a softcap c: c·tanh(scale·q·k / c)
//   cosine-sim      s = scale·(q·k)·rq·rk, rq = 1/max(‖q‖, eps) (q·k raw without the l2-norm)
//   squared Lorentz s = 2β/c + 2β(q·k − q0 k0), x0 = √(1/c + ‖x‖²)
//   geodesic        s = −(β/√c)·arccosh(max(c(q0 k0 − q·k), 1 + ACOSH_EPS))
// and, for the Einstein midpoint, the per-key bias log γ_j = −½·log(1 − min(c‖v_j‖², KLEIN_MAX_NORM2)).
#pragma once
#include "decode_params.h"

namespace attn_decode {

constexpr float kAcoshEps = 1e-6f;          // attn_core::ACOSH_EPS
constexpr float kKleinMaxNorm2 = 1.0f - 1e-5f;  // attn_core::KLEIN_MAX_NORM2

enum Score { kSoftmax = 0, kCosine = 1, kSqLorentz = 2, kGeodesic = 3 };

// Whether the score needs ‖q‖² and ‖k‖² (cosine-sim with its l2-norm, both hyperbolic scores).
__device__ __forceinline__ bool needs_norms(const DecodeParams& p) {
    return (p.score == kCosine && p.l2norm) || p.score == kSqLorentz || p.score == kGeodesic;
}

// The per-row (query or key) scalar from its squared norm: 1/max(‖x‖, eps) for cosine-sim,
// x0 = √(1/c + ‖x‖²) for the hyperbolic scores, 1 otherwise.
__device__ __forceinline__ float row_scalar(const DecodeParams& p, float norm2) {
    if (p.score == kCosine) return p.l2norm ? 1.f / fmaxf(sqrtf(norm2), p.eps) : 1.f;
    if (p.score == kSqLorentz || p.score == kGeodesic) return sqrtf(1.f / p.curvature + norm2);
    return 1.f;
}

// s from q·k and the two row scalars. `exact` (the f32 kernel): the softcap's tanh in f64, rounded
// once (tanhf's 2-ulp error times a cap of 1e4 is a few 1e-4 of score).
__device__ __forceinline__ float score(const DecodeParams& p, float dot, float qs, float ks, bool exact = false) {
    switch (p.score) {
        case kCosine:
            return p.scale * dot * qs * ks;
        case kSqLorentz:
            return 2.f * p.beta / p.curvature + 2.f * p.beta * (dot - qs * ks);
        case kGeodesic: {
            // The clamp keeps a NaN argument NaN (fmaxf would replace it by the bound).
            const float z_raw = p.curvature * (qs * ks - dot);
            const float z = z_raw < 1.f + kAcoshEps ? 1.f + kAcoshEps : z_raw;
            return -(p.beta / sqrtf(p.curvature)) * acoshf(z);
        }
        default: {
            const float s = p.scale * dot;
            if (!(p.softcap > 0.f)) return s;
            return p.softcap * (exact ? (float)tanh((double)s / (double)p.softcap) : tanhf(s / p.softcap));
        }
    }
}

// log γ_j of the Einstein midpoint from ‖v_j‖².
__device__ __forceinline__ float log_gamma(const DecodeParams& p, float vnorm2) {
    const float n2 = p.curvature * vnorm2;
    return -0.5f * log1pf(-(n2 > kKleinMaxNorm2 ? kKleinMaxNorm2 : n2));  // a NaN norm stays NaN
}

// A max that propagates NaN (docs/nan.md): fmaxf would drop a NaN score and hide it.
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || a > b) ? a : b; }

}  // namespace attn_decode
