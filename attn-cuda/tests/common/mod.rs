//! Shared GPU test harness: one `check` per case compares every output and gradient by name with
//! the f64 reference (attn-cpu-ref) under docs/math.md's tolerance
//! `err(kernel) ≤ 2·err(naive same-dtype) + atol`, where the naive baseline ([`naive`]) is plain
//! attention in the storage dtype: inputs rounded, S, P, dP and dS rounded before the next
//! product, outputs rounded, sums accumulated in f32 (as a framework's matmul would).
//!
//! Every output buffer is poisoned with NaN before each launch, so an element the kernels fail to
//! write cannot pass.
//!
//! Kernel configurations: a test runs its cases once per configuration of a list ([`flash_configs`],
//! [`taylor_configs`]) through [`each_config`], which points [`gpu`] at a backend of that
//! configuration and names the configuration in every failure.

#![allow(dead_code)] // each test binary uses part of the harness

pub mod bench;
pub mod hyperbolic;
pub mod shapes;

use attn_core::{AttnSpec, DType, Element, Family};
pub use attn_cpu_ref::testing::naive::Outputs;
use attn_cpu_ref::testing::naive::{check_lse, compare, GradTol};
use attn_cpu_ref::testing::{check_close, random_case, Case};
use attn_cpu_ref::{backward_f64, forward_f64};
use attn_cuda::cudarc::driver::CudaSlice;
use attn_cuda::{BackwardViews, CudaAttn, DeviceElem, ForwardViews, KernelConfig, Route};
use shapes::{Lengths, Make, Shapes};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};

pub const GPU_ONLY: &str = "needs a CUDA GPU: cargo xtask test-gpu";

/// A kernel configuration the tests run under, and its name in their output and failures.
pub type Config = (&'static str, KernelConfig);

/// The configurations of the flash tests (gpu_softmax_like, gpu_hyperbolic): the default, and each
/// variant the default leaves out on an H200, so every flash kernel the crate ships is tested there.
pub fn flash_configs() -> Vec<Config> {
    let d = KernelConfig::default();
    vec![
        ("default", d),
        // The mma.sync kernels (the sm_80 path).
        ("portable", KernelConfig::portable()),
        // The two-kernel backward where the fused one is the default.
        (
            "fused-backward-off",
            KernelConfig {
                fused_backward: Route::Off,
                ..d
            },
        ),
        // The wgmma fused backward (D = 128) too.
        (
            "fused-backward-everywhere",
            KernelConfig {
                fused_backward: Route::Everywhere,
                ..d
            },
        ),
        // The wgmma forward where the warp-specialised one is the default.
        (
            "ws-forward-off",
            KernelConfig {
                ws_forward: Route::Off,
                ..d
            },
        ),
        // The warp-specialised forward at every head dim it has.
        (
            "ws-forward-everywhere",
            KernelConfig {
                ws_forward: Route::Everywhere,
                ..d
            },
        ),
        // The wgmma dQ and dK/dV kernels in place of the warp-specialised ones.
        (
            "ws-backward-off",
            KernelConfig {
                ws_backward: false,
                ..d
            },
        ),
    ]
}

/// The configurations of the Taylor tests (gpu_taylor): the default; the state kernels for every call
/// (by default order 2 at f16/bf16, D = 64 and 128, runs its quadratic form on the flash kernels at
/// the tests' lengths); order 2's wgmma state forward wherever it applies (bf16, D = 64; by default
/// from 4096 keys, 8192 causal) with 128-key causal segments, so short sequences have several states
/// and the order-1 single-pass forward's chain has many links.
pub fn taylor_configs() -> Vec<Config> {
    let d = KernelConfig::default();
    vec![
        ("default", d),
        (
            "taylor-dense-off",
            KernelConfig {
                taylor_dense: Route::Off,
                ..d
            },
        ),
        (
            "taylor-wg-everywhere-segment-128",
            KernelConfig {
                taylor_wg: Route::Everywhere,
                taylor_causal_segment: Some(128),
                ..d
            },
        ),
    ]
}

thread_local! {
    /// The configuration [`gpu`] serves on this thread: [`each_config`]'s current one, else the
    /// environment's default ([`KernelConfig::from_env`]).
    static CURRENT: Cell<Option<Config>> = const { Cell::new(None) };
}

/// The name of the configuration the current test thread runs under.
pub fn config_name() -> &'static str {
    CURRENT.with(|c| c.get()).map_or("default", |(name, _)| name)
}

/// The GPU of this test process (device 0) under the current thread's configuration (one backend per
/// configuration, all on device 0's default stream). Panics with a clear message when there is no
/// GPU: GPU tests are `#[ignore]`d and only run when asked for (`--ignored`), on a machine that has one.
pub fn gpu() -> &'static CudaAttn {
    static BASE: OnceLock<CudaAttn> = OnceLock::new();
    static BACKENDS: Mutex<Vec<(KernelConfig, &'static CudaAttn)>> = Mutex::new(Vec::new());
    let base = BASE.get_or_init(|| match CudaAttn::new(0) {
        Ok(g) => g,
        Err(e) => panic!("GPU tests need a CUDA GPU: {e}"),
    });
    let Some((name, config)) = CURRENT.with(|c| c.get()) else {
        return base;
    };
    let mut backends = BACKENDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, b)) = backends.iter().find(|(c, _)| *c == config) {
        return b;
    }
    let backend = match CudaAttn::with_config(base.stream().clone(), config) {
        Ok(b) => &*Box::leak(Box::new(b)),
        Err(e) => panic!("kernel configuration `{name}`: {e}"),
    };
    backends.push((config, backend));
    backend
}

/// Run `body` once under each configuration of `configs` ([`gpu`] serves that configuration's
/// backend meanwhile); a failure under one configuration does not stop the others, and the test fails
/// at the end naming every configuration that failed and why.
pub fn each_config(configs: &[Config], mut body: impl FnMut()) {
    let mut failed = Vec::new();
    for &(name, config) in configs {
        println!("---- kernel configuration `{name}`");
        let previous = CURRENT.with(|c| c.replace(Some((name, config))));
        let result = catch_unwind(AssertUnwindSafe(&mut body));
        CURRENT.with(|c| c.set(previous));
        if let Err(panic) = result {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(a panic without a message)");
            failed.push(format!("kernel configuration `{name}`: {why}"));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} kernel configurations failed:\n{}",
        failed.len(),
        configs.len(),
        failed.join("\n")
    );
}

fn round<T: Element>(x: &[f64]) -> (Vec<T>, Vec<f64>) {
    let t: Vec<T> = x.iter().map(|&v| T::from_f64(v)).collect();
    let r = t.iter().map(|v| v.to_f64()).collect();
    (t, r)
}

fn widen<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// `data` on the device; an empty `data` as one NaN (a zero-byte allocation is a driver error; the
/// buffers are checked for at least the spec's length).
fn upload<T: DeviceElem>(data: &[T]) -> CudaSlice<T> {
    let nan = [T::from_f64(f64::NAN)];
    let data = if data.is_empty() { &nan[..] } else { data };
    gpu().stream().clone_htod(data).expect("upload")
}

fn poisoned<T: DeviceElem>(n: usize) -> CudaSlice<T> {
    upload(&vec![T::from_f64(f64::NAN); n.max(1)])
}

fn download<T: DeviceElem>(s: &CudaSlice<T>, n: usize) -> Vec<f64> {
    let v: Vec<T> = gpu().stream().clone_dtoh(s).expect("download");
    widen(&v[..n])
}

/// Run forward and backward of `spec` on the GPU for the (already rounded) case inputs, through
/// the view entry points with inputs starting at element `offset` of their buffers.
pub fn run_gpu<T: DeviceElem>(spec: &AttnSpec, case: &Case, offset: usize) -> Result<Outputs, String> {
    let g = gpu();
    let with_offset = |x: &[f64]| -> CudaSlice<T> {
        let mut v = vec![T::from_f64(f64::NAN); offset];
        v.extend(x.iter().map(|&e| T::from_f64(e)));
        upload(&v)
    };
    let q = with_offset(&case.q);
    let k = with_offset(&case.k);
    let v = with_offset(&case.v);
    let bias = case.bias.as_ref().map(|b| with_offset(b));
    let d_o = upload(&case.d_o.iter().map(|&e| T::from_f64(e)).collect::<Vec<T>>());
    let mut o = poisoned::<T>(spec.o_len());
    let mut lse = poisoned::<f32>(spec.stats_len());
    let e = |e: attn_cuda::CudaAttnError| e.to_string();
    g.forward_views(
        spec,
        ForwardViews {
            q: q.slice(offset..),
            k: k.slice(offset..),
            v: v.slice(offset..),
            bias: bias.as_ref().map(|b| b.slice(offset..)),
            o: o.slice_mut(..),
            lse: lse.slice_mut(..),
        },
    )
    .map_err(e)?;
    let mut dq = poisoned::<T>(spec.dq_len());
    let mut dk = poisoned::<T>(spec.dk_len());
    let mut dv = poisoned::<T>(spec.dv_len());
    let mut dbias = spec.bias().map(|_| poisoned::<T>(spec.bias_len()));
    g.backward_views(
        spec,
        BackwardViews {
            q: q.slice(offset..),
            k: k.slice(offset..),
            v: v.slice(offset..),
            bias: bias.as_ref().map(|b| b.slice(offset..)),
            o: o.slice(..),
            d_o: d_o.slice(..),
            lse: lse.slice(..),
            dq: dq.slice_mut(..),
            dk: dk.slice_mut(..),
            dv: dv.slice_mut(..),
            dbias: dbias.as_mut().map(|b| b.slice_mut(..)),
        },
    )
    .map_err(e)?;
    g.stream().synchronize().map_err(|e| e.to_string())?;
    Ok(Outputs {
        o: download(&o, spec.o_len()),
        lse: download(&lse, spec.stats_len()),
        dq: download(&dq, spec.dq_len()),
        dk: download(&dk, spec.dk_len()),
        dv: download(&dv, spec.dv_len()),
        dbias: dbias.as_ref().map(|b| download(b, spec.bias_len())),
    })
}

/// Unit roundoff of the storage dtype.
fn unit<T: Element>() -> f64 {
    T::DTYPE.unit_roundoff()
}

/// The naive same-dtype baseline of the spec's family (`attn_cpu_ref::testing::naive::baseline`) on
/// inputs the reference accepted.
pub fn naive<T: Element>(spec: &AttnSpec, x: attn_cpu_ref::Inputs<'_, f64>, d_o: &[f64]) -> Outputs {
    attn_cpu_ref::testing::naive::baseline::<T>(spec, x, d_o).expect("the buffers of the spec")
}

/// One case: random inputs (seeded), rounded to `T`; the f64 reference on the rounded inputs; the
/// naive same-dtype baseline; the GPU. Every tensor is compared by name.
pub fn check<T: DeviceElem>(spec: &AttnSpec, seed: u64, offset: usize) -> Result<(), String> {
    let mut case = random_case(spec, seed);
    for x in [&mut case.q, &mut case.k, &mut case.v, &mut case.d_o] {
        *x = round::<T>(x).1;
    }
    if let Some(b) = case.bias.as_mut() {
        *b = round::<T>(b).1;
    }
    let reference = forward_f64(spec, case.inputs()).map_err(|e| e.to_string())?;
    let grads = backward_f64(spec, case.inputs(), &reference.o, &case.d_o, &reference.stats)
        .map_err(|e| e.to_string())?;
    let base = naive::<T>(spec, case.inputs(), &case.d_o);
    let got = run_gpu::<T>(spec, &case, offset)?;
    let ctx = |e: String| format!("{} {} seed {seed}: {e}", spec.family().label(), T::DTYPE);
    compare(
        spec,
        &got,
        &reference,
        &grads,
        &base,
        unit::<T>(),
        GradTol::PerTensor,
    )
    .map_err(ctx)
}

/// Taylor order 1 as the tests and timings run it (l2-normalised q, k and `a1·scale < a0`, so
/// `f > 0`); order 2 with the default coefficients.
pub fn taylor_family(order: u8) -> Family {
    if order == 1 {
        Family::Taylor(attn_core::TaylorParams {
            order: 1,
            a: [1.0, 0.8, 0.0],
            scale: Some(0.9),
            qk_l2norm: true,
        })
    } else {
        Family::taylor(2)
    }
}

/// [`check`] in the spec's storage dtype.
pub fn check_dtype(spec: &AttnSpec, seed: u64, offset: usize) -> Result<(), String> {
    match spec.dtype() {
        DType::F32 => check::<f32>(spec, seed, offset),
        DType::F16 => check::<half::f16>(spec, seed, offset),
        DType::BF16 => check::<half::bf16>(spec, seed, offset),
    }
}

/// The forward and backward of `spec` on `case`, twice in the spec's storage dtype: an error naming the
/// first output whose bits differ between the two runs.
pub fn identical_runs(spec: &AttnSpec, case: &Case) -> Result<(), String> {
    let run = || match spec.dtype() {
        DType::F32 => run_gpu::<f32>(spec, case, 0),
        DType::F16 => run_gpu::<half::f16>(spec, case, 0),
        DType::BF16 => run_gpu::<half::bf16>(spec, case, 0),
    };
    let (a, b) = (run()?, run()?);
    for (name, x, y) in [
        ("o", &a.o, &b.o),
        ("lse", &a.lse, &b.lse),
        ("dq", &a.dq, &b.dq),
        ("dk", &a.dk, &b.dk),
        ("dv", &a.dv, &b.dv),
    ] {
        let diff = x
            .iter()
            .zip(y)
            .filter(|(p, q)| p.to_bits() != q.to_bits())
            .count();
        if diff > 0 {
            return Err(format!(
                "{name}: {diff} of {} elements differ between two runs",
                x.len()
            ));
        }
    }
    Ok(())
}

/// The cases of one test: each one counted and each failure kept under its label, so that
/// [`Cases::finish`] reports them all (case, field, error, bound) before the test fails.
pub struct Cases {
    name: String,
    count: usize,
    skipped: usize,
    failures: Vec<String>,
}

/// The cases [`check_dims`] runs: every head dim and dtype, unless `ATTN_TEST_DIMS` (e.g. `64` or
/// `16,128`) or `ATTN_TEST_DTYPES` (e.g. `bf16`) narrow them, for runs under compute-sanitizer
/// racecheck, which is too slow for the whole list. Each skipped case is counted and reported.
pub fn case_selected(d: usize, dtype: DType) -> bool {
    let listed = |var: &str, item: String| match std::env::var(var) {
        Ok(list) if !list.trim().is_empty() => list.split(',').any(|x| x.trim().eq_ignore_ascii_case(&item)),
        _ => true,
    };
    listed("ATTN_TEST_DIMS", d.to_string()) && listed("ATTN_TEST_DTYPES", dtype.to_string())
}

impl Cases {
    /// The cases of test `name` under the current kernel configuration ([`config_name`]).
    pub fn new(name: &str) -> Self {
        Cases {
            name: format!("{name} [{}]", config_name()),
            count: 0,
            skipped: 0,
            failures: Vec::new(),
        }
    }

    /// Count one case left out by `ATTN_TEST_DIMS` / `ATTN_TEST_DTYPES` ([`case_selected`]).
    pub fn skip(&mut self) {
        self.skipped += 1;
    }

    /// Count one case; keep its error as `label: error`.
    pub fn record(&mut self, label: impl std::fmt::Display, r: Result<(), String>) {
        self.count += 1;
        if let Err(e) = r {
            self.failures.push(format!("{label}: {e}"));
        }
    }

    /// Print how many cases ran and failed; fail with every failure.
    pub fn finish(self) {
        let (name, cases, failures) = (self.name, self.count, self.failures);
        if self.skipped > 0 {
            println!(
                "{name}: {cases} cases, {} failed, {} SKIPPED by ATTN_TEST_DIMS / ATTN_TEST_DTYPES",
                failures.len(),
                self.skipped
            );
        } else {
            println!("{name}: {cases} cases, {} failed", failures.len());
        }
        assert!(
            failures.is_empty(),
            "{name}: {} of {cases} cases failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

/// One family over every head dim of `dims` × dtype: the n-th head dim draws with seed `seed(n)`,
/// its spec built by `make` from a fresh [`Shapes`] of that seed and `lengths`, then checked by
/// `check(spec, seed)`; each case recorded in `cases` as `D=… dtype`.
pub fn check_dims(
    cases: &mut Cases,
    family: Family,
    dims: &[usize],
    lengths: Lengths,
    seed: impl Fn(usize) -> u64,
    make: &Make,
    check: impl Fn(&AttnSpec, u64) -> Result<(), String>,
) {
    for (n, &d) in dims.iter().enumerate() {
        let seed = seed(n);
        for dtype in DType::ALL {
            if !case_selected(d, dtype) {
                cases.skip();
                continue;
            }
            let spec = make(family, dtype, d, &mut Shapes::new(seed, lengths))
                .validate()
                .expect("valid test problem");
            cases.record(format_args!("D={d} {dtype}"), check(&spec, seed));
        }
    }
}
