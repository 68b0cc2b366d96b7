//! The CUDA path of a cache step: attn-cuda on candle's stream, the caches written in place.
//!
//! `cache_seqlens` and `block_table` stay on the device: nothing is copied to the host, so their
//! values are the caller's contract (`0 ≤ cache_seqlens[b]`, `cache_seqlens[b] + Nnew ≤` the
//! capacity, every table entry a sequence uses a page of the pool); attn-cuda's debug mode checks
//! them. Shapes, dtypes and devices were checked on the host by the parent module.
//!
//! [`forward_kv_cache`] is the one place that calls attn-cuda's cache entry point, with the
//! arguments that entry point takes (whole device buffers: the caches must start at element 0 of
//! their storage; the other arguments are copied when they do not); o and the LSE are fresh device
//! buffers it overwrites.

use super::Checked;
use crate::error::{internal, to_candle};
use attn_core::{AttnError, DType, KvCacheSpec, Pass};
use attn_cuda::cudarc::driver::{CudaSlice, DeviceRepr};
use attn_cuda::{CudaAttn, CudaAttnError, DeviceElem};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Layout, Result, Storage, Tensor};

/// The buffers of one cache step, field for field as attn-cuda's `KvCacheIo` takes them: whole
/// device buffers (each tensor starts at element 0 of its storage), shapes in [`KvCacheSpec`].
struct KvIo<'a, T> {
    q: &'a CudaSlice<T>,
    k_cache: &'a mut CudaSlice<T>,
    v_cache: &'a mut CudaSlice<T>,
    k_new: Option<&'a CudaSlice<T>>,
    v_new: Option<&'a CudaSlice<T>>,
    cache_seqlens: &'a CudaSlice<i32>,
    block_table: Option<&'a CudaSlice<i32>>,
    o: &'a mut CudaSlice<T>,
    lse: &'a mut CudaSlice<f32>,
}

/// The one call of `CudaAttn::forward_kv_cache`, with a split workspace sized for the step.
fn forward_kv_cache<E: DeviceElem>(
    backend: &CudaAttn,
    spec: &KvCacheSpec,
    io: KvIo<'_, E>,
) -> std::result::Result<(), CudaAttnError> {
    let mut ws = backend.kv_cache_workspace(spec)?;
    let io = attn_cuda::KvCacheIo {
        q: io.q,
        k_cache: io.k_cache,
        v_cache: io.v_cache,
        k_new: io.k_new,
        v_new: io.v_new,
        cache_seqlens: io.cache_seqlens,
        block_table: io.block_table,
        o: io.o,
        lse: io.lse,
    };
    backend.forward_kv_cache(spec, io, &mut ws)
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

/// The whole device buffer of a tensor the step reads; the tensor must start at its element 0.
fn whole<'a, T: CudaDType + DeviceRepr>(
    spec: &KvCacheSpec,
    what: &str,
    storage: &'a Storage,
    layout: &Layout,
) -> Result<&'a CudaSlice<T>> {
    let op = spec.op(Pass::Forward);
    let Storage::Cuda(s) = storage else {
        return Err(to_candle(AttnError::InvalidArgument {
            op,
            arg: "device",
            reason: format!("`{what}` is not on the caches' CUDA device"),
        }));
    };
    if layout.start_offset() != 0 {
        return Err(internal(
            op,
            format!("`{what}` does not start at element 0 of its buffer"),
        ));
    }
    s.as_cuda_slice::<T>()
}

/// The whole device buffer of a cache, written in place: the cache tensor must start at element 0
/// of its storage (attn-cuda's cache step takes whole buffers).
fn whole_mut<'a, T: CudaDType + DeviceRepr>(
    spec: &KvCacheSpec,
    what: &'static str,
    storage: &'a mut CudaStorage,
    layout: &Layout,
) -> Result<&'a mut CudaSlice<T>> {
    if layout.start_offset() != 0 {
        return Err(to_candle(AttnError::Unsupported {
            op: spec.op(Pass::Forward),
            backend: "attn-candle",
            what: format!(
                "`{what}` starting at element {} of its storage on CUDA (pass a tensor that owns its buffer)",
                layout.start_offset()
            ),
        }));
    }
    storage.as_cuda_slice_mut::<T>()
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
        KvIo {
            q: whole(spec, "q", &q.0, q.1)?,
            k_cache: whole_mut(spec, "k_cache", k, kl)?,
            v_cache: whole_mut(spec, "v_cache", v, vl)?,
            k_new: k_new
                .as_ref()
                .map(|g| whole(spec, "k_new", &g.0, g.1))
                .transpose()?,
            v_new: v_new
                .as_ref()
                .map(|g| whole(spec, "v_new", &g.0, g.1))
                .transpose()?,
            cache_seqlens: whole(spec, "cache_seqlens", &lens.0, lens.1)?,
            block_table: table
                .as_ref()
                .map(|g| whole(spec, "block_table", &g.0, g.1))
                .transpose()?,
            o: &mut o,
            lse: &mut lse,
        },
    )
    .map_err(|e| cuda_error(spec, e))?;
    Ok((
        wrap(o, &dev, a.o_shape().to_vec()),
        wrap(lse, &dev, vec![a.batch(), a.heads_q(), a.seq_q()]),
    ))
}
