//! The generation example's model on the CPU: with seeded random weights, greedy generation through
//! attn's paged KV cache gives the same first 64 tokens as the same weights with plain candle
//! attention (matmul + softmax over a concatenated cache), and the tokens are not all one id.

use attn_candle::llama::{generate_paged, generate_plain, Llama, LlamaConfig};
use attn_candle::seeded_var_builder;
use candle_core::{DType, Device, Result};
use candle_nn::VarMap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn paged_attn_generation_equals_plain_candle_for_64_tokens() -> Result<()> {
    let dev = Device::Cpu;
    let cfg = LlamaConfig {
        max_positions: 128,
        ..LlamaConfig::small()
    };
    let vm = VarMap::new();
    let model = Llama::new(cfg, seeded_var_builder(&vm, 7, DType::F32, &dev))?;
    let mut rng = StdRng::seed_from_u64(11);
    let prompt: Vec<u32> = (0..20).map(|_| rng.random_range(0..cfg.vocab as u32)).collect();
    for page in [16, 64] {
        let attn = generate_paged(&model, &prompt, 64, page)?;
        let plain = generate_plain(&model, &prompt, 64)?;
        assert_eq!(attn.tokens.len(), 64);
        assert_eq!(attn.tokens, plain.tokens, "page size {page}");
        let distinct = {
            let mut t = attn.tokens.clone();
            t.sort_unstable();
            t.dedup();
            t.len()
        };
        assert!(
            distinct > 1,
            "a degenerate generation proves little: {:?}",
            attn.tokens
        );
    }
    Ok(())
}
