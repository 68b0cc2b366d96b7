//! Taylor linear attention (docs/math.md §3), forward and backward through factorised states.
//!
//! Per (batch entry, query head): `q̂_i = q_i / max(‖q_i‖, eps)` and `k̂_j` likewise when `qk_l2norm`
//! (otherwise `q̂ = q`, `k̂ = k`), the scale folded into the query `u_i = scale·q̂_i`, scores
//! `s_ij = u_i·k̂_j`, weights `f(s) = a0 + a1 s + a2 s²` (`a2 = 0` for order 1) and
//!
//! `o_i = num_i / den_i`, `num_i = Σ_j f(s_ij) v_j`, `den_i = Σ_j f(s_ij)` over the keys `j < hi(i)`
//! of `spec.key_range(b, i)` (Taylor specs have no window, so every range starts at 0; with causal
//! masks `hi(i)` is nondecreasing in `i`). `stats` holds `den_i`.
//!
//! ## Forward through states
//! Append a constant 1 to every value, `ṽ_j = [v_j, 1]` (`m = Dv + 1`), so one set of states gives
//! both `num` and `den`. Over the keys `j < hi`:
//! `P0 = Σ_j ṽ_j`, `P1 = Σ_j k̂_j ṽ_jᵀ` `[D, m]`, `P2 = Σ_j (k̂_j⊗k̂_j) ṽ_jᵀ` `[D(D+1)/2, m]`, and
//!
//! `[num_i, den_i] = a0 P0 + a1 P1ᵀ u_i + a2 P2ᵀ (u_i⊗u_i)`,
//!
//! i.e. `num_i = a0 Σ v_j + a1 u_iᵀ Σ k̂_j v_jᵀ + a2 (u_i⊗u_i)ᵀ Σ (k̂_j⊗k̂_j) v_jᵀ` and
//! `den_i = a0 n_i + a1 u_i·Σ k̂_j + a2 u_iᵀ (Σ k̂_j k̂_jᵀ) u_i`. Symmetry of `k̂⊗k̂` keeps `D(D+1)/2`
//! features. Non-causal: every query of a (batch entry, kv head) reads the states of all its valid
//! keys. Causal: a prefix sweep over the keys, 64 keys at a time: query `i` reads the states of the
//! keys before its chunk and sums `f(s_ij) ṽ_j` densely over the rest (the [`sweep`] module).
//! GQA: the query heads of a group are probes of the same states.
//!
//! ## Backward through states
//! With `g_i = dL/do_i`, `ĝ_i = g_i / den_i`, `δ_i = ĝ_i·o_i` and `g̃_i = [ĝ_i, −δ_i]`:
//! `dL = Σ_i g̃_i·d[num_i, den_i]`, so `dṽ_j = Σ_i f(s_ij) g̃_i` (`dV_j` is its first `Dv` entries,
//! `Σ_i f(s_ij) ĝ_i`) and `dL/ds_ij = f'(s_ij) (g̃_i·ṽ_j) = f'(s_ij) (ĝ_i·v_j − δ_i)` with
//! `f'(s) = a1 + 2 a2 s`. In state form:
//!
//! - `dû_i = Σ_j f'(s_ij)(g̃_i·ṽ_j) k̂_j = a1 P1 g̃_i + 2 a2 W_i u_i`, `W_i = Σ_j k̂_j k̂_jᵀ (g̃_i·ṽ_j)`,
//!   whose `(a, b)` entry is `P2[(a,b)]·g̃_i`: the forward's key states, read with `g̃_i`.
//!   `dq̂_i = scale·dû_i`.
//! - Key `j` is seen by the queries `i` with `j < hi(i)`: a suffix `i ≥ i0(j)`. Over it (and over the
//!   group's query heads) the query states `R0 = Σ_i g̃_i`, `R1 = Σ_i u_i g̃_iᵀ`,
//!   `R2 = Σ_i (u_i⊗u_i) g̃_iᵀ` give
//!   `dṽ_j = a0 R0 + a1 R1ᵀ k̂_j + a2 R2ᵀ (k̂_j⊗k̂_j)` and
//!   `dk̂_j = Σ_i f'(s_ij)(g̃_i·ṽ_j) u_i = a1 R1 ṽ_j + 2 a2 M_j k̂_j`, `M_j = Σ_i u_i u_iᵀ (g̃_i·ṽ_j)`.
//!   This is the forward sweep with the roles of queries and keys exchanged, run over the queries in
//!   reverse order (suffix states), so the sum over the group is the GQA reduction of dK and dV.
//! - Through the l2-norm: `dx = (dx̂ − x̂ (x̂·dx̂)) / ‖x‖` when `‖x‖ > eps`, else `dx = dx̂ / eps`.
//!
//! Cost per (batch entry, kv head): `O(N·D²·Dv)` for order 2, `O(N·D·Dv)` for order 1; memory
//! `O(N·(D + Dv) + D²·Dv)`. Work is spread with rayon over (batch entry, kv head) and, inside a
//! sweep, over blocks of probes and rows of `P2`.
//!
//! ## Edge cases
//! - A row with no allowed key (causal bottom-right with `Nq > Nk`, a key length of 0) returns
//!   `o_i = 0`, `den_i = 0` and contributes nothing to any gradient: `g̃_i = 0`, never a NaN.
//! - Order 2 with validated coefficients has `f(s) ≥ a0 − a1²/(4 a2) > 0`, so every non-empty row has
//!   `den_i > 0` for any input magnitude.
//! - Order 1 has no such floor: `f(s) = a0 + a1 s` changes sign at `s = −a0/a1`, and `den_i` can pass
//!   through 0. The reference returns `num_i / den_i` exactly as computed: as `den_i → 0` the output
//!   grows like `1/den_i` and flips sign across 0 (non-finite only if `den_i` is exactly 0). Order 1 is
//!   meant for l2-normalised q, k with `|a1|·scale < a0`, which gives `f ≥ a0 − |a1|·scale > 0`.

/// The dense quadratic form: the cross-check of the factorised path in the unit tests below.
#[cfg(test)]
mod dense;
mod gemm;
mod sweep;

use crate::{Gradients, Inputs};
use attn_core::{AttnSpec, FamilySpec};
use rayon::prelude::*;
use sweep::{sweep, Probes, Sources, Sweep};

/// `f(s) = a0 + a1 s + a2 s²` and its derivative.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Poly {
    pub a0: f64,
    pub a1: f64,
    pub a2: f64,
}

impl Poly {
    pub(crate) fn f(self, s: f64) -> f64 {
        self.a0 + s * (self.a1 + self.a2 * s)
    }
    pub(crate) fn df(self, s: f64) -> f64 {
        self.a1 + 2.0 * self.a2 * s
    }
}

/// The Taylor parameters of a spec, in f64.
#[derive(Clone, Copy, Debug)]
struct Params {
    poly: Poly,
    scale: f64,
    l2norm: bool,
    eps: f64,
}

impl Params {
    fn of(spec: &AttnSpec) -> Self {
        // Internal invariant: lib.rs sends every non-softmax-like spec here, and Taylor is the only such
        // family.
        let FamilySpec::Taylor {
            a,
            scale,
            qk_l2norm,
            eps,
            ..
        } = *spec.family()
        else {
            unreachable!("the Taylor reference is only called with Taylor specs")
        };
        Params {
            poly: Poly {
                a0: a[0] as f64,
                a1: a[1] as f64,
                a2: a[2] as f64,
            },
            scale: scale as f64,
            l2norm: qk_l2norm,
            eps: eps as f64,
        }
    }

    /// Copy `row` into `dst` as `x̂` (l2-normalised when `qk_l2norm`); returns `‖x‖`.
    fn load(&self, row: &[f64], dst: &mut [f64]) -> f64 {
        // A NaN or ±∞ entry makes the whole row NaN (as in the softmax-like families): every
        // weight f(s) it enters is NaN, never an ∞·0 that depends on the other operand.
        if row.iter().any(|x| !x.is_finite()) {
            dst.fill(f64::NAN);
            return f64::NAN;
        }
        dst.copy_from_slice(row);
        let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
        if self.l2norm {
            let r = norm.max(self.eps);
            dst.iter_mut().for_each(|x| *x /= r);
        }
        norm
    }

    /// Turn `dx̂` (in place) into `dx`, given `x̂` and `‖x‖`.
    fn unload(&self, xh: &[f64], norm: f64, dxh: &mut [f64]) {
        if !self.l2norm {
            return;
        }
        if norm > self.eps {
            let proj: f64 = xh.iter().zip(dxh.iter()).map(|(x, d)| x * d).sum();
            for (d, x) in dxh.iter_mut().zip(xh) {
                *d = (*d - x * proj) / norm;
            }
        } else {
            dxh.iter_mut().for_each(|d| *d /= self.eps);
        }
    }
}

/// The factorised inputs of one (batch entry `b`, kv head `kvh`): its valid keys and the queries of
/// the `G` query heads that read them (those with `spec.kv_head(h) = kvh`). Probe `p = i·G + g` is
/// query `i` of head `heads[g]`.
struct Slice {
    b: usize,
    kvh: usize,
    /// The query heads of the group, in increasing order.
    heads: Vec<usize>,
    nq: usize,
    nk: usize,
    /// `k̂_j` `[nk, D]` and `‖k_j‖`.
    kh: Vec<f64>,
    k_norm: Vec<f64>,
    /// `ṽ_j = [v_j, 1]` `[nk, Dv + 1]`.
    vt: Vec<f64>,
    /// `q̂` `[nq·G, D]`, `‖q‖`, and `u = scale·q̂`.
    qh: Vec<f64>,
    q_norm: Vec<f64>,
    u: Vec<f64>,
    /// `hi(i)` per probe: the end of `spec.key_range(b, i)`.
    hi: Vec<usize>,
}

impl Slice {
    fn gather(spec: &AttnSpec, par: &Params, x: &Inputs<'_, f64>, b: usize, kvh: usize) -> Self {
        let (d, dv, g) = (spec.head_dim(), spec.head_dim_v(), spec.group());
        let lens = spec.seq_lens(b);
        let (nq, nk) = (lens.q, lens.k);
        let heads: Vec<usize> = (0..spec.heads_q()).filter(|&h| spec.kv_head(h) == kvh).collect();
        // Internal invariant: a validated spec maps exactly G query heads to each kv head.
        debug_assert_eq!(heads.len(), g);
        let mut kh = vec![0.0; nk * d];
        let mut vt = vec![1.0; nk * (dv + 1)];
        let mut k_norm = Vec::with_capacity(nk);
        for j in 0..nk {
            let ko = spec.k_offset(b, j, kvh);
            k_norm.push(par.load(&x.k[ko..ko + d], &mut kh[j * d..(j + 1) * d]));
            let vo = spec.v_offset(b, j, kvh);
            vt[j * (dv + 1)..j * (dv + 1) + dv].copy_from_slice(&x.v[vo..vo + dv]);
        }
        let mut qh = vec![0.0; nq * g * d];
        let mut q_norm = Vec::with_capacity(nq * g);
        let mut hi = Vec::with_capacity(nq * g);
        for i in 0..nq {
            let range = spec.key_range(b, i);
            // Internal invariant: validation rejects windows for Taylor, so every key range is a prefix.
            debug_assert_eq!(range.start, 0);
            for (gi, &h) in heads.iter().enumerate() {
                let p = i * g + gi;
                let qo = spec.q_offset(b, i, h);
                q_norm.push(par.load(&x.q[qo..qo + d], &mut qh[p * d..(p + 1) * d]));
                hi.push(range.end);
            }
        }
        let u = qh.iter().map(|x| par.scale * x).collect();
        Slice {
            b,
            kvh,
            heads,
            nq,
            nk,
            kh,
            k_norm,
            vt,
            qh,
            q_norm,
            u,
            hi,
        }
    }
}

/// Every (batch entry, kv head) of a call: the unit of parallel work.
fn tasks(spec: &AttnSpec) -> Vec<(usize, usize)> {
    (0..spec.batch())
        .flat_map(|b| (0..spec.heads_kv()).map(move |h| (b, h)))
        .collect()
}

/// Forward pass through the factorised states.
pub(crate) fn forward(spec: &AttnSpec, x: &Inputs<'_, f64>, o: &mut [f64], stats: &mut [f64]) {
    forward_chunked(spec, x, o, stats, sweep::CHUNK);
}

/// [`forward`] with an explicit chunk length (tests vary it; results do not depend on it).
pub(crate) fn forward_chunked(
    spec: &AttnSpec,
    x: &Inputs<'_, f64>,
    o: &mut [f64],
    stats: &mut [f64],
    chunk: usize,
) {
    let par = Params::of(spec);
    let (d, dv, g) = (spec.head_dim(), spec.head_dim_v(), spec.group());
    let m = dv + 1;
    let cfg = Sweep {
        poly: par.poly,
        d,
        m,
        chunk,
        want_value: true,
    };
    let results: Vec<(Slice, Vec<f64>)> = tasks(spec)
        .into_par_iter()
        .map(|(b, kvh)| {
            let sl = Slice::gather(spec, &par, x, b, kvh);
            let swept = sweep(
                &cfg,
                Sources { x: &sl.kh, y: &sl.vt },
                Probes {
                    z: &sl.u,
                    w: None,
                    hi: &sl.hi,
                },
            );
            (sl, swept.value)
        })
        .collect();
    for (sl, value) in results {
        for i in 0..sl.nq {
            for (gi, &h) in sl.heads.iter().enumerate() {
                let p = i * g + gi;
                let (num, den) = (&value[p * m..p * m + dv], value[p * m + dv]);
                let oo = spec.o_offset(sl.b, i, h);
                let out = &mut o[oo..oo + dv];
                if sl.hi[p] == 0 {
                    // No allowed key: o = 0 and den = 0, never 0/0.
                    out.fill(0.0);
                    stats[spec.stats_index(sl.b, h, i)] = 0.0;
                } else {
                    out.iter_mut().zip(num).for_each(|(o, n)| *o = n / den);
                    stats[spec.stats_index(sl.b, h, i)] = den;
                }
            }
        }
    }
}

/// Backward pass through the factorised states, given the forward's `o` and denominators.
pub(crate) fn backward(
    spec: &AttnSpec,
    x: &Inputs<'_, f64>,
    o: &[f64],
    d_o: &[f64],
    stats: &[f64],
    grads: &mut Gradients<f64>,
) {
    backward_chunked(spec, x, o, d_o, stats, grads, sweep::CHUNK);
}

/// Gradients of one (batch entry, kv head): `dq` `[nq·G, D]` by probe, `dk` `[nk, D]`, `dv` `[nk, Dv]`.
struct SliceGrads {
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

/// [`backward`] with an explicit chunk length (tests vary it; results do not depend on it).
pub(crate) fn backward_chunked(
    spec: &AttnSpec,
    x: &Inputs<'_, f64>,
    o: &[f64],
    d_o: &[f64],
    stats: &[f64],
    grads: &mut Gradients<f64>,
    chunk: usize,
) {
    let par = Params::of(spec);
    let (d, dv, g) = (spec.head_dim(), spec.head_dim_v(), spec.group());
    let m = dv + 1;
    let results: Vec<(Slice, SliceGrads)> = tasks(spec)
        .into_par_iter()
        .map(|(b, kvh)| {
            let sl = Slice::gather(spec, &par, x, b, kvh);
            // g̃_i = [ĝ_i, −δ_i] with ĝ_i = g_i / den_i and δ_i = ĝ_i·o_i; zero for a row with no key.
            let mut gt = vec![0.0; sl.nq * g * m];
            for i in 0..sl.nq {
                for (gi, &h) in sl.heads.iter().enumerate() {
                    let p = i * g + gi;
                    if sl.hi[p] == 0 {
                        continue;
                    }
                    let den = stats[spec.stats_index(b, h, i)];
                    let oo = spec.o_offset(b, i, h);
                    let row = &mut gt[p * m..(p + 1) * m];
                    let mut delta = 0.0;
                    for ((r, &go), &oi) in row.iter_mut().zip(&d_o[oo..oo + dv]).zip(&o[oo..oo + dv]) {
                        *r = go / den;
                        delta += *r * oi;
                    }
                    row[dv] = -delta;
                }
            }
            let grads = slice_backward(&par, &sl, &gt, d, m, g, chunk);
            (sl, grads)
        })
        .collect();
    for (sl, sg) in results {
        for i in 0..sl.nq {
            for (gi, &h) in sl.heads.iter().enumerate() {
                let p = i * g + gi;
                let off = spec.dq_offset(sl.b, i, h);
                grads.dq[off..off + d].copy_from_slice(&sg.dq[p * d..(p + 1) * d]);
            }
        }
        for j in 0..sl.nk {
            let off = spec.dk_offset(sl.b, j, sl.kvh);
            grads.dk[off..off + d].copy_from_slice(&sg.dk[j * d..(j + 1) * d]);
            let off = spec.dv_offset(sl.b, j, sl.kvh);
            grads.dv[off..off + dv].copy_from_slice(&sg.dv[j * dv..(j + 1) * dv]);
        }
    }
}

/// The two sweeps of the backward for one slice, given `g̃` `[nq·G, m]`.
fn slice_backward(
    par: &Params,
    sl: &Slice,
    gt: &[f64],
    d: usize,
    m: usize,
    g: usize,
    chunk: usize,
) -> SliceGrads {
    let dv = m - 1;
    let (nq, nk) = (sl.nq, sl.nk);

    // dû_i = a1 P1 g̃_i + 2 a2 W_i u_i: the forward's key states probed with (u_i, g̃_i).
    let dq_sweep = Sweep {
        poly: par.poly,
        d,
        m,
        chunk,
        want_value: false,
    };
    let mut dq = sweep(
        &dq_sweep,
        Sources { x: &sl.kh, y: &sl.vt },
        Probes {
            z: &sl.u,
            w: Some(gt),
            hi: &sl.hi,
        },
    )
    .grad;
    for (p, dqp) in dq.chunks_exact_mut(d).enumerate() {
        if sl.hi[p] == 0 {
            // No allowed key: dq = 0. The sweep probed the (empty) states with this row anyway, and
            // a NaN in its q would come out of 0·NaN.
            dqp.fill(0.0);
            continue;
        }
        dqp.iter_mut().for_each(|x| *x *= par.scale);
        par.unload(&sl.qh[p * d..(p + 1) * d], sl.q_norm[p], dqp);
    }

    // dṽ_j and dk̂_j: query states over the suffix i ≥ i0(j), swept from the last query backwards.
    // Sources are the probes (u, g̃) in reverse query order; probes are the keys (k̂_j, ṽ_j) in reverse.
    let mut src_u = Vec::with_capacity(nq * g * d);
    let mut src_g = Vec::with_capacity(nq * g * m);
    for i in (0..nq).rev() {
        src_u.extend_from_slice(&sl.u[i * g * d..(i + 1) * g * d]);
        src_g.extend_from_slice(&gt[i * g * m..(i + 1) * g * m]);
    }
    // i0(j) = first query whose key range contains j (nq if none); hi is nondecreasing over queries.
    let mut i0 = Vec::with_capacity(nk);
    let mut i = 0;
    for j in 0..nk {
        while i < nq && sl.hi[i * g] <= j {
            i += 1;
        }
        i0.push(i);
    }
    let mut key_z = Vec::with_capacity(nk * d);
    let mut key_w = Vec::with_capacity(nk * m);
    let mut key_hi = Vec::with_capacity(nk);
    for j in (0..nk).rev() {
        key_z.extend_from_slice(&sl.kh[j * d..(j + 1) * d]);
        key_w.extend_from_slice(&sl.vt[j * m..(j + 1) * m]);
        key_hi.push(g * (nq - i0[j]));
    }
    let kv_sweep = Sweep {
        want_value: true,
        ..dq_sweep
    };
    let swept = sweep(
        &kv_sweep,
        Sources { x: &src_u, y: &src_g },
        Probes {
            z: &key_z,
            w: Some(&key_w),
            hi: &key_hi,
        },
    );
    let mut dk = vec![0.0; nk * d];
    let mut dvv = vec![0.0; nk * dv];
    for j in 0..nk {
        if i0[j] == nq {
            // No query sees key j: dk_j = dv_j = 0, whatever its (possibly NaN) k and v hold.
            continue;
        }
        let r = nk - 1 - j;
        dvv[j * dv..(j + 1) * dv].copy_from_slice(&swept.value[r * m..r * m + dv]);
        let dkj = &mut dk[j * d..(j + 1) * d];
        dkj.copy_from_slice(&swept.grad[r * d..(r + 1) * d]);
        par.unload(&sl.kh[j * d..(j + 1) * d], sl.k_norm[j], dkj);
    }
    SliceGrads { dq, dk, dv: dvv }
}

#[cfg(test)]
mod test_specs;

#[cfg(test)]
mod tests {
    use super::dense::{backward_dense, forward_dense};
    use super::test_specs::{problems, Limits};
    use super::*;
    use crate::testing::{max_abs, max_abs_diff, random_case, Case};
    use attn_core::AttnProblem;
    use proptest::prelude::*;

    struct Run {
        o: Vec<f64>,
        stats: Vec<f64>,
        grads: Gradients<f64>,
    }

    fn zero_grads(spec: &AttnSpec) -> Gradients<f64> {
        Gradients {
            dq: vec![0.0; spec.dq_len()],
            dk: vec![0.0; spec.dk_len()],
            dv: vec![0.0; spec.dv_len()],
            dbias: None,
        }
    }

    /// Forward and backward through the states with `chunk`, or densely when `chunk` is `None`.
    fn run(case: &Case, chunk: Option<usize>) -> Run {
        let spec = &case.spec;
        let x = case.inputs();
        let mut o = vec![0.0; spec.o_len()];
        let mut stats = vec![0.0; spec.stats_len()];
        let mut grads = zero_grads(spec);
        match chunk {
            Some(c) => {
                forward_chunked(spec, &x, &mut o, &mut stats, c);
                backward_chunked(spec, &x, &o, &case.d_o, &stats, &mut grads, c);
            }
            None => {
                forward_dense(spec, &x, &mut o, &mut stats);
                backward_dense(spec, &x, &o, &case.d_o, &stats, &mut grads);
            }
        }
        Run { o, stats, grads }
    }

    fn assert_same(what: &str, got: &[f64], want: &[f64]) -> Result<(), TestCaseError> {
        let tol = 1e-11 * (1.0 + max_abs(want));
        let err = max_abs_diff(got, want);
        prop_assert!(got.iter().all(|x| x.is_finite()), "{what}: non-finite entry");
        prop_assert!(
            err <= tol,
            "{what}: factorised vs dense differ by {err:.3e} (tolerance {tol:.3e})"
        );
        Ok(())
    }

    fn factorised_equals_dense(p: AttnProblem, chunk: usize, seed: u64) -> Result<(), TestCaseError> {
        let spec = p.validate().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let case = random_case(&spec, seed);
        let (fact, dense) = (run(&case, Some(chunk)), run(&case, None));
        assert_same("o", &fact.o, &dense.o)?;
        assert_same("den", &fact.stats, &dense.stats)?;
        assert_same("dq", &fact.grads.dq, &dense.grads.dq)?;
        assert_same("dk", &fact.grads.dk, &dense.grads.dk)?;
        assert_same("dv", &fact.grads.dv, &dense.grads.dv)
    }

    proptest! {
        #![proptest_config(crate::proptest_config::config(1024))]

        /// Small problems with chunks of 1..=8 keys: the states carry most of every sum.
        #[test]
        fn factorised_matches_dense_for_every_output_and_gradient(
            p in problems(Limits { batch: 2, heads_kv: 2, group: 3, seq: 12, dim: 5 }),
            chunk in 1usize..=8,
            seed in any::<u64>(),
        ) {
            factorised_equals_dense(p, chunk, seed)?;
        }
    }

    proptest! {
        #![proptest_config(crate::proptest_config::config(32))]

        /// Sequences longer than the default chunk, through the public entry points' chunk length.
        #[test]
        fn factorised_matches_dense_across_default_chunks(
            p in problems(Limits { batch: 2, heads_kv: 1, group: 2, seq: 3 * sweep::CHUNK, dim: 3 }),
            seed in any::<u64>(),
        ) {
            factorised_equals_dense(p, sweep::CHUNK, seed)?;
        }
    }

    /// |s| up to ~1e4·D with order 2: f ≥ 1/2 keeps every sum positive, so the states (which add
    /// products of either sign) must still agree with the row-by-row sums to rounding.
    #[test]
    fn order2_large_scores_match_dense_across_chunks() {
        let p = AttnProblem::new(
            attn_core::Family::taylor(2),
            attn_core::DType::F32,
            2,
            4,
            2,
            150,
            130,
            8,
        )
        .with_head_dim_v(5)
        .with_causal(attn_core::Causal::TopLeft);
        let spec = p.validate().expect("valid problem");
        let mut case = random_case(&spec, 17);
        case.q
            .iter_mut()
            .chain(case.k.iter_mut())
            .for_each(|x| *x *= 100.0);
        let (fact, dense) = (run(&case, Some(sweep::CHUNK)), run(&case, None));
        for (what, got, want) in [
            ("o", &fact.o, &dense.o),
            ("den", &fact.stats, &dense.stats),
            ("dq", &fact.grads.dq, &dense.grads.dq),
            ("dk", &fact.grads.dk, &dense.grads.dk),
            ("dv", &fact.grads.dv, &dense.grads.dv),
        ] {
            assert!(got.iter().all(|x| x.is_finite()), "{what}: non-finite entry");
            let err = max_abs_diff(got, want);
            assert!(
                err <= 1e-9 * max_abs(want),
                "{what}: factorised vs dense differ by {err:.3e}"
            );
        }
    }

    #[test]
    fn poly_derivative_matches_its_difference_quotient() {
        let poly = Poly {
            a0: 0.7,
            a1: -0.3,
            a2: 0.45,
        };
        for s in [-3.0, -0.2, 0.0, 1.5, 40.0] {
            let h = 1e-6;
            let fd = (poly.f(s + h) - poly.f(s - h)) / (2.0 * h);
            assert!(
                (poly.df(s) - fd).abs() < 1e-6 * (1.0 + fd.abs()),
                "f'({s}) = {} vs {fd}",
                poly.df(s)
            );
        }
    }
}
