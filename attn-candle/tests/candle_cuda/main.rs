//! attn-candle on a CUDA GPU: the ops' CUDA path (attn-cuda on candle's stream) against the f64
//! oracle, the naive same-dtype baseline and the CPU op; the drop-in `flash_attn` on strided
//! views; bias, padding and varlen; the layer in a model that trains; the errors; generation through
//! KV caches (`kv_cache.rs`).
//!
//! Built with `--features cuda` (`cargo xtask setup-candle-cuda` sets up the toolchain), run with
//! `cargo xtask test-gpu` or from the GPU bundle; every test is `#[ignore]`d without `--ignored`.
//!
//! Shapes: sequence lengths that are not multiples of any tile (37 queries, 53 keys), GQA (4 query
//! heads over 2 kv heads), `Nq ≠ Nk` both ways, every causal alignment (bottom-right with
//! `Nq > Nk` leaves rows with no key), key padding; f32, f16, bf16 each.
#![cfg(feature = "cuda")]

#[path = "../common/mod.rs"]
mod common;
mod harness;
mod naive;

mod api;
mod kv_cache;
mod model;

use attn_core::{
    Aggregation, AttnProblem, Causal, DType, Family, FamilyKind, HypScore, HyperbolicParams, Op, Pass,
    SoftmaxParams, TaylorParams,
};
use candle_core::Result;
use harness::{check, is_unsupported};

/// The shapes every family runs, at head dim `d`.
fn problems(family: Family, d: usize) -> Vec<AttnProblem> {
    let mut out = Vec::new();
    for dtype in DType::ALL {
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            out.push(AttnProblem::new(family, dtype, 2, 4, 2, 37, 53, d).with_causal(causal));
        }
        out.push(AttnProblem::new(family, dtype, 1, 2, 1, 45, 20, d).with_causal(Causal::BottomRight));
        out.push(AttnProblem::new(family, dtype, 2, 2, 2, 33, 40, d).with_key_lens(vec![40, 17]));
    }
    out
}

fn check_family(family: Family, d: usize) -> Result<()> {
    for (seed, p) in problems(family, d).iter().enumerate() {
        check(p, 500 + seed as u64)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn softmax_matches_reference_on_gpu() -> Result<()> {
    check_family(Family::softmax(), 64)
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn softmax_with_softcap_matches_reference_on_gpu() -> Result<()> {
    let family = Family::Softmax(SoftmaxParams {
        scale: Some(0.3),
        softcap: Some(5.0),
    });
    for (seed, dtype) in DType::ALL.into_iter().enumerate() {
        let p = AttnProblem::new(family, dtype, 2, 2, 1, 29, 29, 32).with_causal(Causal::TopLeft);
        check(&p, 600 + seed as u64)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn cosine_sim_matches_reference_on_gpu() -> Result<()> {
    check_family(Family::cosine_sim(), 32)
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_order1_matches_reference_on_gpu() -> Result<()> {
    check_family(
        Family::Taylor(TaylorParams {
            order: 1,
            qk_l2norm: true,
            ..TaylorParams::default()
        }),
        32,
    )
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_order2_matches_reference_on_gpu() -> Result<()> {
    check_family(Family::taylor(2), 32)
}

/// Hyperbolic attention, both scores and both aggregations, non-default curvature and β, every dtype:
/// outputs and gradients through candle autograd against the reference (attn-cuda runs every case).
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn hyperbolic_matches_reference_on_gpu() -> Result<()> {
    let families = [
        Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean),
        Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::EinsteinMidpoint),
        Family::Hyperbolic(HyperbolicParams {
            score: HypScore::Geodesic,
            curvature: 0.5,
            beta: 1.5,
            aggregation: Aggregation::Euclidean,
        }),
    ];
    for (seed, family) in families.into_iter().enumerate() {
        for dtype in DType::ALL {
            let p = AttnProblem::new(family, dtype, 2, 4, 2, 37, 53, 64).with_causal(Causal::BottomRight);
            check(&p, 700 + seed as u64)?;
        }
    }
    Ok(())
}

/// A head dim attn-cuda has no kernel for is its `Unsupported` error naming the op and the
/// shapes; nothing falls back to another implementation.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn an_unsupported_head_dim_is_a_typed_error_not_a_fallback() -> Result<()> {
    let p = AttnProblem::new(Family::softmax(), DType::F16, 1, 2, 2, 16, 16, 48);
    match check(&p, 1) {
        Ok(_) => panic!("softmax with head dim 48 ran on the GPU; attn-cuda has no such kernel"),
        Err(e) => {
            assert!(
                is_unsupported(&e, Op::new(FamilyKind::Softmax, Pass::Forward)),
                "not attn-cuda's Unsupported error: {e}"
            );
            let msg = e.to_string();
            assert!(msg.contains("48") && msg.contains("[1, 16, 2, 48]"), "{msg}");
        }
    }
    Ok(())
}
