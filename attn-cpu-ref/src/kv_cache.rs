//! A generation step against a KV cache (docs/math.md, "Decode, split-KV and KV caches"): the
//! reference that every cache path (attn-cuda's kernels, attn-candle's cache types) is tested against.
//!
//! [`forward_kv_cache`] runs one step of a checked [`KvCacheSpec`] with FlashAttention's
//! `flash_attn_with_kvcache` semantics:
//!
//! 1. check `cache_seqlens` (and a paged cache's `block_table`) with the spec's host checks, and every
//!    buffer's length;
//! 2. write `k_new`, `v_new` (`new_tokens` rows per sequence) at logical positions
//!    `cache_seqlens[b] ..` of the cache: row `b·capacity + j` of a contiguous cache, slot
//!    `j % page_size` of page `block_table[b][j / page_size]` of a paged one
//!    ([`KvCacheSpec::cache_row`]);
//! 3. attend over `cache_seqlens[b] + new_tokens` keys per sequence through the ordinary key-padded
//!    forward ([`KvCacheSpec::attend_with_lengths`]); a paged cache is first gathered into a dense
//!    `[B, capacity, Hkv, D]` buffer (only the rows a sequence uses; the rest stay zero and are never
//!    read).
//!
//! Nothing else of the cache is written: slots past a sequence's new length and pages no sequence
//! uses keep their contents.

use crate::{check_dtype, Forward, Inputs};
use attn_core::{shape_str, AttnError, AttnSpec, Element, KvCacheSpec, KvLayout, Pass, Result};

/// The buffers of one step, all contiguous in the layouts of [`KvCacheSpec`] (attn-core's
/// `kv_cache` module doc).
#[derive(Debug)]
pub struct KvCacheIo<'a, E> {
    /// Queries `[B, seq_q, Hq, D]`.
    pub q: &'a [E],
    /// `k_cache` `[B, capacity, Hkv, D]` or `k_pages` `[num_pages, page_size, Hkv, D]`; the new keys
    /// are written into it.
    pub k_cache: &'a mut [E],
    /// `v_cache` / `v_pages`, with `Dv` for `D`; the new values are written into it.
    pub v_cache: &'a mut [E],
    /// New keys `[B, new_tokens, Hkv, D]`; present exactly when `new_tokens > 0`.
    pub k_new: Option<&'a [E]>,
    /// New values `[B, new_tokens, Hkv, Dv]`; present exactly when `new_tokens > 0`.
    pub v_new: Option<&'a [E]>,
    /// Keys already in the cache per sequence, `[B]`.
    pub cache_seqlens: &'a [i32],
    /// `[B, pages_per_seq]` page indices; present exactly for a paged cache.
    pub block_table: Option<&'a [i32]>,
}

fn shape_mismatch(spec: &KvCacheSpec, what: &str, expected: &[usize], got: usize) -> AttnError {
    AttnError::ShapeMismatch {
        op: spec.op(Pass::Forward),
        what: what.into(),
        expected: format!(
            "{} ({} elements)",
            shape_str(expected),
            expected.iter().product::<usize>()
        ),
        got: format!("{got} elements"),
    }
}

fn check_buffer(spec: &KvCacheSpec, what: &str, shape: &[usize], len: usize) -> Result<()> {
    // The product cannot wrap: `KvCacheProblem::validate` checked every buffer's length.
    if len != shape.iter().product::<usize>() {
        return Err(shape_mismatch(spec, what, shape, len));
    }
    Ok(())
}

/// The new rows of one of `k_new` / `v_new`: present exactly when the step has new tokens.
fn check_new<'a, E>(
    spec: &KvCacheSpec,
    what: &'static str,
    new: Option<&'a [E]>,
    dim: usize,
) -> Result<Option<&'a [E]>> {
    let shape = spec.new_shape(dim);
    match (spec.new_tokens(), new) {
        (0, None) => Ok(None),
        (0, Some(x)) => Err(AttnError::InvalidArgument {
            op: spec.op(Pass::Forward),
            arg: what,
            reason: format!(
                "the step has no new tokens, but `{what}` holds {} elements",
                x.len()
            ),
        }),
        (_, None) => Err(AttnError::InvalidArgument {
            op: spec.op(Pass::Forward),
            arg: what,
            reason: format!(
                "the step has {} new tokens per sequence, but no `{what}` {}",
                spec.new_tokens(),
                shape_str(&shape)
            ),
        }),
        (_, Some(x)) => {
            check_buffer(spec, what, &shape, x.len())?;
            Ok(Some(x))
        }
    }
}

/// The cache row of key `j` of sequence `b`, from checked lengths and table.
fn row(spec: &KvCacheSpec, b: usize, j: usize, table: &[i32]) -> Result<usize> {
    spec.cache_row(b, j, table)
        .ok_or_else(|| AttnError::InvalidArgument {
            op: spec.op(Pass::Forward),
            arg: "block_table",
            reason: format!("key {j} of sequence {b} has no page in the pool"),
        })
}

/// Write `new` (`[B, new_tokens, Hkv, dim]`) into `cache` at each sequence's positions
/// `cache_seqlens[b] ..`.
fn append<E: Copy>(
    spec: &KvCacheSpec,
    cache: &mut [E],
    new: &[E],
    width: usize,
    cache_seqlens: &[i32],
    table: &[i32],
) -> Result<()> {
    let t = spec.new_tokens();
    for (b, &len) in cache_seqlens.iter().enumerate() {
        let start = len as usize;
        for i in 0..t {
            let r = row(spec, b, start + i, table)?;
            let src = (b * t + i) * width;
            cache[r * width..][..width].copy_from_slice(&new[src..][..width]);
        }
    }
    Ok(())
}

/// A paged cache's keys (or values) of every sequence as a dense `[B, capacity, Hkv, dim]` buffer:
/// rows `0 .. cache_seqlens[b] + new_tokens` gathered through the block table, the rest zero.
fn gather<E: Copy + Default>(
    spec: &KvCacheSpec,
    pages: &[E],
    width: usize,
    cache_seqlens: &[i32],
    table: &[i32],
) -> Result<Vec<E>> {
    let capacity = spec.capacity();
    let mut dense = vec![E::default(); cache_seqlens.len() * capacity * width];
    for (b, &len) in cache_seqlens.iter().enumerate() {
        for j in 0..len as usize + spec.new_tokens() {
            let r = row(spec, b, j, table)?;
            dense[(b * capacity + j) * width..][..width].copy_from_slice(&pages[r * width..][..width]);
        }
    }
    Ok(dense)
}

/// One step against a KV cache on storage-dtype buffers: write the new keys and values into the
/// cache, then attend (see the module doc). Returns o `[B, seq_q, Hq, Dv]` and the LSE
/// `[B, Hq, seq_q]` (f32, −∞ for a row with no key), f64 inside as [`crate::forward`].
///
/// Errors (op `<family> forward`): a buffer of the wrong length (`ShapeMismatch` naming it),
/// `k_new`/`v_new` present without new tokens or absent with them, a block table with a contiguous
/// cache or none with a paged one, lengths that do not fit the cache (`cache_seqlens`), table entries
/// outside the pool (`block_table`), a dtype other than the spec's (`dtype`). The cache is written
/// only after every check passed.
pub fn forward_kv_cache<E: Element>(spec: &KvCacheSpec, io: KvCacheIo<'_, E>) -> Result<Forward<E, f32>> {
    step(spec, io, crate::forward)
}

/// The attention of a step once its cache holds the new tokens: the reference's or the fast path's
/// key-padded forward.
pub(crate) type Attend<E> = fn(&AttnSpec, Inputs<'_, E>) -> Result<Forward<E, f32>>;

/// [`forward_kv_cache`] with the attention computed by `attend`.
pub(crate) fn step<E: Element>(
    spec: &KvCacheSpec,
    io: KvCacheIo<'_, E>,
    attend_fn: Attend<E>,
) -> Result<Forward<E, f32>> {
    let attend = spec.attend();
    check_dtype::<E>(attend, Pass::Forward)?;
    let (d, dv) = (attend.head_dim(), attend.head_dim_v());
    let hkv = attend.heads_kv();
    check_buffer(spec, "q", &attend.q_shape(), io.q.len())?;
    check_buffer(spec, "k_cache", &spec.cache_shape(d), io.k_cache.len())?;
    check_buffer(spec, "v_cache", &spec.cache_shape(dv), io.v_cache.len())?;
    let k_new = check_new(spec, "k_new", io.k_new, d)?;
    let v_new = check_new(spec, "v_new", io.v_new, dv)?;
    let table: &[i32] = match (spec.layout(), io.block_table) {
        (KvLayout::Contiguous { .. }, None) => {
            spec.check_seqlens(io.cache_seqlens)?;
            &[]
        }
        (KvLayout::Paged { .. }, Some(t)) => {
            spec.check_block_table(t, io.cache_seqlens)?;
            t
        }
        (KvLayout::Contiguous { .. }, Some(_)) => {
            return Err(AttnError::InvalidArgument {
                op: spec.op(Pass::Forward),
                arg: "block_table",
                reason: "a contiguous cache takes no block table".into(),
            })
        }
        (KvLayout::Paged { .. }, None) => {
            return Err(AttnError::InvalidArgument {
                op: spec.op(Pass::Forward),
                arg: "block_table",
                reason: format!(
                    "a paged cache needs a block table {}",
                    shape_str(&spec.block_table_shape().unwrap_or_default())
                ),
            })
        }
    };
    let dense = spec.attend_with_lengths(io.cache_seqlens)?;
    if let (Some(k_new), Some(v_new)) = (k_new, v_new) {
        append(spec, io.k_cache, k_new, hkv * d, io.cache_seqlens, table)?;
        append(spec, io.v_cache, v_new, hkv * dv, io.cache_seqlens, table)?;
    }
    match spec.layout() {
        KvLayout::Contiguous { .. } => attend_fn(
            &dense,
            Inputs {
                q: io.q,
                k: io.k_cache,
                v: io.v_cache,
                bias: None,
            },
        ),
        KvLayout::Paged { .. } => {
            let k = gather(spec, io.k_cache, hkv * d, io.cache_seqlens, table)?;
            let v = gather(spec, io.v_cache, hkv * dv, io.cache_seqlens, table)?;
            attend_fn(
                &dense,
                Inputs {
                    q: io.q,
                    k: &k,
                    v: &v,
                    bias: None,
                },
            )
        }
    }
}
