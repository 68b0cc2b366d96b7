//! The implementations a run can measure, each one entry of [`ImplId`].
//!
//! An implementation turns a grid point into a [`Runner`]: set-up (inputs, saved forward for a
//! backward-only pass) happens in [`prepare`], and each [`Runner::call`] is one timed pass. One that
//! cannot run a point says why with an error, and the run records the point as skipped with that
//! reason: an implementation missing from this build or machine is never a zero or a pass.
//!
//! - `attn-cpu-ref`: [`attn_cpu_ref::forward`] / [`attn_cpu_ref::backward`] on storage dtypes.
//! - `candle_naive`: the same attention as candle ops on the CPU (scores by matmul, softmax or the
//!   Taylor polynomial, matmul), backward through candle's autograd ([`candle_naive`]).
//! - `attn-cuda`: the fused kernels. Its launch API does not exist yet, so every point is skipped
//!   with that reason; it comes in behind a `cuda` cargo feature, as does `candle_naive` on a CUDA
//!   device (candle's `cuda` feature, GPU.md).

use crate::error::BenchError;
use crate::grid::GridPoint;
use attn_core::{Aggregation, AttnSpec, FamilySpec, HypScore, TaylorOrder};
use std::fmt;
use std::str::FromStr;

pub mod candle_naive;
mod cpu_ref;

/// One benchmarked implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImplId {
    /// The f64-accumulating CPU reference (ours).
    AttnCpuRef,
    /// The fused CUDA kernels (ours).
    AttnCuda,
    /// Baseline: candle ops, matmul + softmax + matmul, autograd backward.
    CandleNaive,
}

impl ImplId {
    pub const ALL: [ImplId; 3] = [ImplId::AttnCpuRef, ImplId::AttnCuda, ImplId::CandleNaive];

    /// The `impl` field of a row.
    pub fn label(self) -> &'static str {
        match self {
            ImplId::AttnCpuRef => "attn-cpu-ref",
            ImplId::AttnCuda => "attn-cuda",
            ImplId::CandleNaive => "candle_naive",
        }
    }

    /// Ours (as opposed to a baseline).
    pub fn is_ours(self) -> bool {
        matches!(self, ImplId::AttnCpuRef | ImplId::AttnCuda)
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
            format!("unknown implementation `{s}` (known: attn-cpu-ref, attn-cuda, candle_naive)")
        })
    }
}

/// Whether a row's `impl` is one of ours; every other name is a baseline.
pub fn is_ours_label(label: &str) -> bool {
    label.parse::<ImplId>().map(ImplId::is_ours).unwrap_or(false)
}

/// One prepared point: each call runs the pass once.
pub trait Runner {
    fn call(&mut self) -> Result<(), BenchError>;
}

/// Set up `id` for a point: allocate and fill the inputs (seeded), and for a backward-only pass run
/// the forward it starts from.
pub fn prepare(
    id: ImplId,
    point: &GridPoint,
    spec: &AttnSpec,
    seed: u64,
) -> Result<Box<dyn Runner>, BenchError> {
    match id {
        ImplId::AttnCpuRef => cpu_ref::prepare(spec, point.pass, seed),
        ImplId::CandleNaive => candle_naive::prepare(spec, point.pass, seed),
        ImplId::AttnCuda => Err(BenchError::Unavailable {
            implementation: "attn-cuda",
            reason: "attn-bench is built without the `cuda` feature (attn-cuda has no launch API yet)".into(),
        }),
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
            l2norm_qk,
            eps,
        } => {
            format!("scale={scale} l2norm={l2norm_qk} eps={eps:e}")
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
