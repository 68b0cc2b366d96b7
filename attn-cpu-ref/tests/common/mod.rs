//! Helpers shared by the softmax-like test suites: random problems that cover every option of the
//! spec, the f64 reference on a case, row copies between layouts, and a proptest runner that reports
//! how many cases ran.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use attn_core::{
    Aggregation, AttnProblem, AttnSpec, BiasShape, Causal, CosineParams, DType, Family, HypScore,
    HyperbolicParams, Layout, SeqLengths, SoftmaxParams, Window, DEFAULT_L2_EPS,
};
use attn_cpu_ref::testing::{max_abs, max_abs_diff, random_case, Case};
use attn_cpu_ref::{backward_f64, forward_f64, Forward, Gradients};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use std::cell::Cell;
use std::fmt::Debug;

#[path = "../../src/proptest_config.rs"]
mod proptest_config;

/// Run `test` on `cases` values of `strategy` (from the fixed seed of `src/proptest_config.rs`),
/// print how many cases ran, and fail the test with the shrunk counterexample if one fails; the
/// failing seed is saved under `proptest-regressions/tests/<calling file>.txt`.
#[track_caller]
pub fn run_cases<S>(name: &str, cases: u32, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: Debug,
{
    let caller = std::path::Path::new(std::panic::Location::caller().file());
    let file = caller.file_stem().and_then(|s| s.to_str()).unwrap_or("common");
    let mut runner = TestRunner::new(proptest_config::config_for_test_file(cases, file));
    let ran = Cell::new(0u32);
    let result = runner.run(&strategy, |value| {
        ran.set(ran.get() + 1);
        test(value)
    });
    println!("{name}: {} proptest cases", ran.get());
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

pub fn softmax_family() -> impl Strategy<Value = Family> + Clone {
    (prop::option::of(0.1f32..1.5), prop::option::of(0.5f32..5.0))
        .prop_map(|(scale, softcap)| Family::Softmax(SoftmaxParams { scale, softcap }))
}

pub fn cosine_family() -> impl Strategy<Value = Family> + Clone {
    let eps = prop_oneof![Just(DEFAULT_L2_EPS), 1e-4f32..1e-2];
    (0.5f32..12.0, any::<bool>(), eps).prop_map(|(scale, qk_l2norm, eps)| {
        Family::CosineSim(CosineParams {
            scale,
            qk_l2norm,
            eps,
        })
    })
}

pub fn hyp_score() -> impl Strategy<Value = HypScore> + Clone {
    prop_oneof![Just(HypScore::Geodesic), Just(HypScore::SquaredLorentz)]
}

pub fn aggregation() -> impl Strategy<Value = Aggregation> + Clone {
    prop_oneof![Just(Aggregation::Euclidean), Just(Aggregation::EinsteinMidpoint)]
}

pub fn hyperbolic_family() -> impl Strategy<Value = Family> + Clone {
    (hyp_score(), aggregation(), 0.25f32..3.0, 0.1f32..2.0).prop_map(
        |(score, aggregation, curvature, beta)| {
            Family::Hyperbolic(HyperbolicParams {
                score,
                curvature,
                beta,
                aggregation,
            })
        },
    )
}

/// Any softmax-like family with random parameters.
pub fn softmax_like_family() -> impl Strategy<Value = Family> + Clone {
    prop_oneof![softmax_family(), cosine_family(), hyperbolic_family()]
}

pub fn causal() -> impl Strategy<Value = Causal> + Clone {
    prop_oneof![
        Just(Causal::None),
        Just(Causal::TopLeft),
        Just(Causal::BottomRight)
    ]
}

pub fn layout() -> impl Strategy<Value = Layout> + Clone {
    prop_oneof![Just(Layout::Bnhd), Just(Layout::Bhnd)]
}

pub fn window() -> impl Strategy<Value = Option<Window>> + Clone {
    let some = (prop::option::of(0..4usize), prop::option::of(0..4usize))
        .prop_map(|(left, right)| Some(Window { left, right }));
    prop_oneof![2 => Just(None), 1 => some]
}

/// Dense, key padding (lengths 0..=Nk) or a packed varlen batch (lengths 0..=Nq, 0..=Nk).
pub fn lengths(batch: usize, nq: usize, nk: usize) -> impl Strategy<Value = SeqLengths> {
    let padding = prop::collection::vec(0..=nk, batch).prop_map(SeqLengths::KeyPadding);
    let varlen = prop::collection::vec((0..=nq, 0..=nk), batch).prop_map(|lens| {
        let (mut cq, mut ck) = (vec![0], vec![0]);
        for (lq, lk) in lens {
            cq.push(cq.last().copied().unwrap_or(0) + lq);
            ck.push(ck.last().copied().unwrap_or(0) + lk);
        }
        SeqLengths::Varlen {
            cu_seqlens_q: cq,
            cu_seqlens_k: ck,
        }
    });
    prop_oneof![Just(SeqLengths::Dense), padding, varlen]
}

/// A bias with each of its batch and head dims either full or broadcast (never with varlen).
pub fn bias(batch: usize, heads_q: usize) -> impl Strategy<Value = Option<BiasShape>> {
    let shape = (
        prop_oneof![Just(1), Just(batch)],
        prop_oneof![Just(1), Just(heads_q)],
    )
        .prop_map(|(batch, heads)| Some(BiasShape { batch, heads }));
    prop_oneof![1 => Just(None), 2 => shape]
}

/// A valid problem over every option of the spec except explicit strides: B 1–2, Hkv 1–2, group
/// 1–3, Nq and Nk 1–9, D and Dv 1–6, both layouts, every causal alignment, random windows, key
/// padding or varlen, a bias with random broadcast.
pub fn problem(family: impl Strategy<Value = Family> + Clone) -> impl Strategy<Value = AttnProblem> {
    let dims = (
        1..=2usize,
        1..=2usize,
        1..=3usize,
        1..=9usize,
        1..=9usize,
        1..=6usize,
        1..=6usize,
    );
    (family, dims, layout(), causal(), window())
        .prop_flat_map(
            |(family, (b, hkv, group, nq, nk, d, dv), layout, causal, window)| {
                let mut p = AttnProblem::new(family, DType::F32, b, hkv * group, hkv, nq, nk, d)
                    .with_head_dim_v(dv)
                    .with_layout(layout)
                    .with_causal(causal);
                p.window = window;
                (Just(p), lengths(b, nq, nk), bias(b, hkv * group))
            },
        )
        .prop_map(|(mut p, lengths, bias)| {
            if !matches!(lengths, SeqLengths::Varlen { .. }) {
                p.bias = bias;
            }
            p.lengths = lengths;
            p
        })
}

/// A problem from [`problem`] and a seed for its data.
pub fn setup(family: impl Strategy<Value = Family> + Clone) -> impl Strategy<Value = (AttnProblem, u64)> {
    (problem(family), any::<u64>())
}

/// The checked spec of a problem that [`problem`] built (always valid) and a random case on it.
pub fn case(p: &AttnProblem, seed: u64) -> Case {
    random_case(&p.validate().expect("problem() builds valid problems"), seed)
}

/// Forward and backward of the f64 reference on `case`, with its random dO.
pub fn run(case: &Case) -> (Forward<f64, f64>, Gradients<f64>) {
    let f = forward_f64(&case.spec, case.inputs()).expect("forward of a valid case");
    let g =
        backward_f64(&case.spec, case.inputs(), &f.o, &case.d_o, &f.stats).expect("backward of a valid case");
    (f, g)
}

/// `max|a − b| ≤ tol·max(1, max|b|)`.
pub fn close(name: &str, a: &[f64], b: &[f64], tol: f64) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.len(), b.len(), "{}: lengths differ", name);
    let err = max_abs_diff(a, b);
    let bound = tol * max_abs(b).max(1.0);
    prop_assert!(err <= bound, "{}: max difference {:e} > {:e}", name, err, bound);
    Ok(())
}

/// No NaN or infinity in any output or gradient; LSE may be −∞ (a row with no allowed key).
pub fn all_finite(f: &Forward<f64, f64>, g: &Gradients<f64>) -> Result<(), TestCaseError> {
    let tensors = [("o", &f.o), ("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)];
    for (name, t) in tensors.into_iter().chain(g.dbias.as_ref().map(|t| ("dbias", t))) {
        prop_assert!(t.iter().all(|x| x.is_finite()), "{} has a non-finite entry", name);
    }
    prop_assert!(
        f.stats.iter().all(|&l| l.is_finite() || l == f64::NEG_INFINITY),
        "LSE is NaN or +inf"
    );
    Ok(())
}

/// Which input tensor a row belongs to, for [`offset`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tensor {
    Q,
    K,
    V,
}

/// The element offset of row `(b, n, h)` of input `t`, through the spec's input strides.
pub fn offset(spec: &AttnSpec, t: Tensor, b: usize, n: usize, h: usize) -> usize {
    match t {
        Tensor::Q => spec.q_offset(b, n, h),
        Tensor::K => spec.k_offset(b, n, h),
        Tensor::V => spec.v_offset(b, n, h),
    }
}
