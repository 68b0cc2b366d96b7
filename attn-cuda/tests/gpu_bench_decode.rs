//! Decode stopwatch (issue 43's shapes): `gpu_bench_decode --bench [--out FILE.csv] [--reps N]`.
//! Without `--bench` it does nothing, so `cargo test` stays quick; attn-bench owns the reported
//! benchmark, this is the kernel author's stopwatch.
//!
//! For each (B, Hq, Hkv, Nq, T, D), bf16, bottom-right causal: the forward on the decode kernels
//! (KernelConfig::decode = Everywhere; bulk copies, and cp.async with KernelConfig::hopper off) and on
//! the flash kernels (decode Off), all on dense
//! [B, T, Hkv, D] keys; then KV-cache steps of one new token against a contiguous cache and paged
//! caches of 16- and 256-slot pages holding T keys. Each row: median µs of CUDA-event timings,
//! the K/V bytes read once (2·B·T·Hkv·D·2) over the time in GB/s, and that as a % of the device's
//! copy bandwidth, measured first (a 1 GiB device-to-device copy, read + write bytes). At B = 1,
//! Nq = 1 the decode path is also timed at forced split counts 8 … 128 (KernelConfig::decode_splits).

mod common;

use attn_core::{AttnProblem, Causal, DType, Family, KvCacheProblem, KvLayout};
use attn_cuda::cudarc::driver::CudaSlice;
use attn_cuda::{CudaAttn, KernelConfig, KvCacheIo, Route};
use common::bench::{forward, random_bf16, time_ms, BenchArgs, Bufs};
use half::bf16;

fn main() {
    let Some(args) = BenchArgs::parse("gpu_bench_decode", "the decode kernels") else {
        return;
    };
    let base = args.gpu();
    let s = base.stream().clone();
    let reps = args.list("--reps", &[20])[0].max(1);
    let cfg = |decode, splits| KernelConfig {
        decode,
        decode_splits: splits,
        ..KernelConfig::default()
    };
    let on = CudaAttn::with_config(s.clone(), cfg(Route::Everywhere, None)).expect("config");
    let off = CudaAttn::with_config(s.clone(), cfg(Route::Off, None)).expect("config");
    // The cp.async loads (KernelConfig::hopper off) against the default bulk copies.
    let cp_async = CudaAttn::with_config(
        s.clone(),
        KernelConfig {
            hopper: false,
            ..cfg(Route::Everywhere, None)
        },
    )
    .expect("config");

    // Copy bandwidth: 1 GiB device to device, read + write bytes.
    let n = 1usize << 29; // bf16 elements = 1 GiB
    let src: CudaSlice<bf16> = s.alloc_zeros(n).expect("alloc");
    let mut dst: CudaSlice<bf16> = s.alloc_zeros(n).expect("alloc");
    let t_copy = time_ms(&base, 3, 10, || s.memcpy_dtod(&src, &mut dst).expect("copy"));
    let copy_gbs = 2.0 * (n * 2) as f64 / (t_copy * 1e-3) / 1e9;
    drop((src, dst));
    println!("copy bandwidth: {copy_gbs:.0} GB/s (1 GiB device-to-device, {t_copy:.3} ms)");

    let shapes: Vec<(usize, usize, usize, usize, usize, usize)> = vec![
        (1, 32, 8, 1, 32768, 128),
        (1, 32, 8, 1, 131072, 128),
        (8, 32, 8, 1, 8192, 128),
        (32, 32, 8, 1, 4096, 128),
        (64, 32, 8, 1, 2048, 128),
        (1, 32, 32, 1, 16384, 64),
        (16, 32, 32, 1, 4096, 64),
        (1, 32, 8, 8, 16384, 128),
        (1, 32, 8, 8, 32768, 128),
        (1, 32, 8, 128, 16384, 128),
        (1, 32, 8, 128, 32768, 128),
    ];
    let mut rows = vec!["b,hq,hkv,nq,t,d,path,us,gbs,pct_copy".to_string()];
    println!(
        "{:>3} {:>3} {:>3} {:>4} {:>7} {:>4} {:<16} {:>9} {:>8} {:>7}",
        "B", "Hq", "Hkv", "Nq", "T", "D", "path", "µs", "GB/s", "% copy"
    );
    for (b, hq, hkv, nq, t, d) in shapes {
        let bytes = 2.0 * (b * t * hkv * d * 2) as f64;
        let mut row = |path: &str, ms: f64| {
            let gbs = bytes / (ms * 1e-3) / 1e9;
            let pct = 100.0 * gbs / copy_gbs;
            let us = ms * 1e3;
            println!(
                "{b:>3} {hq:>3} {hkv:>3} {nq:>4} {t:>7} {d:>4} {path:<16} {us:>9.1} {gbs:>8.0} {pct:>7.1}"
            );
            rows.push(format!(
                "{b},{hq},{hkv},{nq},{t},{d},{path},{us:.2},{gbs:.1},{pct:.2}"
            ));
        };
        let spec = AttnProblem::new(Family::softmax(), DType::BF16, b, hq, hkv, nq, t, d)
            .with_causal(Causal::BottomRight)
            .validate()
            .expect("valid");
        {
            let mut bufs = Bufs::new(&base, &spec);
            row("decode", time_ms(&on, 3, reps, || forward(&on, &spec, &mut bufs)));
            row(
                "decode cp.async",
                time_ms(&cp_async, 3, reps, || forward(&cp_async, &spec, &mut bufs)),
            );
            // The split heuristic's neighbourhood at one sequence (the grid is B·Hkv blocks per chunk).
            if b == 1 && nq == 1 {
                for splits in [8, 16, 32, 64, 128] {
                    let forced = CudaAttn::with_config(s.clone(), cfg(Route::Everywhere, Some(splits)))
                        .expect("config");
                    let ms = time_ms(&forced, 3, reps, || forward(&forced, &spec, &mut bufs));
                    row(&format!("decode S={splits}"), ms);
                }
            }
            row(
                "flash",
                time_ms(&off, 2, reps.min(5), || forward(&off, &spec, &mut bufs)),
            );
        }
        // KV-cache steps: one new token (Nq = 1 rows only), T − 1 keys already cached.
        if nq == 1 {
            for (name, layout) in [
                ("cache contiguous", KvLayout::Contiguous { capacity: t }),
                (
                    "cache paged 16",
                    KvLayout::Paged {
                        num_pages: b * t / 16,
                        page_size: 16,
                        pages_per_seq: t / 16,
                    },
                ),
                (
                    "cache paged 256",
                    KvLayout::Paged {
                        num_pages: b * t / 256,
                        page_size: 256,
                        pages_per_seq: t / 256,
                    },
                ),
            ] {
                let mut step = CacheStep::new(&s, (b, hq, hkv, d, t), layout, 1);
                let mut ws = on.kv_cache_workspace(&step.spec).expect("workspace");
                let ms = time_ms(&on, 3, reps, || step.run(&on, &mut ws));
                row(name, ms);
            }
        }
    }
    step_latency(&mut rows);
    args.write_csv(&rows);
}

/// Per-token latency of the attention of one decode step through `layers` layers (a KV-cache step
/// of one token per layer, each layer its own paged cache of 16-slot pages holding `t` keys), at the
/// generation example's `--preset 1b` shape (B = 1, Hq = 32, Hkv = 8, D = 64, 16 layers): launched
/// call by call, and captured once into a CUDA graph replayed per token. Wall-clock time per token
/// over 200 tokens, the stream synchronised once per token as a generation loop does (the next token
/// is read back).
fn step_latency(rows: &mut Vec<String>) {
    use attn_cuda::cudarc::driver::{sys, CudaContext};
    use std::time::Instant;
    let (b, hq, hkv, d, layers) = (1usize, 32usize, 8usize, 64usize, 16usize);
    let ctx = CudaContext::new(0).expect("GPU 0");
    // SAFETY: every buffer of this section is used on `s` alone, in stream order.
    unsafe { ctx.disable_event_tracking() };
    let s = ctx.new_stream().expect("stream");
    let g = CudaAttn::with_config(s.clone(), KernelConfig::default()).expect("backend");
    println!("\nper-token attention latency, {layers} layers, B={b} Hq={hq} Hkv={hkv} D={d}, paged 16");
    println!(
        "{:>7} {:>14} {:>14} {:>8}",
        "T", "launched µs", "graph µs", "ratio"
    );
    for t in [1024usize, 8192] {
        let layout = KvLayout::Paged {
            num_pages: b * t / 16,
            page_size: 16,
            pages_per_seq: t / 16,
        };
        let mut ls: Vec<CacheStep> = (0..layers as u64)
            .map(|l| CacheStep::new(&s, (b, hq, hkv, d, t), layout, 10 + 10 * l))
            .collect();
        let mut ws = g.kv_cache_workspace(&ls[0].spec).expect("workspace");
        let token = |ls: &mut Vec<CacheStep>, ws: &mut attn_cuda::KvCacheWorkspace| {
            for l in ls.iter_mut() {
                l.run(&g, ws);
            }
        };
        let per_token = |f: &mut dyn FnMut()| {
            for _ in 0..20 {
                f();
                s.synchronize().expect("sync");
            }
            let t0 = Instant::now();
            for _ in 0..200 {
                f();
                s.synchronize().expect("sync");
            }
            t0.elapsed().as_secs_f64() * 1e6 / 200.0
        };
        let launched = per_token(&mut || token(&mut ls, &mut ws));
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .expect("begin capture");
        token(&mut ls, &mut ws);
        let graph = s
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .expect("end capture")
            .expect("a graph");
        let captured = per_token(&mut || graph.launch().expect("graph launch"));
        println!(
            "{t:>7} {launched:>14.1} {captured:>14.1} {:>8.2}",
            launched / captured
        );
        rows.push(format!(
            "{b},{hq},{hkv},1,{t},{d},{layers} layers launched,{launched:.2},,"
        ));
        rows.push(format!(
            "{b},{hq},{hkv},1,{t},{d},{layers} layers graph,{captured:.2},,"
        ));
    }
}

/// The buffers of one KV-cache step of one new token (bf16, softmax): q, the caches holding T − 1
/// keys per sequence, the new k and v, the lengths, and with a paged layout a block table that visits
/// the pages in a shuffled order (a stride coprime with the pool); the values drawn from seeds
/// `seed` to `seed + 4`.
struct CacheStep {
    spec: attn_core::KvCacheSpec,
    q: CudaSlice<bf16>,
    k_cache: CudaSlice<bf16>,
    v_cache: CudaSlice<bf16>,
    k_new: CudaSlice<bf16>,
    v_new: CudaSlice<bf16>,
    lens: CudaSlice<i32>,
    table: Option<CudaSlice<i32>>,
    o: CudaSlice<bf16>,
    lse: CudaSlice<f32>,
}

impl CacheStep {
    fn new(
        s: &std::sync::Arc<attn_cuda::cudarc::driver::CudaStream>,
        (b, hq, hkv, d, t): (usize, usize, usize, usize, usize),
        layout: KvLayout,
        seed: u64,
    ) -> Self {
        let spec = KvCacheProblem::new(Family::softmax(), DType::BF16, b, hq, hkv, 1, d, layout)
            .validate()
            .expect("valid");
        let cache_len: usize = spec.cache_shape(d).iter().product();
        let up = |n: usize, seed| s.clone_htod(&random_bf16(n, seed)).expect("upload");
        let pool = match layout {
            KvLayout::Paged { num_pages, .. } => num_pages,
            KvLayout::Contiguous { .. } => 0,
        };
        let table = spec.block_table_shape().map(|[rb, pp]| {
            let v: Vec<i32> = (0..rb * pp).map(|i| ((i * 7919) % pool) as i32).collect();
            s.clone_htod(&v).expect("upload")
        });
        CacheStep {
            q: up(spec.attend().q_len(), seed),
            k_cache: up(cache_len, seed + 1),
            v_cache: up(cache_len, seed + 2),
            k_new: up(b * hkv * d, seed + 3),
            v_new: up(b * hkv * d, seed + 4),
            lens: s.clone_htod(&vec![(t - 1) as i32; b]).expect("upload"),
            table,
            o: s.alloc_zeros(spec.attend().o_len()).expect("alloc"),
            lse: s.alloc_zeros(spec.attend().stats_len()).expect("alloc"),
            spec,
        }
    }

    /// One step on `g`'s stream.
    fn run(&mut self, g: &CudaAttn, ws: &mut attn_cuda::KvCacheWorkspace) {
        g.forward_kv_cache(
            &self.spec,
            KvCacheIo {
                q: &self.q,
                k_cache: &mut self.k_cache,
                v_cache: &mut self.v_cache,
                k_new: Some(&self.k_new),
                v_new: Some(&self.v_new),
                cache_seqlens: &self.lens,
                block_table: self.table.as_ref(),
                o: &mut self.o,
                lse: &mut self.lse,
            },
            ws,
        )
        .expect("kv cache step");
    }
}
