//! Attention against a KV cache (docs/math.md, "Decode, split-KV and KV caches"): the description of
//! a generation step that every backend shares.
//!
//! A step has `seq_q` queries per sequence (1 for plain decode, a few for speculative decoding, more
//! for chunked prefill) and `new_tokens` new keys and values per sequence. With
//! `cache_seqlens[b]` keys already in the cache, the step first writes the new keys and values at
//! positions `cache_seqlens[b] ..` and then attends over `cache_seqlens[b] + new_tokens` keys, with
//! bottom-right causality over those real lengths when `causal` is set (query `i` sees key
//! `j ≤ i + len_k − seq_q`): FlashAttention's `flash_attn_with_kvcache` semantics.
//!
//! Tensors, all with a contiguous layout:
//! - `q`: `[B, seq_q, Hq, D]`; `o`: `[B, seq_q, Hq, Dv]`; `lse`: `[B, Hq, seq_q]` f32;
//! - `k_new`, `v_new`: `[B, new_tokens, Hkv, D]` and `[…, Dv]` (absent when `new_tokens` is 0);
//! - a contiguous cache ([`KvLayout::Contiguous`]): `k_cache`, `v_cache` `[B, capacity, Hkv, D]`;
//! - a paged cache ([`KvLayout::Paged`], the vLLM / FlashInfer layout): `k_pages`, `v_pages`
//!   `[num_pages, page_size, Hkv, D]` and `block_table` `[B, pages_per_seq]` i32: key `j` of sequence
//!   `b` lives in page `block_table[b][j / page_size]`, slot `j % page_size`;
//! - `cache_seqlens`: `[B]` i32.
//!
//! The cache lengths and the block table usually live on the device, where the host cannot check
//! them without a copy: [`KvCacheSpec::check_seqlens`] and [`KvCacheSpec::check_block_table`] are the
//! checks a backend runs wherever the values are visible on the host (the CPU always, a GPU in its
//! debug mode); elsewhere their ranges are the caller's contract.

use crate::spec::MAX_INDEX;
use crate::{
    shape_str, AttnError, AttnProblem, AttnSpec, Causal, DType, Family, FamilyKind, Op, Pass, Result,
};

/// Where a KV cache keeps its keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvLayout {
    /// `k_cache`, `v_cache`: `[B, capacity, Hkv, D]`, one row of `capacity` slots per sequence.
    Contiguous {
        /// Slots per sequence (the most keys a sequence can hold).
        capacity: usize,
    },
    /// `k_pages`, `v_pages`: `[num_pages, page_size, Hkv, D]`, shared by every sequence through a
    /// block table `[B, pages_per_seq]` of page indices.
    Paged {
        /// Pages in the pool.
        num_pages: usize,
        /// Slots per page: a power of two from 16 to 256.
        page_size: usize,
        /// Columns of the block table: the most pages one sequence can use.
        pages_per_seq: usize,
    },
}

/// The smallest and largest page size of a paged cache.
pub const PAGE_SIZES: std::ops::RangeInclusive<usize> = 16..=256;

/// A step against a KV cache, as the user describes it; [`KvCacheProblem::validate`] checks it.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCacheProblem {
    /// A softmax-like family (softmax, cosine-sim or hyperbolic). Taylor attention keeps a
    /// recurrent state instead of a cache of keys.
    pub family: Family,
    /// Storage dtype of q, the cache, the new keys and values and o.
    pub dtype: DType,
    /// Sequences (B).
    pub batch: usize,
    /// Query heads (Hq), a multiple of `heads_kv`.
    pub heads_q: usize,
    /// Key/value heads of the cache (Hkv).
    pub heads_kv: usize,
    /// Queries per sequence in this step.
    pub seq_q: usize,
    /// New keys and values per sequence written into the cache before attending (may be 0).
    pub new_tokens: usize,
    /// Head dim of q and k (D).
    pub head_dim: usize,
    /// Head dim of v and o (Dv); defaults to `head_dim`.
    pub head_dim_v: usize,
    /// The cache's layout and size.
    pub layout: KvLayout,
    /// Bottom-right causal masking over the real lengths (default: on).
    pub causal: bool,
    /// Sliding window `(left, right)` around each query's diagonal, bottom-right aligned.
    pub window: Option<(Option<usize>, Option<usize>)>,
}

impl KvCacheProblem {
    /// A causal step: `seq_q` queries and as many new tokens per sequence.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        family: Family,
        dtype: DType,
        batch: usize,
        heads_q: usize,
        heads_kv: usize,
        seq_q: usize,
        head_dim: usize,
        layout: KvLayout,
    ) -> Self {
        KvCacheProblem {
            family,
            dtype,
            batch,
            heads_q,
            heads_kv,
            seq_q,
            new_tokens: seq_q,
            head_dim,
            head_dim_v: head_dim,
            layout,
            causal: true,
            window: None,
        }
    }

    /// Set the number of new tokens per sequence (0: attend to the cache as it is).
    pub fn with_new_tokens(mut self, new_tokens: usize) -> Self {
        self.new_tokens = new_tokens;
        self
    }

    /// Set bottom-right causal masking on or off.
    pub fn with_causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// Set a sliding window (`None` on a side: unbounded).
    pub fn with_window(mut self, left: Option<usize>, right: Option<usize>) -> Self {
        self.window = Some((left, right));
        self
    }

    /// Set the head dim of v and o.
    pub fn with_head_dim_v(mut self, head_dim_v: usize) -> Self {
        self.head_dim_v = head_dim_v;
        self
    }

    /// Check the step; the family, sizes and window follow [`AttnProblem::validate`]'s rules.
    pub fn validate(&self) -> Result<KvCacheSpec> {
        let op = Op::new(self.family.kind(), Pass::Spec);
        let invalid = |arg: &'static str, reason: String| AttnError::InvalidArgument { op, arg, reason };
        if self.family.kind() == FamilyKind::Taylor {
            return Err(invalid(
                "family",
                "Taylor attention keeps a recurrent decode state, not a cache of keys".into(),
            ));
        }
        let capacity = match self.layout {
            KvLayout::Contiguous { capacity } => {
                if capacity == 0 {
                    return Err(invalid("capacity", "must be at least 1".into()));
                }
                capacity
            }
            KvLayout::Paged {
                num_pages,
                page_size,
                pages_per_seq,
            } => {
                if !page_size.is_power_of_two() || !PAGE_SIZES.contains(&page_size) {
                    return Err(invalid(
                        "page_size",
                        format!(
                            "{page_size} is not a power of two from {} to {}",
                            PAGE_SIZES.start(),
                            PAGE_SIZES.end()
                        ),
                    ));
                }
                if num_pages == 0 || pages_per_seq == 0 {
                    let arg = if num_pages == 0 {
                        "num_pages"
                    } else {
                        "pages_per_seq"
                    };
                    return Err(invalid(arg, "must be at least 1".into()));
                }
                let too_large = |arg: &'static str, what: String| AttnError::TooLarge {
                    op,
                    arg,
                    shapes: self.sizes_str(),
                    reason: format!("{what} exceeds {MAX_INDEX}, the kernels' 32-bit row index"),
                };
                match num_pages.checked_mul(page_size) {
                    Some(rows) if rows <= MAX_INDEX => {}
                    _ => {
                        return Err(too_large(
                            "num_pages",
                            format!("num_pages·page_size = {num_pages}·{page_size}"),
                        ))
                    }
                }
                match pages_per_seq.checked_mul(page_size) {
                    Some(c) if c <= MAX_INDEX => c,
                    _ => {
                        return Err(too_large(
                            "pages_per_seq",
                            format!("pages_per_seq·page_size = {pages_per_seq}·{page_size}"),
                        ))
                    }
                }
            }
        };
        if self.new_tokens > capacity {
            return Err(invalid(
                "k_new",
                format!(
                    "{} new tokens do not fit a cache of {capacity} slots per sequence",
                    self.new_tokens
                ),
            ));
        }
        // The attention part: a key-padded problem over the cache's slots. Its validation checks the
        // family parameters, the sizes, the heads and head dims and the window, and sizes q, o and
        // the statistics; the cache's own lengths are checked below.
        let mut attend = AttnProblem::new(
            self.family,
            self.dtype,
            self.batch,
            self.heads_q,
            self.heads_kv,
            self.seq_q,
            capacity,
            self.head_dim,
        )
        .with_head_dim_v(self.head_dim_v)
        .with_causal(if self.causal {
            Causal::BottomRight
        } else {
            Causal::None
        })
        .with_key_lens(vec![capacity; self.batch.min(MAX_INDEX)]);
        if let Some((left, right)) = self.window {
            attend = attend.with_window(left, right);
        }
        let attend = attend.validate()?;
        let spec = KvCacheSpec {
            family: self.family,
            attend,
            layout: self.layout,
            new_tokens: self.new_tokens,
            capacity,
        };
        // Every buffer length once, checked (the q/o/statistics lengths come from `attend`).
        let (b, hkv, d, dv) = (self.batch, self.heads_kv, self.head_dim, self.head_dim_v);
        let rows = match self.layout {
            KvLayout::Contiguous { capacity } => b.checked_mul(capacity),
            KvLayout::Paged {
                num_pages, page_size, ..
            } => num_pages.checked_mul(page_size),
        };
        let elems = |dim: usize| {
            rows.and_then(|r| r.checked_mul(hkv))
                .and_then(|x| x.checked_mul(dim))
        };
        let new_elems = |dim: usize| {
            b.checked_mul(self.new_tokens)
                .and_then(|x| x.checked_mul(hkv))
                .and_then(|x| x.checked_mul(dim))
        };
        let table = match self.layout {
            KvLayout::Paged { pages_per_seq, .. } => b.checked_mul(pages_per_seq),
            KvLayout::Contiguous { .. } => Some(0),
        };
        let bytes = self.dtype.size();
        for (arg, n) in [
            ("k_cache", elems(d)),
            ("v_cache", elems(dv)),
            ("k_new", new_elems(d)),
            ("v_new", new_elems(dv)),
            ("block_table", table),
        ] {
            match n.and_then(|n| n.checked_mul(bytes)) {
                Some(x) if x <= isize::MAX as usize => {}
                _ => {
                    return Err(AttnError::TooLarge {
                        op,
                        arg,
                        shapes: self.sizes_str(),
                        reason: "its length overflows or exceeds isize::MAX bytes".into(),
                    })
                }
            }
        }
        Ok(spec)
    }

    fn sizes_str(&self) -> String {
        format!(
            "batch {}, heads {}/{}, seq_q {}, new tokens {}, head dims {}/{}, cache {:?}",
            self.batch,
            self.heads_q,
            self.heads_kv,
            self.seq_q,
            self.new_tokens,
            self.head_dim,
            self.head_dim_v,
            self.layout
        )
    }
}

/// A checked step against a KV cache: the layouts and lengths of every buffer, and the attention
/// it computes.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCacheSpec {
    family: Family,
    attend: AttnSpec,
    layout: KvLayout,
    new_tokens: usize,
    capacity: usize,
}

impl KvCacheSpec {
    /// The attention over the cache as a key-padded problem with `seq_k` = the capacity per sequence
    /// and every key length at the capacity: family, dtype, heads, head dims, causality and window,
    /// and the layouts of q, o and the statistics. [`KvCacheSpec::attend_with_lengths`] gives the
    /// same problem with a step's real lengths.
    pub fn attend(&self) -> &AttnSpec {
        &self.attend
    }

    /// The cache's layout.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// New tokens per sequence.
    pub fn new_tokens(&self) -> usize {
        self.new_tokens
    }

    /// The most keys one sequence can hold (contiguous: the capacity; paged: pages_per_seq·page_size).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The op of errors about this step in `pass`.
    pub fn op(&self, pass: Pass) -> Op {
        self.attend.op(pass)
    }

    /// Shape of `k_cache` / `k_pages` (`dim` = D) or `v_cache` / `v_pages` (`dim` = Dv).
    pub fn cache_shape(&self, dim: usize) -> [usize; 4] {
        let hkv = self.attend.heads_kv();
        match self.layout {
            KvLayout::Contiguous { capacity } => [self.attend.batch(), capacity, hkv, dim],
            KvLayout::Paged {
                num_pages, page_size, ..
            } => [num_pages, page_size, hkv, dim],
        }
    }

    /// Shape of `k_new` (`dim` = D) or `v_new` (`dim` = Dv).
    pub fn new_shape(&self, dim: usize) -> [usize; 4] {
        [self.attend.batch(), self.new_tokens, self.attend.heads_kv(), dim]
    }

    /// Shape of the block table, `[B, pages_per_seq]`; `None` for a contiguous cache.
    pub fn block_table_shape(&self) -> Option<[usize; 2]> {
        match self.layout {
            KvLayout::Paged { pages_per_seq, .. } => Some([self.attend.batch(), pages_per_seq]),
            KvLayout::Contiguous { .. } => None,
        }
    }

    /// Check the cache lengths: `B` values with `0 ≤ cache_seqlens[b]` and
    /// `cache_seqlens[b] + new_tokens ≤ capacity`.
    pub fn check_seqlens(&self, cache_seqlens: &[i32]) -> Result<()> {
        let op = self.op(Pass::Forward);
        let b = self.attend.batch();
        if cache_seqlens.len() != b {
            return Err(AttnError::ShapeMismatch {
                op,
                what: "cache_seqlens".into(),
                expected: shape_str(&[b]),
                got: shape_str(&[cache_seqlens.len()]),
            });
        }
        for (i, &len) in cache_seqlens.iter().enumerate() {
            let fits = usize::try_from(len)
                .ok()
                .and_then(|l| l.checked_add(self.new_tokens))
                .is_some_and(|total| total <= self.capacity);
            if !fits {
                return Err(AttnError::InvalidArgument {
                    op,
                    arg: "cache_seqlens",
                    reason: format!(
                        "cache_seqlens[{i}] = {len} with {} new tokens does not fit {} slots (0 ≤ len ≤ {})",
                        self.new_tokens,
                        self.capacity,
                        self.capacity - self.new_tokens
                    ),
                });
            }
        }
        Ok(())
    }

    /// Check a paged cache's block table against checked lengths: every page a sequence uses
    /// (`⌈(cache_seqlens[b] + new_tokens) / page_size⌉` of them) names a page of the pool. Entries
    /// past a sequence's length are never read and not checked. A contiguous cache takes no table.
    pub fn check_block_table(&self, block_table: &[i32], cache_seqlens: &[i32]) -> Result<()> {
        let op = self.op(Pass::Forward);
        let KvLayout::Paged {
            num_pages,
            page_size,
            pages_per_seq,
        } = self.layout
        else {
            return Err(AttnError::InvalidArgument {
                op,
                arg: "block_table",
                reason: "a contiguous cache takes no block table".into(),
            });
        };
        self.check_seqlens(cache_seqlens)?;
        let b = self.attend.batch();
        if Some(block_table.len()) != b.checked_mul(pages_per_seq) {
            return Err(AttnError::ShapeMismatch {
                op,
                what: "block_table".into(),
                expected: shape_str(&[b, pages_per_seq]),
                got: shape_str(&[block_table.len()]),
            });
        }
        for (s, &len) in cache_seqlens.iter().enumerate() {
            let used = (len as usize + self.new_tokens).div_ceil(page_size);
            for (p, &page) in block_table[s * pages_per_seq..][..used].iter().enumerate() {
                if usize::try_from(page).map_or(true, |x| x >= num_pages) {
                    return Err(AttnError::InvalidArgument {
                        op,
                        arg: "block_table",
                        reason: format!(
                            "block_table[{s}][{p}] = {page} is not a page of the pool (0..{num_pages})"
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The attention of a step with these (checked) cache lengths, as a key-padded dense problem
    /// over `[B, capacity, Hkv, D]` keys with key lengths `cache_seqlens[b] + new_tokens`: what a
    /// backend computes once the new tokens are written, and the reference's input after gathering
    /// a paged cache.
    pub fn attend_with_lengths(&self, cache_seqlens: &[i32]) -> Result<AttnSpec> {
        self.check_seqlens(cache_seqlens)?;
        let a = &self.attend;
        let mut p = AttnProblem::new(
            self.family,
            a.dtype(),
            a.batch(),
            a.heads_q(),
            a.heads_kv(),
            a.seq_q(),
            self.capacity,
            a.head_dim(),
        )
        .with_head_dim_v(a.head_dim_v())
        .with_causal(a.causal())
        .with_key_lens(
            cache_seqlens
                .iter()
                .map(|&l| l as usize + self.new_tokens)
                .collect(),
        );
        if let Some(w) = a.window() {
            p = p.with_window(w.left, w.right);
        }
        p.validate()
    }

    /// The row of key `j` of sequence `b` in the cache viewed as `[rows, Hkv, D]`: `b·capacity + j`
    /// for a contiguous cache, `block_table[b][j / page_size]·page_size + j % page_size` for a
    /// paged one. `None` when the table entry is outside the pool (`j` must be below the capacity).
    pub fn cache_row(&self, b: usize, j: usize, block_table: &[i32]) -> Option<usize> {
        match self.layout {
            KvLayout::Contiguous { capacity } => Some(b * capacity + j),
            KvLayout::Paged {
                num_pages,
                page_size,
                pages_per_seq,
            } => {
                let page = *block_table.get(b * pages_per_seq + j / page_size)?;
                let page = usize::try_from(page).ok().filter(|&p| p < num_pages)?;
                Some(page * page_size + j % page_size)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paged(page_size: usize) -> KvCacheProblem {
        let layout = KvLayout::Paged {
            num_pages: 8,
            page_size,
            pages_per_seq: 3,
        };
        KvCacheProblem::new(Family::softmax(), DType::BF16, 2, 8, 2, 1, 64, layout)
    }

    fn arg_of(e: AttnError) -> &'static str {
        match e {
            AttnError::InvalidArgument { arg, .. } | AttnError::TooLarge { arg, .. } => arg,
            other => panic!("unexpected error {other}"),
        }
    }

    #[test]
    fn page_sizes_are_powers_of_two_from_16_to_256() {
        for ok in [16, 32, 64, 128, 256] {
            assert!(paged(ok).validate().is_ok(), "{ok}");
        }
        for bad in [0, 8, 24, 100, 512] {
            assert_eq!(arg_of(paged(bad).validate().unwrap_err()), "page_size", "{bad}");
        }
    }

    #[test]
    fn shapes_and_capacity() {
        let s = paged(16).with_head_dim_v(32).validate().unwrap();
        assert_eq!(s.capacity(), 48);
        assert_eq!(s.cache_shape(64), [8, 16, 2, 64]);
        assert_eq!(s.new_shape(32), [2, 1, 2, 32]);
        assert_eq!(s.block_table_shape(), Some([2, 3]));
        assert_eq!(s.attend().q_shape(), [2, 1, 8, 64]);
        let c = KvCacheProblem::new(
            Family::cosine_sim(),
            DType::F16,
            3,
            4,
            4,
            2,
            64,
            KvLayout::Contiguous { capacity: 100 },
        )
        .validate()
        .unwrap();
        assert_eq!(c.cache_shape(64), [3, 100, 4, 64]);
        assert_eq!(c.block_table_shape(), None);
        assert_eq!(c.cache_row(2, 7, &[]), Some(207));
    }

    #[test]
    fn lengths_that_overflow_the_cache_are_rejected() {
        let s = paged(16).with_new_tokens(4).validate().unwrap();
        assert!(s.check_seqlens(&[0, 44]).is_ok());
        for bad in [[45, 0], [-1, 0], [i32::MAX, 0]] {
            assert_eq!(
                arg_of(s.check_seqlens(&bad).unwrap_err()),
                "cache_seqlens",
                "{bad:?}"
            );
        }
        assert!(matches!(
            s.check_seqlens(&[1]),
            Err(AttnError::ShapeMismatch { .. })
        ));
        assert_eq!(
            arg_of(paged(16).with_new_tokens(49).validate().unwrap_err()),
            "k_new"
        );
    }

    #[test]
    fn block_table_entries_in_use_must_name_pages() {
        let s = paged(16).validate().unwrap();
        // Sequence 0 holds 17 + 1 keys: two pages; sequence 1 holds 1 key: one page.
        assert!(s.check_block_table(&[3, 7, -1, 0, 99, 99], &[17, 0]).is_ok());
        assert_eq!(
            arg_of(s.check_block_table(&[3, 8, 0, 0, 0, 0], &[17, 0]).unwrap_err()),
            "block_table"
        );
        assert_eq!(
            arg_of(s.check_block_table(&[3, 1, 0, -2, 0, 0], &[17, 0]).unwrap_err()),
            "block_table"
        );
        assert_eq!(s.cache_row(0, 17, &[3, 7, 0, 0, 0, 0]), Some(7 * 16 + 1));
        assert_eq!(s.cache_row(0, 17, &[3, 9, 0, 0, 0, 0]), None);
    }

    #[test]
    fn attention_is_bottom_right_over_the_real_lengths() {
        let s = paged(16).with_new_tokens(2).validate().unwrap();
        let p = KvCacheProblem {
            seq_q: 2,
            ..paged(16)
        }
        .with_new_tokens(2)
        .validate()
        .unwrap();
        assert_eq!(s.attend().seq_k(), 48);
        let a = p.attend_with_lengths(&[5, 0]).unwrap();
        // Sequence 0: 7 keys, the last query sees all, the first all but the last.
        assert_eq!(a.key_range(0, 1), 0..7);
        assert_eq!(a.key_range(0, 0), 0..6);
        assert_eq!(a.key_range(1, 0), 0..1);
    }

    #[test]
    fn taylor_has_no_kv_cache() {
        let p = KvCacheProblem {
            family: Family::taylor(1),
            ..paged(16)
        };
        assert_eq!(arg_of(p.validate().unwrap_err()), "family");
    }
}
