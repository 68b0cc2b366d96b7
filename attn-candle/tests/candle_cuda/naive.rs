//! The naive same-dtype baseline of the tolerance `err(op) ≤ 2·err(naive) + atol` (docs/math.md,
//! "Numerics"): attention written as a composite of candle ops on the GPU, in the storage dtype,
//! differentiated by candle's autograd — what a framework computes without a fused kernel
//! (FlashAttention's `attention_ref`).
//!
//! Per batch entry: q, k, v in the storage dtype; the kv heads repeated over their GQA group; scores
//! `S = q kᵀ` by a storage-dtype matmul (f32 accumulate, rounded), then the family's weights in f32
//! over the keys `spec.key_range(b, i)` allows:
//! - softmax-like: `s` (+ bias, + log γ for the Einstein midpoint), `P = softmax(s)`,
//!   `LSE = m + log Σ exp(s − m)`;
//! - Taylor: `f(s) = a0 + a1 s + a2 s²`, `den = Σ f`, `P = f / den`;
//!
//! `P` rounded to the storage dtype, `o = P v` by a storage-dtype matmul. A row with no allowed key
//! gets `P = 0` (so `o = 0`), LSE `−∞`, `den = 0`. The mask comes from the spec (never re-derived).

use crate::common::{candle_dtype, to_f64, Outcome, Stored, Vars};
use attn_core::{Aggregation, AttnSpec, FamilySpec, HypScore, SeqLengths, ACOSH_EPS, KLEIN_MAX_NORM2};
use candle_core::{DType, Device, Result, Tensor, D};

/// `x / max(‖x‖, eps)` along the last dim.
fn l2norm(x: &Tensor, eps: f32) -> Result<Tensor> {
    let norm = x.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?.maximum(eps as f64)?;
    x.broadcast_div(&norm)
}

/// `a bᵀ` over the last two dims.
fn scores(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    a.matmul(&b.t()?.contiguous()?)
}

/// The time coordinate `x0 = √(1/c + ‖x‖²)`, `[.., n, 1]`.
fn time_coordinate(x: &Tensor, c: f64) -> Result<Tensor> {
    (x.sqr()?.sum_keepdim(D::Minus1)? + 1.0 / c)?.sqrt()
}

/// Scores of the softmax-like families `[1, H, nq, nk]`, in f32.
fn softmax_like_scores(family: &FamilySpec, q: &Tensor, k: &Tensor, dt: DType) -> Result<Tensor> {
    let s = match *family {
        FamilySpec::Softmax { scale, softcap } => {
            let s = (scores(q, k)? * scale as f64)?;
            match softcap {
                Some(cap) => ((s / cap as f64)?.tanh()? * cap as f64)?,
                None => s,
            }
        }
        FamilySpec::CosineSim {
            scale,
            qk_l2norm,
            eps,
        } => {
            let (q, k) = if qk_l2norm {
                (l2norm(q, eps)?, l2norm(k, eps)?)
            } else {
                (q.clone(), k.clone())
            };
            (scores(&q, &k)? * scale as f64)?
        }
        FamilySpec::Hyperbolic {
            score,
            curvature,
            beta,
            ..
        } => {
            // ⟨q, k⟩_L = q·k − q0 k0, in f32 (the naive formula, cancellation and all).
            let c = curvature as f64;
            let (q, k) = (q.to_dtype(DType::F32)?, k.to_dtype(DType::F32)?);
            let lorentz = (scores(&q, &k)? - scores(&time_coordinate(&q, c)?, &time_coordinate(&k, c)?)?)?;
            let s = match score {
                HypScore::SquaredLorentz => ((lorentz * -2.0)? - 2.0 / c)?.affine(-(beta as f64), 0.0)?,
                HypScore::Geodesic => {
                    let z = (lorentz * -c)?.maximum(1.0 + ACOSH_EPS)?;
                    let acosh = (&z + (z.sqr()? - 1.0)?.sqrt()?)?.log()?;
                    (acosh * (-(beta as f64) / c.sqrt()))?
                }
            };
            s.to_dtype(dt)?
        }
        FamilySpec::Taylor { .. } => candle_core::bail!("Taylor has no softmax scores"),
    };
    s.to_dtype(DType::F32)
}

/// `log γ_j = −½ log(1 − min(c‖v_j‖², KLEIN_MAX_NORM2))` as `[1, H, 1, nk]` (Einstein midpoint).
fn log_gamma(v: &Tensor, c: f64) -> Result<Tensor> {
    let n2 = (v.to_dtype(DType::F32)?.sqr()?.sum_keepdim(D::Minus1)? * c)?.minimum(KLEIN_MAX_NORM2)?;
    ((n2.neg()? + 1.0)?.log()? * -0.5)?.transpose(2, 3)
}

/// `x` with its zeros replaced by ones: the divisor of a row with no allowed key, whose weights
/// are all 0 (so `P = 0` and the gradient stays finite).
fn nonzero(x: &Tensor) -> Result<Tensor> {
    x + x.eq(&x.zeros_like()?)?.to_dtype(x.dtype())?
}

/// One batch entry: `o [1, H, nq, Dv]` and the statistics `[1, H, nq]` (f32).
#[allow(clippy::too_many_arguments)]
fn entry(
    spec: &AttnSpec,
    b: usize,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    dt: DType,
) -> Result<(Tensor, Tensor)> {
    let dev = q.device();
    let (nq, nk) = (q.dim(2)?, k.dim(2)?);
    let mut allowed = vec![0f32; nq * nk];
    for i in 0..nq {
        for j in spec.key_range(b, i) {
            allowed[i * nk + j] = 1.0;
        }
    }
    let mask = Tensor::from_vec(allowed, (nq, nk), dev)?;
    let family = spec.family();
    match *family {
        FamilySpec::Taylor {
            a,
            scale,
            qk_l2norm,
            eps,
            ..
        } => {
            let (q, k) = if qk_l2norm {
                (l2norm(q, eps)?, l2norm(k, eps)?)
            } else {
                (q.clone(), k.clone())
            };
            let s = scores(&(q * scale as f64)?, &k)?.to_dtype(DType::F32)?;
            let f = ((s.sqr()? * a[2] as f64)? + (s * a[1] as f64)?)?;
            let f = (f + a[0] as f64)?.broadcast_mul(&mask)?;
            let den = f.sum_keepdim(D::Minus1)?;
            let p = f.broadcast_div(&nonzero(&den)?)?.to_dtype(dt)?;
            Ok((p.matmul(v)?, den.squeeze(D::Minus1)?))
        }
        _ => {
            let mut s = softmax_like_scores(family, q, k, dt)?;
            if let Some(bias) = bias {
                s = s.broadcast_add(&bias.to_dtype(DType::F32)?)?;
            }
            if let FamilySpec::Hyperbolic {
                aggregation: Aggregation::EinsteinMidpoint,
                curvature,
                ..
            } = *family
            {
                s = s.broadcast_add(&log_gamma(v, curvature as f64)?)?;
            }
            // Disallowed pairs: −1e30 before the max, weight 0 after the exp.
            let s = s.broadcast_add(&((mask.clone() - 1.0)? * 1e30)?)?;
            let m = s.max_keepdim(D::Minus1)?.detach();
            let e = s.broadcast_sub(&m)?.exp()?.broadcast_mul(&mask)?;
            let sum = e.sum_keepdim(D::Minus1)?;
            let p = e.broadcast_div(&nonzero(&sum)?)?.to_dtype(dt)?;
            let lse = (m + sum.log()?)?.squeeze(D::Minus1)?;
            Ok((p.matmul(v)?, lse))
        }
    }
}

/// Rows `[start, start + len)` of a `(rows, H, D)` or `(B, N, H, D)` tensor as `[1, H, len, D]`, the
/// kv heads repeated over their query heads when `heads` is given.
fn heads_first(x: &Tensor, dim: usize, start: usize, len: usize, heads: Option<&Tensor>) -> Result<Tensor> {
    let mut x = x.narrow(dim, start, len)?;
    if dim == 0 && x.rank() == 3 {
        x = x.unsqueeze(0)?;
    }
    if let Some(idx) = heads {
        x = x.index_select(idx, 2)?;
    }
    x.transpose(1, 2)?.contiguous()
}

/// The baseline's outputs and gradients for the stored inputs, computed on `device` (Bnhd layout).
pub fn naive(spec: &AttnSpec, x: &Stored, device: &Device) -> Result<Outcome> {
    if spec.layout() != attn_core::Layout::Bnhd {
        candle_core::bail!("the naive baseline takes the Bnhd layout");
    }
    let dt = candle_dtype(spec.dtype());
    let Vars { q, k, v, bias, d_o } = x.to_vars(spec, device)?;
    let group: Vec<u32> = (0..spec.heads_q()).map(|h| spec.kv_head(h) as u32).collect();
    let group = Tensor::from_vec(group, spec.heads_q(), device)?;
    let (mut outs, mut stats) = (Vec::new(), Vec::new());
    for b in 0..spec.batch() {
        let lens = spec.seq_lens(b);
        let (dim, q0, k0, nk) = match spec.lengths() {
            SeqLengths::Varlen {
                cu_seqlens_q,
                cu_seqlens_k,
            } => (0, cu_seqlens_q[b], cu_seqlens_k[b], lens.k),
            _ => (1, 0, 0, spec.seq_k()),
        };
        // Dense: this batch entry's [1, N, H, D]; packed: all rows (narrowed below).
        let pick = |t: &Tensor| {
            if dim == 0 {
                Ok(t.clone())
            } else {
                t.narrow(0, b, 1)
            }
        };
        let (qb, kb, vb) = (pick(q.as_tensor())?, pick(k.as_tensor())?, pick(v.as_tensor())?);
        let nq = if dim == 0 { lens.q } else { spec.seq_q() };
        let qh = heads_first(&qb, dim, q0, nq, None)?;
        let kh = heads_first(&kb, dim, k0, nk, Some(&group))?;
        let vh = heads_first(&vb, dim, k0, nk, Some(&group))?;
        let bias_b = match &bias {
            Some(t) if t.dim(0)? > 1 => Some(t.narrow(0, b, 1)?),
            Some(t) => Some(t.as_tensor().clone()),
            None => None,
        };
        let (o, lse) = entry(spec, b, &qh, &kh, &vh, bias_b.as_ref(), dt)?;
        outs.push(o.transpose(1, 2)?);
        stats.push(lse);
    }
    let (o, stats) = if spec.is_varlen() {
        // Rows of each sequence, packed back: o (total_q, H, Dv); stats [H, total_q].
        let rows: Vec<Tensor> = outs.iter().map(|o| o.squeeze(0)).collect::<Result<_>>()?;
        let st: Vec<Tensor> = stats.iter().map(|s| s.squeeze(0)).collect::<Result<_>>()?;
        (Tensor::cat(&rows, 0)?, Tensor::cat(&st, 1)?)
    } else {
        (Tensor::cat(&outs, 0)?, Tensor::cat(&stats, 0)?)
    };
    let grads = (&o * &d_o)?.sum_all()?.backward()?;
    let grad = |t: &Tensor, name: &str| -> Result<Vec<f64>> {
        match grads.get(t) {
            Some(g) => to_f64(g),
            None => candle_core::bail!("the baseline has no gradient for {name}"),
        }
    };
    Ok(Outcome {
        o: to_f64(&o)?,
        stats: to_f64(&stats)?,
        dq: grad(q.as_tensor(), "q")?,
        dk: grad(k.as_tensor(), "k")?,
        dv: grad(v.as_tensor(), "v")?,
        dbias: bias.as_ref().map(|b| grad(b.as_tensor(), "bias")).transpose()?,
    })
}
