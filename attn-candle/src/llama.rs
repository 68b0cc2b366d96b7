//! A Llama-architecture decoder for generation (`examples/generate.rs`): token embeddings, blocks of
//! RMSNorm → [`DecoderAttention`] (rotary embeddings, GQA) → residual → RMSNorm → SwiGLU MLP →
//! residual, a final RMSNorm and the LM head. Weights under the usual Llama tensor names
//! (`model.embed_tokens.weight`, `model.layers.N.self_attn.{q,k,v,o}_proj.weight`,
//! `model.layers.N.mlp.{gate,up,down}_proj.weight`,
//! `model.layers.N.{input,post_attention}_layernorm.weight`, `model.norm.weight`,
//! `lm_head.weight`), so a safetensors checkpoint loads through a `VarBuilder` as it is.
//!
//! Two ways to run the same weights, for greedy generation:
//! - [`Llama::forward`] attends through one [`AttnCache`] per layer (attn's paged cache in the
//!   example);
//! - [`Llama::forward_plain`] attends with plain candle ops (matmul, softmax) over a concatenated
//!   KV cache ([`PlainCache`]): the baseline the example compares tokens and speed against.

use crate::cache::AttnCache;
use crate::decoder::{DecoderAttention, DecoderAttentionConfig, Rotary};
use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{embedding, linear_no_bias, rms_norm, Embedding, Linear, RmsNorm, VarBuilder};

/// Sizes of a [`Llama`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate: usize,
    /// Decoder blocks.
    pub layers: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads (GQA).
    pub heads_kv: usize,
    /// Head dim.
    pub head_dim: usize,
    /// Rotary base θ.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// Positions the rotary tables cover (prompt plus generated tokens).
    pub max_positions: usize,
    /// The LM head shares the embedding matrix (no `lm_head.weight`).
    pub tie_embeddings: bool,
}

impl LlamaConfig {
    /// A small model that runs in seconds on a CPU: 4 layers, width 512, 8 query heads and 2 kv
    /// heads of 64, vocabulary 1024.
    pub fn small() -> Self {
        LlamaConfig {
            vocab: 1024,
            hidden: 512,
            intermediate: 1408,
            layers: 4,
            heads_q: 8,
            heads_kv: 2,
            head_dim: 64,
            rope_theta: 10_000.0,
            rms_eps: 1e-5,
            max_positions: 4096,
            tie_embeddings: false,
        }
    }

    /// Llama 3.2 1B's shapes: 16 layers, width 2048, 32 query heads and 8 kv heads of 64, SwiGLU
    /// width 8192, vocabulary 128 256, θ = 500 000, tied embeddings.
    pub fn llama_1b() -> Self {
        LlamaConfig {
            vocab: 128_256,
            hidden: 2048,
            intermediate: 8192,
            layers: 16,
            heads_q: 32,
            heads_kv: 8,
            head_dim: 64,
            rope_theta: 500_000.0,
            rms_eps: 1e-5,
            max_positions: 8192,
            tie_embeddings: true,
        }
    }
}

struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = candle_nn::ops::silu(&self.gate.forward(x)?)?;
        self.down.forward(&(g * self.up.forward(x)?)?)
    }
}

struct Block {
    attn: DecoderAttention,
    mlp: Mlp,
    input_norm: RmsNorm,
    post_norm: RmsNorm,
}

/// A Llama-architecture decoder; see the module doc.
pub struct Llama {
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rotary: Rotary,
    cfg: LlamaConfig,
}

/// Per layer, the keys and values so far `[B, T, Hkv, D]`, concatenated step by step: the plain
/// candle baseline's cache.
#[derive(Debug, Default)]
pub struct PlainCache {
    kv: Vec<Option<(Tensor, Tensor)>>,
}

impl PlainCache {
    /// An empty cache for `layers` layers.
    pub fn new(layers: usize) -> Self {
        PlainCache {
            kv: vec![None; layers],
        }
    }
}

/// Softmax attention with plain candle ops: `q` `[B, N, Hq, D]` over `k`, `v` `[B, T, Hkv, D]`
/// (GQA by repeating kv heads), bottom-right causal (query `i` sees keys `j ≤ i + T − N`), scale
/// `1/√D`. Returns `[B, N, Hq, D]`.
pub fn plain_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (b, n, hq, d) = q.dims4()?;
    let (_, t, hkv, _) = k.dims4()?;
    let g = hq / hkv.max(1);
    let repeat = |x: &Tensor| -> Result<Tensor> {
        // [B, T, Hkv, D] → [B, Hq, T, D], kv head h/g for query head h.
        x.transpose(1, 2)?
            .unsqueeze(2)?
            .expand((b, hkv, g, t, d))?
            .reshape((b, hq, t, d))
    };
    let q = q.transpose(1, 2)?.contiguous()?;
    let (k, v) = (repeat(k)?.contiguous()?, repeat(v)?.contiguous()?);
    let scores = (q.matmul(&k.t()?)? * (1.0 / (d as f64).sqrt()))?;
    let scores = if n > 1 {
        let mask: Vec<f32> = (0..n)
            .flat_map(|i| (0..t).map(move |j| if j + n > i + t { f32::NEG_INFINITY } else { 0.0 }))
            .collect();
        let mask = Tensor::from_vec(mask, (n, t), q.device())?.to_dtype(scores.dtype())?;
        scores.broadcast_add(&mask)?
    } else {
        scores
    };
    let w = candle_nn::ops::softmax_last_dim(&scores)?;
    w.matmul(&v)?.transpose(1, 2)
}

impl Llama {
    /// The model of `cfg` with its weights from (or created in) `vb`, under the Llama names.
    pub fn new(cfg: LlamaConfig, vb: VarBuilder) -> Result<Self> {
        let rotary = Rotary::new(
            cfg.head_dim,
            cfg.max_positions,
            cfg.rope_theta,
            vb.dtype(),
            vb.device(),
        )?;
        let m = vb.pp("model");
        let embed = embedding(cfg.vocab, cfg.hidden, m.pp("embed_tokens"))?;
        let attn_cfg = DecoderAttentionConfig {
            hidden: cfg.hidden,
            heads_q: cfg.heads_q,
            heads_kv: cfg.heads_kv,
            head_dim: cfg.head_dim,
        };
        let blocks = (0..cfg.layers)
            .map(|i| {
                let l = m.pp(format!("layers.{i}"));
                let mlp = l.pp("mlp");
                Ok(Block {
                    attn: DecoderAttention::new(attn_cfg, rotary.clone(), l.pp("self_attn"))?,
                    mlp: Mlp {
                        gate: linear_no_bias(cfg.hidden, cfg.intermediate, mlp.pp("gate_proj"))?,
                        up: linear_no_bias(cfg.hidden, cfg.intermediate, mlp.pp("up_proj"))?,
                        down: linear_no_bias(cfg.intermediate, cfg.hidden, mlp.pp("down_proj"))?,
                    },
                    input_norm: rms_norm(cfg.hidden, cfg.rms_eps, l.pp("input_layernorm"))?,
                    post_norm: rms_norm(cfg.hidden, cfg.rms_eps, l.pp("post_attention_layernorm"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = rms_norm(cfg.hidden, cfg.rms_eps, m.pp("norm"))?;
        let lm_head = if cfg.tie_embeddings {
            Linear::new(embed.embeddings().clone(), None)
        } else {
            linear_no_bias(cfg.hidden, cfg.vocab, vb.pp("lm_head"))?
        };
        Ok(Llama {
            embed,
            blocks,
            norm,
            lm_head,
            rotary,
            cfg,
        })
    }

    /// The model's sizes.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The rotary tables (for [`Rotary::positions`]).
    pub fn rotary(&self) -> &Rotary {
        &self.rotary
    }

    fn run(
        &self,
        tokens: &Tensor,
        mut attend: impl FnMut(usize, &DecoderAttention, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let mut x = self.embed.forward(tokens)?;
        for (i, block) in self.blocks.iter().enumerate() {
            let h = attend(i, &block.attn, &block.input_norm.forward(&x)?)?;
            x = (x + h)?;
            let h = block.mlp.forward(&block.post_norm.forward(&x)?)?;
            x = (x + h)?;
        }
        let n = x.dim(1)?;
        let last = self.norm.forward(&x.narrow(1, n - 1, 1)?)?;
        self.lm_head.forward(&last)?.squeeze(1)
    }

    /// Logits of the last token `[B, vocab]` for `tokens` `[B, N]` (u32) at `positions` `[B, N]`,
    /// attending through `caches` (one per layer; prefill with the prompt, then one token per
    /// call).
    pub fn forward(
        &self,
        tokens: &Tensor,
        caches: &mut [&mut dyn AttnCache],
        positions: &Tensor,
    ) -> Result<Tensor> {
        if caches.len() != self.blocks.len() {
            candle_core::bail!(
                "{} caches for a model of {} layers",
                caches.len(),
                self.blocks.len()
            );
        }
        self.run(tokens, |i, attn, x| attn.forward(x, &mut *caches[i], positions))
    }

    /// [`Llama::forward`] with plain candle attention ([`plain_attention`]) over `cache`.
    pub fn forward_plain(
        &self,
        tokens: &Tensor,
        cache: &mut PlainCache,
        positions: &Tensor,
    ) -> Result<Tensor> {
        if cache.kv.len() != self.blocks.len() {
            candle_core::bail!(
                "a plain cache of {} layers for a model of {}",
                cache.kv.len(),
                self.blocks.len()
            );
        }
        self.run(tokens, |i, attn, x| {
            let (q, k, v) = attn.qkv(x, positions)?;
            let (k, v) = match cache.kv[i].take() {
                Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 1)?, Tensor::cat(&[&pv, &v], 1)?),
                None => (k, v),
            };
            let o = plain_attention(&q, &k, &v)?;
            cache.kv[i] = Some((k, v));
            attn.project_out(&o)
        })
    }
}

/// The tokens of a greedy generation and the time its two phases took.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    /// The generated tokens (the prompt not included).
    pub tokens: Vec<u32>,
    /// Seconds of the prefill (the prompt in one forward, through the first token).
    pub prefill_s: f64,
    /// Seconds of the decode steps (one forward per further token).
    pub decode_s: f64,
}

/// Greedy generation of `n` tokens after `prompt` (one sequence), through attn's
/// [`PagedKvCache`](crate::PagedKvCache) (pages of `page_size`, softmax with `1/√D`), one per layer.
pub fn generate_paged(model: &Llama, prompt: &[u32], n: usize, page_size: usize) -> Result<Generated> {
    let cfg = model.config();
    let dev = model.embed.embeddings().device().clone();
    let dtype = model.embed.embeddings().dtype();
    let pages = (prompt.len() + n).div_ceil(page_size);
    let mut caches = (0..cfg.layers)
        .map(|_| {
            crate::PagedKvCache::new(
                1,
                page_size,
                pages,
                cfg.heads_kv,
                cfg.head_dim,
                dtype,
                &dev,
                crate::KvAttnOptions::softmax(None),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let mut step = |tokens: &[u32]| -> Result<u32> {
        let start = caches[0].lens()[0];
        let positions = model.rotary().positions(&[start], tokens.len(), &dev)?;
        let t = Tensor::new(tokens, &dev)?.unsqueeze(0)?;
        let mut refs: Vec<&mut dyn AttnCache> = caches.iter_mut().map(|c| c as &mut dyn AttnCache).collect();
        let logits = model.forward(&t, &mut refs, &positions)?;
        Ok(greedy(&logits)?[0])
    };
    run_greedy(&dev, prompt, n, &mut step)
}

/// Greedy generation of `n` tokens after `prompt` with plain candle attention
/// ([`Llama::forward_plain`]).
pub fn generate_plain(model: &Llama, prompt: &[u32], n: usize) -> Result<Generated> {
    let dev = model.embed.embeddings().device().clone();
    let mut cache = PlainCache::new(model.config().layers);
    let mut pos = 0;
    let mut step = |tokens: &[u32]| -> Result<u32> {
        let positions = model.rotary().positions(&[pos], tokens.len(), &dev)?;
        pos += tokens.len();
        let t = Tensor::new(tokens, &dev)?.unsqueeze(0)?;
        let logits = model.forward_plain(&t, &mut cache, &positions)?;
        Ok(greedy(&logits)?[0])
    };
    run_greedy(&dev, prompt, n, &mut step)
}

fn run_greedy(
    dev: &Device,
    prompt: &[u32],
    n: usize,
    step: &mut dyn FnMut(&[u32]) -> Result<u32>,
) -> Result<Generated> {
    if prompt.is_empty() || n == 0 {
        candle_core::bail!("generation needs a prompt and at least one token to generate");
    }
    synchronize(dev)?;
    let t0 = std::time::Instant::now();
    let mut tokens = vec![step(prompt)?];
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = std::time::Instant::now();
    while tokens.len() < n {
        let last = tokens[tokens.len() - 1];
        tokens.push(step(&[last])?);
    }
    synchronize(dev)?;
    Ok(Generated {
        tokens,
        prefill_s,
        decode_s: t1.elapsed().as_secs_f64(),
    })
}

/// Greedy tokens from `[B, vocab]` logits, on the host.
pub fn greedy(logits: &Tensor) -> Result<Vec<u32>> {
    logits.to_dtype(DType::F32)?.argmax(D::Minus1)?.to_vec1::<u32>()
}

/// Wait for the device's queued work (CUDA), so a host clock measures it.
pub fn synchronize(device: &Device) -> Result<()> {
    device.synchronize()
}
