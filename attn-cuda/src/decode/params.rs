//! `DecodeParams`: the `#[repr(C)]` mirror of `kernels/decode/decode_params.h`, field for field.

use cudarc::driver::DeviceRepr;

/// The parameters of every decode kernel (split-KV forward, combine, KV-cache append, total lengths).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct DecodeParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub ws_o: u64,
    pub ws_lse: u64,
    pub key_lens: u64,
    pub block_table: u64,
    pub k_new: u64,
    pub v_new: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub total_lens: u64,
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
    pub kn_batch: i64,
    pub kn_seq: i64,
    pub kn_head: i64,
    pub vn_batch: i64,
    pub vn_seq: i64,
    pub vn_head: i64,
    pub batch: i32,
    pub heads_q: i32,
    pub heads_kv: i32,
    pub group: i32,
    pub seq_q: i32,
    pub seq_k: i32,
    pub head_dim: i32,
    pub head_dim_v: i32,
    pub causal: i32,
    pub window_left: i32,
    pub window_right: i32,
    pub key_len_add: i32,
    pub page_size: i32,
    pub page_shift: i32,
    pub pages_per_seq: i32,
    pub splits: i32,
    pub chunk: i32,
    pub row_tiles: i32,
    pub new_tokens: i32,
    pub score: i32,
    pub l2norm: i32,
    pub midpoint: i32,
    pub scale: f32,
    pub softcap: f32,
    pub eps: f32,
    pub curvature: f32,
    pub beta: f32,
    /// 1: K/V tiles by bulk copies on mbarriers (sm_90); 0: cp.async.
    pub bulk: i32,
}

impl Default for DecodeParams {
    fn default() -> Self {
        // SAFETY: every field is an integer or a float, for which all-zero bits are a valid value.
        unsafe { std::mem::zeroed() }
    }
}

// SAFETY: a #[repr(C)] struct of plain integers and floats, passed by value as the kernels' only
// parameter.
unsafe impl DeviceRepr for DecodeParams {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_decode_params_h() {
        // 14 pointers + 18 strides (8 bytes), then 22 ints, 5 floats and `bulk` (4 bytes).
        assert_eq!(std::mem::size_of::<DecodeParams>(), 14 * 8 + 18 * 8 + 28 * 4);
        assert_eq!(std::mem::offset_of!(DecodeParams, q_batch), 14 * 8);
        assert_eq!(std::mem::offset_of!(DecodeParams, batch), 32 * 8);
        assert_eq!(std::mem::offset_of!(DecodeParams, scale), 32 * 8 + 22 * 4);
        assert_eq!(std::mem::align_of::<DecodeParams>(), 8);
    }
}
