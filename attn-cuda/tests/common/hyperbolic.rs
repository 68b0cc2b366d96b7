//! Case shaping and the point checks of the hyperbolic GPU tests; the family's naive same-dtype
//! baseline is `attn_cpu_ref::testing::naive::hyperbolic`.

pub use super::naive;
use super::{check_close, check_lse, run_gpu, unit};
use attn_core::{AttnSpec, FamilySpec};
use attn_cpu_ref::testing::{max_abs, Case};
use attn_cpu_ref::{backward_f64, forward_f64};
use attn_cuda::DeviceElem;

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
