//! Taylor attention on the fast path: the reference's factorised forward and backward
//! (`crate::taylor`'s module doc states the math) in f32, chunked as a tensor-core kernel runs it.
//!
//! Per (batch entry, kv head) slice, with `u_i = scale·q̂_i` (the scale folded into the query),
//! `ṽ_j = [v_j, 1]` (`m = Dv + 1`, so one set of states gives `num` and `den`) and the probes
//! `p = i·G + g` of the `G` query heads of the group:
//!
//! - **Forward**: one [`sweep()`] of the keys `(k̂_j, ṽ_j)` against the probes `u_p`:
//!   `[num_p, den_p] = Σ_{j<hi_p} f(u_p·k̂_j) ṽ_j`, `o_p = num_p / den_p`; `den_p` is the statistic.
//! - **dQ**: the same sweep probed with `(u_p, g̃_p)`, `g̃_p = [ĝ_p, −δ_p]`, `ĝ_p = dO_p / den_p`,
//!   `δ_p = ĝ_p·o_p`: `dû_p = Σ_{j<hi_p} f'(s_pj)(g̃_p·ṽ_j) k̂_j` (prefix states `P0, P1, P2` of the
//!   keys), `dq̂ = scale·dû`.
//! - **dK, dV**: the sweep with the roles exchanged, run over the probes in reverse order: key `j`
//!   is seen by the suffix of probes `p ≥ p0(j)`, so its prefix in reverse order. Sources
//!   `(u_p, g̃_p)`, probes `(k̂_j, ṽ_j)`: `dṽ_j = Σ_p f(s_pj) g̃_p` (dV is its first `Dv` entries) and
//!   `dk̂_j = Σ_p f'(s_pj)(g̃_p·ṽ_j) u_p` (suffix states `R0, R1, R2` of the queries; the sum over
//!   the group's probes is the GQA reduction).
//! - The l2-norm backward `dx = (dx̂ − x̂ (x̂·dx̂)) / ‖x‖` (`dx̂ / eps` when `‖x‖ ≤ eps`).
//!
//! Inside every sweep ([`sweep`](mod@sweep)), chunks of sources: the quadratic form `f(S)` with
//! the causal mask as dense GEMMs within a chunk, the states across chunks; [`plan`] picks the
//! chunk length from the FLOP count of both. Work: rayon over the slices, and inside a sweep over
//! blocks of probes and rows of `P2`; every output row and state row is computed by one task in a
//! fixed order, so results are identical for any thread count. Accumulation in f32; inputs in f32,
//! f16 or bf16 are converted once.
//!
//! Edge cases as in the reference: a row with no allowed key has `o = 0`, `den = 0`, `dq = 0` and
//! contributes nothing to dK or dV; a key no row sees has `dk = dv = 0`; a NaN or ±∞ in a q or k row
//! makes that row NaN.

pub mod decode;
mod plan;
mod sweep;

use crate::{Forward, Gradients, Inputs};
use attn_core::{AttnSpec, Element, FamilySpec};
use plan::Work;
use rayon::prelude::*;
use sweep::{sweep, sweep_on, Probes, Sources, State, Sweep};

/// `f(s) = a0 + a1 s + a2 s²` (`a2 = 0` for order 1).
#[derive(Clone, Copy, Debug)]
pub(super) struct Poly {
    pub a0: f32,
    pub a1: f32,
    pub a2: f32,
}

/// The Taylor parameters of a spec.
#[derive(Clone, Copy, Debug)]
struct Params {
    poly: Poly,
    scale: f32,
    l2norm: bool,
    eps: f32,
}

impl Params {
    /// `None` unless the spec is Taylor's.
    fn of(spec: &AttnSpec) -> Option<Self> {
        match *spec.family() {
            FamilySpec::Taylor {
                a,
                scale,
                qk_l2norm,
                eps,
                ..
            } => Some(Params {
                poly: Poly {
                    a0: a[0],
                    a1: a[1],
                    a2: a[2],
                },
                scale,
                l2norm: qk_l2norm,
                eps,
            }),
            _ => None,
        }
    }

    /// `x̂` of `row` into `dst` (l2-normalised when `qk_l2norm`); returns `‖x‖`. A row holding a NaN
    /// or ±∞ becomes NaN.
    fn load<E: Element>(&self, row: &[E], dst: &mut [f32]) -> f32 {
        dst.iter_mut().zip(row).for_each(|(d, x)| *d = x.to_f32());
        if dst.iter().any(|x| !x.is_finite()) {
            dst.fill(f32::NAN);
            return f32::NAN;
        }
        let norm = dst.iter().map(|x| x * x).sum::<f32>().sqrt();
        if self.l2norm {
            let r = norm.max(self.eps);
            dst.iter_mut().for_each(|x| *x /= r);
        }
        norm
    }

    /// Turn `dx̂` (in place) into `dx`, given `x̂` and `‖x‖`.
    fn unload(&self, xh: &[f32], norm: f32, dxh: &mut [f32]) {
        if !self.l2norm {
            return;
        }
        if norm > self.eps {
            let proj: f32 = xh.iter().zip(dxh.iter()).map(|(x, d)| x * d).sum();
            for (d, x) in dxh.iter_mut().zip(xh) {
                *d = (*d - x * proj) / norm;
            }
        } else {
            dxh.iter_mut().for_each(|d| *d /= self.eps);
        }
    }
}

/// Whether the spec is Taylor attention (the family this module runs).
pub(super) fn covers(spec: &AttnSpec) -> bool {
    Params::of(spec).is_some()
}

/// The prepared rows of one (batch entry `b`, kv head `kvh`): its keys and the probes of the `G`
/// query heads that read them (probe `p = i·G + g` is query `i` of head `heads[g]`).
struct Slice {
    b: usize,
    kvh: usize,
    heads: Vec<usize>,
    nq: usize,
    nk: usize,
    /// `k̂_j` `[nk, D]` and `‖k_j‖`.
    kh: Vec<f32>,
    k_norm: Vec<f32>,
    /// `ṽ_j = [v_j, 1]` `[nk, m]`.
    vt: Vec<f32>,
    /// `q̂_p` `[nq·G, D]`, `u_p = scale·q̂_p` and `‖q_p‖`.
    qh: Vec<f32>,
    u: Vec<f32>,
    q_norm: Vec<f32>,
    /// `hi[p]`: the end of the probe's key range (every Taylor range starts at 0).
    hi: Vec<usize>,
}

impl Slice {
    fn gather<E: Element>(spec: &AttnSpec, par: &Params, x: &Inputs<'_, E>, b: usize, kvh: usize) -> Self {
        let (d, dv, g) = (spec.head_dim(), spec.head_dim_v(), spec.group());
        let m = dv + 1;
        let lens = spec.seq_lens(b);
        let (nq, nk) = (lens.q, lens.k);
        let heads: Vec<usize> = (0..spec.heads_q()).filter(|&h| spec.kv_head(h) == kvh).collect();
        let mut kh = vec![0f32; nk * d];
        let mut vt = vec![1f32; nk * m];
        let mut k_norm = Vec::with_capacity(nk);
        for j in 0..nk {
            let ko = spec.k_offset(b, j, kvh);
            k_norm.push(par.load(&x.k[ko..ko + d], &mut kh[j * d..(j + 1) * d]));
            let vo = spec.v_offset(b, j, kvh);
            vt[j * m..j * m + dv]
                .iter_mut()
                .zip(&x.v[vo..vo + dv])
                .for_each(|(o, v)| *o = v.to_f32());
        }
        let mut qh = vec![0f32; nq * g * d];
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
            u,
            q_norm,
            hi,
        }
    }
}

/// Every (batch entry, kv head) of a call.
fn tasks(spec: &AttnSpec) -> Vec<(usize, usize)> {
    (0..spec.batch())
        .flat_map(|b| (0..spec.heads_kv()).map(move |h| (b, h)))
        .collect()
}

/// What a sweep of rows `D` and `m` computes (`value` and/or `grad`), from no state, its states
/// dropped at the end.
fn work(par: &Params, d: usize, m: usize, value: bool, grad: bool) -> Work {
    Work {
        d,
        m,
        square: par.poly.a2 != 0.0,
        value,
        grad,
        resume: false,
        keep: false,
    }
}

/// A sweep configuration for `work` over `sources` sources seen up to `hi`, its chunk from
/// [`plan::chunk`].
fn config(par: &Params, work: Work, hi: &[usize], sources: usize) -> Sweep {
    Sweep {
        poly: par.poly,
        d: work.d,
        m: work.m,
        chunk: plan::chunk(&work, hi, sources),
        want_value: work.value,
    }
}

/// The forward sweep of one slice: `[num_p, den_p]` `[nq·G, m]` per probe. With a `state`, the
/// sweep starts from the keys it holds (every probe sees them) and leaves the slice's keys folded
/// into it (the recurrent decode, `decode.rs`).
fn slice_forward(par: &Params, sl: &Slice, d: usize, m: usize, state: Option<&mut State>) -> Vec<f32> {
    let src = Sources { x: &sl.kh, y: &sl.vt };
    let probes = Probes {
        z: &sl.u,
        w: None,
        hi: &sl.hi,
    };
    let fwd = work(par, d, m, true, false);
    match state {
        None => sweep(&config(par, fwd, &sl.hi, sl.nk), src, probes).value,
        Some(st) => {
            let w = Work {
                resume: st.any,
                keep: true,
                ..fwd
            };
            sweep_on(&config(par, w, &sl.hi, sl.nk), st, src, probes).value
        }
    }
}

/// Forward pass of a Taylor spec whose dtype and buffers the caller has checked (non-empty call):
/// o in the storage dtype, the denominators in f32.
pub(super) fn forward<E: Element>(spec: &AttnSpec, x: &Inputs<'_, E>) -> Forward<E, f32> {
    let Some(par) = Params::of(spec) else {
        // Internal invariant: fast::forward routes only Taylor specs here.
        unreachable!("fast::taylor::forward is only called with Taylor specs")
    };
    let (d, m) = (spec.head_dim(), spec.head_dim_v() + 1);
    let results: Vec<(Slice, Vec<f32>)> = tasks(spec)
        .into_par_iter()
        .map(|(b, kvh)| {
            let sl = Slice::gather(spec, &par, x, b, kvh);
            let value = slice_forward(&par, &sl, d, m, None);
            (sl, value)
        })
        .collect();
    outputs(spec, results)
}

/// o and the denominators of a call from each slice's `[num_p, den_p]`: `o_p = num_p / den_p`, and
/// `o = 0`, `den = 0` for a row with no allowed key.
fn outputs<E: Element>(spec: &AttnSpec, results: Vec<(Slice, Vec<f32>)>) -> Forward<E, f32> {
    let (dv, g) = (spec.head_dim_v(), spec.group());
    let m = dv + 1;
    let mut o = vec![E::from_f32(0.0); spec.o_len()];
    let mut stats = vec![0f32; spec.stats_len()];
    for (sl, value) in results {
        for i in 0..sl.nq {
            for (gi, &h) in sl.heads.iter().enumerate() {
                let p = i * g + gi;
                let oo = spec.o_offset(sl.b, i, h);
                if sl.hi[p] == 0 {
                    // No allowed key: o = 0 and den = 0 (already), never 0/0.
                    continue;
                }
                let (num, den) = (&value[p * m..p * m + dv], value[p * m + dv]);
                o[oo..oo + dv]
                    .iter_mut()
                    .zip(num)
                    .for_each(|(o, n)| *o = E::from_f32(n / den));
                stats[spec.stats_index(sl.b, h, i)] = den;
            }
        }
    }
    Forward { o, stats }
}

/// Gradients of one slice: `dq` `[nq·G, D]` by probe, `dk` `[nk, D]`, `dv` `[nk, Dv]`.
struct SliceGrads {
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

/// Backward pass of a Taylor spec whose dtype and buffers the caller has checked (non-empty call),
/// given the forward's o and denominators.
pub(super) fn backward<E: Element>(
    spec: &AttnSpec,
    x: &Inputs<'_, E>,
    o: &[E],
    d_o: &[E],
    stats: &[f32],
) -> Gradients<E> {
    let Some(par) = Params::of(spec) else {
        // Internal invariant: fast::backward routes only Taylor specs here.
        unreachable!("fast::taylor::backward is only called with Taylor specs")
    };
    let (d, dv, g) = (spec.head_dim(), spec.head_dim_v(), spec.group());
    let m = dv + 1;
    let results: Vec<(Slice, SliceGrads)> = tasks(spec)
        .into_par_iter()
        .map(|(b, kvh)| {
            let sl = Slice::gather(spec, &par, x, b, kvh);
            // g̃_p = [ĝ_p, −δ_p], ĝ_p = dO_p / den_p, δ_p = ĝ_p·o_p; zero for a row with no key.
            let mut gt = vec![0f32; sl.nq * g * m];
            for i in 0..sl.nq {
                for (gi, &h) in sl.heads.iter().enumerate() {
                    let p = i * g + gi;
                    if sl.hi[p] == 0 {
                        continue;
                    }
                    let den = stats[spec.stats_index(b, h, i)];
                    let oo = spec.o_offset(b, i, h);
                    let row = &mut gt[p * m..(p + 1) * m];
                    let mut delta = 0f32;
                    for ((r, go), oi) in row.iter_mut().zip(&d_o[oo..oo + dv]).zip(&o[oo..oo + dv]) {
                        *r = go.to_f32() / den;
                        delta += *r * oi.to_f32();
                    }
                    row[dv] = -delta;
                }
            }
            let grads = slice_backward(&par, &sl, &gt, d, m, g);
            (sl, grads)
        })
        .collect();
    let zero = E::from_f32(0.0);
    let mut grads = Gradients {
        dq: vec![zero; spec.dq_len()],
        dk: vec![zero; spec.dk_len()],
        dv: vec![zero; spec.dv_len()],
        dbias: None,
    };
    let put = |dst: &mut [E], src: &[f32]| dst.iter_mut().zip(src).for_each(|(d, s)| *d = E::from_f32(*s));
    for (sl, sg) in results {
        for i in 0..sl.nq {
            for (gi, &h) in sl.heads.iter().enumerate() {
                let p = i * g + gi;
                let off = spec.dq_offset(sl.b, i, h);
                put(&mut grads.dq[off..off + d], &sg.dq[p * d..(p + 1) * d]);
            }
        }
        for j in 0..sl.nk {
            let off = spec.dk_offset(sl.b, j, sl.kvh);
            put(&mut grads.dk[off..off + d], &sg.dk[j * d..(j + 1) * d]);
            let off = spec.dv_offset(sl.b, j, sl.kvh);
            put(&mut grads.dv[off..off + dv], &sg.dv[j * dv..(j + 1) * dv]);
        }
    }
    grads
}

/// The two sweeps of the backward for one slice, given `g̃` `[nq·G, m]`.
fn slice_backward(par: &Params, sl: &Slice, gt: &[f32], d: usize, m: usize, g: usize) -> SliceGrads {
    let dv = m - 1;
    let (nk, np) = (sl.nk, sl.nq * g);

    // dû_p: the keys' prefix states probed with (u_p, g̃_p).
    let cfg = config(par, work(par, d, m, false, true), &sl.hi, nk);
    let mut dq = sweep(
        &cfg,
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
            // No allowed key: dq = 0, whatever (possibly NaN) q holds.
            dqp.fill(0.0);
            continue;
        }
        // dq̂ = scale·dû
        dqp.iter_mut().for_each(|x| *x *= par.scale);
        par.unload(&sl.qh[p * d..(p + 1) * d], sl.q_norm[p], dqp);
    }

    // dṽ_j, dk̂_j: the probes' suffix states, swept from the last probe backwards.
    let mut src_u = Vec::with_capacity(np * d);
    let mut src_g = Vec::with_capacity(np * m);
    for p in (0..np).rev() {
        src_u.extend_from_slice(&sl.u[p * d..(p + 1) * d]);
        src_g.extend_from_slice(&gt[p * m..(p + 1) * m]);
    }
    // p0(j): the first probe whose key range contains j (np if none); hi is nondecreasing.
    let mut first = Vec::with_capacity(nk);
    let mut p = 0;
    for j in 0..nk {
        while p < np && sl.hi[p] <= j {
            p += 1;
        }
        first.push(p);
    }
    let mut key_z = Vec::with_capacity(nk * d);
    let mut key_w = Vec::with_capacity(nk * m);
    let mut key_hi = Vec::with_capacity(nk);
    for j in (0..nk).rev() {
        key_z.extend_from_slice(&sl.kh[j * d..(j + 1) * d]);
        key_w.extend_from_slice(&sl.vt[j * m..(j + 1) * m]);
        key_hi.push(np - first[j]);
    }
    let cfg = config(par, work(par, d, m, true, true), &key_hi, np);
    let swept = sweep(
        &cfg,
        Sources { x: &src_u, y: &src_g },
        Probes {
            z: &key_z,
            w: Some(&key_w),
            hi: &key_hi,
        },
    );
    let mut dk = vec![0f32; nk * d];
    let mut dvv = vec![0f32; nk * dv];
    for j in 0..nk {
        if first[j] == np {
            // No row sees key j: dk = dv = 0, whatever its (possibly NaN) k and v hold.
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
