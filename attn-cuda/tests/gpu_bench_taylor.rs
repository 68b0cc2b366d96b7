//! Taylor kernel timings, for iterating on the kernels: `gpu_bench_taylor --bench [--out FILE.csv]
//! [--orders 1,2] [--dims 64,128] [--max-n 65536] [--ns 4096,16384] [--causal 0,1] [--l2norm 1]` (the
//! bundle of `cargo xtask gpu-bundle` carries it).
//! Without `--bench` it does nothing, so `cargo test` stays quick. attn-bench owns the reported
//! benchmark; this is the kernel author's stopwatch.
//!
//! Grid: bf16, orders 1 and 2, D ∈ {64, 128}, N from 1024 to 65536 (B = 16384/N, at least 1; H = 2048/D),
//! causal (bottom-right) and not, forward and forward+backward. Median of CUDA-event timings after
//! warm-up. Columns: for order 1 the HBM traffic of the ideal kernel (forward: q, k, v read and o
//! written once; backward: q, k, v, o, dO read and dq, dk, dv written) over the time, in TB/s and in %
//! of the 3.0 TB/s the H100 reaches on a copy; for order 2 TFLOP/s of the factorised product
//! (forward `4·N·F·M` per head with F = 1 + D + D(D+1)/2 features and M = D + 1 columns, backward 3×
//! that). Every output is checked finite after its timing.

mod common;

use attn_core::{AttnProblem, Causal, DType, Family};
use common::bench::{all_finite, forward, forward_backward, time_ms, BenchArgs, Bufs};
use common::taylor_family;

/// The H100's measured device-to-device copy bandwidth (3.0 TB/s), the 100% of the order-1 column.
const HBM_BYTES_PER_S: f64 = 3.0e12;

fn main() {
    let Some(args) = BenchArgs::parse("gpu_bench_taylor", "the Taylor kernels") else {
        return;
    };
    let orders = args.list("--orders", &[1, 2]);
    let dims = args.list("--dims", &[64, 128]);
    let max_n = args.list("--max-n", &[65_536])[0];
    let all_n: Vec<usize> = (10..=16).map(|e| 1usize << e).collect();
    let ns = args.list("--ns", &all_n);
    let causals = args.list("--causal", &[0, 1]);
    // Order 1's qk_l2norm (1: the tests' family; 0: attn-bench's, `Family::taylor(1)`'s coefficients).
    let l2norm = args.list("--l2norm", &[1])[0] != 0;
    let g = args.gpu();
    let mut rows = vec!["order,d,n,b,h,causal,pass,ms,tb_per_s,hbm_pct,tflops,finite".to_string()];
    println!(
        "{:>5} {:>4} {:>6} {:>3} {:>3} {:>6} {:>8} {:>10} {:>7} {:>6} {:>8} {:>6}",
        "order", "D", "N", "B", "H", "causal", "pass", "ms", "TB/s", "HBM%", "TFLOP/s", "finite"
    );
    for &order in &orders {
        for &d in &dims {
            for n in ns.iter().copied().filter(|&n| n <= max_n) {
                for causal in causals.iter().map(|&c| c != 0) {
                    let (b, h) = ((16_384 / n).max(1), 2048 / d);
                    let fam = if order == 1 && !l2norm {
                        Family::taylor(1)
                    } else {
                        taylor_family(order as u8)
                    };
                    let mut p = AttnProblem::new(fam, DType::BF16, b, h, h, n, n, d);
                    if causal {
                        p = p.with_causal(Causal::BottomRight);
                    }
                    let spec = p.validate().expect("valid problem");
                    let mut bufs = Bufs::new(&g, &spec);
                    let long = n >= 32_768;
                    let t_f = time_ms(&g, 2, if long { 3 } else { 7 }, || forward(&g, &spec, &mut bufs));
                    let ok_f = all_finite(&g, &bufs.o);
                    let t_fb = time_ms(&g, 1, if long { 2 } else { 5 }, || {
                        forward_backward(&g, &spec, &mut bufs)
                    });
                    let ok_fb = ok_f
                        && all_finite(&g, &bufs.dq)
                        && all_finite(&g, &bufs.dk)
                        && all_finite(&g, &bufs.dv);
                    let tensor = (b * h * n * d * 2) as f64; // bytes of one bf16 [B, N, H, D] tensor
                    let (f, m) = ((1 + d + d * (d + 1) / 2) as f64, (d + 1) as f64);
                    let flops = 4.0 * (b * h * n) as f64 * f * m;
                    for (pass, ms, bytes, fl, ok) in [
                        ("fwd", t_f, 4.0 * tensor, flops, ok_f),
                        ("fwd_bwd", t_fb, 12.0 * tensor, 4.0 * flops, ok_fb),
                    ] {
                        let tbs = bytes / (ms * 1e-3) / 1e12;
                        let pct = 100.0 * bytes / (ms * 1e-3) / HBM_BYTES_PER_S;
                        let tf = fl / (ms * 1e-3) / 1e12;
                        let (tbs_s, pct_s, tf_s) = if order == 1 {
                            (format!("{tbs:.3}"), format!("{pct:.1}"), "-".to_string())
                        } else {
                            ("-".to_string(), "-".to_string(), format!("{tf:.1}"))
                        };
                        println!(
                            "{order:>5} {d:>4} {n:>6} {b:>3} {h:>3} {causal:>6} {pass:>8} {ms:>10.3} {tbs_s:>7} {pct_s:>6} {tf_s:>8} {ok:>6}"
                        );
                        rows.push(format!(
                            "{order},{d},{n},{b},{h},{causal},{pass},{ms:.4},{tbs:.4},{pct:.2},{tf:.2},{ok}"
                        ));
                    }
                }
            }
        }
    }
    args.write_csv(&rows);
}
