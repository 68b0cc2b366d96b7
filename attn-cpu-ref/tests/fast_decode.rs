//! Taylor's recurrent decode on the fast path (`fast::decode_taylor`, f32 sums) against the f64
//! oracle: a prompt prefilled in one call and continued by steps of one or more tokens gives the
//! causal forward of the whole sequence, under the fast tests' rule (`testing::naive`: o and the
//! denominator within `2·err(naive) + 4·u_T·max|ref|`, the naive baseline the quadratic form in the
//! storage dtype `T` on the whole sequence). Orders 1 and 2, `qk_l2norm` on and off, GQA and MHA,
//! D = 1, 2, 16 and 64, f32, bf16 and f16, empty prompts, prompts and steps long enough for the sweep's
//! chunks, batch entries with prompts of different lengths; the state against the f64 state's sums;
//! independence of the thread count; the NaN contract (a NaN key reaches exactly the rows that see
//! it, as in the oracle); typed errors for steps that do not fit the state.

#[path = "../src/taylor/test_specs.rs"]
#[allow(dead_code)]
mod test_specs;

mod fast_common;

use attn_core::{AttnError, AttnProblem, AttnSpec, Causal, DType, Element, Family, Pass, TaylorParams};
use attn_cpu_ref::decode::{self as oracle, DecodeState};
use attn_cpu_ref::fast::decode_taylor::{prefill, step, FastDecodeState};
use attn_cpu_ref::testing::{max_abs, naive, random_case};
use attn_cpu_ref::{forward_f64, Forward, Inputs};
use fast_common::{on_threads, round};
use half::bf16;
use test_specs::family;

/// A family, head shapes and storage dtype; sequences are `[B, N, H, D]`.
#[derive(Clone, Copy, Debug)]
struct Setup {
    family: Family,
    dtype: DType,
    batch: usize,
    heads_q: usize,
    heads_kv: usize,
    d: usize,
    dv: usize,
}

impl Setup {
    fn problem(&self, nq: usize, nk: usize) -> AttnProblem {
        AttnProblem::new(
            self.family,
            self.dtype,
            self.batch,
            self.heads_q,
            self.heads_kv,
            nq,
            nk,
            self.d,
        )
        .with_head_dim_v(self.dv)
    }

    /// A dense step (or prompt) of `t` tokens per batch entry.
    fn step(&self, t: usize) -> AttnSpec {
        self.problem(t, t)
            .with_causal(Causal::BottomRight)
            .validate()
            .expect("a valid step")
    }
}

/// The rows of `part` (a prompt or a step) taken from `full`'s buffer `src`: token `i` of entry `b`
/// is token `start[b] + i` of the whole sequence. `which` is `q`, `k` or `v`.
fn rows<T: Copy>(full: &AttnSpec, part: &AttnSpec, start: &[usize], src: &[T], which: char) -> Vec<T> {
    let (len, heads, dim) = match which {
        'q' => (part.q_len(), part.heads_q(), part.head_dim()),
        'k' => (part.k_len(), part.heads_kv(), part.head_dim()),
        _ => (part.v_len(), part.heads_kv(), part.head_dim_v()),
    };
    let at = |s: &AttnSpec, b, i, h| match which {
        'q' => s.q_offset(b, i, h),
        'k' => s.k_offset(b, i, h),
        _ => s.v_offset(b, i, h),
    };
    let mut out = vec![src[0]; len];
    for (b, &s0) in start.iter().enumerate() {
        for i in 0..part.seq_lens(b).k {
            for h in 0..heads {
                let (to, from) = (at(part, b, i, h), at(full, b, s0 + i, h));
                out[to..to + dim].copy_from_slice(&src[from..from + dim]);
            }
        }
    }
    out
}

/// One decode of a whole sequence, gathered in the layout of `full`'s forward.
struct Gathered {
    o: Vec<f64>,
    den: Vec<f64>,
}

impl Gathered {
    fn new(full: &AttnSpec) -> Self {
        Gathered {
            o: vec![f64::NAN; full.o_len()],
            den: vec![f64::NAN; full.stats_len()],
        }
    }

    /// Put the outputs of `part` (queries `start[b]..` of entry `b`) at their rows of `full`.
    fn put<T: Element>(&mut self, full: &AttnSpec, part: &AttnSpec, start: &[usize], f: &Forward<T, f32>) {
        let dv = part.head_dim_v();
        for (b, &s0) in start.iter().enumerate() {
            for i in 0..part.seq_lens(b).q {
                for h in 0..part.heads_q() {
                    let (to, from) = (full.o_offset(b, s0 + i, h), part.o_offset(b, i, h));
                    for (dst, src) in self.o[to..to + dv].iter_mut().zip(&f.o[from..from + dv]) {
                        *dst = src.to_f64();
                    }
                    self.den[full.stats_index(b, h, s0 + i)] = f.stats[part.stats_index(b, h, i)] as f64;
                }
            }
        }
    }
}

fn inputs<'a, T>(q: &'a [T], k: &'a [T], v: &'a [T]) -> Inputs<'a, T> {
    Inputs { q, k, v, bias: None }
}

/// Decode `full` (a causal sequence, dense or packed) in storage dtype `T`: the prompt `prompt`
/// (its entries' first tokens; `None`: decoding starts from an empty state built for `steps`'
/// spec) through [`prefill`], then dense steps of `steps[s]` tokens each through [`step`]. Every
/// output and denominator against the oracle's forward of `full` under the fast tests' rule.
fn check_decode<T: Element>(
    full: &AttnSpec,
    prompt: Option<&AttnSpec>,
    steps: &[AttnSpec],
    seed: u64,
) -> Result<(), String> {
    let e = |e: AttnError| e.to_string();
    let case = random_case(full, seed);
    let ((q, qw), (k, kw), (v, vw)) = (round::<T>(&case.q), round::<T>(&case.k), round::<T>(&case.v));
    let wide = inputs(&qw, &kw, &vw);
    let reference = forward_f64(full, wide).map_err(e)?;
    let base = naive::baseline::<T>(full, wide, &round::<T>(&case.d_o).1).map_err(e)?;

    let mut got = Gathered::new(full);
    let zero = vec![0; full.batch()];
    let mut state = match prompt {
        Some(p) => {
            let part = |src: &[T], w| rows(full, p, &zero, src, w);
            let (pq, pk, pv) = (part(&q, 'q'), part(&k, 'k'), part(&v, 'v'));
            let (f, state) = prefill(p, inputs(&pq, &pk, &pv)).map_err(e)?;
            got.put(full, p, &zero, &f);
            state
        }
        None => FastDecodeState::empty(&steps[0]).map_err(e)?,
    };
    for s in steps {
        let start = state.lens().to_vec();
        let part = |src: &[T], w| rows(full, s, &start, src, w);
        let (sq, sk, sv) = (part(&q, 'q'), part(&k, 'k'), part(&v, 'v'));
        let f = step(&mut state, s, inputs(&sq, &sk, &sv)).map_err(e)?;
        got.put(full, s, &start, &f);
    }
    for b in 0..full.batch() {
        let want = full.seq_lens(b).k;
        if state.lens()[b] != want {
            return Err(format!(
                "entry {b}: the state holds {} tokens, not {want}",
                state.lens()[b]
            ));
        }
    }
    let u = T::DTYPE.unit_roundoff();
    naive::compare_forward(full, &got.o, &got.den, &reference, &base, u)
}

/// [`check_decode`] in the spec's dtype.
fn check(full: &AttnSpec, prompt: Option<&AttnSpec>, steps: &[AttnSpec], seed: u64) -> Result<(), String> {
    match full.dtype() {
        DType::F32 => check_decode::<f32>(full, prompt, steps, seed),
        DType::BF16 => check_decode::<bf16>(full, prompt, steps, seed),
        DType::F16 => check_decode::<half::f16>(full, prompt, steps, seed),
    }
}

/// A dense sequence of `prompt` tokens (0: from an empty state) and then steps of `sizes`.
fn check_dense(setup: &Setup, prompt: usize, sizes: &[usize], seed: u64) -> Result<(), String> {
    let n = prompt + sizes.iter().sum::<usize>();
    let full = setup
        .problem(n, n)
        .with_causal(Causal::TopLeft)
        .validate()
        .map_err(|e| e.to_string())?;
    let p = (prompt > 0).then(|| setup.step(prompt));
    let steps: Vec<AttnSpec> = sizes.iter().map(|&t| setup.step(t)).collect();
    check(&full, p.as_ref(), &steps, seed)
        .map_err(|m| format!("{setup:?}, prompt {prompt}, steps {sizes:?}: {m}"))
}

fn fail_on(failures: Vec<String>, what: &str) {
    assert!(
        failures.is_empty(),
        "{what}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Coefficients drawn once; order 1 keeps `f > 0` over every score (`test_specs::family`).
fn taylor(order: u8, l2: bool, d: usize) -> Family {
    family(order, [0.3, 0.7, 0.4, 0.5], l2, d)
}

#[test]
fn fast_decode_token_by_token_matches_the_causal_forward() {
    let mut failures = Vec::new();
    let mut n = 0;
    for order in [1, 2] {
        for l2 in [false, true] {
            for (heads_q, heads_kv) in [(4, 1), (8, 2), (3, 3)] {
                for d in [1, 2, 16, 64] {
                    for dtype in [DType::F32, DType::BF16, DType::F16] {
                        let setup = Setup {
                            family: taylor(order, l2, d),
                            dtype,
                            batch: 2,
                            heads_q,
                            heads_kv,
                            d,
                            dv: if d == 16 { 5 } else { d },
                        };
                        // Prompts of 0 (an empty state), 1 and 20 tokens, then 20 single tokens.
                        let prompt = [0, 1, 20][n % 3];
                        n += 1;
                        if let Err(m) = check_dense(&setup, prompt, &[1; 20], 100 + n as u64) {
                            failures.push(m);
                        }
                    }
                }
            }
        }
    }
    println!("{n} decodes");
    fail_on(failures, "token by token");
}

/// Steps of several tokens, including one of 150 (which the sweep reads through its chunks of 64
/// where the states are cheap: order 1, and order 2 at small D) and a whole sequence appended as
/// one step to an empty state (what attn-candle's `TaylorCache` does with a prompt); prompts of
/// 150 and 300 tokens that the prefill's sweep chunks.
#[test]
fn fast_decode_steps_of_several_tokens_and_long_prompts_match_the_causal_forward() {
    let mut failures = Vec::new();
    let mut n = 0;
    for order in [1, 2] {
        for (d, heads_q, heads_kv) in [(2, 4, 1), (16, 2, 2), (64, 4, 1)] {
            for dtype in [DType::F32, DType::BF16] {
                let setup = Setup {
                    family: taylor(order, order == 1, d),
                    dtype,
                    batch: 2,
                    heads_q,
                    heads_kv,
                    d,
                    dv: d,
                };
                for (prompt, sizes) in [
                    (0, vec![3, 1, 5, 2, 150, 4]),
                    (0, vec![170, 1, 1]),
                    (150, vec![2, 7, 1]),
                    (300, vec![1, 65]),
                ] {
                    n += 1;
                    if let Err(m) = check_dense(&setup, prompt, &sizes, 200 + n) {
                        failures.push(m);
                    }
                }
            }
        }
    }
    println!("{n} decodes");
    fail_on(failures, "multi-token steps and long prompts");
}

/// Prompts of different lengths in one batch (a packed varlen prompt, one entry empty or short,
/// one across a chunk boundary): each entry continues after its own tokens. The reference is the
/// packed causal forward of each entry's whole sequence.
#[test]
fn fast_decode_batch_entries_continue_after_their_own_prompts() {
    let mut failures = Vec::new();
    for (order, lens) in [(2, [45, 0]), (1, [3, 140]), (2, [70, 9])] {
        for dtype in [DType::F32, DType::BF16] {
            let setup = Setup {
                family: taylor(order, true, 8),
                dtype,
                batch: 2,
                heads_q: 4,
                heads_kv: 1,
                d: 8,
                dv: 6,
            };
            let sizes = [1, 4, 1, 1, 2];
            let steps: Vec<AttnSpec> = sizes.iter().map(|&t| setup.step(t)).collect();
            let added: usize = sizes.iter().sum();
            let max = lens[0].max(lens[1]);
            let cu = |extra: usize| vec![0, lens[0] + extra, lens[0] + lens[1] + 2 * extra];
            let prompt = setup
                .problem(max, max)
                .with_varlen(cu(0), cu(0))
                .with_causal(Causal::TopLeft)
                .validate()
                .expect("a valid prompt");
            let full = setup
                .problem(max + added, max + added)
                .with_varlen(cu(added), cu(added))
                .with_causal(Causal::TopLeft)
                .validate()
                .expect("a valid sequence");
            if let Err(m) = check(&full, Some(&prompt), &steps, 7) {
                failures.push(format!("order {order}, prompts {lens:?}, {dtype}: {m}"));
            }
        }
    }
    fail_on(failures, "prompts of different lengths");
}

/// The state after a key-padded prompt holds each entry's valid keys, and its sums are the f64
/// state's within f32 rounding of sums over those keys.
#[test]
fn fast_prefill_state_holds_the_f64_sums_over_the_valid_keys() {
    let key_lens = vec![37, 4, 0];
    for order in [1, 2] {
        let family = Family::Taylor(TaylorParams {
            order,
            a: [0.9, 0.6, if order == 2 { 0.35 } else { 0.0 }],
            scale: Some(0.4),
            qk_l2norm: order == 1,
        });
        let spec = AttnProblem::new(family, DType::F32, 3, 4, 2, 37, 37, 5)
            .with_head_dim_v(3)
            .with_causal(Causal::BottomRight)
            .with_key_lens(key_lens.clone())
            .validate()
            .expect("a valid prompt");
        let case = random_case(&spec, 3);
        let narrow = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        let (q, k, v) = (narrow(&case.q), narrow(&case.k), narrow(&case.v));
        let wide = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let (qw, kw, vw) = (wide(&q), wide(&k), wide(&v));
        let (_, fast) = prefill(&spec, inputs(&q, &k, &v)).expect("fast prefill");
        let (_, exact) = oracle::prefill_f64(&spec, inputs(&qw, &kw, &vw)).expect("f64 prefill");
        assert_eq!(fast.lens(), &key_lens[..]);
        for (b, &len) in key_lens.iter().enumerate() {
            assert_eq!(exact.len(b), len);
            for hk in 0..2 {
                let got = fast.sums(b, hk).expect("an entry and head of the state");
                let want = exact.sums(b, hk);
                assert_eq!(got.len(), want.len(), "rows [F, m] as the f64 state's");
                let err = got
                    .iter()
                    .zip(want)
                    .map(|(g, w)| (*g as f64 - w).abs())
                    .fold(0.0, f64::max);
                let tol = 1e-5 * max_abs(want).max(1.0);
                assert!(
                    err <= tol,
                    "order {order}, entry {b}, head {hk}: sums differ by {err:.3e}"
                );
            }
        }
        assert!(fast.sums(3, 0).is_none() && fast.sums(0, 2).is_none());
    }
}

/// Rayon pools of 1 and 3 threads give the same bits, prefill and steps (one token, and 100).
#[test]
fn fast_decode_is_bit_identical_across_thread_counts() {
    for order in [1, 2] {
        let setup = Setup {
            family: taylor(order, false, 16),
            dtype: DType::F32,
            batch: 2,
            heads_q: 4,
            heads_kv: 2,
            d: 16,
            dv: 16,
        };
        let (prompt, one, many) = (setup.step(200), setup.step(1), setup.step(100));
        let run = || {
            let mut outs: Vec<Vec<u32>> = Vec::new();
            let mut keep = |f: Forward<f32, f32>| {
                outs.push(f.o.iter().chain(&f.stats).map(|x| x.to_bits()).collect());
            };
            let c = random_case(&prompt, 1);
            let narrow = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
            let (f, mut state) =
                prefill(&prompt, inputs(&narrow(&c.q), &narrow(&c.k), &narrow(&c.v))).expect("prefill");
            keep(f);
            for (s, spec) in [&one, &many, &one].into_iter().enumerate() {
                let c = random_case(spec, 2 + s as u64);
                let f = step(
                    &mut state,
                    spec,
                    inputs(&narrow(&c.q), &narrow(&c.k), &narrow(&c.v)),
                )
                .expect("step");
                keep(f);
            }
            outs
        };
        let runs = [on_threads(1, run), on_threads(3, run)];
        assert_eq!(runs[0], runs[1], "order {order}: 1 and 3 threads differ");
    }
}

fn expect_arg<T: std::fmt::Debug>(r: Result<T, AttnError>, arg: &str) {
    match r {
        Err(AttnError::InvalidArgument { op, arg: a, .. }) if a == arg => assert_eq!(op.pass, Pass::Decode),
        other => panic!("expected an invalid `{arg}`, got {other:?}"),
    }
}

fn expect_shape<T: std::fmt::Debug>(r: Result<T, AttnError>, what: &str) {
    match r {
        Err(AttnError::ShapeMismatch { what: w, .. }) if w == what => {}
        other => panic!("expected a wrong shape of `{what}`, got {other:?}"),
    }
}

/// Steps that do not fit the state (another head shape, dtype, family, packed lengths, Nq ≠ Nk,
/// no causal mask), buffers of the wrong length or dtype, a bias, a family other than Taylor and a
/// state too large for memory are typed errors naming the argument, the fast state's as the f64
/// state's; a failed step leaves the state as it was.
#[test]
fn fast_decode_steps_that_do_not_fit_the_state_are_typed_errors() {
    let base =
        || AttnProblem::new(Family::taylor(2), DType::F32, 2, 4, 2, 1, 1, 8).with_causal(Causal::TopLeft);
    let spec = base().validate().expect("valid");
    let c = random_case(&spec, 1);
    let narrow = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    let (q, k, v) = (narrow(&c.q), narrow(&c.k), narrow(&c.v));
    let (_, mut state) = prefill(&spec, inputs(&q, &k, &v)).expect("prefill");
    let sums = |s: &FastDecodeState| (s.lens().to_vec(), s.sums(1, 1));
    let before = sums(&state);

    let other = |p: AttnProblem| p.validate().expect("valid");
    let mismatched = [
        other(AttnProblem {
            heads_kv: 1,
            ..base()
        }),
        other(AttnProblem {
            head_dim_v: 3,
            ..base()
        }),
        other(AttnProblem { batch: 3, ..base() }),
        other(AttnProblem {
            family: Family::taylor(1),
            ..base()
        }),
    ];
    for s in &mismatched {
        let c = random_case(s, 2);
        let (q, k, v) = (narrow(&c.q), narrow(&c.k), narrow(&c.v));
        let r = step(&mut state, s, inputs(&q, &k, &v));
        let e = r.as_ref().expect_err("a spec the state was not built for");
        assert!(e.to_string().contains("the state was built for"), "{e}");
        expect_arg(r, "state");
    }
    // A bf16 spec against the f32 state, and f32 buffers against a bf16 spec.
    let b16 = other(AttnProblem {
        dtype: DType::BF16,
        ..base()
    });
    let h: Vec<bf16> = c.q.iter().map(|&x| bf16::from_f64(x)).collect();
    let hk: Vec<bf16> = c.k.iter().map(|&x| bf16::from_f64(x)).collect();
    let hv: Vec<bf16> = c.v.iter().map(|&x| bf16::from_f64(x)).collect();
    expect_arg(step(&mut state, &b16, inputs(&h, &hk, &hv)), "state");
    expect_arg(step(&mut state, &spec, inputs(&h, &hk, &hv)), "dtype");
    let mut b16_state = FastDecodeState::empty(&b16).expect("a bf16 state");
    expect_arg(step(&mut b16_state, &b16, inputs(&q, &k, &v)), "dtype");
    expect_arg(prefill(&b16, inputs(&q, &k, &v)), "dtype");
    // Not a decode step.
    let varlen = other(base().with_varlen(vec![0, 1, 2], vec![0, 1, 2]));
    expect_arg(step(&mut state, &varlen, inputs(&q, &k, &v)), "lengths");
    let open = other(base().with_causal(Causal::None));
    expect_arg(step(&mut state, &open, inputs(&q, &k, &v)), "causal");
    let long = other(AttnProblem { seq_k: 2, ..base() });
    let lc = random_case(&long, 4);
    expect_shape(
        step(
            &mut state,
            &long,
            inputs(&narrow(&lc.q), &narrow(&lc.k), &narrow(&lc.v)),
        ),
        "seq_k",
    );
    // Buffers of the wrong length, a bias.
    expect_shape(step(&mut state, &spec, inputs(&q[1..], &k, &v)), "q");
    expect_shape(step(&mut state, &spec, inputs(&q, &k, &v[..v.len() - 1])), "v");
    expect_shape(prefill(&spec, inputs(&q, &k[1..], &v)), "k");
    let bias = [0f32];
    let with_bias = Inputs {
        bias: Some(&bias[..]),
        ..inputs(&q, &k, &v)
    };
    expect_shape(step(&mut state, &spec, with_bias), "bias");
    assert_eq!(sums(&state), before, "failed steps leave the state as it was");
    step(&mut state, &spec, inputs(&q, &k, &v)).expect("the state's own step");
    assert_eq!(state.lens(), &[2, 2]);

    // Another family; a state whose sums would pass isize::MAX bytes (both states).
    let softmax = other(AttnProblem {
        family: Family::softmax(),
        ..base()
    });
    expect_arg(FastDecodeState::empty(&softmax), "family");
    expect_arg(prefill(&softmax, inputs(&q, &k, &v)), "family");
    let huge = other(AttnProblem {
        batch: 1 << 30,
        heads_q: 1 << 30,
        heads_kv: 1 << 30,
        seq_q: 0,
        seq_k: 0,
        ..base()
    });
    for r in [
        FastDecodeState::empty(&huge).map(|_| ()),
        DecodeState::empty(&huge).map(|_| ()),
    ] {
        match r {
            Err(AttnError::TooLarge { arg: "batch", op, .. }) => assert_eq!(op.pass, Pass::Decode),
            other => panic!("expected a state too large, got {other:?}"),
        }
    }
}

/// The NaN contract (docs/nan.md) through a decode: a NaN in one prompt key of entry 0, kv head 0
/// (folded by the prefill's sweep), and in one step's key of entry 1, kv head 1 (folded by the token
/// loop), make exactly the outputs that see those keys NaN, as in the f64 oracle: the query heads of
/// that kv head from that token on; the tokens before it and the other (entry, kv head) pairs stay
/// finite. Orders 1 and 2, with and without l2norm (a NaN key row stays NaN after normalising).
#[test]
fn fast_decode_a_nan_key_reaches_exactly_the_rows_that_see_it() {
    let mut failures = Vec::new();
    for order in [1, 2] {
        for l2 in [false, true] {
            let setup = Setup {
                family: taylor(order, l2, 8),
                dtype: DType::F32,
                batch: 2,
                heads_q: 4,
                heads_kv: 2,
                d: 8,
                dv: 8,
            };
            let (prompt, poisoned) = (70, 3);
            let spec = setup.step(prompt);
            let case = random_case(&spec, 7 + order as u64);
            let (q, mut k, v) = (
                round::<f32>(&case.q).0,
                round::<f32>(&case.k).0,
                round::<f32>(&case.v).0,
            );
            // k is [B, N, Hkv, D]: entry 0, token `poisoned`, kv head 0, element 0.
            k[poisoned * setup.heads_kv * setup.d] = f32::NAN;
            let (fast, mut fast_state) = prefill(&spec, inputs(&q, &k, &v)).expect("fast prefill");
            let (slow, mut slow_state) = oracle::prefill(&spec, inputs(&q, &k, &v)).expect("oracle prefill");
            let one = setup.step(1);
            let mut outs = vec![(None, spec.clone(), fast.o, slow.o)];
            for s in 0..3 {
                let c = random_case(&one, 50 + s);
                let (sq, mut sk, sv) = (round::<f32>(&c.q).0, round::<f32>(&c.k).0, round::<f32>(&c.v).0);
                if s == 1 {
                    // The step's key of entry 1, kv head 1: folded by the token loop.
                    sk[(setup.heads_kv + 1) * setup.d] = f32::NAN;
                }
                let f = step(&mut fast_state, &one, inputs(&sq, &sk, &sv)).expect("fast step");
                let o = oracle::step(&mut slow_state, &one, inputs(&sq, &sk, &sv)).expect("oracle step");
                outs.push((Some(s), one.clone(), f.o, o.o));
            }
            for (at_step, sp, got, want) in &outs {
                let (n, hq, dv) = (sp.seq_q(), setup.heads_q, setup.dv);
                let group = setup.heads_q / setup.heads_kv;
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    let (b, t, h) = (i / (n * hq * dv), (i / (hq * dv)) % n, (i / dv) % hq);
                    // Sees a NaN key: entry 0, kv head 0, from the poisoned prompt token on; entry
                    // 1, kv head 1, from the poisoned step on (its own key included).
                    let sees = match at_step {
                        None => b == 0 && h / group == 0 && t >= poisoned,
                        Some(s) => (b == 0 && h / group == 0) || (b == 1 && h / group == 1 && *s >= 1),
                    };
                    if g.is_nan() != sees || w.is_nan() != sees {
                        failures.push(format!(
                            "order {order} l2 {l2} step {at_step:?} entry {b} token {t} head {h}: fast {g}, oracle {w}, sees a NaN key: {sees}"
                        ));
                    }
                }
            }
        }
    }
    failures.truncate(8);
    fail_on(failures, "NaN key");
}
