//! The score `s(q, k)` of each softmax-like family and its gradient, on prepared rows.
//!
//! A family scores a pair in two steps: an *embedding* applied once per row, which yields the
//! prepared vector `x̃` and one row scalar `a`, and a *pair kernel* applied per `(i, j)`:
//!
//! | family                     | `x̃`, `a`                        | `s(q̃, k̃)`                                   |
//! |----------------------------|---------------------------------|---------------------------------------------|
//! | softmax                    | `x`, 0                          | `scale·q̃·k̃`, or `cap·tanh(scale·q̃·k̃/cap)`   |
//! | cosine-sim (`l2norm_qk`)   | `x̂ = x/max(‖x‖, ε)`, `‖x‖`       | `scale·q̂·k̂`                                 |
//! | cosine-sim (no l2norm)     | `x`, 0                          | `scale·q·k`                                 |
//! | hyperbolic                 | `x`, `x0 = √(1/c + ‖x‖²)`        | `−β d²_L` or `−β arccosh(1 + c d²_L/2)/√c`  |
//!
//! ## Gradients
//! The backward weighs each pair with `w_ij = dS_ij·σ_ij`, where `σ` is the kernel's derivative
//! ([`Score::scores_grad`]), accumulates `A_i = Σ_j w_ij k̃_j` and `α_i = Σ_j w_ij a_j`, and maps
//! them to `dq_i` with [`Score::finish`] (the same on the key side with the roles swapped):
//! - dot kernels: `σ = scale` (`scale·(1 − t²)` with a softcap, `t = tanh(scale·q̃·k̃/cap)`) and
//!   `dq = A`, or through the l2-norm `dq = (A − q̂ (q̂·A))/‖q‖` when `‖q‖ > ε`, else `A/ε`;
//! - hyperbolic: `∂d²_L/∂q = 2 (k0 q/q0 − k)` (the time coordinate moves with q, `∂q0/∂q = q/q0`),
//!   so with `σ = 2 ∂s/∂d²_L` we get `dq = α q/q0 − A`. `σ = −2β` for the squared Lorentz distance;
//!   for the geodesic, `σ = −β√c/√(z² − 1)` with `z = 1 + c d²_L/2`, and `σ = 0` where `z` is clamped
//!   at `1 + ACOSH_EPS`.
//!
//! ## The Lorentz product without cancellation
//! `d²_L = −2/c − 2⟨q,k⟩_L = 2 (q0 k0 − q·k) − 2/c` subtracts two numbers of size `‖q‖‖k‖` whose
//! difference can be tiny (q close to k far from the origin), where the geodesic's `arccosh` is most
//! sensitive. Expanding `q0² = 1/c + ‖q‖²` gives the identity
//! `d²_L = ‖q − k‖² − (q0 − k0)²`, with `q0 − k0 = (q − k)·(q + k) / (q0 + k0)`.
//! Both terms come from one fused loop over the differences `q − k` and sums `q + k`; their rounding
//! errors scale with `‖q − k‖²` instead of `‖q‖‖k‖`, and the geodesic uses
//! `arccosh(1 + x) = ln_1p(x + √(x (x + 2)))` on `x = c d²_L/2` directly, never forming `z − 1`.

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
                l2norm_qk: true,
                eps,
            } => Score::Cosine {
                scale: scale as f64,
                eps: eps as f64,
            },
            FamilySpec::CosineSim {
                scale,
                l2norm_qk: false,
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
                unreachable!("lib.rs routes only softmax-like families (is_softmax_like) here")
            }
        }
    }

    /// Write the embedded row `x̃` of `x` to `out` and return its row scalar `a`.
    pub(super) fn prepare(&self, x: &[f64], out: &mut [f64]) -> f64 {
        match *self {
            Score::Dot { .. } => {
                out.copy_from_slice(x);
                0.0
            }
            Score::Cosine { eps, .. } => {
                let norm = dot(x, x).sqrt();
                let inv = 1.0 / norm.max(eps);
                out.iter_mut().zip(x).for_each(|(o, x)| *o = x * inv);
                norm
            }
            Score::Lorentz { c, .. } => {
                out.copy_from_slice(x);
                (1.0 / c + dot(x, x)).sqrt()
            }
        }
    }

    /// `s[jj] = s(q̃, k̃_j)` for the keys `j = keys_range.start + jj`.
    pub(super) fn scores(&self, q: &[f64], qa: f64, keys: &Rows, range: Range<usize>, s: &mut [f64]) {
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
                    *s = lorentz(kind, c, beta, q, qa, keys.row(j), keys.aux(j)).0;
                }
            }
        }
    }

    /// Like [`Score::scores`], and `sigma[jj]` = the kernel derivative σ of the module doc.
    pub(super) fn scores_grad(
        &self,
        q: &[f64],
        qa: f64,
        keys: &Rows,
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
                    (*s, *sg) = lorentz(kind, c, beta, q, qa, keys.row(j), keys.aux(j));
                }
            }
        }
    }

    /// Turn the accumulated `A = Σ w x̃_other` (in `acc`, overwritten) and `α = Σ w a_other` into the
    /// gradient with respect to the raw row `x` whose embedding is `(xt, xa)`.
    pub(super) fn finish(&self, acc: &mut [f64], alpha: f64, xt: &[f64], xa: f64) {
        match *self {
            Score::Dot { .. } => {}
            Score::Cosine { eps, .. } => {
                if xa > eps {
                    // dq = (dq̂ − q̂ (q̂·dq̂)) / ‖q‖
                    let radial = dot(xt, acc);
                    acc.iter_mut()
                        .zip(xt)
                        .for_each(|(a, x)| *a = (*a - x * radial) / xa);
                } else {
                    // ‖q‖ ≤ ε: q̂ = q/ε is linear in q.
                    acc.iter_mut().for_each(|a| *a /= eps);
                }
            }
            Score::Lorentz { .. } => {
                // dq = α q/q0 − A
                let t = alpha / xa;
                acc.iter_mut().zip(xt).for_each(|(a, x)| *a = t * x - *a);
            }
        }
    }
}

/// `(s, σ)` of the hyperbolic kernel for one pair (`q0`, `k0` = the time coordinates).
#[inline]
fn lorentz(kind: HypScore, c: f64, beta: f64, q: &[f64], q0: f64, k: &[f64], k0: f64) -> (f64, f64) {
    let d2 = lorentz_sq_dist(q, q0, k, k0);
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

/// `d²_L = ‖q − k‖² − (q0 − k0)²` with `q0 − k0 = (q − k)·(q + k)/(q0 + k0)` (module doc).
#[inline]
fn lorentz_sq_dist(q: &[f64], q0: f64, k: &[f64], k0: f64) -> f64 {
    let (mut diff2, mut diff_sum) = (0.0, 0.0);
    for (a, b) in q.iter().zip(k) {
        let d = a - b;
        diff2 += d * d;
        diff_sum += d * (a + b);
    }
    let dt = diff_sum / (q0 + k0);
    diff2 - dt * dt
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
