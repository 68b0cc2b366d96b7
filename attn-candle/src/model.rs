//! [`TransformerLm`], a small causal language model around [`MultiHeadAttention`], and
//! [`seeded_var_builder`] for reproducible training runs.

use crate::layer::{AttentionConfig, MultiHeadAttention};
use attn_core::{Causal, Family};
use candle_core::{DType, Device, Module, Result, Shape, Tensor, Var};
use candle_nn::init::NormalOrUniform;
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{
    embedding, layer_norm_no_bias, linear_no_bias, Embedding, Init, LayerNorm, Linear, VarBuilder, VarMap,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Mutex;

/// Sizes and attention family of a [`TransformerLm`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LmConfig {
    /// Token ids `0..vocab`; also the width of the logits.
    pub vocab: usize,
    /// Longest sequence (size of the learned position table).
    pub max_len: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Query heads of each attention layer.
    pub heads_q: usize,
    /// Key/value heads of each attention layer; `heads_q` must be a multiple.
    pub heads_kv: usize,
    /// Head dim of each attention layer.
    pub head_dim: usize,
    /// The attention family of every layer.
    pub family: Family,
    /// Taps `K` of the short convolution before each attention layer (0 or 1: none).
    pub short_conv: usize,
}

/// `Conv(h)_n = h_n + Σ_{1≤s<K} c_s ⊙ h_{n−s}`; see [`TransformerLm`].
#[derive(Clone, Debug)]
struct ShortConv {
    /// `[K − 1, hidden]`: the weights of the taps `s = 1 … K − 1`.
    c: Tensor,
}

impl ShortConv {
    fn new(taps: usize, hidden: usize, vb: VarBuilder) -> Result<Option<Self>> {
        if taps <= 1 {
            return Ok(None);
        }
        let c = vb.get_with_hints((taps - 1, hidden), "weight", Init::Const(1.0))?;
        Ok(Some(ShortConv { c }))
    }

    fn forward(&self, h: &Tensor) -> Result<Tensor> {
        let (b, n, hidden) = h.dims3()?;
        let mut y = h.clone();
        for s in 1..=self.c.dim(0)?.min(n.saturating_sub(1)) {
            let zeros = Tensor::zeros((b, s, hidden), h.dtype(), h.device())?;
            let shifted = Tensor::cat(&[&zeros, &h.narrow(1, 0, n - s)?], 1)?;
            y = (y + shifted.broadcast_mul(&self.c.get(s - 1)?)?)?;
        }
        Ok(y)
    }
}

#[derive(Clone, Debug)]
struct Block {
    norm_attn: LayerNorm,
    conv: Option<ShortConv>,
    attn: MultiHeadAttention,
    norm_mlp: LayerNorm,
    up: Linear,
    down: Linear,
}

impl Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.norm_attn.forward(x)?;
        if let Some(conv) = &self.conv {
            h = conv.forward(&h)?;
        }
        let x = (x + self.attn.forward(&h)?)?;
        let h = self.up.forward(&self.norm_mlp.forward(&x)?)?.gelu()?;
        x + self.down.forward(&h)?
    }
}

/// A small pre-norm causal transformer language model whose every block uses
/// [`MultiHeadAttention`] with the configured family (bottom-right causal).
///
/// `x_0 = E_tok[t] + E_pos[n]`; per block `x ← x + Attn(Conv(LN(x)))`, `x ← x + W_2 gelu(W_1 LN(x))`
/// (`W_1` `[4·hidden, hidden]`); logits `= W_head LN(x)`, `[B, N, vocab]`. The layer norms have no
/// bias (candle-nn's biased layer norm has no backward on contiguous inputs).
///
/// `Conv` is an optional short causal depthwise convolution, `Conv(h)_n = h_n + Σ_{1≤s<K} c_s ⊙ h_{n−s}`
/// (zero before the start, `c` initialised to 0, so it starts as the identity), as in Based and the
/// Zoology recall models: it lets one attention layer match a query against the token *before*
/// each position, instead of first having to learn a previous-token head. It mixes only the last
/// `K` positions, so recall over longer distances is still the attention's job.
#[derive(Clone, Debug)]
pub struct TransformerLm {
    tok: Embedding,
    pos: Embedding,
    blocks: Vec<Block>,
    norm: LayerNorm,
    head: Linear,
    cfg: LmConfig,
}

const NORM_EPS: f64 = 1e-5;

impl TransformerLm {
    /// The model of `cfg`, its weights taken from (or created in) `vb`.
    pub fn new(cfg: LmConfig, vb: VarBuilder) -> Result<Self> {
        let attn = AttentionConfig {
            hidden: cfg.hidden,
            heads_q: cfg.heads_q,
            heads_kv: cfg.heads_kv,
            head_dim: cfg.head_dim,
            family: cfg.family,
            causal: Causal::BottomRight,
        };
        let blocks = (0..cfg.layers)
            .map(|l| {
                let vb = vb.pp(format!("blocks.{l}"));
                Ok(Block {
                    norm_attn: layer_norm_no_bias(cfg.hidden, NORM_EPS, vb.pp("norm_attn"))?,
                    conv: ShortConv::new(cfg.short_conv, cfg.hidden, vb.pp("conv"))?,
                    attn: MultiHeadAttention::new(attn, vb.pp("attn"))?,
                    norm_mlp: layer_norm_no_bias(cfg.hidden, NORM_EPS, vb.pp("norm_mlp"))?,
                    up: linear_no_bias(cfg.hidden, 4 * cfg.hidden, vb.pp("mlp.up"))?,
                    down: linear_no_bias(4 * cfg.hidden, cfg.hidden, vb.pp("mlp.down"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(TransformerLm {
            tok: embedding(cfg.vocab, cfg.hidden, vb.pp("tok"))?,
            pos: embedding(cfg.max_len, cfg.hidden, vb.pp("pos"))?,
            blocks,
            norm: layer_norm_no_bias(cfg.hidden, NORM_EPS, vb.pp("norm"))?,
            head: linear_no_bias(cfg.hidden, cfg.vocab, vb.pp("head"))?,
            cfg,
        })
    }

    /// The model's sizes and family.
    pub fn config(&self) -> &LmConfig {
        &self.cfg
    }
}

impl Module for TransformerLm {
    /// Token ids `[B, N]` (u32, `N ≤ max_len`) → logits `[B, N, vocab]`.
    fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        let n = tokens.dim(1)?;
        let positions = Tensor::arange(0u32, n as u32, tokens.device())?;
        let mut x = self
            .tok
            .forward(tokens)?
            .broadcast_add(&self.pos.forward(&positions)?)?;
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        self.head.forward(&self.norm.forward(&x)?)
    }
}

/// A `VarBuilder` whose new variables are drawn from a `StdRng` seeded with `seed` (candle's own CPU
/// generator cannot be seeded) and stored in `map`, honouring each layer's `Init` hint.
/// Variables already in `map` are returned as they are.
pub fn seeded_var_builder(map: &VarMap, seed: u64, dtype: DType, device: &Device) -> VarBuilder<'static> {
    let backend = Seeded {
        map: map.clone(),
        rng: Mutex::new(StdRng::seed_from_u64(seed)),
    };
    VarBuilder::from_backend(Box::new(backend), dtype, device.clone())
}

struct Seeded {
    map: VarMap,
    rng: Mutex<StdRng>,
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn sample(init: Init, shape: &Shape, rng: &mut StdRng) -> Vec<f32> {
    let n = shape.elem_count();
    let mut draw = |f: &mut dyn FnMut(&mut StdRng) -> f64| (0..n).map(|_| f(rng) as f32).collect();
    match init {
        Init::Const(c) => vec![c as f32; n],
        Init::Randn { mean, stdev } => draw(&mut |r| mean + stdev * normal(r)),
        Init::Uniform { lo, up } => draw(&mut |r| r.random_range(lo..up)),
        Init::Kaiming {
            dist,
            fan,
            non_linearity,
        } => {
            let std = non_linearity.gain() / (fan.for_shape(shape) as f64).sqrt();
            match dist {
                NormalOrUniform::Uniform => {
                    let bound = 3f64.sqrt() * std;
                    draw(&mut |r| r.random_range(-bound..bound))
                }
                NormalOrUniform::Normal => draw(&mut |r| std * normal(r)),
            }
        }
    }
}

impl SimpleBackend for Seeded {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> Result<Tensor> {
        let mut vars = self
            .map
            .data()
            .lock()
            .map_err(|e| candle_core::Error::msg(e.to_string()))?;
        if let Some(var) = vars.get(name) {
            if var.shape() != &s {
                return Err(candle_core::Error::UnexpectedShape {
                    msg: format!("shape mismatch for {name}"),
                    expected: s,
                    got: var.shape().clone(),
                });
            }
            return var.as_tensor().to_dtype(dtype);
        }
        let values = {
            let mut rng = self
                .rng
                .lock()
                .map_err(|e| candle_core::Error::msg(e.to_string()))?;
            sample(h, &s, &mut rng)
        };
        let var = Var::from_tensor(&Tensor::from_vec(values, s, dev)?.to_dtype(dtype)?)?;
        let t = var.as_tensor().clone();
        vars.insert(name.to_string(), var);
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, _dev: &Device) -> Result<Tensor> {
        let vars = self
            .map
            .data()
            .lock()
            .map_err(|e| candle_core::Error::msg(e.to_string()))?;
        match vars.get(name) {
            Some(var) => var.as_tensor().to_dtype(dtype),
            None => Err(candle_core::Error::CannotFindTensor {
                path: name.to_string(),
            }),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.map
            .data()
            .lock()
            .map(|vars| vars.contains_key(name))
            .unwrap_or(false)
    }
}
