//! Taylor attention on the fast path (f32 accumulation, chunked factorised states) against the f64
//! oracle: every output (o, the denominator) and every gradient, across the Taylor test shapes
//! (`src/taylor/test_specs.rs`: order 1 and 2, l2-norm on and off, causal of both alignments with
//! Nq ≠ Nk, GQA, key padding, packed varlen, Dv ≠ D, both layouts), the chunk boundaries, large
//! scores for order 2, f32, f16 and bf16 storage, and independence of the thread count.
//!
//! The comparison is `fast_common::check_case` (its module doc: the GPU tests' naive same-dtype
//! baseline, quadratic Taylor attention in the storage dtype; the denominator's `atol` relative to
//! `max|den|`).

#[path = "../src/taylor/test_specs.rs"]
mod test_specs;

mod common;
mod fast_common;

use attn_core::{AttnProblem, AttnSpec, Causal, DType, Family, Layout};
use attn_cpu_ref::testing::{max_abs, random_case, Case};
use attn_cpu_ref::{backward_f64, fast, forward_f64, Forward, Gradients, Inputs};
use common::run_cases;
use fast_common::round;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use test_specs::{family, problems, Limits};

/// The case in f32 storage through the fast path: its forward, then its backward from its own o and
/// denominators (as attn-candle chains them).
fn run_fast_f32(spec: &AttnSpec, case: &Case) -> (Forward<f32, f32>, Gradients<f32>) {
    let narrow = |x: &[f64]| round::<f32>(x).0;
    let (q, k, v, d_o) = (
        narrow(&case.q),
        narrow(&case.k),
        narrow(&case.v),
        narrow(&case.d_o),
    );
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: None,
    };
    let f = fast::forward(spec, x).expect("fast forward");
    let g = fast::backward(spec, x, &f.o, &d_o, &f.stats).expect("fast backward");
    (f, g)
}

fn check(spec: &AttnSpec, seed: u64, what: &str) -> Result<(), String> {
    let case = random_case(spec, seed);
    match spec.dtype() {
        DType::F32 => fast_common::check_case::<f32>(spec, &case, what),
        DType::F16 => fast_common::check_case::<half::f16>(spec, &case, what),
        DType::BF16 => fast_common::check_case::<half::bf16>(spec, &case, what),
    }
}

fn dtype() -> impl Strategy<Value = DType> + Clone {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16)]
}

/// Up to 150 queries and keys at head dims ≤ 6: the planner puts all but the last chunk of 64 keys
/// into the states there (their state rows are few), so most draws cross chunk boundaries.
#[test]
fn fast_taylor_matches_the_oracle_on_every_spec_option() {
    let lim = Limits {
        batch: 2,
        heads_kv: 2,
        group: 3,
        seq: 150,
        dim: 6,
    };
    run_cases(
        "fast_taylor_matches_the_oracle_on_every_spec_option",
        192,
        (problems(lim), dtype(), any::<u64>()),
        |(mut p, dtype, seed)| {
            p.dtype = dtype;
            let spec = p.validate().map_err(|e| TestCaseError::fail(e.to_string()))?;
            check(&spec, seed, "proptest").map_err(TestCaseError::fail)
        },
    );
}

/// A Taylor problem with fixed coefficients from `test_specs::family`'s draws.
fn problem(order: u8, l2norm: bool, nq: usize, nk: usize, d: usize, dv: usize) -> AttnProblem {
    AttnProblem::new(
        family(order, [0.3, 0.7, 0.4, 0.5], l2norm, d),
        DType::F32,
        2,
        4,
        2,
        nq,
        nk,
        d,
    )
    .with_head_dim_v(dv)
}

fn run_table(name: &str, problems: Vec<AttnProblem>, dtypes: &[DType]) {
    let mut failures = Vec::new();
    let mut n = 0;
    for (i, p) in problems.into_iter().enumerate() {
        for &dtype in dtypes {
            let mut p = p.clone();
            p.dtype = dtype;
            let spec = match p.validate() {
                Ok(s) => s,
                Err(e) => panic!("{name}: problem {i} is invalid: {e}"),
            };
            n += 1;
            if let Err(e) = check(&spec, 31 + i as u64, &format!("{name}[{i}]")) {
                failures.push(e);
            }
        }
    }
    println!("{name}: {n} cases");
    assert!(
        failures.is_empty(),
        "{name}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// N = C − 1, C, C + 1 around the smallest chunk (64), 1 and 0, for both orders and every causal
/// alignment, at D = 4 (states from the first chunk on).
#[test]
fn fast_taylor_chunk_boundaries() {
    let mut ps = Vec::new();
    for order in [1, 2] {
        for n in [0, 1, 63, 64, 65, 129] {
            for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
                ps.push(problem(order, order == 1, n, n, 4, 3).with_causal(causal));
            }
            // Nq ≠ Nk across the boundary.
            ps.push(problem(order, false, n, n + 64, 4, 4).with_causal(Causal::BottomRight));
            ps.push(problem(order, true, n + 64, n, 4, 4).with_causal(Causal::TopLeft));
        }
    }
    run_table("fast_taylor_chunk_boundaries", ps, &[DType::F32, DType::BF16]);
}

/// Head dims 64 (and Dv 32; one case at 128): order 1 through the states, order 2 through the
/// quadratic form (these lengths are below its crossover), GQA, key padding and packed varlen.
#[test]
fn fast_taylor_head_dim_64_shapes() {
    let mut ps = Vec::new();
    for order in [1, 2] {
        let l2 = order == 1;
        ps.push(problem(order, l2, 200, 130, 64, 64));
        ps.push(problem(order, l2, 1100, 1100, 64, 32).with_causal(Causal::TopLeft));
        ps.push(problem(order, !l2, 700, 1300, 64, 64).with_causal(Causal::BottomRight));
        ps.push(
            problem(order, l2, 900, 1200, 64, 64)
                .with_causal(Causal::TopLeft)
                .with_key_lens(vec![1200, 517]),
        );
        ps.push(
            problem(order, l2, 700, 1000, 64, 64)
                .with_varlen(vec![0, 700, 1300], vec![0, 1000, 1013])
                .with_causal(Causal::BottomRight)
                .with_layout(Layout::Bnhd),
        );
    }
    // D = 128 (the quadratic form at this length; 8,384 state rows).
    ps.push(problem(2, false, 300, 330, 128, 128).with_causal(Causal::TopLeft));
    run_table("fast_taylor_head_dim_64_shapes", ps, &[DType::F32, DType::BF16]);
}

/// Order 2 where the planner reads the states at wide heads: non-causal at D = 64 (from about 2100
/// keys), causal at D = 32 with GQA.
#[test]
fn fast_taylor_order2_states_at_head_dims_32_and_64() {
    let one = |nq, nk, d, hq| {
        AttnProblem::new(
            family(2, [0.3, 0.7, 0.4, 0.5], false, d),
            DType::F32,
            1,
            hq,
            1,
            nq,
            nk,
            d,
        )
    };
    let ps = vec![
        one(2200, 2200, 64, 1),
        one(1100, 1100, 32, 2).with_causal(Causal::TopLeft),
        one(900, 1200, 32, 2)
            .with_causal(Causal::BottomRight)
            .with_layout(Layout::Bnhd),
    ];
    run_table(
        "fast_taylor_order2_states_at_head_dims_32_and_64",
        ps,
        &[DType::F32],
    );
}

/// Order 2 with |q·k| up to ~10⁴·D (q and k scaled by 100): f ≥ 1/2 keeps every sum positive, and
/// the states (which add products of either sign) must still agree with the oracle.
#[test]
fn fast_taylor_order2_large_scores() {
    for causal in [Causal::None, Causal::TopLeft] {
        let p = AttnProblem::new(Family::taylor(2), DType::F32, 2, 4, 2, 300, 260, 8)
            .with_head_dim_v(5)
            .with_causal(causal);
        let spec = p.validate().expect("valid problem");
        let mut case = random_case(&spec, 17);
        case.q
            .iter_mut()
            .chain(case.k.iter_mut())
            .for_each(|x| *x *= 100.0);
        fast_common::check_case::<f32>(&spec, &case, "large scores").unwrap_or_else(|e| panic!("{e}"));
        let mut p = p;
        p.dtype = DType::BF16;
        let spec = p.validate().expect("valid problem");
        fast_common::check_case::<half::bf16>(&spec, &case, "large scores").unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Rayon pools of 1 and 3 threads give the same bits: the chunks, probe blocks and state row blocks
/// do not depend on the thread count, and every sum has one owner.
#[test]
fn fast_taylor_is_bit_identical_across_thread_counts() {
    for (order, causal, n, d) in [
        (2, Causal::TopLeft, 700, 16),
        (2, Causal::None, 2200, 32),
        (1, Causal::BottomRight, 900, 8),
    ] {
        let p = problem(order, false, n, n + 40, d, d).with_causal(causal);
        let spec = p.validate().expect("valid problem");
        let case = random_case(&spec, 5);
        let runs: Vec<_> = [1, 3]
            .into_iter()
            .map(|threads| fast_common::on_threads(threads, || run_fast_f32(&spec, &case)))
            .collect();
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let (a, b) = (&runs[0], &runs[1]);
        assert_eq!(
            bits(&a.0.o),
            bits(&b.0.o),
            "o differs (order {order}, {causal:?})"
        );
        assert_eq!(bits(&a.0.stats), bits(&b.0.stats), "den differs");
        assert_eq!(bits(&a.1.dq), bits(&b.1.dq), "dq differs");
        assert_eq!(bits(&a.1.dk), bits(&b.1.dk), "dk differs");
        assert_eq!(bits(&a.1.dv), bits(&b.1.dv), "dv differs");
    }
}

/// docs/nan.md on the fast path: a NaN in a k row and one in a v row reach exactly the outputs and
/// gradients they reach in the reference (the rows that see them), and every other entry still
/// matches the oracle; the poisoned rows sit inside chunks that other rows see only partly.
#[test]
fn fast_taylor_nan_reaches_what_it_reaches_in_the_reference() {
    for (order, causal) in [(2, Causal::TopLeft), (1, Causal::BottomRight), (2, Causal::None)] {
        let p = AttnProblem::new(
            family(order, [0.3, 0.7, 0.4, 0.5], false, 4),
            DType::F32,
            1,
            2,
            1,
            150,
            150,
            4,
        )
        .with_causal(causal);
        let spec = p.validate().expect("valid problem");
        let mut case = random_case(&spec, 9);
        let d = spec.head_dim();
        // Key 100's k and key 120's v (kv head 0, layout [B, N, H, D] with one kv head).
        case.k[spec.k_offset(0, 100, 0)] = f64::NAN;
        case.v[spec.v_offset(0, 120, 0) + 1] = f64::NAN;
        // f32 storage; the oracle on the same rounded values.
        let rounded = |x: &[f64]| round::<f32>(x).1;
        let widen = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let (qw, kw, vw, dow) = (
            rounded(&case.q),
            rounded(&case.k),
            rounded(&case.v),
            rounded(&case.d_o),
        );
        let wide = Inputs {
            q: &qw,
            k: &kw,
            v: &vw,
            bias: None,
        };
        let rf = forward_f64(&spec, wide).expect("reference forward");
        let rg = backward_f64(&spec, wide, &rf.o, &dow, &rf.stats).expect("reference backward");
        let (f, g) = run_fast_f32(&spec, &case);
        for (name, got, want) in [
            ("o", widen(&f.o), &rf.o),
            ("den", widen(&f.stats), &rf.stats),
            ("dq", widen(&g.dq), &rg.dq),
            ("dk", widen(&g.dk), &rg.dk),
            ("dv", widen(&g.dv), &rg.dv),
        ] {
            let nan_got: Vec<bool> = got.iter().map(|x| x.is_nan()).collect();
            let nan_want: Vec<bool> = want.iter().map(|x| x.is_nan()).collect();
            assert_eq!(
                nan_got, nan_want,
                "{name}: NaN positions differ (order {order}, {causal:?})"
            );
            assert!(nan_want.iter().any(|&x| x), "{name}: the poison reaches nothing");
            if name == "o" && causal != Causal::None {
                assert!(!nan_want.iter().all(|&x| x), "o: the poison reaches every row");
            }
            let (g, w): (Vec<f64>, Vec<f64>) = got
                .iter()
                .zip(want.iter())
                .filter(|(_, w)| !w.is_nan())
                .map(|(a, b)| (*a, *b))
                .unzip();
            let err = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(
                err <= 1e-4 * max_abs(&w).max(1.0),
                "{name}: finite entries differ by {err:.3e} (order {order}, {causal:?}, D = {d})"
            );
        }
    }
}
