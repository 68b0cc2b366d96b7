//! Recurrent Taylor decode on the CPU: a prompt prefilled in one call and continued token by token
//! (or several tokens at a time) gives the causal forward of the whole sequence; batch entries of
//! different prompt lengths continue after their own keys; mismatched states and specs are typed
//! errors.

#[path = "../src/taylor/test_specs.rs"]
#[allow(dead_code)]
mod test_specs;

mod common;

use common::run_cases;

use attn_core::{AttnError, AttnProblem, AttnSpec, Causal, DType, Family, Pass, TaylorParams};
use attn_cpu_ref::decode::{prefill, prefill_f64, step, step_f64, DecodeState};
use attn_cpu_ref::testing::{max_abs, max_abs_diff, random_case};
use attn_cpu_ref::{forward_f64, Inputs};
use half::bf16;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// One decode setup: the family and head shapes, and a dense `[B, N, H, D]` sequence.
#[derive(Clone, Debug)]
struct Setup {
    family: Family,
    batch: usize,
    heads_kv: usize,
    group: usize,
    d: usize,
    dv: usize,
    n: usize,
}

impl Setup {
    fn problem(&self, nq: usize, nk: usize) -> AttnProblem {
        AttnProblem::new(
            self.family,
            DType::F32,
            self.batch,
            self.heads_kv * self.group,
            self.heads_kv,
            nq,
            nk,
            self.d,
        )
        .with_head_dim_v(self.dv)
    }
    /// The spec of tokens `[i0, i0 + t)`: a dense causal step (or prompt) of `t` tokens.
    fn step_spec(&self, t: usize) -> AttnSpec {
        self.problem(t, t)
            .with_causal(Causal::BottomRight)
            .validate()
            .expect("valid step problem")
    }
}

/// Rows `[i0, i0 + t)` of every batch entry of a contiguous `[B, N, H, W]` buffer, as `[B, t, H, W]`.
fn tokens(buf: &[f64], batch: usize, n: usize, row: usize, i0: usize, t: usize) -> Vec<f64> {
    (0..batch)
        .flat_map(|b| buf[(b * n + i0) * row..(b * n + i0 + t) * row].iter().copied())
        .collect()
}

fn close(what: &str, got: &[f64], want: &[f64], rtol: f64) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{}: lengths differ", what);
    prop_assert!(got.iter().all(|x| x.is_finite()), "{}: non-finite entry", what);
    let (err, tol) = (max_abs_diff(got, want), rtol * (1.0 + max_abs(want)));
    prop_assert!(
        err <= tol,
        "{}: differs by {:.3e} (tolerance {:.3e})",
        what,
        err,
        tol
    );
    Ok(())
}

/// Decode the sequence of `setup` as a prompt of `prompt` tokens then steps of the sizes `steps`
/// (summing to `n − prompt`), and compare every token's o and denominator with the causal forward.
fn decode_matches_forward(
    setup: &Setup,
    prompt: usize,
    steps: &[usize],
    seed: u64,
) -> Result<(), TestCaseError> {
    let full = setup
        .problem(setup.n, setup.n)
        .with_causal(Causal::TopLeft)
        .validate()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let case = random_case(&full, seed);
    let want = forward_f64(&full, case.inputs()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let (hq, hk) = (full.heads_q(), full.heads_kv());
    let rows = |i0: usize, t: usize| {
        (
            tokens(&case.q, setup.batch, setup.n, hq * setup.d, i0, t),
            tokens(&case.k, setup.batch, setup.n, hk * setup.d, i0, t),
            tokens(&case.v, setup.batch, setup.n, hk * setup.dv, i0, t),
        )
    };
    let err = |e: AttnError| TestCaseError::fail(e.to_string());
    let mut state = if prompt == 0 {
        DecodeState::empty(&setup.step_spec(1)).map_err(err)?
    } else {
        let spec = setup.step_spec(prompt);
        let (q, k, v) = rows(0, prompt);
        let (f, state) = prefill_f64(
            &spec,
            Inputs {
                q: &q,
                k: &k,
                v: &v,
                bias: None,
            },
        )
        .map_err(err)?;
        close(
            "prefill o",
            &f.o,
            &tokens(&want.o, setup.batch, setup.n, hq * setup.dv, 0, prompt),
            1e-12,
        )?;
        close(
            "prefill den",
            &f.stats,
            &stats_rows(&full, &want.stats, 0, prompt),
            1e-12,
        )?;
        state
    };
    let mut i0 = prompt;
    for &t in steps {
        let spec = setup.step_spec(t);
        let (q, k, v) = rows(i0, t);
        let f = step_f64(
            &mut state,
            &spec,
            Inputs {
                q: &q,
                k: &k,
                v: &v,
                bias: None,
            },
        )
        .map_err(err)?;
        let at = format!("tokens {i0}..{}", i0 + t);
        close(
            &format!("{at} o"),
            &f.o,
            &tokens(&want.o, setup.batch, setup.n, hq * setup.dv, i0, t),
            1e-11,
        )?;
        close(
            &format!("{at} den"),
            &f.stats,
            &stats_rows(&full, &want.stats, i0, t),
            1e-11,
        )?;
        i0 += t;
        prop_assert!(
            (0..setup.batch).all(|b| state.len(b) == i0),
            "state lengths {}",
            i0
        );
    }
    Ok(())
}

/// The statistics of queries `[i0, i0 + t)` of `full`, in a `t`-token spec's `[B, Hq, t]` order.
fn stats_rows(full: &AttnSpec, stats: &[f64], i0: usize, t: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for b in 0..full.batch() {
        for h in 0..full.heads_q() {
            for i in i0..i0 + t {
                out.push(stats[full.stats_index(b, h, i)]);
            }
        }
    }
    out
}

fn setups() -> impl Strategy<Value = Setup> {
    (
        1u8..=2,
        prop::array::uniform4(0.0f64..1.0),
        any::<bool>(),
        (1usize..=2, 1usize..=2, 1usize..=3),
        (1usize..=6, 1usize..=5),
        2usize..=14,
    )
        .prop_map(|(order, r, l2, (batch, heads_kv, group), (d, dv), n)| Setup {
            family: test_specs::family(order, r, l2, d),
            batch,
            heads_kv,
            group,
            d,
            dv,
            n,
        })
}

#[test]
fn decoding_token_by_token_equals_the_causal_forward() {
    run_cases(
        "token by token",
        256,
        (setups(), any::<prop::sample::Index>(), any::<u64>()),
        |(setup, p, seed)| {
            // A prompt of 0..n tokens (0: decoding starts from an empty state), then one token per step.
            let prompt = p.index(setup.n);
            let steps = vec![1; setup.n - prompt];
            decode_matches_forward(&setup, prompt, &steps, seed)
        },
    );
}

#[test]
fn steps_of_several_tokens_equal_the_causal_forward() {
    run_cases(
        "multi-token steps",
        256,
        (
            setups(),
            any::<prop::sample::Index>(),
            any::<u64>(),
            prop::collection::vec(1usize..=4, 14),
        ),
        |(setup, p, seed, sizes)| {
            let prompt = p.index(setup.n);
            let mut steps = Vec::new();
            let mut left = setup.n - prompt;
            for s in sizes {
                if left == 0 {
                    break;
                }
                steps.push(s.min(left));
                left -= s.min(left);
            }
            if left > 0 {
                steps.push(left);
            }
            decode_matches_forward(&setup, prompt, &steps, seed)
        },
    );
}

/// Prompts of different lengths (key padding): every batch entry continues after its own valid keys.
/// The reference is a packed varlen forward whose query rows are the new tokens and whose keys are
/// each entry's valid prompt keys followed by the new ones, bottom-right aligned.
#[test]
fn each_batch_entry_continues_after_its_own_prompt_keys() {
    let (b, hq, hk, d, dv, p, t) = (3, 4, 2, 5, 3, 9, 4);
    let key_lens = vec![9, 4, 0];
    let family = Family::Taylor(TaylorParams {
        order: 2,
        a: [0.9, 0.6, 0.35],
        scale: Some(0.4),
        qk_l2norm: true,
    });
    let prompt = AttnProblem::new(family, DType::F32, b, hq, hk, p, p, d)
        .with_head_dim_v(dv)
        .with_causal(Causal::BottomRight)
        .with_key_lens(key_lens.clone())
        .validate()
        .expect("valid prompt");
    let pc = random_case(&prompt, 5);
    let (_, mut state) = prefill_f64(&prompt, pc.inputs()).expect("prefill");
    for (bi, &l) in key_lens.iter().enumerate() {
        assert_eq!(state.len(bi), l);
    }
    let step_spec = AttnProblem::new(family, DType::F32, b, hq, hk, t, t, d)
        .with_head_dim_v(dv)
        .with_causal(Causal::TopLeft)
        .validate()
        .expect("valid step");
    let sc = random_case(&step_spec, 6);
    let got = step_f64(&mut state, &step_spec, sc.inputs()).expect("step");

    // Reference: packed q = the new tokens, packed k/v = valid prompt keys then the new keys.
    let cu_q: Vec<usize> = (0..=b).map(|i| i * t).collect();
    let mut cu_k = vec![0];
    for &l in &key_lens {
        cu_k.push(cu_k[cu_k.len() - 1] + l + t);
    }
    let packed = AttnProblem::new(family, DType::F32, b, hq, hk, t, p + t, d)
        .with_head_dim_v(dv)
        .with_causal(Causal::BottomRight)
        .with_varlen(cu_q, cu_k)
        .validate()
        .expect("valid packed reference");
    let (mut k, mut v) = (Vec::new(), Vec::new());
    for (bi, &l) in key_lens.iter().enumerate() {
        for j in 0..l {
            let (ko, vo) = (prompt.k_offset(bi, j, 0), prompt.v_offset(bi, j, 0));
            k.extend_from_slice(&pc.k[ko..ko + hk * d]);
            v.extend_from_slice(&pc.v[vo..vo + hk * dv]);
        }
        for j in 0..t {
            let (ko, vo) = (step_spec.k_offset(bi, j, 0), step_spec.v_offset(bi, j, 0));
            k.extend_from_slice(&sc.k[ko..ko + hk * d]);
            v.extend_from_slice(&sc.v[vo..vo + hk * dv]);
        }
    }
    let want = forward_f64(
        &packed,
        Inputs {
            q: &sc.q,
            k: &k,
            v: &v,
            bias: None,
        },
    )
    .expect("reference");
    let err = max_abs_diff(&got.o, &want.o);
    assert!(err < 1e-12 * (1.0 + max_abs(&want.o)), "o differs by {err:.3e}");
    for (bi, &l) in key_lens.iter().enumerate() {
        for h in 0..hq {
            for i in 0..t {
                let (g, w) = (
                    got.stats[step_spec.stats_index(bi, h, i)],
                    want.stats[packed.stats_index(bi, h, i)],
                );
                assert!(
                    (g - w).abs() < 1e-12 * (1.0 + w.abs()),
                    "den[{bi}, {h}, {i}]: {g} vs {w}"
                );
            }
        }
        assert_eq!(state.len(bi), l + t);
    }
}

/// The storage-dtype entry points compute in f64 and round once: they equal the f64 results rounded.
#[test]
fn storage_dtype_decode_rounds_the_f64_results_once() {
    let family = Family::Taylor(TaylorParams {
        order: 2,
        ..TaylorParams::default()
    });
    let mk = |n: usize| {
        AttnProblem::new(family, DType::BF16, 2, 2, 1, n, n, 8)
            .with_causal(Causal::TopLeft)
            .validate()
            .expect("valid")
    };
    let (prompt, one) = (mk(6), mk(1));
    let round = |x: &[f64]| -> (Vec<bf16>, Vec<f64>) {
        let r: Vec<bf16> = x.iter().map(|&e| bf16::from_f64(e)).collect();
        let w = r.iter().map(|e| e.to_f64()).collect();
        (r, w)
    };
    let pc = random_case(&prompt, 11);
    let ((q, qw), (k, kw), (v, vw)) = (round(&pc.q), round(&pc.k), round(&pc.v));
    let (f, mut state) = prefill(
        &prompt,
        Inputs {
            q: &q,
            k: &k,
            v: &v,
            bias: None,
        },
    )
    .expect("prefill");
    let (f64_f, mut state64) = prefill_f64(
        &prompt,
        Inputs {
            q: &qw,
            k: &kw,
            v: &vw,
            bias: None,
        },
    )
    .expect("prefill");
    assert_eq!(state, state64);
    assert_eq!(
        f.o,
        f64_f.o.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>()
    );
    for s in 0..3 {
        let sc = random_case(&one, 20 + s);
        let ((q, qw), (k, kw), (v, vw)) = (round(&sc.q), round(&sc.k), round(&sc.v));
        let got = step(
            &mut state,
            &one,
            Inputs {
                q: &q,
                k: &k,
                v: &v,
                bias: None,
            },
        )
        .expect("step");
        let want = step_f64(
            &mut state64,
            &one,
            Inputs {
                q: &qw,
                k: &kw,
                v: &vw,
                bias: None,
            },
        )
        .expect("step");
        assert_eq!(
            got.o,
            want.o.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>()
        );
        assert_eq!(
            got.stats,
            want.stats.iter().map(|&x| x as f32).collect::<Vec<_>>()
        );
        assert_eq!(state, state64);
    }
}

/// Order 2 keeps f ≥ 1/2 for any score, so decoding with |s| in the thousands stays finite and agrees
/// with the forward.
#[test]
fn order2_decode_stays_finite_and_matches_for_large_scores() {
    let setup = Setup {
        family: Family::taylor(2),
        batch: 1,
        heads_kv: 1,
        group: 2,
        d: 8,
        dv: 4,
        n: 10,
    };
    let full = setup
        .problem(10, 10)
        .with_causal(Causal::TopLeft)
        .validate()
        .expect("valid");
    let mut case = random_case(&full, 3);
    case.q
        .iter_mut()
        .chain(case.k.iter_mut())
        .for_each(|x| *x *= 300.0);
    let want = forward_f64(&full, case.inputs()).expect("forward");
    let mut state = DecodeState::empty(&setup.step_spec(1)).expect("state");
    for i in 0..10 {
        let q = tokens(&case.q, 1, 10, 2 * 8, i, 1);
        let k = tokens(&case.k, 1, 10, 8, i, 1);
        let v = tokens(&case.v, 1, 10, 4, i, 1);
        let f = step_f64(
            &mut state,
            &setup.step_spec(1),
            Inputs {
                q: &q,
                k: &k,
                v: &v,
                bias: None,
            },
        )
        .expect("step");
        let w = tokens(&want.o, 1, 10, 2 * 4, i, 1);
        assert!(f.o.iter().chain(&f.stats).all(|x| x.is_finite()));
        let err = max_abs_diff(&f.o, &w);
        assert!(
            err < 1e-9 * (1.0 + max_abs(&w)),
            "token {i}: o differs by {err:.3e}"
        );
    }
}

fn expect_arg(r: Result<impl std::fmt::Debug, AttnError>, arg: &str) {
    match r {
        Err(AttnError::InvalidArgument { op, arg: a, .. }) => {
            assert_eq!(a, arg);
            assert_eq!(op.pass, Pass::Decode);
        }
        other => panic!("expected an invalid `{arg}`, got {other:?}"),
    }
}

#[test]
fn mismatched_states_and_specs_are_typed_errors() {
    let base =
        || AttnProblem::new(Family::taylor(2), DType::F32, 2, 4, 2, 1, 1, 8).with_causal(Causal::TopLeft);
    let spec = base().validate().expect("valid");
    let case = random_case(&spec, 1);
    let fresh = || DecodeState::empty(&spec).expect("state");

    // Every field of the state's shape, changed one at a time.
    let changed = [
        base().validate(),
        AttnProblem {
            family: Family::taylor(1),
            ..base()
        }
        .validate(),
        AttnProblem {
            family: Family::Taylor(TaylorParams {
                scale: Some(0.3),
                ..TaylorParams::default()
            }),
            ..base()
        }
        .validate(),
        AttnProblem {
            dtype: DType::F16,
            ..base()
        }
        .validate(),
        AttnProblem { batch: 3, ..base() }.validate(),
        AttnProblem { heads_q: 2, ..base() }.validate(),
        AttnProblem {
            heads_kv: 1,
            ..base()
        }
        .validate(),
        AttnProblem {
            head_dim: 4,
            head_dim_v: 4,
            ..base()
        }
        .validate(),
        AttnProblem {
            head_dim_v: 3,
            ..base()
        }
        .validate(),
    ];
    for (n, other) in changed.into_iter().enumerate() {
        let other = other.expect("valid");
        let c = random_case(&other, 2);
        let r = step_f64(&mut fresh(), &other, c.inputs());
        if n == 0 {
            r.expect("the state's own spec");
        } else {
            let e = r.expect_err("a different spec");
            assert!(e.to_string().contains("the state was built for"), "{e}");
            expect_arg(Err::<(), _>(e), "state");
        }
    }

    // Not a decode step: packed lengths, Nq ≠ Nk, no causal mask, another family.
    let varlen = base()
        .with_varlen(vec![0, 1, 2], vec![0, 1, 2])
        .validate()
        .expect("valid");
    expect_arg(
        step_f64(&mut fresh(), &varlen, random_case(&varlen, 3).inputs()),
        "lengths",
    );
    let long = AttnProblem { seq_k: 2, ..base() }.validate().expect("valid");
    assert!(matches!(
        step_f64(&mut fresh(), &long, random_case(&long, 4).inputs()),
        Err(AttnError::ShapeMismatch { .. })
    ));
    let open = base().with_causal(Causal::None).validate().expect("valid");
    expect_arg(step_f64(&mut fresh(), &open, case.inputs()), "causal");
    let softmax = AttnProblem {
        family: Family::softmax(),
        ..base()
    }
    .validate()
    .expect("valid");
    expect_arg(DecodeState::empty(&softmax), "family");
    expect_arg(prefill_f64(&softmax, case.inputs()), "family");

    // Short buffers, a bias, a storage dtype other than the spec's.
    let mut st = fresh();
    let short = Inputs {
        q: &case.q[1..],
        ..case.inputs()
    };
    assert!(matches!(
        step_f64(&mut st, &spec, short),
        Err(AttnError::ShapeMismatch { .. })
    ));
    assert_eq!(st, fresh(), "a failed step leaves the state unchanged");
    let bias = [0.0];
    let with_bias = Inputs {
        bias: Some(&bias),
        ..case.inputs()
    };
    assert!(matches!(
        step_f64(&mut st, &spec, with_bias),
        Err(AttnError::ShapeMismatch { .. })
    ));
    let q: Vec<f32> = case.q.iter().map(|&x| x as f32).collect();
    let b16 = AttnProblem {
        dtype: DType::BF16,
        ..base()
    }
    .validate()
    .expect("valid");
    expect_arg(
        step(
            &mut DecodeState::empty(&b16).expect("state"),
            &b16,
            Inputs {
                q: &q,
                k: &q,
                v: &q,
                bias: None,
            },
        ),
        "dtype",
    );
}
