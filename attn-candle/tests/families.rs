//! Every family through `attention` and `Tensor::backward`: o, the saved statistics, dq, dk, dv
//! equal attn-cpu-ref's in every storage dtype, and match the f64 oracle in f32. Shapes cover GQA
//! (4 query heads over 2 kv heads), `Nq ≠ Nk` both ways, `Dv ≠ D`, sequence lengths that are not
//! powers of two, and every causal alignment (bottom-right with `Nq > Nk` leaves rows with no key).

mod common;

use attn_core::{
    Aggregation, AttnProblem, Causal, DType, Family, HypScore, HyperbolicParams, Layout, SoftmaxParams,
    TaylorParams,
};
use candle_core::Result;
use common::check;

fn problems(family: Family) -> Vec<AttnProblem> {
    let mut out = Vec::new();
    for dtype in DType::ALL {
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            out.push(
                AttnProblem::new(family, dtype, 2, 4, 2, 5, 9, 8)
                    .with_head_dim_v(6)
                    .with_causal(causal),
            );
        }
    }
    out.push(AttnProblem::new(family, DType::F32, 1, 2, 1, 7, 4, 16).with_causal(Causal::BottomRight));
    out.push(AttnProblem::new(family, DType::F32, 2, 3, 3, 6, 6, 4).with_layout(Layout::Bhnd));
    out
}

fn check_family(family: Family) -> Result<()> {
    for (seed, p) in problems(family).iter().enumerate() {
        check(p, 100 + seed as u64)?;
    }
    Ok(())
}

#[test]
fn softmax_outputs_and_gradients_match_reference() -> Result<()> {
    check_family(Family::softmax())
}

#[test]
fn softmax_with_scale_and_softcap_matches_reference() -> Result<()> {
    check_family(Family::Softmax(SoftmaxParams {
        scale: Some(0.7),
        softcap: Some(2.0),
    }))
}

#[test]
fn cosine_sim_outputs_and_gradients_match_reference() -> Result<()> {
    check_family(Family::cosine_sim())
}

#[test]
fn taylor_order1_l2norm_outputs_and_gradients_match_reference() -> Result<()> {
    check_family(Family::Taylor(TaylorParams {
        order: 1,
        qk_l2norm: true,
        ..TaylorParams::default()
    }))
}

#[test]
fn taylor_order2_outputs_and_gradients_match_reference() -> Result<()> {
    check_family(Family::taylor(2))
}

#[test]
fn hyperbolic_geodesic_outputs_and_gradients_match_reference() -> Result<()> {
    check_family(Family::Hyperbolic(HyperbolicParams {
        score: HypScore::Geodesic,
        curvature: 0.5,
        beta: 1.5,
        aggregation: Aggregation::Euclidean,
    }))
}

#[test]
fn hyperbolic_squared_lorentz_outputs_and_gradients_match_reference() -> Result<()> {
    check_family(Family::hyperbolic(
        HypScore::SquaredLorentz,
        Aggregation::Euclidean,
    ))
}

#[test]
fn hyperbolic_einstein_midpoint_outputs_and_gradients_match_reference() -> Result<()> {
    check_family(Family::hyperbolic(
        HypScore::SquaredLorentz,
        Aggregation::EinsteinMidpoint,
    ))
}
