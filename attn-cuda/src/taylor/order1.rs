//! Taylor order 1's own kernels (`taylor_order1.cuh`, `taylor_order1_bwd.cuh`, `taylor_order1_causal.cuh`,
//! `taylor_order1_chain*.cuh`): the single-pass causal forward's and the backward's launches (where a
//! call takes them: `route`).

use super::launch::Launch;
use super::{heuristics, Call, TaylorParams};
use crate::dispatch::dtype_tag;
use crate::error::Result;
use cudarc::driver::DevicePtr;

impl Call<'_> {
    /// The single-pass causal order-1 forward: one launch of fold and forward blocks per segment round
    /// (their chain states and flags in scratch, the flags and the ticket counter zeroed), writing o and
    /// the denominators.
    /// `wg`: its wgmma kernel (`route::order1_chain_wg`).
    pub(super) fn order1_chain_forward(&self, p: &mut TaylorParams, wg: bool) -> Result<()> {
        let s = self.spec;
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
