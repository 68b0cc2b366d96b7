//! The stopwatch of the timing runs: bf16 buffers filled with a seeded xorshift draw, one forward or
//! backward call through the `AttnBackend` entry points, the median of CUDA-event timings, and the
//! command line of the timing binaries.

use attn_core::{AttnBackend, AttnSpec, BackwardIo, ForwardIo};
use attn_cuda::cudarc::driver::sys::CUevent_flags;
use attn_cuda::cudarc::driver::CudaSlice;
use attn_cuda::CudaAttn;
use half::bf16;
use std::io::Write;

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

/// One forward and one backward call.
pub fn forward_backward(g: &CudaAttn, spec: &AttnSpec, b: &mut Bufs) {
    forward(g, spec, b);
    backward(g, spec, b);
}

/// Whether every element of `x` is finite.
pub fn all_finite(g: &CudaAttn, x: &CudaSlice<bf16>) -> bool {
    let v: Vec<bf16> = g.stream().clone_dtoh(x).expect("download");
    v.iter().all(|x| x.is_finite())
}

/// The command line of a timing binary: `NAME --bench [--out FILE.csv] [its own flags]`.
pub struct BenchArgs {
    name: &'static str,
    args: Vec<String>,
}

impl BenchArgs {
    /// The process's arguments; `None`, after saying so, without `--bench` (so that `cargo test`,
    /// which runs the binary, stays quick). `what` names what it times.
    pub fn parse(name: &'static str, what: &str) -> Option<Self> {
        let args: Vec<String> = std::env::args().collect();
        if !args.iter().any(|a| a == "--bench") {
            println!("{name}: pass --bench to time {what} on a GPU (nothing to do otherwise)");
            return None;
        }
        Some(Self { name, args })
    }

    /// The value after `flag`.
    pub fn value(&self, flag: &str) -> Option<&str> {
        let i = self.args.iter().position(|a| a == flag)?;
        self.args.get(i + 1).map(String::as_str)
    }

    /// Whether `flag` was passed.
    pub fn flag(&self, flag: &str) -> bool {
        self.args.iter().any(|a| a == flag)
    }

    /// The comma-separated values after `flag`, or `default`.
    pub fn list(&self, flag: &str, default: &[usize]) -> Vec<usize> {
        self.value(flag)
            .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_else(|| default.to_vec())
    }

    /// GPU 0; without one, the error and exit status 1.
    pub fn gpu(&self) -> CudaAttn {
        CudaAttn::new(0).unwrap_or_else(|e| {
            eprintln!("{}: {e}", self.name);
            std::process::exit(1)
        })
    }

    /// The CSV `rows` (header first) into the `--out` file, when one is given.
    pub fn write_csv(&self, rows: &[String]) {
        if let Some(path) = self.value("--out") {
            let mut f = std::fs::File::create(path).expect("create csv");
            writeln!(f, "{}", rows.join("\n")).expect("write csv");
        }
    }
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
