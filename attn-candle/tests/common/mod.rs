//! Shared by the integration tests: run a call through candle autograd and compare it with
//! attn-cpu-ref on the same stored values.
//!
//! Two comparisons per output and gradient:
//! - bit-exact against `attn_cpu_ref::{forward, backward}` in the storage dtype (the op runs exactly
//!   that code, so any difference is a plumbing bug: strides, offsets, dtypes, the bias link, the
//!   saved statistics);
//! - against the f64 oracle (`forward_f64` / `backward_f64`) in f32, within a few rounding errors.
#![allow(dead_code)]

use attn_candle::{attention_with_stats, AttnOptions};
use attn_core::{AttnProblem, AttnSpec, Element};
use attn_cpu_ref::testing::{max_abs, max_abs_diff, random_case};
use attn_cpu_ref::Inputs;
use candle_core::{DType, Device, Result, Tensor, Var};

/// Everything a call produces, as f64 in the spec's layout.
#[derive(Debug)]
pub struct Outcome {
    pub o: Vec<f64>,
    pub stats: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
    pub dbias: Option<Vec<f64>>,
}

pub fn candle_dtype(d: attn_core::DType) -> DType {
    match d {
        attn_core::DType::F32 => DType::F32,
        attn_core::DType::F16 => DType::F16,
        attn_core::DType::BF16 => DType::BF16,
    }
}

/// The values of `t` (on any device) as f64, in logical order.
pub fn to_f64(t: &Tensor) -> Result<Vec<f64>> {
    t.to_device(&Device::Cpu)?
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()
}

/// The options that describe the same call as `p` (bias tensor added by the caller).
pub fn options_for(p: &AttnProblem) -> AttnOptions {
    AttnOptions {
        family: p.family,
        causal: p.causal,
        window: p.window,
        lengths: p.lengths.clone(),
        bias: None,
        layout: p.layout,
        deterministic: p.deterministic,
    }
}

/// A variable holding `x` rounded to `dtype`.
pub fn var(x: &[f64], shape: Vec<usize>, dtype: DType) -> Result<Var> {
    var_on(x, shape, dtype, &Device::Cpu)
}

/// A variable on `device` holding `x` rounded to `dtype` (rounded on the host, so every device
/// stores the same values).
pub fn var_on(x: &[f64], shape: Vec<usize>, dtype: DType, device: &Device) -> Result<Var> {
    let host = Tensor::from_vec(x.to_vec(), shape, &Device::Cpu)?.to_dtype(dtype)?;
    Var::from_tensor(&host.to_device(device)?)
}

/// The stored inputs of a call, as f64.
pub struct Stored {
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    pub bias: Option<Vec<f64>>,
    pub d_o: Vec<f64>,
}

/// The inputs of a call as variables (dO as a detached tensor).
pub struct Vars {
    pub q: Var,
    pub k: Var,
    pub v: Var,
    pub bias: Option<Var>,
    pub d_o: Tensor,
}

impl Stored {
    /// The values on `device` in the spec's storage dtype (rounded on the host, see [`var_on`]).
    pub fn to_vars(&self, spec: &AttnSpec, device: &Device) -> Result<Vars> {
        let dt = candle_dtype(spec.dtype());
        let bias = match (spec.bias(), &self.bias) {
            (Some(b), Some(x)) => Some(var_on(
                x,
                vec![b.batch, b.heads, spec.seq_q(), spec.seq_k()],
                dt,
                device,
            )?),
            _ => None,
        };
        Ok(Vars {
            q: var_on(&self.q, spec.q_shape(), dt, device)?,
            k: var_on(&self.k, spec.k_shape(), dt, device)?,
            v: var_on(&self.v, spec.v_shape(), dt, device)?,
            bias,
            d_o: var_on(&self.d_o, spec.o_shape(), dt, device)?
                .as_tensor()
                .detach(),
        })
    }
}

/// attn-cpu-ref in the storage dtype `E` on the stored values, on the path the CPU op takes: the
/// f32 `fast` path where it covers the family (every family today), else the reference.
pub fn reference<E: Element>(spec: &AttnSpec, s: &Stored) -> Outcome {
    let narrow = |x: &[f64]| x.iter().map(|&v| E::from_f64(v)).collect::<Vec<E>>();
    let widen = |x: &[E]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let (q, k, v, d_o) = (narrow(&s.q), narrow(&s.k), narrow(&s.v), narrow(&s.d_o));
    let bias = s.bias.as_deref().map(narrow);
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: bias.as_deref(),
    };
    let (f, g) = if attn_cpu_ref::fast::supports(spec) {
        let f = attn_cpu_ref::fast::forward::<E>(spec, x).expect("fast forward");
        let g = attn_cpu_ref::fast::backward::<E>(spec, x, &f.o, &d_o, &f.stats).expect("fast backward");
        (f, g)
    } else {
        let f = attn_cpu_ref::forward::<E>(spec, x).expect("reference forward");
        let g = attn_cpu_ref::backward::<E>(spec, x, &f.o, &d_o, &f.stats).expect("reference backward");
        (f, g)
    };
    Outcome {
        o: widen(&f.o),
        stats: f.stats.iter().map(|&x| x as f64).collect(),
        dq: widen(&g.dq),
        dk: widen(&g.dk),
        dv: widen(&g.dv),
        dbias: g.dbias.as_deref().map(widen),
    }
}

/// attn-cpu-ref in f64 on the stored values.
pub fn oracle(spec: &AttnSpec, s: &Stored) -> Outcome {
    let x = Inputs {
        q: &s.q,
        k: &s.k,
        v: &s.v,
        bias: s.bias.as_deref(),
    };
    let f = attn_cpu_ref::forward_f64(spec, x).expect("oracle forward");
    let g = attn_cpu_ref::backward_f64(spec, x, &f.o, &s.d_o, &f.stats).expect("oracle backward");
    Outcome {
        o: f.o,
        stats: f.stats,
        dq: g.dq,
        dk: g.dk,
        dv: g.dv,
        dbias: g.dbias,
    }
}

fn typed_reference(spec: &AttnSpec, s: &Stored) -> Outcome {
    match spec.dtype() {
        attn_core::DType::F32 => reference::<f32>(spec, s),
        attn_core::DType::F16 => reference::<half::f16>(spec, s),
        attn_core::DType::BF16 => reference::<half::bf16>(spec, s),
    }
}

/// Named pairs of (got, expected) for every output and gradient.
pub fn pairs<'a>(got: &'a Outcome, want: &'a Outcome) -> Vec<(&'static str, &'a [f64], &'a [f64])> {
    let mut v = vec![
        ("o", &got.o[..], &want.o[..]),
        ("dq", &got.dq[..], &want.dq[..]),
        ("dk", &got.dk[..], &want.dk[..]),
        ("dv", &got.dv[..], &want.dv[..]),
    ];
    match (&got.dbias, &want.dbias) {
        (Some(g), Some(w)) => v.push(("dbias", g, w)),
        (None, None) => {}
        _ => panic!("dbias present in one result only"),
    }
    v
}

/// Assert `got` equals the storage-dtype reference bit for bit.
pub fn assert_exact(what: &str, got: &Outcome, want: &Outcome) {
    for (name, g, w) in pairs(got, want) {
        assert_eq!(g.len(), w.len(), "{what}: {name} length");
        assert_eq!(
            max_abs_diff(g, w),
            0.0,
            "{what}: {name} differs from attn-cpu-ref"
        );
    }
    // −∞ (a row with no allowed key) compares equal to itself.
    assert_eq!(got.stats, want.stats, "{what}: stats differ from attn-cpu-ref");
}

/// Assert `got` (f32) is within a few rounding errors of the f64 oracle.
pub fn assert_near_oracle(what: &str, got: &Outcome, want: &Outcome) {
    for (name, g, w) in pairs(got, want) {
        let tol = 1e-5 * max_abs(w) + 1e-6;
        let err = max_abs_diff(g, w);
        assert!(
            err <= tol,
            "{what}: {name} max error {err:.3e} vs the f64 oracle > {tol:.3e}"
        );
    }
}

/// Run `problem` through `attention_with_stats` and candle autograd, with random inputs and a
/// random dO (never ones), and return what candle produced plus the stored inputs.
pub fn run_candle(problem: &AttnProblem, seed: u64) -> Result<(AttnSpec, Outcome, Stored)> {
    run_candle_on(problem, seed, &Device::Cpu)
}

/// [`run_candle`] with the tensors on `device`. The loss is `Σ o ⊙ R` for a random `R` (the
/// stored dO), so the upstream gradient of `o` is `R`.
pub fn run_candle_on(
    problem: &AttnProblem,
    seed: u64,
    device: &Device,
) -> Result<(AttnSpec, Outcome, Stored)> {
    let spec = problem.validate().map_err(attn_candle::to_candle)?;
    let case = random_case(&spec, seed);
    let Vars { q, k, v, bias, d_o } = Stored {
        q: case.q,
        k: case.k,
        v: case.v,
        bias: case.bias,
        d_o: case.d_o,
    }
    .to_vars(&spec, device)?;
    let mut opts = options_for(problem);
    opts.bias = bias.as_ref().map(|b| b.as_tensor().clone());
    let (o, stats) = attention_with_stats(q.as_tensor(), k.as_tensor(), v.as_tensor(), &opts)?;
    let grads = (&o * &d_o)?.sum_all()?.backward()?;
    let grad = |t: &Tensor, name: &str| -> Result<Vec<f64>> {
        match grads.get(t) {
            Some(g) => to_f64(g),
            None => candle_core::bail!("no gradient for {name}"),
        }
    };
    let got = Outcome {
        o: to_f64(&o)?,
        stats: to_f64(&stats)?,
        dq: grad(q.as_tensor(), "q")?,
        dk: grad(k.as_tensor(), "k")?,
        dv: grad(v.as_tensor(), "v")?,
        dbias: bias.as_ref().map(|b| grad(b.as_tensor(), "bias")).transpose()?,
    };
    let stored = Stored {
        q: to_f64(q.as_tensor())?,
        k: to_f64(k.as_tensor())?,
        v: to_f64(v.as_tensor())?,
        bias: bias.as_ref().map(|b| to_f64(b.as_tensor())).transpose()?,
        d_o: to_f64(&d_o)?,
    };
    Ok((spec, got, stored))
}

/// The standard check: candle's outputs and gradients equal attn-cpu-ref's in the storage dtype,
/// and (in f32) match the f64 oracle.
pub fn check(problem: &AttnProblem, seed: u64) -> Result<()> {
    let (spec, got, stored) = run_candle(problem, seed)?;
    let what = format!("{} {} {:?}", spec.family().label(), spec.dtype(), spec.causal());
    assert_exact(&what, &got, &typed_reference(&spec, &stored));
    if spec.dtype() == attn_core::DType::F32 {
        assert_near_oracle(&what, &got, &oracle(&spec, &stored));
    }
    Ok(())
}
