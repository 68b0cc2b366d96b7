//! The implementations a run can measure, each one entry of [`ImplId`].
//!
//! An implementation turns a grid point into a [`Runner`]: set-up (inputs, saved forward for a
//! backward-only pass) happens in [`prepare`], and each [`Runner::call`] is one timed pass. One that
//! cannot run a point says why with an error, and the run records the point as skipped with that
//! reason: an implementation missing from this build or machine is never a zero or a pass.
//!
//! - `attn-cpu-ref`: [`attn_cpu_ref::forward`] / [`attn_cpu_ref::backward`] on storage dtypes.
//! - `attn-cpu-fast`: [`attn_cpu_ref::fast`], the f32 path attn-candle runs on CPU tensors
//!   ([`cpu_fast`]; softmax-like families).
//! - `candle_naive`: the same attention as candle ops on the CPU (scores by matmul, softmax or the
//!   Taylor polynomial, matmul), backward through candle's autograd ([`candle_naive`]).
//! - `attn-cuda`: the fused kernels on GPU 0 ([`cuda`], with the `cuda` cargo feature): each call
//!   is enqueued on the kernels' stream and timed with CUDA events; peak device memory comes from
//!   the stream-ordered memory pool. Built without the feature, without kernels (no nvcc at build
//!   time) or run without a GPU, every point is skipped with that reason; a family or head dim the
//!   kernels do not cover is skipped with attn-cuda's `Unsupported` text.
//!
//! Timing of host implementations is the wall clock around each call ([`Runner::time`]'s default);
//! a device implementation overrides [`Runner::sync`], [`Runner::time`], [`Runner::peak`] and
//! [`Runner::device`].

use crate::error::BenchError;
use crate::grid::GridPoint;
use attn_core::{Aggregation, AttnSpec, FamilySpec, HypScore, TaylorOrder};
use std::fmt;
use std::str::FromStr;
use std::time::Instant;

pub mod candle_naive;
pub mod cpu_fast;
mod cpu_ref;
#[cfg(feature = "cuda")]
pub mod cuda;

/// One benchmarked implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImplId {
    /// The f64-accumulating CPU reference (ours).
    AttnCpuRef,
    /// The fused CUDA kernels (ours).
    AttnCuda,
    /// Baseline: candle ops, matmul + softmax + matmul, autograd backward.
    CandleNaive,
    /// The f32-accumulating CPU fast path (ours).
    AttnCpuFast,
}

impl ImplId {
    pub const ALL: [ImplId; 4] = [
        ImplId::AttnCpuRef,
        ImplId::AttnCuda,
        ImplId::CandleNaive,
        ImplId::AttnCpuFast,
    ];

    /// The `impl` field of a row.
    pub fn label(self) -> &'static str {
        match self {
            ImplId::AttnCpuRef => "attn-cpu-ref",
            ImplId::AttnCuda => "attn-cuda",
            ImplId::CandleNaive => "candle_naive",
            ImplId::AttnCpuFast => "attn-cpu-fast",
        }
    }

    /// Ours (as opposed to a baseline).
    pub fn is_ours(self) -> bool {
        matches!(self, ImplId::AttnCpuRef | ImplId::AttnCuda | ImplId::AttnCpuFast)
    }
}

impl fmt::Display for ImplId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for ImplId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ImplId::ALL.into_iter().find(|i| i.label() == s).ok_or_else(|| {
            format!(
                "unknown implementation `{s}` (known: attn-cpu-ref, attn-cuda, candle_naive, attn-cpu-fast)"
            )
        })
    }
}

/// Whether a row's `impl` is one of ours; every other name is a baseline.
pub fn is_ours_label(label: &str) -> bool {
    // A paged-cache row's label is its implementation's with `-paged<size>` (GridPoint::impl_label).
    let base = match label.rsplit_once("-paged") {
        Some((base, size)) if size.parse::<usize>().is_ok() => base,
        _ => label,
    };
    base.parse::<ImplId>().map(ImplId::is_ours).unwrap_or(false)
}

/// Peak memory of set-up plus one call, as an implementation measured it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peak {
    pub mib: f64,
    /// The `peak_source` of the row, e.g. `cuda_pool_used_high`.
    pub source: &'static str,
}

/// One prepared point: each call runs the pass once.
pub trait Runner {
    /// Run the pass once (a device implementation enqueues it and returns).
    fn call(&mut self) -> Result<(), BenchError>;

    /// Wait until every call so far has finished.
    fn sync(&mut self) -> Result<(), BenchError> {
        Ok(())
    }

    /// `runs` timed calls, in ms each: by default the host wall clock around each call.
    fn time(&mut self, runs: usize) -> Result<Vec<f64>, BenchError> {
        let mut samples = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            self.call()?;
            samples.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(samples)
    }

    /// How [`Runner::time`] measures: `host_clock` or `cuda_event`.
    fn timer(&self) -> &'static str {
        "host_clock"
    }

    /// The peak memory of set-up and the first call when the implementation measures it itself
    /// (device memory); `None` leaves it to the host's resident-set measurement.
    fn peak(&mut self) -> Option<Peak> {
        None
    }

    /// The device the calls run on (the row's `gpu`); `None` is the host CPU.
    fn device(&self) -> Option<String> {
        None
    }
}

/// The name of the GPU attn-cuda runs on, or why it cannot run here.
pub fn cuda_device() -> Result<String, String> {
    #[cfg(feature = "cuda")]
    {
        cuda::device_name()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(NO_CUDA_FEATURE.into())
    }
}

/// The copy bandwidth of attn-cuda's GPU in GB/s, or why it cannot be measured here.
pub fn cuda_bandwidth_gbs() -> Result<f64, String> {
    #[cfg(feature = "cuda")]
    {
        let g = crate::gpu::gpu()?;
        crate::gpu::copy_bandwidth_gbs(g).map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(NO_CUDA_FEATURE.into())
    }
}

/// Why attn-cuda cannot run in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub(crate) const NO_CUDA_FEATURE: &str =
    "attn-bench was built without the `cuda` feature (rebuild with `--features cuda`)";

/// Set up `id` for a point: allocate and fill the inputs (seeded), and for a backward-only pass run
/// the forward it starts from.
pub fn prepare(
    id: ImplId,
    point: &GridPoint,
    spec: &AttnSpec,
    seed: u64,
) -> Result<Box<dyn Runner>, BenchError> {
    if let Some(page_size) = point.page_size {
        return prepare_paged(id, point, spec, page_size, seed);
    }
    match id {
        ImplId::AttnCpuRef => cpu_ref::prepare(spec, point.pass, seed),
        ImplId::CandleNaive => candle_naive::prepare(spec, point.pass, seed),
        ImplId::AttnCpuFast => cpu_fast::prepare(spec, point.pass, seed),
        #[cfg(feature = "cuda")]
        ImplId::AttnCuda => cuda::prepare(spec, point.pass, seed),
        #[cfg(not(feature = "cuda"))]
        ImplId::AttnCuda => Err(BenchError::Unavailable {
            implementation: "attn-cuda",
            reason: NO_CUDA_FEATURE.into(),
        }),
    }
}

/// A decode point on a paged KV cache (`[num_pages, page_size, Hkv, D]` pages and a `[B, max_pages]`
/// i32 block table, the vLLM / FlashInfer layout): attn-cuda's `forward_kv_cache` on a cache holding
/// the point's keys; every other implementation has no paged cache and skips the point with that
/// reason (never a contiguous call under a paged label).
pub fn prepare_paged(
    id: ImplId,
    point: &GridPoint,
    _spec: &AttnSpec,
    page_size: usize,
    seed: u64,
) -> Result<Box<dyn Runner>, BenchError> {
    match id {
        #[cfg(feature = "cuda")]
        ImplId::AttnCuda => cuda::prepare_paged(point, page_size, seed),
        #[cfg(not(feature = "cuda"))]
        ImplId::AttnCuda => {
            let _ = (point, seed);
            Err(BenchError::Unavailable {
                implementation: "attn-cuda",
                reason: NO_CUDA_FEATURE.into(),
            })
        }
        _ => {
            let _ = (point, seed);
            Err(BenchError::Unavailable {
                implementation: id.label(),
                reason: format!("paged KV cache (page size {page_size}): {id} has no paged cache"),
            })
        }
    }
}

/// The `params` field: the family's resolved parameters, e.g. `scale=0.125`.
///
/// ```
/// use attn_bench::impls::family_params;
/// use attn_core::{AttnProblem, DType, Family};
/// let spec = AttnProblem::new(Family::taylor(2), DType::F32, 1, 1, 1, 4, 4, 64).validate()?;
/// assert_eq!(family_params(&spec), "a=1,1,0.5 scale=0.125");
/// # Ok::<(), attn_core::AttnError>(())
/// ```
pub fn family_params(spec: &AttnSpec) -> String {
    match *spec.family() {
        FamilySpec::Softmax { scale, softcap } => match softcap {
            Some(c) => format!("scale={scale} softcap={c}"),
            None => format!("scale={scale}"),
        },
        FamilySpec::CosineSim {
            scale,
            qk_l2norm,
            eps,
        } => {
            format!("scale={scale} l2norm={qk_l2norm} eps={eps:e}")
        }
        FamilySpec::Taylor {
            order,
            a,
            scale,
            qk_l2norm,
            ..
        } => {
            let a = match order {
                TaylorOrder::One => format!("a={},{}", a[0], a[1]),
                TaylorOrder::Two => format!("a={},{},{}", a[0], a[1], a[2]),
            };
            let norm = if qk_l2norm { " l2norm" } else { "" };
            format!("{a} scale={scale}{norm}")
        }
        FamilySpec::Hyperbolic {
            score,
            curvature,
            beta,
            aggregation,
        } => {
            let score = match score {
                HypScore::Geodesic => "geodesic",
                HypScore::SquaredLorentz => "sq_lorentz",
            };
            let agg = match aggregation {
                Aggregation::Euclidean => "euclidean",
                Aggregation::EinsteinMidpoint => "einstein",
            };
            format!("{score} c={curvature} beta={beta} agg={agg}")
        }
    }
}
