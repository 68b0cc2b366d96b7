//! The spec's mask and index arithmetic, on small worked examples.

use attn_core::{AttnError, AttnProblem, Causal, DType, Family, Layout, Pass, Strides, TaylorParams};

fn problem(nq: usize, nk: usize) -> AttnProblem {
    AttnProblem::new(Family::softmax(), DType::F32, 2, 4, 2, nq, nk, 8)
}

#[test]
fn causal_alignments_agree_when_lengths_are_equal_and_differ_otherwise() {
    let tl = problem(5, 5).with_causal(Causal::TopLeft).validate().unwrap();
    let br = problem(5, 5).with_causal(Causal::BottomRight).validate().unwrap();
    for i in 0..5 {
        assert_eq!(tl.key_range(0, i), 0..i + 1);
        assert_eq!(br.key_range(0, i), 0..i + 1);
    }
    // Nq > Nk: bottom-right leaves the first Nq − Nk rows with no key at all.
    let br = problem(6, 3).with_causal(Causal::BottomRight).validate().unwrap();
    let tl = problem(6, 3).with_causal(Causal::TopLeft).validate().unwrap();
    assert_eq!(br.key_range(0, 0), 0..0);
    assert_eq!(br.key_range(0, 3), 0..1);
    assert_eq!(br.key_range(0, 5), 0..3);
    assert_eq!(tl.key_range(0, 0), 0..1);
    assert_eq!(tl.key_range(0, 5), 0..3);
}

#[test]
fn window_follows_the_alignment_of_the_diagonal() {
    // No causal mask: the window is centred on the bottom-right diagonal (FlashAttention's convention).
    let s = problem(2, 6).with_window(Some(1), Some(0)).validate().unwrap();
    assert_eq!(s.key_range(0, 0), 3..5);
    assert_eq!(s.key_range(0, 1), 4..6);
    let s = problem(2, 6)
        .with_causal(Causal::TopLeft)
        .with_window(Some(1), None)
        .validate()
        .unwrap();
    assert_eq!(s.key_range(0, 0), 0..1);
    assert_eq!(s.key_range(0, 1), 0..2);
}

#[test]
fn key_padding_shortens_rows_and_moves_the_bottom_right_diagonal() {
    let s = problem(3, 8)
        .with_key_lens(vec![8, 4])
        .with_causal(Causal::BottomRight)
        .validate()
        .unwrap();
    assert_eq!(s.key_range(0, 2), 0..8);
    assert_eq!(s.key_range(1, 2), 0..4);
    assert_eq!(s.key_range(1, 0), 0..2);
}

#[test]
fn varlen_offsets_index_the_packed_rows() {
    let s = problem(4, 5)
        .with_varlen(vec![0, 3, 7], vec![0, 5, 6])
        .validate()
        .unwrap();
    assert_eq!(s.total_q(), 7);
    assert_eq!(s.total_k(), 6);
    assert_eq!(s.seq_lens(1).q, 4);
    assert_eq!(s.seq_lens(1).k, 1);
    // q is [total_q, Hq, D] = [7, 4, 8]: row 3 + 2 = 5, head 1.
    assert_eq!(s.q_offset(1, 2, 1), 5 * 32 + 8);
    // stats are [Hq, total_q].
    assert_eq!(s.stats_index(1, 2, 2), 2 * 7 + 5);
    assert_eq!(s.q_len(), 7 * 4 * 8);
}

#[test]
fn strided_bhnd_inputs_use_their_own_strides_and_outputs_stay_contiguous() {
    let q = Strides::contiguous(Layout::Bhnd, 4, 4, 8);
    let kv = Strides::contiguous(Layout::Bhnd, 5, 2, 8);
    let s = problem(4, 5)
        .with_layout(Layout::Bhnd)
        .with_strides(attn_core::InputStrides { q, k: kv, v: kv })
        .validate()
        .unwrap();
    assert_eq!(s.q_offset(1, 2, 3), 128 + 3 * 32 + 2 * 8);
    assert_eq!(s.o_offset(1, 2, 3), s.q_offset(1, 2, 3));
    assert_eq!(s.q_shape(), vec![2, 4, 4, 8]);
}

#[test]
fn gqa_maps_query_heads_onto_their_group() {
    let s = problem(1, 1).validate().unwrap();
    assert_eq!(s.group(), 2);
    assert_eq!((0..4).map(|h| s.kv_head(h)).collect::<Vec<_>>(), vec![0, 0, 1, 1]);
}

#[test]
fn errors_name_the_op_and_the_argument() {
    let e = AttnProblem::new(Family::taylor(3), DType::F16, 1, 1, 1, 4, 4, 8)
        .validate()
        .unwrap_err();
    assert!(
        matches!(e, AttnError::InvalidArgument { arg: "order", .. }),
        "{e}"
    );
    assert_eq!(e.op().pass, Pass::Spec);
    assert!(
        e.to_string().starts_with("taylor attention: invalid `order`"),
        "{e}"
    );

    let e = AttnProblem::new(Family::softmax(), DType::F32, 1, 6, 4, 4, 4, 8)
        .validate()
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("heads_q (6) is not a multiple of heads_kv (4)"),
        "{e}"
    );

    let e = problem(4, 4).with_bias(3, 1).validate().unwrap_err();
    assert!(matches!(e, AttnError::ShapeMismatch { .. }), "{e}");
    assert!(e.to_string().contains("[3, 1, 4, 4]"), "{e}");

    let taylor = Family::Taylor(TaylorParams {
        a: [1.0, 1.0, -0.5],
        ..TaylorParams::default()
    });
    let e = AttnProblem::new(taylor, DType::F32, 1, 1, 1, 4, 4, 8)
        .validate()
        .unwrap_err();
    assert!(matches!(e, AttnError::InvalidArgument { arg: "a", .. }), "{e}");

    let e = AttnProblem::from_shapes(
        Family::softmax(),
        DType::F32,
        Layout::Bnhd,
        &[1, 4, 2, 8],
        &[1, 4, 2, 16],
        &[1, 4, 2, 8],
    )
    .unwrap_err();
    assert!(e.to_string().contains("head dim"), "{e}");
}

/// Every buffer length of `s`: q, k, v, o, dq, dk, dv, stats, bias.
fn lens(s: &attn_core::AttnSpec) -> [usize; 9] {
    [
        s.q_len(),
        s.k_len(),
        s.v_len(),
        s.o_len(),
        s.dq_len(),
        s.dk_len(),
        s.dv_len(),
        s.stats_len(),
        s.bias_len(),
    ]
}

#[test]
fn empty_batches_and_sequences_validate_with_empty_buffers() {
    // A batch of 0: every buffer is empty, in both layouts, with a bias and a window.
    for layout in [Layout::Bnhd, Layout::Bhnd] {
        let s = AttnProblem::new(Family::softmax(), DType::F16, 0, 4, 2, 5, 7, 8)
            .with_layout(layout)
            .with_bias(0, 1)
            .with_window(Some(2), Some(1))
            .validate()
            .expect("batch 0 validates");
        assert_eq!(lens(&s), [0; 9], "{layout:?}");
        assert_eq!((s.total_q(), s.total_k()), (0, 0));
    }
    // A bias broadcast over the batch is [1, Hq|1, Nq, Nk] whatever B is: over a batch of 0 it keeps
    // its Nq·Nk entries (the caller's tensor), and nothing reads them.
    let s = AttnProblem::new(Family::softmax(), DType::F32, 0, 4, 2, 5, 7, 8)
        .with_bias(1, 1)
        .validate()
        .expect("batch 0 with a broadcast bias validates");
    assert_eq!(s.bias_len(), 5 * 7);
    assert_eq!(s.q_len(), 0);
    // Nq = 0: the query side is empty, the key side is not.
    let s = problem(0, 3).validate().expect("seq_q 0 validates");
    assert_eq!(lens(&s), [0, 96, 96, 0, 0, 96, 96, 0, 0]);
    // Nk = 0: the key side is empty; o and the statistics hold every query row (zeros, LSE −∞).
    let s = problem(3, 0)
        .with_bias(1, 4)
        .validate()
        .expect("seq_k 0 validates");
    assert_eq!(lens(&s), [192, 0, 0, 192, 192, 0, 0, 24, 0]);
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        let s = problem(3, 0).with_causal(causal).validate().unwrap();
        for (b, i) in [(0, 0), (1, 2)] {
            assert!(s.key_range(b, i).is_empty(), "{causal:?} ({b}, {i})");
        }
        assert_eq!(s.stats_index(1, 3, 2), 23);
        assert_eq!(s.o_offset(1, 2, 3), 96 + 2 * 32 + 3 * 8);
    }
    // Bottom-right with Nk = 0 < Nq and a window: still empty, no wrap.
    let s = problem(4, 0)
        .with_causal(Causal::BottomRight)
        .with_window(Some(usize::MAX), Some(usize::MAX))
        .validate()
        .unwrap();
    assert!((0..4).all(|i| s.key_range(0, i).is_empty()));
    // Key padding with a zero length, and both sequences empty.
    let s = problem(2, 3).with_key_lens(vec![0, 3]).validate().unwrap();
    assert!(s.key_range(0, 1).is_empty());
    assert_eq!(s.key_range(1, 1), 0..3);
    assert_eq!(lens(&problem(0, 0).validate().unwrap()), [0; 9]);
    let s = AttnProblem::new(Family::softmax(), DType::F32, 0, 1, 1, 0, 0, 4)
        .with_key_lens(vec![])
        .validate()
        .unwrap();
    assert_eq!(lens(&s), [0; 9]);
    // Explicit strides over an empty sequence: the extent is 0.
    let st = Strides {
        batch: 1 << 20,
        seq: 64,
        head: 8,
        dim: 1,
    };
    let s = problem(0, 2)
        .with_strides(attn_core::InputStrides { q: st, k: st, v: st })
        .validate()
        .unwrap();
    assert_eq!(s.q_len(), 0);
    assert!(s.k_len() > 0);
}

#[test]
fn empty_varlen_batches_validate() {
    // No sequence at all: cu_seqlens = [0].
    let s = AttnProblem::new(Family::taylor(2), DType::F32, 0, 2, 1, 4, 4, 8)
        .with_varlen(vec![0], vec![0])
        .validate()
        .expect("an empty packed batch validates");
    assert_eq!(lens(&s), [0; 9]);
    // Entries with no queries or no keys among non-empty ones.
    let s = AttnProblem::new(Family::softmax(), DType::F32, 3, 2, 1, 4, 4, 8)
        .with_causal(Causal::BottomRight)
        .with_varlen(vec![0, 0, 3, 5], vec![0, 2, 2, 6])
        .validate()
        .unwrap();
    assert_eq!((s.total_q(), s.total_k()), (5, 6));
    assert_eq!(s.seq_lens(0).q, 0);
    assert!(
        (0..3).all(|i| s.key_range(1, i).is_empty()),
        "entry 1 has no keys"
    );
    assert_eq!(s.key_range(2, 1), 0..4);
    // Packed batches of queries only or keys only.
    let s = AttnProblem::new(Family::softmax(), DType::F32, 2, 2, 1, 4, 4, 8)
        .with_varlen(vec![0, 0, 0], vec![0, 3, 4])
        .validate()
        .unwrap();
    assert_eq!((s.o_len(), s.stats_len(), s.k_len()), (0, 0, 4 * 8));
}

#[test]
fn heads_and_head_dims_stay_at_least_one() {
    for (p, arg) in [
        (
            AttnProblem::new(Family::softmax(), DType::F32, 1, 0, 1, 2, 2, 8),
            "heads_q",
        ),
        (
            AttnProblem::new(Family::softmax(), DType::F32, 1, 1, 0, 2, 2, 8),
            "heads_kv",
        ),
        (
            AttnProblem::new(Family::softmax(), DType::F32, 1, 1, 1, 2, 2, 0),
            "head_dim",
        ),
    ] {
        match p.validate() {
            Err(AttnError::InvalidArgument { arg: a, .. }) => assert_eq!(a, arg),
            other => panic!("{arg} = 0: {other:?}"),
        }
    }
}
