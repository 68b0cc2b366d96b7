//! Recurrent Taylor decode on the fast path: the sums of [`crate::decode`] (its module doc states
//! the math) in f32, built and read with the GEMMs of the chunked sweep.
//!
//! Per (batch entry, kv head), with `k̂_j`, `ṽ_j = [v_j, 1]` (`m = Dv + 1`) and `u_i = scale·q̂_i`,
//! the state is `P0 = Σ_j ṽ_j`, `P1 = K̂ᵀ Ṽ` `[D, m]` and, for order 2, `P2 = Φ(K̂)ᵀ Ṽ`
//! `[D(D+1)/2, m]` with `Φ(k)_(a,b) = k_a k_b` over the pairs `a ≤ b` (row-major): the
//! [`crate::decode`] state's rows `[F, m]`, `F = 1 + D (+ D(D+1)/2)`.
//!
//! - [`prefill`] runs the fast forward's sweep of each slice (`super::slice_forward`) on the prompt
//!   and keeps its states: the keys the sweep folded to read its probes stay folded, the rest are
//!   folded at the end, `Φ(K̂)ᵀ Ṽ` as GEMMs over tiles of 64 keys. The chunk comes from the planner
//!   with the folds counted as already paid (they are needed for the state anyway), so a prompt
//!   reads the states from about 2,100 tokens on at D = 64 order 2 (causal), from the first chunk
//!   for order 1, and below that runs the quadratic form and folds once.
//! - [`step`] appends `t` tokens per batch entry: the same sweep started from the state, so new
//!   token `i` reads the state, `[num, den] = a0 P0 + (a1 u) P1 + Ψ(u) P2` (`Ψ(u)_(a,b) =
//!   a2 c_ab u_a u_b`, a GEMM over the group's `G·t` queries, a GEMV for one), plus the new keys
//!   `0..=i` by the quadratic form; then the new keys are folded in (a rank-`t` update). `t` large
//!   (a prompt appended as one step) goes through chunks as a prefill does.
//!
//! Slices run in parallel with rayon, and inside a slice the sweep's probe blocks and blocks of
//! `P2` rows; every value has one owner and a fixed order, so the results do not depend on the
//! thread count. The checks are those of [`crate::decode`] (attn-core's
//! [`DecodeShape::check_step`], the buffers, the dtype); a failed call leaves the state unchanged.

use super::{outputs, slice_forward, Params, Slice, State};
use crate::decode::{check_step, features, state_len};
use crate::{check_dtype, check_inputs, Forward, Inputs};
use attn_core::{AttnSpec, DecodeShape, Element, Pass, Result};
use rayon::prelude::*;

/// The f32 sums `P0, P1, P2` of every (batch entry, kv head), carried between decode calls.
#[derive(Clone, Debug)]
pub struct FastDecodeState {
    shape: DecodeShape,
    par: Params,
    /// Tokens folded so far, per batch entry.
    lens: Vec<usize>,
    /// The states of slice `b·Hkv + kv head`.
    states: Vec<State>,
}

impl FastDecodeState {
    /// A state with no token folded yet (decoding from an empty prompt). `InvalidArgument` naming
    /// `family` for a spec that is not Taylor's; `TooLarge` where the sums of every (batch entry,
    /// kv head) would pass `isize::MAX` bytes.
    pub fn empty(spec: &AttnSpec) -> Result<Self> {
        let shape = DecodeShape::of(spec, Pass::Decode)?;
        let (order, ..) = shape.taylor()?;
        state_len(&shape, features(order, shape.head_dim), 4)?;
        let Some(par) = Params::of(spec) else {
            // Internal invariant: `DecodeShape::of` accepted the spec, so its family is Taylor's.
            unreachable!("a decode shape holds a Taylor family")
        };
        let one = State::new(shape.head_dim, shape.width(), par.poly.a2 != 0.0);
        Ok(FastDecodeState {
            shape,
            par,
            lens: vec![0; shape.batch],
            states: vec![one; shape.batch * shape.heads_kv],
        })
    }

    /// What the state was built for; every step's spec must match it.
    pub fn shape(&self) -> &DecodeShape {
        &self.shape
    }

    /// Tokens folded so far into each batch entry.
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// Whether no batch entry has a token yet.
    pub fn is_empty(&self) -> bool {
        self.lens.iter().all(|&l| l == 0)
    }

    /// The sums of batch entry `b`, kv head `hk` as `[F, m]` row-major, the rows of
    /// [`crate::decode::DecodeState::sums`]; `None` for an entry or head the state does not have.
    pub fn sums(&self, b: usize, hk: usize) -> Option<Vec<f32>> {
        if b >= self.shape.batch || hk >= self.shape.heads_kv {
            return None;
        }
        let st = &self.states[b * self.shape.heads_kv + hk];
        Some([&st.p0[..], &st.p1, &st.p2].concat())
    }

    /// Run the sweep of every slice of `spec` on `x` from its state and return the outputs.
    fn advance<E: Element>(&mut self, spec: &AttnSpec, x: &Inputs<'_, E>) -> Forward<E, f32> {
        let (d, m, hkv) = (spec.head_dim(), spec.head_dim_v() + 1, spec.heads_kv());
        let par = self.par;
        let results: Vec<(Slice, Vec<f32>)> = self
            .states
            .par_iter_mut()
            .enumerate()
            .map(|(i, st)| {
                let sl = Slice::gather(spec, &par, x, i / hkv, i % hkv);
                let value = slice_forward(&par, &sl, d, m, Some(st));
                (sl, value)
            })
            .collect();
        outputs(spec, results)
    }
}

/// Prefill: the fast forward of a prompt (any Taylor spec: causal or not, key padding, packed
/// varlen; o in the storage dtype, the denominators in f32) and the state over each batch entry's
/// valid keys. The errors of [`crate::decode::prefill`].
pub fn prefill<E: Element>(spec: &AttnSpec, x: Inputs<'_, E>) -> Result<(Forward<E, f32>, FastDecodeState)> {
    check_dtype::<E>(spec, Pass::Decode)?;
    let mut state = FastDecodeState::empty(spec)?;
    check_inputs(spec, Pass::Forward, &x)?;
    let f = state.advance(spec, &x);
    for (b, len) in state.lens.iter_mut().enumerate() {
        *len = spec.seq_lens(b).k;
    }
    Ok((f, state))
}

/// Append the tokens of `x` (a step spec: see [`crate::decode`]'s module doc) to `state` and return
/// their outputs in the storage dtype and their denominators in f32. The errors of
/// [`crate::decode::step`]; on an error the state is unchanged.
pub fn step<E: Element>(state: &mut FastDecodeState, spec: &AttnSpec, x: Inputs<'_, E>) -> Result<Forward<E, f32>> {
    check_step(&state.shape, spec, &x)?;
    let f = state.advance(spec, &x);
    let t = spec.seq_q();
    state.lens.iter_mut().for_each(|l| *l = l.saturating_add(t));
    Ok(f)
}
