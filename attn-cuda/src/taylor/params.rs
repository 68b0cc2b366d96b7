//! The Taylor kernels' parameter struct: the spec's `AttnParams` followed by the row scalars and f32 sums of a call,
//! the mirror of `struct TaylorParams` in `kernels/taylor/taylor_common.cuh`, field for field.

use crate::params::AttnParams;
use attn_core::{AttnSpec, FamilySpec, TaylorOrder};
use cudarc::driver::DeviceRepr;

/// Device pointers are plain addresses (`u64`, 0 = none), filled by the launcher from checked buffers.
///
/// Three slots mean different things in different kernels; in C the kernels read the other meanings
/// through accessors named after them (`decode_partials()`, `chain_flags()`, `decode_blocks()`,
/// `lookahead()`). Here each is a private field written through one setter per meaning (`set_st` or
/// `set_decode_partials`, `set_st_max` or `set_chain_flags`, `set_slabs`, `set_decode_blocks` or
/// `set_lookahead`), so a launch site names what it passes and the layout stays that of one field.
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
    /// `st`, also read as `decode_partials()`: see [`Self::set_st`] and [`Self::set_decode_partials`].
    st: u64,
    /// `st_max`, also read as `chain_flags()`: see [`Self::set_st_max`] and [`Self::set_chain_flags`].
    st_max: u64,
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
    /// `n_slabs`, also read as `decode_blocks()` and `lookahead()`: see [`Self::set_slabs`],
    /// [`Self::set_decode_blocks`] and [`Self::set_lookahead`].
    n_slabs: i32,
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

    /// State sweep (and the order-2 wgmma fold's per-split sums): `[B][Hkv][n_seg][M][f_pad]` f32 segment
    /// sums, then their prefix; the single-pass causal order-1 forward: its chain states.
    pub(crate) fn set_st(&mut self, ptr: u64) {
        self.st = ptr;
    }

    /// Decode step: the per-feature-block partials of `[num, den]`, `[decode_blocks][rows][M]` (C:
    /// `decode_partials()`, the slot of `st`).
    pub(crate) fn set_decode_partials(&mut self, ptr: u64) {
        self.st = ptr;
    }

    /// State sweep: `[B][Hkv][n_seg]` the bits of each segment's largest |sum| (zeroed before the fold).
    pub(crate) fn set_st_max(&mut self, ptr: u64) {
        self.st_max = ptr;
    }

    /// The single-pass causal order-1 forward: its chain flags, then its ticket counter, zeroed (C:
    /// `chain_flags()`, the slot of `st_max`).
    pub(crate) fn set_chain_flags(&mut self, ptr: u64) {
        self.st_max = ptr;
    }

    /// Fold: feature slabs per (batch entry, kv head) (C: `n_slabs`).
    pub(crate) fn set_slabs(&mut self, slabs: i32) {
        self.n_slabs = slabs;
    }

    /// Decode step: the feature blocks, how many partials the reduce sums (C: `decode_blocks()`, the
    /// slot of `n_slabs`).
    pub(crate) fn set_decode_blocks(&mut self, blocks: i32) {
        self.n_slabs = blocks;
    }

    /// The single-pass causal order-1 forward: how many rounds its fold blocks run ahead (C: `lookahead()`,
    /// the slot of `n_slabs`).
    pub(crate) fn set_lookahead(&mut self, rounds: i32) {
        self.n_slabs = rounds;
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
    fn each_meaning_writes_its_one_slot() {
        let mut p = TaylorParams::default();
        p.set_st(1);
        p.set_st_max(2);
        p.set_slabs(3);
        assert_eq!((p.st, p.st_max, p.n_slabs), (1, 2, 3));
        p.set_decode_partials(4);
        p.set_chain_flags(5);
        p.set_decode_blocks(6);
        assert_eq!((p.st, p.st_max, p.n_slabs), (4, 5, 6));
        p.set_lookahead(7);
        assert_eq!(p.n_slabs, 7);
        // The slots sit where struct TaylorParams has them: after the AttnParams and nine pointers, and
        // after the three coefficients and two ints.
        let base = std::mem::size_of::<AttnParams>();
        assert_eq!(std::mem::offset_of!(TaylorParams, st), base + 9 * 8);
        assert_eq!(std::mem::offset_of!(TaylorParams, st_max), base + 10 * 8);
        assert_eq!(std::mem::offset_of!(TaylorParams, n_slabs), base + 13 * 8 + 5 * 4);
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
