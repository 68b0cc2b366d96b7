//! Zero-length sequences on every family, forward and backward: `B = 0`, `Nq = 0` and `Nk = 0` return
//! empty outputs and zero-size gradients (as candle and PyTorch do); key lengths of 0 and packed
//! sequences with no query, no key or neither follow the documented result of a row with no key
//! (docs/nan.md, ARCHITECTURE.md's invariants): o = 0 with LSE −∞ (Taylor: denominator 0), dq = 0,
//! and dk = dv = 0 for every key no query sees; nothing NaN, nothing panics.

use attn_core::{Aggregation, AttnProblem, AttnSpec, Causal, DType, Family, HypScore, TaylorParams};
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

/// `B = 0`, `Nq = 0`, `Nk = 0` (dense, key-padded, with a bias) and a packed batch whose every
/// sequence is empty, on every family: empty outputs and zero-size gradients (as candle and PyTorch),
/// and for `Nk = 0` with queries, rows of zeros with the no-key statistic (LSE −∞, Taylor den 0),
/// through every entry point: f64, storage dtypes (f32, bf16), the fast path and `CpuRef`.
#[test]
fn zero_sizes_return_empty_results_on_every_entry_point() {
    for (fam, family) in families() {
        let softmax_like = family.kind() != attn_core::FamilyKind::Taylor;
        let no_key = if softmax_like { f64::NEG_INFINITY } else { 0.0 };
        let p = |b, nq, nk| AttnProblem::new(family, DType::F32, b, 2, 1, nq, nk, 8);
        let mut cases = vec![
            ("batch 0", p(0, 4, 4)),
            ("seq_q 0", p(2, 0, 4)),
            ("seq_k 0", p(2, 4, 0)),
            ("seq_q 0 seq_k 0", p(2, 0, 0)),
            (
                "seq_k 0 causal bottom-right",
                p(2, 4, 0).with_causal(Causal::BottomRight),
            ),
            ("seq_k 0 causal top-left", p(2, 3, 0).with_causal(Causal::TopLeft)),
            ("batch 0 key_lens []", p(0, 4, 4).with_key_lens(vec![])),
            ("seq_k 0 key_lens [0, 0]", p(2, 4, 0).with_key_lens(vec![0, 0])),
            ("varlen batch 0", p(0, 4, 4).with_varlen(vec![0], vec![0])),
            (
                "varlen all empty",
                p(2, 0, 0).with_varlen(vec![0, 0, 0], vec![0, 0, 0]),
            ),
        ];
        if softmax_like {
            cases.push(("seq_k 0 bias", p(2, 3, 0).with_bias(2, 1)));
            cases.push(("batch 0 bias", p(0, 3, 5).with_bias(1, 2)));
            cases.push(("seq_q 0 window", p(2, 0, 5).with_window(Some(1), Some(2))));
        }
        for (label, p) in cases {
            let name = format!("{fam} {label}");
            let spec = p.validate().unwrap_or_else(|e| panic!("{name}: validate: {e}"));
            let case = random_case(&spec, 5);
            let f = forward_f64(&spec, case.inputs()).unwrap_or_else(|e| panic!("{name}: {e}"));
            let g = backward_f64(&spec, case.inputs(), &f.o, &case.d_o, &f.stats)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            check_empty(&name, &spec, &f, &g, no_key);

            // Storage dtypes: f32, bf16 (a spec per dtype), and the fast path where it applies.
            let narrow = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
            let wide = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
            let (q, k, v, d_o) = (
                narrow(&case.q),
                narrow(&case.k),
                narrow(&case.v),
                narrow(&case.d_o),
            );
            let bias = case.bias.as_deref().map(narrow);
            let x = Inputs {
                q: &q,
                k: &k,
                v: &v,
                bias: bias.as_deref(),
            };
            let wide_result = |f: &Forward<f32, f32>, g: &Gradients<f32>| {
                (
                    Forward {
                        o: wide(&f.o),
                        stats: wide(&f.stats),
                    },
                    Gradients {
                        dq: wide(&g.dq),
                        dk: wide(&g.dk),
                        dv: wide(&g.dv),
                        dbias: g.dbias.as_deref().map(wide),
                    },
                )
            };
            let f32f = forward(&spec, x).unwrap_or_else(|e| panic!("{name} f32: {e}"));
            let f32g =
                backward(&spec, x, &f32f.o, &d_o, &f32f.stats).unwrap_or_else(|e| panic!("{name} f32: {e}"));
            let (wf, wg) = wide_result(&f32f, &f32g);
            check_empty(&format!("{name} f32"), &spec, &wf, &wg, no_key);
            if attn_cpu_ref::fast::supports(&spec) {
                let ff = attn_cpu_ref::fast::forward(&spec, x).unwrap_or_else(|e| panic!("{name} fast: {e}"));
                let fg = attn_cpu_ref::fast::backward(&spec, x, &ff.o, &d_o, &ff.stats)
                    .unwrap_or_else(|e| panic!("{name} fast: {e}"));
                let (wf, wg) = wide_result(&ff, &fg);
                check_empty(&format!("{name} fast"), &spec, &wf, &wg, no_key);
            }
            // CpuRef writes into the caller's buffers, which may be empty.
            let mut o = vec![f32::NAN; spec.o_len()];
            let mut stats = vec![f32::NAN; spec.stats_len()];
            attn_core::AttnBackend::<[f32], [f32]>::forward(
                &attn_cpu_ref::CpuRef,
                &spec,
                attn_core::ForwardIo {
                    q: &q,
                    k: &k,
                    v: &v,
                    bias: bias.as_deref(),
                    o: &mut o,
                    stats: &mut stats,
                },
            )
            .unwrap_or_else(|e| panic!("{name} CpuRef: {e}"));
            assert_eq!((o, stats), (f32f.o.clone(), f32f.stats.clone()), "{name} CpuRef");

            let bspec = AttnProblem {
                dtype: DType::BF16,
                ..p.clone()
            }
            .validate()
            .unwrap();
            let nb = |x: &[f64]| {
                x.iter()
                    .map(|&v| attn_core::bf16::from_f64(v))
                    .collect::<Vec<_>>()
            };
            let (q, k, v, d_o) = (nb(&case.q), nb(&case.k), nb(&case.v), nb(&case.d_o));
            let bias = case.bias.as_deref().map(nb);
            let x = Inputs {
                q: &q,
                k: &k,
                v: &v,
                bias: bias.as_deref(),
            };
            let bf = forward(&bspec, x).unwrap_or_else(|e| panic!("{name} bf16: {e}"));
            let bg =
                backward(&bspec, x, &bf.o, &d_o, &bf.stats).unwrap_or_else(|e| panic!("{name} bf16: {e}"));
            let w = |x: &[attn_core::bf16]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
            check_empty(
                &format!("{name} bf16"),
                &bspec,
                &Forward {
                    o: w(&bf.o),
                    stats: wide(&bf.stats),
                },
                &Gradients {
                    dq: w(&bg.dq),
                    dk: w(&bg.dk),
                    dv: w(&bg.dv),
                    dbias: bg.dbias.as_deref().map(w),
                },
                no_key,
            );
        }
    }
}

/// The result of an empty call: every buffer at the spec's length (0 where its side is empty), o
/// and every gradient zeros, every statistic the no-key value.
fn check_empty(name: &str, spec: &AttnSpec, f: &Forward<f64, f64>, g: &Gradients<f64>, no_key: f64) {
    assert_eq!(
        [f.o.len(), f.stats.len(), g.dq.len(), g.dk.len(), g.dv.len()],
        [
            spec.o_len(),
            spec.stats_len(),
            spec.dq_len(),
            spec.dk_len(),
            spec.dv_len()
        ],
        "{name}: lengths"
    );
    assert_eq!(
        g.dbias.as_ref().map(Vec::len),
        spec.bias().map(|_| spec.bias_len()),
        "{name}: dbias"
    );
    for (what, x) in [("o", &f.o), ("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)] {
        assert!(x.iter().all(|&v| v == 0.0), "{name}: {what} is not all zeros");
    }
    assert!(
        g.dbias.iter().flatten().all(|&v| v == 0.0),
        "{name}: dbias is not all zeros"
    );
    assert!(
        f.stats.iter().all(|&s| s == no_key),
        "{name}: statistics {:?}",
        f.stats
    );
    assert!(
        spec.total_q() == 0 || spec.total_k() == 0,
        "{name}: the case is not an empty call"
    );
}

/// Taylor decode over empty prompts and steps: a prefill of 0 tokens (or of a batch of 0) gives empty
/// outputs and an empty state; a step of 0 tokens writes and appends nothing; the next one-token step
/// equals the causal forward of that token alone.
#[test]
fn taylor_decode_with_empty_prompts_and_steps() {
    use attn_cpu_ref::decode;
    for order in [1u8, 2] {
        let family = families()
            .into_iter()
            .find(|(n, _)| *n == if order == 1 { "taylor1" } else { "taylor2" })
            .map(|(_, f)| f)
            .expect("a Taylor family");
        let p =
            |b, n| AttnProblem::new(family, DType::F32, b, 2, 1, n, n, 8).with_causal(Causal::BottomRight);
        let name = format!("taylor{order}");
        // A batch of 0.
        let spec = p(0, 3).validate().unwrap();
        let (f, state) = decode::prefill_f64(&spec, random_case(&spec, 1).inputs()).unwrap();
        assert!(
            f.o.is_empty() && f.stats.is_empty() && state.is_empty(),
            "{name}: batch 0"
        );
        // An empty prompt, an empty step, then one token.
        let spec = p(2, 0).validate().unwrap();
        let (f, mut state) = decode::prefill_f64(&spec, random_case(&spec, 2).inputs()).unwrap();
        assert!(f.o.is_empty() && f.stats.is_empty(), "{name}: empty prompt");
        let f = decode::step_f64(&mut state, &spec, random_case(&spec, 3).inputs()).unwrap();
        assert!(f.o.is_empty() && f.stats.is_empty(), "{name}: empty step");
        assert_eq!((state.len(0), state.len(1)), (0, 0), "{name}: nothing appended");
        let one = p(2, 1).validate().unwrap();
        let case = random_case(&one, 4);
        let got = decode::step_f64(&mut state, &one, case.inputs()).unwrap();
        let want = forward_f64(&one, case.inputs()).unwrap();
        let err = got
            .o
            .iter()
            .zip(&want.o)
            .chain(got.stats.iter().zip(&want.stats))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(
            err < 1e-12,
            "{name}: a one-token step after empty ones differs by {err}"
        );
    }
}
