//! The stopwatch of the timing runs: bf16 buffers filled with a seeded xorshift draw, one forward or
//! backward call through the `AttnBackend` entry points, and the median of CUDA-event timings.

use attn_core::{AttnBackend, AttnSpec, BackwardIo, ForwardIo};
use attn_cuda::cudarc::driver::sys::CUevent_flags;
use attn_cuda::cudarc::driver::CudaSlice;
use attn_cuda::CudaAttn;
use half::bf16;

/// The bf16 buffers of one forward and backward call (`stats` is the LSE or the denominator).
pub struct Bufs {
    pub q: CudaSlice<bf16>,
    pub k: CudaSlice<bf16>,
    pub v: CudaSlice<bf16>,
    pub o: CudaSlice<bf16>,
    pub d_o: CudaSlice<bf16>,
    pub stats: CudaSlice<f32>,
    pub dq: CudaSlice<bf16>,
    pub dk: CudaSlice<bf16>,
    pub dv: CudaSlice<bf16>,
}

/// `n` values of a xorshift draw in (−1, 1), rounded to bf16.
pub fn random_bf16(n: usize, seed: u64) -> Vec<bf16> {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bf16::from_f32(((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
        })
        .collect()
}

impl Bufs {
    /// q, k, v and dO drawn with seeds 1 to 4; the outputs zeroed.
    pub fn new(g: &CudaAttn, spec: &AttnSpec) -> Self {
        let s = g.stream();
        let up = |n: usize, seed| s.clone_htod(&random_bf16(n, seed)).expect("upload");
        let zeros = |n: usize| s.alloc_zeros::<bf16>(n).expect("alloc");
        Self {
            q: up(spec.q_len(), 1),
            k: up(spec.k_len(), 2),
            v: up(spec.v_len(), 3),
            o: zeros(spec.o_len()),
            d_o: up(spec.o_len(), 4),
            stats: s.alloc_zeros::<f32>(spec.stats_len()).expect("alloc"),
            dq: zeros(spec.dq_len()),
            dk: zeros(spec.dk_len()),
            dv: zeros(spec.dv_len()),
        }
    }
}

pub fn forward(g: &CudaAttn, spec: &AttnSpec, b: &mut Bufs) {
    g.forward(
        spec,
        ForwardIo {
            q: &b.q,
            k: &b.k,
            v: &b.v,
            bias: None,
            o: &mut b.o,
            stats: &mut b.stats,
        },
    )
    .expect("forward");
}

pub fn backward(g: &CudaAttn, spec: &AttnSpec, b: &mut Bufs) {
    g.backward(
        spec,
        BackwardIo {
            q: &b.q,
            k: &b.k,
            v: &b.v,
            bias: None,
            o: &b.o,
            d_o: &b.d_o,
            stats: &b.stats,
            dq: &mut b.dq,
            dk: &mut b.dk,
            dv: &mut b.dv,
            dbias: None,
        },
    )
    .expect("backward");
}

/// Median milliseconds of `reps` runs of `f`, timed with CUDA events, after `warm` runs.
pub fn time_ms(g: &CudaAttn, warm: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    let s = g.stream();
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    for _ in 0..warm {
        f();
    }
    let mut ms: Vec<f64> = (0..reps)
        .map(|_| {
            let a = s.record_event(flags).expect("event");
            f();
            let b = s.record_event(flags).expect("event");
            b.synchronize().expect("sync");
            a.elapsed_ms(&b).expect("elapsed") as f64
        })
        .collect();
    ms.sort_by(|x, y| x.total_cmp(y));
    ms[ms.len() / 2]
}
