//! Criterion bench of the CPU fast path (`attn-cpu-fast`, what attn-candle runs on CPU tensors)
//! against candle's composite attention (`candle_naive`).
//!
//! - Prefill: softmax, B = 1, H = 8, D = 64 and 128, f32 and bf16, forward and forward+backward,
//!   N from `ATTN_BENCH_N` (default 512, 1024, 2048; the bars go to 8192).
//! - Decode: one query per head against Nk cached keys (B = 1, H = 8, D = 128, f32, forward), Nk
//!   from `ATTN_BENCH_DECODE_N` (default 4096, 16384, 32768).
//!
//! Both go through the runners of `attn-bench run`, so the numbers agree with the CLI's. Before
//! timing each point the bench prints the peak resident memory of set-up and one call of each.
//! Sample counts are criterion's minimum (10 samples, flat sampling): minutes on two cores.

use attn_bench::grid::{FamilyId, GridPoint, PassKind};
use attn_bench::impls::{prepare, ImplId};
use attn_bench::machine::PeakMemory;
use attn_core::{AttnProblem, AttnSpec, DType, Family};
use criterion::{criterion_group, BenchmarkId, Criterion, SamplingMode};
use std::time::Duration;

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|s| {
            s.split(',')
                .filter_map(|n| n.trim().parse().ok())
                .collect::<Vec<usize>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_vec())
}

fn point(pass: PassKind, dtype: DType, n: usize, d: usize) -> GridPoint {
    GridPoint {
        family: FamilyId::Softmax,
        dtype,
        pass,
        batch: 1,
        heads_q: 8,
        heads_kv: 8,
        seq_q: n,
        seq: n,
        head_dim: d,
        causal: false,
        page_size: None,
    }
}

fn measure(c: &mut Criterion, group: &str, p: &GridPoint, spec: &AttnSpec, x: usize) {
    let mut g = c.benchmark_group(group);
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1));
    for id in [ImplId::AttnCpuFast, ImplId::CandleNaive] {
        let mem = PeakMemory::start();
        let mut runner = match prepare(id, p, spec, 0).and_then(|mut r| r.call().map(|()| r)) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{id} {group} {x}: skipped: {e}");
                continue;
            }
        };
        if let Some(mib) = mem.as_ref().and_then(PeakMemory::peak_mib) {
            eprintln!("{id} {group} {x}: peak memory of set-up and one call {mib:.1} MiB");
        }
        g.bench_function(BenchmarkId::new(id.label(), x), |b| {
            b.iter(|| runner.call().expect("the call succeeded once during set-up"))
        });
    }
    g.finish();
}

fn bench(c: &mut Criterion) {
    for dtype in [DType::F32, DType::BF16] {
        for d in [64, 128] {
            for pass in [PassKind::Fwd, PassKind::FwdBwd] {
                for n in env_list("ATTN_BENCH_N", &[512, 1024, 2048]) {
                    let p = point(pass, dtype, n, d);
                    match p.spec() {
                        Ok(spec) => measure(c, &format!("softmax/{pass}/{dtype}/D{d}"), &p, &spec, n),
                        Err(e) => eprintln!("{p}: {e}"),
                    }
                }
            }
        }
    }
    for nk in env_list("ATTN_BENCH_DECODE_N", &[4096, 16384, 32768]) {
        let p = point(PassKind::Fwd, DType::F32, nk, 128);
        match AttnProblem::new(Family::softmax(), DType::F32, 1, 8, 8, 1, nk, 128).validate() {
            Ok(spec) => measure(c, "decode/softmax/fwd/f32/D128", &p, &spec, nk),
            Err(e) => eprintln!("decode Nk={nk}: {e}"),
        }
    }
}

criterion_group!(benches, bench);

fn main() {
    // criterion's HTML report draws its plots with plotters, which needs the compiled-in font.
    if let Err(e) = attn_bench::plots::register_font() {
        eprintln!("cpu_fast: criterion plots may fail: {e}");
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
