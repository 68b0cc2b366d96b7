//! The split-KV decode kernels and the KV-cache step against the f64 CPU reference (docs/math.md,
//! "Decode, split-KV and KV caches"; docs/kernels/decode.md), under the project's tolerance rule
//! (`common`): decode-shaped forwards (few queries, GQA ratios 1, 4, 8, key padding with empty and
//! full sequences, bottom-right causal, windows, softcap) at every split count from 1 to the most the
//! keys allow, followed by the flash backward on the decode forward's LSE; KV-cache steps on
//! contiguous and paged caches (shuffled block tables) with random cache lengths, checking the
//! appended cache slot by slot; one-token-at-a-time decode against the causal prefill's rows; a
//! step captured in a CUDA graph and replayed with new lengths. Outputs are poisoned with NaN
//! before every launch.
//!
//! GPU-only: `cargo xtask test-gpu` (or the bundle of `cargo xtask gpu-bundle`) runs them with
//! `--ignored`.

mod common;

use attn_core::{
    AttnProblem, AttnSpec, Causal, DType, Element, Family, KvCacheProblem, KvCacheSpec, KvLayout,
    SoftmaxParams,
};
use attn_cpu_ref::testing::{check_close, max_abs, random_case};
use attn_cpu_ref::{forward_f64, Inputs};
use attn_cuda::cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DeviceRepr};
use attn_cuda::{CudaAttn, DeviceElem, KernelConfig, KvCacheIo, Route};
use common::{check, each_config, gpu, Cases, Config};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

/// The decode kernels wherever they support the call, at the heuristic's split count and at forced
/// counts from 1 up to more than any test's key tiles (clamped to them: the most chunks possible).
fn decode_configs() -> Vec<Config> {
    let d = KernelConfig {
        decode: Route::Everywhere,
        ..KernelConfig::default()
    };
    vec![
        ("decode-heuristic", d),
        (
            "decode-splits-1",
            KernelConfig {
                decode_splits: Some(1),
                ..d
            },
        ),
        (
            "decode-splits-2",
            KernelConfig {
                decode_splits: Some(2),
                ..d
            },
        ),
        (
            "decode-splits-3",
            KernelConfig {
                decode_splits: Some(3),
                ..d
            },
        ),
        // The cp.async loads (the sm_80 path) in place of the bulk copies.
        (
            "decode-portable-splits-3",
            KernelConfig {
                hopper: false,
                decode_splits: Some(3),
                ..d
            },
        ),
        (
            "decode-splits-max",
            KernelConfig {
                decode_splits: Some(1 << 20),
                ..d
            },
        ),
    ]
}

fn softcap() -> Family {
    Family::Softmax(SoftmaxParams {
        scale: Some(1.5),
        softcap: Some(2.0),
    })
}

/// One decode-shaped spec: B sequences, `nq` queries, `nk` keys, mask option `mask` (0 dense, 1
/// bottom-right causal with key padding including an empty and a full sequence, 2 window, 3 causal
/// + window + padding).
#[allow(clippy::too_many_arguments)]
fn decode_spec(
    family: Family,
    dtype: DType,
    d: usize,
    hq: usize,
    hkv: usize,
    nq: usize,
    nk: usize,
    mask: usize,
) -> AttnSpec {
    let b = 4;
    let mut p = AttnProblem::new(family, dtype, b, hq, hkv, nq, nk, d);
    let lens = vec![nk, 0, 1.max(nk / 3), nk - 7];
    match mask {
        1 => p = p.with_causal(Causal::BottomRight).with_key_lens(lens),
        2 => p = p.with_window(Some(70), Some(0)),
        3 => {
            p = p
                .with_causal(Causal::BottomRight)
                .with_window(Some(150), None)
                .with_key_lens(lens)
        }
        _ => {}
    }
    p.validate().expect("valid decode spec")
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn decode_forward_matches_reference_at_every_split_count() {
    each_config(&decode_configs(), || {
        let mut cases = Cases::new("decode_forward");
        let mut n = 0u64;
        for (fname, family) in [
            ("softmax", Family::softmax()),
            ("softcap", softcap()),
            ("cosine_sim", Family::cosine_sim()),
        ] {
            let dims: &[usize] = if fname == "cosine_sim" {
                &[16, 32, 64, 96, 128, 256]
            } else {
                &[32, 64, 96, 128, 256]
            };
            for dtype in [DType::F16, DType::BF16, DType::F32] {
                for &d in dims {
                    for (hq, hkv) in [(4, 4), (8, 2), (8, 1)] {
                        n += 1;
                        let nq = [1, 3, 8][(n % 3) as usize];
                        let mask = (n % 4) as usize;
                        let nk = if d == 256 { 333 } else { 611 };
                        let spec = decode_spec(family, dtype, d, hq, hkv, nq, nk, mask);
                        let label =
                            format!("{fname} {dtype} D={d} Hq/Hkv={hq}/{hkv} Nq={nq} Nk={nk} mask={mask}");
                        let r = match dtype {
                            DType::F16 => check::<half::f16>(&spec, 7000 + n, 0),
                            DType::BF16 => check::<half::bf16>(&spec, 7000 + n, 0),
                            DType::F32 => check::<f32>(&spec, 7000 + n, 0),
                        };
                        cases.record(label, r);
                    }
                }
            }
        }
        cases.finish();
    });
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn decode_forward_hyperbolic_matches_reference_at_every_split_count() {
    use attn_core::{Aggregation, HypScore, HyperbolicParams};
    use common::hyperbolic::{check_points, Points};
    let hyp = |score, aggregation, curvature, beta| {
        Family::Hyperbolic(HyperbolicParams {
            score,
            curvature,
            beta,
            aggregation,
        })
    };
    each_config(&decode_configs(), || {
        let mut cases = Cases::new("decode_forward_hyperbolic");
        let mut n = 0u64;
        for (fname, family, points) in [
            (
                "sq_lorentz",
                hyp(HypScore::SquaredLorentz, Aggregation::Euclidean, 1.0, 1.0),
                Points::Scaled { radius: 1.5 },
            ),
            (
                "geodesic",
                hyp(HypScore::Geodesic, Aggregation::Euclidean, 2.0, 1.7),
                Points::Scaled { radius: 1.5 },
            ),
            (
                "sq_lorentz_midpoint",
                hyp(HypScore::SquaredLorentz, Aggregation::EinsteinMidpoint, 0.5, 0.7),
                Points::KleinEdge { radius: 1.5 },
            ),
        ] {
            for dtype in [DType::F16, DType::BF16] {
                for d in [64, 128] {
                    for (hq, hkv) in [(4, 4), (8, 1)] {
                        n += 1;
                        let mask = (n % 4) as usize;
                        let spec = decode_spec(family, dtype, d, hq, hkv, 2, 411, mask);
                        let label = format!("{fname} {dtype} D={d} Hq/Hkv={hq}/{hkv} mask={mask}");
                        let r = match dtype {
                            DType::F16 => check_points::<half::f16>(&spec, 9000 + n, 0, points),
                            _ => check_points::<half::bf16>(&spec, 9000 + n, 0, points),
                        };
                        cases.record(label, r);
                    }
                }
            }
        }
        cases.finish();
    });
}

// ---- KV cache ----

fn upload<T: DeviceRepr>(s: &Arc<CudaStream>, x: &[T]) -> CudaSlice<T> {
    s.clone_htod(x).expect("upload")
}

fn download<T: DeviceRepr + Clone + Default>(s: &Arc<CudaStream>, x: &CudaSlice<T>) -> Vec<T> {
    s.clone_dtoh(x).expect("download")
}

fn to_t<T: Element>(x: &[f64]) -> Vec<T> {
    x.iter().map(|&v| T::from_f64(v)).collect()
}

fn widen<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// A random KV-cache step and its host image: the caches before the step, the new tokens, the
/// lengths and (paged) a shuffled block table.
struct Step {
    spec: KvCacheSpec,
    q: Vec<f64>,
    k_cache: Vec<f64>,
    v_cache: Vec<f64>,
    k_new: Vec<f64>,
    v_new: Vec<f64>,
    lens: Vec<i32>,
    table: Vec<i32>,
}

#[allow(clippy::too_many_arguments)]
fn random_step<T: Element>(
    family: Family,
    b: usize,
    hq: usize,
    hkv: usize,
    seq_q: usize,
    new: usize,
    d: usize,
    layout: KvLayout,
    seed: u64,
) -> Step {
    let spec = KvCacheProblem::new(family, T::DTYPE, b, hq, hkv, seq_q, d, layout)
        .with_new_tokens(new)
        .validate()
        .expect("valid cache step");
    let mut rng = StdRng::seed_from_u64(seed);
    let cap = spec.capacity();
    let mut u = |n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| T::from_f64(rng.random_range(-1.0..1.0)).to_f64())
            .collect()
    };
    let cache_len = spec.cache_shape(d).iter().product();
    let q = u(spec.attend().q_len());
    let k_cache = u(cache_len);
    let v_cache = u(cache_len);
    let k_new = u(b * new * hkv * d);
    let v_new = u(b * new * hkv * d);
    // Lengths: empty, one key, the full cache, then lengths that are no multiple of a page or chunk.
    let most = cap - new;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let lens: Vec<i32> = (0..b)
        .map(|i| match i {
            0 => 0,
            1 => 1.min(most),
            2 => most,
            _ => rng.random_range(0..=most),
        } as i32)
        .collect();
    let table = match layout {
        KvLayout::Paged {
            num_pages,
            pages_per_seq,
            ..
        } => {
            let mut pages: Vec<i32> = (0..num_pages as i32).collect();
            pages.shuffle(&mut rng);
            (0..b * pages_per_seq).map(|i| pages[i % num_pages]).collect()
        }
        KvLayout::Contiguous { .. } => Vec::new(),
    };
    Step {
        spec,
        q,
        k_cache,
        v_cache,
        k_new,
        v_new,
        lens,
        table,
    }
}

impl Step {
    /// The caches after the step's append, on the host.
    fn appended(&self) -> (Vec<f64>, Vec<f64>) {
        let a = self.spec.attend();
        let (hkv, d, new) = (a.heads_kv(), a.head_dim(), self.spec.new_tokens());
        let (mut k, mut v) = (self.k_cache.clone(), self.v_cache.clone());
        for b in 0..a.batch() {
            for t in 0..new {
                let j = self.lens[b] as usize + t;
                let row = self.spec.cache_row(b, j, &self.table).expect("row in the pool");
                for h in 0..hkv {
                    let src = ((b * new + t) * hkv + h) * d;
                    let dst = (row * hkv + h) * d;
                    k[dst..dst + d].copy_from_slice(&self.k_new[src..src + d]);
                    v[dst..dst + d].copy_from_slice(&self.v_new[src..src + d]);
                }
            }
        }
        (k, v)
    }

    /// The reference o and LSE (f64) and the naive same-dtype baseline's: the appended cache gathered
    /// into a dense [B, capacity, Hkv, D] key-padded problem.
    fn reference<T: Element>(&self) -> (AttnSpec, Vec<f64>, Vec<f64>, common::Outputs) {
        let a = self.spec.attend();
        let dense = self.spec.attend_with_lengths(&self.lens).expect("lengths fit");
        let (hkv, d, cap) = (a.heads_kv(), a.head_dim(), self.spec.capacity());
        let (kc, vc) = self.appended();
        let mut k = vec![0.0; a.batch() * cap * hkv * d];
        let mut v = k.clone();
        for b in 0..a.batch() {
            let used = self.lens[b] as usize + self.spec.new_tokens();
            for j in 0..used {
                let row = self.spec.cache_row(b, j, &self.table).expect("row");
                for h in 0..hkv {
                    let src = (row * hkv + h) * d;
                    let dst = ((b * cap + j) * hkv + h) * d;
                    k[dst..dst + d].copy_from_slice(&kc[src..src + d]);
                    v[dst..dst + d].copy_from_slice(&vc[src..src + d]);
                }
            }
        }
        let x = Inputs {
            q: &self.q,
            k: &k,
            v: &v,
            bias: None,
        };
        let r = forward_f64(&dense, x).expect("reference");
        let d_o = vec![0.0; dense.o_len()];
        let base = common::naive::<T>(&dense, x, &d_o);
        (dense, r.o, r.stats, base)
    }
}

/// What one step on the GPU produced: o, LSE and the two caches after it.
struct Got {
    o: Vec<f64>,
    lse: Vec<f64>,
    k_cache: Vec<f64>,
    v_cache: Vec<f64>,
}

/// Device buffers of one step.
struct Dev<T> {
    q: CudaSlice<T>,
    k_cache: CudaSlice<T>,
    v_cache: CudaSlice<T>,
    k_new: Option<CudaSlice<T>>,
    v_new: Option<CudaSlice<T>>,
    lens: CudaSlice<i32>,
    table: Option<CudaSlice<i32>>,
    o: CudaSlice<T>,
    lse: CudaSlice<f32>,
}

impl<T: DeviceElem> Dev<T> {
    fn new(s: &Arc<CudaStream>, step: &Step) -> Self {
        let a = step.spec.attend();
        let new = step.spec.new_tokens() > 0;
        Dev {
            q: upload(s, &to_t::<T>(&step.q)),
            k_cache: upload(s, &to_t::<T>(&step.k_cache)),
            v_cache: upload(s, &to_t::<T>(&step.v_cache)),
            k_new: new.then(|| upload(s, &to_t::<T>(&step.k_new))),
            v_new: new.then(|| upload(s, &to_t::<T>(&step.v_new))),
            lens: upload(s, &step.lens),
            table: (!step.table.is_empty()).then(|| upload(s, &step.table)),
            o: upload(s, &vec![T::from_f64(f64::NAN); a.o_len()]),
            lse: upload(s, &vec![f32::NAN; a.stats_len()]),
        }
    }

    fn run(
        &mut self,
        g: &CudaAttn,
        spec: &KvCacheSpec,
        ws: &mut attn_cuda::KvCacheWorkspace,
    ) -> Result<(), String> {
        g.forward_kv_cache(
            spec,
            KvCacheIo {
                q: &self.q,
                k_cache: &mut self.k_cache,
                v_cache: &mut self.v_cache,
                k_new: self.k_new.as_ref(),
                v_new: self.v_new.as_ref(),
                cache_seqlens: &self.lens,
                block_table: self.table.as_ref(),
                o: &mut self.o,
                lse: &mut self.lse,
            },
            ws,
        )
        .map_err(|e| e.to_string())
    }

    fn get(&self, s: &Arc<CudaStream>) -> Got {
        s.synchronize().expect("sync");
        Got {
            o: widen(&download(s, &self.o)),
            lse: download(s, &self.lse).iter().map(|&x| x as f64).collect(),
            k_cache: widen(&download(s, &self.k_cache)),
            v_cache: widen(&download(s, &self.v_cache)),
        }
    }
}

/// The LSE within the naive baseline's rule, `atol` 4e-3 (bf16 decode).
fn check_lse(got: &[f64], reference: &[f64], base: &[f64]) -> Result<(), String> {
    attn_cpu_ref::testing::naive::check_lse(got, reference, base, 4.0 * 1e-3)
}

/// The step's o and LSE against the reference, and the caches: exactly the appended image.
fn check_step<T: Element>(step: &Step, got: &Got) -> Result<(), String> {
    let (k_app, v_app) = step.appended();
    for (what, g, want) in [
        ("k_cache", &got.k_cache, &k_app),
        ("v_cache", &got.v_cache, &v_app),
    ] {
        if let Some(i) = (0..want.len()).find(|&i| g[i].to_bits() != want[i].to_bits()) {
            return Err(format!(
                "{what}[{i}] = {} after the append, expected {}",
                g[i], want[i]
            ));
        }
    }
    let (_, o, lse, base) = step.reference::<T>();
    let atol = 4.0 * T::DTYPE.unit_roundoff() * max_abs(&o).max(1e-3);
    check_close("o", &got.o, &o, &base.o, atol)?;
    check_lse(&got.lse, &lse, &base.lse)
}

fn layouts() -> Vec<(String, KvLayout)> {
    let mut v = vec![("contiguous".to_string(), KvLayout::Contiguous { capacity: 700 })];
    for ps in [16, 32, 64, 128, 256] {
        let pages_per_seq = 700usize.div_ceil(ps);
        v.push((
            format!("paged {ps}"),
            KvLayout::Paged {
                num_pages: 4 * pages_per_seq + 3,
                page_size: ps,
                pages_per_seq,
            },
        ));
    }
    v
}

fn kv_case<T: DeviceElem>(g: &CudaAttn, step: &Step) -> Result<(), String> {
    let s = g.stream();
    let mut ws = g.kv_cache_workspace(&step.spec).map_err(|e| e.to_string())?;
    let mut dev = Dev::<T>::new(s, step);
    dev.run(g, &step.spec, &mut ws)?;
    check_step::<T>(step, &dev.get(s))
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn kv_cache_steps_match_reference_contiguous_and_paged() {
    each_config(&decode_configs(), || {
        let g = gpu();
        let mut cases = Cases::new("kv_cache_step");
        let mut n = 0u64;
        for (lname, layout) in layouts() {
            for dtype in [DType::F16, DType::BF16, DType::F32] {
                for (hq, hkv) in [(4, 4), (8, 2), (8, 1)] {
                    for (seq_q, new) in [(1, 1), (3, 3), (16, 16), (1, 0), (2, 5)] {
                        n += 1;
                        let d = [64, 128, 256, 32, 96][(n % 5) as usize];
                        let family = if n % 3 == 0 { softcap() } else { Family::softmax() };
                        let label = format!(
                            "{lname} {dtype} D={d} Hq/Hkv={hq}/{hkv} seq_q={seq_q} new={new} seed={n}"
                        );
                        let r = match dtype {
                            DType::F16 => {
                                let st =
                                    random_step::<half::f16>(family, 4, hq, hkv, seq_q, new, d, layout, n);
                                kv_case::<half::f16>(g, &st)
                            }
                            DType::BF16 => {
                                let st =
                                    random_step::<half::bf16>(family, 4, hq, hkv, seq_q, new, d, layout, n);
                                kv_case::<half::bf16>(g, &st)
                            }
                            DType::F32 => {
                                let st = random_step::<f32>(family, 4, hq, hkv, seq_q, new, d, layout, n);
                                kv_case::<f32>(g, &st)
                            }
                        };
                        cases.record(label, r);
                    }
                }
            }
        }
        cases.finish();
    });
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn one_token_at_a_time_equals_causal_prefill_rows() {
    // Prefill of L tokens (causal, the flash kernels) against L decode steps of one token each into
    // an empty contiguous cache: step t's output is row t of the prefill's, both checked against
    // the reference, and the cache after the last step holds the prompt's keys and values.
    let g = gpu();
    let s = g.stream();
    let mut cases = Cases::new("token_by_token");
    for (hq, hkv, d) in [(4, 4, 64), (8, 2, 128), (8, 1, 256)] {
        let l = 77;
        let prefill = AttnProblem::new(Family::softmax(), DType::BF16, 1, hq, hkv, l, l, d)
            .with_causal(Causal::BottomRight)
            .validate()
            .expect("valid");
        let case = random_case(&prefill, 40 + d as u64);
        let round = |x: &[f64]| widen(&to_t::<half::bf16>(x));
        let (q, k, v) = (round(&case.q), round(&case.k), round(&case.v));
        let r = forward_f64(
            &prefill,
            Inputs {
                q: &q,
                k: &k,
                v: &v,
                bias: None,
            },
        )
        .expect("reference");
        let spec = KvCacheProblem::new(
            Family::softmax(),
            DType::BF16,
            1,
            hq,
            hkv,
            1,
            d,
            KvLayout::Contiguous { capacity: l },
        )
        .validate()
        .expect("valid");
        let mut ws = g.kv_cache_workspace(&spec).expect("workspace");
        let mut k_cache = upload(s, &vec![half::bf16::ZERO; l * hkv * d]);
        let mut v_cache = upload(s, &vec![half::bf16::ZERO; l * hkv * d]);
        let mut worst: Result<(), String> = Ok(());
        let mut got_o = vec![f64::NAN; prefill.o_len()];
        let mut got_lse = vec![f64::NAN; prefill.stats_len()];
        for t in 0..l {
            let qt = upload(s, &to_t::<half::bf16>(&q[t * hq * d..(t + 1) * hq * d]));
            let kt = upload(s, &to_t::<half::bf16>(&k[t * hkv * d..(t + 1) * hkv * d]));
            let vt = upload(s, &to_t::<half::bf16>(&v[t * hkv * d..(t + 1) * hkv * d]));
            let lens = upload(s, &[t as i32]);
            let mut o = upload(s, &vec![half::bf16::from_f64(f64::NAN); hq * d]);
            let mut lse = upload(s, &vec![f32::NAN; hq]);
            let run = g.forward_kv_cache(
                &spec,
                KvCacheIo {
                    q: &qt,
                    k_cache: &mut k_cache,
                    v_cache: &mut v_cache,
                    k_new: Some(&kt),
                    v_new: Some(&vt),
                    cache_seqlens: &lens,
                    block_table: None,
                    o: &mut o,
                    lse: &mut lse,
                },
                &mut ws,
            );
            if let Err(e) = run {
                worst = Err(format!("step {t}: {e}"));
                break;
            }
            got_o[t * hq * d..(t + 1) * hq * d].copy_from_slice(&widen(&download(s, &o)));
            for (h, &x) in download(s, &lse).iter().enumerate() {
                got_lse[h * l + t] = x as f64;
            }
        }
        if worst.is_ok() {
            let base = common::naive::<half::bf16>(
                &prefill,
                Inputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    bias: None,
                },
                &vec![0.0; prefill.o_len()],
            );
            let atol = 4.0 * DType::BF16.unit_roundoff() * max_abs(&r.o).max(1e-3);
            worst = check_close("o", &got_o, &r.o, &base.o, atol)
                .and_then(|()| check_lse(&got_lse, &r.stats, &base.lse));
        }
        if worst.is_ok() {
            let kc = widen(&download(s, &k_cache));
            if kc != k {
                worst = Err("the cache after the last step is not the prompt's keys".into());
            }
        }
        cases.record(format!("Hq/Hkv={hq}/{hkv} D={d} L={l}"), worst);
    }
    cases.finish();
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn graph_captured_step_replays_with_new_lengths() {
    // A step captured on a stream of its own context (event tracking off: the graph must hold the
    // launches only), replayed after new lengths are written into the same device buffer, against
    // the same step run uncaptured on a fresh copy of the caches.
    let ctx = CudaContext::new(0).expect("GPU 0");
    // SAFETY: every buffer of this test is used on `s` alone, in stream order.
    unsafe { ctx.disable_event_tracking() };
    let s = ctx.new_stream().expect("stream");
    let cfg = KernelConfig::default();
    let g = CudaAttn::with_config(s.clone(), cfg).expect("backend");
    let mut cases = Cases::new("graph_replay");
    for (lname, layout) in layouts() {
        let step = random_step::<half::bf16>(Family::softmax(), 4, 8, 2, 1, 1, 128, layout, 99);
        let mut ws = g.kv_cache_workspace(&step.spec).expect("workspace");
        // One uncaptured step first: modules and functions load outside the capture.
        let mut warm = Dev::<half::bf16>::new(&s, &step);
        let warmed = warm.run(&g, &step.spec, &mut ws);
        let mut dev = Dev::<half::bf16>::new(&s, &step);
        s.synchronize().expect("sync");
        let r: Result<(), String> = (|| {
            warmed?;
            s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(|e| e.to_string())?;
            let run = dev.run(&g, &step.spec, &mut ws);
            let graph = s
                .end_capture(sys::CUgraphInstantiate_flags(0))
                .map_err(|e| e.to_string())?;
            run?;
            let graph = graph.ok_or("capture recorded no graph")?;
            // New lengths (and fresh outputs, caches) in the same buffers, then replay.
            let mut moved = step
                .lens
                .iter()
                .map(|&l| (l + 37).min(step.spec.capacity() as i32 - 1))
                .collect::<Vec<_>>();
            moved[0] = 5;
            let step2 = Step {
                lens: moved,
                spec: step.spec.clone(),
                q: step.q.clone(),
                k_cache: step.k_cache.clone(),
                v_cache: step.v_cache.clone(),
                k_new: step.k_new.clone(),
                v_new: step.v_new.clone(),
                table: step.table.clone(),
            };
            s.memcpy_htod(&step2.lens, &mut dev.lens)
                .map_err(|e| e.to_string())?;
            s.memcpy_htod(&to_t::<half::bf16>(&step2.k_cache), &mut dev.k_cache)
                .map_err(|e| e.to_string())?;
            s.memcpy_htod(&to_t::<half::bf16>(&step2.v_cache), &mut dev.v_cache)
                .map_err(|e| e.to_string())?;
            s.memcpy_htod(
                &vec![half::bf16::from_f64(f64::NAN); step.spec.attend().o_len()],
                &mut dev.o,
            )
            .map_err(|e| e.to_string())?;
            graph.launch().map_err(|e| e.to_string())?;
            let replayed = dev.get(&s);
            check_step::<half::bf16>(&step2, &replayed).map_err(|e| format!("replayed: {e}"))?;
            let mut fresh = Dev::<half::bf16>::new(&s, &step2);
            fresh.run(&g, &step.spec, &mut ws)?;
            let direct = fresh.get(&s);
            if direct
                .o
                .iter()
                .zip(&replayed.o)
                .any(|(a, b)| a.to_bits() != b.to_bits())
            {
                return Err("the replayed o differs from the uncaptured step's".into());
            }
            Ok(())
        })();
        cases.record(lname, r);
    }
    cases.finish();
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn kv_cache_rejects_bad_buffers_with_typed_errors() {
    let g = gpu();
    let s = g.stream();
    let step = random_step::<half::bf16>(
        Family::softmax(),
        2,
        4,
        2,
        1,
        1,
        64,
        KvLayout::Contiguous { capacity: 64 },
        3,
    );
    let mut ws = g.kv_cache_workspace(&step.spec).expect("workspace");
    let mut dev = Dev::<half::bf16>::new(s, &step);
    // A block table for a contiguous cache.
    let table = upload(s, &[0i32; 4]);
    let e = g
        .forward_kv_cache(
            &step.spec,
            KvCacheIo {
                q: &dev.q,
                k_cache: &mut dev.k_cache,
                v_cache: &mut dev.v_cache,
                k_new: dev.k_new.as_ref(),
                v_new: dev.v_new.as_ref(),
                cache_seqlens: &dev.lens,
                block_table: Some(&table),
                o: &mut dev.o,
                lse: &mut dev.lse,
            },
            &mut ws,
        )
        .expect_err("rejected");
    assert!(e.to_string().contains("block_table"), "{e}");
    // Missing new tokens.
    let e = g
        .forward_kv_cache(
            &step.spec,
            KvCacheIo {
                q: &dev.q,
                k_cache: &mut dev.k_cache,
                v_cache: &mut dev.v_cache,
                k_new: None,
                v_new: None,
                cache_seqlens: &dev.lens,
                block_table: None,
                o: &mut dev.o,
                lse: &mut dev.lse,
            },
            &mut ws,
        )
        .expect_err("rejected");
    assert!(e.to_string().contains("k_new"), "{e}");
    // A workspace of another step.
    let other = random_step::<half::bf16>(
        Family::softmax(),
        3,
        4,
        2,
        1,
        1,
        64,
        KvLayout::Contiguous { capacity: 64 },
        4,
    );
    let mut ws2 = g.kv_cache_workspace(&other.spec).expect("workspace");
    let e = dev.run(g, &step.spec, &mut ws2).expect_err("rejected");
    assert!(e.contains("workspace"), "{e}");
    // A short cache buffer.
    let mut short = upload(s, &[half::bf16::ZERO; 10]);
    let e = g
        .forward_kv_cache(
            &step.spec,
            KvCacheIo {
                q: &dev.q,
                k_cache: &mut short,
                v_cache: &mut dev.v_cache,
                k_new: dev.k_new.as_ref(),
                v_new: dev.v_new.as_ref(),
                cache_seqlens: &dev.lens,
                block_table: None,
                o: &mut dev.o,
                lse: &mut dev.lse,
            },
            &mut ws,
        )
        .expect_err("rejected");
    assert!(e.to_string().contains("k_cache"), "{e}");
    // A head dim no kernel has: Unsupported, never a silent result.
    let layout = KvLayout::Contiguous { capacity: 64 };
    let st = random_step::<half::bf16>(Family::softmax(), 1, 4, 2, 1, 1, 80, layout, 5);
    let mut ws = g.kv_cache_workspace(&st.spec).expect("workspace");
    let mut dev = Dev::<half::bf16>::new(s, &st);
    let e = dev.run(g, &st.spec, &mut ws).expect_err("head dim 80 rejected");
    assert!(e.contains("head dim"), "{e}");
}
