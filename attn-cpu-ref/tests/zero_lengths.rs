//! Zero-length sequences on every family, forward and backward: `B = 0`, `Nq = 0` and `Nk = 0` are
//! typed errors of `validate` naming the argument; key lengths of 0 and packed sequences with no
//! query, no key or neither are valid calls whose empty rows follow the documented result (docs/nan.md,
//! ARCHITECTURE.md's invariants): o = 0 with LSE −∞ (Taylor: denominator 0), dq = 0, and dk = dv = 0
//! for every key no query sees; nothing NaN, nothing panics.

use attn_core::{
    Aggregation, AttnError, AttnProblem, AttnSpec, Causal, DType, Family, HypScore, TaylorParams,
};
use attn_cpu_ref::testing::random_case;
use attn_cpu_ref::{backward, backward_f64, forward, forward_f64, Forward, Gradients, Inputs};

fn families() -> Vec<(&'static str, Family)> {
    vec![
        ("softmax", Family::softmax()),
        ("cosine_sim", Family::cosine_sim()),
        (
            "taylor1",
            Family::Taylor(TaylorParams {
                order: 1,
                a: [1.0, 0.25, 0.0],
                scale: None,
                qk_l2norm: true,
            }),
        ),
        ("taylor2", Family::taylor(2)),
        (
            "hyperbolic geodesic",
            Family::hyperbolic(HypScore::Geodesic, Aggregation::Euclidean),
        ),
        (
            "hyperbolic sq_lorentz midpoint",
            Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::EinsteinMidpoint),
        ),
    ]
}

/// The calls with empty sequences, each valid: key lengths with zeros (one entry with none), every key
/// length 0, and packed sequences (no query, no key, neither, both), each causal or not.
fn empty_sequence_problems(family: Family) -> Vec<(String, AttnProblem)> {
    let mut out = Vec::new();
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        let base = AttnProblem::new(family, DType::F32, 3, 4, 2, 5, 6, 8).with_causal(causal);
        out.push((
            format!("{causal:?} key_lens [6, 0, 3]"),
            base.clone().with_key_lens(vec![6, 0, 3]),
        ));
        out.push((
            format!("{causal:?} key_lens [0, 0, 0]"),
            base.clone().with_key_lens(vec![0, 0, 0]),
        ));
        // Sequences (q, k): (0, 2), (3, 0), (0, 0), (4, 5).
        out.push((
            format!("{causal:?} varlen (0,2) (3,0) (0,0) (4,5)"),
            AttnProblem::new(family, DType::F32, 4, 4, 2, 4, 5, 8)
                .with_causal(causal)
                .with_varlen(vec![0, 0, 3, 3, 7], vec![0, 2, 2, 2, 7]),
        ));
        // No query in the whole batch; no key in the whole batch.
        out.push((
            format!("{causal:?} varlen without queries"),
            AttnProblem::new(family, DType::F32, 2, 4, 2, 1, 5, 8)
                .with_causal(causal)
                .with_varlen(vec![0, 0, 0], vec![0, 5, 9]),
        ));
        out.push((
            format!("{causal:?} varlen without keys"),
            AttnProblem::new(family, DType::F32, 2, 4, 2, 3, 1, 8)
                .with_causal(causal)
                .with_varlen(vec![0, 3, 4], vec![0, 0, 0]),
        ));
    }
    out
}

/// The documented result of the rows and keys with nothing to attend: zeros, LSE −∞ / den 0, zero
/// gradients; every value finite (the inputs are).
fn check_documented(name: &str, spec: &AttnSpec, f: &Forward<f64, f64>, g: &Gradients<f64>) {
    let (d, dv) = (spec.head_dim(), spec.head_dim_v());
    let empty_stat = if spec.family().is_softmax_like() {
        f64::NEG_INFINITY
    } else {
        0.0
    };
    for (what, x) in [("o", &f.o), ("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)] {
        assert!(
            x.iter().all(|v| v.is_finite()),
            "{name}: {what} has a non-finite element"
        );
    }
    for b in 0..spec.batch() {
        let lens = spec.seq_lens(b);
        for i in 0..lens.q {
            if !spec.key_range(b, i).is_empty() {
                continue;
            }
            for h in 0..spec.heads_q() {
                let o = &f.o[spec.o_offset(b, i, h)..][..dv];
                let dq = &g.dq[spec.dq_offset(b, i, h)..][..d];
                assert!(
                    o.iter().all(|&x| x == 0.0),
                    "{name}: o row (b {b}, i {i}, h {h}) = {o:?}"
                );
                assert!(
                    dq.iter().all(|&x| x == 0.0),
                    "{name}: dq row (b {b}, i {i}, h {h})"
                );
                let s = f.stats[spec.stats_index(b, h, i)];
                assert_eq!(s, empty_stat, "{name}: statistic (b {b}, h {h}, i {i})");
            }
        }
        for j in 0..lens.k {
            if (0..lens.q).any(|i| spec.key_range(b, i).contains(&j)) {
                continue;
            }
            for hk in 0..spec.heads_kv() {
                let dk = &g.dk[spec.dk_offset(b, j, hk)..][..d];
                let dvr = &g.dv[spec.dv_offset(b, j, hk)..][..dv];
                assert!(
                    dk.iter().all(|&x| x == 0.0),
                    "{name}: dk row (b {b}, j {j}, hk {hk})"
                );
                assert!(
                    dvr.iter().all(|&x| x == 0.0),
                    "{name}: dv row (b {b}, j {j}, hk {hk})"
                );
            }
        }
    }
}

#[test]
fn empty_sequences_give_the_documented_result_on_every_family() {
    for (fam, family) in families() {
        for (label, p) in empty_sequence_problems(family) {
            let name = format!("{fam} {label}");
            let spec = p.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
            let case = random_case(&spec, 3);
            let f = forward_f64(&spec, case.inputs()).unwrap_or_else(|e| panic!("{name}: {e}"));
            let g = backward_f64(&spec, case.inputs(), &f.o, &case.d_o, &f.stats)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            check_documented(&name, &spec, &f, &g);

            // The storage-dtype entry points (f32 here) agree on the empty rows.
            let narrow = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
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
            let f32f = forward(&spec, x).unwrap_or_else(|e| panic!("{name} f32: {e}"));
            let f32g =
                backward(&spec, x, &f32f.o, &d_o, &f32f.stats).unwrap_or_else(|e| panic!("{name} f32: {e}"));
            let wide = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
            check_documented(
                &format!("{name} f32"),
                &spec,
                &Forward {
                    o: wide(&f32f.o),
                    stats: wide(&f32f.stats),
                },
                &Gradients {
                    dq: wide(&f32g.dq),
                    dk: wide(&f32g.dk),
                    dv: wide(&f32g.dv),
                    dbias: None,
                },
            );
        }
    }
}

/// `B = 0`, `Nq = 0`, `Nk = 0` and a packed batch whose every sequence is empty: typed errors of
/// `validate` naming the argument, on every family.
#[test]
fn zero_sizes_are_typed_errors_naming_the_argument() {
    for (fam, family) in families() {
        let cases = [
            ("batch", AttnProblem::new(family, DType::F32, 0, 2, 1, 4, 4, 8)),
            ("seq_q", AttnProblem::new(family, DType::F32, 2, 2, 1, 0, 4, 8)),
            ("seq_k", AttnProblem::new(family, DType::F32, 2, 2, 1, 4, 0, 8)),
            (
                "seq_q",
                AttnProblem::new(family, DType::F32, 2, 2, 1, 0, 0, 8)
                    .with_varlen(vec![0, 0, 0], vec![0, 0, 0]),
            ),
        ];
        for (arg, p) in cases {
            match p.validate() {
                Err(AttnError::InvalidArgument { arg: a, .. }) => {
                    assert_eq!(a, arg, "{fam}: the error names the argument")
                }
                other => panic!("{fam} {arg} = 0: expected a typed error naming `{arg}`, got {other:?}"),
            }
        }
    }
}
