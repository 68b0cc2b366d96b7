//! The layer inside a model on the GPU: a two-block language model gives the CPU's logits and
//! parameter gradients, and MQAR training on the GPU lowers the loss.

use crate::harness::gpu;
use attn_candle::mqar::{train, MqarTask, TrainConfig};
use attn_candle::{seeded_var_builder, LmConfig, TransformerLm};
use attn_core::{Aggregation, Family, HypScore};
use attn_cpu_ref::testing::{max_abs, max_abs_diff};
use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::VarMap;

fn families() -> [Family; 3] {
    [Family::softmax(), Family::cosine_sim(), Family::taylor(2)]
}

/// Hyperbolic attention, checked in tests of its own (its kernels are the newest).
fn hyperbolic() -> Family {
    Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean)
}

/// Logits and every parameter gradient (sorted by name) of a cross-entropy loss, as f64.
fn logits_and_grads(
    cfg: LmConfig,
    dev: &Device,
    tokens: &[u32],
    targets: &[u32],
) -> Result<Vec<(String, Vec<f64>)>> {
    let vm = VarMap::new();
    let model = TransformerLm::new(cfg, seeded_var_builder(&vm, 7, DType::F32, dev))?;
    let n = tokens.len() / 2;
    let x = Tensor::from_vec(tokens.to_vec(), (2, n), dev)?;
    let y = Tensor::from_vec(targets.to_vec(), 2 * n, dev)?;
    let logits = model.forward(&x)?;
    let loss = candle_nn::loss::cross_entropy(&logits.reshape((2 * n, cfg.vocab))?, &y)?;
    let grads = loss.backward()?;
    let flat = |t: &Tensor| t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>();
    let mut out = vec![("logits".to_string(), flat(&logits)?)];
    let vars = vm
        .data()
        .lock()
        .map_err(|e| candle_core::Error::msg(e.to_string()))?
        .clone();
    let mut names: Vec<_> = vars.keys().cloned().collect();
    names.sort();
    for name in names {
        match grads.get(vars[&name].as_tensor()) {
            Some(g) => out.push((name, flat(g)?)),
            None => candle_core::bail!("no gradient for {name}"),
        }
    }
    Ok(out)
}

/// Two blocks (GQA 4 over 2 heads of 32, short convolution) on the GPU and on the CPU from the
/// same seed: the same logits and parameter gradients within f32 accumulation-order differences.
fn two_block_model_matches_cpu(family: Family) -> Result<()> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let (vocab, n) = (24, 19);
    let tokens: Vec<u32> = (0..2 * n).map(|_| rng.random_range(0..vocab as u32)).collect();
    let targets: Vec<u32> = (0..2 * n).map(|_| rng.random_range(0..vocab as u32)).collect();
    let cfg = LmConfig {
        vocab,
        max_len: n,
        hidden: 64,
        layers: 2,
        heads_q: 4,
        heads_kv: 2,
        head_dim: 32,
        family,
        short_conv: 2,
    };
    let on_gpu = logits_and_grads(cfg, &gpu(), &tokens, &targets)?;
    let on_cpu = logits_and_grads(cfg, &Device::Cpu, &tokens, &targets)?;
    assert_eq!(on_gpu.len(), on_cpu.len());
    for ((name, g), (_, c)) in on_gpu.iter().zip(&on_cpu) {
        let (diff, scale) = (max_abs_diff(g, c), max_abs(c));
        assert!(
            diff <= 1e-3 * scale + 1e-6,
            "{}: {name} differs by {diff:.3e} (max {scale:.3e})",
            family.kind().name()
        );
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn two_block_model_on_gpu_matches_cpu() -> Result<()> {
    families().into_iter().try_for_each(two_block_model_matches_cpu)
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn hyperbolic_two_block_model_on_gpu_matches_cpu() -> Result<()> {
    two_block_model_matches_cpu(hyperbolic())
}

/// 150 MQAR steps on the GPU: the mean loss of the last ten steps is below 85% of the first ten's
/// (the accuracy and tokens/s are printed).
fn mqar_on_gpu_lowers_the_loss(family: Family) -> Result<()> {
    let cfg = TrainConfig {
        task: MqarTask {
            num_kv_pairs: 4,
            num_queries: 8,
            num_keys: 16,
            num_values: 16,
        },
        hidden: 64,
        layers: 2,
        heads: 2,
        head_dim: 32,
        short_conv: 2,
        batch_size: 16,
        steps: 150,
        lr: 1e-2,
        warmup: 10,
        weight_decay: 0.01,
        eval_sequences: 64,
        seed: 3,
    };
    let mean = |x: &[f32]| x.iter().sum::<f32>() / x.len() as f32;
    let report = train(&cfg, family, &gpu(), &mut |_, _| {})?;
    let first = mean(&report.losses[..10]);
    let last = mean(&report.losses[report.losses.len() - 10..]);
    println!(
        "{}: loss {first:.3} → {last:.3}, accuracy {:.1}%, {:.0} tokens/s on the GPU",
        family.kind().name(),
        report.accuracy * 100.0,
        report.tokens_per_sec
    );
    assert!(report.losses.iter().all(|l| l.is_finite()));
    assert!(
        last < 0.85 * first,
        "{}: loss {first:.3} → {last:.3}",
        family.kind().name()
    );
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn mqar_training_on_gpu_lowers_the_loss() -> Result<()> {
    families().into_iter().try_for_each(mqar_on_gpu_lowers_the_loss)
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn hyperbolic_mqar_training_on_gpu_lowers_the_loss() -> Result<()> {
    mqar_on_gpu_lowers_the_loss(hyperbolic())
}
