//! Errors of the benchmark tool. Attention errors keep their op and shapes; everything else names
//! the file, tensor or argument at fault.

use attn_core::AttnError;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Attn(#[from] AttnError),
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// An attn-cuda call failed: its own text (an `Unsupported` family or head dim, no kernels, ...).
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] attn_cuda::CudaAttnError),
    /// A CUDA driver call of the harness itself (events, memory pool, copies) failed.
    #[cfg(feature = "cuda")]
    #[error("CUDA driver error: {0}")]
    Driver(#[from] attn_cuda::cudarc::driver::DriverError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("safetensors {path}: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    #[error("invalid `{arg}`: {reason}")]
    InvalidArgument { arg: &'static str, reason: String },
    #[error("plot {path}: {reason}")]
    Plot { path: PathBuf, reason: String },
    /// An implementation that is not available in this build or on this machine.
    #[error("{implementation} unavailable: {reason}")]
    Unavailable {
        implementation: &'static str,
        reason: String,
    },
}

impl BenchError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        BenchError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
