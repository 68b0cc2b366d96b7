//! Taylor order 1's own kernels (`taylor_order1.cuh`, `taylor_order1_bwd.cuh`, `taylor_order1_causal.cuh`):
//! where a call takes them, and the backward's launches.

use super::launch::Launch;
use super::{heuristics, query_on_key, rows_aligned, Call, TaylorParams};
use crate::dispatch::dtype_tag;
use crate::error::Result;
use crate::runtime::Hopper;
use attn_core::{AttnSpec, Causal, DType};
use cudarc::driver::DevicePtr;

/// Whether the single-pass causal order-1 forward ([`Call::order1_chain`]) runs on its wgmma kernel
/// (`taylor_order1_chain_wg.cuh`): bf16, D = Dv = 64, the Hopper kernels on this device.
pub(crate) fn order1_chain_wg(spec: &AttnSpec, hopper: Hopper) -> bool {
    spec.dtype() == DType::BF16
        && spec.head_dim() == heuristics::WG_HEAD_DIM
        && spec.head_dim_v() == heuristics::WG_HEAD_DIM
        && hopper.on
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
        p.order == 1 && s.dtype().size() == 2 && sources
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
        self.order1_causal(p) && query_on_key(self.spec)
    }

    /// The single-pass causal order-1 forward: one launch of fold and forward blocks per segment round
    /// (their chain states and flags in scratch, the flags and the ticket counter zeroed), writing o and
    /// the denominators.
    pub(super) fn order1_chain_forward(&self, p: &mut TaylorParams) -> Result<()> {
        let s = self.spec;
        let wg = order1_chain_wg(s, self.hopper());
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
        let seg = self
            .config
            .taylor_causal_segment
            .unwrap_or(heuristics::ORDER1_CHAIN_SEG_LEN);
        let rounds = s.seq_k().div_ceil(seg);
        let chains = s.batch() * s.heads_kv() * rounds;
        (p.seg_len, p.n_seg) = (seg as i32, rounds as i32);
        let lookahead = heuristics::ORDER1_CHAIN_LOOKAHEAD;
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
}
