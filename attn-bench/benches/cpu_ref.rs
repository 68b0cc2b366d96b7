//! Criterion bench of the CPU reference against the candle composite.
//!
//! attn-cpu-ref forward and forward+backward, softmax and Taylor order 2, B = 1, H = 8, D = 64,
//! f32, N ∈ {256, 1024, 4096}, side by side with `candle_naive` (matmul, softmax or the Taylor
//! polynomial, matmul; backward through candle autograd). Both go through the same runners as
//! `attn-bench run`, so the numbers agree with the CLI's. Before timing each N the bench prints the
//! peak resident memory of one call of each (O(N·D) for the reference, O(N²) for the composite).
//!
//! Sample counts are kept at criterion's minimum (10 samples, flat sampling, short warm-up), and
//! the default lengths are N ∈ {256, 1024}, so the whole bench finishes in minutes on two cores:
//! at N = 4096 one forward+backward of the f64 reference takes tens of seconds there.
//! `ATTN_BENCH_N=256,1024,4096` adds the longest length.
//!
//! The GPU launch-overhead bench is `benches/cuda_launch.rs` (feature `cuda`): a tiny attn-cuda
//! call timed end to end.

use attn_bench::grid::{FamilyId, GridPoint, PassKind};
use attn_bench::impls::{prepare, ImplId};
use attn_bench::machine::PeakMemory;
use attn_core::DType;
use criterion::{criterion_group, BenchmarkId, Criterion, SamplingMode};
use std::time::Duration;

fn lengths() -> Vec<usize> {
    std::env::var("ATTN_BENCH_N")
        .ok()
        .map(|s| {
            s.split(',')
                .filter_map(|n| n.trim().parse().ok())
                .collect::<Vec<usize>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| vec![256, 1024])
}

fn point(family: FamilyId, pass: PassKind, n: usize) -> GridPoint {
    GridPoint {
        family,
        dtype: DType::F32,
        pass,
        batch: 1,
        heads_q: 8,
        heads_kv: 8,
        seq_q: n,
        seq: n,
        head_dim: 64,
        causal: false,
        page_size: None,
    }
}

fn bench(c: &mut Criterion) {
    for family in [FamilyId::Softmax, FamilyId::Taylor2] {
        for pass in [PassKind::Fwd, PassKind::FwdBwd] {
            let mut group = c.benchmark_group(format!("{family}/{pass}"));
            group
                .sample_size(10)
                .sampling_mode(SamplingMode::Flat)
                .warm_up_time(Duration::from_millis(1))
                .measurement_time(Duration::from_secs(1));
            for n in lengths() {
                let p = point(family, pass, n);
                let spec = match p.spec() {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("{p}: {e}");
                        continue;
                    }
                };
                for id in [ImplId::AttnCpuRef, ImplId::CandleNaive] {
                    let mem = PeakMemory::start();
                    let mut runner = match prepare(id, &p, &spec, 0).and_then(|mut r| r.call().map(|()| r)) {
                        Ok(r) => r,
                        Err(e) => {
                            eprintln!("{id} {p}: skipped: {e}");
                            continue;
                        }
                    };
                    if let Some(mib) = mem.as_ref().and_then(PeakMemory::peak_mib) {
                        eprintln!("{id} {p}: peak memory of set-up and one call {mib:.1} MiB");
                    }
                    group.bench_function(BenchmarkId::new(id.label(), n), |b| {
                        b.iter(|| runner.call().expect("the call succeeded once during set-up"))
                    });
                }
            }
            group.finish();
        }
    }
}

criterion_group!(benches, bench);

fn main() {
    // criterion's HTML report draws its plots with plotters, which needs the compiled-in font.
    if let Err(e) = attn_bench::plots::register_font() {
        eprintln!("cpu_ref: criterion plots may fail: {e}");
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
