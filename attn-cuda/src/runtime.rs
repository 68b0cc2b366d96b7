//! Modules and launches of every kernel family. Each fatbin embedded by build.rs is loaded once per
//! CUDA context, on the first launch of one of its kernels, and shared by every `CudaAttn` on that
//! context; functions are looked up once and configured for their dynamic shared memory. The only
//! `unsafe` launches of the crate are here.

use crate::config::{Hopper, KernelConfig};
use crate::dispatch::{Kernel, Module};
use crate::error::{CudaAttnError, Result};
use crate::params::AttnParams;
use attn_core::Op;
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute_enum};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, DriverError, LaunchConfig, PushKernelArg,
};
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

/// The kernels of one context: its modules, each loaded from the fatbins embedded by build.rs on its
/// first launch, the functions looked up so far, and the device's compute capability and SM count.
/// Nothing here depends on a backend's [`KernelConfig`]: two backends with different configurations
/// share one context's modules and functions, and each derives its [`Hopper`] routing per call
/// ([`Kernels::hopper`]).
pub(crate) struct Kernels {
    ctx: Arc<CudaContext>,
    fatbins: &'static [(&'static str, &'static [u8])],
    modules: Mutex<HashMap<Module, Arc<CudaModule>>>,
    functions: FunctionCache,
    /// Resident blocks per SM asked of the driver so far: (module, kernel, threads, dynamic shared
    /// memory) → blocks ([`Kernels::blocks_per_sm`]).
    occupancy: Mutex<HashMap<(Module, String, u32, usize), usize>>,
    /// The device's compute capability (major, minor).
    cc: (i32, i32),
    /// The device's SM count (at least 1), for the grids of kernels that loop over their work.
    pub sms: usize,
}

/// Functions looked up so far: (module, name) → (function, dynamic shared memory it is configured for).
#[derive(Default)]
pub(crate) struct FunctionCache(Mutex<HashMap<(Module, String), (CudaFunction, usize)>>);

impl FunctionCache {
    /// `name` from `module`, opted in to at least `smem` bytes of dynamic shared memory.
    ///
    /// The driver's default limit of 48 KiB counts static and dynamic shared memory together, so a
    /// kernel with static arrays fails at 48 KiB of dynamic memory or a little below it (the Taylor
    /// gradient read at D = 32 asked for exactly 49 152 bytes beside its static probe table and got
    /// `CUDA_ERROR_INVALID_VALUE` on the H100). Every function with dynamic shared memory is therefore
    /// opted in to what it uses.
    fn get(&self, key: Module, module: &Arc<CudaModule>, name: &str, smem: usize) -> Result<CudaFunction> {
        // A poisoned lock only means another thread panicked mid-lookup; entries are whole.
        let mut functions = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let entry = (key, name.to_string());
        if let Some((f, configured)) = functions.get(&entry) {
            if *configured >= smem {
                return Ok(f.clone());
            }
        }
        let f = module.load_function(name)?;
        if smem > 0 {
            let bytes = i32::try_from(smem).map_err(|_| CudaAttnError::Internal {
                what: format!("{name}: {smem} bytes of shared memory do not fit the driver's i32"),
            })?;
            f.set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes,
            )?;
        }
        functions.insert(entry, (f.clone(), smem));
        Ok(f)
    }
}

/// The launch configuration of kernel `name` on grid `(x, heads, batch)`: a typed error naming the
/// kernel when a dimension is zero or past the driver's limit.
pub(crate) fn launch_config(
    op: Op,
    name: &str,
    grid: (usize, usize, usize),
    threads: u32,
    smem: usize,
) -> Result<LaunchConfig> {
    let dim = |n: usize, max: usize, what: &str| -> Result<u32> {
        if n == 0 || n > max {
            return Err(attn_core::AttnError::Unsupported {
                op,
                backend: crate::dispatch::BACKEND,
                what: format!("{name} grid of {n} blocks along {what} (limit {max})"),
            }
            .into());
        }
        Ok(n as u32)
    };
    Ok(LaunchConfig {
        grid_dim: (
            dim(grid.0, i32::MAX as usize, "x")?,
            dim(grid.1, 65_535, "heads")?,
            dim(grid.2, 65_535, "batch")?,
        ),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: u32::try_from(smem).map_err(|_| CudaAttnError::Internal {
            what: format!("{name}: {smem} bytes of shared memory"),
        })?,
    })
}

/// Whether every launch waits for its kernel to finish and reports the kernel's own failure under its
/// name: `ATTN_CUDA_CHECK_LAUNCHES=1`, for finding which kernel faults (an asynchronous fault otherwise
/// surfaces at a later, unrelated call). Slow; for debugging only.
pub(crate) fn check_launches() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("ATTN_CUDA_CHECK_LAUNCHES").is_ok_and(|v| v.trim() == "1"))
}

/// After a launch of `name` with `cfg` was enqueued: under `ATTN_CUDA_CHECK_LAUNCHES=1`, wait for it and
/// name it in the error if it failed.
pub(crate) fn after_launch(stream: &CudaStream, op: Op, name: &str, cfg: &LaunchConfig) -> Result<()> {
    if check_launches() {
        stream
            .synchronize()
            .map_err(|source| launch_error(op, name, cfg, source))?;
    }
    Ok(())
}

/// A failed launch of kernel `name` with `cfg`, as an error that names both (built only on failure).
pub(crate) fn launch_error(op: Op, name: &str, cfg: &LaunchConfig, source: DriverError) -> CudaAttnError {
    CudaAttnError::Launch {
        op,
        kernel: name.to_string(),
        grid: cfg.grid_dim,
        threads: cfg.block_dim.0,
        smem: cfg.shared_mem_bytes,
        source,
    }
}

type Cache = Mutex<Vec<(usize, Arc<Kernels>)>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(Vec::new()))
}

/// The kernels of `ctx` (each module loads on its first launch).
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
    let cc = ctx.compute_capability()?;
    let sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let kernels = Arc::new(Kernels {
        ctx: ctx.clone(),
        fatbins,
        modules: Mutex::new(HashMap::new()),
        functions: FunctionCache::default(),
        occupancy: Mutex::new(HashMap::new()),
        cc,
        sms: usize::try_from(sms).unwrap_or(1).max(1),
    });
    entries.push((key, kernels.clone()));
    Ok(kernels)
}

impl Kernels {
    /// The Hopper routing of a call under `config` on this context's device.
    pub(crate) fn hopper(&self, config: &KernelConfig) -> Hopper {
        Hopper::new(self.cc, config)
    }

    /// `module`, loaded on its first use.
    fn module(&self, module: Module, op: Op) -> Result<Arc<CudaModule>> {
        // A poisoned lock only means another thread panicked mid-load; entries are whole.
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = modules.get(&module) {
            return Ok(m.clone());
        }
        let bytes = self
            .fatbins
            .iter()
            .find(|(name, _)| *name == module.file())
            .map(|(_, b)| *b)
            .ok_or(CudaAttnError::KernelsNotBuilt { op })?;
        let loaded = self.ctx.load_module(Ptx::from_binary(bytes.to_vec()))?;
        modules.insert(module, loaded.clone());
        Ok(loaded)
    }

    /// Blocks of `launch`'s kernel resident on one SM at its block size and dynamic shared memory
    /// (the driver's occupancy calculator, which counts the compiled kernel's registers too), at
    /// least 1; asked once per (kernel, block size, shared memory) and remembered, so a decode step
    /// makes no driver call for it after the first.
    pub(crate) fn blocks_per_sm(&self, launch: &Launch<'_>, op: Op) -> Result<usize> {
        let key = (
            launch.module,
            launch.name.to_string(),
            launch.threads,
            launch.smem,
        );
        // A poisoned lock only means another thread panicked mid-lookup; entries are whole.
        if let Some(&n) = self.occupancy.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(n);
        }
        let module = self.module(launch.module, op)?;
        let f = self
            .functions
            .get(launch.module, &module, launch.name, launch.smem)?;
        // The occupancy calculator runs on the calling thread's current context (no stream call
        // before it need have made ours current).
        self.ctx.bind_to_thread()?;
        let n = f.occupancy_max_active_blocks_per_multiprocessor(launch.threads, launch.smem, None)?;
        let n = usize::try_from(n).unwrap_or(1).max(1);
        self.occupancy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, n);
        Ok(n)
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
        let launch = Launch {
            module: kernel.module,
            name: &kernel.name,
            grid: kernel.grid,
            threads: kernel.threads,
            smem: kernel.smem,
        };
        // SAFETY: `params` is the #[repr(C)] mirror of the flash kernels' only parameter
        // (`AttnParams`, kernels/common/params.h); the backend checked every buffer it points at
        // against the spec, and grid and shared memory match the kernel's tile configuration
        // (dispatch + heuristics mirror tiles.h).
        unsafe { self.launch_params(stream, &launch, params, op) }
    }

    /// Launch `launch` with `params` (the kernel's only parameter) on `stream`, then
    /// [`after_launch`].
    ///
    /// # Safety
    /// `P` is the `#[repr(C)]` mirror of the kernel's parameter struct; every pointer in `params`
    /// addresses a live device buffer of the length the kernel reads or writes, and those buffers
    /// outlive the enqueued launch (the caller holds them and their stream guards until every launch
    /// of the call is enqueued; cudarc frees in stream order); grid and shared memory match the
    /// kernel's layout (a kernel given less shared memory than its layout traps).
    pub(crate) unsafe fn launch_params<P: DeviceRepr>(
        &self,
        stream: &CudaStream,
        launch: &Launch<'_>,
        params: &P,
        op: Op,
    ) -> Result<()> {
        let module = self.module(launch.module, op)?;
        let f = self
            .functions
            .get(launch.module, &module, launch.name, launch.smem)?;
        let cfg = launch_config(op, launch.name, launch.grid, launch.threads, launch.smem)?;
        let mut builder = stream.launch_builder(&f);
        builder.arg(params);
        // SAFETY: the caller's contract (above).
        unsafe { builder.launch(cfg) }.map_err(|source| launch_error(op, launch.name, &cfg, source))?;
        after_launch(stream, op, launch.name, &cfg)
    }
}

/// One launch of a kernel: its module, name, grid `(x, heads, batch)`, threads per block and dynamic
/// shared memory.
pub(crate) struct Launch<'a> {
    pub module: Module,
    pub name: &'a str,
    pub grid: (usize, usize, usize),
    pub threads: u32,
    pub smem: usize,
}
