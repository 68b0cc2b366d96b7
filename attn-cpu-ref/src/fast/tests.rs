//! The fast path's internals: every instruction-set level gives the same bits, and the work
//! partitions depend on the shape alone.

use super::backward::key_chunks;
use super::forward::key_splits;
use super::simd::Level;
use super::tile::BK;
use super::{backward, check, forward, Ctx};
use crate::testing::random_case;
use crate::Inputs;
use attn_core::{
    Aggregation, AttnProblem, AttnSpec, Causal, DType, Element, Family, HypScore, Pass, SoftmaxParams,
};

fn problems() -> Vec<AttnProblem> {
    let softcap = Family::Softmax(SoftmaxParams {
        scale: None,
        softcap: Some(4.0),
    });
    vec![
        AttnProblem::new(Family::softmax(), DType::F32, 1, 2, 1, 150, 300, 64)
            .with_causal(Causal::BottomRight),
        AttnProblem::new(softcap, DType::F32, 2, 2, 2, 70, 129, 32).with_key_lens(vec![129, 40]),
        AttnProblem::new(Family::cosine_sim(), DType::BF16, 1, 2, 2, 65, 200, 16).with_bias(1, 2),
        AttnProblem::new(
            Family::hyperbolic(HypScore::Geodesic, Aggregation::EinsteinMidpoint),
            DType::F32,
            1,
            1,
            1,
            1,
            1500,
            8,
        ),
        AttnProblem::new(
            Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean),
            DType::F16,
            1,
            2,
            1,
            90,
            90,
            24,
        )
        .with_window(Some(20), Some(5)),
        // One query per sequence: the decode kernel.
        AttnProblem::new(Family::softmax(), DType::BF16, 2, 4, 2, 1, 1500, 32)
            .with_causal(Causal::BottomRight)
            .with_bias(2, 1),
        AttnProblem::new(softcap, DType::F32, 1, 2, 2, 1, 700, 16).with_key_lens(vec![600]),
    ]
}

/// Forward o, LSE and every gradient, as bits, at `level`.
fn run_at<E: Element>(spec: &AttnSpec, level: Level) -> Vec<Vec<u32>> {
    let case = random_case(spec, 5);
    let cast = |x: &[f64]| x.iter().map(|&v| E::from_f64(v)).collect::<Vec<E>>();
    let (q, k, v, d_o) = (cast(&case.q), cast(&case.k), cast(&case.v), cast(&case.d_o));
    let bias = case.bias.as_deref().map(cast);
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: bias.as_deref(),
    };
    let kind = check::<E>(spec, Pass::Forward)
        .expect("a fast-path family")
        .expect("a tiled family (Taylor has its own sweep)");
    let ctx = Ctx::new(spec, kind, &x);
    let f = forward::run(&ctx, level);
    let g = backward::run(&ctx, &f.o, &d_o, &f.stats, level);
    let bits = |x: &[E]| x.iter().map(|v| v.to_f32().to_bits()).collect::<Vec<u32>>();
    let mut out = vec![
        bits(&f.o),
        f.stats.iter().map(|v| v.to_bits()).collect(),
        bits(&g.dq),
        bits(&g.dk),
        bits(&g.dv),
    ];
    out.extend(g.dbias.as_deref().map(bits));
    out
}

#[test]
fn every_instruction_set_level_gives_the_portable_bits() {
    let levels = Level::available();
    println!("levels on this CPU: {levels:?}");
    for p in problems() {
        let spec = p.validate().expect("valid");
        let run = |level| match spec.dtype() {
            DType::F32 => run_at::<f32>(&spec, level),
            DType::F16 => run_at::<half::f16>(&spec, level),
            DType::BF16 => run_at::<half::bf16>(&spec, level),
        };
        let portable = run(Level::Portable);
        assert!(
            portable[0].iter().any(|&b| b != 0),
            "{}: o is all zeros",
            spec.family().label()
        );
        for &level in &levels[1..] {
            assert!(
                run(level) == portable,
                "{} {:?}: {level:?} differs from the portable body",
                spec.family().label(),
                spec.q_shape()
            );
        }
    }
}

#[test]
fn key_splits_depend_on_the_shape_only_and_respect_their_bounds() {
    // Enough (batch, head, query tile) tasks: no split.
    assert_eq!(key_splits(64, 1 << 20), 1);
    assert_eq!(key_splits(1000, 4096), 1);
    // Decode, 8 heads, 4096 keys: 8 parts of 512 keys reach 64 tasks.
    assert_eq!(key_splits(8, 4096), 8);
    // Too few keys to split.
    assert_eq!(key_splits(1, 1000), 1);
    assert_eq!(key_splits(1, 0), 1);
    for tiles in 0..80 {
        for seq_k in [0, 1, 511, 512, 1500, 4096, 32768, 1 << 20] {
            let p = key_splits(tiles, seq_k);
            assert!(p >= 1);
            assert!(p == 1 || p * 512 <= seq_k, "{tiles} {seq_k}: {p}");
            assert!(
                p == 1 || (p - 1) * tiles.max(1) < 64,
                "{tiles} {seq_k}: {p} overshoots"
            );
        }
    }
}

#[test]
fn key_chunks_depend_on_the_shape_only_and_respect_their_bounds() {
    assert_eq!(key_chunks(8, 1 << 20, 1), 1);
    // One kv head, 4096 keys: 8 chunks of 512.
    assert_eq!(key_chunks(1, 4096, 4096 * 64), 8);
    // Two slices: 4 chunks.
    assert_eq!(key_chunks(2, 4096, 4096 * 64), 4);
    // The dQ partials' budget caps the chunks (MQA, 32 query heads, N = 8192, D = 128).
    assert_eq!(key_chunks(1, 8192, 32 * 8192 * 128), 2);
    for slices in 0..10 {
        for seq_k in [0, 1, 4 * BK - 1, 4 * BK, 3000, 1 << 16] {
            for dq_len in [0, 1000, 1 << 26, 1 << 30] {
                let c = key_chunks(slices, seq_k, dq_len);
                assert!(c >= 1);
                assert!(c == 1 || c * 4 * BK <= seq_k);
                assert!(c == 1 || c * dq_len <= 1 << 26);
            }
        }
    }
}

/// NaN where the f64 reference has NaN, per output row, with one key row holding −∞ and one
/// holding +∞: prefill (prepared rows) and decode (k and v read in place from f32 storage).
#[test]
fn non_finite_keys_make_the_rows_that_see_them_nan() {
    for (nq, causal) in [(40, Causal::TopLeft), (1, Causal::BottomRight)] {
        let spec = AttnProblem::new(Family::softmax(), DType::F32, 1, 2, 1, nq, 300, 16)
            .with_causal(causal)
            .validate()
            .expect("valid");
        let mut case = random_case(&spec, 9);
        let d = spec.head_dim();
        case.k[spec.k_offset(0, 10, 0) + 3] = f64::NEG_INFINITY;
        case.k[spec.k_offset(0, 250, 0) + 5] = f64::INFINITY;
        let want = crate::forward_f64(&spec, case.inputs()).expect("reference");
        let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        let (q, k, v) = (f32s(&case.q), f32s(&case.k), f32s(&case.v));
        let got = super::forward(
            &spec,
            Inputs {
                q: &q,
                k: &k,
                v: &v,
                bias: None,
            },
        )
        .expect("fast forward");
        let mut nan_rows = 0;
        for h in 0..spec.heads_q() {
            for i in 0..nq {
                let at = spec.o_offset(0, i, h);
                let w = want.o[at..at + d].iter().any(|x| x.is_nan());
                let g = got.o[at..at + d].iter().any(|x| x.is_nan());
                assert_eq!(g, w, "nq {nq}: row {i} of head {h}");
                nan_rows += w as usize;
            }
        }
        assert!(nan_rows > 0, "nq {nq}: the reference has no NaN row");
    }
}
