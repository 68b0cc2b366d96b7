//! Exhaustive dispatch: (family, pass, dtype, head dim) → one compiled kernel, or a typed
//! `Unsupported` error. No default arm picks a kernel: every supported combination is listed.
//!
//! | family     | dtype     | head dims                 | kernels                                   |
//! |------------|-----------|---------------------------|-------------------------------------------|
//! | softmax    | f16, bf16 | 32, 64, 96, 128, 256      | `attn_softmax_{pass}_{dt}_d{D}` (mma.sync)  |
//! | cosine_sim | f16, bf16 | 16, 32, 64, 96, 128, 256  | `attn_cosine_sim_{pass}_{dt}_d{D}`          |
//! | hyperbolic | f16, bf16 | 32, 64, 96, 128, 256      | `attn_hyperbolic_{score}_{pass}_{dt}_d{D}`  |
//! | all three  | f32       | the family's head dims    | `attn_{family}_{pass}_f32` (SIMT, exact f32) |
//!
//! `{score}` is `sq_lorentz` or `geodesic` (the family label); the aggregation (Euclidean or Einstein
//! midpoint) is a runtime flag of the same kernels. Hyperbolic kernels also need the per-row scalars
//! of `attn_hyp_rows_{q,k}_{dt}` (time coordinates, norms, log γ) before any of them runs.

use crate::heuristics::{self, Tile};
use crate::runtime::{FusedMode, Hopper, WsMode};
use attn_core::{AttnError, AttnSpec, DType, FamilyKind, FamilySpec, HypScore, Pass};

/// Name used in `Unsupported` errors.
pub(crate) const BACKEND: &str = "attn-cuda";

/// The flash kernels of a call: the forward, and the backward as dQ and dK/dV kernels or (Hopper,
/// see [`fused_backward`]) as one kernel that reduces dQ with f32 atomics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    Forward,
    BwdDq,
    BwdDkdv,
    BwdFused,
}

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::Forward => "fwd",
            Stage::BwdDq => "bwd_dq",
            Stage::BwdDkdv => "bwd_dkdv",
            Stage::BwdFused => "bwd_fused",
        }
    }
    fn pass(self) -> Pass {
        match self {
            Stage::Forward => Pass::Forward,
            Stage::BwdDq | Stage::BwdDkdv | Stage::BwdFused => Pass::Backward,
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
    Hyperbolic,
}

impl Module {
    pub(crate) fn file(self) -> &'static str {
        match self {
            Module::Softmax => "softmax",
            Module::CosineSim => "cosine_sim",
            Module::SimtF32 => "simt_f32",
            Module::Common => "common",
            Module::Hyperbolic => "hyperbolic",
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
    /// A Hopper (wgmma) kernel: a cosine-sim forward then reads the reciprocal norms of the inv-norm
    /// row kernels (the backward always does).
    pub hopper: bool,
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
        FamilyKind::Hyperbolic => &[32, 64, 96, 128, 256],
        FamilyKind::Taylor => &[],
    }
}

fn unsupported(spec: &AttnSpec, pass: Pass, what: String) -> AttnError {
    AttnError::Unsupported {
        op: spec.op(pass),
        backend: BACKEND,
        what,
    }
}

/// Curvatures the geodesic kernels take: they form `1/c²` and `(1 + ACOSH_EPS)/c` in f32, which stay
/// finite and normal well inside this range.
pub(crate) const GEODESIC_CURVATURE: (f32, f32) = (1e-12, 1e12);

/// Check the combination once per call: family, head dims, sizes that fit the kernels' i32 indices.
pub(crate) fn check_supported(spec: &AttnSpec, pass: Pass) -> Result<(), AttnError> {
    let family = spec.family_kind();
    let module = match *spec.family() {
        FamilySpec::Softmax { .. } => "softmax",
        FamilySpec::CosineSim { .. } => "cosine_sim",
        FamilySpec::Hyperbolic {
            score: HypScore::Geodesic,
            curvature,
            ..
        } if !(GEODESIC_CURVATURE.0..=GEODESIC_CURVATURE.1).contains(&curvature) => {
            return Err(unsupported(
                spec,
                pass,
                format!(
                    "a geodesic curvature {curvature:e} outside [{:e}, {:e}] (the kernels form 1/c² in f32)",
                    GEODESIC_CURVATURE.0, GEODESIC_CURVATURE.1
                ),
            ))
        }
        FamilySpec::Hyperbolic { .. } => "hyperbolic",
        // Taylor runs its own state kernels (`crate::taylor`), routed before this flash dispatch.
        FamilySpec::Taylor { .. } => {
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

/// Whether the backward of `spec` runs as one fused Hopper kernel (dK, dV, and dQ reduced into f32
/// with atomics, then stored by a row kernel) instead of the deterministic dQ and dK/dV kernels: on
/// the Hopper backward, f16/bf16, where [`fused_kernel_tile`] has a kernel for `hopper.fused`
/// ([`FusedMode`]), unless the call asks for a deterministic backward or has a bias (whose gradient
/// the dQ kernel gathers).
pub(crate) fn fused_backward(spec: &AttnSpec, hopper: Hopper) -> bool {
    hopper.on
        && hopper.bwd
        && !spec.deterministic()
        && spec.bias().is_none()
        && spec.dtype() != DType::F32
        && fused_kernel_tile(spec, hopper).is_some()
}

/// Whether the fused backward of `spec` is the warp-specialised kernel, whose dQ scratch has its own
/// tiled layout (`AttnParams::dq_acc_tiled`, `SeqInfo::dq_acc_index` in kernels/include/mask.h) rather
/// than the dq strides.
pub(crate) fn fused_dq_tiled(spec: &AttnSpec, hopper: Hopper) -> bool {
    fused_backward(spec, hopper) && matches!(fused_kernel_tile(spec, hopper), Some((_, true)))
}

/// The fused backward's kernel of `spec` under `hopper.fused`: the warp-specialised one (`true`;
/// softmax and cosine-sim at D = 64 and 128, with `hopper.bwd_ws`, its dQ by bulk reductions), else
/// with [`FusedMode::Everywhere`] the wgmma one (D = 128, every score, dQ by f32 atomics from
/// registers). Its tile either way.
fn fused_kernel_tile(spec: &AttnSpec, hopper: Hopper) -> Option<(Tile, bool)> {
    let d = spec.head_dim();
    let softmax_like = matches!(spec.family_kind(), FamilyKind::Softmax | FamilyKind::CosineSim);
    let wg_family = softmax_like || spec.family_kind() == FamilyKind::Hyperbolic;
    match hopper.fused {
        FusedMode::Off => None,
        _ if softmax_like && hopper.bwd_ws => heuristics::ws_dkdv_tile(d).map(|t| (t, true)),
        FusedMode::Everywhere if wg_family && d == 128 => heuristics::wg_dkdv_tile(d).map(|t| (t, false)),
        _ => None,
    }
}

/// The flash kernel of one stage. Assumes [`check_supported`] passed. `hopper`: whether the device runs
/// the Hopper kernels (runtime::Kernels::hopper); the forward (and, unless `hopper.bwd` is off, the
/// backward) then uses them at the head dims they cover, f16 and bf16.
pub(crate) fn flash_kernel(spec: &AttnSpec, stage: Stage, hopper: Hopper) -> Result<Kernel, AttnError> {
    let pass = stage.pass();
    let d = spec.head_dim();
    let (family, module) = match spec.family_kind() {
        FamilyKind::Softmax => ("softmax", Module::Softmax),
        FamilyKind::CosineSim => ("cosine_sim", Module::CosineSim),
        FamilyKind::Hyperbolic => (spec.family().label(), Module::Hyperbolic),
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
            Stage::BwdFused => return Err(unsupported(spec, pass, "a fused f32 backward".into())),
        };
        return Ok(Kernel {
            // The hyperbolic f32 kernels live with the family (their pair kernel is its own).
            module: if module == Module::Hyperbolic {
                module
            } else {
                Module::SimtF32
            },
            name: format!("attn_{family}_{}_f32", stage.name()),
            smem: 0,
            grid,
            threads: heuristics::THREADS,
            hopper: false,
        });
    }
    let elem = spec.dtype().size();
    let missing = || unsupported(spec, pass, format!("{family} head dim {d}"));
    let lorentz = module == Module::Hyperbolic;
    let wg_tile = heuristics::wg_fwd_tile(d);
    if let (Stage::Forward, true, Some(mut tile)) = (stage, hopper.on, wg_tile) {
        let mut variant = String::new();
        if let Some((bm, bn)) = hopper.tile {
            if module == Module::Softmax
                && spec.dtype() == DType::BF16
                && heuristics::WG_TILE_VARIANTS.contains(&(d, bm, bn))
            {
                tile = Tile { bm, bn, da: d };
                variant = format!("{bm}x{bn}");
            }
        }
        // The warp-specialised forward where runtime::WsMode asks for it and no tile experiment runs.
        let geodesic = matches!(
            spec.family(),
            FamilySpec::Hyperbolic {
                score: HypScore::Geodesic,
                ..
            }
        );
        let ws_here = match hopper.ws {
            WsMode::Off => false,
            WsMode::Measured => heuristics::ws_fwd_measured_faster(d, geodesic),
            WsMode::Everywhere => true,
        };
        let ws = heuristics::ws_fwd_tile(d).filter(|_| variant.is_empty() && ws_here);
        let (kind, threads, smem) = match ws {
            Some(t) => {
                tile = t;
                let smem = heuristics::ws_fwd_smem(t, d, elem, lorentz);
                ("ws".to_string(), heuristics::ws_threads(t), smem)
            }
            None => {
                let extra = if lorentz {
                    heuristics::lorentz_extra_smem(tile)
                } else {
                    0
                };
                let smem = heuristics::wg_fwd_smem(tile, d, elem) + extra;
                (format!("wg{variant}"), heuristics::wg_threads(tile), smem)
            }
        };
        return Ok(Kernel {
            module,
            name: format!("attn_{family}_fwd_{kind}_{}_d{d}", dtype_tag(spec.dtype())),
            smem,
            grid: (heuristics::blocks(spec.seq_q(), tile.bm), hq, b),
            threads,
            hopper: true,
        });
    }
    if stage == Stage::BwdFused {
        let tile = fused_kernel_tile(spec, hopper).filter(|_| fused_backward(spec, hopper));
        let (tile, ws) =
            tile.ok_or_else(|| unsupported(spec, pass, format!("a fused {family} backward here")))?;
        let (kind, smem, threads) = if ws {
            ("ws", heuristics::ws_fused_smem(tile, d, elem), tile.bn * 2 + 128)
        } else {
            ("wg", heuristics::wg_fused_smem(tile, d, elem), tile.bn * 2)
        };
        return Ok(Kernel {
            module,
            name: format!("attn_{family}_bwd_fused_{kind}_{}_d{d}", dtype_tag(spec.dtype())),
            smem,
            grid: (heuristics::blocks(spec.seq_k(), tile.bn), hkv, b),
            threads: threads as u32,
            hopper: true,
        });
    }
    if let (Stage::BwdDq | Stage::BwdDkdv, true, true) = (stage, hopper.on, hopper.bwd) {
        let dq = stage == Stage::BwdDq;
        let tile = if dq {
            heuristics::wg_dq_tile(d)
        } else {
            heuristics::wg_dkdv_tile(d)
        };
        if let Some(tile) = tile {
            let (smem, grid, threads) = if dq {
                let grid = (heuristics::blocks(spec.seq_q(), tile.bm), hq, b);
                (heuristics::wg_dq_smem(tile, d, elem), grid, tile.bm * 2)
            } else {
                let grid = (heuristics::blocks(spec.seq_k(), tile.bn), hkv, b);
                (heuristics::wg_dkdv_smem(tile, d, elem), grid, tile.bn * 2)
            };
            // The warp-specialised kernels (a producer warpgroup beside the two consumers): dQ and
            // dK/dV for every score (the hyperbolic scores' dK/dV tile: heuristics::ws_dkdv_lorentz_tile).
            let ws = if !hopper.bwd_ws {
                None
            } else if dq {
                heuristics::ws_dq_tile(d).map(|t| (heuristics::ws_dq_smem(t, d, elem), t.bm * 2 + 128))
            } else {
                let t = if lorentz {
                    heuristics::ws_dkdv_lorentz_tile(d)
                } else {
                    heuristics::ws_dkdv_tile(d)
                };
                t.map(|t| (heuristics::ws_dkdv_smem(t, d, elem), t.bn * 2 + 128))
            };
            let (kind, smem, threads) = match ws {
                Some((smem, threads)) => ("ws", smem, threads),
                None => ("wg", smem, threads),
            };
            return Ok(Kernel {
                module,
                name: format!(
                    "attn_{family}_{}_{kind}_{}_d{d}",
                    stage.name(),
                    dtype_tag(spec.dtype())
                ),
                smem,
                grid,
                threads: threads as u32,
                hopper: true,
            });
        }
    }
    type TileFn = fn(usize) -> Option<Tile>;
    type SmemFn = fn(Tile, usize, usize) -> usize;
    let (tile_of, smem_of): (TileFn, SmemFn) = match (stage, lorentz) {
        (Stage::Forward, false) => (heuristics::fwd_tile, heuristics::fwd_smem),
        (Stage::Forward, true) => (heuristics::lorentz_fwd_tile, heuristics::fwd_smem),
        (Stage::BwdDq, false) => (heuristics::dq_tile, heuristics::dq_smem),
        (Stage::BwdDq, true) => (heuristics::lorentz_dq_tile, heuristics::dq_smem),
        (Stage::BwdDkdv, false) => (heuristics::dkdv_tile, heuristics::dkdv_smem),
        (Stage::BwdDkdv, true) => (heuristics::lorentz_dkdv_tile, heuristics::dkdv_smem),
        // The fused stage returned above; it has no mma.sync kernel.
        (Stage::BwdFused, _) => {
            return Err(unsupported(
                spec,
                pass,
                format!("a fused {family} backward without the Hopper kernels"),
            ))
        }
    };
    let tile = tile_of(d).ok_or_else(missing)?;
    let mut smem = smem_of(tile, d, elem);
    if lorentz && stage != Stage::BwdDkdv {
        smem += heuristics::lorentz_extra_smem(tile);
    }
    let grid = match stage {
        Stage::Forward | Stage::BwdDq => (heuristics::blocks(spec.seq_q(), tile.bm), hq, b),
        Stage::BwdDkdv | Stage::BwdFused => {
            (heuristics::blocks(spec.seq_k(), tile.bn) * (d / tile.da), hkv, b)
        }
    };
    Ok(Kernel {
        module,
        name: format!("attn_{family}_{}_{}_d{d}", stage.name(), dtype_tag(spec.dtype())),
        smem,
        grid,
        threads: heuristics::THREADS,
        hopper: false,
    })
}

/// Row kernels of the backward (`common.cu`), one warp per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowKernel {
    Delta,
    InvNormQ,
    InvNormK,
    /// 1/‖q‖ and q̂ (into `p.dq`): cosine-sim's queries for the Hopper backward.
    NormaliseQ,
    /// 1/‖k‖ and k̂ (into `p.dk`): cosine-sim's keys for the Hopper kernels.
    NormaliseK,
    L2normBwdQ,
    L2normBwdK,
    DbiasReduce,
    /// Hyperbolic: q0 and ‖q‖ per query row.
    HypRowsQ,
    /// Hyperbolic: k0, ‖k‖ (and log γ, c γ² for the Einstein midpoint) per key row.
    HypRowsK,
    /// dq from the f32 dQ of the fused backward.
    DqStore,
    /// Hyperbolic: dq from the f32 dQ and its row sums of the fused backward.
    HypDqStore,
}

pub(crate) fn row_kernel(spec: &AttnSpec, which: RowKernel) -> Kernel {
    let rows = heuristics::SIMT_ROWS;
    let (b, hq, hkv) = (spec.batch(), spec.heads_q(), spec.heads_kv());
    let over_q = (heuristics::blocks(spec.seq_q(), rows), hq, b);
    let over_k = (heuristics::blocks(spec.seq_k(), rows), hkv, b);
    let module = match which {
        RowKernel::HypRowsQ | RowKernel::HypRowsK | RowKernel::HypDqStore => Module::Hyperbolic,
        _ => Module::Common,
    };
    let (stem, grid) = match which {
        RowKernel::HypRowsQ => ("hyp_rows_q", over_q),
        RowKernel::HypRowsK => ("hyp_rows_k", over_k),
        RowKernel::Delta => ("bwd_delta", over_q),
        RowKernel::InvNormQ => ("inv_norm_q", over_q),
        RowKernel::InvNormK => ("inv_norm_k", over_k),
        RowKernel::NormaliseQ => ("normalise_q", over_q),
        RowKernel::NormaliseK => ("normalise_k", over_k),
        RowKernel::L2normBwdQ => ("l2norm_bwd_q", over_q),
        RowKernel::L2normBwdK => ("l2norm_bwd_k", over_k),
        RowKernel::DqStore => ("dq_store", over_q),
        RowKernel::HypDqStore => ("hyp_dq_store", over_q),
        // A grid-stride loop: enough blocks to fill the GPU, never more than the elements need.
        RowKernel::DbiasReduce => (
            "dbias_reduce",
            (heuristics::blocks(spec.bias_len(), 256).clamp(1, 4096), 1, 1),
        ),
    };
    Kernel {
        module,
        name: format!("attn_{stem}_{}", dtype_tag(spec.dtype())),
        smem: 0,
        grid,
        threads: if which == RowKernel::DbiasReduce {
            256
        } else {
            heuristics::THREADS
        },
        hopper: false,
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
            (
                Family::hyperbolic(HypScore::Geodesic, Aggregation::EinsteinMidpoint),
                FamilyKind::Hyperbolic,
            ),
            (
                Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean),
                FamilyKind::Hyperbolic,
            ),
        ] {
            for &d in head_dims(kind) {
                for dtype in DType::ALL {
                    let s = spec(family, dtype, d);
                    check_supported(&s, Pass::Forward).expect("supported");
                    for stage in [Stage::Forward, Stage::BwdDq, Stage::BwdDkdv] {
                        let k = flash_kernel(&s, stage, Hopper::default()).expect("kernel");
                        let stem = format!("attn_{}_{}", s.family().label(), stage.name());
                        assert!(k.name.starts_with(&stem), "{k:?}");
                        assert_eq!(
                            kind == FamilyKind::Hyperbolic,
                            k.module == Module::Hyperbolic,
                            "{k:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn hyperbolic_kernels_carry_their_column_scalars_in_shared_memory() {
        let fam = Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean);
        let (h, s) = (
            spec(fam, DType::BF16, 128),
            spec(Family::softmax(), DType::BF16, 128),
        );
        let fwd = |x: &AttnSpec| {
            flash_kernel(x, Stage::Forward, Hopper::default())
                .expect("kernel")
                .smem
        };
        // log γ for two key blocks of 32 keys (k0 takes the cosine norms' slots).
        assert_eq!(fwd(&h), fwd(&s) + 2 * 32 * 4);
        assert_eq!(
            flash_kernel(&h, Stage::Forward, Hopper::default())
                .expect("kernel")
                .name,
            "attn_hyperbolic_sq_lorentz_fwd_bf16_d128"
        );
        let f32 = spec(fam, DType::F32, 64);
        let k = flash_kernel(&f32, Stage::BwdDq, Hopper::default()).expect("kernel");
        assert_eq!(
            (k.module, k.name.as_str()),
            (Module::Hyperbolic, "attn_hyperbolic_sq_lorentz_bwd_dq_f32")
        );
        let rows = row_kernel(&f32, RowKernel::HypRowsK);
        assert_eq!((rows.module, rows.grid), (Module::Hyperbolic, (33, 2, 2)));
    }

    const ON: Hopper = Hopper {
        on: true,
        bwd: true,
        fused: FusedMode::Everywhere,
        tile: None,
        ws: WsMode::Off,
        bwd_ws: false,
    };

    #[test]
    fn warp_specialised_backward_kernels_unless_turned_off() {
        let ws = Hopper { bwd_ws: true, ..ON };
        let hyp = Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean);
        for (family, dtype, d, expect) in [
            (Family::softmax(), DType::BF16, 128, true),
            (Family::cosine_sim(), DType::F16, 128, true),
            (Family::softmax(), DType::F16, 64, true),
            (Family::cosine_sim(), DType::BF16, 64, true),
            (hyp, DType::BF16, 128, true),
            (hyp, DType::BF16, 64, true),
        ] {
            let s = spec(family, dtype, d);
            let k = flash_kernel(&s, Stage::BwdDkdv, ws).expect("kernel");
            assert_eq!(k.name.contains("_bwd_dkdv_ws_"), expect, "{k:?}");
            if expect {
                // 130 keys → two tiles of 128 per kv head; 384 threads; three stages of Q and dO
                // (64 queries at D = 128 and for the hyperbolic scores, 128 at D = 64) with their
                // LSE, δ and a row of ones (q0).
                let lorentz = family.kind() == FamilyKind::Hyperbolic;
                let bm = if d == 128 || lorentz { 64 } else { 128 };
                assert_eq!((k.grid, k.threads, k.hopper), ((2, 2, 2), 384, true), "{k:?}");
                assert_eq!(k.smem, 1024 + (2 * 128 + 6 * bm) * d * 2 + 9 * bm * 4, "{k:?}");
            } else {
                assert!(k.name.contains("_bwd_dkdv_wg_"), "{k:?}");
            }
            // The dQ kernel for every score: 100 queries → one block of 128 (384 threads); Q, dO, four
            // K and three V stages of 128 (D = 64) or 64 (D = 128) keys, k0 and log γ with each K
            // stage. ATTN_CUDA_WG_BWD_WS=0 keeps the wgmma kernels.
            let dq = flash_kernel(&s, Stage::BwdDq, ws).expect("kernel");
            assert!(dq.name.contains("_bwd_dq_ws_"), "{dq:?}");
            let bn = if d == 128 { 64 } else { 128 };
            assert_eq!((dq.grid, dq.threads, dq.hopper), ((1, 4, 2), 384, true), "{dq:?}");
            assert_eq!(dq.smem, 1024 + (2 * 128 + 7 * bn) * d * 2 + 8 * bn * 4, "{dq:?}");
            for stage in [Stage::BwdDq, Stage::BwdDkdv] {
                let k = flash_kernel(&s, stage, ON).expect("kernel");
                assert!(k.name.contains("_wg_"), "{k:?}");
            }
        }
        // Other head dims and f32 keep their kernels.
        for (dtype, d) in [(DType::BF16, 96), (DType::F32, 64)] {
            for stage in [Stage::BwdDq, Stage::BwdDkdv] {
                let k = flash_kernel(&spec(Family::softmax(), dtype, d), stage, ws).expect("kernel");
                assert!(!k.name.contains("_ws_") && !k.hopper, "{k:?}");
            }
        }
    }

    #[test]
    fn warp_specialised_forward_where_the_head_dim_allows_unless_turned_off() {
        let ws = Hopper {
            ws: WsMode::Everywhere,
            ..ON
        };
        let hyp = Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::EinsteinMidpoint);
        for (family, dtype, d) in [
            (Family::softmax(), DType::BF16, 128),
            (Family::cosine_sim(), DType::F16, 128),
            (hyp, DType::BF16, 128),
            (Family::softmax(), DType::F16, 64),
            (hyp, DType::BF16, 64),
        ] {
            let s = spec(family, dtype, d);
            let k = flash_kernel(&s, Stage::Forward, ws).expect("kernel");
            assert!(k.name.contains("_fwd_ws_"), "{k:?}");
            // 100 queries → one block of 128 rows (D = 128: 384 threads) or 192 (D = 64: 512); the
            // wgmma forward's shared memory with 128 keys per stage (plus log γ for the hyperbolic
            // scores).
            let (bm, threads) = if d == 128 { (128, 384) } else { (192, 512) };
            assert_eq!((k.grid, k.threads, k.hopper), ((1, 4, 2), threads, true), "{k:?}");
            // The scalars hold three stages; the hyperbolic scores add three of log γ. Two K and two
            // V stages for every score (cosine-sim reads k̂ from the row kernels).
            let lorentz = if matches!(family, Family::Hyperbolic(_)) {
                3 * 128 * 4
            } else {
                0
            };
            assert_eq!(
                k.smem,
                1024 + (bm + 4 * 128) * d * 2 + (2 * 128 + bm) * 4 + lorentz
            );
            // ATTN_CUDA_WG_WS governs the forward only (ON: no warp-specialised backward); with
            // ATTN_CUDA_WG_WS=0, the wgmma forward.
            let dq = flash_kernel(&s, Stage::BwdDq, ws).expect("kernel");
            assert!(dq.name.contains("_bwd_dq_wg_"), "{dq:?}");
            let k = flash_kernel(&s, Stage::Forward, ON).expect("kernel");
            assert!(k.name.contains("_fwd_wg_"), "{k:?}");
        }
        // By default: D = 128 every score, D = 64 the geodesic score only.
        let measured = Hopper {
            ws: WsMode::Measured,
            ..ON
        };
        let geo = Family::hyperbolic(HypScore::Geodesic, Aggregation::Euclidean);
        for (family, d, kind) in [
            (Family::softmax(), 128, "ws"),
            (Family::cosine_sim(), 128, "ws"),
            (geo, 128, "ws"),
            (geo, 64, "ws"),
            (Family::softmax(), 64, "wg"),
            (Family::cosine_sim(), 64, "wg"),
            (hyp, 64, "wg"),
        ] {
            let k = flash_kernel(&spec(family, DType::BF16, d), Stage::Forward, measured).expect("kernel");
            assert!(
                k.name.contains(&format!("_fwd_{kind}_")),
                "{family:?} D = {d}: {k:?}"
            );
        }
        // D = 96 has only the mma.sync forward; a tile experiment asks for a wgmma one.
        let k = flash_kernel(&spec(Family::softmax(), DType::BF16, 96), Stage::Forward, ws).expect("kernel");
        assert!(!k.name.contains("_ws_") && !k.hopper, "{k:?}");
        let exp = Hopper {
            tile: Some((64, 64)),
            ..ws
        };
        let k =
            flash_kernel(&spec(Family::softmax(), DType::BF16, 128), Stage::Forward, exp).expect("kernel");
        assert_eq!(k.name, "attn_softmax_fwd_wg64x64_bf16_d128");
    }

    #[test]
    fn hopper_tile_experiments_apply_to_bf16_softmax_only() {
        let exp = Hopper {
            tile: Some((64, 128)),
            ..ON
        };
        let s = spec(Family::softmax(), DType::BF16, 64);
        let k = flash_kernel(&s, Stage::Forward, exp).expect("kernel");
        assert_eq!(
            (k.name.as_str(), k.threads),
            ("attn_softmax_fwd_wg64x128_bf16_d64", 128)
        );
        assert_eq!(k.grid, (2, 4, 2));
        for (family, dtype, d) in [
            (Family::cosine_sim(), DType::BF16, 64),
            (Family::softmax(), DType::F16, 64),
            (Family::softmax(), DType::BF16, 128),
        ] {
            let k = flash_kernel(&spec(family, dtype, d), Stage::Forward, exp).expect("kernel");
            assert!(k.name.contains("_fwd_wg_"), "{k:?}");
        }
    }

    #[test]
    fn hopper_forward_where_the_device_and_head_dim_allow() {
        let hyp = Family::hyperbolic(HypScore::Geodesic, Aggregation::EinsteinMidpoint);
        for (family, d, dtype, wg) in [
            (Family::softmax(), 128, DType::BF16, true),
            (Family::cosine_sim(), 64, DType::F16, true),
            (hyp, 64, DType::BF16, true),
            (Family::softmax(), 96, DType::BF16, false),
            (Family::softmax(), 256, DType::F16, false),
            (Family::softmax(), 64, DType::F32, false),
        ] {
            let s = spec(family, dtype, d);
            let k = flash_kernel(&s, Stage::Forward, ON).expect("kernel");
            assert_eq!(k.name.contains("_fwd_wg_"), wg, "{k:?}");
            assert_eq!(
                (k.threads, k.hopper),
                if wg { (256, true) } else { (128, false) },
                "{k:?}"
            );
            if wg {
                // 100 queries → one block of 128; the Einstein midpoint's log γ rides along.
                assert_eq!(k.grid, (1, 4, 2));
                let hyp = matches!(family, Family::Hyperbolic(_));
                let bn = if d == 64 { 64 } else { 128 };
                let lorentz = if hyp { 2 * bn * 4 } else { 0 };
                assert_eq!(
                    k.smem,
                    1024 + (128 + 4 * bn) * d * 2 + (2 * bn + 128) * 4 + lorentz,
                    "{k:?}"
                );
            }
            // The backward likewise: dQ over 100 queries in one block of 128, dK/dV over 130 keys in
            // two of 128; both on their own with ATTN_CUDA_WG_BWD=0.
            let dq = flash_kernel(&s, Stage::BwdDq, ON).expect("kernel");
            let dkdv = flash_kernel(&s, Stage::BwdDkdv, ON).expect("kernel");
            assert_eq!(dq.name.contains("_bwd_dq_wg_"), wg, "{dq:?}");
            assert_eq!(dkdv.name.contains("_bwd_dkdv_wg_"), wg, "{dkdv:?}");
            if wg {
                // dQ: 128 keys per streamed block at D = 64, 64 at D = 128; dK/dV: 128 queries per
                // streamed block at D = 64, 64 at D = 128.
                let (bn, bm) = if d == 64 { (128, 128) } else { (64, 64) };
                assert_eq!((dq.grid, dq.threads, dq.hopper), ((1, 4, 2), 256, true));
                assert_eq!(dq.smem, 1024 + (2 * 128 + 5 * bn) * d * 2 + 6 * bn * 4);
                assert_eq!((dkdv.grid, dkdv.threads), ((2, 2, 2), 256));
                assert_eq!(dkdv.smem, 1024 + (2 * 128 + 4 * bm) * d * 2 + 6 * bm * 4);
            }
            let fwd_only = Hopper { bwd: false, ..ON };
            for stage in [Stage::BwdDq, Stage::BwdDkdv] {
                let k = flash_kernel(&s, stage, fwd_only).expect("kernel");
                assert!(!k.name.contains("_wg_") && !k.hopper, "{k:?}");
            }
            // Without the Hopper kernels, the mma.sync kernels.
            for stage in [Stage::Forward, Stage::BwdDq, Stage::BwdDkdv] {
                let k = flash_kernel(&s, stage, Hopper::default()).expect("kernel");
                assert!(!k.name.contains("_wg_"), "{k:?}");
            }
        }
    }

    #[test]
    fn fused_backward_only_where_it_is_exact_and_allowed() {
        let hyp = Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean);
        // (family, dtype, d, fused with the warp-specialised kernels, fused with the wgmma ones)
        for (family, dtype, d, ws, wg) in [
            (Family::softmax(), DType::BF16, 128, true, true),
            (Family::cosine_sim(), DType::F16, 128, true, true),
            (Family::softmax(), DType::BF16, 64, true, false),
            (Family::cosine_sim(), DType::BF16, 64, true, false),
            (Family::softmax(), DType::BF16, 96, false, false),
            (Family::softmax(), DType::F32, 64, false, false),
            (Family::softmax(), DType::F32, 128, false, false),
            (hyp, DType::BF16, 128, true, true),
            (hyp, DType::BF16, 64, false, false),
            (hyp, DType::F32, 128, false, false),
        ] {
            let s = spec(family, dtype, d);
            let ws_on = Hopper { bwd_ws: true, ..ON };
            assert_eq!(fused_backward(&s, ws_on), ws, "{family:?} {dtype:?} {d}");
            assert_eq!(fused_backward(&s, ON), wg, "{family:?} {dtype:?} {d}");
            for (hopper, fused) in [(ws_on, ws), (ON, wg)] {
                let k = flash_kernel(&s, Stage::BwdFused, hopper);
                assert_eq!(k.is_ok(), fused, "{k:?}");
                let lorentz = family.kind() == FamilyKind::Hyperbolic;
                assert_eq!(fused_dq_tiled(&s, hopper), fused && hopper.bwd_ws && !lorentz);
                let Ok(k) = k else { continue };
                if hopper.bwd_ws && !lorentz {
                    assert!(k.name.contains("_bwd_fused_ws_"), "{k:?}");
                    // 130 keys → two tiles of 128 per kv head; a producer warpgroup beside the two.
                    assert_eq!((k.grid, k.threads), ((2, 2, 2), 384));
                    let bm = if d == 128 { 64 } else { 128 };
                    assert_eq!(
                        k.smem,
                        1024 + (2 * 128 + 4 * bm) * d * 2 + 2 * 128 * bm * 2 + 6 * bm * 4 + 8 * 16 * 64 * 4
                    );
                } else {
                    assert!(k.name.contains("_bwd_fused_wg_"), "{k:?}");
                    // dS'ᵀ of a 64-query block and ‖q‖ ride along.
                    assert_eq!((k.grid, k.threads), ((2, 2, 2), 256));
                    assert_eq!(
                        k.smem,
                        1024 + (2 * 128 + 4 * 64) * d * 2 + 6 * 64 * 4 + 128 * 64 * 2 + 2 * 64 * 4
                    );
                }
            }
        }
        let s = spec(Family::softmax(), DType::BF16, 128);
        let det = AttnProblem::new(Family::softmax(), DType::BF16, 2, 4, 2, 100, 130, 128)
            .with_deterministic(true)
            .validate()
            .expect("valid problem");
        let bias = AttnProblem::new(Family::softmax(), DType::BF16, 2, 4, 2, 100, 130, 128)
            .with_bias(1, 4)
            .validate()
            .expect("valid problem");
        assert!(!fused_backward(&det, ON) && !fused_backward(&bias, ON));
        for off in [
            Hopper::default(),
            Hopper { bwd: false, ..ON },
            Hopper {
                fused: FusedMode::Off,
                ..ON
            },
        ] {
            assert!(!fused_backward(&s, off), "{off:?}");
        }
        // The default mode: the warp-specialised fused kernel only (softmax, cosine-sim), never the
        // wgmma one; the hyperbolic scores keep the two kernels.
        let default = Hopper {
            fused: FusedMode::WarpSpecialised,
            bwd_ws: true,
            ..ON
        };
        let hyp = spec(hyp, DType::BF16, 128);
        assert!(fused_dq_tiled(&s, default) && !fused_backward(&hyp, default));
        assert!(!fused_backward(
            &s,
            Hopper {
                bwd_ws: false,
                ..default
            }
        ));
        assert!(!fused_backward(&det, default) && !fused_backward(&bias, default));
    }

    #[test]
    fn grids_cover_tails_and_split_columns() {
        let s = spec(Family::softmax(), DType::BF16, 256);
        assert_eq!(
            flash_kernel(&s, Stage::Forward, Hopper::default())
                .expect("kernel")
                .grid,
            (2, 4, 2)
        );
        // 130 keys → 3 key tiles of 64, two column blocks each, one block per kv head.
        assert_eq!(
            flash_kernel(&s, Stage::BwdDkdv, Hopper::default())
                .expect("kernel")
                .grid,
            (6, 2, 2)
        );
        let f = spec(Family::softmax(), DType::F32, 64);
        assert_eq!(
            flash_kernel(&f, Stage::BwdDq, Hopper::default())
                .expect("kernel")
                .grid,
            (25, 4, 2)
        );
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
        let taylor = spec(Family::taylor(2), DType::F32, 64);
        assert!(matches!(
            check_supported(&taylor, Pass::Backward),
            Err(AttnError::Unsupported { .. })
        ));
        let flat = Family::Hyperbolic(attn_core::HyperbolicParams {
            score: HypScore::Geodesic,
            curvature: 1e-20,
            ..Default::default()
        });
        let err = check_supported(&spec(flat, DType::BF16, 64), Pass::Forward).expect_err("tiny c");
        assert!(err.to_string().contains("curvature"), "{err}");
        let hyp48 = spec(
            Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean),
            DType::BF16,
            48,
        );
        assert!(check_supported(&hyp48, Pass::Forward)
            .expect_err("no D = 48")
            .to_string()
            .contains("hyperbolic head dim 48"));
        let dv = AttnProblem::new(Family::softmax(), DType::BF16, 1, 1, 1, 8, 8, 64)
            .with_head_dim_v(32)
            .validate()
            .expect("valid problem");
        let err = check_supported(&dv, Pass::Forward).expect_err("Dv != D");
        assert!(err.to_string().contains("value head dim 32"), "{err}");
    }
}
