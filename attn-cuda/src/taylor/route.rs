//! Taylor's routing: which kernels a call runs, as pure functions of the spec, the Hopper routing
//! (device and `KernelConfig`, [`Hopper`]) and the alignment of the call's rows ([`Rows`]). The
//! launches (`taylor.rs`, `order1.rs`, `wg.rs`) follow what these return.

use super::heuristics;
use crate::config::{Hopper, Route};
use crate::dispatch;
use crate::params::AttnParams;
use attn_core::{AttnSpec, Causal, DType, FamilyKind, FamilySpec, Pass, SeqLengths, Strides, TaylorOrder};

/// Which tensors of a call have every row 16 bytes aligned (base address and strides), as the order-1
/// and wgmma kernels' 16-byte copies need; a tensor the call does not have (address 0) qualifies where
/// its strides do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rows {
    pub q: bool,
    pub k: bool,
    pub v: bool,
    pub o: bool,
    pub d_o: bool,
    pub dq: bool,
    pub dk: bool,
    pub dv: bool,
}

/// A tensor whose every row starts 16 bytes aligned (base address and strides); `ptr` 0 (no tensor)
/// qualifies.
pub(crate) fn rows_aligned(ptr: u64, s: Strides) -> bool {
    ptr % 16 == 0 && s.batch % 8 == 0 && s.seq % 8 == 0 && s.head % 8 == 0
}

impl Rows {
    /// The alignment of the tensors `p` points at, with `spec`'s strides.
    pub(crate) fn of(spec: &AttnSpec, p: &AttnParams) -> Self {
        Rows {
            q: rows_aligned(p.q, spec.q_strides()),
            k: rows_aligned(p.k, spec.k_strides()),
            v: rows_aligned(p.v, spec.v_strides()),
            o: rows_aligned(p.o, spec.o_strides()),
            d_o: rows_aligned(p.d_o, spec.o_strides()),
            dq: rows_aligned(p.dq, spec.dq_strides()),
            dk: rows_aligned(p.dk, spec.dk_strides()),
            dv: rows_aligned(p.dv, spec.dv_strides()),
        }
    }

    /// Every row aligned (for tests).
    #[cfg(test)]
    pub(crate) const ALL: Rows = Rows {
        q: true,
        k: true,
        v: true,
        o: true,
        d_o: true,
        dq: true,
        dk: true,
        dv: true,
    };
}

/// Whether every sequence of a call has as many queries as keys (no key padding), so that query i sits on
/// key i and both causal alignments are `j ≤ i`: the shape of the causal forwards of the wgmma state kernels
/// ([`wg_forward`]) and of the single-pass order-1 kernel ([`Forward::Order1Chain`]).
pub(crate) fn query_on_key(spec: &AttnSpec) -> bool {
    match spec.lengths() {
        SeqLengths::Dense => spec.seq_q() == spec.seq_k(),
        SeqLengths::KeyPadding(_) => false,
        SeqLengths::Varlen {
            cu_seqlens_q,
            cu_seqlens_k,
        } => cu_seqlens_q == cu_seqlens_k,
    }
}

fn order(spec: &AttnSpec) -> Option<TaylorOrder> {
    match *spec.family() {
        FamilySpec::Taylor { order, .. } => Some(order),
        _ => None,
    }
}

/// Whether a Taylor call runs as its quadratic form on the Hopper flash kernels (`TaylorScore`,
/// kernels/taylor/taylor_flash.cu) rather than the state kernels: order 2, f16 or bf16, a head dim those
/// kernels have, the Hopper kernels of the pass on this device, and `hopper.taylor_dense` (by default
/// where [`heuristics::dense_faster`], unless a forward takes the wgmma state kernels, [`wg_forward`]).
/// Both paths save the same statistic (the denominators), so a forward on one and a backward on the
/// other agree. The backend also needs the rows the flash kernels load (its `taylor_on_flash`).
pub(crate) fn dense_on_flash(spec: &AttnSpec, pass: Pass, hopper: Hopper) -> bool {
    if order(spec) != Some(TaylorOrder::Two) {
        return false;
    }
    let d = spec.head_dim();
    let kernels = match pass {
        Pass::Forward => hopper.on,
        Pass::Backward => hopper.on && hopper.bwd_ws,
        Pass::Spec | Pass::Decode => false,
    };
    if !kernels
        || spec.dtype() == DType::F32
        || spec.head_dim_v() != d
        || !dispatch::head_dims(FamilyKind::Taylor).contains(&d)
    {
        return false;
    }
    match hopper.taylor_dense {
        Route::Off => false,
        Route::Everywhere => true,
        Route::Measured => {
            !(pass == Pass::Forward && wg_forward(spec, hopper))
                && heuristics::dense_faster(d, spec.causal() != Causal::None, spec.seq_k())
        }
    }
}

/// Whether a Taylor forward runs on the wgmma state kernels (kernels/taylor/taylor_wg.cuh: fold,
/// reduce, read): order 2, bf16, D = Dv = 64, the Hopper kernels on this device, no window, no causal
/// mask or a causal mask where every sequence has as many queries as keys (dense or packed with equal
/// offsets: both alignments are then `j ≤ i`), and `hopper.taylor_wg` (`KernelConfig::taylor_wg`; by
/// default where [`heuristics::wg_state_faster`]). They save the denominators as the other paths do,
/// so the backward may run on either of the others. [`forward`] also needs q, k, v and o rows aligned.
pub(crate) fn wg_forward(spec: &AttnSpec, hopper: Hopper) -> bool {
    if order(spec) != Some(TaylorOrder::Two) {
        return false;
    }
    if !hopper.on
        || spec.dtype() != DType::BF16
        || spec.head_dim() != heuristics::WG_HEAD_DIM
        || spec.head_dim_v() != heuristics::WG_HEAD_DIM
        || spec.window().is_some()
    {
        return false;
    }
    let causal = spec.causal() != Causal::None;
    if causal && !query_on_key(spec) {
        return false;
    }
    match hopper.taylor_wg {
        Route::Off => false,
        Route::Everywhere => true,
        Route::Measured => heuristics::wg_state_faster(spec.seq_k(), causal),
    }
}

/// Whether the single-pass causal order-1 forward runs on its wgmma kernel (`taylor_order1_chain_wg.cuh`):
/// bf16, D = Dv = 64, the Hopper kernels on this device; elsewhere its mma.sync kernel.
pub(crate) fn order1_chain_wg(spec: &AttnSpec, hopper: Hopper) -> bool {
    spec.dtype() == DType::BF16
        && spec.head_dim() == heuristics::WG_HEAD_DIM
        && spec.head_dim_v() == heuristics::WG_HEAD_DIM
        && hopper.on
}

/// Whether a sweep folds its sources with the order-1 fold (`reverse`: its sources are q and dO, else
/// k and v): order 1, f16/bf16, the sources' rows 16-byte aligned.
pub(crate) fn order1_fold(spec: &AttnSpec, rows: Rows, reverse: bool) -> bool {
    let sources = if reverse {
        rows.q && rows.d_o
    } else {
        rows.k && rows.v
    };
    order(spec) == Some(TaylorOrder::One) && spec.dtype().size() == 2 && sources
}

/// The kernels of a Taylor forward on the state kernels (the flash path, [`dense_on_flash`], is the
/// backend's choice before this).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Forward {
    /// Order 2 on the wgmma state kernels ([`wg_forward`]).
    WgState,
    /// The single-pass causal order-1 forward (`taylor_order1_chain.cuh`; `wg`: its wgmma kernel,
    /// [`order1_chain_wg`]): the causal order-1 tile where every sequence has as many queries as keys.
    Order1Chain { wg: bool },
    /// The two-pass causal order-1 forward (`taylor_order1_causal.cuh`): the order-1 fold of the
    /// forward sweep, a causal mask, D ≤ 64, q and o rows 16-byte aligned.
    Order1Causal,
    /// The order-1 forward tile (`taylor_order1.cuh`): the order-1 fold of the forward sweep, no
    /// causal mask, q and o rows 16-byte aligned.
    Order1Tiles,
    /// The general f16/bf16 forward tile after the fold and the prefix.
    Tiles,
    /// f32: the general sweep (dense, fold, prefix, read) and the finalize row kernel.
    Sweep,
}

/// The forward of `spec` with rows `rows` under `hopper`.
pub(crate) fn forward(spec: &AttnSpec, hopper: Hopper, rows: Rows) -> Forward {
    if spec.dtype().size() != 2 {
        return Forward::Sweep;
    }
    // The wgmma state kernels copy 16-byte row chunks (cp.async) and store o in pairs.
    if rows.q && rows.k && rows.v && rows.o && wg_forward(spec, hopper) {
        return Forward::WgState;
    }
    let fold = order1_fold(spec, rows, false) && rows.q && rows.o;
    if fold && spec.causal() != Causal::None && spec.head_dim() <= heuristics::ORDER1_CAUSAL_MAX_DIM {
        if query_on_key(spec) {
            return Forward::Order1Chain {
                wg: order1_chain_wg(spec, hopper),
            };
        }
        return Forward::Order1Causal;
    }
    if fold && spec.causal() == Causal::None {
        return Forward::Order1Tiles;
    }
    Forward::Tiles
}

/// The kernels of a Taylor backward on the state kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backward {
    /// Order 1's own backward (`taylor_order1_bwd.cuh`; `causal`: `taylor_order1_causal.cuh`, D ≤ 64):
    /// the order-1 folds of both sweeps and dq, dk, dv rows 16-byte aligned.
    Order1 { causal: bool },
    /// The general sweeps (each fold the order-1 one where [`order1_fold`] says so) and the finalize
    /// row kernels.
    Sweeps,
}

/// The backward of `spec` with rows `rows`.
pub(crate) fn backward(spec: &AttnSpec, rows: Rows) -> Backward {
    let causal = spec.causal() != Causal::None;
    let on = order1_fold(spec, rows, false)
        && order1_fold(spec, rows, true)
        && (!causal || spec.head_dim() <= heuristics::ORDER1_CAUSAL_MAX_DIM)
        && rows.dq
        && rows.dk
        && rows.dv;
    if on {
        Backward::Order1 { causal }
    } else {
        Backward::Sweeps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::{AttnProblem, Family};

    fn spec(order: u8, dtype: DType, d: usize, n: usize, causal: Causal) -> AttnSpec {
        AttnProblem::new(Family::taylor(order), dtype, 1, 4, 2, n, n, d)
            .with_causal(causal)
            .validate()
            .expect("valid problem")
    }

    fn hopper(on: bool) -> Hopper {
        Hopper::new(
            if on { (9, 0) } else { (8, 0) },
            &crate::config::KernelConfig::default(),
        )
    }

    /// The wgmma chain kernel takes bf16 at D = 64 on Hopper only; everything else stays on the mma.sync one.
    #[test]
    fn order1_chain_wg_routes_bf16_d64_on_hopper_only() {
        let s = |dtype, d| spec(1, dtype, d, 2048, Causal::TopLeft);
        assert!(order1_chain_wg(&s(DType::BF16, 64), hopper(true)));
        assert!(!order1_chain_wg(&s(DType::BF16, 64), hopper(false)));
        assert!(!order1_chain_wg(&s(DType::F16, 64), hopper(true)));
        assert!(!order1_chain_wg(&s(DType::BF16, 32), hopper(true)));
    }

    #[test]
    fn forward_paths_by_order_mask_dtype_and_alignment() {
        let (h, sm80) = (hopper(true), hopper(false));
        let all = Rows::ALL;
        // Order 1 causal, Nq = Nk: the single-pass forward (wgmma at bf16 D = 64 on Hopper).
        let causal = spec(1, DType::BF16, 64, 2048, Causal::TopLeft);
        assert_eq!(forward(&causal, h, all), Forward::Order1Chain { wg: true });
        assert_eq!(forward(&causal, sm80, all), Forward::Order1Chain { wg: false });
        // Nq ≠ Nk: the two-pass forward; D = 128 (past the causal kernels' 64): the general tile.
        let uneven = AttnProblem::new(Family::taylor(1), DType::F16, 1, 4, 2, 100, 300, 64)
            .with_causal(Causal::BottomRight)
            .validate()
            .expect("valid problem");
        assert_eq!(forward(&uneven, h, all), Forward::Order1Causal);
        assert_eq!(
            forward(&spec(1, DType::BF16, 128, 512, Causal::TopLeft), h, all),
            Forward::Tiles
        );
        // No mask: the order-1 tile; misaligned k: the general tile; f32: the sweep.
        let dense = spec(1, DType::BF16, 64, 512, Causal::None);
        assert_eq!(forward(&dense, h, all), Forward::Order1Tiles);
        assert_eq!(forward(&dense, h, Rows { k: false, ..all }), Forward::Tiles);
        assert_eq!(
            forward(&spec(1, DType::F32, 64, 512, Causal::None), h, all),
            Forward::Sweep
        );
        // Order 2, bf16, D = 64: the wgmma state kernels from 4096 keys (8192 causal) on Hopper, with
        // q, k, v, o aligned; shorter, the general tile (the backend sends those to the flash kernels).
        let long = spec(2, DType::BF16, 64, 4096, Causal::None);
        assert_eq!(forward(&long, h, all), Forward::WgState);
        assert_eq!(forward(&long, h, Rows { o: false, ..all }), Forward::Tiles);
        assert_eq!(forward(&long, sm80, all), Forward::Tiles);
        assert_eq!(
            forward(&spec(2, DType::BF16, 64, 4096, Causal::TopLeft), h, all),
            Forward::Tiles
        );
        assert_eq!(
            forward(&spec(2, DType::BF16, 64, 8192, Causal::TopLeft), h, all),
            Forward::WgState
        );
    }

    #[test]
    fn backward_paths_need_both_folds_and_aligned_gradients() {
        let all = Rows::ALL;
        let dense = spec(1, DType::F16, 64, 512, Causal::None);
        assert_eq!(backward(&dense, all), Backward::Order1 { causal: false });
        let causal = spec(1, DType::F16, 64, 512, Causal::TopLeft);
        assert_eq!(backward(&causal, all), Backward::Order1 { causal: true });
        assert_eq!(
            backward(&spec(1, DType::F16, 128, 512, Causal::TopLeft), all),
            Backward::Sweeps
        );
        for rows in [
            Rows { d_o: false, ..all },
            Rows { dk: false, ..all },
            Rows { k: false, ..all },
        ] {
            assert_eq!(backward(&dense, rows), Backward::Sweeps, "{rows:?}");
        }
        // The reversed sweep's fold is the order-1 one where q and dO are aligned, whatever k and v.
        assert!(order1_fold(&dense, Rows { k: false, ..all }, true));
        assert!(!order1_fold(&dense, Rows { q: false, ..all }, true));
        assert_eq!(
            backward(&spec(2, DType::F16, 64, 512, Causal::None), all),
            Backward::Sweeps
        );
        assert_eq!(
            backward(&spec(1, DType::F32, 64, 512, Causal::None), all),
            Backward::Sweeps
        );
    }
}
