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

use attn_core::{AttnSpec, DType, Element, Family, FamilySpec};
use attn_cpu_ref::testing::{check_close, max_abs, random_case, Case};
use attn_cpu_ref::{backward_f64, forward_f64, Inputs};
use attn_cuda::cudarc::driver::CudaSlice;
use attn_cuda::{BackwardViews, CudaAttn, DeviceElem, ForwardViews, KernelConfig, Route};
use shapes::{Lengths, Make, Shapes};
use std::cell::Cell;
use std::ops::Range;
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

/// What one implementation produced.
#[derive(Clone, Debug)]
pub struct Outputs {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
    pub dbias: Option<Vec<f64>>,
}

impl Outputs {
    /// Zeros, the LSE at −∞ (an empty row's) and a dbias where the spec has a bias: what a naive
    /// baseline leaves where no key is seen.
    pub fn zeros(spec: &AttnSpec) -> Self {
        Outputs {
            o: vec![0.0; spec.o_len()],
            lse: vec![f64::NEG_INFINITY; spec.stats_len()],
            dq: vec![0.0; spec.dq_len()],
            dk: vec![0.0; spec.dk_len()],
            dv: vec![0.0; spec.dv_len()],
            dbias: spec.bias().map(|_| vec![0.0; spec.bias_len()]),
        }
    }
}

/// A query row that sees at least one key: batch entry `b`, query head `h` over key/value head
/// `hk`, position `i`, and the keys it sees.
pub struct QueryRow {
    pub b: usize,
    pub h: usize,
    pub hk: usize,
    pub i: usize,
    pub keys: Range<usize>,
}

/// Every query row of `spec` that sees a key, in (batch, head, position) order.
pub fn query_rows(spec: &AttnSpec) -> impl Iterator<Item = QueryRow> + '_ {
    (0..spec.batch()).flat_map(move |b| {
        (0..spec.heads_q()).flat_map(move |h| {
            (0..spec.seq_lens(b).q).filter_map(move |i| {
                let keys = spec.key_range(b, i);
                (!keys.is_empty()).then(|| QueryRow {
                    b,
                    h,
                    hk: spec.kv_head(h),
                    i,
                    keys,
                })
            })
        })
    })
}

/// A key row whose gradient a naive baseline writes: batch entry `b`, key/value head `hk`,
/// position `j`; `valid` where `j` is inside the entry's key length (not key padding).
pub struct KeyRow {
    pub b: usize,
    pub hk: usize,
    pub j: usize,
    pub valid: bool,
}

/// Every key row of `spec` in (batch, head, position) order: a packed entry's own rows, every row
/// of a dense entry (its key padding included).
pub fn key_rows(spec: &AttnSpec) -> impl Iterator<Item = KeyRow> + '_ {
    (0..spec.batch()).flat_map(move |b| {
        let len_k = spec.seq_lens(b).k;
        let rows = if spec.is_varlen() { len_k } else { spec.seq_k() };
        (0..spec.heads_kv()).flat_map(move |hk| {
            (0..rows).map(move |j| KeyRow {
                b,
                hk,
                j,
                valid: j < len_k,
            })
        })
    })
}

/// `a·b`, summed in f32.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>()
}

/// Per-key values of one call, each made once: the naive baselines prepare a key row for every query row
/// that sees it, which made them the GPU tests' longest part. `fill` makes the value of key j of (batch
/// entry, kv head) the first time it is asked for; `at` reads it after.
pub struct KeyCache<V> {
    keys: usize,
    rows: std::collections::HashMap<(usize, usize), Vec<Option<V>>>,
}

impl<V> KeyCache<V> {
    /// A cache for `keys` keys per (batch entry, kv head) (the spec's longest sequence).
    pub fn new(keys: usize) -> Self {
        KeyCache {
            keys,
            rows: std::collections::HashMap::new(),
        }
    }
    pub fn fill(&mut self, b: usize, hk: usize, j: usize, make: impl FnOnce() -> V) {
        let keys = self.keys;
        let row = self
            .rows
            .entry((b, hk))
            .or_insert_with(|| (0..keys).map(|_| None).collect());
        row[j].get_or_insert_with(make);
    }
    /// The value `fill` made (a test bug if it did not: the baselines fill every key before reading it).
    pub fn at(&self, b: usize, hk: usize, j: usize) -> &V {
        self.rows[&(b, hk)][j].as_ref().expect("a filled key")
    }
}

/// Row `x` in f32 and its norm `‖x‖`; with `l2_eps`, the row is `x / max(‖x‖, eps)` rounded to `T`.
pub fn prep_row<T: Element>(x: &[f64], l2_eps: Option<f32>) -> (Vec<f32>, f32) {
    let row: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
    match l2_eps {
        Some(eps) => (
            row.iter()
                .map(|v| T::from_f32(v / norm.max(eps)).to_f32())
                .collect(),
            norm,
        ),
        None => (row, norm),
    }
}

/// The gradient through [`prep_row`]: `dx = (dx̂ − x̂ (x̂·dx̂)) / ‖x‖` where `‖x‖ > eps`, else
/// `dx̂ / eps`; `dx̂` itself without the l2-norm.
pub fn l2norm_bwd(xh: &[f32], dxh: &[f32], norm: f32, l2_eps: Option<f32>) -> Vec<f32> {
    match l2_eps {
        None => dxh.to_vec(),
        Some(eps) if norm > eps => {
            let xd: f32 = xh.iter().zip(dxh).map(|(a, b)| a * b).sum();
            xh.iter().zip(dxh).map(|(x, g)| (g - x * xd) / norm).collect()
        }
        Some(eps) => dxh.iter().map(|g| g / eps).collect(),
    }
}

/// The bias of `row` at key `j` in f32 (0 without a bias).
pub fn bias_at(spec: &AttnSpec, x: &Inputs<'_, f64>, row: &QueryRow, j: usize) -> f32 {
    spec.bias_index(row.b, row.h, row.i, j)
        .map(|bi| x.bias.expect("bias")[bi] as f32)
        .unwrap_or(0.0)
}

/// The f32 sums of the softmax part of a naive baseline's backward, per key row: `dv` (`Σ p dO`)
/// and `dbias` (`Σ dS`).
pub struct SoftmaxSums {
    pub dv: Vec<f32>,
    pub dbias: Vec<f32>,
}

impl SoftmaxSums {
    pub fn new(spec: &AttnSpec) -> Self {
        SoftmaxSums {
            dv: vec![0f32; spec.dv_len()],
            dbias: vec![0f32; spec.bias_len()],
        }
    }

    /// `dbias` rounded to `T` into `out`.
    pub fn write_dbias<T: Element>(&self, out: &mut Outputs) {
        if let Some(db) = out.dbias.as_mut() {
            for (o, a) in db.iter_mut().zip(&self.dbias) {
                *o = T::from_f32(*a).to_f32() as f64;
            }
        }
    }
}

/// The softmax half of one query row of a naive baseline in dtype `T`, from its rounded scores `s`
/// (one per key of `row.keys`): `p = e^{s−m}/Σ` rounded, `o = Σ p v` (f32 sum, rounded) and the LSE
/// `m + ln Σ` into `out`; then `dP = dO·v` and `dS = p (dP − dO·o)`, both rounded, with `p dO` and
/// `dS` added to `sums`. Returns `dS` per key, or `None` where every score is −∞ (the row keeps
/// its zeros).
#[allow(clippy::needless_range_loop)] // one index addresses several rows at once
pub fn softmax_row<T: Element>(
    spec: &AttnSpec,
    x: &Inputs<'_, f64>,
    d_o: &[f64],
    row: &QueryRow,
    s: &[f32],
    out: &mut Outputs,
    sums: &mut SoftmaxSums,
) -> Option<Vec<f32>> {
    let rt = |v: f32| T::from_f32(v).to_f32();
    let (d, &QueryRow { b, h, hk, i, .. }) = (spec.head_dim(), row);
    let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return None;
    }
    let e: Vec<f32> = s.iter().map(|v| (v - m).exp()).collect();
    let sum: f32 = e.iter().sum();
    let p: Vec<f32> = e.iter().map(|v| rt(v / sum)).collect();
    let oo = spec.o_offset(b, i, h);
    let mut o_row = vec![0f32; d];
    for (jj, j) in row.keys.clone().enumerate() {
        let vo = spec.v_offset(b, j, hk);
        for c in 0..d {
            o_row[c] += p[jj] * x.v[vo + c] as f32;
        }
    }
    let o_row: Vec<f32> = o_row.into_iter().map(rt).collect();
    for c in 0..d {
        out.o[oo + c] = o_row[c] as f64;
    }
    out.lse[spec.stats_index(b, h, i)] = (m + sum.ln()) as f64;
    let g: Vec<f32> = d_o[oo..oo + d].iter().map(|&v| v as f32).collect();
    let delta = dot(&g, &o_row);
    let mut ds = Vec::with_capacity(s.len());
    for (jj, j) in row.keys.clone().enumerate() {
        let vo = spec.v_offset(b, j, hk);
        let vrow: Vec<f32> = x.v[vo..vo + d].iter().map(|&v| v as f32).collect();
        let dp = rt(dot(&g, &vrow));
        let dsj = rt(p[jj] * (dp - delta));
        if let Some(bi) = spec.bias_index(b, h, i, j) {
            sums.dbias[bi] += dsj;
        }
        let dvo = spec.dv_offset(b, j, hk);
        for c in 0..d {
            sums.dv[dvo + c] += p[jj] * g[c];
        }
        ds.push(dsj);
    }
    Some(ds)
}

/// Plain attention in dtype `T` (see the module doc), for softmax and cosine-sim.
#[allow(clippy::needless_range_loop)] // one index addresses several rows at once
pub fn naive<T: Element>(spec: &AttnSpec, x: Inputs<'_, f64>, d_o: &[f64]) -> Outputs {
    let rt = |v: f32| T::from_f32(v).to_f32();
    let d = spec.head_dim();
    let (scale, softcap, cosine_eps) = match *spec.family() {
        FamilySpec::Softmax { scale, softcap } => (scale, softcap, None),
        FamilySpec::CosineSim {
            scale,
            qk_l2norm,
            eps,
        } => (scale, None, qk_l2norm.then_some(eps)),
        ref other => panic!("no naive baseline for {other:?}"),
    };
    // Prepared rows: x̂ = x / max(‖x‖, eps) rounded to T (cosine-sim), else x; and ‖x‖.
    let prep = |buf: &[f64], off: usize| prep_row::<T>(&buf[off..off + d], cosine_eps);
    let mut out = Outputs::zeros(spec);
    // dk̂ accumulated in f32 per key row, then rounded.
    let mut dk_acc = vec![0f32; spec.dk_len()];
    let mut sums = SoftmaxSums::new(spec);
    let mut cache = KeyCache::new(spec.seq_k());
    for row in query_rows(spec) {
        let QueryRow { b, h, hk, i, .. } = row;
        let (qh, qnorm) = prep(x.q, spec.q_offset(b, i, h));
        for j in row.keys.clone() {
            cache.fill(b, hk, j, || prep(x.k, spec.k_offset(b, j, hk)));
        }
        let krows: Vec<&(Vec<f32>, f32)> = row.keys.clone().map(|j| cache.at(b, hk, j)).collect();
        // s = score + bias, rounded; sigma = ∂score/∂(q̂·k̂) (the softcap's tanh term).
        let mut s = Vec::with_capacity(row.keys.len());
        let mut sigma = Vec::with_capacity(row.keys.len());
        for (jj, j) in row.keys.clone().enumerate() {
            let raw = scale * dot(&qh, &krows[jj].0);
            let (sc, sg) = match softcap {
                Some(cap) => {
                    let t = (raw / cap).tanh();
                    (cap * t, scale * (1.0 - t * t))
                }
                None => (raw, scale),
            };
            s.push(rt(sc + bias_at(spec, &x, &row, j)));
            sigma.push(sg);
        }
        let Some(ds) = softmax_row::<T>(spec, &x, d_o, &row, &s, &mut out, &mut sums) else {
            continue;
        };
        let mut dqh = vec![0f32; d];
        for (jj, j) in row.keys.clone().enumerate() {
            let w = ds[jj] * sigma[jj];
            let ko = spec.dk_offset(b, j, hk);
            for c in 0..d {
                dqh[c] += w * krows[jj].0[c];
                dk_acc[ko + c] += w * qh[c];
            }
        }
        let dqh: Vec<f32> = dqh.into_iter().map(rt).collect();
        let dq = l2norm_bwd(&qh, &dqh, qnorm, cosine_eps);
        let qo = spec.dq_offset(b, i, h);
        for c in 0..d {
            out.dq[qo + c] = rt(dq[c]) as f64;
        }
    }
    // dk: through the l2-norm per key row (cosine-sim), then rounded.
    for KeyRow { b, hk, j, .. } in key_rows(spec) {
        let ko = spec.dk_offset(b, j, hk);
        let dkh: Vec<f32> = dk_acc[ko..ko + d].iter().map(|&v| rt(v)).collect();
        let (kh, norm) = prep(x.k, spec.k_offset(b, j, hk));
        let dk = l2norm_bwd(&kh, &dkh, norm, cosine_eps);
        let vo = spec.dv_offset(b, j, hk);
        for c in 0..d {
            out.dk[ko + c] = rt(dk[c]) as f64;
            out.dv[vo + c] = rt(sums.dv[vo + c]) as f64;
        }
    }
    sums.write_dbias::<T>(&mut out);
    out
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

/// Compare the LSE: −∞ exactly where the reference has an empty row, close elsewhere.
fn check_lse(got: &[f64], reference: &[f64], baseline: &[f64], atol: f64) -> Result<(), String> {
    let mut g = Vec::new();
    let mut r = Vec::new();
    let mut b = Vec::new();
    for i in 0..reference.len() {
        let empty = reference[i] == f64::NEG_INFINITY;
        if empty != (got[i] == f64::NEG_INFINITY) {
            return Err(format!(
                "lse[{i}]: got {} where the reference has {}",
                got[i], reference[i]
            ));
        }
        if !empty {
            g.push(got[i]);
            r.push(reference[i]);
            b.push(baseline[i]);
        }
    }
    check_close("lse", &g, &r, &b, atol)
}

/// Unit roundoff of the storage dtype.
fn unit<T: Element>() -> f64 {
    T::DTYPE.unit_roundoff()
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
    let atol = |r: &[f64]| 4.0 * unit::<T>() * max_abs(r).max(1e-3);
    let ctx = |e: String| format!("{} {} seed {seed}: {e}", spec.family().label(), T::DTYPE);
    check_close("o", &got.o, &reference.o, &base.o, atol(&reference.o)).map_err(ctx)?;
    let lse_ref: Vec<f64> = reference.stats.clone();
    check_lse(&got.lse, &lse_ref, &base.lse, atol(&[1.0])).map_err(ctx)?;
    check_close("dq", &got.dq, &grads.dq, &base.dq, atol(&grads.dq)).map_err(ctx)?;
    check_close("dk", &got.dk, &grads.dk, &base.dk, atol(&grads.dk)).map_err(ctx)?;
    check_close("dv", &got.dv, &grads.dv, &base.dv, atol(&grads.dv)).map_err(ctx)?;
    if let (Some(g), Some(r), Some(b)) = (&got.dbias, &grads.dbias, &base.dbias) {
        check_close("dbias", g, r, b, atol(r)).map_err(ctx)?;
    }
    Ok(())
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
