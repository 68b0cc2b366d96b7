//! The backward sweep (FlashAttention-2's, on the CPU): per (batch, kv head, key chunk), for each
//! key tile and each query tile of the GQA group that sees it, recompute `P` from the saved LSE,
//! `dP = dO·Vᵀ`, `dS = P ⊙ (dP − δ)`, and accumulate `dV += Pᵀ dO`, `dK += (dS⊙σ)ᵀ Q̃` and the
//! task's own dQ partial `+= (dS⊙σ) K̃` (GEMMs). With a bias, dbias runs as a second pass per
//! (bias batch, bias head, query tile), summing the (b, h) that broadcast onto it in order.

use super::simd::{dot_lanes, multiversion, Level};
use super::tile::{bad_in, bad_rows, exp, log_gamma, matmul, matmul_masked, Kind, Mat, BK, BQ};
use super::Ctx;
use crate::Gradients;
use attn_core::Element;
use rayon::prelude::*;
use std::ops::Range;

/// The per-(b, h) rows the backward reads besides the prepared inputs.
struct Grad<'c, 'a, E> {
    ctx: &'c Ctx<'a, E>,
    /// dO rows of every (b, h) slice, f32, contiguous.
    g: Vec<Vec<f32>>,
    /// The dO rows of each slice holding a non-finite value, ascending.
    g_bad: Vec<Vec<usize>>,
    /// `δ_i = dO_i·o_i` per (b, h) slice.
    delta: Vec<Vec<f32>>,
    /// The LSE per (b, h) slice.
    lse: Vec<Vec<f32>>,
}

/// Scratch of one tile: P, dS, σ and dP (m × n each).
struct Tile {
    p: Vec<f32>,
    ds: Vec<f32>,
    sigma: Vec<f32>,
    dp: Vec<f32>,
}

impl Tile {
    fn new() -> Tile {
        let z = || vec![0f32; BQ * BK];
        Tile {
            p: z(),
            ds: z(),
            sigma: z(),
            dp: z(),
        }
    }
}

impl<E: Element> Grad<'_, '_, E> {
    fn slot(&self, b: usize, h: usize) -> usize {
        b * self.ctx.spec.heads_q() + h
    }

    /// Whether any row of `rows` (with a finite LSE or NaN) sees a key of `keys`.
    fn touches(&self, b: usize, h: usize, rows: Range<usize>, keys: &Range<usize>) -> bool {
        let lse = &self.lse[self.slot(b, h)];
        rows.into_iter().any(|i| {
            let r = self.ctx.spec.key_range(b, i);
            r.start < keys.end && keys.start < r.end && lse[i] != f32::NEG_INFINITY
        })
    }

    /// Fill P, σ and dS of the tile (rows `i0..i0+m` of (b, h), keys `j0..j0+n`), row stride n.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn tile(&self, b: usize, h: usize, i0: usize, m: usize, j0: usize, n: usize, t: &mut Tile) {
        let ctx = self.ctx;
        let spec = ctx.spec;
        let (d, dv) = (spec.head_dim(), spec.head_dim_v());
        let hk = spec.kv_head(h);
        let (q, k, v) = (ctx.q(b, h), ctx.k(b, hk), ctx.v(b, hk));
        let slot = self.slot(b, h);
        let (p, ds, sigma, dp) = (
            &mut t.p[..m * n],
            &mut t.ds[..m * n],
            &mut t.sigma[..m * n],
            &mut t.dp[..m * n],
        );
        matmul(m, n, d, p, n, false, q.block(i0, m), k.block_t(j0, n));
        ctx.logits(b, h, i0, m, j0, n, p, Some(sigma));
        let g = &self.g[slot][i0 * dv..(i0 + m) * dv];
        matmul(m, n, dv, dp, n, false, Mat::rows(g, dv), v.block_t(j0, n));
        for r in 0..m {
            let i = i0 + r;
            let (lse, delta) = (self.lse[slot][i], self.delta[slot][i]);
            let row = r * n..(r + 1) * n;
            if lse == f32::NEG_INFINITY {
                p[row.clone()].fill(0.0);
                ds[row].fill(0.0);
                continue;
            }
            for c in row {
                let x = p[c];
                let pc = if x == f32::NEG_INFINITY { 0.0 } else { exp(x - lse) };
                p[c] = pc;
                ds[c] = if pc == 0.0 { 0.0 } else { pc * (dp[c] - delta) };
            }
        }
    }

    /// dK, dV of keys `keys` of (b, kv head hk), and this chunk's dQ partial for every query head
    /// of the group (in group order).
    #[inline(always)]
    fn dkv_task(&self, b: usize, hk: usize, keys: Range<usize>) -> (Vec<f32>, Vec<f32>, Vec<Vec<f32>>) {
        let ctx = self.ctx;
        let spec = ctx.spec;
        let (d, dv) = (spec.head_dim(), spec.head_dim_v());
        let nq = spec.seq_lens(b).q;
        let heads: Vec<usize> = (0..spec.heads_q()).filter(|&h| spec.kv_head(h) == hk).collect();
        let nk = keys.len();
        let mut dk = vec![0f32; nk * d];
        let mut dvs = vec![0f32; nk * dv];
        let mut colsum = vec![0f32; nk];
        let mut seen = vec![false; nk];
        let mut dq: Vec<Vec<f32>> = heads.iter().map(|_| vec![0f32; nq * d]).collect();
        let (k, v) = (ctx.k(b, hk), ctx.v(b, hk));
        let mut t = Tile::new();
        let lorentz_c = match ctx.kind {
            Kind::Lorentz { c, .. } => Some(c),
            _ => None,
        };
        for j0 in keys.clone().step_by(BK) {
            let n = (keys.end - j0).min(BK);
            let kt = j0..j0 + n;
            let (jl, jh) = (j0 - keys.start, j0 - keys.start + n);
            for (hi, &h) in heads.iter().enumerate() {
                let q = ctx.q(b, h);
                let slot = self.slot(b, h);
                for i0 in (0..nq).step_by(BQ) {
                    let m = (nq - i0).min(BQ);
                    if !self.touches(b, h, i0..i0 + m, &kt) {
                        continue;
                    }
                    self.tile(b, h, i0, m, j0, n, &mut t);
                    let g = &self.g[slot][i0 * dv..(i0 + m) * dv];
                    let qt = q.block(i0, m);
                    // Masked pairs of the tile carry weights of exactly 0; `matmul_masked` keeps
                    // a non-finite source row away from the outputs they pair it with.
                    let sees = |r: usize, c: usize| spec.key_range(b, i0 + r).contains(&(j0 + c));
                    let sees_t = |c: usize, r: usize| sees(r, c);
                    // dV += Pᵀ dO
                    matmul_masked(
                        (n, dv, m),
                        &mut dvs[jl * dv..jh * dv],
                        dv,
                        Mat::t(&t.p[..m * n], n),
                        Mat::rows(g, dv),
                        &bad_in(&self.g_bad[slot], i0, m),
                        sees_t,
                    );
                    for r in 0..m {
                        let range = spec.key_range(b, i0 + r);
                        let live = self.lse[slot][i0 + r] != f32::NEG_INFINITY;
                        for c in 0..n {
                            colsum[jl + c] += t.ds[r * n + c];
                            if live && range.contains(&(j0 + c)) {
                                seen[jl + c] = true;
                            }
                        }
                    }
                    let w = &mut t.ds[..m * n];
                    w.iter_mut().zip(&t.sigma[..m * n]).for_each(|(w, s)| *w *= s);
                    let dqh = &mut dq[hi][i0 * d..(i0 + m) * d];
                    let kt_rows = k.block(j0, n);
                    match lorentz_c {
                        None => {
                            let (wr, wt) = (Mat::rows(w, n), Mat::t(w, n));
                            matmul_masked((m, d, n), dqh, d, wr, kt_rows, &k.bad_in(j0, n), sees);
                            let dkt = &mut dk[jl * d..jh * d];
                            matmul_masked((n, d, m), dkt, d, wt, qt, &q.bad_in(i0, m), sees_t);
                        }
                        Some(c) => {
                            // Per pair, in the reference's form `a (x̂ − ŷ) + T ŷ`: splitting it into
                            // GEMMs would cancel terms of size `a` where x̂ ≈ ŷ.
                            let dkt = &mut dk[jl * d..jh * d];
                            for r in 0..m {
                                let (qs, qh) = (&q.scalars(i0 + r), q.row(i0 + r));
                                let dqr = &mut dqh[r * d..(r + 1) * d];
                                for cc in 0..n {
                                    let wv = w[r * n + cc];
                                    if wv == 0.0 {
                                        continue;
                                    }
                                    let (ks, kh) = (&k.scalars(j0 + cc), k.row(j0 + cc));
                                    let (a, tq) = Kind::lorentz_coef(c, wv, qs, ks);
                                    let (a2, tk) = Kind::lorentz_coef(c, wv, ks, qs);
                                    let dkr = &mut dkt[cc * d..(cc + 1) * d];
                                    for l in 0..d {
                                        let diff = qh[l] - kh[l];
                                        dqr[l] += a * diff + tq * kh[l];
                                        dkr[l] += tk * qh[l] - a2 * diff;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        for (jj, (dkj, dvj)) in dk
            .chunks_exact_mut(d.max(1))
            .zip(dvs.chunks_exact_mut(dv.max(1)))
            .enumerate()
        {
            let j = keys.start + jj;
            ctx.kind.finish(dkj, k.row(j), &k.scalars(j));
            if let (Some(c), true) = (ctx.midpoint, seen[jj]) {
                let f = colsum[jj] * log_gamma(c, v.row(j)).1;
                dvj.iter_mut().zip(v.row(j)).for_each(|(o, x)| *o += f * x);
            }
        }
        (dk, dvs, dq)
    }

    /// dbias rows `rows` of bias slice (bb, bh): `Σ dS` over every (b, h) broadcasting onto it.
    fn dbias_task(&self, bb: usize, bh: usize, rows: Range<usize>) -> Vec<f32> {
        let spec = self.ctx.spec;
        let nk_max = spec.seq_k();
        let mut out = vec![0f32; rows.len() * nk_max];
        let Some(shape) = spec.bias() else {
            return out;
        };
        let mut t = Tile::new();
        for b in (0..spec.batch()).filter(|&b| shape.batch == 1 || b == bb) {
            let nq = spec.seq_lens(b).q;
            let nk = spec.seq_lens(b).k;
            let (i0, i1) = (rows.start.min(nq), rows.end.min(nq));
            if i0 >= i1 {
                continue;
            }
            let m = i1 - i0;
            for h in (0..spec.heads_q()).filter(|&h| shape.heads == 1 || h == bh) {
                for j0 in (0..nk).step_by(BK) {
                    let n = (nk - j0).min(BK);
                    if !self.touches(b, h, i0..i1, &(j0..j0 + n)) {
                        continue;
                    }
                    self.tile(b, h, i0, m, j0, n, &mut t);
                    for r in 0..m {
                        let dst = &mut out[(i0 - rows.start + r) * nk_max + j0..][..n];
                        dst.iter_mut()
                            .zip(&t.ds[r * n..(r + 1) * n])
                            .for_each(|(o, x)| *o += x);
                    }
                }
            }
        }
        out
    }
}

type DkvPart = (Vec<f32>, Vec<f32>, Vec<Vec<f32>>);

#[inline(always)]
fn dkv_body<E: Element>(g: &Grad<'_, '_, E>, b: usize, hk: usize, keys: Range<usize>) -> DkvPart {
    g.dkv_task(b, hk, keys)
}

multiversion! {
    /// [`Grad::dkv_task`] at `level`.
    fn run_dkv<E: Element>(g: &Grad<'_, '_, E>, b: usize, hk: usize, keys: Range<usize>) -> DkvPart => dkv_body;
}

/// The (batch, kv head) slices below which the backward splits each slice's keys into chunks. A
/// constant, not the thread count: the partition, and so the order of every sum, depends on the
/// shape alone (bit-identical gradients under any number of threads).
const SPLIT_BELOW_SLICES: usize = 8;
/// Keys a chunk holds at least.
const MIN_CHUNK_KEYS: usize = 4 * BK;
/// f32 values the chunks' dQ partials may hold together (256 MiB): each chunk carries a dQ partial
/// for every query of its GQA group, `dq_len` values over all chunks of one split.
const DQ_PARTIALS_MAX: usize = 1 << 26;

/// How many key chunks each (b, kv head) slice is split into, given the slices `B·Hkv`, the longest
/// key length `seq_k` and the dQ length `dq_len`: 1 when the slices reach [`SPLIT_BELOW_SLICES`],
/// else enough chunks to reach it, with at least [`MIN_CHUNK_KEYS`] keys each and at most
/// [`DQ_PARTIALS_MAX`] values of dQ partials in all.
pub(super) fn key_chunks(slices: usize, seq_k: usize, dq_len: usize) -> usize {
    if slices >= SPLIT_BELOW_SLICES {
        return 1;
    }
    SPLIT_BELOW_SLICES
        .div_ceil(slices.max(1))
        .min((seq_k / MIN_CHUNK_KEYS).max(1))
        .min((DQ_PARTIALS_MAX / dq_len.max(1)).max(1))
}

pub(super) fn run<E: Element>(
    ctx: &Ctx<'_, E>,
    o: &[E],
    d_o: &[E],
    stats: &[f32],
    level: Level,
) -> Gradients<E> {
    let spec = ctx.spec;
    let (d, dv) = (spec.head_dim(), spec.head_dim_v());
    let (hq, hkv) = (spec.heads_q(), spec.heads_kv());
    let per_slice: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = (0..spec.batch() * hq)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / hq, bh % hq);
            let nq = spec.seq_lens(b).q;
            let mut g = vec![0f32; nq * dv];
            let mut delta = vec![0f32; nq];
            let mut lse = vec![0f32; nq];
            let mut orow = vec![0f32; dv];
            for i in 0..nq {
                let at = spec.o_offset(b, i, h);
                let gi = &mut g[i * dv..(i + 1) * dv];
                gi.iter_mut()
                    .zip(&d_o[at..at + dv])
                    .for_each(|(x, e)| *x = e.to_f32());
                orow.iter_mut()
                    .zip(&o[at..at + dv])
                    .for_each(|(x, e)| *x = e.to_f32());
                delta[i] = dot_lanes(gi, &orow);
                lse[i] = stats[spec.stats_index(b, h, i)];
            }
            (g, delta, lse)
        })
        .collect();
    let mut grad = Grad {
        ctx,
        g: Vec::with_capacity(per_slice.len()),
        g_bad: Vec::with_capacity(per_slice.len()),
        delta: Vec::with_capacity(per_slice.len()),
        lse: Vec::with_capacity(per_slice.len()),
    };
    for (g, delta, lse) in per_slice {
        grad.g_bad.push(bad_rows(&g, dv));
        grad.g.push(g);
        grad.delta.push(delta);
        grad.lse.push(lse);
    }

    let parts = key_chunks(spec.batch() * hkv, spec.seq_k(), spec.dq_len());
    let mut tasks = Vec::new();
    for b in 0..spec.batch() {
        let nk = spec.seq_lens(b).k;
        let step = nk.div_ceil(parts).div_ceil(BK).max(1) * BK;
        for hk in 0..hkv {
            tasks.extend((0..nk).step_by(step).map(|k0| (b, hk, k0..(k0 + step).min(nk))));
        }
    }
    let results: Vec<_> = tasks
        .par_iter()
        .map(|(b, hk, keys)| run_dkv(level, &grad, *b, *hk, keys.clone()))
        .collect();

    let zero = E::from_f32(0.0);
    let mut out = Gradients {
        dq: vec![zero; spec.dq_len()],
        dk: vec![zero; spec.dk_len()],
        dv: vec![zero; spec.dv_len()],
        dbias: spec.bias().map(|_| vec![zero; spec.bias_len()]),
    };
    let mut dq_sum: Vec<Option<Vec<Vec<f32>>>> = vec![None; spec.batch() * hkv];
    for ((b, hk, keys), (dk, dvs, dq)) in tasks.iter().zip(results) {
        for (jj, j) in keys.clone().enumerate() {
            let at = spec.dk_offset(*b, j, *hk);
            out.dk[at..at + d]
                .iter_mut()
                .zip(&dk[jj * d..(jj + 1) * d])
                .for_each(|(o, x)| *o = E::from_f32(*x));
            let at = spec.dv_offset(*b, j, *hk);
            out.dv[at..at + dv]
                .iter_mut()
                .zip(&dvs[jj * dv..(jj + 1) * dv])
                .for_each(|(o, x)| *o = E::from_f32(*x));
        }
        match &mut dq_sum[b * hkv + hk] {
            Some(acc) => {
                for (a, p) in acc.iter_mut().zip(dq) {
                    a.iter_mut().zip(p).for_each(|(a, p)| *a += p);
                }
            }
            slot => *slot = Some(dq),
        }
    }
    for b in 0..spec.batch() {
        let nq = spec.seq_lens(b).q;
        for hk in 0..hkv {
            let Some(acc) = dq_sum[b * hkv + hk].as_mut() else {
                continue;
            };
            let heads = (0..hq).filter(|&h| spec.kv_head(h) == hk);
            for (h, rows) in heads.zip(acc.iter_mut()) {
                let q = ctx.q(b, h);
                for i in 0..nq {
                    let row = &mut rows[i * d..(i + 1) * d];
                    ctx.kind.finish(row, q.row(i), &q.scalars(i));
                    let at = spec.dq_offset(b, i, h);
                    out.dq[at..at + d]
                        .iter_mut()
                        .zip(row.iter())
                        .for_each(|(o, x)| *o = E::from_f32(*x));
                }
            }
        }
    }

    if let (Some(shape), Some(dbias)) = (spec.bias(), out.dbias.as_mut()) {
        let mut btasks = Vec::new();
        for bb in 0..shape.batch {
            for bh in 0..shape.heads {
                btasks.extend(
                    (0..spec.seq_q())
                        .step_by(BQ)
                        .map(|r0| (bb, bh, r0..(r0 + BQ).min(spec.seq_q()))),
                );
            }
        }
        let rows: Vec<Vec<f32>> = btasks
            .par_iter()
            .map(|(bb, bh, r)| grad.dbias_task(*bb, *bh, r.clone()))
            .collect();
        let nk = spec.seq_k();
        for ((bb, bh, r), vals) in btasks.iter().zip(rows) {
            for (rr, i) in r.clone().enumerate() {
                if let Some(at) = spec.bias_index(*bb, *bh, i, 0) {
                    dbias[at..at + nk]
                        .iter_mut()
                        .zip(&vals[rr * nk..(rr + 1) * nk])
                        .for_each(|(o, x)| *o = E::from_f32(*x));
                }
            }
        }
    }
    out
}
