//! [`super::TaylorCache`] on CUDA: attn-cuda's `TaylorDecodeState`, stepped on candle's stream (the
//! state stays on the device; each step launches attn-cuda's decode kernels on the new tokens).

use crate::error::to_candle;
use attn_core::{AttnError, AttnSpec, DType, Pass};
use attn_cuda::cudarc::driver::CudaView;
use attn_cuda::{CudaAttn, CudaAttnError, DeviceElem, ForwardViews, TaylorDecodeState};
use candle_core::cuda_backend::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Layout, Result, Storage, Tensor};

fn cuda_error(spec: &AttnSpec, e: CudaAttnError) -> candle_core::Error {
    match e {
        CudaAttnError::Attn(e) => to_candle(e),
        other => to_candle(AttnError::Backend {
            op: spec.op(Pass::Decode),
            backend: "attn-cuda",
            message: other.to_string(),
        }),
    }
}

fn view<'a, E: CudaDType + DeviceElem>(
    spec: &AttnSpec,
    what: &str,
    storage: &'a Storage,
    layout: &Layout,
) -> Result<CudaView<'a, E>> {
    let Storage::Cuda(s) = storage else {
        return Err(to_candle(AttnError::InvalidArgument {
            op: spec.op(Pass::Decode),
            arg: "device",
            reason: format!("`{what}` is not on the state's CUDA device"),
        }));
    };
    let slice = s.as_cuda_slice::<E>()?;
    let start = layout.start_offset().min(slice.len());
    Ok(slice.slice(start..))
}

/// One decode step of `spec` (the new tokens: dense, causal, `seq_q = seq_k`); the state is created
/// on the first step.
pub(super) fn step(
    state: &mut Option<TaylorDecodeState>,
    spec: &AttnSpec,
    dev: &CudaDevice,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<Tensor> {
    match spec.dtype() {
        DType::F32 => typed::<f32>(state, spec, dev, q, k, v),
        DType::F16 => typed::<half::f16>(state, spec, dev, q, k, v),
        DType::BF16 => typed::<half::bf16>(state, spec, dev, q, k, v),
    }
}

fn typed<E: DeviceElem + CudaDType>(
    state: &mut Option<TaylorDecodeState>,
    spec: &AttnSpec,
    dev: &CudaDevice,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<Tensor> {
    let backend = CudaAttn::with_stream(dev.cuda_stream());
    let st = match state {
        Some(s) => s,
        None => state.insert(
            backend
                .taylor_decode_empty(spec)
                .map_err(|e| cuda_error(spec, e))?,
        ),
    };
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    let (gq, gk, gv) = (
        q.storage_and_layout(),
        k.storage_and_layout(),
        v.storage_and_layout(),
    );
    // SAFETY: o and the denominators are outputs of the decode step, which writes every element;
    // they become tensors only after the launch is enqueued on this stream.
    let mut o = unsafe { dev.alloc::<E>(spec.o_len().max(1)) }?;
    let mut den = unsafe { dev.alloc::<f32>(spec.stats_len().max(1)) }?;
    backend
        .taylor_decode_step(
            st,
            spec,
            ForwardViews {
                q: view(spec, "q", &gq.0, gq.1)?,
                k: view(spec, "k", &gk.0, gk.1)?,
                v: view(spec, "v", &gv.0, gv.1)?,
                bias: None,
                o: o.slice_mut(..),
                lse: den.slice_mut(..),
            },
        )
        .map_err(|e| cuda_error(spec, e))?;
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(o, dev.clone()));
    Ok(Tensor::from_storage(
        storage,
        spec.o_shape().to_vec(),
        BackpropOp::none(),
        false,
    ))
}
