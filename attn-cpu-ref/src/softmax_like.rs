//! Softmax, cosine-similarity and hyperbolic attention (docs/math.md §1, §2, §4): the families whose
//! weights are a softmax over scores.
//!
//! ## Forward
//! For query `i` of slice (b, h) and the keys `j` in `spec.key_range(b, i)`:
//! `s_ij = score(q_i, k_j) + bias_ij (+ log γ_j for the Einstein midpoint)`,
//! `LSE_i = m_i + log Σ_j exp(s_ij − m_i)` with `m_i = max_j s_ij`,
//! `P_ij = exp(s_ij − LSE_i)`, `o_i = Σ_j P_ij v_j`. The score of each family and its gradient live
//! in [`score`]; `γ_j = 1/√(1 − min(c‖v_j‖², KLEIN_MAX_NORM2))`. A row with no allowed key (or whose
//! every allowed score is −∞) gets `o_i = 0` and `LSE_i = −∞`.
//!
//! ## Backward
//! With `g_i = dL/do_i`: `δ_i = g_i·o_i`, `dP_ij = g_i·v_j`, `dS_ij = P_ij (dP_ij − δ_i)`,
//! `dV_j = Σ_i P_ij g_i`, `dbias_ij = dS_ij` (summed over broadcast dims), and dS flows through the
//! score to q and k ([`score`]). The Einstein midpoint adds `(Σ_i dS_ij) c γ_j² v_j` to `dv_j`
//! (`∂ log γ_j/∂v_j = c γ_j² v_j`), except where the Klein-ball clamp is active.
//!
//! ## Structure (FlashAttention-2's split)
//! q, k and v are gathered once into contiguous per-slice rows ([`rows`]). The forward runs one task
//! per (batch entry, query head, block of queries), one score row at a time. The backward runs
//! (1) per (batch entry, query head, query block): `δ_i` and `dq_i`; (2) per (batch entry, kv head,
//! key block): `dk_j`, `dv_j`, recomputing `P_ij` for every query of the GQA group whose key range
//! holds `j`; (3) with a bias, per bias row: `dbias`, summing the (b, h) that broadcast onto it in a
//! fixed order. Tasks return their rows, which are then scattered through the spec's offsets: no
//! Nq×Nk buffer, no shared mutable state, and the result does not depend on the thread count.

mod backward;
mod rows;
mod score;

use crate::{Gradients, Inputs};
use attn_core::{Aggregation, AttnSpec, FamilySpec, KLEIN_MAX_NORM2};
use rayon::prelude::*;
use rows::{Rows, Slices, Tensor};
use score::{axpy, dot, RowScalars, Score};
use std::ops::Range;

/// Queries per forward / dq task.
const QUERY_BLOCK: usize = 32;
/// Keys per dk / dv task.
const KEY_BLOCK: usize = 32;

/// Rows `rows` of the (batch entry `b`, head `h`) slice: one unit of parallel work.
#[derive(Clone, Debug)]
struct Block {
    b: usize,
    h: usize,
    rows: Range<usize>,
}

/// Split every (b, h) slice, `heads` heads with `len(b)` rows, into blocks of `size` rows.
fn blocks(spec: &AttnSpec, heads: usize, len: impl Fn(usize) -> usize, size: usize) -> Vec<Block> {
    let mut out = Vec::new();
    for b in 0..spec.batch() {
        let n = len(b);
        for h in 0..heads {
            out.extend((0..n).step_by(size).map(|r0| Block {
                b,
                h,
                rows: r0..(r0 + size).min(n),
            }));
        }
    }
    out
}

/// `log γ` of a value row and the factor `c γ²` of its gradient (0 where the clamp is active).
fn log_gamma(c: f64, v: &[f64]) -> (f64, f64) {
    let n2 = c * dot(v, v);
    let clamped = n2 > KLEIN_MAX_NORM2;
    // Not `f64::min`, which returns the bound for a NaN norm: a NaN value row keeps a NaN log γ.
    let n2 = if clamped { KLEIN_MAX_NORM2 } else { n2 };
    let dfactor = if clamped { 0.0 } else { c / (1.0 - n2) };
    (-0.5 * (-n2).ln_1p(), dfactor)
}

/// `max(a, b)`, NaN when either is NaN.
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Everything a task reads: the spec, the score and the prepared rows.
struct Ctx<'a> {
    spec: &'a AttnSpec,
    score: Score,
    /// The curvature `c` when values aggregate by Einstein midpoint.
    midpoint: Option<f64>,
    q: Slices<RowScalars>,
    k: Slices<RowScalars>,
    /// Raw value rows; the row scalar is `log γ_j` (0 for Euclidean aggregation).
    v: Slices<f64>,
    bias: Option<&'a [f64]>,
}

impl<'a> Ctx<'a> {
    fn new(spec: &'a AttnSpec, x: &Inputs<'a, f64>) -> Ctx<'a> {
        let score = Score::new(spec.family());
        let midpoint = match *spec.family() {
            FamilySpec::Hyperbolic {
                aggregation: Aggregation::EinsteinMidpoint,
                curvature,
                ..
            } => Some(curvature as f64),
            _ => None,
        };
        let embed = |raw: &[f64], out: &mut [f64]| score.prepare(raw, out);
        let value = |raw: &[f64], out: &mut [f64]| {
            out.copy_from_slice(raw);
            midpoint.map_or(0.0, |c| log_gamma(c, raw).0)
        };
        Ctx {
            spec,
            score,
            midpoint,
            q: Slices::gather(spec, Tensor::Q, x.q, embed),
            k: Slices::gather(spec, Tensor::K, x.k, embed),
            v: Slices::gather(spec, Tensor::V, x.v, value),
            bias: x.bias,
        }
    }

    /// The prepared query rows of (b, h) and key and value rows of its kv head.
    fn slice(&self, b: usize, h: usize) -> (&Rows<RowScalars>, &Rows<RowScalars>, &Rows<f64>) {
        let hk = self.spec.kv_head(h);
        (self.q.get(b, h), self.k.get(b, hk), self.v.get(b, hk))
    }

    /// `s[jj] = s_ij` (score + bias + log γ_j) for the keys `j = keys.start + jj`, and the score's
    /// derivative σ_ij when `sigma` is given.
    fn logits(
        &self,
        b: usize,
        h: usize,
        i: usize,
        keys: Range<usize>,
        s: &mut [f64],
        sigma: Option<&mut [f64]>,
    ) {
        let (q, k, v) = self.slice(b, h);
        match sigma {
            Some(sigma) => self
                .score
                .scores_grad(q.row(i), q.aux(i), k, keys.clone(), s, sigma),
            None => self.score.scores(q.row(i), q.aux(i), k, keys.clone(), s),
        }
        if let (Some(bias), Some(start)) = (self.bias, self.spec.bias_index(b, h, i, keys.start)) {
            // The bias is contiguous along j.
            s.iter_mut()
                .zip(&bias[start..start + keys.len()])
                .for_each(|(s, x)| *s += x);
        }
        if self.midpoint.is_some() {
            s.iter_mut().zip(keys).for_each(|(s, j)| *s += *v.aux(j));
        }
    }

    /// Forward for query row `i` of (b, h): writes `o_i` to `o` and returns `LSE_i`. `s` is scratch of
    /// at least `seq_k` entries.
    fn forward_row(&self, b: usize, h: usize, i: usize, s: &mut [f64], o: &mut [f64]) -> f64 {
        o.fill(0.0);
        let keys = self.spec.key_range(b, i);
        if keys.is_empty() {
            return f64::NEG_INFINITY;
        }
        let s = &mut s[..keys.len()];
        self.logits(b, h, i, keys.clone(), s, None);
        // The running max propagates NaN (`f64::max` would skip it, and an all-NaN row would then
        // look fully masked: o = 0, LSE = −∞). A NaN score makes the row's o and LSE NaN.
        let m = s.iter().copied().fold(f64::NEG_INFINITY, nan_max);
        if m.is_nan() {
            o.fill(f64::NAN);
            return f64::NAN;
        }
        if m == f64::NEG_INFINITY {
            return f64::NEG_INFINITY;
        }
        let mut l = 0.0;
        for x in s.iter_mut() {
            *x = (*x - m).exp();
            l += *x;
        }
        let (_, _, v) = self.slice(b, h);
        for (&w, j) in s.iter().zip(keys) {
            axpy(o, w, v.row(j));
        }
        let inv = 1.0 / l;
        o.iter_mut().for_each(|x| *x *= inv);
        m + l.ln()
    }
}

/// Forward of every softmax-like family: `o` at `spec.o_offset`, `LSE` at `spec.stats_index`.
pub(crate) fn forward(spec: &AttnSpec, x: &Inputs<'_, f64>, o: &mut [f64], stats: &mut [f64]) {
    let ctx = Ctx::new(spec, x);
    let dv = spec.head_dim_v();
    let tasks = blocks(spec, spec.heads_q(), |b| spec.seq_lens(b).q, QUERY_BLOCK);
    let results: Vec<(Vec<f64>, Vec<f64>)> = tasks
        .par_iter()
        .map(|blk| {
            let mut s = vec![0.0; spec.seq_k()];
            let mut out = vec![0.0; blk.rows.len() * dv];
            let lse = blk
                .rows
                .clone()
                .zip(out.chunks_exact_mut(dv))
                .map(|(i, o)| ctx.forward_row(blk.b, blk.h, i, &mut s, o))
                .collect();
            (out, lse)
        })
        .collect();
    for (blk, (out, lse)) in tasks.iter().zip(results) {
        for ((i, row), l) in blk.rows.clone().zip(out.chunks_exact(dv)).zip(lse) {
            let at = spec.o_offset(blk.b, i, blk.h);
            o[at..at + dv].copy_from_slice(row);
            stats[spec.stats_index(blk.b, blk.h, i)] = l;
        }
    }
}

/// Backward of every softmax-like family. The buffers of `g` arrive zeroed; entries no key range
/// reaches (padded keys) keep that zero, which is their gradient.
pub(crate) fn backward(
    spec: &AttnSpec,
    x: &Inputs<'_, f64>,
    o: &[f64],
    d_o: &[f64],
    stats: &[f64],
    g: &mut Gradients<f64>,
) {
    let ctx = Ctx::new(spec, x);
    backward::run(&ctx, o, d_o, stats, g);
}
