//! The comparison of the fast path with the f64 oracle, shared by the `fast_*` suites.
//!
//! Inputs are drawn by `testing::random_case`, rounded to the storage dtype `T`; the oracle is the
//! f64 reference on the rounded inputs. The fast path runs its forward, then its backward from its
//! own o and LSE (as attn-candle chains them). Every tensor follows REFERENCE.md's rule with the
//! GPU tests' naive same-dtype baseline (`testing::naive`: plain attention in `T`, f32 sums): error
//! ≤ 2·err(naive) + atol. o and the LSE take the GPU tests' `atol = 4·u_T·max(|ref|, 1e-3)`; the
//! gradients `(4·u_T + 64·√(Nk + D)·u_f32)·m`, `m` their largest max|ref| (`GradTol::Shared`: the
//! fast path forms `δ = dO·o` and `dP = dO·v` by different sums, so a gradient that cancels to
//! zero in the baseline, dq of a row that sees one key, keeps a rounding of the other gradients'
//! size). Taylor has no naive baseline; there the baseline is the oracle rounded once to `T`, with
//! the same `atol` for every tensor, relative to max|den| for the denominator (which, unlike an
//! LSE, scales with its rows).

#![allow(dead_code)]

use attn_core::{AttnSpec, DType, Element};
use attn_cpu_ref::testing::{check_close, max_abs, naive, random_case, Case};
use attn_cpu_ref::{backward_f64, fast, forward_f64, Inputs};

fn round<T: Element>(x: &[f64]) -> (Vec<T>, Vec<f64>) {
    let t: Vec<T> = x.iter().map(|&v| T::from_f64(v)).collect();
    let w = t.iter().map(|v| v.to_f64()).collect();
    (t, w)
}

fn widen<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// The oracle rounded once to `T`.
fn rounded<T: Element>(x: &[f64]) -> Vec<f64> {
    round::<T>(x).1
}

/// Compare the LSE: −∞ exactly where the oracle has an empty row, close elsewhere (the baseline
/// the oracle rounded to f32).
fn check_lse(got: &[f32], reference: &[f64], atol: f64) -> Result<(), String> {
    let got: Vec<f64> = got.iter().map(|&x| x as f64).collect();
    let base: Vec<f64> = reference.iter().map(|&v| v as f32 as f64).collect();
    naive::check_lse(&got, reference, &base, atol)
}

/// Run one case in storage dtype `T` (the spec's dtype) and compare every output and gradient;
/// `what` names the case in a failure.
pub fn check_case<T: Element>(spec: &AttnSpec, case: &Case, what: &str) -> Result<(), String> {
    let (q, qw) = round::<T>(&case.q);
    let (k, kw) = round::<T>(&case.k);
    let (v, vw) = round::<T>(&case.v);
    let (d_o, dow) = round::<T>(&case.d_o);
    let bias = case.bias.as_deref().map(round::<T>);
    let e = |e: attn_core::AttnError| e.to_string();
    let wide = Inputs {
        q: &qw,
        k: &kw,
        v: &vw,
        bias: bias.as_ref().map(|b| b.1.as_slice()),
    };
    let rf = forward_f64(spec, wide).map_err(e)?;
    let rg = backward_f64(spec, wide, &rf.o, &dow, &rf.stats).map_err(e)?;
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: bias.as_ref().map(|b| b.0.as_slice()),
    };
    let f = fast::forward(spec, x).map_err(e)?;
    let g = fast::backward(spec, x, &f.o, &d_o, &f.stats).map_err(e)?;
    let ctx = |m: String| {
        format!(
            "{what}: {} {} q{:?} k{:?} causal {:?} window {:?}: {m}",
            spec.family().label(),
            T::DTYPE,
            spec.q_shape(),
            spec.k_shape(),
            spec.causal(),
            spec.window()
        )
    };
    let u = T::DTYPE.unit_roundoff();
    // f32 accumulation over dot products of length D and sums over Nk keys.
    let acc = 64.0 * ((spec.seq_k() + spec.head_dim()) as f64).sqrt() * DType::F32.unit_roundoff();
    if let Some(base) = naive::baseline::<T>(spec, wide, &dow) {
        let got = naive::Outputs {
            o: widen(&f.o),
            lse: f.stats.iter().map(|&x| x as f64).collect(),
            dq: widen(&g.dq),
            dk: widen(&g.dk),
            dv: widen(&g.dv),
            dbias: g.dbias.as_deref().map(widen),
        };
        let grad = naive::GradTol::Shared { extra: acc };
        return naive::compare(&got, &rf, &rg, &base, u, grad).map_err(ctx);
    }
    // Taylor: no naive baseline. The baseline is the oracle rounded once to T (its backward from o
    // rounded to T, as every storage-dtype backward starts). The denominator, unlike an LSE, scales
    // with its rows: its atol is relative to max|den|.
    let bg = backward_f64(spec, wide, &rounded::<T>(&rf.o), &dow, &rf.stats).map_err(e)?;
    let atol = |scale: f64| (4.0 * u + acc) * scale.max(1e-3);
    // Gradients share one scale: a gradient that is zero in exact arithmetic (cosine-sim's dk
    // through the l2-norm at D = 1, say) is a cancellation of terms of the size of the others.
    let gscale = [Some(&rg.dq), Some(&rg.dk), Some(&rg.dv), rg.dbias.as_ref()]
        .iter()
        .flatten()
        .map(|g| max_abs(g))
        .fold(0.0, f64::max);
    let cmp = |name: &str, got: &[T], r: &[f64], base: &[f64], tol: f64| {
        check_close(name, &widen(got), r, &rounded::<T>(base), tol).map_err(ctx)
    };
    cmp("o", &f.o, &rf.o, &rf.o, atol(max_abs(&rf.o)))?;
    let den: Vec<f64> = f.stats.iter().map(|&x| x as f64).collect();
    let den_base: Vec<f64> = rf.stats.iter().map(|&x| x as f32 as f64).collect();
    check_close("den", &den, &rf.stats, &den_base, atol(max_abs(&rf.stats))).map_err(ctx)?;
    cmp("dq", &g.dq, &rg.dq, &bg.dq, atol(gscale))?;
    cmp("dk", &g.dk, &rg.dk, &bg.dk, atol(gscale))?;
    cmp("dv", &g.dv, &rg.dv, &bg.dv, atol(gscale))?;
    match (&g.dbias, &rg.dbias, &bg.dbias) {
        (Some(a), Some(r), Some(b)) => cmp("dbias", a, r, b, atol(gscale))?,
        (None, None, None) => {}
        _ => return Err(ctx("dbias present on one side only".into())),
    }
    Ok(())
}

/// [`check_case`] on the seeded random case of `spec`, in the spec's dtype.
pub fn check(spec: &AttnSpec, seed: u64) -> Result<(), String> {
    let case = random_case(spec, seed);
    let what = format!("seed {seed}");
    match spec.dtype() {
        DType::F32 => check_case::<f32>(spec, &case, &what),
        DType::F16 => check_case::<half::f16>(spec, &case, &what),
        DType::BF16 => check_case::<half::bf16>(spec, &case, &what),
    }
}
