//! The candle-flash-attn drop-ins: `(b, seq, heads, d)` transposed views, bottom-right causal,
//! GQA, and the packed varlen variant, all with gradients.

mod common;

use attn_candle::{flash_attn, flash_attn_varlen};
use attn_core::{AttnProblem, Causal, DType, Family, SoftmaxParams};
use attn_cpu_ref::testing::{max_abs_diff, random_case};
use candle_core::{Device, Result, Tensor, Var};
use common::{assert_exact, candle_dtype, reference, to_f64, Outcome, Stored};

fn softmax(scale: f32) -> Family {
    Family::Softmax(SoftmaxParams {
        scale: Some(scale),
        softcap: None,
    })
}

/// A `[B, H, N, D]` variable and its `(b, seq, heads, d)` view.
fn transposed(
    x: &[f64],
    b: usize,
    n: usize,
    h: usize,
    d: usize,
    dt: candle_core::DType,
) -> Result<(Var, Tensor)> {
    // x is in [B, N, H, D] order; store it as [B, H, N, D] so the view is a true transpose.
    let bnhd = Tensor::from_vec(x.to_vec(), (b, n, h, d), &Device::Cpu)?.to_dtype(dt)?;
    let base = Var::from_tensor(&bnhd.transpose(1, 2)?.contiguous()?)?;
    let view = base.as_tensor().transpose(1, 2)?;
    Ok((base, view))
}

#[test]
fn flash_attn_on_transposed_views_matches_reference_and_trains() -> Result<()> {
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for causal in [false, true] {
            let (b, hq, hkv, nq, nk, d) = (2, 4, 2, 6, 9, 16);
            let scale = 0.3;
            let p = AttnProblem::new(softmax(scale), dtype, b, hq, hkv, nq, nk, d).with_causal(if causal {
                Causal::BottomRight
            } else {
                Causal::None
            });
            let spec = p.validate().map_err(attn_candle::to_candle)?;
            let case = random_case(&spec, 5);
            let dt = candle_dtype(dtype);
            let (qb, q) = transposed(&case.q, b, nq, hq, d, dt)?;
            let (kb, k) = transposed(&case.k, b, nk, hkv, d, dt)?;
            let (vb, v) = transposed(&case.v, b, nk, hkv, d, dt)?;
            assert!(!q.is_contiguous() && !k.is_contiguous());
            let o = flash_attn(&q, &k, &v, scale, causal)?;
            assert_eq!(o.dims(), &[b, nq, hq, d]);
            let d_o = Tensor::from_vec(case.d_o.clone(), spec.o_shape(), &Device::Cpu)?.to_dtype(dt)?;
            let grads = (&o * &d_o)?.sum_all()?.backward()?;
            // Gradients arrive on the [B, H, N, D] variables; view them as (b, seq, heads, d).
            let grad = |base: &Var| -> Result<Vec<f64>> {
                let g = grads
                    .get(base.as_tensor())
                    .expect("gradient of a transposed input");
                to_f64(&g.transpose(1, 2)?.contiguous()?)
            };
            let got = Outcome {
                o: to_f64(&o)?,
                stats: Vec::new(),
                dq: grad(&qb)?,
                dk: grad(&kb)?,
                dv: grad(&vb)?,
                dbias: None,
            };
            let stored = Stored {
                q: to_f64(&q.contiguous()?)?,
                k: to_f64(&k.contiguous()?)?,
                v: to_f64(&v.contiguous()?)?,
                bias: None,
                d_o: to_f64(&d_o)?,
            };
            let mut want = match dtype {
                DType::F32 => reference::<f32>(&spec, &stored),
                DType::F16 => reference::<half::f16>(&spec, &stored),
                DType::BF16 => reference::<half::bf16>(&spec, &stored),
            };
            want.stats.clear();
            assert_exact(&format!("flash_attn {dtype} causal={causal}"), &got, &want);
        }
    }
    Ok(())
}

#[test]
fn flash_attn_causal_is_bottom_right_when_kv_is_longer() -> Result<()> {
    let (nq, nk, d) = (3, 7, 8);
    let q = Tensor::randn(0f32, 1.0, (1, nq, 2, d), &Device::Cpu)?;
    let k = Tensor::randn(0f32, 1.0, (1, nk, 2, d), &Device::Cpu)?;
    let v = Tensor::randn(0f32, 1.0, (1, nk, 2, d), &Device::Cpu)?;
    let o = to_f64(&flash_attn(&q, &k, &v, 0.5, true)?)?;
    let stored = Stored {
        q: to_f64(&q)?,
        k: to_f64(&k)?,
        v: to_f64(&v)?,
        bias: None,
        d_o: vec![0.0; nq * 2 * d],
    };
    let problem = AttnProblem::new(softmax(0.5), DType::F32, 1, 2, 2, nq, nk, d);
    let at = |c: Causal| -> Result<Vec<f64>> {
        let spec = problem
            .clone()
            .with_causal(c)
            .validate()
            .map_err(attn_candle::to_candle)?;
        Ok(reference::<f32>(&spec, &stored).o)
    };
    assert_eq!(o, at(Causal::BottomRight)?);
    assert!(
        max_abs_diff(&o, &at(Causal::TopLeft)?) > 1e-3,
        "top-left would mask keys 1..=4 of query 0"
    );
    Ok(())
}

#[test]
fn flash_attn_varlen_equals_flash_attn_per_sequence() -> Result<()> {
    let dev = Device::Cpu;
    let (hq, hkv, d, scale) = (4, 2, 8, 0.35);
    let (lq, lk) = ([3usize, 5], [6usize, 4]);
    let q = Var::randn(0f32, 1.0, (lq[0] + lq[1], hq, d), &dev)?;
    let k = Var::randn(0f32, 1.0, (lk[0] + lk[1], hkv, d), &dev)?;
    let v = Var::randn(0f32, 1.0, (lk[0] + lk[1], hkv, d), &dev)?;
    let cu_q = Tensor::new(&[0u32, 3, 8], &dev)?;
    let cu_k = Tensor::new(&[0u32, 6, 10], &dev)?;
    let d_o = Tensor::randn(0f32, 1.0, (lq[0] + lq[1], hq, d), &dev)?;
    let o = flash_attn_varlen(
        q.as_tensor(),
        k.as_tensor(),
        v.as_tensor(),
        &cu_q,
        &cu_k,
        5,
        6,
        scale,
        true,
    )?;
    let grads = (&o * &d_o)?.sum_all()?.backward()?;
    let dq = grads.get(q.as_tensor()).expect("dq");
    let dk = grads.get(k.as_tensor()).expect("dk");
    let (mut q0, mut k0) = (0, 0);
    for s in 0..2 {
        let part = |t: &Tensor, start: usize, len: usize| t.narrow(0, start, len)?.unsqueeze(0);
        let (qs, ks, vs) = (
            Var::from_tensor(&part(q.as_tensor(), q0, lq[s])?)?,
            Var::from_tensor(&part(k.as_tensor(), k0, lk[s])?)?,
            Var::from_tensor(&part(v.as_tensor(), k0, lk[s])?)?,
        );
        let os = flash_attn(qs.as_tensor(), ks.as_tensor(), vs.as_tensor(), scale, true)?;
        assert_eq!(to_f64(&os)?, to_f64(&part(&o, q0, lq[s])?)?, "o of sequence {s}");
        let gs = (&os * &part(&d_o, q0, lq[s])?)?.sum_all()?.backward()?;
        let dqs = gs.get(qs.as_tensor()).expect("dq of one sequence");
        let dks = gs.get(ks.as_tensor()).expect("dk of one sequence");
        assert_eq!(to_f64(dqs)?, to_f64(&part(dq, q0, lq[s])?)?, "dq of sequence {s}");
        assert_eq!(to_f64(dks)?, to_f64(&part(dk, k0, lk[s])?)?, "dk of sequence {s}");
        q0 += lq[s];
        k0 += lk[s];
    }
    Ok(())
}
