//! Modules and launches. The fatbins embedded by build.rs are loaded once per CUDA context and
//! shared by every `CudaAttn` on that context; functions are looked up once and configured for
//! their dynamic shared memory. The only `unsafe` launches of the crate are here.

use crate::dispatch::{Kernel, Module};
use crate::error::{CudaAttnError, Result};
use crate::params::AttnParams;
use attn_core::Op;
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

/// Whether this build carries kernels (nvcc was found at build time).
pub(crate) fn kernels_built() -> bool {
    embedded::FATBINS.is_some()
}

/// The loaded modules of one context and the functions looked up so far.
pub(crate) struct Kernels {
    modules: HashMap<Module, Arc<CudaModule>>,
    /// name → (function, dynamic shared memory it is configured for)
    functions: Mutex<HashMap<String, (CudaFunction, usize)>>,
}

type Cache = Mutex<Vec<(usize, Arc<Kernels>)>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(Vec::new()))
}

/// The kernels of `ctx`, loading the modules on first use.
pub(crate) fn kernels_for(ctx: &Arc<CudaContext>, op: Op) -> Result<Arc<Kernels>> {
    let Some(fatbins) = embedded::FATBINS else {
        return Err(CudaAttnError::KernelsNotBuilt { op });
    };
    let key = ctx.cu_ctx() as usize;
    // A poisoned lock only means another thread panicked mid-lookup; the cache itself is a list of
    // fully built entries, so it is still consistent.
    let mut entries = cache().lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, k)) = entries.iter().find(|(c, _)| *c == key) {
        return Ok(k.clone());
    }
    let mut modules = HashMap::new();
    for module in [
        Module::Softmax,
        Module::CosineSim,
        Module::SimtF32,
        Module::Common,
        Module::Hyperbolic,
    ] {
        let bytes = fatbins
            .iter()
            .find(|(name, _)| *name == module.file())
            .map(|(_, b)| *b)
            .ok_or(CudaAttnError::KernelsNotBuilt { op })?;
        modules.insert(module, ctx.load_module(Ptx::from_binary(bytes.to_vec()))?);
    }
    let kernels = Arc::new(Kernels {
        modules,
        functions: Mutex::new(HashMap::new()),
    });
    entries.push((key, kernels.clone()));
    Ok(kernels)
}

impl Kernels {
    fn function(&self, kernel: &Kernel, op: Op) -> Result<CudaFunction> {
        let mut functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((f, smem)) = functions.get(&kernel.name) {
            if *smem >= kernel.smem {
                return Ok(f.clone());
            }
        }
        let module = self
            .modules
            .get(&kernel.module)
            .ok_or(CudaAttnError::KernelsNotBuilt { op })?;
        let f = module.load_function(&kernel.name)?;
        if kernel.smem > 48 * 1024 {
            f.set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                kernel.smem as i32,
            )?;
        }
        functions.insert(kernel.name.clone(), (f.clone(), kernel.smem));
        Ok(f)
    }

    /// Launch `kernel` with `params` on `stream`. The caller guarantees that every pointer in
    /// `params` addresses a live device buffer of the length the spec requires (checked by the
    /// backend before the params are built).
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        kernel: &Kernel,
        params: &AttnParams,
        op: Op,
    ) -> Result<()> {
        let f = self.function(kernel, op)?;
        let (gx, gy, gz) = kernel.grid;
        let dim = |n: usize, max: usize, what: &str| -> Result<u32> {
            if n == 0 || n > max {
                return Err(attn_core::AttnError::Unsupported {
                    op,
                    backend: crate::dispatch::BACKEND,
                    what: format!("{} grid of {n} blocks along {what} (limit {max})", kernel.name),
                }
                .into());
            }
            Ok(n as u32)
        };
        let cfg = LaunchConfig {
            grid_dim: (
                dim(gx, i32::MAX as usize, "x")?,
                dim(gy, 65_535, "heads")?,
                dim(gz, 65_535, "batch")?,
            ),
            block_dim: (kernel.threads, 1, 1),
            shared_mem_bytes: kernel.smem as u32,
        };
        let mut builder = stream.launch_builder(&f);
        builder.arg(params);
        // SAFETY: `params` is the #[repr(C)] mirror of the kernel's only parameter; every pointer
        // in it was taken from a buffer whose length the backend checked against the spec, and
        // those buffers outlive this call (the guards that recorded their use are held by the
        // caller until after the launch is enqueued). Grid and shared memory match the kernel's
        // tile configuration (dispatch + heuristics mirror tiles.h).
        unsafe { builder.launch(cfg) }?;
        Ok(())
    }
}
