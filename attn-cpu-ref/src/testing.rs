//! Test helpers shared by every crate's tests: random cases, finite differences and the
//! FlashAttention-style tolerance check (docs/math.md, "Numerics").
//!
//! Kept in the library (not behind `cfg(test)`) so the CUDA and Candle test suites compare against
//! the same oracle in the same way.

pub mod naive;

use crate::{backward_f64, forward_f64, Inputs};
use attn_core::{Aggregation, AttnSpec, FamilySpec, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Random q, k, v, bias and dO for a spec, in f64, laid out as the spec says.
#[derive(Clone, Debug)]
pub struct Case {
    /// The call.
    pub spec: AttnSpec,
    /// Queries, `spec.q_len()` elements.
    pub q: Vec<f64>,
    /// Keys, `spec.k_len()` elements.
    pub k: Vec<f64>,
    /// Values, `spec.v_len()` elements.
    pub v: Vec<f64>,
    /// The bias, present exactly when the spec has one.
    pub bias: Option<Vec<f64>>,
    /// The upstream gradient dL/do, `spec.o_len()` elements; random, because a dO of ones has
    /// hidden a dV bug upstream (docs/math.md, "Numerics").
    pub d_o: Vec<f64>,
}

impl Case {
    /// The case's tensors as [`Inputs`].
    pub fn inputs(&self) -> Inputs<'_, f64> {
        Inputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            bias: self.bias.as_deref(),
        }
    }

    /// `L = Σ o ⊙ dO`, the scalar whose gradients `backward` returns.
    pub fn loss(&self) -> Result<f64> {
        let f = forward_f64(&self.spec, self.inputs())?;
        Ok(f.o.iter().zip(&self.d_o).map(|(o, g)| o * g).sum())
    }
}

fn uniform(rng: &mut StdRng, n: usize, amp: f64) -> Vec<f64> {
    (0..n).map(|_| rng.random_range(-amp..amp)).collect()
}

/// Draw a case: entries uniform in (−1, 1); Einstein-midpoint values scaled into the Klein ball
/// (`c‖v‖² < 0.81`, every row the spec addresses); a random dO (never ones: a dO of ones hides dV bugs).
pub fn random_case(spec: &AttnSpec, seed: u64) -> Case {
    let mut rng = StdRng::seed_from_u64(seed);
    let q = uniform(&mut rng, spec.q_len(), 1.0);
    let k = uniform(&mut rng, spec.k_len(), 1.0);
    let mut v = uniform(&mut rng, spec.v_len(), 1.0);
    if let FamilySpec::Hyperbolic {
        aggregation: Aggregation::EinsteinMidpoint,
        curvature,
        ..
    } = *spec.family()
    {
        let dv = spec.head_dim_v();
        for b in 0..spec.batch() {
            for j in 0..spec.seq_lens(b).k {
                for hk in 0..spec.heads_kv() {
                    let row = &mut v[spec.v_offset(b, j, hk)..][..dv];
                    let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
                    let radius = rng.random_range(0.0..0.9) / (curvature as f64).sqrt();
                    row.iter_mut().for_each(|x| *x *= radius / norm);
                }
            }
        }
    }
    let bias = spec.bias().map(|_| uniform(&mut rng, spec.bias_len(), 1.0));
    let d_o = uniform(&mut rng, spec.o_len(), 1.0);
    Case {
        spec: spec.clone(),
        q,
        k,
        v,
        bias,
        d_o,
    }
}

/// Largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// Largest absolute value (0 for an empty slice).
pub fn max_abs(a: &[f64]) -> f64 {
    a.iter().map(|x| x.abs()).fold(0.0, f64::max)
}

/// Which input tensor a gradient belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tensor {
    Q,
    K,
    V,
    Bias,
}

/// `(input index, gradient index)` of every element of `t` that the spec addresses. Inputs may be
/// strided views while gradients are contiguous, so the two indices differ in general.
fn element_pairs(spec: &AttnSpec, t: Tensor) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    if t == Tensor::Bias {
        return (0..spec.bias_len()).map(|i| (i, i)).collect();
    }
    for b in 0..spec.batch() {
        let lens = spec.seq_lens(b);
        let (rows, heads, dim) = match t {
            Tensor::Q => (lens.q, spec.heads_q(), spec.head_dim()),
            Tensor::K => (lens.k, spec.heads_kv(), spec.head_dim()),
            _ => (lens.k, spec.heads_kv(), spec.head_dim_v()),
        };
        for n in 0..rows {
            for h in 0..heads {
                let (x, g) = match t {
                    Tensor::Q => (spec.q_offset(b, n, h), spec.dq_offset(b, n, h)),
                    Tensor::K => (spec.k_offset(b, n, h), spec.dk_offset(b, n, h)),
                    _ => (spec.v_offset(b, n, h), spec.dv_offset(b, n, h)),
                };
                pairs.extend((0..dim).map(|d| (x + d, g + d)));
            }
        }
    }
    pairs
}

/// The input element `xi` of tensor `t` in `case`.
fn slot(c: &mut Case, t: Tensor, xi: usize) -> &mut f64 {
    match t {
        Tensor::Q => &mut c.q[xi],
        Tensor::K => &mut c.k[xi],
        Tensor::V => &mut c.v[xi],
        // Internal invariant: a dbias (and so this tensor) exists only when the spec, and so the case,
        // has a bias.
        Tensor::Bias => &mut c.bias.as_mut().expect("dbias implies a bias")[xi],
    }
}

/// Compare every gradient of `case` (dq, dk, dv, dbias) from [`backward_f64`] with finite differences
/// of [`Case::loss`] (central differences at steps `h` and `h/2`, Richardson-extrapolated), element by
/// element through the spec's offsets (so strided inputs are checked too). An entry passes when
/// `|analytic − fd| ≤ atol + rtol·max|analytic of that tensor|`. Returns the first failure.
pub fn check_gradients(case: &Case, h: f64, rtol: f64, atol: f64) -> Result<(), String> {
    let err = |e: attn_core::AttnError| e.to_string();
    let f = forward_f64(&case.spec, case.inputs()).map_err(err)?;
    let g = backward_f64(&case.spec, case.inputs(), &f.o, &case.d_o, &f.stats).map_err(err)?;
    let tensors = [
        ("dq", Tensor::Q, Some(&g.dq)),
        ("dk", Tensor::K, Some(&g.dk)),
        ("dv", Tensor::V, Some(&g.dv)),
        ("dbias", Tensor::Bias, g.dbias.as_ref()),
    ];
    let mut probe = case.clone();
    for (name, t, analytic) in tensors {
        let Some(analytic) = analytic else { continue };
        let scale = max_abs(analytic);
        for (xi, gi) in element_pairs(&case.spec, t) {
            let x0 = *slot(&mut probe, t, xi);
            let mut central = |step: f64| -> Result<f64, String> {
                *slot(&mut probe, t, xi) = x0 + step;
                let lp = probe.loss().map_err(err)?;
                *slot(&mut probe, t, xi) = x0 - step;
                let lm = probe.loss().map_err(err)?;
                *slot(&mut probe, t, xi) = x0;
                Ok((lp - lm) / (2.0 * step))
            };
            // Richardson extrapolation of two central differences: O(h⁴) truncation, so curvature
            // (l2 normalisation of a short vector, say) does not pass for a wrong gradient.
            let (coarse, fine) = (central(h)?, central(h / 2.0)?);
            let fd = (4.0 * fine - coarse) / 3.0;
            let an = analytic[gi];
            if (an - fd).abs() > atol + rtol * scale {
                return Err(format!(
                    "{name}[{gi}]: analytic {an:.9e} vs finite difference {fd:.9e} (tensor max {scale:.3e})"
                ));
            }
        }
    }
    Ok(())
}

/// The FlashAttention-style acceptance test: a result `got` passes against the f64 `reference` when
/// `max|got − ref| ≤ 2·max|baseline − ref| + atol`, where `baseline` is an honest computation in the
/// same storage dtype. Returns a description of the failure.
pub fn check_close(
    name: &str,
    got: &[f64],
    reference: &[f64],
    baseline: &[f64],
    atol: f64,
) -> Result<(), String> {
    if got.len() != reference.len() || baseline.len() != reference.len() {
        return Err(format!(
            "{name}: lengths differ: got {}, reference {}, baseline {}",
            got.len(),
            reference.len(),
            baseline.len()
        ));
    }
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        return Err(format!("{name}[{i}] is {} (not finite)", got[i]));
    }
    let err = max_abs_diff(got, reference);
    let base = max_abs_diff(baseline, reference);
    if err > 2.0 * base + atol {
        return Err(format!(
            "{name}: max error {err:.3e} > 2 × baseline error {base:.3e} + atol {atol:.1e}"
        ));
    }
    Ok(())
}
