//! Per-call overhead of the Candle op over calling the backend directly, at tiny sizes where the
//! attention itself costs little: checks, spec building, the custom-op plumbing and tensor
//! allocation.
//!
//! ```text
//! cargo run --release -p attn-candle --example overhead
//! cargo run --release -p attn-candle --features cuda --example overhead   # adds the GPU table
//! ```
//!
//! CPU: the median time per call (forward, and forward + backward through candle autograd) of
//! `attn_candle::attention` and of `attn_cpu_ref::{forward, backward}` on the same data.
//!
//! GPU (with the `cuda` feature and a GPU): the same op on CUDA tensors against
//! `attn_cuda::CudaAttn::{forward_views, backward_views}` on candle's own stream with
//! preallocated outputs, bf16. Two measures per call: latency (call, then synchronise; median)
//! and throughput (many calls, one synchronisation; mean). The overhead is op − direct: what the
//! op adds on the host (checks, spec, allocation of o and the statistics, candle's graph).

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
    cpu_table()?;
    #[cfg(feature = "cuda")]
    gpu::table()?;
    Ok(())
}

fn cpu_table() -> candle_core::Result<()> {
    let iters = 2000;
    println!("CPU (attn-cpu-ref), f32:");
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

#[cfg(feature = "cuda")]
mod gpu {
    //! The GPU table: see the crate docs.

    use super::median;
    use attn_candle::{attention, AttnOptions};
    use attn_core::{AttnProblem, AttnSpec, DType, Family};
    use attn_cuda::cudarc::driver::CudaSlice;
    use attn_cuda::{BackwardViews, CudaAttn, ForwardViews};
    use candle_core::{Device, Storage, Tensor, Var};
    use half::bf16;
    use std::time::Instant;

    /// Mean seconds per call of `f` over `iters` calls followed by one synchronisation.
    fn throughput(
        dev: &Device,
        iters: usize,
        mut f: impl FnMut() -> candle_core::Result<()>,
    ) -> candle_core::Result<f64> {
        f()?;
        dev.synchronize()?;
        let start = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        dev.synchronize()?;
        Ok(start.elapsed().as_secs_f64() / iters as f64)
    }

    fn slice(t: &Tensor) -> candle_core::Result<CudaSlice<bf16>> {
        let (s, l) = t.storage_and_layout();
        match &*s {
            Storage::Cuda(c) if l.is_contiguous() && l.start_offset() == 0 => {
                Ok(c.as_cuda_slice::<bf16>()?.clone())
            }
            _ => candle_core::bail!("expected a dense CUDA tensor"),
        }
    }

    /// Preallocated buffers for the direct calls.
    struct Direct {
        spec: AttnSpec,
        backend: CudaAttn,
        q: CudaSlice<bf16>,
        k: CudaSlice<bf16>,
        v: CudaSlice<bf16>,
        d_o: CudaSlice<bf16>,
        o: CudaSlice<bf16>,
        lse: CudaSlice<f32>,
        dq: CudaSlice<bf16>,
        dk: CudaSlice<bf16>,
        dv: CudaSlice<bf16>,
    }

    impl Direct {
        fn forward(&mut self) -> candle_core::Result<()> {
            self.backend
                .forward_views(
                    &self.spec,
                    ForwardViews {
                        q: self.q.slice(..),
                        k: self.k.slice(..),
                        v: self.v.slice(..),
                        bias: None,
                        o: self.o.slice_mut(..),
                        lse: self.lse.slice_mut(..),
                    },
                )
                .map_err(candle_core::Error::wrap)
        }

        fn backward(&mut self) -> candle_core::Result<()> {
            self.backend
                .backward_views(
                    &self.spec,
                    BackwardViews {
                        q: self.q.slice(..),
                        k: self.k.slice(..),
                        v: self.v.slice(..),
                        bias: None,
                        o: self.o.slice(..),
                        d_o: self.d_o.slice(..),
                        lse: self.lse.slice(..),
                        dq: self.dq.slice_mut(..),
                        dk: self.dk.slice_mut(..),
                        dv: self.dv.slice_mut(..),
                        dbias: None,
                    },
                )
                .map_err(candle_core::Error::wrap)
        }
    }

    pub fn table() -> candle_core::Result<()> {
        let dev = match Device::new_cuda(0) {
            Ok(d) => d,
            Err(e) => {
                let why = e.to_string();
                let why = why.lines().next().unwrap_or_default();
                println!("\nGPU table skipped: no CUDA device ({why})");
                return Ok(());
            }
        };
        let Device::Cuda(cuda) = &dev else {
            candle_core::bail!("Device::new_cuda returned another device")
        };
        let iters = 2000;
        println!("\nGPU (attn-cuda on candle's stream), bf16, softmax; µs per call:");
        println!(
            "| {:<16} | {:>9} | {:>9} | {:>8} | {:>9} | {:>9} | {:>8} | {:>9} | {:>9} | {:>8} |",
            "shape (B,N,H,D)",
            "lat dir",
            "lat op",
            "overhead",
            "thr dir",
            "thr op",
            "overhead",
            "f+b dir",
            "f+b op",
            "overhead"
        );
        println!(
            "|{:-<18}|{:->11}|{:->11}|{:->10}|{:->11}|{:->11}|{:->10}|{:->11}|{:->11}|{:->10}|",
            "", "", "", "", "", "", "", "", "", ""
        );
        for (b, n, h, d) in [(1, 16, 1, 64), (1, 64, 2, 64), (2, 128, 4, 64)] {
            let spec = AttnProblem::new(Family::softmax(), DType::BF16, b, h, h, n, n, d)
                .validate()
                .map_err(attn_candle::to_candle)?;
            let randn = |shape| Tensor::randn(0f32, 1.0, shape, &dev)?.to_dtype(candle_core::DType::BF16);
            let q = Var::from_tensor(&randn((b, n, h, d))?)?;
            let k = Var::from_tensor(&randn((b, n, h, d))?)?;
            let v = Var::from_tensor(&randn((b, n, h, d))?)?;
            let d_o = randn((b, n, h, d))?;
            let stream = cuda.cuda_stream();
            let alloc = |len: usize| stream.alloc_zeros::<bf16>(len).map_err(candle_core::Error::wrap);
            let mut direct = Direct {
                backend: CudaAttn::with_stream(stream.clone()),
                q: slice(q.as_tensor())?,
                k: slice(k.as_tensor())?,
                v: slice(v.as_tensor())?,
                d_o: slice(&d_o)?,
                o: alloc(spec.o_len())?,
                lse: stream
                    .alloc_zeros::<f32>(spec.stats_len())
                    .map_err(candle_core::Error::wrap)?,
                dq: alloc(spec.dq_len())?,
                dk: alloc(spec.dk_len())?,
                dv: alloc(spec.dv_len())?,
                spec,
            };
            let opts = AttnOptions::new(Family::softmax());
            let op = || attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), &opts);

            let lat_dir = median(iters, || {
                direct.forward()?;
                dev.synchronize()
            })?;
            let lat_op = median(iters, || {
                op()?;
                dev.synchronize()
            })?;
            let thr_dir = throughput(&dev, iters, || direct.forward())?;
            let thr_op = throughput(&dev, iters, || op().map(|_| ()))?;
            let both_dir = median(iters, || {
                direct.forward()?;
                direct.backward()?;
                dev.synchronize()
            })?;
            let both_op = median(iters, || {
                (op()? * &d_o)?.sum_all()?.backward()?;
                dev.synchronize()
            })?;
            let us = |s: f64| s * 1e6;
            println!(
                "| {:<16} | {:>9.1} | {:>9.1} | {:>8.1} | {:>9.1} | {:>9.1} | {:>8.1} | {:>9.1} | {:>9.1} | {:>8.1} |",
                format!("({b}, {n}, {h}, {d})"),
                us(lat_dir),
                us(lat_op),
                us(lat_op - lat_dir),
                us(thr_dir),
                us(thr_op),
                us(thr_op - thr_dir),
                us(both_dir),
                us(both_op),
                us(both_op - both_dir)
            );
        }
        println!(
            "\nlat = call + synchronise (median); thr = {iters} calls, one synchronisation (mean); \
             f+b op includes candle's product-sum loss and its backward"
        );
        Ok(())
    }
}
