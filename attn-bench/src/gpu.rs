//! The GPU side of a run (feature `cuda`): one attn-cuda handle on GPU 0 shared by every point,
//! CUDA-event timing, the peak device memory of a call, and the device's copy bandwidth.
//!
//! **Timing.** Each timed call is bracketed by two CUDA events recorded on the kernels' stream; all
//! runs are enqueued back to back and the stream is synchronised once at the end, so a sample is the
//! device time from the first kernel of the call to the last (launch gaps included where the host
//! cannot keep the device busy, as with PyTorch's event timing of the baselines).
//!
//! **Peak memory.** cudarc allocates through the device's stream-ordered memory pool
//! (`cuMemAllocAsync`) whenever the device supports pools (every Hopper does), and attn-cuda's
//! scratch goes through the same pool. Before a point's set-up the pool's `USED_MEM_HIGH` watermark
//! is reset and its `USED_MEM_CURRENT` noted; after set-up and one call (synchronised) the peak is
//! `USED_MEM_HIGH − USED_MEM_CURRENT(before)`: inputs, outputs and every scratch buffer the call
//! allocates, at its largest (`peak_source = cuda_pool_used_high`). The pool keeps what it reserved
//! while a point runs (release threshold at its maximum, so timed calls do not map memory) and is
//! trimmed back to nothing between points. On a device without pools the fallback is
//! `cuMemGetInfo`'s free memory before set-up minus after the call (`cuda_mem_get_info_delta`),
//! which sees the buffers held after the call but not scratch freed inside it.
//!
//! **Bandwidth.** Best of ten device-to-device copies of 1 GiB after three warm-ups, counting bytes
//! read plus bytes written, as the python baselines measure it.

use crate::error::BenchError;
use crate::impls::Peak;
use attn_cuda::cudarc::driver::sys::{self, CUevent_flags, CUmemPool_attribute};
use attn_cuda::cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError};
use attn_cuda::CudaAttn;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

/// The shared handle: attn-cuda on GPU 0's default stream, and the device's name.
pub struct Gpu {
    pub attn: CudaAttn,
    pub name: String,
}

impl Gpu {
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.attn.stream()
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        self.attn.stream().context()
    }
}

fn open() -> Result<Gpu, String> {
    let attn = CudaAttn::new(0).map_err(|e| e.to_string())?;
    if !attn_cuda::kernels_built() {
        return Err(
            "attn-cuda was built without its kernels (nvcc was not found when it was \
                    compiled: put nvcc on PATH, set ATTN_REQUIRE_NVCC=1 and rebuild)"
                .into(),
        );
    }
    let ctx = attn.stream().context().clone();
    let name = ctx.name().map_err(|e| format!("cuDeviceGetName: {e}"))?;
    if ctx.has_async_alloc() {
        let pool = current_pool(&ctx).map_err(|e| format!("cuDeviceGetMemPool: {e}"))?;
        set_pool_attr(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            u64::MAX,
        )
        .map_err(|e| format!("cuMemPoolSetAttribute: {e}"))?;
    }
    Ok(Gpu { attn, name })
}

/// The shared GPU handle, opened on first use, or why there is none (no driver, no device, no
/// kernels in this build).
pub fn gpu() -> Result<&'static Gpu, String> {
    static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();
    GPU.get_or_init(open).as_ref().map_err(Clone::clone)
}

fn current_pool(ctx: &Arc<CudaContext>) -> Result<sys::CUmemoryPool, DriverError> {
    ctx.bind_to_thread()?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: writes one pool handle into `pool`; the device handle comes from a live context.
    unsafe { sys::cuDeviceGetMemPool(&mut pool, ctx.cu_device()) }.result()?;
    Ok(pool)
}

fn pool_attr(pool: sys::CUmemoryPool, attr: CUmemPool_attribute) -> Result<u64, DriverError> {
    let mut value: u64 = 0;
    // SAFETY: the attributes read here (USED_MEM_*) are cuuint64_t, written into `value`.
    unsafe { sys::cuMemPoolGetAttribute(pool, attr, &mut value as *mut u64 as *mut c_void) }.result()?;
    Ok(value)
}

fn set_pool_attr(pool: sys::CUmemoryPool, attr: CUmemPool_attribute, value: u64) -> Result<(), DriverError> {
    let mut value = value;
    // SAFETY: the attributes set here (RELEASE_THRESHOLD, USED_MEM_HIGH) are cuuint64_t, read
    // from `value`.
    unsafe { sys::cuMemPoolSetAttribute(pool, attr, &mut value as *mut u64 as *mut c_void) }.result()
}

/// Give the pool's unused reservations back to the device (between points).
pub fn trim_pool(ctx: &Arc<CudaContext>) -> Result<(), DriverError> {
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    let pool = current_pool(ctx)?;
    // SAFETY: trims a live pool; memory in use is never released by a trim.
    unsafe { sys::cuMemPoolTrimTo(pool, 0) }.result()
}

const MIB: f64 = 1024.0 * 1024.0;

enum How {
    Pool { pool: sys::CUmemoryPool, base: u64 },
    MemInfo { free_before: usize },
}

/// The peak device memory of set-up plus one call (module doc).
pub struct DevicePeak {
    ctx: Arc<CudaContext>,
    how: How,
}

impl DevicePeak {
    /// Start before the point's first allocation.
    pub fn start(ctx: &Arc<CudaContext>) -> Result<Self, DriverError> {
        let how = if ctx.has_async_alloc() {
            let pool = current_pool(ctx)?;
            let base = pool_attr(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
            // Resetting the watermark (only 0 is accepted) restarts it from the current use.
            set_pool_attr(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)?;
            How::Pool { pool, base }
        } else {
            How::MemInfo {
                free_before: ctx.mem_get_info()?.0,
            }
        };
        Ok(DevicePeak {
            ctx: ctx.clone(),
            how,
        })
    }

    /// The peak since [`DevicePeak::start`]; call after synchronising the first call.
    pub fn read(&self) -> Result<Peak, DriverError> {
        Ok(match self.how {
            How::Pool { pool, base } => {
                let high = pool_attr(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?;
                Peak {
                    mib: high.saturating_sub(base) as f64 / MIB,
                    source: "cuda_pool_used_high",
                }
            }
            How::MemInfo { free_before } => {
                let free_now = self.ctx.mem_get_info()?.0;
                Peak {
                    mib: free_before.saturating_sub(free_now) as f64 / MIB,
                    source: "cuda_mem_get_info_delta",
                }
            }
        })
    }
}

/// Time `runs` calls of `f` with CUDA events on `stream` (module doc), in ms each.
pub fn time_events(
    stream: &Arc<CudaStream>,
    runs: usize,
    mut f: impl FnMut() -> Result<(), BenchError>,
) -> Result<Vec<f64>, BenchError> {
    let ctx = stream.context();
    let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let events = (0..runs)
        .map(|_| Ok((ctx.new_event(timing)?, ctx.new_event(timing)?)))
        .collect::<Result<Vec<(CudaEvent, CudaEvent)>, DriverError>>()?;
    for (start, end) in &events {
        start.record(stream)?;
        f()?;
        end.record(stream)?;
    }
    stream.synchronize()?;
    events
        .iter()
        .map(|(start, end)| Ok(f64::from(start.elapsed_ms(end)?)))
        .collect()
}

/// Device-to-device copy bandwidth in GB/s (module doc).
pub fn copy_bandwidth_gbs(g: &Gpu) -> Result<f64, BenchError> {
    const BYTES: usize = 1 << 30;
    let s = g.stream();
    let src = s.alloc_zeros::<u8>(BYTES)?;
    let mut dst = s.alloc_zeros::<u8>(BYTES)?;
    for _ in 0..3 {
        s.memcpy_dtod(&src, &mut dst)?;
    }
    let samples = time_events(s, 10, || Ok(s.memcpy_dtod(&src, &mut dst)?))?;
    drop((src, dst));
    s.synchronize()?;
    trim_pool(g.context())?;
    let best_ms = samples.into_iter().fold(f64::INFINITY, f64::min);
    Ok(2.0 * BYTES as f64 / (best_ms * 1e-3) / 1e9)
}
