//! f32 building blocks of the fast path: prepared rows, the pair score of each softmax-like family
//! computed from a tile of dot products, and a safe wrapper around the `gemm` crate.

use super::simd::dot_lanes;
use attn_core::{Element, FamilySpec, HypScore, ACOSH_EPS, KLEIN_MAX_NORM2};
use std::any::TypeId;
use std::borrow::Cow;

/// Queries per tile (forward and backward).
pub(super) const BQ: usize = 64;
/// Keys per tile (forward and backward).
pub(super) const BK: usize = 128;

/// Scalars of one prepared row (see `softmax_like::score`): `‖x‖`, `x0 = √(1/c + ‖x‖²)` and the gap
/// `x0 − ‖x‖`; a family leaves the fields it does not use at 0.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RowS {
    pub norm: f32,
    pub x0: f32,
    pub gap: f32,
}

/// `n` prepared rows of `dim` f32 values, row `r` at `data[r·rs..r·rs + dim]`, with their scalars
/// (empty where every row's are the defaults: [`Rows::scalars`]), one extra scalar per row
/// (`log γ` of a value row under the Einstein midpoint, else 0) and the rows holding a non-finite
/// value ([`Rows::bad_in`]). `data` is the caller's buffer itself where no preparation is needed
/// (f32 storage, a row used as is: [`Rows::borrow`]), else a contiguous copy (`rs = dim`).
pub(super) struct Rows<'a> {
    pub dim: usize,
    pub rs: usize,
    pub data: Cow<'a, [f32]>,
    pub s: Vec<RowS>,
    pub extra: Vec<f32>,
    /// Indices of the rows holding a NaN or ±∞, ascending. Not tracked for borrowed rows: only
    /// the decode kernel reads those, and it visits allowed keys only.
    pub bad: Vec<usize>,
}

impl<'a> Rows<'a> {
    /// The `n` rows of `dim` values at `src[base + r·rs..]` without a copy, when the storage is
    /// f32 (`None` otherwise). Scalars are the defaults (not stored) and the extras 0: for the rows a family
    /// uses as is (q and k of a plain dot-product score, v without the Einstein midpoint).
    pub(super) fn borrow<E: Element>(
        src: &'a [E],
        base: usize,
        rs: usize,
        n: usize,
        dim: usize,
    ) -> Option<Rows<'a>> {
        if TypeId::of::<E>() != TypeId::of::<f32>() {
            return None;
        }
        // SAFETY: E is f32 (same type, checked above), so the slice reinterprets nothing.
        let all = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<f32>(), src.len()) };
        let end = if n == 0 { base } else { base + (n - 1) * rs + dim };
        let data = all.get(base..end)?;
        Some(Rows {
            dim,
            rs,
            data: Cow::Borrowed(data),
            s: Vec::new(),
            extra: vec![0.0; n],
            bad: Vec::new(),
        })
    }

    /// The rows of `r0..r0 + n` holding a non-finite value, relative to `r0`.
    #[inline]
    pub(super) fn bad_in(&self, r0: usize, n: usize) -> Vec<usize> {
        bad_in(&self.bad, r0, n)
    }

    /// The scalars of row `r`.
    #[inline]
    pub(super) fn scalars(&self, r: usize) -> RowS {
        self.s.get(r).copied().unwrap_or_default()
    }

    #[inline]
    pub(super) fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.rs..r * self.rs + self.dim]
    }

    /// Rows `r0..r0 + n` as a matrix operand (`n × dim`).
    #[inline]
    pub(super) fn block(&self, r0: usize, n: usize) -> Mat<'_> {
        Mat::rows(self.span(r0, n), self.rs)
    }

    /// The transpose of [`Rows::block`] (`dim × n`).
    #[inline]
    pub(super) fn block_t(&self, r0: usize, n: usize) -> Mat<'_> {
        Mat::t(self.span(r0, n), self.rs)
    }

    fn span(&self, r0: usize, n: usize) -> &[f32] {
        if n == 0 {
            return &[];
        }
        &self.data[r0 * self.rs..(r0 + n - 1) * self.rs + self.dim]
    }
}

/// The pair score in f32: the same kernels as the reference's `Score`, evaluated from the dot
/// product `t = x̃·ỹ` of the prepared rows (a GEMM tile).
#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    Dot { scale: f32, softcap: Option<f32> },
    Cosine { scale: f32, eps: f32 },
    Lorentz { kind: HypScore, c: f32, beta: f32 },
}

impl Kind {
    /// `None` for Taylor (no row-wise softmax).
    pub(super) fn new(family: &FamilySpec) -> Option<Kind> {
        Some(match *family {
            FamilySpec::Softmax { scale, softcap } => Kind::Dot { scale, softcap },
            FamilySpec::CosineSim {
                scale,
                qk_l2norm: true,
                eps,
            } => Kind::Cosine { scale, eps },
            FamilySpec::CosineSim {
                scale,
                qk_l2norm: false,
                ..
            } => Kind::Dot { scale, softcap: None },
            FamilySpec::Hyperbolic {
                score,
                curvature,
                beta,
                ..
            } => Kind::Lorentz {
                kind: score,
                c: curvature,
                beta,
            },
            FamilySpec::Taylor { .. } => return None,
        })
    }

    /// Write the prepared row of `x` to `out` and return its scalars; a row holding a NaN or ±∞
    /// becomes NaN (docs/nan.md), as in the reference.
    pub(super) fn prepare(&self, x: &[f32], out: &mut [f32]) -> RowS {
        if x.iter().any(|v| !v.is_finite()) {
            out.fill(f32::NAN);
            return RowS {
                norm: f32::NAN,
                x0: f32::NAN,
                gap: f32::NAN,
            };
        }
        match *self {
            Kind::Dot { .. } => {
                out.copy_from_slice(x);
                RowS::default()
            }
            Kind::Cosine { eps, .. } => {
                let norm = dot_lanes(x, x).sqrt();
                // A division, not a product with `1/‖x‖`: `x / ‖x‖` is exactly ±1 at D = 1, where
                // the l2-norm's gradient then cancels to exactly 0, as in the reference.
                let n = norm.max(eps);
                out.iter_mut().zip(x).for_each(|(o, x)| *o = x / n);
                RowS {
                    norm,
                    ..RowS::default()
                }
            }
            Kind::Lorentz { c, .. } => {
                let norm = dot_lanes(x, x).sqrt();
                let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
                out.iter_mut().zip(x).for_each(|(o, x)| *o = x * inv);
                let x0 = (1.0 / c + norm * norm).sqrt();
                RowS {
                    norm,
                    x0,
                    gap: (1.0 / c) / (x0 + norm),
                }
            }
        }
    }

    /// `(s, σ)` for one pair from `t = x̃·ỹ` and the rows' scalars (σ as in the reference's module
    /// doc: the weight of `G` in the gradient).
    #[inline]
    pub(super) fn score(&self, t: f32, qs: &RowS, ks: &RowS) -> (f32, f32) {
        match *self {
            // q and k rows of a dot-product score are used as is: a non-finite product means a
            // row holding ±∞ or NaN, whose scores are NaN (docs/nan.md).
            Kind::Dot { .. } if !t.is_finite() => (f32::NAN, f32::NAN),
            Kind::Dot { scale, softcap: None } | Kind::Cosine { scale, .. } => (scale * t, scale),
            Kind::Dot {
                scale,
                softcap: Some(cap),
            } => {
                let th = (scale * t / cap).tanh();
                (cap * th, scale * (1.0 - th * th))
            }
            Kind::Lorentz { kind, c, beta } => {
                // The hyperboloid arithmetic runs in f64 on the f32 dot product: the geodesic's
                // σ = −β√c/√(z² − 1) amplifies the rounding of z − 1 where q and k are close.
                let (c, beta) = (c as f64, beta as f64);
                let (nq, nk) = (qs.norm as f64, ks.norm as f64);
                let (q0, k0) = (qs.x0 as f64, ks.x0 as f64);
                // ‖q̂ − k̂‖² = 2 − 2 q̂·k̂ on unit rows (a zero row has norm 0 and its term vanishes).
                let angular = (2.0 - 2.0 * t as f64).max(0.0);
                let dn = nq - nk;
                let t0 = q0 + k0;
                let one_minus_rho2 = (qs.gap as f64 + ks.gap as f64) * (t0 + nq + nk) / (t0 * t0);
                let d2 = dn * dn * one_minus_rho2 + nq * nk * angular;
                let (s, sg) = match kind {
                    HypScore::SquaredLorentz => (-beta * d2, -2.0 * beta),
                    HypScore::Geodesic => {
                        let x = 0.5 * c * d2;
                        let (x, clamped) = if x < ACOSH_EPS {
                            (ACOSH_EPS, true)
                        } else {
                            (x, false)
                        };
                        let root = (x * (x + 2.0)).sqrt();
                        let sc = c.sqrt();
                        let s = -beta * (x + root).ln_1p() / sc;
                        (s, if clamped { 0.0 } else { -beta * sc / root })
                    }
                };
                (s as f32, sg as f32)
            }
        }
    }

    /// The Lorentz gradient's pair coefficients for a weight `w` (reference: `Score::accumulate`):
    /// `w·G(x, y) = a (x̂ − ŷ) + T ŷ`; returns `(a, T)`.
    #[inline]
    pub(super) fn lorentz_coef(c: f32, w: f32, xs: &RowS, ys: &RowS) -> (f32, f32) {
        let (nx, ny, x0, y0) = (xs.norm, ys.norm, xs.x0, ys.x0);
        let radial = (nx + ny) * (1.0 + nx / (x0 + y0)) + y0;
        let t = w * (nx - ny) * radial / (c * (y0 + ny) * (x0 + nx) * x0);
        let a = w * y0 * nx / x0;
        (a, t)
    }

    /// Map the accumulated gradient with respect to the prepared row to the raw row (cosine-sim's
    /// l2-normalisation; identity otherwise).
    pub(super) fn finish(&self, acc: &mut [f32], xt: &[f32], xs: &RowS) {
        if let Kind::Cosine { eps, .. } = *self {
            if xs.norm > eps {
                let radial = dot_lanes(xt, acc);
                acc.iter_mut()
                    .zip(xt)
                    .for_each(|(a, x)| *a = (*a - x * radial) / xs.norm);
            } else {
                acc.iter_mut().for_each(|a| *a /= eps);
            }
        }
    }
}

/// `log γ` of a value row and the factor `c γ²` of its gradient (0 where the Klein-ball clamp is
/// active).
pub(super) fn log_gamma(c: f32, v: &[f32]) -> (f32, f32) {
    let n2 = c * dot_lanes(v, v);
    let clamped = n2 > KLEIN_MAX_NORM2 as f32;
    let n2 = if clamped { KLEIN_MAX_NORM2 as f32 } else { n2 };
    let dfactor = if clamped { 0.0 } else { c / (1.0 - n2) };
    (-0.5 * (-n2).ln_1p(), dfactor)
}

/// `max(a, b)`, NaN when either is NaN.
#[inline]
pub(super) fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// The indices in `r0..r0 + n` of the ascending indices `bad`, relative to `r0`.
#[inline]
pub(super) fn bad_in(bad: &[usize], r0: usize, n: usize) -> Vec<usize> {
    let at = bad.partition_point(|&r| r < r0);
    bad[at..]
        .iter()
        .take_while(|&&r| r < r0 + n)
        .map(|&r| r - r0)
        .collect()
}

/// The ascending indices of the `dim`-value rows of `data` holding a NaN or ±∞.
pub(super) fn bad_rows(data: &[f32], dim: usize) -> Vec<usize> {
    data.chunks_exact(dim.max(1))
        .enumerate()
        .filter(|(_, r)| r.iter().any(|x| !x.is_finite()))
        .map(|(i, _)| i)
        .collect()
}

/// `dst[m×n] += a[m×k]·b[k×n]` for a tile product whose weights `a` are exactly 0 at masked
/// pairs (`sees(r, i)` false) and whose rows `bad` of `b` (ascending) hold a NaN or ±∞.
///
/// A plain GEMM would multiply the masked pairs' zero weights by those rows, and `0·NaN` is NaN:
/// it would reach outputs the mask hides the row from (docs/nan.md). Here the GEMM runs on a
/// copy of `b` with the bad rows zeroed, which gives every output the bits it would have with
/// any finite row there (a masked pair adds an exact 0 either way), and each bad row is then
/// added to the outputs that see it. Without bad rows it is [`matmul`].
pub(super) fn matmul_masked(
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    dst_rs: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    bad: &[usize],
    sees: impl Fn(usize, usize) -> bool,
) {
    if bad.is_empty() {
        matmul(m, n, k, dst, dst_rs, true, a, b);
        return;
    }
    let at = |x: &Mat<'_>, r: usize, c: usize| x.data[r * x.rs + c * x.cs];
    let mut clean = vec![0f32; k * n];
    for (i, row) in clean.chunks_exact_mut(n.max(1)).enumerate().take(k) {
        if bad.binary_search(&i).is_err() {
            row.iter_mut().enumerate().for_each(|(c, x)| *x = at(&b, i, c));
        }
    }
    matmul(m, n, k, dst, dst_rs, true, a, Mat::rows(&clean, n));
    for r in 0..m {
        for &i in bad.iter().filter(|&&i| sees(r, i)) {
            let w = at(&a, r, i);
            for c in 0..n {
                dst[r * dst_rs + c] += w * at(&b, i, c);
            }
        }
    }
}

/// A matrix operand: `data[r·rs + c·cs]` is element (r, c).
#[derive(Clone, Copy)]
pub(super) struct Mat<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// Row-major with row stride `rs`.
    pub(super) fn rows(data: &'a [f32], rs: usize) -> Mat<'a> {
        Mat { data, rs, cs: 1 }
    }
    /// The transpose of a row-major matrix with row stride `rs`.
    pub(super) fn t(data: &'a [f32], rs: usize) -> Mat<'a> {
        Mat { data, rs: 1, cs: rs }
    }
    fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// Products summed at a time into a single row's partial (see [`matmul`]).
const ROW_K: usize = 64;

/// `dst[m×n] (row-major, row stride dst_rs) = (acc ? dst : 0) + a[m×k]·b[k×n]` on the `gemm` crate,
/// single-threaded (the callers parallelise over tiles).
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    acc: bool,
    a: Mat<'_>,
    b: Mat<'_>,
) {
    if m == 0 || n == 0 {
        return;
    }
    let d = Mat {
        data: dst,
        rs: dst_rs,
        cs: 1,
    };
    // Internal invariant (every caller sizes its tiles from the same m, n, k); checked because the
    // call below reads and writes through raw pointers.
    assert!(
        d.fits(m, n) && a.fits(m, k) && b.fits(k, n),
        "fast::matmul: operand too short for {m}x{n}x{k}"
    );
    if k == 0 {
        if !acc {
            for r in 0..m {
                dst[r * dst_rs..r * dst_rs + n].fill(0.0);
            }
        }
        return;
    }
    if m == 1 && (acc || k > ROW_K) {
        // One row: the `gemm` crate adds the k products to dst one after the other, so each
        // rounding is relative to dst's running value (20 ulp of the result at k = 2080, an
        // order-2 Taylor state at D = 64, against 4 with two rows or more).
        matmul_blocked(1, n, k, ROW_K, dst, dst_rs, acc, a, b);
        return;
    }
    // SAFETY: the three extents were checked above; dst is a unique borrow that overlaps neither
    // input (both are shared borrows).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            acc,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// [`matmul`] with the `k` products summed in blocks of `kb` from zero and the blocks added to dst
/// in order: a long contraction (`k` in the thousands) whose terms cancel keeps the rounding of
/// sums of `kb` terms plus one addition per block, instead of one sum over all of `k`.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul_blocked(
    m: usize,
    n: usize,
    k: usize,
    kb: usize,
    dst: &mut [f32],
    dst_rs: usize,
    acc: bool,
    a: Mat<'_>,
    b: Mat<'_>,
) {
    if m == 0 || n == 0 {
        return;
    }
    let kb = kb.max(1);
    let (mut sum, mut part) = (vec![0f32; m * n], vec![0f32; m * n]);
    for k0 in (0..k).step_by(kb) {
        let a = Mat {
            data: a.data.get(k0 * a.cs..).unwrap_or(&[]),
            ..a
        };
        let b = Mat {
            data: b.data.get(k0 * b.rs..).unwrap_or(&[]),
            ..b
        };
        matmul(m, n, kb.min(k - k0), &mut part, n, false, a, b);
        sum.iter_mut().zip(&part).for_each(|(s, p)| *s += p);
    }
    for (r, sr) in sum.chunks_exact(n).enumerate() {
        for (d, s) in dst[r * dst_rs..r * dst_rs + n].iter_mut().zip(sr) {
            *d = if acc { *d + s } else { *s };
        }
    }
}

/// `e^x` in f32 to within 2 ulp on [−87, 88], in a form the compiler vectorises (no libm call,
/// no float-to-int conversion): Cody–Waite reduction `x = n ln 2 + r` with `n` rounded by the
/// 1.5·2²³ shift (whose low mantissa bits then hold `n`), Cephes' degree-5 minimax polynomial for
/// `(e^r − 1 − r)/r²` on |r| ≤ ln2/2, and `2^n` by exponent bits. 0 below −87 (e^−87 is near the
/// bottom of f32's normal range), +∞ above 88, NaN for NaN.
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const SHIFT: f32 = 12_582_912.0;
    // `clamp` keeps NaN, which then flows through every step below.
    let xc = x.clamp(-87.0, 88.0);
    let t = xc * LOG2E + SHIFT;
    let n = t - SHIFT;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = (p * (r * r) + r) + 1.0;
    // t = 1.5·2²³ + n: its bits minus the shift's are n (|n| ≤ 127), the exponent of 2^n.
    let n_bits = t.to_bits().wrapping_sub(SHIFT.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    let y = y * scale;
    if x < -87.0 {
        0.0
    } else if x > 88.0 {
        f32::INFINITY
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::exp;

    #[test]
    fn exp_matches_libm_within_a_few_ulp_and_keeps_the_special_values() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_37;
        }
        assert!(
            worst < 2.0 * f32::EPSILON as f64,
            "worst relative error {worst:e}"
        );
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
    }
}
