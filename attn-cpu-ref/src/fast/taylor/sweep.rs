//! The chunked prefix sweep in f32: the one computation every Taylor pass of the fast path reduces to,
//! the same as the reference's `taylor::sweep` with dense GEMMs on both sides of the chunk boundary.
//!
//! Sources `(x_s, y_s)`, `x_s ∈ R^D`, `y_s ∈ R^m` (`s < ns`), and probes `(z_p, w_p)`, `z_p ∈ R^D`,
//! `w_p ∈ R^m` (`p < np`); probe `p` sees the sources `s < hi_p`, `hi_p` nondecreasing in `p`:
//!
//! - `value_p = Σ_{s<hi_p} f(z_p·x_s) y_s`               (`m` numbers), and/or
//! - `grad_p  = Σ_{s<hi_p} f'(z_p·x_s) (w_p·y_s) x_s`    (`D` numbers),
//!
//! `f(t) = a0 + a1 t + a2 t²`, `f'(t) = a1 + 2 a2 t`.
//!
//! ## Chunks
//! Sources are folded into states up to each chunk boundary some probe is evaluated at (all of them
//! at once when no probe falls in between, as without a mask): `P0 = Σ y_s` `[m]`,
//! `P1 = Σ x_s y_sᵀ` `[D, m]`, `P2 = Σ φ(x_s) y_sᵀ` `[D(D+1)/2, m]` with the symmetric features
//! `φ(x)_(a,b) = x_a x_b`, `a ≤ b` (row-major pairs `(0,0), (0,1), …, (1,1), …`). Probe `p` is evaluated at its chunk boundary
//! `c_p = ⌊hi_p / chunk⌋·chunk`:
//!
//! - across chunks (the states of sources `[0, c_p)`), for a block of probes `Z` `[n, D]`, `W` `[n, m]`:
//!   `value += a0 P0 + (a1 Z) P1 + Ψ(Z) P2` with `Ψ(z)_(a,b) = a2 c_ab z_a z_b` (`c_ab = 2` off the
//!   diagonal, 1 on it, so `Ψ(z)·φ(x) = a2 (z·x)²`), and
//!   `grad += (a1 W) P1ᵀ + 2 a2 Wz`, where the symmetric `W_ab = P2_(a,b)·w` comes out of the GEMM
//!   `T = W P2ᵀ` `[n, D(D+1)/2]` and `(Wz)_a = Σ_b T_(min(a,b), max(a,b)) z_b`;
//! - within the chunk (sources `[c_p, hi_p)`), in tiles of [`KT`] sources: `S = Z Xᵀ`, the masked
//!   weights `F = f(S)` (0 where `s ≥ hi_p`) and `value += F Y`; `G = W Yᵀ`,
//!   `dS = f'(S) ∘ G` (masked) and `grad += dS X`.
//!
//! [`sweep_on`] starts from states that already hold earlier sources (which every probe sees) and
//! folds the rest of its sources before it returns: the recurrent decode (`super::decode`).
//!
//! Every product is a GEMM on the `gemm` crate ([`matmul`]); `chunk` (from [`super::plan`]) trades
//! the quadratic work inside a chunk against the state reads. Memory: one set of states
//! (`O(D²·m)`), per probe block `O(PB·D²)` features and one `PB × KT` tile, and the outputs; nothing of
//! size `ns × np` or `ns × D²`.
//!
//! ## Order of operations
//! The chunk boundaries and the folds depend only on `chunk` and `hi`; probe blocks (of [`PB`]) and
//! blocks of state rows (of 256, over tiles of 64 sources) run in parallel, but each output row is
//! computed by one task in a fixed order and each state row is folded by one task in source order.
//! The result is the same bit for bit for any number of threads.

use super::super::tile::{matmul, matmul_blocked, Mat};
use super::Poly;
use rayon::prelude::*;
use std::ops::Range;

/// Sources per tile of the dense part.
pub(super) const KT: usize = 64;
/// Sources per tile of a fold (one GEMM into a block of state rows). 256 measured 10–15% slower on
/// the order-2 forward (D = 64, N = 4096, B·H = 8; the project's 2-core machine while shared,
/// 2026-12-04).
const FOLD_KT: usize = 64;
/// Probes evaluated together against one read of the states (one rayon task).
pub(super) const PB: usize = 64;
/// State rows of `P2` folded by one rayon task.
const FOLD_ROWS: usize = 256;
/// Rows of `P2` a read sums from zero before adding them to the probe's value (`matmul_blocked`).
/// The read's terms `Ψ(z)_(a,b) P2_(a,b)` cancel (values of either sign, scores whose features
/// outweigh their sum); one sum over all 2080 rows at D = 64 rounds o to ~1.3× the naive f32
/// baseline's bound on 21-token decodes, blocks of 256 to ≤ 0.71× (64: 0.80×;
/// `tests/fast_decode.rs`).
const READ_K: usize = 256;

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
    pub x: &'a [f32],
    pub y: &'a [f32],
}

/// Probes: `z` `[np, D]`, `w` `[np, m]` (present exactly when `grad` is wanted) and the prefix lengths.
#[derive(Clone, Copy, Debug)]
pub(super) struct Probes<'a> {
    pub z: &'a [f32],
    pub w: Option<&'a [f32]>,
    /// `hi[p]`: probe `p` sees sources `0..hi[p]`; nondecreasing, at most `ns`.
    pub hi: &'a [usize],
}

/// Results per probe: `value` `[np, m]` (empty unless wanted) and `grad` `[np, D]` (empty unless `w`).
#[derive(Clone, Debug, Default)]
pub(super) struct Swept {
    pub value: Vec<f32>,
    pub grad: Vec<f32>,
}

/// `D(D+1)/2`: the symmetric pairs `a ≤ b`.
pub(super) fn pairs(d: usize) -> usize {
    d * (d + 1) / 2
}

/// The states of the sources folded so far (`p2` empty when `a2 = 0`).
#[derive(Clone, Debug)]
pub(super) struct State {
    pub p0: Vec<f32>,
    pub p1: Vec<f32>,
    pub p2: Vec<f32>,
    /// The pair `(a, b)` of each row of `p2`.
    pairs: Vec<(usize, usize)>,
    /// Whether any source has been folded (an empty state is not read).
    pub any: bool,
}

impl State {
    /// No source folded: zero states of `D` and `m` (with `P2` when `square`).
    pub(super) fn new(d: usize, m: usize, square: bool) -> Self {
        let pairs: Vec<(usize, usize)> = if square {
            (0..d).flat_map(|a| (a..d).map(move |b| (a, b))).collect()
        } else {
            Vec::new()
        };
        State {
            p0: vec![0.0; m],
            p1: vec![0.0; d * m],
            p2: vec![0.0; pairs.len() * m],
            pairs,
            any: false,
        }
    }

    /// Fold the sources `x` `[n, D]`, `y` `[n, m]`, [`FOLD_KT`] at a time.
    fn fold(&mut self, d: usize, m: usize, x: &[f32], y: &[f32]) {
        let n = y.len() / m;
        if n == 0 {
            return;
        }
        self.any = true;
        // P0 += Σ_s y_s;  P1 += Xᵀ Y   [D, m]
        for ys in y.chunks_exact(m) {
            self.p0.iter_mut().zip(ys).for_each(|(p, v)| *p += v);
        }
        for s0 in (0..n).step_by(FOLD_KT) {
            let kt = FOLD_KT.min(n - s0);
            let (xt, yt) = (&x[s0 * d..(s0 + kt) * d], &y[s0 * m..(s0 + kt) * m]);
            matmul(d, m, kt, &mut self.p1, m, true, Mat::t(xt, d), Mat::rows(yt, m));
        }
        // P2 += φ(X)ᵀ Y   [D(D+1)/2, m]: one task per block of rows, each over every source tile
        // in order, with φ(X)ᵀ of its own rows ([rows, kt]: row (a, b) holds x_sa x_sb).
        let pairs = &self.pairs;
        self.p2
            .par_chunks_mut(FOLD_ROWS * m)
            .enumerate()
            .for_each(|(blk, p2)| {
                let rows = &pairs[blk * FOLD_ROWS..blk * FOLD_ROWS + p2.len() / m];
                let mut phi = vec![0f32; rows.len() * FOLD_KT.min(n)];
                for s0 in (0..n).step_by(FOLD_KT) {
                    let kt = FOLD_KT.min(n - s0);
                    let (xt, yt) = (&x[s0 * d..(s0 + kt) * d], &y[s0 * m..(s0 + kt) * m]);
                    let phi = &mut phi[..rows.len() * kt];
                    for (out, &(a, b)) in phi.chunks_exact_mut(kt).zip(rows) {
                        for (o, xs) in out.iter_mut().zip(xt.chunks_exact(d)) {
                            *o = xs[a] * xs[b];
                        }
                    }
                    matmul(
                        rows.len(),
                        m,
                        kt,
                        p2,
                        m,
                        true,
                        Mat::rows(phi, kt),
                        Mat::rows(yt, m),
                    );
                }
            });
    }
}

/// Run the sweep. `src` and `probes` agree with `cfg` (`D`, `m`) and `hi[p] ≤ ns`.
pub(super) fn sweep(cfg: &Sweep, src: Sources<'_>, probes: Probes<'_>) -> Swept {
    let mut state = State::new(cfg.d, cfg.m, cfg.poly.a2 != 0.0);
    run(cfg, &mut state, src, probes).0
}

/// The sweep continued from `state`, which holds sources before `src` (every probe sees them, in
/// addition to its own `src[..hi_p]`); afterwards `state` holds every source of `src` as well. The
/// recurrent decode's prefill and steps: the sources are the new keys, the probes their queries.
pub(super) fn sweep_on(cfg: &Sweep, state: &mut State, src: Sources<'_>, probes: Probes<'_>) -> Swept {
    let (out, start) = run(cfg, state, src, probes);
    let (d, m) = (cfg.d, cfg.m);
    state.fold(d, m, &src.x[start * d..], &src.y[start * m..]);
    out
}

/// The sweep from `state`; returns the results and how many of the sources it folded into `state`
/// (those before the last boundary a probe was evaluated at).
fn run(cfg: &Sweep, state: &mut State, src: Sources<'_>, probes: Probes<'_>) -> (Swept, usize) {
    let (d, m) = (cfg.d, cfg.m);
    let ns = src.y.len() / m;
    let np = probes.hi.len();
    // Internal invariant: the callers build `hi` from a validated spec (nondecreasing key ends, none
    // past the sources); a user cannot reach this with other values.
    debug_assert!(probes.hi.windows(2).all(|w| w[0] <= w[1]) && probes.hi.iter().all(|&h| h <= ns));
    let chunk = cfg.chunk.max(1);
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
    let (mut p0, mut start) = (0, 0usize);
    while p0 < np {
        // The next probe's boundary (≤ hi[p0] ≤ ns): fold every source before it in one call.
        let c = probes.hi[p0] / chunk * chunk;
        if c > start {
            state.fold(d, m, &src.x[start * d..c * d], &src.y[start * m..c * m]);
            start = c;
        }
        // Probes whose boundary is `start`: states of [0, start) + dense [start, hi).
        let p1 = p0 + probes.hi[p0..].partition_point(|&h| h < start.saturating_add(chunk));
        let blocks: Vec<Range<usize>> = (p0..p1).step_by(PB).map(|b| b..(b + PB).min(p1)).collect();
        let results: Vec<Swept> = blocks
            .par_iter()
            .map(|r| eval_block(cfg, state, src, start, probes, r.clone()))
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
    }
    (out, start)
}

/// `Ψ(z)_(a,b) = a2 c_ab z_a z_b` into `out` `[D(D+1)/2]` (pairs `a ≤ b` row-major, `c_ab = 2` off
/// the diagonal, 1 on it), so that `Ψ(z)·φ(x) = a2 (z·x)²`.
pub(super) fn psi_row(a2: f32, z: &[f32], out: &mut [f32]) {
    let d = z.len();
    let mut row = 0;
    for a in 0..d {
        let za = a2 * z[a];
        out[row] = za * z[a];
        for (o, zv) in out[row + 1..row + d - a].iter_mut().zip(&z[a + 1..]) {
            *o = 2.0 * za * zv;
        }
        row += d - a;
    }
}

/// `φ(x)_(a,b) = x_a x_b` into `out` `[D(D+1)/2]` (pairs `a ≤ b` row-major).
pub(super) fn phi_row(x: &[f32], out: &mut [f32]) {
    let d = x.len();
    let mut row = 0;
    for a in 0..d {
        for (o, xb) in out[row..row + d - a].iter_mut().zip(&x[a..]) {
            *o = x[a] * xb;
        }
        row += d - a;
    }
}

/// Evaluate the probes `range` against the states (sources `[0, start)`) plus the sources
/// `[start, hi_p)`.
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
    let mut value = if cfg.want_value {
        vec![0f32; n * m]
    } else {
        Vec::new()
    };
    let mut grad = if probes.w.is_some() {
        vec![0f32; n * d]
    } else {
        Vec::new()
    };
    let zb = &probes.z[range.start * d..range.end * d];
    let wb = probes.w.map(|w| &w[range.start * m..range.end * m]);

    if state.any {
        // value = a0 P0 + (a1 Z) P1;  grad = (a1 W) P1ᵀ
        if cfg.want_value {
            for val in value.chunks_exact_mut(m) {
                val.iter_mut().zip(&state.p0).for_each(|(v, p)| *v = a0 * p);
            }
            let za: Vec<f32> = zb.iter().map(|z| a1 * z).collect();
            matmul(
                n,
                m,
                d,
                &mut value,
                m,
                true,
                Mat::rows(&za, d),
                Mat::rows(&state.p1, m),
            );
        }
        if let Some(wb) = wb {
            let wa: Vec<f32> = wb.iter().map(|w| a1 * w).collect();
            matmul(
                n,
                d,
                m,
                &mut grad,
                d,
                true,
                Mat::rows(&wa, m),
                Mat::t(&state.p1, m),
            );
        }
        if !state.p2.is_empty() {
            let f = pairs(d);
            if cfg.want_value {
                // Ψ(Z) [n, D(D+1)/2];  value += Ψ(Z) P2, summed over blocks of READ_K rows
                let mut psi = vec![0f32; n * f];
                for (ps, zp) in psi.chunks_exact_mut(f).zip(zb.chunks_exact(d)) {
                    psi_row(a2, zp, ps);
                }
                matmul_blocked(
                    n,
                    m,
                    f,
                    READ_K,
                    &mut value,
                    m,
                    true,
                    Mat::rows(&psi, f),
                    Mat::rows(&state.p2, m),
                );
            }
            if let Some(wb) = wb {
                // T = (2 a2 W) P2ᵀ [n, D(D+1)/2];  grad_a += Σ_b T_(a,b) z_b (both triangles)
                let w2: Vec<f32> = wb.iter().map(|w| 2.0 * a2 * w).collect();
                let mut t = vec![0f32; n * f];
                matmul(n, f, m, &mut t, f, false, Mat::rows(&w2, m), Mat::t(&state.p2, m));
                for ((tp, zp), g) in t
                    .chunks_exact(f)
                    .zip(zb.chunks_exact(d))
                    .zip(grad.chunks_exact_mut(d))
                {
                    let mut row = 0;
                    for a in 0..d {
                        let ta = &tp[row..row + d - a];
                        let za = zp[a];
                        let mut acc = ta[0] * za;
                        for ((tv, zv), gb) in ta[1..].iter().zip(&zp[a + 1..]).zip(&mut g[a + 1..]) {
                            acc += tv * zv;
                            *gb += tv * za;
                        }
                        g[a] += acc;
                        row += d - a;
                    }
                }
            }
        }
    }

    // Dense part: sources [start, hi_p) in tiles of KT; f(S) and f'(S) masked per row.
    let last = probes.hi[range.end - 1];
    if last > start {
        let mut s = vec![0f32; n * KT];
        let mut wt = vec![0f32; n * KT];
        let mut gy = vec![0f32; if wb.is_some() { n * KT } else { 0 }];
        for j0 in (start..last).step_by(KT) {
            let kt = KT.min(last - j0);
            let xt = &src.x[j0 * d..(j0 + kt) * d];
            let yt = &src.y[j0 * m..(j0 + kt) * m];
            // S = Z Xᵀ   [n, kt]
            let s = &mut s[..n * kt];
            matmul(n, kt, d, s, kt, false, Mat::rows(zb, d), Mat::t(xt, d));
            // Columns of row p inside its range: j < hi_p.
            let lim = |r: usize| probes.hi[range.start + r].saturating_sub(j0).min(kt);
            if cfg.want_value {
                // F = f(S) masked;  value += F Y
                let wt = &mut wt[..n * kt];
                for (r, (wr, sr)) in wt.chunks_exact_mut(kt).zip(s.chunks_exact(kt)).enumerate() {
                    let l = lim(r);
                    for (w, &t) in wr[..l].iter_mut().zip(&sr[..l]) {
                        *w = a0 + t * (a1 + a2 * t);
                    }
                    wr[l..].fill(0.0);
                }
                masked_product(n, m, kt, &mut value, wt, yt, &lim);
            }
            if let Some(wb) = wb {
                // G = W Yᵀ;  dS = f'(S) ∘ G masked;  grad += dS X
                let gy = &mut gy[..n * kt];
                matmul(n, kt, m, gy, kt, false, Mat::rows(wb, m), Mat::t(yt, m));
                let wt = &mut wt[..n * kt];
                for (r, ((wr, sr), gr)) in wt
                    .chunks_exact_mut(kt)
                    .zip(s.chunks_exact(kt))
                    .zip(gy.chunks_exact(kt))
                    .enumerate()
                {
                    let l = lim(r);
                    for ((w, &t), &g) in wr[..l].iter_mut().zip(&sr[..l]).zip(&gr[..l]) {
                        *w = (a1 + 2.0 * a2 * t) * g;
                    }
                    wr[l..].fill(0.0);
                }
                masked_product(n, d, kt, &mut grad, wt, xt, &lim);
            }
        }
    }
    Swept { value, grad }
}

/// `out [n, w] += A B` for the masked weights `A` `[n, kt]` (row `r` zero past column `lim(r)`) and the
/// tile `B` `[kt, w]`: one GEMM when `B` is finite, else row by row over each row's own columns only,
/// so that a NaN or ±∞ in a source a row does not see never reaches it (`0·NaN` is NaN).
fn masked_product(
    n: usize,
    w: usize,
    kt: usize,
    out: &mut [f32],
    a: &[f32],
    b: &[f32],
    lim: &dyn Fn(usize) -> usize,
) {
    if b.iter().all(|x| x.is_finite()) {
        matmul(n, w, kt, out, w, true, Mat::rows(a, kt), Mat::rows(b, w));
        return;
    }
    for (r, (o, ar)) in out.chunks_exact_mut(w).zip(a.chunks_exact(kt)).enumerate() {
        let l = lim(r);
        matmul(
            1,
            w,
            l,
            o,
            w,
            true,
            Mat::rows(&ar[..l], l),
            Mat::rows(&b[..l * w], w),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An order-2 and an order-1 polynomial.
    const POLYS: [Poly; 2] = [
        Poly {
            a0: 1.0,
            a1: 0.7,
            a2: 0.4,
        },
        Poly {
            a0: 1.0,
            a1: -0.3,
            a2: 0.0,
        },
    ];

    /// Uniform draws in (−1, 1) from a fixed linear congruential sequence.
    fn draws(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// `value` and `grad` by the definition, pair by pair, in f64.
    fn naive(poly: Poly, d: usize, m: usize, src: Sources<'_>, probes: Probes<'_>) -> (Vec<f64>, Vec<f64>) {
        let np = probes.hi.len();
        let (mut value, mut grad) = (vec![0f64; np * m], vec![0f64; np * d]);
        for p in 0..np {
            let z = &probes.z[p * d..(p + 1) * d];
            let w = probes.w.map(|w| &w[p * m..(p + 1) * m]);
            for s in 0..probes.hi[p] {
                let x = &src.x[s * d..(s + 1) * d];
                let y = &src.y[s * m..(s + 1) * m];
                let t: f64 = z.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum();
                let f = poly.a0 as f64 + t * (poly.a1 as f64 + poly.a2 as f64 * t);
                let df = poly.a1 as f64 + 2.0 * poly.a2 as f64 * t;
                for (v, yv) in value[p * m..(p + 1) * m].iter_mut().zip(y) {
                    *v += f * *yv as f64;
                }
                if let Some(w) = w {
                    let wy: f64 = w.iter().zip(y).map(|(a, b)| *a as f64 * *b as f64).sum();
                    for (g, xv) in grad[p * d..(p + 1) * d].iter_mut().zip(x) {
                        *g += df * wy * *xv as f64;
                    }
                }
            }
        }
        (value, grad)
    }

    fn close(what: &str, got: &[f32], want: &[f64]) {
        let scale = want.iter().fold(1.0f64, |a, b| a.max(b.abs()));
        let err = got
            .iter()
            .zip(want)
            .map(|(g, w)| (*g as f64 - w).abs())
            .fold(0.0, f64::max);
        assert!(err <= 1e-5 * scale, "{what}: error {err:.3e} (scale {scale:.3e})");
    }

    /// Every chunk length, from 1 (states for all but the probe's own source) to past the sources
    /// (the quadratic form only), gives the pairwise sums, for both orders, with ranges that are
    /// empty, partial and full, and more probes than a block.
    #[test]
    fn every_chunk_length_gives_the_pairwise_sums() {
        let (d, m, ns, np) = (5, 4, 150, 170);
        let x = draws(ns * d, 1);
        let y = draws(ns * m, 2);
        let z = draws(np * d, 3);
        let w = draws(np * m, 4);
        let hi: Vec<usize> = (0..np).map(|p| (p * ns / np).saturating_sub(7)).collect();
        let src = Sources { x: &x, y: &y };
        let probes = Probes {
            z: &z,
            w: Some(&w),
            hi: &hi,
        };
        for poly in POLYS {
            let (value, grad) = naive(poly, d, m, src, probes);
            for chunk in [1, 2, 3, 7, 64, 65, 149, 150, 151, 1000] {
                let cfg = Sweep {
                    poly,
                    d,
                    m,
                    chunk,
                    want_value: true,
                };
                let got = sweep(&cfg, src, probes);
                close(&format!("value, chunk {chunk}, {poly:?}"), &got.value, &value);
                close(&format!("grad, chunk {chunk}, {poly:?}"), &got.grad, &grad);
            }
        }
    }

    /// A sweep continued from the states of earlier sources gives the pairwise sums over those
    /// sources and its own: sources split at 0, 1, 70 and 150 (all in the state), each chunk
    /// length, both orders; the state it leaves equals the one of every source folded at once.
    #[test]
    fn a_sweep_on_folded_states_sees_the_earlier_sources() {
        let (d, m, ns, np) = (5, 4, 150, 90);
        let x = draws(ns * d, 11);
        let y = draws(ns * m, 12);
        let z = draws(np * d, 13);
        for poly in POLYS {
            let square = poly.a2 != 0.0;
            let mut whole = State::new(d, m, square);
            whole.fold(d, m, &x, &y);
            for split in [0, 1, 70, 150] {
                // Probe p sees the first `split` sources and the next hi_p of the rest.
                let rest = ns - split;
                let hi: Vec<usize> = (0..np).map(|p| (p * rest / np).saturating_sub(3)).collect();
                let all_hi: Vec<usize> = hi.iter().map(|h| h + split).collect();
                let (value, _) = naive(
                    poly,
                    d,
                    m,
                    Sources { x: &x, y: &y },
                    Probes {
                        z: &z,
                        w: None,
                        hi: &all_hi,
                    },
                );
                for chunk in [1, 7, 64, rest + 1] {
                    let cfg = Sweep {
                        poly,
                        d,
                        m,
                        chunk,
                        want_value: true,
                    };
                    let mut state = State::new(d, m, square);
                    let none = Probes {
                        z: &[],
                        w: None,
                        hi: &[],
                    };
                    let first = Sources {
                        x: &x[..split * d],
                        y: &y[..split * m],
                    };
                    sweep_on(&cfg, &mut state, first, none);
                    assert_eq!(state.any, split > 0);
                    let got = sweep_on(
                        &cfg,
                        &mut state,
                        Sources {
                            x: &x[split * d..],
                            y: &y[split * m..],
                        },
                        Probes {
                            z: &z,
                            w: None,
                            hi: &hi,
                        },
                    );
                    let what = format!("split {split}, chunk {chunk}, {poly:?}");
                    close(&format!("value, {what}"), &got.value, &value);
                    for (name, a, b) in [
                        ("P0", &state.p0, &whole.p0),
                        ("P1", &state.p1, &whole.p1),
                        ("P2", &state.p2, &whole.p2),
                    ] {
                        let want: Vec<f64> = b.iter().map(|&v| v as f64).collect();
                        close(&format!("{name}, {what}"), a, &want);
                    }
                }
            }
        }
    }
}
