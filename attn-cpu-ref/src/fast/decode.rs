//! One query per sequence (decode) on a plain dot-product score: one task per (batch entry, key
//! split) that walks its keys in tiles and, per tile, serves every query head.
//!
//! k and v arrive as `[B, N, Hkv, D]` (or any strides): the rows of one head sit a whole token
//! apart (4 KiB at Hkv = 8, D = 128, f32), so a task per head reads one row per page and pays a
//! TLB miss per key. Here a tile's keys are visited for all kv heads at once (f32 storage read in
//! place, other dtypes converted to f32 into a task-local buffer: no copy of the whole cache), and
//! each query head of a GQA group reads its kv head's rows while they are in cache: the cache is
//! read once per call.

use super::forward::{key_splits, merge, online_row, Part};
use super::simd::{dot_lanes, multiversion, Level};
use super::tile::{Kind, BK};
use super::Ctx;
use crate::{Forward, Inputs};
use attn_core::{AttnSpec, DType, Element};
use rayon::prelude::*;
use std::ops::Range;

/// Whether [`run`] computes this forward: one query per sequence, and q, k, v used as they are
/// (a dot-product score; no Einstein midpoint, which only the hyperbolic family has).
pub(super) fn applies(spec: &AttnSpec, kind: Kind) -> bool {
    spec.seq_q() == 1 && matches!(kind, Kind::Dot { .. })
}

multiversion! {
    /// [`task_body`] at `level`.
    fn run_task<E: Element>(ctx: &Ctx<'_, E>, x: &Inputs<'_, E>, b: usize, keys: &Range<usize>) -> Part => task_body;
}

/// The keys `keys` of batch entry `b` for every query head: row `h` of the part is head `h`.
#[inline(always)]
fn task_body<E: Element>(ctx: &Ctx<'_, E>, x: &Inputs<'_, E>, b: usize, keys: &Range<usize>) -> Part {
    let spec = ctx.spec;
    let (d, dv, hq, hkv) = (
        spec.head_dim(),
        spec.head_dim_v(),
        spec.heads_q(),
        spec.heads_kv(),
    );
    let mut part = Part {
        acc: vec![0.0; hq * dv],
        m: vec![f32::NEG_INFINITY; hq],
        l: vec![0.0; hq],
    };
    let range = spec.key_range(b, 0);
    let (lo, hi) = (range.start.max(keys.start), range.end.min(keys.end));
    if lo >= hi {
        return part;
    }
    // f32 rows are read in place (the context borrows them); other storage is converted tile by
    // tile into kt and vt, [key][kv head][dim].
    let in_place = E::DTYPE == DType::F32 && !ctx.k(b, 0).data.is_empty();
    let (kn, vn) = if in_place {
        (0, 0)
    } else {
        (BK * hkv * d, BK * hkv * dv)
    };
    let (mut kt, mut vt) = (vec![0f32; kn], vec![0f32; vn]);
    // Scores of head h at s[h·BK..]; query heads h_0.. of kv head hk are hk·g.., g = Hq/Hkv.
    let g = hq / hkv.max(1);
    let mut s = vec![0f32; hq * BK];
    for j0 in (lo..hi).step_by(BK) {
        let n = (hi - j0).min(BK);
        if !in_place {
            for c in 0..n {
                for hk in 0..hkv {
                    let at = spec.k_offset(b, j0 + c, hk);
                    let dst = &mut kt[(c * hkv + hk) * d..][..d];
                    dst.iter_mut()
                        .zip(&x.k[at..at + d])
                        .for_each(|(o, e)| *o = e.to_f32());
                    let at = spec.v_offset(b, j0 + c, hk);
                    let dst = &mut vt[(c * hkv + hk) * dv..][..dv];
                    dst.iter_mut()
                        .zip(&x.v[at..at + dv])
                        .for_each(|(o, e)| *o = e.to_f32());
                }
            }
        }
        // Key row (c, hk) of the tile: in memory order when visited c-major, hk-minor.
        let krow = |c: usize, hk: usize| -> &[f32] {
            if in_place {
                ctx.k(b, hk).row(j0 + c)
            } else {
                &kt[(c * hkv + hk) * d..][..d]
            }
        };
        let vrow = |c: usize, hk: usize| -> &[f32] {
            if in_place {
                ctx.v(b, hk).row(j0 + c)
            } else {
                &vt[(c * hkv + hk) * dv..][..dv]
            }
        };
        for c in 0..n {
            for hk in 0..hkv {
                let kr = krow(c, hk);
                // Ask for the same key's v row now: the P·V pass below reads it from cache.
                prefetch_row(vrow(c, hk));
                for h in hk * g..(hk + 1) * g {
                    s[h * BK + c] = dot_lanes(ctx.q(b, h).row(0), kr);
                }
            }
        }
        for h in 0..hq {
            let row = &mut s[h * BK..h * BK + n];
            ctx.logits(b, h, 0, 1, j0, n, row, None);
            let o = &mut part.acc[h * dv..(h + 1) * dv];
            online_row(row, &mut part.m[h], &mut part.l[h], o);
        }
        for c in 0..n {
            for hk in 0..hkv {
                let vr = vrow(c, hk);
                for h in hk * g..(hk + 1) * g {
                    let p = s[h * BK + c];
                    part.acc[h * dv..(h + 1) * dv]
                        .iter_mut()
                        .zip(vr)
                        .for_each(|(o, v)| *o += p * v);
                }
            }
        }
    }
    part
}

/// Prefetch the cache lines of `row` into L2 (a no-op off x86-64).
#[inline(always)]
fn prefetch_row(row: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in row.chunks(16) {
        // SAFETY: a prefetch reads nothing architecturally and cannot fault; the address is in a live
        // slice.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(line.as_ptr().cast());
        }
    }
}

/// The forward of a one-query spec ([`applies`]): tasks (batch entry, key split), the splits
/// from [`key_splits`] over the batch entries, merged per head in split order.
pub(super) fn run<E: Element>(ctx: &Ctx<'_, E>, x: &Inputs<'_, E>, level: Level) -> Forward<E, f32> {
    let spec = ctx.spec;
    let dv = spec.head_dim_v();
    let parts = key_splits(spec.batch(), spec.seq_k());
    let mut tasks = Vec::new();
    for b in (0..spec.batch()).filter(|&b| spec.seq_lens(b).q == 1) {
        let nk = spec.seq_lens(b).k;
        let step = nk.div_ceil(parts).max(1);
        for p in 0..parts {
            tasks.push((b, (p * step).min(nk)..((p + 1) * step).min(nk)));
        }
    }
    let results: Vec<Part> = tasks
        .par_iter()
        .map(|(b, keys)| run_task(level, ctx, x, *b, keys))
        .collect();
    let mut o = vec![E::from_f32(0.0); spec.o_len()];
    let mut stats = vec![0f32; spec.stats_len()];
    let mut row = vec![0f32; dv];
    for (t, chunk) in tasks.chunks(parts).zip(results.chunks(parts)) {
        let b = t[0].0;
        let group: Vec<&Part> = chunk.iter().collect();
        for h in 0..spec.heads_q() {
            let lse = merge(&group, h, dv, &mut row);
            let off = spec.o_offset(b, 0, h);
            o[off..off + dv]
                .iter_mut()
                .zip(&row)
                .for_each(|(o, x)| *o = E::from_f32(*x));
            stats[spec.stats_index(b, h, 0)] = lse;
        }
    }
    Forward { o, stats }
}
