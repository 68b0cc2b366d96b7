//! Zero-length sequences through candle on the CPU, every family, forward and backward: an empty
//! batch, query or key dimension gives empty outputs and zero-size (or zero) gradients, as candle and
//! PyTorch do for empty tensors; key lengths of 0 and
//! packed sequences with no query or no key give the documented result: o = 0 with LSE −∞ (Taylor:
//! denominator 0) for a row with no key, dq = 0 there, dk = dv = 0 for a key no query sees, everything
//! finite.

use attn_candle::{attention, attention_with_stats, AttnOptions};
use attn_core::{Aggregation, Causal, Family, HypScore, TaylorParams};
use candle_core::{DType, Device, Result, Tensor, Var};

fn families() -> Vec<(&'static str, Family)> {
    vec![
        ("softmax", Family::softmax()),
        ("cosine_sim", Family::cosine_sim()),
        (
            "taylor1",
            Family::Taylor(TaylorParams {
                order: 1,
                a: [1.0, 0.25, 0.0],
                scale: None,
                qk_l2norm: true,
            }),
        ),
        ("taylor2", Family::taylor(2)),
        (
            "hyperbolic geodesic",
            Family::hyperbolic(HypScore::Geodesic, Aggregation::Euclidean),
        ),
    ]
}

fn randn(shape: &[usize], seed: u64) -> Result<Var> {
    // A fixed pseudo-random fill (no RNG state shared between tests).
    let n: usize = shape.iter().product();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect();
    Var::from_tensor(&Tensor::from_vec(data, shape, &Device::Cpu)?)
}

fn rows(t: &Tensor) -> Result<Vec<Vec<f32>>> {
    let d = t.dim(t.rank() - 1)?;
    let flat = t.flatten_all()?.to_vec1::<f32>()?;
    Ok(flat.chunks(d).map(|c| c.to_vec()).collect())
}

fn all_finite(name: &str, what: &str, t: &Tensor) -> Result<()> {
    let v = t.flatten_all()?.to_vec1::<f32>()?;
    assert!(
        v.iter().all(|x| x.is_finite()),
        "{name}: {what} has a non-finite element"
    );
    Ok(())
}

/// Key padding: B = 2, Nq = 3, Nk = 4, Hq = 2 over Hkv = 1, key lengths [4, 0] (entry 1 has no key),
/// [B, N, H, D].
#[test]
fn key_lengths_of_zero_give_zero_rows_and_zero_gradients() -> Result<()> {
    for (name, family) in families() {
        for causal in [Causal::None, Causal::BottomRight] {
            let name = format!("{name} {causal:?}");
            let q = randn(&[2, 3, 2, 8], 1)?;
            let k = randn(&[2, 4, 1, 8], 2)?;
            let v = randn(&[2, 4, 1, 8], 3)?;
            let opts = AttnOptions::new(family)
                .with_causal(causal)
                .with_key_lens(vec![4, 0]);
            let (o, stats) = attention_with_stats(q.as_tensor(), k.as_tensor(), v.as_tensor(), &opts)
                .map_err(|e| candle_core::Error::Msg(format!("{name}: {e}")))?;
            all_finite(&name, "o", &o)?;
            let o1 = o.narrow(0, 1, 1)?;
            assert!(
                rows(&o1)?.iter().flatten().all(|&x| x == 0.0),
                "{name}: o of entry 1"
            );
            let empty = if matches!(family, Family::Taylor(_)) {
                0.0
            } else {
                f32::NEG_INFINITY
            };
            let s1 = stats.narrow(0, 1, 1)?.flatten_all()?.to_vec1::<f32>()?;
            assert!(
                s1.iter().all(|&s| s == empty),
                "{name}: statistics of entry 1: {s1:?}"
            );

            let weights = randn(o.dims(), 4)?;
            let grads = (o * weights.as_tensor())?.sum_all()?.backward()?;
            for (what, var) in [("dq", &q), ("dk", &k), ("dv", &v)] {
                let g = grads
                    .get(var.as_tensor())
                    .unwrap_or_else(|| panic!("{name}: no {what}"));
                all_finite(&name, what, g)?;
                let g1 = g.narrow(0, 1, 1)?;
                assert!(
                    rows(&g1)?.iter().flatten().all(|&x| x == 0.0),
                    "{name}: {what} of entry 1"
                );
            }
        }
    }
    Ok(())
}

/// Packed sequences (q, k) = (0, 2), (3, 0), (0, 0), (4, 5): the rows of the second have no key, the
/// keys of the first no query.
#[test]
fn packed_sequences_with_no_query_or_no_key_give_zero_rows_and_zero_gradients() -> Result<()> {
    for (name, family) in families() {
        for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
            let name = format!("{name} {causal:?}");
            let q = randn(&[7, 2, 8], 5)?;
            let k = randn(&[7, 1, 8], 6)?;
            let v = randn(&[7, 1, 8], 7)?;
            let opts = AttnOptions::new(family)
                .with_causal(causal)
                .with_varlen(vec![0, 0, 3, 3, 7], vec![0, 2, 2, 2, 7]);
            let o = attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), &opts)
                .map_err(|e| candle_core::Error::Msg(format!("{name}: {e}")))?;
            all_finite(&name, "o", &o)?;
            // Query rows 0..3 belong to the sequence with no key.
            assert!(
                rows(&o.narrow(0, 0, 3)?)?.iter().flatten().all(|&x| x == 0.0),
                "{name}: o of the sequence with no key"
            );
            let weights = randn(o.dims(), 8)?;
            let grads = (o * weights.as_tensor())?.sum_all()?.backward()?;
            let dq = grads.get(q.as_tensor()).expect("dq");
            let dk = grads.get(k.as_tensor()).expect("dk");
            let dv = grads.get(v.as_tensor()).expect("dv");
            for (what, g) in [("dq", dq), ("dk", dk), ("dv", dv)] {
                all_finite(&name, what, g)?;
            }
            assert!(
                rows(&dq.narrow(0, 0, 3)?)?.iter().flatten().all(|&x| x == 0.0),
                "{name}: dq"
            );
            // Key rows 0..2 belong to the sequence with no query.
            for (what, g) in [("dk", dk), ("dv", dv)] {
                assert!(
                    rows(&g.narrow(0, 0, 2)?)?.iter().flatten().all(|&x| x == 0.0),
                    "{name}: {what} of the keys no query sees"
                );
            }
        }
    }
    Ok(())
}

/// An empty batch, query or key dimension (B = 0, Nq = 0, Nk = 0, both, and Nk = 0 under each causal
/// alignment), on every family, in f32 and bf16: o of shape [B, Nq, Hq, Dv] (empty, or zeros where
/// queries have no key), statistics [B, Hq, Nq] (−∞, Taylor 0), and gradients of the inputs' shapes,
/// all zeros, as candle and PyTorch give for empty tensors.
#[test]
fn empty_batch_query_or_key_dimensions_give_empty_results_and_gradients() -> Result<()> {
    for (name, family) in families() {
        let taylor = matches!(family, Family::Taylor(_));
        let no_key = if taylor { 0.0 } else { f32::NEG_INFINITY };
        for dtype in [DType::F32, DType::BF16] {
            for (label, b, nq, nk, causal) in [
                ("B = 0", 0, 3, 4, Causal::None),
                ("Nq = 0", 2, 0, 4, Causal::None),
                ("Nk = 0", 2, 3, 0, Causal::None),
                ("Nk = 0 top-left", 2, 3, 0, Causal::TopLeft),
                ("Nk = 0 bottom-right", 2, 3, 0, Causal::BottomRight),
                ("Nq = Nk = 0", 2, 0, 0, Causal::BottomRight),
            ] {
                let name = format!("{name} {dtype:?} {label}");
                let var = |shape: &[usize], seed| -> Result<Var> {
                    Var::from_tensor(&randn(shape, seed)?.as_tensor().to_dtype(dtype)?)
                };
                let q = var(&[b, nq, 2, 8], 1)?;
                let k = var(&[b, nk, 1, 8], 2)?;
                let v = var(&[b, nk, 1, 8], 3)?;
                let opts = AttnOptions::new(family).with_causal(causal);
                let (o, stats) = attention_with_stats(q.as_tensor(), k.as_tensor(), v.as_tensor(), &opts)
                    .map_err(|e| candle_core::Error::Msg(format!("{name}: {e}")))?;
                assert_eq!(o.dims(), &[b, nq, 2, 8], "{name}: o's shape");
                assert_eq!(stats.dims(), &[b, 2, nq], "{name}: the statistics' shape");
                let of = o.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                assert!(of.iter().all(|&x| x == 0.0), "{name}: o is not all zeros");
                let sf = stats.flatten_all()?.to_vec1::<f32>()?;
                assert!(sf.iter().all(|&x| x == no_key), "{name}: statistics {sf:?}");

                let weights = randn(o.dims(), 4)?.as_tensor().to_dtype(dtype)?;
                let grads = (o * weights)?.to_dtype(DType::F32)?.sum_all()?.backward()?;
                for (what, x) in [("dq", &q), ("dk", &k), ("dv", &v)] {
                    let g = grads
                        .get(x.as_tensor())
                        .unwrap_or_else(|| panic!("{name}: no {what}"));
                    assert_eq!(g.dims(), x.dims(), "{name}: {what}'s shape");
                    let gf = g.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                    assert!(gf.iter().all(|&x| x == 0.0), "{name}: {what} is not all zeros");
                }
            }
        }
    }
    Ok(())
}
