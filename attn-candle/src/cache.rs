//! Caches for generation that own their tensors and grow: [`KvCache`] (contiguous), [`PagedKvCache`]
//! (a page pool shared through a block table) and [`TaylorCache`] (Taylor attention's recurrent
//! state). Each implements [`AttnCache`]: `append_and_attend(q, k, v)` appends the new keys and
//! values of every sequence and attends the new queries over everything the sequence holds
//! (bottom-right causal by default), which is what a decoder layer calls for prefill (many tokens)
//! and for decode (one).
//!
//! The lengths live twice: a host mirror (`lens`) for the cache's own bookkeeping (growing the
//! tensors, allocating pages) and an i32 tensor `cache_seqlens` on the cache's device that the step
//! reads. After a step the device copy is advanced on the device (one `affine` kernel on CUDA), so a
//! decode step moves no length between host and device; the block table is uploaded only when a
//! sequence gets a new page (every `page_size` tokens) and the pool is reallocated only when it runs
//! out of pages.

use crate::error::{describe, storage_dtype, to_candle};
use crate::kv_cache::{kv_cache_attention, KvAttnOptions};
use attn_core::{shape_str, AttnError, AttnProblem, Causal, DType, Family, FamilyKind, Op, Pass, PAGE_SIZES};
use attn_cpu_ref::fast::decode_taylor::FastDecodeState;
use attn_cpu_ref::Inputs;
use candle_core::{Device, Result, Tensor, WithDType};

#[cfg(feature = "cuda")]
mod cuda;

/// A cache a decoder layer attends through.
pub trait AttnCache {
    /// Append `k`, `v` (`[B, N, Hkv, D]`, `[B, N, Hkv, Dv]`) to every sequence and attend `q`
    /// (`[B, N, Hq, D]`) over all its keys; returns o `[B, N, Hq, Dv]`.
    fn append_and_attend(&mut self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor>;

    /// Tokens held per sequence.
    fn lens(&self) -> &[usize];
}

fn invalid(kind: FamilyKind, arg: &'static str, reason: String) -> candle_core::Error {
    to_candle(AttnError::InvalidArgument {
        op: Op::new(kind, Pass::Spec),
        arg,
        reason,
    })
}

/// The new tokens per sequence of `k` `[B, N, Hkv, D]`, checked against the cache's batch.
fn new_tokens(kind: FamilyKind, batch: usize, k: &Tensor) -> Result<usize> {
    match *k.dims() {
        [b, n, _, _] if b == batch => Ok(n),
        _ => Err(to_candle(AttnError::ShapeMismatch {
            op: Op::new(kind, Pass::Spec),
            what: "k".into(),
            expected: format!("[{batch}, new_tokens, heads_kv, head_dim]"),
            got: describe("k", k),
        })),
    }
}

/// `lens` as an i32 tensor on `dev` (one small host-to-device write).
fn lens_tensor(kind: FamilyKind, lens: &[usize], dev: &Device) -> Result<Tensor> {
    let v = lens
        .iter()
        .map(|&l| {
            i32::try_from(l).map_err(|_| invalid(kind, "cache_seqlens", format!("length {l} exceeds i32")))
        })
        .collect::<Result<Vec<i32>>>()?;
    Tensor::from_vec(v, lens.len(), &Device::Cpu)?.to_device(dev)
}

/// Advance every length by `n`: the host mirror and, on the device, the lengths tensor.
fn advance(lens: &mut [usize], seqlens: &Tensor, n: usize) -> Result<Tensor> {
    lens.iter_mut().for_each(|l| *l += n);
    if n == 0 {
        return Ok(seqlens.clone());
    }
    seqlens.affine(1.0, n as f64)
}

/// A contiguous KV cache `[B, capacity, Hkv, D]` that doubles its capacity when a step would
/// overflow it (new tensors, the old rows copied: a tensor taken from [`KvCache::k`] before then no
/// longer sees the new rows).
///
/// ```
/// use attn_candle::{AttnCache, KvAttnOptions, KvCache};
/// use candle_core::{DType, Device, Tensor};
/// let dev = Device::Cpu;
/// let mut cache = KvCache::new(1, 4, 2, 16, DType::F32, &dev, KvAttnOptions::softmax(None))?;
/// let q = Tensor::randn(0f32, 1.0, (1, 6, 4, 16), &dev)?;
/// let kv = Tensor::randn(0f32, 1.0, (1, 6, 2, 16), &dev)?;
/// let o = cache.append_and_attend(&q, &kv, &kv)?; // prefill: 6 tokens, the cache grows to 8
/// assert_eq!((o.dims(), cache.lens(), cache.capacity()), (&[1, 6, 4, 16][..], &[6][..], 8));
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Debug)]
pub struct KvCache {
    k: Tensor,
    v: Tensor,
    lens: Vec<usize>,
    seqlens: Tensor,
    opts: KvAttnOptions,
}

impl KvCache {
    /// An empty cache of `batch` sequences, `capacity` slots each (grown on demand), `heads_kv`
    /// heads of `head_dim`, in `dtype` on `device`; steps attend as `opts` says.
    pub fn new(
        batch: usize,
        capacity: usize,
        heads_kv: usize,
        head_dim: usize,
        dtype: candle_core::DType,
        device: &Device,
        opts: KvAttnOptions,
    ) -> Result<Self> {
        let k = Tensor::zeros((batch, capacity.max(1), heads_kv, head_dim), dtype, device)?;
        Ok(KvCache {
            v: k.zeros_like()?,
            k,
            lens: vec![0; batch],
            seqlens: lens_tensor(opts.family.kind(), &vec![0; batch], device)?,
            opts,
        })
    }

    /// Slots per sequence.
    pub fn capacity(&self) -> usize {
        self.k.dims()[1]
    }

    /// The keys, `[B, capacity, Hkv, D]`; rows past a sequence's length are unused.
    pub fn k(&self) -> &Tensor {
        &self.k
    }

    /// The values, `[B, capacity, Hkv, Dv]`.
    pub fn v(&self) -> &Tensor {
        &self.v
    }

    /// The lengths on the cache's device, `[B]` i32.
    pub fn cache_seqlens(&self) -> &Tensor {
        &self.seqlens
    }

    /// Forget every sequence's tokens (the tensors are kept).
    pub fn reset(&mut self) -> Result<()> {
        self.lens.iter_mut().for_each(|l| *l = 0);
        self.seqlens = lens_tensor(self.opts.family.kind(), &self.lens, self.k.device())?;
        Ok(())
    }

    /// [`AttnCache::append_and_attend`], also returning the LSE `[B, Hq, N]` (f32).
    pub fn append_and_attend_with_lse(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let kind = self.opts.family.kind();
        let n = new_tokens(kind, self.lens.len(), k)?;
        let need = self.lens.iter().max().copied().unwrap_or(0) + n;
        if need > self.capacity() {
            let cap = need.max(self.capacity().saturating_mul(2));
            let grow = |t: &Tensor| -> Result<Tensor> {
                let mut dims = t.dims().to_vec();
                dims[1] = cap;
                let bigger = Tensor::zeros(dims, t.dtype(), t.device())?;
                bigger.slice_set(t, 1, 0)?;
                Ok(bigger)
            };
            self.k = grow(&self.k)?;
            self.v = grow(&self.v)?;
        }
        let (o, lse) = kv_cache_attention(
            q,
            &self.k,
            &self.v,
            Some(k),
            Some(v),
            &self.seqlens,
            None,
            &self.opts,
        )?;
        self.seqlens = advance(&mut self.lens, &self.seqlens, n)?;
        Ok((o, lse))
    }
}

impl AttnCache for KvCache {
    fn append_and_attend(&mut self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        Ok(self.append_and_attend_with_lse(q, k, v)?.0)
    }

    fn lens(&self) -> &[usize] {
        &self.lens
    }
}

/// A paged KV cache (the vLLM / FlashInfer layout): a pool of pages `[num_pages, page_size, Hkv,
/// D]`, a block table `[B, max_pages]` i32 naming each sequence's pages in order, and per-sequence
/// lengths. A sequence gets a page from the free list when its next token would start one; the pool
/// doubles when the free list is empty (new tensors, the old pages copied);
/// [`PagedKvCache::free_sequence`] returns a sequence's pages.
///
/// ```
/// use attn_candle::{AttnCache, KvAttnOptions, PagedKvCache};
/// use candle_core::{DType, Device, Tensor};
/// let dev = Device::Cpu;
/// let mut cache = PagedKvCache::new(2, 16, 4, 2, 16, DType::F32, &dev, KvAttnOptions::softmax(None))?;
/// let q = Tensor::randn(0f32, 1.0, (2, 20, 4, 16), &dev)?;
/// let kv = Tensor::randn(0f32, 1.0, (2, 20, 2, 16), &dev)?;
/// cache.append_and_attend(&q, &kv, &kv)?; // 20 tokens: two pages per sequence
/// assert_eq!(cache.pages_of(0).len() + cache.pages_of(1).len(), 4);
/// cache.free_sequence(1)?;
/// assert_eq!(cache.lens(), &[20, 0]);
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Debug)]
pub struct PagedKvCache {
    k: Tensor,
    v: Tensor,
    page_size: usize,
    /// Pages of each sequence, in order.
    pages: Vec<Vec<u32>>,
    /// Free pages; the last is handed out first.
    free: Vec<u32>,
    /// Columns of the block table.
    pages_per_seq: usize,
    block_table: Tensor,
    lens: Vec<usize>,
    seqlens: Tensor,
    opts: KvAttnOptions,
}

impl PagedKvCache {
    /// An empty cache of `batch` sequences over a pool of `num_pages` pages of `page_size` slots
    /// (a power of two from 16 to 256), `heads_kv` heads of `head_dim`, in `dtype` on `device`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        batch: usize,
        page_size: usize,
        num_pages: usize,
        heads_kv: usize,
        head_dim: usize,
        dtype: candle_core::DType,
        device: &Device,
        opts: KvAttnOptions,
    ) -> Result<Self> {
        let kind = opts.family.kind();
        if !page_size.is_power_of_two() || !PAGE_SIZES.contains(&page_size) {
            return Err(invalid(
                kind,
                "page_size",
                format!(
                    "{page_size} is not a power of two from {} to {}",
                    PAGE_SIZES.start(),
                    PAGE_SIZES.end()
                ),
            ));
        }
        let num_pages = num_pages.max(1);
        let pages = u32::try_from(num_pages)
            .map_err(|_| invalid(kind, "num_pages", format!("{num_pages} pages exceed u32")))?;
        let k = Tensor::zeros((num_pages, page_size, heads_kv, head_dim), dtype, device)?;
        let mut cache = PagedKvCache {
            v: k.zeros_like()?,
            k,
            page_size,
            pages: vec![Vec::new(); batch],
            free: (0..pages).rev().collect(),
            pages_per_seq: 1,
            block_table: Tensor::zeros((batch, 1), candle_core::DType::I32, device)?,
            lens: vec![0; batch],
            seqlens: lens_tensor(kind, &vec![0; batch], device)?,
            opts,
        };
        cache.upload_table()?;
        Ok(cache)
    }

    /// The key pages `[num_pages, page_size, Hkv, D]`.
    pub fn k_pages(&self) -> &Tensor {
        &self.k
    }

    /// The value pages `[num_pages, page_size, Hkv, Dv]`.
    pub fn v_pages(&self) -> &Tensor {
        &self.v
    }

    /// The block table on the cache's device, `[B, max_pages]` i32.
    pub fn block_table(&self) -> &Tensor {
        &self.block_table
    }

    /// The lengths on the cache's device, `[B]` i32.
    pub fn cache_seqlens(&self) -> &Tensor {
        &self.seqlens
    }

    /// The pages of sequence `b`, in order (empty for an out-of-range `b`).
    pub fn pages_of(&self, b: usize) -> &[u32] {
        self.pages.get(b).map_or(&[], Vec::as_slice)
    }

    /// Pages in the pool, used or free.
    pub fn num_pages(&self) -> usize {
        self.k.dims()[0]
    }

    /// Slots per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Return sequence `b`'s pages to the free list and set its length to 0.
    pub fn free_sequence(&mut self, b: usize) -> Result<()> {
        let kind = self.opts.family.kind();
        let Some(pages) = self.pages.get_mut(b) else {
            return Err(invalid(
                kind,
                "sequence",
                format!("{b} is not a sequence of a batch of {}", self.lens.len()),
            ));
        };
        self.free.extend(pages.drain(..).rev());
        self.lens[b] = 0;
        self.seqlens = lens_tensor(kind, &self.lens, self.k.device())?;
        Ok(())
    }

    /// The block table from the host's page lists: one small host-to-device write. Columns a
    /// sequence does not use hold page 0 (never read: the step reads `⌈len / page_size⌉` pages).
    fn upload_table(&mut self) -> Result<()> {
        let mut table = vec![0i32; self.lens.len() * self.pages_per_seq];
        for (b, pages) in self.pages.iter().enumerate() {
            for (j, &p) in pages.iter().enumerate() {
                table[b * self.pages_per_seq + j] = p as i32;
            }
        }
        self.block_table = Tensor::from_vec(table, (self.lens.len(), self.pages_per_seq), &Device::Cpu)?
            .to_device(self.k.device())?;
        Ok(())
    }

    /// A free page, doubling the pool when none is left.
    fn take_page(&mut self) -> Result<u32> {
        if let Some(p) = self.free.pop() {
            return Ok(p);
        }
        let old = self.num_pages();
        let new = old.saturating_mul(2);
        let kind = self.opts.family.kind();
        let (lo, hi) = match (u32::try_from(old), u32::try_from(new)) {
            (Ok(lo), Ok(hi)) => (lo, hi),
            _ => {
                return Err(invalid(
                    kind,
                    "num_pages",
                    format!("a pool of {new} pages exceeds u32"),
                ))
            }
        };
        let grow = |t: &Tensor| -> Result<Tensor> {
            let mut dims = t.dims().to_vec();
            dims[0] = new;
            let bigger = Tensor::zeros(dims, t.dtype(), t.device())?;
            bigger.slice_set(t, 0, 0)?;
            Ok(bigger)
        };
        self.k = grow(&self.k)?;
        self.v = grow(&self.v)?;
        self.free.extend((lo + 1..hi).rev());
        Ok(lo)
    }

    /// [`AttnCache::append_and_attend`], also returning the LSE `[B, Hq, N]` (f32).
    pub fn append_and_attend_with_lse(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let n = new_tokens(self.opts.family.kind(), self.lens.len(), k)?;
        let mut changed = false;
        for b in 0..self.lens.len() {
            let need = (self.lens[b] + n).div_ceil(self.page_size);
            while self.pages[b].len() < need {
                let p = self.take_page()?;
                self.pages[b].push(p);
                changed = true;
            }
        }
        let widest = self.pages.iter().map(Vec::len).max().unwrap_or(0);
        if widest > self.pages_per_seq {
            self.pages_per_seq = widest.max(self.pages_per_seq.saturating_mul(2));
        }
        if changed {
            self.upload_table()?;
        }
        let (o, lse) = kv_cache_attention(
            q,
            &self.k,
            &self.v,
            Some(k),
            Some(v),
            &self.seqlens,
            Some(&self.block_table),
            &self.opts,
        )?;
        self.seqlens = advance(&mut self.lens, &self.seqlens, n)?;
        Ok((o, lse))
    }
}

impl AttnCache for PagedKvCache {
    fn append_and_attend(&mut self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        Ok(self.append_and_attend_with_lse(q, k, v)?.0)
    }

    fn lens(&self) -> &[usize] {
        &self.lens
    }
}

/// Taylor attention's recurrent decode state behind the cache interface: no keys are kept, each
/// step folds the new keys and values into running sums (docs/math.md §3, "Decode") and reads the
/// new queries from them, so a prompt appended in one step and continued token by token gives the
/// causal forward of the whole sequence. CPU tensors run attn-cpu-ref's fast path
/// (`fast::decode_taylor`: the sums in f32, read and folded by GEMMs; the f64 `decode` stays its
/// test oracle); CUDA tensors (feature `cuda`) attn-cuda's `TaylorDecodeState` on candle's stream.
pub struct TaylorCache {
    family: Family,
    batch: usize,
    state: Option<FastDecodeState>,
    #[cfg(feature = "cuda")]
    cuda_state: Option<attn_cuda::TaylorDecodeState>,
    /// The device of the first step; every later step runs there.
    location: Option<candle_core::DeviceLocation>,
    lens: Vec<usize>,
}

impl std::fmt::Debug for TaylorCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaylorCache")
            .field("family", &self.family)
            .field("batch", &self.batch)
            .field("lens", &self.lens)
            .finish_non_exhaustive()
    }
}

impl TaylorCache {
    /// An empty state of `batch` sequences for a Taylor `family`; the head shapes and dtype are
    /// fixed by the first step.
    pub fn new(family: Family, batch: usize) -> Result<Self> {
        if family.kind() != FamilyKind::Taylor {
            return Err(invalid(
                family.kind(),
                "family",
                "a TaylorCache holds Taylor attention's state; use KvCache or PagedKvCache".into(),
            ));
        }
        Ok(TaylorCache {
            family,
            batch,
            state: None,
            #[cfg(feature = "cuda")]
            cuda_state: None,
            location: None,
            lens: vec![0; batch],
        })
    }

    fn step<E: attn_core::Element + WithDType>(
        &mut self,
        spec: &attn_core::AttnSpec,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Tensor> {
        let host = |t: &Tensor| t.flatten_all()?.to_vec1::<E>();
        let (qh, kh, vh) = (host(q)?, host(k)?, host(v)?);
        let state = match &mut self.state {
            Some(s) => s,
            None => self
                .state
                .insert(FastDecodeState::empty(spec).map_err(to_candle)?),
        };
        let f = attn_cpu_ref::fast::decode_taylor::step::<E>(
            state,
            spec,
            Inputs {
                q: &qh,
                k: &kh,
                v: &vh,
                bias: None,
            },
        )
        .map_err(to_candle)?;
        Tensor::from_vec(f.o, spec.o_shape().to_vec(), &Device::Cpu)
    }
}

impl AttnCache for TaylorCache {
    fn append_and_attend(&mut self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let kind = FamilyKind::Taylor;
        let op = Op::new(kind, Pass::Decode);
        let dims = |name: &str, t: &Tensor| -> Result<[usize; 4]> {
            match *t.dims() {
                [a, b, c, d] => Ok([a, b, c, d]),
                _ => Err(to_candle(AttnError::ShapeMismatch {
                    op,
                    what: name.into(),
                    expected: "[batch, new_tokens, heads, head_dim]".into(),
                    got: describe(name, t),
                })),
            }
        };
        let [b, n, hq, d] = dims("q", q)?;
        let [kb, kn, hkv, kd] = dims("k", k)?;
        let [vb, vn, vh, dv] = dims("v", v)?;
        if [kb, kn, kd] != [b, n, d] || [vb, vn, vh] != [b, n, hkv] || b != self.batch {
            return Err(to_candle(AttnError::ShapeMismatch {
                op,
                what: "k".into(),
                expected: format!(
                    "k [{}, {n}, heads_kv, {d}] and v [{}, {n}, heads_kv, dv] for q {}",
                    self.batch,
                    self.batch,
                    shape_str(q.dims())
                ),
                got: format!("k {}, v {}", shape_str(k.dims()), shape_str(v.dims())),
            }));
        }
        let dtype = storage_dtype(kind, "q", q).map_err(to_candle)?;
        for (name, t) in [("k", k), ("v", v)] {
            if t.dtype() != q.dtype() || !t.device().same_device(q.device()) {
                return Err(invalid(
                    kind,
                    name,
                    format!(
                        "{} differs from {} in dtype or device",
                        describe(name, t),
                        describe("q", q)
                    ),
                ));
            }
        }
        let here = q.device().location();
        if *self.location.get_or_insert(here) != here {
            return Err(invalid(
                kind,
                "q",
                format!(
                    "the state lives on {:?}, {} does not",
                    self.location,
                    describe("q", q)
                ),
            ));
        }
        let spec = AttnProblem::new(self.family, dtype, b, hq, hkv, n, n, d)
            .with_head_dim_v(dv)
            .with_causal(Causal::BottomRight)
            .validate()
            .map_err(to_candle)?;
        let o = match q.device() {
            Device::Cpu => match dtype {
                DType::F32 => self.step::<f32>(&spec, q, k, v)?,
                DType::F16 => self.step::<half::f16>(&spec, q, k, v)?,
                DType::BF16 => self.step::<half::bf16>(&spec, q, k, v)?,
            },
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => cuda::step(&mut self.cuda_state, &spec, dev, q, k, v)?,
            other => {
                return Err(to_candle(AttnError::Unsupported {
                    op,
                    backend: "attn-candle",
                    what: format!("a TaylorCache step on {:?}", other.location()),
                }))
            }
        };
        self.lens.iter_mut().for_each(|l| *l += n);
        Ok(o)
    }

    fn lens(&self) -> &[usize] {
        &self.lens
    }
}
