//! Recurrent Taylor decode on the GPU: a state a caller carries between calls, a prefill that returns
//! it, and a step that appends tokens (the CPU reference is `attn_cpu_ref::decode`).
//!
//! The state holds, per (batch entry, kv head), `S[f][·] = Σ_j φ_f(k̂_j) ṽ_j` over every feature `f`
//! of the head (`8·tiles`: 1 + D for order 1, + the D(D+1)/2 pairs for order 2, in 8-wide tiles) and the
//! `M = Dv + 1` columns of `ṽ = [v, 1]`, in f32. A new token `i` folds in as `S += φ(k̂_i) ṽ_iᵀ` and
//! each query head of its group reads `[num, den] = Σ_f ψ_f(u_i) S[f]`: `O(features·M)` per kv head and
//! token, i.e. `O(D^p·Dv)`. Each block of 64 features writes its part of the sum, and one pass adds the
//! parts in order (the same bits on every run).

use super::heuristics::{self, DECODE_FEATURES};
use super::{check, Call, Forward};
use crate::check::Checker;
use crate::config::KernelConfig;
use crate::error::Result;
use crate::views::{DeviceElem, ForwardViews};
use attn_core::{AttnError, AttnSpec, Pass};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use std::sync::Arc;

/// What a [`TaylorDecodeState`] was built for (attn-core's, the same type the CPU decode wraps).
pub use attn_core::DecodeShape;

/// The running sums of a Taylor decode, on the device that built them.
pub struct TaylorDecodeState {
    shape: DecodeShape,
    /// Feature rows per (batch entry, kv head): `8·tiles` of the shape's order and head dim.
    features: usize,
    lens: Vec<usize>,
    sums: CudaSlice<f32>,
}

impl TaylorDecodeState {
    pub fn shape(&self) -> &DecodeShape {
        &self.shape
    }
    /// Feature rows of the state per (batch entry, kv head): `8·tiles` (1 + D for order 1, + the
    /// D(D+1)/2 pairs for order 2, in 8-wide tiles).
    pub fn features(&self) -> usize {
        self.features
    }
    /// Tokens folded so far into batch entry `b`.
    pub fn len(&self, b: usize) -> usize {
        self.lens[b]
    }
    /// Whether no batch entry has a token yet.
    pub fn is_empty(&self) -> bool {
        self.lens.iter().all(|&l| l == 0)
    }
    /// The sums, `[B, Hkv, features, Dv + 1]` f32.
    pub fn sums(&self) -> &CudaSlice<f32> {
        &self.sums
    }
}

/// The decode entry points of `CudaAttn` (`taylor_decode_empty`, `taylor_prefill`,
/// `taylor_decode_step`, which document them) on a stream under a kernel configuration.
pub(crate) struct Decode<'s> {
    pub stream: &'s Arc<CudaStream>,
    pub config: KernelConfig,
}

impl Decode<'_> {
    /// A state with no token folded yet, for the family and shapes of `spec` (a Taylor spec).
    pub(crate) fn empty(&self, spec: &AttnSpec) -> Result<TaylorDecodeState> {
        let shape = DecodeShape::of(spec, Pass::Decode)?;
        check_head_dims(spec)?;
        let features = 8 * heuristics::tiles(shape.head_dim, shape.taylor()?.0.as_u8());
        let n = spec.batch() * spec.heads_kv() * features * heuristics::width(spec.head_dim());
        Ok(TaylorDecodeState {
            shape,
            features,
            lens: vec![0; spec.batch()],
            sums: self.stream.alloc_zeros::<f32>(n.max(1))?,
        })
    }

    /// Prefill: the forward of a prompt (any Taylor spec: causal or not, key padding, packed varlen),
    /// writing `o` and the denominators into `io`, and the decode state over each batch entry's valid keys.
    pub(crate) fn prefill<T: DeviceElem>(
        &self,
        spec: &AttnSpec,
        io: ForwardViews<'_, T>,
    ) -> Result<TaylorDecodeState> {
        let pass = Pass::Forward;
        check::<T>(spec, pass)?;
        let mut state = self.empty(spec)?;
        let ForwardViews {
            q,
            k,
            v,
            bias,
            mut o,
            mut lse,
        } = io;
        // No query row or no key (crate::empty): o zeros and denominators 0 without a kernel; with
        // no key at all the state stays empty, otherwise the keys are folded below.
        let empty = crate::empty::is_empty(spec);
        if empty {
            if bias.is_some() {
                super::no_bias(spec, pass, "bias", true)?;
            }
            let c = Checker {
                spec,
                op: spec.op(pass),
                pass,
                stream: self.stream,
                tensor_cores: false,
            };
            let _ = c.input("q", &q, spec.q_len())?;
            crate::empty::zero(&c, self.stream, "o", &mut o, spec.o_len())?;
            crate::empty::fill_stats(&c, self.stream, "stats", &mut lse)?;
            if spec.total_k() == 0 {
                let _ = c.input("k", &k, spec.k_len())?;
                let _ = c.input("v", &v, spec.v_len())?;
                return Ok(state);
            }
        }
        let call = Call::new(self.stream, self.config, spec, pass)?;
        let (mut p, _lengths) = call.params()?;
        if !empty {
            super::forward_impl(
                &call,
                &mut p,
                Forward {
                    q: &q,
                    k: &k,
                    v: &v,
                    bias: bias.as_ref().map(|b| b as &dyn DevicePtr<T>),
                    o: &mut o,
                    stats: &mut lse,
                },
            )?;
        }
        let d = spec.head_dim();
        // The prefill reads k and v again: hold their stream guards until it is enqueued.
        let c = call.checker(pass);
        let (k_ptr, _gk) = c.input("k", &k, spec.k_len())?;
        let (v_ptr, _gv) = c.input("v", &v, spec.v_len())?;
        (p.base.k, p.base.v) = (k_ptr, v_ptr);
        p.state = state.sums.device_ptr(call.stream).0;
        p.features = state.features as i32;
        call.run(
            super::Launch {
                name: format!(
                    "attn_taylor_decode_prefill_{}_d{d}",
                    super::dtype_tag(spec.dtype())
                ),
                grid: (
                    heuristics::blocks(state.features, DECODE_FEATURES),
                    spec.heads_kv(),
                    spec.batch(),
                ),
                smem: 0,
            },
            &p,
        )?;
        for (b, len) in state.lens.iter_mut().enumerate() {
            *len = spec.seq_lens(b).k;
        }
        Ok(state)
    }

    /// A decode step: append the tokens `io` holds (described by `spec`: a dense batch of `t` new tokens
    /// per entry, `seq_q = seq_k = t`, causal) to `state`, and write their o and denominators into `io`.
    /// New token `i` sees every key folded before the call and the new keys `0..=i`.
    pub(crate) fn step<T: DeviceElem>(
        &self,
        state: &mut TaylorDecodeState,
        spec: &AttnSpec,
        io: ForwardViews<'_, T>,
    ) -> Result<()> {
        let pass = Pass::Decode;
        check::<T>(spec, pass)?;
        state.shape.check_step(spec)?;
        check_state_device(state, spec, self.stream)?;
        if io.bias.is_some() {
            super::no_bias(spec, pass, "bias", true)?;
        }
        // A step of no token (t = 0) or of an empty batch appends nothing and writes nothing.
        if crate::empty::is_empty(spec) {
            let c = Checker {
                spec,
                op: spec.op(pass),
                pass,
                stream: self.stream,
                tensor_cores: false,
            };
            let _ = c.input("q", &io.q, spec.q_len())?;
            let _ = c.input("k", &io.k, spec.k_len())?;
            let _ = c.input("v", &io.v, spec.v_len())?;
            let ForwardViews { mut o, mut lse, .. } = io;
            crate::empty::zero(&c, self.stream, "o", &mut o, spec.o_len())?;
            return crate::empty::fill_stats(&c, self.stream, "stats", &mut lse);
        }
        let call = Call::new(self.stream, self.config, spec, pass)?;
        let (mut p, _lengths) = call.params()?;
        let c = call.checker(pass);
        let (q, _gq) = c.input("q", &io.q, spec.q_len())?;
        let (k, _gk) = c.input("k", &io.k, spec.k_len())?;
        let (v, _gv) = c.input("v", &io.v, spec.v_len())?;
        let ForwardViews { mut o, mut lse, .. } = io;
        let (o, _go) = c.output("o", &mut o, spec.o_len())?;
        let (stats, _gs) = c.output("stats", &mut lse, spec.stats_len())?;
        (p.base.q, p.base.k, p.base.v, p.base.o, p.base.lse) = (q, k, v, o, stats);
        let (d, m) = (spec.head_dim(), heuristics::width(spec.head_dim()));
        let sums_len = spec.total_q() * spec.heads_q() * m;
        let blocks = heuristics::blocks(state.features, DECODE_FEATURES);
        let (_acc, acc) = call.scratch(sums_len)?;
        // SAFETY (uninitialised): block σ of the step writes partial σ of every query row and column.
        let partials = unsafe { call.stream.alloc::<f32>(blocks * sums_len) }?;
        p.acc_q = acc;
        p.set_decode_partials(partials.device_ptr(call.stream).0);
        p.set_decode_blocks(blocks as i32);
        let (sums, _gsum) = state.sums.device_ptr_mut(call.stream);
        p.state = sums;
        p.features = state.features as i32;
        call.run(
            super::Launch {
                name: format!("attn_taylor_decode_step_{}_d{d}", super::dtype_tag(spec.dtype())),
                grid: (blocks, spec.heads_kv(), spec.batch()),
                smem: heuristics::decode_step_smem(d, spec.group()),
            },
            &p,
        )?;
        call.run(
            super::Launch {
                name: "attn_taylor_decode_reduce".into(),
                grid: (heuristics::blocks(sums_len, heuristics::THREADS as usize), 1, 1),
                smem: 0,
            },
            &p,
        )?;
        call.run(call.rows("finalize_fwd", false), &p)?;
        state.lens.iter_mut().for_each(|l| *l += spec.seq_q());
        Ok(())
    }
}

/// The state's sums live in the context of the call's stream: a state built on another device (another
/// context) is an error naming it, never a foreign pointer handed to a kernel. A state built by another
/// `CudaAttn` of the same context (another stream) is fine: its last use is ordered before the step by
/// the buffer's stream events.
fn check_state_device(state: &TaylorDecodeState, spec: &AttnSpec, stream: &CudaStream) -> Result<()> {
    let built = state.sums.stream().context();
    let here = stream.context();
    if built.cu_ctx() != here.cu_ctx() {
        return Err(AttnError::InvalidArgument {
            op: spec.op(Pass::Decode),
            arg: "state",
            reason: format!(
                "the decode state was built on CUDA device {} (another context) but the step runs on device {}",
                built.ordinal(),
                here.ordinal()
            ),
        }
        .into());
    }
    Ok(())
}

/// A decode state exists for the head dims the kernels support (the family is `DecodeShape::of`'s).
fn check_head_dims(spec: &AttnSpec) -> Result<()> {
    if !heuristics::HEAD_DIMS.contains(&spec.head_dim()) || spec.head_dim_v() != spec.head_dim() {
        return Err(super::unsupported(
            spec.op(Pass::Decode),
            format!(
                "taylor decode with head dims ({}, {}) (supported: equal, one of {:?})",
                spec.head_dim(),
                spec.head_dim_v(),
                heuristics::HEAD_DIMS
            ),
        )
        .into());
    }
    Ok(())
}
