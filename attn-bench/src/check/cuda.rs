//! `check --device cuda` (feature `cuda`): the file's tensors through attn-cuda's `AttnBackend`
//! entry points on GPU 0, exactly as a user calls them.
//!
//! q, k, v, the bias and dO are uploaded as stored; o, the statistics and every gradient are
//! filled with NaN before the launch, so an element the kernels do not write shows as NaN in the
//! output file and as a non-finite mismatch in the comparison. The backward starts from attn-cuda's
//! own forward (`o` and statistics), as in training. One synchronisation after the launches, then
//! the outputs are copied back.

use super::{outputs, reference_comparisons, Comparison, HostInputs, Out, Reader, Stored};
use crate::error::BenchError;
use crate::gpu::{gpu, Gpu};
use attn_core::{bf16, f16, AttnBackend, AttnSpec, BackwardIo, DType, ForwardIo};
use attn_cpu_ref::{Forward, Gradients};
use attn_cuda::cudarc::driver::CudaSlice;
use attn_cuda::DeviceElem;

/// The shared GPU handle, or why attn-cuda cannot run here (no driver or GPU, no kernels in this
/// build) as a typed error.
pub(super) fn gpu_handle() -> Result<&'static Gpu, BenchError> {
    gpu().map_err(|reason| BenchError::Unavailable {
        implementation: "attn-cuda",
        reason,
    })
}

/// attn-cuda's outputs for the file's call and, when `reference`, their comparison with the f64
/// reference.
pub(super) fn run(
    r: &Reader<'_>,
    spec: &AttnSpec,
    reference: bool,
) -> Result<(Vec<Out>, Vec<Comparison>), BenchError> {
    let g = gpu_handle()?;
    match spec.dtype() {
        DType::F32 => run_typed::<f32>(g, r, spec, reference),
        DType::F16 => run_typed::<f16>(g, r, spec, reference),
        DType::BF16 => run_typed::<bf16>(g, r, spec, reference),
    }
}

/// A device buffer of `len` NaNs (written over by the kernels).
fn poisoned<T: DeviceElem>(g: &Gpu, len: usize) -> Result<CudaSlice<T>, BenchError> {
    Ok(g.stream().clone_htod(&vec![T::from_f64(f64::NAN); len])?)
}

fn run_typed<E: Stored + DeviceElem>(
    g: &Gpu,
    r: &Reader<'_>,
    spec: &AttnSpec,
    reference: bool,
) -> Result<(Vec<Out>, Vec<Comparison>), BenchError> {
    let x = HostInputs::<E>::read(r)?;
    let s = g.stream();
    let q = s.clone_htod(&x.q)?;
    let k = s.clone_htod(&x.k)?;
    let v = s.clone_htod(&x.v)?;
    let bias = x.bias.as_deref().map(|b| s.clone_htod(b)).transpose()?;
    let mut o = poisoned::<E>(g, spec.o_len())?;
    let mut stats = poisoned::<f32>(g, spec.stats_len())?;
    g.attn.forward(
        spec,
        ForwardIo {
            q: &q,
            k: &k,
            v: &v,
            bias: bias.as_ref(),
            o: &mut o,
            stats: &mut stats,
        },
    )?;
    let grads = match x.d_o.as_deref() {
        None => None,
        Some(d_o) => {
            let d_o = s.clone_htod(d_o)?;
            let mut dq = poisoned::<E>(g, spec.dq_len())?;
            let mut dk = poisoned::<E>(g, spec.dk_len())?;
            let mut dv = poisoned::<E>(g, spec.dv_len())?;
            let mut dbias = spec
                .bias()
                .map(|_| poisoned::<E>(g, spec.bias_len()))
                .transpose()?;
            g.attn.backward(
                spec,
                BackwardIo {
                    q: &q,
                    k: &k,
                    v: &v,
                    bias: bias.as_ref(),
                    o: &o,
                    d_o: &d_o,
                    stats: &stats,
                    dq: &mut dq,
                    dk: &mut dk,
                    dv: &mut dv,
                    dbias: dbias.as_mut(),
                },
            )?;
            Some((dq, dk, dv, dbias))
        }
    };
    s.synchronize()?;
    let f = Forward {
        o: s.clone_dtoh(&o)?,
        stats: s.clone_dtoh(&stats)?,
    };
    let grads = match grads {
        None => None,
        Some((dq, dk, dv, dbias)) => Some(Gradients {
            dq: s.clone_dtoh(&dq)?,
            dk: s.clone_dtoh(&dk)?,
            dv: s.clone_dtoh(&dv)?,
            dbias: dbias.map(|db| s.clone_dtoh(&db)).transpose()?,
        }),
    };
    let comparisons = if reference {
        reference_comparisons(spec, &x, &f, grads.as_ref())?
    } else {
        Vec::new()
    };
    Ok((outputs(spec, &f, grads.as_ref()), comparisons))
}
