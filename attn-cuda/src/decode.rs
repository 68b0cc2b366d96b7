//! Split-KV decode (docs/kernels/decode.md, docs/math.md "Decode, split-KV and KV caches"): the
//! forward of calls with few queries per sequence on `kernels/decode`, and the KV-cache step
//! ([`CudaAttn::forward_kv_cache`]).
//!
//! A forward launches `decode_fwd_*` over (S·row tiles, Hkv, B) blocks; with S = 1 it writes o and
//! the LSE, with S > 1 partial outputs and LSEs into an f32 workspace that `decode_combine_*` merges.
//! The o and LSE are those of the flash kernels (layout and meaning), so a backward after a decode
//! forward runs as after any other.
//!
//! A KV-cache step enqueues, in stream order: the append of the new keys and values at positions
//! `cache_seqlens[b] ..` (`kv_append_*`), then the decode forward over `cache_seqlens[b] + new_tokens`
//! keys, both reading the lengths and the block table on the device. Nothing is copied to or from the
//! host and nothing is allocated (the split workspace is the caller's [`KvCacheWorkspace`]), so a
//! step can be captured in a CUDA graph and replayed with new lengths written into the same buffers.

pub(crate) mod params;
pub(crate) mod plan;

use crate::check::Checker;
use crate::dispatch::{self, Module};
use crate::error::{CudaAttnError, Result};
use crate::runtime::{self, Kernels, Launch};
use crate::views::DeviceElem;
use crate::CudaAttn;
use attn_core::{
    Aggregation, AttnError, AttnSpec, DType, FamilySpec, HypScore, KvCacheSpec, KvLayout, Op, Pass,
    SeqLengths,
};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use params::DecodeParams;

fn to_i32(x: usize) -> i32 {
    // Callers pass validated sizes, which AttnProblem::validate and dispatch::check_supported bound
    // by i32::MAX.
    i32::try_from(x).unwrap_or(i32::MAX)
}

fn to_i64(x: usize) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}

fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
    }
}

/// The family, sizes, mask and q/o strides of `spec` (k and v strides are the caller's: the spec's, or
/// a cache's).
fn params_for(spec: &AttnSpec) -> DecodeParams {
    let mut p = DecodeParams::default();
    let st = crate::params::set_strides;
    (p.q_batch, p.q_seq, p.q_head) = st(spec.q_strides());
    (p.k_batch, p.k_seq, p.k_head) = st(spec.k_strides());
    (p.v_batch, p.v_seq, p.v_head) = st(spec.v_strides());
    (p.o_batch, p.o_seq, p.o_head) = st(spec.o_strides());
    p.batch = to_i32(spec.batch());
    p.heads_q = to_i32(spec.heads_q());
    p.heads_kv = to_i32(spec.heads_kv());
    p.group = to_i32(spec.group());
    p.seq_q = to_i32(spec.seq_q());
    p.seq_k = to_i32(spec.seq_k());
    p.head_dim = to_i32(spec.head_dim());
    p.head_dim_v = to_i32(spec.head_dim_v());
    p.causal = crate::params::causal_code(spec);
    (p.window_left, p.window_right) = crate::params::window_sides(spec);
    p.scale = 1.0;
    match *spec.family() {
        FamilySpec::Softmax { scale, softcap } => {
            p.score = 0;
            p.scale = scale;
            p.softcap = softcap.unwrap_or(0.0);
        }
        FamilySpec::CosineSim {
            scale,
            qk_l2norm,
            eps,
        } => {
            // The running max for every call: the LSE is the same as with the fixed offset, and one
            // code path serves the l2-normalised and raw scores.
            p.score = 1;
            p.scale = scale;
            p.eps = eps;
            p.l2norm = i32::from(qk_l2norm);
        }
        FamilySpec::Hyperbolic {
            score,
            curvature,
            beta,
            aggregation,
        } => {
            p.score = match score {
                HypScore::SquaredLorentz => 2,
                HypScore::Geodesic => 3,
            };
            p.curvature = curvature;
            p.beta = beta;
            p.midpoint = i32::from(aggregation == Aggregation::EinsteinMidpoint);
        }
        // plan::unsupported keeps Taylor off this path.
        FamilySpec::Taylor { .. } => {}
    }
    p
}

/// The forward kernel's name for `spec` (`decode_fwd_{dtype}_d{D}`).
fn forward_name(spec: &AttnSpec) -> String {
    format!("decode_fwd_{}_d{}", dtype_name(spec.dtype()), spec.head_dim())
}

/// The forward launch of `spec` under kernel `name` with `splits` key chunks: grid (S·row tiles,
/// Hkv, B) of [`plan::THREADS`], the dynamic shared memory of its head dim (none for the f32
/// kernel, which keeps its rows in registers).
fn forward_launch<'a>(spec: &AttnSpec, name: &'a str, splits: usize) -> Launch<'a> {
    Launch {
        module: Module::Decode,
        name,
        grid: (
            splits.saturating_mul(plan::row_tiles(spec.seq_q(), spec.group())),
            spec.heads_kv(),
            spec.batch(),
        ),
        threads: plan::THREADS,
        smem: if spec.dtype() == DType::F32 {
            0
        } else {
            plan::smem_bytes(spec.head_dim())
        },
    }
}

/// Launch the forward (and with S > 1 the combine) with `p` filled but for the split and the load
/// path: bulk copies on mbarriers where the Hopper kernels are on (compute capability 9.0 and
/// `KernelConfig::hopper`) and the head dim is at least `plan::BULK_MIN_HEAD_DIM`, cp.async
/// elsewhere.
fn launch_forward(
    attn: &CudaAttn,
    kernels: &Kernels,
    spec: &AttnSpec,
    p: &DecodeParams,
    split: plan::Split,
    op: Op,
) -> Result<()> {
    let stream = attn.stream();
    let mut p = *p;
    p.bulk = i32::from(kernels.hopper(attn.config()).on && plan::bulk_loads(spec.head_dim()));
    let p = &p;
    let dt = dtype_name(spec.dtype());
    let name = forward_name(spec);
    let fwd = forward_launch(spec, &name, split.splits);
    // SAFETY: `p` is the mirror of DecodeParams (decode_params.h); the callers checked every buffer it
    // points at against the spec (q, k, v or the cache, o, lse, the lengths and table) and sized the
    // workspace for `split`; grid and shared memory are the kernel's (plan mirrors decode_fwd.cuh).
    unsafe { kernels.launch_params(stream, &fwd, p, op) }?;
    if split.splits > 1 {
        let rows = spec.batch() * spec.heads_q() * spec.seq_q();
        let name = format!("decode_combine_{dt}");
        let combine = Launch {
            module: Module::Decode,
            name: &name,
            // One block per row (decode_combine).
            grid: (rows, 1, 1),
            threads: 128,
            smem: 0,
        };
        // SAFETY: as above; the combine reads the S partial rows the forward wrote.
        unsafe { kernels.launch_params(stream, &combine, p, op) }?;
    }
    Ok(())
}

fn fill_split(p: &mut DecodeParams, spec: &AttnSpec, split: plan::Split) {
    p.splits = to_i32(split.splits);
    p.chunk = to_i32(split.chunk);
    p.row_tiles = to_i32(plan::row_tiles(spec.seq_q(), spec.group()));
}

/// The split of `spec`'s keys on this device under the backend's configuration: as many chunks as
/// one wave of the forward's resident blocks holds (the driver's occupancy of the forward kernel
/// times the SMs), or `KernelConfig::decode_splits`.
fn split_for(attn: &CudaAttn, kernels: &Kernels, spec: &AttnSpec, op: Op) -> Result<plan::Split> {
    let blocks = spec
        .batch()
        .saturating_mul(spec.heads_kv())
        .saturating_mul(plan::row_tiles(spec.seq_q(), spec.group()));
    let forced = attn.config().decode_splits;
    // No kernel to ask for a spec the decode kernels cannot run (its step is rejected when run).
    let slots = match forced {
        Some(_) => 0,
        None if plan::unsupported(spec).is_some() => 0,
        None => {
            let name = forward_name(spec);
            kernels
                .blocks_per_sm(&forward_launch(spec, &name, 1), op)?
                .saturating_mul(kernels.sms)
        }
    };
    Ok(plan::splits(blocks, spec.seq_k(), slots, forced))
}

/// The decode forward of `spec` (routed by [`plan::route`]): o and the LSE as the flash forward
/// writes them.
pub(crate) fn forward<T: DeviceElem>(
    attn: &CudaAttn,
    spec: &AttnSpec,
    q: &dyn DevicePtr<T>,
    k: &dyn DevicePtr<T>,
    v: &dyn DevicePtr<T>,
    o: &mut dyn DevicePtrMut<T>,
    lse: &mut dyn DevicePtrMut<f32>,
) -> Result<()> {
    let pass = Pass::Forward;
    let op = spec.op(pass);
    dispatch::check_supported(spec, pass)?;
    if let Some(why) = plan::unsupported(spec) {
        return Err(CudaAttnError::Internal {
            what: format!("the decode path was routed a call it cannot run: {why}"),
        });
    }
    let tensor_cores = spec.dtype() != DType::F32;
    if tensor_cores {
        crate::backend::check_strides(spec, op)?;
    }
    let stream = attn.stream();
    let kernels = runtime::kernels_for(stream.context(), op)?;
    let c = Checker {
        spec,
        op,
        pass,
        stream,
        tensor_cores,
    };
    let (qp, _gq) = c.input("q", q, spec.q_len())?;
    let (kp, _gk) = c.input("k", k, spec.k_len())?;
    let (vp, _gv) = c.input("v", v, spec.v_len())?;
    let (op_, _go) = c.output("o", o, spec.o_len())?;
    let (lp, _gl) = c.output("lse", lse, spec.stats_len())?;
    let mut p = params_for(spec);
    (p.q, p.k, p.v, p.o, p.lse) = (qp, kp, vp, op_, lp);
    let _lens = match spec.lengths() {
        SeqLengths::KeyPadding(lens) => {
            let host: Vec<i32> = lens.iter().map(|&l| to_i32(l)).collect();
            let d = stream.clone_htod(&host)?;
            p.key_lens = d.device_ptr(stream).0;
            Some(d)
        }
        _ => None,
    };
    let split = split_for(attn, &kernels, spec, op)?;
    fill_split(&mut p, spec, split);
    let _ws = if split.splits > 1 {
        let rows = split.splits * spec.stats_len();
        // SAFETY: the forward writes every (chunk, row) of both buffers (an empty chunk writes zeros
        // and −∞) before the combine, the only reader, runs after it in stream order.
        let wo = unsafe { stream.alloc::<f32>(rows * spec.head_dim_v()) }?;
        let wl = unsafe { stream.alloc::<f32>(rows) }?;
        (p.ws_o, p.ws_lse) = (wo.device_ptr(stream).0, wl.device_ptr(stream).0);
        Some((wo, wl))
    } else {
        None
    };
    launch_forward(attn, &kernels, spec, &p, split, op)
}

/// The split workspace of KV-cache steps of one [`KvCacheSpec`] on one backend: partial outputs and
/// LSEs (f32) for the step's key chunks. Allocated once by [`CudaAttn::kv_cache_workspace`] and
/// reused by every step, so a step allocates nothing (and can be captured in a CUDA graph).
pub struct KvCacheWorkspace {
    o: CudaSlice<f32>,
    lse: CudaSlice<f32>,
    split: plan::Split,
    /// The step it was sized for: (B, Hq, seq_q, Dv, capacity).
    sized_for: [usize; 5],
}

impl KvCacheWorkspace {
    /// Key chunks per (sequence, kv head, row tile) of the steps it serves.
    pub fn splits(&self) -> usize {
        self.split.splits
    }
}

fn sized_for(spec: &KvCacheSpec) -> [usize; 5] {
    let a = spec.attend();
    [a.batch(), a.heads_q(), a.seq_q(), a.head_dim_v(), spec.capacity()]
}

/// The buffers of one KV-cache step ([`CudaAttn::forward_kv_cache`]); shapes in [`KvCacheSpec`].
pub struct KvCacheIo<'a, T> {
    /// `[B, seq_q, Hq, D]`.
    pub q: &'a CudaSlice<T>,
    /// `[B, capacity, Hkv, D]` or `[num_pages, page_size, Hkv, D]`; the new keys are written into it.
    pub k_cache: &'a mut CudaSlice<T>,
    /// As `k_cache`, with Dv.
    pub v_cache: &'a mut CudaSlice<T>,
    /// `[B, new_tokens, Hkv, D]`; `None` exactly when the step has no new tokens.
    pub k_new: Option<&'a CudaSlice<T>>,
    /// `[B, new_tokens, Hkv, Dv]`.
    pub v_new: Option<&'a CudaSlice<T>>,
    /// `[B]`: keys in the cache before the step.
    pub cache_seqlens: &'a CudaSlice<i32>,
    /// `[B, pages_per_seq]` for a paged cache; `None` for a contiguous one.
    pub block_table: Option<&'a CudaSlice<i32>>,
    /// `[B, seq_q, Hq, Dv]`.
    pub o: &'a mut CudaSlice<T>,
    /// `[B, Hq, seq_q]`.
    pub lse: &'a mut CudaSlice<f32>,
}

fn aligned(op: Op, what: &str, ptr: u64, align: u64) -> Result<()> {
    if ptr % align != 0 {
        return Err(AttnError::Unsupported {
            op,
            backend: dispatch::BACKEND,
            what: format!("`{what}` at device address {ptr:#x}, not {align}-byte aligned"),
        }
        .into());
    }
    Ok(())
}

fn on_device(op: Op, what: &str, buf: &CudaStream, ours: &CudaStream) -> Result<()> {
    if buf.context().cu_ctx() != ours.context().cu_ctx() {
        return Err(AttnError::InvalidArgument {
            op,
            arg: "device",
            reason: format!(
                "`{what}` lives on CUDA device {} but the call runs on device {}",
                buf.context().ordinal(),
                ours.context().ordinal()
            ),
        }
        .into());
    }
    Ok(())
}

impl CudaAttn {
    /// The split workspace for KV-cache steps of `spec` on this backend (its size follows the
    /// split heuristic on this device, or [`crate::KernelConfig::decode_splits`]).
    pub fn kv_cache_workspace(&self, spec: &KvCacheSpec) -> Result<KvCacheWorkspace> {
        let a = spec.attend();
        let op = spec.op(Pass::Forward);
        let kernels = runtime::kernels_for(self.stream().context(), op)?;
        let split = split_for(self, &kernels, a, op)?;
        let rows = if split.splits > 1 {
            split.splits * a.stats_len()
        } else {
            0
        };
        let s = self.stream();
        Ok(KvCacheWorkspace {
            o: s.alloc_zeros::<f32>((rows * a.head_dim_v()).max(1))?,
            lse: s.alloc_zeros::<f32>(rows.max(1))?,
            split,
            sized_for: sized_for(spec),
        })
    }

    /// One generation step against a KV cache (FlashAttention's `flash_attn_with_kvcache`
    /// semantics, docs/math.md): write `k_new`, `v_new` at positions `cache_seqlens[b] ..` of the
    /// cache, then attend over `cache_seqlens[b] + new_tokens` keys (bottom-right causal when the spec
    /// is causal), writing o and the LSE.
    ///
    /// Every length and table entry is read on the device: nothing is copied to or from the host and
    /// nothing is allocated, so the step can be captured in a CUDA graph. The values of
    /// `cache_seqlens` and `block_table` are therefore the caller's contract
    /// (`0 ≤ cache_seqlens[b]`, `cache_seqlens[b] + new_tokens ≤ capacity`, every table entry a
    /// sequence uses names a page of the pool); with `ATTN_CUDA_CHECK_LAUNCHES=1` they are copied to
    /// the host and checked ([`KvCacheSpec::check_seqlens`], [`KvCacheSpec::check_block_table`]),
    /// and a violation is a typed error. `cache_seqlens` itself is not updated.
    ///
    /// Runs on the decode kernels: f16/bf16 on the tensor cores, f32 on the CUDA cores, D = Dv among
    /// the flash kernels' head dims; anything else is `Unsupported`.
    pub fn forward_kv_cache<T: DeviceElem>(
        &self,
        spec: &KvCacheSpec,
        io: KvCacheIo<'_, T>,
        ws: &mut KvCacheWorkspace,
    ) -> Result<()> {
        let pass = Pass::Forward;
        let op = spec.op(pass);
        let a = spec.attend();
        if T::DTYPE != a.dtype() {
            return Err(AttnError::InvalidArgument {
                op,
                arg: "dtype",
                reason: format!("buffers are {} but the spec says {}", T::DTYPE, a.dtype()),
            }
            .into());
        }
        dispatch::check_supported(a, pass)?;
        if let Some(why) = plan::unsupported(a) {
            return Err(AttnError::Unsupported {
                op,
                backend: dispatch::BACKEND,
                what: format!("a KV-cache step with {why}"),
            }
            .into());
        }
        if ws.sized_for != sized_for(spec) {
            return Err(AttnError::InvalidArgument {
                op,
                arg: "workspace",
                reason: format!(
                    "sized for (B, Hq, seq_q, Dv, capacity) = {:?}, the step has {:?}",
                    ws.sized_for,
                    sized_for(spec)
                ),
            }
            .into());
        }
        let stream = self.stream();
        let kernels = runtime::kernels_for(stream.context(), op)?;
        let new = spec.new_tokens();
        let shape_len = |s: [usize; 4]| s.iter().product::<usize>();
        let (d, dv) = (a.head_dim(), a.head_dim_v());
        let tensor_cores = a.dtype() != DType::F32;
        let c = Checker {
            spec: a,
            op,
            pass,
            stream,
            tensor_cores,
        };
        let (qp, _gq) = c.input("q", io.q, a.q_len())?;
        let (op_, _go) = c.output("o", io.o, a.o_len())?;
        let (lp, _gl) = c.output("lse", io.lse, a.stats_len())?;
        let (kc, _gkc) = c.output("k_cache", io.k_cache, shape_len(spec.cache_shape(d)))?;
        let (vc, _gvc) = c.output("v_cache", io.v_cache, shape_len(spec.cache_shape(dv)))?;
        // cp.async of 16-byte row chunks (f16/bf16); the f32 kernel reads elements.
        let row_align = if tensor_cores { 16 } else { 4 };
        aligned(op, "k_cache", kc, row_align)?;
        aligned(op, "v_cache", vc, row_align)?;
        let (sl, _gsl) = c.input("cache_seqlens", io.cache_seqlens, a.batch())?;
        let table = match (spec.block_table_shape(), io.block_table) {
            (Some(shape), Some(t)) => Some(c.input("block_table", t, shape_len_2(shape))?),
            (None, None) => None,
            (Some(shape), None) => {
                return Err(AttnError::ShapeMismatch {
                    op,
                    what: "block_table".into(),
                    expected: format!("a block table of shape {shape:?} for a paged cache"),
                    got: "none".into(),
                }
                .into())
            }
            (None, Some(_)) => {
                return Err(AttnError::ShapeMismatch {
                    op,
                    what: "block_table".into(),
                    expected: "no block table (a contiguous cache)".into(),
                    got: "a buffer".into(),
                }
                .into())
            }
        };
        let news = match (new, io.k_new, io.v_new) {
            (0, None, None) => None,
            (n, Some(kn), Some(vn)) if n > 0 => {
                let (knp, gkn) = c.input("k_new", kn, shape_len(spec.new_shape(d)))?;
                let (vnp, gvn) = c.input("v_new", vn, shape_len(spec.new_shape(dv)))?;
                aligned(op, "k_new", knp, 4)?;
                aligned(op, "v_new", vnp, 4)?;
                Some((knp, vnp, gkn, gvn))
            }
            _ => {
                return Err(AttnError::ShapeMismatch {
                    op,
                    what: "k_new, v_new".into(),
                    expected: format!("both present exactly when the step has new tokens ({new})"),
                    got: format!(
                        "k_new {}, v_new {}",
                        if io.k_new.is_some() { "present" } else { "absent" },
                        if io.v_new.is_some() { "present" } else { "absent" }
                    ),
                }
                .into())
            }
        };
        for (what, s) in [("workspace", ws.o.stream()), ("workspace", ws.lse.stream())] {
            on_device(op, what, s, stream)?;
        }
        if runtime::check_launches() {
            let lens: Vec<i32> = stream.clone_dtoh(io.cache_seqlens)?;
            spec.check_seqlens(&lens[..a.batch().min(lens.len())])?;
            if let Some(t) = io.block_table {
                let table: Vec<i32> = stream.clone_dtoh(t)?;
                let n = spec.block_table_shape().map_or(0, shape_len_2);
                spec.check_block_table(&table[..n.min(table.len())], &lens[..a.batch().min(lens.len())])?;
            }
        }

        // An empty batch appends and attends nothing; o and the LSE are empty (crate::empty).
        if a.batch() == 0 {
            return Ok(());
        }
        let mut p = params_for(a);
        (p.q, p.o, p.lse) = (qp, op_, lp);
        (p.k, p.v, p.k_cache, p.v_cache) = (kc, vc, kc, vc);
        p.key_lens = sl;
        p.key_len_add = to_i32(new);
        p.new_tokens = to_i32(new);
        let hkv = a.heads_kv();
        // The cache's strides: one slot is Hkv rows of D (Dv) elements.
        (p.k_seq, p.k_head) = (to_i64(hkv * d), to_i64(d));
        (p.v_seq, p.v_head) = (to_i64(hkv * dv), to_i64(dv));
        match spec.layout() {
            KvLayout::Contiguous { capacity } => {
                p.k_batch = to_i64(capacity * hkv * d);
                p.v_batch = to_i64(capacity * hkv * dv);
            }
            KvLayout::Paged {
                page_size,
                pages_per_seq,
                ..
            } => {
                p.k_batch = 0;
                p.v_batch = 0;
                p.page_size = to_i32(page_size);
                p.page_shift = to_i32(page_size.trailing_zeros() as usize);
                p.pages_per_seq = to_i32(pages_per_seq);
                p.block_table = table.as_ref().map_or(0, |(ptr, _)| *ptr);
            }
        }
        let split = ws.split;
        fill_split(&mut p, a, split);
        (p.ws_o, p.ws_lse) = (ws.o.device_ptr(stream).0, ws.lse.device_ptr(stream).0);
        if let Some((knp, vnp, _, _)) = &news {
            (p.k_new, p.v_new) = (*knp, *vnp);
            (p.kn_batch, p.kn_seq, p.kn_head) = (to_i64(new * hkv * d), to_i64(hkv * d), to_i64(d));
            (p.vn_batch, p.vn_seq, p.vn_head) = (to_i64(new * hkv * dv), to_i64(hkv * dv), to_i64(dv));
            let name = format!("kv_append_b{}", std::mem::size_of::<T>());
            let append = Launch {
                module: Module::Decode,
                name: &name,
                grid: (new, hkv, a.batch()),
                threads: 64,
                smem: 0,
            };
            // SAFETY: `p` mirrors DecodeParams; k_new, v_new and the cache were checked against the
            // spec's shapes above; the positions written are `cache_seqlens[b] + t` < capacity and
            // the table entries name pages of the pool (the caller's contract, checked under
            // ATTN_CUDA_CHECK_LAUNCHES).
            unsafe { kernels.launch_params(stream, &append, &p, op) }?;
        }
        // seq_q = 0: the new tokens are appended, there is no query to attend (o and LSE empty).
        if a.total_q() == 0 {
            return Ok(());
        }
        launch_forward(self, &kernels, a, &p, split, op)
    }
}

fn shape_len_2(s: [usize; 2]) -> usize {
    s[0] * s[1]
}
