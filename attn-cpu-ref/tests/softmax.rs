//! Softmax attention on the CPU reference: gradients against finite differences, and the layout
//! equivalences every softmax-like family must satisfy (GQA, strides, layouts).

mod common;

use attn_core::{InputStrides, Layout, Strides};
use attn_cpu_ref::testing::{check_gradients, Case};
use common::{case, close, offset, run, run_cases, setup, softmax_family, softmax_like_family, Tensor};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

#[test]
fn softmax_gradients_match_finite_differences() {
    run_cases(
        "softmax_gradients_match_finite_differences",
        40,
        setup(softmax_family()),
        |(p, seed)| check_gradients(&case(&p, seed), 1e-5, 1e-6, 1e-8).map_err(TestCaseError::fail),
    );
}

/// Fill `to`'s q, k and v (laid out by `to.spec`) with every valid row of `from`'s, through each
/// spec's offsets: kv head `hk` of `to` takes kv head `kv_from(hk)` of `from`. Elements no row
/// covers are set to `fill`.
fn copy_inputs(from: &Case, to: &mut Case, kv_from: impl Fn(usize) -> usize, fill: f64) {
    let (s0, s1) = (&from.spec, to.spec.clone());
    to.q = vec![fill; s1.q_len()];
    to.k = vec![fill; s1.k_len()];
    to.v = vec![fill; s1.v_len()];
    for b in 0..s0.batch() {
        let lens = s0.seq_lens(b);
        for h in 0..s1.heads_q() {
            for i in 0..lens.q {
                let (a, z) = (offset(s0, Tensor::Q, b, i, h), offset(&s1, Tensor::Q, b, i, h));
                to.q[z..z + s0.head_dim()].copy_from_slice(&from.q[a..a + s0.head_dim()]);
            }
        }
        for hk in 0..s1.heads_kv() {
            for j in 0..lens.k {
                let (a, z) = (
                    offset(s0, Tensor::K, b, j, kv_from(hk)),
                    offset(&s1, Tensor::K, b, j, hk),
                );
                to.k[z..z + s0.head_dim()].copy_from_slice(&from.k[a..a + s0.head_dim()]);
                let (a, z) = (
                    offset(s0, Tensor::V, b, j, kv_from(hk)),
                    offset(&s1, Tensor::V, b, j, hk),
                );
                to.v[z..z + s0.head_dim_v()].copy_from_slice(&from.v[a..a + s0.head_dim_v()]);
            }
        }
    }
}

#[test]
fn gqa_equals_explicitly_repeated_kv_with_gradients_summed_over_the_group() {
    run_cases(
        "gqa_equals_explicitly_repeated_kv_with_gradients_summed_over_the_group",
        64,
        setup(softmax_like_family()),
        |(p, seed)| {
            let grouped = case(&p, seed);
            let s0 = grouped.spec.clone();
            let mut rep = p.clone();
            rep.heads_kv = p.heads_q;
            let mut repeated = grouped.clone();
            repeated.spec = rep.validate().map_err(|e| TestCaseError::fail(e.to_string()))?;
            copy_inputs(&grouped, &mut repeated, |h| s0.kv_head(h), 0.0);

            let (f0, g0) = run(&grouped);
            let (f1, g1) = run(&repeated);
            prop_assert_eq!(&f0.o, &f1.o);
            prop_assert_eq!(&f0.stats, &f1.stats);
            prop_assert_eq!(&g0.dq, &g1.dq);
            prop_assert_eq!(&g0.dbias, &g1.dbias);
            // dK, dV of a kv head = Σ over its query heads of the repeated heads' gradients.
            let s1 = &repeated.spec;
            let (mut dk, mut dv) = (vec![0.0; s0.dk_len()], vec![0.0; s0.dv_len()]);
            for b in 0..s0.batch() {
                for j in 0..s0.seq_lens(b).k {
                    for h in 0..s0.heads_q() {
                        let (a, z) = (s1.dk_offset(b, j, h), s0.dk_offset(b, j, s0.kv_head(h)));
                        for x in 0..s0.head_dim() {
                            dk[z + x] += g1.dk[a + x];
                        }
                        let (a, z) = (s1.dv_offset(b, j, h), s0.dv_offset(b, j, s0.kv_head(h)));
                        for x in 0..s0.head_dim_v() {
                            dv[z + x] += g1.dv[a + x];
                        }
                    }
                }
            }
            close("dk", &g0.dk, &dk, 1e-12)?;
            close("dv", &g0.dv, &dv, 1e-12)
        },
    );
}

#[test]
fn strided_inputs_equal_their_contiguous_copy_and_padding_is_never_read() {
    let strategy = (
        setup(softmax_like_family()),
        prop_oneof![Just(Layout::Bnhd), Just(Layout::Bhnd)],
        0..3usize,
    );
    run_cases(
        "strided_inputs_equal_their_contiguous_copy_and_padding_is_never_read",
        64,
        strategy,
        |((p, seed), physical, pad)| {
            let dense = case(&p, seed);
            let s0 = &dense.spec;
            // The physical buffer: `physical` order with `pad` unused elements after every row; a
            // varlen tensor is one packed batch entry.
            let view = |rows: usize, heads: usize, dim: usize| {
                let mut s = Strides::contiguous(physical, rows, heads, dim + pad);
                s.dim = 1;
                if s0.is_varlen() {
                    s.batch = 0;
                }
                s
            };
            let (nq, nk) = if s0.is_varlen() {
                (s0.total_q(), s0.total_k())
            } else {
                (s0.seq_q(), s0.seq_k())
            };
            let strided_problem = p.clone().with_strides(InputStrides {
                q: view(nq, s0.heads_q(), s0.head_dim()),
                k: view(nk, s0.heads_kv(), s0.head_dim()),
                v: view(nk, s0.heads_kv(), s0.head_dim_v()),
            });
            let mut strided = dense.clone();
            strided.spec = strided_problem
                .validate()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            copy_inputs(&dense, &mut strided, |h| h, f64::NAN);

            let (f0, g0) = run(&dense);
            let (f1, g1) = run(&strided);
            prop_assert_eq!(f0, f1);
            prop_assert_eq!(g0, g1);
            Ok(())
        },
    );
}

#[test]
fn bhnd_layout_equals_bnhd_transposed() {
    run_cases(
        "bhnd_layout_equals_bnhd_transposed",
        48,
        setup(softmax_like_family()),
        |(p, seed)| {
            let a = case(&p.clone().with_layout(Layout::Bnhd), seed);
            let mut b = a.clone();
            b.spec = p
                .clone()
                .with_layout(Layout::Bhnd)
                .validate()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            copy_inputs(&a, &mut b, |h| h, f64::NAN);
            let (sa, sb) = (&a.spec, &b.spec);
            // dO (and o) rows move with the layout too.
            let dv = sa.head_dim_v();
            let rows = |s: &attn_core::AttnSpec| {
                let mut out = Vec::new();
                for bb in 0..s.batch() {
                    for i in 0..s.seq_lens(bb).q {
                        for h in 0..s.heads_q() {
                            out.push((bb, i, h));
                        }
                    }
                }
                out
            };
            for &(bb, i, h) in &rows(sa) {
                let (x, z) = (sa.o_offset(bb, i, h), sb.o_offset(bb, i, h));
                b.d_o[z..z + dv].copy_from_slice(&a.d_o[x..x + dv]);
            }
            let (fa, ga) = run(&a);
            let (fb, gb) = run(&b);
            prop_assert_eq!(&fa.stats, &fb.stats);
            prop_assert_eq!(&ga.dbias, &gb.dbias);
            for &(bb, i, h) in &rows(sa) {
                let (x, z) = (sa.o_offset(bb, i, h), sb.o_offset(bb, i, h));
                prop_assert_eq!(&fa.o[x..x + dv], &fb.o[z..z + dv]);
                let d = sa.head_dim();
                let (x, z) = (sa.dq_offset(bb, i, h), sb.dq_offset(bb, i, h));
                prop_assert_eq!(&ga.dq[x..x + d], &gb.dq[z..z + d]);
            }
            for bb in 0..sa.batch() {
                for j in 0..sa.seq_lens(bb).k {
                    for hk in 0..sa.heads_kv() {
                        let d = sa.head_dim();
                        let (x, z) = (sa.dk_offset(bb, j, hk), sb.dk_offset(bb, j, hk));
                        prop_assert_eq!(&ga.dk[x..x + d], &gb.dk[z..z + d]);
                        let (x, z) = (sa.dv_offset(bb, j, hk), sb.dv_offset(bb, j, hk));
                        prop_assert_eq!(&ga.dv[x..x + dv], &gb.dv[z..z + dv]);
                    }
                }
            }
            Ok(())
        },
    );
}
