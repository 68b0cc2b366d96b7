//! Cosine-similarity attention on the CPU reference: gradients against finite differences, and
//! agreement with softmax attention on l2-normalised inputs.

mod common;

use attn_core::{AttnProblem, AttnSpec, CosineParams, Family, SoftmaxParams, DEFAULT_L2_EPS};
use attn_cpu_ref::testing::{check_gradients, Case};
use common::{case, close, cosine_family, offset, problem, run, run_cases, setup, Tensor};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

#[test]
fn cosine_sim_gradients_match_finite_differences() {
    // The default eps: a larger one puts some rows of random data on or under the kink at ‖x‖ = ε,
    // where a central difference straddles it or meets curvature ~ (scale/ε)³. The regime under ε
    // has its own test below.
    let strategy = setup(cosine_family()).prop_map(|(mut p, seed)| {
        if let Family::CosineSim(c) = &mut p.family {
            c.eps = DEFAULT_L2_EPS;
        }
        (p, seed)
    });
    run_cases(
        "cosine_sim_gradients_match_finite_differences",
        48,
        strategy,
        |(p, seed)| check_gradients(&case(&p, seed), 1e-5, 1e-6, 1e-8).map_err(TestCaseError::fail),
    );
}

/// The cosine parameters of a problem built from [`cosine_family`].
fn params(p: &AttnProblem) -> CosineParams {
    match p.family {
        Family::CosineSim(c) => c,
        other => unreachable!("cosine_family() builds cosine-sim problems, got {other:?}"),
    }
}

/// Apply `f(row)` to every valid q row and k row of `c` in place.
fn each_qk_row(c: &mut Case, mut f: impl FnMut(&mut [f64])) {
    let s = c.spec.clone();
    let d = s.head_dim();
    for b in 0..s.batch() {
        let lens = s.seq_lens(b);
        for h in 0..s.heads_q() {
            for i in 0..lens.q {
                let at = offset(&s, Tensor::Q, b, i, h);
                f(&mut c.q[at..at + d]);
            }
        }
        for hk in 0..s.heads_kv() {
            for j in 0..lens.k {
                let at = offset(&s, Tensor::K, b, j, hk);
                f(&mut c.k[at..at + d]);
            }
        }
    }
}

fn softmax_twin(p: &AttnProblem, scale: f32) -> Result<AttnSpec, TestCaseError> {
    let mut twin = p.clone();
    twin.family = Family::Softmax(SoftmaxParams {
        scale: Some(scale),
        softcap: None,
    });
    twin.validate().map_err(|e| TestCaseError::fail(e.to_string()))
}

#[test]
fn cosine_sim_equals_softmax_on_l2_normalised_inputs_with_the_same_scale() {
    let strategy = (problem(cosine_family()), any::<u64>()).prop_map(|(mut p, seed)| {
        if let Family::CosineSim(c) = &mut p.family {
            c.qk_l2norm = true;
        }
        (p, seed)
    });
    run_cases(
        "cosine_sim_equals_softmax_on_l2_normalised_inputs_with_the_same_scale",
        64,
        strategy,
        |(p, seed)| {
            let cp = params(&p);
            let eps = cp.eps as f64;
            let cos = case(&p, seed);
            let mut soft = cos.clone();
            soft.spec = softmax_twin(&p, cp.scale)?;
            each_qk_row(&mut soft, |x| {
                let n = x.iter().map(|v| v * v).sum::<f64>().sqrt().max(eps);
                x.iter_mut().for_each(|v| *v /= n);
            });
            let (fc, gc) = run(&cos);
            let (fs, gs) = run(&soft);
            close("o", &fc.o, &fs.o, 1e-12)?;
            close("lse", &fc.stats, &fs.stats, 1e-12)?;
            close("dv", &gc.dv, &gs.dv, 1e-12)?;
            if let (Some(a), Some(b)) = (&gc.dbias, &gs.dbias) {
                close("dbias", a, b, 1e-12)?;
            }
            // dq = (dq̂ − q̂ (q̂·dq̂)) / ‖q‖ with dq̂ the softmax gradient (likewise for k).
            let s = &cos.spec;
            let d = s.head_dim();
            let chain = |raw: &[f64], hat: &[f64], dhat: &[f64]| -> Vec<f64> {
                let n = raw.iter().map(|v| v * v).sum::<f64>().sqrt();
                if n > eps {
                    let r: f64 = hat.iter().zip(dhat).map(|(a, b)| a * b).sum();
                    hat.iter().zip(dhat).map(|(x, g)| (g - x * r) / n).collect()
                } else {
                    dhat.iter().map(|g| g / eps).collect()
                }
            };
            let (mut dq, mut dk) = (gs.dq.clone(), gs.dk.clone());
            for b in 0..s.batch() {
                let lens = s.seq_lens(b);
                for h in 0..s.heads_q() {
                    for i in 0..lens.q {
                        let (x, g) = (offset(s, Tensor::Q, b, i, h), s.dq_offset(b, i, h));
                        let v = chain(&cos.q[x..x + d], &soft.q[x..x + d], &gs.dq[g..g + d]);
                        dq[g..g + d].copy_from_slice(&v);
                    }
                }
                for hk in 0..s.heads_kv() {
                    for j in 0..lens.k {
                        let (x, g) = (offset(s, Tensor::K, b, j, hk), s.dk_offset(b, j, hk));
                        let v = chain(&cos.k[x..x + d], &soft.k[x..x + d], &gs.dk[g..g + d]);
                        dk[g..g + d].copy_from_slice(&v);
                    }
                }
            }
            close("dq", &gc.dq, &dq, 1e-10)?;
            close("dk", &gc.dk, &dk, 1e-10)
        },
    );
}

#[test]
fn cosine_sim_without_l2norm_is_softmax_with_its_fixed_scale() {
    let strategy = (problem(cosine_family()), any::<u64>()).prop_map(|(mut p, seed)| {
        if let Family::CosineSim(c) = &mut p.family {
            c.qk_l2norm = false;
        }
        (p, seed)
    });
    run_cases(
        "cosine_sim_without_l2norm_is_softmax_with_its_fixed_scale",
        48,
        strategy,
        |(p, seed)| {
            let cos = case(&p, seed);
            let mut soft = cos.clone();
            soft.spec = softmax_twin(&p, params(&p).scale)?;
            prop_assert_eq!(run(&cos), run(&soft));
            Ok(())
        },
    );
}

#[test]
fn cosine_sim_rows_shorter_than_eps_scale_by_one_over_eps() {
    let strategy = (problem(cosine_family()), any::<u64>()).prop_map(|(mut p, seed)| {
        if let Family::CosineSim(c) = &mut p.family {
            c.qk_l2norm = true;
            c.eps = 0.05;
        }
        (p, seed)
    });
    run_cases(
        "cosine_sim_rows_shorter_than_eps_scale_by_one_over_eps",
        32,
        strategy,
        |(p, seed)| {
            let mut c = case(&p, seed);
            // Every other row shrinks to a norm below eps (and stays there under the probe step).
            let mut n = 0;
            each_qk_row(&mut c, |x| {
                n += 1;
                if n % 2 == 0 {
                    x.iter_mut().for_each(|v| *v *= 0.01);
                }
            });
            let (f, g) = run(&c);
            common::all_finite(&f, &g)?;
            check_gradients(&c, 1e-5, 1e-6, 1e-8).map_err(TestCaseError::fail)
        },
    );
}
