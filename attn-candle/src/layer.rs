//! [`MultiHeadAttention`]: a multi-head attention layer over any family, built from a `VarBuilder`.

use crate::api::{attention, AttnOptions};
use crate::error::to_candle;
use attn_core::{shape_str, AttnError, Causal, Family, Op, Pass};
use candle_core::{Module, Result, Tensor};
use candle_nn::{linear_no_bias, Init, Linear, VarBuilder};

/// Initialisation of a fresh `W_q` (see [`MultiHeadAttention`]).
const Q_INIT: Init = Init::Randn {
    mean: 0.0,
    stdev: 0.02,
};

/// Sizes, family and mask of a [`MultiHeadAttention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionConfig {
    /// Width of the layer's input and output.
    pub hidden: usize,
    /// Query heads (Hq).
    pub heads_q: usize,
    /// Key/value heads; `heads_q` must be a multiple (GQA; 1 is MQA).
    pub heads_kv: usize,
    /// Head dim (D) of q, k and v; `hidden` need not equal `heads_q · head_dim`.
    pub head_dim: usize,
    /// The attention family and its parameters.
    pub family: Family,
    /// Causal mask ([`Causal::BottomRight`] and [`Causal::TopLeft`] agree here: q and k have the
    /// same length).
    pub causal: Causal,
}

/// Multi-head attention with q/k/v/o projections, over any family.
///
/// For `x` `[B, N, hidden]`: `q = x W_qᵀ` viewed as `[B, N, Hq, D]`, `k = x W_kᵀ` and `v = x W_vᵀ`
/// as `[B, N, Hkv, D]` (GQA when `Hkv < Hq`), `o = attention(q, k, v)` with the layer's family and
/// causal mask, and `y = o W_oᵀ` `[B, N, hidden]`. Weights (no biases): `q_proj` `[Hq·D, hidden]`,
/// `k_proj` and `v_proj` `[Hkv·D, hidden]`, `o_proj` `[hidden, Hq·D]`, the names candle-transformers
/// models use.
///
/// Fresh weights (a `VarBuilder` that creates variables): `W_q ~ N(0, 0.02²)`, the others candle's
/// default Kaiming-uniform. A small query projection starts every family's attention near uniform
/// (μP initialises `W_q` to zero; a small nonzero scale keeps the l2-normalising families away from
/// the singular gradient of `q/‖q‖` at `q = 0`), which shortens the plateau before attention
/// learns to retrieve.
///
/// ```
/// use attn_candle::{AttentionConfig, Causal, Family, MultiHeadAttention};
/// use candle_core::{DType, Device, Module, Tensor};
/// use candle_nn::{VarBuilder, VarMap};
/// let cfg = AttentionConfig {
///     hidden: 32,
///     heads_q: 4,
///     heads_kv: 2,
///     head_dim: 8,
///     family: Family::taylor(2),
///     causal: Causal::BottomRight,
/// };
/// let vm = VarMap::new();
/// let layer = MultiHeadAttention::new(cfg, VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu))?;
/// let x = Tensor::randn(0f32, 1.0, (2, 5, 32), &Device::Cpu)?;
/// assert_eq!(layer.forward(&x)?.dims(), &[2, 5, 32]);
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct MultiHeadAttention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    cfg: AttentionConfig,
}

impl MultiHeadAttention {
    /// The layer of `cfg`, its weights taken from (or created in) `vb`. An `InvalidArgument` error
    /// names `heads_kv` when `heads_q` is not a multiple of it.
    pub fn new(cfg: AttentionConfig, vb: VarBuilder) -> Result<Self> {
        let op = Op::new(cfg.family.kind(), Pass::Spec);
        if cfg.heads_kv == 0 || cfg.heads_q % cfg.heads_kv != 0 {
            return Err(to_candle(AttnError::InvalidArgument {
                op,
                arg: "heads_kv",
                reason: format!(
                    "heads_q ({}) is not a multiple of heads_kv ({})",
                    cfg.heads_q, cfg.heads_kv
                ),
            }));
        }
        let (q_dim, kv_dim) = (cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim);
        Ok(MultiHeadAttention {
            q_proj: Linear::new(
                vb.pp("q_proj")
                    .get_with_hints((q_dim, cfg.hidden), "weight", Q_INIT)?,
                None,
            ),
            k_proj: linear_no_bias(cfg.hidden, kv_dim, vb.pp("k_proj"))?,
            v_proj: linear_no_bias(cfg.hidden, kv_dim, vb.pp("v_proj"))?,
            o_proj: linear_no_bias(q_dim, cfg.hidden, vb.pp("o_proj"))?,
            cfg,
        })
    }

    /// The layer's sizes, family and mask.
    pub fn config(&self) -> &AttentionConfig {
        &self.cfg
    }

    /// The forward pass where batch entry `b` attends only to its first `key_lens[b]` tokens
    /// (right padding); `None` attends to all.
    pub fn forward_with_key_lens(&self, x: &Tensor, key_lens: Option<Vec<usize>>) -> Result<Tensor> {
        let cfg = &self.cfg;
        let (b, n) = match *x.dims() {
            [b, n, h] if h == cfg.hidden => (b, n),
            _ => {
                return Err(to_candle(AttnError::ShapeMismatch {
                    op: Op::new(cfg.family.kind(), Pass::Forward),
                    what: "x".into(),
                    expected: format!("[batch, seq, {}]", cfg.hidden),
                    got: shape_str(x.dims()),
                }))
            }
        };
        let q = self
            .q_proj
            .forward(x)?
            .reshape((b, n, cfg.heads_q, cfg.head_dim))?;
        let k = self
            .k_proj
            .forward(x)?
            .reshape((b, n, cfg.heads_kv, cfg.head_dim))?;
        let v = self
            .v_proj
            .forward(x)?
            .reshape((b, n, cfg.heads_kv, cfg.head_dim))?;
        let mut opts = AttnOptions::new(cfg.family).with_causal(cfg.causal);
        if let Some(lens) = key_lens {
            opts = opts.with_key_lens(lens);
        }
        let o = attention(&q, &k, &v, &opts)?;
        self.o_proj
            .forward(&o.reshape((b, n, cfg.heads_q * cfg.head_dim))?)
    }
}

impl Module for MultiHeadAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with_key_lens(x, None)
    }
}
