//! Wrong rank, dtype, shape or option → a candle error whose message names the op and, in the
//! caller's words, the argument: the tensors `q`, `k`, `v`, `bias` with their shapes and the
//! entry point's own argument names, never the fields of the internal problem (`heads_q`, `seq_k`).

use attn_candle::{
    attention, flash_attn, flash_attn_varlen, AttentionConfig, AttnOptions, MultiHeadAttention,
};
use attn_core::{Causal, Family};
use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};

fn t(shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::zeros(shape, dtype, &Device::Cpu)
}

/// The error's message, without the backtrace candle appends when `RUST_BACKTRACE` is set.
fn message(r: Result<Tensor>) -> String {
    match r {
        Ok(o) => panic!("expected an error, got a tensor of shape {:?}", o.dims()),
        Err(e) => e.to_string().lines().next().unwrap_or_default().to_string(),
    }
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "`{msg}` does not mention `{p}`");
    }
}

#[test]
fn wrong_rank_names_the_op_and_the_shape() -> Result<()> {
    let q = t(&[2, 5, 16], DType::F32)?;
    let k = t(&[2, 5, 4, 16], DType::F32)?;
    let msg = message(flash_attn(&q, &k, &k, 0.25, false));
    assert_eq!(
        msg,
        "softmax attention: `q` has the wrong shape: expected a rank-4 tensor [batch, seq, heads, dim], got [2, 5, 16]"
    );
    Ok(())
}

#[test]
fn mismatched_head_dims_name_all_three_shapes() -> Result<()> {
    let q = t(&[2, 5, 4, 16], DType::F32)?;
    let k = t(&[2, 7, 2, 8], DType::F32)?;
    let v = t(&[2, 7, 2, 16], DType::F32)?;
    let msg = message(flash_attn(&q, &k, &v, 0.25, true));
    assert_mentions(
        &msg,
        &["softmax", "[2, 5, 4, 16]", "[2, 7, 2, 8]", "[2, 7, 2, 16]"],
    );
    Ok(())
}

#[test]
fn heads_that_do_not_group_are_rejected() -> Result<()> {
    let q = t(&[1, 4, 3, 8], DType::F32)?;
    let k = t(&[1, 4, 2, 8], DType::F32)?;
    let msg = message(attention(&q, &k, &k, &AttnOptions::new(Family::cosine_sim())));
    assert_eq!(
        msg,
        "cosine_sim attention: invalid `k`: q has 3 heads, not a multiple of k's 2 heads (q [1, 4, 3, 8], k [1, 4, 2, 8])"
    );
    Ok(())
}

#[test]
fn empty_heads_and_oversized_heads_name_the_tensor() -> Result<()> {
    // An empty batch or sequence is a valid call (tests/zero_lengths.rs); no heads is not.
    let q = t(&[1, 4, 0, 8], DType::F32)?;
    let msg = message(attention(&q, &q, &q, &AttnOptions::new(Family::softmax())));
    assert_mentions(&msg, &["softmax attention", "`q`", "q [1, 4, 0, 8]"]);
    let q = t(&[1, 4, 2, 300], DType::F32)?;
    let v = t(&[1, 4, 2, 8], DType::F32)?;
    let msg = message(attention(&q, &q, &v, &AttnOptions::new(Family::softmax())));
    assert_eq!(
        msg,
        "softmax attention: invalid `q`: q [1, 4, 2, 300] F32 on Cpu: head dim 300 is outside 1..=256"
    );
    let k = t(&[2, 4, 2, 8], DType::F32)?;
    let msg = message(attention(&v, &k, &k, &AttnOptions::new(Family::softmax())));
    assert_mentions(
        &msg,
        &["`k`", "k with q's batch (1)", "q [1, 4, 2, 8], k [2, 4, 2, 8]"],
    );
    Ok(())
}

#[test]
fn mixed_or_unsupported_dtypes_name_the_tensors() -> Result<()> {
    let q = t(&[1, 4, 2, 8], DType::F16)?;
    let k = t(&[1, 4, 2, 8], DType::F32)?;
    let msg = message(flash_attn(&q, &k, &q, 1.0, false));
    assert_mentions(
        &msg,
        &["softmax", "dtype", "k [1, 4, 2, 8] F32", "q [1, 4, 2, 8] F16"],
    );
    let q = t(&[1, 4, 2, 8], DType::F64)?;
    let msg = message(attention(&q, &q, &q, &AttnOptions::new(Family::taylor(2))));
    assert_mentions(&msg, &["taylor", "q [1, 4, 2, 8] F64", "f32, f16, bf16"]);
    Ok(())
}

#[test]
fn wrong_bias_shape_or_family_is_rejected() -> Result<()> {
    let q = t(&[2, 4, 2, 8], DType::F32)?;
    let bias = t(&[2, 2, 4, 5], DType::F32)?;
    let msg = message(attention(
        &q,
        &q,
        &q,
        &AttnOptions::new(Family::softmax()).with_bias(bias),
    ));
    assert_mentions(&msg, &["bias", "[2|1, 2|1, 4, 4]", "[2, 2, 4, 5]"]);
    let bias = t(&[1, 1, 4, 4], DType::F32)?;
    let msg = message(attention(
        &q,
        &q,
        &q,
        &AttnOptions::new(Family::taylor(2)).with_bias(bias),
    ));
    assert_mentions(&msg, &["taylor", "bias"]);
    let bias = t(&[1, 1, 4, 4], DType::BF16)?;
    let msg = message(attention(
        &q,
        &q,
        &q,
        &AttnOptions::new(Family::softmax()).with_bias(bias),
    ));
    assert_mentions(&msg, &["bias [1, 1, 4, 4] BF16"]);
    Ok(())
}

#[test]
fn bad_key_lengths_and_varlen_offsets_are_rejected() -> Result<()> {
    let q = t(&[2, 4, 2, 8], DType::F32)?;
    let opts = AttnOptions::new(Family::softmax()).with_key_lens(vec![4]);
    assert_eq!(
        message(attention(&q, &q, &q, &opts)),
        "softmax attention: `key_lens` has the wrong shape: expected 2 lengths, one per batch entry of q [2, 4, 2, 8], got 1"
    );
    let opts = AttnOptions::new(Family::softmax()).with_key_lens(vec![4, 5]);
    assert_eq!(
        message(attention(&q, &q, &q, &opts)),
        "softmax attention: invalid `key_lens`: key_lens[1] = 5 exceeds the 4 keys of k [2, 4, 2, 8] F32 on Cpu"
    );

    let packed = t(&[7, 2, 8], DType::F32)?;
    let cu = Tensor::new(&[0u32, 3, 6], &Device::Cpu)?;
    let msg = message(flash_attn_varlen(
        &packed, &packed, &packed, &cu, &cu, 3, 3, 1.0, false,
    ));
    assert_mentions(&msg, &["softmax", "6 packed rows", "[7, 2, 8]"]);
    let cu_f = Tensor::new(&[0f32, 3.0, 7.0], &Device::Cpu)?;
    let msg = message(flash_attn_varlen(
        &packed, &packed, &packed, &cu_f, &cu_f, 4, 4, 1.0, false,
    ));
    assert_mentions(&msg, &["seqlens_q", "integer"]);
    let cu = Tensor::new(&[0u32, 3, 7], &Device::Cpu)?;
    let msg = message(flash_attn_varlen(
        &packed, &packed, &packed, &cu, &cu, 3, 3, 1.0, false,
    ));
    assert_eq!(
        msg,
        "softmax attention: invalid `seqlens_q`: sequence 1 has length 4, more than max_seqlen_q = 3"
    );
    let msg = message(flash_attn_varlen(
        &packed, &packed, &packed, &cu, &cu, 0, 4, 1.0, false,
    ));
    assert_eq!(
        msg,
        "softmax attention: invalid `seqlens_q`: sequence 0 has length 3, more than max_seqlen_q = 0"
    );
    // attention() with packed lengths names the option `cu_seqlens_q`.
    let opts = AttnOptions::new(Family::softmax()).with_varlen(vec![0, 8, 7], vec![0, 3, 7]);
    let msg = message(attention(&packed, &packed, &packed, &opts));
    assert_mentions(&msg, &["invalid `cu_seqlens_q`", "decreases at 1"]);
    Ok(())
}

#[test]
fn window_with_taylor_and_bad_family_parameters_are_rejected() -> Result<()> {
    let q = t(&[1, 4, 2, 8], DType::F32)?;
    let opts = AttnOptions::new(Family::taylor(2)).with_window(Some(2), None);
    assert_mentions(&message(attention(&q, &q, &q, &opts)), &["taylor", "window"]);
    let msg = message(flash_attn(&q, &q, &q, -1.0, false));
    assert_eq!(
        msg,
        "softmax attention: invalid `softmax_scale`: -1 must be finite and > 0"
    );
    let opts = AttnOptions::new(Family::Softmax(attn_core::SoftmaxParams {
        scale: Some(f32::NAN),
        softcap: None,
    }));
    assert_mentions(
        &message(attention(&q, &q, &q, &opts)),
        &["invalid `scale`", "NaN"],
    );
    Ok(())
}

#[test]
fn layer_rejects_input_of_the_wrong_width() -> Result<()> {
    let cfg = AttentionConfig {
        hidden: 32,
        heads_q: 4,
        heads_kv: 2,
        head_dim: 8,
        family: Family::softmax(),
        causal: Causal::BottomRight,
    };
    let vm = VarMap::new();
    let layer = MultiHeadAttention::new(cfg, VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu))?;
    let msg = message(layer.forward(&t(&[2, 5, 16], DType::F32)?));
    assert_mentions(&msg, &["softmax", "`x`", "[batch, seq, 32]", "[2, 5, 16]"]);
    let bad = AttentionConfig { heads_kv: 3, ..cfg };
    match MultiHeadAttention::new(bad, VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu)) {
        Ok(_) => panic!("4 query heads over 3 kv heads must be rejected"),
        Err(e) => assert_mentions(&e.to_string(), &["heads_kv", "4", "3"]),
    }
    Ok(())
}
