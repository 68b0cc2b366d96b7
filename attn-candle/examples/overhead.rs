//! Per-call overhead of the Candle op over calling the backend directly, at tiny sizes where the
//! attention itself costs little: checks, spec building, the custom-op plumbing and tensor
//! allocation.
//!
//! ```text
//! cargo run --release -p attn-candle --example overhead
//! ```
//!
//! Prints the median time per call (forward, and forward + backward through candle autograd) of
//! `attn_candle::attention` and of `attn_cpu_ref::{forward, backward}` on the same data.

use attn_candle::{attention, AttnOptions};
use attn_core::{AttnProblem, DType, Family};
use attn_cpu_ref::Inputs;
use candle_core::{Device, Tensor, Var};
use std::time::Instant;

/// Median seconds of `f` over `iters` calls (after a warm-up tenth).
fn median(iters: usize, mut f: impl FnMut() -> candle_core::Result<()>) -> candle_core::Result<f64> {
    for _ in 0..iters / 10 {
        f()?;
    }
    let mut t = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[iters / 2])
}

fn main() -> candle_core::Result<()> {
    let iters = 2000;
    println!(
        "| {:<20} | {:>12} | {:>12} | {:>9} | {:>12} | {:>12} | {:>9} |",
        "shape (B,N,H,D)", "ref fwd µs", "op fwd µs", "overhead", "ref f+b µs", "op f+b µs", "overhead"
    );
    println!(
        "|{:-<22}|{:->14}|{:->14}|{:->11}|{:->14}|{:->14}|{:->11}|",
        "", "", "", "", "", "", ""
    );
    for (b, n, h, d) in [(1, 1, 1, 8), (1, 8, 1, 16), (1, 16, 2, 32), (2, 32, 2, 32)] {
        let spec = AttnProblem::new(Family::softmax(), DType::F32, b, h, h, n, n, d)
            .validate()
            .map_err(attn_candle::to_candle)?;
        let dev = Device::Cpu;
        let q = Var::randn(0f32, 1.0, (b, n, h, d), &dev)?;
        let k = Var::randn(0f32, 1.0, (b, n, h, d), &dev)?;
        let v = Var::randn(0f32, 1.0, (b, n, h, d), &dev)?;
        let d_o = Tensor::randn(0f32, 1.0, (b, n, h, d), &dev)?;
        let host = |t: &Tensor| t.flatten_all()?.to_vec1::<f32>();
        let (qh, kh, vh, gh) = (host(&q)?, host(&k)?, host(&v)?, host(&d_o)?);
        let x = Inputs {
            q: &qh,
            k: &kh,
            v: &vh,
            bias: None,
        };
        let opts = AttnOptions::new(Family::softmax());

        let ref_fwd = median(iters, || {
            attn_cpu_ref::forward::<f32>(&spec, x).map_err(attn_candle::to_candle)?;
            Ok(())
        })?;
        let op_fwd = median(iters, || {
            attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), &opts)?;
            Ok(())
        })?;
        let ref_both = median(iters, || {
            let f = attn_cpu_ref::forward::<f32>(&spec, x).map_err(attn_candle::to_candle)?;
            attn_cpu_ref::backward::<f32>(&spec, x, &f.o, &gh, &f.stats).map_err(attn_candle::to_candle)?;
            Ok(())
        })?;
        let op_both = median(iters, || {
            let o = attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), &opts)?;
            (o * &d_o)?.sum_all()?.backward()?;
            Ok(())
        })?;
        let us = |s: f64| s * 1e6;
        println!(
            "| {:<20} | {:>12.1} | {:>12.1} | {:>9.1} | {:>12.1} | {:>12.1} | {:>9.1} |",
            format!("({b}, {n}, {h}, {d})"),
            us(ref_fwd),
            us(op_fwd),
            us(op_fwd - ref_fwd),
            us(ref_both),
            us(op_both),
            us(op_both - ref_both)
        );
    }
    println!(
        "\noverhead = op − ref (µs per call; fwd+bwd includes candle's product-sum loss and its backward)"
    );
    Ok(())
}
