//! [`DecoderAttention`]: the attention block of a decoder for generation (q/k/v/o projections,
//! rotary embeddings at given positions, GQA), attending through an [`AttnCache`].

use crate::cache::AttnCache;
use crate::error::{describe, to_candle};
use attn_core::{AttnError, FamilyKind, Op, Pass};
use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{linear_no_bias, Linear, VarBuilder};

fn invalid(arg: &'static str, reason: String) -> candle_core::Error {
    to_candle(AttnError::InvalidArgument {
        op: Op::new(FamilyKind::Softmax, Pass::Spec),
        arg,
        reason,
    })
}

/// Rotary position embeddings (RoFormer; the half-split form Llama checkpoints use): the pair
/// `(x_i, x_{i+D/2})` of a head is rotated by the angle `p·θ^(−2i/D)` at position `p`.
#[derive(Clone, Debug)]
pub struct Rotary {
    /// `[max_positions, D/2]`.
    cos: Tensor,
    sin: Tensor,
}

impl Rotary {
    /// Tables for positions `0 .. max_positions` of heads of `head_dim` (even) with base `theta`
    /// (Llama: 10 000 or 500 000), in `dtype` on `device`.
    pub fn new(
        head_dim: usize,
        max_positions: usize,
        theta: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(invalid(
                "head_dim",
                format!("rotary embeddings need an even head dim, not {head_dim}"),
            ));
        }
        let half = head_dim / 2;
        let inv: Vec<f32> = (0..half)
            .map(|i| (1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)) as f32)
            .collect();
        let inv = Tensor::from_vec(inv, (1, half), device)?;
        let pos = Tensor::arange(0u32, max_positions as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((max_positions, 1))?;
        let angles = pos.broadcast_mul(&inv)?;
        Ok(Rotary {
            cos: angles.cos()?.to_dtype(dtype)?,
            sin: angles.sin()?.to_dtype(dtype)?,
        })
    }

    /// Positions the tables cover.
    pub fn max_positions(&self) -> usize {
        self.cos.dims()[0]
    }

    /// Rotate `x` `[B, N, H, D]` at `positions` `[B, N]` (u32, each below
    /// [`Rotary::max_positions`]).
    pub fn apply(&self, x: &Tensor, positions: &Tensor) -> Result<Tensor> {
        let (b, n, _, _) = x.dims4()?;
        if positions.dims() != [b, n] {
            return Err(to_candle(AttnError::ShapeMismatch {
                op: Op::new(FamilyKind::Softmax, Pass::Spec),
                what: "positions".into(),
                expected: format!("[{b}, {n}] for x {:?}", x.dims()),
                got: describe("positions", positions),
            }));
        }
        let idx = positions.flatten_all()?;
        let half = self.cos.dims()[1];
        let cos = self.cos.index_select(&idx, 0)?.reshape((b, n, half))?;
        let sin = self.sin.index_select(&idx, 0)?.reshape((b, n, half))?;
        candle_nn::rotary_emb::rope_thd(&x.contiguous()?, &cos, &sin)
    }

    /// Positions `start[b] .. start[b] + n` of each sequence as a `[B, n]` u32 tensor on `device`;
    /// an `InvalidArgument` error names `positions` when one reaches [`Rotary::max_positions`].
    pub fn positions(&self, start: &[usize], n: usize, device: &Device) -> Result<Tensor> {
        let max = self.max_positions();
        let mut p = Vec::with_capacity(start.len() * n);
        for &s in start {
            let end = s.checked_add(n).filter(|&e| e <= max).ok_or_else(|| {
                invalid(
                    "positions",
                    format!("positions {s}..{s}+{n} exceed the rotary tables' {max} positions"),
                )
            })?;
            p.extend((s..end).map(|x| x as u32));
        }
        Tensor::from_vec(p, (start.len(), n), device)
    }
}

/// Sizes of a [`DecoderAttention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecoderAttentionConfig {
    /// Width of the layer's input and output.
    pub hidden: usize,
    /// Query heads (Hq).
    pub heads_q: usize,
    /// Key/value heads; `heads_q` must be a multiple (GQA).
    pub heads_kv: usize,
    /// Head dim of q, k and v (even, for the rotary embeddings).
    pub head_dim: usize,
}

/// The attention block of a decoder for generation: `q = x W_qᵀ`, `k = x W_kᵀ`, `v = x W_vᵀ`
/// (`[B, N, Hq|Hkv, D]`), rotary embeddings on q and k at the tokens' positions, the cache's
/// `append_and_attend` (prefill: the prompt's N tokens at once; decode: one), and `y = o W_oᵀ`.
/// Weights (no biases) under Llama's names: `q_proj`, `k_proj`, `v_proj`, `o_proj`.
///
/// ```
/// use attn_candle::{AttnCache, DecoderAttention, DecoderAttentionConfig, KvAttnOptions, PagedKvCache, Rotary};
/// use candle_core::{DType, Device, Tensor};
/// use candle_nn::{VarBuilder, VarMap};
/// let dev = Device::Cpu;
/// let cfg = DecoderAttentionConfig { hidden: 32, heads_q: 4, heads_kv: 2, head_dim: 8 };
/// let vm = VarMap::new();
/// let rotary = Rotary::new(8, 64, 10_000.0, DType::F32, &dev)?;
/// let layer = DecoderAttention::new(cfg, rotary.clone(), VarBuilder::from_varmap(&vm, DType::F32, &dev))?;
/// let mut cache = PagedKvCache::new(1, 16, 2, 2, 8, DType::F32, &dev, KvAttnOptions::softmax(None))?;
/// let prompt = Tensor::randn(0f32, 1.0, (1, 5, 32), &dev)?;
/// let y = layer.forward(&prompt, &mut cache, &rotary.positions(&[0], 5, &dev)?)?;
/// let next = Tensor::randn(0f32, 1.0, (1, 1, 32), &dev)?;
/// let pos = rotary.positions(cache.lens(), 1, &dev)?; // position 5
/// let y1 = layer.forward(&next, &mut cache, &pos)?;
/// assert_eq!((y.dims(), y1.dims(), cache.lens()), (&[1, 5, 32][..], &[1, 1, 32][..], &[6][..]));
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct DecoderAttention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    rotary: Rotary,
    cfg: DecoderAttentionConfig,
}

impl DecoderAttention {
    /// The layer of `cfg` with `rotary`'s tables, its weights taken from (or created in) `vb`. An
    /// `InvalidArgument` error names `heads_kv` when `heads_q` is not a multiple of it.
    pub fn new(cfg: DecoderAttentionConfig, rotary: Rotary, vb: VarBuilder) -> Result<Self> {
        if cfg.heads_kv == 0 || cfg.heads_q % cfg.heads_kv != 0 {
            return Err(invalid(
                "heads_kv",
                format!(
                    "heads_q ({}) is not a multiple of heads_kv ({})",
                    cfg.heads_q, cfg.heads_kv
                ),
            ));
        }
        if rotary.cos.dims()[1] * 2 != cfg.head_dim {
            return Err(invalid(
                "rotary",
                format!(
                    "tables for head dim {}, the layer's is {}",
                    rotary.cos.dims()[1] * 2,
                    cfg.head_dim
                ),
            ));
        }
        let (q_dim, kv_dim) = (cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim);
        Ok(DecoderAttention {
            q_proj: linear_no_bias(cfg.hidden, q_dim, vb.pp("q_proj"))?,
            k_proj: linear_no_bias(cfg.hidden, kv_dim, vb.pp("k_proj"))?,
            v_proj: linear_no_bias(cfg.hidden, kv_dim, vb.pp("v_proj"))?,
            o_proj: linear_no_bias(q_dim, cfg.hidden, vb.pp("o_proj"))?,
            rotary,
            cfg,
        })
    }

    /// The layer's sizes.
    pub fn config(&self) -> &DecoderAttentionConfig {
        &self.cfg
    }

    /// q `[B, N, Hq, D]`, k and v `[B, N, Hkv, D]` of `x` `[B, N, hidden]`, q and k rotated at
    /// `positions` `[B, N]` (u32).
    pub fn qkv(&self, x: &Tensor, positions: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let cfg = &self.cfg;
        let (b, n) = match *x.dims() {
            [b, n, h] if h == cfg.hidden => (b, n),
            _ => {
                return Err(to_candle(AttnError::ShapeMismatch {
                    op: Op::new(FamilyKind::Softmax, Pass::Spec),
                    what: "x".into(),
                    expected: format!("[batch, seq, {}]", cfg.hidden),
                    got: describe("x", x),
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
        Ok((
            self.rotary.apply(&q, positions)?,
            self.rotary.apply(&k, positions)?,
            v,
        ))
    }

    /// The output projection of the attention's o `[B, N, Hq, D]`: `[B, N, hidden]`.
    pub fn project_out(&self, o: &Tensor) -> Result<Tensor> {
        let (b, n, _, _) = o.dims4()?;
        self.o_proj
            .forward(&o.reshape((b, n, self.cfg.heads_q * self.cfg.head_dim))?)
    }

    /// Prefill (N tokens) or decode (one) through `cache`: `x` `[B, N, hidden]` at `positions`
    /// `[B, N]` (u32; usually `cache.lens()[b] ..`, see [`Rotary::positions`]) → `[B, N, hidden]`.
    pub fn forward(&self, x: &Tensor, cache: &mut dyn AttnCache, positions: &Tensor) -> Result<Tensor> {
        let (q, k, v) = self.qkv(x, positions)?;
        let o = cache.append_and_attend(&q, &k, &v)?;
        self.project_out(&o)
    }
}
