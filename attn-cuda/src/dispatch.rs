//! Exhaustive dispatch: (family, pass, dtype, head dim) → one compiled kernel, or a typed
//! `Unsupported` error. No default arm picks a kernel: every supported combination is listed.
//!
//! | family     | dtype     | head dims                 | kernels                                   |
//! |------------|-----------|---------------------------|-------------------------------------------|
//! | softmax    | f16, bf16 | 32, 64, 96, 128, 256      | `attn_softmax_{pass}_{dt}_d{D}` (mma.sync)  |
//! | cosine_sim | f16, bf16 | 16, 32, 64, 96, 128, 256  | `attn_cosine_sim_{pass}_{dt}_d{D}`          |
//! | both       | f32       | the family's head dims    | `attn_{family}_{pass}_f32` (SIMT, exact f32) |

use crate::heuristics::{self, Tile};
use attn_core::{AttnError, AttnSpec, DType, FamilyKind, Pass};

/// Name used in `Unsupported` errors.
pub(crate) const BACKEND: &str = "attn-cuda";

/// The three flash kernels of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    Forward,
    BwdDq,
    BwdDkdv,
}

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::Forward => "fwd",
            Stage::BwdDq => "bwd_dq",
            Stage::BwdDkdv => "bwd_dkdv",
        }
    }
    fn pass(self) -> Pass {
        match self {
            Stage::Forward => Pass::Forward,
            Stage::BwdDq | Stage::BwdDkdv => Pass::Backward,
        }
    }
}

/// Which fatbin a kernel lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Module {
    Softmax,
    CosineSim,
    SimtF32,
    Common,
}

impl Module {
    pub(crate) fn file(self) -> &'static str {
        match self {
            Module::Softmax => "softmax",
            Module::CosineSim => "cosine_sim",
            Module::SimtF32 => "simt_f32",
            Module::Common => "common",
        }
    }
}

/// A resolved kernel: where it is, its name, and how to launch it over the problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Kernel {
    pub module: Module,
    pub name: String,
    /// Dynamic shared memory in bytes.
    pub smem: usize,
    pub grid: (usize, usize, usize),
    /// Threads per block.
    pub threads: u32,
}

fn dtype_tag(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
    }
}

/// Head dims with kernels, per family.
pub(crate) fn head_dims(family: FamilyKind) -> &'static [usize] {
    match family {
        FamilyKind::Softmax => &[32, 64, 96, 128, 256],
        FamilyKind::CosineSim => &[16, 32, 64, 96, 128, 256],
        FamilyKind::Taylor | FamilyKind::Hyperbolic => &[],
    }
}

fn unsupported(spec: &AttnSpec, pass: Pass, what: String) -> AttnError {
    AttnError::Unsupported {
        op: spec.op(pass),
        backend: BACKEND,
        what,
    }
}

/// Check the combination once per call: family, head dims, sizes that fit the kernels' i32 indices.
pub(crate) fn check_supported(spec: &AttnSpec, pass: Pass) -> Result<(), AttnError> {
    let family = spec.family_kind();
    let module = match family {
        FamilyKind::Softmax => "softmax",
        FamilyKind::CosineSim => "cosine_sim",
        // Taylor runs its own state kernels (`crate::taylor`), routed before this flash dispatch.
        FamilyKind::Taylor | FamilyKind::Hyperbolic => {
            return Err(unsupported(
                spec,
                pass,
                format!("the {} family has no flash-skeleton CUDA kernel", family.name()),
            ))
        }
    };
    let d = spec.head_dim();
    if !head_dims(family).contains(&d) {
        return Err(unsupported(
            spec,
            pass,
            format!("{module} head dim {d} (supported: {:?})", head_dims(family)),
        ));
    }
    if spec.head_dim_v() != d {
        return Err(unsupported(
            spec,
            pass,
            format!(
                "a value head dim {} different from the query/key head dim {d}",
                spec.head_dim_v()
            ),
        ));
    }
    let limit = i32::MAX as usize;
    for (what, n) in [
        ("total_q", spec.total_q()),
        ("total_k", spec.total_k()),
        ("seq_q + seq_k", spec.seq_q() + spec.seq_k()),
    ] {
        if n > limit {
            return Err(unsupported(
                spec,
                pass,
                format!("{what} = {n} beyond the kernels' i32 row index"),
            ));
        }
    }
    Ok(())
}

/// The flash kernel of one stage. Assumes [`check_supported`] passed.
pub(crate) fn flash_kernel(spec: &AttnSpec, stage: Stage) -> Result<Kernel, AttnError> {
    let pass = stage.pass();
    let d = spec.head_dim();
    let (family, module) = match spec.family_kind() {
        FamilyKind::Softmax => ("softmax", Module::Softmax),
        FamilyKind::CosineSim => ("cosine_sim", Module::CosineSim),
        other => {
            return Err(unsupported(
                spec,
                pass,
                format!("the {} family has no CUDA kernel yet", other.name()),
            ))
        }
    };
    let (b, hq, hkv) = (spec.batch(), spec.heads_q(), spec.heads_kv());
    if spec.dtype() == DType::F32 {
        let rows = heuristics::SIMT_ROWS;
        let grid = match stage {
            Stage::Forward | Stage::BwdDq => (heuristics::blocks(spec.seq_q(), rows), hq, b),
            Stage::BwdDkdv => (heuristics::blocks(spec.seq_k(), rows), hkv, b),
        };
        return Ok(Kernel {
            module: Module::SimtF32,
            name: format!("attn_{family}_{}_f32", stage.name()),
            smem: 0,
            grid,
            threads: heuristics::THREADS,
        });
    }
    let elem = spec.dtype().size();
    let missing = || unsupported(spec, pass, format!("{family} head dim {d}"));
    let (tile, smem): (Tile, usize) = match stage {
        Stage::Forward => (
            heuristics::fwd_tile(d).ok_or_else(missing)?,
            heuristics::fwd_smem(d, elem).ok_or_else(missing)?,
        ),
        Stage::BwdDq => (
            heuristics::dq_tile(d).ok_or_else(missing)?,
            heuristics::dq_smem(d, elem).ok_or_else(missing)?,
        ),
        Stage::BwdDkdv => (
            heuristics::dkdv_tile(d).ok_or_else(missing)?,
            heuristics::dkdv_smem(d, elem).ok_or_else(missing)?,
        ),
    };
    let grid = match stage {
        Stage::Forward | Stage::BwdDq => (heuristics::blocks(spec.seq_q(), tile.bm), hq, b),
        Stage::BwdDkdv => (heuristics::blocks(spec.seq_k(), tile.bn) * (d / tile.da), hkv, b),
    };
    Ok(Kernel {
        module,
        name: format!("attn_{family}_{}_{}_d{d}", stage.name(), dtype_tag(spec.dtype())),
        smem,
        grid,
        threads: heuristics::THREADS,
    })
}

/// Row kernels of the backward (`common.cu`), one warp per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowKernel {
    Delta,
    InvNormQ,
    InvNormK,
    L2normBwdQ,
    L2normBwdK,
    DbiasReduce,
}

pub(crate) fn row_kernel(spec: &AttnSpec, which: RowKernel) -> Kernel {
    let rows = heuristics::SIMT_ROWS;
    let (b, hq, hkv) = (spec.batch(), spec.heads_q(), spec.heads_kv());
    let over_q = (heuristics::blocks(spec.seq_q(), rows), hq, b);
    let over_k = (heuristics::blocks(spec.seq_k(), rows), hkv, b);
    let (stem, grid) = match which {
        RowKernel::Delta => ("bwd_delta", over_q),
        RowKernel::InvNormQ => ("inv_norm_q", over_q),
        RowKernel::InvNormK => ("inv_norm_k", over_k),
        RowKernel::L2normBwdQ => ("l2norm_bwd_q", over_q),
        RowKernel::L2normBwdK => ("l2norm_bwd_k", over_k),
        // A grid-stride loop: enough blocks to fill the GPU, never more than the elements need.
        RowKernel::DbiasReduce => (
            "dbias_reduce",
            (heuristics::blocks(spec.bias_len(), 256).clamp(1, 4096), 1, 1),
        ),
    };
    Kernel {
        module: Module::Common,
        name: format!("attn_{stem}_{}", dtype_tag(spec.dtype())),
        smem: 0,
        grid,
        threads: if which == RowKernel::DbiasReduce {
            256
        } else {
            heuristics::THREADS
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::{Aggregation, AttnProblem, Family, HypScore};

    fn spec(family: Family, dtype: DType, d: usize) -> AttnSpec {
        AttnProblem::new(family, dtype, 2, 4, 2, 100, 130, d)
            .validate()
            .expect("valid problem")
    }

    #[test]
    fn every_supported_combination_resolves_to_a_named_kernel() {
        for (family, kind) in [
            (Family::softmax(), FamilyKind::Softmax),
            (Family::cosine_sim(), FamilyKind::CosineSim),
        ] {
            for &d in head_dims(kind) {
                for dtype in DType::ALL {
                    let s = spec(family, dtype, d);
                    check_supported(&s, Pass::Forward).expect("supported");
                    for stage in [Stage::Forward, Stage::BwdDq, Stage::BwdDkdv] {
                        let k = flash_kernel(&s, stage).expect("kernel");
                        assert!(
                            k.name
                                .starts_with(&format!("attn_{}_{}", kind.name(), stage.name())),
                            "{k:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn grids_cover_tails_and_split_columns() {
        let s = spec(Family::softmax(), DType::BF16, 256);
        assert_eq!(flash_kernel(&s, Stage::Forward).expect("kernel").grid, (2, 4, 2));
        // 130 keys → 3 key tiles of 64, two column blocks each, one block per kv head.
        assert_eq!(flash_kernel(&s, Stage::BwdDkdv).expect("kernel").grid, (6, 2, 2));
        let f = spec(Family::softmax(), DType::F32, 64);
        assert_eq!(flash_kernel(&f, Stage::BwdDq).expect("kernel").grid, (25, 4, 2));
    }

    #[test]
    fn unsupported_combinations_are_typed_errors() {
        let bad_dim = spec(Family::softmax(), DType::BF16, 48);
        assert!(matches!(
            check_supported(&bad_dim, Pass::Forward),
            Err(AttnError::Unsupported { .. })
        ));
        let softmax16 = spec(Family::softmax(), DType::F16, 16);
        assert!(matches!(
            check_supported(&softmax16, Pass::Forward),
            Err(AttnError::Unsupported { .. })
        ));
        let hyperbolic = spec(
            Family::hyperbolic(HypScore::Geodesic, Aggregation::Euclidean),
            DType::F32,
            64,
        );
        assert!(matches!(
            check_supported(&hyperbolic, Pass::Backward),
            Err(AttnError::Unsupported { .. })
        ));
        let dv = AttnProblem::new(Family::softmax(), DType::BF16, 1, 1, 1, 8, 8, 64)
            .with_head_dim_v(32)
            .validate()
            .expect("valid problem");
        let err = check_supported(&dv, Pass::Forward).expect_err("Dv != D");
        assert!(err.to_string().contains("value head dim 32"), "{err}");
    }
}
