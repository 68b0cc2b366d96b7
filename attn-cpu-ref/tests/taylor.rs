//! Taylor linear attention on the CPU reference: gradients against finite differences, and the
//! properties its factorised form must keep (GQA, packed varlen, causal alignments, layouts, rows
//! with no key, large scores, order 1 near a zero denominator).

#[path = "../src/taylor/test_specs.rs"]
mod test_specs;

mod common;

use common::run_cases;

use attn_core::{
    AttnProblem, AttnSpec, Causal, DType, Family, InputStrides, Layout, SeqLengths, Strides, TaylorParams,
};
use attn_cpu_ref::testing::{check_gradients, max_abs, max_abs_diff, random_case, Case};
use attn_cpu_ref::{backward, backward_f64, forward, forward_f64, Forward, Gradients, Inputs};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use test_specs::{problems, Limits};

fn spec(p: &AttnProblem) -> Result<AttnSpec, TestCaseError> {
    p.validate()
        .map_err(|e| TestCaseError::fail(format!("drawn problem is invalid: {e}")))
}

/// Forward and backward in f64 on a case.
fn run(case: &Case) -> (Forward<f64, f64>, Gradients<f64>) {
    let f = forward_f64(&case.spec, case.inputs()).expect("case buffers match their spec");
    let g = backward_f64(&case.spec, case.inputs(), &f.o, &case.d_o, &f.stats)
        .expect("case buffers match their spec");
    (f, g)
}

/// `|got − want| ≤ 1e-11·(1 + max|want|)` entry by entry, and every entry finite.
fn close(what: &str, got: &[f64], want: &[f64]) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{}: lengths differ", what);
    prop_assert!(got.iter().all(|x| x.is_finite()), "{}: non-finite entry", what);
    let (err, tol) = (max_abs_diff(got, want), 1e-11 * (1.0 + max_abs(want)));
    prop_assert!(
        err <= tol,
        "{}: differs by {:.3e} (tolerance {:.3e})",
        what,
        err,
        tol
    );
    Ok(())
}

fn row(buf: &[f64], off: usize, width: usize) -> &[f64] {
    &buf[off..off + width]
}

#[test]
fn taylor_gradients_match_finite_differences() {
    // Order 1 draws keep the denominator away from 0 (see test_specs::family): with qk_l2norm and
    // scale ≤ 0.5, f ≥ a0 − |a1|·scale ≥ a0/2 > 0; without it the scale is ≤ 0.5/D for inputs in (−1, 1).
    let lim = Limits {
        batch: 2,
        heads_kv: 2,
        group: 2,
        seq: 6,
        dim: 4,
    };
    run_cases(
        "taylor_gradients_match_finite_differences",
        256,
        (problems(lim), any::<u64>()),
        |(p, seed)| {
            let case = random_case(&spec(&p)?, seed);
            check_gradients(&case, 1e-5, 1e-7, 1e-9).map_err(TestCaseError::fail)
        },
    );
}

/// A case CI drew (seed 18311512083242492351): l2-normalised keys in D = 2 curve sharply, and a plain
/// central difference at h = 1e-5 missed dk by 4e-7 relative; the extrapolated difference must not.
#[test]
fn taylor_gradients_match_finite_differences_on_sharply_curved_l2norm() {
    let p = AttnProblem::new(
        taylor(1, [0.5, -0.084_967_06, 0.0], 0.05, true),
        DType::F32,
        2,
        1,
        1,
        6,
        4,
        2,
    )
    .with_head_dim_v(1)
    .with_causal(Causal::TopLeft)
    .with_key_lens(vec![0, 3]);
    let s = p.validate().expect("valid problem");
    let case = random_case(&s, 18_311_512_083_242_492_351);
    check_gradients(&case, 1e-5, 1e-7, 1e-9).expect("gradients of the drawn case");
}

#[test]
fn taylor_gqa_equals_explicitly_repeated_kv_with_gradients_summed_over_the_group() {
    let lim = Limits {
        batch: 2,
        heads_kv: 2,
        group: 3,
        seq: 9,
        dim: 4,
    };
    let strategy = (
        problems(lim).prop_filter("GQA", |p| p.heads_q > p.heads_kv),
        any::<u64>(),
    );
    run_cases("taylor_gqa_equals_repeated_kv", 48, strategy, |(p, seed)| {
        let s = spec(&p)?;
        let case = random_case(&s, seed);
        let mut rep_p = p.clone();
        rep_p.heads_kv = p.heads_q;
        let rs = spec(&rep_p)?;
        // Same q and dO layout; K/V rows repeated per query head, every unread entry NaN.
        let mut rep = random_case(&rs, seed);
        rep.q = case.q.clone();
        rep.d_o = case.d_o.clone();
        rep.k = vec![f64::NAN; rs.k_len()];
        rep.v = vec![f64::NAN; rs.v_len()];
        let (d, dv) = (s.head_dim(), s.head_dim_v());
        for b in 0..s.batch() {
            for j in 0..s.seq_lens(b).k {
                for h in 0..s.heads_q() {
                    let (src_k, dst_k) = (s.k_offset(b, j, s.kv_head(h)), rs.k_offset(b, j, h));
                    rep.k[dst_k..dst_k + d].copy_from_slice(row(&case.k, src_k, d));
                    let (src_v, dst_v) = (s.v_offset(b, j, s.kv_head(h)), rs.v_offset(b, j, h));
                    rep.v[dst_v..dst_v + dv].copy_from_slice(row(&case.v, src_v, dv));
                }
            }
        }
        let ((f, g), (rf, rg)) = (run(&case), run(&rep));
        close("o", &f.o, &rf.o)?;
        close("den", &f.stats, &rf.stats)?;
        close("dq", &g.dq, &rg.dq)?;
        for b in 0..s.batch() {
            for j in 0..s.seq_lens(b).k {
                for hk in 0..s.heads_kv() {
                    let group = (0..s.heads_q()).filter(|&h| s.kv_head(h) == hk);
                    let mut dk = vec![0.0; d];
                    let mut dvs = vec![0.0; dv];
                    for h in group {
                        dk.iter_mut()
                            .zip(row(&rg.dk, rs.dk_offset(b, j, h), d))
                            .for_each(|(a, x)| *a += x);
                        dvs.iter_mut()
                            .zip(row(&rg.dv, rs.dv_offset(b, j, h), dv))
                            .for_each(|(a, x)| *a += x);
                    }
                    close("dk", row(&g.dk, s.dk_offset(b, j, hk), d), &dk)?;
                    close("dv", row(&g.dv, s.dv_offset(b, j, hk), dv), &dvs)?;
                }
            }
        }
        Ok(())
    });
}

#[test]
fn taylor_packed_varlen_equals_each_sequence_run_alone() {
    let lim = Limits {
        batch: 3,
        heads_kv: 2,
        group: 2,
        seq: 9,
        dim: 4,
    };
    let packed = |p: &AttnProblem| matches!(p.lengths, SeqLengths::Varlen { .. });
    let strategy = (problems(lim).prop_filter("packed", packed), any::<u64>());
    run_cases(
        "taylor_packed_varlen_equals_sequences_alone",
        48,
        strategy,
        |(p, seed)| {
            let s = spec(&p)?;
            let case = random_case(&s, seed);
            let (f, g) = run(&case);
            let (d, dv, hq, hkv) = (s.head_dim(), s.head_dim_v(), s.heads_q(), s.heads_kv());
            for b in 0..s.batch() {
                let lens = s.seq_lens(b);
                if lens.q == 0 {
                    continue;
                }
                // Alone: one dense entry; a sequence with no key becomes one padded key of length 0.
                let alone_p = AttnProblem::new(p.family, p.dtype, 1, hq, hkv, lens.q, lens.k.max(1), d)
                    .with_head_dim_v(dv)
                    .with_causal(p.causal)
                    .with_layout(p.layout)
                    .with_key_lens(vec![lens.k]);
                let a = spec(&alone_p)?;
                let mut alone = random_case(&a, seed);
                alone.q = vec![f64::NAN; a.q_len()];
                alone.k = vec![f64::NAN; a.k_len()];
                alone.v = vec![f64::NAN; a.v_len()];
                alone.d_o = vec![f64::NAN; a.o_len()];
                for h in 0..hq {
                    for i in 0..lens.q {
                        let (src, dst) = (s.q_offset(b, i, h), a.q_offset(0, i, h));
                        alone.q[dst..dst + d].copy_from_slice(row(&case.q, src, d));
                        let (src, dst) = (s.o_offset(b, i, h), a.o_offset(0, i, h));
                        alone.d_o[dst..dst + dv].copy_from_slice(row(&case.d_o, src, dv));
                    }
                }
                for hk in 0..hkv {
                    for j in 0..lens.k {
                        let (src, dst) = (s.k_offset(b, j, hk), a.k_offset(0, j, hk));
                        alone.k[dst..dst + d].copy_from_slice(row(&case.k, src, d));
                        let (src, dst) = (s.v_offset(b, j, hk), a.v_offset(0, j, hk));
                        alone.v[dst..dst + dv].copy_from_slice(row(&case.v, src, dv));
                    }
                }
                let (af, ag) = run(&alone);
                for h in 0..hq {
                    for i in 0..lens.q {
                        close(
                            "o",
                            row(&f.o, s.o_offset(b, i, h), dv),
                            row(&af.o, a.o_offset(0, i, h), dv),
                        )?;
                        close(
                            "den",
                            &[f.stats[s.stats_index(b, h, i)]],
                            &[af.stats[a.stats_index(0, h, i)]],
                        )?;
                        close(
                            "dq",
                            row(&g.dq, s.dq_offset(b, i, h), d),
                            row(&ag.dq, a.dq_offset(0, i, h), d),
                        )?;
                    }
                }
                for hk in 0..hkv {
                    for j in 0..lens.k {
                        close(
                            "dk",
                            row(&g.dk, s.dk_offset(b, j, hk), d),
                            row(&ag.dk, a.dk_offset(0, j, hk), d),
                        )?;
                        close(
                            "dv",
                            row(&g.dv, s.dv_offset(b, j, hk), dv),
                            row(&ag.dv, a.dv_offset(0, j, hk), dv),
                        )?;
                    }
                }
            }
            Ok(())
        },
    );
}

#[test]
fn taylor_top_left_and_bottom_right_differ_exactly_where_their_key_ranges_differ() {
    let lim = Limits {
        batch: 2,
        heads_kv: 2,
        group: 2,
        seq: 10,
        dim: 3,
    };
    let strategy = (
        problems(lim).prop_filter("Nq ≠ Nk", |p| p.seq_q != p.seq_k),
        any::<u64>(),
    );
    run_cases("taylor_top_left_vs_bottom_right", 64, strategy, |(p, seed)| {
        let tl = spec(&p.clone().with_causal(Causal::TopLeft))?;
        let br = spec(&p.clone().with_causal(Causal::BottomRight))?;
        let (ct, cb) = (random_case(&tl, seed), random_case(&br, seed));
        prop_assert!(ct.q == cb.q && ct.k == cb.k && ct.v == cb.v && ct.d_o == cb.d_o);
        let ((ft, gt), (fb, gb)) = (run(&ct), run(&cb));
        let (d, dv) = (tl.head_dim(), tl.head_dim_v());
        for b in 0..tl.batch() {
            let lens = tl.seq_lens(b);
            let same_row = |i: usize| tl.key_range(b, i) == br.key_range(b, i);
            for h in 0..tl.heads_q() {
                for i in 0..lens.q {
                    let (o_t, o_b) = (
                        row(&ft.o, tl.o_offset(b, i, h), dv),
                        row(&fb.o, br.o_offset(b, i, h), dv),
                    );
                    let si = tl.stats_index(b, h, i);
                    let (dq_t, dq_b) = (
                        row(&gt.dq, tl.dq_offset(b, i, h), d),
                        row(&gb.dq, br.dq_offset(b, i, h), d),
                    );
                    if same_row(i) {
                        close("o", o_t, o_b)?;
                        close("den", &[ft.stats[si]], &[fb.stats[si]])?;
                        close("dq", dq_t, dq_b)?;
                    } else {
                        // The ranges are nested prefixes, so the denominators differ by at least
                        // one f(s) ≥ 0.1 (the drawn coefficients' floor).
                        prop_assert!(
                            (ft.stats[si] - fb.stats[si]).abs() > 0.05,
                            "row {} den should differ",
                            i
                        );
                    }
                }
            }
            for j in 0..lens.k {
                let seen_t = (0..lens.q).any(|i| tl.key_range(b, i).contains(&j));
                let seen_b = (0..lens.q).any(|i| br.key_range(b, i).contains(&j));
                let by_same_rows = (0..lens.q)
                    .filter(|&i| tl.key_range(b, i).contains(&j) || br.key_range(b, i).contains(&j))
                    .all(same_row);
                for hk in 0..tl.heads_kv() {
                    let (dk_t, dk_b) = (
                        row(&gt.dk, tl.dk_offset(b, j, hk), d),
                        row(&gb.dk, br.dk_offset(b, j, hk), d),
                    );
                    let (dv_t, dv_b) = (
                        row(&gt.dv, tl.dv_offset(b, j, hk), dv),
                        row(&gb.dv, br.dv_offset(b, j, hk), dv),
                    );
                    if by_same_rows {
                        close("dk", dk_t, dk_b)?;
                        close("dv", dv_t, dv_b)?;
                    } else {
                        prop_assert!(
                            max_abs_diff(dk_t, dk_b) + max_abs_diff(dv_t, dv_b) > 1e-9,
                            "key {} grads should differ",
                            j
                        );
                    }
                    if !seen_t {
                        prop_assert!(
                            max_abs(dk_t) == 0.0 && max_abs(dv_t) == 0.0,
                            "unseen key {} has a gradient",
                            j
                        );
                    }
                    if !seen_b {
                        prop_assert!(
                            max_abs(dk_b) == 0.0 && max_abs(dv_b) == 0.0,
                            "unseen key {} has a gradient",
                            j
                        );
                    }
                }
            }
        }
        Ok(())
    });
}

#[test]
fn taylor_bhnd_layout_equals_bnhd_transposed() {
    let lim = Limits {
        batch: 2,
        heads_kv: 2,
        group: 2,
        seq: 8,
        dim: 4,
    };
    let strategy = (
        problems(lim).prop_filter("not packed", |p| !matches!(p.lengths, SeqLengths::Varlen { .. })),
        any::<u64>(),
    );
    run_cases("taylor_bhnd_equals_bnhd", 32, strategy, |(p, seed)| {
        let (sn, sh) = (
            spec(&p.clone().with_layout(Layout::Bnhd))?,
            spec(&p.clone().with_layout(Layout::Bhnd))?,
        );
        let cn = random_case(&sn, seed);
        let mut ch = random_case(&sh, seed);
        let (d, dv) = (sn.head_dim(), sn.head_dim_v());
        for b in 0..sn.batch() {
            for h in 0..sn.heads_q() {
                for i in 0..sn.seq_q() {
                    let (src, dst) = (sn.q_offset(b, i, h), sh.q_offset(b, i, h));
                    ch.q[dst..dst + d].copy_from_slice(row(&cn.q, src, d));
                    let (src, dst) = (sn.o_offset(b, i, h), sh.o_offset(b, i, h));
                    ch.d_o[dst..dst + dv].copy_from_slice(row(&cn.d_o, src, dv));
                }
            }
            for hk in 0..sn.heads_kv() {
                for j in 0..sn.seq_k() {
                    let (src, dst) = (sn.k_offset(b, j, hk), sh.k_offset(b, j, hk));
                    ch.k[dst..dst + d].copy_from_slice(row(&cn.k, src, d));
                    let (src, dst) = (sn.v_offset(b, j, hk), sh.v_offset(b, j, hk));
                    ch.v[dst..dst + dv].copy_from_slice(row(&cn.v, src, dv));
                }
            }
        }
        let ((fnn, gn), (fh, gh)) = (run(&cn), run(&ch));
        close("den", &fnn.stats, &fh.stats)?;
        for b in 0..sn.batch() {
            for h in 0..sn.heads_q() {
                for i in 0..sn.seq_q() {
                    close(
                        "o",
                        row(&fnn.o, sn.o_offset(b, i, h), dv),
                        row(&fh.o, sh.o_offset(b, i, h), dv),
                    )?;
                    close(
                        "dq",
                        row(&gn.dq, sn.dq_offset(b, i, h), d),
                        row(&gh.dq, sh.dq_offset(b, i, h), d),
                    )?;
                }
            }
            for hk in 0..sn.heads_kv() {
                for j in 0..sn.seq_k() {
                    close(
                        "dk",
                        row(&gn.dk, sn.dk_offset(b, j, hk), d),
                        row(&gh.dk, sh.dk_offset(b, j, hk), d),
                    )?;
                    close(
                        "dv",
                        row(&gn.dv, sn.dv_offset(b, j, hk), dv),
                        row(&gh.dv, sh.dv_offset(b, j, hk), dv),
                    )?;
                }
            }
        }
        Ok(())
    });
}

/// `[B, N, H, D]` strides with gaps after every row, head and batch entry.
fn padded(n: usize, heads: usize, d: usize) -> Strides {
    let head = d + 3;
    let seq = heads * head + 1;
    Strides {
        batch: n * seq + 5,
        seq,
        head,
        dim: 1,
    }
}

#[test]
fn taylor_strided_inputs_equal_their_contiguous_copy_and_padding_is_never_read() {
    let lim = Limits {
        batch: 2,
        heads_kv: 2,
        group: 2,
        seq: 8,
        dim: 4,
    };
    let strategy = (
        problems(lim).prop_map(|p| p.with_layout(Layout::Bnhd)),
        any::<u64>(),
    );
    run_cases("taylor_strided_inputs", 32, strategy, |(p, seed)| {
        let s = spec(&p)?;
        let case = random_case(&s, seed);
        let (nq, nk) = if s.is_varlen() {
            (s.total_q(), s.total_k())
        } else {
            (s.seq_q(), s.seq_k())
        };
        let strides = InputStrides {
            q: padded(nq, p.heads_q, p.head_dim),
            k: padded(nk, p.heads_kv, p.head_dim),
            v: padded(nk, p.heads_kv, p.head_dim_v),
        };
        let ss = spec(&p.clone().with_strides(strides))?;
        let mut strided = random_case(&ss, seed);
        strided.d_o = case.d_o.clone();
        strided.q = vec![f64::NAN; ss.q_len()];
        strided.k = vec![f64::NAN; ss.k_len()];
        strided.v = vec![f64::NAN; ss.v_len()];
        let (d, dv) = (s.head_dim(), s.head_dim_v());
        for b in 0..s.batch() {
            let lens = s.seq_lens(b);
            for h in 0..s.heads_q() {
                for i in 0..lens.q {
                    let (src, dst) = (s.q_offset(b, i, h), ss.q_offset(b, i, h));
                    strided.q[dst..dst + d].copy_from_slice(row(&case.q, src, d));
                }
            }
            for hk in 0..s.heads_kv() {
                for j in 0..lens.k {
                    let (src, dst) = (s.k_offset(b, j, hk), ss.k_offset(b, j, hk));
                    strided.k[dst..dst + d].copy_from_slice(row(&case.k, src, d));
                    let (src, dst) = (s.v_offset(b, j, hk), ss.v_offset(b, j, hk));
                    strided.v[dst..dst + dv].copy_from_slice(row(&case.v, src, dv));
                }
            }
        }
        // Outputs are contiguous either way, so they compare buffer to buffer.
        let ((f, g), (sf, sg)) = (run(&case), run(&strided));
        close("o", &sf.o, &f.o)?;
        close("den", &sf.stats, &f.stats)?;
        close("dq", &sg.dq, &g.dq)?;
        close("dk", &sg.dk, &g.dk)?;
        close("dv", &sg.dv, &g.dv)
    });
}

fn taylor(order: u8, a: [f32; 3], scale: f32, qk_l2norm: bool) -> Family {
    Family::Taylor(TaylorParams {
        order,
        a,
        scale: Some(scale),
        qk_l2norm,
    })
}

#[test]
fn taylor_row_with_no_key_returns_zeros_and_zero_gradients() {
    let problems = [
        // Bottom-right with Nq > Nk: queries 0..3 see no key.
        AttnProblem::new(Family::taylor(2), DType::F32, 1, 2, 1, 7, 4, 3).with_causal(Causal::BottomRight),
        // Key padding with an entry of no keys, order 1.
        AttnProblem::new(
            taylor(1, [1.0, 0.5, 0.0], 0.5, true),
            DType::F32,
            2,
            2,
            2,
            3,
            5,
            4,
        )
        .with_key_lens(vec![0, 3]),
        // A packed sequence with queries and no keys, causal top-left.
        AttnProblem::new(Family::taylor(2), DType::F32, 2, 2, 1, 4, 3, 2)
            .with_varlen(vec![0, 4, 7], vec![0, 0, 3])
            .with_causal(Causal::TopLeft),
    ];
    for (n, p) in problems.iter().enumerate() {
        let s = p.validate().expect("valid problem");
        let case = random_case(&s, 7 + n as u64);
        let (f, g) = run(&case);
        for buf in [&f.o, &f.stats, &g.dq, &g.dk, &g.dv] {
            assert!(
                buf.iter().all(|x| x.is_finite()),
                "problem {n}: non-finite output"
            );
        }
        let (d, dv) = (s.head_dim(), s.head_dim_v());
        let mut empty_rows = 0;
        for b in 0..s.batch() {
            for h in 0..s.heads_q() {
                for i in 0..s.seq_lens(b).q {
                    let o = row(&f.o, s.o_offset(b, i, h), dv);
                    let dq = row(&g.dq, s.dq_offset(b, i, h), d);
                    let den = f.stats[s.stats_index(b, h, i)];
                    if s.key_range(b, i).is_empty() {
                        empty_rows += 1;
                        assert!(
                            max_abs(o) == 0.0 && den == 0.0 && max_abs(dq) == 0.0,
                            "problem {n}: row {i}"
                        );
                    } else {
                        assert!(den > 0.0, "problem {n}: row {i} lost its keys");
                    }
                }
            }
        }
        assert!(empty_rows > 0, "problem {n} has no empty row");
    }
}

#[test]
fn taylor_order2_large_scores_stay_finite_with_den_above_its_floor() {
    // |q·k| up to ~1e4·D: f(s) = 1 + s + s²/2 ≥ 1/2, so den_i ≥ n_i / 2 and nothing overflows.
    let p =
        AttnProblem::new(Family::taylor(2), DType::F32, 1, 2, 1, 6, 9, 8).with_causal(Causal::BottomRight);
    let s = p.validate().expect("valid problem");
    let mut case = random_case(&s, 11);
    case.q
        .iter_mut()
        .chain(case.k.iter_mut())
        .for_each(|x| *x *= 100.0);
    let (f, g) = run(&case);
    for buf in [&f.o, &g.dq, &g.dk, &g.dv] {
        assert!(buf.iter().all(|x| x.is_finite()));
    }
    for h in 0..2 {
        for i in 0..6 {
            let n = s.key_range(0, i).len() as f64;
            assert!(f.stats[s.stats_index(0, h, i)] >= 0.5 * n);
        }
    }
    // The outputs stay convex combinations only when f ≥ 0, which order 2 guarantees: |o| ≤ max|v|.
    assert!(max_abs(&f.o) <= max_abs(&case.v) * (1.0 + 1e-12));
    check_gradients(&case, 1e-5, 1e-6, 1e-9).expect("gradients at large scores");
}

/// One query and two keys in D = 1 with order 1, `a = (1, 1)`, scale 1, no l2-norm:
/// `f_j = 1 + k_j`, `den = 2 + k1 + k2`. With `k = (−1.5, −0.5 + τ)`, `den = τ`.
fn order1_case(tau: f64) -> Case {
    let p = AttnProblem::new(
        taylor(1, [1.0, 1.0, 0.0], 1.0, false),
        DType::F32,
        1,
        1,
        1,
        1,
        2,
        1,
    )
    .with_head_dim_v(2);
    let s = p.validate().expect("valid problem");
    let mut case = random_case(&s, 5);
    case.q = vec![1.0];
    case.k = vec![-1.5, -0.5 + tau];
    case
}

#[test]
fn taylor_order1_near_zero_denominator_returns_num_over_den_as_computed() {
    for tau in [1e-3, 1e-6, 1e-9, -1e-9, -1e-6, -1e-3] {
        let case = order1_case(tau);
        let (f, g) = run(&case);
        let den = f.stats[0];
        assert!((den - tau).abs() <= 1e-15, "den {den} for τ = {tau}");
        for c in 0..2 {
            // num_c = f1 v1c + f2 v2c with f1 = −0.5, f2 = 0.5 + τ; o = num / den, as computed.
            let num = -0.5 * case.v[c] + (0.5 + tau) * case.v[2 + c];
            assert!(
                (f.o[c] * den - num).abs() <= 1e-9 * num.abs().max(1.0),
                "o·den vs num at τ = {tau}"
            );
            assert!(f.o[c].abs() >= 0.5 * num.abs() / tau.abs());
        }
        for buf in [&g.dq, &g.dk, &g.dv] {
            assert!(
                buf.iter().all(|x| x.is_finite()),
                "τ = {tau}: gradients must stay finite"
            );
        }
    }
    // The output flips sign across den = 0 and is non-finite only at exactly 0.
    let (fp, _) = run(&order1_case(1e-9));
    let (fm, _) = run(&order1_case(-1e-9));
    assert!(fp.o[0].signum() == -fm.o[0].signum());
    let (f0, _) = run(&order1_case(0.0));
    assert_eq!(f0.stats[0], 0.0);
    assert!(!f0.o[0].is_finite());
}

#[test]
fn taylor_order1_with_l2norm_and_small_scale_keeps_den_above_its_floor() {
    // ‖q̂‖ = ‖k̂‖ = 1, so |s| ≤ scale and f ≥ a0 − |a1|·scale for any input magnitude.
    let lim = Limits {
        batch: 2,
        heads_kv: 2,
        group: 2,
        seq: 12,
        dim: 6,
    };
    let strategy = (
        lim.dim..=lim.dim,
        0.0..=0.5f32,
        -1.0..1.0f32,
        0.1..10.0f64,
        any::<u64>(),
    );
    run_cases(
        "taylor_order1_den_floor",
        48,
        strategy,
        |(d, scale, a1, amp, seed)| {
            let p = AttnProblem::new(
                taylor(1, [1.0, a1, 0.0], scale.max(1e-3), true),
                DType::F32,
                2,
                2,
                1,
                12,
                12,
                d,
            )
            .with_causal(Causal::TopLeft);
            let s = spec(&p)?;
            let mut case = random_case(&s, seed);
            case.q.iter_mut().chain(case.k.iter_mut()).for_each(|x| *x *= amp);
            let (f, _) = run(&case);
            let floor = 1.0 - (a1 as f64).abs() * scale.max(1e-3) as f64;
            for b in 0..2 {
                for h in 0..2 {
                    for i in 0..12 {
                        let n = s.key_range(b, i).len() as f64;
                        prop_assert!(f.stats[s.stats_index(b, h, i)] >= floor * n * (1.0 - 1e-12));
                    }
                }
            }
            Ok(())
        },
    );
}

#[test]
fn taylor_f32_entry_points_round_the_f64_oracle() {
    let p = AttnProblem::new(Family::taylor(2), DType::F32, 2, 4, 2, 70, 90, 8)
        .with_head_dim_v(6)
        .with_causal(Causal::BottomRight);
    let s = p.validate().expect("valid problem");
    let case = random_case(&s, 3);
    let to32 = |x: &[f64]| x.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    let (q, k, v, d_o) = (to32(&case.q), to32(&case.k), to32(&case.v), to32(&case.d_o));
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: None,
    };
    let f = forward(&s, x).expect("f32 forward");
    let g = backward(&s, x, &f.o, &d_o, &f.stats).expect("f32 backward");
    // The oracle on the same (rounded) inputs, rounded once.
    let wide = |x: &[f32]| x.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    let (q64, k64, v64) = (wide(&q), wide(&k), wide(&v));
    let x64 = Inputs {
        q: &q64,
        k: &k64,
        v: &v64,
        bias: None,
    };
    let f64r = forward_f64(&s, x64).expect("f64 forward");
    let g64 = backward_f64(&s, x64, &wide(&f.o), &wide(&d_o), &wide(&f.stats)).expect("f64 backward");
    for (name, got, want) in [
        ("o", wide(&f.o), f64r.o.clone()),
        ("den", wide(&f.stats), f64r.stats.clone()),
        ("dq", wide(&g.dq), g64.dq),
        ("dk", wide(&g.dk), g64.dk),
        ("dv", wide(&g.dv), g64.dv),
    ] {
        let err = max_abs_diff(&got, &want);
        assert!(
            err <= 1e-7 * max_abs(&want),
            "{name}: f32 result is {err:.3e} from the rounded oracle"
        );
    }
}
