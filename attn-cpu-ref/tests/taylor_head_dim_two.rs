//! Taylor order 2 at head dim 2 against the dense form `o_i = Σ_j f(s_ij) v_j / Σ_j f(s_ij)`, forward
//! and backward, through the public API in f32 and f64. Without the `black_box` in `taylor/sweep.rs`,
//! rustc 1.95.0 at opt-level 3 miscompiles the factorised sweep so that D = 2 dies with SIGFPE, so
//! `cargo test --release` runs these too. N = 700 crosses many 64-key chunks; N = 10 stays in one.

use attn_core::{AttnProblem, AttnSpec, Causal, DType, Element, Family, FamilySpec};
use attn_cpu_ref::testing::{max_abs, max_abs_diff, random_case, Case};
use attn_cpu_ref::{backward, backward_f64, forward, forward_f64, Inputs};

/// o, dq, dk, dv of one head (B = H = 1, `[N, D]` rows) from the dense weights, in f64:
/// `w = f(s)`, `s = scale·q·k`; `dv_j = Σ_i w_ij dO_i / den_i`;
/// `ds_ij = f'(s_ij)·dO_i·(v_j − o_i) / den_i`;
/// `dq_i = scale Σ_j ds_ij k_j`, `dk_j = scale Σ_i ds_ij q_i`.
fn dense(spec: &AttnSpec, case: &Case) -> [Vec<f64>; 4] {
    let FamilySpec::Taylor { a, scale, .. } = *spec.family() else {
        unreachable!("a Taylor spec")
    };
    let [a0, a1, a2] = a.map(f64::from);
    let (n, d, scale) = (spec.seq_q(), spec.head_dim(), f64::from(scale));
    let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(x, y)| x * y).sum::<f64>();
    let row = |buf: &[f64], i: usize| buf[i * d..(i + 1) * d].to_vec();
    let (q, k, v, d_o) = (&case.q, &case.k, &case.v, &case.d_o);
    let s = |i: usize, j: usize| scale * dot(&row(q, i), &row(k, j));
    let keys = |i: usize| spec.key_range(0, i);
    let mut o = vec![0.0; n * d];
    let mut den = vec![0.0; n];
    for i in 0..n {
        for j in keys(i) {
            let t = s(i, j);
            let w = a0 + a1 * t + a2 * t * t;
            den[i] += w;
            for c in 0..d {
                o[i * d + c] += w * v[j * d + c];
            }
        }
        for c in 0..d {
            o[i * d + c] /= den[i];
        }
    }
    let (mut dq, mut dk, mut dv) = (vec![0.0; n * d], vec![0.0; n * d], vec![0.0; n * d]);
    for i in 0..n {
        let do_i = row(d_o, i);
        let do_o = dot(&do_i, &row(&o, i));
        for j in keys(i) {
            let t = s(i, j);
            let w = a0 + a1 * t + a2 * t * t;
            let ds = (a1 + 2.0 * a2 * t) * (dot(&do_i, &row(v, j)) - do_o) / den[i];
            for c in 0..d {
                dv[j * d + c] += w * do_i[c] / den[i];
                dq[i * d + c] += scale * ds * k[j * d + c];
                dk[j * d + c] += scale * ds * q[i * d + c];
            }
        }
    }
    [o, dq, dk, dv]
}

fn assert_close(what: &str, got: &[f64], want: &[f64], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    assert!(got.iter().all(|x| x.is_finite()), "{what}: non-finite entry");
    let (err, tol) = (max_abs_diff(got, want), rtol * (1.0 + max_abs(want)));
    assert!(err <= tol, "{what}: differs by {err:.3e} (tolerance {tol:.3e})");
}

fn round<E: Element>(x: &[f64]) -> Vec<E> {
    x.iter().map(|&x| E::from_f64(x)).collect()
}

fn widen<E: Element>(x: &[E]) -> Vec<f64> {
    x.iter().map(|x| x.to_f64()).collect()
}

/// f64 against the dense form to 1e-11; f32 (inputs rounded first, so both see the same numbers)
/// to a few f32 ulps.
fn check(n: usize, causal: Causal, seed: u64) {
    let p = AttnProblem::new(Family::taylor(2), DType::F32, 1, 1, 1, n, n, 2).with_causal(causal);
    let spec = p.validate().expect("valid problem");
    let mut case = random_case(&spec, seed);
    for x in [&mut case.q, &mut case.k, &mut case.v, &mut case.d_o] {
        *x = widen(&round::<f32>(x));
    }
    let want = dense(&spec, &case);
    let label = format!("N = {n}, {causal:?}");

    let f = forward_f64(&spec, case.inputs()).expect("buffers match the spec");
    let g = backward_f64(&spec, case.inputs(), &f.o, &case.d_o, &f.stats).expect("buffers match the spec");
    for (name, got, want) in [
        ("o", &f.o, &want[0]),
        ("dq", &g.dq, &want[1]),
        ("dk", &g.dk, &want[2]),
        ("dv", &g.dv, &want[3]),
    ] {
        assert_close(&format!("{label} f64 {name}"), got, want, 1e-11);
    }

    let (q, k, v, d_o) = (
        round::<f32>(&case.q),
        round::<f32>(&case.k),
        round::<f32>(&case.v),
        round::<f32>(&case.d_o),
    );
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: None,
    };
    let f = forward(&spec, x).expect("buffers match the spec");
    let g = backward(&spec, x, &f.o, &d_o, &f.stats).expect("buffers match the spec");
    for (name, got, want) in [
        ("o", &f.o, &want[0]),
        ("dq", &g.dq, &want[1]),
        ("dk", &g.dk, &want[2]),
        ("dv", &g.dv, &want[3]),
    ] {
        assert_close(&format!("{label} f32 {name}"), &widen(got), want, 1e-5);
    }
}

#[test]
fn taylor_order2_head_dim_two_matches_the_dense_form() {
    for (n, causal) in [
        (10, Causal::None),
        (10, Causal::TopLeft),
        (700, Causal::None),
        (700, Causal::BottomRight),
    ] {
        check(n, causal, 47 + n as u64);
    }
}
