//! An independent cross-check: inside a larger graph (projections before, a nonlinearity after),
//! the softmax op gives the same values and parameter gradients as attention written as a
//! composite of candle ops.

use attn_candle::{attention, AttnOptions};
use attn_core::{Causal, Family};
use candle_core::{Device, Result, Tensor, Var, D};

/// `softmax(q kᵀ · scale + causal mask) v` per head, with candle ops, on `(b, n, h, d)` tensors.
fn composite(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
    let (q, k, v) = (q.transpose(1, 2)?, k.transpose(1, 2)?, v.transpose(1, 2)?);
    let n = q.dim(2)?;
    let s = (q.contiguous()?.matmul(&k.contiguous()?.t()?)? * scale)?;
    let mask: Vec<f32> = (0..n * n)
        .map(|x| if x % n > x / n { f32::NEG_INFINITY } else { 0.0 })
        .collect();
    let s = s.broadcast_add(&Tensor::from_vec(mask, (n, n), q.device())?)?;
    let p = candle_nn::ops::softmax(&s, D::Minus1)?;
    p.matmul(&v.contiguous()?)?.transpose(1, 2)
}

#[test]
fn softmax_op_matches_candle_composite_inside_a_graph() -> Result<()> {
    let dev = Device::Cpu;
    let (b, n, h, d, hidden) = (3, 7, 2, 8, 12);
    let x = Tensor::randn(0f32, 1.0, (b, n, hidden), &dev)?;
    let w = [
        Var::randn(0f32, 0.5, (hidden, h * d), &dev)?,
        Var::randn(0f32, 0.5, (hidden, h * d), &dev)?,
        Var::randn(0f32, 0.5, (hidden, h * d), &dev)?,
    ];
    let target = Tensor::randn(0f32, 1.0, (b, n, h, d), &dev)?;
    let scale = 1.0 / (d as f64).sqrt();
    let run = |ours: bool| -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
        let proj = |i: usize| x.broadcast_matmul(w[i].as_tensor())?.reshape((b, n, h, d));
        let (q, k, v) = (proj(0)?, proj(1)?, proj(2)?);
        let o = if ours {
            let opts = AttnOptions::new(Family::softmax()).with_causal(Causal::TopLeft);
            attention(&q, &k, &v, &opts)?
        } else {
            composite(&q, &k, &v, scale)?
        };
        let loss = (o.tanh()? - &target)?.sqr()?.sum_all()?;
        let grads = loss.backward()?;
        let gs = w
            .iter()
            .map(|wi| {
                grads
                    .get(wi.as_tensor())
                    .expect("weight gradient")
                    .flatten_all()?
                    .to_vec1::<f32>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((o.flatten_all()?.to_vec1::<f32>()?, gs))
    };
    let (o_ours, g_ours) = run(true)?;
    let (o_comp, g_comp) = run(false)?;
    let close = |a: &[f32], b: &[f32], what: &str| {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            err <= 1e-4 * scale.max(1.0),
            "{what}: max difference {err:e} (max {scale:e})"
        );
    };
    close(&o_ours, &o_comp, "o");
    for (i, name) in ["w_q", "w_k", "w_v"].iter().enumerate() {
        close(&g_ours[i], &g_comp[i], name);
    }
    Ok(())
}
