//! The entry points on the GPU: `flash_attn` on the strided views models pass (transposed, fused
//! QKV with start offsets, misaligned starts), bias with its gradient, varlen, and the errors for
//! tensors on different devices.

use crate::common::{candle_dtype, to_f64};
use crate::harness::{check, gpu};
use attn_candle::{attention, flash_attn, flash_attn_varlen, AttnOptions};
use attn_core::{AttnProblem, Causal, DType, Family, TaylorParams};
use candle_core::{Device, Result, Tensor, Var};

/// Random values, rounded to `dtype` on the host, as a variable on `dev`.
fn random_var(shape: &[usize], dtype: DType, seed: u64, dev: &Device) -> Result<Var> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n = shape.iter().product();
    let x: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let t = Tensor::from_vec(x, shape, &Device::Cpu)?.to_dtype(candle_dtype(dtype))?;
    Var::from_tensor(&t.to_device(dev)?)
}

/// `o` and the gradients of `Σ o ⊙ r` w.r.t. `vars`, as f64.
fn forward_backward(o: &Tensor, r: &Tensor, vars: &[&Var]) -> Result<Vec<Vec<f64>>> {
    let grads = (o * r)?.sum_all()?.backward()?;
    let mut out = vec![to_f64(o)?];
    for v in vars {
        match grads.get(v.as_tensor()) {
            Some(g) => out.push(to_f64(g)?),
            None => candle_core::bail!("no gradient for a variable"),
        }
    }
    Ok(out)
}

fn assert_same(what: &str, a: &[Vec<f64>], b: &[Vec<f64>]) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.len(), y.len(), "{what}: tensor {i} length");
        let diff = attn_cpu_ref::testing::max_abs_diff(x, y);
        assert_eq!(
            diff, 0.0,
            "{what}: tensor {i} (o, then gradients) differs by {diff:e}"
        );
    }
}

/// The drop-in on `(b, seq, heads, d)` views of `[b, heads, seq, d]` buffers (what a
/// candle-transformers model passes) gives exactly what it gives on dense tensors with the same
/// values, forward and backward, in every dtype.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn flash_attn_on_transposed_views_equals_dense_inputs() -> Result<()> {
    let dev = gpu();
    let (b, nq, nk, hq, hkv, d) = (2, 37, 53, 4, 2, 64);
    for (s, dtype) in DType::ALL.into_iter().enumerate() {
        let seed = 10 * s as u64;
        let qb = random_var(&[b, hq, nq, d], dtype, seed, &dev)?;
        let kb = random_var(&[b, hkv, nk, d], dtype, seed + 1, &dev)?;
        let vb = random_var(&[b, hkv, nk, d], dtype, seed + 2, &dev)?;
        let r = random_var(&[b, nq, hq, d], dtype, seed + 3, &dev)?
            .as_tensor()
            .detach();
        let (q, k, v) = (qb.transpose(1, 2)?, kb.transpose(1, 2)?, vb.transpose(1, 2)?);
        assert!(!q.is_contiguous() && !k.is_contiguous());
        let o = flash_attn(&q, &k, &v, 0.125, true)?;
        let viewed = forward_backward(&o, &r, &[&qb, &kb, &vb])?;

        let dense = [&q, &k, &v].map(|t| t.contiguous().and_then(|c| Var::from_tensor(&c)));
        let [qd, kd, vd] = dense;
        let (qd, kd, vd) = (qd?, kd?, vd?);
        let o = flash_attn(qd.as_tensor(), kd.as_tensor(), vd.as_tensor(), 0.125, true)?;
        let mut plain = forward_backward(&o, &r, &[&qd, &kd, &vd])?;
        // The views' gradients are [b, heads, seq, d]: bring the dense ones to that order.
        for (g, (h, n)) in plain[1..].iter_mut().zip([(hq, nq), (hkv, nk), (hkv, nk)]) {
            let t = Tensor::from_vec(g.clone(), (b, n, h, d), &Device::Cpu)?;
            *g = t.transpose(1, 2)?.flatten_all()?.to_vec1::<f64>()?;
        }
        assert_same(&format!("{dtype} transposed views"), &viewed, &plain);
    }
    Ok(())
}

/// q, k, v as views into one fused `[b, seq, 3·heads, d]` projection (start offsets `heads·d` and
/// `2·heads·d`), and tensors that start at an element offset that is not a multiple of 8 (copied for
/// the f16/bf16 kernels, read in place in f32): the same results as dense inputs.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn fused_qkv_and_offset_views_equal_dense_inputs() -> Result<()> {
    let dev = gpu();
    let (b, n, h, d) = (2, 21, 2, 32);
    for (s, dtype) in DType::ALL.into_iter().enumerate() {
        let seed = 100 + 10 * s as u64;
        let fused = random_var(&[b, n, 3 * h, d], dtype, seed, &dev)?;
        let r = random_var(&[b, n, h, d], dtype, seed + 1, &dev)?
            .as_tensor()
            .detach();
        let part = |i: usize| fused.narrow(2, i * h, h);
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        assert_eq!(k.layout().start_offset(), h * d);
        let o = flash_attn(&q, &k, &v, 0.2, false)?;
        let grads = (&o * &r)?.sum_all()?.backward()?;
        let dfused = match grads.get(fused.as_tensor()) {
            Some(g) => g.clone(),
            None => candle_core::bail!("no gradient for the fused projection"),
        };
        let viewed = vec![
            to_f64(&o)?,
            to_f64(&dfused.narrow(2, 0, h)?)?,
            to_f64(&dfused.narrow(2, h, h)?)?,
            to_f64(&dfused.narrow(2, 2 * h, h)?)?,
        ];
        let dense: Vec<Var> = [&q, &k, &v]
            .iter()
            .map(|t| t.contiguous().and_then(|c| Var::from_tensor(&c)))
            .collect::<Result<_>>()?;
        let o = flash_attn(
            dense[0].as_tensor(),
            dense[1].as_tensor(),
            dense[2].as_tensor(),
            0.2,
            false,
        )?;
        let plain = forward_backward(&o, &r, &[&dense[0], &dense[1], &dense[2]])?;
        assert_same(&format!("{dtype} fused qkv"), &viewed, &plain);

        // A tensor starting 3 elements into its buffer.
        let len = b * n * h * d;
        let flat = random_var(&[len + 3], dtype, seed + 2, &dev)?;
        let shifted = flat.narrow(0, 3, len)?.reshape((b, n, h, d))?;
        assert_eq!(shifted.layout().start_offset(), 3);
        let o_shift = flash_attn(&shifted, &k, &v, 0.2, false)?;
        let o_dense = flash_attn(&shifted.force_contiguous()?, &k, &v, 0.2, false)?;
        assert_same(
            &format!("{dtype} offset 3"),
            &[to_f64(&o_shift)?],
            &[to_f64(&o_dense)?],
        );
    }
    Ok(())
}

/// An additive bias, per head or per batch entry, and its gradient; softmax and cosine-sim.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn bias_and_its_gradient_match_reference_on_gpu() -> Result<()> {
    let mut seed = 800;
    for family in [Family::softmax(), Family::cosine_sim()] {
        for dtype in DType::ALL {
            for (bb, bh) in [(1, 4), (2, 1), (2, 4)] {
                let p = AttnProblem::new(family, dtype, 2, 4, 2, 37, 53, 64)
                    .with_causal(Causal::BottomRight)
                    .with_bias(bb, bh);
                check(&p, seed)?;
                seed += 1;
            }
        }
    }
    Ok(())
}

/// Packed variable-length batches (lengths 5, 17, 33 queries over 9, 17, 40 keys) for softmax,
/// cosine-sim and Taylor; `flash_attn_varlen` equals `attention` with the same offsets.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn varlen_matches_reference_on_gpu() -> Result<()> {
    let (cu_q, cu_k) = (vec![0, 5, 22, 55], vec![0, 9, 26, 66]);
    let families = [
        Family::softmax(),
        Family::cosine_sim(),
        Family::Taylor(TaylorParams {
            order: 2,
            ..TaylorParams::default()
        }),
    ];
    let mut seed = 900;
    for family in families {
        for dtype in DType::ALL {
            for causal in [Causal::None, Causal::BottomRight] {
                let p = AttnProblem::new(family, dtype, 3, 4, 2, 33, 40, 32)
                    .with_causal(causal)
                    .with_varlen(cu_q.clone(), cu_k.clone());
                check(&p, seed)?;
                seed += 1;
            }
        }
    }

    let dev = gpu();
    let q = random_var(&[55, 4, 64], DType::BF16, 1, &dev)?;
    let k = random_var(&[66, 2, 64], DType::BF16, 2, &dev)?;
    let v = random_var(&[66, 2, 64], DType::BF16, 3, &dev)?;
    let offsets = |x: &[usize]| Tensor::new(x.iter().map(|&o| o as u32).collect::<Vec<_>>(), &dev);
    let o = flash_attn_varlen(
        q.as_tensor(),
        k.as_tensor(),
        v.as_tensor(),
        &offsets(&cu_q)?,
        &offsets(&cu_k)?,
        33,
        40,
        0.125,
        true,
    )?;
    let opts = AttnOptions::new(Family::Softmax(attn_core::SoftmaxParams {
        scale: Some(0.125),
        softcap: None,
    }))
    .with_causal(Causal::BottomRight)
    .with_varlen(cu_q, cu_k);
    let want = attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), &opts)?;
    assert_same("flash_attn_varlen", &[to_f64(&o)?], &[to_f64(&want)?]);
    Ok(())
}

fn message(r: Result<Tensor>) -> String {
    match r {
        Ok(o) => panic!("expected an error, got a tensor of shape {:?}", o.dims()),
        Err(e) => e.to_string(),
    }
}

/// q on the CPU with k, v on the GPU (and a CPU bias with GPU tensors) is a candle error naming
/// the tensors, their shapes and devices.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn tensors_on_different_devices_are_an_error_naming_the_shapes() -> Result<()> {
    let dev = gpu();
    let q_cpu = random_var(&[1, 8, 2, 32], DType::F32, 1, &Device::Cpu)?;
    let k = random_var(&[1, 9, 2, 32], DType::F32, 2, &dev)?;
    let v = random_var(&[1, 9, 2, 32], DType::F32, 3, &dev)?;
    let msg = message(flash_attn(
        q_cpu.as_tensor(),
        k.as_tensor(),
        v.as_tensor(),
        0.2,
        false,
    ));
    for part in [
        "softmax",
        "device",
        "[1, 8, 2, 32]",
        "[1, 9, 2, 32]",
        "Cpu",
        "Cuda",
    ] {
        assert!(msg.contains(part), "`{msg}` does not mention `{part}`");
    }

    let q = q_cpu.to_device(&dev)?;
    let bias = Tensor::zeros((1, 2, 8, 9), candle_core::DType::F32, &Device::Cpu)?;
    let opts = AttnOptions::new(Family::softmax()).with_bias(bias);
    let msg = message(attention(&q, k.as_tensor(), v.as_tensor(), &opts));
    for part in ["bias", "device", "[1, 2, 8, 9]", "[1, 8, 2, 32]"] {
        assert!(msg.contains(part), "`{msg}` does not mention `{part}`");
    }
    Ok(())
}
