//! An f64 emulation of the Taylor kernels' control flow, line for line: the backward's row scalars in
//! sweep order (`taylor_key_row`, `taylor_query_row`), `TaylorSweep` (sizes, reversed rows, the tensor
//! rows each source and probe reads, `hi`, the segments and the state index κ), the dense part past
//! each segment boundary, the fold's slabs and segments, the ordered prefix, the reads' probe tiles and
//! their state range, and the finalize kernels (the f16/bf16 forward kernel computes the same dense and
//! state parts of each probe in one pass); and the order-1 kernels' own schedule ([`order1_sweep`]),
//! including the causal order-1 backward of `taylor_order1_causal.cuh` (the reversed sweep that never
//! folds the chunk of its last source); and the causal wgmma forward's states and reads
//! ([`wg_causal_forward`], `taylor_wg.cuh`). The tests run it on random specs and compare every output
//! with attn-cpu-ref: what it checks is the decomposition the kernels implement (which sources each
//! probe gets from which kernel), not the mma fragment plumbing, which only the GPU suite can check.
//! Compiled for the tests only (`#[cfg(test)]` in taylor.rs): its `panic!` and `assert!`s guard the
//! emulation's own invariants and fail the test that drives it; no user input reaches them.

use super::heuristics::{self, state_tile};
use attn_core::{AttnSpec, Causal, FamilySpec, SeqLengths};

mod chain;
mod order1;
mod wg;

use chain::order1_chain_forward;
use order1::order1_sweep;
use wg::wg_causal_forward;

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
    seg: usize,
    n_seg: usize,
    probe0: usize,
    rev: bool,
    causal: bool,
}

impl Sweep {
    fn new(spec: &AttnSpec, b: usize, hk: usize, rev: bool, seg: usize) -> Self {
        let seq = Seq::new(spec, b);
        let group = spec.group();
        let (key0, query0) = (seq.key_row(spec, hk, 0), seq.query_row(spec, hk, 0, 0));
        let (n_s, n_p, probe0) = if rev {
            (group * seq.len_q, seq.len_k, key0)
        } else {
            (seq.len_k, group * seq.len_q, query0)
        };
        Sweep {
            seq,
            group,
            n_s,
            n_p,
            seg,
            n_seg: n_s.div_ceil(seg),
            probe0,
            rev,
            causal: spec.causal() != Causal::None,
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
    /// κ(hi): the state a probe reads (st[κ − 1]; none for κ = 0).
    fn state_index(&self, h: usize) -> usize {
        if h == 0 {
            0
        } else if !self.causal && h >= self.n_s {
            self.n_seg
        } else {
            (h - 1) / self.seg
        }
    }
    fn boundary(&self, h: usize) -> usize {
        (self.state_index(h) * self.seg).min(self.n_s)
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

/// The call's tensors (the spec's layouts), the row scalars of the prep kernels (sweep order) and where
/// a sweep's results go.
struct SweepIo<'a> {
    q: &'a [f64],
    k: &'a [f64],
    v: &'a [f64],
    d_o: Option<&'a [f64]>,
    rg: &'a [f64],
    nd: &'a [f64],
    out: &'a mut [f64],
}

/// `TaylorRowRef`, resolved: x and y = [values, last] of one row.
struct Row {
    x: Vec<f64>,
    y: Vec<f64>,
}

impl Sweep {
    /// `key_ref` through `taylor_load_x`: k̂_j = k_j/max(‖k_j‖, eps) (or k_j), ṽ_j = [v_j, 1].
    fn key_ref(&self, spec: &AttnSpec, io: &SweepIo<'_>, hk: usize, j: usize) -> Row {
        let (d, b) = (spec.head_dim(), self.seq.b);
        let r = inv_norm(&io.k[spec.k_offset(b, j, hk)..][..d], &family(spec));
        let (ko, vo) = (spec.k_offset(b, j, hk), spec.v_offset(b, j, hk));
        let mut y = io.v[vo..vo + d].to_vec();
        y.push(1.0);
        Row {
            x: io.k[ko..ko + d].iter().map(|x| x * r).collect(),
            y,
        }
    }
    /// `query_ref` through `taylor_load_x`: u = scale·q/max(‖q‖, eps) (or scale·q), g̃ = [rg·dO, −δ]
    /// (zeros without dO).
    fn query_ref(&self, spec: &AttnSpec, io: &SweepIo<'_>, hk: usize, i: usize, g: usize) -> Row {
        let (d, b, h) = (spec.head_dim(), self.seq.b, hk * self.group + g);
        let row = self.seq.query_row(spec, hk, i, g);
        let (qo, oo) = (spec.q_offset(b, i, h), spec.o_offset(b, i, h));
        let fam = family(spec);
        let r = fam.scale * inv_norm(&io.q[qo..qo + d], &fam);
        let mut y: Vec<f64> = match io.d_o {
            Some(d_o) => d_o[oo..oo + d].iter().map(|x| x * io.rg[row]).collect(),
            None => vec![0.0; d],
        };
        y.push(if io.d_o.is_some() { io.nd[row] } else { 0.0 });
        Row {
            x: io.q[qo..qo + d].iter().map(|x| x * r).collect(),
            y,
        }
    }
    fn source(&self, spec: &AttnSpec, io: &SweepIo<'_>, hk: usize, s: usize) -> Row {
        if !self.rev {
            return self.key_ref(spec, io, hk, s);
        }
        let r = self.n_s - 1 - s;
        self.query_ref(spec, io, hk, r / self.group, r % self.group)
    }
    fn probe(&self, spec: &AttnSpec, io: &SweepIo<'_>, hk: usize, p: usize) -> Row {
        if !self.rev {
            return self.query_ref(spec, io, hk, p / self.group, p % self.group);
        }
        self.key_ref(spec, io, hk, self.n_p - 1 - p)
    }
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

/// `taylor_dense_*`, `taylor_fold`, `taylor_prefix` and `taylor_read_*` of one sweep, with segments of
/// `seg` sources (the host's `seg_len` when `None`).
fn sweep(spec: &AttnSpec, io: SweepIo<'_>, rev: bool, grad: bool, seg: Option<usize>) {
    let fam = family(spec);
    let (d, m) = (spec.head_dim(), spec.head_dim() + 1);
    let width = if grad { d } else { m };
    let poly = |s: f64| fam.c[0] + s * (fam.c[1] + fam.c[2] * s);
    let dpoly = |s: f64| fam.c[1] + 2.0 * fam.c[2] * s;
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let max_sources = if rev {
        spec.group() * spec.seq_q()
    } else {
        spec.seq_k()
    };
    let heads = spec.batch() * spec.heads_kv();
    // Internal invariant (test-only module): the tests drive the emulator with the head dims the kernels
    // support, for which every heuristic below is `Some`.
    let seg = seg.unwrap_or_else(|| {
        let causal = spec.causal() != Causal::None;
        heuristics::seg_len(d, fam.order, max_sources, heads, 2, causal).expect("supported head dim")
    });
    let f_pad = heuristics::f_pad(d, fam.order);
    let nt = state_tile(d).expect("supported head dim").nt;
    let slabs = heuristics::fold_slabs(d, fam.order).expect("supported head dim");
    let bp = heuristics::read_probes(d, 2, grad);
    for b in 0..spec.batch() {
        for hk in 0..spec.heads_kv() {
            let sw = Sweep::new(spec, b, hk, rev, seg);
            // Dense: every probe row written, the sources [B_p, hi_p).
            for p in 0..sw.n_p {
                let pr = sw.probe_row(p);
                let Row { x: z, y: w } = sw.probe(spec, &io, hk, p);
                let hi = sw.hi(spec, p);
                let mut acc = vec![0.0; width];
                for s in sw.boundary(hi)..hi {
                    let Row { x, y } = sw.source(spec, &io, hk, s);
                    let t = dot(&z, &x);
                    if grad {
                        let coef = dpoly(t) * dot(&w, &y);
                        acc.iter_mut().zip(&x).for_each(|(a, x)| *a += coef * x);
                    } else {
                        acc.iter_mut().zip(&y).for_each(|(a, y)| *a += poly(t) * y);
                    }
                }
                io.out[pr * width..][..width].copy_from_slice(&acc);
            }
            // Fold: block (slab σ, segment k) writes st[k][v][f] for its features f ∈ [8·NT·σ, …) ∩ [0, f_pad).
            let mut st = vec![vec![0.0; m * f_pad]; sw.n_seg];
            for block in 0..slabs * sw.n_seg {
                let (slab, k) = (block % slabs, block / slabs);
                for s in k * seg..((k + 1) * seg).min(sw.n_s) {
                    let Row { x, y } = sw.source(spec, &io, hk, s);
                    for f in 8 * nt * slab..(8 * nt * (slab + 1)).min(f_pad) {
                        let ph = phi(feature_tile(f / 8, d, fam.order), f % 8, &x);
                        for (v, yv) in y.iter().enumerate() {
                            st[k][v * f_pad + f] += ph * yv;
                        }
                    }
                }
            }
            // Prefix: st[k] ← st[0] + … + st[k].
            for k in 1..sw.n_seg {
                let (done, rest) = st.split_at_mut(k);
                rest[0].iter_mut().zip(&done[k - 1]).for_each(|(x, p)| *x += p);
            }
            // Reads: tiles of BP probes, each over the states κ ∈ [max(1, κ(first)), κ(last)].
            for p0 in (0..sw.n_p).step_by(bp) {
                let p_end = (p0 + bp).min(sw.n_p);
                let k_lo = sw.state_index(sw.hi(spec, p0)).max(1);
                let k_hi = sw.state_index(sw.hi(spec, p_end - 1));
                for k in k_lo..=k_hi {
                    let state = &st[k - 1];
                    for p in (p0..p_end).filter(|&p| sw.state_index(sw.hi(spec, p)) == k) {
                        let pr = sw.probe_row(p);
                        let Row { x: z, y: w } = sw.probe(spec, &io, hk, p);
                        let out = &mut io.out[pr * width..][..width];
                        for t in 0..f_pad / 8 {
                            let ft = feature_tile(t, d, fam.order);
                            if !grad {
                                let ps: Vec<f64> = (0..8).map(|e| psi(ft, e, &z, fam.c)).collect();
                                for (v, o) in out.iter_mut().enumerate() {
                                    let row = &state[v * f_pad + 8 * t..][..8];
                                    *o += ps.iter().zip(row).map(|(p, s)| p * s).sum::<f64>();
                                }
                            } else {
                                let tw: Vec<f64> = (0..8)
                                    .map(|e| (0..m).map(|v| w[v] * state[v * f_pad + 8 * t + e]).sum())
                                    .collect();
                                for (dd, o) in out.iter_mut().enumerate() {
                                    *o += psi_grad(ft, dd, &z, &tw, fam.c);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `1/max(‖x‖, eps)`, or 1 without the l2-norm.
fn inv_norm(row: &[f64], fam: &Family) -> f64 {
    if fam.l2 {
        1.0 / row.iter().map(|x| x * x).sum::<f64>().sqrt().max(fam.eps)
    } else {
        1.0
    }
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

/// Which kernels [`run`] emulates: the general sweeps, or the order-1 kernels' schedule ([`order1_sweep`]).
#[derive(Clone, Copy)]
pub(super) enum Path {
    General,
    Order1,
}

pub(super) fn run(
    spec: &AttnSpec,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    seg: Option<usize>,
    path: Path,
) -> Emulated {
    let fam = family(spec);
    let heads = spec.batch() * spec.heads_kv();
    // One sweep of the chosen path, with `seg` or the host's segment length.
    let sweep = |io: SweepIo<'_>, rev: bool, grad: bool| match path {
        Path::General => sweep(spec, io, rev, grad, seg),
        Path::Order1 => {
            let n_s = if rev {
                spec.group() * spec.seq_q()
            } else {
                spec.seq_k()
            };
            let l = seg.unwrap_or_else(|| heuristics::order1_causal_seg_len(spec.head_dim(), n_s, heads));
            order1_sweep(spec, io, rev, grad, l)
        }
    };
    let (d, m, g) = (spec.head_dim(), spec.head_dim() + 1, spec.group());
    let (rows_q, rows_k) = (spec.total_q() * spec.heads_q(), spec.total_k() * spec.heads_kv());
    let (mut rg, mut nd) = (vec![0.0; rows_q], vec![0.0; rows_q]);
    fn io<'a>(
        [q, k, v]: [&'a [f64]; 3],
        d_o: Option<&'a [f64]>,
        rg: &'a [f64],
        nd: &'a [f64],
        out: &'a mut [f64],
    ) -> SweepIo<'a> {
        SweepIo {
            q,
            k,
            v,
            d_o,
            rg,
            nd,
            out,
        }
    }
    let x = [q, k, v];
    // forward
    let mut acc = vec![0.0; rows_q * m];
    sweep(io(x, None, &rg, &nd, &mut acc), false, false);
    let (mut o, mut den) = (vec![0.0; spec.o_len()], vec![0.0; spec.stats_len()]);
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
                    rg[row] = 1.0 / dn;
                    nd[row] = -(0..d).map(|c| d_o[oo + c] * rg[row] * o[oo + c]).sum::<f64>();
                }
            }
        }
    }
    // backward
    let mut du = vec![0.0; rows_q * d];
    let (mut dvt, mut dkh) = (vec![0.0; rows_k * m], vec![0.0; rows_k * d]);
    sweep(io(x, Some(d_o), &rg, &nd, &mut du), false, true);
    sweep(io(x, Some(d_o), &rg, &nd, &mut dvt), true, false);
    sweep(io(x, Some(d_o), &rg, &nd, &mut dkh), true, true);
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

    fn check(p: AttnProblem, seed: u64, seg: Option<usize>, path: Path) {
        let spec = p.validate().expect("valid problem");
        let case = random_case(&spec, seed);
        let f = forward_f64(&spec, case.inputs()).expect("reference");
        let g = backward_f64(&spec, case.inputs(), &f.o, &case.d_o, &f.stats).expect("reference");
        let e = run(&spec, &case.q, &case.k, &case.v, &case.d_o, seg, path);
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

    /// The order-1 kernels' schedule ([`order1_sweep`]) on every mask option, forward and backward: the
    /// non-causal forward and backward (whole sums; key padding, an empty packed sequence) and the causal
    /// forward as the kernels run them, and the causal backward as planned (both sweeps in blocks of
    /// segments), with segments of one chunk, of several, and longer than
    /// every sequence.
    #[test]
    fn emulated_order1_kernels_match_the_reference() {
        let mut n = 500u64;
        for seg in [64, 192, 256, 4096] {
            for (d, l2) in [(16, false), (32, true)] {
                let f = fam(1, l2);
                let cases = [
                    AttnProblem::new(f, DType::F32, 2, 4, 2, 150, 197, d),
                    AttnProblem::new(f, DType::F32, 2, 4, 2, 100, 180, d).with_key_lens(vec![129, 0]),
                    AttnProblem::new(f, DType::F32, 4, 4, 2, 160, 190, d)
                        .with_varlen(vec![0, 160, 160, 200, 330], vec![0, 190, 211, 251, 381]),
                    AttnProblem::new(f, DType::F32, 1, 2, 1, 93, 211, d).with_causal(Causal::TopLeft),
                    AttnProblem::new(f, DType::F32, 1, 2, 2, 300, 300, d).with_causal(Causal::TopLeft),
                    AttnProblem::new(f, DType::F32, 1, 3, 3, 230, 141, d).with_causal(Causal::TopLeft),
                    AttnProblem::new(f, DType::F32, 1, 3, 1, 230, 141, d).with_causal(Causal::BottomRight),
                    AttnProblem::new(f, DType::F32, 2, 4, 1, 75, 203, d).with_causal(Causal::BottomRight),
                    AttnProblem::new(f, DType::F32, 3, 2, 2, 170, 170, d)
                        .with_key_lens(vec![170, 66, 0])
                        .with_causal(Causal::BottomRight),
                    AttnProblem::new(f, DType::F32, 4, 4, 2, 160, 190, d)
                        .with_varlen(vec![0, 160, 160, 200, 330], vec![0, 190, 211, 251, 381])
                        .with_causal(Causal::BottomRight),
                ];
                for p in cases {
                    n += 1;
                    check(p, n, Some(seg), Path::Order1);
                }
            }
        }
    }

    /// Every mask option at sizes with several segments: the host's segment length (the fold chunk at
    /// these sizes), twice that, and one longer than every sequence (one segment: a probe either reads
    /// the whole sum or none of it).
    #[test]
    fn emulated_kernel_decomposition_matches_the_reference() {
        let mut n = 0u64;
        for order in [1u8, 2] {
            for seg in [None, Some(128), Some(1024)] {
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
                        check(p, n, seg, Path::General);
                    }
                }
            }
        }
    }

    /// The single-pass causal order-1 forward's decomposition (tickets, the fold blocks' chain, the forward
    /// blocks' chunk loop) against the reference: segments of one chunk, of several (the last segment and
    /// chunk partial), and the host's length (one segment); fold blocks 0, 1 and 3 rounds ahead; GQA, both
    /// alignments (Nq = Nk), packed sequences with equal offsets (one of one key, one empty), l2-norm.
    #[test]
    fn emulated_order1_chain_forward_matches_the_reference() {
        let mut n = 800u64;
        let f = fam(1, false);
        let fl = fam(1, true);
        let cases = [
            AttnProblem::new(f, DType::BF16, 2, 4, 2, 450, 450, 16).with_causal(Causal::TopLeft),
            AttnProblem::new(fl, DType::BF16, 1, 3, 1, 300, 300, 32).with_causal(Causal::BottomRight),
            AttnProblem::new(fl, DType::BF16, 4, 2, 2, 330, 330, 16)
                .with_varlen(vec![0, 1, 331, 331, 531], vec![0, 1, 331, 331, 531])
                .with_causal(Causal::TopLeft),
        ];
        for p in cases {
            let spec = p.validate().expect("valid problem");
            for (seg, lookahead) in [
                (64, 0),
                (128, 1),
                (192, 3),
                (
                    heuristics::ORDER1_CHAIN_SEG_LEN,
                    heuristics::ORDER1_CHAIN_LOOKAHEAD,
                ),
            ] {
                n += 1;
                let case = random_case(&spec, n);
                let want = forward_f64(&spec, case.inputs()).expect("reference");
                let (o, den) = order1_chain_forward(&spec, &case.q, &case.k, &case.v, seg, lookahead);
                close("o", &o, &want.o);
                close("den", &den, &want.stats);
            }
        }
    }

    /// The causal wgmma forward's decomposition (per-segment states in their stored, symmetric-halved form,
    /// each 128-query block's own segment densely) against the reference: segments of 128 and 256 keys
    /// (several states, the last segment and query block partial), the host's length for the shape (one
    /// segment: dense only), GQA, both alignments (Nq = Nk), packed sequences with equal offsets, l2-norm
    /// and custom coefficients.
    #[test]
    fn emulated_wgmma_causal_forward_matches_the_reference() {
        let mut n = 500u64;
        let f2 = fam(2, false);
        let f2l = fam(2, true);
        let cases = [
            (
                AttnProblem::new(f2, DType::BF16, 2, 4, 2, 700, 700, 16).with_causal(Causal::TopLeft),
                Some(128),
            ),
            (
                AttnProblem::new(f2l, DType::BF16, 1, 2, 1, 300, 300, 32).with_causal(Causal::BottomRight),
                Some(256),
            ),
            (
                AttnProblem::new(f2, DType::BF16, 3, 2, 2, 340, 340, 16)
                    .with_varlen(vec![0, 260, 261, 601], vec![0, 260, 261, 601])
                    .with_causal(Causal::BottomRight),
                Some(128),
            ),
            (
                AttnProblem::new(f2l, DType::BF16, 1, 2, 1, 390, 390, 64).with_causal(Causal::TopLeft),
                Some(128),
            ),
            (
                AttnProblem::new(f2, DType::BF16, 1, 2, 2, 300, 300, 16).with_causal(Causal::TopLeft),
                None,
            ),
        ];
        for (p, seg) in cases {
            n += 1;
            let spec = p.validate().expect("valid problem");
            let case = random_case(&spec, n);
            let want = forward_f64(&spec, case.inputs()).expect("reference");
            let l = seg.unwrap_or_else(|| heuristics::wg_causal_seg_len(spec.seq_k()));
            let (o, den) = wg_causal_forward(&spec, &case.q, &case.k, &case.v, l);
            close("o", &o, &want.o);
            close("den", &den, &want.stats);
        }
    }
}
