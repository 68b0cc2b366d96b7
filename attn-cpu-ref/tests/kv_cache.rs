//! A step against a KV cache on the CPU: the append writes exactly the new rows, a paged cache gives
//! the contiguous cache's results bit for bit on the same logical content (shuffled tables, every
//! page size), one-token-at-a-time decode gives the causal prefill's rows, lengths 0, 1 and a full
//! cache work, and bad lengths, tables and buffers are typed errors that leave the cache untouched.

use attn_core::{
    Aggregation, AttnError, AttnProblem, Causal, DType, Family, HypScore, KvCacheProblem, KvCacheSpec,
    KvLayout, PAGE_SIZES,
};
use attn_cpu_ref::kv_cache::{forward_kv_cache, KvCacheIo};
use attn_cpu_ref::{forward, Forward, Inputs};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

fn uniform(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// Sizes shared by one test's steps.
#[derive(Clone, Copy, Debug)]
struct Heads {
    batch: usize,
    heads_q: usize,
    heads_kv: usize,
    d: usize,
}

impl Heads {
    fn problem(&self, family: Family, seq_q: usize, new: usize, layout: KvLayout) -> KvCacheProblem {
        KvCacheProblem::new(
            family,
            DType::F32,
            self.batch,
            self.heads_q,
            self.heads_kv,
            seq_q,
            self.d,
            layout,
        )
        .with_new_tokens(new)
    }
}

/// Run a step; `k_new`/`v_new` are passed exactly when the step has new tokens.
#[allow(clippy::too_many_arguments)]
fn step(
    spec: &KvCacheSpec,
    q: &[f32],
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    k_new: &[f32],
    v_new: &[f32],
    cache_seqlens: &[i32],
    block_table: Option<&[i32]>,
) -> attn_core::Result<Forward<f32, f32>> {
    let has_new = spec.new_tokens() > 0;
    forward_kv_cache(
        spec,
        KvCacheIo {
            q,
            k_cache,
            v_cache,
            k_new: has_new.then_some(k_new),
            v_new: has_new.then_some(v_new),
            cache_seqlens,
            block_table,
        },
    )
}

/// A pool of `pages_per_seq` pages per sequence plus `spare` unused ones, assigned in a shuffled
/// order: the block table `[B, pages_per_seq]` and the pool size.
fn shuffled_table(rng: &mut StdRng, batch: usize, pages_per_seq: usize, spare: usize) -> (Vec<i32>, usize) {
    let num_pages = batch * pages_per_seq + spare;
    let mut pages: Vec<i32> = (0..num_pages as i32).collect();
    pages.shuffle(rng);
    (pages[..batch * pages_per_seq].to_vec(), num_pages)
}

/// The same logical keys in a paged pool: row `j` of sequence `b` of the contiguous cache
/// `[B, capacity, w]` copied to its page slot.
fn to_pages(
    contiguous: &[f32],
    w: usize,
    capacity: usize,
    page: usize,
    table: &[i32],
    num_pages: usize,
) -> Vec<f32> {
    let pages_per_seq = capacity / page;
    let mut pool = vec![f32::NAN; num_pages * page * w];
    for (b, row) in contiguous.chunks(capacity * w).enumerate() {
        for j in 0..capacity {
            let p = table[b * pages_per_seq + j / page] as usize;
            pool[(p * page + j % page) * w..][..w].copy_from_slice(&row[j * w..][..w]);
        }
    }
    pool
}

#[test]
fn append_writes_exactly_the_new_rows() {
    let mut rng = StdRng::seed_from_u64(1);
    let h = Heads {
        batch: 3,
        heads_q: 4,
        heads_kv: 2,
        d: 8,
    };
    let (new, w) = (3, h.heads_kv * h.d);
    let lens = [0i32, 17, 29];
    // Contiguous: row b·capacity + j.
    let capacity = 32;
    let spec = h
        .problem(Family::softmax(), 2, new, KvLayout::Contiguous { capacity })
        .validate()
        .unwrap();
    let q = uniform(&mut rng, spec.attend().q_len());
    let (k0, v0) = (
        uniform(&mut rng, h.batch * capacity * w),
        uniform(&mut rng, h.batch * capacity * w),
    );
    let (kn, vn) = (
        uniform(&mut rng, h.batch * new * w),
        uniform(&mut rng, h.batch * new * w),
    );
    let (mut k, mut v) = (k0.clone(), v0.clone());
    step(&spec, &q, &mut k, &mut v, &kn, &vn, &lens, None).unwrap();
    let (mut want_k, mut want_v) = (k0.clone(), v0.clone());
    for (b, &len) in lens.iter().enumerate() {
        for i in 0..new {
            let dst = (b * capacity + len as usize + i) * w;
            want_k[dst..][..w].copy_from_slice(&kn[(b * new + i) * w..][..w]);
            want_v[dst..][..w].copy_from_slice(&vn[(b * new + i) * w..][..w]);
        }
    }
    assert_eq!(k, want_k, "contiguous k_cache");
    assert_eq!(v, want_v, "contiguous v_cache");

    // Paged: slot j % page of page table[b][j / page]; spare pages untouched.
    let page = 16;
    let (table, num_pages) = shuffled_table(&mut rng, h.batch, 2, 3);
    let spec = h
        .problem(
            Family::softmax(),
            2,
            new,
            KvLayout::Paged {
                num_pages,
                page_size: page,
                pages_per_seq: 2,
            },
        )
        .validate()
        .unwrap();
    let (k0, v0) = (
        uniform(&mut rng, num_pages * page * w),
        uniform(&mut rng, num_pages * page * w),
    );
    let (mut k, mut v) = (k0.clone(), v0.clone());
    step(&spec, &q, &mut k, &mut v, &kn, &vn, &lens, Some(&table)).unwrap();
    let (mut want_k, mut want_v) = (k0, v0);
    for (b, &len) in lens.iter().enumerate() {
        for i in 0..new {
            let j = len as usize + i;
            let dst = (table[b * 2 + j / page] as usize * page + j % page) * w;
            want_k[dst..][..w].copy_from_slice(&kn[(b * new + i) * w..][..w]);
            want_v[dst..][..w].copy_from_slice(&vn[(b * new + i) * w..][..w]);
        }
    }
    assert_eq!(k, want_k, "paged k_pages");
    assert_eq!(v, want_v, "paged v_pages");
}

#[test]
fn paged_equals_contiguous_for_every_page_size() {
    let h = Heads {
        batch: 3,
        heads_q: 8,
        heads_kv: 2,
        d: 16,
    };
    let w = h.heads_kv * h.d;
    for family in [Family::softmax(), Family::cosine_sim()] {
        for page in [16, 32, 64, 128, 256] {
            assert!(PAGE_SIZES.contains(&page));
            let mut rng = StdRng::seed_from_u64(page as u64);
            let pages_per_seq = 3;
            let capacity = pages_per_seq * page;
            let (seq_q, new) = (2, 2);
            // Lengths: empty, not a multiple of the page, and the fullest the step allows.
            let lens = [0, page as i32 + 5, (capacity - new) as i32];
            let contiguous = h
                .problem(family, seq_q, new, KvLayout::Contiguous { capacity })
                .validate()
                .unwrap();
            let (table, num_pages) = shuffled_table(&mut rng, h.batch, pages_per_seq, 2);
            let paged = h
                .problem(
                    family,
                    seq_q,
                    new,
                    KvLayout::Paged {
                        num_pages,
                        page_size: page,
                        pages_per_seq,
                    },
                )
                .validate()
                .unwrap();
            let q = uniform(&mut rng, contiguous.attend().q_len());
            let (mut kc, mut vc) = (
                uniform(&mut rng, h.batch * capacity * w),
                uniform(&mut rng, h.batch * capacity * w),
            );
            let (kn, vn) = (
                uniform(&mut rng, h.batch * new * w),
                uniform(&mut rng, h.batch * new * w),
            );
            let mut kp = to_pages(&kc, w, capacity, page, &table, num_pages);
            let mut vp = to_pages(&vc, w, capacity, page, &table, num_pages);
            let a = step(&contiguous, &q, &mut kc, &mut vc, &kn, &vn, &lens, None).unwrap();
            let b = step(&paged, &q, &mut kp, &mut vp, &kn, &vn, &lens, Some(&table)).unwrap();
            let case = format!("{family:?}, page {page}");
            assert_eq!(a.o, b.o, "o: {case}");
            assert_eq!(a.stats, b.stats, "lse: {case}");
            // The caches hold the same logical content after the append.
            let kp_logical = to_pages(&kc, w, capacity, page, &table, num_pages);
            let used = |x: &[f32]| -> Vec<f32> {
                table
                    .iter()
                    .flat_map(|&p| x[p as usize * page * w..][..page * w].to_vec())
                    .collect()
            };
            assert_eq!(used(&kp), used(&kp_logical), "k pages after the append: {case}");
            assert!(a.o.iter().all(|x| x.is_finite()), "{case}");
        }
    }
}

/// Decode `n` tokens per sequence, first `prefill` of them in one step and then one at a time,
/// against the causal forward of the whole sequence; `page` chooses a paged cache.
fn decode_matches_prefill(family: Family, window: Option<usize>, prefill: usize, page: Option<usize>) {
    let h = Heads {
        batch: 2,
        heads_q: 4,
        heads_kv: 2,
        d: 16,
    };
    let (n, w) = (37, h.heads_kv * h.d);
    let mut rng = StdRng::seed_from_u64(7);
    let qw = h.heads_q * h.d;
    let (q, k, v) = (
        uniform(&mut rng, h.batch * n * qw),
        uniform(&mut rng, h.batch * n * w),
        uniform(&mut rng, h.batch * n * w),
    );
    let mut dense = AttnProblem::new(family, DType::F32, h.batch, h.heads_q, h.heads_kv, n, n, h.d)
        .with_causal(Causal::BottomRight);
    if let Some(left) = window {
        dense = dense.with_window(Some(left), Some(0));
    }
    let dense = dense.validate().unwrap();
    let want = forward(
        &dense,
        Inputs {
            q: &q,
            k: &k,
            v: &v,
            bias: None,
        },
    )
    .unwrap();
    let (layout, table) = match page {
        None => (KvLayout::Contiguous { capacity: 40 }, None),
        Some(p) => {
            let pages_per_seq = n.div_ceil(p);
            let (table, num_pages) = shuffled_table(&mut rng, h.batch, pages_per_seq, 1);
            let layout = KvLayout::Paged {
                num_pages,
                page_size: p,
                pages_per_seq,
            };
            (layout, Some(table))
        }
    };
    let cache_len = h
        .problem(family, 1, 1, layout)
        .validate()
        .unwrap()
        .cache_shape(h.d)
        .iter()
        .product();
    let mut kc = vec![0f32; cache_len];
    let mut vc = kc.clone();
    // Rows t0..t1 of every sequence of a [B, n, H, D] tensor, as a [B, t1 − t0, H, D] buffer.
    let rows = |x: &[f32], width: usize, t0: usize, t1: usize| -> Vec<f32> {
        (0..h.batch)
            .flat_map(|b| x[(b * n + t0) * width..(b * n + t1) * width].to_vec())
            .collect()
    };
    let mut got_o = vec![f32::NAN; want.o.len()];
    let mut got_lse = vec![f32::NAN; want.stats.len()];
    let mut t = 0;
    while t < n {
        let chunk = if t == 0 { prefill.max(1) } else { 1 };
        let mut p = h.problem(family, chunk, chunk, layout);
        if let Some(left) = window {
            p = p.with_window(Some(left), Some(0));
        }
        let spec = p.validate().unwrap();
        let lens = vec![t as i32; h.batch];
        let f = step(
            &spec,
            &rows(&q, qw, t, t + chunk),
            &mut kc,
            &mut vc,
            &rows(&k, w, t, t + chunk),
            &rows(&v, w, t, t + chunk),
            &lens,
            table.as_deref(),
        )
        .unwrap();
        for b in 0..h.batch {
            for i in 0..chunk {
                let (src, dst) = ((b * chunk + i) * qw, (b * n + t + i) * qw);
                got_o[dst..dst + qw].copy_from_slice(&f.o[src..src + qw]);
                for hq in 0..h.heads_q {
                    got_lse[(b * h.heads_q + hq) * n + t + i] = f.stats[(b * h.heads_q + hq) * chunk + i];
                }
            }
        }
        t += chunk;
    }
    let case = format!("{family:?}, window {window:?}, prefill {prefill}, page {page:?}");
    let err = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    // f64 inside, rounded once: the rows agree to the last bit or two of f32.
    assert!(
        err(&got_o, &want.o) <= 1e-6,
        "o: {case}: {}",
        err(&got_o, &want.o)
    );
    assert!(
        err(&got_lse, &want.stats) <= 1e-5,
        "lse: {case}: {}",
        err(&got_lse, &want.stats)
    );
}

#[test]
fn one_token_at_a_time_decode_equals_the_causal_prefill() {
    for family in [
        Family::softmax(),
        Family::cosine_sim(),
        Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::Euclidean),
    ] {
        decode_matches_prefill(family, None, 1, None);
        decode_matches_prefill(family, None, 11, None);
        decode_matches_prefill(family, None, 11, Some(16));
    }
    decode_matches_prefill(Family::softmax(), Some(5), 1, None);
    decode_matches_prefill(Family::softmax(), Some(5), 20, Some(32));
}

#[test]
fn lengths_zero_one_and_a_full_cache() {
    let h = Heads {
        batch: 3,
        heads_q: 2,
        heads_kv: 1,
        d: 8,
    };
    let capacity = 24;
    let w = h.heads_kv * h.d;
    let mut rng = StdRng::seed_from_u64(3);
    let (mut kc, mut vc) = (
        uniform(&mut rng, h.batch * capacity * w),
        uniform(&mut rng, h.batch * capacity * w),
    );
    // No new tokens: attend to the cache as it is. Sequence 0 is empty, 1 holds one key, 2 is full.
    let spec = h
        .problem(Family::softmax(), 1, 0, KvLayout::Contiguous { capacity })
        .with_causal(false)
        .validate()
        .unwrap();
    let q = uniform(&mut rng, spec.attend().q_len());
    let before = (kc.clone(), vc.clone());
    let f = step(
        &spec,
        &q,
        &mut kc,
        &mut vc,
        &[],
        &[],
        &[0, 1, capacity as i32],
        None,
    )
    .unwrap();
    assert_eq!(
        (kc.clone(), vc.clone()),
        before,
        "a step without new tokens writes nothing"
    );
    let o = |b: usize, hq: usize| &f.o[(b * h.heads_q + hq) * h.d..][..h.d];
    for hq in 0..h.heads_q {
        assert!(
            o(0, hq).iter().all(|&x| x == 0.0),
            "an empty sequence gives zeros"
        );
        assert_eq!(f.stats[hq], f32::NEG_INFINITY, "and LSE −∞");
        assert_eq!(o(1, hq), &vc[capacity * w..][..h.d], "one key: o is its value");
    }
    // The full sequence against a dense forward over all its keys.
    let dense = AttnProblem::new(
        Family::softmax(),
        DType::F32,
        1,
        h.heads_q,
        h.heads_kv,
        1,
        capacity,
        h.d,
    )
    .validate()
    .unwrap();
    let last = 2 * capacity * w;
    let want = forward(
        &dense,
        Inputs {
            q: &q[2 * h.heads_q * h.d..],
            k: &kc[last..],
            v: &vc[last..],
            bias: None,
        },
    )
    .unwrap();
    assert_eq!(&f.o[2 * h.heads_q * h.d..], &want.o[..], "a full cache");

    // New tokens that fill the cache exactly.
    let spec = h
        .problem(Family::softmax(), 1, 4, KvLayout::Contiguous { capacity })
        .validate()
        .unwrap();
    let kn = uniform(&mut rng, h.batch * 4 * w);
    let full = (capacity - 4) as i32;
    let f = step(&spec, &q, &mut kc, &mut vc, &kn, &kn, &[0, 1, full], None).unwrap();
    assert!(f.o.iter().all(|x| x.is_finite()));
    assert_eq!(
        &kc[(3 * capacity - 4) * w..],
        &kn[2 * 4 * w..],
        "the last slots of a full cache"
    );
}

fn arg(e: AttnError) -> String {
    match e {
        AttnError::InvalidArgument { arg, .. } => arg.to_string(),
        AttnError::ShapeMismatch { what, .. } => what,
        other => panic!("unexpected error {other}"),
    }
}

#[test]
fn bad_lengths_tables_and_buffers_are_typed_errors_that_write_nothing() {
    let h = Heads {
        batch: 2,
        heads_q: 4,
        heads_kv: 2,
        d: 8,
    };
    let w = h.heads_kv * h.d;
    let page = 16;
    let paged = h
        .problem(
            Family::softmax(),
            1,
            1,
            KvLayout::Paged {
                num_pages: 4,
                page_size: page,
                pages_per_seq: 2,
            },
        )
        .validate()
        .unwrap();
    let contiguous = h
        .problem(Family::softmax(), 1, 1, KvLayout::Contiguous { capacity: 32 })
        .validate()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let q = uniform(&mut rng, paged.attend().q_len());
    let kn = uniform(&mut rng, h.batch * w);
    let cache = uniform(&mut rng, 4 * page * w);
    let table = [0, 1, 2, 3];
    let run = |spec: &KvCacheSpec,
               q: &[f32],
               cache_len: usize,
               new: Option<&[f32]>,
               lens: &[i32],
               table: Option<&[i32]>|
     -> String {
        let (mut k, mut v) = (cache[..cache_len].to_vec(), cache[..cache_len].to_vec());
        let e = forward_kv_cache(
            spec,
            KvCacheIo {
                q,
                k_cache: &mut k,
                v_cache: &mut v,
                k_new: new,
                v_new: new,
                cache_seqlens: lens,
                block_table: table,
            },
        )
        .unwrap_err();
        assert_eq!(k, cache[..cache_len], "{e}: the cache is unchanged");
        assert_eq!(v, cache[..cache_len], "{e}: the cache is unchanged");
        arg(e)
    };
    let full = 4 * page * w;
    let t = Some(&table[..]);
    // Lengths beyond the cache (31 + 1 new = 32 fits; 32 + 1 does not), negative, or too few.
    assert_eq!(run(&paged, &q, full, Some(&kn), &[32, 0], t), "cache_seqlens");
    assert_eq!(run(&paged, &q, full, Some(&kn), &[-1, 0], t), "cache_seqlens");
    assert_eq!(run(&paged, &q, full, Some(&kn), &[0], t), "cache_seqlens");
    assert_eq!(
        run(&contiguous, &q, full, Some(&kn), &[32, 0], None),
        "cache_seqlens"
    );
    // A table entry in use outside the pool; a table of the wrong size; no table; a table where
    // none belongs.
    assert_eq!(
        run(&paged, &q, full, Some(&kn), &[16, 0], Some(&[0, 4, 2, 3])),
        "block_table"
    );
    assert_eq!(
        run(&paged, &q, full, Some(&kn), &[0, 0], Some(&[0, -1, -1, 3])),
        "block_table"
    );
    assert_eq!(
        run(&paged, &q, full, Some(&kn), &[0, 0], Some(&[0, 1])),
        "block_table"
    );
    assert_eq!(run(&paged, &q, full, Some(&kn), &[0, 0], None), "block_table");
    assert_eq!(run(&contiguous, &q, full, Some(&kn), &[0, 0], t), "block_table");
    // Buffers: a short cache, a short q, new tokens missing, new tokens where the step has none.
    assert_eq!(run(&paged, &q, full - 1, Some(&kn), &[0, 0], t), "k_cache");
    assert_eq!(run(&paged, &q[1..], full, Some(&kn), &[0, 0], t), "q");
    assert_eq!(run(&paged, &q, full, None, &[0, 0], t), "k_new");
    assert_eq!(run(&paged, &q, full, Some(&kn[1..]), &[0, 0], t), "k_new");
    let no_new = h
        .problem(
            Family::softmax(),
            1,
            0,
            KvLayout::Paged {
                num_pages: 4,
                page_size: page,
                pages_per_seq: 2,
            },
        )
        .validate()
        .unwrap();
    assert_eq!(run(&no_new, &q, full, Some(&kn), &[0, 0], t), "k_new");
    // A dtype other than the spec's.
    let bf = KvCacheProblem::new(
        Family::softmax(),
        DType::BF16,
        2,
        4,
        2,
        1,
        8,
        KvLayout::Contiguous { capacity: 32 },
    )
    .validate()
    .unwrap();
    assert_eq!(run(&bf, &q, 2 * 32 * w, Some(&kn), &[0, 0], None), "dtype");
}

/// A step of a batch of 0 returns empty o and LSE and writes nothing; a step with `seq_q = 0`
/// appends its new tokens (the same rows as a step with queries) and returns empty o and LSE.
#[test]
fn steps_with_an_empty_batch_or_no_query() {
    let (hq, hkv, d, cap, new) = (4, 2, 8, 6, 2);
    let layout = KvLayout::Contiguous { capacity: cap };
    let mut rng = StdRng::seed_from_u64(9);
    // B = 0.
    let spec = KvCacheProblem::new(Family::softmax(), DType::F32, 0, hq, hkv, 1, d, layout)
        .with_new_tokens(new)
        .validate()
        .expect("a batch of 0 validates");
    let (mut kc, mut vc) = (Vec::<f32>::new(), Vec::<f32>::new());
    let f = forward_kv_cache(
        &spec,
        KvCacheIo {
            q: &[],
            k_cache: &mut kc,
            v_cache: &mut vc,
            k_new: Some(&[]),
            v_new: Some(&[]),
            cache_seqlens: &[],
            block_table: None,
        },
    )
    .expect("a step of a batch of 0");
    assert!(f.o.is_empty() && f.stats.is_empty());
    // seq_q = 0 against seq_q = 1: the same append, no output.
    let b = 2;
    let k_new = uniform(&mut rng, b * new * hkv * d);
    let v_new = uniform(&mut rng, b * new * hkv * d);
    let lens = [1i32, 3];
    let mut caches = Vec::new();
    for seq_q in [0, 1] {
        let spec = KvCacheProblem::new(Family::softmax(), DType::F32, b, hq, hkv, seq_q, d, layout)
            .with_new_tokens(new)
            .validate()
            .expect("valid");
        let q = uniform(&mut rng, b * seq_q * hq * d);
        let (mut kc, mut vc) = (vec![0f32; b * cap * hkv * d], vec![0f32; b * cap * hkv * d]);
        let f = forward_kv_cache(
            &spec,
            KvCacheIo {
                q: &q,
                k_cache: &mut kc,
                v_cache: &mut vc,
                k_new: Some(&k_new),
                v_new: Some(&v_new),
                cache_seqlens: &lens,
                block_table: None,
            },
        )
        .unwrap_or_else(|e| panic!("seq_q {seq_q}: {e}"));
        assert_eq!(f.o.len(), b * seq_q * hq * d, "seq_q {seq_q}: o");
        assert_eq!(f.stats.len(), b * seq_q * hq, "seq_q {seq_q}: LSE");
        caches.push((kc, vc));
    }
    assert_eq!(caches[0], caches[1], "seq_q = 0 appends as seq_q = 1 does");
    assert!(caches[0].0.iter().any(|&x| x != 0.0), "the new keys were written");
}
