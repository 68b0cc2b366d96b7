//! `attn-cuda` as a benchmarked implementation (feature `cuda`): the fused kernels through the
//! `AttnBackend` entry points on `CudaSlice` buffers, exactly as a user calls them.
//!
//! Set-up allocates q, k, v, o and the f32 statistics (plus dO, dq, dk, dv for a pass with a
//! backward) on GPU 0 and fills the inputs with uniform values in (−1, 1); a backward-only pass
//! runs its forward once. Each [`Runner::call`] enqueues the pass on the kernels' stream; timing,
//! peak memory and the device's name come from [`crate::gpu`].
//!
//! Inputs are copied from one host draw of 2²⁵ values per dtype, made once per process; a tensor
//! longer than that repeats it, each tensor starting at its own offset. The values only have to
//! be realistic for the timing, and a fresh draw per point would cost more host time than the
//! kernels take on the FlashAttention grid.

use super::{Peak, Runner};
use crate::error::BenchError;
use crate::gpu::{self, gpu, DevicePeak, Gpu};
use crate::grid::GridPoint;
use crate::grid::PassKind;
use attn_core::{AttnBackend, AttnSpec, BackwardIo, DType, ForwardIo, KvCacheProblem, KvCacheSpec, KvLayout};
use attn_cuda::cudarc::driver::CudaSlice;
use attn_cuda::{DeviceElem, KvCacheIo, KvCacheWorkspace};
use half::{bf16, f16};
use std::sync::OnceLock;

/// Length of the host draw the inputs are copied from.
const POOL_LEN: usize = 1 << 25;

/// `n` values uniform in (−1, 1) from a xorshift64 stream.
fn draw(n: usize) -> impl Iterator<Item = f32> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n).map(move |_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    })
}

/// A storage type with its host draw.
trait PoolElem: DeviceElem {
    fn pool() -> &'static [Self];
}

macro_rules! pool_elem {
    ($t:ty, $from:expr) => {
        impl PoolElem for $t {
            fn pool() -> &'static [Self] {
                static POOL: OnceLock<Vec<$t>> = OnceLock::new();
                POOL.get_or_init(|| draw(POOL_LEN).map($from).collect())
            }
        }
    };
}
pool_elem!(f32, |x| x);
pool_elem!(f16, f16::from_f32);
pool_elem!(bf16, bf16::from_f32);

/// A device buffer of `n` elements filled from the host draw, starting at tensor `which`'s offset.
fn upload<T: PoolElem>(g: &Gpu, n: usize, which: usize, seed: u64) -> Result<CudaSlice<T>, BenchError> {
    let s = g.stream();
    let pool = T::pool();
    let len = pool.len();
    // SAFETY: every element is written by the copies below before the buffer is read.
    let mut dst = unsafe { s.alloc::<T>(n.max(1)) }?;
    let mut at = (which * len / 4 + (seed as usize).wrapping_mul(7919)) % len;
    let mut done = 0;
    while done < n {
        let take = (len - at).min(n - done);
        s.memcpy_htod(&pool[at..at + take], &mut dst.slice_mut(done..done + take))?;
        done += take;
        at = (at + take) % len;
    }
    Ok(dst)
}

struct Grads<T> {
    d_o: CudaSlice<T>,
    dq: CudaSlice<T>,
    dk: CudaSlice<T>,
    dv: CudaSlice<T>,
}

struct Bufs<T> {
    q: CudaSlice<T>,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    o: CudaSlice<T>,
    stats: CudaSlice<f32>,
    grads: Option<Grads<T>>,
}

/// The `Runner` methods every GPU runner shares (fields `gpu: &'static Gpu` and
/// `peak: DevicePeak`): CUDA-event timing on the kernels' stream, the pool's peak, the GPU's name.
macro_rules! on_the_gpu {
    () => {
        fn sync(&mut self) -> Result<(), BenchError> {
            Ok(self.gpu.stream().synchronize()?)
        }

        fn time(&mut self, runs: usize) -> Result<Vec<f64>, BenchError> {
            let g = self.gpu;
            gpu::time_events(g.stream(), runs, || self.call())
        }

        fn timer(&self) -> &'static str {
            "cuda_event"
        }

        fn peak(&mut self) -> Option<Peak> {
            self.peak.read().ok()
        }

        fn device(&self) -> Option<String> {
            Some(self.gpu.name.clone())
        }
    };
}

struct CudaRunner<T: PoolElem> {
    gpu: &'static Gpu,
    spec: AttnSpec,
    pass: PassKind,
    /// Taken (and freed) first when the runner drops, so the pool can be trimmed after.
    bufs: Option<Bufs<T>>,
    peak: DevicePeak,
}

fn forward<T: DeviceElem>(g: &Gpu, spec: &AttnSpec, b: &mut Bufs<T>) -> Result<(), BenchError> {
    g.attn.forward(
        spec,
        ForwardIo {
            q: &b.q,
            k: &b.k,
            v: &b.v,
            bias: None,
            o: &mut b.o,
            stats: &mut b.stats,
        },
    )?;
    Ok(())
}

fn backward<T: DeviceElem>(g: &Gpu, spec: &AttnSpec, b: &mut Bufs<T>) -> Result<(), BenchError> {
    let Some(gr) = b.grads.as_mut() else {
        return Err(BenchError::InvalidArgument {
            arg: "pass",
            reason: "a backward call on buffers set up for a forward-only pass".into(),
        });
    };
    g.attn.backward(
        spec,
        BackwardIo {
            q: &b.q,
            k: &b.k,
            v: &b.v,
            bias: None,
            o: &b.o,
            d_o: &gr.d_o,
            stats: &b.stats,
            dq: &mut gr.dq,
            dk: &mut gr.dk,
            dv: &mut gr.dv,
            dbias: None,
        },
    )?;
    Ok(())
}

impl<T: PoolElem> CudaRunner<T> {
    fn new(g: &'static Gpu, spec: &AttnSpec, pass: PassKind, seed: u64) -> Result<Self, BenchError> {
        let peak = DevicePeak::start(g.context())?;
        let s = g.stream();
        let grads = if pass.needs_backward() {
            Some(Grads {
                d_o: upload(g, spec.o_len(), 3, seed)?,
                dq: s.alloc_zeros::<T>(spec.dq_len().max(1))?,
                dk: s.alloc_zeros::<T>(spec.dk_len().max(1))?,
                dv: s.alloc_zeros::<T>(spec.dv_len().max(1))?,
            })
        } else {
            None
        };
        let mut bufs = Bufs {
            q: upload(g, spec.q_len(), 0, seed)?,
            k: upload(g, spec.k_len(), 1, seed)?,
            v: upload(g, spec.v_len(), 2, seed)?,
            o: s.alloc_zeros::<T>(spec.o_len().max(1))?,
            stats: s.alloc_zeros::<f32>(spec.stats_len().max(1))?,
            grads,
        };
        if pass == PassKind::Bwd {
            forward(g, spec, &mut bufs)?;
        }
        Ok(CudaRunner {
            gpu: g,
            spec: spec.clone(),
            pass,
            bufs: Some(bufs),
            peak,
        })
    }
}

impl<T: PoolElem> Runner for CudaRunner<T> {
    fn call(&mut self) -> Result<(), BenchError> {
        let Some(b) = self.bufs.as_mut() else {
            return Err(BenchError::InvalidArgument {
                arg: "runner",
                reason: "called after its buffers were released".into(),
            });
        };
        if self.pass != PassKind::Bwd {
            forward(self.gpu, &self.spec, b)?;
        }
        if self.pass.needs_backward() {
            backward(self.gpu, &self.spec, b)?;
        }
        Ok(())
    }

    on_the_gpu!();
}

impl<T: PoolElem> Drop for CudaRunner<T> {
    fn drop(&mut self) {
        drop(self.bufs.take());
        // Best effort: after a failed call the context may be unusable, and a pool that is not
        // trimmed only holds memory until the next point's trim.
        let _ = self.gpu.stream().synchronize();
        let _ = gpu::trim_pool(self.gpu.context());
    }
}

/// The GPU's name, or why attn-cuda cannot run here.
pub fn device_name() -> Result<String, String> {
    gpu().map(|g| g.name.clone())
}

pub(super) fn prepare(spec: &AttnSpec, pass: PassKind, seed: u64) -> Result<Box<dyn Runner>, BenchError> {
    let g = gpu().map_err(|reason| BenchError::Unavailable {
        implementation: "attn-cuda",
        reason,
    })?;
    Ok(match spec.dtype() {
        DType::F32 => Box::new(CudaRunner::<f32>::new(g, spec, pass, seed)?),
        DType::F16 => Box::new(CudaRunner::<f16>::new(g, spec, pass, seed)?),
        DType::BF16 => Box::new(CudaRunner::<bf16>::new(g, spec, pass, seed)?),
    })
}

/// A decode point on a paged cache: every sequence holds the point's `seq_k` keys in pages of
/// `page_size` slots, the pages of the pool handed out in a shuffled order (so the block table is
/// exercised, as in a serving engine after some churn), and each call is one
/// `CudaAttn::forward_kv_cache` step with no new tokens: the same attention as the contiguous row of
/// the point (`seq_q` queries, bottom-right causal, `seq_k` keys).
struct PagedRunner<T: PoolElem> {
    gpu: &'static Gpu,
    spec: KvCacheSpec,
    q: CudaSlice<T>,
    k_pages: CudaSlice<T>,
    v_pages: CudaSlice<T>,
    seqlens: CudaSlice<i32>,
    table: CudaSlice<i32>,
    o: CudaSlice<T>,
    lse: CudaSlice<f32>,
    ws: KvCacheWorkspace,
    peak: DevicePeak,
}

/// The paged step of `point` with pages of `page_size` slots.
fn paged_spec(point: &GridPoint, page_size: usize) -> Result<KvCacheSpec, BenchError> {
    let pages_per_seq = point.seq.div_ceil(page_size.max(1));
    let num_pages = pages_per_seq
        .checked_mul(point.batch)
        .ok_or_else(|| BenchError::InvalidArgument {
            arg: "page_size",
            reason: format!("{} sequences of {pages_per_seq} pages overflow", point.batch),
        })?;
    let layout = KvLayout::Paged {
        num_pages,
        page_size,
        pages_per_seq,
    };
    Ok(KvCacheProblem::new(
        point.family.family(),
        point.dtype,
        point.batch,
        point.heads_q,
        point.heads_kv,
        point.seq_q,
        point.head_dim,
        layout,
    )
    .with_new_tokens(0)
    .with_causal(point.causal)
    .validate()?)
}

/// A permutation of `0..n` from a seeded xorshift (Fisher–Yates).
fn shuffled(n: usize, seed: u64) -> Vec<i32> {
    let mut x = seed | 1;
    let mut p: Vec<i32> = (0..n as i32).collect();
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p.swap(i, (x % (i as u64 + 1)) as usize);
    }
    p
}

impl<T: PoolElem> PagedRunner<T> {
    fn new(g: &'static Gpu, point: &GridPoint, page_size: usize, seed: u64) -> Result<Self, BenchError> {
        let spec = paged_spec(point, page_size)?;
        let peak = DevicePeak::start(g.context())?;
        let s = g.stream();
        let a = spec.attend();
        let cache = KvCacheSpec::cache_shape(&spec, a.head_dim()).iter().product();
        let table_len = spec.block_table_shape().map_or(0, |[b, p]| b * p);
        let seqlens = vec![point.seq as i32; a.batch()];
        Ok(PagedRunner {
            gpu: g,
            q: upload(g, a.q_len(), 0, seed)?,
            k_pages: upload(g, cache, 1, seed)?,
            v_pages: upload(g, cache, 2, seed)?,
            seqlens: s.clone_htod(&seqlens)?,
            table: s.clone_htod(&shuffled(table_len, seed ^ 0x5EED))?,
            o: s.alloc_zeros::<T>(a.o_len().max(1))?,
            lse: s.alloc_zeros::<f32>(a.stats_len().max(1))?,
            ws: g.attn.kv_cache_workspace(&spec)?,
            spec,
            peak,
        })
    }
}

impl<T: PoolElem> Runner for PagedRunner<T> {
    fn call(&mut self) -> Result<(), BenchError> {
        let io = KvCacheIo {
            q: &self.q,
            k_cache: &mut self.k_pages,
            v_cache: &mut self.v_pages,
            k_new: None,
            v_new: None,
            cache_seqlens: &self.seqlens,
            block_table: Some(&self.table),
            o: &mut self.o,
            lse: &mut self.lse,
        };
        self.gpu.attn.forward_kv_cache(&self.spec, io, &mut self.ws)?;
        Ok(())
    }

    on_the_gpu!();
}

/// attn-cuda on a paged cache for a decode point (`CudaAttn::forward_kv_cache`).
pub(super) fn prepare_paged(
    point: &GridPoint,
    page_size: usize,
    seed: u64,
) -> Result<Box<dyn Runner>, BenchError> {
    let g = gpu().map_err(|reason| BenchError::Unavailable {
        implementation: "attn-cuda",
        reason,
    })?;
    Ok(match point.dtype {
        DType::F32 => Box::new(PagedRunner::<f32>::new(g, point, page_size, seed)?),
        DType::F16 => Box::new(PagedRunner::<f16>::new(g, point, page_size, seed)?),
        DType::BF16 => Box::new(PagedRunner::<bf16>::new(g, point, page_size, seed)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffled_is_a_permutation() {
        let mut p = shuffled(1000, 7);
        assert_ne!(p[..10], (0..10).collect::<Vec<i32>>()[..]);
        p.sort_unstable();
        assert_eq!(p, (0..1000).collect::<Vec<i32>>());
    }

    #[test]
    fn host_draw_is_uniform_in_the_open_interval() {
        let v: Vec<f32> = draw(1 << 16).collect();
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        // Uniform(−1, 1): mean 0, variance 1/3.
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var - 1.0 / 3.0).abs() < 0.01, "{var}");
    }
}
