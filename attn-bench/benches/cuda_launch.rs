//! Per-call launch overhead of attn-cuda at sizes where the kernels themselves take microseconds:
//! B = 1, H = 1, D = 64, N ∈ {64, 128}, bf16, every family, forward and backward.
//!
//! Two numbers per case, both through `AttnBackend::forward` / `backward` exactly as a user calls
//! them (argument checks, dispatch, scratch allocation, launches):
//! - `pipelined`: calls enqueued back to back with one synchronisation per criterion batch, so the
//!   time per call is the steady cost of issuing one (host launch path or device time, whichever is
//!   larger);
//! - `synced`: each call followed by a stream synchronisation, the latency of an isolated call.
//!
//! A family or head dim without a kernel prints attn-cuda's reason and is left out. Without a GPU
//! (or without kernels in the build) the bench prints why it skipped and exits successfully.
//! `cargo bench -p attn-bench --features cuda --bench cuda_launch`; the GPU bundle runs the built
//! binary as `cuda_launch --bench`.

use attn_bench::grid::{FamilyId, GridPoint, PassKind};
use attn_bench::impls::{cuda_device, prepare, ImplId, Runner};
use attn_core::DType;
use criterion::{BenchmarkId, Criterion};
use std::time::{Duration, Instant};

fn point(family: FamilyId, pass: PassKind, n: usize) -> GridPoint {
    GridPoint {
        family,
        dtype: DType::BF16,
        pass,
        batch: 1,
        heads_q: 1,
        heads_kv: 1,
        seq_q: n,
        seq: n,
        head_dim: 64,
        causal: false,
        page_size: None,
    }
}

/// A runner for the case, or why it cannot run (printed once, the case left out).
fn runner(p: &GridPoint) -> Option<Box<dyn Runner>> {
    let spec = match p.spec() {
        Ok(s) => s,
        Err(e) => {
            println!("cuda_launch: {p}: skipped: {e}");
            return None;
        }
    };
    let mut r = match prepare(ImplId::AttnCuda, p, &spec, 0) {
        Ok(r) => r,
        Err(e) => {
            println!("cuda_launch: {p}: skipped: {e}");
            return None;
        }
    };
    // One synchronised call up front: an unsupported family fails here, and modules get loaded.
    match r.call().and_then(|()| r.sync()) {
        Ok(()) => Some(r),
        Err(e) => {
            println!("cuda_launch: {p}: skipped: {e}");
            None
        }
    }
}

fn bench(c: &mut Criterion) {
    for family in FamilyId::ALL {
        // `bwd` times the backward alone, from a forward made at set-up.
        for pass in [PassKind::Fwd, PassKind::Bwd] {
            let mut group = c.benchmark_group(format!("attn-cuda/{family}/{pass}"));
            for n in [64usize, 128] {
                let p = point(family, pass, n);
                let Some(mut r) = runner(&p) else { continue };
                group.bench_function(BenchmarkId::new("pipelined", n), |b| {
                    b.iter_custom(|iters| {
                        let t = Instant::now();
                        for _ in 0..iters {
                            r.call().expect("a call that succeeded at set-up");
                        }
                        r.sync().expect("synchronise");
                        t.elapsed()
                    })
                });
                group.bench_function(BenchmarkId::new("synced", n), |b| {
                    b.iter(|| {
                        r.call().expect("a call that succeeded at set-up");
                        r.sync().expect("synchronise");
                    })
                });
            }
            group.finish();
        }
    }
}

fn main() {
    // criterion's HTML report draws its plots with plotters, which needs the compiled-in font.
    if let Err(e) = attn_bench::plots::register_font() {
        eprintln!("cuda_launch: criterion plots may fail: {e}");
    }
    if let Err(reason) = cuda_device() {
        println!("cuda_launch: skipped, no GPU run: {reason}");
        return;
    }
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(700))
        .configure_from_args();
    bench(&mut c);
    c.final_summary();
}
