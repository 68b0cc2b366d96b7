//! The safe layer: checked buffers in, kernels launched on the caller's stream.
//!
//! Forward: one flash kernel writes o and LSE (hyperbolic: after the row kernels that write the
//! per-row time coordinates q0, k0, the norms and, for the Einstein midpoint, log γ_j and c γ_j² into
//! f32 scratch). Backward, in stream order:
//! 1. δ_i = dO_i·o_i (row kernel);
//! 2. cosine-sim with l2-norm: 1/max(‖q‖, eps) and 1/max(‖k‖, eps) per row (row kernels);
//!    hyperbolic: the per-row scalars again (row kernels);
//! 3. dQ (flash kernel over query tiles; also dS for the bias gradient, into a zeroed f32 scratch);
//! 4. dK, dV (flash kernel over key tiles, looping over the GQA group: no atomics);
//!    on the Hopper backward without a bias or `deterministic`, 3 and 4 are one fused kernel
//!    (`dispatch::fused_backward`) that adds each key tile's dQ into a zeroed f32 scratch with
//!    atomics, and a row kernel stores dq from it (cosine-sim: step 5 does; hyperbolic: dQ's row sums
//!    Σ_j w_ij k0_j are reduced the same way and the row kernel subtracts their term);
//! 5. cosine-sim with l2-norm: the l2-norm's Jacobian on dq̂, dk̂ (row kernels);
//! 6. with a bias: dbias = dS summed over its broadcast dims (deterministic reduction).
//!
//! Inputs may be strided views (the spec's strides, last dim contiguous): nothing is copied.

use crate::check::Checker;
use crate::config::KernelConfig;
use crate::dispatch::{self, RowKernel, Stage};
use crate::error::{CudaAttnError, Result};
use crate::heuristics;
use crate::params::AttnParams;
use crate::runtime::{self, Kernels};
use crate::taylor::TaylorDecodeState;
use crate::views::{BackwardViews, DeviceElem, ForwardViews};
use attn_core::{
    Aggregation, AttnBackend, AttnError, AttnSpec, BackwardIo, Causal, DType, Element, FamilyKind,
    FamilySpec, ForwardIo, Op, Pass, SeqLengths,
};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use std::sync::Arc;

/// The CUDA backend: launches on one stream (the caller's, e.g. candle's), choosing kernels under
/// one [`KernelConfig`].
#[derive(Clone, Debug)]
pub struct CudaAttn {
    stream: Arc<CudaStream>,
    config: KernelConfig,
}

type In<'a, T> = &'a dyn DevicePtr<T>;
type Out<'a, T> = &'a mut dyn DevicePtrMut<T>;

struct FwdArgs<'a, T> {
    q: In<'a, T>,
    k: In<'a, T>,
    v: In<'a, T>,
    bias: Option<In<'a, T>>,
    o: Out<'a, T>,
    lse: Out<'a, f32>,
}

struct BwdArgs<'a, T> {
    q: In<'a, T>,
    k: In<'a, T>,
    v: In<'a, T>,
    bias: Option<In<'a, T>>,
    o: In<'a, T>,
    d_o: In<'a, T>,
    lse: In<'a, f32>,
    dq: Out<'a, T>,
    dk: Out<'a, T>,
    dv: Out<'a, T>,
    dbias: Option<Out<'a, T>>,
}

fn bias_pair<X>(spec: &AttnSpec, op: Op, buf: Option<X>, what: &str) -> Result<Option<X>> {
    match (spec.bias(), buf) {
        (Some(_), Some(b)) => Ok(Some(b)),
        (None, None) => Ok(None),
        (Some(s), None) => Err(AttnError::ShapeMismatch {
            op,
            what: what.into(),
            expected: format!(
                "a `{what}` of shape [{}, {}, {}, {}]",
                s.batch,
                s.heads,
                spec.seq_q(),
                spec.seq_k()
            ),
            got: "none".into(),
        }
        .into()),
        (None, Some(_)) => Err(AttnError::ShapeMismatch {
            op,
            what: what.into(),
            expected: format!("no `{what}` (the spec has no bias)"),
            got: "a buffer".into(),
        }
        .into()),
    }
}

/// Strides of f16/bf16 inputs must keep every row 16-byte aligned for cp.async (the flash and the
/// decode kernels).
pub(crate) fn check_strides(spec: &AttnSpec, op: Op) -> Result<()> {
    for (what, s) in [
        ("q", spec.q_strides()),
        ("k", spec.k_strides()),
        ("v", spec.v_strides()),
    ] {
        if s.batch % 8 != 0 || s.seq % 8 != 0 || s.head % 8 != 0 {
            return Err(AttnError::Unsupported {
                op,
                backend: dispatch::BACKEND,
                what: format!(
                    "`{what}` strides (batch {}, seq {}, head {}) that are not multiples of 8 elements \
                     (rows must be 16-byte aligned for the tensor-core kernels)",
                    s.batch, s.seq, s.head
                ),
            }
            .into());
        }
    }
    Ok(())
}

/// Cosine-sim with l2-normalised q and k (its kernels scale by the reciprocal norms), and Taylor's
/// quadratic form with `qk_l2norm` (the same scores, the same row kernels).
fn qk_l2norm(spec: &AttnSpec) -> bool {
    matches!(
        spec.family(),
        FamilySpec::CosineSim { qk_l2norm: true, .. } | FamilySpec::Taylor { qk_l2norm: true, .. }
    )
}

fn dtype_check<T: Element>(spec: &AttnSpec, op: Op) -> Result<()> {
    if T::DTYPE != spec.dtype() {
        return Err(AttnError::InvalidArgument {
            op,
            arg: "dtype",
            reason: format!("buffers are {} but the spec says {}", T::DTYPE, spec.dtype()),
        }
        .into());
    }
    Ok(())
}

/// Sequence-length arrays uploaded for one call (kept alive until the launches are enqueued;
/// cudarc frees them in stream order).
struct Lengths {
    key_lens: Option<CudaSlice<i32>>,
    cu_q: Option<CudaSlice<i32>>,
    cu_k: Option<CudaSlice<i32>>,
}

fn to_i32s(v: &[usize]) -> Vec<i32> {
    // Validated lengths are ≤ seq_q + seq_k or ≤ total_q/total_k, which dispatch::check_supported
    // bounds by i32::MAX.
    v.iter().map(|&x| i32::try_from(x).unwrap_or(i32::MAX)).collect()
}

impl CudaAttn {
    /// The backend on GPU `ordinal`'s default stream. No driver or no such GPU → `NoGpu`.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_library_present() {
            return Err(CudaAttnError::NoGpu {
                reason: "the CUDA driver library (libcuda) is not installed".into(),
            });
        }
        let count = CudaContext::device_count()?;
        if ordinal >= count.max(0) as usize {
            return Err(CudaAttnError::NoGpu {
                reason: format!("GPU {ordinal} requested, {count} present"),
            });
        }
        let ctx = CudaContext::new(ordinal)?;
        Ok(Self::with_stream(ctx.default_stream()))
    }

    /// The backend on a caller's stream (candle's, for instance), under [`KernelConfig::from_env`].
    /// Kernels load on first use.
    pub fn with_stream(stream: Arc<CudaStream>) -> Self {
        CudaAttn {
            stream,
            config: KernelConfig::from_env(),
        }
    }

    /// The backend on `stream` under `config` (A/B timings, tests of every kernel variant). A field
    /// out of its range is a [`CudaAttnError::Config`] error.
    pub fn with_config(stream: Arc<CudaStream>, config: KernelConfig) -> Result<Self> {
        config.check()?;
        Ok(CudaAttn { stream, config })
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The kernel configuration of this backend.
    pub fn config(&self) -> &KernelConfig {
        &self.config
    }

    fn decode(&self) -> crate::taylor::Decode<'_> {
        crate::taylor::Decode {
            stream: &self.stream,
            config: self.config,
        }
    }

    /// A Taylor decode state with no token folded yet, for the family and shapes of `spec` (a Taylor
    /// spec).
    pub fn taylor_decode_empty(&self, spec: &AttnSpec) -> Result<TaylorDecodeState> {
        self.decode().empty(spec)
    }

    /// Taylor prefill: the forward of a prompt (any Taylor spec: causal or not, key padding, packed
    /// varlen), writing `o` and the denominators into `io`, and the decode state over each batch
    /// entry's valid keys.
    pub fn taylor_prefill<T: DeviceElem>(
        &self,
        spec: &AttnSpec,
        io: ForwardViews<'_, T>,
    ) -> Result<TaylorDecodeState> {
        self.decode().prefill(spec, io)
    }

    /// A Taylor decode step: append the tokens `io` holds (described by `spec`: a dense batch of `t`
    /// new tokens per entry, `seq_q = seq_k = t`, causal) to `state`, and write their o and
    /// denominators into `io`. New token `i` sees every key folded before the call and the new keys
    /// `0..=i`.
    pub fn taylor_decode_step<T: DeviceElem>(
        &self,
        state: &mut TaylorDecodeState,
        spec: &AttnSpec,
        io: ForwardViews<'_, T>,
    ) -> Result<()> {
        self.decode().step(state, spec, io)
    }

    /// Forward on views (any element offset, strides from the spec).
    pub fn forward_views<T: DeviceElem>(&self, spec: &AttnSpec, io: ForwardViews<'_, T>) -> Result<()> {
        let ForwardViews {
            q,
            k,
            v,
            bias,
            mut o,
            mut lse,
        } = io;
        self.forward_impl(
            spec,
            FwdArgs {
                q: &q,
                k: &k,
                v: &v,
                bias: bias.as_ref().map(|b| b as In<'_, T>),
                o: &mut o,
                lse: &mut lse,
            },
        )
    }

    /// Backward on views.
    pub fn backward_views<T: DeviceElem>(&self, spec: &AttnSpec, io: BackwardViews<'_, T>) -> Result<()> {
        let BackwardViews {
            q,
            k,
            v,
            bias,
            o,
            d_o,
            lse,
            mut dq,
            mut dk,
            mut dv,
            mut dbias,
        } = io;
        self.backward_impl(
            spec,
            BwdArgs {
                q: &q,
                k: &k,
                v: &v,
                bias: bias.as_ref().map(|b| b as In<'_, T>),
                o: &o,
                d_o: &d_o,
                lse: &lse,
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
                dbias: dbias.as_mut().map(|b| b as Out<'_, T>),
            },
        )
    }

    fn prepare(&self, spec: &AttnSpec, pass: Pass) -> Result<(Arc<Kernels>, AttnParams, Lengths)> {
        let op = spec.op(pass);
        dispatch::check_supported(spec, pass)?;
        if spec.dtype() != DType::F32 {
            check_strides(spec, op)?;
        }
        let kernels = runtime::kernels_for(self.stream.context(), op)?;
        let mut params = AttnParams::from_spec(spec);
        // The work order's sections matter under a causal mask only (mask.h::tile_order; 0 elsewhere).
        if spec.causal() != Causal::None {
            let (section_q, section_k) =
                heuristics::causal_sections(spec.head_dim(), spec.seq_q(), spec.seq_k(), spec.group());
            // At most every (batch entry, head) pair, so section × tiles stays within the grid's i32 count.
            let pairs = spec.batch() * spec.heads_q();
            params.section_q = i32::try_from(section_q.min(pairs)).unwrap_or(i32::MAX);
            params.section_k = i32::try_from(section_k.min(pairs)).unwrap_or(i32::MAX);
        }
        let mut lengths = Lengths {
            key_lens: None,
            cu_q: None,
            cu_k: None,
        };
        match spec.lengths() {
            SeqLengths::Dense => {}
            SeqLengths::KeyPadding(lens) => {
                let d = self.stream.clone_htod(&to_i32s(lens))?;
                params.key_lens = d.device_ptr(&self.stream).0;
                lengths.key_lens = Some(d);
            }
            SeqLengths::Varlen {
                cu_seqlens_q,
                cu_seqlens_k,
            } => {
                let dq = self.stream.clone_htod(&to_i32s(cu_seqlens_q))?;
                let dk = self.stream.clone_htod(&to_i32s(cu_seqlens_k))?;
                params.cu_q = dq.device_ptr(&self.stream).0;
                params.cu_k = dk.device_ptr(&self.stream).0;
                lengths.cu_q = Some(dq);
                lengths.cu_k = Some(dk);
            }
        }
        Ok((kernels, params, lengths))
    }

    /// Whether a Taylor call runs on the flash kernels: [`crate::taylor::dense_on_flash`], and rows
    /// those kernels load (strides of whole 16-byte units, 16-byte aligned buffers on this device);
    /// otherwise the state kernels take it (and report any bad argument).
    fn taylor_on_flash<T>(&self, spec: &AttnSpec, pass: Pass, rows: &[In<'_, T>]) -> bool {
        let op = spec.op(pass);
        let Ok(kernels) = runtime::kernels_for(self.stream.context(), op) else {
            return false;
        };
        let ours = self.stream.context().cu_ctx();
        crate::taylor::dense_on_flash(spec, pass, kernels.hopper(&self.config))
            && check_strides(spec, op).is_ok()
            && rows
                .iter()
                .all(|b| b.stream().context().cu_ctx() == ours && b.device_ptr(&self.stream).0 % 16 == 0)
    }

    fn checker<'s>(&'s self, spec: &'s AttnSpec, pass: Pass) -> Checker<'s> {
        Checker {
            spec,
            op: spec.op(pass),
            pass,
            stream: &self.stream,
            tensor_cores: spec.dtype() != DType::F32,
        }
    }

    /// The forward of an empty call (crate::empty): buffers checked, o zeroed, the statistics set
    /// to the no-key value; no kernel.
    fn forward_empty<T: DeviceElem>(&self, spec: &AttnSpec, a: FwdArgs<'_, T>) -> Result<()> {
        let bias = bias_pair(spec, spec.op(Pass::Forward), a.bias, "bias")?;
        let c = Checker {
            tensor_cores: false,
            ..self.checker(spec, Pass::Forward)
        };
        let _ = c.input("q", a.q, spec.q_len())?;
        let _ = c.input("k", a.k, spec.k_len())?;
        let _ = c.input("v", a.v, spec.v_len())?;
        let _ = bias.map(|b| c.input("bias", b, spec.bias_len())).transpose()?;
        crate::empty::zero(&c, &self.stream, "o", a.o, spec.o_len())?;
        let what = if spec.family().is_softmax_like() {
            "lse"
        } else {
            "stats"
        };
        crate::empty::fill_stats(&c, &self.stream, what, a.lse)
    }

    /// The backward of an empty call: buffers checked, every gradient zeroed; no kernel.
    fn backward_empty<T: DeviceElem>(&self, spec: &AttnSpec, a: BwdArgs<'_, T>) -> Result<()> {
        let op = spec.op(Pass::Backward);
        let bias = bias_pair(spec, op, a.bias, "bias")?;
        let dbias = bias_pair(spec, op, a.dbias, "dbias")?;
        let c = Checker {
            tensor_cores: false,
            ..self.checker(spec, Pass::Backward)
        };
        let _ = c.input("q", a.q, spec.q_len())?;
        let _ = c.input("k", a.k, spec.k_len())?;
        let _ = c.input("v", a.v, spec.v_len())?;
        let _ = c.input("o", a.o, spec.o_len())?;
        let _ = c.input("d_o", a.d_o, spec.o_len())?;
        let what = if spec.family().is_softmax_like() {
            "lse"
        } else {
            "stats"
        };
        let _ = c.input(what, a.lse, spec.stats_len())?;
        let _ = bias.map(|b| c.input("bias", b, spec.bias_len())).transpose()?;
        crate::empty::zero(&c, &self.stream, "dq", a.dq, spec.dq_len())?;
        crate::empty::zero(&c, &self.stream, "dk", a.dk, spec.dk_len())?;
        crate::empty::zero(&c, &self.stream, "dv", a.dv, spec.dv_len())?;
        if let Some(db) = dbias {
            crate::empty::zero(&c, &self.stream, "dbias", db, spec.bias_len())?;
        }
        Ok(())
    }

    fn forward_impl<T: DeviceElem>(&self, spec: &AttnSpec, a: FwdArgs<'_, T>) -> Result<()> {
        let pass = Pass::Forward;
        let op = spec.op(pass);
        dtype_check::<T>(spec, op)?;
        if crate::empty::is_empty(spec) {
            return self.forward_empty(spec, a);
        }
        let taylor = matches!(spec.family(), FamilySpec::Taylor { .. });
        if taylor && !self.taylor_on_flash(spec, pass, &[a.q, a.k, a.v]) {
            let t = crate::taylor::Forward {
                q: a.q,
                k: a.k,
                v: a.v,
                bias: a.bias,
                o: a.o,
                stats: a.lse,
            };
            return crate::taylor::forward(&self.stream, self.config, spec, t);
        }
        let bias = bias_pair(spec, op, a.bias, "bias")?;
        // Few queries per kv head: the split-KV decode kernels (crate::decode).
        if bias.is_none() && crate::decode::plan::route(spec, &self.config) {
            return crate::decode::forward(self, spec, a.q, a.k, a.v, a.o, a.lse);
        }
        let (kernels, mut p, _lengths) = self.prepare(spec, pass)?;
        let c = self.checker(spec, pass);
        let (q, _gq) = c.input("q", a.q, spec.q_len())?;
        let (k, _gk) = c.input("k", a.k, spec.k_len())?;
        let (v, _gv) = c.input("v", a.v, spec.v_len())?;
        let bias = bias.map(|b| c.input("bias", b, spec.bias_len())).transpose()?;
        let (o, _go) = c.output("o", a.o, spec.o_len())?;
        let (lse, _gl) = c.output(if taylor { "stats" } else { "lse" }, a.lse, spec.stats_len())?;
        (p.q, p.k, p.v, p.o, p.lse) = (q, k, v, o, lse);
        p.bias = bias.as_ref().map(|(ptr, _)| *ptr).unwrap_or(0);
        let kernel = dispatch::flash_kernel(spec, Stage::Forward, kernels.hopper(&self.config))?;
        let keys_only = dispatch::forward_forms_q0(spec, &kernel);
        let scratch = self.hyperbolic_rows(spec, &kernels, &mut p, op, keys_only)?;
        // The Hopper forward reads cosine-sim's 1/‖q‖ and k̂ from the row kernels (the mma.sync one
        // computes the norms in its tiles).
        let norms = if kernel.hopper && qk_l2norm(spec) {
            Some(self.norm_rows::<T>(spec, &kernels, &mut p, op, (false, true))?)
        } else {
            None
        };
        let mut p = norms.as_ref().map_or(p, |n| n.hat(self, &p));
        // The warp-specialised forward's query tiles per (batch entry, head).
        if kernel.tiles_q > 0 {
            p.tiles_q = i32::try_from(kernel.tiles_q * spec.heads_q() * spec.batch())
                .map(|_| kernel.tiles_q as i32)
                .map_err(|_| CudaAttnError::Internal {
                    what: format!(
                        "{}: {} query tiles overflow the kernel's i32",
                        kernel.name, kernel.tiles_q
                    ),
                })?;
        }
        kernels.launch(&self.stream, &kernel, &p, op)?;
        drop((scratch, norms));
        Ok(())
    }

    /// Cosine-sim with l2-normalised q and k: allocate 1/‖q‖ and 1/‖k‖ (f32, one per row, indexed by
    /// the dq/dk offset / D), point `p` at them and enqueue the row kernels that fill them; with
    /// `hat` = (queries, keys) those row kernels also write q̂ or k̂ (the storage type, laid out as dq
    /// or dk) into scratch, which [`NormScratch::hat`] points a copy of `p` at. Returns the buffers, to
    /// be kept until the kernels that read them are enqueued.
    fn norm_rows<T: DeviceElem>(
        &self,
        spec: &AttnSpec,
        kernels: &Kernels,
        p: &mut AttnParams,
        op: Op,
        hat: (bool, bool),
    ) -> Result<NormScratch<T>> {
        let s = &self.stream;
        // SAFETY (each uninitialised allocation): the row kernels enqueued below write 1/‖x‖ (and x̂)
        // for every q row and every k row dk holds before any kernel reads them; the kernels read
        // no other entry.
        let rq = unsafe { s.alloc::<f32>((spec.total_q() * spec.heads_q()).max(1)) }?;
        let rk = unsafe { s.alloc::<f32>((spec.total_k() * spec.heads_kv()).max(1)) }?;
        (p.rq, p.rk) = (rq.device_ptr(s).0, rk.device_ptr(s).0);
        let hat_rows = |queries: bool, write: bool| -> Result<Option<CudaSlice<T>>> {
            let which = match (queries, write) {
                (true, false) => RowKernel::InvNormQ,
                (false, false) => RowKernel::InvNormK,
                (true, true) => RowKernel::NormaliseQ,
                (false, true) => RowKernel::NormaliseK,
            };
            let mut pn = *p;
            let buf = if write {
                let len = if queries { spec.dq_len() } else { spec.dk_len() };
                let buf = unsafe { s.alloc::<T>(len.max(1)) }?;
                *(if queries { &mut pn.dq } else { &mut pn.dk }) = buf.device_ptr(s).0;
                Some(buf)
            } else {
                None
            };
            kernels.launch(s, &dispatch::row_kernel(spec, which), &pn, op)?;
            Ok(buf)
        };
        let (q_hat, k_hat) = (hat_rows(true, hat.0)?, hat_rows(false, hat.1)?);
        Ok(NormScratch {
            _norms: vec![rq, rk],
            q_hat,
            k_hat,
        })
    }

    /// Hyperbolic only: allocate the per-row scalar scratch, point `p` at it and enqueue the row
    /// kernels that fill it. Returns the buffers, to be kept until the kernels that read them are
    /// enqueued (cudarc frees them in stream order). Nothing for the other families. `keys_only`
    /// (a forward that forms q0 from its own Q tile, [`dispatch::forward_forms_q0`]): only the key
    /// rows' scalars are written, and the kernel after it reads no query row's.
    fn hyperbolic_rows(
        &self,
        spec: &AttnSpec,
        kernels: &Kernels,
        p: &mut AttnParams,
        op: Op,
        keys_only: bool,
    ) -> Result<Vec<CudaSlice<f32>>> {
        let FamilySpec::Hyperbolic { aggregation, .. } = *spec.family() else {
            return Ok(Vec::new());
        };
        let s = &self.stream;
        let (rows_q, rows_k) = (spec.stats_len().max(1), (spec.total_k() * spec.heads_kv()).max(1));
        // SAFETY (each uninitialised allocation): the row kernels enqueued below write q0 and ‖q‖ for
        // every query row (not with `keys_only`, whose forward reads neither) and k0, ‖k‖ (log γ,
        // c γ² with the midpoint) for every key row dk holds, before any kernel reads them; the
        // kernels read no other entry.
        let mut bufs = Vec::new();
        for n in [rows_q, rows_q, rows_k, rows_k] {
            bufs.push(unsafe { s.alloc::<f32>(n) }?);
        }
        if aggregation == Aggregation::EinsteinMidpoint {
            for _ in 0..2 {
                bufs.push(unsafe { s.alloc::<f32>(rows_k) }?);
            }
        }
        let ptrs: Vec<u64> = bufs.iter().map(|b| b.device_ptr(s).0).collect();
        (p.x0q, p.nq, p.x0k, p.nk) = (ptrs[0], ptrs[1], ptrs[2], ptrs[3]);
        if let [.., lgk, dgk] = ptrs[4..] {
            (p.lgk, p.dgk) = (lgk, dgk);
        }
        let rows = if keys_only {
            RowKernel::HypRowsKeys
        } else {
            RowKernel::HypRows
        };
        kernels.launch(s, &dispatch::row_kernel(spec, rows), p, op)?;
        Ok(bufs)
    }

    fn backward_impl<T: DeviceElem>(&self, spec: &AttnSpec, a: BwdArgs<'_, T>) -> Result<()> {
        let pass = Pass::Backward;
        let op = spec.op(pass);
        dtype_check::<T>(spec, op)?;
        if crate::empty::is_empty(spec) {
            return self.backward_empty(spec, a);
        }
        let taylor = matches!(spec.family(), FamilySpec::Taylor { .. });
        if taylor && !self.taylor_on_flash(spec, pass, &[a.q, a.k, a.v, a.o, a.d_o]) {
            let t = crate::taylor::Backward {
                q: a.q,
                k: a.k,
                v: a.v,
                bias: a.bias,
                o: a.o,
                d_o: a.d_o,
                stats: a.lse,
                dq: a.dq,
                dk: a.dk,
                dv: a.dv,
                dbias: a.dbias,
            };
            return crate::taylor::backward(&self.stream, self.config, spec, t);
        }
        let bias = bias_pair(spec, op, a.bias, "bias")?;
        let dbias = bias_pair(spec, op, a.dbias, "dbias")?;
        let (kernels, mut p, _lengths) = self.prepare(spec, pass)?;
        let c = self.checker(spec, pass);
        let (q, _gq) = c.input("q", a.q, spec.q_len())?;
        let (k, _gk) = c.input("k", a.k, spec.k_len())?;
        let (v, _gv) = c.input("v", a.v, spec.v_len())?;
        let (o, _go) = c.input("o", a.o, spec.o_len())?;
        let (d_o, _gdo) = c.input("d_o", a.d_o, spec.o_len())?;
        let (lse, _gl) = c.input(if taylor { "stats" } else { "lse" }, a.lse, spec.stats_len())?;
        let bias = bias.map(|b| c.input("bias", b, spec.bias_len())).transpose()?;
        let (dq, _gdq) = c.output("dq", a.dq, spec.dq_len())?;
        let (dk, _gdk) = c.output("dk", a.dk, spec.dk_len())?;
        let (dv, _gdv) = c.output("dv", a.dv, spec.dv_len())?;
        let dbias = dbias.map(|b| c.output("dbias", b, spec.bias_len())).transpose()?;
        (p.q, p.k, p.v, p.o, p.d_o, p.lse) = (q, k, v, o, d_o, lse);
        (p.dq, p.dk, p.dv) = (dq, dk, dv);
        p.bias = bias.as_ref().map(|(ptr, _)| *ptr).unwrap_or(0);
        p.dbias = dbias.as_ref().map(|(ptr, _)| *ptr).unwrap_or(0);

        // Scratch (f32, stream-ordered allocations freed in stream order).
        let s = &self.stream;
        // SAFETY (each uninitialised allocation below): every element is written by a kernel
        // enqueued before any kernel that reads it: δ and the log2 LSE by the delta kernel (every
        // query row), the reciprocal norms by the inv-norm kernels (every q row, every k row dk
        // holds), dq̂ by the dQ kernel (the fused kernel's dQ scratch is zeroed instead) and dk̂ by
        // the mma.sync dK/dV kernel (every row of dq and dk, zeros for padded keys).
        // δ, then the LSE in log2 units (both written by the delta kernel; the second half is what the
        // warp-specialised dK/dV kernel copies).
        let delta = unsafe { s.alloc::<f32>((2 * spec.stats_len()).max(1)) }?;
        p.delta = delta.device_ptr(s).0;
        let norms = qk_l2norm(spec);
        let fused = dispatch::fused_backward(spec, kernels.hopper(&self.config));
        let mut scratch = Vec::new();
        if fused {
            // Zeroed: the fused kernel adds every key block's dQ into it. The warp-specialised one
            // in its tiled layout: every (head, query row) × head dim, the statistics order.
            let tiled = dispatch::fused_dq_tiled(spec, kernels.hopper(&self.config));
            p.dq_acc_tiled = i32::from(tiled);
            let len = if tiled {
                spec.stats_len() * spec.head_dim()
            } else {
                spec.dq_len()
            };
            let dq_acc = s.alloc_zeros::<f32>(len.max(1))?;
            p.dq_acc = dq_acc.device_ptr(s).0;
            scratch.push(dq_acc);
        } else if norms {
            let dq_acc = unsafe { s.alloc::<f32>(spec.dq_len().max(1)) }?;
            p.dq_acc = dq_acc.device_ptr(s).0;
            scratch.push(dq_acc);
        }
        let flash = if fused {
            vec![dispatch::flash_kernel(
                spec,
                Stage::BwdFused,
                kernels.hopper(&self.config),
            )?]
        } else {
            vec![
                dispatch::flash_kernel(spec, Stage::BwdDq, kernels.hopper(&self.config))?,
                dispatch::flash_kernel(spec, Stage::BwdDkdv, kernels.hopper(&self.config))?,
            ]
        };
        // Cosine-sim: the Hopper kernels read q̂ and k̂ (NormScratch::hat); the mma.sync ones scale by
        // the reciprocal norms in their tiles; the l2-norm's row kernels read the raw rows. A Hopper
        // dK/dV kernel (the last of `flash`, fused or not) projects dk̂ through the l2-norm itself
        // and writes dk; the mma.sync one leaves dk̂ in f32 for the row kernel.
        let dk_in_kernel = flash.last().is_some_and(|k| k.hopper);
        let mut norm_scratch = None;
        if norms {
            if !dk_in_kernel {
                let dk_acc = unsafe { s.alloc::<f32>(spec.dk_len().max(1)) }?;
                p.dk_acc = dk_acc.device_ptr(s).0;
                scratch.push(dk_acc);
            }
            let hopper = flash.iter().any(|k| k.hopper);
            norm_scratch = Some(self.norm_rows::<T>(spec, &kernels, &mut p, op, (hopper, hopper))?);
        }
        if spec.bias().is_some() {
            // Zeroed: the dQ kernel writes dS only where the mask allows a pair.
            let full = spec.batch() * spec.heads_q() * spec.seq_q() * spec.seq_k();
            let ds = s.alloc_zeros::<f32>(full.max(1))?;
            p.ds = ds.device_ptr(s).0;
            scratch.push(ds);
        }

        let hyperbolic = self.hyperbolic_rows(spec, &kernels, &mut p, op, false)?;
        let hyperbolic_fused = fused && spec.family_kind() == FamilyKind::Hyperbolic;
        if hyperbolic_fused {
            // Zeroed: the fused kernel adds every key block's share of dQ's row sums into it.
            let rowsum = s.alloc_zeros::<f32>(spec.stats_len().max(1))?;
            p.dq_rowsum = rowsum.device_ptr(s).0;
            scratch.push(rowsum);
        }
        let p_hat = norm_scratch.as_ref().map_or(p, |n| n.hat(self, &p));
        let launch = |k: dispatch::Kernel| kernels.launch(s, &k, &p, op);
        launch(dispatch::row_kernel(spec, RowKernel::Delta))?;
        for k in &flash {
            kernels.launch(s, k, if k.hopper { &p_hat } else { &p }, op)?;
        }
        if fused {
            if hyperbolic_fused {
                launch(dispatch::row_kernel(spec, RowKernel::HypDqStore))?;
            } else if !norms {
                launch(dispatch::row_kernel(spec, RowKernel::DqStore))?;
            }
        }
        if norms {
            launch(dispatch::row_kernel(spec, RowKernel::L2normBwdQ))?;
            if !dk_in_kernel {
                launch(dispatch::row_kernel(spec, RowKernel::L2normBwdK))?;
            }
        }
        if spec.bias().is_some() {
            launch(dispatch::row_kernel(spec, RowKernel::DbiasReduce))?;
        }
        drop(scratch);
        drop(norm_scratch);
        drop(hyperbolic);
        drop(delta);
        Ok(())
    }
}

impl<T: DeviceElem> AttnBackend<CudaSlice<T>, CudaSlice<f32>> for CudaAttn {
    type Error = CudaAttnError;

    fn name(&self) -> &'static str {
        dispatch::BACKEND
    }

    fn forward(&self, spec: &AttnSpec, io: ForwardIo<'_, CudaSlice<T>, CudaSlice<f32>>) -> Result<()> {
        self.forward_impl(
            spec,
            FwdArgs {
                q: io.q,
                k: io.k,
                v: io.v,
                bias: io.bias.map(|b| b as In<'_, T>),
                o: io.o,
                lse: io.stats,
            },
        )
    }

    fn backward(&self, spec: &AttnSpec, io: BackwardIo<'_, CudaSlice<T>, CudaSlice<f32>>) -> Result<()> {
        self.backward_impl(
            spec,
            BwdArgs {
                q: io.q,
                k: io.k,
                v: io.v,
                bias: io.bias.map(|b| b as In<'_, T>),
                o: io.o,
                d_o: io.d_o,
                lse: io.stats,
                dq: io.dq,
                dk: io.dk,
                dv: io.dv,
                dbias: io.dbias.map(|b| b as Out<'_, T>),
            },
        )
    }
}

/// Cosine-sim's row scratch: 1/‖q‖ and 1/‖k‖ (f32), and for the Hopper kernels the normalised rows
/// q̂, k̂ in the storage type, laid out as dq and dk. Kept until the kernels that read it are enqueued
/// (cudarc frees in stream order).
struct NormScratch<T: DeviceElem> {
    _norms: Vec<CudaSlice<f32>>,
    q_hat: Option<CudaSlice<T>>,
    k_hat: Option<CudaSlice<T>>,
}

impl<T: DeviceElem> NormScratch<T> {
    /// `p` with its queries and keys read from q̂ and k̂ where those were written (dq, dk strides).
    fn hat(&self, a: &CudaAttn, p: &AttnParams) -> AttnParams {
        let s = &a.stream;
        let mut ph = *p;
        if let Some(q) = &self.q_hat {
            (ph.q, ph.q_batch, ph.q_seq, ph.q_head) = (q.device_ptr(s).0, p.dq_batch, p.dq_seq, p.dq_head);
        }
        if let Some(k) = &self.k_hat {
            (ph.k, ph.k_batch, ph.k_seq, ph.k_head) = (k.device_ptr(s).0, p.dk_batch, p.dk_seq, p.dk_head);
        }
        ph
    }
}

/// Whether the CUDA driver library can be loaded. cudarc's own probe exists only in its
/// dynamic-loading mode, and candle's `cuda` feature switches cudarc to dynamic linking.
fn driver_library_present() -> bool {
    ["libcuda.so.1", "libcuda.so", "nvcuda.dll"].iter().any(|name| {
        // SAFETY: loading the driver library runs only its own initialisers; dropped at once.
        unsafe { libloading::Library::new(*name) }.is_ok()
    })
}

/// Whether the kernels were compiled into this build (false: every call returns `KernelsNotBuilt`).
pub fn kernels_built() -> bool {
    runtime::kernels_built()
}
