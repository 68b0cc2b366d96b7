//! The naive same-dtype baseline of REFERENCE.md's tolerance rule, `err(impl) ≤ 2·err(naive) + atol`
//! against the f64 reference: plain attention in the storage dtype `T` as a framework user writes
//! it. Inputs rounded to `T`; S, P, dP and dS rounded to `T` before the next product; outputs
//! rounded; sums accumulated in f32 (as a framework's matmul would). The softmax backward
//! recomputes P from the f32 LSE, as every memory-efficient implementation does. Softmax and cosine-sim here,
//! hyperbolic in [`hyperbolic`], Taylor in [`taylor`]; [`baseline`] picks by family.
//!
//! The GPU tests (`attn-cuda/tests/common`) and the CPU fast path's (`attn-cpu-ref/tests/fast_common`)
//! both compare through [`compare`].

pub mod hyperbolic;
pub mod taylor;

use super::{check_close, max_abs};
use crate::{Forward, Gradients, Inputs};
use attn_core::{AttnSpec, Element, FamilySpec, Pass, Result};
use std::ops::Range;

/// The naive baseline of `spec`'s family in dtype `T`, forward and backward (dO `d_o`), after the
/// reference's checks of the buffers against the spec (a typed error otherwise).
pub fn baseline<T: Element>(spec: &AttnSpec, x: Inputs<'_, f64>, d_o: &[f64]) -> Result<Outputs> {
    crate::check_inputs(spec, Pass::Backward, &x)?;
    spec.check_len(Pass::Backward, "d_o", d_o.len(), spec.o_len())?;
    Ok(match *spec.family() {
        FamilySpec::Softmax { scale, softcap } => softmax_like::<T>(spec, x, d_o, scale, softcap, None),
        FamilySpec::CosineSim {
            scale,
            qk_l2norm,
            eps,
        } => softmax_like::<T>(spec, x, d_o, scale, None, qk_l2norm.then_some(eps)),
        FamilySpec::Hyperbolic {
            score,
            curvature,
            beta,
            aggregation,
        } => hyperbolic::naive::<T>(spec, x, d_o, score, curvature, beta, aggregation),
        FamilySpec::Taylor {
            a,
            scale,
            qk_l2norm,
            eps,
            ..
        } => taylor::naive::<T>(spec, x, d_o, a, scale, qk_l2norm.then_some(eps)),
    })
}

/// The gradients' `atol`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GradTol {
    /// `4·u·max|ref|` per gradient, as for o.
    PerTensor,
    /// `(4·u + extra)·m`, `m` the largest `max|ref|` over dq, dk, dv and dbias. For an
    /// implementation that forms `δ = dO·o` and `dP = dO·v` by different sums (a GEMM beside a dot
    /// product): where `dP − δ` cancels exactly in the baseline (a row that sees one key, whose dq
    /// is 0), it keeps a rounding of the size of the other gradients, amplified by the l2-norm's
    /// `1/‖x‖` (cosine-sim) and summed over D and Nk (`extra`).
    Shared {
        /// The allowance added to `4·u`, relative to `m`.
        extra: f64,
    },
}

/// Compare `got` (o, LSE and gradients, widened to f64) with the f64 reference forward `reference`
/// and gradients `grads`: every tensor within `2·err(base) + atol` (`check_close`), with
/// `atol = 4·u·max(|ref|, 1e-3)` for the storage dtype's unit roundoff `u` (the gradients' per
/// `grad`), and the LSE −∞ exactly where the reference's row is empty (Taylor: the denominator,
/// its `atol` relative to its own `max|ref|`).
pub fn compare(
    spec: &AttnSpec,
    got: &Outputs,
    reference: &Forward<f64, f64>,
    grads: &Gradients<f64>,
    base: &Outputs,
    u: f64,
    grad: GradTol,
) -> Result<(), String> {
    let shared = [
        Some(&grads.dq),
        Some(&grads.dk),
        Some(&grads.dv),
        grads.dbias.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|g| max_abs(g))
    .fold(1e-3, f64::max);
    let gtol = |r: &[f64]| match grad {
        GradTol::PerTensor => atol(u, r),
        GradTol::Shared { extra } => (4.0 * u + extra) * shared,
    };
    compare_forward(spec, &got.o, &got.lse, reference, base, u)?;
    check_close("dq", &got.dq, &grads.dq, &base.dq, gtol(&grads.dq))?;
    check_close("dk", &got.dk, &grads.dk, &base.dk, gtol(&grads.dk))?;
    check_close("dv", &got.dv, &grads.dv, &base.dv, gtol(&grads.dv))?;
    match (&got.dbias, &grads.dbias, &base.dbias) {
        (Some(g), Some(r), Some(b)) => check_close("dbias", g, r, b, gtol(r)),
        (None, None, _) => Ok(()),
        _ => Err("dbias present on one side only".into()),
    }
}

/// The forward half of [`compare`]: o and the statistics `stats` (LSE, or Taylor's denominator)
/// of an implementation against the reference forward and the baseline, with the same `atol`.
pub fn compare_forward(
    spec: &AttnSpec,
    o: &[f64],
    stats: &[f64],
    reference: &Forward<f64, f64>,
    base: &Outputs,
    u: f64,
) -> Result<(), String> {
    check_close("o", o, &reference.o, &base.o, atol(u, &reference.o))?;
    if let FamilySpec::Taylor { .. } = spec.family() {
        // Denominators scale with their rows, unlike an LSE.
        check_close(
            "den",
            stats,
            &reference.stats,
            &base.lse,
            atol(u, &reference.stats),
        )
    } else {
        check_lse(stats, &reference.stats, &base.lse, atol(u, &[1.0]))
    }
}

/// The `atol` of a tensor with reference `r` in a dtype of unit roundoff `u`: `4·u·max(|r|, 1e-3)`.
fn atol(u: f64, r: &[f64]) -> f64 {
    4.0 * u * max_abs(r).max(1e-3)
}

/// Compare the LSE: −∞ exactly where the reference has an empty row, close elsewhere.
pub fn check_lse(got: &[f64], reference: &[f64], baseline: &[f64], atol: f64) -> Result<(), String> {
    let mut g = Vec::new();
    let mut r = Vec::new();
    let mut b = Vec::new();
    for i in 0..reference.len() {
        let empty = reference[i] == f64::NEG_INFINITY;
        if empty != (got[i] == f64::NEG_INFINITY) {
            return Err(format!(
                "lse[{i}]: got {} where the reference has {}",
                got[i], reference[i]
            ));
        }
        if !empty {
            g.push(got[i]);
            r.push(reference[i]);
            b.push(baseline[i]);
        }
    }
    check_close("lse", &g, &r, &b, atol)
}

/// What one implementation produced.
#[derive(Clone, Debug)]
pub struct Outputs {
    /// The output.
    pub o: Vec<f64>,
    /// The LSE per query row and head (`spec.stats_index`).
    pub lse: Vec<f64>,
    /// dL/dq.
    pub dq: Vec<f64>,
    /// dL/dk.
    pub dk: Vec<f64>,
    /// dL/dv.
    pub dv: Vec<f64>,
    /// dL/dbias, where the spec has a bias.
    pub dbias: Option<Vec<f64>>,
}

impl Outputs {
    /// Zeros, the LSE at −∞ (an empty row's) and a dbias where the spec has a bias: what a naive
    /// baseline leaves where no key is seen.
    pub fn zeros(spec: &AttnSpec) -> Self {
        Outputs {
            o: vec![0.0; spec.o_len()],
            lse: vec![f64::NEG_INFINITY; spec.stats_len()],
            dq: vec![0.0; spec.dq_len()],
            dk: vec![0.0; spec.dk_len()],
            dv: vec![0.0; spec.dv_len()],
            dbias: spec.bias().map(|_| vec![0.0; spec.bias_len()]),
        }
    }
}

/// A query row that sees at least one key: batch entry `b`, query head `h` over key/value head
/// `hk`, position `i`, and the keys it sees.
struct QueryRow {
    /// Batch entry.
    pub b: usize,
    /// Query head.
    pub h: usize,
    /// Its key/value head.
    pub hk: usize,
    /// Position.
    pub i: usize,
    /// The keys it sees.
    pub keys: Range<usize>,
}

/// Every query row of `spec` that sees a key, in (batch, head, position) order.
fn query_rows(spec: &AttnSpec) -> impl Iterator<Item = QueryRow> + '_ {
    (0..spec.batch()).flat_map(move |b| {
        (0..spec.heads_q()).flat_map(move |h| {
            (0..spec.seq_lens(b).q).filter_map(move |i| {
                let keys = spec.key_range(b, i);
                (!keys.is_empty()).then(|| QueryRow {
                    b,
                    h,
                    hk: spec.kv_head(h),
                    i,
                    keys,
                })
            })
        })
    })
}

/// A key row whose gradient a naive baseline writes: batch entry `b`, key/value head `hk`,
/// position `j`; `valid` where `j` is inside the entry's key length (not key padding).
struct KeyRow {
    /// Batch entry.
    pub b: usize,
    /// Key/value head.
    pub hk: usize,
    /// Position.
    pub j: usize,
    /// Inside the entry's key length.
    pub valid: bool,
}

/// Every key row of `spec` in (batch, head, position) order: a packed entry's own rows, every row
/// of a dense entry (its key padding included).
fn key_rows(spec: &AttnSpec) -> impl Iterator<Item = KeyRow> + '_ {
    (0..spec.batch()).flat_map(move |b| {
        let len_k = spec.seq_lens(b).k;
        let rows = if spec.is_varlen() { len_k } else { spec.seq_k() };
        (0..spec.heads_kv()).flat_map(move |hk| {
            (0..rows).map(move |j| KeyRow {
                b,
                hk,
                j,
                valid: j < len_k,
            })
        })
    })
}

/// `a·b`, summed in f32.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>()
}

/// Per-key values of one call, each made once: the naive baselines prepare a key row for every query row
/// that sees it, which made them the GPU tests' longest part. `fill` makes the value of key j of (batch
/// entry, kv head) the first time it is asked for; `at` reads it after.
struct KeyCache<V> {
    keys: usize,
    rows: std::collections::HashMap<(usize, usize), Vec<Option<V>>>,
}

impl<V> KeyCache<V> {
    /// A cache for `keys` keys per (batch entry, kv head) (the spec's longest sequence).
    pub fn new(keys: usize) -> Self {
        KeyCache {
            keys,
            rows: std::collections::HashMap::new(),
        }
    }

    /// Make the value of key `j` of (batch entry `b`, kv head `hk`) unless it is made.
    pub fn fill(&mut self, b: usize, hk: usize, j: usize, make: impl FnOnce() -> V) {
        let keys = self.keys;
        let row = self
            .rows
            .entry((b, hk))
            .or_insert_with(|| (0..keys).map(|_| None).collect());
        row[j].get_or_insert_with(make);
    }
    /// The value `fill` made.
    pub fn at(&self, b: usize, hk: usize, j: usize) -> &V {
        // Internal invariant: the baselines fill every key of a row before reading it.
        self.rows[&(b, hk)][j].as_ref().expect("a filled key")
    }
}

/// Row `x` in f32 and its norm `‖x‖`; with `l2_eps`, the row is `x / max(‖x‖, eps)` rounded to `T`.
fn prep_row<T: Element>(x: &[f64], l2_eps: Option<f32>) -> (Vec<f32>, f32) {
    let row: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
    match l2_eps {
        Some(eps) => (
            row.iter()
                .map(|v| T::from_f32(v / norm.max(eps)).to_f32())
                .collect(),
            norm,
        ),
        None => (row, norm),
    }
}

/// The gradient through [`prep_row`]: `dx = (dx̂ − x̂ (x̂·dx̂)) / ‖x‖` where `‖x‖ > eps`, else
/// `dx̂ / eps`; `dx̂` itself without the l2-norm.
fn l2norm_bwd(xh: &[f32], dxh: &[f32], norm: f32, l2_eps: Option<f32>) -> Vec<f32> {
    match l2_eps {
        None => dxh.to_vec(),
        Some(eps) if norm > eps => {
            let xd: f32 = xh.iter().zip(dxh).map(|(a, b)| a * b).sum();
            xh.iter().zip(dxh).map(|(x, g)| (g - x * xd) / norm).collect()
        }
        Some(eps) => dxh.iter().map(|g| g / eps).collect(),
    }
}

/// The bias of `row` at key `j` in f32 (0 without a bias; [`baseline`] has checked that a spec with a
/// bias comes with its buffer).
fn bias_at(spec: &AttnSpec, x: &Inputs<'_, f64>, row: &QueryRow, j: usize) -> f32 {
    spec.bias_index(row.b, row.h, row.i, j)
        .zip(x.bias)
        .map_or(0.0, |(bi, bias)| bias[bi] as f32)
}

/// The f32 sums of the softmax part of a naive baseline's backward, per key row: `dv` (`Σ p dO`)
/// and `dbias` (`Σ dS`).
struct SoftmaxSums {
    /// `Σ p dO` per value row.
    pub dv: Vec<f32>,
    /// `Σ dS` per bias entry.
    pub dbias: Vec<f32>,
}

impl SoftmaxSums {
    /// Zeros for every value row and bias entry of `spec`.
    pub fn new(spec: &AttnSpec) -> Self {
        SoftmaxSums {
            dv: vec![0f32; spec.dv_len()],
            dbias: vec![0f32; spec.bias_len()],
        }
    }

    /// `dbias` rounded to `T` into `out`.
    pub fn write_dbias<T: Element>(&self, out: &mut Outputs) {
        if let Some(db) = out.dbias.as_mut() {
            for (o, a) in db.iter_mut().zip(&self.dbias) {
                *o = T::from_f32(*a).to_f32() as f64;
            }
        }
    }
}

/// The softmax half of one query row of a naive baseline in dtype `T`, from its rounded scores `s`
/// (one per key of `row.keys`): `p = e^{s−m}/Σ` rounded, `o = Σ p v` (f32 sum, rounded) and the LSE
/// `m + ln Σ` into `out`; then, from the f32 LSE as a memory-efficient backward recomputes them,
/// `p' = e^{s−LSE}` rounded, `dP = dO·v` and `dS = p' (dP − dO·o)`, both rounded, with `p' dO` and
/// `dS` added to `sums`. Returns `dS` per key, or `None` where every score is −∞ (the row keeps
/// its zeros). (A composite that keeps P itself is more precise where |s| is large: at |s| ≈ 1e4
/// an f32 LSE is rounded by up to 5e-4, which moves every recomputed `p'` by that fraction. Every
/// implementation this baseline judges keeps only the LSE.)
#[allow(clippy::needless_range_loop)] // one index addresses several rows at once
fn softmax_row<T: Element>(
    spec: &AttnSpec,
    x: &Inputs<'_, f64>,
    d_o: &[f64],
    row: &QueryRow,
    s: &[f32],
    out: &mut Outputs,
    sums: &mut SoftmaxSums,
) -> Option<Vec<f32>> {
    let rt = |v: f32| T::from_f32(v).to_f32();
    let (dv, &QueryRow { b, h, hk, i, .. }) = (spec.head_dim_v(), row);
    let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return None;
    }
    let e: Vec<f32> = s.iter().map(|v| (v - m).exp()).collect();
    let sum: f32 = e.iter().sum();
    let p: Vec<f32> = e.iter().map(|v| rt(v / sum)).collect();
    let oo = spec.o_offset(b, i, h);
    let mut o_row = vec![0f32; dv];
    for (jj, j) in row.keys.clone().enumerate() {
        let vo = spec.v_offset(b, j, hk);
        for c in 0..dv {
            o_row[c] += p[jj] * x.v[vo + c] as f32;
        }
    }
    let o_row: Vec<f32> = o_row.into_iter().map(rt).collect();
    for c in 0..dv {
        out.o[oo + c] = o_row[c] as f64;
    }
    let lse = m + sum.ln();
    out.lse[spec.stats_index(b, h, i)] = lse as f64;
    let g: Vec<f32> = d_o[oo..oo + dv].iter().map(|&v| v as f32).collect();
    let delta = dot(&g, &o_row);
    let mut ds = Vec::with_capacity(s.len());
    for (jj, j) in row.keys.clone().enumerate() {
        let vo = spec.v_offset(b, j, hk);
        let vrow: Vec<f32> = x.v[vo..vo + dv].iter().map(|&v| v as f32).collect();
        let dp = rt(dot(&g, &vrow));
        let pj = rt((s[jj] - lse).exp());
        let dsj = rt(pj * (dp - delta));
        if let Some(bi) = spec.bias_index(b, h, i, j) {
            sums.dbias[bi] += dsj;
        }
        let dvo = spec.dv_offset(b, j, hk);
        for c in 0..dv {
            sums.dv[dvo + c] += pj * g[c];
        }
        ds.push(dsj);
    }
    Some(ds)
}

/// Plain attention in dtype `T` (see the module doc), for softmax (`softcap`) and cosine-sim
/// (`cosine_eps`: the l2-norm's eps where q and k are normalised).
#[allow(clippy::needless_range_loop)] // one index addresses several rows at once
fn softmax_like<T: Element>(
    spec: &AttnSpec,
    x: Inputs<'_, f64>,
    d_o: &[f64],
    scale: f32,
    softcap: Option<f32>,
    cosine_eps: Option<f32>,
) -> Outputs {
    let rt = |v: f32| T::from_f32(v).to_f32();
    let d = spec.head_dim();
    // Prepared rows: x̂ = x / max(‖x‖, eps) rounded to T (cosine-sim), else x; and ‖x‖.
    let prep = |buf: &[f64], off: usize| prep_row::<T>(&buf[off..off + d], cosine_eps);
    let mut out = Outputs::zeros(spec);
    // dk̂ accumulated in f32 per key row, then rounded.
    let mut dk_acc = vec![0f32; spec.dk_len()];
    let mut sums = SoftmaxSums::new(spec);
    let mut cache = KeyCache::new(spec.seq_k());
    for row in query_rows(spec) {
        let QueryRow { b, h, hk, i, .. } = row;
        let (qh, qnorm) = prep(x.q, spec.q_offset(b, i, h));
        for j in row.keys.clone() {
            cache.fill(b, hk, j, || prep(x.k, spec.k_offset(b, j, hk)));
        }
        let krows: Vec<&(Vec<f32>, f32)> = row.keys.clone().map(|j| cache.at(b, hk, j)).collect();
        // s = score + bias, rounded; sigma = ∂score/∂(q̂·k̂) (the softcap's tanh term).
        let mut s = Vec::with_capacity(row.keys.len());
        let mut sigma = Vec::with_capacity(row.keys.len());
        for (jj, j) in row.keys.clone().enumerate() {
            let raw = scale * dot(&qh, &krows[jj].0);
            let (sc, sg) = match softcap {
                Some(cap) => {
                    let t = (raw / cap).tanh();
                    (cap * t, scale * (1.0 - t * t))
                }
                None => (raw, scale),
            };
            s.push(rt(sc + bias_at(spec, &x, &row, j)));
            sigma.push(sg);
        }
        let Some(ds) = softmax_row::<T>(spec, &x, d_o, &row, &s, &mut out, &mut sums) else {
            continue;
        };
        let mut dqh = vec![0f32; d];
        for (jj, j) in row.keys.clone().enumerate() {
            let w = ds[jj] * sigma[jj];
            let ko = spec.dk_offset(b, j, hk);
            for c in 0..d {
                dqh[c] += w * krows[jj].0[c];
                dk_acc[ko + c] += w * qh[c];
            }
        }
        let dqh: Vec<f32> = dqh.into_iter().map(rt).collect();
        let dq = l2norm_bwd(&qh, &dqh, qnorm, cosine_eps);
        let qo = spec.dq_offset(b, i, h);
        for c in 0..d {
            out.dq[qo + c] = rt(dq[c]) as f64;
        }
    }
    // dk: through the l2-norm per key row (cosine-sim), then rounded.
    for KeyRow { b, hk, j, .. } in key_rows(spec) {
        let ko = spec.dk_offset(b, j, hk);
        let dkh: Vec<f32> = dk_acc[ko..ko + d].iter().map(|&v| rt(v)).collect();
        let (kh, norm) = prep(x.k, spec.k_offset(b, j, hk));
        let dk = l2norm_bwd(&kh, &dkh, norm, cosine_eps);
        for c in 0..d {
            out.dk[ko + c] = rt(dk[c]) as f64;
        }
        let vo = spec.dv_offset(b, j, hk);
        for c in 0..spec.head_dim_v() {
            out.dv[vo + c] = rt(sums.dv[vo + c]) as f64;
        }
    }
    sums.write_dbias::<T>(&mut out);
    out
}
