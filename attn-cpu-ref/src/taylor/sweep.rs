//! The one computation every Taylor pass reduces to: a chunked prefix sweep of sources against probes.
//!
//! Sources `(x_s, y_s)` with `x_s ∈ R^D`, `y_s ∈ R^m` (`s < ns`) and probes `(z_p, w_p)` with
//! `z_p ∈ R^D`, `w_p ∈ R^m` (`p < np`). Probe `p` sees the sources `s < hi_p`, and `hi_p` is
//! nondecreasing in `p`. Per probe the sweep returns
//!
//! - `value_p = Σ_{s<hi_p} f(z_p·x_s) y_s`                 (`m` numbers), and/or
//! - `grad_p  = Σ_{s<hi_p} f'(z_p·x_s) (w_p·y_s) x_s`      (`D` numbers),
//!
//! with `f(t) = a0 + a1 t + a2 t²`, `f'(t) = a1 + 2 a2 t`. Both factor through the states of a set of
//! sources, which do not depend on the probe:
//!
//! - `P0 = Σ_s y_s` `[m]`, `P1 = Σ_s x_s y_sᵀ` `[D, m]`, `P2 = Σ_s (x_s⊗x_s) y_sᵀ` `[D(D+1)/2, m]`;
//! - `value = a0 P0 + a1 P1ᵀ z + a2 P2ᵀ (z⊗z)`;
//! - `grad  = a1 P1 w + 2 a2 W z`, with the symmetric `W = Σ_s x_s x_sᵀ (w·y_s)` whose `(a, b)` entry is
//!   `P2[(a, b)]·w`.
//!
//! `x⊗x` is symmetric, so `P2` keeps only the `D(D+1)/2` pairs `a ≤ b` (row-major: `(0,0), (0,1), …,
//! (0,D−1), (1,1), …`) and the probe side weighs pair `(a, b)` by `c_ab = 2` for `a < b` and 1 on the
//! diagonal: `(z·x)² = Σ_{a≤b} c_ab z_a z_b x_a x_b`.
//!
//! Chunking: sources are folded into the states `chunk` at a time. Probe `p` is evaluated at the
//! boundary `c = ⌊hi_p / chunk⌋·chunk`, against the states of the sources `[0, c)` plus, densely, the
//! fewer than `chunk` sources `[c, hi_p)`. Memory: one set of states (`O(D²·m)`) and the outputs
//! (`O(np·(D + m))`); nothing of size `ns × np` or `ns × D²`.

use super::gemm::{gemm_acc, View};
use super::Poly;
use rayon::prelude::*;
use std::ops::Range;

/// Sources folded into the states at a time (the dense part of a probe covers fewer than this).
pub(super) const CHUNK: usize = 64;

/// Probes evaluated together against one read of the states (one rayon task).
const PROBE_BLOCK: usize = 32;

/// What a sweep computes and the sizes of its rows.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sweep {
    pub poly: Poly,
    /// Width of `x` and `z` (the head dim `D`).
    pub d: usize,
    /// Width of `y` and `w`.
    pub m: usize,
    /// Sources folded into the states at a time (≥ 1).
    pub chunk: usize,
    /// Whether to compute `value`.
    pub want_value: bool,
}

/// Sources, as row-major `[ns, D]` and `[ns, m]` buffers.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sources<'a> {
    pub x: &'a [f64],
    pub y: &'a [f64],
}

/// Probes: `z` `[np, D]`, `w` `[np, m]` (present exactly when `grad` is wanted) and the prefix lengths.
#[derive(Clone, Copy, Debug)]
pub(super) struct Probes<'a> {
    pub z: &'a [f64],
    pub w: Option<&'a [f64]>,
    /// `hi[p]`: probe `p` sees sources `0..hi[p]`; nondecreasing, at most `ns`.
    pub hi: &'a [usize],
}

/// Results per probe: `value` `[np, m]` (empty unless wanted) and `grad` `[np, D]` (empty unless `w`).
#[derive(Clone, Debug, Default)]
pub(super) struct Swept {
    pub value: Vec<f64>,
    pub grad: Vec<f64>,
}

/// The states `P0`, `P1`, `P2` of a set of sources (`P2` empty when `a2 = 0`).
struct State {
    p0: Vec<f64>,
    p1: Vec<f64>,
    p2: Vec<f64>,
}

fn axpy(acc: &mut [f64], c: f64, x: &[f64]) {
    for (a, x) in acc.iter_mut().zip(x) {
        *a += c * x;
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

impl State {
    fn new(d: usize, m: usize, square: bool) -> Self {
        State {
            p0: vec![0.0; m],
            p1: vec![0.0; d * m],
            p2: if square {
                vec![0.0; d * (d + 1) / 2 * m]
            } else {
                Vec::new()
            },
        }
    }

    /// Fold the sources `x` `[n, D]`, `y` `[n, m]` into the states.
    fn add(&mut self, d: usize, m: usize, x: &[f64], y: &[f64]) {
        let n = x.len() / d;
        // P0 += Σ_s y_s,  P1 += Xᵀ Y
        for ys in y.chunks_exact(m) {
            axpy(&mut self.p0, 1.0, ys);
        }
        gemm_acc(
            d,
            m,
            n,
            1.0,
            View {
                data: x,
                rs: 1,
                cs: d,
            },
            y,
            m,
            &mut self.p1,
            m,
        );
        if self.p2.is_empty() {
            return;
        }
        // P2[(a, a+i)] += Σ_s x_s(a+i) (x_sa y_s), one rayon task per a: the pairs (a, a..D) are
        // contiguous rows, a [D−a, m] block += X[:, a..]ᵀ Ỹ_a with Ỹ_a[s] = x_sa y_s.
        let mut blocks = Vec::with_capacity(d);
        let mut rest: &mut [f64] = &mut self.p2;
        for a in 0..d {
            let (block, tail) = std::mem::take(&mut rest).split_at_mut((d - a) * m);
            blocks.push((a, block));
            rest = tail;
        }
        blocks.into_par_iter().for_each(|(a, block)| {
            let ya: Vec<f64> = x
                .chunks_exact(d)
                .zip(y.chunks_exact(m))
                .flat_map(|(xs, ys)| ys.iter().map(move |v| xs[a] * v))
                .collect();
            let xa = View {
                data: &x[a..],
                rs: 1,
                cs: d,
            };
            gemm_acc(d - a, m, n, 1.0, xa, &ya, m, block, m);
        });
    }
}

/// A row-major `[_, width]` buffer as a view.
fn rows(data: &[f64], width: usize) -> View<'_> {
    View {
        data,
        rs: width,
        cs: 1,
    }
}

/// `x` `[rows, cols]` transposed into `[cols, rows]`.
fn transpose(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; rows * cols];
    for (r, xr) in x.chunks_exact(cols).enumerate() {
        for (c, &v) in xr.iter().enumerate() {
            t[c * rows + r] = v;
        }
    }
    t
}

/// Run the sweep. `src` and `probes` must agree with `cfg` (`D`, `m`) and `hi[p] ≤ ns`.
pub(super) fn sweep(cfg: &Sweep, src: Sources<'_>, probes: Probes<'_>) -> Swept {
    let (d, m) = (cfg.d, cfg.m);
    let ns = src.x.len() / d;
    let np = probes.hi.len();
    // Internal invariant: the crate's callers build `hi` from a validated spec (nondecreasing key ends,
    // none past the sources); a user cannot reach this with other values.
    debug_assert!(probes.hi.windows(2).all(|w| w[0] <= w[1]) && probes.hi.iter().all(|&h| h <= ns));
    let mut out = Swept {
        value: if cfg.want_value {
            vec![0.0; np * m]
        } else {
            Vec::new()
        },
        grad: if probes.w.is_some() {
            vec![0.0; np * d]
        } else {
            Vec::new()
        },
    };
    let mut state = State::new(d, m, cfg.poly.a2 != 0.0);
    let (mut p0, mut start) = (0, 0);
    while p0 < np {
        // Probes whose last visible source lies in this chunk: states of [0, start) + dense [start, hi).
        let p1 = p0 + probes.hi[p0..].partition_point(|&h| h < start + cfg.chunk);
        let blocks: Vec<Range<usize>> = (p0..p1)
            .step_by(PROBE_BLOCK)
            .map(|b| b..(b + PROBE_BLOCK).min(p1))
            .collect();
        let results: Vec<Swept> = blocks
            .par_iter()
            .map(|r| eval_block(cfg, &state, src, start, probes, r.clone()))
            .collect();
        for (r, res) in blocks.iter().zip(results) {
            if cfg.want_value {
                out.value[r.start * m..r.end * m].copy_from_slice(&res.value);
            }
            if probes.w.is_some() {
                out.grad[r.start * d..r.end * d].copy_from_slice(&res.grad);
            }
        }
        p0 = p1;
        let end = (start + cfg.chunk).min(ns);
        if p0 < np && start < end {
            state.add(d, m, &src.x[start * d..end * d], &src.y[start * m..end * m]);
        }
        start += cfg.chunk;
    }
    out
}

/// Evaluate the probes `range` against the states of sources `[0, start)` plus sources `[start, hi_p)`.
fn eval_block(
    cfg: &Sweep,
    state: &State,
    src: Sources<'_>,
    start: usize,
    probes: Probes<'_>,
    range: Range<usize>,
) -> Swept {
    let (d, m) = (cfg.d, cfg.m);
    let Poly { a0, a1, a2 } = cfg.poly;
    let n = range.len();
    let mut out = Swept {
        value: if cfg.want_value {
            vec![0.0; n * m]
        } else {
            Vec::new()
        },
        grad: if probes.w.is_some() {
            vec![0.0; n * d]
        } else {
            Vec::new()
        },
    };
    let zb = &probes.z[range.start * d..range.end * d];
    let wb = probes.w.map(|w| &w[range.start * m..range.end * m]);

    // value = a0 P0 + a1 Z P1;  grad = a1 W P1ᵀ
    if cfg.want_value {
        for val in out.value.chunks_exact_mut(m) {
            axpy(val, a0, &state.p0);
        }
        gemm_acc(n, m, d, a1, rows(zb, d), &state.p1, m, &mut out.value, m);
    }
    if let Some(wb) = wb {
        let p1t = transpose(&state.p1, d, m);
        gemm_acc(n, d, m, a1, rows(wb, m), &p1t, d, &mut out.grad, d);
    }

    // Block a of P2 holds the pairs (a, a+i), i < D−a, as rows [D−a, m].
    //   value += Z̃_a P2_a with Z̃_a[p, i] = a2 c_{a,a+i} z_pa z_p(a+i);
    //   grad  += 2 a2 W z with W_{a,a+i} = T_a[p, i] = (W P2_aᵀ)[p, i], both triangles.
    if !state.p2.is_empty() {
        let mut za = vec![0.0; n * d];
        let mut t = vec![0.0; n * d];
        let mut row0 = 0;
        for a in 0..d {
            // `black_box`: rustc 1.95.0 (LLVM 22.1.2) at opt-level 3 miscompiles this loop. It versions
            // the P2 value update on `k == 1` and, in that version, divides the probe count by
            // `1 − a` (no divisor in the source), so at D = 2, a = 1 it divides by zero (SIGFPE;
            // at D ≥ 3, `1 − a` wraps to a huge divisor and the results stay right). Hiding `k`'s
            // relation to `d − a` keeps that version out; the cost is one opaque value per pair block. A
            // standalone reproduction: tests/repro/taylor_pairs_sigfpe.rs; the release-profile
            // regression test: tests/taylor_head_dim_two.rs.
            let k = std::hint::black_box(d - a);
            let block = &state.p2[row0 * m..(row0 + k) * m];
            row0 += k;
            if cfg.want_value {
                for (zap, zp) in za.chunks_exact_mut(k).zip(zb.chunks_exact(d)) {
                    for (i, zv) in zap.iter_mut().enumerate() {
                        let c = if i == 0 { a2 } else { 2.0 * a2 };
                        *zv = c * zp[a] * zp[a + i];
                    }
                }
                gemm_acc(n, m, k, 1.0, rows(&za[..n * k], k), block, m, &mut out.value, m);
            }
            if let Some(wb) = wb {
                let bt = transpose(block, k, m);
                let ta = &mut t[..n * k];
                ta.fill(0.0);
                gemm_acc(n, k, m, 2.0 * a2, rows(wb, m), &bt, k, ta, k);
                for ((tp, zp), g) in ta
                    .chunks_exact(k)
                    .zip(zb.chunks_exact(d))
                    .zip(out.grad.chunks_exact_mut(d))
                {
                    g[a] += dot(tp, &zp[a..]);
                    for (gb, tv) in g[a + 1..].iter_mut().zip(&tp[1..]) {
                        *gb += tv * zp[a];
                    }
                }
            }
        }
    }

    let z = |p: usize| &probes.z[p * d..(p + 1) * d];
    let w = |p: usize| probes.w.map(|w| &w[p * m..(p + 1) * m]);
    // Dense part: the sources [start, hi_p) of this chunk, f(t) and f'(t) with t = z·x.
    for (bp, p) in range.enumerate() {
        let zp = z(p);
        for s in start..probes.hi[p] {
            let xs = &src.x[s * d..(s + 1) * d];
            let ys = &src.y[s * m..(s + 1) * m];
            let t = dot(zp, xs);
            if cfg.want_value {
                axpy(&mut out.value[bp * m..(bp + 1) * m], cfg.poly.f(t), ys);
            }
            if let Some(wp) = w(p) {
                axpy(
                    &mut out.grad[bp * d..(bp + 1) * d],
                    cfg.poly.df(t) * dot(wp, ys),
                    xs,
                );
            }
        }
    }
    out
}
