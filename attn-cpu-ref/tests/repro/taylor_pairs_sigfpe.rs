//! Standalone reproduction of the miscompilation worked around in `taylor/sweep.rs` (`eval_block`, the
//! `black_box` on `k`). Safe code only, no dependencies; not part of any test target:
//!
//! ```text
//! rustc --edition 2021 -C opt-level=3 taylor_pairs_sigfpe.rs && ./taylor_pairs_sigfpe 2
//! ```
//!
//! With rustc 1.95.0 (LLVM 22.1.2) on x86_64 this dies with SIGFPE (integer division by zero);
//! `-C opt-level=2`, `-C codegen-units=1`, `./taylor_pairs_sigfpe 1` and `… 3` print a sum. In
//! attn-cpu-ref's release build the generated code versions the loop on `k == 1` and, in that
//! version, divides the row count `n` by `1 − a` (a `div` by 0 at D = 2, a = 1).

/// `c[m, n] += A[m, kk]·b[kk, n]`, `A(i, k) = a[i·rs + k]`, packed four rows at a time.
#[inline(always)]
fn gemm(m: usize, n: usize, kk: usize, a: &[f64], rs: usize, b: &[f64], c: &mut [f64]) {
    let mut panel = vec![0.0f64; kk * 4];
    for i0 in (0..m).step_by(4) {
        let mr = 4.min(m - i0);
        for (k, pk) in panel.chunks_exact_mut(4).enumerate() {
            for (ii, p) in pk.iter_mut().enumerate() {
                *p = if ii < mr { a[(i0 + ii) * rs + k] } else { 0.0 };
            }
        }
        for j0 in (0..n).step_by(4) {
            let nr = 4.min(n - j0);
            let mut acc = [[0.0f64; 4]; 4];
            for (pk, brow) in panel.chunks_exact(4).zip(b[j0..].chunks(n)) {
                for (row, &av) in acc.iter_mut().zip(pk) {
                    for (s, &bv) in row.iter_mut().zip(&brow[..nr]) {
                        *s += av * bv;
                    }
                }
            }
            for (ii, row) in acc.iter().enumerate().take(mr) {
                for (cv, s) in c[(i0 + ii) * n + j0..(i0 + ii) * n + j0 + nr].iter_mut().zip(row) {
                    *cv += s;
                }
            }
        }
    }
}

/// For each `a < d`: `za[p, i] = c_i·z[p, a]·z[p, a + i]` for `i < k = d − a` (k ≥ 1), then
/// `out += za·p2[a]`.
#[inline(never)]
fn pairs(p2: &[f64], z: &[f64], n: usize, d: usize, m: usize, a2: f64, out: &mut [f64]) {
    let mut za = vec![0.0; n * d];
    let mut row0 = 0;
    for a in 0..d {
        let k = d - a;
        let block = &p2[row0 * m..(row0 + k) * m];
        row0 += k;
        for (zap, zp) in za.chunks_exact_mut(k).zip(z.chunks_exact(d)) {
            for (i, zv) in zap.iter_mut().enumerate() {
                let c = if i == 0 { a2 } else { 2.0 * a2 };
                *zv = c * zp[a] * zp[a + i];
            }
        }
        gemm(n, m, k, &za[..n * k], k, block, out);
    }
}

fn main() {
    let d: usize = std::env::args().nth(1).map_or(2, |s| s.parse().expect("a head dim"));
    let (n, m) = (32, 3);
    let z: Vec<f64> = (0..n * d).map(|i| i as f64).collect();
    let p2 = vec![1.0; d * (d + 1) / 2 * m];
    let mut out = vec![0.0; n * m];
    pairs(&p2, &z, std::hint::black_box(n), d, std::hint::black_box(m), 0.5, &mut out);
    println!("d = {d}: {}", out.iter().sum::<f64>());
}
