// Hyperbolic attention (docs/math.md §4) in the Lorentz model of curvature −c: squared-Lorentz and
// geodesic scores, Euclidean or Einstein-midpoint aggregation (a runtime flag: the per-key bias
// log γ_j), forward and backward.
//   attn_hyperbolic_{sq_lorentz,geodesic}_{fwd,bwd_dq,bwd_dkdv}_{f16,bf16}_d{32,64,96,128,256}:
//       the flash skeleton on tensor cores (score.h, lorentz_tile.cuh)
//   attn_hyperbolic_{sq_lorentz,geodesic}_fwd_wg_{f16,bf16}_d{64,128}: the Hopper forward (wgmma,
//       sm_90a only; flash_fwd_wg.cuh)
//   attn_hyperbolic_{sq_lorentz,geodesic}_bwd_{dq,dkdv}_wg_{f16,bf16}_d{64,128}: the Hopper backward
//       (flash_bwd_wg.cuh)
//   attn_hyperbolic_{sq_lorentz,geodesic}_bwd_fused_wg_{f16,bf16}_d128: the fused Hopper backward (dK,
//       dV, and dQ with its row sums reduced into f32 scratch), finished by attn_hyp_dq_store_{dt}
//   attn_hyperbolic_{sq_lorentz,geodesic}_bwd_fused_ws_{f16,bf16}_d{64,128}: the default fused Hopper backward
//       (flash_bwd_ws.cuh, dQ's row sums by atomics), finished by attn_hyp_dq_store_{dt}
//   attn_hyperbolic_{sq_lorentz,geodesic}_{fwd,bwd_dq,bwd_dkdv}_f32: exact f32 SIMT (hyp_simt.cuh)
//   attn_hyperbolic_{sq_lorentz,geodesic}_{fwd,bwd_dq,bwd_dkdv}_exact_{f16,bf16}: the same SIMT kernels on
//       f16/bf16 rows (KernelConfig::hyperbolic_exact: points far from the origin)
//   attn_hyp_rows_{f32,f16,bf16}: the per-row scalars every kernel above reads (grid.y: the query heads,
//       then the key heads), rows as simt_f32.cuh's with_lane_row lays them out, sums in f64 and rounded
//       once to f32:
//       q rows: q0 = √(1/c + ‖q‖²) and ‖q‖ (stats_index);
//       k rows: k0 and ‖k‖, and for the Einstein midpoint γ_j = 1/√(1 − min(c‖v_j‖², KLEIN_MAX_NORM2)):
//       log γ_j and its gradient factor c γ_j² (0 where the clamp is active), at key_index.
//   attn_hyp_rows_k_{f16,bf16}: the key rows' scalars only, before the wgmma forward (it forms q0 itself)
//   attn_hyp_dq_store_{f16,bf16}: dq_i = hyp_grad·(dq_acc_i − (a_i/q0_i)·q_i) after the fused backward,
//       with_lane_row's rows (the dQ kernel's epilogue, lorentz_dq_epilogue, from the f32 sums).
#include "../flash/flash_bwd.cuh"
#include "../flash/flash_fwd.cuh"
#include "../flash/flash_fwd_wg.cuh"
#include "../flash/flash_fwd_ws.cuh"
#include "../flash/flash_bwd_wg.cuh"
#include "../flash/flash_bwd_ws.cuh"
#include "lorentz_tile.cuh"  // the hyperbolic scores' hooks (Score::Ops)
#include "hyp_simt.cuh"

namespace attn {

// Σ x_d² of a row in f64 (each lane's elements, then the lanes of the row), the elements read as
// LaneRow lays them.
template <class LR, typename T>
__device__ __forceinline__ double row_sum_sq_f64(const LR& lr, const T* x) {
    float v[LR::kE];
    lr.load(x, v);
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < LR::kE; ++i) s = fma((double)v[i], (double)v[i], s);
    return lr.sum(s);
}

template <typename T, bool kQuery>
__device__ __forceinline__ void hyp_rows(const AttnParams& p, int h) {
    const int b = blockIdx.z;
    const SeqInfo si(p, b);
    const double c = p.curvature;
    with_lane_row<T>(p.head_dim, [&](auto lr, int n) {
        if (n >= (kQuery ? si.len_q : si.key_rows(p))) return;
        const T* x = static_cast<const T*>(kQuery ? p.q : p.k) + (kQuery ? si.q_off(p, n, h) : si.k_off(p, n, h));
        const double s2 = row_sum_sq_f64(lr, x);
        double n2 = 0.0;
        if (!kQuery && p.midpoint) n2 = c * row_sum_sq_f64(lr, static_cast<const T*>(p.v) + si.v_off(p, n, h));
        if (lr.lane != 0) return;
        const long long at = kQuery ? si.stats_index(p, h, n) : si.key_index(p, h, n);
        const float x0 = lorentz_time_coord(c, s2), norm = (float)sqrt(s2);
        if (kQuery) {
            p.x0q[at] = x0;
            p.nq[at] = norm;
        } else {
            p.x0k[at] = x0;
            p.nk[at] = norm;
            if (p.midpoint) {
                const bool clamped = n2 > kKleinMaxNorm2;
                const double m2 = clamped ? kKleinMaxNorm2 : n2;  // a NaN norm stays NaN (fmin would return the bound)
                p.lgk[at] = (float)(-0.5 * log1p(-m2));
                p.dgk[at] = clamped ? 0.f : (float)(c / (1.0 - m2));
            }
        }
    });
}

}  // namespace attn

#define ATTN_HYP_DQ_STORE(DT, T)                                                                                   \
    extern "C" __global__ void __launch_bounds__(128) attn_hyp_dq_store_##DT(const __grid_constant__ AttnParams p) { \
        attn::dq_acc_store_rows<T, true>(p);                                                                                \
    }

ATTN_HYP_DQ_STORE(f16, __half)
ATTN_HYP_DQ_STORE(bf16, __nv_bfloat16)

// One launch for both: grid.y walks the query heads, then the key heads.
#define ATTN_HYP_ROWS(DT, T)                                                                                       \
    extern "C" __global__ void __launch_bounds__(128) attn_hyp_rows_##DT(const __grid_constant__ AttnParams p) {    \
        if ((int)blockIdx.y < p.heads_q)                                                                           \
            attn::hyp_rows<T, true>(p, blockIdx.y);                                                                \
        else                                                                                                       \
            attn::hyp_rows<T, false>(p, blockIdx.y - p.heads_q);                                                   \
    }

// The keys' scalars only (grid.y: the key heads), before the wgmma forward, which forms q0 from its own
// Q tile (lorentz_q0_from_tile; dispatch::forward_forms_q0): half the row kernel's bytes.
#define ATTN_HYP_ROWS_K(DT, T)                                                                                      \
    extern "C" __global__ void __launch_bounds__(128) attn_hyp_rows_k_##DT(const __grid_constant__ AttnParams p) { \
        attn::hyp_rows<T, false>(p, blockIdx.y);                                                                   \
    }

ATTN_HYP_ROWS_K(f16, __half)
ATTN_HYP_ROWS_K(bf16, __nv_bfloat16)
ATTN_HYP_ROWS(f32, float)
ATTN_HYP_ROWS(f16, __half)
ATTN_HYP_ROWS(bf16, __nv_bfloat16)

#define ATTN_HYP(NAME, SCORE, DT, T, D)                                                                            \
    extern "C" __global__ void __launch_bounds__(attn::kThreads)                                                   \
        attn_hyperbolic_##NAME##_fwd_##DT##_d##D(const __grid_constant__ AttnParams p) {                            \
        attn::flash_fwd<T, D, SCORE>(p);                                                                           \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(attn::kThreads)                                                   \
        attn_hyperbolic_##NAME##_bwd_dq_##DT##_d##D(const __grid_constant__ AttnParams p) {                         \
        attn::flash_bwd_dq<T, D, SCORE>(p);                                                                        \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(attn::kThreads)                                                   \
        attn_hyperbolic_##NAME##_bwd_dkdv_##DT##_d##D(const __grid_constant__ AttnParams p) {                       \
        attn::flash_bwd_dkdv<T, D, SCORE>(p);                                                                      \
    }

#define ATTN_HYP_DTYPES(NAME, SCORE, D)         \
    ATTN_HYP(NAME, SCORE, f16, __half, D)       \
    ATTN_HYP(NAME, SCORE, bf16, __nv_bfloat16, D)

#define ATTN_HYP_DIMS(NAME, SCORE)      \
    ATTN_HYP_DTYPES(NAME, SCORE, 32)    \
    ATTN_HYP_DTYPES(NAME, SCORE, 64)    \
    ATTN_HYP_DTYPES(NAME, SCORE, 96)    \
    ATTN_HYP_DTYPES(NAME, SCORE, 128)   \
    ATTN_HYP_DTYPES(NAME, SCORE, 256)

ATTN_HYP_DIMS(sq_lorentz, attn::SqLorentzScore)
ATTN_HYP_DIMS(geodesic, attn::GeodesicScore)

ATTN_FLASH_FWD_WG_ALL(attn_hyperbolic_sq_lorentz, attn::SqLorentzScore)
ATTN_FLASH_FWD_WG_ALL(attn_hyperbolic_geodesic, attn::GeodesicScore)
ATTN_FLASH_BWD_WG_ALL(attn_hyperbolic_sq_lorentz, attn::SqLorentzScore)
ATTN_FLASH_BWD_WG_ALL(attn_hyperbolic_geodesic, attn::GeodesicScore)
ATTN_FLASH_BWD_FUSED_WG_ALL(attn_hyperbolic_sq_lorentz, attn::SqLorentzScore)
ATTN_FLASH_BWD_FUSED_WG_ALL(attn_hyperbolic_geodesic, attn::GeodesicScore)

// SUFFIX: f32 for the f32 calls, exact_{f16,bf16} for KernelConfig::hyperbolic_exact.
#define ATTN_HYP_SIMT(NAME, SCORE, SUFFIX, T)                                                                      \
    extern "C" __global__ void __launch_bounds__(128)                                                              \
        attn_hyperbolic_##NAME##_fwd_##SUFFIX(const __grid_constant__ AttnParams p) {                               \
        attn::hyp_simt_fwd<SCORE, T>(p);                                                                           \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                                              \
        attn_hyperbolic_##NAME##_bwd_dq_##SUFFIX(const __grid_constant__ AttnParams p) {                            \
        attn::hyp_simt_bwd_dq<SCORE, T>(p);                                                                        \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                                              \
        attn_hyperbolic_##NAME##_bwd_dkdv_##SUFFIX(const __grid_constant__ AttnParams p) {                          \
        attn::hyp_simt_bwd_dkdv<SCORE, T>(p);                                                                      \
    }

ATTN_HYP_SIMT(sq_lorentz, attn::SqLorentzScore, f32, float)
ATTN_HYP_SIMT(geodesic, attn::GeodesicScore, f32, float)
ATTN_HYP_SIMT(sq_lorentz, attn::SqLorentzScore, exact_f16, __half)
ATTN_HYP_SIMT(geodesic, attn::GeodesicScore, exact_f16, __half)
ATTN_HYP_SIMT(sq_lorentz, attn::SqLorentzScore, exact_bf16, __nv_bfloat16)
ATTN_HYP_SIMT(geodesic, attn::GeodesicScore, exact_bf16, __nv_bfloat16)

// The warp-specialised Hopper forward (sm_90a only): attn_hyperbolic_sq_lorentz, attn_hyperbolic_geodesic_fwd_ws_{dt}_d{64,128}.
ATTN_FLASH_FWD_WS_ALL(attn_hyperbolic_sq_lorentz, attn::SqLorentzScore)
ATTN_FLASH_FWD_WS_ALL(attn_hyperbolic_geodesic, attn::GeodesicScore)

// The warp-specialised Hopper backward (sm_90a only): attn_hyperbolic_{sq_lorentz,geodesic}_bwd_{dq,dkdv}_ws_{dt}_d{64,128}
// (the dK/dV kernel at D = 64 with 64-query blocks, LorentzWsDkvTile).
ATTN_FLASH_BWD_DQ_WS_ALL(attn_hyperbolic_sq_lorentz, attn::SqLorentzScore)
ATTN_FLASH_BWD_DQ_WS_ALL(attn_hyperbolic_geodesic, attn::GeodesicScore)
ATTN_FLASH_BWD_WS_ALL(attn_hyperbolic_sq_lorentz, attn::SqLorentzScore)
ATTN_FLASH_BWD_WS_ALL(attn_hyperbolic_geodesic, attn::GeodesicScore)
// The warp-specialised fused backward (sm_90a only): attn_hyperbolic_{sq_lorentz,geodesic}_bwd_fused_ws_{dt}_d{64,128},
// and for calls whose every tile is fast attn_hyperbolic_sq_lorentz_bwd_fused_ws_even_bf16_d64 (Euclidean, 128-query blocks)
// (LorentzWsDkvTile; dQ's row sums into p.dq_rowsum, finished by attn_hyp_dq_store).
ATTN_FLASH_BWD_FUSED_WS_ALL(attn_hyperbolic_sq_lorentz, attn::SqLorentzScore)
ATTN_FLASH_BWD_FUSED_WS_EVEN(attn_hyperbolic_sq_lorentz, attn::SqLorentzScore)
ATTN_FLASH_BWD_FUSED_WS_ALL(attn_hyperbolic_geodesic, attn::GeodesicScore)
