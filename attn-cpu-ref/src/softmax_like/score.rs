//! The score `s(q, k)` of each softmax-like family and its gradient, on prepared rows.
//!
//! A family scores a pair in two steps: an *embedding* applied once per row ([`Score::prepare`]),
//! which yields the prepared vector `x̃` and a few row scalars ([`RowScalars`]), and a *pair kernel*
//! applied per `(i, j)`:
//!
//! | family                   | `x̃`                          | `s(q, k)`                                   |
//! |--------------------------|------------------------------|---------------------------------------------|
//! | softmax                  | `x`                          | `scale·q·k`, or `cap·tanh(scale·q·k/cap)`   |
//! | cosine-sim (`qk_l2norm`) | `x̂ = x/max(‖x‖, ε)`          | `scale·q̂·k̂`                                 |
//! | cosine-sim (no l2norm)   | `x`                          | `scale·q·k`                                 |
//! | hyperbolic               | `x/‖x‖` (0 for x = 0)        | `−β d²_L` or `−β arccosh(1 + c d²_L/2)/√c`  |
//!
//! ## Gradients
//! The backward weighs each pair with `w_ij = dS_ij·σ_ij`, where σ is the kernel's derivative
//! ([`Score::scores_grad`]), adds `w_ij·G(q_i, k_j)` to an accumulator ([`Score::accumulate`]) and
//! maps the sum to `dq_i` ([`Score::finish`]); the key side is the same with the roles swapped.
//! - dot kernels: `σ = scale` (`scale·(1 − t²)` with a softcap, `t = tanh(scale·q̃·k̃/cap)`),
//!   `G = k̃`; `dq = Σ w k̃`, or through the l2-norm `dq = (dq̂ − q̂ (q̂·dq̂))/‖q‖` when `‖q‖ > ε`,
//!   else `dq̂/ε`.
//! - hyperbolic: `σ = 2 ∂s/∂d²_L` and `G = ½ ∂d²_L/∂q = k0 q/q0 − k` (the time coordinate moves with
//!   q: `∂q0/∂q = q/q0`). `σ = −2β` for the squared Lorentz distance; for the geodesic,
//!   `σ = −β√c/√(z² − 1)` with `z = 1 + c d²_L/2`, and `σ = 0` where `z` is clamped at
//!   `1 + ACOSH_EPS`.
//!
//! ## The Lorentz product without cancellation
//! `d²_L = −2/c − 2⟨q,k⟩_L = 2 (q0 k0 − q·k) − 2/c` subtracts numbers of size `‖q‖‖k‖` whose
//! difference is tiny when q and k are close far from the origin, which is where the geodesic's
//! `arccosh` is most sensitive (and the naive form loses every digit: at `‖q‖ ≈ 1e5` its absolute
//! error in `z` is `~1e-6`). We split every quantity into a radial and an angular part, each a sum
//! of non-negative terms. With `n = ‖x‖`, `x̂ = x/n` and the gap `g = x0 − n = (1/c)/(x0 + n)`
//! (no cancellation), `q0² = 1/c + ‖q‖²` gives
//! - `d²_L = ‖q − k‖² − (q0 − k0)² = (nq − nk)² (1 − ρ²) + nq nk ‖q̂ − k̂‖²`, where
//!   `ρ = (nq + nk)/(q0 + k0)` and `1 − ρ² = (gq + gk)(q0 + k0 + nq + nk)/(q0 + k0)²`;
//! - `G = k0 q/q0 − k = (k0 nq/q0)(q̂ − k̂) + T k̂`, where `T = k0 nq/q0 − nk`
//!   `= (nq − nk)·[(nq + nk)(1 + nq/(q0 + k0)) + k0] / (c (k0 + nk)(q0 + nq) q0)`.
//!
//! The only differences left are `nq − nk` and `q̂ − k̂`, whose rounding errors are those the inputs
//! themselves carry; every other factor is a product of positive terms. The geodesic takes
//! `arccosh(1 + x) = ln_1p(x + √(x (x + 2)))` on `x = c d²_L/2`, never forming `z − 1`.

use super::rows::Rows;
use attn_core::{FamilySpec, HypScore, ACOSH_EPS};
use std::ops::Range;

/// The pair score of a softmax-like family (see the module doc).
#[derive(Clone, Copy, Debug)]
pub(super) enum Score {
    /// `scale·q·k`, optionally soft-capped: softmax, and cosine-sim without l2-normalisation.
    Dot { scale: f64, softcap: Option<f64> },
    /// `scale·q̂·k̂` on l2-normalised rows.
    Cosine { scale: f64, eps: f64 },
    /// `−β d²_L` or `−β arccosh(1 + c d²_L/2)/√c` on hyperboloid points.
    Lorentz { kind: HypScore, c: f64, beta: f64 },
}

/// Scalars of one prepared row; a family leaves the fields it does not use at 0.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RowScalars {
    /// `‖x‖` (cosine-sim with l2norm, hyperbolic).
    pub norm: f64,
    /// The time coordinate `x0 = √(1/c + ‖x‖²)` (hyperbolic).
    pub x0: f64,
    /// `x0 − ‖x‖ = (1/c)/(x0 + ‖x‖)` (hyperbolic).
    pub gap: f64,
}

impl Score {
    /// The score of a softmax-like family. Taylor has no row-wise softmax and never gets here.
    pub(super) fn new(family: &FamilySpec) -> Score {
        match *family {
            FamilySpec::Softmax { scale, softcap } => Score::Dot {
                scale: scale as f64,
                softcap: softcap.map(f64::from),
            },
            FamilySpec::CosineSim {
                scale,
                qk_l2norm: true,
                eps,
            } => Score::Cosine {
                scale: scale as f64,
                eps: eps as f64,
            },
            FamilySpec::CosineSim {
                scale,
                qk_l2norm: false,
                ..
            } => Score::Dot {
                scale: scale as f64,
                softcap: None,
            },
            FamilySpec::Hyperbolic {
                score,
                curvature,
                beta,
                ..
            } => Score::Lorentz {
                kind: score,
                c: curvature as f64,
                beta: beta as f64,
            },
            FamilySpec::Taylor { .. } => {
                // Internal invariant: no user input reaches here with a Taylor family.
                unreachable!("lib.rs routes only softmax-like families (is_softmax_like) here")
            }
        }
    }

    /// Write the prepared row `x̃` of `x` to `out` and return its scalars.
    pub(super) fn prepare(&self, x: &[f64], out: &mut [f64]) -> RowScalars {
        // A NaN or ±∞ entry has no score: ∞·0, ∞ − ∞ and the softcap's tanh would turn it into NaN,
        // ±∞, 0 or a finite value depending on the other row. The whole row becomes NaN, so every
        // score it enters is NaN and so is every output that score reaches (docs/nan.md).
        if x.iter().any(|v| !v.is_finite()) {
            out.fill(f64::NAN);
            return RowScalars {
                norm: f64::NAN,
                x0: f64::NAN,
                gap: f64::NAN,
            };
        }
        match *self {
            Score::Dot { .. } => {
                out.copy_from_slice(x);
                RowScalars::default()
            }
            Score::Cosine { eps, .. } => {
                let norm = dot(x, x).sqrt();
                let inv = 1.0 / norm.max(eps);
                out.iter_mut().zip(x).for_each(|(o, x)| *o = x * inv);
                RowScalars {
                    norm,
                    ..RowScalars::default()
                }
            }
            Score::Lorentz { c, .. } => {
                let norm = dot(x, x).sqrt();
                let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
                out.iter_mut().zip(x).for_each(|(o, x)| *o = x * inv);
                let x0 = (1.0 / c + norm * norm).sqrt();
                RowScalars {
                    norm,
                    x0,
                    gap: (1.0 / c) / (x0 + norm),
                }
            }
        }
    }

    /// `s[jj] = s(q, k_j)` for the keys `j = range.start + jj`.
    pub(super) fn scores(
        &self,
        q: &[f64],
        qs: &RowScalars,
        keys: &Rows<RowScalars>,
        range: Range<usize>,
        s: &mut [f64],
    ) {
        match *self {
            Score::Dot { scale, softcap: None } | Score::Cosine { scale, .. } => {
                for (s, j) in s.iter_mut().zip(range) {
                    *s = scale * dot(q, keys.row(j));
                }
            }
            Score::Dot {
                scale,
                softcap: Some(cap),
            } => {
                for (s, j) in s.iter_mut().zip(range) {
                    *s = cap * (scale * dot(q, keys.row(j)) / cap).tanh();
                }
            }
            Score::Lorentz { kind, c, beta } => {
                for (s, j) in s.iter_mut().zip(range) {
                    *s = lorentz(kind, c, beta, q, qs, keys.row(j), keys.aux(j)).0;
                }
            }
        }
    }

    /// Like [`Score::scores`], and `sigma[jj]` = the kernel derivative σ of the module doc.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scores_grad(
        &self,
        q: &[f64],
        qs: &RowScalars,
        keys: &Rows<RowScalars>,
        range: Range<usize>,
        s: &mut [f64],
        sigma: &mut [f64],
    ) {
        match *self {
            Score::Dot { scale, softcap: None } | Score::Cosine { scale, .. } => {
                for ((s, sg), j) in s.iter_mut().zip(sigma.iter_mut()).zip(range) {
                    *s = scale * dot(q, keys.row(j));
                    *sg = scale;
                }
            }
            Score::Dot {
                scale,
                softcap: Some(cap),
            } => {
                for ((s, sg), j) in s.iter_mut().zip(sigma.iter_mut()).zip(range) {
                    let t = (scale * dot(q, keys.row(j)) / cap).tanh();
                    *s = cap * t;
                    *sg = scale * (1.0 - t * t);
                }
            }
            Score::Lorentz { kind, c, beta } => {
                for ((s, sg), j) in s.iter_mut().zip(sigma.iter_mut()).zip(range) {
                    (*s, *sg) = lorentz(kind, c, beta, q, qs, keys.row(j), keys.aux(j));
                }
            }
        }
    }

    /// `acc += w·G(x, y)`: the pair term of the gradient with respect to row `x` (prepared `x`, `xs`)
    /// against the other side's row `y` (prepared `y`, `ys`).
    #[inline]
    pub(super) fn accumulate(
        &self,
        acc: &mut [f64],
        w: f64,
        x: &[f64],
        xs: &RowScalars,
        y: &[f64],
        ys: &RowScalars,
    ) {
        match *self {
            Score::Dot { .. } | Score::Cosine { .. } => axpy(acc, w, y),
            Score::Lorentz { c, .. } => {
                // G = (y0 nx/x0)(x̂ − ŷ) + T ŷ
                let (nx, ny, x0, y0) = (xs.norm, ys.norm, xs.x0, ys.x0);
                let radial = (nx + ny) * (1.0 + nx / (x0 + y0)) + y0;
                let t = w * (nx - ny) * radial / (c * (y0 + ny) * (x0 + nx) * x0);
                let a = w * y0 * nx / x0;
                acc.iter_mut()
                    .zip(x.iter().zip(y))
                    .for_each(|(acc, (xh, yh))| *acc += a * (xh - yh) + t * yh);
            }
        }
    }

    /// Turn the accumulated `Σ w G` (in `acc`, overwritten) into the gradient with respect to the raw
    /// row whose preparation is `(xt, xs)`.
    pub(super) fn finish(&self, acc: &mut [f64], xt: &[f64], xs: &RowScalars) {
        match *self {
            Score::Dot { .. } | Score::Lorentz { .. } => {}
            Score::Cosine { eps, .. } => {
                if xs.norm > eps {
                    // dq = (dq̂ − q̂ (q̂·dq̂)) / ‖q‖
                    let radial = dot(xt, acc);
                    acc.iter_mut()
                        .zip(xt)
                        .for_each(|(a, x)| *a = (*a - x * radial) / xs.norm);
                } else {
                    // ‖q‖ ≤ ε: q̂ = q/ε is linear in q.
                    acc.iter_mut().for_each(|a| *a /= eps);
                }
            }
        }
    }
}

/// `(s, σ)` of the hyperbolic kernel for one pair of prepared rows.
#[inline]
#[allow(clippy::too_many_arguments)]
fn lorentz(
    kind: HypScore,
    c: f64,
    beta: f64,
    q: &[f64],
    qs: &RowScalars,
    k: &[f64],
    ks: &RowScalars,
) -> (f64, f64) {
    let d2 = lorentz_sq_dist(q, qs, k, ks);
    match kind {
        HypScore::SquaredLorentz => (-beta * d2, -2.0 * beta),
        HypScore::Geodesic => {
            // z = 1 + x with x = c d²_L/2, clamped at x ≥ ACOSH_EPS (zero gradient there).
            let x = 0.5 * c * d2;
            let (x, clamped) = if x < ACOSH_EPS {
                (ACOSH_EPS, true)
            } else {
                (x, false)
            };
            let root = (x * (x + 2.0)).sqrt(); // √(z² − 1)
            let sqrt_c = c.sqrt();
            let s = -beta * (x + root).ln_1p() / sqrt_c;
            let sigma = if clamped { 0.0 } else { -beta * sqrt_c / root };
            (s, sigma)
        }
    }
}

/// `d²_L = (nq − nk)² (1 − ρ²) + nq nk ‖q̂ − k̂‖²` (module doc); never negative.
#[inline]
fn lorentz_sq_dist(q: &[f64], qs: &RowScalars, k: &[f64], ks: &RowScalars) -> f64 {
    let mut acc = [0.0f64; 4];
    let (cq, ck) = (q.chunks_exact(4), k.chunks_exact(4));
    let tail: f64 = cq
        .remainder()
        .iter()
        .zip(ck.remainder())
        .map(|(a, b)| (a - b) * (a - b))
        .sum();
    for (a, b) in cq.zip(ck) {
        for l in 0..4 {
            acc[l] += (a[l] - b[l]) * (a[l] - b[l]);
        }
    }
    let angular = (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail;
    let dn = qs.norm - ks.norm;
    let t0 = qs.x0 + ks.x0;
    let one_minus_rho2 = (qs.gap + ks.gap) * (t0 + qs.norm + ks.norm) / (t0 * t0);
    dn * dn * one_minus_rho2 + qs.norm * ks.norm * angular
}

/// `a·b`, with four independent partial sums so the loop vectorises.
#[inline]
pub(super) fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        acc[0] += x[0] * y[0];
        acc[1] += x[1] * y[1];
        acc[2] += x[2] * y[2];
        acc[3] += x[3] * y[3];
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// `y += alpha·x`.
#[inline]
pub(super) fn axpy(y: &mut [f64], alpha: f64, x: &[f64]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += alpha * x);
}
