//! Hyperbolic attention far from the origin: clusters of points at radius 1e3 and 1e4, curvatures
//! from 1e-12 to 1e12, both scores and both aggregations, in f32, f16 and bf16 storage, against an
//! independent oracle that forms the Lorentz product in double-double arithmetic (`dd.rs`: no digit
//! lost to the cancellation of `q0 k0 − q·k`).
//!
//! - The reference's storage paths (`forward::<T>`) follow the oracle within REFERENCE.md's rule
//!   (the oracle rounded to `T` as the baseline), and its gradients follow finite differences of
//!   the oracle.
//! - The fast path and the f32 score forms a GPU kernel can use are measured against the oracle
//!   (`ATTN_PRINT_ERRORS=1` prints the tables docs/hyperbolic.md quotes); the tests assert the
//!   envelope that page documents.
//!
//! A cluster: a base point at radius `R` on a random ray, points displaced from it by `σ` along
//! directions tangent to the sphere of radius `R` (hyperbolic distance `σ`) and radially by up to
//! half the radius. `σ` grows with the storage type's spacing at `R` (`max(1, 16·u_T·R)`) so that
//! rounding the inputs does not collapse the cluster, and β is set so that the scores of a row span
//! about 8 nats.

#[path = "hyperbolic_far/dd.rs"]
mod dd;

use attn_core::{
    bf16, f16, Aggregation, AttnProblem, AttnSpec, DType, Element, Family, HypScore, HyperbolicParams,
    ACOSH_EPS, KLEIN_MAX_NORM2,
};
use attn_cpu_ref::testing::{check_close, max_abs, max_abs_diff};
use attn_cpu_ref::{fast, forward, Inputs};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NQ: usize = 12;
const NK: usize = 20;
const D: usize = 8;

fn print() -> bool {
    std::env::var_os("ATTN_PRINT_ERRORS").is_some()
}

/// One far-from-origin problem: its spec (β chosen from the rounded inputs) and the inputs rounded
/// to the storage type, widened to f64.
struct Far {
    label: String,
    spec: AttnSpec,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
}

fn round<T: Element>(x: &[f64]) -> Vec<f64> {
    x.iter().map(|&v| T::from_f64(v).to_f64()).collect()
}

fn round_to(dtype: DType, x: &[f64]) -> Vec<f64> {
    match dtype {
        DType::F32 => round::<f32>(x),
        DType::F16 => round::<f16>(x),
        DType::BF16 => round::<bf16>(x),
    }
}

/// `n` rows of the cluster around `r·u`.
fn cluster(rng: &mut StdRng, n: usize, u: &[f64], r: f64, sigma: f64, c: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(n * D);
    for _ in 0..n {
        // A random direction with its component along u removed: tangent to the sphere.
        let mut t: Vec<f64> = (0..D).map(|_| rng.random_range(-1.0..1.0)).collect();
        let along: f64 = t.iter().zip(u).map(|(a, b)| a * b).sum();
        t.iter_mut().zip(u).for_each(|(a, b)| *a -= along * b);
        let radial = (sigma * (1.0 + c * r * r).sqrt()).min(r) * 0.5 * rng.random_range(-1.0..1.0);
        let tan = sigma * rng.random_range(0.0..1.0);
        let tn = t.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-300);
        out.extend((0..D).map(|a| (r + radial) * u[a] + tan * t[a] / tn));
    }
    out
}

/// `(s, log γ)`-free score of the oracle for one pair, at β = `beta`.
fn oracle_score(score: HypScore, c: f64, beta: f64, q: &[f64], k: &[f64]) -> f64 {
    let d2 = dd::lorentz_sq_dist(c, q, k).max(0.0);
    match score {
        HypScore::SquaredLorentz => -beta * d2,
        HypScore::Geodesic => {
            let x = (0.5 * c * d2).max(ACOSH_EPS);
            -beta * (x + (x * (x + 2.0)).sqrt()).ln_1p() / c.sqrt()
        }
    }
}

fn log_gamma(c: f64, v: &[f64]) -> f64 {
    let n2 = (c * v.iter().map(|x| x * x).sum::<f64>()).min(KLEIN_MAX_NORM2);
    -0.5 * (-n2).ln_1p()
}

fn params(spec: &AttnSpec) -> (HypScore, f64, f64, Aggregation) {
    match *spec.family() {
        attn_core::FamilySpec::Hyperbolic {
            score,
            curvature,
            beta,
            aggregation,
        } => (score, curvature as f64, beta as f64, aggregation),
        _ => unreachable!("hyperbolic problems only"),
    }
}

/// The oracle's o and LSE from per-pair scores `s(i, j)` (B = H = 1, no mask).
fn softmax_rows(far: &Far, s: impl Fn(usize, usize) -> f64) -> (Vec<f64>, Vec<f64>) {
    let (_, c, _, agg) = params(&far.spec);
    let mut o = vec![0.0; NQ * D];
    let mut lse = vec![0.0; NQ];
    for i in 0..NQ {
        let row: Vec<f64> = (0..NK)
            .map(|j| {
                let lg = match agg {
                    Aggregation::EinsteinMidpoint => log_gamma(c, &far.v[j * D..][..D]),
                    Aggregation::Euclidean => 0.0,
                };
                s(i, j) + lg
            })
            .collect();
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = row.iter().map(|x| (x - m).exp()).collect();
        let l: f64 = w.iter().sum();
        for (wj, vj) in w.iter().zip(far.v.chunks_exact(D)) {
            for a in 0..D {
                o[i * D + a] += wj / l * vj[a];
            }
        }
        lse[i] = m + l.ln();
    }
    (o, lse)
}

fn oracle(far: &Far) -> (Vec<f64>, Vec<f64>) {
    let (score, c, beta, _) = params(&far.spec);
    softmax_rows(far, |i, j| {
        oracle_score(score, c, beta, &far.q[i * D..][..D], &far.k[j * D..][..D])
    })
}

/// The problems: every score and aggregation, curvatures, radii 1e3 and 1e4, every storage type.
fn problems() -> Vec<Far> {
    let mut out = Vec::new();
    let combos = [
        (
            HypScore::SquaredLorentz,
            Aggregation::Euclidean,
            &[1e-12f32, 1e-4, 1.0, 1e4, 1e12][..],
        ),
        (
            HypScore::SquaredLorentz,
            Aggregation::EinsteinMidpoint,
            &[1e-4, 1.0][..],
        ),
        (HypScore::Geodesic, Aggregation::Euclidean, &[1e-4, 1.0, 1e4][..]),
        (HypScore::Geodesic, Aggregation::EinsteinMidpoint, &[1.0][..]),
    ];
    let mut seed = 0u64;
    for (score, agg, curvatures) in combos {
        for &c in curvatures {
            for r in [1e3, 1e4] {
                for dtype in [DType::F32, DType::F16, DType::BF16] {
                    seed += 1;
                    let mut rng = StdRng::seed_from_u64(seed);
                    let u: Vec<f64> = (0..D).map(|_| rng.random_range(-1.0..1.0)).collect();
                    let un = u.iter().map(|x| x * x).sum::<f64>().sqrt();
                    let u: Vec<f64> = u.iter().map(|x| x / un).collect();
                    let sigma = (16.0 * dtype.unit_roundoff() * r).max(1.0);
                    let q = round_to(dtype, &cluster(&mut rng, NQ, &u, r, sigma, c as f64));
                    let k = round_to(dtype, &cluster(&mut rng, NK, &u, r, sigma, c as f64));
                    // Values: uniform, inside the Klein ball (c‖v‖² < 0.81) for the midpoint.
                    let vmax = match agg {
                        Aggregation::EinsteinMidpoint => 0.9 / ((c as f64) * D as f64).sqrt(),
                        Aggregation::Euclidean => 1.0,
                    };
                    let v: Vec<f64> = (0..NK * D).map(|_| rng.random_range(-vmax..vmax)).collect();
                    let v = round_to(dtype, &v);
                    // β: the scores of a row span about 8 nats.
                    let raw: Vec<f64> = (0..NQ * NK)
                        .map(|p| {
                            oracle_score(score, c as f64, 1.0, &q[p / NK * D..][..D], &k[p % NK * D..][..D])
                        })
                        .collect();
                    let spread = raw.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
                        - raw.iter().cloned().fold(f64::INFINITY, f64::min);
                    let beta = (8.0 / spread.max(1e-30)) as f32;
                    let family = Family::Hyperbolic(HyperbolicParams {
                        score,
                        curvature: c,
                        beta,
                        aggregation: agg,
                    });
                    let spec = AttnProblem::new(family, dtype, 1, 1, 1, NQ, NK, D)
                        .validate()
                        .expect("a valid far-from-origin problem");
                    let label = format!(
                        "{} {agg:?} c={c:e} R={r:e} {dtype} β={beta:.2e} σ={sigma:.0}",
                        spec.family().label()
                    );
                    out.push(Far { label, spec, q, k, v });
                }
            }
        }
    }
    out
}

fn narrow<T: Element>(x: &[f64]) -> Vec<T> {
    x.iter().map(|&v| T::from_f64(v)).collect()
}

/// o and LSE of a storage-typed backend run, widened.
fn run<T: Element>(far: &Far, fast_path: bool) -> (Vec<f64>, Vec<f64>) {
    let (q, k, v) = (narrow::<T>(&far.q), narrow::<T>(&far.k), narrow::<T>(&far.v));
    let x = Inputs {
        q: &q,
        k: &k,
        v: &v,
        bias: None,
    };
    let f = if fast_path {
        fast::forward(&far.spec, x)
    } else {
        forward(&far.spec, x)
    }
    .expect("forward");
    (
        f.o.iter().map(|x| x.to_f64()).collect(),
        f.stats.iter().map(|&x| x as f64).collect(),
    )
}

fn run_dtype(far: &Far, fast_path: bool) -> (Vec<f64>, Vec<f64>) {
    match far.spec.dtype() {
        DType::F32 => run::<f32>(far, fast_path),
        DType::F16 => run::<f16>(far, fast_path),
        DType::BF16 => run::<bf16>(far, fast_path),
    }
}

/// REFERENCE.md's rule with the oracle rounded to the storage type as baseline; `acc` is an
/// accumulation allowance relative to max|ref| (0 for the reference, which accumulates in f64).
fn follows(far: &Far, o: &[f64], lse: &[f64], acc: f64) -> Result<(), String> {
    let (ro, rl) = oracle(far);
    let u = far.spec.dtype().unit_roundoff();
    let bo = round_to(far.spec.dtype(), &ro);
    let bl: Vec<f64> = rl.iter().map(|&x| x as f32 as f64).collect();
    check_close("o", o, &ro, &bo, (4.0 * u + acc) * max_abs(&ro).max(1e-3))
        .and_then(|_| {
            check_close(
                "lse",
                lse,
                &rl,
                &bl,
                (4.0 * f32::EPSILON as f64 + acc) * max_abs(&rl).max(1.0),
            )
        })
        .map_err(|e| format!("{}: {e}", far.label))
}

/// The oracle itself against the reference's f64 path near the origin, where cancellation costs
/// nothing: both must agree to rounding, or the oracle is wrong.
#[test]
fn the_double_double_oracle_matches_the_reference_near_the_origin() {
    for score in [HypScore::SquaredLorentz, HypScore::Geodesic] {
        let family = Family::Hyperbolic(HyperbolicParams {
            score,
            curvature: 0.7,
            beta: 0.9,
            aggregation: Aggregation::EinsteinMidpoint,
        });
        let spec = AttnProblem::new(family, DType::F32, 1, 1, 1, NQ, NK, D)
            .validate()
            .expect("valid");
        let mut rng = StdRng::seed_from_u64(5);
        let mut draw = |n: usize, a: f64| (0..n).map(|_| rng.random_range(-a..a)).collect::<Vec<f64>>();
        let far = Far {
            label: format!("{score:?} near the origin"),
            q: draw(NQ * D, 1.0),
            k: draw(NK * D, 1.0),
            v: draw(NK * D, 0.3),
            spec,
        };
        let (ro, rl) = oracle(&far);
        let f = attn_cpu_ref::forward_f64(
            &far.spec,
            Inputs {
                q: &far.q,
                k: &far.k,
                v: &far.v,
                bias: None,
            },
        )
        .expect("forward");
        assert!(max_abs_diff(&ro, &f.o) < 1e-13, "{}: o", far.label);
        assert!(max_abs_diff(&rl, &f.stats) < 1e-13, "{}: lse", far.label);
    }
}

/// The reference's f32, f16 and bf16 storage paths at radius 1e3 and 1e4 follow the oracle.
#[test]
fn reference_storage_paths_follow_the_oracle_far_from_the_origin() {
    let mut failures = Vec::new();
    for far in problems() {
        let (o, lse) = run_dtype(&far, false);
        if let Err(e) = follows(&far, &o, &lse, 0.0) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The fast path (f32 arithmetic, its Lorentz score from the GEMM's unit-vector product
/// `‖q̂ − k̂‖² = 2 − 2 q̂·k̂`) against the oracle. Its score error is about `2β·nq·nk·u_f32` (the
/// rounding of `q̂·k̂ ≈ 1` times `nq nk ≈ R²`): it follows `fast_common`'s rule near the origin but
/// not at these radii (`ATTN_PRINT_ERRORS=1` prints the table docs/hyperbolic.md quotes). The test
/// holds it to that envelope: results finite, the LSE within `4β·(1.5 R)²·u_f32` of the oracle's
/// (points lie within 1.5 R of the origin), which an error growing faster than R² would break.
#[test]
fn fast_path_error_far_from_the_origin_stays_in_its_envelope() {
    let acc = 64.0 * ((NK + D) as f64).sqrt() * DType::F32.unit_roundoff();
    let mut failures = Vec::new();
    for far in problems() {
        let (o, lse) = run_dtype(&far, true);
        let (ro, rl) = oracle(&far);
        let (_, _, beta, _) = params(&far.spec);
        let r: f64 = if far.label.contains("R=1e3") { 1e3 } else { 1e4 };
        let bound = 4.0 * beta * (1.5 * r).powi(2) * DType::F32.unit_roundoff();
        let e_lse = max_abs_diff(&lse, &rl);
        if print() {
            let verdict = follows(&far, &o, &lse, acc);
            println!(
                "fast {}: o error {:.1e} (rounding {:.1e}), lse error {:.1e} (envelope {:.1e}): {}",
                far.label,
                max_abs_diff(&o, &ro),
                max_abs_diff(&round_to(far.spec.dtype(), &ro), &ro),
                e_lse,
                bound,
                if verdict.is_ok() { "follows" } else { "fails" }
            );
        }
        if !o.iter().chain(&lse).all(|x| x.is_finite()) {
            failures.push(format!("{}: not finite", far.label));
        } else if e_lse > bound {
            failures.push(format!("{}: lse error {e_lse:.2e} > {bound:.2e}", far.label));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `Σ a_i b_i` as a tensor core forms it from storage values: exact products, f32 accumulation.
fn dot_f32(a: &[f64], b: &[f64]) -> f32 {
    a.iter()
        .zip(b)
        .fold(0.0f32, |acc, (x, y)| (*x as f32).mul_add(*y as f32, acc))
}

/// `(hi, lo)` f32 pieces of an f64.
fn split(x: f64) -> (f32, f32) {
    let hi = x as f32;
    (hi, (x - hi as f64) as f32)
}

/// The f32 forms of the pair score a GPU kernel can use, each returning `d²_L` (f64 from its f32
/// intermediates); row scalars come from f64 row kernels rounded to f32 as the kernels have them.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Form {
    /// The tensor-core kernels today: `y = fl32(q·k) − q0 k0` (one FMA), `d²_L = −2y − 2/c`.
    Difference,
    /// The same GEMM product, `q0 k0` compensated: q0 and k0 as f32 (hi, lo) pairs, the product's
    /// error by FMA (two-product), `y = (fl32(q·k) − p) − e` (the first difference is exact by
    /// Sterbenz when `q·k ≈ q0 k0`).
    Compensated,
    /// The CPU reference's cancellation-free form in f32 (the f32 SIMT kernel, hyp_simt.cuh):
    /// `d²_L = (nq − nk)²(1 − ρ²) + nq nk ‖q̂ − k̂‖²`, the angular term a per-pair sum of squared
    /// differences.
    CancellationFree,
}

fn form_sq_dist(form: Form, c: f64, q: &[f64], k: &[f64]) -> f64 {
    let inv_c = dd::Dd::recip(c);
    let time = |x: &[f64]| inv_c.add(dd::dot(x, x)).sqrt();
    let (q0, k0) = (time(q), time(k));
    match form {
        Form::Difference => {
            let (q0, k0) = (q0.to_f64() as f32, k0.to_f64() as f32);
            let y = (-q0).mul_add(k0, dot_f32(q, k));
            -2.0 * y as f64 - 2.0 / c
        }
        Form::Compensated => {
            let ((qh, ql), (kh, kl)) = (split(q0.to_f64()), split(k0.to_f64()));
            let p = qh * kh;
            let e = qh.mul_add(kh, -p) + qh * kl + ql * kh;
            let y = (dot_f32(q, k) - p) - e;
            -2.0 * y as f64 - 2.0 / c
        }
        Form::CancellationFree => {
            let norm = |x: &[f64]| x.iter().map(|v| v * v).sum::<f64>().sqrt();
            let (nq, nk) = (norm(q) as f32, norm(k) as f32);
            let (q0, k0) = (q0.to_f64() as f32, k0.to_f64() as f32);
            let unit = |x: &[f64], n: f32| x.iter().map(|&v| v as f32 * (1.0 / n)).collect::<Vec<f32>>();
            let (qh, kh) = (unit(q, nq), unit(k, nk));
            let ang = qh
                .iter()
                .zip(&kh)
                .fold(0.0f32, |a, (x, y)| (x - y).mul_add(x - y, a));
            let ic = (1.0 / c) as f32;
            let (gq, gk) = (ic / (q0 + nq), ic / (k0 + nk));
            let dn = nq - nk;
            let t0 = q0 + k0;
            let one_minus_rho2 = (gq + gk) * (t0 + nq + nk) / (t0 * t0);
            (dn * dn * one_minus_rho2 + nq * nk * ang) as f64
        }
    }
}

/// The GPU's f32 score forms emulated on the CPU: the largest score error (nats, at the problem's
/// β, against the double-double oracle) of each, per problem. On f16 and bf16 inputs the
/// cancellation-free form stays within 2e-4 nats at radius 1e4 for every curvature (the f16 and
/// bf16 tolerances allow about 2e-3 and 1e-2 nats); on f32 inputs within 1e-3 nats per 1e3 of
/// radius (it rounds the unit rows: about 2β·R·d·u_f32). The difference form loses about
/// `2β·u_f32·q0 k0` and the compensated one `2β·u_f32·|q·k|` (the f32 accumulation of the GEMM
/// product): both grow with R², and the difference form with 1/c.
#[test]
fn gpu_score_forms_emulated_in_f32_far_from_the_origin() {
    let forms = [Form::Difference, Form::Compensated, Form::CancellationFree];
    let mut worst = [0.0f64; 3];
    for far in problems() {
        let (score, c, beta, _) = params(&far.spec);
        let mut err = [0.0f64; 3];
        for i in 0..NQ {
            for j in 0..NK {
                let (q, k) = (&far.q[i * D..][..D], &far.k[j * D..][..D]);
                let want = oracle_score(score, c, beta, q, k);
                for (f, form) in forms.iter().enumerate() {
                    let d2 = form_sq_dist(*form, c, q, k).max(0.0);
                    let got = match score {
                        HypScore::SquaredLorentz => -beta * d2,
                        HypScore::Geodesic => {
                            let x = (0.5 * c * d2).max(ACOSH_EPS);
                            -beta * (x + (x * (x + 2.0)).sqrt()).ln_1p() / c.sqrt()
                        }
                    };
                    err[f] = err[f].max((got - want).abs());
                }
            }
        }
        if print() {
            println!(
                "score error {}: difference {:.1e}, compensated {:.1e}, cancellation-free {:.1e} nats",
                far.label, err[0], err[1], err[2]
            );
        }
        for f in 0..3 {
            worst[f] = worst[f].max(err[f]);
        }
        // f32 rounds the unit rows and norms: about 2β·R·d·u_f32 (d the pair's distance).
        let r: f64 = if far.label.contains("R=1e3") { 1e3 } else { 1e4 };
        let bound = if far.spec.dtype() == DType::F32 {
            1e-3 * r / 1e3
        } else {
            2e-4
        };
        assert!(
            err[2] <= bound,
            "{}: the cancellation-free form's score error {:.2e} > {bound:.1e}",
            far.label,
            err[2]
        );
    }
    // The motivation: the forms on the GEMM product do not reach it.
    assert!(worst[0] > 1.0 && worst[1] > 1e-2, "{worst:?}");
}

/// `L = Σ o·dO` of the oracle's forward on inputs `q`, `k`.
fn oracle_loss(far: &Far, q: &[f64], k: &[f64], d_o: &[f64]) -> f64 {
    let moved = Far {
        label: String::new(),
        spec: far.spec.clone(),
        q: q.to_vec(),
        k: k.to_vec(),
        v: far.v.clone(),
    };
    let (o, _) = oracle(&moved);
    o.iter().zip(d_o).map(|(a, b)| a * b).sum()
}

/// The reference's f64 gradients dq and dk far from the origin (its cancellation-free
/// `G = (k0 nq/q0)(q̂ − k̂) + T k̂`) against central differences of the double-double oracle's loss
/// (Richardson-extrapolated, steps of 1e-3·σ: the scores vary on the scale σ), to 1e-6 of the
/// largest gradient. f32 problems only: their inputs are the unrounded clusters' f32 values, and
/// the storage paths' backward is this f64 backward rounded.
#[test]
fn reference_gradients_follow_the_oracle_far_from_the_origin() {
    let mut failures = Vec::new();
    for far in problems().into_iter().filter(|f| f.spec.dtype() == DType::F32) {
        let mut rng = StdRng::seed_from_u64(99);
        let d_o: Vec<f64> = (0..NQ * D).map(|_| rng.random_range(-1.0..1.0)).collect();
        let x = Inputs {
            q: &far.q,
            k: &far.k,
            v: &far.v,
            bias: None,
        };
        let f = attn_cpu_ref::forward_f64(&far.spec, x).expect("forward");
        let g = attn_cpu_ref::backward_f64(&far.spec, x, &f.o, &d_o, &f.stats).expect("backward");
        let sigma = 1.0; // f32 clusters (module doc)
        let fd = |which: usize, at: usize| {
            let central = |h: f64| {
                let (mut qp, mut kp) = (far.q.clone(), far.k.clone());
                let (mut qm, mut km) = (far.q.clone(), far.k.clone());
                if which == 0 {
                    qp[at] += h;
                    qm[at] -= h;
                } else {
                    kp[at] += h;
                    km[at] -= h;
                }
                (oracle_loss(&far, &qp, &kp, &d_o) - oracle_loss(&far, &qm, &km, &d_o)) / (2.0 * h)
            };
            let h = 1e-3 * sigma;
            (4.0 * central(h / 2.0) - central(h)) / 3.0
        };
        for (which, name, grad) in [(0, "dq", &g.dq), (1, "dk", &g.dk)] {
            let scale = max_abs(grad).max(1e-12);
            for (at, &an) in grad.iter().enumerate() {
                let num = fd(which, at);
                if (an - num).abs() > 1e-6 * scale {
                    failures.push(format!(
                        "{}: {name}[{at}] = {an:.9e}, oracle's finite difference {num:.9e} (max {scale:.2e})",
                        far.label
                    ));
                    break;
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
