//! The backend traits: what the CPU reference, the CUDA kernels and the Candle ops implement.
//!
//! A backend is generic over its buffer type `B` (host slices `[E]`, device slices, ...) and its
//! statistics buffer `S` (always f32 elements). Both passes take a checked [`AttnSpec`]; buffer
//! lengths are checked against the spec's `*_len()` before any work.
//!
//! Statistics saved by the forward, one f32 per (batch, query head, query): the log-sum-exp
//! `LSE_i = m_i + log Σ_j w_ij` for the softmax-like families (−∞ for a row with no allowed key),
//! the denominator `den_i = Σ_j f(s_ij)` for Taylor (0 for a row with no allowed key).

use crate::{AttnError, AttnSpec};

/// Inputs and outputs of a forward pass.
pub struct ForwardIo<'a, B: ?Sized, S: ?Sized> {
    /// Queries, `spec.q_len()` elements in the spec's layout.
    pub q: &'a B,
    /// Keys, `spec.k_len()` elements.
    pub k: &'a B,
    /// Values, `spec.v_len()` elements.
    pub v: &'a B,
    /// Required exactly when the spec has a bias.
    pub bias: Option<&'a B>,
    /// `[B, Nq, Hq, Dv]` (contiguous in the spec's layout); fully overwritten.
    pub o: &'a mut B,
    /// LSE or Taylor denominators; fully overwritten.
    pub stats: &'a mut S,
}

/// Inputs and outputs of a backward pass. Gradients are fully overwritten (never accumulated into).
pub struct BackwardIo<'a, B: ?Sized, S: ?Sized> {
    /// The forward's queries.
    pub q: &'a B,
    /// The forward's keys.
    pub k: &'a B,
    /// The forward's values.
    pub v: &'a B,
    /// The forward's bias; present exactly when the spec has one.
    pub bias: Option<&'a B>,
    /// The forward's output.
    pub o: &'a B,
    /// dL/do, same layout as o.
    pub d_o: &'a B,
    /// The forward's statistics.
    pub stats: &'a S,
    /// dL/dq, same length as q; fully overwritten.
    pub dq: &'a mut B,
    /// dL/dk, same length as k (summed over the query heads of a GQA group); fully overwritten.
    pub dk: &'a mut B,
    /// dL/dv, same length as v (summed like dk); fully overwritten.
    pub dv: &'a mut B,
    /// Required exactly when the spec has a bias: dL/dbias, summed over broadcast dims.
    pub dbias: Option<&'a mut B>,
}

/// A forward and backward implementation of every family for one buffer type.
pub trait AttnBackend<B: ?Sized, S: ?Sized> {
    /// The backend's error; every [`AttnError`] converts into it.
    type Error: From<AttnError>;

    /// Name used in `Unsupported` errors, e.g. `attn-cpu-ref`.
    fn name(&self) -> &'static str;

    /// Run the forward pass of `spec`: write `io.o` and `io.stats`.
    fn forward(&self, spec: &AttnSpec, io: ForwardIo<'_, B, S>) -> Result<(), Self::Error>;

    /// Run the backward pass of `spec`: write `io.dq`, `io.dk`, `io.dv` and `io.dbias`.
    fn backward(&self, spec: &AttnSpec, io: BackwardIo<'_, B, S>) -> Result<(), Self::Error>;
}
