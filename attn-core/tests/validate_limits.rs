//! `AttnProblem::validate` on sizes, strides and coefficients at the edge: every size, stride, extent
//! and buffer length is checked (no wrap, no panic, in debug and release builds), windows are clamped
//! once, degenerate Taylor coefficients are rejected, and so are squared Lorentz curvatures whose
//! f32 constants (`1/c`, `2β/c`) would not be normal and finite.

use attn_core::{
    Aggregation, AttnError, AttnProblem, Causal, DType, Family, FamilySpec, HypScore, HyperbolicParams,
    InputStrides, Layout, Strides, TaylorParams, Window, SQ_LORENTZ_CURVATURE,
};

const I32_MAX: usize = i32::MAX as usize;

fn softmax(b: usize, nq: usize, nk: usize, d: usize) -> AttnProblem {
    AttnProblem::new(Family::softmax(), DType::F32, b, 1, 1, nq, nk, d)
}

/// The error must be `TooLarge` for `arg`, and its message must name the op and the sizes.
#[track_caller]
fn too_large(p: &AttnProblem, arg: &str) {
    match p.validate() {
        Err(e @ AttnError::TooLarge { arg: a, .. }) if a == arg => {
            let msg = e.to_string();
            assert!(
                msg.starts_with("softmax attention: ") || msg.starts_with("taylor attention: "),
                "{msg}"
            );
            assert!(msg.contains("batch ") && msg.contains("seq "), "{msg}");
        }
        other => panic!("expected TooLarge for `{arg}`, got {other:?}"),
    }
}

fn with_q_strides(p: AttnProblem, q: Strides) -> AttnProblem {
    let k = Strides::contiguous(Layout::Bnhd, p.seq_k, p.heads_kv, p.head_dim);
    let v = Strides::contiguous(Layout::Bnhd, p.seq_k, p.heads_kv, p.head_dim_v);
    p.with_strides(InputStrides { q, k, v })
}

#[test]
fn strides_whose_extent_wraps_are_rejected() {
    let q = |batch: usize| Strides {
        batch,
        seq: 64,
        head: 64,
        dim: 1,
    };
    // 1 + 2·2^63 + 15 wraps to 16 elements: a stride past the kernels' 64-bit strides.
    too_large(&with_q_strides(softmax(3, 1, 1, 16), q(1 << 63)), "strides");
    // 4·2^62 = 2^64 wraps.
    too_large(&with_q_strides(softmax(5, 1, 1, 16), q(1 << 62)), "q");
    // 2·2^61 + … elements fit usize but not isize::MAX bytes of f32.
    too_large(&with_q_strides(softmax(3, 1, 1, 16), q(1 << 61)), "q");
    // The same strides at B = 1 address 16 elements.
    let s = with_q_strides(softmax(1, 1, 1, 16), q(1 << 61))
        .validate()
        .expect("valid");
    assert_eq!(s.q_len(), 16);
}

#[test]
fn sizes_past_the_kernels_index_width_are_rejected() {
    too_large(&softmax(1 << 40, 1 << 30, 1, 8), "batch");
    too_large(&softmax(1, I32_MAX + 1, 1, 8), "seq_q");
    too_large(&softmax(1, 1, usize::MAX, 8), "seq_k");
    let mut p = softmax(1, 1, 1, 8);
    p.heads_q = 1 << 32;
    too_large(&p, "heads_q");
    // Each size fits, the rows over the batch do not.
    too_large(&softmax(1 << 20, 1 << 20, 1, 8), "seq_q");
    too_large(&softmax(1 << 20, 1, 1 << 20, 8), "seq_k");
    // Rows fit, elements pass isize::MAX bytes: a [B|1, H|1, Nq, Nk] bias at Nq = Nk = 2^31 − 1.
    too_large(&softmax(1, I32_MAX, I32_MAX, 8).with_bias(1, 1), "bias");
    // The largest sizes that fit are accepted, and their lengths computed.
    let s = softmax(1, I32_MAX, 1, 8).validate().expect("valid");
    assert_eq!(s.q_len(), I32_MAX * 8);
}

#[test]
fn packed_lengths_past_the_index_width_are_rejected_without_panicking() {
    // batch + 1 wraps to 0 in release builds: an empty cu_seqlens used to pass the length check.
    too_large(&softmax(usize::MAX, 1, 1, 8).with_varlen(vec![], vec![]), "batch");
    let p = softmax(I32_MAX, 1, 1, 8).with_varlen(vec![], vec![]);
    assert!(matches!(p.validate(), Err(AttnError::ShapeMismatch { .. })));
    // cu_seqlens [0, 2^62]: the maximum length itself is past the index width.
    too_large(
        &softmax(1, 1 << 62, 1, 8).with_varlen(vec![0, 1 << 62], vec![0, 1]),
        "seq_q",
    );
    // Every sequence fits, the packed total does not.
    let cu = vec![0, I32_MAX, 2 * I32_MAX];
    too_large(
        &softmax(2, I32_MAX, 1, 8).with_varlen(cu, vec![0, 1, 2]),
        "cu_seqlens_q",
    );
}

#[test]
fn huge_windows_are_clamped_to_no_window() {
    let (nq, nk) = (5, 9);
    for causal in [Causal::None, Causal::TopLeft, Causal::BottomRight] {
        let open = softmax(1, nq, nk, 8)
            .with_causal(causal)
            .validate()
            .expect("valid");
        for w in [nq + nk, 1 << 62, 1 << 63, usize::MAX] {
            let s = softmax(1, nq, nk, 8)
                .with_causal(causal)
                .with_window(Some(w), Some(w))
                .validate()
                .expect("valid");
            let cap = Some(nq + nk);
            assert_eq!(
                s.window(),
                Some(Window {
                    left: cap,
                    right: cap
                })
            );
            for i in 0..nq {
                assert_eq!(
                    s.key_range(0, i),
                    open.key_range(0, i),
                    "{causal:?}, window {w}, query {i}"
                );
            }
        }
    }
    // A narrower window is kept as given.
    let s = softmax(1, nq, nk, 8)
        .with_window(Some(2), None)
        .validate()
        .expect("valid");
    assert_eq!(
        s.window(),
        Some(Window {
            left: Some(2),
            right: None
        })
    );
    // The kernels' key bounds i + diag ± window must fit 32 bits.
    too_large(
        &softmax(1, 1 << 30, 1 << 30, 8).with_window(Some(1), None),
        "window",
    );
}

#[test]
fn taylor_order1_with_zero_coefficients_is_rejected() {
    let taylor = |a: [f32; 3]| {
        let family = Family::Taylor(TaylorParams {
            order: 1,
            a,
            ..TaylorParams::default()
        });
        AttnProblem::new(family, DType::F32, 1, 1, 1, 4, 4, 8).validate()
    };
    for a in [[0.0, 0.0, 0.5], [-0.0, 0.0, 0.0], [0.0, -0.0, 1.0]] {
        match taylor(a) {
            Err(e @ AttnError::InvalidArgument { arg: "a", .. }) => {
                assert!(e.to_string().contains("a0 > 0"), "{e}");
            }
            other => panic!("{a:?}: expected InvalidArgument for `a`, got {other:?}"),
        }
    }
    // A negative slope is allowed (the weight stays positive for small scores).
    assert!(taylor([1.0, -0.5, 0.0]).is_ok());
    assert!(taylor([0.0, 1.0, 0.0]).is_ok());
}

#[test]
fn contiguous_strides_of_huge_sizes_saturate_and_are_rejected() {
    // seq · heads · dim overflows usize: the strides saturate instead of wrapping (no panic in a
    // debug build) and validate names the tensor whose extent no longer fits.
    let s = Strides::contiguous(Layout::Bnhd, 1 << 40, 1 << 20, 1 << 10);
    assert_eq!(s.batch, usize::MAX);
    let s = Strides::contiguous(Layout::Bhnd, 1 << 40, 1 << 20, 1 << 10);
    assert_eq!(s.batch, usize::MAX);
    assert_eq!(s.head, 1 << 50);
    let p = softmax(1, 1, 1, 16);
    let err = with_q_strides(p, Strides::contiguous(Layout::Bnhd, 1 << 62, 1 << 62, 16))
        .validate()
        .expect_err("saturated strides must not validate");
    assert!(matches!(err, AttnError::TooLarge { .. }), "{err:?}");
}

fn hyperbolic(score: HypScore, curvature: f32, beta: f32) -> attn_core::Result<attn_core::AttnSpec> {
    let family = Family::Hyperbolic(HyperbolicParams {
        score,
        curvature,
        beta,
        aggregation: Aggregation::Euclidean,
    });
    AttnProblem::new(family, DType::F32, 1, 1, 1, 4, 4, 8).validate()
}

/// The error must be `InvalidArgument` for `arg` and its message must name the op and `needle`.
#[track_caller]
fn invalid(r: attn_core::Result<attn_core::AttnSpec>, arg: &str, needle: &str) {
    match r {
        Err(e @ AttnError::InvalidArgument { arg: a, .. }) if a == arg => {
            let msg = e.to_string();
            assert!(msg.starts_with("hyperbolic attention: "), "{msg}");
            assert!(msg.contains(needle), "{msg}");
        }
        other => panic!("expected InvalidArgument for `{arg}`, got {other:?}"),
    }
}

#[test]
fn squared_lorentz_curvature_outside_its_range_is_rejected() {
    let sq = HypScore::SquaredLorentz;
    let (lo, hi) = SQ_LORENTZ_CURVATURE;
    let below = f32::from_bits(lo.to_bits() - 1);
    let above = f32::from_bits(hi.to_bits() + 1);
    // The edges are accepted, and there 1/c and 2β/c are finite, normal f32 numbers.
    for c in [lo, hi] {
        let s = hyperbolic(sq, c, 1.0).expect("the range is inclusive");
        let FamilySpec::Hyperbolic { curvature, beta, .. } = *s.family() else {
            panic!("a hyperbolic spec")
        };
        assert_eq!(curvature, c);
        for x in [1.0 / curvature, 2.0 * beta / curvature] {
            assert!(x.is_normal(), "c = {c:e}: {x:e}");
        }
    }
    // One ulp outside, the c < 1e-38 (2β/c overflows f32), and the extremes.
    for c in [below, above, 1e-38, f32::MIN_POSITIVE, 1e-45, f32::MAX] {
        invalid(hyperbolic(sq, c, 1.0), "curvature", "outside [1e-12, 1e12]");
    }
    // Non-positive and non-finite curvatures keep their own message.
    for c in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        invalid(hyperbolic(sq, c, 1.0), "curvature", "must be finite and > 0");
    }
    // The geodesic keeps the f64 reference's domain (attn-cuda checks its own range).
    assert!(hyperbolic(HypScore::Geodesic, 1e-20, 1.0).is_ok());
}

#[test]
fn squared_lorentz_constants_that_overflow_f32_are_rejected() {
    let sq = HypScore::SquaredLorentz;
    // 2β/c = 2e38 at the smallest curvature: finite.
    let s = hyperbolic(sq, 1e-12, 1e26).expect("2β/c = 2e38 fits f32");
    let FamilySpec::Hyperbolic { curvature, beta, .. } = *s.family() else {
        panic!("a hyperbolic spec")
    };
    assert!((2.0 * beta / curvature).is_finite());
    // 2β/c = 2e39 overflows.
    invalid(hyperbolic(sq, 1e-12, 1e27), "beta", "2β/c");
    // 2β/c is small but 2β·log2 e overflows.
    invalid(hyperbolic(sq, 1e12, f32::MAX), "beta", "2β·log2 e");
    invalid(hyperbolic(sq, 1.0, 1.2e38), "beta", "must be finite in f32");
}
