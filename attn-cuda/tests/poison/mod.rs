//! The NaN/Inf contract of docs/nan.md on the GPU: one element of q, k, v, the bias or dO set to NaN
//! or ±∞, the f64 reference run on the same inputs, and every output and gradient compared with it:
//! NaN exactly where the reference has NaN, ±∞ exactly where it has ±∞, every finite entry within
//! the tolerance rule of `common` (2 × the naive same-dtype error + atol, both measured on the case
//! before the poison: the rows the poison does not reach are the clean case's).

use crate::common::{run_gpu, Outputs};
use attn_core::{AttnSpec, Element};
use attn_cpu_ref::testing::{max_abs, max_abs_diff, random_case, Case};
use attn_cpu_ref::{backward_f64, forward_f64, Inputs};
use attn_cuda::DeviceElem;

/// The tensor that gets the non-finite element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Q,
    K,
    V,
    Bias,
    DO,
}

/// A same-dtype baseline of the family (`common::naive`, `common::hyperbolic::naive`).
pub type Naive = fn(&AttnSpec, Inputs<'_, f64>, &[f64]) -> Outputs;

fn round<T: Element>(x: &mut [f64]) {
    for e in x.iter_mut() {
        *e = T::from_f64(*e).to_f64();
    }
}

/// The reference's outputs and gradients of `case`, in the order of [`NAMES`].
fn reference(spec: &AttnSpec, case: &Case) -> Result<Vec<Vec<f64>>, String> {
    let fwd = forward_f64(spec, case.inputs()).map_err(|e| e.to_string())?;
    let g = backward_f64(spec, case.inputs(), &fwd.o, &case.d_o, &fwd.stats).map_err(|e| e.to_string())?;
    Ok(vec![
        fwd.o,
        fwd.stats,
        g.dq,
        g.dk,
        g.dv,
        g.dbias.unwrap_or_default(),
    ])
}

fn fields(x: Outputs) -> Vec<Vec<f64>> {
    vec![x.o, x.lse, x.dq, x.dk, x.dv, x.dbias.unwrap_or_default()]
}

const NAMES: [&str; 6] = ["o", "lse", "dq", "dk", "dv", "dbias"];

/// NaN and ±∞ where the reference has them, finite entries within `2·base + atol`.
fn compare(name: &str, got: &[f64], reference: &[f64], base: f64, atol: f64) -> Result<(), String> {
    if got.len() != reference.len() {
        return Err(format!(
            "{name}: {} elements, reference {}",
            got.len(),
            reference.len()
        ));
    }
    let mut err = 0.0f64;
    for (i, (&g, &r)) in got.iter().zip(reference).enumerate() {
        let same_kind = if r.is_nan() {
            g.is_nan()
        } else if r.is_infinite() {
            g == r
        } else {
            g.is_finite()
        };
        if !same_kind {
            return Err(format!("{name}[{i}]: got {g} where the reference has {r}"));
        }
        if r.is_finite() {
            err = err.max((g - r).abs());
        }
    }
    if err > 2.0 * base + atol {
        return Err(format!(
            "{name}: max error {err:.3e} over the finite entries > 2 × baseline error {base:.3e} + atol {atol:.1e}"
        ));
    }
    Ok(())
}

/// One case of `spec` (seeded, rounded to `T`) with element `at` (modulo its length) of `target` set to
/// `value`: the GPU's outputs and gradients against the reference on the same inputs.
pub fn check_poisoned<T: DeviceElem>(
    spec: &AttnSpec,
    seed: u64,
    target: Target,
    at: usize,
    value: f64,
    naive: Naive,
) -> Result<(), String> {
    let mut case = random_case(spec, seed);
    for x in [&mut case.q, &mut case.k, &mut case.v, &mut case.d_o] {
        round::<T>(x);
    }
    if let Some(b) = case.bias.as_mut() {
        round::<T>(b);
    }
    let ctx = |e: String| {
        format!(
            "{} {} seed {seed}, {target:?}[{at}] = {value}: {e}",
            spec.family().label(),
            T::DTYPE
        )
    };
    // The tolerance of the clean case.
    let clean = reference(spec, &case).map_err(ctx)?;
    let base: Vec<f64> = fields(naive(spec, case.inputs(), &case.d_o))
        .iter()
        .zip(&clean)
        .map(|(b, r)| if r.is_empty() { 0.0 } else { max_abs_diff(b, r) })
        .collect();
    let unit = T::DTYPE.unit_roundoff();
    let atol: Vec<f64> = clean
        .iter()
        .enumerate()
        .map(|(n, r)| {
            if n == 1 {
                4.0 * unit
            } else {
                4.0 * unit * max_abs(r).max(1e-3)
            }
        })
        .collect();
    let x = match target {
        Target::Q => &mut case.q,
        Target::K => &mut case.k,
        Target::V => &mut case.v,
        Target::DO => &mut case.d_o,
        Target::Bias => case
            .bias
            .as_mut()
            .ok_or_else(|| ctx("the spec has no bias".into()))?,
    };
    let n = x.len();
    x[at % n] = value;
    let want = reference(spec, &case).map_err(ctx)?;
    let got = fields(run_gpu::<T>(spec, &case, 0).map_err(ctx)?);
    for (i, name) in NAMES.iter().enumerate() {
        compare(name, &got[i], &want[i], base[i], atol[i]).map_err(ctx)?;
    }
    Ok(())
}
