//! The fast path against the f64 oracle on shapes that cross its tiles (64 queries, 128 keys):
//! tails, head dims 64 and 128, GQA, causal masks of both alignments, windows, key padding, a bias,
//! decode (one query against many keys: the split-KV path) and one kv head (the backward's key
//! chunks), for every softmax-like family, in f32, f16 and bf16.

mod fast_common;

use attn_core::{Aggregation, AttnProblem, Causal, CosineParams, DType, Family, HypScore, SoftmaxParams};

fn families() -> Vec<Family> {
    vec![
        Family::softmax(),
        Family::Softmax(SoftmaxParams {
            scale: None,
            softcap: Some(4.0),
        }),
        Family::cosine_sim(),
        Family::CosineSim(CosineParams {
            qk_l2norm: false,
            scale: 0.2,
            ..CosineParams::default()
        }),
        Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean),
        Family::hyperbolic(HypScore::Geodesic, Aggregation::EinsteinMidpoint),
    ]
}

fn run(name: &str, problems: Vec<AttnProblem>) {
    let mut failures = Vec::new();
    let mut n = 0;
    for (i, p) in problems.into_iter().enumerate() {
        for family in families() {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let mut p = p.clone();
                p.family = family;
                p.dtype = dtype;
                let spec = match p.validate() {
                    Ok(s) => s,
                    Err(e) => panic!("{name}: problem {i} is invalid: {e}"),
                };
                n += 1;
                if let Err(e) = fast_common::check(&spec, 17 + i as u64) {
                    failures.push(e);
                }
            }
        }
    }
    println!("{name}: {n} cases");
    assert!(
        failures.is_empty(),
        "{name}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn fast_tiles_tails_and_gqa() {
    run(
        "fast_tiles_tails_and_gqa",
        vec![
            AttnProblem::new(Family::softmax(), DType::F32, 1, 2, 2, 130, 200, 64),
            AttnProblem::new(Family::softmax(), DType::F32, 2, 4, 2, 70, 129, 32)
                .with_causal(Causal::BottomRight),
            AttnProblem::new(Family::softmax(), DType::F32, 1, 3, 1, 200, 150, 128)
                .with_causal(Causal::TopLeft),
        ],
    );
}

#[test]
fn fast_tiles_windows_padding_and_bias() {
    run(
        "fast_tiles_windows_padding_and_bias",
        vec![
            AttnProblem::new(Family::softmax(), DType::F32, 2, 2, 2, 150, 150, 16)
                .with_window(Some(40), Some(3))
                .with_key_lens(vec![150, 77]),
            AttnProblem::new(Family::softmax(), DType::F32, 2, 2, 1, 100, 140, 8)
                .with_causal(Causal::BottomRight)
                .with_bias(1, 2),
            AttnProblem::new(Family::softmax(), DType::F32, 2, 2, 2, 65, 130, 8)
                .with_varlen(vec![0, 65, 130], vec![0, 10, 140])
                .with_head_dim_v(12),
        ],
    );
}

#[test]
fn fast_tiles_decode_split_kv() {
    run(
        "fast_tiles_decode_split_kv",
        vec![
            AttnProblem::new(Family::softmax(), DType::F32, 1, 2, 1, 1, 3000, 64),
            AttnProblem::new(Family::softmax(), DType::F32, 2, 1, 1, 1, 2000, 32)
                .with_key_lens(vec![2000, 1200]),
        ],
    );
}

#[test]
fn fast_path_rejects_a_wrong_dtype_for_every_family_and_covers_taylor() {
    use attn_cpu_ref::{fast, Inputs};
    let x = vec![0f32; 32];
    let inputs = Inputs {
        q: &x,
        k: &x,
        v: &x,
        bias: None,
    };
    for family in [Family::softmax(), Family::taylor(2)] {
        let spec = AttnProblem::new(family, DType::BF16, 1, 1, 1, 4, 4, 8)
            .validate()
            .expect("valid");
        let e = fast::forward(&spec, inputs).expect_err("f32 buffers on a bf16 spec");
        assert!(e.to_string().contains("dtype"), "{e}");
    }
    for order in [1, 2] {
        let spec = AttnProblem::new(Family::taylor(order), DType::F32, 1, 1, 1, 4, 4, 8)
            .validate()
            .expect("valid");
        assert!(fast::supports(&spec));
        let f = fast::forward(&spec, inputs).expect("Taylor runs on the fast path");
        assert_eq!(f.o.len(), spec.o_len());
    }
}
