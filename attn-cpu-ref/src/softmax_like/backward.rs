//! The three backward sweeps (see the parent module doc): dq and `δ` per query block, dk and dv
//! per key block, dbias per bias row.

use super::score::{axpy, dot};
use super::{blocks, log_gamma, Block, Ctx, KEY_BLOCK, QUERY_BLOCK};
use crate::Gradients;
use rayon::prelude::*;
use std::ops::Range;

/// What every sweep reads besides the prepared rows.
struct Grad<'a> {
    ctx: &'a Ctx<'a>,
    d_o: &'a [f64],
    stats: &'a [f64],
    /// `δ_i = g_i·o_i`, indexed like the statistics.
    delta: Vec<f64>,
}

/// Per-task scratch rows of `seq_k` entries: `P_ij`, `dS_ij` and the score derivative σ_ij.
struct Scratch {
    p: Vec<f64>,
    ds: Vec<f64>,
    sigma: Vec<f64>,
}

impl Scratch {
    fn new(n: usize) -> Scratch {
        Scratch {
            p: vec![0.0; n],
            ds: vec![0.0; n],
            sigma: vec![0.0; n],
        }
    }
}

impl Grad<'_> {
    /// `g_i`, the row of dO for query `i` of (b, h).
    fn g(&self, b: usize, h: usize, i: usize) -> &[f64] {
        let at = self.ctx.spec.o_offset(b, i, h);
        &self.d_o[at..at + self.ctx.spec.head_dim_v()]
    }

    /// Fill `P_ij`, `dS_ij` and σ_ij for the keys `j = keys.start + jj` of query `i` of (b, h).
    /// Returns `false` (and fills nothing) for a row that carries no weight: no allowed key among
    /// `keys`, or `LSE_i = −∞`.
    fn pair_terms(&self, b: usize, h: usize, i: usize, keys: Range<usize>, t: &mut Scratch) -> bool {
        let spec = self.ctx.spec;
        let lse = self.stats[spec.stats_index(b, h, i)];
        if keys.is_empty() || lse == f64::NEG_INFINITY {
            return false;
        }
        let n = keys.len();
        let (p, ds, sigma) = (&mut t.p[..n], &mut t.ds[..n], &mut t.sigma[..n]);
        self.ctx.logits(b, h, i, keys.clone(), p, Some(sigma));
        let g = self.g(b, h, i);
        let delta = self.delta[spec.stats_index(b, h, i)];
        let (_, _, v) = self.ctx.slice(b, h);
        for ((p, ds), j) in p.iter_mut().zip(ds.iter_mut()).zip(keys) {
            *p = (*p - lse).exp();
            *ds = *p * (dot(g, v.row(j)) - delta);
        }
        true
    }

    /// Sweep 1 for one query block: `dq_i` rows.
    fn dq_block(&self, blk: &Block) -> Vec<f64> {
        let spec = self.ctx.spec;
        let d = spec.head_dim();
        let (q, k, _) = self.ctx.slice(blk.b, blk.h);
        let mut t = Scratch::new(spec.seq_k());
        let mut out = vec![0.0; blk.rows.len() * d];
        for (i, dq) in blk.rows.clone().zip(out.chunks_exact_mut(d)) {
            let keys = spec.key_range(blk.b, i);
            if !self.pair_terms(blk.b, blk.h, i, keys.clone(), &mut t) {
                continue;
            }
            // Σ_j w_ij G(q_i, k_j) with w = dS·σ.
            let (qt, qs) = (q.row(i), q.aux(i));
            for ((ds, sigma), j) in t.ds.iter().zip(&t.sigma).zip(keys) {
                self.ctx
                    .score
                    .accumulate(dq, ds * sigma, qt, qs, k.row(j), k.aux(j));
            }
            self.ctx.score.finish(dq, qt, qs);
        }
        out
    }

    /// Sweep 2 for one key block of kv head `blk.h`: `dk_j` and `dv_j` rows, summed over the GQA group.
    fn dkv_block(&self, blk: &Block) -> (Vec<f64>, Vec<f64>) {
        let spec = self.ctx.spec;
        let (d, dv) = (spec.head_dim(), spec.head_dim_v());
        let (j0, n) = (blk.rows.start, blk.rows.len());
        let mut dk = vec![0.0; n * d];
        let mut dvs = vec![0.0; n * dv];
        let mut colsum = vec![0.0; n];
        // Whether any query sees key j: one no query sees keeps dk_j = dv_j = 0 whatever it holds.
        let mut seen = vec![false; n];
        let mut t = Scratch::new(spec.seq_k());
        let k = self.ctx.k.get(blk.b, blk.h);
        let v = self.ctx.v.get(blk.b, blk.h);
        for h in (0..spec.heads_q()).filter(|&h| spec.kv_head(h) == blk.h) {
            let q = self.ctx.q.get(blk.b, h);
            for i in 0..spec.seq_lens(blk.b).q {
                let r = spec.key_range(blk.b, i);
                let keys = r.start.max(blk.rows.start)..r.end.min(blk.rows.end);
                if keys.start >= keys.end || !self.pair_terms(blk.b, h, i, keys.clone(), &mut t) {
                    continue;
                }
                let g = self.g(blk.b, h, i);
                let (qt, qs) = (q.row(i), q.aux(i));
                let terms = t.p.iter().zip(&t.ds).zip(&t.sigma);
                for (((&p, &ds), &sigma), j) in terms.zip(keys) {
                    let jj = j - j0;
                    axpy(&mut dvs[jj * dv..(jj + 1) * dv], p, g);
                    let dkj = &mut dk[jj * d..(jj + 1) * d];
                    self.ctx
                        .score
                        .accumulate(dkj, ds * sigma, k.row(j), k.aux(j), qt, qs);
                    colsum[jj] += ds;
                    seen[jj] = true;
                }
            }
        }
        for (jj, (dk, dvj)) in dk.chunks_exact_mut(d).zip(dvs.chunks_exact_mut(dv)).enumerate() {
            let j = j0 + jj;
            self.ctx.score.finish(dk, k.row(j), k.aux(j));
            if let (Some(c), true) = (self.ctx.midpoint, seen[jj]) {
                // dv_j += (Σ_i dS_ij) c γ_j² v_j
                axpy(dvj, colsum[jj] * log_gamma(c, v.row(j)).1, v.row(j));
            }
        }
        (dk, dvs)
    }

    /// Sweep 3 for bias row `(bb, bh, i)`: `Σ dS_ij` over every (b, h) whose bias row it is.
    fn dbias_row(&self, bb: usize, bh: usize, i: usize) -> Vec<f64> {
        let spec = self.ctx.spec;
        let mut row = vec![0.0; spec.seq_k()];
        let mut t = Scratch::new(spec.seq_k());
        let target = spec.bias_index(bb, bh, i, 0);
        for b in 0..spec.batch() {
            for h in (0..spec.heads_q()).filter(|&h| spec.bias_index(b, h, i, 0) == target) {
                let keys = spec.key_range(b, i);
                if self.pair_terms(b, h, i, keys.clone(), &mut t) {
                    row[keys.clone()]
                        .iter_mut()
                        .zip(&t.ds)
                        .for_each(|(r, ds)| *r += ds);
                }
            }
        }
        row
    }
}

/// Run the three sweeps and scatter their rows into `g` through the spec's offsets.
pub(super) fn run(ctx: &Ctx<'_>, o: &[f64], d_o: &[f64], stats: &[f64], g: &mut Gradients<f64>) {
    let spec = ctx.spec;
    let (d, dv) = (spec.head_dim(), spec.head_dim_v());

    // δ_i = g_i·o_i for every query row.
    let mut delta = vec![0.0; spec.stats_len()];
    for b in 0..spec.batch() {
        for h in 0..spec.heads_q() {
            for i in 0..spec.seq_lens(b).q {
                let at = spec.o_offset(b, i, h);
                delta[spec.stats_index(b, h, i)] = dot(&d_o[at..at + dv], &o[at..at + dv]);
            }
        }
    }
    let grad = Grad {
        ctx,
        d_o,
        stats,
        delta,
    };

    // (1) dq per (b, h, query block).
    let q_tasks = blocks(spec, spec.heads_q(), |b| spec.seq_lens(b).q, QUERY_BLOCK);
    let dq: Vec<Vec<f64>> = q_tasks.par_iter().map(|blk| grad.dq_block(blk)).collect();
    for (blk, rows) in q_tasks.iter().zip(dq) {
        for (i, row) in blk.rows.clone().zip(rows.chunks_exact(d)) {
            let at = spec.dq_offset(blk.b, i, blk.h);
            g.dq[at..at + d].copy_from_slice(row);
        }
    }

    // (2) dk, dv per (b, kv head, key block).
    let k_tasks = blocks(spec, spec.heads_kv(), |b| spec.seq_lens(b).k, KEY_BLOCK);
    let dkv: Vec<_> = k_tasks.par_iter().map(|blk| grad.dkv_block(blk)).collect();
    for (blk, (dk, dvs)) in k_tasks.iter().zip(dkv) {
        for ((j, dk), dvj) in blk.rows.clone().zip(dk.chunks_exact(d)).zip(dvs.chunks_exact(dv)) {
            let at = spec.dk_offset(blk.b, j, blk.h);
            g.dk[at..at + d].copy_from_slice(dk);
            let at = spec.dv_offset(blk.b, j, blk.h);
            g.dv[at..at + dv].copy_from_slice(dvj);
        }
    }

    // (3) dbias per bias row.
    if let (Some(shape), Some(dbias)) = (spec.bias(), g.dbias.as_mut()) {
        let rows: Vec<(usize, usize, usize)> = (0..shape.batch)
            .flat_map(|bb| (0..shape.heads).flat_map(move |bh| (0..spec.seq_q()).map(move |i| (bb, bh, i))))
            .collect();
        let out: Vec<Vec<f64>> = rows
            .par_iter()
            .map(|&(bb, bh, i)| grad.dbias_row(bb, bh, i))
            .collect();
        for (&(bb, bh, i), row) in rows.iter().zip(out) {
            if let Some(at) = spec.bias_index(bb, bh, i, 0) {
                dbias[at..at + row.len()].copy_from_slice(&row);
            }
        }
    }
}
