//! # attn-bench
//!
//! One benchmark harness for every attention family: the `attn-bench` command line (`run` measures
//! a grid against baselines and writes JSON, a markdown table and PNG plots under
//! `target/attn-bench/`; `check` runs one call on tensors from a safetensors file, on the CPU
//! reference or on attn-cuda compared with the f64 reference), the criterion benches, and the
//! python baselines (`python/`) that write the same JSON on a GPU machine.
//!
//! Every family computes, per (batch, head), `o_i = Σ_j w_ij v_j / Σ_j w_ij` over the allowed keys
//! (docs/math.md). Work is counted the FlashAttention way ([`flops`]): `4·B·H·N²·D` for a
//! softmax-like forward (½ causal, ×3.5 for forward plus backward), and for Taylor attention its own
//! factorised count `2·B·H·(Nq + Nk)·M·(Dv + 1)` with `M` features, linear in N; for the linear
//! family the compulsory bytes and the share of a measured bandwidth are reported too.
//!
//! Code map: [`grid`] and [`plan`] (what to measure: grids, presets, sections), [`impls`] (how each
//! implementation runs a point; `attn-cuda` with the `cuda` feature), [`timing`], [`machine`] and,
//! with `cuda`, `gpu` (samples, peak memory, device, commit), [`run`] (the loop), [`schema`] (the
//! JSON rows), [`report`], [`summary`] and [`plots`] (outputs), [`check`] (the safetensors tool).

pub mod check;
pub mod error;
pub mod flops;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod grid;
pub mod impls;
pub mod machine;
pub mod plan;
pub mod plots;
pub mod report;
pub mod run;
pub mod schema;
pub mod summary;
pub mod timing;

pub use error::BenchError;
