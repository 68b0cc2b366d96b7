//! Loading the `taylor` fatbin and launching its kernels: the only `unsafe` launches of the Taylor family.
//!
//! The module is loaded once per CUDA context (the fatbins embedded by build.rs) and its functions are
//! looked up once and configured for their dynamic shared memory.

use crate::error::{CudaAttnError, Result};
use crate::runtime::{after_launch, launch_config, launch_error, FunctionCache};
use crate::taylor::heuristics::THREADS;
use crate::taylor::params::TaylorParams;
use attn_core::Op;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, PushKernelArg};
use cudarc::nvrtc::Ptx;
use std::sync::{Arc, Mutex, OnceLock};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

/// The fatbin's name in build.rs's kernel list.
const FATBIN: &str = "taylor";

/// One kernel launch: name, grid `(x, heads, batch)` and dynamic shared memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Launch {
    pub name: String,
    pub grid: (usize, usize, usize),
    pub smem: usize,
}

/// The loaded module of one context, the functions looked up so far, and the device's SM count (for the
/// grids of kernels that loop over their work: read once, not per call).
pub(crate) struct Kernels {
    module: Arc<CudaModule>,
    functions: FunctionCache,
    pub sms: usize,
}

type Cache = Mutex<Vec<(usize, Arc<Kernels>)>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(Vec::new()))
}

/// The Taylor kernels of `ctx`, loading the module on first use.
pub(crate) fn kernels_for(ctx: &Arc<CudaContext>, op: Op) -> Result<Arc<Kernels>> {
    let bytes = embedded::FATBINS
        .and_then(|all| all.iter().find(|(name, _)| *name == FATBIN))
        .map(|(_, b)| *b)
        .ok_or(CudaAttnError::KernelsNotBuilt { op })?;
    let key = ctx.cu_ctx() as usize;
    // A poisoned lock only means another thread panicked mid-lookup; the cache holds fully built entries.
    let mut entries = cache().lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, k)) = entries.iter().find(|(c, _)| *c == key) {
        return Ok(k.clone());
    }
    let sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let kernels = Arc::new(Kernels {
        module: ctx.load_module(Ptx::from_binary(bytes.to_vec()))?,
        functions: FunctionCache::default(),
        sms: usize::try_from(sms).unwrap_or(1).max(1),
    });
    entries.push((key, kernels.clone()));
    Ok(kernels)
}

impl Kernels {
    fn function(&self, launch: &Launch) -> Result<CudaFunction> {
        self.functions.get(&self.module, &launch.name, launch.smem)
    }

    /// Launch one kernel with `params` on `stream`. The caller guarantees that every pointer in `params`
    /// addresses a live device buffer of the length the spec requires (checked before params are built).
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        launch: &Launch,
        params: &TaylorParams,
        op: Op,
    ) -> Result<()> {
        let f = self.function(launch)?;
        let cfg = launch_config(op, &launch.name, launch.grid, THREADS, launch.smem)?;
        let mut builder = stream.launch_builder(&f);
        builder.arg(params);
        // SAFETY: `params` is the #[repr(C)] mirror of the kernel's only parameter; every pointer in it
        // was taken from a buffer whose length was checked against the spec (or allocated here for the
        // call's scratch), and those buffers outlive the enqueued launch (the caller holds them and their
        // stream guards until every launch of the call is enqueued; cudarc frees in stream order). Grid and
        // shared memory come from `taylor::heuristics`, the mirror of the kernels' tiles; a kernel given
        // less shared memory than its layout traps rather than writing past it.
        unsafe { builder.launch(cfg) }.map_err(|source| launch_error(op, &launch.name, &cfg, source))?;
        after_launch(stream, op, &launch.name, &cfg)
    }
}
