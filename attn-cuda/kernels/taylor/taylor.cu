// Taylor linear attention (docs/math.md §3): every kernel of the family, for f16, bf16 (tensor cores,
// f32 sums) and f32 (CUDA cores, exact f32) at head dims 16, 32, 64, 128 (value head dim = head dim).
// The host (attn_cuda::taylor) runs them in this order (a sweep: dense, fold, prefix, read):
//   forward:  fold, prefix → forward (f16/bf16: the state read, the dense part
//             and o = num/den of a probe tile in one kernel); f32: dense_value, fold, prefix, read_value
//             → finalize_fwd
//   backward: prep_grads
//             → dense_grad, fold, prefix, read_grad (fwd roles: dû)
//             → dense_value, dense_grad, fold, prefix, read_value, read_grad (reverse roles: dṽ, dk̂)
//             → finalize_dq, finalize_dkdv
//   decode:   decode_prefill (after a forward); decode_step → decode_reduce → finalize_fwd
// Order 1, f16/bf16, rows 16-byte aligned: order1_fold replaces fold in every sweep, and a non-causal
// forward is order1_fold, prefix → order1_forward (taylor_order1.cuh); a causal one (D ≤ 64) order1_fold,
// prefix (f32 sums in place, no copies) → order1_causal, or, where every sequence has as many queries as
// keys, the single pass order1_chain (taylor_order1_chain.cuh; bf16 at D = 64 on Hopper order1_chain_wg,
// taylor_order1_chain_wg.cuh).
// A non-causal backward is prep_grads →
// order1_fold, prefix → order1_dq → order1_fold, prefix (reversed) → order1_dkdv (taylor_order1_bwd.cuh);
// a causal one (D ≤ 64) the same with order1_causal_dq and order1_causal_dkdv, f32 sums in place
// (taylor_order1_causal.cuh).
// Names: attn_taylor_{prep_grads,finalize_fwd,finalize_dq,finalize_dkdv}_{dt},
//        attn_taylor_{dense,read}_{value,grad}_{dt}_d{D}, attn_taylor_fold_{dt}_d{D}, attn_taylor_prefix_{dt},
//        attn_taylor_forward_{f16,bf16}_d{D},
//        attn_taylor_decode_{step,prefill}_{dt}_d{D}, attn_taylor_decode_reduce,
//        attn_taylor_order1_{fold,forward,dq,dkdv}_{f16,bf16}_d{D},
//        attn_taylor_order1_causal{,_dq,_dkdv}_{f16,bf16}_d{16,32,64},
//        attn_taylor_order1_chain_{f16,bf16}_d{16,32,64}, attn_taylor_order1_chain_wg_bf16_d64,
//        attn_taylor2_wg_{fold,reduce,read}_bf16_d64.
// Order 2, bf16, D = 64, no causal mask, on Hopper (taylor_wg.cuh): a forward is wg_fold → wg_reduce (with
// several splits of the keys only) → wg_read (attn_cuda::taylor::Call::wg_forward).
#include "taylor_decode.cuh"
#include "taylor_dense.cuh"
#include "taylor_order1.cuh"
#include "taylor_order1_bwd.cuh"
#include "taylor_order1_causal.cuh"
#include "taylor_order1_chain.cuh"
#include "taylor_order1_chain_wg.cuh"
#include "taylor_rows.cuh"
#include "taylor_state.cuh"
#include "taylor_wg.cuh"

#define ATTN_TAYLOR_ROW(NAME, DT, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_##NAME##_##DT(const __grid_constant__ TaylorParams p) {                                   \
        attn::taylor_##NAME<T>(p);                                                                           \
    }

#define ATTN_TAYLOR_ROWS(DT, T)               \
    ATTN_TAYLOR_ROW(prep_grads, DT, T)        \
    ATTN_TAYLOR_ROW(finalize_fwd, DT, T)      \
    ATTN_TAYLOR_ROW(finalize_dq, DT, T)       \
    ATTN_TAYLOR_ROW(finalize_dkdv, DT, T)

ATTN_TAYLOR_ROWS(f32, float)

#define ATTN_TAYLOR_PREFIX(DT, T)                                                                             \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_prefix_##DT(const __grid_constant__ TaylorParams p) {                                     \
        attn::taylor_prefix<T>(p);                                                                           \
    }
ATTN_TAYLOR_PREFIX(f32, float)
ATTN_TAYLOR_PREFIX(f16, __half)
ATTN_TAYLOR_PREFIX(bf16, __nv_bfloat16)

extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)
    attn_taylor_decode_reduce(const __grid_constant__ TaylorParams p) {
    attn::taylor_decode_reduce(p);
}
ATTN_TAYLOR_ROWS(f16, __half)
ATTN_TAYLOR_ROWS(bf16, __nv_bfloat16)

// DENSE(value|grad) is the tensor-core kernel for f16/bf16 and the SIMT one for f32.
#define ATTN_TAYLOR_SWEEP(DT, T, D, DENSE_VALUE, DENSE_GRAD)                                                  \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_dense_value_##DT##_d##D(const __grid_constant__ TaylorParams p) {                         \
        DENSE_VALUE(p);                                                                                      \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_dense_grad_##DT##_d##D(const __grid_constant__ TaylorParams p) {                          \
        DENSE_GRAD(p);                                                                                       \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_fold_##DT##_d##D(const __grid_constant__ TaylorParams p) {                                \
        attn::taylor_fold<T, D>(p);                                                                          \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_read_value_##DT##_d##D(const __grid_constant__ TaylorParams p) {                          \
        attn::taylor_read<T, D, false>(p);                                                                   \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_read_grad_##DT##_d##D(const __grid_constant__ TaylorParams p) {                           \
        attn::taylor_read<T, D, true>(p);                                                                    \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_decode_step_##DT##_d##D(const __grid_constant__ TaylorParams p) {                         \
        attn::taylor_decode_step<T, D>(p);                                                                   \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_decode_prefill_##DT##_d##D(const __grid_constant__ TaylorParams p) {                      \
        attn::taylor_decode_prefill<T, D>(p);                                                                \
    }

#define ATTN_TAYLOR_FORWARD(DT, T, D)                                                                         \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_forward_##DT##_d##D(const __grid_constant__ TaylorParams p) {                             \
        attn::taylor_forward_tile<T, D>(p);                                                                  \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_order1_fold_##DT##_d##D(const __grid_constant__ TaylorParams p) {                         \
        attn::taylor1_fold<T, D>(p);                                                                         \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_order1_forward_##DT##_d##D(const __grid_constant__ TaylorParams p) {                      \
        attn::taylor1_forward<T, D>(p);                                                                      \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_order1_dq_##DT##_d##D(const __grid_constant__ TaylorParams p) {                           \
        attn::taylor1_backward<T, D, false>(p);                                                              \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_order1_dkdv_##DT##_d##D(const __grid_constant__ TaylorParams p) {                         \
        attn::taylor1_backward<T, D, true>(p);                                                               \
    }

// The order-1 causal forward at D ≤ 64 (at D = 128 its f32 state and tiles would not fit sm_80's 163 KB).
#define ATTN_TAYLOR_ORDER1_CAUSAL(D)                                                                          \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_order1_causal_f16_d##D(const __grid_constant__ TaylorParams p) {                          \
        attn::taylor1_forward_causal<__half, D>(p);                                                          \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_order1_causal_bf16_d##D(const __grid_constant__ TaylorParams p) {                         \
        attn::taylor1_forward_causal<__nv_bfloat16, D>(p);                                                   \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_order1_causal_dq_f16_d##D(const __grid_constant__ TaylorParams p) {                       \
        attn::taylor1_dq_causal<__half, D>(p);                                                               \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_order1_causal_dq_bf16_d##D(const __grid_constant__ TaylorParams p) {                      \
        attn::taylor1_dq_causal<__nv_bfloat16, D>(p);                                                        \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_order1_causal_dkdv_f16_d##D(const __grid_constant__ TaylorParams p) {                     \
        attn::taylor1_dkdv_causal<__half, D>(p);                                                             \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)                                       \
        attn_taylor_order1_causal_dkdv_bf16_d##D(const __grid_constant__ TaylorParams p) {                    \
        attn::taylor1_dkdv_causal<__nv_bfloat16, D>(p);                                                      \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads, 2)                                    \
        attn_taylor_order1_chain_f16_d##D(const __grid_constant__ TaylorParams p) {                           \
        attn::taylor1_forward_chain<__half, D>(p);                                                           \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads, 2)                                    \
        attn_taylor_order1_chain_bf16_d##D(const __grid_constant__ TaylorParams p) {                          \
        attn::taylor1_forward_chain<__nv_bfloat16, D>(p);                                                    \
    }

#define ATTN_TAYLOR_DIM(D)                                                                                     \
    ATTN_TAYLOR_SWEEP(f32, float, D, (attn::taylor_dense_simt<D, false>), (attn::taylor_dense_simt<D, true>)) \
    ATTN_TAYLOR_SWEEP(f16, __half, D, (attn::taylor_dense_mma<__half, D, false>),                            \
                      (attn::taylor_dense_mma<__half, D, true>))                                             \
    ATTN_TAYLOR_SWEEP(bf16, __nv_bfloat16, D, (attn::taylor_dense_mma<__nv_bfloat16, D, false>),             \
                      (attn::taylor_dense_mma<__nv_bfloat16, D, true>))                                      \
    ATTN_TAYLOR_FORWARD(f16, __half, D)                                                                      \
    ATTN_TAYLOR_FORWARD(bf16, __nv_bfloat16, D)

ATTN_TAYLOR_DIM(16)
ATTN_TAYLOR_DIM(32)
ATTN_TAYLOR_DIM(64)
ATTN_TAYLOR_DIM(128)
ATTN_TAYLOR_ORDER1_CAUSAL(16)
ATTN_TAYLOR_ORDER1_CAUSAL(32)
ATTN_TAYLOR_ORDER1_CAUSAL(64)

// The single-pass causal order-1 forward on Hopper tensor cores (taylor_order1_chain_wg.cuh): bf16, D = 64,
// sm_90a (the body is empty for other targets; the host launches it on compute capability 9.0 only).
extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads, 2)
    attn_taylor_order1_chain_wg_bf16_d64(const __grid_constant__ TaylorParams p) {
    attn::taylor1_forward_chain_wg(p);
}

// Order 2 on Hopper tensor cores (taylor_wg.cuh; causal: Nq = Nk, per-segment states): bf16, D = 64, sm_90a (the bodies
// are empty for other targets; the host launches them on compute capability 9.0 only).
extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads, 2)
    attn_taylor2_wg_fold_bf16_d64(const __grid_constant__ TaylorParams p) {
    attn::taylor_wg_fold(p);
}
extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads)
    attn_taylor2_wg_reduce_bf16_d64(const __grid_constant__ TaylorParams p) {
    attn::taylor_wg_reduce(p);
}
extern "C" __global__ void __launch_bounds__(attn::kTaylorThreads, 2)
    attn_taylor2_wg_read_bf16_d64(const __grid_constant__ TaylorParams p) {
    attn::taylor_wg_read(p);
}
