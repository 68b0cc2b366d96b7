//! Taylor linear attention kernels against the f64 CPU reference: orders 1 and 2 × dtypes × head dims ×
//! mask options (causal top-left and bottom-right with `Nq ≠ Nk`, key padding, packed varlen, GQA/MQA,
//! layouts, strided views), sequences long enough to split the states over blocks, random dO, outputs
//! poisoned with NaN before each launch (`common::run_gpu`); recurrent decode against
//! `attn_cpu_ref::decode`; bad input as typed errors.
//!
//! Tolerance (docs/math.md): `err(kernel) ≤ 2·err(naive) + atol` with `atol = 4·u·max|ref|`, where the
//! naive baseline (`attn_cpu_ref::testing::naive::taylor`) is quadratic Taylor attention in the storage dtype: q̂, k̂, the
//! scores S, the weights f(S), num, den, o and every gradient product rounded to the dtype, sums in f32.
//!
//! GPU-only: `cargo xtask test-gpu` (or the bundle of `cargo xtask gpu-bundle`) runs them with `--ignored`.

#[path = "../common/mod.rs"]
mod common;
mod decode;
mod robustness;

use attn_core::{AttnError, AttnProblem, AttnSpec, Causal, DType, Element, Family, TaylorParams};
use attn_cpu_ref::decode::{prefill_f64, step_f64};
use attn_cpu_ref::testing::naive::{self, GradTol};
use attn_cpu_ref::testing::{max_abs, random_case, Case};
use attn_cpu_ref::{backward_f64, forward_f64};
use attn_cuda::{CudaAttnError, DeviceElem, ForwardViews};
use common::bench::{all_finite, forward_backward, time_ms, Bufs};
use common::shapes::{cu_seqlens, dense_gqa, mqa_bhnd, strided_views, varlen_causal, Lengths, Shapes};
use common::{case_selected, check_dims, gpu, identical_runs, run_gpu, taylor_family, Cases};
use half::{bf16, f16};

const DIMS: [usize; 4] = [16, 32, 64, 128];

fn round_all<T: Element>(case: &mut Case, amp: f64) {
    for x in [&mut case.q, &mut case.k] {
        x.iter_mut().for_each(|v| *v = T::from_f64(*v * amp).to_f64());
    }
    for x in [&mut case.v, &mut case.d_o] {
        x.iter_mut().for_each(|v| *v = T::from_f64(*v).to_f64());
    }
}

/// One case: random inputs (q, k scaled by `amp`), rounded to `T`; the f64 reference; the naive baseline;
/// the GPU (inputs at element `offset` of their buffers). Every tensor compared by name.
fn check_taylor<T: DeviceElem>(spec: &AttnSpec, seed: u64, offset: usize, amp: f64) -> Result<(), String> {
    let mut case = random_case(spec, seed);
    round_all::<T>(&mut case, amp);
    let reference = forward_f64(spec, case.inputs()).map_err(|e| e.to_string())?;
    let grads = backward_f64(spec, case.inputs(), &reference.o, &case.d_o, &reference.stats)
        .map_err(|e| e.to_string())?;
    let base = naive::baseline::<T>(spec, case.inputs(), &case.d_o).map_err(|e| e.to_string())?;
    let got = run_gpu::<T>(spec, &case, offset)?;
    let ctx = |e: String| format!("{} {} seed {seed}: {e}", spec.family().label(), T::DTYPE);
    naive::compare(
        spec,
        &got,
        &reference,
        &grads,
        &base,
        T::DTYPE.unit_roundoff(),
        GradTol::PerTensor,
    )
    .map_err(ctx)
}

fn check_dtype(spec: &AttnSpec, seed: u64, offset: usize, amp: f64) -> Result<(), String> {
    match spec.dtype() {
        DType::F32 => check_taylor::<f32>(spec, seed, offset, amp),
        DType::F16 => check_taylor::<f16>(spec, seed, offset, amp),
        DType::BF16 => check_taylor::<bf16>(spec, seed, offset, amp),
    }
}

/// Sequence lengths: long enough for several chunks of the state sweep (C = 64, or 32 at D = 128).
fn max_len(d: usize) -> usize {
    if d >= 128 {
        110
    } else {
        200
    }
}

/// Dense shapes draw `Nk` ≥ 70: more than one chunk of keys.
const LENGTHS: Lengths = Lengths {
    max: max_len,
    min_k: 70,
};

fn custom_order2() -> Family {
    Family::Taylor(TaylorParams {
        order: 2,
        a: [0.7, -0.4, 0.35],
        scale: Some(0.3),
        qk_l2norm: true,
    })
}

type Make = fn(Family, DType, usize, &mut Shapes) -> AttnProblem;

/// Run every (order or family) × dtype × head dim of one option group; collect every failure.
fn run_group(name: &str, families: &[Family], make: Make, offset: usize, amp: f64) {
    let mut cases = Cases::new(name);
    for (fi, &fam) in families.iter().enumerate() {
        let seed = |n: usize| 100 * fi as u64 + 17 * n as u64 + 1;
        check_dims(&mut cases, fam, &DIMS, LENGTHS, seed, &make, |spec, seed| {
            check_dtype(spec, seed, offset, amp)
        });
    }
    cases.finish();
}

fn causal_top_left_q_shorter(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let nk = s.tail(90, max_len(d));
    let nq = s.tail(20, nk - 20);
    AttnProblem::new(f, dt, 2, 2, 1, nq, nk, d).with_causal(Causal::TopLeft)
}

fn causal_top_left_q_longer(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    // Nq > Nk, top-left: the last Nq − Nk queries all see every key.
    let nq = s.tail(90, max_len(d));
    let nk = s.tail(40, nq - 20);
    AttnProblem::new(f, dt, 1, 2, 2, nq, nk, d).with_causal(Causal::TopLeft)
}

fn causal_bottom_right_q_longer(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    // Nq > Nk: the first Nq − Nk queries see no key (zeros, den = 0, zero gradients).
    let nq = s.tail(90, max_len(d));
    let nk = s.tail(40, nq - 20);
    AttnProblem::new(f, dt, 1, 3, 3, nq, nk, d).with_causal(Causal::BottomRight)
}

fn causal_bottom_right_kv_longer(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let nk = s.tail(90, max_len(d));
    let nq = s.tail(10, nk - 30);
    AttnProblem::new(f, dt, 2, 4, 1, nq, nk, d).with_causal(Causal::BottomRight)
}

fn key_padding_causal(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let n = s.tail(70, max_len(d));
    // Batch entry 2 has no valid key at all.
    let lens = vec![n, s.next(1, n - 1), 0];
    AttnProblem::new(f, dt, 3, 2, 2, n, n, d)
        .with_key_lens(lens)
        .with_causal(Causal::BottomRight)
}

fn key_padding_dense(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let (nq, nk) = (s.tail(30, max_len(d)), s.tail(70, max_len(d)));
    let lens = vec![s.next(1, nk), nk];
    AttnProblem::new(f, dt, 2, 4, 2, nq, nk, d).with_key_lens(lens)
}

/// One head, a sequence of ~1000: the state sweep splits it across up to 8 blocks per feature slab.
fn long_causal(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let n = s.tail(900, 1100);
    AttnProblem::new(f, dt, 1, 2, 1, n, n, d).with_causal(Causal::TopLeft)
}

fn long_dense(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let (nq, nk) = (s.tail(200, 400), s.tail(900, 1100));
    AttnProblem::new(f, dt, 1, 1, 1, nq, nk, d)
}

/// The packed sequences of `varlen_causal` without a mask: one sequence has no query (its keys get zero
/// gradients), another few keys.
fn varlen_dense(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    varlen_causal(f, dt, d, s).with_causal(Causal::None)
}

const ORDERS: [Family; 2] = [
    Family::Taylor(TaylorParams {
        order: 1,
        a: [1.0, 0.8, 0.0],
        scale: Some(0.9),
        qk_l2norm: true,
    }),
    Family::Taylor(TaylorParams {
        order: 2,
        a: [1.0, 1.0, 0.5],
        scale: None,
        qk_l2norm: false,
    }),
];

/// Order 1 without the l2-norm and with other coefficients: the order-1 kernels' path where the keys
/// need no scaling (f16/bf16 with 16-byte aligned rows).
const ORDER1_PLAIN: Family = Family::Taylor(TaylorParams {
    order: 1,
    a: [0.6, 1.1, 0.0],
    scale: None,
    qk_l2norm: false,
});

macro_rules! gpu_tests {
    ($($name:ident: $families:expr, $make:expr, $offset:expr;)*) => {$(
        #[test]
        #[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
        fn $name() {
            common::each_config(&common::taylor_configs(), || {
                run_group(stringify!($name), &$families, $make, $offset, 1.0);
            });
        }
    )*};
}

gpu_tests! {
    taylor_dense_gqa_with_tails_matches_reference: ORDERS, dense_gqa, 0;
    taylor_causal_top_left_q_shorter_than_k_matches_reference: ORDERS, causal_top_left_q_shorter, 0;
    taylor_causal_top_left_q_longer_than_k_matches_reference: ORDERS, causal_top_left_q_longer, 0;
    taylor_causal_bottom_right_q_longer_than_k_zeroes_empty_rows: ORDERS, causal_bottom_right_q_longer, 0;
    taylor_causal_kv_longer_than_q_matches_reference: ORDERS, causal_bottom_right_kv_longer, 0;
    taylor_key_padding_causal_matches_reference: ORDERS, key_padding_causal, 0;
    taylor_key_padding_dense_matches_reference: ORDERS, key_padding_dense, 0;
    taylor_packed_varlen_causal_matches_reference: ORDERS, varlen_causal, 0;
    taylor_packed_varlen_dense_matches_reference: ORDERS, varlen_dense, 0;
    taylor_mqa_bhnd_layout_matches_reference: ORDERS, mqa_bhnd, 0;
    taylor_strided_views_at_an_offset_match_reference: ORDERS, strided_views, 8;
    taylor_custom_coefficients_with_l2norm_match_reference: [custom_order2()], causal_top_left_q_shorter, 0;
    taylor_long_causal_split_states_match_reference: ORDERS, long_causal, 0;
    taylor_long_dense_split_states_match_reference: ORDERS, long_dense, 0;
    taylor_order1_plain_dense_gqa_matches_reference: [ORDER1_PLAIN], dense_gqa, 0;
    taylor_order1_plain_key_padding_matches_reference: [ORDER1_PLAIN], key_padding_dense, 0;
    taylor_order1_plain_varlen_causal_matches_reference: [ORDER1_PLAIN], varlen_causal, 0;
    // Rows not 16-byte aligned (inputs 3 elements into their buffers): the general kernels.
    taylor_unaligned_rows_match_reference: ORDERS, dense_gqa, 3;
}

/// No atomics on the sums: a forward and backward run twice on the same inputs gives the same bits,
/// for every dtype and order, on a causal GQA case long enough for several segments (and, at D = 16 and
/// 128, several fold slabs) with a query length that leaves partial tiles.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_results_are_identical_run_to_run() {
    common::each_config(&common::taylor_configs(), || {
        let mut cases = Cases::new("taylor_results_are_identical_run_to_run");
        for (fi, &fam) in ORDERS.iter().enumerate() {
            for d in [16, 128] {
                for dtype in DType::ALL {
                    if !case_selected(d, dtype) {
                        cases.skip();
                        continue;
                    }
                    let spec = AttnProblem::new(fam, dtype, 2, 4, 2, 517, 700, d)
                        .with_causal(Causal::BottomRight)
                        .validate()
                        .expect("valid");
                    let case = random_case(&spec, 70 + fi as u64);
                    let label = format!("{} D={d} {dtype}", spec.family().label());
                    cases.record(label, identical_runs(&spec, &case));
                }
            }
        }
        cases.finish();
    });
}

/// MQA with 128 query heads per kv head, causal: 128 consecutive probes of the forward sweep share one
/// hi, where the order-1 causal kernels' source prefetch once left a block unread for two tiles (and the
/// next probe rows could be read in flight). Both order-1 families, f16 and bf16, Nk = Nq + 1 and longer.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_order1_causal_large_group_matches_reference() {
    common::each_config(&common::taylor_configs(), || {
        let mut cases = Cases::new("taylor_order1_causal_large_group_matches_reference");
        for (fi, fam) in [ORDERS[0], ORDER1_PLAIN].into_iter().enumerate() {
            for dtype in [DType::BF16, DType::F16] {
                for (n, (nq, nk)) in [(64, 65), (150, 200)].into_iter().enumerate() {
                    if !case_selected(32, dtype) {
                        cases.skip();
                        continue;
                    }
                    let spec = AttnProblem::new(fam, dtype, 1, 128, 1, nq, nk, 32)
                        .with_causal(Causal::TopLeft)
                        .validate()
                        .expect("valid");
                    let label = format!("{} {dtype} Nq={nq} Nk={nk}", spec.family().label());
                    cases.record(label, check_dtype(&spec, 300 + 10 * fi as u64 + n as u64, 0, 1.0));
                }
            }
        }
        cases.finish();
    });
}

/// The single-pass causal order-1 forward (every sequence with as many queries as keys): fold blocks chain
/// the segment sums, forward blocks carry them through their chunks. Sequences of several 1024-key
/// segments (the default length; the configuration with 128-key segments, `common::taylor_configs`,
/// makes them many) with partial last chunks: GQA top-left, MQA bottom-right, packed sequences with equal offsets
/// (one of length 1, one empty, one a whole number of segments). Both order-1 families, f16 and bf16,
/// D = 16, 32, 64; forward and backward (the backward takes the two-pass kernels' states).
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_order1_causal_single_pass_matches_reference() {
    common::each_config(&common::taylor_configs(), || {
        let mut cases = Cases::new("taylor_order1_causal_single_pass_matches_reference");
        for (fi, fam) in [ORDERS[0], ORDER1_PLAIN].into_iter().enumerate() {
            for d in [16, 32, 64] {
                for dtype in [DType::BF16, DType::F16] {
                    let shapes = [
                        (
                            "GQA top-left 2111",
                            AttnProblem::new(fam, dtype, 1, 4, 2, 2111, 2111, d).with_causal(Causal::TopLeft),
                        ),
                        (
                            "MQA bottom-right 1500",
                            AttnProblem::new(fam, dtype, 2, 3, 1, 1500, 1500, d)
                                .with_causal(Causal::BottomRight),
                        ),
                        (
                            "varlen 1, 2048, 0, 1301",
                            AttnProblem::new(fam, dtype, 4, 2, 2, 2048, 2048, d)
                                .with_causal(Causal::TopLeft)
                                .with_varlen(
                                    cu_seqlens(&[1, 2048, 0, 1301]),
                                    cu_seqlens(&[1, 2048, 0, 1301]),
                                ),
                        ),
                    ];
                    for (n, (label, problem)) in shapes.into_iter().enumerate() {
                        if !case_selected(d, dtype) {
                            cases.skip();
                            continue;
                        }
                        let spec = problem.validate().expect("valid");
                        let label = format!("{} D={d} {dtype} {label}", spec.family().label());
                        let seed = 900 + 100 * fi as u64 + 10 * d as u64 + n as u64;
                        cases.record(label, check_dtype(&spec, seed, 0, 1.0));
                    }
                }
            }
        }
        cases.finish();
    });
}

/// Order 2 keeps f ≥ 1/2 for any score: with q, k scaled by 30 (|s| in the thousands) every output and
/// gradient stays finite and within tolerance (f32 and bf16; f16 cannot hold f(s) ~ 1e6).
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_order2_large_scores_stay_finite_and_match_reference() {
    common::each_config(&common::taylor_configs(), || {
        let mut cases = Cases::new("taylor_order2_large_scores_stay_finite_and_match_reference");
        for (n, &d) in DIMS.iter().enumerate() {
            for dtype in [DType::F32, DType::BF16] {
                if !case_selected(d, dtype) {
                    cases.skip();
                    continue;
                }
                let seed = 900 + n as u64;
                let spec =
                    causal_top_left_q_shorter(taylor_family(2), dtype, d, &mut Shapes::new(seed, LENGTHS))
                        .validate()
                        .expect("valid");
                cases.record(format_args!("D={d} {dtype}"), check_dtype(&spec, seed, 0, 30.0));
            }
        }
        cases.finish();
    });
}

/// Order 2, bf16, D = 64 runs its forward on the wgmma state kernels from 4096 keys
/// per query (the default routing; the configuration with `taylor_wg: Route::Everywhere` sends the
/// shorter shapes of this file there too): several fold splits with a partial last chunk (the reduce) and a single
/// split (the fold writes the state), GQA with `Nq ≠ Nk`, key padding with an empty batch entry, and
/// packed varlen with an empty sequence, for the default and custom coefficients; with a causal mask
/// from 8192 keys where Nq = Nk (per-segment states and the dense part of each query's segment), both
/// alignments, dense and packed. The backward (the flash kernels at these lengths) reads the
/// denominators it saved.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_order2_wgmma_state_forward_matches_reference() {
    common::each_config(&common::taylor_configs(), || {
        let mut cases = Cases::new("taylor_order2_wgmma_state_forward_matches_reference");
        let shapes = [
            (
                "GQA Nq 300 Nk 8200",
                AttnProblem::new(taylor_family(2), DType::BF16, 2, 4, 2, 300, 8200, 64),
            ),
            (
                "key padding 8250, 0, 8193",
                AttnProblem::new(custom_order2(), DType::BF16, 3, 2, 1, 130, 8250, 64)
                    .with_key_lens(vec![8250, 0, 8193]),
            ),
            (
                "varlen",
                AttnProblem::new(taylor_family(2), DType::BF16, 3, 2, 2, 200, 8300, 64)
                    .with_varlen(cu_seqlens(&[200, 0, 77]), cu_seqlens(&[8300, 40, 8192])),
            ),
            // 64 (batch entry, kv head) pairs: one split, so the fold writes the read's state itself.
            (
                "one split, key padding 4100, 0, 4097, 4096",
                AttnProblem::new(taylor_family(2), DType::BF16, 4, 16, 16, 70, 4100, 64)
                    .with_key_lens(vec![4100, 0, 4097, 4096]),
            ),
            // Causal (Nq = Nk): the fold writes a state per segment, the read adds its segment densely; the
            // last segment partial, the last query tile too.
            (
                "causal GQA 8300",
                AttnProblem::new(taylor_family(2), DType::BF16, 1, 2, 1, 8300, 8300, 64)
                    .with_causal(Causal::TopLeft),
            ),
            (
                "causal bottom-right varlen 8200, 1, 130",
                AttnProblem::new(custom_order2(), DType::BF16, 3, 2, 2, 8200, 8200, 64)
                    .with_causal(Causal::BottomRight)
                    .with_varlen(cu_seqlens(&[8200, 1, 130]), cu_seqlens(&[8200, 1, 130])),
            ),
        ];
        for (n, (label, problem)) in shapes.into_iter().enumerate() {
            if !case_selected(64, DType::BF16) {
                cases.skip();
                continue;
            }
            let spec = problem.validate().expect("valid");
            cases.record(label, check_dtype(&spec, 700 + n as u64, 0, 1.0));
        }
        cases.finish();
    });
}

/// Order 1 has no floor on f: with a1·scale = a0 the weights f = a0(1 + ŝ) reach 0 where q̂ = −k̂ and the
/// denominators get small. The kernels return num/den as computed, like the reference: checked in f32
/// on rows whose denominators are small but not 0.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_order1_small_denominators_follow_the_reference() {
    common::each_config(&common::taylor_configs(), || {
        let fam = Family::Taylor(TaylorParams {
            order: 1,
            a: [1.0, 1.0, 0.0],
            scale: Some(1.0),
            qk_l2norm: true,
        });
        let spec = AttnProblem::new(fam, DType::F32, 1, 1, 1, 40, 70, 32)
            .with_causal(Causal::BottomRight)
            .validate()
            .expect("valid");
        let mut case = random_case(&spec, 4);
        // Every key close to −q_0: query 0's weights are all near 0.
        let q0: Vec<f64> = case.q[..32].to_vec();
        for j in 0..70 {
            let ko = spec.k_offset(0, j, 0);
            for (kc, &qc) in case.k[ko..ko + 32].iter_mut().zip(&q0) {
                *kc = -qc + 0.05 * *kc;
            }
        }
        let reference = forward_f64(&spec, case.inputs()).expect("reference");
        let got = run_gpu::<f32>(&spec, &case, 0).expect("gpu");
        // Query 0 sees 31 keys whose weights are each well under 0.05.
        let den0 = reference.stats[spec.stats_index(0, 0, 0)];
        assert!(
            den0 > 0.0 && den0 < 1.5,
            "query 0 has a small denominator: {den0}"
        );
        assert!(got.o.iter().chain(&got.lse).all(|x| x.is_finite()));
        // f = 1 + s cancels in f32 (|s| ≈ 1), so query 0's output carries ~1e-3 relative error, as any
        // f32 computation of it would; a wrong sum would be off by O(1).
        for (i, (g, r)) in got.o.iter().zip(&reference.o).enumerate() {
            assert!((g - r).abs() <= 2e-2 * (1.0 + r.abs()), "o[{i}]: {g} vs {r}");
        }
    });
}

fn views_for<'a, T: DeviceElem>(
    bufs: &'a mut [attn_cuda::cudarc::driver::CudaSlice<T>; 4],
    den: &'a mut attn_cuda::cudarc::driver::CudaSlice<f32>,
) -> ForwardViews<'a, T> {
    let [q, k, v, o] = bufs;
    ForwardViews {
        q: q.slice(..),
        k: k.slice(..),
        v: v.slice(..),
        bias: None,
        o: o.slice_mut(..),
        lse: den.slice_mut(..),
    }
}

fn expect_unsupported(r: Result<(), CudaAttnError>, what: &str) {
    match r {
        Err(CudaAttnError::Attn(AttnError::Unsupported { what: w, .. })) => {
            assert!(w.contains(what), "{w}")
        }
        other => panic!("expected Unsupported({what}), got {other:?}"),
    }
}

/// Head dims without kernels, `Dv ≠ D` and mismatched decode states are typed errors naming the argument.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_bad_input_is_a_typed_error() {
    common::each_config(&common::taylor_configs(), || {
        let g = gpu();
        let s = g.stream();
        let bufs = |spec: &AttnSpec| -> [attn_cuda::cudarc::driver::CudaSlice<bf16>; 4] {
            [spec.q_len(), spec.k_len(), spec.v_len(), spec.o_len()]
                .map(|n| s.alloc_zeros::<bf16>(n.max(1)).expect("alloc"))
        };
        let run = |spec: &AttnSpec| -> Result<(), CudaAttnError> {
            let mut b = bufs(spec);
            let mut den = s.alloc_zeros::<f32>(spec.stats_len()).expect("alloc");
            g.forward_views(spec, views_for(&mut b, &mut den))
        };
        let p = |d: usize| AttnProblem::new(Family::taylor(2), DType::BF16, 1, 2, 1, 8, 8, d);
        expect_unsupported(run(&p(48).validate().expect("valid")), "head dim 48");
        expect_unsupported(
            run(&p(64).with_head_dim_v(32).validate().expect("valid")),
            "value head dim 32",
        );

        // Order 3 and an order-2 a2 that lets f reach 0 are rejected when the spec is built.
        let bad = |a: [f32; 3], order: u8| {
            AttnProblem::new(
                Family::Taylor(TaylorParams {
                    order,
                    a,
                    scale: None,
                    qk_l2norm: false,
                }),
                DType::BF16,
                1,
                1,
                1,
                4,
                4,
                16,
            )
            .validate()
        };
        assert!(matches!(
            bad([1.0, 1.0, 0.5], 3),
            Err(AttnError::InvalidArgument { arg: "order", .. })
        ));
        assert!(matches!(
            bad([1.0, 1.0, -0.5], 2),
            Err(AttnError::InvalidArgument { arg: "a", .. })
        ));

        // A decode state and a step spec that disagree.
        let prompt = p(32).with_causal(Causal::TopLeft).validate().expect("valid");
        let mut b = bufs(&prompt);
        let mut den = s.alloc_zeros::<f32>(prompt.stats_len()).expect("alloc");
        let mut state = g
            .taylor_prefill(&prompt, views_for(&mut b, &mut den))
            .expect("prefill");
        let other = AttnProblem::new(Family::taylor(2), DType::BF16, 1, 2, 2, 1, 1, 32)
            .with_causal(Causal::TopLeft)
            .validate()
            .expect("valid");
        let mut b = bufs(&other);
        let mut den = s.alloc_zeros::<f32>(other.stats_len()).expect("alloc");
        match g.taylor_decode_step(&mut state, &other, views_for(&mut b, &mut den)) {
            Err(CudaAttnError::Attn(AttnError::InvalidArgument {
                arg: "state", reason, ..
            })) => {
                assert!(reason.contains("heads_kv"), "{reason}")
            }
            other => panic!("expected a state mismatch, got {other:?}"),
        }
        let open = AttnProblem::new(Family::taylor(2), DType::BF16, 1, 2, 1, 1, 1, 32)
            .validate()
            .expect("valid");
        let mut b = bufs(&open);
        match g.taylor_decode_step(&mut state, &open, views_for(&mut b, &mut den)) {
            Err(CudaAttnError::Attn(AttnError::InvalidArgument { arg: "causal", .. })) => {}
            other => panic!("expected a causal error, got {other:?}"),
        }
        assert_eq!(state.len(0), 8, "failed steps leave the state as it was");
    });
}

/// The memory bar: B = 1, H = 8, N = 1,048,576, D = 64, forward and backward, orders 1 and 2
/// (scratch is O(N·D); nothing N×N or N×D²). Outputs must be finite.
#[test]
#[ignore = "needs a CUDA GPU: cargo xtask test-gpu"]
fn taylor_one_million_tokens_forward_and_backward_fit() {
    common::each_config(&common::taylor_configs(), || {
        for order in [1u8, 2] {
            let mut p = AttnProblem::new(Family::taylor(order), DType::BF16, 1, 8, 8, 1 << 20, 1 << 20, 64)
                .with_causal(Causal::BottomRight);
            if order == 1 {
                p.family = taylor_family(1);
            }
            let spec = p.validate().expect("valid problem");
            let mut bb = Bufs::new(gpu(), &spec);
            let ms = time_ms(gpu(), 0, 1, || forward_backward(gpu(), &spec, &mut bb));
            println!("order {order}: B=1 H=8 N=1048576 D=64 causal forward+backward {ms:.1} ms");
            assert!(
                [&bb.o, &bb.dq, &bb.dk, &bb.dv]
                    .iter()
                    .all(|x| all_finite(gpu(), x)),
                "order {order}: non-finite output at N = 1M"
            );
        }
    });
}
