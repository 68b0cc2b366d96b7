//! One attention call as Candle custom ops, with a backward that runs the backend's backward pass.
//!
//! Forward, per (batch, query head): `o_i = Σ_j w_ij v_j / Σ_j w_ij` with the family's weights and
//! the mask of the checked [`AttnSpec`]; the statistics it saves (`LSE_i` for the softmax-like
//! families, `den_i = Σ_j f(s_ij)` for Taylor; f32 `[B, Hq, Nq]`, `[Hq, total_q]` when packed) stay
//! in the shared [`Call`] for the backward, which never recomputes them.
//! Backward, given `g = dL/do`: `dq`, `dk`, `dv` (and `dbias = dS`, summed over broadcast dims) from
//! the backend's backward with those statistics (the gradients per family in docs/math.md).
//!
//! Candle's `CustomOp3` has three tensor slots, so a call is at most two ops:
//! - [`AttnOp`], a `CustomOp3` over `(q, k, v)`, computes `o` and saves the statistics. Without a
//!   bias its backward computes `dq, dk, dv`.
//! - With a bias, [`BiasLink`], a `CustomOp2` over `(o, bias)`, returns `o` unchanged and puts the
//!   bias into the graph. Candle runs backwards from the loss, so `BiasLink`'s backward runs first:
//!   it runs the one backward pass, returns `dbias` (and `g` for `o`), and parks `dq, dk, dv` in the
//!   [`Call`], where `AttnOp`'s backward picks them up. `o` itself is internal (only `BiasLink`
//!   reads it), so the `g` `AttnOp` then receives is the one the parked gradients were computed for.
//!
//! Inputs are read in place: the spec's strides come from each tensor's layout and the data from
//! the layout's start offset, so transposed views are never copied. The CPU path runs
//! attn-cpu-ref's f32-accumulating `fast` path on the storage dtype (every family; Taylor through
//! its chunked factorised states); with the `cuda` feature, CUDA tensors run attn-cuda on
//! candle's stream ([`cuda`]), forward and backward. Metal tensors get candle's "no metal
//! implementation" error.

use crate::error::{internal, to_candle};
use attn_core::{AttnError, AttnSpec, DType, Element, FamilyKind, Pass};
use attn_cpu_ref::Inputs;
use candle_core::{
    CpuStorage, CustomOp2, CustomOp3, Device, Layout, Result, Shape, Storage, Tensor, WithDType,
};
use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(feature = "cuda")]
mod cuda;

/// One attention call: its checked spec, detached handles on its inputs, and what the forward
/// leaves for the backward.
pub(crate) struct Call {
    spec: AttnSpec,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// Contiguous `[B|1, Hq|1, Nq, Nk]`, present exactly when the spec has a bias.
    bias: Option<Tensor>,
    /// Statistics saved by the forward.
    stats: Mutex<Option<Tensor>>,
    /// `[dq, dk, dv]` computed by [`BiasLink`]'s backward for [`AttnOp`]'s backward to return.
    parked: Mutex<Option<[Tensor; 3]>>,
}

/// The gradients of one backward pass, shaped like the inputs.
struct Grads {
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    dbias: Option<Tensor>,
}

/// Poisoning only records that another holder panicked; the `Option` inside is still consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn op_name(kind: FamilyKind) -> &'static str {
    match kind {
        FamilyKind::Softmax => "attn_softmax",
        FamilyKind::CosineSim => "attn_cosine_sim",
        FamilyKind::Taylor => "attn_taylor",
        FamilyKind::Hyperbolic => "attn_hyperbolic",
    }
}

fn link_name(kind: FamilyKind) -> &'static str {
    match kind {
        FamilyKind::Softmax => "attn_softmax_bias",
        FamilyKind::CosineSim => "attn_cosine_sim_bias",
        FamilyKind::Taylor => "attn_taylor_bias",
        FamilyKind::Hyperbolic => "attn_hyperbolic_bias",
    }
}

/// The elements of a CPU buffer from `layout`'s start offset on; the spec's strides address the rest.
fn cpu_elems<'a, E: WithDType>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [E]> {
    let data = storage.as_slice::<E>()?;
    data.get(layout.start_offset()..).ok_or_else(|| {
        candle_core::Error::msg(format!(
            "attn-candle: start offset {} beyond a buffer of {} elements",
            layout.start_offset(),
            data.len()
        ))
    })
}

/// The host elements of a tensor's storage: CPU tensors only (the CUDA path has its own kernels).
fn host<'a, E: WithDType>(
    spec: &AttnSpec,
    pass: Pass,
    what: &str,
    storage: &'a Storage,
    layout: &Layout,
) -> Result<&'a [E]> {
    match storage {
        Storage::Cpu(s) => cpu_elems(s, layout),
        other => Err(to_candle(AttnError::Unsupported {
            op: spec.op(pass),
            backend: "attn-candle",
            what: format!(
                "`{what}` on {:?} in the CPU path (q {}, k {}, v {})",
                other.device().location(),
                attn_core::shape_str(&spec.q_shape()),
                attn_core::shape_str(&spec.k_shape()),
                attn_core::shape_str(&spec.v_shape())
            ),
        })),
    }
}

impl Call {
    /// Apply the call to `q`, `k`, `v` (and the bias): the output `o`, and the call holding the
    /// forward's statistics.
    pub(crate) fn run(
        spec: AttnSpec,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        bias: Option<&Tensor>,
    ) -> Result<(Tensor, Arc<Call>)> {
        let call = Arc::new(Call {
            spec,
            q: q.detach(),
            k: k.detach(),
            v: v.detach(),
            bias: bias.map(Tensor::detach),
            stats: Mutex::new(None),
            parked: Mutex::new(None),
        });
        let o = q.apply_op3(k, v, AttnOp(call.clone()))?;
        let o = match bias {
            Some(b) => o.apply_op2(b, BiasLink(call.clone()))?,
            None => o,
        };
        Ok((o, call))
    }

    /// The statistics the forward saved (detached; f32).
    pub(crate) fn stats(&self) -> Result<Tensor> {
        lock(&self.stats).clone().ok_or_else(|| {
            internal(
                self.spec.op(Pass::Forward),
                "the forward saved no statistics".into(),
            )
        })
    }

    fn stats_shape(&self) -> Vec<usize> {
        let s = &self.spec;
        if s.is_varlen() {
            vec![s.heads_q(), s.total_q()]
        } else {
            vec![s.batch(), s.heads_q(), s.seq_q()]
        }
    }

    fn forward_cpu<E: Element + WithDType>(
        &self,
        q: (&CpuStorage, &Layout),
        k: (&CpuStorage, &Layout),
        v: (&CpuStorage, &Layout),
    ) -> Result<CpuStorage> {
        let spec = &self.spec;
        let bias = self.bias.as_ref().map(Tensor::storage_and_layout);
        let bias = match &bias {
            Some((s, l)) => Some(host::<E>(spec, Pass::Forward, "bias", s, l)?),
            None => None,
        };
        let x = Inputs {
            q: cpu_elems(q.0, q.1)?,
            k: cpu_elems(k.0, k.1)?,
            v: cpu_elems(v.0, v.1)?,
            bias,
        };
        // The f32-accumulating fast path (every family today); the reference for any it lacks.
        let f = if attn_cpu_ref::fast::supports(spec) {
            attn_cpu_ref::fast::forward::<E>(spec, x)
        } else {
            attn_cpu_ref::forward::<E>(spec, x)
        }
        .map_err(to_candle)?;
        let stats = Tensor::from_vec(f.stats, self.stats_shape(), &Device::Cpu)?;
        *lock(&self.stats) = Some(stats);
        Ok(E::to_cpu_storage_owned(f.o))
    }

    /// One backward pass for the upstream gradient `d_o` of the output `o`, on the device of the
    /// inputs.
    fn backward(&self, o: &Tensor, d_o: &Tensor) -> Result<Grads> {
        let d_o = dense(d_o)?;
        let stats = self.stats()?;
        #[cfg(feature = "cuda")]
        if let Some(dev) = cuda::device_of(&self.q) {
            return match self.spec.dtype() {
                DType::F32 => self.backward_cuda::<f32>(dev, o, &d_o, &stats),
                DType::F16 => self.backward_cuda::<half::f16>(dev, o, &d_o, &stats),
                DType::BF16 => self.backward_cuda::<half::bf16>(dev, o, &d_o, &stats),
            };
        }
        match self.spec.dtype() {
            DType::F32 => self.backward_host::<f32>(o, &d_o, &stats),
            DType::F16 => self.backward_host::<half::f16>(o, &d_o, &stats),
            DType::BF16 => self.backward_host::<half::bf16>(o, &d_o, &stats),
        }
    }

    fn backward_host<E: Element + WithDType>(
        &self,
        o: &Tensor,
        d_o: &Tensor,
        stats: &Tensor,
    ) -> Result<Grads> {
        let (spec, pass) = (&self.spec, Pass::Backward);
        let (qs, ql) = self.q.storage_and_layout();
        let (ks, kl) = self.k.storage_and_layout();
        let (vs, vl) = self.v.storage_and_layout();
        let (os, ol) = o.storage_and_layout();
        let (gs, gl) = d_o.storage_and_layout();
        let (ss, sl) = stats.storage_and_layout();
        let bias = self.bias.as_ref().map(Tensor::storage_and_layout);
        let bias = match &bias {
            Some((s, l)) => Some(host::<E>(spec, pass, "bias", s, l)?),
            None => None,
        };
        let x = Inputs {
            q: host(spec, pass, "q", &qs, ql)?,
            k: host(spec, pass, "k", &ks, kl)?,
            v: host(spec, pass, "v", &vs, vl)?,
            bias,
        };
        let o_host = host(spec, pass, "o", &os, ol)?;
        let d_o_host = host(spec, pass, "d_o", &gs, gl)?;
        let stats_host = host::<f32>(spec, pass, "stats", &ss, sl)?;
        let g = if attn_cpu_ref::fast::supports(spec) {
            attn_cpu_ref::fast::backward::<E>(spec, x, o_host, d_o_host, stats_host)
        } else {
            attn_cpu_ref::backward::<E>(spec, x, o_host, d_o_host, stats_host)
        }
        .map_err(to_candle)?;
        let dev = self.q.device();
        let dbias = match (g.dbias, &self.bias) {
            (Some(d), Some(b)) => Some(Tensor::from_vec(d, b.shape(), dev)?),
            _ => None,
        };
        Ok(Grads {
            dq: Tensor::from_vec(g.dq, self.q.shape(), dev)?,
            dk: Tensor::from_vec(g.dk, self.k.shape(), dev)?,
            dv: Tensor::from_vec(g.dv, self.v.shape(), dev)?,
            dbias,
        })
    }
}

/// `t` as a dense row-major tensor starting at an element offset that is a multiple of 8 (16 bytes
/// in f16/bf16, as the GPU kernels' vector loads of dO need): `t` itself when it already is one,
/// else a copy. Upstream gradients are usually fresh dense tensors; a broadcast one (after a sum)
/// is copied.
fn dense(t: &Tensor) -> Result<Tensor> {
    if t.is_contiguous() && t.layout().start_offset() % 8 == 0 {
        Ok(t.clone())
    } else {
        t.force_contiguous()
    }
}

/// The attention op over `(q, k, v)`; see the module docs.
struct AttnOp(Arc<Call>);

impl CustomOp3 for AttnOp {
    fn name(&self) -> &'static str {
        op_name(self.0.spec.family_kind())
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let call = &self.0;
        let (q, k, v) = ((s1, l1), (s2, l2), (s3, l3));
        let o = match call.spec.dtype() {
            DType::F32 => call.forward_cpu::<f32>(q, k, v)?,
            DType::F16 => call.forward_cpu::<half::f16>(q, k, v)?,
            DType::BF16 => call.forward_cpu::<half::bf16>(q, k, v)?,
        };
        Ok((o, Shape::from(call.spec.o_shape())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let call = &self.0;
        let (q, k, v) = ((s1, l1), (s2, l2), (s3, l3));
        let o = match call.spec.dtype() {
            DType::F32 => call.forward_cuda::<f32>(q, k, v)?,
            DType::F16 => call.forward_cuda::<half::f16>(q, k, v)?,
            DType::BF16 => call.forward_cuda::<half::bf16>(q, k, v)?,
        };
        Ok((o, Shape::from(call.spec.o_shape())))
    }

    fn bwd(
        &self,
        _q: &Tensor,
        _k: &Tensor,
        _v: &Tensor,
        o: &Tensor,
        d_o: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        if let Some([dq, dk, dv]) = lock(&self.0.parked).take() {
            return Ok((Some(dq), Some(dk), Some(dv)));
        }
        let g = self.0.backward(o, d_o)?;
        Ok((Some(g.dq), Some(g.dk), Some(g.dv)))
    }
}

/// Identity on `o` that links the bias into the graph and returns its gradient; see the module docs.
struct BiasLink(Arc<Call>);

impl CustomOp2 for BiasLink {
    fn name(&self) -> &'static str {
        link_name(self.0.spec.family_kind())
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        _s2: &CpuStorage,
        _l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        fn copy<E: WithDType>(s: &CpuStorage, l: &Layout) -> Result<CpuStorage> {
            let (start, end) = l.contiguous_offsets().ok_or_else(|| {
                candle_core::Error::msg("attn-candle: the attention output is not contiguous")
            })?;
            let data = cpu_elems::<E>(s, l)?
                .get(..end - start)
                .ok_or_else(|| candle_core::Error::msg("attn-candle: the attention output is truncated"))?;
            Ok(E::to_cpu_storage(data))
        }
        let o = match self.0.spec.dtype() {
            DType::F32 => copy::<f32>(s1, l1)?,
            DType::F16 => copy::<half::f16>(s1, l1)?,
            DType::BF16 => copy::<half::bf16>(s1, l1)?,
        };
        Ok((o, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        _s2: &candle_core::CudaStorage,
        _l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let spec = &self.0.spec;
        let n = l1.shape().elem_count();
        let o = match spec.dtype() {
            DType::F32 => cuda::copy_contiguous::<f32>(spec, s1, l1, n)?,
            DType::F16 => cuda::copy_contiguous::<half::f16>(spec, s1, l1, n)?,
            DType::BF16 => cuda::copy_contiguous::<half::bf16>(spec, s1, l1, n)?,
        };
        Ok((o, l1.shape().clone()))
    }

    fn bwd(
        &self,
        o: &Tensor,
        _bias: &Tensor,
        _res: &Tensor,
        d_o: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = self.0.backward(o, d_o)?;
        *lock(&self.0.parked) = Some([g.dq, g.dk, g.dv]);
        Ok((Some(d_o.clone()), g.dbias))
    }
}
