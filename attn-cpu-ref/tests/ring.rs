//! Context parallelism in sequential mode (attn_cpu_ref::ring): W ranks over zigzag shards give the
//! single-device call's o, statistics (LSE or Taylor's denominators), dq, dk and dv, for every
//! family but the Einstein midpoint.

use attn_core::{AttnError, DType, Family, HypScore, HyperbolicParams, RingProblem, RingSpec, SoftmaxParams};
use attn_cpu_ref::ring::{self, shard, unshard, unshard_stats};
use attn_cpu_ref::testing::{max_abs, max_abs_diff, random_case};
use attn_cpu_ref::{backward_f64, forward_f64, Forward, Inputs};

fn families() -> Vec<(&'static str, Family)> {
    vec![
        ("softmax", Family::softmax()),
        (
            "softmax softcap",
            Family::Softmax(SoftmaxParams {
                scale: Some(0.7),
                softcap: Some(2.0),
            }),
        ),
        ("cosine-sim", Family::cosine_sim()),
        (
            "hyperbolic geodesic",
            Family::Hyperbolic(HyperbolicParams {
                score: HypScore::Geodesic,
                curvature: 0.5,
                ..Default::default()
            }),
        ),
        (
            "hyperbolic squared Lorentz",
            Family::Hyperbolic(HyperbolicParams::default()),
        ),
    ]
}

/// Relative distance of `got` from `want`, scaled by the larger magnitude (at least 1).
fn close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let err = max_abs_diff(got, want) / max_abs(want).max(1.0);
    assert!(err < 1e-12, "{what}: relative error {err:e}");
}

fn run(label: &str, spec: &RingSpec, seed: u64) {
    let g = spec.global();
    let case = random_case(g, seed);
    let (wq, wk, wv, wo) = (
        g.heads_q() * g.head_dim(),
        g.heads_kv() * g.head_dim(),
        g.heads_kv() * g.head_dim_v(),
        g.heads_q() * g.head_dim_v(),
    );
    let w = spec.world();
    let per = |x: &[f64], width| {
        (0..w)
            .map(|r| shard(spec, x, width, r).unwrap())
            .collect::<Vec<_>>()
    };
    let (q, k, v, d_o) = (
        per(&case.q, wq),
        per(&case.k, wk),
        per(&case.v, wv),
        per(&case.d_o, wo),
    );
    let inputs: Vec<Inputs<'_, f64>> = (0..w)
        .map(|r| Inputs {
            q: &q[r],
            k: &k[r],
            v: &v[r],
            bias: None,
        })
        .collect();

    let want = forward_f64(g, case.inputs()).unwrap();
    let got = ring::forward_f64(spec, &inputs).unwrap();
    let o: Vec<Vec<f64>> = got.iter().map(|f| f.o.clone()).collect();
    let lse: Vec<Vec<f64>> = got.iter().map(|f| f.stats.clone()).collect();
    close(&format!("{label}: o"), &unshard(spec, &o, wo).unwrap(), &want.o);
    close(
        &format!("{label}: lse"),
        &unshard_stats(spec, &lse).unwrap(),
        &want.stats,
    );

    let want_g = backward_f64(g, case.inputs(), &want.o, &case.d_o, &want.stats).unwrap();
    let d_o_refs: Vec<&[f64]> = d_o.iter().map(|x| x.as_slice()).collect();
    let grads = ring::backward_f64(spec, &inputs, &got, &d_o_refs).unwrap();
    let gather = |f: fn(&attn_cpu_ref::Gradients<f64>) -> &Vec<f64>, width| {
        unshard(
            spec,
            &grads.iter().map(|x| f(x).clone()).collect::<Vec<_>>(),
            width,
        )
        .unwrap()
    };
    close(&format!("{label}: dq"), &gather(|x| &x.dq, wq), &want_g.dq);
    close(&format!("{label}: dk"), &gather(|x| &x.dk, wk), &want_g.dk);
    close(&format!("{label}: dv"), &gather(|x| &x.dv, wv), &want_g.dv);
}

#[test]
fn ring_attention_equals_the_single_device_call_for_every_family() {
    let mut seed = 7;
    for (name, family) in families() {
        for world in [1, 2, 3, 4] {
            for causal in [false, true] {
                for chunk in [1, 5] {
                    let spec = RingProblem::new(family, DType::F32, 2, 4, 2, 2 * world * chunk, 8, world)
                        .with_head_dim_v(6)
                        .with_causal(causal)
                        .validate()
                        .unwrap();
                    seed += 1;
                    run(
                        &format!("{name}, W={world}, causal={causal}, C={chunk}"),
                        &spec,
                        seed,
                    );
                }
            }
        }
    }
}

#[test]
fn ring_attention_with_mqa_and_long_chunks() {
    let spec = RingProblem::new(Family::softmax(), DType::F32, 1, 8, 1, 8 * 24, 16, 4)
        .with_causal(true)
        .validate()
        .unwrap();
    run("MQA, W=4, C=24", &spec, 99);
}

#[test]
fn a_nan_query_row_stays_nan_through_the_merge() {
    let spec = RingProblem::new(Family::softmax(), DType::F32, 1, 1, 1, 8, 4, 2)
        .with_causal(true)
        .validate()
        .unwrap();
    let case = random_case(spec.global(), 3);
    let mut q = case.q.clone();
    q[6 * 4] = f64::NAN; // token 6: chunk 3, rank 0's second chunk
    let shards: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = (0..2)
        .map(|r| {
            (
                shard(&spec, &q, 4, r).unwrap(),
                shard(&spec, &case.k, 4, r).unwrap(),
                shard(&spec, &case.v, 4, r).unwrap(),
            )
        })
        .collect();
    let inputs: Vec<Inputs<'_, f64>> = shards
        .iter()
        .map(|(q, k, v)| Inputs { q, k, v, bias: None })
        .collect();
    let got: Vec<Forward<f64, f64>> = ring::forward_f64(&spec, &inputs).unwrap();
    let o = unshard(&spec, &got.iter().map(|f| f.o.clone()).collect::<Vec<_>>(), 4).unwrap();
    let lse = unshard_stats(&spec, &got.iter().map(|f| f.stats.clone()).collect::<Vec<_>>()).unwrap();
    for t in 0..8 {
        let row_nan = o[t * 4..][..4].iter().all(|x| x.is_nan());
        assert_eq!(row_nan, t == 6, "token {t}: o {:?}", &o[t * 4..][..4]);
        assert_eq!(lse[t].is_nan(), t == 6, "token {t}: lse {}", lse[t]);
    }
}

#[test]
fn shards_of_the_wrong_size_or_count_are_typed_errors() {
    let spec = RingProblem::new(Family::softmax(), DType::F32, 1, 2, 2, 8, 4, 2)
        .validate()
        .unwrap();
    let n = spec.local().q_len();
    let (a, short) = (vec![0.0; n], vec![0.0; n - 1]);
    let ok = Inputs {
        q: &a,
        k: &a,
        v: &a,
        bias: None,
    };
    let bad = Inputs {
        q: &a,
        k: &short,
        v: &a,
        bias: None,
    };
    let err = ring::forward_f64(&spec, &[ok]).unwrap_err();
    assert!(matches!(err, AttnError::ShapeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("one per rank"), "{err}");
    let err = ring::forward_f64(&spec, &[ok, bad]).unwrap_err();
    assert!(err.to_string().contains("k of rank 1"), "{err}");
    let with_bias = Inputs { bias: Some(&a), ..ok };
    let err = ring::forward_f64(&spec, &[ok, with_bias]).unwrap_err();
    assert!(matches!(err, AttnError::Unsupported { .. }), "{err}");
    let f = ring::forward_f64(&spec, &[ok, ok]).unwrap();
    let err = ring::backward_f64(&spec, &[ok, ok], &f, &[&a, &short]).unwrap_err();
    assert!(err.to_string().contains("dO"), "{err}");
    // Sharding and gathering check their lengths and ranks.
    let global = vec![0.0; spec.global().q_len()];
    assert!(shard(&spec, &global[1..], 8, 0).is_err());
    assert!(shard(&spec, &global, 8, 2).is_err());
    assert!(unshard(&spec, std::slice::from_ref(&a), 8).is_err());
    assert!(unshard(&spec, &[a.clone(), short.clone()], 8).is_err());
    assert!(unshard_stats(&spec, &[vec![0.0; 3], vec![0.0; 3]]).is_err());
}
