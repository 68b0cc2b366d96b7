//! Hyperbolic kernels (squared Lorentz and geodesic scores, Euclidean and Einstein-midpoint
//! aggregation) against the f64 CPU reference: every score × aggregation × dtype × head dim × mask
//! option, random shapes with tails, random dO, outputs poisoned with NaN before each launch; plus
//! points far from the origin, identical q and k (zero distance: the clamp, zero gradient through
//! that pair) and values near and beyond the Klein ball's edge (the clamp of γ). The tolerance is
//! `common`'s (2 × the naive same-dtype error + atol) against `common::hyperbolic::naive`, except
//! for f16/bf16 points far from the origin, where that baseline loses every digit and the kernels
//! must stay within 2·atol of the reference instead. Each test runs all its cases and reports every
//! failure (case, field, max error, bound) before failing.
//!
//! GPU-only: `cargo xtask test-gpu` (or the bundle of `cargo xtask gpu-bundle`) runs them with
//! `--ignored`.

mod common;
mod poison;

use attn_core::{Aggregation, AttnProblem, AttnSpec, Causal, DType, Family, HypScore, HyperbolicParams};
use common::hyperbolic::{check_points, naive, shape_points, Points};
use common::shapes::{
    bias_broadcast_batch, bias_broadcast_heads, causal_bottom_right_q_longer, causal_top_left_q_shorter,
    dense_gqa, key_padding_and_window, long_keys_bottom_right, mqa_bhnd, strided_views, varlen_causal,
    whole_tiles_gqa, whole_tiles_key_padding, whole_tiles_varlen, Lengths, Make, Shapes,
};
use common::{check_dims, Cases};
use poison::{check_poisoned, Target};

const DIMS: [usize; 5] = [32, 64, 96, 128, 256];

/// Sequence lengths scale down with the head dim so the f64 reference stays quick.
fn max_len(d: usize) -> usize {
    if d >= 256 {
        90
    } else {
        140
    }
}

const LENGTHS: Lengths = Lengths {
    max: max_len,
    min_k: 40,
};

/// Typical points: rows of norm about 1.5 (time coordinates ≈ 1.8 at c = 1), scores of order β.
const TYPICAL: Points = Points::Scaled { radius: 1.5 };

fn hyp(score: HypScore, aggregation: Aggregation, curvature: f32, beta: f32) -> Family {
    Family::Hyperbolic(HyperbolicParams {
        score,
        curvature,
        beta,
        aggregation,
    })
}

fn run(name: &str, family: Family, points: Points, offset: usize, make: &Make) {
    run_dims(name, family, &DIMS, points, offset, make);
}

fn run_dims(name: &str, family: Family, dims: &[usize], points: Points, offset: usize, make: &Make) {
    let mut cases = Cases::new(name);
    let seed = |n: usize| 7000 + 31 * n as u64;
    check_dims(
        &mut cases,
        family,
        dims,
        LENGTHS,
        seed,
        make,
        |spec, seed| match spec.dtype() {
            DType::F32 => check_points::<f32>(spec, seed, offset, points),
            DType::F16 => check_points::<half::f16>(spec, seed, offset, points),
            DType::BF16 => check_points::<half::bf16>(spec, seed, offset, points),
        },
    );
    cases.finish();
}

/// Hq = Hkv and Nq = Nk, so k can be a copy of q (`Points::Identical`).
fn square(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let n = s.tail(40, max_len(d));
    AttnProblem::new(f, dt, 2, 2, 2, n, n, d)
}

use Aggregation::{EinsteinMidpoint as Mid, Euclidean as Euc};
use HypScore::{Geodesic as Geo, SquaredLorentz as Sq};

macro_rules! gpu_tests {
    ($($name:ident: $family:expr, $points:expr, $make:expr, $offset:expr;)*) => {$(
        #[test]
        #[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
        fn $name() {
            common::each_config(&common::flash_configs(), || {
                run(stringify!($name), $family, $points, $offset, &$make);
            });
        }
    )*};
}

gpu_tests! {
    sq_lorentz_dense_gqa_with_tails_matches_reference: hyp(Sq, Euc, 1.0, 1.0), TYPICAL, dense_gqa, 0;
    geodesic_dense_gqa_with_tails_matches_reference: hyp(Geo, Euc, 1.0, 1.0), TYPICAL, dense_gqa, 0;
    sq_lorentz_midpoint_dense_gqa_matches_reference: hyp(Sq, Mid, 0.5, 0.7), TYPICAL, dense_gqa, 0;
    geodesic_midpoint_dense_gqa_matches_reference: hyp(Geo, Mid, 2.0, 1.7), TYPICAL, dense_gqa, 0;
    sq_lorentz_midpoint_causal_top_left_q_shorter_than_k_matches_reference: hyp(Sq, Mid, 1.0, 1.0), TYPICAL, causal_top_left_q_shorter, 0;
    geodesic_causal_top_left_q_shorter_than_k_matches_reference: hyp(Geo, Euc, 0.8, 1.3), TYPICAL, causal_top_left_q_shorter, 0;
    geodesic_midpoint_causal_bottom_right_q_longer_than_k_zeroes_empty_rows: hyp(Geo, Mid, 1.0, 1.0), TYPICAL, causal_bottom_right_q_longer, 0;
    sq_lorentz_causal_bottom_right_q_longer_than_k_zeroes_empty_rows: hyp(Sq, Euc, 1.5, 0.5), TYPICAL, causal_bottom_right_q_longer, 0;
    geodesic_key_padding_and_sliding_window_match_reference: hyp(Geo, Euc, 1.0, 1.0), TYPICAL, key_padding_and_window, 0;
    sq_lorentz_midpoint_key_padding_and_sliding_window_match_reference: hyp(Sq, Mid, 1.0, 1.0), TYPICAL, key_padding_and_window, 0;
    sq_lorentz_midpoint_packed_varlen_causal_matches_reference: hyp(Sq, Mid, 1.0, 1.0), TYPICAL, varlen_causal, 0;
    geodesic_packed_varlen_causal_matches_reference: hyp(Geo, Euc, 1.0, 2.0), TYPICAL, varlen_causal, 0;
    geodesic_midpoint_mqa_bhnd_layout_matches_reference: hyp(Geo, Mid, 1.0, 1.0), TYPICAL, mqa_bhnd, 0;
    sq_lorentz_strided_views_at_an_offset_match_reference: hyp(Sq, Euc, 1.0, 1.0), TYPICAL, strided_views, 8;
    geodesic_batch_broadcast_bias_gradient_matches_reference: hyp(Geo, Euc, 1.0, 1.0), TYPICAL, bias_broadcast_batch, 0;
    sq_lorentz_midpoint_head_broadcast_bias_gradient_matches_reference: hyp(Sq, Mid, 1.0, 1.0), TYPICAL, bias_broadcast_heads, 0;
    sq_lorentz_points_far_from_the_origin_match_reference: hyp(Sq, Euc, 1.0, 0.5), Points::FarCluster { radius: 30.0 }, dense_gqa, 0;
    geodesic_points_far_from_the_origin_match_reference: hyp(Geo, Euc, 1.0, 1.0), Points::FarCluster { radius: 30.0 }, dense_gqa, 0;
    geodesic_midpoint_points_far_from_the_origin_match_reference: hyp(Geo, Mid, 1.0, 2.0), Points::FarCluster { radius: 10.0 }, causal_top_left_q_shorter, 0;
    geodesic_identical_q_and_k_have_finite_gradients_matching_reference: hyp(Geo, Euc, 1.0, 1.0), Points::Identical { radius: 1.5 }, square, 0;
    sq_lorentz_identical_q_and_k_match_reference: hyp(Sq, Mid, 1.0, 1.0), Points::Identical { radius: 1.5 }, square, 0;
    geodesic_midpoint_values_at_and_beyond_the_klein_edge_are_clamped_like_the_reference: hyp(Geo, Mid, 1.0, 1.0), Points::KleinEdge { radius: 1.5 }, dense_gqa, 0;
    sq_lorentz_midpoint_values_at_and_beyond_the_klein_edge_are_clamped_like_the_reference: hyp(Sq, Mid, 0.5, 1.0), Points::KleinEdge { radius: 1.5 }, causal_bottom_right_q_longer, 0;
}

/// Long keys (Nk 900–1300, Nq 300–500, bottom-right causal) at the Hopper kernels' head dims: most
/// dK/dV tiles are full, so the fast tiles run (the squared Lorentz score's split halves, with and
/// without the midpoint), and each key tile streams enough query blocks to wrap the fused backward's
/// four stages (the 64-query tile at D = 64) several times. The short cases above rarely fill a tile.
macro_rules! gpu_long_tests {
    ($($name:ident: $family:expr;)*) => {$(
        #[test]
        #[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
        fn $name() {
            common::each_config(&common::flash_configs(), || {
                run_dims(stringify!($name), $family, &[64, 128], TYPICAL, 0, &long_keys_bottom_right);
            });
        }
    )*};
}

gpu_long_tests! {
    sq_lorentz_long_keys_bottom_right_matches_reference: hyp(Sq, Euc, 1.0, 1.0);
    sq_lorentz_midpoint_long_keys_bottom_right_matches_reference: hyp(Sq, Mid, 0.5, 0.7);
    geodesic_long_keys_bottom_right_matches_reference: hyp(Geo, Euc, 1.0, 1.0);
}

/// Every length a multiple of 128 and no mask: the squared Lorentz backward's every tile is fast, so on
/// bf16 at D = 64 it runs the fused kernel with 128-query blocks and the midpoint as a constant
/// (dispatch::fused_even). D = 128 and f16 take the general kernel
/// on the same shapes.
macro_rules! gpu_whole_tile_tests {
    ($($name:ident: $family:expr, $make:expr;)*) => {$(
        #[test]
        #[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
        fn $name() {
            common::each_config(&common::flash_configs(), || {
                run_dims(stringify!($name), $family, &[64, 128], TYPICAL, 0, &$make);
            });
        }
    )*};
}

gpu_whole_tile_tests! {
    sq_lorentz_whole_tiles_gqa_matches_reference: hyp(Sq, Euc, 1.0, 1.0), whole_tiles_gqa;
    sq_lorentz_midpoint_whole_tiles_gqa_matches_reference: hyp(Sq, Mid, 0.5, 0.7), whole_tiles_gqa;
    sq_lorentz_whole_tiles_packed_varlen_matches_reference: hyp(Sq, Euc, 1.0, 1.0), whole_tiles_varlen;
    sq_lorentz_whole_tiles_key_padding_matches_reference: hyp(Sq, Euc, 1.5, 0.5), whole_tiles_key_padding;
    sq_lorentz_midpoint_whole_tiles_key_padding_matches_reference: hyp(Sq, Mid, 1.0, 1.0), whole_tiles_key_padding;
}

/// The baseline itself (CPU only): in f32 it must track the f64 reference closely on typical points,
/// or the GPU tests' bound would be meaningless; and the shaped cases must do what they say.
#[test]
fn f32_naive_baseline_tracks_the_reference_and_cases_are_shaped_as_named() {
    for family in [
        hyp(Sq, Mid, 0.5, 0.7),
        hyp(Geo, Euc, 2.0, 1.7),
        hyp(Geo, Mid, 1.0, 1.0),
    ] {
        let spec = AttnProblem::new(family, DType::F32, 1, 2, 1, 23, 29, 32)
            .with_causal(Causal::BottomRight)
            .validate()
            .expect("valid problem");
        let mut case = attn_cpu_ref::testing::random_case(&spec, 5);
        shape_points(&mut case, TYPICAL);
        let r = attn_cpu_ref::forward_f64(&spec, case.inputs()).expect("forward");
        let g =
            attn_cpu_ref::backward_f64(&spec, case.inputs(), &r.o, &case.d_o, &r.stats).expect("backward");
        let base = naive::<f32>(&spec, case.inputs(), &case.d_o);
        for (name, got, want) in [
            ("o", &base.o, &r.o),
            ("dq", &base.dq, &g.dq),
            ("dk", &base.dk, &g.dk),
            ("dv", &base.dv, &g.dv),
        ] {
            let err = attn_cpu_ref::testing::max_abs_diff(got, want);
            let scale = attn_cpu_ref::testing::max_abs(want).max(1e-3);
            assert!(err < 1e-4 * scale, "{family:?} {name}: {err:e} (scale {scale:e})");
        }
    }
    let spec = AttnProblem::new(hyp(Geo, Mid, 1.0, 1.0), DType::F32, 1, 2, 2, 9, 9, 32)
        .validate()
        .expect("valid problem");
    let mut case = attn_cpu_ref::testing::random_case(&spec, 1);
    shape_points(&mut case, Points::Identical { radius: 1.5 });
    assert_eq!(case.q, case.k);
    let mut case = attn_cpu_ref::testing::random_case(&spec, 1);
    shape_points(&mut case, Points::KleinEdge { radius: 1.5 });
    let c_norm2: Vec<f64> = case.v.chunks(32).map(|v| v.iter().map(|x| x * x).sum()).collect();
    assert!(c_norm2.iter().any(|&n| (n - 0.9995).abs() < 1e-9));
    assert!(c_norm2.iter().any(|&n| n > 1.0));
    let mut case = attn_cpu_ref::testing::random_case(&spec, 1);
    shape_points(&mut case, Points::FarCluster { radius: 30.0 });
    let norm = case.q[..32].iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((25.0..35.0).contains(&norm), "{norm}");
}

/// Bad curvature or temperature never reaches a kernel: validation names the argument (CPU only).
#[test]
fn nonpositive_or_nan_curvature_and_beta_are_typed_errors() {
    for (c, beta, arg) in [
        (0.0, 1.0, "curvature"),
        (-1.0, 1.0, "curvature"),
        (f32::NAN, 1.0, "curvature"),
        (1.0, 0.0, "beta"),
        (1.0, -2.0, "beta"),
        (1.0, f32::NAN, "beta"),
    ] {
        let err = AttnProblem::new(hyp(Geo, Mid, c, beta), DType::BF16, 1, 1, 1, 8, 8, 64)
            .validate()
            .expect_err("invalid hyperbolic parameters");
        assert!(
            matches!(err, attn_core::AttnError::InvalidArgument { arg: a, .. } if a == arg),
            "c = {c}, β = {beta}: {err}"
        );
    }
}

/// The non-finite values each target gets: NaN everywhere; ±∞ in q and k on f32 only (the f32
/// kernels turn a non-finite score into NaN; the tensor-core kernels do not yet, docs/nan.md); a bias
/// entry NaN, +∞ (the row NaN) and −∞ (its key masked).
fn poisons(target: Target, dtype: DType) -> Vec<f64> {
    match target {
        Target::Q | Target::K if dtype == DType::F32 => vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
        Target::Bias => vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
        _ => vec![f64::NAN],
    }
}

/// One spec with every poison of `target` at three positions (seeded), each against the reference.
fn check_spec_poisoned(spec: &AttnSpec, seed: u64, target: Target) -> Result<(), String> {
    for value in poisons(target, spec.dtype()) {
        for at in [seed as usize * 7919 + 3, seed as usize * 104_729 + 11, 5] {
            match spec.dtype() {
                DType::F32 => check_poisoned::<f32>(spec, seed, target, at, value, naive::<f32>)?,
                DType::F16 => check_poisoned::<half::f16>(spec, seed, target, at, value, naive::<half::f16>)?,
                DType::BF16 => {
                    check_poisoned::<half::bf16>(spec, seed, target, at, value, naive::<half::bf16>)?
                }
            }
        }
    }
    Ok(())
}

// The NaN/Inf contract (docs/nan.md) on problems without a mask (GQA with tails), forward and
// backward, every kernel configuration; masked problems are left out (docs/nan.md: the tensor-core
// products read a masked pair's operands).
macro_rules! nonfinite_tests {
    ($($name:ident: $family:expr, $make:expr, $target:expr;)*) => {$(
        #[test]
        #[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
        fn $name() {
            common::each_config(&common::flash_configs(), || {
                let mut cases = Cases::new(stringify!($name));
                let seed = |n: usize| 9000 + 13 * n as u64;
                check_dims(&mut cases, $family, &DIMS, LENGTHS, seed, &$make, |spec, seed| {
                    check_spec_poisoned(spec, seed, $target)
                });
                cases.finish();
            });
        }
    )*};
}

nonfinite_tests! {
    sq_lorentz_nonfinite_q_makes_its_row_nan: hyp(Sq, Euc, 1.0, 1.0), dense_gqa, Target::Q;
    sq_lorentz_nonfinite_k_makes_the_rows_that_see_it_nan: hyp(Sq, Euc, 1.0, 1.0), dense_gqa, Target::K;
    sq_lorentz_nan_v_makes_its_column_nan: hyp(Sq, Euc, 1.0, 1.0), dense_gqa, Target::V;
    sq_lorentz_nan_do_reaches_its_row_gradients: hyp(Sq, Euc, 1.0, 1.0), dense_gqa, Target::DO;
    sq_lorentz_nonfinite_bias_follows_the_contract: hyp(Sq, Euc, 1.0, 1.0), bias_broadcast_heads, Target::Bias;
    geodesic_nonfinite_q_makes_its_row_nan: hyp(Geo, Euc, 1.0, 1.0), dense_gqa, Target::Q;
    geodesic_nonfinite_k_is_not_the_most_similar_key: hyp(Geo, Euc, 1.0, 1.0), dense_gqa, Target::K;
    geodesic_nan_v_makes_its_column_nan: hyp(Geo, Euc, 1.0, 1.0), dense_gqa, Target::V;
    geodesic_nan_do_reaches_its_row_gradients: hyp(Geo, Euc, 1.0, 1.0), dense_gqa, Target::DO;
    geodesic_nonfinite_bias_follows_the_contract: hyp(Geo, Euc, 1.0, 1.0), bias_broadcast_heads, Target::Bias;
    sq_lorentz_midpoint_nan_v_makes_the_rows_that_see_it_nan: hyp(Sq, Mid, 1.0, 1.0), dense_gqa, Target::V;
    geodesic_midpoint_nonfinite_k_makes_the_rows_that_see_it_nan: hyp(Geo, Mid, 1.0, 1.0), dense_gqa, Target::K;
}

/// `KernelConfig::hyperbolic_exact`: f16 and bf16 calls on the SIMT kernels with the cancellation-free
/// distance keep the storage type's accuracy against the reference at radius 1e3 (the strict
/// comparison of `check_points` for `FarCluster`), where the tensor-core kernels' `q·k − q0 k0` loses
/// a nat or more (docs/hyperbolic.md); and they follow the usual rule on typical points with masks.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn hyperbolic_exact_follows_the_reference_far_from_the_origin() {
    let exact = attn_cuda::KernelConfig {
        hyperbolic_exact: true,
        ..attn_cuda::KernelConfig::default()
    };
    common::each_config(&[("hyperbolic-exact", exact)], || {
        let far = Points::FarCluster { radius: 1e3 };
        run("sq_lorentz_exact_far", hyp(Sq, Euc, 1.0, 0.5), far, 0, &dense_gqa);
        run("geodesic_exact_far", hyp(Geo, Euc, 1.0, 1.0), far, 0, &dense_gqa);
        run(
            "geodesic_midpoint_exact_far",
            hyp(Geo, Mid, 1.0, 1.0),
            far,
            0,
            &dense_gqa,
        );
        run(
            "sq_lorentz_midpoint_exact_causal",
            hyp(Sq, Mid, 1.0, 1.0),
            TYPICAL,
            0,
            &causal_top_left_q_shorter,
        );
        run(
            "geodesic_exact_bias",
            hyp(Geo, Euc, 1.0, 1.0),
            TYPICAL,
            0,
            &bias_broadcast_heads,
        );
    });
}
