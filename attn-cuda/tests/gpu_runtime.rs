//! The runtime's contract: no GPU → a typed error (never a panic); bad input → a typed error that
//! names the argument and shapes, with outputs untouched; the AttnBackend entry point on device
//! slices agrees with the view entry point.

mod common;

use attn_core::{
    Aggregation, AttnBackend, AttnError, AttnProblem, AttnSpec, Causal, DType, Family, FamilySpec, ForwardIo,
    HypScore, InputStrides, Strides,
};
use attn_cuda::cudarc::driver::CudaSlice;
use attn_cuda::{CudaAttn, CudaAttnError, ForwardViews};
use common::gpu;
use half::bf16;

#[test]
fn creating_the_backend_never_panics() {
    // On a machine without a driver this is NoGpu; with one it succeeds.
    match CudaAttn::new(0) {
        Ok(_) | Err(CudaAttnError::NoGpu { .. }) => {}
        Err(e) => panic!("unexpected error: {e}"),
    }
    match CudaAttn::new(usize::MAX) {
        Err(CudaAttnError::NoGpu { .. }) | Err(CudaAttnError::Cuda(_)) => {}
        other => panic!("a GPU index past the last one must fail, got {other:?}"),
    }
}

fn spec(d: usize) -> AttnSpec {
    AttnProblem::new(Family::softmax(), DType::BF16, 1, 2, 1, 37, 41, d)
        .validate()
        .expect("valid problem")
}

fn buf(n: usize) -> CudaSlice<bf16> {
    gpu()
        .stream()
        .clone_htod(&vec![bf16::from_f32(0.5); n.max(1)])
        .expect("upload")
}

fn forward(spec: &AttnSpec, q: &CudaSlice<bf16>, o: &mut CudaSlice<bf16>) -> Result<(), CudaAttnError> {
    let k = buf(spec.k_len());
    let v = buf(spec.v_len());
    let mut lse = gpu()
        .stream()
        .alloc_zeros::<f32>(spec.stats_len())
        .expect("alloc");
    gpu().forward(
        spec,
        ForwardIo {
            q,
            k: &k,
            v: &v,
            bias: None,
            o,
            stats: &mut lse,
        },
    )
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn short_buffers_are_shape_errors_naming_the_argument_and_leave_outputs_untouched() {
    let s = spec(64);
    let q = buf(s.q_len() - 1);
    let mut o = buf(s.o_len());
    let err = forward(&s, &q, &mut o).expect_err("q is one element short");
    let msg = err.to_string();
    assert!(
        matches!(err, CudaAttnError::Attn(AttnError::ShapeMismatch { .. })),
        "{msg}"
    );
    assert!(
        msg.contains("`q`") && msg.contains(&s.q_len().to_string()),
        "{msg}"
    );
    let after: Vec<bf16> = gpu().stream().clone_dtoh(&o).expect("download");
    assert!(after.iter().all(|x| x.to_f32() == 0.5), "o was written");
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn unsupported_head_dims_and_families_are_typed_errors() {
    for d in [48, 80, 16] {
        let s = spec(d);
        let q = buf(s.q_len());
        let mut o = buf(s.o_len());
        let err = forward(&s, &q, &mut o).expect_err("no softmax kernel at this head dim");
        assert!(
            matches!(err, CudaAttnError::Attn(AttnError::Unsupported { .. })),
            "D = {d}: {err}"
        );
        assert!(err.to_string().contains(&format!("head dim {d}")), "{err}");
    }
    // Hyperbolic kernels exist, but not for a value head dim that differs from D: a typed error
    // naming it, never a silent result.
    let hyperbolic = AttnProblem::new(
        Family::hyperbolic(HypScore::Geodesic, Aggregation::Euclidean),
        DType::BF16,
        1,
        1,
        1,
        8,
        8,
        64,
    )
    .with_head_dim_v(32)
    .validate()
    .expect("valid problem");
    let q = buf(hyperbolic.q_len());
    let mut o = buf(hyperbolic.o_len());
    let err = forward(&hyperbolic, &q, &mut o).expect_err("no hyperbolic kernel for Dv != D");
    assert!(
        matches!(err, CudaAttnError::Attn(AttnError::Unsupported { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("value head dim 32"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn dtype_mismatch_and_missing_bias_are_rejected() {
    let f16_spec = AttnProblem::new(Family::softmax(), DType::F16, 1, 1, 1, 8, 8, 64)
        .validate()
        .expect("valid problem");
    let q = buf(f16_spec.q_len());
    let mut o = buf(f16_spec.o_len());
    let err = forward(&f16_spec, &q, &mut o).expect_err("bf16 buffers for an f16 spec");
    assert!(err.to_string().contains("dtype"), "{err}");
    let biased = AttnProblem::new(Family::softmax(), DType::BF16, 1, 1, 1, 8, 8, 64)
        .with_bias(1, 1)
        .validate()
        .expect("valid problem");
    let err = forward(&biased, &q, &mut o).expect_err("the spec has a bias and none is given");
    assert!(err.to_string().contains("bias"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn misaligned_rows_are_unsupported_not_wrong() {
    // A seq stride of 68 elements (not a multiple of 8): rows are not 16-byte aligned.
    let st = |n: usize| Strides {
        batch: n * 68,
        seq: 68,
        head: 0,
        dim: 1,
    };
    let s = AttnProblem::new(Family::softmax(), DType::BF16, 1, 1, 1, 9, 9, 64)
        .with_strides(InputStrides {
            q: st(9),
            k: st(9),
            v: st(9),
        })
        .validate()
        .expect("valid problem");
    let q = buf(s.q_len());
    let mut o = buf(s.o_len());
    let err = forward(&s, &q, &mut o).expect_err("misaligned strides");
    assert!(
        matches!(err, CudaAttnError::Attn(AttnError::Unsupported { .. })),
        "{err}"
    );
    // A view starting 3 elements into its buffer is misaligned too.
    let s = spec(64);
    let big = buf(s.q_len() + 3);
    let k = buf(s.k_len());
    let v = buf(s.v_len());
    let mut o = buf(s.o_len());
    let mut lse = gpu().stream().alloc_zeros::<f32>(s.stats_len()).expect("alloc");
    let err = gpu()
        .forward_views(
            &s,
            ForwardViews {
                q: big.slice(3..),
                k: k.slice(..),
                v: v.slice(..),
                bias: None,
                o: o.slice_mut(..),
                lse: lse.slice_mut(..),
            },
        )
        .expect_err("misaligned view");
    assert!(err.to_string().contains("aligned"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn slice_backend_and_views_agree_bit_for_bit() {
    let s = spec(128);
    let case = attn_cpu_ref::testing::random_case(&s, 5);
    let to = |x: &[f64]| -> CudaSlice<bf16> {
        let v: Vec<bf16> = x.iter().map(|&e| bf16::from_f64(e)).collect();
        gpu().stream().clone_htod(&v).expect("upload")
    };
    let (q, k, v) = (to(&case.q), to(&case.k), to(&case.v));
    let mut o1 = buf(s.o_len());
    let mut o2 = buf(s.o_len());
    let mut l1 = gpu().stream().alloc_zeros::<f32>(s.stats_len()).expect("alloc");
    let mut l2 = gpu().stream().alloc_zeros::<f32>(s.stats_len()).expect("alloc");
    gpu()
        .forward(
            &s,
            ForwardIo {
                q: &q,
                k: &k,
                v: &v,
                bias: None,
                o: &mut o1,
                stats: &mut l1,
            },
        )
        .expect("forward");
    gpu()
        .forward_views(
            &s,
            ForwardViews {
                q: q.slice(..),
                k: k.slice(..),
                v: v.slice(..),
                bias: None,
                o: o2.slice_mut(..),
                lse: l2.slice_mut(..),
            },
        )
        .expect("forward");
    let a: Vec<bf16> = gpu().stream().clone_dtoh(&o1).expect("download");
    let b: Vec<bf16> = gpu().stream().clone_dtoh(&o2).expect("download");
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    assert!(a.iter().any(|x| x.to_f32() != 0.5), "o was not written");
}

/// The families of the runtime tests below, as the family suites run them (Taylor order 1 with its
/// l2-norm and `f > 0`).
fn every_family() -> Vec<(&'static str, Family)> {
    vec![
        ("softmax", Family::softmax()),
        ("cosine_sim", Family::cosine_sim()),
        (
            "hyperbolic geodesic",
            Family::hyperbolic(HypScore::Geodesic, Aggregation::Euclidean),
        ),
        (
            "hyperbolic sq_lorentz",
            Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean),
        ),
        ("taylor1", common::taylor_family(1)),
        ("taylor2", common::taylor_family(2)),
    ]
}

/// Zero-length sequences and zero sizes on every family, dtype and mask, forward and backward: key
/// lengths of 0 (some, all), packed sequences with no query, no key or neither, a packed batch with no
/// query or no key at all, and `B = 0`, `Nq = 0`, `Nk = 0` (dense, key-padded, packed, with a bias
/// for the softmax-like families). Every call follows the reference (`common::check`, outputs
/// poisoned with NaN first): o = 0 and LSE −∞ (Taylor: den 0) on rows with no key, zero gradients for
/// them and for keys no query sees, empty buffers where a side is empty. Any error fails the case
/// (an empty call is written on the host: no kernel, no zero grid).
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn empty_sequences_and_zero_sizes_follow_the_reference() {
    let mut cases = common::Cases::new("empty_sequences_and_zero_sizes_follow_the_reference");
    for (fam, family) in every_family() {
        // The bias cases on the families whose naive baseline (`common::naive`) takes a bias.
        let with_bias = matches!(family, Family::Softmax(_) | Family::CosineSim(_));
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
                let p = |b, nq, nk| AttnProblem::new(family, dtype, b, 4, 2, nq, nk, 64);
                let mut problems = vec![
                    (
                        "key_lens [0, 130, 0]",
                        p(3, 70, 130).with_key_lens(vec![0, 130, 0]),
                    ),
                    ("key_lens [0, 0]", p(2, 70, 130).with_key_lens(vec![0, 0])),
                    (
                        "varlen (0,64) (70,0) (0,0) (65,129)",
                        p(4, 70, 129).with_varlen(
                            common::shapes::cu_seqlens(&[0, 70, 0, 65]),
                            common::shapes::cu_seqlens(&[64, 0, 0, 129]),
                        ),
                    ),
                    (
                        "varlen without queries",
                        p(2, 1, 100).with_varlen(vec![0, 0, 0], vec![0, 100, 164]),
                    ),
                    (
                        "varlen without keys",
                        p(2, 77, 1).with_varlen(vec![0, 77, 100], vec![0, 0, 0]),
                    ),
                    ("batch 0", p(0, 70, 130)),
                    ("seq_q 0", p(2, 0, 130)),
                    ("seq_k 0", p(2, 70, 0)),
                    ("seq_q 0 seq_k 0", p(2, 0, 0)),
                    ("seq_k 0 key_lens [0, 0]", p(2, 70, 0).with_key_lens(vec![0, 0])),
                    ("varlen batch 0", p(0, 70, 130).with_varlen(vec![0], vec![0])),
                    ("seq_q 1 seq_k 0 (decode shape)", p(3, 1, 0)),
                ];
                if with_bias {
                    problems.push(("seq_k 0 bias", p(2, 70, 0).with_bias(2, 1)));
                    problems.push(("seq_q 0 bias", p(2, 0, 130).with_bias(1, 4)));
                }
                for (label, p) in problems {
                    let spec = p.with_causal(causal).validate().expect("a valid problem");
                    let label = format!("{fam} {dtype} {causal:?} {label}");
                    // An empty tensor is uploaded as a one-element buffer (`common::upload`).
                    cases.record(label, empty_case(&spec));
                }
            }
        }
    }
    cases.finish();
}

/// One case of `empty_sequences_and_zero_sizes_follow_the_reference`: the documented rows exactly
/// ([`documented`]), then the accuracy of the rest against the reference with the naive baseline of
/// the family (softmax, cosine-sim: `common::check`; hyperbolic: `common::hyperbolic::check_points`;
/// Taylor's accuracy under masks is gpu_taylor's, its rows here are checked by [`documented`] only).
fn empty_case(spec: &AttnSpec) -> Result<(), String> {
    use common::hyperbolic::{check_points, Points};
    match spec.dtype() {
        DType::F32 => documented::<f32>(spec)?,
        DType::F16 => documented::<half::f16>(spec)?,
        DType::BF16 => documented::<bf16>(spec)?,
    }
    let points = Points::Scaled { radius: 1.5 };
    match (spec.family(), spec.dtype()) {
        (FamilySpec::Softmax { .. } | FamilySpec::CosineSim { .. }, _) => common::check_dtype(spec, 17, 0),
        (FamilySpec::Hyperbolic { .. }, DType::F32) => check_points::<f32>(spec, 17, 0, points),
        (FamilySpec::Hyperbolic { .. }, DType::F16) => check_points::<half::f16>(spec, 17, 0, points),
        (FamilySpec::Hyperbolic { .. }, DType::BF16) => check_points::<bf16>(spec, 17, 0, points),
        (FamilySpec::Taylor { .. }, _) => Ok(()),
    }
}

/// The GPU's result on the rows and keys with nothing to attend, exactly (outputs poisoned with NaN
/// first by `common::run_gpu`): o and dq zeros and the statistic −∞ (Taylor 0) on every row with no
/// key, dk and dv zeros on every key no row sees, dbias zeros on an empty call; everything finite.
fn documented<T: attn_cuda::DeviceElem>(spec: &AttnSpec) -> Result<(), String> {
    let mut case = attn_cpu_ref::testing::random_case(spec, 23);
    for x in [&mut case.q, &mut case.k, &mut case.v, &mut case.d_o] {
        x.iter_mut().for_each(|v| *v = T::from_f64(*v).to_f64());
    }
    if let Some(b) = case.bias.as_mut() {
        b.iter_mut().for_each(|v| *v = T::from_f64(*v).to_f64());
    }
    let got = common::run_gpu::<T>(spec, &case, 0)?;
    let no_key = if spec.family().is_softmax_like() {
        f64::NEG_INFINITY
    } else {
        0.0
    };
    let (d, dv) = (spec.head_dim(), spec.head_dim_v());
    for (what, x) in [("o", &got.o), ("dq", &got.dq), ("dk", &got.dk), ("dv", &got.dv)] {
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(format!("{what}[{i}] = {}", x[i]));
        }
    }
    for b in 0..spec.batch() {
        let lens = spec.seq_lens(b);
        for i in (0..lens.q).filter(|&i| spec.key_range(b, i).is_empty()) {
            for h in 0..spec.heads_q() {
                let o = &got.o[spec.o_offset(b, i, h)..][..dv];
                let dq = &got.dq[spec.dq_offset(b, i, h)..][..d];
                let st = got.lse[spec.stats_index(b, h, i)];
                if o.iter().chain(dq).any(|&x| x != 0.0) || st != no_key {
                    return Err(format!(
                        "row (b {b}, i {i}, h {h}) has no key: o {o:?}, dq {dq:?}, statistic {st}"
                    ));
                }
            }
        }
        for j in (0..lens.k).filter(|&j| (0..lens.q).all(|i| !spec.key_range(b, i).contains(&j))) {
            for hk in 0..spec.heads_kv() {
                let dk = &got.dk[spec.dk_offset(b, j, hk)..][..d];
                let dvr = &got.dv[spec.dv_offset(b, j, hk)..][..dv];
                if dk.iter().chain(dvr).any(|&x| x != 0.0) {
                    return Err(format!(
                        "key (b {b}, j {j}, hk {hk}) no row sees: dk or dv nonzero"
                    ));
                }
            }
        }
    }
    if spec.total_q() == 0 || spec.total_k() == 0 {
        if let Some(db) = &got.dbias {
            if db.iter().any(|&x| x != 0.0) {
                return Err("dbias of an empty call is not zero".into());
            }
        }
    }
    Ok(())
}

/// Eight host threads, each with its own `CudaAttn` on its own stream of the one context, run forward
/// and backward of different families at once (softmax, cosine-sim, hyperbolic, Taylor orders 1 and 2;
/// bf16, deterministic backward), three rounds each; every output and gradient is bit-identical to
/// the same call run on one thread. Covers the shared per-context module and function cache under
/// concurrent first loads, and each call's scratch on its own stream.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn eight_threads_on_their_own_streams_match_a_serial_run() {
    use common::bench::Bufs;
    let families = every_family();
    let specs: Vec<(String, AttnSpec)> = (0..8)
        .map(|t| {
            let (name, family) = families[t % families.len()];
            let (n, causal) = if t < families.len() {
                (1000, Causal::BottomRight)
            } else {
                (777, Causal::None)
            };
            let spec = AttnProblem::new(family, DType::BF16, 2, 4, 2, n, n + 64 * t, 64)
                .with_causal(causal)
                .with_deterministic(true)
                .validate()
                .expect("valid");
            (format!("thread {t}: {name} {causal:?} N = {n}"), spec)
        })
        .collect();
    let run = |g: &CudaAttn, spec: &AttnSpec| -> Vec<Vec<u16>> {
        let mut b = Bufs::new(g, spec);
        common::bench::forward_backward(g, spec, &mut b);
        let s = g.stream();
        let bits = |x: &CudaSlice<bf16>| -> Vec<u16> {
            let v: Vec<bf16> = s.clone_dtoh(x).expect("download");
            v.iter().map(|x| x.to_bits()).collect()
        };
        let stats: Vec<f32> = s.clone_dtoh(&b.stats).expect("download");
        let mut out = vec![bits(&b.o), bits(&b.dq), bits(&b.dk), bits(&b.dv)];
        out.push(
            stats
                .iter()
                .flat_map(|x| {
                    let u = x.to_bits();
                    [(u >> 16) as u16, u as u16]
                })
                .collect(),
        );
        out
    };
    let serial: Vec<Vec<Vec<u16>>> = specs.iter().map(|(_, s)| run(gpu(), s)).collect();
    let ctx = gpu().stream().context().clone();
    let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = specs
            .iter()
            .zip(&serial)
            .map(|((label, spec), want)| {
                let ctx = ctx.clone();
                scope.spawn(move || -> Result<(), String> {
                    let stream = ctx.new_stream().map_err(|e| format!("{label}: {e}"))?;
                    let g = CudaAttn::with_stream(stream);
                    for round in 0..3 {
                        let got = run(&g, spec);
                        for (name, (x, y)) in ["o", "dq", "dk", "dv", "stats"].iter().zip(got.iter().zip(want)) {
                            let diff = x.iter().zip(y).filter(|(a, b)| a != b).count();
                            if diff > 0 {
                                return Err(format!(
                                    "{label} round {round}: {diff} of {} elements of {name} differ from the serial run",
                                    y.len()
                                ));
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    let failures: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// o, den and, for a prefill, the state it built.
type Run = (Vec<f64>, Vec<f64>, Option<attn_cuda::TaylorDecodeState>);

/// Taylor decode through empty prompts and steps (order 2, bf16, D = 64, B = 2, Hq/Hkv = 4/2): a
/// prefill of a batch of 0; a causal prefill of 0 tokens, a step of 0 tokens (nothing written or
/// appended), then a step of 1 token; a non-causal prefill of 0 queries over 5 keys (its keys are
/// folded), then a step of 1 token. Each one-token step follows attn-cpu-ref's decode on the same
/// state (o within 2u + 1e-5 relative, den within 1e-5).
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_decode_with_empty_prompts_and_steps_follows_the_cpu_decode() {
    use attn_cpu_ref::decode::{prefill_f64, step_f64};
    use attn_cpu_ref::testing::{max_abs, max_abs_diff, random_case};
    let g = gpu();
    let s = g.stream();
    let family = common::taylor_family(2);
    let mk = |b: usize, nq: usize, nk: usize, causal: Causal| {
        AttnProblem::new(family, DType::BF16, b, 4, 2, nq, nk, 64)
            .with_causal(causal)
            .validate()
            .expect("valid")
    };
    // One element at least: a zero-byte device allocation is a driver error.
    let up = |x: &[f64]| {
        let mut v: Vec<bf16> = x.iter().map(|&e| bf16::from_f64(e)).collect();
        if v.is_empty() {
            v.push(bf16::from_f64(f64::NAN));
        }
        s.clone_htod(&v).expect("upload")
    };
    let round = |c: &mut attn_cpu_ref::testing::Case| {
        for x in [&mut c.q, &mut c.k, &mut c.v] {
            x.iter_mut().for_each(|e| *e = bf16::from_f64(*e).to_f64());
        }
    };
    // Runs `spec` as a prefill (state None) or a step; returns o and den as f64.
    let run = |spec: &AttnSpec,
               c: &attn_cpu_ref::testing::Case,
               state: Option<&mut attn_cuda::TaylorDecodeState>|
     -> Result<Run, String> {
        let (q, k, v) = (up(&c.q), up(&c.k), up(&c.v));
        let mut o = up(&vec![f64::NAN; spec.o_len()]);
        let mut den = s
            .clone_htod(&vec![f32::NAN; spec.stats_len().max(1)])
            .expect("upload");
        let views = ForwardViews {
            q: q.slice(..),
            k: k.slice(..),
            v: v.slice(..),
            bias: None,
            o: o.slice_mut(..),
            lse: den.slice_mut(..),
        };
        let built = match state {
            None => Some(g.taylor_prefill(spec, views).map_err(|e| e.to_string())?),
            Some(st) => {
                g.taylor_decode_step(st, spec, views).map_err(|e| e.to_string())?;
                None
            }
        };
        let o: Vec<f64> = s
            .clone_dtoh(&o)
            .expect("download")
            .iter()
            .map(|x| x.to_f64())
            .collect();
        let den: Vec<f64> = s
            .clone_dtoh(&den)
            .expect("download")
            .iter()
            .map(|&x| x as f64)
            .collect();
        Ok((
            o[..spec.o_len()].to_vec(),
            den[..spec.stats_len()].to_vec(),
            built,
        ))
    };
    let mut cases = common::Cases::new("taylor_decode_with_empty_prompts_and_steps");
    // A batch of 0.
    let spec = mk(0, 3, 3, Causal::BottomRight);
    let c = random_case(&spec, 1);
    cases.record("prefill of a batch of 0", run(&spec, &c, None).map(|_| ()));
    for (label, prompt) in [
        ("causal prefill of 0 tokens", mk(2, 0, 0, Causal::BottomRight)),
        (
            "non-causal prefill of 0 queries over 5 keys",
            mk(2, 0, 5, Causal::None),
        ),
    ] {
        let r = (|| -> Result<(), String> {
            let mut pc = random_case(&prompt, 2);
            round(&mut pc);
            let (_, mut cpu) = prefill_f64(&prompt, pc.inputs()).map_err(|e| e.to_string())?;
            let (o, den, state) = run(&prompt, &pc, None)?;
            if !(o.is_empty() && den.is_empty()) {
                return Err(format!("prefill: o {} and den {} elements", o.len(), den.len()));
            }
            let mut state = state.ok_or("prefill returned no state")?;
            let empty = mk(2, 0, 0, Causal::BottomRight);
            let ec = random_case(&empty, 3);
            run(&empty, &ec, Some(&mut state))?;
            step_f64(&mut cpu, &empty, ec.inputs()).map_err(|e| e.to_string())?;
            let one = mk(2, 1, 1, Causal::BottomRight);
            let mut c1 = random_case(&one, 4);
            round(&mut c1);
            let want = step_f64(&mut cpu, &one, c1.inputs()).map_err(|e| e.to_string())?;
            let (o, den, _) = run(&one, &c1, Some(&mut state))?;
            let (eo, ed) = (max_abs_diff(&o, &want.o), max_abs_diff(&den, &want.stats));
            let u = DType::BF16.unit_roundoff();
            let (to, td) = (
                (2.0 * u + 1e-5) * max_abs(&want.o).max(1e-3),
                1e-5 * max_abs(&want.stats).max(1.0),
            );
            if eo <= to && ed <= td {
                Ok(())
            } else {
                Err(format!(
                    "one-token step: o error {eo:.3e} (tol {to:.3e}), den error {ed:.3e} (tol {td:.3e})"
                ))
            }
        })();
        cases.record(label, r);
    }
    cases.finish();
}

/// KV-cache steps with an empty batch or no query (bf16, D = 64, Hq/Hkv = 4/2, contiguous cache of
/// 40 slots, 3 new tokens): a batch of 0 returns without a launch; `seq_q = 0` appends the new tokens
/// exactly as attn-cpu-ref's step does (the caches compared bit for bit) and attends nothing.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn kv_cache_steps_with_an_empty_batch_or_no_query() {
    use attn_core::{KvCacheProblem, KvLayout};
    let g = gpu();
    let s = g.stream();
    let (hq, hkv, d, cap, new) = (4, 2, 64, 40, 3);
    let layout = KvLayout::Contiguous { capacity: cap };
    let mut cases = common::Cases::new("kv_cache_steps_with_an_empty_batch_or_no_query");
    let up = |x: &[bf16]| {
        let nan = [bf16::from_f64(f64::NAN)];
        s.clone_htod(if x.is_empty() { &nan[..] } else { x })
            .expect("upload")
    };
    let up_i = |x: &[i32]| {
        s.clone_htod(if x.is_empty() { &[0][..] } else { x })
            .expect("upload")
    };
    for b in [0usize, 2] {
        let label = format!("B = {b}, seq_q = 0");
        let r = (|| -> Result<(), String> {
            let spec = KvCacheProblem::new(Family::softmax(), DType::BF16, b, hq, hkv, 0, d, layout)
                .with_new_tokens(new)
                .validate()
                .map_err(|e| e.to_string())?;
            let rnd = |n: usize, seed: u64| -> Vec<bf16> {
                (0..n)
                    .map(|i| bf16::from_f64(((i as u64 * 2654435761 + seed) % 1000) as f64 / 500.0 - 1.0))
                    .collect()
            };
            let cache_len = b * cap * hkv * d;
            let (k0, v0) = (rnd(cache_len, 1), rnd(cache_len, 2));
            let (kn, vn) = (rnd(b * new * hkv * d, 3), rnd(b * new * hkv * d, 4));
            let lens: Vec<i32> = (0..b as i32).map(|i| 5 + 7 * i).collect();
            // The CPU step.
            let (mut kc, mut vc) = (k0.clone(), v0.clone());
            attn_cpu_ref::kv_cache::forward_kv_cache(
                &spec,
                attn_cpu_ref::kv_cache::KvCacheIo {
                    q: &[],
                    k_cache: &mut kc,
                    v_cache: &mut vc,
                    k_new: Some(&kn),
                    v_new: Some(&vn),
                    cache_seqlens: &lens,
                    block_table: None,
                },
            )
            .map_err(|e| format!("cpu: {e}"))?;
            // The GPU step.
            let mut ws = g.kv_cache_workspace(&spec).map_err(|e| e.to_string())?;
            let q = up(&[]);
            let (mut dk, mut dv) = (up(&k0), up(&v0));
            let (dkn, dvn) = (up(&kn), up(&vn));
            let dl = up_i(&lens);
            let mut o = up(&[]);
            let mut lse = s.clone_htod(&[f32::NAN]).expect("upload");
            g.forward_kv_cache(
                &spec,
                attn_cuda::KvCacheIo {
                    q: &q,
                    k_cache: &mut dk,
                    v_cache: &mut dv,
                    k_new: Some(&dkn),
                    v_new: Some(&dvn),
                    cache_seqlens: &dl,
                    block_table: None,
                    o: &mut o,
                    lse: &mut lse,
                },
                &mut ws,
            )
            .map_err(|e| e.to_string())?;
            s.synchronize().map_err(|e| e.to_string())?;
            if b > 0 {
                let gk: Vec<bf16> = s.clone_dtoh(&dk).expect("download");
                let gv: Vec<bf16> = s.clone_dtoh(&dv).expect("download");
                if gk != kc || gv != vc {
                    return Err("the appended caches differ from attn-cpu-ref's".into());
                }
            }
            Ok(())
        })();
        cases.record(label, r);
    }
    cases.finish();
}
