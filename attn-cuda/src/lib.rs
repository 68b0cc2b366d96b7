//! # attn-cuda
//!
//! Fused attention kernels for NVIDIA GPUs, built with nvcc (sm_90a and sm_80 SASS, compute_80 PTX)
//! and launched through cudarc on the caller's stream.
//!
//! Families: softmax (docs/math.md §1: `s = scale·q·k`, optional softcap, `+ bias`,
//! `o = softmax(s)·v`, LSE saved in f32), cosine-sim (§2: `s = scale·q̂·k̂` with the l2-norms fused
//! into the tiles and the fixed offset `−scale` instead of a running max) and hyperbolic (§4, Lorentz
//! model of curvature `−c`, `x0 = √(1/c + ‖x‖²)`): squared Lorentz `s = −β d²_L = 2β/c + 2β(q·k − q0 k0)`
//! or geodesic `s = −(β/√c)·arccosh(max(c(q0 k0 − q·k), 1 + ACOSH_EPS))`, aggregated by `Σ w v` or by the
//! Einstein midpoint (softmax with the per-key bias `log γ_j`, `γ_j = 1/√(1 − min(c‖v_j‖², KLEIN_MAX_NORM2))`,
//! its gradient `(Σ_i dS_ij)·c γ_j² v_j` into dv_j). Taylor linear attention runs its own state kernels.
//! One FlashAttention-2 skeleton serves the softmax-like families: Q tiles resident in shared memory,
//! K/V streamed with cp.async double buffering, `mma.sync.m16n8k16` (f16/bf16 in, f32 accumulate) fed
//! by `ldmatrix`, online softmax in registers. The score function is a compile-time parameter of the
//! skeleton (`kernels/flash/score.h`): the raw `q·k` comes from the tensor cores, the hyperbolic
//! time coordinates are f32 per-row scalars (row kernels; no (D+1)-wide copy is ever stored), and
//! the gradient through them, `∂x0/∂x = x/x0`, is applied from row sums in the epilogues.
//!
//! Backward (FlashAttention-2): P recomputed from LSE; δ = rowsum(dO∘o) by a row kernel; dQ by a
//! kernel over query tiles, dK/dV by a kernel over key tiles that loops over the GQA group —
//! deterministic, no atomics. f32 inputs run exact f32 SIMT kernels (tf32 is not f32-accurate).
//!
//! Options: causal top-left / bottom-right with `Nq ≠ Nk`, key padding, packed varlen, sliding
//! window, additive bias with broadcast dims and its gradient, GQA/MQA, fully masked rows → zeros
//! (LSE = −∞). Head dims 32, 64, 96, 128, 256 (and 16 for cosine-sim), `Dv = D`; anything else
//! is a typed `Unsupported` error (so is a geodesic curvature outside `[1e-12, 1e12]`).
//!
//! Empty calls (a batch of 0, `seq_q = 0` or `seq_k = 0`) launch no kernel: their buffers are checked,
//! then o and the gradients are zeroed and the statistics set to the no-key value (LSE −∞, Taylor
//! denominator 0) by memsets on the stream; `forward_views` and `backward_views` do this before
//! routing, so it needs neither the kernels nor a supported head dim (docs/nan.md, "Empty calls").
//!
//! Without nvcc at build time the crate still builds and every call that launches a kernel returns
//! [`CudaAttnError::KernelsNotBuilt`]; without a GPU [`CudaAttn::new`] returns
//! [`CudaAttnError::NoGpu`].
//!
//! Kernel variants: [`KernelConfig`] (its default is the tuned routing; docs/configuration.md), given
//! to [`CudaAttn::with_config`]. The environment is read for two switches only:
//! `ATTN_CUDA_CHECK_LAUNCHES=1` (every launch waits for its kernel and names it in an error) and
//! `ATTN_CUDA_PORTABLE=1` ([`KernelConfig::portable`] for backends built by `new` / `with_stream`).

mod backend;
mod check;
mod config;
mod decode;
mod dispatch;
mod empty;
mod error;
mod heuristics;
mod params;
mod runtime;
mod taylor;
mod views;

pub use backend::{kernels_built, CudaAttn};
pub use config::{KernelConfig, Route};
pub use cudarc;
pub use decode::{KvCacheIo, KvCacheWorkspace};
pub use error::{CudaAttnError, Result};
#[doc(hidden)]
pub use taylor::chain_stall_for_tests;
pub use taylor::{DecodeShape, TaylorDecodeState};
pub use views::{BackwardViews, DeviceElem, ForwardViews};
