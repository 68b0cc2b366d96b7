//! # attn-core
//!
//! The description of an attention call and the contract every backend implements. No CUDA, no
//! candle: just shapes, layouts, masks, family parameters, typed errors and the backend traits.
//!
//! Every family computes, per (batch, query head) slice,
//! `o_i = Σ_j w_ij v_j / Σ_j w_ij` over the keys `j` that the mask allows for query `i`, with a
//! family-specific weight `w_ij` ([`Family`]). A user describes a call as an [`AttnProblem`];
//! [`AttnProblem::validate`] checks it once and returns the [`AttnSpec`] that backends accept. A batch
//! or a sequence may be empty: backends then return empty outputs and zero-size gradients (zeros
//! with LSE −∞, Taylor denominator 0, for queries without keys).
//!
//! ```
//! use attn_core::{AttnProblem, Causal, DType, Family};
//! let spec = AttnProblem::new(Family::softmax(), DType::BF16, 2, 8, 2, 128, 256, 64)
//!     .with_causal(Causal::BottomRight)
//!     .validate()?;
//! assert_eq!(spec.group(), 4);
//! assert_eq!(spec.key_range(0, 0), 0..129);
//! # Ok::<(), attn_core::AttnError>(())
//! ```

#![warn(missing_docs)]

mod backend;
mod decode;
mod dtype;
mod error;
mod family;
mod kv_cache;
mod ring;
mod spec;

pub use backend::{AttnBackend, BackwardIo, ForwardIo};
pub use decode::DecodeShape;
pub use dtype::{round_to, DType, Element};
pub use error::{shape_str, AttnError, FamilyKind, Op, Pass, Result};
pub use family::{
    Aggregation, CosineParams, Family, FamilySpec, HypScore, HyperbolicParams, SoftmaxParams, TaylorOrder,
    TaylorParams, ACOSH_EPS, DEFAULT_L2_EPS, KLEIN_MAX_NORM2, SQ_LORENTZ_CURVATURE,
};
pub use half::{bf16, f16};
pub use kv_cache::{KvCacheProblem, KvCacheSpec, KvLayout, PAGE_SIZES};
pub use ring::{Block, Merge, RingComm, RingProblem, RingSpec};
pub use spec::{
    AttnProblem, AttnSpec, BiasShape, Causal, InputStrides, Layout, SeqLengths, SeqLens, Strides, Window,
    MAX_HEAD_DIM,
};
