//! Taylor order 1's own kernels (`taylor_order1.cuh`, `taylor_order1_bwd.cuh`, `taylor_order1_causal.cuh`,
//! `taylor_order1_chain*.cuh`): the single-pass causal forward's and the backward's launches (where a
//! call takes them: `route`).

use super::launch::Launch;
use super::{heuristics, Call, TaylorParams};
use crate::dispatch::dtype_tag;
use crate::error::{CudaAttnError, Result};
use crate::runtime;
use cudarc::driver::DevicePtr;
use std::sync::atomic::{AtomicBool, Ordering};

/// The chain kernels' status word (`taylor_order1_chain.cuh`: `kChainReport`, `kChainTimedOut`,
/// `kChainReportStall`) and their bound on a wait (`kChainWaitNs`).
const CHAIN_REPORT: i32 = 1;
const CHAIN_TIMED_OUT: i32 = 2;
const CHAIN_REPORT_STALL: i32 = 3;
const CHAIN_WAIT_MS: u64 = 2000;

/// Test hook: under `ATTN_CUDA_CHECK_LAUNCHES=1`, the chain kernels' round-0 fold blocks keep their
/// flags down, so every wait on them runs into the bound ([`chain_stall_for_tests`]).
static STALL_FOR_TESTS: AtomicBool = AtomicBool::new(false);

/// Test hook of the chain kernels' bounded wait: while `on`, and only under
/// `ATTN_CUDA_CHECK_LAUNCHES=1`, the single-pass causal order-1 forward's first fold blocks never raise
/// their flags, so the call returns [`CudaAttnError::Stalled`] after the kernels' bound (2 s) instead of
/// a result. Process-wide; for the GPU test of the bound only.
#[doc(hidden)]
pub fn chain_stall_for_tests(on: bool) {
    STALL_FOR_TESTS.store(on, Ordering::Relaxed);
}

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
        p.set_lookahead(lookahead as i32);
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
    /// many flags in scratch (`st`, `chain_flags()`; the flags, the ticket counter and the status word
    /// after them zeroed).
    ///
    /// The kernels bound every wait for a flag (`taylor1_chain_wait`, 2 s). By default a wait that runs
    /// out traps: the launch fails and the next synchronisation on the context returns the driver's
    /// error. Under `ATTN_CUDA_CHECK_LAUNCHES=1` the status word asks the kernel to record the timeout
    /// and end its blocks instead; the launch path has synchronised, and a recorded timeout is
    /// [`CudaAttnError::Stalled`] naming the kernel. No host work is added to the default path.
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
        let mut flags = self.stream.alloc_zeros::<i32>(slots + 2)?;
        let report = runtime::check_launches();
        if report {
            let mode = if STALL_FOR_TESTS.load(Ordering::Relaxed) {
                CHAIN_REPORT_STALL
            } else {
                CHAIN_REPORT
            };
            self.stream
                .memcpy_htod(&[mode], &mut flags.slice_mut(slots + 1..))?;
        }
        p.set_st(states.device_ptr(self.stream).0);
        p.set_chain_flags(flags.device_ptr(self.stream).0);
        launch.grid.0 = launch.grid.0.max(1);
        self.run(launch.clone(), p)?;
        if report {
            let status = self.stream.clone_dtoh(&flags.slice(slots + 1..))?;
            if status.first() == Some(&CHAIN_TIMED_OUT) {
                return Err(CudaAttnError::Stalled {
                    op: self.op,
                    kernel: launch.name,
                    waited_ms: CHAIN_WAIT_MS,
                });
            }
        }
        Ok(())
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
