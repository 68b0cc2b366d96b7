//! The Taylor kernels' parameter struct: the spec's `AttnParams` followed by the row scalars and f32 sums of a call,
//! the mirror of `struct TaylorParams` in `kernels/taylor/taylor_common.cuh`, field for field.

use crate::params::AttnParams;
use attn_core::{AttnSpec, FamilySpec, TaylorOrder};
use cudarc::driver::DeviceRepr;

/// Device pointers are plain addresses (`u64`, 0 = none), filled by the launcher from checked buffers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TaylorParams {
    pub base: AttnParams,
    pub out_value: u64,
    pub out_grad: u64,
    /// Backward: `1/den` per query row (0 for a row with no key).
    pub rg: u64,
    /// Backward: `−δ = −(dO/den)·o` per query row.
    pub nd: u64,
    /// −T(ĝ_i)·o_i for the order-1 reversed sweeps (0: not written).
    pub nd_rev: u64,
    pub acc_q: u64,
    pub acc_kv: u64,
    pub acc_k: u64,
    pub state: u64,
    /// State sweep: `[B][Hkv][n_seg][M][f_pad]` f32 segment sums, then their prefix; decode: the
    /// per-feature-block partials of a step.
    pub st: u64,
    /// State sweep: `[B][Hkv][n_seg]` the bits of each segment's largest |sum| (zeroed before the fold);
    /// the single-pass causal order-1 forward: its chain flags, then its ticket counter (zeroed).
    pub st_max: u64,
    /// f16/bf16 state sweep: the states in the storage type, `[B][Hkv][n_seg][copies][M][f_pad]`.
    pub st_t: u64,
    /// Order 2 on wgmma (`taylor_wg.cuh`): the read's f32 vector part, `[B][Hkv][132]` (causal: one per
    /// state, `[B][Hkv][n_seg][132]`).
    pub st_vec: u64,
    pub a0: f32,
    pub a1: f32,
    pub a2: f32,
    /// 1 or 2.
    pub order: i32,
    /// Sweep roles: 0 keys → queries (forward, dQ), 1 queries → keys reversed (dV, dK).
    pub reverse: i32,
    /// Fold: feature slabs per (batch entry, kv head); decode: feature blocks of the partials; the
    /// single-pass causal order-1 forward: how many rounds its fold blocks run ahead.
    pub n_slabs: i32,
    /// Sources per segment `L`.
    pub seg_len: i32,
    /// Segments of the longest (batch entry, kv head): the stride of `st`.
    pub n_seg: i32,
    /// Features per state row (8 · tiles, padded to whole read steps).
    pub f_pad: i32,
    /// Decode: feature rows of the state (8 per tile).
    pub features: i32,
    /// f16/bf16 state copies: 1 (hi) or 2 (hi and lo, for a sweep with a gradient read).
    pub copies: i32,
    /// 1: an order-1 reversed sweep without qk_l2norm folds q raw and its reads apply the scale (so
    /// that its f is the forward's to f32 rounding, which matters where a denominator nears 0).
    pub rev_raw: i32,
}

// SAFETY: `TaylorParams` is `#[repr(C)]`, made of `AttnParams` (itself `#[repr(C)]` integers and floats,
// 8-byte aligned with no tail padding), 8-byte pointers and then 4-byte fields whose count keeps the total
// a multiple of 8; the order and types match `struct TaylorParams` in taylor_common.cuh.
unsafe impl DeviceRepr for TaylorParams {}

impl TaylorParams {
    /// Everything but the pointers and the per-launch fields, from a checked Taylor spec.
    pub(crate) fn from_spec(spec: &AttnSpec) -> Self {
        let mut p = TaylorParams {
            base: AttnParams::from_spec(spec),
            ..TaylorParams::default()
        };
        // The launcher only builds params for Taylor specs (checked by `taylor::check`).
        if let FamilySpec::Taylor {
            order,
            a,
            scale,
            qk_l2norm,
            eps,
        } = *spec.family()
        {
            p.base.scale = scale;
            p.base.eps = eps;
            p.base.l2norm = i32::from(qk_l2norm);
            [p.a0, p.a1, p.a2] = a;
            p.order = match order {
                TaylorOrder::One => 1,
                TaylorOrder::Two => 2,
            };
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::{AttnProblem, DType, Family, TaylorParams as Taylor};

    #[test]
    fn params_are_the_attn_params_then_thirteen_pointers_and_twelve_scalars() {
        assert_eq!(
            std::mem::size_of::<TaylorParams>(),
            std::mem::size_of::<AttnParams>() + 13 * 8 + 12 * 4
        );
        assert_eq!(std::mem::size_of::<TaylorParams>() % 8, 0);
        assert_eq!(std::mem::align_of::<TaylorParams>(), 8);
    }

    #[test]
    fn family_parameters_reach_the_kernels() {
        let fam = Family::Taylor(Taylor {
            order: 1,
            a: [1.0, 0.5, 0.25],
            scale: Some(0.3),
            qk_l2norm: true,
        });
        let spec = AttnProblem::new(fam, DType::BF16, 1, 2, 1, 4, 4, 16)
            .validate()
            .expect("valid problem");
        let p = TaylorParams::from_spec(&spec);
        // Order 1 drops a2 (validation sets it to 0).
        assert_eq!((p.a0, p.a1, p.a2, p.order), (1.0, 0.5, 0.0, 1));
        assert_eq!((p.base.scale, p.base.l2norm, p.base.group), (0.3, 1, 2));
        assert_eq!((p.base.window_left, p.base.window_right), (-1, -1));
    }
}
