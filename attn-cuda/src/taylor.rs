//! Taylor linear attention on the GPU (docs/math.md §3): forward, backward and recurrent decode.
//!
//! Per (batch entry, query head), with `u_i = scale·q̂_i`, `k̂_j` (l2-normalised when `qk_l2norm`),
//! `ṽ_j = [v_j, 1]` and `f(s) = a0 + a1 s + a2 s²`: `[num_i, den_i] = Σ_{j<hi(i)} f(u_i·k̂_j) ṽ_j`,
//! `o_i = num_i / den_i`, the denominators saved in f32 as the statistics (0 and o = 0 for a row with
//! no key). Backward with `g̃_i = [ĝ_i, −δ_i]`, `ĝ_i = dO_i / den_i`, `δ_i = ĝ_i·o_i`:
//! `dû_i = Σ_j f'(s_ij)(g̃_i·ṽ_j) k̂_j`, `dṽ_j = Σ_i f(s_ij) g̃_i`, `dk̂_j = Σ_i f'(s_ij)(g̃_i·ṽ_j) u_i`,
//! then `dq = scale·J(q)ᵀ dû`, `dk = J(k)ᵀ dk̂` through the l2-norm, `dv = dṽ[..Dv]`.
//!
//! Each of these is one sweep (`kernels/taylor/taylor_common.cuh`), never an N×N or N×D² buffer:
//! 1. the sweeps read q, k, v, dO in the storage dtype and scale them on the fly: the l2-norms of q and
//!    k from the tiles they load, 1/den and −δ of g̃ from per-row scalars a row kernel writes (O(N));
//! 2. the dense kernel writes each probe's sum over the at most L sources past its segment boundary
//!    (tensor cores for f16/bf16: S = Z Xᵀ, f(S) or f'(S)∘(W Yᵀ), then · Y or · X);
//! 3. the state kernels add the sums before the boundary through the factorised states
//!    `S[f] = Σ_s φ_f(x_s) y_s` (order 2 over the D(D+1)/2 pairs a ≤ b): the fold writes the sums of
//!    each segment of L sources (blocks split along the features and the segments), one ordered prefix
//!    pass turns them into the states before each segment boundary, and the reads add `Σ_f ψ_f(z) S[f]`
//!    (or its gradient) to each probe's row. No atomics: a call gives the same bits on every run;
//! 4. row kernels turn the sums into o and the statistics, or into dq, dk, dv.
//!
//! The f16/bf16 forward runs 2–4 as one kernel per probe tile after the fold and the prefix (the state
//! read and the dense part into the same mma accumulators, then o = num/den): no `[rows][M]` scratch.
//!
//! Order 1 with f16/bf16 and 16-byte aligned rows has its own kernels (`kernels/taylor/taylor_order1.cuh`):
//! a fold that writes the same segment sums in the same
//! layout (every sweep: forward, dQ, dV and dK), and a forward for calls without a causal mask that reads
//! the whole state once per block and streams its probe tiles (the order-1 forward is bound by memory).
//! A causal order-1 forward at D ≤ 64 runs one block per segment (longer segments than the general path,
//! whose dense part grows with them): the block carries its segment's state in shared memory (f32, from
//! the prefix's f32 sums; no storage-type copies), folds each whole chunk of 64 keys into it as its probe
//! tiles pass, and takes only the keys past the last folded chunk densely. Where every sequence has as many
//! queries as keys it runs in one pass instead (`Call::order1_chain_forward`,
//! `kernels/taylor/taylor_order1_chain.cuh`): fold blocks chain the segments' inclusive sums in a fixed
//! order, forward blocks carry them through their 64-query chunks. The causal order-1 backward
//! at D ≤ 64 runs the same block structure twice (`taylor_order1_causal.cuh`): dq on the keys' sweep, dk
//! and dv on the queries' reversed sweep (both reads of one state), writing finished gradients.
//!
//! Order 2's forward at bf16, D = 64 on Hopper has wgmma kernels of its own ([`route::wg_forward`],
//! `kernels/taylor/taylor_wg.cuh`): the states as whole 64 × 64 tensor-core products (a fold, a
//! deterministic reduce of its splits, a read of 128 queries per block); with a causal mask where every
//! sequence has as many queries as keys, a state per segment of keys and each block's own segment taken
//! densely in the read. Shorter order-2 calls run the quadratic form on the flash kernels
//! ([`dense_on_flash`]).
//!
//! Causal masks (top-left, bottom-right, `Nq ≠ Nk`), key padding, packed varlen and GQA/MQA are the
//! prefix length `hi` of each probe: keys before `key_range(b, i).end` for a query, and for dK, dV the
//! suffix of queries that see a key, swept in reverse. Head dims 16, 32, 64, 128 with `Dv = D`; f16 and
//! bf16 on tensor cores with f32 sums, f32 on CUDA cores (the state reads' dot products, the dense part's
//! scores and the backward's ĝ·v and δ in f64).
//!
//! Which of these kernels a call runs is decided in one place, `route` (pure functions of the spec, the
//! Hopper routing and the rows' alignment, unit-tested on the CPU); the launches follow it.
//!
//! Recurrent decode ([`TaylorDecodeState`]): `CudaAttn::taylor_prefill` and
//! `CudaAttn::taylor_decode_step`.

mod decode;
#[cfg(test)]
mod emulate;
mod heuristics;
mod launch;
mod order1;
mod params;
mod route;
mod wg;

pub(crate) use decode::Decode;
pub use decode::{DecodeShape, TaylorDecodeState};
#[doc(hidden)]
pub use order1::chain_stall_for_tests;
pub(crate) use route::dense_on_flash;
#[cfg(test)]
pub(crate) use route::wg_forward;

use crate::check::Checker;
use crate::config::{Hopper, KernelConfig};
use crate::dispatch::{dtype_tag, BACKEND};
use crate::error::Result;
use crate::runtime::Kernels;
use crate::views::DeviceElem;
use attn_core::{AttnError, AttnSpec, Causal, FamilySpec, Op, Pass, SeqLengths};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use launch::Launch;
use params::TaylorParams;
use route::Rows;
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

/// One call: the spec, the stream and the loaded kernels.
struct Call<'s> {
    spec: &'s AttnSpec,
    stream: &'s Arc<CudaStream>,
    kernels: Arc<Kernels>,
    op: Op,
    /// The backend's kernel configuration.
    config: KernelConfig,
}

impl<'s> Call<'s> {
    fn new(
        stream: &'s Arc<CudaStream>,
        config: KernelConfig,
        spec: &'s AttnSpec,
        pass: Pass,
    ) -> Result<Self> {
        let op = spec.op(pass);
        let kernels = crate::runtime::kernels_for(stream.context(), op)?;
        Ok(Call {
            spec,
            stream,
            kernels,
            op,
            config,
        })
    }

    /// The Hopper kernels' routing of this call (the device and the backend's configuration).
    fn hopper(&self) -> Hopper {
        self.kernels.hopper(&self.config)
    }

    /// The buffer checks of the call's `pass`: element alignment only (the routing takes the rows'
    /// alignment into account, `route::Rows`).
    fn checker(&self, pass: Pass) -> Checker<'s> {
        Checker {
            spec: self.spec,
            op: self.spec.op(pass),
            pass,
            stream: self.stream,
            tensor_cores: false,
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
        launch::launch(&self.kernels, self.stream, &launch, p, self.op)
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

    /// The geometry of a sweep (`reverse`: queries → keys) set in `p`: segment length (`causal_blocks`: the
    /// order-1 causal kernels', one block per segment carrying its state), segments and features per state
    /// row; returns `(probes, states)`, the most probes of a (batch entry, kv head) and the state entries of
    /// all of them.
    fn geometry(&self, p: &mut TaylorParams, reverse: bool, causal_blocks: bool) -> Result<(usize, usize)> {
        let s = self.spec;
        let (d, g) = (s.head_dim(), s.group());
        let order = p.order as u8;
        let (max_probes, max_sources) = if reverse {
            (s.seq_k(), g * s.seq_q())
        } else {
            (g * s.seq_q(), s.seq_k())
        };
        let heads = s.batch() * s.heads_kv();
        let missing = || unsupported(self.op, format!("taylor head dim {d}"));
        let causal = s.causal() != Causal::None;
        let seg = if causal_blocks {
            self.config
                .taylor_causal_segment
                .unwrap_or_else(|| heuristics::order1_causal_seg_len(d, max_sources, heads))
        } else {
            heuristics::seg_len(d, order, max_sources, heads, s.dtype().size(), causal).ok_or_else(missing)?
        };
        let n_seg = max_sources.div_ceil(seg);
        let f_pad = heuristics::f_pad(d, order);
        p.reverse = i32::from(reverse);
        p.seg_len = seg as i32;
        p.n_seg = n_seg as i32;
        p.f_pad = f_pad as i32;
        Ok((max_probes, heads * n_seg * heuristics::width(d) * f_pad))
    }

    /// The states of the sweep `p` describes (after [`Call::geometry`]): the fold writes each segment's
    /// sums, the prefix turns them into the states before each segment boundary (f16/bf16: `copies`
    /// storage-type copies, 2 when a gradient read follows; 0: the f32 sums in place, for the order-1
    /// causal forward). `None` when there is no source at all.
    fn states(&self, p: &mut TaylorParams, entries: usize, copies: usize) -> Result<Option<States>> {
        let s = self.spec;
        let d = s.head_dim();
        let dt = dtype_tag(s.dtype());
        let elem = s.dtype().size();
        let missing = || unsupported(self.op, format!("taylor head dim {d}"));
        if entries == 0 {
            return Ok(None);
        }
        let n_states = s.batch() * s.heads_kv() * p.n_seg as usize;
        // SAFETY (uninitialised): the fold writes every entry of st[k] for every k < n_seg(b) of each
        // (batch entry, kv head), which are the only states the prefix and the reads touch.
        let st = unsafe { self.stream.alloc::<f32>(entries) }?;
        let st_max = self.stream.alloc_zeros::<i32>(n_states)?;
        p.set_st(st.device_ptr(self.stream).0);
        p.set_st_max(st_max.device_ptr(self.stream).0);
        p.copies = copies as i32;
        let st_t = if elem == 2 && copies > 0 {
            // SAFETY (uninitialised): the prefix writes every entry of every copy of st[k], k < n_seg(b),
            // before the reads, which touch no other (u16: as many bytes as T).
            let t = unsafe { self.stream.alloc::<u16>(copies * entries) }?;
            p.st_t = t.device_ptr(self.stream).0;
            Some(t)
        } else {
            p.st_t = 0;
            None
        };
        let slabs = heuristics::fold_slabs(d, p.order as u8).ok_or_else(missing)?;
        p.set_slabs(slabs as i32);
        let fold = if route::order1_fold(s, Rows::of(s, &p.base), p.reverse != 0) {
            Launch {
                name: format!("attn_taylor_order1_fold_{dt}_d{d}"),
                grid: (
                    heuristics::order1_fold_split(d) * p.n_seg as usize,
                    s.heads_kv(),
                    s.batch(),
                ),
                smem: heuristics::order1_fold_smem(d),
            }
        } else {
            Launch {
                name: format!("attn_taylor_fold_{dt}_d{d}"),
                grid: (slabs * p.n_seg as usize, s.heads_kv(), s.batch()),
                smem: heuristics::fold_smem(d, elem).ok_or_else(missing)?,
            }
        };
        self.run(fold, p)?;
        let per_state = heuristics::width(d) * p.f_pad as usize;
        self.run(
            Launch {
                name: format!("attn_taylor_prefix_{dt}"),
                grid: (
                    heuristics::blocks(per_state, heuristics::THREADS as usize),
                    s.heads_kv(),
                    s.batch(),
                ),
                smem: 0,
            },
            p,
        )?;
        Ok(Some(States {
            _st: st,
            _st_max: st_max,
            _st_t: st_t,
        }))
    }

    /// One sweep with the sources, probes and outputs set in `p`, for the value read, the gradient read
    /// or both (dV and dK share their sources, probes and states): the dense kernels write every probe's
    /// rows, the states are built, and the reads add each probe's state part to its rows.
    fn sweep(&self, p: &mut TaylorParams, reverse: bool, value: bool, grad: bool) -> Result<()> {
        let s = self.spec;
        let d = s.head_dim();
        let dt = dtype_tag(s.dtype());
        let elem = s.dtype().size();
        let missing = || unsupported(self.op, format!("taylor head dim {d}"));
        let (max_probes, entries) = self.geometry(p, reverse, false)?;
        let dense_per_block = if elem == 4 {
            heuristics::ROWS_PER_BLOCK
        } else {
            heuristics::DENSE_PROBES
        };
        // The reads asked for, as `grad` flags, and their kernels' name part.
        let reads: Vec<bool> = [(value, false), (grad, true)]
            .into_iter()
            .filter_map(|(on, grad)| on.then_some(grad))
            .collect();
        let what = |grad: bool| if grad { "grad" } else { "value" };
        for &grad in &reads {
            self.run(
                Launch {
                    name: format!("attn_taylor_dense_{}_{dt}_d{d}", what(grad)),
                    grid: (
                        heuristics::blocks(max_probes, dense_per_block),
                        s.heads_kv(),
                        s.batch(),
                    ),
                    smem: heuristics::dense_smem(d, elem, grad),
                },
                p,
            )?;
        }
        let Some(_states) = self.states(p, entries, if grad { 2 } else { 1 })? else {
            return Ok(()); // no source at all: every sum is the dense one
        };
        for &grad in &reads {
            self.run(
                Launch {
                    name: format!("attn_taylor_read_{}_{dt}_d{d}", what(grad)),
                    grid: (
                        heuristics::blocks(max_probes, heuristics::read_probes(d, elem, grad)),
                        s.heads_kv(),
                        s.batch(),
                    ),
                    smem: heuristics::read_smem(d, elem, grad).ok_or_else(missing)?,
                },
                p,
            )?;
        }
        Ok(())
    }

    /// The forward sweep of f16/bf16 in one probe kernel (state read, dense part, o = num/den, den),
    /// after the states: writes o and the statistics directly. `path`: one of [`route::forward`]'s
    /// tile paths.
    fn forward_tiles(&self, p: &mut TaylorParams, path: route::Forward) -> Result<()> {
        let s = self.spec;
        let d = s.head_dim();
        let missing = || unsupported(self.op, format!("taylor head dim {d}"));
        if let route::Forward::Order1Chain { wg } = path {
            return self.order1_chain_forward(p, wg);
        }
        let causal_blocks = path == route::Forward::Order1Causal;
        let (max_probes, entries) = self.geometry(p, false, causal_blocks)?;
        if causal_blocks {
            let _states = self.states(p, entries, 0)?;
            return self.run(
                Launch {
                    name: format!("attn_taylor_order1_causal_{}_d{d}", dtype_tag(s.dtype())),
                    grid: ((p.n_seg as usize).max(1), s.heads_kv(), s.batch()),
                    smem: heuristics::order1_causal_smem(d),
                },
                p,
            );
        }
        let _states = self.states(p, entries, 1)?;
        if path == route::Forward::Order1Tiles {
            let heads = s.batch() * s.heads_kv();
            return self.run(
                Launch {
                    name: format!("attn_taylor_order1_forward_{}_d{d}", dtype_tag(s.dtype())),
                    grid: (
                        heuristics::order1_forward_blocks(max_probes, d, heads, self.kernels.sms),
                        s.heads_kv(),
                        s.batch(),
                    ),
                    smem: heuristics::order1_forward_smem(d),
                },
                p,
            );
        }
        self.run(
            Launch {
                name: format!("attn_taylor_forward_{}_d{d}", dtype_tag(s.dtype())),
                grid: (
                    heuristics::blocks(max_probes, heuristics::DENSE_PROBES),
                    s.heads_kv(),
                    s.batch(),
                ),
                smem: heuristics::forward_smem(d).ok_or_else(missing)?,
            },
            p,
        )
    }
}

/// The state buffers of a sweep, kept alive until its reads are enqueued (freed in stream order).
struct States {
    _st: CudaSlice<f32>,
    _st_max: CudaSlice<i32>,
    _st_t: Option<CudaSlice<u16>>,
}

/// The forward: o and the denominators (`p` keeps the call's tensors for a prefill).
fn forward_impl<T: DeviceElem>(call: &Call<'_>, p: &mut TaylorParams, b: Forward<'_, T>) -> Result<()> {
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

    if spec.dtype().size() == 2 {
        match route::forward(spec, call.hopper(), Rows::of(spec, &p.base)) {
            route::Forward::WgState => return call.wg_forward(p),
            route::Forward::Sweep => {}
            path => return call.forward_tiles(p, path),
        }
    }
    let rows_q = spec.total_q() * spec.heads_q();
    let (_acc, acc) = call.scratch(rows_q * heuristics::width(spec.head_dim()))?;
    (p.acc_q, p.out_value) = (acc, acc);
    call.sweep(p, false, true, false)?;
    call.run(call.rows("finalize_fwd", false), p)
}

/// Forward of a Taylor spec (called by the backend for `FamilySpec::Taylor`).
pub(crate) fn forward<T: DeviceElem>(
    stream: &Arc<CudaStream>,
    config: KernelConfig,
    spec: &AttnSpec,
    b: Forward<'_, T>,
) -> Result<()> {
    check::<T>(spec, Pass::Forward)?;
    let call = Call::new(stream, config, spec, Pass::Forward)?;
    let (mut p, _lengths) = call.params()?;
    forward_impl(&call, &mut p, b)?;
    Ok(())
}

/// Backward of a Taylor spec (called by the backend for `FamilySpec::Taylor`).
pub(crate) fn backward<T: DeviceElem>(
    stream: &Arc<CudaStream>,
    config: KernelConfig,
    spec: &AttnSpec,
    b: Backward<'_, T>,
) -> Result<()> {
    let pass = Pass::Backward;
    check::<T>(spec, pass)?;
    no_bias(spec, pass, "bias", b.bias.is_some())?;
    no_bias(spec, pass, "dbias", b.dbias.is_some())?;
    let call = Call::new(stream, config, spec, pass)?;
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
    let (_rg, rg) = call.scratch(rows_q)?;
    let (_nd, nd) = call.scratch(rows_q)?;
    (p.rg, p.nd) = (rg, nd);
    // The order-1 kernels' reversed sweep holds ĝ rounded to the storage type: its −δ from the same ĝ.
    let order1 = match route::backward(spec, Rows::of(spec, &p.base)) {
        route::Backward::Order1 { causal } => Some(causal),
        route::Backward::Sweeps => None,
    };
    let _nd_rev = if order1.is_some() {
        let (buf, ptr) = call.scratch(rows_q)?;
        p.nd_rev = ptr;
        Some(buf)
    } else {
        None
    };
    call.run(call.rows("prep_grads", false), &p)?;
    if let Some(causal) = order1 {
        return call.order1_backward_tiles(&mut p, causal);
    }
    let (_du, du) = call.scratch(rows_q * d)?;
    let (_dvt, dvt) = call.scratch(rows_k * m)?;
    let (_dkh, dkh) = call.scratch(rows_k * d)?;
    (p.acc_q, p.acc_kv, p.acc_k) = (du, dvt, dkh);
    // dû: keys → queries, the gradient read.
    p.out_grad = du;
    call.sweep(&mut p, false, false, true)?;
    // dṽ and dk̂: queries → keys, reversed (suffix sums), the value and the gradient reads of one state.
    (p.out_value, p.out_grad) = (dvt, dkh);
    call.sweep(&mut p, true, true, true)?;
    call.run(call.rows("finalize_dq", false), &p)?;
    call.run(call.rows("finalize_dkdv", true), &p)?;
    Ok(())
}
