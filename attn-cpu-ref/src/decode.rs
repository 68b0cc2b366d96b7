//! Recurrent decode for Taylor linear attention (docs/math.md §3, "Decode"): the reference that the
//! GPU decode is tested against.
//!
//! Per (batch entry `b`, kv head), with `k̂_j` (l2-normalised when `qk_l2norm`), `ṽ_j = [v_j, 1]`
//! (`m = Dv + 1`) and `u_i = scale·q̂_i`, the keys seen so far fold into running sums that do not
//! depend on any query:
//!
//! - `P0 = Σ_j ṽ_j` `[m]`, `P1 = Σ_j k̂_j ṽ_jᵀ` `[D, m]`,
//! - order 2 only: `P2 = Σ_j (k̂_j⊗k̂_j) ṽ_jᵀ` over the `D(D+1)/2` pairs `a ≤ b` (row-major).
//!
//! A query reads them as `[num_i, den_i] = a0 P0 + a1 P1ᵀ u_i + a2 Σ_{a≤b} c_ab u_ia u_ib P2[(a,b)]`
//! with `c_ab = 2` off the diagonal and 1 on it, and `o_i = num_i / den_i`: the same sums as the
//! forward's (`taylor.rs`), so a prompt prefilled in one call and continued token by token gives the
//! causal forward of the whole sequence.
//!
//! - [`prefill_f64`] runs the forward of a prompt (any Taylor spec: causal or not, key padding,
//!   packed varlen) and returns the sums over each batch entry's valid keys.
//! - [`step_f64`] appends `t` new tokens per batch entry: new token `i` (its query, key and value)
//!   sees every key folded before the call plus the new keys `0..=i`. Each token costs
//!   `O(F·m)` per kv head with `F = 1 + D` (order 1) or `1 + D + D(D+1)/2` (order 2): `O(D^p·Dv)`.
//! - [`prefill`] and [`step`] are the same on storage dtypes (f64 inside, outputs rounded once).
//!
//! A step's spec describes only the new tokens: a dense batch with `seq_q = seq_k = t` and a causal
//! mask, and the state's family, dtype, batch and head shapes. Anything else is a typed error naming
//! the argument (`state`, `lengths`, `causal`, `seq_k`): attn-core's [`DecodeShape::check_step`], the
//! same check as the GPU decode's.

use crate::{check_dtype, narrow, widen, Forward, Inputs};
use attn_core::{AttnError, AttnSpec, DecodeShape, Element, FamilyKind, Op, Pass, Result, TaylorOrder};

/// The shapes and parameters a [`DecodeState`] was built for: attn-core's [`DecodeShape`], the same
/// type the GPU decode wraps.
pub type StateShape = DecodeShape;

/// The family's parameters in f64: `order`, `[a0, a1, a2]`, `scale`, `qk_l2norm`, `eps`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Params {
    order: TaylorOrder,
    a: [f64; 3],
    scale: f64,
    l2: bool,
    eps: f64,
}

impl Params {
    fn of(shape: &DecodeShape) -> Result<Self> {
        let (order, a, scale, l2, eps) = shape.taylor()?;
        Ok(Params {
            order,
            a: a.map(f64::from),
            scale: scale as f64,
            l2,
            eps: eps as f64,
        })
    }
}

/// The running sums `P0, P1, P2` of every (batch entry, kv head), carried between decode calls.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeState {
    shape: DecodeShape,
    params: Params,
    /// Tokens folded so far, per batch entry.
    lens: Vec<usize>,
    /// `[B, Hkv, F, m]`: rows `P0`, then `P1[a]`, then `P2[(a, b)]` for `a ≤ b`.
    sums: Vec<f64>,
}

impl DecodeState {
    /// A state with no token folded yet (decoding from an empty prompt).
    pub fn empty(spec: &AttnSpec) -> Result<Self> {
        let shape = DecodeShape::of(spec, Pass::Decode)?;
        let params = Params::of(&shape)?;
        let len = state_len(&shape, features(params.order, shape.head_dim), 8)?;
        Ok(DecodeState {
            shape,
            params,
            lens: vec![0; shape.batch],
            sums: vec![0.0; len],
        })
    }

    /// What the state was built for; every step's spec must match it.
    pub fn shape(&self) -> &DecodeShape {
        &self.shape
    }

    /// Rows of the sums per (batch entry, kv head): `F = 1 + D` (+ `D(D+1)/2` for order 2).
    pub fn features(&self) -> usize {
        features(self.params.order, self.shape.head_dim)
    }

    /// Tokens folded so far into batch entry `b`.
    pub fn len(&self, b: usize) -> usize {
        self.lens[b]
    }

    /// Whether no batch entry has a token yet.
    pub fn is_empty(&self) -> bool {
        self.lens.iter().all(|&l| l == 0)
    }

    /// The sums of batch entry `b`, kv head `hk`: `[F, m]` row-major (see the module doc).
    pub fn sums(&self, b: usize, hk: usize) -> &[f64] {
        let n = self.features() * self.shape.width();
        let at = (b * self.shape.heads_kv + hk) * n;
        &self.sums[at..at + n]
    }

    fn sums_mut(&mut self, b: usize, hk: usize) -> &mut [f64] {
        let n = self.features() * self.shape.width();
        let at = (b * self.shape.heads_kv + hk) * n;
        &mut self.sums[at..at + n]
    }
}

/// `F = 1 + D` (+ `D(D+1)/2` for order 2): `P0`, `P1` and, for order 2, `P2`. At most 33,153
/// (`D ≤ MAX_HEAD_DIM` = 256).
pub(crate) fn features(order: TaylorOrder, d: usize) -> usize {
    match order {
        TaylorOrder::One => 1 + d,
        TaylorOrder::Two => 1 + d + d * (d + 1) / 2,
    }
}

/// The values of a state of `shape` with `rows` feature rows, `B·Hkv·rows·m`, where that many
/// values of `elem` bytes fit in `isize::MAX` bytes; `TooLarge` naming `batch` otherwise (batch
/// and heads may each be up to 2³¹ − 1).
pub(crate) fn state_len(shape: &DecodeShape, rows: usize, elem: usize) -> Result<usize> {
    let len = shape
        .batch
        .checked_mul(shape.heads_kv)
        .and_then(|n| n.checked_mul(rows))
        .and_then(|n| n.checked_mul(shape.width()));
    match len {
        Some(l) if l <= isize::MAX as usize / elem => Ok(l),
        _ => Err(AttnError::TooLarge {
            op: Op::new(FamilyKind::Taylor, Pass::Decode),
            arg: "batch",
            shapes: format!(
                "batch {}, heads {}/{}, head dims {}/{}",
                shape.batch, shape.heads_q, shape.heads_kv, shape.head_dim, shape.head_dim_v
            ),
            reason: format!(
                "a state of batch·heads_kv·{rows}·{} values of {elem} bytes passes isize::MAX bytes",
                shape.width()
            ),
        }),
    }
}

/// `x̂` of a row (l2-normalised when `qk_l2norm`), as the forward computes it.
fn normalised(row: &[f64], l2norm: bool, eps: f64) -> Vec<f64> {
    // A non-finite entry makes the row NaN, as in the forward (taylor.rs, `Params::load`).
    if row.iter().any(|x| !x.is_finite()) {
        return vec![f64::NAN; row.len()];
    }
    if !l2norm {
        return row.to_vec();
    }
    let r = row.iter().map(|x| x * x).sum::<f64>().sqrt().max(eps);
    row.iter().map(|x| x / r).collect()
}

/// Fold one key `k̂` with value `v` into the sums `[F, m]`: `P0 += ṽ`, `P1 += k̂ ṽᵀ`, `P2 += (k̂⊗k̂) ṽᵀ`.
fn fold(sums: &mut [f64], order: TaylorOrder, kh: &[f64], v: &[f64]) {
    let m = v.len() + 1;
    let d = kh.len();
    let mut add = |row: usize, c: f64| {
        let r = &mut sums[row * m..(row + 1) * m];
        for (x, vi) in r.iter_mut().zip(v) {
            *x += c * vi;
        }
        r[m - 1] += c;
    };
    add(0, 1.0);
    for (a, &ka) in kh.iter().enumerate() {
        add(1 + a, ka);
    }
    if order == TaylorOrder::Two {
        let mut row = 1 + d;
        for a in 0..d {
            for b in a..d {
                add(row, kh[a] * kh[b]);
                row += 1;
            }
        }
    }
}

/// `[num, den] = a0 P0 + a1 P1ᵀ u + a2 Σ_{a≤b} c_ab u_a u_b P2[(a,b)]` for one query `u = scale·q̂`.
fn read(sums: &[f64], order: TaylorOrder, a: [f64; 3], u: &[f64], m: usize) -> Vec<f64> {
    let d = u.len();
    let mut out = vec![0.0; m];
    let mut add = |row: usize, c: f64| {
        for (o, s) in out.iter_mut().zip(&sums[row * m..(row + 1) * m]) {
            *o += c * s;
        }
    };
    add(0, a[0]);
    for (i, &ui) in u.iter().enumerate() {
        add(1 + i, a[1] * ui);
    }
    if order == TaylorOrder::Two {
        let mut row = 1 + d;
        for i in 0..d {
            for j in i..d {
                let c = if i == j { 1.0 } else { 2.0 };
                add(row, a[2] * c * u[i] * u[j]);
                row += 1;
            }
        }
    }
    out
}

/// The buffers of a decode call against `spec`: q, k and v of its lengths, no bias.
pub(crate) fn check_inputs<T>(spec: &AttnSpec, pass: Pass, x: &Inputs<'_, T>) -> Result<()> {
    spec.check_len(pass, "q", x.q.len(), spec.q_len())?;
    spec.check_len(pass, "k", x.k.len(), spec.k_len())?;
    spec.check_len(pass, "v", x.v.len(), spec.v_len())?;
    if x.bias.is_some() {
        return Err(AttnError::ShapeMismatch {
            op: spec.op(pass),
            what: "bias".into(),
            expected: "no bias (Taylor attention has none)".into(),
            got: "a bias buffer".into(),
        });
    }
    Ok(())
}

/// The checks of a step on storage-dtype buffers, before the state is touched: the dtype, the
/// spec against the state's shape ([`DecodeShape::check_step`]), then the buffers.
pub(crate) fn check_step<E: Element>(shape: &DecodeShape, spec: &AttnSpec, x: &Inputs<'_, E>) -> Result<()> {
    check_dtype::<E>(spec, Pass::Decode)?;
    shape.check_step(spec)?;
    check_inputs(spec, Pass::Decode, x)
}

/// Fold every valid key of every batch entry of `spec` into a fresh state.
fn fold_all(spec: &AttnSpec, x: &Inputs<'_, f64>) -> Result<DecodeState> {
    let mut state = DecodeState::empty(spec)?;
    let Params { order, l2, eps, .. } = state.params;
    let (d, dv) = (spec.head_dim(), spec.head_dim_v());
    for b in 0..spec.batch() {
        let nk = spec.seq_lens(b).k;
        for hk in 0..spec.heads_kv() {
            let sums = state.sums_mut(b, hk);
            for j in 0..nk {
                let ko = spec.k_offset(b, j, hk);
                let vo = spec.v_offset(b, j, hk);
                fold(
                    sums,
                    order,
                    &normalised(&x.k[ko..ko + d], l2, eps),
                    &x.v[vo..vo + dv],
                );
            }
        }
        state.lens[b] = nk;
    }
    Ok(state)
}

/// Prefill on f64 data: the forward of the prompt (o and the denominators) and the state over each
/// batch entry's valid keys.
pub fn prefill_f64(spec: &AttnSpec, x: Inputs<'_, f64>) -> Result<(Forward<f64, f64>, DecodeState)> {
    DecodeShape::of(spec, Pass::Decode)?;
    // The forward checks every buffer against the spec before the keys are folded.
    let f = crate::forward_f64(spec, x)?;
    let state = fold_all(spec, &x)?;
    Ok((f, state))
}

/// Append the tokens of `x` (described by `spec`: see the module doc) to `state` and return their
/// outputs and denominators, on f64 data.
pub fn step_f64(state: &mut DecodeState, spec: &AttnSpec, x: Inputs<'_, f64>) -> Result<Forward<f64, f64>> {
    state.shape.check_step(spec)?;
    check_inputs(spec, Pass::Decode, &x)?;
    let Params {
        order,
        a,
        scale,
        l2,
        eps,
    } = state.params;
    let (d, dv, m, t) = (
        spec.head_dim(),
        spec.head_dim_v(),
        state.shape.width(),
        spec.seq_q(),
    );
    let mut o = vec![0.0; spec.o_len()];
    let mut stats = vec![0.0; spec.stats_len()];
    for b in 0..spec.batch() {
        for hk in 0..spec.heads_kv() {
            let heads: Vec<usize> = (0..spec.heads_q()).filter(|&h| spec.kv_head(h) == hk).collect();
            for i in 0..t {
                let ko = spec.k_offset(b, i, hk);
                let vo = spec.v_offset(b, i, hk);
                let kh = normalised(&x.k[ko..ko + d], l2, eps);
                fold(state.sums_mut(b, hk), order, &kh, &x.v[vo..vo + dv]);
                for &h in &heads {
                    let qo = spec.q_offset(b, i, h);
                    let u: Vec<f64> = normalised(&x.q[qo..qo + d], l2, eps)
                        .into_iter()
                        .map(|x| scale * x)
                        .collect();
                    let nd = read(state.sums(b, hk), order, a, &u, m);
                    let oo = spec.o_offset(b, i, h);
                    for (dst, n) in o[oo..oo + dv].iter_mut().zip(&nd) {
                        *dst = n / nd[dv];
                    }
                    stats[spec.stats_index(b, h, i)] = nd[dv];
                }
            }
        }
        state.lens[b] += t;
    }
    Ok(Forward { o, stats })
}

/// [`prefill_f64`] on storage-dtype data: f64 inside, o rounded to `E`, denominators to f32.
pub fn prefill<E: Element>(spec: &AttnSpec, x: Inputs<'_, E>) -> Result<(Forward<E, f32>, DecodeState)> {
    check_dtype::<E>(spec, Pass::Decode)?;
    DecodeShape::of(spec, Pass::Decode)?;
    // The forward checks every buffer against the spec before the keys are folded.
    let f = crate::forward(spec, x)?;
    let state = {
        let (q, k, v) = (widen(x.q), widen(x.k), widen(x.v));
        fold_all(
            spec,
            &Inputs {
                q: &q,
                k: &k,
                v: &v,
                bias: None,
            },
        )?
    };
    Ok((f, state))
}

/// [`step_f64`] on storage-dtype data: f64 inside (the state stays f64), outputs rounded once.
pub fn step<E: Element>(
    state: &mut DecodeState,
    spec: &AttnSpec,
    x: Inputs<'_, E>,
) -> Result<Forward<E, f32>> {
    check_step(&state.shape, spec, &x)?;
    let (q, k, v) = (widen(x.q), widen(x.k), widen(x.v));
    let f = step_f64(
        state,
        spec,
        Inputs {
            q: &q,
            k: &k,
            v: &v,
            bias: None,
        },
    )?;
    Ok(Forward {
        o: narrow(&f.o),
        stats: f.stats.iter().map(|&s| s as f32).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_then_read_is_the_sum_of_f_over_the_folded_keys() {
        let (order, a) = (TaylorOrder::Two, [0.7, -0.4, 0.3]);
        let keys = [[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]];
        let vals = [[1.0, -2.0], [0.5, 3.0]];
        let u = [0.2, -0.3, 0.9];
        let mut sums = vec![0.0; (1 + 3 + 6) * 3];
        for (k, v) in keys.iter().zip(&vals) {
            fold(&mut sums, order, k, v);
        }
        let got = read(&sums, order, a, &u, 3);
        let mut want = [0.0; 3];
        for (k, v) in keys.iter().zip(&vals) {
            let s: f64 = k.iter().zip(&u).map(|(x, y)| x * y).sum();
            let f = a[0] + a[1] * s + a[2] * s * s;
            want[0] += f * v[0];
            want[1] += f * v[1];
            want[2] += f;
        }
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    }
}
