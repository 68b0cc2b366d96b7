//! The NaN/Inf contract of docs/nan.md, for every family, forward and backward: a NaN (or a ±∞ in q
//! or k) reaching a row makes that row's outputs NaN, never zeros or finite values; every row it
//! does not reach is bit-for-bit what it was; a row with no key stays zeros with LSE −∞ (Taylor:
//! denominator 0), whatever its q holds.
//!
//! The same checks run on the f32 fast path (`attn_cpu_ref::fast`) for the softmax-like families,
//! on f32 and bf16 storage (`fast_*` tests): inputs rounded to the storage type, results widened.

use attn_core::{
    bf16, Aggregation, AttnProblem, AttnSpec, Causal, DType, Element, Family, HypScore, Layout, SeqLengths,
    TaylorParams,
};
use attn_cpu_ref::testing::{random_case, Case};
use attn_cpu_ref::{backward_f64, fast, forward_f64, Forward, Gradients, Inputs};
use std::collections::BTreeSet;

/// Every family and the variants whose code differs on the path of a NaN.
fn families() -> Vec<(&'static str, Family)> {
    let taylor = |order, qk_l2norm| {
        Family::Taylor(TaylorParams {
            order,
            a: if order == 1 {
                [1.0, 0.25, 0.0]
            } else {
                [1.0, 1.0, 0.5]
            },
            scale: None,
            qk_l2norm,
        })
    };
    let softcap = Family::Softmax(attn_core::SoftmaxParams {
        scale: None,
        softcap: Some(2.0),
    });
    vec![
        ("softmax", Family::softmax()),
        ("softmax softcap", softcap),
        ("cosine_sim", Family::cosine_sim()),
        ("taylor1 l2norm", taylor(1, true)),
        ("taylor2", taylor(2, false)),
        ("taylor2 l2norm", taylor(2, true)),
        (
            "hyperbolic geodesic",
            Family::hyperbolic(HypScore::Geodesic, Aggregation::Euclidean),
        ),
        (
            "hyperbolic sq_lorentz midpoint",
            Family::hyperbolic(HypScore::SquaredLorentz, Aggregation::EinsteinMidpoint),
        ),
    ]
}

/// B = 2, Hq = 4 over Hkv = 2 (GQA), Nq = 6, Nk = 7, D = 5, Dv = 3, causal top-left: key `j` reaches
/// only the queries `i ≥ j`, so a NaN in the middle leaves earlier rows alone; key 6 reaches no query.
/// Taylor's causal sweep runs in chunks of 64 keys: every key shares the first chunk.
fn spec(family: Family, causal: Causal) -> AttnSpec {
    spec_t(family, causal, DType::F32)
}

/// [`spec`] in storage dtype `dtype`.
fn spec_t(family: Family, causal: Causal, dtype: DType) -> AttnSpec {
    AttnProblem::new(family, dtype, 2, 4, 2, 6, 7, 5)
        .with_head_dim_v(3)
        .with_layout(Layout::Bhnd)
        .with_causal(causal)
        .validate()
        .expect("a valid spec")
}

fn run(case: &Case) -> (Forward<f64, f64>, Gradients<f64>) {
    let f = forward_f64(&case.spec, case.inputs()).expect("forward");
    let g = backward_f64(&case.spec, case.inputs(), &f.o, &case.d_o, &f.stats).expect("backward");
    (f, g)
}

/// The backend under test: the f64 reference ([`run`]) or the fast path ([`run_fast_path`]).
type Runner = fn(&Case) -> (Forward<f64, f64>, Gradients<f64>);

/// The fast path in the spec's storage dtype.
fn run_fast_path(case: &Case) -> (Forward<f64, f64>, Gradients<f64>) {
    match case.spec.dtype() {
        DType::F32 => run_fast::<f32>(case),
        DType::F16 => run_fast::<attn_core::f16>(case),
        DType::BF16 => run_fast::<bf16>(case),
    }
}

/// The fast path's forward, then its backward from its own o and LSE, on the case rounded to `T`;
/// results widened to f64. Poisoned entries stay NaN or ±∞ through the rounding.
fn run_fast<T: Element>(case: &Case) -> (Forward<f64, f64>, Gradients<f64>) {
    let spec = &case.spec;
    let narrow = |x: &[f64]| x.iter().map(|&v| T::from_f64(v)).collect::<Vec<T>>();
    let wide = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let (q, k, v, d_o) = (
        narrow(&case.q),
        narrow(&case.k),
        narrow(&case.v),
        narrow(&case.d_o),
    );
    let bias = case.bias.as_deref().map(narrow);
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: bias.as_deref(),
    };
    let f = fast::forward(spec, x).expect("fast forward");
    let g = fast::backward(spec, x, &f.o, &d_o, &f.stats).expect("fast backward");
    (
        Forward {
            o: wide(&f.o),
            stats: f.stats.iter().map(|&s| s as f64).collect(),
        },
        Gradients {
            dq: wide(&g.dq),
            dk: wide(&g.dk),
            dv: wide(&g.dv),
            dbias: g.dbias.as_deref().map(wide),
        },
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tensor {
    Q,
    K,
    V,
}

/// Rows, as (b, index, head): query rows (o, dq, statistics) with query heads, key rows (dk, dv)
/// with kv heads.
type Row = (usize, usize, usize);

/// What one poisoned element reaches.
struct Reach {
    /// Query rows whose o (and, unless only a value was poisoned, statistic and dq) turn NaN.
    queries: BTreeSet<Row>,
    /// Key rows whose dk turns NaN (and dv, unless only a value was poisoned).
    keys: BTreeSet<Row>,
}

/// The rows a NaN at row (b, n, h) of tensor `t` reaches, from the spec's key ranges alone.
fn reach(spec: &AttnSpec, t: Tensor, (b, n, h): Row) -> Reach {
    let mut queries = BTreeSet::new();
    match t {
        Tensor::Q => {
            if !spec.key_range(b, n).is_empty() {
                queries.insert((b, n, h));
            }
        }
        Tensor::K | Tensor::V => {
            for hq in (0..spec.heads_q()).filter(|&hq| spec.kv_head(hq) == h) {
                for i in 0..spec.seq_lens(b).q {
                    if spec.key_range(b, i).contains(&n) {
                        queries.insert((b, i, hq));
                    }
                }
            }
        }
    }
    let mut keys = BTreeSet::new();
    for &(b, i, hq) in &queries {
        for j in spec.key_range(b, i) {
            keys.insert((b, j, spec.kv_head(hq)));
        }
    }
    Reach { queries, keys }
}

fn row(x: &[f64], at: usize, len: usize) -> &[f64] {
    &x[at..at + len]
}

fn same_bits(a: &[f64], b: &[f64]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn rows_q(spec: &AttnSpec) -> Vec<Row> {
    let mut out = Vec::new();
    for b in 0..spec.batch() {
        for h in 0..spec.heads_q() {
            out.extend((0..spec.seq_lens(b).q).map(|i| (b, i, h)));
        }
    }
    out
}

fn rows_k(spec: &AttnSpec) -> Vec<Row> {
    let mut out = Vec::new();
    for b in 0..spec.batch() {
        for h in 0..spec.heads_kv() {
            out.extend((0..spec.seq_lens(b).k).map(|j| (b, j, h)));
        }
    }
    out
}

/// Poison element `c` of row (b, n, h) of tensor `t` with `bad` and check the contract against the
/// clean run.
fn check(name: &str, case: &Case, t: Tensor, at: Row, c: usize, bad: f64) {
    check_with(run, name, case, t, at, c, bad)
}

/// [`check`] on the backend `run`.
fn check_with(run: Runner, name: &str, case: &Case, t: Tensor, at: Row, c: usize, bad: f64) {
    let spec = &case.spec;
    let (clean_f, clean_g) = run(case);
    let mut poisoned = case.clone();
    let (b, n, h) = at;
    match t {
        Tensor::Q => poisoned.q[spec.q_offset(b, n, h) + c] = bad,
        Tensor::K => poisoned.k[spec.k_offset(b, n, h) + c] = bad,
        Tensor::V => poisoned.v[spec.v_offset(b, n, h) + c] = bad,
    }
    let (f, g) = run(&poisoned);
    let r = reach(spec, t, at);
    let what = format!("{name}: {bad} in {t:?}{at:?}[{c}]");
    let softmax_like = spec.family().is_softmax_like();
    let midpoint = matches!(
        spec.family(),
        attn_core::FamilySpec::Hyperbolic {
            aggregation: Aggregation::EinsteinMidpoint,
            ..
        }
    );
    // Only a value was poisoned: the scores (so LSE, the Taylor denominator and dv) do not read it,
    // except through the Einstein midpoint's log γ.
    let value_only = t == Tensor::V && !midpoint;
    let (d, dv) = (spec.head_dim(), spec.head_dim_v());

    for (b, i, h) in rows_q(spec) {
        let reached = r.queries.contains(&(b, i, h));
        let (o, o0) = (
            row(&f.o, spec.o_offset(b, i, h), dv),
            row(&clean_f.o, spec.o_offset(b, i, h), dv),
        );
        let s = spec.stats_index(b, h, i);
        let (st, st0) = (f.stats[s], clean_f.stats[s]);
        let (dq, dq0) = (
            row(&g.dq, spec.dq_offset(b, i, h), d),
            row(&clean_g.dq, spec.dq_offset(b, i, h), d),
        );
        if reached {
            if t == Tensor::V {
                assert!(
                    o[c].is_nan(),
                    "{what}: o{:?}[{c}] = {} (not NaN)",
                    (b, i, h),
                    o[c]
                );
            } else {
                assert!(
                    o.iter().all(|x| x.is_nan()),
                    "{what}: o{:?} = {o:?} (not NaN)",
                    (b, i, h)
                );
            }
            if value_only {
                assert_eq!(
                    st.to_bits(),
                    st0.to_bits(),
                    "{what}: statistic of {:?} changed",
                    (b, i, h)
                );
            } else {
                assert!(
                    st.is_nan(),
                    "{what}: statistic of {:?} = {st} (not NaN)",
                    (b, i, h)
                );
            }
            assert!(
                dq.iter().any(|x| x.is_nan()),
                "{what}: dq{:?} = {dq:?} (no NaN)",
                (b, i, h)
            );
        } else {
            assert!(
                same_bits(o, o0),
                "{what}: o{:?} changed: {o:?} vs {o0:?}",
                (b, i, h)
            );
            assert_eq!(
                st.to_bits(),
                st0.to_bits(),
                "{what}: statistic of {:?} changed",
                (b, i, h)
            );
            assert!(
                same_bits(dq, dq0),
                "{what}: dq{:?} changed: {dq:?} vs {dq0:?}",
                (b, i, h)
            );
        }
        if spec.key_range(b, i).is_empty() {
            assert!(
                o.iter().all(|&x| x == 0.0),
                "{what}: row {:?} has no key but o = {o:?}",
                (b, i, h)
            );
            let empty = if softmax_like { f64::NEG_INFINITY } else { 0.0 };
            assert_eq!(st, empty, "{what}: row {:?} has no key", (b, i, h));
        }
    }
    for (b, j, h) in rows_k(spec) {
        let reached = r.keys.contains(&(b, j, h));
        let (dk, dk0) = (
            row(&g.dk, spec.dk_offset(b, j, h), d),
            row(&clean_g.dk, spec.dk_offset(b, j, h), d),
        );
        let (gv, gv0) = (
            row(&g.dv, spec.dv_offset(b, j, h), dv),
            row(&clean_g.dv, spec.dv_offset(b, j, h), dv),
        );
        if reached {
            assert!(
                dk.iter().any(|x| x.is_nan()),
                "{what}: dk{:?} = {dk:?} (no NaN)",
                (b, j, h)
            );
            if !value_only {
                assert!(
                    gv.iter().any(|x| x.is_nan()),
                    "{what}: dv{:?} = {gv:?} (no NaN)",
                    (b, j, h)
                );
            }
        } else if !(t == Tensor::K && (b, j, h) == at) {
            assert!(
                same_bits(dk, dk0),
                "{what}: dk{:?} changed: {dk:?} vs {dk0:?}",
                (b, j, h)
            );
            assert!(
                same_bits(gv, gv0),
                "{what}: dv{:?} changed: {gv:?} vs {gv0:?}",
                (b, j, h)
            );
        }
    }
    if r.queries.is_empty() {
        // Reached no row: nothing may change (a poisoned key's own dk included: no query sees it).
        assert!(
            same_bits(&f.o, &clean_f.o) && same_bits(&f.stats, &clean_f.stats),
            "{what}"
        );
        assert!(
            same_bits(&g.dq, &clean_g.dq) && same_bits(&g.dk, &clean_g.dk),
            "{what}"
        );
        assert!(same_bits(&g.dv, &clean_g.dv), "{what}");
    }
}

/// The poisoned spots: a middle row, the first and last rows, and (for k and v) the key no query
/// sees; batch entry 1 and head 1 or 3, so entry 0 and the other heads must stay unchanged.
fn spots(t: Tensor) -> Vec<(Row, usize)> {
    match t {
        Tensor::Q => vec![((1, 3, 3), 2), ((0, 0, 1), 0), ((1, 5, 2), 4)],
        Tensor::K => vec![((1, 3, 1), 1), ((0, 0, 0), 4), ((1, 6, 1), 0)],
        Tensor::V => vec![((1, 2, 1), 2), ((0, 0, 0), 0), ((1, 6, 0), 1)],
    }
}

fn check_all(t: Tensor, bad: f64) {
    for (name, family) in families() {
        let case = random_case(&spec(family, Causal::TopLeft), 47);
        for (at, c) in spots(t) {
            check(name, &case, t, at, c, bad);
        }
    }
}

/// [`check_all`] on the fast path: the softmax-like families, f32, f16 and bf16 storage, with the
/// mask `causal`. Collects every failure before failing.
fn check_all_fast(t: Tensor, bad: f64, causal: Causal) {
    check_all_fast_on(t, bad, &format!("{causal:?}"), |family, dtype| {
        spec_t(family, causal, dtype)
    });
}

/// [`check_all_fast`] on the specs `make` builds (`label` names them in failures).
fn check_all_fast_on(t: Tensor, bad: f64, label: &str, make: impl Fn(Family, DType) -> AttnSpec) {
    let mut failures = Vec::new();
    for (name, family) in families().into_iter().filter(|(n, _)| !n.starts_with("taylor")) {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let case = random_case(&make(family, dtype), 47);
            let name = format!("fast {name} {dtype} {label}");
            for (at, c) in spots(t) {
                let r = std::panic::catch_unwind(|| check_with(run_fast_path, &name, &case, t, at, c, bad));
                if let Err(e) = r {
                    let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
                    failures.push(msg.chars().take(200).collect::<String>());
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// [`spec_t`] with every mask at once: bottom-right causal, a window of 2 keys left and 1 right, and
/// key lengths 7 and 5 (batch entry 1's keys 5 and 6 are padding).
fn spec_masked(family: Family, dtype: DType) -> AttnSpec {
    AttnProblem::new(family, dtype, 2, 4, 2, 6, 7, 5)
        .with_head_dim_v(3)
        .with_layout(Layout::Bhnd)
        .with_causal(Causal::BottomRight)
        .with_window(Some(2), Some(1))
        .with_key_lens(vec![7, 5])
        .validate()
        .expect("a valid spec")
}

#[test]
fn nan_in_q_makes_its_row_nan_and_leaves_every_other_row_alone() {
    check_all(Tensor::Q, f64::NAN);
}

#[test]
fn nan_in_k_makes_every_row_that_sees_the_key_nan() {
    check_all(Tensor::K, f64::NAN);
}

#[test]
fn nan_in_v_makes_the_column_nan_in_every_row_that_sees_the_value() {
    check_all(Tensor::V, f64::NAN);
}

#[test]
fn inf_in_q_makes_its_row_nan() {
    check_all(Tensor::Q, f64::INFINITY);
    check_all(Tensor::Q, f64::NEG_INFINITY);
}

#[test]
fn inf_in_k_makes_every_row_that_sees_the_key_nan() {
    check_all(Tensor::K, f64::INFINITY);
}

/// A NaN in dO reaches its row's δ: that row's dq and the dk and dv of every key it sees are NaN;
/// the forward and every other gradient row are unchanged.
#[test]
fn nan_in_d_o_reaches_the_gradients_of_its_row_and_its_keys() {
    for (name, family) in families() {
        d_o_check(run, name, &spec(family, Causal::TopLeft));
    }
}

/// [`nan_in_d_o_reaches_the_gradients_of_its_row_and_its_keys`] on the fast path, with and
/// without a causal mask.
#[test]
fn fast_nan_in_d_o_reaches_the_gradients_of_its_row_and_its_keys() {
    for (name, family) in families().into_iter().filter(|(n, _)| !n.starts_with("taylor")) {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for causal in [Causal::None, Causal::TopLeft] {
                d_o_check(
                    run_fast_path,
                    &format!("fast {name} {dtype} {causal:?}"),
                    &spec_t(family, causal, dtype),
                );
            }
        }
    }
}

fn d_o_check(run: Runner, name: &str, spec: &AttnSpec) {
    let case = random_case(spec, 3);
    let (_, clean) = run(&case);
    let (b, i, h) = (1, 2, 3);
    let mut bad = case.clone();
    bad.d_o[spec.o_offset(b, i, h) + 1] = f64::NAN;
    let (_, g) = run(&bad);
    let keys = reach(spec, Tensor::Q, (b, i, h)).keys;
    for (bq, iq, hq) in rows_q(spec) {
        let (at, d) = (spec.dq_offset(bq, iq, hq), spec.head_dim());
        let (x, x0) = (row(&g.dq, at, d), row(&clean.dq, at, d));
        if (bq, iq, hq) == (b, i, h) {
            assert!(
                x.iter().any(|x| x.is_nan()),
                "{name}: dq{:?} = {x:?}",
                (bq, iq, hq)
            );
        } else {
            assert!(same_bits(x, x0), "{name}: dq{:?} changed", (bq, iq, hq));
        }
    }
    for key in rows_k(spec) {
        let (bk, j, hk) = key;
        let (d, dv) = (spec.head_dim(), spec.head_dim_v());
        let dk = row(&g.dk, spec.dk_offset(bk, j, hk), d);
        let gv = row(&g.dv, spec.dv_offset(bk, j, hk), dv);
        if keys.contains(&key) {
            assert!(dk.iter().any(|x| x.is_nan()), "{name}: dk{key:?} = {dk:?}");
            assert!(gv.iter().any(|x| x.is_nan()), "{name}: dv{key:?} = {gv:?}");
        } else {
            assert!(
                same_bits(dk, row(&clean.dk, spec.dk_offset(bk, j, hk), d)),
                "{name}: dk{key:?}"
            );
            assert!(
                same_bits(gv, row(&clean.dv, spec.dv_offset(bk, j, hk), dv)),
                "{name}: dv{key:?}"
            );
        }
    }
}

/// A query with every entry NaN: its whole score row is NaN. The running max used to skip NaN and
/// return o = 0, LSE = −∞ (a fully masked row) for it.
#[test]
fn an_all_nan_query_row_is_nan_not_masked() {
    for (name, family) in families() {
        let spec = spec(family, Causal::None);
        let mut case = random_case(&spec, 7);
        let at = spec.q_offset(1, 2, 0);
        case.q[at..at + spec.head_dim()].fill(f64::NAN);
        let (f, g) = run(&case);
        let o = row(&f.o, spec.o_offset(1, 2, 0), spec.head_dim_v());
        assert!(o.iter().all(|x| x.is_nan()), "{name}: o = {o:?}");
        assert!(f.stats[spec.stats_index(1, 0, 2)].is_nan(), "{name}");
        let dq = row(&g.dq, spec.dq_offset(1, 2, 0), spec.head_dim());
        assert!(dq.iter().all(|x| x.is_nan()), "{name}: dq = {dq:?}");
        // Without a mask the row sees every key of its kv head: all their gradients are NaN.
        for j in 0..spec.seq_k() {
            let dk = row(&g.dk, spec.dk_offset(1, j, 0), spec.head_dim());
            assert!(dk.iter().all(|x| x.is_nan()), "{name}: dk[{j}] = {dk:?}");
        }
    }
}

/// Rows with no key (bottom-right causal with Nq > Nk, a key length of 0) return zeros and LSE −∞
/// (Taylor: denominator 0) and contribute nothing, even when their q is NaN.
#[test]
fn rows_with_no_key_stay_zero_whatever_their_q() {
    for (name, family) in families() {
        let p = AttnProblem::new(family, DType::F32, 2, 2, 1, 6, 4, 4).with_causal(Causal::BottomRight);
        let spec = p.clone().with_key_lens(vec![4, 0]).validate().expect("valid");
        let case = random_case(&spec, 11);
        // Rows 0 and 1 of entry 0 see no key (diag = i − 2); entry 1 has no key at all.
        assert!(spec.key_range(0, 1).is_empty() && spec.key_range(1, 5).is_empty());
        for at in [(0, 1, 1), (1, 5, 0), (1, 0, 1)] {
            check(name, &case, Tensor::Q, at, 0, f64::NAN);
        }
        assert!(matches!(spec.lengths(), SeqLengths::KeyPadding(_)));
    }
}

/// A NaN or +∞ in an additive bias entry reaches its row; a −∞ one masks its key; a row whose every bias
/// entry is −∞ is fully masked (o = 0, LSE = −∞), not NaN.
#[test]
fn nan_in_the_bias_reaches_its_row_and_minus_inf_masks() {
    for (name, family) in families().into_iter().filter(|(n, _)| !n.starts_with("taylor")) {
        let spec = AttnProblem::new(family, DType::F32, 1, 2, 1, 3, 4, 4)
            .with_bias(1, 2)
            .validate()
            .expect("valid");
        let case = random_case(&spec, 5);
        let (clean, _) = run(&case);
        let (nk, dv) = (spec.seq_k(), spec.head_dim_v());
        let bias_at = |h: usize, i: usize| spec.bias_index(0, h, i, 0).expect("a bias");

        let mut nan = case.clone();
        nan.bias.as_mut().expect("a bias")[bias_at(1, 2) + 3] = f64::NAN;
        let (f, g) = run(&nan);
        assert!(
            row(&f.o, spec.o_offset(0, 2, 1), dv).iter().all(|x| x.is_nan()),
            "{name}"
        );
        assert!(f.stats[spec.stats_index(0, 1, 2)].is_nan(), "{name}");
        let dbias = g.dbias.expect("dbias");
        assert!(
            dbias[bias_at(1, 2)..bias_at(1, 2) + nk]
                .iter()
                .all(|x| x.is_nan()),
            "{name}"
        );
        assert!(
            same_bits(&f.o[..spec.o_offset(0, 2, 1)], &clean.o[..spec.o_offset(0, 2, 1)]),
            "{name}"
        );

        let mut inf = case.clone();
        inf.bias.as_mut().expect("a bias")[bias_at(0, 0) + 1] = f64::INFINITY;
        let (f, _) = run(&inf);
        assert!(
            row(&f.o, spec.o_offset(0, 0, 0), dv).iter().all(|x| x.is_nan()),
            "{name}"
        );
        assert!(f.stats[spec.stats_index(0, 0, 0)].is_nan(), "{name}");

        let mut masked = case.clone();
        let bias = masked.bias.as_mut().expect("a bias");
        bias[bias_at(0, 1)..bias_at(0, 1) + nk].fill(f64::NEG_INFINITY);
        let (f, g) = run(&masked);
        assert!(
            row(&f.o, spec.o_offset(0, 1, 0), dv).iter().all(|&x| x == 0.0),
            "{name}"
        );
        assert_eq!(f.stats[spec.stats_index(0, 0, 1)], f64::NEG_INFINITY, "{name}");
        assert!(
            g.dq.iter().chain(&g.dk).chain(&g.dv).all(|x| x.is_finite()),
            "{name}"
        );
    }
}

/// The fast path without a mask: every key is seen by every row of its batch entry and head group.
#[test]
fn fast_nan_in_q_makes_its_row_nan_and_leaves_every_other_row_alone() {
    check_all_fast(Tensor::Q, f64::NAN, Causal::None);
}

#[test]
fn fast_nan_in_k_makes_every_row_that_sees_the_key_nan() {
    check_all_fast(Tensor::K, f64::NAN, Causal::None);
}

#[test]
fn fast_nan_in_v_makes_the_column_nan_in_every_row_that_sees_the_value() {
    check_all_fast(Tensor::V, f64::NAN, Causal::None);
}

#[test]
fn fast_inf_in_q_and_k_makes_the_rows_nan() {
    for bad in [f64::INFINITY, f64::NEG_INFINITY] {
        check_all_fast(Tensor::Q, bad, Causal::None);
        check_all_fast(Tensor::K, bad, Causal::None);
    }
}

/// With a causal mask: the tile products (`P·V`, `Pᵀ·dO`, `dS·K`, `dSᵀ·Q`) of a tile holding a
/// non-finite source row skip the masked pairs, so the NaN stays out of the rows and keys of its
/// 64 × 128 tile that the mask hides from it.
#[test]
fn fast_nan_behind_a_causal_mask_stays_out_of_the_rows_that_do_not_see_it() {
    for t in [Tensor::Q, Tensor::K, Tensor::V] {
        check_all_fast(t, f64::NAN, Causal::TopLeft);
    }
}

/// The same behind a window, key padding and bottom-right causality at once, and for ±∞.
#[test]
fn fast_nan_and_inf_behind_windows_and_key_padding_stay_out_of_the_rows_that_do_not_see_them() {
    for t in [Tensor::Q, Tensor::K, Tensor::V] {
        check_all_fast_on(t, f64::NAN, "masked", spec_masked);
    }
    for bad in [f64::INFINITY, f64::NEG_INFINITY] {
        check_all_fast_on(Tensor::Q, bad, "masked", spec_masked);
        check_all_fast_on(Tensor::K, bad, "masked", spec_masked);
    }
    for (name, family) in families().into_iter().filter(|(n, _)| !n.starts_with("taylor")) {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            d_o_check(
                run_fast_path,
                &format!("fast {name} {dtype} masked"),
                &spec_masked(family, dtype),
            );
        }
    }
}
