// Score functions: the compile-time parameter of the flash skeleton. A score turns the raw tile
// product `q_i·k_j` into `s_ij` (natural-log units) and gives the factor that carries dS back to the
// raw product in the backward.
//
//   Softmax:   s = scale·q·k, optionally softcap·tanh(s/softcap), + bias
//   CosineSim: s = scale·q̂·k̂ (+ bias), q̂ = q/max(‖q‖, eps); computed as scale·(q·k)·rq·rk with the
//              reciprocal norms rq, rk of the raw rows (fused: no normalised copy is ever written).
//              With l2norm_qk = false the norms are 1. The row max is the fixed offset `scale`
//              unless a bias or l2norm_qk = false makes the scores unbounded (host sets running_max).
// A future family adds a struct here with the same members.
#pragma once
#include "params.h"

namespace attn {

struct SoftmaxScore {
    static constexpr bool kNorms = false;   // scores use reciprocal row norms
    static constexpr bool kSoftcap = true;  // softcap is possible
};

struct CosineScore {
    static constexpr bool kNorms = true;
    static constexpr bool kSoftcap = false;
};

// s_ij before the bias, from the raw product and the reciprocal norms (1 when unused). `dx` is set
// to ∂s/∂(raw product)/scale-free factor needed by the backward: the softcap derivative 1 − tanh².
template <class Score>
__device__ __forceinline__ float score(const AttnParams& p, float raw, float rq, float rk, float& dtanh) {
    float x = raw * p.scale;
    if (Score::kNorms) x *= rq * rk;
    dtanh = 1.f;
    if (Score::kSoftcap && p.softcap > 0.f) {
        const float t = tanhf(x / p.softcap);
        dtanh = 1.f - t * t;
        x = p.softcap * t;
    }
    return x;
}

}  // namespace attn
