//! Softmax logits of magnitude about 1e4 (q and k entries of about ±100 at D = 64, default scale
//! 1/8), with and without a softcap and a causal mask, on f32, f16 and bf16 storage: the reference's
//! storage-dtype path and the f32 fast path return finite results that follow the f64 oracle on the
//! same rounded inputs. The online max must absorb the scores (an `exp` of 1e4 overflows even f64),
//! and the LSE (about 1e4) must survive its f32 storage.

use attn_core::{bf16, f16, AttnProblem, AttnSpec, Causal, DType, Element, Family, SoftmaxParams};
use attn_cpu_ref::testing::{check_close, max_abs, random_case, Case};
use attn_cpu_ref::{backward, backward_f64, forward, forward_f64, Inputs};

/// Entries of q and k are scaled to ±`AMP`: `max |s|` over the pairs is then about 1e4.
const AMP: f64 = 100.0;

fn variants() -> Vec<(&'static str, Family, Causal)> {
    let cap = |c: f32| {
        Family::Softmax(SoftmaxParams {
            scale: None,
            softcap: Some(c),
        })
    };
    vec![
        ("softmax", Family::softmax(), Causal::None),
        ("softmax causal", Family::softmax(), Causal::TopLeft),
        ("softcap 50", cap(50.0), Causal::None),
        ("softcap 2e4", cap(2e4), Causal::None),
        ("softcap 2e4 causal", cap(2e4), Causal::BottomRight),
    ]
}

/// Nq = 70, Nk = 150 (past one 64 × 128 tile of the fast path), B = 1, Hq = 2, Hkv = 1, D = 64.
fn case(family: Family, causal: Causal, dtype: DType, seed: u64) -> Case {
    let spec = AttnProblem::new(family, dtype, 1, 2, 1, 70, 150, 64)
        .with_causal(causal)
        .validate()
        .expect("a valid spec");
    let mut c = random_case(&spec, seed);
    c.q.iter_mut().chain(c.k.iter_mut()).for_each(|x| *x *= AMP);
    c
}

/// `max |scale·q·k|` over every pair of the case's inputs rounded to `T`, unmasked.
fn max_logit<T: Element>(c: &Case) -> f64 {
    let s = &c.spec;
    let r = |x: f64| T::from_f64(x).to_f64();
    let d = s.head_dim();
    let scale = 1.0 / (d as f64).sqrt();
    let mut m = 0.0f64;
    for h in 0..s.heads_q() {
        for i in 0..s.seq_q() {
            let q = &c.q[s.q_offset(0, i, h)..][..d];
            for j in 0..s.seq_k() {
                let k = &c.k[s.k_offset(0, j, s.kv_head(h))..][..d];
                let t: f64 = q.iter().zip(k).map(|(a, b)| r(*a) * r(*b)).sum();
                m = m.max((scale * t).abs());
            }
        }
    }
    m
}

/// The reference's storage path (`forward::<T>`, `backward::<T>`: f64 inside, results rounded to
/// `T`, statistics to f32) against the f64 oracle on the same rounded inputs: finite, and within
/// the rounding of its own outputs (REFERENCE.md's rule with the oracle rounded to `T` as baseline).
fn reference_storage<T: Element>(c: &Case, label: &str) -> Result<(), String> {
    let spec: &AttnSpec = &c.spec;
    let round = |x: &[f64]| x.iter().map(|&v| T::from_f64(v)).collect::<Vec<T>>();
    let wide = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let (q, k, v, d_o) = (round(&c.q), round(&c.k), round(&c.v), round(&c.d_o));
    let (qw, kw, vw, dow) = (wide(&q), wide(&k), wide(&v), wide(&d_o));
    let e = |e: attn_core::AttnError| format!("{label}: {e}");
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: None,
    };
    let xw = Inputs {
        q: &qw,
        k: &kw,
        v: &vw,
        bias: None,
    };
    let f = forward(spec, x).map_err(e)?;
    let g = backward(spec, x, &f.o, &d_o, &f.stats).map_err(e)?;
    let rf = forward_f64(spec, xw).map_err(e)?;
    let rg = backward_f64(
        spec,
        xw,
        &wide(&f.o),
        &dow,
        &f.stats.iter().map(|&s| s as f64).collect::<Vec<_>>(),
    )
    .map_err(e)?;
    let u = T::DTYPE.unit_roundoff();
    let ctx = |m: String| format!("{label}: {m}");
    let base = |r: &[f64]| r.iter().map(|&v| T::from_f64(v).to_f64()).collect::<Vec<f64>>();
    check_close("o", &wide(&f.o), &rf.o, &base(&rf.o), u * max_abs(&rf.o)).map_err(ctx)?;
    let lse: Vec<f64> = f.stats.iter().map(|&s| s as f64).collect();
    let lse_base: Vec<f64> = rf.stats.iter().map(|&s| s as f32 as f64).collect();
    check_close("lse", &lse, &rf.stats, &lse_base, 0.0).map_err(ctx)?;
    for (name, got, r) in [
        ("dq", &g.dq, &rg.dq),
        ("dk", &g.dk, &rg.dk),
        ("dv", &g.dv, &rg.dv),
    ] {
        check_close(name, &wide(got), r, &base(r), u * max_abs(r)).map_err(ctx)?;
    }
    Ok(())
}

fn each(mut f: impl FnMut(&Case, &str) -> Result<(), String>) {
    let mut failures = Vec::new();
    for (name, family, causal) in variants() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for seed in [1, 2] {
                let c = case(family, causal, dtype, seed);
                let label = format!("{name} {dtype} seed {seed}");
                let m = match dtype {
                    DType::F32 => max_logit::<f32>(&c),
                    DType::F16 => max_logit::<f16>(&c),
                    DType::BF16 => max_logit::<bf16>(&c),
                };
                assert!((5e3..5e4).contains(&m), "{label}: max |s| = {m:e}, not about 1e4");
                if let Err(e) = f(&c, &label) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn reference_storage_paths_with_logits_of_1e4_are_finite_and_match_f64() {
    each(|c, label| match c.spec.dtype() {
        DType::F32 => reference_storage::<f32>(c, label),
        DType::F16 => reference_storage::<f16>(c, label),
        DType::BF16 => reference_storage::<bf16>(c, label),
    });
}

/// The naive same-dtype computation of REFERENCE.md's rule: scores as f32 dot products of the
/// rounded inputs, the softcap, max, `exp`, sum and `P·V` in f32; its backward in f32 from its own
/// o and LSE (`P = exp(s − LSE)`, `dS = P (dP − δ)·σ` with σ the softcap's derivative). Results
/// widened to f64: o, LSE, dq, dk, dv.
fn naive_f32(c: &Case, qw: &[f64], kw: &[f64], vw: &[f64], dow: &[f64]) -> [Vec<f64>; 5] {
    let s = &c.spec;
    let (d, dv) = (s.head_dim(), s.head_dim_v());
    let (scale, cap) = match *s.family() {
        attn_core::FamilySpec::Softmax { scale, softcap } => (scale, softcap),
        _ => unreachable!("softmax variants only"),
    };
    let f = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    let (q, k, v, d_o) = (f(qw), f(kw), f(vw), f(dow));
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0.0f32, |acc, (x, y)| acc + x * y);
    // (s, σ) of a pair.
    let score = |qi: &[f32], kj: &[f32]| {
        let x = scale * dot(qi, kj);
        match cap {
            Some(cp) => {
                let t = (x / cp).tanh();
                (cp * t, scale * (1.0 - t * t))
            }
            None => (x, scale),
        }
    };
    let mut o = vec![0.0f32; s.o_len()];
    let mut lse = vec![0.0f32; s.stats_len()];
    let (mut dq, mut dk, mut gv) = (
        vec![0.0f32; s.dq_len()],
        vec![0.0f32; s.dk_len()],
        vec![0.0f32; s.dv_len()],
    );
    for h in 0..s.heads_q() {
        let hk = s.kv_head(h);
        for i in 0..s.seq_q() {
            let qi = &q[s.q_offset(0, i, h)..][..d];
            let keys = s.key_range(0, i);
            let sc: Vec<f32> = keys
                .clone()
                .map(|j| score(qi, &k[s.k_offset(0, j, hk)..][..d]).0)
                .collect();
            let m = sc.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let w: Vec<f32> = sc.iter().map(|&x| (x - m).exp()).collect();
            let l: f32 = w.iter().sum();
            let at = s.o_offset(0, i, h);
            for (jj, j) in keys.clone().enumerate() {
                let vj = &v[s.v_offset(0, j, hk)..][..dv];
                for a in 0..dv {
                    o[at + a] += w[jj] / l * vj[a];
                }
            }
            let li = m + l.ln();
            lse[s.stats_index(0, h, i)] = li;
            let (oi, gi) = (&o[at..at + dv], &d_o[at..at + dv]);
            let delta = dot(gi, oi);
            for j in keys {
                let (kj, vj) = (&k[s.k_offset(0, j, hk)..][..d], &v[s.v_offset(0, j, hk)..][..dv]);
                let (sij, sigma) = score(qi, kj);
                let p = (sij - li).exp();
                let ds = p * (dot(gi, vj) - delta) * sigma;
                let (qa, ka, va) = (s.dq_offset(0, i, h), s.dk_offset(0, j, hk), s.dv_offset(0, j, hk));
                for a in 0..d {
                    dq[qa + a] += ds * kj[a];
                    dk[ka + a] += ds * qi[a];
                }
                for a in 0..dv {
                    gv[va + a] += p * gi[a];
                }
            }
        }
    }
    let w = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    [w(&o), w(&lse), w(&dq), w(&dk), w(&gv)]
}

/// The fast path against the f64 oracle on the same rounded inputs, by REFERENCE.md's rule taken
/// literally: error ≤ 2·error of the naive f32 computation ([`naive_f32`]) + 2·error of the oracle
/// rounded to the storage type (the gradients': its backward from o rounded) + `fast_common`'s
/// `atol` (`(4·u_T + 64·√(Nk + D)·u_f32)·max|ref|`). At
/// |s| ≈ 1e4 every f32 computation carries the rounding of its scores (an f32 ulp of 1e4 is 1e-3,
/// so P and the LSE move by about 1e-3), which the fixed `atol` of `fast_common` (sized for |s| of
/// a few units) does not allow.
/// One comparison: name, result, oracle, naive f32 result, oracle rounded to the storage type, atol.
type Check<'a> = (&'static str, Vec<f64>, &'a [f64], &'a [f64], Vec<f64>, f64);

fn fast_path<T: Element>(c: &Case, label: &str) -> Result<(), String> {
    let spec = &c.spec;
    let round = |x: &[f64]| x.iter().map(|&v| T::from_f64(v)).collect::<Vec<T>>();
    let wide = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let (q, k, v, d_o) = (round(&c.q), round(&c.k), round(&c.v), round(&c.d_o));
    let (qw, kw, vw, dow) = (wide(&q), wide(&k), wide(&v), wide(&d_o));
    let e = |e: attn_core::AttnError| format!("{label}: {e}");
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: None,
    };
    let xw = Inputs {
        q: &qw,
        k: &kw,
        v: &vw,
        bias: None,
    };
    let f = attn_cpu_ref::fast::forward(spec, x).map_err(e)?;
    let g = attn_cpu_ref::fast::backward(spec, x, &f.o, &d_o, &f.stats).map_err(e)?;
    let rf = forward_f64(spec, xw).map_err(e)?;
    let rg = backward_f64(spec, xw, &rf.o, &dow, &rf.stats).map_err(e)?;
    let bo: Vec<f64> = rf.o.iter().map(|&v| T::from_f64(v).to_f64()).collect();
    let bg = backward_f64(spec, xw, &bo, &dow, &rf.stats).map_err(e)?;
    let [no, nl, ndq, ndk, ndv] = naive_f32(c, &qw, &kw, &vw, &dow);
    let ctx = |m: String| format!("{label}: {m}");
    let u = T::DTYPE.unit_roundoff();
    let err = |a: &[f64], b: &[f64]| attn_cpu_ref::testing::max_abs_diff(a, b);
    let rounded = |x: &[f64]| x.iter().map(|&v| T::from_f64(v).to_f64()).collect::<Vec<f64>>();
    let lse: Vec<f64> = f.stats.iter().map(|&s| s as f64).collect();
    let lse_base: Vec<f64> = rf.stats.iter().map(|&s| s as f32 as f64).collect();
    let gscale = [&rg.dq, &rg.dk, &rg.dv]
        .iter()
        .map(|g| max_abs(g))
        .fold(1e-3, f64::max);
    // fast_common's allowance: storage rounding plus the f32 accumulation of the tiles' products.
    let acc = 64.0 * ((spec.seq_k() + spec.head_dim()) as f64).sqrt() * DType::F32.unit_roundoff();
    let u = 4.0 * u + acc;
    let checks: [Check<'_>; 5] = [
        ("o", wide(&f.o), &rf.o, &no, rounded(&rf.o), u * max_abs(&rf.o)),
        ("lse", lse, &rf.stats, &nl, lse_base, 0.0),
        ("dq", wide(&g.dq), &rg.dq, &ndq, rounded(&bg.dq), u * gscale),
        ("dk", wide(&g.dk), &rg.dk, &ndk, rounded(&bg.dk), u * gscale),
        ("dv", wide(&g.dv), &rg.dv, &ndv, rounded(&bg.dv), u * gscale),
    ];
    for (name, got, r, naive, base, atol) in checks {
        let (e_got, e_naive, e_base) = (err(&got, r), err(naive, r), err(&base, r));
        if std::env::var_os("ATTN_PRINT_ERRORS").is_some() {
            println!("{label}: {name} error {e_got:.2e} (naive f32 {e_naive:.2e}, rounding {e_base:.2e})");
        }
        if let Some(i) = got.iter().position(|x| !x.is_finite()) {
            return Err(ctx(format!("{name}[{i}] = {} (not finite)", got[i])));
        }
        let tol = 2.0 * e_naive + 2.0 * e_base + atol;
        if e_got > tol {
            return Err(ctx(format!(
                "{name}: error {e_got:.3e} > 2 × naive f32 {e_naive:.3e} + 2 × rounding {e_base:.3e} + {atol:.1e}"
            )));
        }
    }
    Ok(())
}

#[test]
fn fast_path_with_logits_of_1e4_is_finite_and_matches_f64() {
    each(|c, label| match c.spec.dtype() {
        DType::F32 => fast_path::<f32>(c, label),
        DType::F16 => fast_path::<f16>(c, label),
        DType::BF16 => fast_path::<bf16>(c, label),
    });
}
