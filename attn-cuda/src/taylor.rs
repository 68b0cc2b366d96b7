//! Taylor linear attention on the GPU (REFERENCE.md §3): forward, backward and recurrent decode.
//!
//! Per (batch entry, query head), with `u_i = scale·q̂_i`, `k̂_j` (l2-normalised when `qk_l2norm`),
//! `ṽ_j = [v_j, 1]` and `f(s) = a0 + a1 s + a2 s²`: `[num_i, den_i] = Σ_{j<hi(i)} f(u_i·k̂_j) ṽ_j`,
//! `o_i = num_i / den_i`, the denominators saved in f32 as the statistics (0 and o = 0 for a row with
//! no key). Backward with `g̃_i = [ĝ_i, −δ_i]`, `ĝ_i = dO_i / den_i`, `δ_i = ĝ_i·o_i`:
//! `dû_i = Σ_j f'(s_ij)(g̃_i·ṽ_j) k̂_j`, `dṽ_j = Σ_i f(s_ij) g̃_i`, `dk̂_j = Σ_i f'(s_ij)(g̃_i·ṽ_j) u_i`,
//! then `dq = scale·J(q)ᵀ dû`, `dk = J(k)ᵀ dk̂` through the l2-norm, `dv = dṽ[..Dv]`.
//!
//! Each of these is one sweep (`kernels/include/taylor_common.cuh`), never an N×N or N×D² buffer:
//! 1. row kernels write the f32 scratch in sweep order (k̂, ṽ, u, g̃: O(N·D));
//! 2. the dense kernel writes each probe's sum over the fewer than C sources past its chunk boundary
//!    (tensor cores for f16/bf16: S = Z Xᵀ, f(S) or f'(S)∘(W Yᵀ), then · Y or · X);
//! 3. the state kernel adds the sums before the boundary through the factorised states
//!    `S[f] = Σ_s φ_f(x_s) y_s` (order 2 over the D(D+1)/2 pairs a ≤ b), split over blocks along the
//!    features and along the sequence, with f32 atomics (so results may differ in the last bits from run
//!    to run);
//! 4. row kernels turn the sums into o and the statistics, or into dq, dk, dv.
//!
//! Causal masks (top-left, bottom-right, `Nq ≠ Nk`), key padding, packed varlen and GQA/MQA are the
//! prefix length `hi` of each probe: keys before `key_range(b, i).end` for a query, and for dK, dV the
//! suffix of queries that see a key, swept in reverse. Head dims 16, 32, 64, 128 with `Dv = D`; f16 and
//! bf16 on tensor cores with f32 sums, f32 on CUDA cores in exact f32.
//!
//! Recurrent decode ([`TaylorDecodeState`]): `CudaAttn::taylor_prefill` and
//! `CudaAttn::taylor_decode_step`.

mod decode;
#[cfg(test)]
mod emulate;
mod heuristics;
mod launch;
mod params;

pub use decode::{DecodeShape, TaylorDecodeState};

use crate::backend::{CudaAttn, DeviceElem};
use crate::dispatch::BACKEND;
use crate::error::Result;
use attn_core::{AttnError, AttnSpec, DType, FamilySpec, Op, Pass, SeqLengths};
use cudarc::driver::sys::CUdevice_attribute_enum;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use launch::{Kernels, Launch};
use params::TaylorParams;
use std::sync::Arc;

type In<'a, T> = &'a dyn DevicePtr<T>;
type Out<'a, T> = &'a mut dyn DevicePtrMut<T>;

/// The buffers of a forward call.
pub(crate) struct Forward<'a, T> {
    pub q: In<'a, T>,
    pub k: In<'a, T>,
    pub v: In<'a, T>,
    pub bias: Option<In<'a, T>>,
    pub o: Out<'a, T>,
    pub stats: Out<'a, f32>,
}

/// The buffers of a backward call.
pub(crate) struct Backward<'a, T> {
    pub q: In<'a, T>,
    pub k: In<'a, T>,
    pub v: In<'a, T>,
    pub bias: Option<In<'a, T>>,
    pub o: In<'a, T>,
    pub d_o: In<'a, T>,
    pub stats: In<'a, f32>,
    pub dq: Out<'a, T>,
    pub dk: Out<'a, T>,
    pub dv: Out<'a, T>,
    pub dbias: Option<Out<'a, T>>,
}

fn unsupported(op: Op, what: String) -> AttnError {
    AttnError::Unsupported {
        op,
        backend: BACKEND,
        what,
    }
}

/// The checks every Taylor call makes once: family, dtype, head dims, sizes within the kernels' indices.
fn check<T: DeviceElem>(spec: &AttnSpec, pass: Pass) -> Result<()> {
    let op = spec.op(pass);
    if !matches!(spec.family(), FamilySpec::Taylor { .. }) {
        return Err(AttnError::InvalidArgument {
            op,
            arg: "family",
            reason: format!("the Taylor kernels got a {} spec", spec.family_kind().name()),
        }
        .into());
    }
    if T::DTYPE != spec.dtype() {
        return Err(AttnError::InvalidArgument {
            op,
            arg: "dtype",
            reason: format!("buffers are {} but the spec says {}", T::DTYPE, spec.dtype()),
        }
        .into());
    }
    let d = spec.head_dim();
    if !heuristics::HEAD_DIMS.contains(&d) {
        return Err(unsupported(
            op,
            format!("taylor head dim {d} (supported: {:?})", heuristics::HEAD_DIMS),
        )
        .into());
    }
    if spec.head_dim_v() != d {
        return Err(unsupported(
            op,
            format!(
                "a value head dim {} different from the query/key head dim {d}",
                spec.head_dim_v()
            ),
        )
        .into());
    }
    let limit = i32::MAX as usize;
    for (what, n) in [
        ("total_q·heads_q", spec.total_q() * spec.heads_q()),
        ("total_k·heads_kv", spec.total_k() * spec.heads_kv()),
        ("seq_q·group", spec.seq_q() * spec.group()),
        ("seq_q + seq_k", spec.seq_q() + spec.seq_k()),
    ] {
        if n > limit {
            return Err(unsupported(op, format!("{what} = {n} beyond the kernels' i32 row index")).into());
        }
    }
    Ok(())
}

/// Length, device and alignment checks of a call's buffers; their addresses and stream guards.
struct Checker<'s> {
    spec: &'s AttnSpec,
    pass: Pass,
    stream: &'s Arc<CudaStream>,
}

impl<'s> Checker<'s> {
    fn same_device(&self, what: &str, stream: &CudaStream) -> Result<()> {
        if stream.context().cu_ctx() != self.stream.context().cu_ctx() {
            return Err(AttnError::InvalidArgument {
                op: self.spec.op(self.pass),
                arg: "device",
                reason: format!(
                    "`{what}` lives on CUDA device {} but the call runs on device {}",
                    stream.context().ordinal(),
                    self.stream.context().ordinal()
                ),
            }
            .into());
        }
        Ok(())
    }

    fn aligned<T>(&self, what: &str, ptr: u64) -> Result<()> {
        let align = std::mem::size_of::<T>() as u64;
        if ptr % align != 0 {
            return Err(unsupported(
                self.spec.op(self.pass),
                format!("`{what}` at device address {ptr:#x}, not {align}-byte aligned"),
            )
            .into());
        }
        Ok(())
    }

    fn input<'a, T>(&self, what: &str, buf: In<'a, T>, need: usize) -> Result<(u64, SyncOnDrop<'a>)>
    where
        's: 'a,
    {
        self.spec.check_len(self.pass, what, buf.len(), need)?;
        self.same_device(what, buf.stream())?;
        let (ptr, guard) = buf.device_ptr(self.stream);
        self.aligned::<T>(what, ptr)?;
        Ok((ptr, guard))
    }

    fn output<'a, T>(&self, what: &str, buf: Out<'a, T>, need: usize) -> Result<(u64, SyncOnDrop<'a>)>
    where
        's: 'a,
    {
        self.spec.check_len(self.pass, what, buf.len(), need)?;
        self.same_device(what, buf.stream())?;
        let (ptr, guard) = buf.device_ptr_mut(self.stream);
        self.aligned::<T>(what, ptr)?;
        Ok((ptr, guard))
    }
}

/// A bias buffer with a Taylor spec (which never has one) is a shape error.
fn no_bias(spec: &AttnSpec, pass: Pass, what: &str, present: bool) -> Result<()> {
    if present {
        return Err(AttnError::ShapeMismatch {
            op: spec.op(pass),
            what: what.into(),
            expected: format!("no `{what}` (Taylor attention has no bias)"),
            got: "a buffer".into(),
        }
        .into());
    }
    Ok(())
}

/// Sequence-length arrays of a call on the device (kept alive until its launches are enqueued).
struct Lengths {
    _bufs: Vec<CudaSlice<i32>>,
}

fn to_i32s(v: &[usize]) -> Vec<i32> {
    // `check` bounded every length by i32::MAX.
    v.iter().map(|&x| i32::try_from(x).unwrap_or(i32::MAX)).collect()
}

/// One call: the spec, the stream, the loaded kernels and the launch geometry.
struct Call<'s> {
    spec: &'s AttnSpec,
    stream: &'s Arc<CudaStream>,
    kernels: Arc<Kernels>,
    op: Op,
    sms: usize,
}

fn dtype_tag(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
    }
}

impl<'s> Call<'s> {
    fn new(attn: &'s CudaAttn, spec: &'s AttnSpec, pass: Pass) -> Result<Self> {
        let stream = attn.stream();
        let op = spec.op(pass);
        let kernels = launch::kernels_for(stream.context(), op)?;
        let sms = stream
            .context()
            .attribute(CUdevice_attribute_enum::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(Call {
            spec,
            stream,
            kernels,
            op,
            sms: sms.max(1) as usize,
        })
    }

    fn checker(&self, pass: Pass) -> Checker<'s> {
        Checker {
            spec: self.spec,
            pass,
            stream: self.stream,
        }
    }

    /// Parameters of the spec with its sequence lengths uploaded.
    fn params(&self) -> Result<(TaylorParams, Lengths)> {
        let mut p = TaylorParams::from_spec(self.spec);
        let mut bufs = Vec::new();
        match self.spec.lengths() {
            SeqLengths::Dense => {}
            SeqLengths::KeyPadding(lens) => {
                let d = self.stream.clone_htod(&to_i32s(lens))?;
                p.base.key_lens = d.device_ptr(self.stream).0;
                bufs.push(d);
            }
            SeqLengths::Varlen {
                cu_seqlens_q,
                cu_seqlens_k,
            } => {
                let dq = self.stream.clone_htod(&to_i32s(cu_seqlens_q))?;
                let dk = self.stream.clone_htod(&to_i32s(cu_seqlens_k))?;
                p.base.cu_q = dq.device_ptr(self.stream).0;
                p.base.cu_k = dk.device_ptr(self.stream).0;
                bufs.extend([dq, dk]);
            }
        }
        Ok((p, Lengths { _bufs: bufs }))
    }

    /// A zeroed f32 scratch buffer of `n` elements and its address.
    fn scratch(&self, n: usize) -> Result<(CudaSlice<f32>, u64)> {
        let s = self.stream.alloc_zeros::<f32>(n.max(1))?;
        let ptr = s.device_ptr(self.stream).0;
        Ok((s, ptr))
    }

    fn run(&self, launch: Launch, p: &TaylorParams) -> Result<()> {
        self.kernels.launch(self.stream, &launch, p, self.op)
    }

    /// A row kernel over the queries (query heads) or the key rows (kv heads).
    fn rows(&self, stem: &str, over_keys: bool) -> Launch {
        let s = self.spec;
        let (n, heads) = if over_keys {
            (s.seq_k(), s.heads_kv())
        } else {
            (s.seq_q(), s.heads_q())
        };
        Launch {
            name: format!("attn_taylor_{stem}_{}", dtype_tag(s.dtype())),
            grid: (
                heuristics::blocks(n, heuristics::ROWS_PER_BLOCK),
                heads,
                s.batch(),
            ),
            smem: 0,
        }
    }

    /// One sweep with the sources, probes and outputs set in `p`: the dense kernel writes every probe's
    /// row, then the state kernel adds the sums before each probe's chunk boundary.
    fn sweep(&self, p: &mut TaylorParams, reverse: bool, grad: bool) -> Result<()> {
        let s = self.spec;
        let (d, g) = (s.head_dim(), s.group());
        let dt = dtype_tag(s.dtype());
        let what = if grad { "grad" } else { "value" };
        let elem = s.dtype().size();
        let missing = || unsupported(self.op, format!("taylor head dim {d}"));
        let tile = heuristics::state_tile(d).ok_or_else(missing)?;
        let order = p.order as u8;
        let (max_probes, max_sources) = if reverse {
            (s.seq_k(), g * s.seq_q())
        } else {
            (g * s.seq_q(), s.seq_k())
        };
        p.reverse = i32::from(reverse);
        let per_block = if elem == 4 {
            heuristics::ROWS_PER_BLOCK
        } else {
            heuristics::DENSE_PROBES
        };
        self.run(
            Launch {
                name: format!("attn_taylor_dense_{what}_{dt}_d{d}"),
                grid: (heuristics::blocks(max_probes, per_block), s.heads_kv(), s.batch()),
                smem: heuristics::dense_smem(d, elem, grad),
            },
            p,
        )?;
        let chunks = max_sources / tile.c;
        if chunks == 0 {
            return Ok(()); // every probe's sum is dense
        }
        let slabs = heuristics::slabs(d, order).ok_or_else(missing)?;
        let (splits, per) = heuristics::split(chunks, slabs * s.heads_kv() * s.batch(), self.sms);
        p.n_slabs = slabs as i32;
        p.chunks_per_split = per as i32;
        self.run(
            Launch {
                name: format!("attn_taylor_state_{what}_{dt}_d{d}"),
                grid: (slabs * splits, s.heads_kv(), s.batch()),
                smem: heuristics::state_smem(d, elem).ok_or_else(missing)?,
            },
            p,
        )
    }
}

/// Scratch of a forward: k̂, ṽ (kept by a prefill for the decode state), u and the [num, den] sums.
struct ForwardScratch {
    kx: CudaSlice<f32>,
    ky: CudaSlice<f32>,
    _qz: CudaSlice<f32>,
    _acc: CudaSlice<f32>,
}

/// The forward: o and the denominators. Returns the scratch (a prefill builds its state from it).
fn forward_impl<T: DeviceElem>(
    call: &Call<'_>,
    p: &mut TaylorParams,
    b: Forward<'_, T>,
) -> Result<ForwardScratch> {
    let spec = call.spec;
    let pass = Pass::Forward;
    no_bias(spec, pass, "bias", b.bias.is_some())?;
    let c = call.checker(pass);
    let (q, _gq) = c.input("q", b.q, spec.q_len())?;
    let (k, _gk) = c.input("k", b.k, spec.k_len())?;
    let (v, _gv) = c.input("v", b.v, spec.v_len())?;
    let (o, _go) = c.output("o", b.o, spec.o_len())?;
    let (stats, _gs) = c.output("stats", b.stats, spec.stats_len())?;
    (p.base.q, p.base.k, p.base.v, p.base.o, p.base.lse) = (q, k, v, o, stats);

    let (d, m) = (spec.head_dim(), heuristics::width(spec.head_dim()));
    let (rows_q, rows_k) = (spec.total_q() * spec.heads_q(), spec.total_k() * spec.heads_kv());
    let (kx, kx_ptr) = call.scratch(rows_k * d)?;
    let (ky, ky_ptr) = call.scratch(rows_k * m)?;
    let (qz, qz_ptr) = call.scratch(rows_q * d)?;
    let (acc, acc_ptr) = call.scratch(rows_q * m)?;
    (p.kx, p.ky, p.qz, p.acc_q) = (kx_ptr, ky_ptr, qz_ptr, acc_ptr);
    call.run(call.rows("prep_keys", true), p)?;
    call.run(call.rows("prep_queries", false), p)?;
    (p.src_x, p.src_y, p.probe_z, p.out_value) = (kx_ptr, ky_ptr, qz_ptr, acc_ptr);
    call.sweep(p, false, false)?;
    call.run(call.rows("finalize_fwd", false), p)?;
    Ok(ForwardScratch {
        kx,
        ky,
        _qz: qz,
        _acc: acc,
    })
}

/// Forward of a Taylor spec (called by the backend for `FamilySpec::Taylor`).
pub(crate) fn forward<T: DeviceElem>(attn: &CudaAttn, spec: &AttnSpec, b: Forward<'_, T>) -> Result<()> {
    check::<T>(spec, Pass::Forward)?;
    let call = Call::new(attn, spec, Pass::Forward)?;
    let (mut p, _lengths) = call.params()?;
    forward_impl(&call, &mut p, b)?;
    Ok(())
}

/// Backward of a Taylor spec (called by the backend for `FamilySpec::Taylor`).
pub(crate) fn backward<T: DeviceElem>(attn: &CudaAttn, spec: &AttnSpec, b: Backward<'_, T>) -> Result<()> {
    let pass = Pass::Backward;
    check::<T>(spec, pass)?;
    no_bias(spec, pass, "bias", b.bias.is_some())?;
    no_bias(spec, pass, "dbias", b.dbias.is_some())?;
    let call = Call::new(attn, spec, pass)?;
    let (mut p, _lengths) = call.params()?;
    let c = call.checker(pass);
    let (q, _gq) = c.input("q", b.q, spec.q_len())?;
    let (k, _gk) = c.input("k", b.k, spec.k_len())?;
    let (v, _gv) = c.input("v", b.v, spec.v_len())?;
    let (o, _go) = c.input("o", b.o, spec.o_len())?;
    let (d_o, _gdo) = c.input("d_o", b.d_o, spec.o_len())?;
    let (stats, _gs) = c.input("stats", b.stats, spec.stats_len())?;
    let (dq, _gdq) = c.output("dq", b.dq, spec.dq_len())?;
    let (dk, _gdk) = c.output("dk", b.dk, spec.dk_len())?;
    let (dv, _gdv) = c.output("dv", b.dv, spec.dv_len())?;
    (p.base.q, p.base.k, p.base.v, p.base.o, p.base.d_o, p.base.lse) = (q, k, v, o, d_o, stats);
    (p.base.dq, p.base.dk, p.base.dv) = (dq, dk, dv);

    let (d, m) = (spec.head_dim(), heuristics::width(spec.head_dim()));
    let (rows_q, rows_k) = (spec.total_q() * spec.heads_q(), spec.total_k() * spec.heads_kv());
    let (_kx, kx) = call.scratch(rows_k * d)?;
    let (_ky, ky) = call.scratch(rows_k * m)?;
    let (_qz, qz) = call.scratch(rows_q * d)?;
    let (_qw, qw) = call.scratch(rows_q * m)?;
    let (_du, du) = call.scratch(rows_q * d)?;
    let (_dvt, dvt) = call.scratch(rows_k * m)?;
    let (_dkh, dkh) = call.scratch(rows_k * d)?;
    (p.kx, p.ky, p.qz, p.qw) = (kx, ky, qz, qw);
    (p.acc_q, p.acc_kv, p.acc_k) = (du, dvt, dkh);
    call.run(call.rows("prep_keys", true), &p)?;
    call.run(call.rows("prep_queries", false), &p)?;
    call.run(call.rows("prep_grads", false), &p)?;
    // dû: keys → queries, the gradient read.
    (p.src_x, p.src_y, p.probe_z, p.probe_w, p.out_grad) = (kx, ky, qz, qw, du);
    call.sweep(&mut p, false, true)?;
    // dṽ and dk̂: queries → keys, reversed (suffix sums), the value and the gradient reads.
    (p.src_x, p.src_y, p.probe_z, p.probe_w) = (qz, qw, kx, ky);
    (p.out_value, p.out_grad) = (dvt, dkh);
    call.sweep(&mut p, true, false)?;
    call.sweep(&mut p, true, true)?;
    call.run(call.rows("finalize_dq", false), &p)?;
    call.run(call.rows("finalize_dkdv", true), &p)?;
    Ok(())
}
