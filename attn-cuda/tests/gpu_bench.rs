//! Kernel timings on the benchmark grid of BENCHMARKS.md, for iterating on the kernels:
//! `gpu_bench --bench [--out FILE.csv]` (the bundle of `cargo xtask gpu-bundle` carries it).
//! Without `--bench` it does nothing, so `cargo test` stays quick. attn-bench owns the reported
//! benchmark; this is the kernel author's stopwatch.
//!
//! Grid: bf16, 16k tokens per batch (B = 16384/N), hidden 2048 (H = 2048/D), D ∈ {64, 128},
//! N ∈ {4096, 16384}, causal and not; softmax and cosine-sim; forward and forward+backward.
//! FLOPs: forward 4·B·H·N²·D (halved when causal), forward+backward 3.5× that. Median of CUDA-event
//! timings after warm-up. Plus one long-sequence row (B = 1, H = 8, N = 131072, D = 128).

use attn_core::{AttnBackend, AttnProblem, AttnSpec, BackwardIo, Causal, DType, Family, ForwardIo};
use attn_cuda::cudarc::driver::CudaSlice;
use attn_cuda::CudaAttn;
use half::bf16;
use std::io::Write;

struct Bufs {
    q: CudaSlice<bf16>,
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    o: CudaSlice<bf16>,
    d_o: CudaSlice<bf16>,
    lse: CudaSlice<f32>,
    dq: CudaSlice<bf16>,
    dk: CudaSlice<bf16>,
    dv: CudaSlice<bf16>,
}

fn random(n: usize, seed: u64) -> Vec<bf16> {
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

fn alloc(g: &CudaAttn, spec: &AttnSpec) -> Bufs {
    let s = g.stream();
    let up = |n: usize, seed| s.clone_htod(&random(n, seed)).expect("upload");
    Bufs {
        q: up(spec.q_len(), 1),
        k: up(spec.k_len(), 2),
        v: up(spec.v_len(), 3),
        o: s.alloc_zeros(spec.o_len()).expect("alloc"),
        d_o: up(spec.o_len(), 4),
        lse: s.alloc_zeros(spec.stats_len()).expect("alloc"),
        dq: s.alloc_zeros(spec.dq_len()).expect("alloc"),
        dk: s.alloc_zeros(spec.dk_len()).expect("alloc"),
        dv: s.alloc_zeros(spec.dv_len()).expect("alloc"),
    }
}

fn fwd(g: &CudaAttn, spec: &AttnSpec, b: &mut Bufs) {
    g.forward(
        spec,
        ForwardIo {
            q: &b.q,
            k: &b.k,
            v: &b.v,
            bias: None,
            o: &mut b.o,
            stats: &mut b.lse,
        },
    )
    .expect("forward");
}

fn bwd(g: &CudaAttn, spec: &AttnSpec, b: &mut Bufs) {
    g.backward(
        spec,
        BackwardIo {
            q: &b.q,
            k: &b.k,
            v: &b.v,
            bias: None,
            o: &b.o,
            d_o: &b.d_o,
            stats: &b.lse,
            dq: &mut b.dq,
            dk: &mut b.dk,
            dv: &mut b.dv,
            dbias: None,
        },
    )
    .expect("backward");
}

/// Median milliseconds of `reps` runs of `f`, timed with CUDA events, after `warm` runs.
fn time(g: &CudaAttn, warm: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    let s = g.stream();
    let flags = Some(attn_cuda::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        println!("gpu_bench: pass --bench to time the kernels on a GPU (nothing to do otherwise)");
        return;
    }
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let g = match CudaAttn::new(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("gpu_bench: {e}");
            std::process::exit(1);
        }
    };
    let mut rows = vec!["family,d,n,causal,pass,ms,tflops".to_string()];
    println!(
        "{:<11} {:>4} {:>6} {:>6} {:>8} {:>9} {:>8}",
        "family", "D", "N", "causal", "pass", "ms", "TFLOP/s"
    );
    for (fname, family) in [
        ("softmax", Family::softmax()),
        ("cosine_sim", Family::cosine_sim()),
    ] {
        for d in [64, 128] {
            for n in [4096, 16384] {
                for causal in [false, true] {
                    let (b, h) = (16384 / n, 2048 / d);
                    let mut p = AttnProblem::new(family, DType::BF16, b, h, h, n, n, d);
                    if causal {
                        p = p.with_causal(Causal::BottomRight);
                    }
                    let spec = p.validate().expect("valid problem");
                    let mut bufs = alloc(&g, &spec);
                    let flops =
                        4.0 * (b * h) as f64 * (n * n) as f64 * d as f64 * if causal { 0.5 } else { 1.0 };
                    let t_f = time(&g, 3, 10, || fwd(&g, &spec, &mut bufs));
                    let t_fb = time(&g, 2, 6, || {
                        fwd(&g, &spec, &mut bufs);
                        bwd(&g, &spec, &mut bufs);
                    });
                    for (pass, ms, fl) in [("fwd", t_f, flops), ("fwd_bwd", t_fb, 3.5 * flops)] {
                        let tf = fl / (ms * 1e-3) / 1e12;
                        println!("{fname:<11} {d:>4} {n:>6} {causal:>6} {pass:>8} {ms:>9.3} {tf:>8.1}");
                        rows.push(format!("{fname},{d},{n},{causal},{pass},{ms:.4},{tf:.2}"));
                    }
                }
            }
        }
    }
    // Long sequence: O(N) memory (naive attention would need B·H·N² scores).
    let spec = AttnProblem::new(Family::softmax(), DType::BF16, 1, 8, 8, 131_072, 131_072, 128)
        .with_causal(Causal::BottomRight)
        .validate()
        .expect("valid problem");
    let mut bufs = alloc(&g, &spec);
    let ms = time(&g, 1, 1, || {
        fwd(&g, &spec, &mut bufs);
        bwd(&g, &spec, &mut bufs);
    });
    let flops = 3.5 * 4.0 * 8.0 * (131_072f64 * 131_072f64) * 128.0 * 0.5;
    println!(
        "long: B=1 H=8 N=131072 D=128 causal fwd+bwd {ms:.1} ms ({:.1} TFLOP/s)",
        flops / (ms * 1e-3) / 1e12
    );
    rows.push(format!(
        "softmax,128,131072,true,fwd_bwd_long,{ms:.4},{:.2}",
        flops / (ms * 1e-3) / 1e12
    ));
    if let Some(path) = out {
        let mut f = std::fs::File::create(&path).expect("create csv");
        writeln!(f, "{}", rows.join("\n")).expect("write csv");
    }
}
