//! The runtime's contract: no GPU → a typed error (never a panic); bad input → a typed error that
//! names the argument and shapes, with outputs untouched; the AttnBackend entry point on device
//! slices agrees with the view entry point.

mod common;

use attn_core::{
    Aggregation, AttnBackend, AttnError, AttnProblem, AttnSpec, DType, Family, ForwardIo, HypScore,
    InputStrides, Strides,
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
