//! The hyperbolic family's naive same-dtype baseline and case shaping for the GPU tests.
//!
//! The baseline is hyperbolic attention as a framework user writes it in dtype `T`: each row lifted
//! to the hyperboloid with its time coordinate `x0 = √(1/c + ‖x‖²)` stored in `T`, the Lorentz product
//! `L = −q0 k0 + q·k` as one matmul over the D + 1 coordinates (f32 accumulation, result rounded),
//! the score from `L` in f32 and rounded (`−β(−2/c − 2L)`, or `−(β/√c)·arccosh(max(−cL, 1 + ε))` with
//! zero gradient where clamped), `+ bias + log γ_j` (Einstein midpoint, `γ` in f32 with the CPU's
//! clamp), softmax and everything after it rounded as in [`super::naive`]; the backward runs autograd's
//! route: `dL = dS·∂s/∂L` rounded, the lifted gradients `Σ dL (−k0, k)` and `Σ dL (−q0, q)` rounded,
//! then through `x0`: `dq = dq_space + dq_0·q/q0`.

use super::{
    bias_at, check_close, check_lse, dot, key_rows, query_rows, run_gpu, softmax_row, unit, KeyCache, KeyRow,
    Outputs, QueryRow, SoftmaxSums,
};
use attn_core::{Aggregation, AttnSpec, Element, FamilySpec, HypScore, KLEIN_MAX_NORM2};
use attn_cpu_ref::testing::{max_abs, Case};
use attn_cpu_ref::{backward_f64, forward_f64, Inputs};
use attn_cuda::DeviceElem;

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

/// Plain hyperbolic attention in dtype `T` (module doc).
#[allow(clippy::needless_range_loop)] // one index addresses several rows at once
pub fn naive<T: Element>(spec: &AttnSpec, x: Inputs<'_, f64>, d_o: &[f64]) -> Outputs {
    let rt = |v: f32| T::from_f32(v).to_f32();
    let FamilySpec::Hyperbolic {
        score,
        curvature: c,
        beta,
        aggregation,
    } = *spec.family()
    else {
        panic!("the hyperbolic baseline needs a hyperbolic spec")
    };
    let midpoint = aggregation == Aggregation::EinsteinMidpoint;
    let d = spec.head_dim();
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
    let mut colsum = vec![0f32; spec.dv_len() / d.max(1) + 1];
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
                    log_gamma(&x.v[spec.v_offset(b, j, hk)..][..d], c).0
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
            colsum[spec.dv_offset(b, j, hk) / d] += ds[jj];
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
        let vrow = &x.v[vo..vo + d];
        let mid = if midpoint && valid {
            colsum[dvo / d] * log_gamma(vrow, c).1
        } else {
            0.0
        };
        let dk0 = rt(dk0_acc[ko / d]);
        for cc in 0..d {
            let dk = rt(dk_acc[ko + cc]) + dk0 * krow[cc] / k0;
            out.dk[ko + cc] = if valid { rt(dk) as f64 } else { 0.0 };
            out.dv[dvo + cc] = rt(rt(sums.dv[dvo + cc]) + mid * vrow[cc] as f32) as f64;
        }
    }
    sums.write_dbias::<T>(&mut out);
    out
}

/// How a test shapes the random case before rounding it to the storage type.
#[derive(Clone, Copy, Debug)]
pub enum Points {
    /// q and k rows scaled to a norm of about `radius` (uniform entries times `radius/√(D/3)`).
    Scaled { radius: f64 },
    /// Every q and k row a shared centre of norm `radius` plus a small perturbation: points far from
    /// the origin and close to each other, where `q0 k0 − q·k` cancels.
    FarCluster { radius: f64 },
    /// k = q row for row (needs Hq = Hkv, Nq = Nk and one layout): zero distance on the diagonal.
    Identical { radius: f64 },
    /// Einstein-midpoint values with `c‖v‖²` cycling through 0.9995 (inside the Klein ball, γ ≈ 45),
    /// 1.02 and 3 (outside: clamped, zero gradient through γ), q and k scaled as `Scaled`.
    KleinEdge { radius: f64 },
}

fn curvature(spec: &AttnSpec) -> f64 {
    match *spec.family() {
        FamilySpec::Hyperbolic { curvature, .. } => curvature as f64,
        _ => 1.0,
    }
}

/// Reshape `case` for `points` (in place, before rounding).
pub fn shape_points(case: &mut Case, points: Points) {
    let spec = case.spec.clone();
    let d = spec.head_dim();
    let per = |radius: f64| radius / (d as f64 / 3.0).sqrt();
    match points {
        Points::Scaled { radius } | Points::KleinEdge { radius } => {
            case.q.iter_mut().for_each(|x| *x *= per(radius));
            case.k.iter_mut().for_each(|x| *x *= per(radius));
        }
        Points::FarCluster { radius } => {
            // Centre: a fixed direction of norm `radius`; perturbations of norm about 0.6.
            let centre: Vec<f64> = (0..d)
                .map(|c| if c % 2 == 0 { 1.0 } else { -0.5 } * radius / (0.625 * d as f64).sqrt())
                .collect();
            for buf in [&mut case.q, &mut case.k] {
                for (idx, x) in buf.iter_mut().enumerate() {
                    *x = centre[idx % d] + *x * per(0.6);
                }
            }
        }
        Points::Identical { radius } => {
            case.q.iter_mut().for_each(|x| *x *= per(radius));
            case.k = case.q.clone();
        }
    }
    if let Points::KleinEdge { .. } = points {
        let c = curvature(&spec);
        let targets = [0.9995, 1.02, 3.0];
        let mut n = 0;
        for b in 0..spec.batch() {
            for j in 0..spec.seq_lens(b).k {
                for hk in 0..spec.heads_kv() {
                    let row = &mut case.v[spec.v_offset(b, j, hk)..][..d];
                    let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
                    let radius = (targets[n % 3] / c).sqrt();
                    row.iter_mut().for_each(|x| *x *= radius / norm);
                    n += 1;
                }
            }
        }
    }
}

/// One hyperbolic case on the GPU against the f64 reference, every tensor by name, the tolerance of
/// [`super::check`] (for f16/bf16 points far from the origin a stricter one, see the body). Returns
/// the case's label on failure (family, dtype, points, seed, field, errors and bound).
pub fn check_points<T: DeviceElem>(
    spec: &AttnSpec,
    seed: u64,
    offset: usize,
    points: Points,
) -> Result<(), String> {
    let mut case = attn_cpu_ref::testing::random_case(spec, seed);
    shape_points(&mut case, points);
    let round = |x: &mut Vec<f64>| x.iter_mut().for_each(|v| *v = T::from_f64(*v).to_f64());
    for x in [&mut case.q, &mut case.k, &mut case.v, &mut case.d_o] {
        round(x);
    }
    if let Some(b) = case.bias.as_mut() {
        round(b);
    }
    let reference = forward_f64(spec, case.inputs()).map_err(|e| e.to_string())?;
    let grads = backward_f64(spec, case.inputs(), &reference.o, &case.d_o, &reference.stats)
        .map_err(|e| e.to_string())?;
    let base = naive::<T>(spec, case.inputs(), &case.d_o);
    let got = run_gpu::<T>(spec, &case, offset)?;
    let atol = |r: &[f64]| 4.0 * unit::<T>() * max_abs(r).max(1e-3);
    let ctx = |e: String| {
        format!(
            "{} {} {points:?} seed {seed}: {e}",
            spec.family().label(),
            T::DTYPE
        )
    };
    // Far from the origin the f16/bf16 baseline loses its digits (its lifted coordinate is rounded
    // to T: about u_T·R² in every score), so 2× its error bounds nothing. The kernels form the score
    // in f32 from the T inputs, so there they must keep the storage type's own accuracy instead:
    // err ≤ 2·atol against the reference alone (the reference passed as its own baseline).
    let strict = matches!(points, Points::FarCluster { .. }) && T::DTYPE != attn_core::DType::F32;
    let cmp = |name: &str, got: &[f64], r: &[f64], b: &[f64]| {
        if strict {
            check_close(name, got, r, r, 2.0 * atol(r))
        } else {
            check_close(name, got, r, b, atol(r))
        }
    };
    cmp("o", &got.o, &reference.o, &base.o).map_err(ctx)?;
    let lse_base = if strict { &reference.stats } else { &base.lse };
    let lse_atol = if strict { 2.0 * atol(&[1.0]) } else { atol(&[1.0]) };
    check_lse(&got.lse, &reference.stats, lse_base, lse_atol).map_err(ctx)?;
    cmp("dq", &got.dq, &grads.dq, &base.dq).map_err(ctx)?;
    cmp("dk", &got.dk, &grads.dk, &base.dk).map_err(ctx)?;
    cmp("dv", &got.dv, &grads.dv, &base.dv).map_err(ctx)?;
    if let (Some(g), Some(r), Some(b)) = (&got.dbias, &grads.dbias, &base.dbias) {
        cmp("dbias", g, r, b).map_err(ctx)?;
    }
    Ok(())
}
