//! Multi-query associative recall (MQAR, Arora et al. 2023, "Zoology"): the standard test of what an
//! attention mechanism can recall in context, and the training loop the `mqar` example runs.
//!
//! A sequence lists `n` key-value pairs, then `m` queries, each a key from the list followed by its
//! value: `k_1 v_1 … k_n v_n  q_1 a_1 … q_m a_m` (keys and values from disjoint vocabularies, keys
//! distinct within a sequence, fresh random pairs in every sequence, so nothing can be memorised).
//! A causal language model reads the sequence without its last token and is scored only where the
//! next token is an answer `a_t`: the loss is the cross-entropy of `a_t` at the position of `q_t`,
//! and recall accuracy is the fraction of answers predicted exactly (argmax over the vocabulary).

use crate::model::{seeded_var_builder, LmConfig, TransformerLm};
use attn_core::Family;
use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarMap};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// The shape of the recall task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MqarTask {
    /// Key-value pairs per sequence (`n`).
    pub num_kv_pairs: usize,
    /// Queries per sequence (`m`); distinct keys when `m ≤ n`.
    pub num_queries: usize,
    /// Size of the key vocabulary (token ids `0..num_keys`); at least `num_kv_pairs`.
    pub num_keys: usize,
    /// Size of the value vocabulary (token ids `num_keys..num_keys + num_values`).
    pub num_values: usize,
}

/// One batch: model inputs and the answers to predict.
#[derive(Clone, Debug)]
pub struct Batch {
    /// `[B, L]` u32 token ids, `L = 2(n + m) − 1`.
    pub inputs: Tensor,
    /// `[B, m]` u32: the value that follows each query.
    pub answers: Tensor,
}

impl MqarTask {
    /// Keys and values together: the model's vocabulary.
    pub fn vocab(&self) -> usize {
        self.num_keys + self.num_values
    }

    /// Length of a model input (the sequence without its last token).
    pub fn input_len(&self) -> usize {
        2 * (self.num_kv_pairs + self.num_queries) - 1
    }

    /// Input positions holding a query, whose next token is its answer.
    pub fn query_positions(&self) -> Vec<u32> {
        (0..self.num_queries)
            .map(|t| (2 * (self.num_kv_pairs + t)) as u32)
            .collect()
    }

    /// Draw `batch` sequences.
    pub fn sample(&self, batch: usize, rng: &mut StdRng, device: &Device) -> Result<Batch> {
        let (n, m) = (self.num_kv_pairs, self.num_queries);
        if n == 0 || m == 0 || n > self.num_keys || self.num_values == 0 {
            candle_core::bail!("mqar: invalid task {self:?} (need 1 ≤ num_kv_pairs ≤ num_keys, num_queries ≥ 1, num_values ≥ 1)");
        }
        let mut inputs = Vec::with_capacity(batch * self.input_len());
        let mut answers = Vec::with_capacity(batch * m);
        let mut keys: Vec<u32> = (0..self.num_keys as u32).collect();
        for _ in 0..batch {
            // The first n entries of a partial Fisher–Yates shuffle: n distinct keys.
            for i in 0..n {
                let j = rng.random_range(i..keys.len());
                keys.swap(i, j);
            }
            let values: Vec<u32> = (0..n)
                .map(|_| (self.num_keys + rng.random_range(0..self.num_values)) as u32)
                .collect();
            let mut order: Vec<usize> = (0..n).collect();
            let picks: Vec<usize> = if m <= n {
                for i in 0..m {
                    let j = rng.random_range(i..n);
                    order.swap(i, j);
                }
                order[..m].to_vec()
            } else {
                (0..m).map(|_| rng.random_range(0..n)).collect()
            };
            let mut seq = Vec::with_capacity(2 * (n + m));
            for i in 0..n {
                seq.extend([keys[i], values[i]]);
            }
            for &p in &picks {
                seq.extend([keys[p], values[p]]);
                answers.push(values[p]);
            }
            inputs.extend_from_slice(&seq[..seq.len() - 1]);
        }
        Ok(Batch {
            inputs: Tensor::from_vec(inputs, (batch, self.input_len()), device)?,
            answers: Tensor::from_vec(answers, (batch, m), device)?,
        })
    }
}

/// Everything a training run needs besides the family and the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainConfig {
    /// The recall task.
    pub task: MqarTask,
    /// Width of the model's residual stream.
    pub hidden: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads (query and key/value alike).
    pub heads: usize,
    /// Head dim of each attention layer.
    pub head_dim: usize,
    /// Taps of the short convolution before each attention layer (0: none).
    pub short_conv: usize,
    /// Sequences per training step.
    pub batch_size: usize,
    /// Training steps.
    pub steps: usize,
    /// Peak learning rate (linear warm-up over `warmup` steps, then cosine decay to a tenth).
    pub lr: f64,
    /// Steps of linear learning-rate warm-up.
    pub warmup: usize,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Held-out sequences for the final loss and accuracy.
    pub eval_sequences: usize,
    /// Seed of the initial weights and the data ([`seeded_var_builder`]).
    pub seed: u64,
}

/// What a training run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainReport {
    /// Training loss per step.
    pub losses: Vec<f32>,
    /// Mean answer cross-entropy on the held-out sequences after training.
    pub eval_loss: f32,
    /// Fraction of held-out answers predicted exactly.
    pub accuracy: f32,
    /// Training tokens (`batch_size · input_len` per step) per second of training.
    pub tokens_per_sec: f64,
    /// Wall-clock seconds of the training steps (evaluation excluded).
    pub train_seconds: f64,
}

impl TrainConfig {
    /// The model this configuration trains with `family`: `heads` query and key/value heads.
    pub fn lm_config(&self, family: Family) -> LmConfig {
        LmConfig {
            vocab: self.task.vocab(),
            max_len: self.task.input_len(),
            hidden: self.hidden,
            layers: self.layers,
            heads_q: self.heads,
            heads_kv: self.heads,
            head_dim: self.head_dim,
            family,
            short_conv: self.short_conv,
        }
    }

    /// Learning rate at `step`: linear warm-up, then cosine decay from `lr` to `lr / 10`.
    pub fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.lr * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.steps.saturating_sub(self.warmup).max(1) as f64;
        let t = ((step - self.warmup) as f64 / span).min(1.0);
        self.lr * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()))
    }
}

/// Answer logits `[B·m, vocab]` of a batch.
fn answer_logits(model: &TransformerLm, task: &MqarTask, batch: &Batch) -> Result<Tensor> {
    let positions = Tensor::new(task.query_positions(), batch.inputs.device())?;
    let logits = model.forward(&batch.inputs)?.index_select(&positions, 1)?;
    let (b, m, v) = logits.dims3()?;
    logits.reshape((b * m, v))
}

/// Mean cross-entropy and the number of exactly predicted answers.
fn score(logits: &Tensor, answers: &Tensor) -> Result<(Tensor, usize)> {
    let answers = answers.flatten_all()?;
    let loss = candle_nn::loss::cross_entropy(logits, &answers)?;
    let hits = logits
        .argmax(D::Minus1)?
        .eq(&answers)?
        .to_dtype(DType::U32)?
        .sum_all()?
        .to_scalar::<u32>()?;
    Ok((loss, hits as usize))
}

/// Train a fresh model of `family` on the task; `on_step(step, loss)` after every step.
/// Deterministic for a given `cfg.seed` on the CPU: the same seed gives every family the same
/// initial weights (where shapes agree) and the same data.
pub fn train(
    cfg: &TrainConfig,
    family: Family,
    device: &Device,
    on_step: &mut dyn FnMut(usize, f32),
) -> Result<TrainReport> {
    let varmap = VarMap::new();
    let model = TransformerLm::new(
        cfg.lm_config(family),
        seeded_var_builder(&varmap, cfg.seed, DType::F32, device),
    )?;
    let params = ParamsAdamW {
        lr: cfg.lr,
        weight_decay: cfg.weight_decay,
        ..ParamsAdamW::default()
    };
    let mut opt = AdamW::new(varmap.all_vars(), params)?;
    let mut rng = StdRng::seed_from_u64(cfg.seed ^ 0x5eed_da7a);
    let mut losses = Vec::with_capacity(cfg.steps);
    let start = Instant::now();
    for step in 0..cfg.steps {
        opt.set_learning_rate(cfg.lr_at(step));
        let batch = cfg.task.sample(cfg.batch_size, &mut rng, device)?;
        let logits = answer_logits(&model, &cfg.task, &batch)?;
        let (loss, _) = score(&logits, &batch.answers)?;
        opt.backward_step(&loss)?;
        let loss = loss.to_scalar::<f32>()?;
        losses.push(loss);
        on_step(step, loss);
    }
    let train_seconds = start.elapsed().as_secs_f64();
    let tokens = (cfg.steps * cfg.batch_size * cfg.task.input_len()) as f64;

    let mut eval_rng = StdRng::seed_from_u64(cfg.seed ^ 0xe7a1_5eed);
    let (mut loss_sum, mut hits, mut seen) = (0.0f64, 0usize, 0usize);
    while seen < cfg.eval_sequences {
        let b = cfg.batch_size.min(cfg.eval_sequences - seen);
        let batch = cfg.task.sample(b, &mut eval_rng, device)?;
        let logits = answer_logits(&model, &cfg.task, &batch)?.detach();
        let (loss, h) = score(&logits, &batch.answers)?;
        loss_sum += loss.to_scalar::<f32>()? as f64 * b as f64;
        hits += h;
        seen += b;
    }
    let answers = (seen * cfg.task.num_queries).max(1);
    Ok(TrainReport {
        losses,
        eval_loss: (loss_sum / seen.max(1) as f64) as f32,
        accuracy: hits as f32 / answers as f32,
        tokens_per_sec: tokens / train_seconds.max(1e-9),
        train_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_answer_is_the_value_paired_with_its_query_key() -> Result<()> {
        let task = MqarTask {
            num_kv_pairs: 6,
            num_queries: 4,
            num_keys: 10,
            num_values: 7,
        };
        let mut rng = StdRng::seed_from_u64(1);
        let batch = task.sample(5, &mut rng, &Device::Cpu)?;
        let inputs = batch.inputs.to_vec2::<u32>()?;
        let answers = batch.answers.to_vec2::<u32>()?;
        let positions = task.query_positions();
        for (seq, ans) in inputs.iter().zip(&answers) {
            assert_eq!(seq.len(), task.input_len());
            let pairs: Vec<(u32, u32)> = seq[..12].chunks(2).map(|p| (p[0], p[1])).collect();
            let mut keys: Vec<u32> = pairs.iter().map(|p| p.0).collect();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), 6, "keys within a sequence are distinct");
            assert!(pairs.iter().all(|&(k, v)| k < 10 && (10..17).contains(&v)));
            for (t, &p) in positions.iter().enumerate() {
                let key = seq[p as usize];
                let value = pairs.iter().find(|pair| pair.0 == key).map(|pair| pair.1);
                assert_eq!(value, Some(ans[t]), "query {t} of {seq:?}");
                if (p as usize) + 1 < seq.len() {
                    assert_eq!(
                        seq[p as usize + 1],
                        ans[t],
                        "the answer follows its query in the input"
                    );
                }
            }
        }
        Ok(())
    }

    #[test]
    fn learning_rate_warms_up_then_decays_to_a_tenth() {
        let cfg = TrainConfig {
            task: MqarTask {
                num_kv_pairs: 1,
                num_queries: 1,
                num_keys: 1,
                num_values: 1,
            },
            hidden: 8,
            layers: 1,
            heads: 1,
            head_dim: 8,
            short_conv: 0,
            batch_size: 1,
            steps: 110,
            lr: 1.0,
            warmup: 10,
            weight_decay: 0.0,
            eval_sequences: 1,
            seed: 0,
        };
        assert!((cfg.lr_at(0) - 0.1).abs() < 1e-12);
        assert!((cfg.lr_at(9) - 1.0).abs() < 1e-12);
        assert!((cfg.lr_at(10) - 1.0).abs() < 1e-12);
        assert!((cfg.lr_at(60) - 0.55).abs() < 1e-12);
        assert!((cfg.lr_at(109) - 0.1).abs() < 1e-3);
    }
}
