//! Bias (with its gradient through the link op), key padding, sliding windows and packed
//! variable-length batches, each against attn-cpu-ref.

mod common;

use attn_candle::{attention, AttnOptions};
use attn_core::{Aggregation, AttnProblem, Causal, DType, Family, HypScore, TaylorParams};
use attn_cpu_ref::testing::random_case;
use candle_core::{Device, Result, Tensor};
use common::{candle_dtype, check, reference, to_f64, var, Stored};

fn softmax_like() -> [Family; 3] {
    [
        Family::softmax(),
        Family::cosine_sim(),
        Family::hyperbolic(HypScore::Geodesic, Aggregation::Euclidean),
    ]
}

#[test]
fn bias_gradient_matches_reference_for_every_broadcast_shape() -> Result<()> {
    for family in softmax_like() {
        for (seed, (bb, bh)) in [(2, 4), (1, 4), (2, 1), (1, 1)].into_iter().enumerate() {
            for dtype in [DType::F32, DType::BF16] {
                let p = AttnProblem::new(family, dtype, 2, 4, 2, 5, 7, 8)
                    .with_causal(Causal::BottomRight)
                    .with_bias(bb, bh);
                check(&p, 7 + seed as u64)?;
            }
        }
    }
    Ok(())
}

#[test]
fn bias_alone_receives_its_gradient_when_qkv_are_constants() -> Result<()> {
    let p = AttnProblem::new(Family::softmax(), DType::F32, 1, 2, 2, 4, 6, 8).with_bias(1, 2);
    let spec = p.validate().map_err(attn_candle::to_candle)?;
    let case = random_case(&spec, 3);
    let dt = candle_dtype(spec.dtype());
    let constant =
        |x: &[f64], shape: Vec<usize>| Tensor::from_vec(x.to_vec(), shape, &Device::Cpu)?.to_dtype(dt);
    let q = constant(&case.q, spec.q_shape())?;
    let k = constant(&case.k, spec.k_shape())?;
    let v = constant(&case.v, spec.v_shape())?;
    let bias = var(case.bias.as_deref().unwrap_or_default(), vec![1, 2, 4, 6], dt)?;
    let opts = AttnOptions::new(p.family).with_bias(bias.as_tensor().clone());
    let o = attention(&q, &k, &v, &opts)?;
    let d_o = Tensor::from_vec(case.d_o.clone(), spec.o_shape(), &Device::Cpu)?.to_dtype(dt)?;
    let grads = (&o * &d_o)?.sum_all()?.backward()?;
    assert!(grads.get(&q).is_none(), "a constant q must get no gradient");
    let got = to_f64(grads.get(bias.as_tensor()).expect("bias gradient"))?;
    let stored = Stored {
        q: to_f64(&q)?,
        k: to_f64(&k)?,
        v: to_f64(&v)?,
        bias: Some(to_f64(bias.as_tensor())?),
        d_o: to_f64(&d_o)?,
    };
    let want = reference::<f32>(&spec, &stored);
    assert_eq!(Some(got), want.dbias);
    Ok(())
}

#[test]
fn key_padding_matches_reference_for_every_family() -> Result<()> {
    let taylor1 = Family::Taylor(TaylorParams {
        order: 1,
        qk_l2norm: true,
        ..TaylorParams::default()
    });
    let families = [
        Family::softmax(),
        Family::cosine_sim(),
        taylor1,
        Family::taylor(2),
        Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean),
    ];
    for (seed, family) in families.into_iter().enumerate() {
        for causal in [Causal::None, Causal::BottomRight] {
            // Batch entry 2 has no valid key at all: its rows return zeros, never NaN.
            let p = AttnProblem::new(family, DType::F32, 3, 2, 1, 6, 8, 8)
                .with_causal(causal)
                .with_key_lens(vec![8, 3, 0]);
            check(&p, 40 + seed as u64)?;
        }
    }
    Ok(())
}

#[test]
fn sliding_window_matches_reference() -> Result<()> {
    for family in softmax_like() {
        let p = AttnProblem::new(family, DType::F32, 2, 2, 2, 9, 9, 8)
            .with_causal(Causal::BottomRight)
            .with_window(Some(3), Some(0));
        check(&p, 11)?;
        let p = AttnProblem::new(family, DType::BF16, 1, 2, 1, 6, 10, 8).with_window(Some(2), Some(1));
        check(&p, 12)?;
    }
    Ok(())
}

#[test]
fn varlen_matches_reference_for_every_family() -> Result<()> {
    let families = [
        Family::softmax(),
        Family::cosine_sim(),
        Family::taylor(2),
        Family::hyperbolic(HypScore::Geodesic, Aggregation::Euclidean),
    ];
    for (seed, family) in families.into_iter().enumerate() {
        for causal in [Causal::None, Causal::BottomRight, Causal::TopLeft] {
            // Lengths 3, 0 and 6 queries over 5, 2 and 4 keys.
            let p = AttnProblem::new(family, DType::F32, 3, 4, 2, 6, 5, 8)
                .with_causal(causal)
                .with_varlen(vec![0, 3, 3, 9], vec![0, 5, 7, 11]);
            check(&p, 60 + seed as u64)?;
        }
    }
    let p = AttnProblem::new(Family::softmax(), DType::BF16, 2, 2, 2, 4, 7, 8)
        .with_causal(Causal::BottomRight)
        .with_varlen(vec![0, 4, 7], vec![0, 7, 12]);
    check(&p, 70)
}
