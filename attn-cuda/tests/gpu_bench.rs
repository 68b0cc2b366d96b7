//! Kernel timings on attn-bench's benchmark grid (docs/performance.md), for iterating on the kernels:
//! `gpu_bench --bench [--out FILE.csv]` (the bundle of `cargo xtask gpu-bundle` carries it).
//! Without `--bench` it does nothing, so `cargo test` stays quick. attn-bench owns the reported
//! benchmark; this is the kernel author's stopwatch.
//!
//! Grid: bf16, 16k tokens per batch (B = 16384/N), hidden 2048 (H = 2048/D), D ∈ {64, 128},
//! N ∈ {4096, 16384}, causal and not; softmax, cosine-sim and hyperbolic (squared Lorentz and
//! geodesic, Euclidean aggregation, c = β = 1); forward and forward+backward. FLOPs: forward
//! 4·B·H·N²·D (halved when causal), forward+backward 3.5× that, for every family (the hyperbolic
//! scores' own arithmetic is not counted, so TFLOP/s compare directly). Each row after softmax's
//! also prints its throughput as a ratio to softmax's at the same point (issue 7's bars: squared
//! Lorentz ≥ 0.9, geodesic ≥ 0.5). Median of CUDA-event timings after warm-up. Plus one
//! long-sequence row (B = 1, H = 8, N = 131072, D = 128).
//!
//! Filters for profiling runs: `--families 0,1` (0 softmax, 1 cosine-sim, 2 squared Lorentz,
//! 3 geodesic), `--dims 64`, `--ns 16384`, `--no-long` (skips the long row).

mod common;

use attn_core::{Aggregation, AttnProblem, Causal, DType, Family, HypScore};
use common::bench::{forward, forward_backward, time_ms, BenchArgs, Bufs};
use std::collections::HashMap;

fn main() {
    let Some(args) = BenchArgs::parse("gpu_bench", "the kernels") else {
        return;
    };
    let g = args.gpu();
    let mut rows = vec!["family,d,n,causal,pass,ms,tflops,vs_softmax".to_string()];
    println!(
        "{:<22} {:>4} {:>6} {:>6} {:>8} {:>9} {:>8} {:>8}",
        "family", "D", "N", "causal", "pass", "ms", "TFLOP/s", "/softmax"
    );
    // Softmax's TFLOP/s per (D, N, causal, pass), for the ratios of the rows after it.
    let mut softmax_tf: HashMap<(usize, usize, bool, &str), f64> = HashMap::new();
    let families = args.list("--families", &[0, 1, 2, 3]);
    let dims = args.list("--dims", &[64, 128]);
    let ns = args.list("--ns", &[4096, 16384]);
    for (fi, (fname, family)) in [
        ("softmax", Family::softmax()),
        ("cosine_sim", Family::cosine_sim()),
        (
            "hyperbolic_sq_lorentz",
            Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean),
        ),
        (
            "hyperbolic_geodesic",
            Family::hyperbolic(HypScore::Geodesic, Aggregation::Euclidean),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        if !families.contains(&fi) {
            continue;
        }
        for &d in &dims {
            for &n in &ns {
                for causal in [false, true] {
                    let (b, h) = (16384 / n, 2048 / d);
                    let mut p = AttnProblem::new(family, DType::BF16, b, h, h, n, n, d);
                    if causal {
                        p = p.with_causal(Causal::BottomRight);
                    }
                    let spec = p.validate().expect("valid problem");
                    let mut bufs = Bufs::new(&g, &spec);
                    let flops =
                        4.0 * (b * h) as f64 * (n * n) as f64 * d as f64 * if causal { 0.5 } else { 1.0 };
                    let t_f = time_ms(&g, 3, 10, || forward(&g, &spec, &mut bufs));
                    let t_fb = time_ms(&g, 2, 6, || forward_backward(&g, &spec, &mut bufs));
                    for (pass, ms, fl) in [("fwd", t_f, flops), ("fwd_bwd", t_fb, 3.5 * flops)] {
                        let tf = fl / (ms * 1e-3) / 1e12;
                        let key = (d, n, causal, pass);
                        if fname == "softmax" {
                            softmax_tf.insert(key, tf);
                        }
                        let ratio = softmax_tf.get(&key).map(|s| tf / s).unwrap_or(f64::NAN);
                        println!(
                            "{fname:<22} {d:>4} {n:>6} {causal:>6} {pass:>8} {ms:>9.3} {tf:>8.1} {ratio:>8.2}"
                        );
                        rows.push(format!(
                            "{fname},{d},{n},{causal},{pass},{ms:.4},{tf:.2},{ratio:.3}"
                        ));
                    }
                }
            }
        }
    }
    if args.flag("--no-long") {
        args.write_csv(&rows);
        return;
    }
    // Long sequence: O(N) memory (naive attention would need B·H·N² scores).
    let spec = AttnProblem::new(Family::softmax(), DType::BF16, 1, 8, 8, 131_072, 131_072, 128)
        .with_causal(Causal::BottomRight)
        .validate()
        .expect("valid problem");
    let mut bufs = Bufs::new(&g, &spec);
    let ms = time_ms(&g, 1, 1, || forward_backward(&g, &spec, &mut bufs));
    let flops = 3.5 * 4.0 * 8.0 * (131_072f64 * 131_072f64) * 128.0 * 0.5;
    println!(
        "long: B=1 H=8 N=131072 D=128 causal fwd+bwd {ms:.1} ms ({:.1} TFLOP/s)",
        flops / (ms * 1e-3) / 1e12
    );
    rows.push(format!(
        "softmax,128,131072,true,fwd_bwd_long,{ms:.4},{:.2},1.000",
        flops / (ms * 1e-3) / 1e12
    ));
    args.write_csv(&rows);
}
