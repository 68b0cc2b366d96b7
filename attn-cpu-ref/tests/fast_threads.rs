//! The fast path gives bit-identical outputs and gradients under any number of rayon threads: its
//! work partitions (the forward's key splits, the backward's key chunks) are functions of the shape
//! alone, and every sum over parts runs in a fixed order.

use attn_core::{AttnProblem, AttnSpec, Causal, DType, Family, KvCacheProblem, KvLayout};
use attn_cpu_ref::kv_cache::KvCacheIo;
use attn_cpu_ref::testing::random_case;
use attn_cpu_ref::{fast, Inputs};

fn f32s(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// o, LSE, dq, dk, dv (and dbias) of forward then backward, as bits, on `threads` threads.
fn run(spec: &AttnSpec, threads: usize) -> Vec<Vec<u32>> {
    let case = random_case(spec, 11);
    let (q, k, v, d_o) = (f32s(&case.q), f32s(&case.k), f32s(&case.v), f32s(&case.d_o));
    let bias = case.bias.as_deref().map(f32s);
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: bias.as_deref(),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool");
    pool.install(|| {
        let f = fast::forward(spec, x).expect("forward");
        let g = fast::backward(spec, x, &f.o, &d_o, &f.stats).expect("backward");
        let mut out = vec![bits(&f.o), bits(&f.stats), bits(&g.dq), bits(&g.dk), bits(&g.dv)];
        out.extend(g.dbias.as_deref().map(bits));
        out
    })
}

#[test]
fn forward_and_backward_are_bit_identical_on_1_2_and_3_threads() {
    let problems = [
        // Prefill with GQA and a causal mask: one task per query tile, no split.
        AttnProblem::new(Family::softmax(), DType::F32, 1, 4, 2, 300, 300, 64).with_causal(Causal::TopLeft),
        // Decode-like: one query against many keys (the forward splits the keys; one kv head, so
        // the backward splits them into chunks).
        AttnProblem::new(Family::softmax(), DType::F32, 1, 4, 1, 1, 5000, 64),
        // Few slices, a bias: backward key chunks and the dbias pass.
        AttnProblem::new(Family::cosine_sim(), DType::F32, 1, 2, 1, 130, 2100, 32).with_bias(1, 2),
    ];
    for p in problems {
        let spec = p.validate().expect("valid");
        let one = run(&spec, 1);
        for threads in [2, 3] {
            assert!(
                run(&spec, threads) == one,
                "q{:?} k{:?}: {threads} threads differ from 1",
                spec.q_shape(),
                spec.k_shape()
            );
        }
    }
}

#[test]
fn forward_kv_cache_is_bit_identical_on_1_2_and_3_threads() {
    let (b, hq, hkv, d, capacity) = (2, 4, 2, 64, 6000);
    let spec = KvCacheProblem::new(
        Family::softmax(),
        DType::F32,
        b,
        hq,
        hkv,
        1,
        d,
        KvLayout::Contiguous { capacity },
    )
    .validate()
    .expect("valid");
    let dense = AttnProblem::new(Family::softmax(), DType::F32, b, hkv, hkv, capacity, capacity, d)
        .validate()
        .expect("valid");
    let case = random_case(&dense, 3);
    let q = f32s(&case.q[..b * hq * d]);
    let new = f32s(&case.d_o[..b * hkv * d]);
    let seqlens = [5000i32, 3100];
    let step = |threads: usize| {
        let (mut kc, mut vc) = (f32s(&case.k), f32s(&case.v));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool");
        let f = pool
            .install(|| {
                fast::forward_kv_cache(
                    &spec,
                    KvCacheIo {
                        q: &q,
                        k_cache: &mut kc,
                        v_cache: &mut vc,
                        k_new: Some(&new),
                        v_new: Some(&new),
                        cache_seqlens: &seqlens,
                        block_table: None,
                    },
                )
            })
            .expect("a step");
        (bits(&f.o), bits(&f.stats))
    };
    let one = step(1);
    assert!(one.0.iter().any(|&x| x != 0), "o is all zeros");
    for threads in [2, 3] {
        assert!(step(threads) == one, "{threads} threads differ from 1");
    }
}
