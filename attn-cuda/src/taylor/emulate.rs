//! An f64 emulation of the Taylor kernels' control flow, line for line: the row kernels' scratch layout
//! (`taylor_key_row`, `taylor_query_row`), `TaylorSweep` (sizes, reversed rows, `hi`, `first_probe`), the
//! dense part past each chunk boundary, the state sweep's slabs, splits and read rules, and the finalize
//! kernels. The tests run it on random specs and compare every output with attn-cpu-ref: what it checks is
//! the decomposition the kernels implement (which sources each probe gets from which block), not the mma
//! fragment plumbing, which only the GPU suite can check.

use super::heuristics::{self, state_tile};
use attn_core::{AttnSpec, Causal, FamilySpec, SeqLengths};

/// `SeqInfo` (mask.h) without windows: Taylor specs have none.
struct Seq {
    b: usize,
    len_q: usize,
    len_k: usize,
    row_q: usize,
    row_k: usize,
    diag: i64,
    varlen: bool,
}

impl Seq {
    fn new(spec: &AttnSpec, b: usize) -> Self {
        let l = spec.seq_lens(b);
        let (row_q, row_k, varlen) = match spec.lengths() {
            SeqLengths::Varlen {
                cu_seqlens_q,
                cu_seqlens_k,
            } => (cu_seqlens_q[b], cu_seqlens_k[b], true),
            _ => (0, 0, false),
        };
        let diag = if spec.causal() == Causal::TopLeft {
            0
        } else {
            l.k as i64 - l.q as i64
        };
        Seq {
            b,
            len_q: l.q,
            len_k: l.k,
            row_q,
            row_k,
            diag,
            varlen,
        }
    }
    fn key_hi(&self, spec: &AttnSpec, i: usize) -> usize {
        let mut hi = self.len_k as i64;
        if spec.causal() != Causal::None {
            hi = hi.min(i as i64 + self.diag + 1);
        }
        hi.max(0) as usize
    }
    fn key_row(&self, spec: &AttnSpec, hk: usize, j: usize) -> usize {
        let stride = if self.varlen { self.len_k } else { spec.seq_k() };
        let row0 = if self.varlen {
            self.row_k
        } else {
            self.b * spec.seq_k()
        };
        row0 * spec.heads_kv() + hk * stride + j
    }
    fn query_row(&self, spec: &AttnSpec, hk: usize, i: usize, g: usize) -> usize {
        let stride = if self.varlen { self.len_q } else { spec.seq_q() };
        let row0 = if self.varlen {
            self.row_q
        } else {
            self.b * spec.seq_q()
        };
        row0 * spec.heads_q() + hk * spec.group() * stride + i * spec.group() + g
    }
}

/// `TaylorSweep`.
struct Sweep {
    seq: Seq,
    group: usize,
    n_s: usize,
    n_p: usize,
    src0: usize,
    probe0: usize,
    rev: bool,
}

impl Sweep {
    fn new(spec: &AttnSpec, b: usize, hk: usize, rev: bool) -> Self {
        let seq = Seq::new(spec, b);
        let group = spec.group();
        let (key0, query0) = (seq.key_row(spec, hk, 0), seq.query_row(spec, hk, 0, 0));
        let (n_s, n_p, src0, probe0) = if rev {
            (group * seq.len_q, seq.len_k, query0, key0)
        } else {
            (seq.len_k, group * seq.len_q, key0, query0)
        };
        Sweep {
            seq,
            group,
            n_s,
            n_p,
            src0,
            probe0,
            rev,
        }
    }
    fn src_row(&self, s: usize) -> usize {
        if self.rev {
            self.src0 + (self.n_s - 1 - s)
        } else {
            self.src0 + s
        }
    }
    fn probe_row(&self, p: usize) -> usize {
        if self.rev {
            self.probe0 + (self.n_p - 1 - p)
        } else {
            self.probe0 + p
        }
    }
    fn hi(&self, spec: &AttnSpec, p: usize) -> usize {
        if !self.rev {
            return self.seq.key_hi(spec, p / self.group);
        }
        let j = (self.n_p - 1 - p) as i64;
        let i0 = if spec.causal() != Causal::None {
            (j - self.seq.diag).clamp(0, self.seq.len_q as i64) as usize
        } else {
            0
        };
        self.group * (self.seq.len_q - i0)
    }
    fn first_probe(&self, spec: &AttnSpec, x: usize) -> usize {
        let (mut lo, mut up) = (0, self.n_p);
        while lo < up {
            let mid = (lo + up) / 2;
            if self.hi(spec, mid) >= x {
                up = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }
}

/// The port of the feature-tile helpers (see the heuristics tests for their algebra).
fn feature_tile(t: usize, d: usize, order: u8) -> (u8, usize, usize) {
    let w = d / 8;
    if t == 0 {
        return (1, 0, 0);
    }
    if t <= w {
        return (2, 0, 8 * (t - 1));
    }
    if order == 1 {
        return (0, 0, 0);
    }
    let mut q = t - 1 - w;
    for grp in 0..w {
        let wg = w - grp;
        if q < 8 * wg {
            return (3, 8 * grp + q / wg, 8 * grp + 8 * (q % wg));
        }
        q -= 8 * wg;
    }
    (0, 0, 0)
}
fn weight(a: usize, b: usize) -> f64 {
    if b > a {
        2.0
    } else if b == a {
        1.0
    } else {
        0.0
    }
}
fn phi((k, a, b0): (u8, usize, usize), e: usize, x: &[f64]) -> f64 {
    match k {
        1 if e == 0 => 1.0,
        2 => x[b0 + e],
        3 => x[a] * x[b0 + e],
        _ => 0.0,
    }
}
fn psi((k, a, b0): (u8, usize, usize), e: usize, z: &[f64], c: [f64; 3]) -> f64 {
    match k {
        1 if e == 0 => c[0],
        2 => c[1] * z[b0 + e],
        3 => c[2] * weight(a, b0 + e) * z[a] * z[b0 + e],
        _ => 0.0,
    }
}
fn psi_grad((k, a, b0): (u8, usize, usize), d: usize, z: &[f64], t: &[f64], c: [f64; 3]) -> f64 {
    let mut g = 0.0;
    if k == 2 && (b0..b0 + 8).contains(&d) {
        g = c[1] * t[d - b0];
    } else if k == 3 {
        if d == a {
            g += (0..8).map(|e| weight(a, b0 + e) * z[b0 + e] * t[e]).sum::<f64>();
        }
        if (b0..b0 + 8).contains(&d) {
            g += weight(a, d) * z[a] * t[d - b0];
        }
        g *= c[2];
    }
    g
}

/// The kernels' inputs of one sweep and where its results go.
struct SweepIo<'a> {
    src_x: &'a [f64],
    src_y: &'a [f64],
    probe_z: &'a [f64],
    probe_w: &'a [f64],
    out: &'a mut [f64],
}

struct Family {
    c: [f64; 3],
    order: u8,
    scale: f64,
    l2: bool,
    eps: f64,
}

fn family(spec: &AttnSpec) -> Family {
    let FamilySpec::Taylor {
        order,
        a,
        scale,
        qk_l2norm,
        eps,
    } = *spec.family()
    else {
        // Internal invariant: the emulator is only driven by the tests' Taylor specs.
        panic!("a Taylor spec")
    };
    Family {
        c: a.map(|x| x as f64),
        order: order.as_u8(),
        scale: scale as f64,
        l2: qk_l2norm,
        eps: eps as f64,
    }
}

/// `taylor_dense_*` then `taylor_state_*` of one sweep.
fn sweep(spec: &AttnSpec, io: SweepIo<'_>, rev: bool, grad: bool, sms: usize) {
    let fam = family(spec);
    let (d, m) = (spec.head_dim(), spec.head_dim() + 1);
    let width = if grad { d } else { m };
    let tile = state_tile(d).expect("supported head dim");
    let (c, nt) = (tile.c, tile.nt);
    let poly = |s: f64| fam.c[0] + s * (fam.c[1] + fam.c[2] * s);
    let dpoly = |s: f64| fam.c[1] + 2.0 * fam.c[2] * s;
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    // Dense: every probe row written.
    for b in 0..spec.batch() {
        for hk in 0..spec.heads_kv() {
            let sw = Sweep::new(spec, b, hk, rev);
            for p in 0..sw.n_p {
                let pr = sw.probe_row(p);
                let (z, w) = (&io.probe_z[pr * d..][..d], &io.probe_w[pr * m..][..m]);
                let hi = sw.hi(spec, p);
                let mut acc = vec![0.0; width];
                for s in hi / c * c..hi {
                    let sr = sw.src_row(s);
                    let (x, y) = (&io.src_x[sr * d..][..d], &io.src_y[sr * m..][..m]);
                    let t = dot(z, x);
                    if grad {
                        let coef = dpoly(t) * dot(w, y);
                        acc.iter_mut().zip(x).for_each(|(a, x)| *a += coef * x);
                    } else {
                        acc.iter_mut().zip(y).for_each(|(a, y)| *a += poly(t) * y);
                    }
                }
                io.out[pr * width..][..width].copy_from_slice(&acc);
            }
        }
    }
    // State: blocks (slab, split) of every (b, kv head), with the host's split heuristic.
    let max_sources = if rev {
        spec.group() * spec.seq_q()
    } else {
        spec.seq_k()
    };
    let chunks = max_sources / c;
    if chunks == 0 {
        return;
    }
    let slabs = heuristics::slabs(d, fam.order).expect("supported");
    let (splits, per) = heuristics::split(chunks, slabs * spec.heads_kv() * spec.batch(), sms);
    for b in 0..spec.batch() {
        for hk in 0..spec.heads_kv() {
            let sw = Sweep::new(spec, b, hk, rev);
            for block in 0..slabs * splits {
                let (slab, split) = (block % slabs, block / slabs);
                let n_chunks = sw.n_s / c;
                let c_lo = split * per;
                let c_hi = (c_lo + per).min(n_chunks);
                if c_lo >= c_hi || sw.first_probe(spec, (c_lo + 1) * c) >= sw.n_p {
                    continue;
                }
                let desc: Vec<_> = (0..nt)
                    .map(|t| feature_tile(slab * nt + t, d, fam.order))
                    .collect();
                // Sᵀ[v][f] over the slab's 8·NT features.
                let mut sums = vec![0.0; m * 8 * nt];
                for ch in c_lo..c_hi {
                    for r in 0..c {
                        let sr = sw.src_row(ch * c + r);
                        let (x, y) = (&io.src_x[sr * d..][..d], &io.src_y[sr * m..][..m]);
                        for (t, &ft) in desc.iter().enumerate() {
                            for e in 0..8 {
                                let ph = phi(ft, e, x);
                                for (v, yv) in y.iter().enumerate() {
                                    sums[v * 8 * nt + 8 * t + e] += ph * yv;
                                }
                            }
                        }
                    }
                    let bound = (ch + 1) * c;
                    let pa = sw.first_probe(spec, bound);
                    let pb = if ch + 1 < c_hi {
                        sw.first_probe(spec, bound + c)
                    } else {
                        sw.n_p
                    };
                    for p in pa..pb {
                        let pr = sw.probe_row(p);
                        let (z, w) = (&io.probe_z[pr * d..][..d], &io.probe_w[pr * m..][..m]);
                        let out = &mut io.out[pr * width..][..width];
                        if !grad {
                            for (v, o) in out.iter_mut().enumerate() {
                                for (t, &ft) in desc.iter().enumerate() {
                                    for e in 0..8 {
                                        *o += psi(ft, e, z, fam.c) * sums[v * 8 * nt + 8 * t + e];
                                    }
                                }
                            }
                        } else {
                            for (t, &ft) in desc.iter().enumerate() {
                                let tw: Vec<f64> = (0..8)
                                    .map(|e| (0..m).map(|v| w[v] * sums[v * 8 * nt + 8 * t + e]).sum())
                                    .collect();
                                for (dd, o) in out.iter_mut().enumerate() {
                                    *o += psi_grad(ft, dd, z, &tw, fam.c);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn normalised(row: &[f64], fam: &Family) -> Vec<f64> {
    let r = if fam.l2 {
        row.iter().map(|x| x * x).sum::<f64>().sqrt().max(fam.eps)
    } else {
        1.0
    };
    row.iter().map(|x| x / r).collect()
}

/// `taylor_l2norm_bwd`.
fn l2norm_bwd(x: &[f64], dxh: &[f64], scale: f64, fam: &Family) -> Vec<f64> {
    if !fam.l2 {
        return dxh.iter().map(|g| scale * g).collect();
    }
    let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
    if norm > fam.eps {
        let proj: f64 = x.iter().zip(dxh).map(|(x, g)| x / norm * scale * g).sum();
        x.iter()
            .zip(dxh)
            .map(|(x, g)| (scale * g - x / norm * proj) / norm)
            .collect()
    } else {
        dxh.iter().map(|g| scale * g / fam.eps).collect()
    }
}

/// Forward and backward as the host runs them: o, den, dq, dk, dv in the spec's layouts.
pub(super) struct Emulated {
    pub o: Vec<f64>,
    pub den: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

pub(super) fn run(spec: &AttnSpec, q: &[f64], k: &[f64], v: &[f64], d_o: &[f64], sms: usize) -> Emulated {
    let fam = family(spec);
    let (d, m, g) = (spec.head_dim(), spec.head_dim() + 1, spec.group());
    let (rows_q, rows_k) = (spec.total_q() * spec.heads_q(), spec.total_k() * spec.heads_kv());
    let (mut kx, mut ky, mut qz) = (
        vec![0.0; rows_k * d],
        vec![0.0; rows_k * m],
        vec![0.0; rows_q * d],
    );
    // prep_keys, prep_queries
    for b in 0..spec.batch() {
        let seq = Seq::new(spec, b);
        for hk in 0..spec.heads_kv() {
            for j in 0..seq.len_k {
                let row = seq.key_row(spec, hk, j);
                let ko = spec.k_offset(b, j, hk);
                kx[row * d..][..d].copy_from_slice(&normalised(&k[ko..ko + d], &fam));
                let vo = spec.v_offset(b, j, hk);
                ky[row * m..][..d].copy_from_slice(&v[vo..vo + d]);
                ky[row * m + d] = 1.0;
            }
        }
        for h in 0..spec.heads_q() {
            for i in 0..seq.len_q {
                let row = seq.query_row(spec, h / g, i, h % g);
                let qo = spec.q_offset(b, i, h);
                let u: Vec<f64> = normalised(&q[qo..qo + d], &fam)
                    .iter()
                    .map(|x| fam.scale * x)
                    .collect();
                qz[row * d..][..d].copy_from_slice(&u);
            }
        }
    }
    // forward
    let mut acc = vec![0.0; rows_q * m];
    let none = vec![0.0; rows_q * m];
    let io = SweepIo {
        src_x: &kx,
        src_y: &ky,
        probe_z: &qz,
        probe_w: &none,
        out: &mut acc,
    };
    sweep(spec, io, false, false, sms);
    let (mut o, mut den) = (vec![0.0; spec.o_len()], vec![0.0; spec.stats_len()]);
    let mut qw = vec![0.0; rows_q * m];
    for b in 0..spec.batch() {
        let seq = Seq::new(spec, b);
        for h in 0..spec.heads_q() {
            for i in 0..seq.len_q {
                let row = seq.query_row(spec, h / g, i, h % g);
                let empty = seq.key_hi(spec, i) == 0;
                let dn = if empty { 0.0 } else { acc[row * m + d] };
                let oo = spec.o_offset(b, i, h);
                for c in 0..d {
                    o[oo + c] = if empty { 0.0 } else { acc[row * m + c] / dn };
                }
                den[spec.stats_index(b, h, i)] = dn;
                // prep_grads
                if !empty {
                    let mut delta = 0.0;
                    for c in 0..d {
                        let gh = d_o[oo + c] / dn;
                        qw[row * m + c] = gh;
                        delta += gh * o[oo + c];
                    }
                    qw[row * m + d] = -delta;
                }
            }
        }
    }
    // backward
    let mut du = vec![0.0; rows_q * d];
    let (mut dvt, mut dkh) = (vec![0.0; rows_k * m], vec![0.0; rows_k * d]);
    let dq_io = SweepIo {
        src_x: &kx,
        src_y: &ky,
        probe_z: &qz,
        probe_w: &qw,
        out: &mut du,
    };
    sweep(spec, dq_io, false, true, sms);
    let dv_io = SweepIo {
        src_x: &qz,
        src_y: &qw,
        probe_z: &kx,
        probe_w: &ky,
        out: &mut dvt,
    };
    sweep(spec, dv_io, true, false, sms);
    let dk_io = SweepIo {
        src_x: &qz,
        src_y: &qw,
        probe_z: &kx,
        probe_w: &ky,
        out: &mut dkh,
    };
    sweep(spec, dk_io, true, true, sms);
    let (mut dq, mut dk, mut dv) = (
        vec![0.0; spec.dq_len()],
        vec![0.0; spec.dk_len()],
        vec![0.0; spec.dv_len()],
    );
    for b in 0..spec.batch() {
        let seq = Seq::new(spec, b);
        for h in 0..spec.heads_q() {
            for i in 0..seq.len_q {
                let row = seq.query_row(spec, h / g, i, h % g);
                let qo = spec.q_offset(b, i, h);
                let r = l2norm_bwd(&q[qo..qo + d], &du[row * d..][..d], fam.scale, &fam);
                dq[spec.dq_offset(b, i, h)..][..d].copy_from_slice(&r);
            }
        }
        for hk in 0..spec.heads_kv() {
            for j in 0..seq.len_k {
                let row = seq.key_row(spec, hk, j);
                let ko = spec.k_offset(b, j, hk);
                let r = l2norm_bwd(&k[ko..ko + d], &dkh[row * d..][..d], 1.0, &fam);
                dk[spec.dk_offset(b, j, hk)..][..d].copy_from_slice(&r);
                dv[spec.dv_offset(b, j, hk)..][..d].copy_from_slice(&dvt[row * m..][..d]);
            }
        }
    }
    Emulated { o, den, dq, dk, dv }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::{AttnProblem, DType, Family as Fam, Layout, TaylorParams};
    use attn_cpu_ref::testing::{max_abs, max_abs_diff, random_case};
    use attn_cpu_ref::{backward_f64, forward_f64};

    fn close(what: &str, got: &[f64], want: &[f64]) {
        let err = max_abs_diff(got, want);
        assert!(
            err <= 1e-10 * (1.0 + max_abs(want)),
            "{what}: emulated kernels differ from the reference by {err:.3e}"
        );
    }

    fn check(p: AttnProblem, seed: u64, sms: usize) {
        let spec = p.validate().expect("valid problem");
        let case = random_case(&spec, seed);
        let f = forward_f64(&spec, case.inputs()).expect("reference");
        let g = backward_f64(&spec, case.inputs(), &f.o, &case.d_o, &f.stats).expect("reference");
        let e = run(&spec, &case.q, &case.k, &case.v, &case.d_o, sms);
        close("o", &e.o, &f.o);
        close("den", &e.den, &f.stats);
        close("dq", &e.dq, &g.dq);
        close("dk", &e.dk, &g.dk);
        close("dv", &e.dv, &g.dv);
    }

    fn fam(order: u8, l2: bool) -> Fam {
        Fam::Taylor(TaylorParams {
            order,
            a: if order == 1 {
                [1.0, 0.6, 0.0]
            } else {
                [0.8, -0.3, 0.4]
            },
            scale: Some(if order == 1 { 0.05 } else { 0.3 }),
            qk_l2norm: l2,
        })
    }

    /// `Σ_f ψ_f(z) φ_f(x) = f(z·x)` and `Σ_f ∇ψ_f(z) φ_f(x) = f'(z·x) x` over the tiles of a head (the
    /// identities the kernels' value and gradient reads rest on), at every head dim and order.
    #[test]
    fn feature_tiles_factor_the_polynomial_and_its_gradient() {
        let c = [0.7, -0.45, 0.3];
        let mut seed = 12345u64;
        let mut draw = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        };
        for d in heuristics::HEAD_DIMS {
            for order in [1u8, 2] {
                let a2 = if order == 2 { c[2] } else { 0.0 };
                let coef = [c[0], c[1], a2];
                let z: Vec<f64> = (0..d).map(|_| draw()).collect();
                let x: Vec<f64> = (0..d).map(|_| draw()).collect();
                let s: f64 = z.iter().zip(&x).map(|(a, b)| a * b).sum();
                let tiles_here = heuristics::tiles(d, order);
                let mut value = 0.0;
                let mut grad = vec![0.0; d];
                for t in 0..tiles_here + 3 {
                    let ft = feature_tile(t, d, order);
                    let phis: Vec<f64> = (0..8).map(|e| phi(ft, e, &x)).collect();
                    value += (0..8).map(|e| psi(ft, e, &z, coef) * phis[e]).sum::<f64>();
                    for (dd, g) in grad.iter_mut().enumerate() {
                        *g += psi_grad(ft, dd, &z, &phis, coef);
                    }
                    if t >= tiles_here {
                        assert_eq!(ft.0, 0, "tile {t} past the end of D = {d}, order {order}");
                    }
                }
                let f = c[0] + c[1] * s + a2 * s * s;
                let df = c[1] + 2.0 * a2 * s;
                assert!(
                    (value - f).abs() < 1e-12,
                    "D = {d}, order {order}: {value} vs {f}"
                );
                for (dd, g) in grad.iter().enumerate() {
                    assert!((g - df * x[dd]).abs() < 1e-12, "D = {d}, order {order}, d = {dd}");
                }
            }
        }
    }

    /// Every mask option at sizes with several chunks, with one SM (many splits) and many (no split).
    #[test]
    fn emulated_kernel_decomposition_matches_the_reference() {
        let mut n = 0u64;
        for order in [1u8, 2] {
            for sms in [1, 1000] {
                for (d, l2) in [(16, false), (32, true)] {
                    let f = fam(order, l2);
                    let cases = [
                        AttnProblem::new(f, DType::F32, 2, 4, 2, 150, 197, d),
                        AttnProblem::new(f, DType::F32, 1, 2, 1, 93, 211, d).with_causal(Causal::TopLeft),
                        AttnProblem::new(f, DType::F32, 1, 3, 3, 230, 141, d).with_causal(Causal::TopLeft),
                        AttnProblem::new(f, DType::F32, 1, 3, 1, 230, 141, d)
                            .with_causal(Causal::BottomRight),
                        AttnProblem::new(f, DType::F32, 2, 2, 1, 75, 203, d).with_causal(Causal::BottomRight),
                        AttnProblem::new(f, DType::F32, 3, 2, 2, 170, 170, d)
                            .with_key_lens(vec![170, 66, 0])
                            .with_causal(Causal::BottomRight),
                        AttnProblem::new(f, DType::F32, 2, 4, 2, 100, 180, d).with_key_lens(vec![129, 180]),
                        AttnProblem::new(f, DType::F32, 4, 4, 2, 160, 190, d)
                            .with_varlen(vec![0, 160, 160, 200, 330], vec![0, 190, 211, 251, 381])
                            .with_causal(Causal::BottomRight),
                        AttnProblem::new(f, DType::F32, 2, 4, 1, 140, 150, d)
                            .with_layout(Layout::Bhnd)
                            .with_causal(Causal::TopLeft),
                    ];
                    for p in cases {
                        n += 1;
                        check(p, n, sms);
                    }
                }
            }
        }
    }
}
