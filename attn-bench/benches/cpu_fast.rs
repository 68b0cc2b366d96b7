//! Criterion bench of the CPU fast path (`attn-cpu-fast`, what attn-candle runs on CPU tensors)
//! against candle's composite attention (`candle_naive`).
//!
//! - Prefill: softmax, B = 1, H = 8, D = 64 and 128, f32 and bf16, forward and forward+backward,
//!   N from `ATTN_BENCH_N` (default 512, 1024, 2048; the bars go to 8192).
//! - Decode: one query per head against Nk cached keys (B = 1, H = 8, D = 128, f32, forward), Nk
//!   from `ATTN_BENCH_DECODE_N` (default 4096, 16384, 32768).
//! - Taylor's recurrent decode (`decode/taylor{1,2}/{prefill,step}/f32/D64/Hkv{8,2}`): the prefill
//!   of a causal prompt of `ATTN_BENCH_TAYLOR_PROMPT` tokens (default 1024) and one step of one token
//!   after it, B = 1, Hq = 8, D = Dv = 64, f32, on the fast state (`attn-cpu-fast`) and the f64 one
//!   (`attn-cpu-ref`). Those points exist only here.
//!
//! Prefill and decode go through the runners of `attn-bench run`, so the numbers agree with the
//! CLI's. Before timing each of those points the bench prints the peak resident memory of set-up
//! and one call of each.
//! Sample counts are criterion's minimum (10 samples, flat sampling): minutes on two cores.

use attn_bench::grid::{FamilyId, GridPoint, PassKind};
use attn_bench::impls::{prepare, ImplId};
use attn_bench::machine::PeakMemory;
use attn_core::{AttnProblem, AttnSpec, Causal, DType, Family};
use attn_cpu_ref::fast::decode_taylor;
use attn_cpu_ref::testing::random_case;
use attn_cpu_ref::{decode, Inputs};
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

fn measure(c: &mut Criterion, name: &str, p: &GridPoint, spec: &AttnSpec, x: usize) {
    let mut g = group(c, name);
    for id in [ImplId::AttnCpuFast, ImplId::CandleNaive] {
        let mem = PeakMemory::start();
        let mut runner = match prepare(id, p, spec, 0).and_then(|mut r| r.call().map(|()| r)) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{id} {name} {x}: skipped: {e}");
                continue;
            }
        };
        if let Some(mib) = mem.as_ref().and_then(PeakMemory::peak_mib) {
            eprintln!("{id} {name} {x}: peak memory of set-up and one call {mib:.1} MiB");
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

/// A group with criterion's minimum sampling (10 samples, flat).
fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1));
    g
}

/// Taylor's recurrent decode: the prefill of a prompt of `n` tokens, then steps of one token, on
/// the fast state and the f64 one (B = 1, Hq = 8, D = Dv = 64, f32).
fn taylor_decode(c: &mut Criterion, order: u8, heads_kv: usize, n: usize) {
    let spec = |t: usize| {
        AttnProblem::new(Family::taylor(order), DType::F32, 1, 8, heads_kv, t, t, 64)
            .with_causal(Causal::BottomRight)
            .validate()
    };
    let (prompt, one) = match (spec(n), spec(1)) {
        (Ok(p), Ok(o)) => (p, o),
        (Err(e), _) | (_, Err(e)) => return eprintln!("taylor{order} decode: {e}"),
    };
    let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    let (pc, sc) = (random_case(&prompt, 1), random_case(&one, 2));
    let (pq, pk, pv) = (f32s(&pc.q), f32s(&pc.k), f32s(&pc.v));
    let (sq, sk, sv) = (f32s(&sc.q), f32s(&sc.k), f32s(&sc.v));
    let px = Inputs {
        q: &pq,
        k: &pk,
        v: &pv,
        bias: None,
    };
    let sx = Inputs {
        q: &sq,
        k: &sk,
        v: &sv,
        bias: None,
    };
    let name = |what: &str| format!("decode/taylor{order}/{what}/f32/D64/Hkv{heads_kv}");
    let mut g = group(c, &name("prefill"));
    g.bench_function(BenchmarkId::new("attn-cpu-fast", n), |b| {
        b.iter(|| decode_taylor::prefill(&prompt, px).expect("fast prefill"))
    });
    g.bench_function(BenchmarkId::new("attn-cpu-ref", n), |b| {
        b.iter(|| decode::prefill(&prompt, px).expect("f64 prefill"))
    });
    g.finish();
    let mut g = group(c, &name("step"));
    match decode_taylor::prefill(&prompt, px) {
        Ok((_, mut state)) => g.bench_function(BenchmarkId::new("attn-cpu-fast", n), |b| {
            b.iter(|| decode_taylor::step(&mut state, &one, sx).expect("fast step"))
        }),
        Err(e) => return eprintln!("{}: {e}", name("step")),
    };
    match decode::prefill(&prompt, px) {
        Ok((_, mut state)) => g.bench_function(BenchmarkId::new("attn-cpu-ref", n), |b| {
            b.iter(|| decode::step(&mut state, &one, sx).expect("f64 step"))
        }),
        Err(e) => return eprintln!("{}: {e}", name("step")),
    };
    g.finish();
}

fn bench_taylor_decode(c: &mut Criterion) {
    for n in env_list("ATTN_BENCH_TAYLOR_PROMPT", &[1024]) {
        for order in [2, 1] {
            for heads_kv in [8, 2] {
                taylor_decode(c, order, heads_kv, n);
            }
        }
    }
}

criterion_group!(benches, bench, bench_taylor_decode);

fn main() {
    // criterion's HTML report draws its plots with plotters, which needs the compiled-in font.
    if let Err(e) = attn_bench::plots::register_font() {
        eprintln!("cpu_fast: criterion plots may fail: {e}");
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
