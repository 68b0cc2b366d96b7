//! The Taylor kernels' launches: kernels of the `taylor` fatbin with a [`TaylorParams`], through the
//! runtime's module loader and launch path (`runtime::Kernels::launch_params`).

use crate::dispatch::Module;
use crate::error::Result;
use crate::runtime::{self, Kernels};
use crate::taylor::heuristics::THREADS;
use crate::taylor::params::TaylorParams;
use attn_core::Op;
use cudarc::driver::CudaStream;

/// One kernel launch: name, grid `(x, heads, batch)` and dynamic shared memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Launch {
    pub name: String,
    pub grid: (usize, usize, usize),
    pub smem: usize,
}

/// Launch one Taylor kernel with `params` on `stream`. The caller guarantees that every pointer in
/// `params` addresses a live device buffer of the length the spec requires (checked before params
/// are built, or allocated for the call's scratch) and holds those buffers until every launch of the
/// call is enqueued.
pub(crate) fn launch(
    kernels: &Kernels,
    stream: &CudaStream,
    launch: &Launch,
    params: &TaylorParams,
    op: Op,
) -> Result<()> {
    let l = runtime::Launch {
        module: Module::Taylor,
        name: &launch.name,
        grid: launch.grid,
        threads: THREADS,
        smem: launch.smem,
    };
    // SAFETY: `params` is the #[repr(C)] mirror of the Taylor kernels' only parameter (`TaylorParams`,
    // kernels/taylor/taylor_common.cuh); the caller's guarantee above covers its pointers. Grid and
    // shared memory come from `taylor::heuristics`, the mirror of the kernels' tiles; a kernel given
    // less shared memory than its layout traps rather than writing past it.
    unsafe { kernels.launch_params(stream, &l, params, op) }
}
