//! The CUDA path of a cache step: attn-cuda on candle's stream, the caches written in place.
//!
//! `cache_seqlens` and `block_table` stay on the device: nothing is copied to the host, so their
//! values are the caller's contract (`0 ≤ cache_seqlens[b]`, `cache_seqlens[b] + Nnew ≤` the
//! capacity, every table entry a sequence uses a page of the pool); attn-cuda's debug mode checks
//! them. Shapes, dtypes and devices were checked on the host by the parent module.
//!
//! [`forward_kv_cache`] is the one place that calls attn-cuda's cache entry point, with the
//! arguments that entry point takes; o and the LSE are fresh device buffers it overwrites.

use super::Checked;
use crate::error::{internal, to_candle};
use attn_core::{AttnError, DType, KvCacheSpec, Pass};
use attn_cuda::cudarc::driver::{CudaView, CudaViewMut, DeviceRepr};
use attn_cuda::{CudaAttn, CudaAttnError, DeviceElem};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Layout, Result, Storage, Tensor};

/// ADAPTER (attn-cuda's cache step): the arguments of `CudaAttn::forward_kv_cache` as attn-candle
/// passes them. attn-cuda's entry point is not wired in yet, so every call is `Unsupported`; wiring it
/// is this function's body only.
#[allow(clippy::too_many_arguments)]
fn forward_kv_cache<E: DeviceElem>(
    _backend: &CudaAttn,
    spec: &KvCacheSpec,
    _q: CudaView<'_, E>,
    _k_cache: CudaViewMut<'_, E>,
    _v_cache: CudaViewMut<'_, E>,
    _k_new: Option<CudaView<'_, E>>,
    _v_new: Option<CudaView<'_, E>>,
    _cache_seqlens: CudaView<'_, i32>,
    _block_table: Option<CudaView<'_, i32>>,
    _o: CudaViewMut<'_, E>,
    _lse: CudaViewMut<'_, f32>,
) -> std::result::Result<(), CudaAttnError> {
    Err(CudaAttnError::Attn(AttnError::Unsupported {
        op: spec.op(Pass::Forward),
        backend: "attn-candle",
        what: "a KV-cache step on CUDA (attn-cuda's cache entry point is not wired into attn-candle yet)"
            .into(),
    }))
}

fn cuda_error(spec: &KvCacheSpec, e: CudaAttnError) -> candle_core::Error {
    match e {
        CudaAttnError::Attn(e) => to_candle(e),
        other => to_candle(AttnError::Backend {
            op: spec.op(Pass::Forward),
            backend: "attn-cuda",
            message: other.to_string(),
        }),
    }
}

/// The dense elements of a tensor the step reads, from its layout's start offset.
fn view<'a, T: CudaDType + DeviceRepr>(
    spec: &KvCacheSpec,
    what: &str,
    storage: &'a Storage,
    layout: &Layout,
) -> Result<CudaView<'a, T>> {
    let op = spec.op(Pass::Forward);
    let Storage::Cuda(s) = storage else {
        return Err(to_candle(AttnError::InvalidArgument {
            op,
            arg: "device",
            reason: format!("`{what}` is not on the caches' CUDA device"),
        }));
    };
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| internal(op, format!("`{what}` is not contiguous")))?;
    let slice = s.as_cuda_slice::<T>()?;
    if end > slice.len() {
        return Err(internal(op, format!("`{what}` exceeds its buffer")));
    }
    Ok(slice.slice(start..end))
}

fn view_mut<'a, T: CudaDType + DeviceRepr>(
    spec: &KvCacheSpec,
    what: &str,
    storage: &'a mut CudaStorage,
    layout: &Layout,
) -> Result<CudaViewMut<'a, T>> {
    let op = spec.op(Pass::Forward);
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| internal(op, format!("`{what}` is not contiguous")))?;
    let slice = storage.as_cuda_slice_mut::<T>()?;
    if end > slice.len() {
        return Err(internal(op, format!("`{what}` exceeds its buffer")));
    }
    Ok(slice.slice_mut(start..end))
}

fn wrap<T: CudaDType>(
    slice: attn_cuda::cudarc::driver::CudaSlice<T>,
    dev: &CudaDevice,
    shape: Vec<usize>,
) -> Tensor {
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, dev.clone()));
    Tensor::from_storage(storage, shape, BackpropOp::none(), false)
}

/// One step on the caches' device; returns o and the LSE.
pub(super) fn step(
    c: &Checked,
    k: &mut CudaStorage,
    kl: &Layout,
    v: &mut CudaStorage,
    vl: &Layout,
) -> Result<(Tensor, Tensor)> {
    match c.spec.attend().dtype() {
        DType::F32 => step_typed::<f32>(c, k, kl, v, vl),
        DType::F16 => step_typed::<half::f16>(c, k, kl, v, vl),
        DType::BF16 => step_typed::<half::bf16>(c, k, kl, v, vl),
    }
}

fn step_typed<E: DeviceElem + CudaDType>(
    c: &Checked,
    k: &mut CudaStorage,
    kl: &Layout,
    v: &mut CudaStorage,
    vl: &Layout,
) -> Result<(Tensor, Tensor)> {
    let spec = &c.spec;
    let dev = k.device().clone();
    let backend = CudaAttn::with_stream(dev.cuda_stream());
    let q = c.q.storage_and_layout();
    let k_new = c.k_new.as_ref().map(Tensor::storage_and_layout);
    let v_new = c.v_new.as_ref().map(Tensor::storage_and_layout);
    let lens = c.cache_seqlens.storage_and_layout();
    let table = c.block_table.as_ref().map(Tensor::storage_and_layout);
    let a = spec.attend();
    // SAFETY: o and the LSE are outputs of the cache step, which writes every element (zeros and
    // −∞ for rows with no key); they become tensors only after the launch is enqueued on this stream.
    let mut o = unsafe { dev.alloc::<E>(a.o_len().max(1)) }?;
    let mut lse = unsafe { dev.alloc::<f32>(a.stats_len().max(1)) }?;
    forward_kv_cache(
        &backend,
        spec,
        view(spec, "q", &q.0, q.1)?,
        view_mut(spec, "k_cache", k, kl)?,
        view_mut(spec, "v_cache", v, vl)?,
        k_new
            .as_ref()
            .map(|g| view(spec, "k_new", &g.0, g.1))
            .transpose()?,
        v_new
            .as_ref()
            .map(|g| view(spec, "v_new", &g.0, g.1))
            .transpose()?,
        view(spec, "cache_seqlens", &lens.0, lens.1)?,
        table
            .as_ref()
            .map(|g| view(spec, "block_table", &g.0, g.1))
            .transpose()?,
        o.slice_mut(..),
        lse.slice_mut(..),
    )
    .map_err(|e| cuda_error(spec, e))?;
    Ok((
        wrap(o, &dev, a.o_shape().to_vec()),
        wrap(lse, &dev, vec![a.batch(), a.heads_q(), a.seq_q()]),
    ))
}
