//! Modules and launches. The fatbins embedded by build.rs are loaded once per CUDA context and
//! shared by every `CudaAttn` on that context; functions are looked up once and configured for
//! their dynamic shared memory. The only `unsafe` launches of the crate are here.

use crate::dispatch::{Kernel, Module};
use crate::error::{CudaAttnError, Result};
use crate::params::AttnParams;
use attn_core::Op;
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute_enum};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DriverError, LaunchConfig, PushKernelArg,
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

/// The loaded modules of one context and the functions looked up so far.
pub(crate) struct Kernels {
    modules: HashMap<Module, Arc<CudaModule>>,
    functions: FunctionCache,
    /// Whether (and how) the forward uses the Hopper (wgmma) kernels on this context.
    pub(crate) hopper: Hopper,
    /// Pairs per section of a causal grid's work order for every call (`ATTN_CUDA_CAUSAL_SECTIONS=N`,
    /// 1 = head by head, for A/B timings); `None` (unset): heuristics::causal_sections decides.
    pub(crate) sections: Option<usize>,
}

/// The Hopper (sm_90a, wgmma) kernels on a context: `on` where the device is compute capability 9.0
/// (the only one that runs sm_90a code) unless `ATTN_CUDA_WGMMA=0`; `bwd`: the backward too, unless
/// `ATTN_CUDA_WG_BWD=0` (A/B timings of the backward alone); `fused`: where the fused backward runs
/// when a call allows it ([`FusedMode`], `ATTN_CUDA_WG_FUSED`, dispatch::fused_backward); `tile`: `ATTN_CUDA_WG_TILE=BMxBN`, a forward tile experiment
/// (heuristics::WG_TILE_VARIANTS); `ws`: where the warp-specialised forward runs ([`WsMode`],
/// `ATTN_CUDA_WG_WS`); `bwd_ws`: the warp-specialised kernels of the deterministic backward (dQ and
/// dK/dV for every score;
/// heuristics::ws_dq_tile, ws_dkdv_tile, ws_dkdv_lorentz_tile), unless `ATTN_CUDA_WG_BWD_WS=0`. All read when the context first loads the kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hopper {
    pub on: bool,
    pub bwd: bool,
    pub fused: FusedMode,
    pub tile: Option<(usize, usize)>,
    pub ws: WsMode,
    pub bwd_ws: bool,
    /// The persistent warp-specialised forward's largest grid (`ATTN_CUDA_PERSISTENT_BLOCKS`, at most
    /// the SM count); 0 (the default): one block per tile, not persistent.
    pub sms: usize,
    /// Where Taylor order 2 runs its quadratic form on these kernels (`ATTN_CUDA_TAYLOR_DENSE`).
    pub taylor_dense: DenseMode,
    /// The fused backward's kernels for calls whose every tile is fast, where a call allows them
    /// (dispatch::fused_even), unless `ATTN_CUDA_WG_EVEN=0` (A/B timings, tests of the general kernel).
    pub even: bool,
    /// Where Taylor order 2's forward (bf16, D = 64; causal where Nq = Nk) runs on the wgmma state
    /// kernels (`crate::taylor::wg_forward`, `ATTN_CUDA_TAYLOR_WG`: 0 never, 1 wherever they apply).
    pub taylor_wg: DenseMode,
}

/// Where Taylor order 2 runs as its quadratic form on the Hopper flash kernels instead of the
/// factorised state kernels (`crate::taylor::dense_on_flash`): `Measured` (the default) where the
/// sequences are short enough for it to be faster (taylor::heuristics::dense_faster); `Everywhere`
/// it has kernels (`ATTN_CUDA_TAYLOR_DENSE=1`, for tests and A/B timings); `Off` never
/// (`ATTN_CUDA_TAYLOR_DENSE=0`: the state kernels for every call).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum DenseMode {
    Off,
    #[default]
    Measured,
    Everywhere,
}

impl DenseMode {
    fn parse(v: Option<&str>) -> Self {
        match v.map(str::trim) {
            Some("0") => DenseMode::Off,
            Some("1") => DenseMode::Everywhere,
            _ => DenseMode::Measured,
        }
    }
}

/// Where the fused Hopper backward (one dK/dV kernel that also adds dQ into f32 scratch; its dQ is a
/// sum in arrival order, so not bit-reproducible) replaces the deterministic dQ and dK/dV kernels, for
/// calls that do not ask for `deterministic` and have no bias: `WarpSpecialised` (the default) where
/// the warp-specialised fused kernel exists (softmax, cosine-sim and the hyperbolic scores at D = 64
/// and 128, with the warp-specialised backward: for softmax on the H100 0–9% faster than the two
/// kernels in forward+backward, 1–3% slower at D = 128, N = 4096; kernels/NOTES.md, version 10,
/// sessions 26 and 29), as FlashAttention and SDPA default to a
/// non-deterministic backward; `Everywhere` it has a kernel, the wgmma fused kernel too (D = 128,
/// every score; `ATTN_CUDA_WG_FUSED=1`); `Off` (`ATTN_CUDA_WG_FUSED=0`): the two kernels for every call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum FusedMode {
    Off,
    #[default]
    WarpSpecialised,
    Everywhere,
}

/// Where the warp-specialised Hopper forward (heuristics::ws_fwd_tile) replaces the wgmma one:
/// `Measured` (the default) at the head dims and scores where it measured faster on the H100
/// (heuristics::ws_fwd_measured_faster); `Everywhere` it has a kernel with `ATTN_CUDA_WG_WS=1` (A/B
/// runs and its tests); `Off` with `ATTN_CUDA_WG_WS=0`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum WsMode {
    Off,
    #[default]
    Measured,
    Everywhere,
}

impl Hopper {
    pub(crate) fn new(
        cc: (i32, i32),
        wgmma: Option<&str>,
        bwd: Option<&str>,
        fused: Option<&str>,
        tile: Option<&str>,
        ws: Option<&str>,
        bwd_ws: Option<&str>,
    ) -> Self {
        let tile = tile.and_then(|t| {
            let (bm, bn) = t.trim().split_once('x')?;
            Some((bm.parse().ok()?, bn.parse().ok()?))
        });
        Hopper {
            on: cc == (9, 0) && wgmma.map(str::trim) != Some("0"),
            bwd: bwd.map(str::trim) != Some("0"),
            fused: match fused.map(str::trim) {
                Some("0") => FusedMode::Off,
                Some("1") => FusedMode::Everywhere,
                _ => FusedMode::WarpSpecialised,
            },
            tile,
            ws: match ws.map(str::trim) {
                Some("0") => WsMode::Off,
                Some("1") => WsMode::Everywhere,
                _ => WsMode::Measured,
            },
            bwd_ws: bwd_ws.map(str::trim) != Some("0"),
            sms: 0,
            taylor_dense: DenseMode::Measured,
            taylor_wg: DenseMode::Measured,
            even: true,
        }
    }
}

/// Functions looked up so far: name → (function, dynamic shared memory it is configured for).
#[derive(Default)]
pub(crate) struct FunctionCache(Mutex<HashMap<String, (CudaFunction, usize)>>);

impl FunctionCache {
    /// `name` from `module`, opted in to at least `smem` bytes of dynamic shared memory.
    ///
    /// The driver's default limit of 48 KiB counts static and dynamic shared memory together, so a
    /// kernel with static arrays fails at 48 KiB of dynamic memory or a little below it (the Taylor
    /// gradient read at D = 32 asked for exactly 49 152 bytes beside its static probe table and got
    /// `CUDA_ERROR_INVALID_VALUE` on the H100). Every function with dynamic shared memory is therefore
    /// opted in to what it uses.
    pub(crate) fn get(&self, module: &Arc<CudaModule>, name: &str, smem: usize) -> Result<CudaFunction> {
        // A poisoned lock only means another thread panicked mid-lookup; entries are whole.
        let mut functions = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((f, configured)) = functions.get(name) {
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
        functions.insert(name.to_string(), (f.clone(), smem));
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
fn check_launches() -> bool {
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
        Module::TaylorFlash,
    ] {
        let bytes = fatbins
            .iter()
            .find(|(name, _)| *name == module.file())
            .map(|(_, b)| *b)
            .ok_or(CudaAttnError::KernelsNotBuilt { op })?;
        modules.insert(module, ctx.load_module(Ptx::from_binary(bytes.to_vec()))?);
    }
    let cc = ctx.compute_capability()?;
    // ATTN_CUDA_PERSISTENT_BLOCKS=N makes the warp-specialised forward persistent with at most N
    // blocks (at most one per SM); unset or 0, one tile per block (the default).
    let sms = match std::env::var("ATTN_CUDA_PERSISTENT_BLOCKS")
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok())
    {
        Some(n) if n > 0 => {
            let count = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            n.min(count)
        }
        _ => 0,
    };
    let sections = std::env::var("ATTN_CUDA_CAUSAL_SECTIONS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok());
    let kernels = Arc::new(Kernels {
        modules,
        functions: FunctionCache::default(),
        sections,
        hopper: Hopper {
            sms: usize::try_from(sms).unwrap_or(0),
            taylor_dense: DenseMode::parse(std::env::var("ATTN_CUDA_TAYLOR_DENSE").ok().as_deref()),
            taylor_wg: DenseMode::parse(std::env::var("ATTN_CUDA_TAYLOR_WG").ok().as_deref()),
            even: std::env::var("ATTN_CUDA_WG_EVEN").ok().as_deref().map(str::trim) != Some("0"),
            ..Hopper::new(
                cc,
                std::env::var("ATTN_CUDA_WGMMA").ok().as_deref(),
                std::env::var("ATTN_CUDA_WG_BWD").ok().as_deref(),
                std::env::var("ATTN_CUDA_WG_FUSED").ok().as_deref(),
                std::env::var("ATTN_CUDA_WG_TILE").ok().as_deref(),
                std::env::var("ATTN_CUDA_WG_WS").ok().as_deref(),
                std::env::var("ATTN_CUDA_WG_BWD_WS").ok().as_deref(),
            )
        },
    });
    entries.push((key, kernels.clone()));
    Ok(kernels)
}

impl Kernels {
    fn function(&self, kernel: &Kernel, op: Op) -> Result<CudaFunction> {
        let module = self
            .modules
            .get(&kernel.module)
            .ok_or(CudaAttnError::KernelsNotBuilt { op })?;
        self.functions.get(module, &kernel.name, kernel.smem)
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
        let cfg = launch_config(op, &kernel.name, kernel.grid, kernel.threads, kernel.smem)?;
        let mut builder = stream.launch_builder(&f);
        builder.arg(params);
        // SAFETY: `params` is the #[repr(C)] mirror of the kernel's only parameter; every pointer
        // in it was taken from a buffer whose length the backend checked against the spec, and
        // those buffers outlive this call (the guards that recorded their use are held by the
        // caller until after the launch is enqueued). Grid and shared memory match the kernel's
        // tile configuration (dispatch + heuristics mirror tiles.h).
        unsafe { builder.launch(cfg) }.map_err(|source| launch_error(op, &kernel.name, &cfg, source))?;
        after_launch(stream, op, &kernel.name, &cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::{FusedMode, Hopper, WsMode};

    #[test]
    fn hopper_kernels_only_on_compute_capability_9_0_and_not_when_turned_off() {
        assert!(Hopper::new((9, 0), None, None, None, None, None, None).on);
        assert!(Hopper::new((9, 0), Some("1"), None, None, None, None, None).on);
        assert!(!Hopper::new((9, 0), Some("0"), None, None, None, None, None).on);
        assert!(!Hopper::new((9, 0), Some(" 0\n"), None, None, None, None, None).on);
        for cc in [(8, 0), (8, 9), (10, 0), (12, 0)] {
            assert!(!Hopper::new(cc, None, None, None, None, None, None).on, "{cc:?}");
        }
        assert!(Hopper::new((9, 0), None, None, None, None, None, None).bwd);
        assert!(!Hopper::new((9, 0), None, Some("0"), None, None, None, None).bwd);
        let fused = |v| Hopper::new((9, 0), None, None, v, None, None, None).fused;
        assert_eq!(fused(None), FusedMode::WarpSpecialised);
        assert_eq!(fused(Some("0")), FusedMode::Off);
        assert_eq!(fused(Some(" 1\n")), FusedMode::Everywhere);
        assert_eq!(
            Hopper::new((9, 0), None, None, None, Some("64x128"), None, None).tile,
            Some((64, 128))
        );
        assert_eq!(
            Hopper::new((9, 0), None, None, None, Some("64"), None, None).tile,
            None
        );
        assert_eq!(
            Hopper::new((9, 0), None, None, None, Some("ax64"), None, None).tile,
            None
        );
        let ws = |v| Hopper::new((9, 0), None, None, None, None, v, None).ws;
        assert_eq!(ws(None), WsMode::Measured);
        assert_eq!(ws(Some(" 1\n")), WsMode::Everywhere);
        assert_eq!(ws(Some("0")), WsMode::Off);
        assert_eq!(ws(Some("yes")), WsMode::Measured);
        let bwd_ws = |v| Hopper::new((9, 0), None, None, None, None, None, v).bwd_ws;
        assert!(bwd_ws(None) && bwd_ws(Some("1")) && !bwd_ws(Some(" 0\n")));
    }
}
