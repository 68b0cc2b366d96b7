//! The forward sweep: online softmax over key tiles, GEMM for `Q̃K̃ᵀ` and `P·V`, split-KV with an
//! LSE merge when the (batch, head, query tile) tasks are too few to fill the threads.

use super::simd::{dot_lanes, exp_sub_sum, max_ignoring_nan, multiversion, Level};
use super::tile::{matmul, matmul_masked, nan_max, Mat, BK, BQ};
use super::Ctx;
use crate::Forward;
use attn_core::Element;
use rayon::prelude::*;
use std::ops::Range;

/// One unit of work: query rows `rows` of (b, h), against the keys in `keys`.
struct Task {
    b: usize,
    h: usize,
    rows: Range<usize>,
    keys: Range<usize>,
}

/// A task's unnormalised result: `acc = Σ_j exp(s_ij − m_i) v_j`, the running max `m_i` and sum
/// `l_i` of each row.
pub(super) struct Part {
    pub acc: Vec<f32>,
    pub m: Vec<f32>,
    pub l: Vec<f32>,
}

/// The (batch, head, query tile) tasks below which the forward splits the keys of each slice.
/// A constant, not the thread count: the partition, and so every rounding, depends on the shape
/// alone (bit-identical results under any number of threads). 64 keeps 2 to 64 threads busy on
/// decode shapes; the merge it costs is one pass over `parts × Dv` values per row.
const SPLIT_BELOW_TASKS: usize = 64;
/// Keys a split must hold at least (below it the merge costs more than the parallelism gains).
const MIN_SPLIT_KEYS: usize = 512;

/// How many parts the keys of every slice are split into, given the (batch, head, query tile)
/// tasks `tiles` and the longest key length `seq_k`: 1 when the tiles reach
/// [`SPLIT_BELOW_TASKS`], else enough parts to reach it, at most one per [`MIN_SPLIT_KEYS`] keys.
pub(super) fn key_splits(tiles: usize, seq_k: usize) -> usize {
    if tiles >= SPLIT_BELOW_TASKS {
        return 1;
    }
    let want = SPLIT_BELOW_TASKS.div_ceil(tiles.max(1));
    want.min((seq_k / MIN_SPLIT_KEYS).max(1))
}

fn tasks<E: Element>(ctx: &Ctx<'_, E>) -> Vec<Task> {
    let spec = ctx.spec;
    let mut tiles = Vec::new();
    for b in 0..spec.batch() {
        let n = spec.seq_lens(b).q;
        for h in 0..spec.heads_q() {
            tiles.extend((0..n).step_by(BQ).map(|r0| (b, h, r0..(r0 + BQ).min(n))));
        }
    }
    let parts = key_splits(tiles.len(), spec.seq_k());
    let mut out = Vec::with_capacity(tiles.len() * parts);
    for (b, h, rows) in tiles {
        let nk = spec.seq_lens(b).k;
        let step = nk.div_ceil(parts).max(1);
        for p in 0..parts {
            let k0 = (p * step).min(nk);
            let k1 = ((p + 1) * step).min(nk);
            out.push(Task {
                b,
                h,
                rows: rows.clone(),
                keys: k0..k1,
            });
        }
    }
    out
}

multiversion! {
    /// [`task_body`] at `level`.
    fn run_task<E: Element>(ctx: &Ctx<'_, E>, t: &Task) -> Part => task_body;
}

/// One task: the online softmax over its key tiles.
#[inline(always)]
fn task_body<E: Element>(ctx: &Ctx<'_, E>, t: &Task) -> Part {
    let spec = ctx.spec;
    let (d, dv) = (spec.head_dim(), spec.head_dim_v());
    let hk = spec.kv_head(t.h);
    let (q, k, v) = (ctx.q(t.b, t.h), ctx.k(t.b, hk), ctx.v(t.b, hk));
    let (i0, m) = (t.rows.start, t.rows.len());
    let mut part = Part {
        acc: vec![0.0; m * dv],
        m: vec![f32::NEG_INFINITY; m],
        l: vec![0.0; m],
    };
    // The keys any row of the tile may see, within this task's split.
    let (mut lo, mut hi) = (usize::MAX, 0);
    for i in t.rows.clone() {
        let r = spec.key_range(t.b, i);
        if !r.is_empty() {
            lo = lo.min(r.start);
            hi = hi.max(r.end);
        }
    }
    let (lo, hi) = (lo.max(t.keys.start), hi.min(t.keys.end));
    if lo >= hi {
        return part;
    }
    let qt = q.block(i0, m);
    let mut s = vec![0f32; m * BK];
    for j0 in (lo..hi).step_by(BK) {
        let n = (hi - j0).min(BK);
        let s = &mut s[..m * n];
        if m == 1 {
            // One query (decode): the tile is n dot products and `P·V` n row updates, streamed
            // from K and V once; a GEMM call per tile would spend more on packing than on them.
            let qr = q.row(i0);
            for (c, x) in s.iter_mut().enumerate() {
                *x = dot_lanes(qr, k.row(j0 + c));
            }
        } else {
            matmul(m, n, d, s, n, false, qt, k.block_t(j0, n));
        }
        ctx.logits(t.b, t.h, i0, m, j0, n, s, None);
        for r in 0..m {
            let row = &mut s[r * n..(r + 1) * n];
            let o = &mut part.acc[r * dv..(r + 1) * dv];
            online_row(row, &mut part.m[r], &mut part.l[r], o);
        }
        if m == 1 {
            for (c, &p) in s.iter().enumerate() {
                part.acc
                    .iter_mut()
                    .zip(v.row(j0 + c))
                    .for_each(|(o, x)| *o += p * x);
            }
        } else {
            let sees = |r: usize, c: usize| spec.key_range(t.b, i0 + r).contains(&(j0 + c));
            let (a, b) = (Mat::rows(s, n), v.block(j0, n));
            matmul_masked((m, dv, n), &mut part.acc, dv, a, b, &v.bad_in(j0, n), sees);
        }
    }
    part
}

/// One row's online-softmax step over a tile of logits `row`: update the running max `m` and sum
/// `l`, rescale the accumulator `o`, and leave `e^(s − m)` in `row` for the `P·V` product. A NaN
/// logit makes the row NaN for good (`m`, `l` and `o` NaN, docs/nan.md): where the row also sees a
/// finite logit the NaN reaches `l` through the sum, and a tile of only NaN and −∞ is caught
/// below (the max ignores NaN so that it vectorises).
#[inline(always)]
pub(super) fn online_row(row: &mut [f32], m: &mut f32, l: &mut f32, o: &mut [f32]) {
    let m_old = *m;
    if m_old.is_nan() {
        row.fill(0.0);
        return;
    }
    let m_new = m_old.max(max_ignoring_nan(row));
    if m_new == f32::NEG_INFINITY {
        if row.iter().any(|x| x.is_nan()) {
            *m = f32::NAN;
            *l = f32::NAN;
            o.fill(f32::NAN);
        }
        row.fill(0.0);
        return;
    }
    *m = m_new;
    let alpha = (m_old - m_new).exp();
    if alpha != 1.0 {
        o.iter_mut().for_each(|x| *x *= alpha);
    }
    *l = *l * alpha + exp_sub_sum(row, m_new);
}

/// Merge the parts of one row into `(o, LSE)`.
pub(super) fn merge(parts: &[&Part], r: usize, dv: usize, o: &mut [f32]) -> f32 {
    o.fill(0.0);
    let mmax = parts.iter().map(|p| p.m[r]).fold(f32::NEG_INFINITY, nan_max);
    if mmax.is_nan() {
        o.fill(f32::NAN);
        return f32::NAN;
    }
    if mmax == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    let mut l = 0.0;
    for p in parts {
        if p.m[r] == f32::NEG_INFINITY {
            continue;
        }
        let w = (p.m[r] - mmax).exp();
        l += p.l[r] * w;
        o.iter_mut()
            .zip(&p.acc[r * dv..(r + 1) * dv])
            .for_each(|(o, a)| *o += w * a);
    }
    let inv = 1.0 / l;
    o.iter_mut().for_each(|x| *x *= inv);
    mmax + l.ln()
}

pub(super) fn run<E: Element>(ctx: &Ctx<'_, E>, level: Level) -> Forward<E, f32> {
    let spec = ctx.spec;
    let dv = spec.head_dim_v();
    let tasks = tasks(ctx);
    let parts: Vec<Part> = tasks.par_iter().map(|t| run_task(level, ctx, t)).collect();
    let mut o = vec![E::from_f32(0.0); spec.o_len()];
    let mut stats = vec![0f32; spec.stats_len()];
    let mut row = vec![0f32; dv];
    let mut at = 0;
    while at < tasks.len() {
        // The splits of one (b, h, query tile) are consecutive.
        let t = &tasks[at];
        let mut end = at + 1;
        while end < tasks.len() && tasks[end].b == t.b && tasks[end].h == t.h && tasks[end].rows == t.rows {
            end += 1;
        }
        let group: Vec<&Part> = parts[at..end].iter().collect();
        for (r, i) in t.rows.clone().enumerate() {
            let lse = merge(&group, r, dv, &mut row);
            let off = spec.o_offset(t.b, i, t.h);
            o[off..off + dv]
                .iter_mut()
                .zip(&row)
                .for_each(|(o, x)| *o = E::from_f32(*x));
            stats[spec.stats_index(t.b, t.h, i)] = lse;
        }
        at = end;
    }
    Forward { o, stats }
}
