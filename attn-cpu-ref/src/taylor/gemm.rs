//! A small register-tiled `C += α·A·B` in f64: the inner product of every state update and state
//! read of the [`super::sweep`].
//!
//! One portable tile loop, compiled twice: with 4-wide tiles for baseline x86-64 / other targets,
//! and with 8-wide tiles inside an AVX2 function chosen at run time. Both do the same operations in
//! the same order per output element (no fused multiply-add), so results are identical bit for bit
//! whichever runs.

/// A read-only matrix view: element `(i, k)` is `data[i·rs + k·cs]`.
#[derive(Clone, Copy, Debug)]
pub(super) struct View<'a> {
    pub data: &'a [f64],
    pub rs: usize,
    pub cs: usize,
}

/// Rows of the register tile (its columns are the `NR` of [`tiled`]).
const MR: usize = 4;

/// `C[i, j] += α·Σ_{k<kk} A(i, k)·B[k, j]` for `i < m`, `j < n`, with `B` and `C` row-major
/// (`B[k, j] = b[k·ldb + j]`, `C[i, j] = c[i·ldc + j]`).
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_acc(
    m: usize,
    n: usize,
    kk: usize,
    alpha: f64,
    a: View<'_>,
    b: &[f64],
    ldb: usize,
    c: &mut [f64],
    ldc: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: `gemm_acc_avx2` requires AVX2 and nothing else; the CPU has it (checked above).
        unsafe { gemm_acc_avx2(m, n, kk, alpha, a, b, ldb, c, ldc) };
        return;
    }
    tiled::<4>(m, n, kk, alpha, a, b, ldb, c, ldc);
}

/// [`tiled`] with 8-wide tiles, compiled for AVX2 (four-lane f64 vectors).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
fn gemm_acc_avx2(
    m: usize,
    n: usize,
    kk: usize,
    alpha: f64,
    a: View<'_>,
    b: &[f64],
    ldb: usize,
    c: &mut [f64],
    ldc: usize,
) {
    tiled::<8>(m, n, kk, alpha, a, b, ldb, c, ldc);
}

/// The tile loop behind [`gemm_acc`], with `NR`-wide tiles.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tiled<const NR: usize>(
    m: usize,
    n: usize,
    kk: usize,
    alpha: f64,
    a: View<'_>,
    b: &[f64],
    ldb: usize,
    c: &mut [f64],
    ldc: usize,
) {
    let mut panel = vec![0.0f64; kk * MR];
    for i0 in (0..m).step_by(MR) {
        let mr = MR.min(m - i0);
        // Pack rows i0..i0+mr of A as a [kk, MR] panel (zero rows past m).
        for (k, pk) in panel.chunks_exact_mut(MR).enumerate() {
            for (ii, p) in pk.iter_mut().enumerate() {
                *p = if ii < mr {
                    a.data[(i0 + ii) * a.rs + k * a.cs]
                } else {
                    0.0
                };
            }
        }
        for j0 in (0..n).step_by(NR) {
            let nr = NR.min(n - j0);
            // acc[ii][jj] = Σ_k A(i0+ii, k)·B[k, j0+jj], kept in registers over the k loop.
            let mut acc = [[0.0f64; NR]; MR];
            let steps = panel.chunks_exact(MR).zip(b[j0..].chunks(ldb));
            if nr == NR {
                for (pk, brow) in steps {
                    // Internal invariant: `brow[..NR]` has exactly NR elements (nr == NR here).
                    let bk: &[f64; NR] = brow[..NR].try_into().expect("the slice is NR long");
                    for (row, &av) in acc.iter_mut().zip(pk) {
                        for (s, &bv) in row.iter_mut().zip(bk) {
                            *s += av * bv;
                        }
                    }
                }
            } else {
                for (pk, brow) in steps {
                    for (row, &av) in acc.iter_mut().zip(pk) {
                        for (s, &bv) in row.iter_mut().zip(&brow[..nr]) {
                            *s += av * bv;
                        }
                    }
                }
            }
            for (ii, row) in acc.iter().enumerate().take(mr) {
                let ci = &mut c[(i0 + ii) * ldc + j0..(i0 + ii) * ldc + j0 + nr];
                for (cv, s) in ci.iter_mut().zip(row) {
                    *cv += alpha * s;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_acc_matches_the_triple_loop_and_every_tile_width_agrees_bit_for_bit() {
        let (m, n, kk) = (11, 19, 7);
        let a: Vec<f64> = (0..kk * m).map(|i| (i as f64 * 0.37).sin()).collect();
        let b: Vec<f64> = (0..kk * n).map(|i| (i as f64 * 0.71).cos()).collect();
        let c0: Vec<f64> = (0..m * n).map(|i| i as f64).collect();
        // A stored transposed (column-major): A(i, k) = a[k·m + i].
        let av = View {
            data: &a,
            rs: 1,
            cs: m,
        };
        let mut want = c0.clone();
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] += 0.5 * (0..kk).map(|k| a[k * m + i] * b[k * n + j]).sum::<f64>();
            }
        }
        let (mut dispatched, mut narrow, mut wide) = (c0.clone(), c0.clone(), c0);
        gemm_acc(m, n, kk, 0.5, av, &b, n, &mut dispatched, n);
        tiled::<4>(m, n, kk, 0.5, av, &b, n, &mut narrow, n);
        tiled::<8>(m, n, kk, 0.5, av, &b, n, &mut wide, n);
        let err = dispatched
            .iter()
            .zip(&want)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(err < 1e-12, "gemm_acc differs from the triple loop by {err}");
        assert_eq!(narrow, wide);
        assert_eq!(narrow, dispatched);
    }
}
