// Score functions: the compile-time parameter of the flash skeleton. A score turns the raw tile
// product `q_i·k_j` into `s_ij` (natural-log units) and gives the factor that carries dS back to the
// raw product in the backward.
//
//   Softmax:   s = scale·q·k, optionally softcap·tanh(s/softcap), + bias
//   CosineSim: s = scale·q̂·k̂ (+ bias), q̂ = q/max(‖q‖, eps); computed as scale·(q·k)·rq·rk with the
//              reciprocal norms rq, rk of the raw rows (fused: no normalised copy is ever written).
//              With qk_l2norm = false the norms are 1. The row max is the fixed offset `scale`
//              unless a bias or qk_l2norm = false makes the scores unbounded (host sets running_max).
//   Hyperbolic (docs/math.md §4), from the raw product q·k and the time coordinates q0, k0 (per-row
//   f32 scalars of the row kernels; the lifted (D+1)-vectors are never stored):
//     SqLorentz: s = −β d²_L = 2β/c + 2β (q·k − q0 k0)
//     Geodesic:  s = −(β/√c) arccosh(z), z = c u with u = q0 k0 − q·k clamped at u ≥ (1 + ACOSH_EPS)/c,
//                arccosh(z) = ln(z + √(z² − 1)) = ln c + ln w,  w = u + √(u² − 1/c²)
//   Their constant parts (2β/c; −(β/√c) ln c) cancel in P and are added to LSE only. The fast path
//   keeps one value y per element with s·log2 e = hyp_c·y + const: y = q·k − q0 k0 (SqLorentz) or
//   y = log2 w (Geodesic, hyp_c = −β/√c < 0), plus the Einstein midpoint's log γ_j / (hyp_c ln 2).
//   Backward: ∂s/∂q = σ (k0 q/q0 − k), σ = −hyp_grad·ψ with ψ = 1 (SqLorentz) or 1/√(u² − 1/c²)
//   (Geodesic; 0 where u is clamped).
#pragma once
#include "../common/online_softmax.h"
#include "../common/params.h"

namespace attn {

// The hooks of a score on the flash skeleton (`Score::Ops`): the skeletons (flash_*.cuh) hold the
// FlashAttention structure and reach every per-family step through them (row and key scalars, the
// per-tile scores and gradients, the statistic, the epilogues). FlashOps (score_ops.cuh) serves
// softmax, cosine-sim and Taylor; LorentzOps (hyperbolic/lorentz_tile.cuh) the hyperbolic scores, so a
// file that instantiates a skeleton with a hyperbolic score includes that header.
template <class Score>
struct FlashOps;
template <class Score>
struct LorentzOps;

// kNorms: scores use reciprocal row norms. kSoftcap: a softcap is possible. kLorentz: a hyperbolic
// score (per-row time coordinates, optional per-key log γ). kGeodesic: its fast-path multiplier is
// negative (the online max tracks the smallest value).
struct SoftmaxScore {
    static constexpr bool kNorms = false;
    static constexpr bool kSoftcap = true;
    static constexpr bool kLorentz = false;
    static constexpr bool kGeodesic = false;
    static constexpr bool kPoly = false;
    using Ops = FlashOps<SoftmaxScore>;
};

struct CosineScore {
    static constexpr bool kNorms = true;
    static constexpr bool kSoftcap = false;
    static constexpr bool kLorentz = false;
    static constexpr bool kGeodesic = false;
    static constexpr bool kPoly = false;
    using Ops = FlashOps<CosineScore>;
};

struct SqLorentzScore {
    static constexpr bool kNorms = false;
    static constexpr bool kSoftcap = false;
    static constexpr bool kLorentz = true;
    static constexpr bool kGeodesic = false;
    static constexpr bool kPoly = false;
    using Ops = LorentzOps<SqLorentzScore>;
};

struct GeodesicScore {
    static constexpr bool kNorms = false;
    static constexpr bool kSoftcap = false;
    static constexpr bool kLorentz = true;
    static constexpr bool kGeodesic = true;
    static constexpr bool kPoly = false;
    using Ops = LorentzOps<GeodesicScore>;
};

// Taylor order 2 on the flash skeleton (the quadratic form, docs/math.md §3): weight f(s) = a0 + a1 s +
// a2 s² of s = scale·q·k (q̂·k̂ under qk_l2norm, as cosine-sim's norms), normalised by den = Σ_j f(s_ij);
// no running max and no exponential. The forward saves den itself (the Taylor statistic); the backward
// reads 1/den where the other scores read LSE, so P = f(s)/den and dS = f'(s)/den ∘ (dP − δ).
struct TaylorScore {
    static constexpr bool kNorms = true;
    static constexpr bool kSoftcap = false;
    static constexpr bool kLorentz = false;
    static constexpr bool kGeodesic = false;
    static constexpr bool kPoly = true;
    using Ops = FlashOps<TaylorScore>;
};

// The coefficients of a call (TaylorScore): f(x) = a0 + x (a1 + a2 x) and f'(x) = a1 + 2 a2 x, two FMAs
// and one.
struct Poly {
    float a0, a1, a2, a2x2;
    __device__ __forceinline__ explicit Poly(const AttnParams& p)
        : a0(p.poly_a0), a1(p.poly_a1), a2(p.poly_a2), a2x2(2.f * p.poly_a2) {}
    __device__ __forceinline__ float f(float x) const { return fmaf(fmaf(a2, x, a1), x, a0); }
    __device__ __forceinline__ float df(float x) const { return fmaf(a2x2, x, a1); }
};

// attn_core::ACOSH_EPS and KLEIN_MAX_NORM2: the same clamps as the CPU reference.
constexpr float kAcoshEps = 1e-6f;
constexpr double kKleinMaxNorm2 = 1.0 - 1e-5;

// Per-call constants of a hyperbolic score.
struct Lorentz {
    float fast;    // hyp_c
    float thr;     // (1 + ACOSH_EPS)/c: the geodesic's clamp of u
    float inv_c2;  // 1/c²
    __device__ __forceinline__ explicit Lorentz(const AttnParams& p)
        : fast(p.hyp_c), thr((1.f + kAcoshEps) / p.curvature), inv_c2(1.f / (p.curvature * p.curvature)) {}
};

// A point's time coordinate x0 = √(1/c + ‖x‖²) from c and its Σ x_d² in f64, rounded once to f32: the one
// formula of the row kernel (hyperbolic.cu's hyp_rows) and of the wgmma forward's q0
// (lorentz_q0_from_tile), so both give the same bits.
__device__ __forceinline__ float lorentz_time_coord(double c, double sum_sq) {
    return (float)sqrt(1.0 / c + sum_sq);
}

// The fast-path value y of one element from the raw product and the time coordinates (see the top
// of the file), and with kGrad the factor ψ of its gradient. Two FMAs (SqLorentz: one) and, for the
// geodesic, one MUFU.RSQ and one MUFU.LG2: √t = t·(1/√t) serves both the score and ψ.
// kW (geodesic): return w itself instead of log2 w (the β/√c = 1 forward, whose weight is 1/w).
// kK0 (the warp-specialised forward on bf16, lorentz_tile.cuh's kLorentzTcK0): `qk` already holds q·k − q0 k0,
// the tensor cores' product of one more k16 step (q0 and k0 unused).
template <class Score, bool kGrad, bool kW = false, bool kK0 = false>
__device__ __forceinline__ float lorentz_value(float qk, float q0, float k0, const Lorentz& L, float& psi) {
    if (!Score::kGeodesic) {
        psi = 1.f;
        return kK0 ? qk : fmaf(-q0, k0, qk);
    }
    const float u_raw = kK0 ? -qk : fmaf(q0, k0, -qk);
    const float u = fmax_nan(u_raw, L.thr);  // the clamp keeps a NaN NaN (fmaxf would return thr)
    const float t = fmaf(u, u, -L.inv_c2);  // u² − 1/c² = (z² − 1)/c², no cancellation (exact square)
    const float rs = rsqrt_fast(t);
    if (kGrad) psi = u_raw < L.thr ? 0.f : rs;
    const float w = fmaf(t, rs, u);  // w = u + √t
    return kW ? w : lg2_fast(w);
}

// s_ij before the bias, from the raw product and the reciprocal norms (1 when unused). `dx` is set
// to ∂s/∂(raw product)/scale-free factor needed by the backward: the softcap derivative 1 − tanh².
// kExact (the f32 kernels): the softcap's tanh in f64, rounded once. tanhf's 2-ulp error times the
// cap is the score's error: with tanhf, logits near 1e4 under a cap of 1e4 gave dq 1.1–1.3× the
// tolerance rule's bound in f32 (gpu_softmax_like, H200, 2026-12-04); within it with the f64 tanh.
template <class Score, bool kExact = false>
__device__ __forceinline__ float score(const AttnParams& p, float raw, float rq, float rk, float& dtanh) {
    float x = raw * p.scale;
    if (Score::kNorms) x *= rq * rk;
    dtanh = 1.f;
    if (Score::kSoftcap && p.softcap > 0.f) {
        const float t = kExact ? (float)tanh((double)x / (double)p.softcap) : tanhf(x / p.softcap);
        dtanh = 1.f - t * t;
        x = p.softcap * t;
    }
    return x;
}

}  // namespace attn
