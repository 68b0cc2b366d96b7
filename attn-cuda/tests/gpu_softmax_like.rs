//! Softmax and cosine-sim kernels against the f64 CPU reference: every family × dtype × head dim ×
//! mask option, random shapes with tails (N not a multiple of any tile), random dO, outputs
//! poisoned with NaN before each launch. See `common` for the tolerance.
//!
//! GPU-only: `cargo xtask test-gpu` (or the bundle of `cargo xtask gpu-bundle`) runs them with
//! `--ignored`.

mod common;
mod poison;

use attn_core::{AttnProblem, AttnSpec, Causal, CosineParams, DType, Family, SoftmaxParams};
use attn_cpu_ref::testing::random_case;
use common::shapes::{
    bias_broadcast_batch, bias_broadcast_heads, causal_bottom_right_q_longer, causal_top_left_q_shorter,
    dense_gqa, key_padding_and_window, long_keys_bottom_right, mqa_bhnd, strided_views, varlen_causal,
    Lengths, Make, Shapes,
};
use common::{check_dims, check_dtype, identical_runs, naive, Cases};
use poison::{check_poisoned, Target};

const SOFTMAX_DIMS: [usize; 5] = [32, 64, 96, 128, 256];
const COSINE_DIMS: [usize; 6] = [16, 32, 64, 96, 128, 256];

/// Sequence lengths scale down with the head dim so the f64 reference stays quick.
fn max_len(d: usize) -> usize {
    if d >= 256 {
        90
    } else {
        150
    }
}

/// Dense shapes draw `Nq` and `Nk` alike.
const LENGTHS: Lengths = Lengths {
    max: max_len,
    min_k: 40,
};

fn run_with_offset(name: &str, family: Family, dims: &[usize], offset: usize, make: &Make) {
    let mut cases = Cases::new(name);
    let seed = |n: usize| 1000 + 17 * n as u64;
    check_dims(&mut cases, family, dims, LENGTHS, seed, make, |spec, seed| {
        check_dtype(spec, seed, offset)
    });
    cases.finish();
}

fn softmax_softcap() -> Family {
    Family::Softmax(SoftmaxParams {
        scale: Some(1.5),
        softcap: Some(2.0),
    })
}

/// Logits of magnitude about 10⁴ (scale 3000 on rows of norm about √(D/3)): the running max, its
/// rescaling and the exponentials far from 0.
fn softmax_huge_logits() -> Family {
    Family::Softmax(SoftmaxParams {
        scale: Some(3000.0),
        softcap: None,
    })
}

/// The same logits through a softcap of 10⁴ (tanh in its curved range).
fn softmax_huge_logits_softcap() -> Family {
    Family::Softmax(SoftmaxParams {
        scale: Some(3000.0),
        softcap: Some(1.0e4),
    })
}

fn softmax_sharp() -> Family {
    // A large scale makes the attention peaked: exercises the running max and its rescaling.
    Family::Softmax(SoftmaxParams {
        scale: Some(4.0),
        softcap: None,
    })
}

fn cosine_unnormalised() -> Family {
    Family::CosineSim(CosineParams {
        scale: 0.5,
        qk_l2norm: false,
        ..CosineParams::default()
    })
}

fn cosine_large_scale() -> Family {
    // Above the fixed-offset limit: the kernel tracks the running max.
    Family::CosineSim(CosineParams {
        scale: 40.0,
        ..CosineParams::default()
    })
}

macro_rules! gpu_tests {
    ($($name:ident: $family:expr, $dims:expr, $make:expr, $offset:expr;)*) => {$(
        #[test]
        #[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
        fn $name() {
            common::each_config(&common::flash_configs(), || {
                run_with_offset(stringify!($name), $family, &$dims, $offset, &$make);
            });
        }
    )*};
}

gpu_tests! {
    softmax_dense_gqa_with_tails_matches_reference: Family::softmax(), SOFTMAX_DIMS, dense_gqa, 0;
    softmax_sharp_scores_match_reference: softmax_sharp(), SOFTMAX_DIMS, dense_gqa, 0;
    softmax_causal_top_left_q_shorter_than_k_matches_reference: Family::softmax(), SOFTMAX_DIMS, causal_top_left_q_shorter, 0;
    softmax_causal_bottom_right_q_longer_than_k_zeroes_empty_rows: Family::softmax(), SOFTMAX_DIMS, causal_bottom_right_q_longer, 0;
    softmax_key_padding_and_sliding_window_match_reference: Family::softmax(), SOFTMAX_DIMS, key_padding_and_window, 0;
    softmax_packed_varlen_causal_matches_reference: Family::softmax(), SOFTMAX_DIMS, varlen_causal, 0;
    softmax_mqa_bhnd_layout_matches_reference: Family::softmax(), SOFTMAX_DIMS, mqa_bhnd, 0;
    softmax_strided_views_at_an_offset_match_reference: Family::softmax(), SOFTMAX_DIMS, strided_views, 8;
    softmax_softcap_and_batch_broadcast_bias_match_reference: softmax_softcap(), SOFTMAX_DIMS, bias_broadcast_batch, 0;
    softmax_head_broadcast_bias_gradient_matches_reference: Family::softmax(), SOFTMAX_DIMS, bias_broadcast_heads, 0;
    cosine_dense_gqa_with_tails_matches_reference: Family::cosine_sim(), COSINE_DIMS, dense_gqa, 0;
    cosine_causal_top_left_q_shorter_than_k_matches_reference: Family::cosine_sim(), COSINE_DIMS, causal_top_left_q_shorter, 0;
    cosine_causal_bottom_right_q_longer_than_k_zeroes_empty_rows: Family::cosine_sim(), COSINE_DIMS, causal_bottom_right_q_longer, 0;
    cosine_key_padding_and_sliding_window_match_reference: Family::cosine_sim(), COSINE_DIMS, key_padding_and_window, 0;
    cosine_packed_varlen_causal_matches_reference: Family::cosine_sim(), COSINE_DIMS, varlen_causal, 0;
    cosine_mqa_bhnd_layout_matches_reference: Family::cosine_sim(), COSINE_DIMS, mqa_bhnd, 0;
    cosine_strided_views_at_an_offset_match_reference: Family::cosine_sim(), COSINE_DIMS, strided_views, 8;
    cosine_bias_uses_the_running_max_and_matches_reference: Family::cosine_sim(), COSINE_DIMS, bias_broadcast_batch, 0;
    cosine_head_broadcast_bias_gradient_matches_reference: Family::cosine_sim(), COSINE_DIMS, bias_broadcast_heads, 0;
    cosine_without_l2norm_matches_reference: cosine_unnormalised(), COSINE_DIMS, dense_gqa, 0;
    cosine_large_scale_uses_the_running_max_and_matches_reference: cosine_large_scale(), COSINE_DIMS, causal_top_left_q_shorter, 0;
    softmax_long_keys_bottom_right_matches_reference: Family::softmax(), [64, 128], long_keys_bottom_right, 0;
    cosine_long_keys_bottom_right_matches_reference: Family::cosine_sim(), [64, 128], long_keys_bottom_right, 0;
    softmax_logits_near_1e4_match_reference: softmax_huge_logits(), SOFTMAX_DIMS, dense_gqa, 0;
    softmax_causal_logits_near_1e4_match_reference: softmax_huge_logits(), SOFTMAX_DIMS, causal_top_left_q_shorter, 0;
    softmax_softcap_logits_near_1e4_match_reference: softmax_huge_logits_softcap(), SOFTMAX_DIMS, dense_gqa, 0;
    softmax_softcap_causal_logits_near_1e4_match_reference: softmax_huge_logits_softcap(), SOFTMAX_DIMS, causal_bottom_right_q_longer, 0;
}

/// The non-finite values each target gets: NaN everywhere; ±∞ in q and k on f32 only (the f32
/// kernels turn a non-finite product into NaN; the tensor-core kernels do not yet, docs/nan.md); a
/// bias entry NaN, +∞ (the row NaN) and −∞ (its key masked).
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

// The NaN/Inf contract (docs/nan.md) on problems without a mask: GQA with tails (every row sees every
// key of its kv head, so a bad k row reaches its group only), forward and backward, every kernel
// configuration. Masked problems are left out: the tensor-core products read a masked pair's operands
// (P = 0 times a NaN v, dS = 0 times a NaN q or k), docs/nan.md.
macro_rules! nonfinite_tests {
    ($($name:ident: $family:expr, $dims:expr, $make:expr, $target:expr;)*) => {$(
        #[test]
        #[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
        fn $name() {
            common::each_config(&common::flash_configs(), || {
                let mut cases = Cases::new(stringify!($name));
                let seed = |n: usize| 4000 + 13 * n as u64;
                check_dims(&mut cases, $family, &$dims, LENGTHS, seed, &$make, |spec, seed| {
                    check_spec_poisoned(spec, seed, $target)
                });
                cases.finish();
            });
        }
    )*};
}

nonfinite_tests! {
    softmax_nonfinite_q_makes_its_row_nan: Family::softmax(), SOFTMAX_DIMS, dense_gqa, Target::Q;
    softmax_nonfinite_k_makes_the_rows_that_see_it_nan: Family::softmax(), SOFTMAX_DIMS, dense_gqa, Target::K;
    softmax_nan_v_makes_its_column_nan: Family::softmax(), SOFTMAX_DIMS, dense_gqa, Target::V;
    softmax_nan_do_reaches_its_row_gradients: Family::softmax(), SOFTMAX_DIMS, dense_gqa, Target::DO;
    softmax_nonfinite_bias_follows_the_contract: Family::softmax(), SOFTMAX_DIMS, bias_broadcast_heads, Target::Bias;
    softmax_softcap_nonfinite_q_makes_its_row_nan: softmax_softcap(), SOFTMAX_DIMS, dense_gqa, Target::Q;
    softmax_softcap_nonfinite_bias_follows_the_contract: softmax_softcap(), SOFTMAX_DIMS, bias_broadcast_heads, Target::Bias;
    cosine_nonfinite_q_makes_its_row_nan: Family::cosine_sim(), COSINE_DIMS, dense_gqa, Target::Q;
    cosine_nonfinite_k_makes_the_rows_that_see_it_nan: Family::cosine_sim(), COSINE_DIMS, dense_gqa, Target::K;
    cosine_nan_v_makes_its_column_nan: Family::cosine_sim(), COSINE_DIMS, dense_gqa, Target::V;
    cosine_nan_do_reaches_its_row_gradients: Family::cosine_sim(), COSINE_DIMS, dense_gqa, Target::DO;
    cosine_nonfinite_bias_follows_the_contract: Family::cosine_sim(), COSINE_DIMS, bias_broadcast_heads, Target::Bias;
}

/// `deterministic` asks for a backward without atomics (on the H100 the two-kernel one, not the fused
/// one that is the default there for these families, whose dQ is a sum in arrival order): the same
/// bits on every run, for both families, both Hopper head dims and both 16-bit dtypes, on a causal GQA
/// case with several key tiles per query and tails. (Every other test here runs the default backward:
/// fused on Hopper under the default configuration, two kernels elsewhere.)
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn deterministic_backward_is_identical_run_to_run() {
    common::each_config(&common::flash_configs(), || {
        let mut cases = Cases::new("deterministic_backward_is_identical_run_to_run");
        for family in [Family::softmax(), Family::cosine_sim()] {
            for d in [64, 128] {
                for dtype in [DType::F16, DType::BF16] {
                    let spec = AttnProblem::new(family, dtype, 2, 6, 2, 333, 461, d)
                        .with_causal(Causal::BottomRight)
                        .with_deterministic(true)
                        .validate()
                        .expect("valid problem");
                    let case = random_case(&spec, 90 + d as u64);
                    cases.record(
                        format!("{} D={d} {dtype}", spec.family().label()),
                        identical_runs(&spec, &case),
                    );
                }
            }
        }
        cases.finish();
    });
}

#[test]
fn shape_generator_always_leaves_a_tail() {
    let mut s = Shapes::new(7, LENGTHS);
    for _ in 0..1000 {
        let n = s.tail(16, 300);
        assert_ne!(n % 16, 0, "{n}");
        assert!((16..=303).contains(&n));
    }
}
