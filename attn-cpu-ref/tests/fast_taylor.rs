//! Taylor attention on the fast path (f32 accumulation, chunked factorised states) against the f64
//! oracle: every output (o, the denominator) and every gradient, across the Taylor test shapes
//! (`src/taylor/test_specs.rs`: order 1 and 2, l2-norm on and off, causal of both alignments with
//! Nq ≠ Nk, GQA, key padding, packed varlen, Dv ≠ D, both layouts), the chunk boundaries, large
//! scores for order 2, f32, f16 and bf16 storage, and independence of the thread count.
//!
//! The tolerance is REFERENCE.md's rule as `fast_common` applies it: error ≤ 2·baseline + atol, the
//! baseline the oracle rounded once to the storage dtype (its backward started from o rounded to
//! it), `atol = (4·u_T + 64·√(Nk + D)·u_f32)·scale`; the denominator, unlike an LSE, scales with
//! its rows, so its `scale` is `max|den|`.

#[path = "../src/taylor/test_specs.rs"]
mod test_specs;

mod common;

use attn_core::{AttnProblem, AttnSpec, Causal, DType, Element, Family, Layout};
use attn_cpu_ref::testing::{check_close, max_abs, random_case, Case};
use attn_cpu_ref::{backward_f64, fast, forward_f64, Forward, Gradients, Inputs};
use common::run_cases;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use test_specs::{family, problems, Limits};

fn round<T: Element>(x: &[f64]) -> (Vec<T>, Vec<f64>) {
    let t: Vec<T> = x.iter().map(|&v| T::from_f64(v)).collect();
    let w = t.iter().map(|v| v.to_f64()).collect();
    (t, w)
}

fn widen<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// The case's inputs rounded to `T`, in `T` and widened back.
struct Rounded<T> {
    q: (Vec<T>, Vec<f64>),
    k: (Vec<T>, Vec<f64>),
    v: (Vec<T>, Vec<f64>),
    d_o: (Vec<T>, Vec<f64>),
}

impl<T: Element> Rounded<T> {
    fn new(case: &Case) -> Self {
        Rounded {
            q: round(&case.q),
            k: round(&case.k),
            v: round(&case.v),
            d_o: round(&case.d_o),
        }
    }
    fn narrow(&self) -> Inputs<'_, T> {
        Inputs {
            q: &self.q.0,
            k: &self.k.0,
            v: &self.v.0,
            bias: None,
        }
    }
    fn wide(&self) -> Inputs<'_, f64> {
        Inputs {
            q: &self.q.1,
            k: &self.k.1,
            v: &self.v.1,
            bias: None,
        }
    }
}

/// The fast path's forward, then its backward from its own o and denominators (as attn-candle
/// chains them).
fn run_fast<T: Element>(
    spec: &AttnSpec,
    x: Inputs<'_, T>,
    d_o: &[T],
) -> Result<(Forward<T, f32>, Gradients<T>), String> {
    let f = fast::forward(spec, x).map_err(|e| e.to_string())?;
    let g = fast::backward(spec, x, &f.o, d_o, &f.stats).map_err(|e| e.to_string())?;
    Ok((f, g))
}

/// Compare every output and gradient of the fast path in `T` with the oracle on the case.
fn check_case<T: Element>(spec: &AttnSpec, case: &Case, what: &str) -> Result<(), String> {
    let r = Rounded::<T>::new(case);
    let e = |e: attn_core::AttnError| e.to_string();
    let rf = forward_f64(spec, r.wide()).map_err(e)?;
    let rg = backward_f64(spec, r.wide(), &rf.o, &r.d_o.1, &rf.stats).map_err(e)?;
    let o_t = round::<T>(&rf.o).1;
    let bg = backward_f64(spec, r.wide(), &o_t, &r.d_o.1, &rf.stats).map_err(e)?;
    let (f, g) = run_fast::<T>(spec, r.narrow(), &r.d_o.0)?;

    let u = T::DTYPE.unit_roundoff();
    let acc = 64.0 * ((spec.seq_k() + spec.head_dim()) as f64).sqrt() * DType::F32.unit_roundoff();
    let atol = |scale: f64| (4.0 * u + acc) * scale.max(1e-3);
    let gscale = [&rg.dq, &rg.dk, &rg.dv]
        .iter()
        .map(|g| max_abs(g))
        .fold(0.0, f64::max);
    let ctx = |m: String| {
        format!(
            "{what}: {} {} q{:?} k{:?} causal {:?}: {m}",
            spec.family().label(),
            T::DTYPE,
            spec.q_shape(),
            spec.k_shape(),
            spec.causal(),
        )
    };
    let cmp = |name: &str, got: &[T], reference: &[f64], base: &[f64], tol: f64| {
        check_close(name, &widen(got), reference, &round::<T>(base).1, tol).map_err(ctx)
    };
    cmp("o", &f.o, &rf.o, &rf.o, atol(max_abs(&rf.o)))?;
    let den: Vec<f64> = f.stats.iter().map(|&x| x as f64).collect();
    let den_base: Vec<f64> = rf.stats.iter().map(|&x| x as f32 as f64).collect();
    check_close("den", &den, &rf.stats, &den_base, atol(max_abs(&rf.stats))).map_err(ctx)?;
    cmp("dq", &g.dq, &rg.dq, &bg.dq, atol(gscale))?;
    cmp("dk", &g.dk, &rg.dk, &bg.dk, atol(gscale))?;
    cmp("dv", &g.dv, &rg.dv, &bg.dv, atol(gscale))?;
    if g.dbias.is_some() {
        return Err(ctx("a dbias without a bias".into()));
    }
    Ok(())
}

fn check(spec: &AttnSpec, seed: u64, what: &str) -> Result<(), String> {
    let case = random_case(spec, seed);
    match spec.dtype() {
        DType::F32 => check_case::<f32>(spec, &case, what),
        DType::F16 => check_case::<half::f16>(spec, &case, what),
        DType::BF16 => check_case::<half::bf16>(spec, &case, what),
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
        check_case::<f32>(&spec, &case, "large scores").unwrap_or_else(|e| panic!("{e}"));
        let mut p = p;
        p.dtype = DType::BF16;
        let spec = p.validate().expect("valid problem");
        check_case::<half::bf16>(&spec, &case, "large scores").unwrap_or_else(|e| panic!("{e}"));
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
        let r = Rounded::<f32>::new(&case);
        let mut runs = Vec::new();
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a rayon pool");
            let (f, g) = pool
                .install(|| run_fast::<f32>(&spec, r.narrow(), &r.d_o.0))
                .unwrap_or_else(|e| panic!("{e}"));
            runs.push((f, g));
        }
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
        let r = Rounded::<f32>::new(&case);
        let rf = forward_f64(&spec, r.wide()).expect("reference forward");
        let rg = backward_f64(&spec, r.wide(), &rf.o, &r.d_o.1, &rf.stats).expect("reference backward");
        let (f, g) = run_fast::<f32>(&spec, r.narrow(), &r.d_o.0).unwrap_or_else(|e| panic!("{e}"));
        let den: Vec<f32> = f.stats.clone();
        for (name, got, want) in [
            ("o", widen(&f.o), &rf.o),
            ("den", widen(&den), &rf.stats),
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
