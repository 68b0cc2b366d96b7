//! # attn-candle
//!
//! Every attention family of `attn` as a Candle op with a real backward, a drop-in
//! [`flash_attn`], a multi-head attention layer, and the pieces of a small language model to train
//! with it.
//!
//! Every family computes, per (batch, query head) slice, `o_i = Σ_j w_ij v_j / Σ_j w_ij` over the
//! keys `j` that the mask allows for query `i` (docs/math.md): softmax `w = exp(scale·q·k + bias)`,
//! cosine-sim `w = exp(scale·q̂·k̂ − scale)`, Taylor `w = a0 + a1·s + a2·s²`, hyperbolic
//! `w = exp(−β·d(q, k))` on the Lorentz hyperboloid. Tensors are `(batch, seq, heads, dim)` as in
//! candle and FlashAttention (`[B, H, N, D]` with [`attn_core::Layout::Bhnd`]); packed
//! variable-length batches are `[total, heads, dim]` with `cu_seqlens`.
//!
//! - [`attention`] is the one general entry point: family, causal alignment, sliding window,
//!   differentiable additive bias, key padding or packed varlen lengths, GQA (from the shapes).
//! - [`flash_attn`] and [`flash_attn_varlen`] have exactly candle-flash-attn's signatures and
//!   layout semantics (bottom-right causal), so a candle-transformers model switches with one line,
//!   and unlike candle-flash-attn they train.
//! - Generation: [`flash_attn_with_kvcache`] (FlashAttention's KV-cache step: the new tokens
//!   written into a contiguous or paged cache in place, then attention over the real lengths), the
//!   caches [`KvCache`], [`PagedKvCache`] and [`TaylorCache`] behind [`AttnCache`], and
//!   [`DecoderAttention`], a decoder's attention block with rotary embeddings that prefills and
//!   decodes through any of them (`examples/generate.rs`: greedy generation with a Llama model).
//! - [`MultiHeadAttention`] is a layer built from a `VarBuilder`; [`TransformerLm`] stacks it into a
//!   small causal language model, and [`mqar`] trains one on multi-query associative recall.
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! let dev = Device::Cpu;
//! let q = Tensor::randn(0f32, 1.0, (2, 5, 4, 16), &dev)?;
//! let k = Tensor::randn(0f32, 1.0, (2, 7, 2, 16), &dev)?;
//! let v = Tensor::randn(0f32, 1.0, (2, 7, 2, 16), &dev)?;
//! let o = attn_candle::flash_attn(&q, &k, &v, 0.25, true)?;
//! assert_eq!(o.dims(), &[2, 5, 4, 16]);
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! ## Devices
//! The ops run attn-cpu-ref on CPU tensors, in their storage dtype (f32, f16, bf16; f64
//! accumulation inside). With the `cuda` feature, CUDA tensors run attn-cuda's kernels on candle's
//! own stream, forward and backward (every family attn-cuda runs; f32, f16, bf16); a family, head
//! dim or option attn-cuda does not implement is a typed `Unsupported` error naming the op and the
//! shapes, never a fallback. `cargo xtask setup-candle-cuda` prints the environment that builds the
//! feature on a machine without CUDA.

#![warn(missing_docs)]

mod api;
mod cache;
mod decoder;
mod error;
mod kv_cache;
mod layer;
pub mod llama;
mod model;
pub mod mqar;
mod op;

pub use api::{attention, attention_with_stats, flash_attn, flash_attn_varlen, AttnOptions};
pub use cache::{AttnCache, KvCache, PagedKvCache, TaylorCache};
pub use decoder::{DecoderAttention, DecoderAttentionConfig, Rotary};
pub use error::to_candle;
pub use kv_cache::{flash_attn_with_kvcache, kv_cache_attention, KvAttnOptions};
pub use layer::{AttentionConfig, MultiHeadAttention};
pub use model::{seeded_var_builder, LmConfig, TransformerLm};

pub use attn_core::{
    Aggregation, Causal, CosineParams, Family, HypScore, HyperbolicParams, Layout, SeqLengths, SoftmaxParams,
    TaylorParams, Window,
};
