//! The GPU check of one call: the op on CUDA tensors through `attention_with_stats` and candle
//! autograd (loss `Σ o ⊙ R`, R random), against
//! - the f64 oracle (attn-cpu-ref `forward_f64` / `backward_f64` on the stored values), under
//!   docs/math.md's `err ≤ 2·err(naive) + atol` with the naive baseline of [`crate::naive`] and
//!   `atol = 4·u·max|ref|` (u: the storage dtype's unit roundoff);
//! - the same op on CPU tensors (attn-cpu-ref in the storage dtype): within the same bound plus
//!   the CPU result's own error.
//!
//! The saved statistics (LSE, Taylor's den) are checked the same way, with `−∞` required exactly
//! where the oracle has it.

use crate::common::{oracle, pairs, run_candle_on, Outcome};
use crate::naive::naive;
use attn_core::{AttnError, AttnProblem, AttnSpec, Op};
use attn_cpu_ref::testing::{check_close, max_abs, max_abs_diff};
use candle_core::{Device, Result};
use std::sync::OnceLock;

/// CUDA device 0 of this test process. GPU tests are `#[ignore]`d and run only when asked for
/// (`--ignored`), on a machine that has one: without it they fail with this message.
pub fn gpu() -> Device {
    static GPU: OnceLock<Device> = OnceLock::new();
    GPU.get_or_init(|| match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => panic!("the CUDA tests need a CUDA GPU: {e}"),
    })
    .clone()
}

/// Whether a candle error carries attn-cuda's typed `Unsupported` error for `op`. Candle keeps a
/// wrapped error only as `Display`, so this matches the typed error's rendering: the prefix
/// `AttnError::Unsupported` writes for that op and backend.
pub fn is_unsupported(e: &candle_core::Error, op: Op) -> bool {
    let prefix = AttnError::Unsupported {
        op,
        backend: "attn-cuda",
        what: String::new(),
    }
    .to_string();
    e.to_string().contains(&prefix)
}

/// `atol = 4·u·max|ref|` (at least `4·u·10⁻³`).
fn atol(spec: &AttnSpec, reference: &[f64]) -> f64 {
    4.0 * spec.dtype().unit_roundoff() * max_abs(reference).max(1e-3)
}

/// The finite entries of (got, reference, baseline); `−∞` must appear in `got` exactly where it is
/// in the reference (rows with no allowed key).
fn finite_stats(
    got: &[f64],
    reference: &[f64],
    baseline: &[f64],
) -> std::result::Result<[Vec<f64>; 3], String> {
    let mut out: [Vec<f64>; 3] = Default::default();
    for (i, (&g, &r)) in got.iter().zip(reference).enumerate() {
        if r == f64::NEG_INFINITY || g == f64::NEG_INFINITY {
            if g != r {
                return Err(format!("stats[{i}]: got {g}, reference {r}"));
            }
            continue;
        }
        out[0].push(g);
        out[1].push(r);
        out[2].push(if baseline[i].is_finite() { baseline[i] } else { r });
    }
    Ok(out)
}

/// Every output and gradient of `got` against the oracle `want` with the baseline `base`, and
/// against the CPU op's `cpu`.
fn compare(
    spec: &AttnSpec,
    got: &Outcome,
    want: &Outcome,
    base: &Outcome,
    cpu: &Outcome,
) -> std::result::Result<(), String> {
    let named = pairs(got, want)
        .into_iter()
        .zip(pairs(base, cpu))
        .map(|((name, g, w), (_, b, c))| (name, g.to_vec(), w.to_vec(), b.to_vec(), c.to_vec()));
    let [g, w, b] = finite_stats(&got.stats, &want.stats, &base.stats)?;
    let [c, _, _] = finite_stats(&cpu.stats, &want.stats, &base.stats)?;
    for (name, g, w, b, c) in named.chain(std::iter::once(("stats", g, w, b, c))) {
        if let Some(i) = b.iter().position(|x| !x.is_finite()) {
            return Err(format!("{name}: the naive baseline is {} at {i}", b[i]));
        }
        let tol = atol(spec, &w);
        check_close(name, &g, &w, &b, tol)?;
        // The CPU op is within a few roundings of the oracle; the GPU may differ from it by its own
        // allowance plus the CPU's error.
        let allowed = 2.0 * max_abs_diff(&b, &w) + tol + max_abs_diff(&c, &w);
        let diff = max_abs_diff(&g, &c);
        if diff > allowed {
            return Err(format!("{name}: max |cuda − cpu| = {diff:.3e} > {allowed:.3e}"));
        }
    }
    Ok(())
}

/// Run `problem` on the GPU and on the CPU with the same seeded inputs and check the GPU's outputs
/// and gradients (see the module docs). The error of a failed run is returned as it is, so callers
/// can require a particular one (an unsupported family).
pub fn check(problem: &AttnProblem, seed: u64) -> Result<()> {
    check_on(problem, seed, &gpu())
}

/// [`check`] with the op and the baseline on `dev` (the CPU, to test the harness itself).
pub fn check_on(problem: &AttnProblem, seed: u64, dev: &Device) -> Result<()> {
    let (spec, got, stored) = run_candle_on(problem, seed, dev)?;
    let (_, cpu, _) = run_candle_on(problem, seed, &Device::Cpu)?;
    let want = oracle(&spec, &stored);
    let base = naive(&spec, &stored, dev)?;
    let what = format!(
        "{} {} {:?} {:?} q {:?}",
        spec.family().label(),
        spec.dtype(),
        spec.causal(),
        spec.lengths(),
        spec.q_shape()
    );
    if let Err(e) = compare(&spec, &got, &want, &base, &cpu) {
        panic!("{what}: {e}");
    }
    Ok(())
}
