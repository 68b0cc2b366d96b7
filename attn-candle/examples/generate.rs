//! Greedy generation with a Llama-architecture decoder (RMSNorm, rotary embeddings, SwiGLU, GQA;
//! `attn_candle::llama`) whose attention runs through attn's paged KV cache: the prompt in one
//! prefill, then one decode step per token. Prints prefill and decode tokens/s; with
//! `--compare-candle` also runs the same weights with plain candle attention (matmul + softmax over a
//! concatenated KV cache) and reports its tokens/s and whether the first 64 tokens agree.
//!
//! Weights: `--weights a.safetensors[,b.safetensors…]` loads a checkpoint under the usual Llama
//! tensor names, its sizes from `--config` (a Hugging Face `config.json`, by default the one next to
//! the first file); without `--weights`, seeded random weights of `--preset small` (4 layers, width
//! 512, 8/2 heads, vocabulary 1024: seconds on a CPU) or `--preset 1b` (Llama 3.2 1B's shapes, for a
//! GPU). The prompt is `--prompt-len` seeded random token ids.
//!
//! ```text
//! cargo run --release -p attn-candle --example generate -- --compare-candle
//! cargo run --release -p attn-candle --features cuda --example generate -- \
//!     --device cuda --preset 1b --dtype bf16 --compare-candle
//! ```

use attn_candle::llama::{generate_paged, generate_plain, Generated, Llama, LlamaConfig};
use attn_candle::seeded_var_builder;
use candle_core::{DType, Device, Result};
use candle_nn::{VarBuilder, VarMap};
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(about = "Greedy generation through attn's paged KV cache")]
struct Args {
    /// `cpu`, or `cuda` (needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Safetensors files of a Llama checkpoint, comma-separated.
    #[arg(long)]
    weights: Option<String>,
    /// The checkpoint's Hugging Face config.json (default: next to the first weights file).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Sizes of the random model: `small` or `1b`.
    #[arg(long, default_value = "small")]
    preset: String,
    /// `f32`, `f16` or `bf16` (default: f32 on the CPU, bf16 on CUDA).
    #[arg(long)]
    dtype: Option<String>,
    /// Prompt tokens (seeded random ids).
    #[arg(long, default_value_t = 32)]
    prompt_len: usize,
    /// Tokens to generate.
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// Slots per page of the paged cache (a power of two from 16 to 256).
    #[arg(long, default_value_t = 16)]
    page_size: usize,
    /// Seed of the random weights and the prompt.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also generate with plain candle attention and compare.
    #[arg(long)]
    compare_candle: bool,
}

fn device(name: &str) -> Result<Device> {
    match name {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Device::new_cuda(0),
        other => candle_core::bail!("--device {other}: expected cpu or cuda"),
    }
}

/// The sizes in a Hugging Face Llama `config.json`.
fn hf_config(path: &PathBuf, max_positions: usize) -> Result<LlamaConfig> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| candle_core::Error::msg(format!("--config {}: {e}", path.display())))?;
    let j: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| candle_core::Error::msg(format!("--config {}: {e}", path.display())))?;
    let int = |key: &str| -> Result<usize> {
        j.get(key)
            .and_then(serde_json::Value::as_u64)
            .map(|x| x as usize)
            .ok_or_else(|| candle_core::Error::msg(format!("{}: no integer `{key}`", path.display())))
    };
    let (hidden, heads_q) = (int("hidden_size")?, int("num_attention_heads")?);
    Ok(LlamaConfig {
        vocab: int("vocab_size")?,
        hidden,
        intermediate: int("intermediate_size")?,
        layers: int("num_hidden_layers")?,
        heads_q,
        heads_kv: int("num_key_value_heads").unwrap_or(heads_q),
        head_dim: int("head_dim").unwrap_or(hidden / heads_q.max(1)),
        rope_theta: j.get("rope_theta").and_then(|x| x.as_f64()).unwrap_or(10_000.0),
        rms_eps: j.get("rms_norm_eps").and_then(|x| x.as_f64()).unwrap_or(1e-5),
        max_positions,
        tie_embeddings: j
            .get("tie_word_embeddings")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false),
    })
}

fn report(name: &str, prompt: usize, g: &Generated) {
    let decode = g.tokens.len().saturating_sub(1);
    println!(
        "{name:>7}: prefill {prompt} tokens in {:.3} s ({:.1} tokens/s), decode {decode} tokens in {:.3} s ({:.1} tokens/s)",
        g.prefill_s,
        prompt as f64 / g.prefill_s,
        g.decode_s,
        decode as f64 / g.decode_s.max(f64::MIN_POSITIVE),
    );
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dev = device(&args.device)?;
    let dtype = match args.dtype.as_deref() {
        None if dev.is_cpu() => DType::F32,
        None => DType::BF16,
        Some("f32") => DType::F32,
        Some("f16") => DType::F16,
        Some("bf16") => DType::BF16,
        Some(other) => candle_core::bail!("--dtype {other}: expected f32, f16 or bf16"),
    };
    let max_positions = (args.prompt_len + args.tokens).next_power_of_two().max(64);
    let varmap = VarMap::new();
    let (cfg, vb) = match &args.weights {
        Some(list) => {
            let files: Vec<PathBuf> = list.split(',').map(PathBuf::from).collect();
            let config = match &args.config {
                Some(c) => c.clone(),
                None => files[0].with_file_name("config.json"),
            };
            let cfg = hf_config(&config, max_positions)?;
            // SAFETY: the files are memory-mapped read-only and must not change while the model
            // runs, as for every candle checkpoint loaded this way.
            let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, &dev)? };
            (cfg, vb)
        }
        None => {
            let mut cfg = match args.preset.as_str() {
                "small" => LlamaConfig::small(),
                "1b" => LlamaConfig::llama_1b(),
                other => candle_core::bail!("--preset {other}: expected small or 1b"),
            };
            cfg.max_positions = max_positions;
            (cfg, seeded_var_builder(&varmap, args.seed, dtype, &dev))
        }
    };
    println!(
        "model: {} layers, width {}, heads {}/{} of {}, vocabulary {}, {dtype:?} on {:?}; prompt {} tokens, {} to generate, pages of {}",
        cfg.layers,
        cfg.hidden,
        cfg.heads_q,
        cfg.heads_kv,
        cfg.head_dim,
        cfg.vocab,
        dev.location(),
        args.prompt_len,
        args.tokens,
        args.page_size
    );
    let model = Llama::new(cfg, vb)?;
    let mut rng = StdRng::seed_from_u64(args.seed ^ 0x5eed);
    let prompt: Vec<u32> = (0..args.prompt_len.max(1))
        .map(|_| rng.random_range(0..cfg.vocab as u32))
        .collect();
    // One short untimed run of each path first: a device's first calls load kernel modules and
    // allocate pools (seconds on a GPU), which are not the cost of generating.
    let warm = &prompt[..prompt.len().min(16)];
    generate_paged(&model, warm, 2, args.page_size)?;
    let attn = generate_paged(&model, &prompt, args.tokens, args.page_size)?;
    report("attn", prompt.len(), &attn);
    println!("first tokens: {:?}", &attn.tokens[..attn.tokens.len().min(16)]);
    if args.compare_candle {
        generate_plain(&model, warm, 2)?;
        let plain = generate_plain(&model, &prompt, args.tokens)?;
        report("candle", prompt.len(), &plain);
        let k = attn.tokens.len().min(plain.tokens.len()).min(64);
        let same = attn.tokens[..k] == plain.tokens[..k];
        println!("first {k} tokens equal: {same}");
        let decode =
            |g: &Generated| g.tokens.len().saturating_sub(1) as f64 / g.decode_s.max(f64::MIN_POSITIVE);
        println!(
            "decode speed attn / candle: {:.2}x",
            decode(&attn) / decode(&plain)
        );
    }
    Ok(())
}
