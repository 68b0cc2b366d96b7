//! `candle_naive`: each family written as plain candle ops, the way a user would without a fused
//! kernel. Tensors are `[B, H, N, D]` (kv heads repeated for GQA); the full score matrix
//! `S = scale · Q Kᵀ  [B, H, Nq, Nk]` is materialised, so memory is O(N²).
//!
//! - softmax: `O = softmax(S (+ mask)) V` (optional softcap `c·tanh(S/c)`);
//! - cosine-sim: `q̂ = q / max(‖q‖, ε)`, `k̂` likewise, then softmax of `scale · Q̂ K̂ᵀ`;
//! - Taylor: `W = a0 + a1·S + a2·S²` (times the 0/1 mask), `O = W V / rowsum(W)`;
//! - hyperbolic: `⟨q,k⟩_L = q·k − q0 k0` with `x0 = √(1/c + ‖x‖²)`, then `S = 2β/c + 2β⟨q,k⟩_L`
//!   (squared Lorentz) or `S = −β·arccosh(max(−c⟨q,k⟩_L, 1 + ε))/√c` (geodesic), softmax, `O = P V`.
//!
//! The mask is built from [`AttnSpec::key_range`] (additive −∞ for the softmax-like families, a 0/1
//! factor for Taylor). The forward-only pass uses candle's fused `softmax_last_dim`; passes with a
//! backward use the composite `candle_nn::ops::softmax` that autograd can differentiate, and take
//! `dL/d(q, k, v)` of `L = Σ O ⊙ dO` through `Tensor::backward`. Key padding, packed batches, a bias
//! and Einstein-midpoint aggregation are not written here: those points are skipped with the reason.

use super::Runner;
use crate::error::BenchError;
use crate::grid::PassKind;
use attn_core::{Aggregation, AttnError, AttnSpec, FamilySpec, HypScore, Pass, SeqLengths, ACOSH_EPS};
use attn_cpu_ref::testing::random_case;
use candle_core::{DType as CDType, Device, Tensor, Var, D};
use std::hint::black_box;

fn unsupported(spec: &AttnSpec, what: &str) -> BenchError {
    BenchError::Attn(AttnError::Unsupported {
        op: spec.op(Pass::Forward),
        backend: "candle_naive",
        what: what.into(),
    })
}

/// The candle dtype of a storage dtype.
pub fn candle_dtype(dtype: attn_core::DType) -> CDType {
    match dtype {
        attn_core::DType::F32 => CDType::F32,
        attn_core::DType::F16 => CDType::F16,
        attn_core::DType::BF16 => CDType::BF16,
    }
}

/// The naive composite for one spec: the mask and the family, ready to apply to q, k, v.
pub struct Composite {
    family: FamilySpec,
    group: usize,
    /// `[Nq, Nk]`: additive (0 / −∞) for softmax-like families, multiplicative (1 / 0) for Taylor.
    mask: Option<Tensor>,
}

impl Composite {
    pub fn new(spec: &AttnSpec, device: &Device) -> Result<Self, BenchError> {
        if !matches!(spec.lengths(), SeqLengths::Dense) {
            return Err(unsupported(spec, "key padding or packed variable-length batches"));
        }
        if spec.bias().is_some() {
            return Err(unsupported(spec, "an additive bias"));
        }
        if let FamilySpec::Hyperbolic {
            aggregation: Aggregation::EinsteinMidpoint,
            ..
        } = spec.family()
        {
            return Err(unsupported(spec, "Einstein-midpoint aggregation"));
        }
        let (nq, nk) = (spec.seq_q(), spec.seq_k());
        let masked = (0..nq).any(|i| spec.key_range(0, i) != (0..nk));
        let mask = if masked {
            let additive = spec.family().is_softmax_like();
            let mut m = vec![0f32; nq * nk];
            for i in 0..nq {
                let allowed = spec.key_range(0, i);
                for (j, x) in m[i * nk..(i + 1) * nk].iter_mut().enumerate() {
                    *x = match (allowed.contains(&j), additive) {
                        (true, true) => 0.0,
                        (false, true) => f32::NEG_INFINITY,
                        (true, false) => 1.0,
                        (false, false) => 0.0,
                    };
                }
            }
            let m = Tensor::from_vec(m, (nq, nk), device)?.to_dtype(candle_dtype(spec.dtype()))?;
            Some(m)
        } else {
            None
        };
        Ok(Composite {
            family: *spec.family(),
            group: spec.group(),
            mask,
        })
    }

    /// `o [B, Hq, Nq, Dv]` from `q [B, Hq, Nq, D]`, `k [B, Hkv, Nk, D]`, `v [B, Hkv, Nk, Dv]`.
    /// `differentiable` picks the softmax autograd can go through.
    pub fn forward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        differentiable: bool,
    ) -> candle_core::Result<Tensor> {
        let (k, v) = (repeat_kv(k, self.group)?, repeat_kv(v, self.group)?);
        let softmax = |s: &Tensor| {
            if differentiable {
                candle_nn::ops::softmax(s, D::Minus1)
            } else {
                candle_nn::ops::softmax_last_dim(s)
            }
        };
        let masked = |s: Tensor| match &self.mask {
            Some(m) => s.broadcast_add(m),
            None => Ok(s),
        };
        match self.family {
            FamilySpec::Softmax { scale, softcap } => {
                let mut s = q.matmul(&k.t()?)?.affine(scale as f64, 0.0)?;
                if let Some(c) = softcap {
                    let c = c as f64;
                    s = s.affine(1.0 / c, 0.0)?.tanh()?.affine(c, 0.0)?;
                }
                softmax(&masked(s)?)?.matmul(&v)
            }
            FamilySpec::CosineSim {
                scale,
                qk_l2norm,
                eps,
            } => {
                let (q, k) = if qk_l2norm {
                    (l2_normalise(q, eps)?, l2_normalise(&k, eps)?)
                } else {
                    (q.clone(), k)
                };
                let s = q.matmul(&k.t()?)?.affine(scale as f64, 0.0)?;
                softmax(&masked(s)?)?.matmul(&v)
            }
            FamilySpec::Taylor {
                a,
                scale,
                qk_l2norm,
                eps,
                ..
            } => {
                let (q, k) = if qk_l2norm {
                    (l2_normalise(q, eps)?, l2_normalise(&k, eps)?)
                } else {
                    (q.clone(), k)
                };
                let s = q.matmul(&k.t()?)?.affine(scale as f64, 0.0)?;
                // W = a0 + a1·S + a2·S² (a2 = 0 for order 1).
                let mut w = s.affine(a[1] as f64, a[0] as f64)?;
                if a[2] != 0.0 {
                    w = (w + s.sqr()?.affine(a[2] as f64, 0.0)?)?;
                }
                if let Some(m) = &self.mask {
                    w = w.broadcast_mul(m)?;
                }
                w.matmul(&v)?.broadcast_div(&w.sum_keepdim(D::Minus1)?)
            }
            FamilySpec::Hyperbolic {
                score,
                curvature,
                beta,
                ..
            } => {
                let (c, beta) = (curvature as f64, beta as f64);
                let time = |x: &Tensor| x.sqr()?.sum_keepdim(D::Minus1)?.affine(1.0, 1.0 / c)?.sqrt();
                // ⟨q,k⟩_L = q·k − q0 k0   [B, H, Nq, Nk]
                let lorentz = (q.matmul(&k.t()?)? - time(q)?.matmul(&time(&k)?.t()?)?)?;
                let s = match score {
                    HypScore::SquaredLorentz => lorentz.affine(2.0 * beta, 2.0 * beta / c)?,
                    HypScore::Geodesic => {
                        let z = lorentz.affine(-c, 0.0)?.maximum(1.0 + ACOSH_EPS)?;
                        // arccosh(z) = ln(z + √(z² − 1))
                        let acosh = (&z + z.sqr()?.affine(1.0, -1.0)?.sqrt()?)?.log()?;
                        acosh.affine(-beta / c.sqrt(), 0.0)?
                    }
                };
                softmax(&masked(s)?)?.matmul(&v)
            }
        }
    }
}

/// `[B, Hkv, N, D]` → `[B, Hkv·group, N, D]`, each kv head repeated for its query heads.
fn repeat_kv(x: &Tensor, group: usize) -> candle_core::Result<Tensor> {
    if group == 1 {
        return Ok(x.clone());
    }
    let (b, h, n, d) = x.dims4()?;
    x.unsqueeze(2)?
        .expand((b, h, group, n, d))?
        .reshape((b, h * group, n, d))
}

/// `x / max(‖x‖, eps)` over the last dim.
fn l2_normalise(x: &Tensor, eps: f32) -> candle_core::Result<Tensor> {
    let norm = x.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?.maximum(eps as f64)?;
    x.broadcast_div(&norm)
}

/// A spec-layout f64 buffer as a `[B, H, N, D]` tensor of the spec's dtype.
fn to_bhnd(
    spec: &AttnSpec,
    data: Vec<f64>,
    heads: usize,
    seq: usize,
    dim: usize,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let t = match spec.layout() {
        attn_core::Layout::Bnhd => {
            Tensor::from_vec(data, (spec.batch(), seq, heads, dim), device)?.transpose(1, 2)?
        }
        attn_core::Layout::Bhnd => Tensor::from_vec(data, (spec.batch(), heads, seq, dim), device)?,
    };
    t.contiguous()?.to_dtype(candle_dtype(spec.dtype()))
}

struct CandleRunner {
    composite: Composite,
    pass: PassKind,
    q: Var,
    k: Var,
    v: Var,
    d_o: Tensor,
    /// `L = Σ O ⊙ dO` with its graph, kept for a backward-only pass.
    loss: Option<Tensor>,
}

impl CandleRunner {
    fn loss(&self) -> candle_core::Result<Tensor> {
        let o = self.composite.forward(&self.q, &self.k, &self.v, true)?;
        (o * &self.d_o)?.sum_all()
    }
}

impl Runner for CandleRunner {
    fn call(&mut self) -> Result<(), BenchError> {
        match self.pass {
            PassKind::Fwd => {
                // Detached: no graph is recorded for a forward-only pass.
                let (q, k, v) = (
                    self.q.as_detached_tensor(),
                    self.k.as_detached_tensor(),
                    self.v.as_detached_tensor(),
                );
                let o = self.composite.forward(&q, &k, &v, false)?;
                black_box(o);
            }
            PassKind::Bwd => {
                let loss = match &self.loss {
                    Some(l) => l.clone(),
                    None => self.loss()?,
                };
                black_box(loss.backward()?);
            }
            PassKind::FwdBwd => {
                black_box(self.loss()?.backward()?);
            }
        }
        Ok(())
    }
}

pub(super) fn prepare(spec: &AttnSpec, pass: PassKind, seed: u64) -> Result<Box<dyn Runner>, BenchError> {
    let device = Device::Cpu;
    let composite = Composite::new(spec, &device)?;
    if spec.is_varlen() {
        return Err(unsupported(spec, "packed variable-length batches"));
    }
    let case = random_case(spec, seed);
    let (hq, hk) = (spec.heads_q(), spec.heads_kv());
    let (nq, nk) = (spec.seq_q(), spec.seq_k());
    let (d, dv) = (spec.head_dim(), spec.head_dim_v());
    let q = Var::from_tensor(&to_bhnd(spec, case.q, hq, nq, d, &device)?)?;
    let k = Var::from_tensor(&to_bhnd(spec, case.k, hk, nk, d, &device)?)?;
    let v = Var::from_tensor(&to_bhnd(spec, case.v, hk, nk, dv, &device)?)?;
    let d_o = to_bhnd(spec, case.d_o, hq, nq, dv, &device)?;
    let mut r = CandleRunner {
        composite,
        pass,
        q,
        k,
        v,
        d_o,
        loss: None,
    };
    if pass == PassKind::Bwd {
        r.loss = Some(r.loss()?);
    }
    Ok(Box::new(r))
}
