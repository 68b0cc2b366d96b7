//! The crate's error: the spec-level errors of attn-core plus what only a GPU backend can hit.

use attn_core::{AttnError, Op};
use cudarc::driver::DriverError;

#[derive(Debug, thiserror::Error)]
pub enum CudaAttnError {
    /// A shape, argument or unsupported-combination error (names the op and the shapes).
    #[error(transparent)]
    Attn(#[from] AttnError),
    /// The CUDA driver reported an error (launch failure, out of memory, ...).
    #[error("CUDA driver error: {0}")]
    Cuda(#[from] DriverError),
    /// The driver refused or failed a kernel launch; names the kernel and its configuration.
    #[error("{op}: launching {kernel} (grid {grid:?}, {threads} threads, {smem} B dynamic shared memory) failed: {source}")]
    Launch {
        op: Op,
        kernel: String,
        grid: (u32, u32, u32),
        threads: u32,
        smem: u32,
        source: DriverError,
    },
    /// A kernel's bounded wait for another block ran out (a bug in the kernel or its launch; reported
    /// under `ATTN_CUDA_CHECK_LAUNCHES=1`, a trap otherwise).
    #[error("{op}: {kernel} stopped: a block waited {waited_ms} ms for another block's flag (a kernel bug; please report it)")]
    Stalled { op: Op, kernel: String, waited_ms: u64 },
    /// A size the crate computed does not fit the driver's types (a bug, reported rather than wrapped).
    #[error("attn-cuda internal error: {what}")]
    Internal { what: String },
    /// The crate was built without nvcc (or nvcc failed and `ATTN_REQUIRE_NVCC` was unset).
    #[error("{op}: attn-cuda was built without its kernels (nvcc was not found at build time; run `cargo xtask setup-cuda` and rebuild)")]
    KernelsNotBuilt { op: Op },
    /// A [`crate::KernelConfig`] field out of its range.
    #[error("attn-cuda kernel configuration: `{field}`: {reason}")]
    Config { field: &'static str, reason: String },
    /// No CUDA driver library or no device on this machine.
    #[error("no usable CUDA GPU: {reason}")]
    NoGpu { reason: String },
}

pub type Result<T, E = CudaAttnError> = std::result::Result<T, E>;
