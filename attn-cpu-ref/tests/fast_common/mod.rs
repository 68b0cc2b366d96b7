//! The comparison of the fast path with the f64 oracle, shared by the `fast_*` suites.
//!
//! Inputs are drawn by `testing::random_case`, rounded to the storage dtype `T`; the oracle is the
//! f64 reference on the rounded inputs. The fast path runs its forward, then its backward from its
//! own o and LSE (as attn-candle chains them). Every tensor follows REFERENCE.md's rule with the
//! GPU tests' naive same-dtype baseline (`testing::naive`: plain attention in `T`, f32 sums; every
//! family): error ≤ 2·err(naive) + atol. o and the LSE (Taylor: the denominator) take the GPU tests'
//! `atol = 4·u_T·max(|ref|, 1e-3)`; the gradients `(4·u_T + 64·√(Nk + D)·u_f32)·m`, `m` their largest
//! max|ref| (`GradTol::Shared`: the fast path forms `δ = dO·o` and `dP = dO·v` by different sums, so
//! a gradient that cancels to zero in the baseline, dq of a row that sees one key, keeps a rounding of
//! the other gradients' size).

#![allow(dead_code)]

use attn_core::{AttnSpec, DType, Element};
use attn_cpu_ref::testing::{naive, random_case, Case};
use attn_cpu_ref::{backward_f64, fast, forward_f64, Inputs};

/// `x` rounded to `T`, and the rounded values widened back to f64 (the oracle's inputs).
pub fn round<T: Element>(x: &[f64]) -> (Vec<T>, Vec<f64>) {
    let t: Vec<T> = x.iter().map(|&v| T::from_f64(v)).collect();
    let w = t.iter().map(|v| v.to_f64()).collect();
    (t, w)
}

fn widen<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
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
    let base = naive::baseline::<T>(spec, wide, &dow).map_err(e)?;
    let got = naive::Outputs {
        o: widen(&f.o),
        lse: f.stats.iter().map(|&x| x as f64).collect(),
        dq: widen(&g.dq),
        dk: widen(&g.dk),
        dv: widen(&g.dv),
        dbias: g.dbias.as_deref().map(widen),
    };
    let grad = naive::GradTol::Shared { extra: acc };
    naive::compare(spec, &got, &rf, &rg, &base, u, grad).map_err(ctx)
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

/// `f` run inside a rayon pool of `threads` threads (the fast path's partitions must not depend
/// on the count).
pub fn on_threads<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool")
        .install(f)
}
