//! The hyperbolic family's naive same-dtype baseline: hyperbolic attention as a framework user
//! writes it in dtype `T`. Each row is lifted to the hyperboloid with its time coordinate
//! `x0 = √(1/c + ‖x‖²)` stored in `T`, the Lorentz product `L = −q0 k0 + q·k` as one matmul over the D + 1 coordinates (f32 accumulation, result rounded),
//! the score from `L` in f32 and rounded (`−β(−2/c − 2L)`, or `−(β/√c)·arccosh(max(−cL, 1 + ε))` with
//! zero gradient where clamped), `+ bias + log γ_j` (Einstein midpoint, `γ` in f32 with the CPU's
//! clamp), softmax and everything after it rounded as in [`super::naive`]; the backward runs autograd's
//! route: `dL = dS·∂s/∂L` rounded, the lifted gradients `Σ dL (−k0, k)` and `Σ dL (−q0, q)` rounded,
//! then through `x0`: `dq = dq_space + dq_0·q/q0`.

use super::{
    bias_at, dot, key_rows, query_rows, softmax_row, KeyCache, KeyRow, Outputs, QueryRow, SoftmaxSums,
};
use crate::Inputs;
use attn_core::{Aggregation, AttnSpec, Element, HypScore, KLEIN_MAX_NORM2};

/// The lifted row `(x0, x)` of `x`, both in `T`.
fn lift<T: Element>(x: &[f64], c: f32) -> (f32, Vec<f32>) {
    let rt = |v: f32| T::from_f32(v).to_f32();
    let row: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let n2: f32 = row.iter().map(|v| v * v).sum();
    (rt((1.0 / c + n2).sqrt()), row)
}

/// `log γ` of a value row in f32 and the factor `c γ²` of its gradient (0 where clamped).
fn log_gamma(v: &[f64], c: f32) -> (f32, f32) {
    let n2 = c * v.iter().map(|&x| (x * x) as f32).sum::<f32>();
    let clamped = n2 > KLEIN_MAX_NORM2 as f32;
    let n2 = n2.min(KLEIN_MAX_NORM2 as f32);
    (-0.5 * (-n2).ln_1p(), if clamped { 0.0 } else { c / (1.0 - n2) })
}

/// Plain hyperbolic attention in dtype `T` (module doc), with the family's parameters.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)] // one index addresses several rows at once
pub(super) fn naive<T: Element>(
    spec: &AttnSpec,
    x: Inputs<'_, f64>,
    d_o: &[f64],
    score: HypScore,
    c: f32,
    beta: f32,
    aggregation: Aggregation,
) -> Outputs {
    let rt = |v: f32| T::from_f32(v).to_f32();
    let midpoint = aggregation == Aggregation::EinsteinMidpoint;
    let (d, dv) = (spec.head_dim(), spec.head_dim_v());
    let eps = attn_core::ACOSH_EPS as f32;
    // s and ∂s/∂L from the rounded Lorentz product L.
    let score_of = |l: f32| -> (f32, f32) {
        match score {
            HypScore::SquaredLorentz => (-beta * (-2.0 / c - 2.0 * l), 2.0 * beta),
            HypScore::Geodesic => {
                let z = -c * l;
                let clamped = z < 1.0 + eps;
                let z = z.max(1.0 + eps);
                let root = (z * z - 1.0).sqrt();
                let s = -beta / c.sqrt() * (z + root).ln();
                (s, if clamped { 0.0 } else { beta * c.sqrt() / root })
            }
        }
    };
    let mut out = Outputs::zeros(spec);
    // Lifted key gradients (space part and time part), accumulated in f32 per key row; the
    // softmax sums (dv, dbias) and each value row's Σ dS (the midpoint's gradient through γ).
    let mut dk_acc = vec![0f32; spec.dk_len()];
    let mut dk0_acc = vec![0f32; spec.dk_len() / d.max(1) + 1];
    let mut colsum = vec![0f32; spec.dv_len() / dv.max(1) + 1];
    let mut sums = SoftmaxSums::new(spec);
    // Per key: the lifted row and, for the midpoint, log γ.
    let mut cache = KeyCache::new(spec.seq_k());
    for row in query_rows(spec) {
        let QueryRow { b, h, hk, i, .. } = row;
        let qo = spec.q_offset(b, i, h);
        let (q0, qrow) = lift::<T>(&x.q[qo..qo + d], c);
        for j in row.keys.clone() {
            cache.fill(b, hk, j, || {
                let lg = if midpoint {
                    log_gamma(&x.v[spec.v_offset(b, j, hk)..][..dv], c).0
                } else {
                    0.0
                };
                (lift::<T>(&x.k[spec.k_offset(b, j, hk)..][..d], c), lg)
            });
        }
        let krows: Vec<&(f32, Vec<f32>)> = row.keys.clone().map(|j| &cache.at(b, hk, j).0).collect();
        let mut s = Vec::with_capacity(row.keys.len());
        let mut sigma = Vec::with_capacity(row.keys.len());
        for (jj, j) in row.keys.clone().enumerate() {
            let l = rt(-q0 * krows[jj].0 + dot(&qrow, &krows[jj].1));
            let (sc, sg) = score_of(l);
            let lg = cache.at(b, hk, j).1;
            s.push(rt(sc + bias_at(spec, &x, &row, j) + lg));
            sigma.push(sg);
        }
        let Some(ds) = softmax_row::<T>(spec, &x, d_o, &row, &s, &mut out, &mut sums) else {
            continue;
        };
        let mut dqs = vec![0f32; d];
        let mut dq0 = 0f32;
        for (jj, j) in row.keys.clone().enumerate() {
            let dl = rt(ds[jj] * sigma[jj]);
            let (k0, krow) = (&krows[jj].0, &krows[jj].1);
            let ko = spec.dk_offset(b, j, hk);
            dq0 -= dl * k0;
            dk0_acc[ko / d] -= dl * q0;
            colsum[spec.dv_offset(b, j, hk) / dv.max(1)] += ds[jj];
            for cc in 0..d {
                dqs[cc] += dl * krow[cc];
                dk_acc[ko + cc] += dl * qrow[cc];
            }
        }
        let (dq0, qo_out) = (rt(dq0), spec.dq_offset(b, i, h));
        for cc in 0..d {
            out.dq[qo_out + cc] = rt(rt(dqs[cc]) + dq0 * qrow[cc] / q0) as f64;
        }
    }
    for KeyRow { b, hk, j, valid } in key_rows(spec) {
        let ko = spec.dk_offset(b, j, hk);
        let dvo = spec.dv_offset(b, j, hk);
        let (k0, krow) = lift::<T>(&x.k[spec.k_offset(b, j, hk)..][..d], c);
        let vo = spec.v_offset(b, j, hk);
        let vrow = &x.v[vo..vo + dv];
        let mid = if midpoint && valid {
            colsum[dvo / dv.max(1)] * log_gamma(vrow, c).1
        } else {
            0.0
        };
        let dk0 = rt(dk0_acc[ko / d]);
        for cc in 0..d {
            let dk = rt(dk_acc[ko + cc]) + dk0 * krow[cc] / k0;
            out.dk[ko + cc] = if valid { rt(dk) as f64 } else { 0.0 };
        }
        for cc in 0..dv {
            out.dv[dvo + cc] = rt(rt(sums.dv[dvo + cc]) + mid * vrow[cc] as f32) as f64;
        }
    }
    sums.write_dbias::<T>(&mut out);
    out
}
