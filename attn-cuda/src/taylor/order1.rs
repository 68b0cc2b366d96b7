//! Taylor order 1's own kernels (`taylor_order1.cuh`, `taylor_order1_bwd.cuh`, `taylor_order1_causal.cuh`):
//! where a call takes them, and the backward's launches.

use super::launch::Launch;
use super::{heuristics, query_on_key, rows_aligned, Call, TaylorParams};
use crate::dispatch::dtype_tag;
use crate::error::Result;
use crate::runtime::Hopper;
use attn_core::{AttnSpec, Causal, DType};
use cudarc::driver::DevicePtr;
use std::sync::OnceLock;

/// A switch read once from the environment: on unless `var` is `0`.
fn env_on(cell: &'static OnceLock<bool>, var: &str) -> bool {
    *cell.get_or_init(|| std::env::var(var).map_or(true, |v| v.trim() != "0"))
}

/// A number read once from the environment, where `var` parses and `accept` takes it.
fn env_usize(cell: &'static OnceLock<Option<usize>>, var: &str, accept: fn(usize) -> bool) -> Option<usize> {
    *cell.get_or_init(|| {
        let n = std::env::var(var).ok()?.trim().parse::<usize>().ok()?;
        accept(n).then_some(n)
    })
}

/// Whether the order-1 kernels may run (`ATTN_CUDA_TAYLOR1=0` keeps the general ones, for comparison).
fn order1_kernels_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    env_on(&ON, "ATTN_CUDA_TAYLOR1")
}

/// Whether the single-pass causal order-1 forward may run (`ATTN_CUDA_TAYLOR1_CHAIN=0` keeps the two-pass
/// one, for comparison).
fn chain_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    env_on(&ON, "ATTN_CUDA_TAYLOR1_CHAIN")
}

/// Whether the single-pass causal order-1 forward may run on its wgmma kernel where it applies (bf16,
/// D = Dv = 64, Hopper; `ATTN_CUDA_TAYLOR1_CHAIN_WG=0` keeps the mma.sync one, for comparison).
fn chain_wg_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    env_on(&ON, "ATTN_CUDA_TAYLOR1_CHAIN_WG")
}

/// Whether the single-pass causal order-1 forward ([`Call::order1_chain`]) runs on its wgmma kernel
/// (`taylor_order1_chain_wg.cuh`): bf16, D = Dv = 64, the Hopper kernels on this device, unless
/// `ATTN_CUDA_TAYLOR1_CHAIN_WG=0`.
pub(crate) fn order1_chain_wg(spec: &AttnSpec, hopper: Hopper) -> bool {
    spec.dtype() == DType::BF16
        && spec.head_dim() == heuristics::WG_HEAD_DIM
        && spec.head_dim_v() == heuristics::WG_HEAD_DIM
        && hopper.on
        && chain_wg_on()
}

/// `ATTN_CUDA_TAYLOR1_CHAIN_RES`: 1 the resident-keys forward wherever the wgmma chain kernel applies, 0
/// never; unset (or anything else): [`order1_chain_res`]'s rule.
fn chain_res_forced() -> Option<bool> {
    static FORCED: OnceLock<Option<usize>> = OnceLock::new();
    env_usize(&FORCED, "ATTN_CUDA_TAYLOR1_CHAIN_RES", |v| v <= 1).map(|v| v == 1)
}

/// Whether the wgmma single-pass causal order-1 forward keeps each block's keys resident in shared memory
/// (`taylor_order1_chain_res.cuh`, k and v read from DRAM once): `forced` where given, else sequences of
/// `heuristics::ORDER1_CHAIN_RES_MIN_N` keys or more on a device whose peak DRAM bandwidth (bytes/s, 0:
/// unknown) is known and below `heuristics::ORDER1_CHAIN_RES_MAX_DRAM`.
pub(crate) fn order1_chain_res(seq_k: usize, dram_bytes_per_s: f64, forced: Option<bool>) -> bool {
    forced.unwrap_or(
        seq_k >= heuristics::ORDER1_CHAIN_RES_MIN_N
            && dram_bytes_per_s > 0.0
            && dram_bytes_per_s < heuristics::ORDER1_CHAIN_RES_MAX_DRAM,
    )
}

/// `ATTN_CUDA_TAYLOR1_SEG=L` (a multiple of 64): the segment length of the order-1 causal sweeps in place
/// of `heuristics::order1_causal_seg_len`, for measuring it; anything else is ignored.
pub(super) fn order1_causal_seg_override() -> Option<usize> {
    static SEG: OnceLock<Option<usize>> = OnceLock::new();
    env_usize(&SEG, "ATTN_CUDA_TAYLOR1_SEG", |l| l >= 64 && l % 64 == 0)
}

/// `ATTN_CUDA_TAYLOR1_LOOKAHEAD=n`: how many rounds the single-pass causal forward's fold blocks run
/// ahead of its forward blocks, in place of `heuristics::ORDER1_CHAIN_LOOKAHEAD`, for measuring it.
fn order1_chain_lookahead_override() -> Option<usize> {
    static LA: OnceLock<Option<usize>> = OnceLock::new();
    env_usize(&LA, "ATTN_CUDA_TAYLOR1_LOOKAHEAD", |_| true)
}

impl Call<'_> {
    /// The order-1 fold for a sweep (`reverse`: its sources are q and dO, else k and v): order 1,
    /// f16/bf16, the sources' rows 16-byte aligned.
    pub(super) fn order1_fold(&self, p: &TaylorParams, reverse: bool) -> bool {
        let s = self.spec;
        let sources = if reverse {
            rows_aligned(p.base.q, s.q_strides()) && rows_aligned(p.base.d_o, s.o_strides())
        } else {
            rows_aligned(p.base.k, s.k_strides()) && rows_aligned(p.base.v, s.v_strides())
        };
        p.order == 1 && s.dtype().size() == 2 && order1_kernels_on() && sources
    }

    /// The order-1 forward tile: the order-1 fold of the forward sweep, no causal mask, q and o rows
    /// 16-byte aligned.
    pub(super) fn order1_forward(&self, p: &TaylorParams) -> bool {
        let s = self.spec;
        self.order1_fold(p, false)
            && s.causal() == Causal::None
            && rows_aligned(p.base.q, s.q_strides())
            && rows_aligned(p.base.o, s.o_strides())
    }

    /// The order-1 causal forward tile: the order-1 fold of the forward sweep, a causal mask, D ≤ 64, q
    /// and o rows 16-byte aligned.
    pub(super) fn order1_causal(&self, p: &TaylorParams) -> bool {
        let s = self.spec;
        self.order1_fold(p, false)
            && s.causal() != Causal::None
            && s.head_dim() <= heuristics::ORDER1_CAUSAL_MAX_DIM
            && rows_aligned(p.base.q, s.q_strides())
            && rows_aligned(p.base.o, s.o_strides())
    }

    /// The single-pass causal order-1 forward (`taylor_order1_chain.cuh`): the causal order-1 forward tile
    /// where every sequence has as many queries as keys (query i sits on key i in both alignments).
    pub(super) fn order1_chain(&self, p: &TaylorParams) -> bool {
        self.order1_causal(p) && query_on_key(self.spec) && chain_on()
    }

    /// The single-pass causal order-1 forward: one launch of fold and forward blocks per segment round
    /// (their chain states and flags in scratch, the flags and the ticket counter zeroed), writing o and
    /// the denominators; where the wgmma kernel applies and [`order1_chain_res`] says so, the
    /// resident-keys kernel instead ([`Call::order1_chain_res_forward`]).
    pub(super) fn order1_chain_forward(&self, p: &mut TaylorParams) -> Result<()> {
        let s = self.spec;
        let wg = order1_chain_wg(s, self.hopper());
        if wg && order1_chain_res(s.seq_k(), self.kernels.dram_bytes_per_s, chain_res_forced()) {
            return self.order1_chain_res_forward(p);
        }
        let d = s.head_dim();
        let (name, smem, state_floats) = if wg {
            (
                "attn_taylor_order1_chain_wg_bf16_d64".to_string(),
                heuristics::ORDER1_CHAIN_WG_SMEM,
                heuristics::ORDER1_CHAIN_WG_STATE_FLOATS,
            )
        } else {
            (
                format!("attn_taylor_order1_chain_{}_d{d}", dtype_tag(s.dtype())),
                heuristics::order1_chain_smem(d),
                heuristics::order1_chain_state_floats(d),
            )
        };
        let seg = order1_causal_seg_override().unwrap_or(heuristics::ORDER1_CHAIN_SEG_LEN);
        let rounds = s.seq_k().div_ceil(seg);
        let chains = s.batch() * s.heads_kv() * rounds;
        (p.seg_len, p.n_seg) = (seg as i32, rounds as i32);
        let lookahead = order1_chain_lookahead_override().unwrap_or(heuristics::ORDER1_CHAIN_LOOKAHEAD);
        p.n_slabs = lookahead as i32;
        let folds = s.batch() * s.heads_kv();
        let blocks = lookahead * folds + rounds * (folds + s.batch() * s.heads_q());
        self.run_chain(
            p,
            Launch {
                name,
                grid: (blocks, 1, 1),
                smem,
            },
            chains,
            state_floats,
        )
    }

    /// One launch of a single-pass chain kernel with `slots` chain states of `state_floats` each and as
    /// many flags in scratch (`p.st`, `p.st_max`; the flags and the ticket counter after them zeroed).
    fn run_chain(
        &self,
        p: &mut TaylorParams,
        mut launch: Launch,
        slots: usize,
        state_floats: usize,
    ) -> Result<()> {
        // SAFETY (uninitialised): a block reads a chain state only after its flag is raised, which the
        // writing block does after writing every slot of it (the flags and the counter: zeroed).
        let states = unsafe { self.stream.alloc::<f32>(slots.max(1) * state_floats) }?;
        let flags = self.stream.alloc_zeros::<i32>(slots + 1)?;
        p.st = states.device_ptr(self.stream).0;
        p.st_max = flags.device_ptr(self.stream).0;
        launch.grid.0 = launch.grid.0.max(1);
        self.run(launch, p)
    }

    /// The single-pass causal order-1 forward with resident keys (`taylor_order1_chain_res.cuh`): one
    /// launch of four blocks per 1024-key segment round and query head, their states (the segments' sums
    /// and the first three blocks' parts) and flags in scratch, the flags and the ticket counter zeroed.
    fn order1_chain_res_forward(&self, p: &mut TaylorParams) -> Result<()> {
        let s = self.spec;
        let seg = heuristics::ORDER1_CHAIN_RES_SEG;
        let rounds = s.seq_k().div_ceil(seg);
        let chains = s.batch() * s.heads_q() * rounds;
        (p.seg_len, p.n_seg) = (seg as i32, rounds as i32);
        // One state and flag per block: the segments' sums (I) and the first J − 1 blocks' parts.
        let slots = heuristics::ORDER1_CHAIN_RES_BLOCKS * chains;
        let launch = Launch {
            name: "attn_taylor_order1_chain_res_bf16_d64".to_string(),
            grid: (slots, 1, 1),
            smem: heuristics::ORDER1_CHAIN_RES_SMEM,
        };
        self.run_chain(p, launch, slots, heuristics::ORDER1_CHAIN_WG_STATE_FLOATS)
    }

    /// Which order-1 backward kernels run: `Some(false)` `taylor1_backward` (no causal mask), `Some(true)`
    /// `taylor1_dq_causal` and `taylor1_dkdv_causal` (a causal mask, D ≤ 64), `None` the general ones.
    /// Both need the order-1 folds of both sweeps and dq, dk, dv rows 16-byte aligned.
    pub(super) fn order1_backward(&self, p: &TaylorParams) -> Option<bool> {
        let s = self.spec;
        let causal = s.causal() != Causal::None;
        let on = self.order1_fold(p, false)
            && self.order1_fold(p, true)
            && (!causal || s.head_dim() <= heuristics::ORDER1_CAUSAL_MAX_DIM)
            && rows_aligned(p.base.dq, s.dq_strides())
            && rows_aligned(p.base.dk, s.dk_strides())
            && rows_aligned(p.base.dv, s.dv_strides());
        on.then_some(causal)
    }

    /// The order-1 backward after prep_grads, per sweep (dq; then dk and dv from the reversed one, both
    /// reads of one state): its states, then one probe kernel that writes finished gradients, with no f32
    /// scratch rows and no finalize. Not causal: the whole sum of each sweep's sources (copies hi and lo),
    /// read by `taylor1_backward`'s blocks over all probe tiles. Causal (D ≤ 64): the prefix's f32 sums in
    /// place (no copies) and one block per segment in `taylor1_forward_causal`'s structure.
    pub(super) fn order1_backward_tiles(&self, p: &mut TaylorParams, causal: bool) -> Result<()> {
        let s = self.spec;
        let d = s.head_dim();
        let dt = dtype_tag(s.dtype());
        let heads = s.batch() * s.heads_kv();
        for (reverse, stem, rows) in [(false, "dq", s.group() * s.seq_q()), (true, "dkdv", s.seq_k())] {
            if reverse {
                p.nd = p.nd_rev; // −T(ĝ)·o: cancels with v·T(ĝ) (taylor_prep_grads)
                p.rev_raw = i32::from(p.base.l2norm == 0); // q raw in the state, the reads scale it
            }
            let (_, entries) = self.geometry(p, reverse, causal)?;
            let _states = self.states(p, entries, if causal { 0 } else { 2 })?;
            let launch = if causal {
                Launch {
                    name: format!("attn_taylor_order1_causal_{stem}_{dt}_d{d}"),
                    grid: ((p.n_seg as usize).max(1), s.heads_kv(), s.batch()),
                    smem: heuristics::order1_causal_bwd_smem(d),
                }
            } else {
                Launch {
                    name: format!("attn_taylor_order1_{stem}_{dt}_d{d}"),
                    grid: (
                        heuristics::order1_backward_blocks(rows, d, heads, self.kernels.sms),
                        s.heads_kv(),
                        s.batch(),
                    ),
                    smem: heuristics::order1_backward_smem(d),
                }
            };
            self.run(launch, p)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::{AttnProblem, Family};

    /// The wgmma chain kernel takes bf16 at D = 64 on Hopper only; everything else stays on the mma.sync one.
    #[test]
    fn order1_chain_wg_routes_bf16_d64_on_hopper_only() {
        let spec = |dtype, d| {
            AttnProblem::new(Family::taylor(1), dtype, 1, 4, 2, 2048, 2048, d)
                .with_causal(Causal::TopLeft)
                .validate()
                .expect("valid problem")
        };
        let on = Hopper {
            on: true,
            ..Hopper::default()
        };
        assert!(order1_chain_wg(&spec(DType::BF16, 64), on));
        assert!(!order1_chain_wg(&spec(DType::BF16, 64), Hopper::default()));
        assert!(!order1_chain_wg(&spec(DType::F16, 64), on));
        assert!(!order1_chain_wg(&spec(DType::BF16, 32), on));
    }

    /// The resident-keys forward: from 16k keys on a device with the H100's DRAM (3.35 TB/s), not on the
    /// H200's (4.8 TB/s) nor where the bandwidth is unknown; the environment's choice wins either way.
    #[test]
    fn order1_chain_res_from_16k_where_dram_is_slow() {
        let (h100, h200) = (3.35e12, 4.8e12);
        assert!(order1_chain_res(16_384, h100, None));
        assert!(order1_chain_res(65_536, h100, None));
        assert!(!order1_chain_res(8_192, h100, None));
        assert!(!order1_chain_res(65_536, h200, None));
        assert!(!order1_chain_res(65_536, 0.0, None));
        assert!(order1_chain_res(1_024, h200, Some(true)));
        assert!(!order1_chain_res(65_536, h100, Some(false)));
    }
}
