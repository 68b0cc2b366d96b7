//! Attention against a KV cache: [`flash_attn_with_kvcache`] with FlashAttention's arguments, and
//! [`kv_cache_attention`], the same step for every softmax-like family.
//!
//! A step has `Nq` queries and `Nnew` new keys and values per sequence. With `cache_seqlens[b]`
//! keys already in the cache, it writes `k_new`, `v_new` at positions `cache_seqlens[b] ..` of the
//! cache tensors (in place), then attends over `cache_seqlens[b] + Nnew` keys; `causal` is
//! bottom-right over those real lengths (query `i` sees key `j ≤ i + len − Nq`). docs/math.md,
//! "Decode, split-KV and KV caches", and attn-core's `KvCacheSpec` describe the layouts:
//!
//! - `q` `[B, Nq, Hq, D]`; `o` `[B, Nq, Hq, Dv]` (q's dtype); the LSE `[B, Hq, Nq]` f32;
//! - a contiguous cache: `k_cache` `[B, Tmax, Hkv, D]`, `v_cache` `[B, Tmax, Hkv, Dv]`;
//! - a paged cache (the vLLM / FlashInfer layout): `k_cache` `[num_pages, page_size, Hkv, D]`,
//!   `v_cache` likewise, `block_table` `[B, max_pages]` (page indices): key `j` of sequence `b` is
//!   slot `j % page_size` of page `block_table[b][j / page_size]`; `page_size` a power of two from
//!   16 to 256;
//! - `k_new`, `v_new` `[B, Nnew, Hkv, D|Dv]`, both or neither;
//! - `cache_seqlens` `[B]` and `block_table`: i32, FlashAttention's dtype (on the CPU u32 and i64
//!   tensors are converted; candle has no cast to i32 on CUDA).
//!
//! The cache tensors are written in place, as FlashAttention writes its `k_cache` and `v_cache`:
//! candle tensors that share their storage (clones, and views of the same tensor) see the new rows.
//! They must be contiguous, must not share storage with each other or with another argument, and are
//! not part of the autograd graph (the step is forward only; `o` has no gradient).
//!
//! CPU tensors run attn-cpu-ref's `fast::forward_kv_cache` (f32 accumulation), which checks `cache_seqlens` and
//! `block_table` against the cache before anything is written. On CUDA (feature `cuda`) the lengths
//! and the table stay on the device and are the caller's contract (see `kv_cache/cuda.rs`).

use crate::error::{describe, storage_dtype, to_candle};
use attn_core::{
    shape_str, AttnError, DType, Element, Family, KvCacheProblem, KvCacheSpec, KvLayout, Op, Pass,
    SoftmaxParams,
};
use attn_cpu_ref::kv_cache::KvCacheIo;
use candle_core::{CpuStorage, Device, InplaceOp1, Layout, Result, Storage, Tensor, WithDType};
use std::sync::{Mutex, MutexGuard};

#[cfg(feature = "cuda")]
mod cuda;

/// The attention of a cache step: a softmax-like family with its parameters, bottom-right causal
/// masking (on by default) and a sliding window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvAttnOptions {
    /// Softmax, cosine-sim or hyperbolic, with its parameters (Taylor attention keeps a recurrent
    /// state instead: [`crate::TaylorCache`]).
    pub family: Family,
    /// Bottom-right causal masking over the real lengths (default `true`).
    pub causal: bool,
    /// Keys `diag − left ..= diag + right` around each query's bottom-right diagonal; `None` on a
    /// side leaves it open (default: no window).
    pub window: Option<(Option<usize>, Option<usize>)>,
}

impl KvAttnOptions {
    /// Causal attention of `family`, no window.
    pub fn new(family: Family) -> Self {
        KvAttnOptions {
            family,
            causal: true,
            window: None,
        }
    }

    /// Causal softmax attention with `scale` (`None`: `1/√D`).
    pub fn softmax(scale: Option<f32>) -> Self {
        KvAttnOptions::new(Family::Softmax(SoftmaxParams { scale, softcap: None }))
    }

    /// Set [`KvAttnOptions::causal`].
    pub fn with_causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// Set [`KvAttnOptions::window`].
    pub fn with_window(mut self, left: Option<usize>, right: Option<usize>) -> Self {
        self.window = Some((left, right));
        self
    }
}

/// FlashAttention's `flash_attn_with_kvcache`, forward only, softmax attention: append `k_new`,
/// `v_new` to the cache **in place** at positions `cache_seqlens[b] ..`, then attend `q` over the
/// `cache_seqlens[b] + Nnew` keys of each sequence. Returns `o` `[B, Nq, Hq, Dv]` and, when
/// `return_lse`, the LSE `[B, Hq, Nq]` (f32, −∞ for a row with no key).
///
/// Arguments as FlashAttention names them (layouts in the module doc): a contiguous cache when
/// `block_table` is `None`, else a paged one; `softmax_scale` multiplies `q·k`; `causal` is
/// bottom-right; `window_left` / `window_right` bound the keys around the diagonal (`None`: open,
/// FlashAttention's −1); `softcap` caps the scores as `c·tanh(s/c)`. `cache_seqlens` does not change:
/// the caller advances it by `Nnew` for the next step (the cache types of [`crate::KvCache`] and
/// [`crate::PagedKvCache`] do).
///
/// Errors name the argument and the tensors' shapes: ranks and shapes that do not agree, dtypes
/// (q, caches and new tokens: one of f32, f16, bf16; lengths and table: integers), devices,
/// caches that are not contiguous or share storage, a page size that is not a power of two from 16 to
/// 256, new tokens that overflow the cache, and (where the values are on the host) lengths beyond
/// the cache or table entries outside the pool.
///
/// ```
/// use attn_candle::flash_attn_with_kvcache;
/// use candle_core::{DType, Device, Tensor};
/// let dev = Device::Cpu;
/// let k_cache = Tensor::zeros((2, 64, 2, 16), DType::F32, &dev)?;
/// let v_cache = Tensor::zeros((2, 64, 2, 16), DType::F32, &dev)?;
/// let q = Tensor::randn(0f32, 1.0, (2, 1, 8, 16), &dev)?;
/// let k = Tensor::randn(0f32, 1.0, (2, 1, 2, 16), &dev)?;
/// let lens = Tensor::new(&[5i32, 0], &dev)?;
/// let (o, lse) = flash_attn_with_kvcache(
///     &q, &k_cache, &v_cache, Some(&k), Some(&k), &lens, None, 0.25, true, None, None, None, true,
/// )?;
/// assert_eq!(o.dims(), &[2, 1, 8, 16]);
/// assert_eq!(lse.map(|l| l.dims().to_vec()), Some(vec![2, 8, 1]));
/// // The new key is now row 5 of sequence 0's cache.
/// assert_eq!(k_cache.get(0)?.get(5)?.to_vec2::<f32>()?, k.get(0)?.get(0)?.to_vec2::<f32>()?);
/// # Ok::<(), candle_core::Error>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_with_kvcache(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    k_new: Option<&Tensor>,
    v_new: Option<&Tensor>,
    cache_seqlens: &Tensor,
    block_table: Option<&Tensor>,
    softmax_scale: f32,
    causal: bool,
    window_left: Option<usize>,
    window_right: Option<usize>,
    softcap: Option<f32>,
    return_lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let mut opts = KvAttnOptions::new(Family::Softmax(SoftmaxParams {
        scale: Some(softmax_scale),
        softcap,
    }))
    .with_causal(causal);
    if window_left.is_some() || window_right.is_some() {
        opts = opts.with_window(window_left, window_right);
    }
    let step = Tensors {
        q,
        k_cache,
        v_cache,
        k_new,
        v_new,
        cache_seqlens,
        block_table,
    };
    let (o, lse) = run(&step, &opts, true)?;
    Ok((o, return_lse.then_some(lse)))
}

/// [`flash_attn_with_kvcache`] for any softmax-like family: append `k_new`, `v_new` to the cache in
/// place and attend; returns `o` and the LSE. Errors use the option names of [`KvAttnOptions`].
#[allow(clippy::too_many_arguments)]
pub fn kv_cache_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    k_new: Option<&Tensor>,
    v_new: Option<&Tensor>,
    cache_seqlens: &Tensor,
    block_table: Option<&Tensor>,
    opts: &KvAttnOptions,
) -> Result<(Tensor, Tensor)> {
    let step = Tensors {
        q,
        k_cache,
        v_cache,
        k_new,
        v_new,
        cache_seqlens,
        block_table,
    };
    run(&step, opts, false)
}

/// The tensors of one step, as the caller passed them.
#[derive(Clone, Copy)]
pub(crate) struct Tensors<'a> {
    pub q: &'a Tensor,
    pub k_cache: &'a Tensor,
    pub v_cache: &'a Tensor,
    pub k_new: Option<&'a Tensor>,
    pub v_new: Option<&'a Tensor>,
    pub cache_seqlens: &'a Tensor,
    pub block_table: Option<&'a Tensor>,
}

impl Tensors<'_> {
    /// `q [..], k_cache [..], ...` for messages.
    fn shapes(&self) -> String {
        let mut s = format!(
            "q {}, k_cache {}, v_cache {}",
            shape_str(self.q.dims()),
            shape_str(self.k_cache.dims()),
            shape_str(self.v_cache.dims())
        );
        for (name, t) in [
            ("k_new", self.k_new),
            ("v_new", self.v_new),
            ("cache_seqlens", Some(self.cache_seqlens)),
            ("block_table", self.block_table),
        ] {
            if let Some(t) = t {
                s.push_str(&format!(", {name} {}", shape_str(t.dims())));
            }
        }
        s
    }
}

fn dims4(op: Op, name: &str, t: &Tensor, expected: &str) -> std::result::Result<[usize; 4], AttnError> {
    match *t.dims() {
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(AttnError::ShapeMismatch {
            op,
            what: name.into(),
            expected: expected.into(),
            got: describe(name, t),
        }),
    }
}

/// An integer tensor of the expected rank as i32 (a CPU tensor in u32 or i64 is cast), contiguous.
fn as_i32(op: Op, name: &'static str, t: &Tensor, expected: &str) -> Result<Tensor> {
    let int = matches!(
        t.dtype(),
        candle_core::DType::I32 | candle_core::DType::U32 | candle_core::DType::I64
    );
    if !int || t.rank() != expected.matches(',').count() + 1 {
        return Err(to_candle(AttnError::ShapeMismatch {
            op,
            what: name.into(),
            expected: format!("an i32 (or u32, i64) tensor {expected}"),
            got: describe(name, t),
        }));
    }
    let t = if t.dtype() == candle_core::DType::I32 {
        t.clone()
    } else if t.device().is_cuda() {
        // candle has no cast to i32 on CUDA; the step reads i32, FlashAttention's dtype.
        return Err(to_candle(AttnError::InvalidArgument {
            op,
            arg: name,
            reason: format!("{} must be i32 on CUDA", describe(name, t)),
        }));
    } else {
        t.to_dtype(candle_core::DType::I32)?
    };
    t.contiguous()
}

/// The checked step: its spec and the tensors the backend reads, contiguous, lengths and table as
/// i32.
struct Checked {
    spec: KvCacheSpec,
    q: Tensor,
    k_new: Option<Tensor>,
    v_new: Option<Tensor>,
    cache_seqlens: Tensor,
    block_table: Option<Tensor>,
}

/// A `KvCacheProblem` validation error restated in the caller's words.
fn in_callers_terms(e: AttnError, t: &Tensors<'_>, flash: bool) -> AttnError {
    let AttnError::InvalidArgument { op, arg, reason } = e else {
        return e;
    };
    let with = |name: &'static str| AttnError::InvalidArgument {
        op,
        arg: name,
        reason: format!("{reason} ({})", t.shapes()),
    };
    match arg {
        "batch" | "seq_q" | "heads_q" | "head_dim" => with("q"),
        "heads_kv" | "capacity" | "page_size" | "num_pages" => with("k_cache"),
        "head_dim_v" => with("v_cache"),
        "pages_per_seq" => with("block_table"),
        "k_new" => with("k_new"),
        "scale" if flash => with("softmax_scale"),
        "window" if flash => with("window_left"),
        _ => AttnError::InvalidArgument { op, arg, reason },
    }
}

/// Check the tensors against each other and build the step's spec.
fn check(t: &Tensors<'_>, opts: &KvAttnOptions, flash: bool) -> Result<Checked> {
    let kind = opts.family.kind();
    let op = Op::new(kind, Pass::Spec);
    let err = |what: &str, expected: String, got: String| {
        to_candle(AttnError::ShapeMismatch {
            op,
            what: what.into(),
            expected: format!("{expected} ({})", t.shapes()),
            got,
        })
    };
    let [b, nq, hq, d] = dims4(op, "q", t.q, "[batch, seq_q, heads_q, head_dim]").map_err(to_candle)?;
    let paged = t.block_table.is_some();
    let cache_dims = if paged {
        "[num_pages, page_size, heads_kv, head_dim]"
    } else {
        "[batch, seq_cache, heads_kv, head_dim]"
    };
    let [c0, c1, hkv, dk] = dims4(op, "k_cache", t.k_cache, cache_dims).map_err(to_candle)?;
    let [v0, v1, vh, dv] = dims4(op, "v_cache", t.v_cache, cache_dims).map_err(to_candle)?;
    if dk != d {
        return Err(err(
            "k_cache",
            format!("head dim {d} as q's"),
            describe("k_cache", t.k_cache),
        ));
    }
    if [v0, v1, vh] != [c0, c1, hkv] {
        return Err(err(
            "v_cache",
            format!("{} as k_cache's outer dims", shape_str(&[c0, c1, hkv])),
            describe("v_cache", t.v_cache),
        ));
    }
    if !paged && c0 != b {
        return Err(err(
            "k_cache",
            format!("batch {b} as q's (a contiguous cache has one row per sequence)"),
            describe("k_cache", t.k_cache),
        ));
    }
    let dtype = storage_dtype(kind, "q", t.q).map_err(to_candle)?;
    let dev = t.q.device();
    let same_device = |name: &'static str, x: &Tensor| -> Result<()> {
        if x.device().same_device(dev) {
            Ok(())
        } else {
            Err(to_candle(AttnError::InvalidArgument {
                op,
                arg: name,
                reason: format!("{} is not on q's device {:?}", describe(name, x), dev.location()),
            }))
        }
    };
    for (name, x) in [
        ("k_cache", Some(t.k_cache)),
        ("v_cache", Some(t.v_cache)),
        ("k_new", t.k_new),
        ("v_new", t.v_new),
    ] {
        let Some(x) = x else { continue };
        same_device(name, x)?;
        if x.dtype() != t.q.dtype() {
            return Err(to_candle(AttnError::InvalidArgument {
                op,
                arg: name,
                reason: format!(
                    "{} has a dtype other than q's {:?}",
                    describe(name, x),
                    t.q.dtype()
                ),
            }));
        }
    }
    same_device("cache_seqlens", t.cache_seqlens)?;
    if let Some(bt) = t.block_table {
        same_device("block_table", bt)?;
    }
    for (name, x) in [("k_cache", t.k_cache), ("v_cache", t.v_cache)] {
        if !x.is_contiguous() {
            return Err(to_candle(AttnError::InvalidArgument {
                op,
                arg: name,
                reason: format!(
                    "{} is not contiguous; the step writes the new tokens into it in place",
                    describe(name, x)
                ),
            }));
        }
    }
    let new_tokens = match (t.k_new, t.v_new) {
        (None, None) => 0,
        (Some(k), Some(v)) => {
            let [kb, kn, kh, kd] =
                dims4(op, "k_new", k, "[batch, seq_new, heads_kv, head_dim]").map_err(to_candle)?;
            if [kb, kh, kd] != [b, hkv, d] {
                return Err(err(
                    "k_new",
                    format!("[{b}, seq_new, {hkv}, {d}]"),
                    describe("k_new", k),
                ));
            }
            if v.dims() != [b, kn, hkv, dv] {
                return Err(err("v_new", shape_str(&[b, kn, hkv, dv]), describe("v_new", v)));
            }
            kn
        }
        (Some(_), None) | (None, Some(_)) => {
            let missing = if t.k_new.is_none() { "k_new" } else { "v_new" };
            return Err(to_candle(AttnError::InvalidArgument {
                op,
                arg: missing,
                reason: format!("k_new and v_new come together ({})", t.shapes()),
            }));
        }
    };
    let cache_seqlens = as_i32(op, "cache_seqlens", t.cache_seqlens, "[batch]")?;
    if cache_seqlens.dims() != [b] {
        return Err(err(
            "cache_seqlens",
            format!("[{b}]"),
            describe("cache_seqlens", t.cache_seqlens),
        ));
    }
    let (layout, block_table) = match t.block_table {
        None => (KvLayout::Contiguous { capacity: c1 }, None),
        Some(bt) => {
            let bt32 = as_i32(op, "block_table", bt, "[batch, max_pages]")?;
            let pages_per_seq = match *bt32.dims() {
                [bb, p] if bb == b => p,
                _ => {
                    return Err(err(
                        "block_table",
                        format!("[{b}, max_pages]"),
                        describe("block_table", bt),
                    ))
                }
            };
            (
                KvLayout::Paged {
                    num_pages: c0,
                    page_size: c1,
                    pages_per_seq,
                },
                Some(bt32),
            )
        }
    };
    let mut p = KvCacheProblem::new(opts.family, dtype, b, hq, hkv, nq, d, layout)
        .with_new_tokens(new_tokens)
        .with_head_dim_v(dv)
        .with_causal(opts.causal);
    if let Some((left, right)) = opts.window {
        p = p.with_window(left, right);
    }
    let spec = p
        .validate()
        .map_err(|e| to_candle(in_callers_terms(e, t, flash)))?;
    // The caches are written while the other arguments are read: they must be separate storage.
    let key = |x: &Tensor| {
        let (s, _) = x.storage_and_layout();
        std::ptr::from_ref::<Storage>(&s).addr()
    };
    let (kc, vc) = (key(t.k_cache), key(t.v_cache));
    let others = [Some(t.q), t.k_new, t.v_new, Some(t.cache_seqlens), t.block_table];
    for (name, x) in [("k_cache", kc), ("v_cache", vc)] {
        let shared =
            x == if name == "k_cache" { vc } else { kc } || others.iter().flatten().any(|o| key(o) == x);
        if shared {
            return Err(to_candle(AttnError::InvalidArgument {
                op,
                arg: name,
                reason: format!(
                    "{name} shares its storage with another argument; the step writes into it ({})",
                    t.shapes()
                ),
            }));
        }
    }
    // Dense; on CUDA also at element 0 of their own buffer, as attn-cuda takes whole buffers.
    let dense = |x: &Tensor| -> Result<Tensor> {
        if x.device().is_cuda() && x.layout().start_offset() != 0 {
            x.force_contiguous()
        } else {
            x.contiguous()
        }
    };
    Ok(Checked {
        spec,
        q: dense(t.q)?,
        k_new: t.k_new.map(dense).transpose()?,
        v_new: t.v_new.map(dense).transpose()?,
        cache_seqlens: dense(&cache_seqlens)?,
        block_table: block_table.as_ref().map(dense).transpose()?,
    })
}

/// Check and run a step: the caches written in place, `o` and the LSE returned.
pub(crate) fn run(t: &Tensors<'_>, opts: &KvAttnOptions, flash: bool) -> Result<(Tensor, Tensor)> {
    let c = check(t, opts, flash)?;
    let step = Step {
        c: &c,
        v_cache: t.v_cache,
        out: Mutex::new(None),
    };
    t.k_cache.inplace_op1(&step)?;
    let out = lock(&step.out).take();
    out.ok_or_else(|| {
        crate::error::internal(
            c.spec.op(Pass::Forward),
            "the cache step returned no output".into(),
        )
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The step as an in-place op on `k_cache`; inside it, [`WithK`] is an in-place op on `v_cache`, so
/// both caches are borrowed mutably while the backend runs (candle gives mutable access to one
/// tensor per op).
struct Step<'a> {
    c: &'a Checked,
    v_cache: &'a Tensor,
    /// `o` and the LSE, left by the backend.
    out: Mutex<Option<(Tensor, Tensor)>>,
}

/// The storage of `k_cache`, mutably borrowed by the outer op.
enum KStorage<'s> {
    Cpu(&'s mut CpuStorage),
    #[cfg(feature = "cuda")]
    Cuda(&'s mut candle_core::CudaStorage),
}

struct WithK<'s, 'a> {
    step: &'s Step<'a>,
    k: Mutex<Option<(KStorage<'s>, &'s Layout)>>,
}

impl WithK<'_, '_> {
    fn take_k(&self) -> Result<(KStorage<'_>, &Layout)> {
        let k = lock(&self.k).take();
        k.ok_or_else(|| {
            crate::error::internal(self.step.c.spec.op(Pass::Forward), "k_cache taken twice".into())
        })
    }
}

impl InplaceOp1 for Step<'_> {
    fn name(&self) -> &'static str {
        "attn_kv_cache"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let inner = WithK {
            step: self,
            k: Mutex::new(Some((KStorage::Cpu(storage), layout))),
        };
        self.v_cache.inplace_op1(&inner)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &mut candle_core::CudaStorage, layout: &Layout) -> Result<()> {
        let inner = WithK {
            step: self,
            k: Mutex::new(Some((KStorage::Cuda(storage), layout))),
        };
        self.v_cache.inplace_op1(&inner)
    }
}

impl InplaceOp1 for WithK<'_, '_> {
    fn name(&self) -> &'static str {
        "attn_kv_cache"
    }

    // Without the `cuda` feature `KStorage` has one variant.
    #[allow(irrefutable_let_patterns)]
    fn cpu_fwd(&self, v: &mut CpuStorage, vl: &Layout) -> Result<()> {
        let (KStorage::Cpu(k), kl) = self.take_k()? else {
            return Err(crate::error::internal(
                self.step.c.spec.op(Pass::Forward),
                "k_cache and v_cache are on different devices".into(),
            ));
        };
        let out = match self.step.c.spec.attend().dtype() {
            DType::F32 => cpu_step::<f32>(self.step.c, k, kl, v, vl)?,
            DType::F16 => cpu_step::<half::f16>(self.step.c, k, kl, v, vl)?,
            DType::BF16 => cpu_step::<half::bf16>(self.step.c, k, kl, v, vl)?,
        };
        *lock(&self.step.out) = Some(out);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, v: &mut candle_core::CudaStorage, vl: &Layout) -> Result<()> {
        let (KStorage::Cuda(k), kl) = self.take_k()? else {
            return Err(crate::error::internal(
                self.step.c.spec.op(Pass::Forward),
                "k_cache and v_cache are on different devices".into(),
            ));
        };
        let out = cuda::step(self.step.c, k, kl, v, vl)?;
        *lock(&self.step.out) = Some(out);
        Ok(())
    }
}

/// The storage dtypes the CPU path writes in place.
trait HostElem: Element + WithDType {
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut Vec<Self>>;
}

impl HostElem for f32 {
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut Vec<Self>> {
        match s {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl HostElem for half::f16 {
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut Vec<Self>> {
        match s {
            CpuStorage::F16(v) => Some(v),
            _ => None,
        }
    }
}

impl HostElem for half::bf16 {
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut Vec<Self>> {
        match s {
            CpuStorage::BF16(v) => Some(v),
            _ => None,
        }
    }
}

/// `layout`'s elements of a dense tensor in `storage`.
fn window<'a, T>(all: &'a [T], layout: &Layout, op: Op, what: &str) -> Result<&'a [T]> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| crate::error::internal(op, format!("`{what}` is not contiguous")))?;
    all.get(start..end)
        .ok_or_else(|| crate::error::internal(op, format!("`{what}` exceeds its storage")))
}

fn window_mut<'a, T>(all: &'a mut [T], layout: &Layout, op: Op, what: &str) -> Result<&'a mut [T]> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| crate::error::internal(op, format!("`{what}` is not contiguous")))?;
    all.get_mut(start..end)
        .ok_or_else(|| crate::error::internal(op, format!("`{what}` exceeds its storage")))
}

/// The host elements of a CPU tensor the step reads.
fn read_host<'g, T: WithDType>(storage: &'g Storage, layout: &Layout, op: Op, what: &str) -> Result<&'g [T]> {
    match storage {
        Storage::Cpu(s) => window(s.as_slice::<T>()?, layout, op, what),
        other => Err(to_candle(AttnError::InvalidArgument {
            op,
            arg: "device",
            reason: format!(
                "`{what}` is on {:?} while the caches are on the CPU",
                other.device().location()
            ),
        })),
    }
}

fn cpu_step<E: HostElem>(
    c: &Checked,
    k: &mut CpuStorage,
    kl: &Layout,
    v: &mut CpuStorage,
    vl: &Layout,
) -> Result<(Tensor, Tensor)> {
    let op = c.spec.op(Pass::Forward);
    let dtype_err = |what: &str| crate::error::internal(op, format!("`{what}` is not in the step's dtype"));
    let k_cache = window_mut(
        E::slice_mut(k).ok_or_else(|| dtype_err("k_cache"))?,
        kl,
        op,
        "k_cache",
    )?;
    let v_cache = window_mut(
        E::slice_mut(v).ok_or_else(|| dtype_err("v_cache"))?,
        vl,
        op,
        "v_cache",
    )?;
    let q = c.q.storage_and_layout();
    let k_new = c.k_new.as_ref().map(Tensor::storage_and_layout);
    let v_new = c.v_new.as_ref().map(Tensor::storage_and_layout);
    let lens = c.cache_seqlens.storage_and_layout();
    let table = c.block_table.as_ref().map(Tensor::storage_and_layout);
    let f = attn_cpu_ref::fast::forward_kv_cache::<E>(
        &c.spec,
        KvCacheIo {
            q: read_host(&q.0, q.1, op, "q")?,
            k_cache,
            v_cache,
            k_new: k_new
                .as_ref()
                .map(|g| read_host(&g.0, g.1, op, "k_new"))
                .transpose()?,
            v_new: v_new
                .as_ref()
                .map(|g| read_host(&g.0, g.1, op, "v_new"))
                .transpose()?,
            cache_seqlens: read_host(&lens.0, lens.1, op, "cache_seqlens")?,
            block_table: table
                .as_ref()
                .map(|g| read_host(&g.0, g.1, op, "block_table"))
                .transpose()?,
        },
    )
    .map_err(to_candle)?;
    let a = c.spec.attend();
    let o = Tensor::from_vec(f.o, a.o_shape().to_vec(), &Device::Cpu)?;
    let lse = Tensor::from_vec(f.stats, (a.batch(), a.heads_q(), a.seq_q()), &Device::Cpu)?;
    Ok((o, lse))
}
