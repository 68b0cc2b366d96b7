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
//! - [`step`] appends `t` tokens per batch entry. Up to `RECURRENT_T` (4) tokens run token by token
//!   (`recurrent`): one pass over the sums per token reads them into the group's outputs,
//!   `[num, den] = a0 P0 + (a1 u) P1 + Ψ(u) P2` (`Ψ(u)_(a,b) = a2 c_ab u_a u_b`, accumulated in
//!   f64), adds the token's own key by the quadratic form, and folds the key in. Longer steps (a
//!   prompt appended as one step) run the sweep from the state, as a prefill does: the new keys
//!   `0..=i` by the quadratic form or chunks, then folded in.
//!
//! Slices run in parallel with rayon, and inside a slice the sweep's probe blocks and blocks of
//! `P2` rows; every value has one owner and a fixed order, so the results do not depend on the
//! thread count. The checks are those of [`crate::decode`] (attn-core's
//! [`DecodeShape::check_step`], the buffers, the dtype); a failed call leaves the state unchanged.

use super::super::simd::{multiversion, Level};
use super::sweep::{pairs, phi_row, psi_row};
use super::{outputs, slice_forward, Params, Slice, State};
use crate::decode::{check_step, features, state_len};
use crate::{check_dtype, check_inputs, Forward, Inputs};
use attn_core::{AttnSpec, DecodeShape, Element, Pass, Result};
use rayon::prelude::*;

/// Steps of at most this many tokens per batch entry run token by token ([`recurrent`]), longer
/// ones (a prompt appended as a step) through the sweep. Token by token, each token passes over
/// the sums once (read and fold fused, no GEMM call); the sweep passes over them about three times
/// per call whatever `t` (the read, and the fold's read and write), in GEMMs that amortise their
/// calls over the tokens. Both do the same FLOPs, so the token loop wins up to about three tokens
/// of memory traffic plus the GEMM calls' overhead (at one token, order 1, the sweep's calls made
/// a step slower than the f64 state's loops).
const RECURRENT_T: usize = 4;

/// Work (sums × tokens) below which a step runs its slices on the calling thread: waking the
/// pool costs more than an order-1 step at D = 64 (4 k values per slice). The results are the
/// same either way (one task per slice).
const SERIAL_WORK: usize = 1 << 16;

/// One token of one slice, token by token: its folded features and the probes' read weights.
struct Token<'a> {
    m: usize,
    /// `ṽ = [v, 1]`.
    vt: &'a [f32],
    /// `k̂` `[D]` and `φ(k̂)` `[D(D+1)/2]` (empty for order 1).
    kh: &'a [f32],
    phi: &'a [f32],
    /// Per probe `g`: `a1 u_g` `[G, D]` and `Ψ(u_g)` `[G, D(D+1)/2]` (empty for order 1).
    w1: &'a [f32],
    w2: &'a [f32],
    /// Per probe `g`: the weight of the token's own key, `f(u_g·k̂)` `[G]`.
    own: &'a [f32],
}

/// Read the sums for every probe, then fold the token into them:
/// `out_g = Σ_f w_g,f P_f + a0 P0 + f(u_g·k̂) ṽ` (`[G, m]`), the sums over the keys before the token
/// and the token's own term by the quadratic form, as the sweep's chunk boundary splits them (through
/// the sums, a key's own term is a cancelling sum over `φ(k̂)`). One pass over the rows: each is
/// read, then updated, while in L1. The read accumulates in f64 (`part`; the sums stay f32): its
/// 2,145 terms at D = 64 cancel down to `a2 (u·k̂)²` from terms up to D times larger, and summed in
/// f32, even in blocks of 64 rows from zero, an order-2 decode of 20 tokens at D = 64 from an empty
/// state rounded o to 1.25× the naive f32 baseline's bound (fast_decode.rs). The step stays bound by
/// the pass over the f32 sums. Elementwise loops only: every level gives the same bits.
#[inline(always)]
fn token_body(st: &mut State, a0: f32, t: &Token<'_>, out: &mut [f32], part: &mut [f64]) {
    let m = t.m;
    part.fill(0.0);
    for (rows, phi, w) in [(&mut st.p1, t.kh, t.w1), (&mut st.p2, t.phi, t.w2)] {
        let n = phi.len();
        for (r, row) in rows.chunks_exact_mut(m).enumerate() {
            // part_g += w_g,f P_f (in f64), then P_f += φ_f ṽ.
            for (pg, wg) in part.chunks_exact_mut(m).zip(w.chunks_exact(n)) {
                let wf = f64::from(wg[r]);
                pg.iter_mut()
                    .zip(row.iter())
                    .for_each(|(a, p)| *a += wf * f64::from(*p));
            }
            let c = phi[r];
            row.iter_mut().zip(t.vt).for_each(|(p, v)| *p += c * v);
        }
    }
    for ((o, a), f) in out.chunks_exact_mut(m).zip(part.chunks_exact(m)).zip(t.own) {
        o.iter_mut()
            .zip(a)
            .zip(&st.p0)
            .zip(t.vt)
            .for_each(|(((o, a), p), v)| *o = (*a + f64::from(a0 * p) + f64::from(f * v)) as f32);
    }
    st.p0.iter_mut().zip(t.vt).for_each(|(p, v)| *p += v);
    st.any = true;
}

multiversion! {
    /// [`token_body`] at `level`.
    fn run_token<>(st: &mut State, a0: f32, t: &Token<'_>, out: &mut [f32], part: &mut [f64]) -> () => token_body;
}

/// A step of the slice `sl` token by token: token `i` folds its key into `st` and its `G` queries
/// read the sums over every key up to it. Returns `[num_p, den_p]` `[t·G, m]` as the sweep does.
fn recurrent(par: &Params, sl: &Slice, st: &mut State, d: usize, m: usize, level: Level) -> Vec<f32> {
    let g = sl.heads.len();
    let f2 = if st.p2.is_empty() { 0 } else { pairs(d) };
    let mut value = vec![0f32; sl.nq * g * m];
    let mut part = vec![0f64; g * m];
    let (mut phi, mut w1, mut w2) = (vec![0f32; f2], vec![0f32; g * d], vec![0f32; g * f2]);
    let mut own = vec![0f32; g];
    let p = par.poly;
    for i in 0..sl.nq {
        let kh = &sl.kh[i * d..(i + 1) * d];
        if f2 > 0 {
            phi_row(kh, &mut phi);
        }
        let probes = &sl.u[i * g * d..(i + 1) * g * d];
        for (gi, u) in probes.chunks_exact(d).enumerate() {
            w1[gi * d..(gi + 1) * d]
                .iter_mut()
                .zip(u)
                .for_each(|(w, x)| *w = p.a1 * x);
            if f2 > 0 {
                psi_row(p.a2, u, &mut w2[gi * f2..(gi + 1) * f2]);
            }
            let s: f32 = u.iter().zip(kh).map(|(a, b)| a * b).sum();
            own[gi] = p.a0 + s * (p.a1 + p.a2 * s);
        }
        let token = Token {
            m,
            vt: &sl.vt[i * m..(i + 1) * m],
            kh,
            phi: &phi,
            w1: &w1,
            w2: &w2,
            own: &own,
        };
        let out = &mut value[i * g * m..(i + 1) * g * m];
        run_token(level, st, p.a0, &token, out, &mut part);
    }
    value
}

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

    /// Fold the keys of `spec` on `x` into the state and return the outputs of its queries: a
    /// dense step of at most [`RECURRENT_T`] tokens token by token, anything else (a prompt, a
    /// longer step) through the sweep from the state.
    fn advance<E: Element>(&mut self, spec: &AttnSpec, x: &Inputs<'_, E>, step: bool) -> Forward<E, f32> {
        let (d, m, hkv) = (spec.head_dim(), spec.head_dim_v() + 1, spec.heads_kv());
        let par = self.par;
        let recurrent_step = step && spec.seq_q() <= RECURRENT_T;
        let level = Level::detect();
        let slice = |(i, st): (usize, &mut State)| {
            let sl = Slice::gather(spec, &par, x, i / hkv, i % hkv);
            let value = if recurrent_step {
                recurrent(&par, &sl, st, d, m, level)
            } else {
                slice_forward(&par, &sl, d, m, Some(st))
            };
            (sl, value)
        };
        let per_slice = self.states.first().map_or(0, |s| s.p1.len() + s.p2.len());
        let work = per_slice
            .saturating_mul(self.states.len())
            .saturating_mul(spec.seq_q());
        let results: Vec<(Slice, Vec<f32>)> = if recurrent_step && work < SERIAL_WORK {
            self.states.iter_mut().enumerate().map(slice).collect()
        } else {
            self.states.par_iter_mut().enumerate().map(slice).collect()
        };
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
    let f = state.advance(spec, &x, false);
    for (b, len) in state.lens.iter_mut().enumerate() {
        *len = spec.seq_lens(b).k;
    }
    Ok((f, state))
}

/// Append the tokens of `x` (a step spec: see [`crate::decode`]'s module doc) to `state` and return
/// their outputs in the storage dtype and their denominators in f32. The errors of
/// [`crate::decode::step`]; on an error the state is unchanged.
pub fn step<E: Element>(
    state: &mut FastDecodeState,
    spec: &AttnSpec,
    x: Inputs<'_, E>,
) -> Result<Forward<E, f32>> {
    check_step(&state.shape, spec, &x)?;
    let f = state.advance(spec, &x, true);
    let t = spec.seq_q();
    state.lens.iter_mut().for_each(|l| *l = l.saturating_add(t));
    Ok(f)
}
