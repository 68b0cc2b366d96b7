//! The ops' CUDA path: attn-cuda's kernels launched on candle's own stream.
//!
//! The math is the CPU path's (see the parent module): the forward computes `o` and saves the
//! statistics (`LSE_i` for softmax and cosine-sim, `den_i` for Taylor; f32), the backward turns
//! `g = dL/do` and those statistics into `dq`, `dk`, `dv` (and `dbias`). attn-cuda runs each pass
//! on the stream of the inputs' `CudaDevice`, so it is ordered with candle's own kernels and needs
//! no synchronisation.
//!
//! Inputs are read in place: each is a view starting at its layout's start offset, addressed with
//! the spec's strides (taken from the same layouts). Outputs are fresh buffers of the device,
//! wrapped as candle storage. A family, head dim or option attn-cuda does not implement is its
//! typed `Unsupported` error, extended with the call's shapes; nothing falls back to a composite.

use super::{lock, Call, Grads};
use crate::error::{internal, to_candle};
use attn_core::{shape_str, AttnError, AttnSpec, Pass};
use attn_cuda::cudarc::driver::{CudaView, DeviceRepr};
use attn_cuda::{BackwardViews, CudaAttn, CudaAttnError, DeviceElem, ForwardViews};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Device, Layout, Result, Shape, Storage, Tensor};

/// `q [..], k [..], v [..]` of a call, for messages.
fn shapes(spec: &AttnSpec) -> String {
    format!(
        "q {}, k {}, v {}",
        shape_str(&spec.q_shape()),
        shape_str(&spec.k_shape()),
        shape_str(&spec.v_shape())
    )
}

/// attn-cuda's error as an [`AttnError`] naming the op and the call's shapes. `Unsupported` stays
/// `Unsupported` (callers can match on it); driver errors become `Backend` errors.
fn cuda_error(spec: &AttnSpec, pass: Pass, e: CudaAttnError) -> candle_core::Error {
    let e = match e {
        CudaAttnError::Attn(AttnError::Unsupported { op, backend, what }) => AttnError::Unsupported {
            op,
            backend,
            what: format!("{what} ({})", shapes(spec)),
        },
        CudaAttnError::Attn(e) => e,
        other => AttnError::Backend {
            op: spec.op(pass),
            backend: "attn-cuda",
            message: format!("{other} ({})", shapes(spec)),
        },
    };
    to_candle(e)
}

/// The elements of a CUDA buffer from `layout`'s start offset on.
fn from_offset<'a, E: CudaDType + DeviceRepr>(
    spec: &AttnSpec,
    pass: Pass,
    what: &str,
    storage: &'a CudaStorage,
    layout: &Layout,
) -> Result<CudaView<'a, E>> {
    let slice = storage.as_cuda_slice::<E>()?;
    let start = layout.start_offset();
    if start > slice.len() {
        return Err(internal(
            spec.op(pass),
            format!(
                "`{what}` starts at element {start} of a buffer of {}",
                slice.len()
            ),
        ));
    }
    Ok(slice.slice(start..))
}

/// The CUDA storage of a tensor the call holds (inputs, output, gradient, statistics).
fn cuda_storage<'a>(
    spec: &AttnSpec,
    pass: Pass,
    what: &str,
    storage: &'a Storage,
) -> Result<&'a CudaStorage> {
    match storage {
        Storage::Cuda(s) => Ok(s),
        other => Err(to_candle(AttnError::InvalidArgument {
            op: spec.op(pass),
            arg: "device",
            reason: format!(
                "`{what}` is on {:?} while the call runs on CUDA ({})",
                other.device().location(),
                shapes(spec)
            ),
        })),
    }
}

/// A buffer of `len` elements (at least one) that attn-cuda overwrites completely.
fn output<E: DeviceRepr>(dev: &CudaDevice, len: usize) -> Result<attn_cuda::cudarc::driver::CudaSlice<E>> {
    // SAFETY: every buffer allocated here is an output of attn-cuda's forward or backward, which
    // writes every element its spec addresses (o and the statistics for every query row, zeros for
    // rows with no key; dq, dk, dv for every row, zeros where no pair contributes; dbias whole);
    // attn-cuda's GPU tests poison these buffers with NaN to hold it to that. The buffer is wrapped
    // as a tensor only after the launch is enqueued on the same stream.
    unsafe { dev.alloc::<E>(len.max(1)) }
}

/// A fresh tensor around a device buffer.
fn wrap<E: CudaDType>(
    slice: attn_cuda::cudarc::driver::CudaSlice<E>,
    dev: &CudaDevice,
    shape: impl Into<Shape>,
) -> Tensor {
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, dev.clone()));
    Tensor::from_storage(storage, shape, BackpropOp::none(), false)
}

impl Call {
    /// The forward on candle's stream: `o` as new storage, the statistics kept in the call.
    pub(super) fn forward_cuda<E: DeviceElem + CudaDType>(
        &self,
        q: (&CudaStorage, &Layout),
        k: (&CudaStorage, &Layout),
        v: (&CudaStorage, &Layout),
    ) -> Result<CudaStorage> {
        let (spec, pass) = (&self.spec, Pass::Forward);
        let dev = q.0.device().clone();
        let backend = CudaAttn::with_stream(dev.cuda_stream());
        let bias = self.bias.as_ref().map(Tensor::storage_and_layout);
        let bias = match &bias {
            Some((s, l)) => Some(from_offset::<E>(
                spec,
                pass,
                "bias",
                cuda_storage(spec, pass, "bias", s)?,
                l,
            )?),
            None => None,
        };
        let mut o = output::<E>(&dev, spec.o_len())?;
        let mut stats = output::<f32>(&dev, spec.stats_len())?;
        backend
            .forward_views(
                spec,
                ForwardViews {
                    q: from_offset(spec, pass, "q", q.0, q.1)?,
                    k: from_offset(spec, pass, "k", k.0, k.1)?,
                    v: from_offset(spec, pass, "v", v.0, v.1)?,
                    bias,
                    o: o.slice_mut(..),
                    lse: stats.slice_mut(..),
                },
            )
            .map_err(|e| cuda_error(spec, pass, e))?;
        *lock(&self.stats) = Some(wrap(stats, &dev, self.stats_shape()));
        Ok(CudaStorage::wrap_cuda_slice(o, dev))
    }

    /// The backward on candle's stream, from the forward's statistics.
    pub(super) fn backward_cuda<E: DeviceElem + CudaDType>(
        &self,
        dev: &CudaDevice,
        o: &Tensor,
        d_o: &Tensor,
        stats: &Tensor,
    ) -> Result<Grads> {
        let (spec, pass) = (&self.spec, Pass::Backward);
        let backend = CudaAttn::with_stream(dev.cuda_stream());
        let held = [
            ("q", &self.q),
            ("k", &self.k),
            ("v", &self.v),
            ("o", o),
            ("d_o", d_o),
        ]
        .map(|(what, t)| (what, t.storage_and_layout()));
        let mut views = Vec::with_capacity(held.len());
        for (what, (s, l)) in &held {
            views.push(from_offset::<E>(
                spec,
                pass,
                what,
                cuda_storage(spec, pass, what, s)?,
                l,
            )?);
        }
        let [q, k, v, o_view, d_o_view]: [CudaView<'_, E>; 5] = views
            .try_into()
            .map_err(|_| internal(spec.op(pass), "five input views expected".into()))?;
        let (ss, sl) = stats.storage_and_layout();
        let lse = from_offset::<f32>(spec, pass, "stats", cuda_storage(spec, pass, "stats", &ss)?, sl)?;
        let bias = self.bias.as_ref().map(Tensor::storage_and_layout);
        let bias = match &bias {
            Some((s, l)) => Some(from_offset::<E>(
                spec,
                pass,
                "bias",
                cuda_storage(spec, pass, "bias", s)?,
                l,
            )?),
            None => None,
        };
        let mut dq = output::<E>(dev, spec.dq_len())?;
        let mut dk = output::<E>(dev, spec.dk_len())?;
        let mut dv = output::<E>(dev, spec.dv_len())?;
        let mut dbias = match &self.bias {
            Some(_) => Some(output::<E>(dev, spec.bias_len())?),
            None => None,
        };
        backend
            .backward_views(
                spec,
                BackwardViews {
                    q,
                    k,
                    v,
                    bias,
                    o: o_view,
                    d_o: d_o_view,
                    lse,
                    dq: dq.slice_mut(..),
                    dk: dk.slice_mut(..),
                    dv: dv.slice_mut(..),
                    dbias: dbias.as_mut().map(|d| d.slice_mut(..)),
                },
            )
            .map_err(|e| cuda_error(spec, pass, e))?;
        let dbias = match (dbias, &self.bias) {
            (Some(d), Some(b)) => Some(wrap(d, dev, b.shape().clone())),
            _ => None,
        };
        Ok(Grads {
            dq: wrap(dq, dev, self.q.shape().clone()),
            dk: wrap(dk, dev, self.k.shape().clone()),
            dv: wrap(dv, dev, self.v.shape().clone()),
            dbias,
        })
    }
}

/// The CUDA device of a tensor the call holds.
pub(super) fn device_of(t: &Tensor) -> Option<&CudaDevice> {
    match t.device() {
        Device::Cuda(d) => Some(d),
        _ => None,
    }
}

/// A copy of `len` elements of `storage` from `layout`'s start offset (the bias link's identity).
pub(super) fn copy_contiguous<E: CudaDType + DeviceRepr>(
    spec: &AttnSpec,
    storage: &CudaStorage,
    layout: &Layout,
    len: usize,
) -> Result<CudaStorage> {
    let pass = Pass::Forward;
    let src = from_offset::<E>(spec, pass, "o", storage, layout)?;
    if !layout.is_contiguous() || src.len() < len {
        return Err(internal(
            spec.op(pass),
            format!(
                "the attention output is not {len} dense elements (layout {layout:?}, {} in the buffer)",
                src.len()
            ),
        ));
    }
    let dev = storage.device();
    let out = dev
        .cuda_stream()
        .clone_dtod(&src.slice(..len))
        .map_err(|e| cuda_error(spec, pass, e.into()))?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}
