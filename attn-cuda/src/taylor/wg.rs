//! Taylor order 2's forward on the wgmma state kernels (`kernels/taylor/taylor_wg.cuh`): where a call
//! runs there (`route::wg_forward`) and the launches (fold, reduce, read; causal: a state per segment, the
//! read's segment densely).

use super::launch::Launch;
use super::{heuristics, Call, TaylorParams};
use crate::error::Result;
use attn_core::Causal;
use cudarc::driver::DevicePtr;

/// The wgmma state kernels (kernels/taylor/taylor_wg.cuh): `attn_taylor2_wg_{stem}_bf16_d64`.
fn wg_kernel(stem: &str) -> String {
    format!("attn_taylor2_wg_{stem}_bf16_d64")
}

impl Call<'_> {
    /// The forward on the wgmma state kernels (`route::wg_forward`): the fold's per-split sums (f32) and the
    /// reduce into the read's bf16 state and f32 vector (with one split the fold writes those itself),
    /// then the read (o, den). Causal: one split whose fold writes the state of the keys before each
    /// segment of `heuristics::wg_causal_seg_len` keys but the first, and a read that takes its
    /// segment's keys densely.
    pub(super) fn wg_forward(&self, p: &mut TaylorParams) -> Result<()> {
        let s = self.spec;
        let heads = s.batch() * s.heads_kv();
        if s.causal() != Causal::None {
            return self.wg_forward_causal(p);
        }
        let seg = heuristics::wg_split_len(s.seq_k(), heads, self.kernels.sms);
        let splits = s.seq_k().div_ceil(seg).max(1);
        (p.seg_len, p.n_seg) = (seg as i32, splits as i32);
        // SAFETY (uninitialised): with several splits the fold writes every sum of every split that has
        // keys, the only ones the reduce reads, and the reduce every element of the bf16 state; with one,
        // the fold writes every element of the state of each sequence that has keys, the only ones the
        // read reads (u16: as many bytes as bf16).
        let partial = if splits > 1 {
            Some(unsafe {
                self.stream
                    .alloc::<f32>(heads * splits * heuristics::WG_SPLIT_SUMS)
            }?)
        } else {
            None
        };
        let state = unsafe { self.stream.alloc::<u16>(heads * heuristics::WG_STATE_ELEMS) }?;
        let vec = self.stream.alloc_zeros::<f32>(heads * heuristics::WG_VEC)?;
        p.st = partial.as_ref().map_or(0, |b| b.device_ptr(self.stream).0);
        p.st_t = state.device_ptr(self.stream).0;
        p.st_vec = vec.device_ptr(self.stream).0;
        self.run(
            Launch {
                name: wg_kernel("fold"),
                grid: (heuristics::WG_FOLD_BLOCKS * splits, s.heads_kv(), s.batch()),
                smem: heuristics::WG_FOLD_SMEM,
            },
            p,
        )?;
        if splits > 1 {
            self.run(
                Launch {
                    name: wg_kernel("reduce"),
                    grid: (heuristics::WG_STATE_GROUPS + 1, s.heads_kv(), s.batch()),
                    smem: 0,
                },
                p,
            )?;
        }
        self.wg_read(p)
    }

    /// The causal forward on the wgmma state kernels (see [`Call::wg_forward`]).
    fn wg_forward_causal(&self, p: &mut TaylorParams) -> Result<()> {
        let s = self.spec;
        let heads = s.batch() * s.heads_kv();
        // `KernelConfig::taylor_causal_segment` where set (a multiple of 128, the read's queries per block).
        let seg = self
            .config
            .taylor_causal_segment
            .unwrap_or_else(|| heuristics::wg_causal_seg_len(s.seq_k()));
        // States of the segments 1 … of the longest sequence.
        let states = heuristics::wg_causal_states(s.seq_k(), seg);
        (p.seg_len, p.n_seg) = (seg as i32, states as i32);
        // SAFETY (uninitialised): the fold writes every element of state m − 1 of each sequence that
        // has a segment m ≥ 1, the only states the read reads (u16: as many bytes as bf16).
        let state = unsafe {
            self.stream
                .alloc::<u16>(heads * states.max(1) * heuristics::WG_STATE_ELEMS)
        }?;
        let vec = self
            .stream
            .alloc_zeros::<f32>(heads * states.max(1) * heuristics::WG_VEC)?;
        (p.st, p.st_t, p.st_vec) = (0, state.device_ptr(self.stream).0, vec.device_ptr(self.stream).0);
        if states > 0 {
            self.run(
                Launch {
                    name: wg_kernel("fold"),
                    grid: (heuristics::WG_FOLD_BLOCKS, s.heads_kv(), s.batch()),
                    smem: heuristics::WG_FOLD_SMEM,
                },
                p,
            )?;
        }
        self.wg_read(p)
    }

    /// The wgmma state kernels' read (o, den) of the state(s) `p` points at.
    fn wg_read(&self, p: &TaylorParams) -> Result<()> {
        let s = self.spec;
        self.run(
            Launch {
                name: wg_kernel("read"),
                grid: (
                    heuristics::blocks(s.seq_q(), heuristics::WG_READ_QUERIES),
                    s.heads_q(),
                    s.batch(),
                ),
                smem: heuristics::WG_READ_SMEM,
            },
            p,
        )
    }
}
