//! Masks on the CPU reference, for every softmax-like family: causal alignment, key padding, packed
//! varlen batches, windows, and rows with no allowed key.

mod common;

use attn_core::{AttnProblem, AttnSpec, BiasShape, Causal, Family, SeqLengths};
use attn_cpu_ref::testing::Case;
use common::{all_finite, case, offset, problem, run, run_cases, setup, softmax_like_family, Tensor};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

fn fail(e: impl ToString) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// The slice `[at, at + n)` of `x`.
fn at(x: &[f64], at: usize, n: usize) -> &[f64] {
    &x[at..at + n]
}

#[test]
fn top_left_and_bottom_right_agree_exactly_where_key_ranges_coincide_and_differ_elsewhere() {
    let strategy = (problem(softmax_like_family()), any::<u64>()).prop_map(|(mut p, seed)| {
        if p.seq_q == p.seq_k {
            p.seq_k += 1;
        }
        p.causal = Causal::TopLeft;
        (p, seed)
    });
    run_cases(
        "top_left_and_bottom_right_agree_exactly_where_key_ranges_coincide_and_differ_elsewhere",
        96,
        strategy,
        |(p, seed)| {
            let tl = case(&p, seed);
            let mut br = tl.clone();
            br.spec = p
                .clone()
                .with_causal(Causal::BottomRight)
                .validate()
                .map_err(fail)?;
            let (s, t) = (tl.spec.clone(), br.spec.clone());
            let (ft, gt) = run(&tl);
            let (fb, gb) = run(&br);
            let (d, dv) = (s.head_dim(), s.head_dim_v());
            // Where ranges differ, the results differ by at least the weight of a key one side
            // sees; softmax scores here span less than 20, so that weight shows in f64. (Other
            // families can push a weight below the rounding of the rest of the row.)
            let bounded = matches!(p.family, Family::Softmax(_));
            for b in 0..s.batch() {
                let lens = s.seq_lens(b);
                for h in 0..s.heads_q() {
                    for i in 0..lens.q {
                        let (rt, rb) = (s.key_range(b, i), t.key_range(b, i));
                        let o = s.o_offset(b, i, h);
                        let dq = s.dq_offset(b, i, h);
                        let lse = s.stats_index(b, h, i);
                        // Two empty ranges are the same set of keys, whatever their bounds.
                        if rt == rb || (rt.is_empty() && rb.is_empty()) {
                            prop_assert_eq!(at(&ft.o, o, dv), at(&fb.o, o, dv));
                            prop_assert_eq!(ft.stats[lse], fb.stats[lse]);
                            prop_assert_eq!(at(&gt.dq, dq, d), at(&gb.dq, dq, d));
                        } else if bounded {
                            prop_assert_ne!(ft.stats[lse], fb.stats[lse], "row {} of ({}, {})", i, b, h);
                            // A row with a single key has P = 1 and dS = 0: dq vanishes for both.
                            if rt.len().max(rb.len()) >= 2 {
                                prop_assert_ne!(at(&gt.dq, dq, d), at(&gb.dq, dq, d));
                            }
                        }
                    }
                }
                // A key column sees the same rows with the same weights exactly when every query
                // either sees it under both alignments with the same range, or under neither.
                for hk in 0..s.heads_kv() {
                    for j in 0..lens.k {
                        let same = (0..lens.q).all(|i| {
                            let (rt, rb) = (s.key_range(b, i), t.key_range(b, i));
                            match (rt.contains(&j), rb.contains(&j)) {
                                (true, true) => rt == rb,
                                (false, false) => true,
                                _ => false,
                            }
                        });
                        let (k, v) = (s.dk_offset(b, j, hk), s.dv_offset(b, j, hk));
                        if same {
                            prop_assert_eq!(at(&gt.dk, k, d), at(&gb.dk, k, d));
                            prop_assert_eq!(at(&gt.dv, v, dv), at(&gb.dv, v, dv));
                        } else if bounded {
                            prop_assert_ne!(at(&gt.dv, v, dv), at(&gb.dv, v, dv), "dv of key {}", j);
                        }
                    }
                }
            }
            Ok(())
        },
    );
}

#[test]
fn keys_outside_a_rows_range_do_not_influence_it() {
    let pick = any::<prop::sample::Index>;
    let strategy = (setup(softmax_like_family()), pick(), pick(), pick());
    run_cases(
        "keys_outside_a_rows_range_do_not_influence_it",
        96,
        strategy,
        |((p, seed), pick_b, pick_hk, pick_j)| {
            let base = case(&p, seed);
            let s = base.spec.clone();
            let b = pick_b.index(s.batch());
            let hk = pick_hk.index(s.heads_kv());
            // Any stored key row of entry b, padded ones included.
            let rows = if s.is_varlen() { s.seq_lens(b).k } else { s.seq_k() };
            if rows == 0 {
                return Ok(());
            }
            let j = pick_j.index(rows);
            let mut moved = base.clone();
            let (ko, vo) = (offset(&s, Tensor::K, b, j, hk), offset(&s, Tensor::V, b, j, hk));
            moved.k[ko..ko + s.head_dim()].iter_mut().for_each(|x| *x += 0.3);
            moved.v[vo..vo + s.head_dim_v()]
                .iter_mut()
                .for_each(|x| *x = -0.5 * *x + 0.1);
            let f0 = attn_cpu_ref::forward_f64(&s, base.inputs()).map_err(fail)?;
            let f1 = attn_cpu_ref::forward_f64(&s, moved.inputs()).map_err(fail)?;
            let dv = s.head_dim_v();
            for bb in 0..s.batch() {
                for h in 0..s.heads_q() {
                    for i in 0..s.seq_lens(bb).q {
                        let sees = bb == b && s.kv_head(h) == hk && s.key_range(bb, i).contains(&j);
                        let (o, l) = (s.o_offset(bb, i, h), s.stats_index(bb, h, i));
                        let same = at(&f0.o, o, dv) == at(&f1.o, o, dv) && f0.stats[l] == f1.stats[l];
                        if !sees {
                            prop_assert!(
                                same,
                                "row {} of ({}, {}) moved with key {} of ({}, {})",
                                i,
                                bb,
                                h,
                                j,
                                b,
                                hk
                            );
                        } else if matches!(p.family, Family::Softmax(_)) {
                            // Softmax weights here are bounded away from 0, so the row must move.
                            prop_assert!(!same, "row {} of ({}, {}) ignored key {}", i, bb, h, j);
                        }
                    }
                }
            }
            Ok(())
        },
    );
}

#[test]
fn rows_without_allowed_keys_return_zero_and_minus_infinity_and_pass_no_gradient() {
    // Four ways to empty a row: bottom-right causal with Nq > Nk, a key length of 0, a packed
    // sequence with no keys, and a bias of −∞ over a whole row.
    let strategy = (problem(softmax_like_family()), 0..4u8, any::<u64>()).prop_map(|(mut p, how, seed)| {
        match how {
            0 => {
                p.lengths = SeqLengths::Dense;
                p.causal = Causal::BottomRight;
                p.seq_q = p.seq_q.max(p.seq_k + 1);
            }
            1 => {
                let mut lens = vec![p.seq_k; p.batch];
                lens[0] = 0;
                p.lengths = SeqLengths::KeyPadding(lens);
            }
            2 => {
                let cu_q = (0..=p.batch).map(|b| b * p.seq_q).collect();
                let cu_k = (0..=p.batch).map(|b| b.saturating_sub(1) * p.seq_k).collect();
                p.lengths = SeqLengths::Varlen {
                    cu_seqlens_q: cu_q,
                    cu_seqlens_k: cu_k,
                };
                p.bias = None;
            }
            _ => {
                p.lengths = SeqLengths::Dense;
                p.bias = Some(BiasShape {
                    batch: p.batch,
                    heads: p.heads_q,
                });
            }
        }
        (p, how, seed)
    });
    run_cases(
        "rows_without_allowed_keys_return_zero_and_minus_infinity_and_pass_no_gradient",
        96,
        strategy,
        |(p, how, seed)| {
            let mut c = case(&p, seed);
            let s = c.spec.clone();
            if how == 3 {
                let bias = c.bias.as_mut().ok_or_else(|| fail("case has a bias"))?;
                for j in 0..s.seq_k() {
                    bias[s.bias_index(0, 0, 0, j).ok_or_else(|| fail("spec has a bias"))?] =
                        f64::NEG_INFINITY;
                }
            }
            let empty = |b: usize, h: usize, i: usize| {
                s.key_range(b, i).is_empty() || (how == 3 && (b, h, i) == (0, 0, 0))
            };
            let (f, g) = run(&c);
            all_finite(&f, &g)?;
            let (d, dv) = (s.head_dim(), s.head_dim_v());
            let mut n_empty = 0;
            let mut moved = c.clone();
            for b in 0..s.batch() {
                for h in 0..s.heads_q() {
                    for i in 0..s.seq_lens(b).q {
                        if !empty(b, h, i) {
                            continue;
                        }
                        n_empty += 1;
                        let o = s.o_offset(b, i, h);
                        prop_assert!(at(&f.o, o, dv).iter().all(|&x| x == 0.0));
                        prop_assert_eq!(f.stats[s.stats_index(b, h, i)], f64::NEG_INFINITY);
                        prop_assert!(at(&g.dq, s.dq_offset(b, i, h), d).iter().all(|&x| x == 0.0));
                        moved.d_o[o..o + dv].iter_mut().for_each(|x| *x = 3.0 - 2.0 * *x);
                    }
                }
            }
            prop_assert!(n_empty > 0, "the strategy always empties a row");
            if how == 3 {
                let dbias = g.dbias.as_ref().ok_or_else(|| fail("case has a dbias"))?;
                for j in 0..s.seq_k() {
                    prop_assert_eq!(
                        dbias[s.bias_index(0, 0, 0, j).ok_or_else(|| fail("spec has a bias"))?],
                        0.0
                    );
                }
            }
            // dO on the empty rows reaches no gradient.
            let (_, g2) = run(&moved);
            prop_assert_eq!(g, g2);
            Ok(())
        },
    );
}

/// Batch entry `b` of `c` run on its own: one entry with its own query and key counts (no bias).
fn alone(p: &AttnProblem, c: &Case, b: usize) -> Result<Option<Case>, TestCaseError> {
    let s = &c.spec;
    let lens = s.seq_lens(b);
    if lens.q == 0 || lens.k == 0 {
        return Ok(None);
    }
    let mut one = AttnProblem::new(
        p.family, p.dtype, 1, p.heads_q, p.heads_kv, lens.q, lens.k, p.head_dim,
    )
    .with_head_dim_v(p.head_dim_v)
    .with_layout(p.layout)
    .with_causal(p.causal);
    one.window = p.window;
    let t = one.validate().map_err(fail)?;
    let (d, dv) = (s.head_dim(), s.head_dim_v());
    let mut x = c.clone();
    x.q = vec![0.0; t.q_len()];
    x.k = vec![0.0; t.k_len()];
    x.v = vec![0.0; t.v_len()];
    x.d_o = vec![0.0; t.o_len()];
    x.bias = None;
    for h in 0..s.heads_q() {
        for i in 0..lens.q {
            let (from, to) = (s.q_offset(b, i, h), t.q_offset(0, i, h));
            x.q[to..to + d].copy_from_slice(at(&c.q, from, d));
            let (from, to) = (s.o_offset(b, i, h), t.o_offset(0, i, h));
            x.d_o[to..to + dv].copy_from_slice(at(&c.d_o, from, dv));
        }
    }
    for hk in 0..s.heads_kv() {
        for j in 0..lens.k {
            let (from, to) = (s.k_offset(b, j, hk), t.k_offset(0, j, hk));
            x.k[to..to + d].copy_from_slice(at(&c.k, from, d));
            let (from, to) = (s.v_offset(b, j, hk), t.v_offset(0, j, hk));
            x.v[to..to + dv].copy_from_slice(at(&c.v, from, dv));
        }
    }
    x.spec = t;
    Ok(Some(x))
}

/// Every output and gradient row of entry `b` of the batched run equals the run of `b` alone, and
/// stored key rows past the entry's length get zero gradients.
fn check_each_entry_alone(p: &AttnProblem, c: &Case) -> Result<(), TestCaseError> {
    let s: &AttnSpec = &c.spec;
    let (f, g) = run(c);
    let (d, dv) = (s.head_dim(), s.head_dim_v());
    for b in 0..s.batch() {
        let Some(x) = alone(p, c, b)? else { continue };
        let t = &x.spec;
        let (fa, ga) = run(&x);
        let lens = s.seq_lens(b);
        for h in 0..s.heads_q() {
            for i in 0..lens.q {
                prop_assert_eq!(
                    at(&f.o, s.o_offset(b, i, h), dv),
                    at(&fa.o, t.o_offset(0, i, h), dv)
                );
                prop_assert_eq!(f.stats[s.stats_index(b, h, i)], fa.stats[t.stats_index(0, h, i)]);
                prop_assert_eq!(
                    at(&g.dq, s.dq_offset(b, i, h), d),
                    at(&ga.dq, t.dq_offset(0, i, h), d)
                );
            }
        }
        for hk in 0..s.heads_kv() {
            for j in 0..lens.k {
                prop_assert_eq!(
                    at(&g.dk, s.dk_offset(b, j, hk), d),
                    at(&ga.dk, t.dk_offset(0, j, hk), d)
                );
                prop_assert_eq!(
                    at(&g.dv, s.dv_offset(b, j, hk), dv),
                    at(&ga.dv, t.dv_offset(0, j, hk), dv)
                );
            }
            if !s.is_varlen() {
                for j in lens.k..s.seq_k() {
                    prop_assert!(at(&g.dk, s.dk_offset(b, j, hk), d).iter().all(|&x| x == 0.0));
                    prop_assert!(at(&g.dv, s.dv_offset(b, j, hk), dv).iter().all(|&x| x == 0.0));
                }
            }
        }
    }
    Ok(())
}

fn with_lengths(varlen: bool) -> impl Strategy<Value = (AttnProblem, u64)> {
    (problem(softmax_like_family()), any::<u64>()).prop_filter_map(
        "wrong kind of lengths",
        move |(mut p, seed)| {
            let keep = match p.lengths {
                SeqLengths::Varlen { .. } => varlen,
                SeqLengths::KeyPadding(_) => !varlen,
                SeqLengths::Dense => false,
            };
            p.bias = None;
            keep.then_some((p, seed))
        },
    )
}

#[test]
fn a_packed_varlen_batch_equals_each_sequence_run_alone() {
    run_cases(
        "a_packed_varlen_batch_equals_each_sequence_run_alone",
        64,
        with_lengths(true),
        |(p, seed)| check_each_entry_alone(&p, &case(&p, seed)),
    );
}

#[test]
fn key_padding_equals_each_entry_with_its_keys_truncated() {
    run_cases(
        "key_padding_equals_each_entry_with_its_keys_truncated",
        64,
        with_lengths(false),
        |(p, seed)| check_each_entry_alone(&p, &case(&p, seed)),
    );
}
