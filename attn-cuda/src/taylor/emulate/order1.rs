//! The order-1 kernels' schedule (`taylor_order1*.cuh`) in the emulator.

use super::*;

/// The order-1 kernels' schedule of one sweep, the value or the gradient read, writing each probe's row
/// of `io.out` as [`sweep`] does. Per probe, with the state cst[v] = Σ y_s[v], lin[v][e] = Σ x_s[e] y_s[v]
/// over the sources [0, B) and the dense sources [B, hi):
///   value: out[v] = a0 cst[v] + a1 z·lin[v] + Σ f(z·x_s) y_s[v]
///   grad:  out[e] = a1 Σ_v w[v] lin[v][e] + Σ a1 (w·y_s) x_s[e]
/// Not causal (`taylor1_forward`, and `taylor1_backward`'s two reads: dû with w = [rg·dO, nd] over the
/// keys' state, dk̂ and dṽ over the queries'): B = hi = n_s, the whole sum. Causal (`taylor1_forward_causal`
/// and `taylor1_dq_causal` on the forward sweep, `taylor1_dkdv_causal` on the reversed one): block m of each
/// (batch entry, kv head) takes the probes with hi ∈ (mL, (m+1)L] (block 0 also hi = 0; the last one every
/// probe past) in tiles of 64, starting from the prefix state of the sources [0, mL); per tile it folds
/// the whole 64-source chunks below the tile's smallest hi into the state (B advancing by 64), then each
/// probe takes the state and the sources [B, hi_p) densely.
pub(super) fn order1_sweep(spec: &AttnSpec, io: SweepIo<'_>, rev: bool, grad: bool, seg: usize) {
    const BP: usize = 64;
    const C: usize = 64;
    let fam = family(spec);
    let (d, m, g) = (spec.head_dim(), spec.head_dim() + 1, spec.group());
    let width = if grad { d } else { m };
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for b in 0..spec.batch() {
        for hk in 0..spec.heads_kv() {
            let sw = Sweep::new(spec, b, hk, rev, seg);
            // The first probe whose hi passes h, in closed form (the forward's taylor1_first_probe_past,
            // and the reversed sweep's: key j = n_p − 1 − p sees the query rows of i ≥ i0(j) =
            // clamp(j − diag, 0, len_q), so hi > h iff i0(j) ≤ c = len_q − 1 − ⌊h/G⌋ iff j ≤ c + diag),
            // checked against its definition.
            let first_past = |h: usize| {
                let p = if sw.n_s <= h {
                    sw.n_p
                } else if !rev {
                    (g * (h as i64 - sw.seq.diag).max(0) as usize).min(sw.n_p)
                } else {
                    let c = (sw.seq.len_q - 1 - h / g) as i64;
                    (sw.n_p as i64 - 1 - c - sw.seq.diag).clamp(0, sw.n_p as i64) as usize
                };
                let by_search = (0..sw.n_p).find(|&p| sw.hi(spec, p) > h).unwrap_or(sw.n_p);
                // Internal invariant (test-only module): the closed form is what the kernel computes; the
                // emulation fails the test when it disagrees with the definition.
                assert_eq!(p, by_search, "first probe past {h} (reversed: {rev})");
                p
            };
            let blocks = if sw.causal { sw.n_seg.max(1) } else { 1 };
            for blk in 0..blocks {
                let (pa, pb, start) = if !sw.causal {
                    (0, sw.n_p, sw.n_s)
                } else {
                    let pa = if blk == 0 { 0 } else { first_past(blk * seg) };
                    let pb = if blk + 1 >= sw.n_seg {
                        sw.n_p
                    } else {
                        first_past((blk + 1) * seg)
                    };
                    (pa, pb, (blk * seg).min(sw.n_s))
                };
                let (mut cst, mut lin) = (vec![0.0; m], vec![0.0; m * d]);
                let fold = |io: &SweepIo<'_>, s: usize, cst: &mut [f64], lin: &mut [f64]| {
                    let Row { x, y } = sw.source(spec, io, hk, s);
                    for vv in 0..m {
                        cst[vv] += y[vv];
                        (0..d).for_each(|e| lin[vv * d + e] += x[e] * y[vv]);
                    }
                };
                for s in 0..start {
                    fold(&io, s, &mut cst, &mut lin);
                }
                let mut b_run = start;
                for t0 in (pa..pb).step_by(BP) {
                    let np = BP.min(pb - t0);
                    // The reversed sweep never folds the chunk of its last source (the first queries stay
                    // dense for every key: taylor_order1_causal.cuh).
                    let cap = if rev {
                        C * (sw.n_s.saturating_sub(1) / C)
                    } else {
                        sw.n_s
                    };
                    let h_lo = sw.hi(spec, t0).min(cap);
                    let target = if h_lo > b_run {
                        b_run + C * ((h_lo - b_run) / C)
                    } else {
                        b_run
                    };
                    while b_run < target {
                        // Internal invariant (test-only module): the kernel folds whole chunks only (no
                        // row of a folded tile is past the sources); the emulation fails the test otherwise.
                        assert!(b_run + C <= sw.n_s, "a folded chunk is whole");
                        for s in b_run..b_run + C {
                            fold(&io, s, &mut cst, &mut lin);
                        }
                        b_run += C;
                    }
                    for p in t0..t0 + np {
                        let hi = sw.hi(spec, p);
                        // Internal invariant (test-only module): every probe of a tile sees at least the
                        // sources the state holds (its dense range [B, hi) is not negative).
                        assert!(
                            hi == 0 || hi >= b_run,
                            "probe {p}: hi {hi} below the state boundary {b_run}"
                        );
                        let Row { x: z, y: w } = sw.probe(spec, &io, hk, p);
                        let mut acc: Vec<f64> = if grad {
                            (0..d)
                                .map(|e| fam.c[1] * (0..m).map(|vv| w[vv] * lin[vv * d + e]).sum::<f64>())
                                .collect()
                        } else {
                            (0..m)
                                .map(|vv| fam.c[0] * cst[vv] + fam.c[1] * dot(&z, &lin[vv * d..][..d]))
                                .collect()
                        };
                        for s in b_run..hi {
                            let Row { x, y } = sw.source(spec, &io, hk, s);
                            if grad {
                                let coef = fam.c[1] * dot(&w, &y);
                                acc.iter_mut().zip(&x).for_each(|(a, x)| *a += coef * x);
                            } else {
                                let f = fam.c[0] + fam.c[1] * dot(&z, &x);
                                acc.iter_mut().zip(&y).for_each(|(a, y)| *a += f * y);
                            }
                        }
                        io.out[sw.probe_row(p) * width..][..width].copy_from_slice(&acc);
                    }
                }
            }
        }
    }
}
