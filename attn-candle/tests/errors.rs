//! Wrong rank, dtype, shape or option → a candle error whose message names the op and the shapes.

use attn_candle::{
    attention, flash_attn, flash_attn_varlen, AttentionConfig, AttnOptions, MultiHeadAttention,
};
use attn_core::{Causal, Family};
use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};

fn t(shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::zeros(shape, dtype, &Device::Cpu)
}

fn message(r: Result<Tensor>) -> String {
    match r {
        Ok(o) => panic!("expected an error, got a tensor of shape {:?}", o.dims()),
        Err(e) => e.to_string(),
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
    assert_mentions(&msg, &["softmax", "`q`", "[2, 5, 16]", "rank-4"]);
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
    assert_mentions(&msg, &["cosine_sim", "heads_kv", "3", "2"]);
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
    assert_mentions(
        &message(attention(&q, &q, &q, &opts)),
        &["key_lens", "[2]", "[1]"],
    );
    let opts = AttnOptions::new(Family::softmax()).with_key_lens(vec![4, 5]);
    assert_mentions(&message(attention(&q, &q, &q, &opts)), &["key_lens", "5"]);

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
    assert_mentions(&msg, &["cu_seqlens_q", "length 4 beyond the maximum 3"]);
    Ok(())
}

#[test]
fn window_with_taylor_and_bad_family_parameters_are_rejected() -> Result<()> {
    let q = t(&[1, 4, 2, 8], DType::F32)?;
    let opts = AttnOptions::new(Family::taylor(2)).with_window(Some(2), None);
    assert_mentions(&message(attention(&q, &q, &q, &opts)), &["taylor", "window"]);
    let msg = message(flash_attn(&q, &q, &q, -1.0, false));
    assert_mentions(&msg, &["softmax", "scale", "-1"]);
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
