//! Exhaustive dispatch: (family, pass, dtype, head dim) → one compiled kernel, or a typed
//! `Unsupported` error. No default arm picks a kernel: every supported combination is listed.
//!
//! | family     | dtype     | head dims                 | kernels                                   |
//! |------------|-----------|---------------------------|-------------------------------------------|
//! | softmax    | f16, bf16 | 32, 64, 96, 128, 256      | `attn_softmax_{pass}_{dt}_d{D}` (mma.sync)  |
//! | cosine_sim | f16, bf16 | 16, 32, 64, 96, 128, 256  | `attn_cosine_sim_{pass}_{dt}_d{D}`          |
//! | hyperbolic | f16, bf16 | 32, 64, 96, 128, 256      | `attn_hyperbolic_{score}_{pass}_{dt}_d{D}`  |
//! | all three  | f32       | the family's head dims    | `attn_{family}_{pass}_f32` (SIMT, exact f32) |
//! | Taylor, order 2 | f16, bf16 | 64, 128 (Hopper only) | `attn_taylor2_{pass}_{ws,wg}_{dt}_d{D}`    |
//!
//! Taylor order 2 runs here only where `crate::taylor::dense_on_flash` routes it (the quadratic
//! form on tensor cores, for sequences short enough); every other Taylor call runs the state
//! kernels of `crate::taylor`.
//!
//! `{score}` is `sq_lorentz` or `geodesic` (the family label); the aggregation (Euclidean or Einstein
//! midpoint) is a runtime flag of the same kernels. Hyperbolic kernels also need the per-row scalars
//! of `attn_hyp_rows_{dt}` (time coordinates, norms, log γ) before any of them runs.

use crate::config::{Hopper, Route};
use crate::heuristics::{self, Tile};
use attn_core::{
    Aggregation, AttnError, AttnSpec, Causal, DType, FamilyKind, FamilySpec, HypScore, Pass, TaylorOrder,
};

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
    TaylorFlash,
    /// Taylor's state kernels (`crate::taylor`).
    Taylor,
    /// The split-KV decode and KV-cache kernels (`crate::decode`).
    Decode,
}

impl Module {
    pub(crate) fn file(self) -> &'static str {
        match self {
            Module::Softmax => "softmax",
            Module::CosineSim => "cosine_sim",
            Module::SimtF32 => "simt_f32",
            Module::Common => "common",
            Module::Hyperbolic => "hyperbolic",
            Module::TaylorFlash => "taylor_flash",
            Module::Taylor => "taylor",
            Module::Decode => "decode",
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
    /// The warp-specialised forward: query tiles per (batch entry, head), for `AttnParams::tiles_q`
    /// (its grid is flat over the tiles); 0 for every other kernel.
    pub tiles_q: usize,
}

/// The kernels' name tag of a dtype: `f32`, `f16`, `bf16`.
pub(crate) fn dtype_tag(dtype: DType) -> &'static str {
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
        FamilyKind::Taylor => &[64, 128],
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
        // Order 2 on the Hopper kernels where `crate::taylor::dense_on_flash` routes it (flash_kernel
        // checks the device); every other Taylor call runs the state kernels of `crate::taylor`.
        FamilySpec::Taylor {
            order: TaylorOrder::Two,
            ..
        } if spec.dtype() != DType::F32 => "taylor2",
        FamilySpec::Taylor { .. } => {
            return Err(unsupported(
                spec,
                pass,
                format!(
                    "{} {} on the flash skeleton (order 2, f16 or bf16 only)",
                    family.name(),
                    spec.dtype()
                ),
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
/// (`KernelConfig::fused_backward`), unless the call asks for a deterministic backward or has a bias (whose gradient
/// the dQ kernel gathers).
pub(crate) fn fused_backward(spec: &AttnSpec, hopper: Hopper) -> bool {
    hopper.on
        && !spec.deterministic()
        && spec.bias().is_none()
        && !simt(spec, hopper)
        && fused_kernel_tile(spec, hopper).is_some()
}

/// Whether the flash stages of `spec` run on the SIMT kernels (CUDA cores, one warp per row): every
/// f32 call, and the hyperbolic scores' f16/bf16 calls under `KernelConfig::hyperbolic_exact`.
pub(crate) fn simt(spec: &AttnSpec, hopper: Hopper) -> bool {
    spec.dtype() == DType::F32 || (hopper.hyp_exact && spec.family_kind() == FamilyKind::Hyperbolic)
}

/// Whether the fused backward of `spec` is the warp-specialised kernel, whose dQ scratch has its own
/// tiled layout (`AttnParams::dq_acc_tiled`, `SeqInfo::dq_acc_index` in kernels/common/mask.h) rather
/// than the dq strides.
pub(crate) fn fused_dq_tiled(spec: &AttnSpec, hopper: Hopper) -> bool {
    fused_backward(spec, hopper) && matches!(fused_kernel_tile(spec, hopper), Some((_, true)))
}

/// The fused backward's kernel of `spec` under `hopper.fused`: the warp-specialised one (`true`;
/// softmax, cosine-sim and the hyperbolic scores at D = 64 and 128, with `hopper.bwd_ws`,
/// its dQ by bulk reductions; the hyperbolic scores on their own dK/dV tile,
/// [`heuristics::ws_dkdv_lorentz_tile`], with dQ's row sums by f32 atomics), else with
/// [`Route::Everywhere`] the wgmma one (D = 128, every score, dQ by f32 atomics from registers).
/// Its tile either way.
fn fused_kernel_tile(spec: &AttnSpec, hopper: Hopper) -> Option<(Tile, bool)> {
    let d = spec.head_dim();
    // Not Taylor: its results are the same bits run to run (README), so its quadratic form takes the
    // deterministic warp-specialised dQ and dK/dV kernels.
    let hyperbolic = spec.family_kind() == FamilyKind::Hyperbolic;
    let softmax_like = matches!(spec.family_kind(), FamilyKind::Softmax | FamilyKind::CosineSim);
    match hopper.fused {
        Route::Off => None,
        _ if softmax_like && hopper.bwd_ws => heuristics::ws_dkdv_tile(d).map(|t| (t, true)),
        _ if hyperbolic && hopper.bwd_ws => heuristics::ws_dkdv_lorentz_tile(d).map(|t| (t, true)),
        Route::Everywhere if (softmax_like || hyperbolic) && d == 128 => {
            heuristics::wg_dkdv_tile(d).map(|t| (t, false))
        }
        _ => None,
    }
}

/// Whether the fused backward of `spec` runs the kernel for calls whose every tile is fast: the squared
/// Lorentz score with Euclidean aggregation on bf16 at D = 64, with [`heuristics::WS_FUSED_EVEN_TILE`]'s
/// 128-query blocks (`attn_hyperbolic_sq_lorentz_bwd_fused_ws_even_bf16_d64`, `kEven` in
/// kernels/flash/flash_bwd_ws.cuh), where the general kernel has 64 (with the general tile's code and
/// the midpoint the 128-query tile spills 408 + 384 bytes). Every tile is fast when nothing masks an
/// element and every sequence's query and key counts are multiples of the tile: no causal mask, no
/// window, no bias. The kernel traps on any other call.
fn fused_even(spec: &AttnSpec, hopper: Hopper) -> bool {
    let t = heuristics::WS_FUSED_EVEN_TILE;
    matches!(
        spec.family(),
        FamilySpec::Hyperbolic {
            score: HypScore::SquaredLorentz,
            aggregation: Aggregation::Euclidean,
            ..
        }
    ) && hopper.bwd_ws
        && spec.dtype() == DType::BF16
        && spec.head_dim() == t.da
        && spec.causal() == Causal::None
        && spec.window().is_none()
        && spec.bias().is_none()
        && (0..spec.batch()).all(|b| {
            let l = spec.seq_lens(b);
            l.q % t.bm == 0 && l.k % t.bn == 0
        })
}

/// Whether the forward `kernel` forms the hyperbolic scores' q0 from its own Q tile
/// (`lorentz_q0_from_tile` in flash_fwd_wg.cuh: the wgmma forward, `attn_{family}_fwd_wg_{dt}_d{D}`), so
/// the row kernel before it computes only the keys' scalars ([`RowKernel::HypRowsKeys`]).
pub(crate) fn forward_forms_q0(spec: &AttnSpec, kernel: &Kernel) -> bool {
    spec.family_kind() == FamilyKind::Hyperbolic && kernel.hopper && kernel.name.contains("_fwd_wg_")
}

/// Whether the hyperbolic warp-specialised dK/dV kernel of `spec` (fused or not) keeps a panel of q0's
/// bf16 pieces per stage for its tensor-core row sums: bf16 at D = 64, and for the squared Lorentz
/// score at D = 128 too, the host's mirror of `LorentzOps::tc_rowsum` in kernels/hyperbolic/lorentz_tile.cuh.
fn ws_q0_panel(spec: &AttnSpec, lorentz: bool) -> bool {
    let squared = matches!(
        spec.family(),
        FamilySpec::Hyperbolic {
            score: HypScore::SquaredLorentz,
            ..
        }
    );
    lorentz && spec.dtype() == DType::BF16 && (spec.head_dim() == 64 || squared)
}

/// Whether the hyperbolic scores' Hopper kernels of `spec` put q0 and k0 on the tensor cores as bf16
/// pieces: the warp-specialised forward's panels beside Q and each K stage (q·k − q0 k0), and the
/// warp-specialised dQ kernel's k0 panel per K stage (its row sums). The hyperbolic scores on bf16, the
/// host's mirror of `kLorentzTcK0` in kernels/hyperbolic/lorentz_tile.cuh.
fn k0_panels(spec: &AttnSpec, lorentz: bool) -> bool {
    lorentz && spec.dtype() == DType::BF16
}

/// The flash kernel of one stage. Assumes [`check_supported`] passed. `hopper`: whether the device runs
/// the Hopper kernels and their routing (`runtime::Kernels::hopper`); forward and backward then use them
/// at the head dims they cover, f16 and bf16.
pub(crate) fn flash_kernel(spec: &AttnSpec, stage: Stage, hopper: Hopper) -> Result<Kernel, AttnError> {
    let pass = stage.pass();
    let d = spec.head_dim();
    let (family, module) = match spec.family_kind() {
        FamilyKind::Softmax => ("softmax", Module::Softmax),
        FamilyKind::CosineSim => ("cosine_sim", Module::CosineSim),
        FamilyKind::Hyperbolic => (spec.family().label(), Module::Hyperbolic),
        FamilyKind::Taylor => {
            // Only the Hopper kernels: the wgmma and warp-specialised forwards, the warp-specialised
            // backward (fused, or dQ and dK/dV).
            let here = match stage {
                Stage::Forward => hopper.on,
                _ => hopper.on && hopper.bwd_ws,
            };
            if !here || spec.dtype() == DType::F32 {
                return Err(unsupported(
                    spec,
                    pass,
                    "Taylor on the flash skeleton without the Hopper kernels (sm_90a, f16/bf16)".into(),
                ));
            }
            ("taylor2", Module::TaylorFlash)
        }
    };
    let (b, hq, hkv) = (spec.batch(), spec.heads_q(), spec.heads_kv());
    if simt(spec, hopper) {
        let rows = heuristics::SIMT_ROWS;
        let grid = match stage {
            Stage::Forward | Stage::BwdDq => (heuristics::blocks(spec.seq_q(), rows), hq, b),
            Stage::BwdDkdv => (heuristics::blocks(spec.seq_k(), rows), hkv, b),
            Stage::BwdFused => return Err(unsupported(spec, pass, "a fused SIMT backward".into())),
        };
        // f32: `_f32`; the hyperbolic f16/bf16 SIMT kernels (KernelConfig::hyperbolic_exact):
        // `_exact_{f16,bf16}`.
        let suffix = match spec.dtype() {
            DType::F32 => "f32",
            DType::F16 => "exact_f16",
            DType::BF16 => "exact_bf16",
        };
        return Ok(Kernel {
            // The hyperbolic SIMT kernels live with the family (their pair kernel is its own).
            module: if module == Module::Hyperbolic {
                module
            } else {
                Module::SimtF32
            },
            name: format!("attn_{family}_{}_{suffix}", stage.name()),
            smem: 0,
            grid,
            threads: heuristics::THREADS,
            hopper: false,
            tiles_q: 0,
        });
    }
    let elem = spec.dtype().size();
    let missing = || unsupported(spec, pass, format!("{family} head dim {d}"));
    let lorentz = module == Module::Hyperbolic;
    let wg_tile = heuristics::wg_fwd_tile(d);
    if let (Stage::Forward, true, Some(mut tile)) = (stage, hopper.on, wg_tile) {
        // The warp-specialised forward where `KernelConfig::ws_forward` routes it.
        let geodesic = matches!(
            spec.family(),
            FamilySpec::Hyperbolic {
                score: HypScore::Geodesic,
                ..
            }
        );
        let ws_here = match hopper.ws {
            Route::Off => false,
            Route::Measured => heuristics::ws_fwd_measured_faster(
                d,
                geodesic,
                // Taylor has cosine-sim's shape of work: no running max.
                matches!(module, Module::CosineSim | Module::TaylorFlash),
                k0_panels(spec, lorentz),
                spec.causal() != Causal::None || spec.window().is_some(),
                spec.seq_k(),
            ),
            Route::Everywhere => true,
        };
        let ws = heuristics::ws_fwd_tile(d).filter(|_| ws_here);
        let (kind, threads, smem) = match ws {
            Some(t) => {
                tile = t;
                let smem = heuristics::ws_fwd_smem(t, d, elem, lorentz, k0_panels(spec, lorentz));
                ("ws".to_string(), heuristics::ws_threads(t), smem)
            }
            None => {
                let extra = if lorentz {
                    heuristics::lorentz_extra_smem(tile)
                } else {
                    0
                };
                let smem = heuristics::wg_fwd_smem(tile, d, elem) + extra;
                ("wg".to_string(), heuristics::wg_threads(tile), smem)
            }
        };
        let tiles_q = heuristics::blocks(spec.seq_q(), tile.bm);
        // The warp-specialised forward takes its (query tile, head, batch) tile from a flat grid, one
        // per block.
        let (grid, ws_tiles) = match ws {
            Some(_) => ((tiles_q * hq * b, 1, 1), tiles_q),
            None => ((tiles_q, hq, b), 0),
        };
        return Ok(Kernel {
            module,
            name: format!("attn_{family}_fwd_{kind}_{}_d{d}", dtype_tag(spec.dtype())),
            smem,
            grid,
            threads,
            hopper: true,
            tiles_q: ws_tiles,
        });
    }
    if stage == Stage::BwdFused {
        let tile = fused_kernel_tile(spec, hopper).filter(|_| fused_backward(spec, hopper));
        let (tile, ws) =
            tile.ok_or_else(|| unsupported(spec, pass, format!("a fused {family} backward here")))?;
        // Calls whose every tile is fast: the warp-specialised kernel's `_even` form, on its own tile.
        let even = ws && fused_even(spec, hopper);
        let tile = if even {
            heuristics::WS_FUSED_EVEN_TILE
        } else {
            tile
        };
        let (kind, smem, threads) = if ws {
            let smem = heuristics::ws_fused_smem(tile, d, elem, ws_q0_panel(spec, lorentz));
            (if even { "ws_even" } else { "ws" }, smem, tile.bn * 2 + 128)
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
            tiles_q: 0,
        });
    }
    if let (Stage::BwdDq | Stage::BwdDkdv, true) = (stage, hopper.on) {
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
                let k0_panel = k0_panels(spec, lorentz);
                heuristics::ws_dq_tile(d)
                    .map(|t| (heuristics::ws_dq_smem(t, d, elem, k0_panel), t.bm * 2 + 128))
            } else {
                let t = if lorentz {
                    heuristics::ws_dkdv_lorentz_tile(d)
                } else {
                    heuristics::ws_dkdv_tile(d)
                };
                let q0_panel = ws_q0_panel(spec, lorentz);
                t.map(|t| (heuristics::ws_dkdv_smem(t, d, elem, q0_panel), t.bn * 2 + 128))
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
                tiles_q: 0,
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
        tiles_q: 0,
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
    /// Hyperbolic: q0 and ‖q‖ per query row, k0, ‖k‖ (and log γ, c γ² for the Einstein midpoint) per
    /// key row, in one launch (grid.y: the query heads, then the key heads).
    HypRows,
    /// Hyperbolic: the key rows' scalars only, before a forward that forms q0 itself
    /// ([`forward_forms_q0`]).
    HypRowsKeys,
    /// dq from the f32 dQ of the fused backward.
    DqStore,
    /// Hyperbolic: dq from the f32 dQ and its row sums of the fused backward.
    HypDqStore,
}

pub(crate) fn row_kernel(spec: &AttnSpec, which: RowKernel) -> Kernel {
    let rows =
        heuristics::SIMT_ROWS * heuristics::row_kernel_rows_per_warp(spec.head_dim(), spec.dtype().size());
    let (b, hq, hkv) = (spec.batch(), spec.heads_q(), spec.heads_kv());
    let over_q = (heuristics::blocks(spec.seq_q(), rows), hq, b);
    let over_k = (heuristics::blocks(spec.seq_k(), rows), hkv, b);
    let module = match which {
        RowKernel::HypRows | RowKernel::HypRowsKeys | RowKernel::HypDqStore => Module::Hyperbolic,
        _ => Module::Common,
    };
    let (stem, grid) = match which {
        RowKernel::HypRows => ("hyp_rows", (over_q.0.max(over_k.0), hq + hkv, b)),
        RowKernel::HypRowsKeys => ("hyp_rows_k", over_k),
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
        tiles_q: 0,
    }
}

#[cfg(test)]
mod tests;
