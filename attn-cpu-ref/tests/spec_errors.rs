//! Invalid input returns the right typed error and never panics: every case runs under
//! `catch_unwind`, and a panic fails the test.

mod common;

use attn_core::{
    f16, AttnBackend, AttnError, AttnProblem, BackwardIo, BiasShape, DType, Family, ForwardIo,
    HyperbolicParams, InputStrides, Layout, SeqLengths, SoftmaxParams, Strides, TaylorParams, Window,
};
use attn_cpu_ref::testing::random_case;
use attn_cpu_ref::{backward, forward, CpuRef, Inputs};
use common::{problem, run_cases, softmax_like_family};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};

fn fail(e: impl ToString) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// Run `f`, which must return an error without panicking.
fn error_of<T: Debug>(f: impl FnOnce() -> Result<T, AttnError>) -> Result<AttnError, TestCaseError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Err(_) => Err(fail("panicked instead of returning an error")),
        Ok(Ok(v)) => Err(fail(format!("accepted invalid input: {v:?}"))),
        Ok(Err(e)) => Ok(e),
    }
}

/// The error must be `InvalidArgument` for `arg`.
fn invalid(e: AttnError, arg: &str) -> Result<(), TestCaseError> {
    match e {
        AttnError::InvalidArgument { arg: a, .. } if a == arg => Ok(()),
        other => Err(fail(format!(
            "expected InvalidArgument for `{arg}`, got {other:?}"
        ))),
    }
}

/// The error must be `ShapeMismatch` for `what`.
fn mismatch(e: AttnError, what: &str) -> Result<(), TestCaseError> {
    match e {
        AttnError::ShapeMismatch { what: w, .. } if w == what => Ok(()),
        other => Err(fail(format!(
            "expected ShapeMismatch for `{what}`, got {other:?}"
        ))),
    }
}

fn valid() -> impl Strategy<Value = AttnProblem> {
    problem(softmax_like_family())
}

fn shape(layout: Layout, b: usize, n: usize, h: usize, d: usize) -> Vec<usize> {
    match layout {
        Layout::Bnhd => vec![b, n, h, d],
        Layout::Bhnd => vec![b, h, n, d],
    }
}

#[test]
fn from_shapes_rejects_tensors_that_disagree() {
    let dims = (1..4usize, 1..9usize, 1..9usize, 1..4usize, 1..9usize, 1..9usize);
    run_cases(
        "from_shapes_rejects_tensors_that_disagree",
        128,
        (
            dims,
            prop_oneof![Just(Layout::Bnhd), Just(Layout::Bhnd)],
            0..6u8,
            1..4usize,
        ),
        |((b, nq, nk, h, d, dv), layout, how, delta)| {
            let mut q = shape(layout, b, nq, h, d);
            let mut k = shape(layout, b, nk, h, d);
            let mut v = shape(layout, b, nk, h, dv);
            let (seq, heads) = match layout {
                Layout::Bnhd => (1, 2),
                Layout::Bhnd => (2, 1),
            };
            let what = match how {
                0 => {
                    q.pop();
                    "q"
                }
                1 => {
                    v.push(1);
                    "v"
                }
                2 => {
                    k[0] += delta;
                    "k"
                }
                3 => {
                    k[3] += delta;
                    "k"
                }
                4 => {
                    v[seq] += delta;
                    "v"
                }
                _ => {
                    v[heads] += delta;
                    "v"
                }
            };
            let e = error_of(|| AttnProblem::from_shapes(Family::softmax(), DType::F32, layout, &q, &k, &v))?;
            mismatch(e, what)
        },
    );
}

/// Zero heads and ungrouped heads are errors naming the argument. (A batch or a sequence of 0 is a
/// valid, empty call: tests/zero_lengths.rs.)
#[test]
fn zero_heads_and_ungrouped_heads_are_rejected() {
    run_cases(
        "zero_heads_and_ungrouped_heads_are_rejected",
        128,
        (valid(), 0..3u8, 2..5usize),
        |(mut p, how, m)| {
            let arg = match how {
                0 => {
                    p.heads_q = 0;
                    "heads_q"
                }
                1 => {
                    p.heads_kv = 0;
                    "heads_kv"
                }
                _ => {
                    // Hq = m·Hkv + 1 is never a multiple of Hkv ≥ 2.
                    p.heads_kv = m;
                    p.heads_q = m * p.heads_q + 1;
                    p.bias = None;
                    "heads_kv"
                }
            };
            invalid(error_of(|| p.validate())?, arg)
        },
    );
}

#[test]
fn head_dims_outside_one_to_256_are_rejected() {
    let bad = prop_oneof![Just(0usize), 257..100_000usize];
    run_cases(
        "head_dims_outside_one_to_256_are_rejected",
        64,
        (valid(), bad, any::<bool>()),
        |(mut p, d, value_side)| {
            if value_side {
                p.head_dim_v = d;
            } else {
                p.head_dim = d;
            }
            invalid(
                error_of(|| p.validate())?,
                if value_side { "head_dim_v" } else { "head_dim" },
            )
        },
    );
}

#[test]
fn key_lengths_beyond_seq_k_or_of_the_wrong_count_are_rejected() {
    run_cases(
        "key_lengths_beyond_seq_k_or_of_the_wrong_count_are_rejected",
        64,
        (valid(), 1..5usize, any::<bool>()),
        |(mut p, extra, count)| {
            if count {
                p.lengths = SeqLengths::KeyPadding(vec![1; p.batch + extra]);
                mismatch(error_of(|| p.validate())?, "key_lens")
            } else {
                let mut lens = vec![p.seq_k; p.batch];
                lens[p.batch - 1] += extra;
                p.lengths = SeqLengths::KeyPadding(lens);
                invalid(error_of(|| p.validate())?, "key_lens")
            }
        },
    );
}

#[test]
fn malformed_cu_seqlens_are_rejected() {
    run_cases(
        "malformed_cu_seqlens_are_rejected",
        128,
        (valid(), 0..4u8, any::<bool>(), 1..5usize),
        |(mut p, how, on_q, delta)| {
            p.bias = None;
            if how == 2 {
                // A decrease needs two sequences.
                p.batch = 2;
            }
            let (nq, nk) = (p.seq_q, p.seq_k);
            let mut cq: Vec<usize> = (0..=p.batch).map(|b| b * nq).collect();
            let mut ck: Vec<usize> = (0..=p.batch).map(|b| b * nk).collect();
            let (cu, max) = if on_q { (&mut cq, nq) } else { (&mut ck, nk) };
            let arg = if on_q { "cu_seqlens_q" } else { "cu_seqlens_k" };
            let shape_error = match how {
                0 => {
                    cu.push(cu[p.batch] + 1);
                    true
                }
                1 => {
                    cu.iter_mut().for_each(|x| *x += delta);
                    false
                }
                2 => {
                    cu[2] = max - (1 + (delta - 1) % max);
                    false
                }
                _ => {
                    // The last sequence is longer than the maximum.
                    cu[p.batch] += delta;
                    false
                }
            };
            p.lengths = SeqLengths::Varlen {
                cu_seqlens_q: cq,
                cu_seqlens_k: ck,
            };
            let e = error_of(|| p.validate())?;
            if shape_error {
                mismatch(e, arg)
            } else {
                invalid(e, arg)
            }
        },
    );
}

fn non_positive() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(f32::NAN),
        Just(0.0f32),
        Just(-0.0f32),
        Just(f32::INFINITY),
        Just(f32::NEG_INFINITY),
        -1e6f32..-1e-6,
    ]
}

#[test]
fn scales_softcaps_and_eps_that_are_not_finite_and_positive_are_rejected() {
    run_cases(
        "scales_softcaps_and_eps_that_are_not_finite_and_positive_are_rejected",
        128,
        (valid(), non_positive(), 0..5u8),
        |(mut p, x, which)| {
            let arg = match which {
                0 => {
                    p.family = Family::Softmax(SoftmaxParams {
                        scale: Some(x),
                        softcap: None,
                    });
                    "scale"
                }
                1 => {
                    p.family = Family::Softmax(SoftmaxParams {
                        scale: None,
                        softcap: Some(x),
                    });
                    "softcap"
                }
                2 => {
                    let Family::CosineSim(mut c) = Family::cosine_sim() else {
                        return Err(fail("cosine_sim() is a cosine family"));
                    };
                    c.scale = x;
                    p.family = Family::CosineSim(c);
                    "scale"
                }
                3 => {
                    let Family::CosineSim(mut c) = Family::cosine_sim() else {
                        return Err(fail("cosine_sim() is a cosine family"));
                    };
                    c.eps = x;
                    p.family = Family::CosineSim(c);
                    "eps"
                }
                _ => {
                    p.family = Family::Taylor(TaylorParams {
                        scale: Some(x),
                        ..TaylorParams::default()
                    });
                    p.window = None;
                    p.bias = None;
                    "scale"
                }
            };
            invalid(error_of(|| p.validate())?, arg)
        },
    );
}

#[test]
fn curvature_and_beta_that_are_not_finite_and_positive_are_rejected() {
    run_cases(
        "curvature_and_beta_that_are_not_finite_and_positive_are_rejected",
        96,
        (valid(), non_positive(), any::<bool>()),
        |(mut p, x, on_c)| {
            let mut h = HyperbolicParams::default();
            if on_c {
                h.curvature = x;
            } else {
                h.beta = x;
            }
            p.family = Family::Hyperbolic(h);
            invalid(
                error_of(|| p.validate())?,
                if on_c { "curvature" } else { "beta" },
            )
        },
    );
}

#[test]
fn taylor_orders_other_than_one_or_two_and_non_positive_quadratics_are_rejected() {
    let order = prop_oneof![Just(0u8), 3..=255u8];
    run_cases(
        "taylor_orders_other_than_one_or_two_and_non_positive_quadratics_are_rejected",
        96,
        (valid(), order, -4.0f32..=0.0, any::<bool>()),
        |(mut p, order, a2, bad_order)| {
            p.window = None;
            p.bias = None;
            let t = if bad_order {
                TaylorParams {
                    order,
                    ..TaylorParams::default()
                }
            } else {
                TaylorParams {
                    order: 2,
                    a: [1.0, 1.0, a2],
                    ..TaylorParams::default()
                }
            };
            p.family = Family::Taylor(t);
            invalid(error_of(|| p.validate())?, if bad_order { "order" } else { "a" })
        },
    );
}

#[test]
fn biases_of_the_wrong_shape_or_with_taylor_or_varlen_are_rejected() {
    run_cases(
        "biases_of_the_wrong_shape_or_with_taylor_or_varlen_are_rejected",
        96,
        (valid(), 0..3u8, 1..4usize),
        |(mut p, how, extra)| {
            p.lengths = SeqLengths::Dense;
            match how {
                0 => {
                    // Neither 1 nor the full size, in batch or in heads.
                    p.bias = Some(if extra % 2 == 0 {
                        BiasShape {
                            batch: p.batch + extra,
                            heads: 1,
                        }
                    } else {
                        BiasShape {
                            batch: 1,
                            heads: p.heads_q + extra,
                        }
                    });
                    mismatch(error_of(|| p.validate())?, "bias")
                }
                1 => {
                    p.family = Family::taylor(2);
                    p.window = None;
                    p.bias = Some(BiasShape { batch: 1, heads: 1 });
                    invalid(error_of(|| p.validate())?, "bias")
                }
                _ => {
                    p.bias = Some(BiasShape { batch: 1, heads: 1 });
                    p.lengths = SeqLengths::Varlen {
                        cu_seqlens_q: (0..=p.batch).map(|b| b * p.seq_q).collect(),
                        cu_seqlens_k: (0..=p.batch).map(|b| b * p.seq_k).collect(),
                    };
                    match error_of(|| p.validate())? {
                        AttnError::Unsupported { .. } => Ok(()),
                        other => Err(fail(format!("expected Unsupported, got {other:?}"))),
                    }
                }
            }
        },
    );
}

#[test]
fn windows_with_taylor_and_non_contiguous_last_dims_are_rejected() {
    run_cases(
        "windows_with_taylor_and_non_contiguous_last_dims_are_rejected",
        64,
        (valid(), any::<bool>(), 2..5usize, 0..3usize),
        |(mut p, window, stride, which)| {
            if window {
                p.family = Family::taylor(1);
                p.bias = None;
                p.window = Some(Window {
                    left: Some(stride),
                    right: None,
                });
                return invalid(error_of(|| p.validate())?, "window");
            }
            let s = Strides::contiguous(
                p.layout,
                p.seq_q.max(p.seq_k),
                p.heads_q,
                p.head_dim.max(p.head_dim_v),
            );
            let mut st = InputStrides { q: s, k: s, v: s };
            [&mut st.q, &mut st.k, &mut st.v][which].dim = stride;
            p.strides = Some(st);
            invalid(error_of(|| p.validate())?, "strides")
        },
    );
}

fn f32s(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

#[test]
fn short_missing_or_unexpected_buffers_and_wrong_dtypes_are_rejected() {
    run_cases(
        "short_missing_or_unexpected_buffers_and_wrong_dtypes_are_rejected",
        128,
        (valid(), 0..10u8, any::<prop::sample::Index>(), any::<u64>()),
        |(p, how, cut, seed)| {
            let spec = p.validate().map_err(fail)?;
            // Empty packed batches have no buffer to shorten.
            prop_assume!(spec.total_q() > 0 && spec.total_k() > 0);
            let c = random_case(&spec, seed);
            let (mut q, mut k, mut v) = (f32s(&c.q), f32s(&c.k), f32s(&c.v));
            let mut bias = c.bias.as_deref().map(f32s);
            let short = |x: &mut Vec<f32>| x.truncate(cut.index(x.len()));
            let ok = forward::<f32>(
                &spec,
                Inputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    bias: bias.as_deref(),
                },
            )
            .map_err(fail)?;
            let (mut o, mut stats, mut d_o) = (ok.o.clone(), ok.stats.clone(), f32s(&c.d_o));
            let what = match how {
                0 => {
                    short(&mut q);
                    "q"
                }
                1 => {
                    short(&mut k);
                    "k"
                }
                2 => {
                    short(&mut v);
                    "v"
                }
                3 => {
                    bias = match bias {
                        // Missing, or a short one.
                        Some(mut b) if seed % 2 == 0 => {
                            short(&mut b);
                            Some(b)
                        }
                        Some(_) => None,
                        // Unexpected.
                        None => Some(vec![0.0; spec.seq_q() * spec.seq_k()]),
                    };
                    "bias"
                }
                4 => {
                    short(&mut o);
                    "o"
                }
                5 => {
                    short(&mut d_o);
                    "d_o"
                }
                6 => {
                    short(&mut stats);
                    "stats"
                }
                7 => {
                    // Outputs handed to the backend trait.
                    let mut out = vec![0.0f32; spec.o_len()];
                    let mut st = vec![0.0f32; spec.stats_len()];
                    let which = seed % 2 == 0;
                    if which {
                        short(&mut out);
                    } else {
                        short(&mut st);
                    }
                    let e = error_of(|| {
                        CpuRef.forward(
                            &spec,
                            ForwardIo {
                                q: q.as_slice(),
                                k: k.as_slice(),
                                v: v.as_slice(),
                                bias: bias.as_deref(),
                                o: out.as_mut_slice(),
                                stats: st.as_mut_slice(),
                            },
                        )
                    })?;
                    return mismatch(e, if which { "o" } else { "stats" });
                }
                8 => {
                    let mut dq = vec![0.0f32; spec.dq_len()];
                    let mut dk = vec![0.0f32; spec.dk_len()];
                    let mut dv = vec![0.0f32; spec.dv_len()];
                    let mut db = bias.as_ref().map(|b| vec![0.0f32; b.len()]);
                    let name = ["dq", "dk", "dv"][(seed % 3) as usize];
                    short([&mut dq, &mut dk, &mut dv][(seed % 3) as usize]);
                    let e = error_of(|| {
                        CpuRef.backward(
                            &spec,
                            BackwardIo {
                                q: q.as_slice(),
                                k: k.as_slice(),
                                v: v.as_slice(),
                                bias: bias.as_deref(),
                                o: o.as_slice(),
                                d_o: d_o.as_slice(),
                                stats: stats.as_slice(),
                                dq: dq.as_mut_slice(),
                                dk: dk.as_mut_slice(),
                                dv: dv.as_mut_slice(),
                                dbias: db.as_deref_mut(),
                            },
                        )
                    })?;
                    return mismatch(e, name);
                }
                _ => {
                    // The spec says f32; the buffers are f16.
                    let half = |x: &[f32]| -> Vec<f16> { x.iter().map(|&v| f16::from_f32(v)).collect() };
                    let (qh, kh, vh) = (half(&q), half(&k), half(&v));
                    let bh = bias.as_deref().map(half);
                    let x = Inputs {
                        q: &qh,
                        k: &kh,
                        v: &vh,
                        bias: bh.as_deref(),
                    };
                    return invalid(error_of(|| forward::<f16>(&spec, x))?, "dtype");
                }
            };
            let x = Inputs {
                q: &q,
                k: &k,
                v: &v,
                bias: bias.as_deref(),
            };
            let e = if how <= 3 {
                error_of(|| forward::<f32>(&spec, x))?
            } else {
                error_of(|| backward::<f32>(&spec, x, &o, &d_o, &stats))?
            };
            mismatch(e, what)
        },
    );
}
