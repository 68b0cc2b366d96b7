//! The attention layer on its own (against projections + the f64 reference) and inside a
//! two-block transformer that trains.

use attn_candle::{seeded_var_builder, AttentionConfig, LmConfig, MultiHeadAttention, TransformerLm};
use attn_core::{Aggregation, AttnProblem, Causal, DType as ADType, Family, HypScore};
use attn_cpu_ref::testing::{max_abs, max_abs_diff};
use attn_cpu_ref::{forward_f64, Inputs};
use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarMap};

fn families() -> [Family; 4] {
    [
        Family::softmax(),
        Family::cosine_sim(),
        Family::taylor(2),
        Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean),
    ]
}

fn weight(vm: &VarMap, name: &str) -> Result<Tensor> {
    let vars = vm
        .data()
        .lock()
        .map_err(|e| candle_core::Error::msg(e.to_string()))?;
    match vars.get(name) {
        Some(v) => v.as_tensor().to_dtype(DType::F64),
        None => candle_core::bail!("no variable {name}"),
    }
}

#[test]
fn gqa_layer_equals_projections_then_reference_attention() -> Result<()> {
    let (b, n, hidden, hq, hkv, d) = (2, 6, 32, 4, 2, 8);
    for (seed, family) in families().into_iter().enumerate() {
        let cfg = AttentionConfig {
            hidden,
            heads_q: hq,
            heads_kv: hkv,
            head_dim: d,
            family,
            causal: Causal::BottomRight,
        };
        let vm = VarMap::new();
        let layer = MultiHeadAttention::new(
            cfg,
            seeded_var_builder(&vm, seed as u64, DType::F32, &Device::Cpu),
        )?;
        let x = Tensor::randn(0f32, 1.0, (b, n, hidden), &Device::Cpu)?;
        let y = layer.forward(&x)?;
        assert_eq!(y.dims(), &[b, n, hidden]);

        // The same computation by hand, in f64: projections, the reference attention, o_proj.
        let x64 = x.to_dtype(DType::F64)?;
        let proj = |name: &str| -> Result<Vec<f64>> {
            x64.broadcast_matmul(&weight(&vm, name)?.t()?)?
                .flatten_all()?
                .to_vec1::<f64>()
        };
        let (q, k, v) = (
            proj("q_proj.weight")?,
            proj("k_proj.weight")?,
            proj("v_proj.weight")?,
        );
        let spec = AttnProblem::new(family, ADType::F32, b, hq, hkv, n, n, d)
            .with_causal(Causal::BottomRight)
            .validate()
            .map_err(attn_candle::to_candle)?;
        let f = forward_f64(
            &spec,
            Inputs {
                q: &q,
                k: &k,
                v: &v,
                bias: None,
            },
        )
        .map_err(attn_candle::to_candle)?;
        let o = Tensor::from_vec(f.o, (b, n, hq * d), &Device::Cpu)?;
        let want = o
            .broadcast_matmul(&weight(&vm, "o_proj.weight")?.t()?)?
            .flatten_all()?
            .to_vec1::<f64>()?;
        let got = y.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        let err = max_abs_diff(&got, &want);
        assert!(
            err <= 1e-4 * max_abs(&want),
            "{}: layer differs by {err:.3e}",
            family.kind().name()
        );
    }
    Ok(())
}

#[test]
fn two_block_model_trains_and_every_parameter_gets_a_gradient() -> Result<()> {
    let dev = Device::Cpu;
    for (seed, family) in families().into_iter().enumerate() {
        let cfg = LmConfig {
            vocab: 16,
            max_len: 12,
            hidden: 32,
            layers: 2,
            heads_q: 4,
            heads_kv: 2,
            head_dim: 8,
            family,
            short_conv: 2,
        };
        let vm = VarMap::new();
        let model = TransformerLm::new(cfg, seeded_var_builder(&vm, seed as u64, DType::F32, &dev))?;
        let tokens = Tensor::rand(0f32, 16.0, (4, 12), &dev)?
            .floor()?
            .to_dtype(DType::U32)?;
        let inputs = tokens.narrow(1, 0, 11)?;
        let targets = tokens.narrow(1, 1, 11)?.flatten_all()?;
        let loss_of = |m: &TransformerLm| -> Result<Tensor> {
            let logits = m.forward(&inputs)?;
            candle_nn::loss::cross_entropy(&logits.flatten_to(1)?, &targets)
        };

        let loss = loss_of(&model)?;
        let grads = loss.backward()?;
        let vars = vm.all_vars();
        // Per block: 2 norm weights, the short convolution, 4 projections, 2 MLP matrices; then
        // tok, pos, norm, head.
        assert_eq!(vars.len(), 2 * 9 + 4);
        for var in &vars {
            let g = grads
                .get(var.as_tensor())
                .expect("every parameter gets a gradient");
            let norm = g.sqr()?.sum_all()?.sqrt()?.to_scalar::<f32>()?;
            assert!(
                norm.is_finite() && norm > 0.0,
                "{}: gradient norm {norm}",
                family.kind().name()
            );
        }

        let mut opt = AdamW::new(
            vars,
            ParamsAdamW {
                lr: 1e-2,
                ..ParamsAdamW::default()
            },
        )?;
        let first = loss.to_scalar::<f32>()?;
        for _ in 0..30 {
            opt.backward_step(&loss_of(&model)?)?;
        }
        let last = loss_of(&model)?.to_scalar::<f32>()?;
        assert!(
            last < 0.6 * first,
            "{}: loss {first} → {last} after 30 steps",
            family.kind().name()
        );
    }
    Ok(())
}
