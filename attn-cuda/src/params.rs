//! The kernel parameter struct: one `#[repr(C)]` value passed by value to every kernel
//! (`__grid_constant__`), the mirror of `kernels/include/params.h` field for field.

use attn_core::{AttnSpec, Causal, FamilySpec, Strides};
use cudarc::driver::DeviceRepr;

/// Device pointers are plain addresses here (`u64`); the launcher fills them from checked buffers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AttnParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub bias: u64,
    pub o: u64,
    pub lse: u64,
    pub d_o: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    pub delta: u64,
    pub ds: u64,
    pub dbias: u64,
    pub dq_acc: u64,
    pub dk_acc: u64,
    pub rq: u64,
    pub rk: u64,
    pub key_lens: u64,
    pub cu_q: u64,
    pub cu_k: u64,
    pub q_batch: i64,
    pub q_seq: i64,
    pub q_head: i64,
    pub k_batch: i64,
    pub k_seq: i64,
    pub k_head: i64,
    pub v_batch: i64,
    pub v_seq: i64,
    pub v_head: i64,
    pub o_batch: i64,
    pub o_seq: i64,
    pub o_head: i64,
    pub dq_batch: i64,
    pub dq_seq: i64,
    pub dq_head: i64,
    pub dk_batch: i64,
    pub dk_seq: i64,
    pub dk_head: i64,
    pub dv_batch: i64,
    pub dv_seq: i64,
    pub dv_head: i64,
    pub batch: i32,
    pub heads_q: i32,
    pub heads_kv: i32,
    pub group: i32,
    pub seq_q: i32,
    pub seq_k: i32,
    pub total_q: i32,
    pub total_k: i32,
    pub head_dim: i32,
    /// 0 none, 1 top-left, 2 bottom-right.
    pub causal: i32,
    /// −1: unbounded.
    pub window_left: i32,
    /// −1: unbounded.
    pub window_right: i32,
    pub bias_batch: i32,
    pub bias_heads: i32,
    pub l2norm: i32,
    pub running_max: i32,
    pub scale: f32,
    /// 0: none.
    pub softcap: f32,
    pub eps: f32,
    /// The fixed row max (natural-log units) when `running_max == 0`.
    pub max_offset: f32,
}

// SAFETY: `AttnParams` is `#[repr(C)]`, made only of integers and floats, and its field order and
// types match `struct AttnParams` in kernels/include/params.h (8-byte fields first, no padding).
unsafe impl DeviceRepr for AttnParams {}

/// Cosine-sim scores are bounded by `scale`, so the row max can be fixed at `scale`; above this
/// scale `exp(s − scale)` could underflow f32 for the smallest scores (s ≥ −scale), so the kernel
/// tracks the running max instead.
pub(crate) const FIXED_MAX_SCALE_LIMIT: f32 = 32.0;

fn to_i32(x: usize) -> i32 {
    // Validated sizes are far below 2^31 elements per dimension for any buffer a GPU can hold; the
    // launcher rejects larger ones (see `check_i32_sizes`) before building params.
    i32::try_from(x).unwrap_or(i32::MAX)
}

fn set_strides(s: Strides) -> (i64, i64, i64) {
    (s.batch as i64, s.seq as i64, s.head as i64)
}

impl AttnParams {
    /// Everything but the pointers, from a checked spec.
    pub(crate) fn from_spec(spec: &AttnSpec) -> Self {
        let mut p = AttnParams::default();
        (p.q_batch, p.q_seq, p.q_head) = set_strides(spec.q_strides());
        (p.k_batch, p.k_seq, p.k_head) = set_strides(spec.k_strides());
        (p.v_batch, p.v_seq, p.v_head) = set_strides(spec.v_strides());
        (p.o_batch, p.o_seq, p.o_head) = set_strides(spec.o_strides());
        (p.dq_batch, p.dq_seq, p.dq_head) = set_strides(spec.dq_strides());
        (p.dk_batch, p.dk_seq, p.dk_head) = set_strides(spec.dk_strides());
        (p.dv_batch, p.dv_seq, p.dv_head) = set_strides(spec.dv_strides());
        p.batch = to_i32(spec.batch());
        p.heads_q = to_i32(spec.heads_q());
        p.heads_kv = to_i32(spec.heads_kv());
        p.group = to_i32(spec.group());
        p.seq_q = to_i32(spec.seq_q());
        p.seq_k = to_i32(spec.seq_k());
        p.total_q = to_i32(spec.total_q());
        p.total_k = to_i32(spec.total_k());
        p.head_dim = to_i32(spec.head_dim());
        p.causal = match spec.causal() {
            Causal::None => 0,
            Causal::TopLeft => 1,
            Causal::BottomRight => 2,
        };
        // A window wider than both sequences is no window; clamping keeps device arithmetic in i32.
        let cap = spec.seq_q() + spec.seq_k();
        let side = |w: Option<usize>| w.map(|w| to_i32(w.min(cap))).unwrap_or(-1);
        let window = spec.window().unwrap_or_default();
        p.window_left = side(window.left);
        p.window_right = side(window.right);
        if let Some(b) = spec.bias() {
            p.bias_batch = to_i32(b.batch);
            p.bias_heads = to_i32(b.heads);
        }
        p.running_max = 1;
        match *spec.family() {
            FamilySpec::Softmax { scale, softcap } => {
                p.scale = scale;
                p.softcap = softcap.unwrap_or(0.0);
            }
            FamilySpec::CosineSim {
                scale,
                l2norm_qk,
                eps,
            } => {
                p.scale = scale;
                p.eps = eps;
                p.l2norm = i32::from(l2norm_qk);
                // f16 has 5 exponent bits: with the fixed offset, a row whose best score sits well
                // below `scale` has every P under f16's normal range (6e-5) before P·V, and loses
                // its digits; the running max keeps each row's largest P at 1. bf16 shares f32's
                // exponent range and keeps the fixed offset.
                let bounded = l2norm_qk
                    && spec.bias().is_none()
                    && scale <= FIXED_MAX_SCALE_LIMIT
                    && spec.dtype() != attn_core::DType::F16;
                if bounded {
                    p.running_max = 0;
                    p.max_offset = scale;
                }
            }
            // The dispatcher rejects the other families before parameters are built.
            FamilySpec::Taylor { .. } | FamilySpec::Hyperbolic { .. } => {}
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::{AttnProblem, DType, Family};

    #[test]
    fn params_are_eight_byte_aligned_without_tail_padding() {
        // 20 pointers + 21 strides (8 bytes) + 16 ints + 4 floats (4 bytes) = 408 bytes.
        assert_eq!(
            std::mem::size_of::<AttnParams>(),
            20 * 8 + 21 * 8 + 16 * 4 + 4 * 4
        );
        assert_eq!(std::mem::align_of::<AttnParams>(), 8);
    }

    #[test]
    fn cosine_uses_the_fixed_offset_only_when_scores_are_bounded() {
        let p = |fam: Family, bias: bool| {
            let mut prob = AttnProblem::new(fam, DType::BF16, 1, 1, 1, 4, 4, 16);
            if bias {
                prob = prob.with_bias(1, 1);
            }
            AttnParams::from_spec(&prob.validate().expect("valid problem"))
        };
        let fixed = p(Family::cosine_sim(), false);
        assert_eq!((fixed.running_max, fixed.max_offset), (0, 10.0));
        let f16 = AttnProblem::new(Family::cosine_sim(), DType::F16, 1, 1, 1, 4, 4, 16);
        assert_eq!(
            AttnParams::from_spec(&f16.validate().expect("valid")).running_max,
            1
        );
        assert_eq!(p(Family::cosine_sim(), true).running_max, 1);
        let unnormalised = Family::CosineSim(attn_core::CosineParams {
            l2norm_qk: false,
            ..Default::default()
        });
        assert_eq!(p(unnormalised, false).running_max, 1);
        assert_eq!(p(Family::softmax(), false).running_max, 1);
    }

    #[test]
    fn windows_wider_than_the_sequences_are_clamped() {
        let spec = AttnProblem::new(Family::softmax(), DType::F16, 1, 1, 1, 8, 8, 32)
            .with_window(Some(usize::MAX), None)
            .validate()
            .expect("valid problem");
        let p = AttnParams::from_spec(&spec);
        assert_eq!((p.window_left, p.window_right), (16, -1));
    }
}
