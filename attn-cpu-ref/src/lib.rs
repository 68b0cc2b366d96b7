//! # attn-cpu-ref
//!
//! The reference implementation of every attention family, forward and backward, on the CPU. It is
//! the oracle for every test in the workspace: inputs in f32, f16 or bf16 are widened to f64, every
//! sum is accumulated in f64, and results are rounded once at the end.
//!
//! Work is spread with rayon across (batch, head, query block) for the forward and dQ, and across
//! (batch, kv head, key block) for dK and dV (FlashAttention-2's split: no atomics, deterministic).
//! Nothing allocates an Nq×Nk buffer for the whole problem: softmax-like families keep one score
//! row per task, and Taylor attention runs through its factorised states (linear in N).
//!
//! Two entry points per pass: [`forward`] / [`backward`] on storage dtypes (statistics in f32, as the
//! kernels save them), and [`forward_f64`] / [`backward_f64`] on f64 data, which tests use as the
//! exact oracle. [`CpuRef`] implements [`attn_core::AttnBackend`] on host slices. [`decode`] is
//! Taylor's recurrent decode; [`kv_cache`] a softmax-like step against a contiguous or paged KV cache;
//! [`ring`] a context-parallel call's ring schedule run rank after rank (the sequential mode).

#![warn(missing_docs)]

use attn_core::{AttnBackend, AttnError, AttnSpec, BackwardIo, Element, ForwardIo, Pass, Result};

pub mod decode;
pub mod fast;
pub mod kv_cache;
#[cfg(test)]
mod proptest_config;
pub mod ring;
mod softmax_like;
mod taylor;
pub mod testing;

/// q, k, v and the optional bias of one call, laid out as the spec says.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a, T> {
    /// Queries, at least `spec.q_len()` elements.
    pub q: &'a [T],
    /// Keys, at least `spec.k_len()` elements.
    pub k: &'a [T],
    /// Values, at least `spec.v_len()` elements.
    pub v: &'a [T],
    /// Present exactly when the spec has a bias.
    pub bias: Option<&'a [T]>,
}

/// What a forward pass returns: o (`spec.o_len()`) and the statistics (`spec.stats_len()`: LSE for
/// the softmax-like families, the denominators for Taylor).
#[derive(Clone, Debug, PartialEq)]
pub struct Forward<T, S> {
    /// The output, contiguous in the spec's layout.
    pub o: Vec<T>,
    /// LSE (softmax-like families, −∞ for a row with no allowed key) or denominators (Taylor), one
    /// per query row and query head, indexed by `spec.stats_index`.
    pub stats: Vec<S>,
}

/// What a backward pass returns; `dbias` is present exactly when the spec has a bias.
#[derive(Clone, Debug, PartialEq)]
pub struct Gradients<T> {
    /// dL/dq, `spec.dq_len()` elements, contiguous in the spec's layout.
    pub dq: Vec<T>,
    /// dL/dk, `spec.dk_len()` elements, summed over each GQA group.
    pub dk: Vec<T>,
    /// dL/dv, `spec.dv_len()` elements, summed over each GQA group.
    pub dv: Vec<T>,
    /// dL/dbias, `spec.bias_len()` elements, summed over the broadcast dims.
    pub dbias: Option<Vec<T>>,
}

fn check_inputs<T>(spec: &AttnSpec, pass: Pass, x: &Inputs<'_, T>) -> Result<()> {
    spec.check_len(pass, "q", x.q.len(), spec.q_len())?;
    spec.check_len(pass, "k", x.k.len(), spec.k_len())?;
    spec.check_len(pass, "v", x.v.len(), spec.v_len())?;
    match (spec.bias(), x.bias) {
        (Some(_), Some(b)) => spec.check_len(pass, "bias", b.len(), spec.bias_len()),
        (None, None) => Ok(()),
        (Some(s), None) => Err(AttnError::ShapeMismatch {
            op: spec.op(pass),
            what: "bias".into(),
            expected: format!(
                "a bias of shape [{}, {}, {}, {}]",
                s.batch,
                s.heads,
                spec.seq_q(),
                spec.seq_k()
            ),
            got: "none".into(),
        }),
        (None, Some(b)) => Err(AttnError::ShapeMismatch {
            op: spec.op(pass),
            what: "bias".into(),
            expected: "no bias (the spec has none)".into(),
            got: format!("{} elements", b.len()),
        }),
    }
}

/// Whether the call has no query row or no key at all (a batch of 0, `seq_q = 0` or `seq_k = 0`,
/// or packed batches of such entries): its result needs no score, so every entry point returns it
/// before any sweep.
pub(crate) fn is_empty_call(spec: &AttnSpec) -> bool {
    spec.total_q() == 0 || spec.total_k() == 0
}

/// The forward of an empty call ([`is_empty_call`]): o zeros and every statistic that of a row with
/// no allowed key: `lse_none` (−∞) for the softmax-like families, `den_none` (0) for Taylor. Both
/// are empty when there is no query row.
pub(crate) fn empty_forward<T: Clone, S: Clone>(
    spec: &AttnSpec,
    zero: T,
    lse_none: S,
    den_none: S,
) -> Forward<T, S> {
    let no_key = if spec.family().is_softmax_like() {
        lse_none
    } else {
        den_none
    };
    Forward {
        o: vec![zero; spec.o_len()],
        stats: vec![no_key; spec.stats_len()],
    }
}

/// The gradients of an empty call ([`is_empty_call`]): zeros of the spec's lengths (empty where
/// the side is empty).
pub(crate) fn empty_gradients<T: Clone>(spec: &AttnSpec, zero: T) -> Gradients<T> {
    Gradients {
        dq: vec![zero.clone(); spec.dq_len()],
        dk: vec![zero.clone(); spec.dk_len()],
        dv: vec![zero.clone(); spec.dv_len()],
        dbias: spec.bias().map(|_| vec![zero; spec.bias_len()]),
    }
}

/// Forward pass on f64 data: the exact oracle. Statistics in f64.
pub fn forward_f64(spec: &AttnSpec, x: Inputs<'_, f64>) -> Result<Forward<f64, f64>> {
    check_inputs(spec, Pass::Forward, &x)?;
    if is_empty_call(spec) {
        return Ok(empty_forward(spec, 0.0, f64::NEG_INFINITY, 0.0));
    }
    let mut o = vec![0.0; spec.o_len()];
    let mut stats = vec![0.0; spec.stats_len()];
    if spec.family().is_softmax_like() {
        softmax_like::forward(spec, &x, &mut o, &mut stats);
    } else {
        taylor::forward(spec, &x, &mut o, &mut stats);
    }
    Ok(Forward { o, stats })
}

/// Backward pass on f64 data, given the forward's `o` and statistics.
pub fn backward_f64(
    spec: &AttnSpec,
    x: Inputs<'_, f64>,
    o: &[f64],
    d_o: &[f64],
    stats: &[f64],
) -> Result<Gradients<f64>> {
    check_inputs(spec, Pass::Backward, &x)?;
    spec.check_len(Pass::Backward, "o", o.len(), spec.o_len())?;
    spec.check_len(Pass::Backward, "d_o", d_o.len(), spec.o_len())?;
    spec.check_len(Pass::Backward, "stats", stats.len(), spec.stats_len())?;
    if is_empty_call(spec) {
        return Ok(empty_gradients(spec, 0.0));
    }
    let mut g = Gradients {
        dq: vec![0.0; spec.dq_len()],
        dk: vec![0.0; spec.dk_len()],
        dv: vec![0.0; spec.dv_len()],
        dbias: spec.bias().map(|_| vec![0.0; spec.bias_len()]),
    };
    if spec.family().is_softmax_like() {
        softmax_like::backward(spec, &x, o, d_o, stats, &mut g);
    } else {
        taylor::backward(spec, &x, o, d_o, stats, &mut g);
    }
    Ok(g)
}

fn widen<E: Element>(x: &[E]) -> Vec<f64> {
    x.iter().map(|e| e.to_f64()).collect()
}

fn narrow<E: Element>(x: &[f64]) -> Vec<E> {
    x.iter().map(|&e| E::from_f64(e)).collect()
}

fn check_dtype<E: Element>(spec: &AttnSpec, pass: Pass) -> Result<()> {
    if E::DTYPE != spec.dtype() {
        return Err(AttnError::InvalidArgument {
            op: spec.op(pass),
            arg: "dtype",
            reason: format!("buffers are {} but the spec says {}", E::DTYPE, spec.dtype()),
        });
    }
    Ok(())
}

/// Forward pass on storage-dtype data: f64 inside, o rounded to `E`, statistics to f32.
pub fn forward<E: Element>(spec: &AttnSpec, x: Inputs<'_, E>) -> Result<Forward<E, f32>> {
    check_dtype::<E>(spec, Pass::Forward)?;
    if is_empty_call(spec) {
        check_inputs(spec, Pass::Forward, &x)?;
        return Ok(empty_forward(spec, E::from_f64(0.0), f32::NEG_INFINITY, 0.0));
    }
    let (q, k, v) = (widen(x.q), widen(x.k), widen(x.v));
    let bias = x.bias.map(widen);
    let f = forward_f64(
        spec,
        Inputs {
            q: &q,
            k: &k,
            v: &v,
            bias: bias.as_deref(),
        },
    )?;
    Ok(Forward {
        o: narrow(&f.o),
        stats: f.stats.iter().map(|&s| s as f32).collect(),
    })
}

/// Backward pass on storage-dtype data: f64 inside, gradients rounded to `E`.
pub fn backward<E: Element>(
    spec: &AttnSpec,
    x: Inputs<'_, E>,
    o: &[E],
    d_o: &[E],
    stats: &[f32],
) -> Result<Gradients<E>> {
    check_dtype::<E>(spec, Pass::Backward)?;
    if is_empty_call(spec) {
        check_inputs(spec, Pass::Backward, &x)?;
        spec.check_len(Pass::Backward, "o", o.len(), spec.o_len())?;
        spec.check_len(Pass::Backward, "d_o", d_o.len(), spec.o_len())?;
        spec.check_len(Pass::Backward, "stats", stats.len(), spec.stats_len())?;
        return Ok(empty_gradients(spec, E::from_f64(0.0)));
    }
    let (q, k, v) = (widen(x.q), widen(x.k), widen(x.v));
    let bias = x.bias.map(widen);
    let stats: Vec<f64> = stats.iter().map(|&s| s as f64).collect();
    let g = backward_f64(
        spec,
        Inputs {
            q: &q,
            k: &k,
            v: &v,
            bias: bias.as_deref(),
        },
        &widen(o),
        &widen(d_o),
        &stats,
    )?;
    Ok(Gradients {
        dq: narrow(&g.dq),
        dk: narrow(&g.dk),
        dv: narrow(&g.dv),
        dbias: g.dbias.as_deref().map(narrow),
    })
}

/// The CPU reference as an [`AttnBackend`] on host slices.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuRef;

impl<E: Element> AttnBackend<[E], [f32]> for CpuRef {
    type Error = AttnError;

    fn name(&self) -> &'static str {
        "attn-cpu-ref"
    }

    fn forward(&self, spec: &AttnSpec, io: ForwardIo<'_, [E], [f32]>) -> Result<()> {
        spec.check_len(Pass::Forward, "o", io.o.len(), spec.o_len())?;
        spec.check_len(Pass::Forward, "stats", io.stats.len(), spec.stats_len())?;
        let f = forward(
            spec,
            Inputs {
                q: io.q,
                k: io.k,
                v: io.v,
                bias: io.bias,
            },
        )?;
        io.o[..f.o.len()].copy_from_slice(&f.o);
        io.stats[..f.stats.len()].copy_from_slice(&f.stats);
        Ok(())
    }

    fn backward(&self, spec: &AttnSpec, io: BackwardIo<'_, [E], [f32]>) -> Result<()> {
        spec.check_len(Pass::Backward, "dq", io.dq.len(), spec.dq_len())?;
        spec.check_len(Pass::Backward, "dk", io.dk.len(), spec.dk_len())?;
        spec.check_len(Pass::Backward, "dv", io.dv.len(), spec.dv_len())?;
        let g = backward(
            spec,
            Inputs {
                q: io.q,
                k: io.k,
                v: io.v,
                bias: io.bias,
            },
            io.o,
            io.d_o,
            io.stats,
        )?;
        io.dq[..g.dq.len()].copy_from_slice(&g.dq);
        io.dk[..g.dk.len()].copy_from_slice(&g.dk);
        io.dv[..g.dv.len()].copy_from_slice(&g.dv);
        match (io.dbias, g.dbias) {
            (Some(dst), Some(src)) => {
                spec.check_len(Pass::Backward, "dbias", dst.len(), src.len())?;
                dst[..src.len()].copy_from_slice(&src);
                Ok(())
            }
            (None, None) => Ok(()),
            (dst, _) => Err(AttnError::ShapeMismatch {
                op: spec.op(Pass::Backward),
                what: "dbias".into(),
                expected: if spec.bias().is_some() {
                    format!("a dbias buffer of {} elements", spec.bias_len())
                } else {
                    "no dbias buffer (the spec has no bias)".into()
                },
                got: if dst.is_some() {
                    "a buffer".into()
                } else {
                    "none".into()
                },
            }),
        }
    }
}
