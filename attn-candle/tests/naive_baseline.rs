//! The GPU tests' yardsticks, checked on the CPU:
//! - their naive baseline (`tests/candle_cuda/naive.rs`) against the f64 oracle in f32: the
//!   tolerance `2·err(naive) + atol` is only as honest as this baseline, so it must compute the same
//!   attention (masks, GQA, bias, varlen, every family);
//! - their harness (`tests/candle_cuda/harness.rs`) run with the CPU op in place of the GPU one, in
//!   every dtype: an accurate implementation passes it.

mod common;
#[allow(dead_code)] // the GPU entry points of the harness are unused here
#[path = "candle_cuda/harness.rs"]
mod harness;
#[path = "candle_cuda/naive.rs"]
mod naive;

use attn_core::{Aggregation, AttnProblem, Causal, DType, Family, HypScore, HyperbolicParams, TaylorParams};
use attn_cpu_ref::testing::{max_abs, max_abs_diff};
use candle_core::{Device, Result};
use common::{oracle, pairs, run_candle};

fn check(p: &AttnProblem, seed: u64, rtol: f64) -> Result<()> {
    let (spec, _, stored) = run_candle(p, seed)?;
    let want = oracle(&spec, &stored);
    let got = naive::naive(&spec, &stored, &Device::Cpu)?;
    let what = format!(
        "{} {:?} {:?}",
        spec.family().label(),
        spec.causal(),
        spec.lengths()
    );
    for (name, g, w) in pairs(&got, &want) {
        if let Some(i) = g.iter().position(|x| !x.is_finite()) {
            panic!("{what}: {name}[{i}] of the baseline is {}", g[i]);
        }
        let (err, tol) = (max_abs_diff(g, w), rtol * max_abs(w) + 1e-6);
        assert!(err <= tol, "{what}: {name} max error {err:.3e} > {tol:.3e}");
    }
    for (i, (g, w)) in got.stats.iter().zip(&want.stats).enumerate() {
        let ok = if w.is_finite() {
            (g - w).abs() <= rtol * w.abs().max(1.0)
        } else {
            g == w
        };
        assert!(ok, "{what}: stats[{i}] = {g}, oracle {w}");
    }
    Ok(())
}

fn problems(family: Family) -> Vec<AttnProblem> {
    let mut out = Vec::new();
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        out.push(AttnProblem::new(family, DType::F32, 2, 4, 2, 7, 11, 8).with_causal(causal));
    }
    out.push(AttnProblem::new(family, DType::F32, 1, 2, 1, 9, 4, 8).with_causal(Causal::BottomRight));
    out.push(AttnProblem::new(family, DType::F32, 2, 2, 2, 5, 8, 8).with_key_lens(vec![8, 3]));
    out.push(
        AttnProblem::new(family, DType::F32, 3, 4, 2, 6, 7, 8)
            .with_causal(Causal::BottomRight)
            .with_varlen(vec![0, 2, 8, 12], vec![0, 3, 10, 13]),
    );
    out
}

#[test]
fn naive_baseline_matches_the_oracle_in_f32() -> Result<()> {
    let families = [
        (Family::softmax(), 1e-5),
        (Family::cosine_sim(), 1e-5),
        (
            Family::Taylor(TaylorParams {
                order: 1,
                qk_l2norm: true,
                ..TaylorParams::default()
            }),
            1e-5,
        ),
        (Family::taylor(2), 1e-5),
        // The naive Lorentz product cancels: −q0 k0 + q·k in f32 loses digits near the diagonal.
        (
            Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean),
            1e-4,
        ),
        (
            Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::EinsteinMidpoint),
            1e-4,
        ),
        (
            Family::Hyperbolic(HyperbolicParams {
                score: HypScore::Geodesic,
                curvature: 0.5,
                beta: 1.5,
                aggregation: Aggregation::Euclidean,
            }),
            1e-3,
        ),
    ];
    let mut seed = 40;
    for (family, rtol) in families {
        for p in problems(family) {
            check(&p, seed, rtol)?;
            seed += 1;
        }
    }
    Ok(())
}

#[test]
fn naive_baseline_with_bias_matches_the_oracle_in_f32() -> Result<()> {
    for (seed, (bb, bh)) in [(1, 4), (2, 1), (2, 4)].into_iter().enumerate() {
        for family in [Family::softmax(), Family::cosine_sim()] {
            let p = AttnProblem::new(family, DType::F32, 2, 4, 2, 7, 11, 8)
                .with_causal(Causal::BottomRight)
                .with_bias(bb, bh);
            check(&p, 90 + seed as u64, 1e-5)?;
        }
    }
    Ok(())
}

/// The CPU op (attn-cpu-ref in the storage dtype) passes the GPU harness's checks in every dtype.
#[test]
fn the_gpu_harness_passes_the_cpu_op() -> Result<()> {
    let families = [
        Family::softmax(),
        Family::cosine_sim(),
        Family::taylor(2),
        Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::EinsteinMidpoint),
    ];
    let mut seed = 200;
    for family in families {
        for dtype in DType::ALL {
            for p in [
                AttnProblem::new(family, dtype, 2, 4, 2, 9, 13, 16).with_causal(Causal::BottomRight),
                AttnProblem::new(family, dtype, 1, 2, 1, 9, 4, 16).with_causal(Causal::BottomRight),
                AttnProblem::new(family, dtype, 3, 2, 2, 6, 7, 16)
                    .with_varlen(vec![0, 2, 8, 12], vec![0, 3, 10, 13]),
            ] {
                harness::check_on(&p, seed, &Device::Cpu)?;
                seed += 1;
            }
        }
    }
    Ok(())
}
