//! The kernel parameter struct: one `#[repr(C)]` value passed by value to every kernel
//! (`__grid_constant__`), the mirror of `kernels/common/params.h` field for field.

use attn_core::{Aggregation, AttnSpec, Causal, FamilySpec, HypScore, Strides};
use cudarc::driver::DeviceRepr;

/// Device pointers are plain addresses here (`u64`); the launcher fills them from checked buffers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AttnParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub bias: u64,
    pub o: u64,
    pub lse: u64,
    pub d_o: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    pub delta: u64,
    pub ds: u64,
    pub dbias: u64,
    pub dq_acc: u64,
    pub dk_acc: u64,
    pub rq: u64,
    pub rk: u64,
    pub key_lens: u64,
    pub cu_q: u64,
    pub cu_k: u64,
    pub q_batch: i64,
    pub q_seq: i64,
    pub q_head: i64,
    pub k_batch: i64,
    pub k_seq: i64,
    pub k_head: i64,
    pub v_batch: i64,
    pub v_seq: i64,
    pub v_head: i64,
    pub o_batch: i64,
    pub o_seq: i64,
    pub o_head: i64,
    pub dq_batch: i64,
    pub dq_seq: i64,
    pub dq_head: i64,
    pub dk_batch: i64,
    pub dk_seq: i64,
    pub dk_head: i64,
    pub dv_batch: i64,
    pub dv_seq: i64,
    pub dv_head: i64,
    pub batch: i32,
    pub heads_q: i32,
    pub heads_kv: i32,
    pub group: i32,
    pub seq_q: i32,
    pub seq_k: i32,
    pub total_q: i32,
    pub total_k: i32,
    pub head_dim: i32,
    /// 0 none, 1 top-left, 2 bottom-right.
    pub causal: i32,
    /// −1: unbounded.
    pub window_left: i32,
    /// −1: unbounded.
    pub window_right: i32,
    pub bias_batch: i32,
    pub bias_heads: i32,
    pub l2norm: i32,
    pub running_max: i32,
    pub scale: f32,
    /// 0: none.
    pub softcap: f32,
    pub eps: f32,
    /// The fixed row max (natural-log units) when `running_max == 0`.
    pub max_offset: f32,
    /// Hyperbolic per-row scalars (f32 scratch written by the row kernels): q0, ‖q‖ per query row,
    /// k0, ‖k‖, log γ, c γ² per key row.
    pub x0q: u64,
    pub nq: u64,
    pub x0k: u64,
    pub nk: u64,
    pub lgk: u64,
    pub dgk: u64,
    /// 1: Einstein-midpoint aggregation.
    pub midpoint: i32,
    pub curvature: f32,
    pub beta: f32,
    /// Fast-path multiplier in log2 units: `2β·log2 e`, or `−β/√c` for the geodesic.
    pub hyp_c: f32,
    /// The constant part of the score, added to LSE: `2β/c`, or `−(β/√c)·ln c` for the geodesic.
    pub hyp_lse: f32,
    /// Gradient scale: `2β`, or `β/√c` for the geodesic.
    pub hyp_grad: f32,
    /// Fused hyperbolic backward: the row sums `a_i = Σ_j w_ij k0_j` of dQ (f32, statistics layout,
    /// zeroed before the kernel adds into it).
    pub dq_rowsum: u64,
    /// 1: `dq_acc` is in the warp-specialised fused backward's tiled layout (`SeqInfo::dq_acc_index`
    /// in kernels/common/mask.h), read by the dq row kernels; 0: the dq strides.
    pub dq_acc_tiled: i32,
    /// Persistent warp-specialised forward: query tiles per (batch entry, head) (0 otherwise).
    pub tiles_q: i32,
    /// Persistent warp-specialised forward: a zeroed counter of the tiles handed out past the grid's
    /// first (`int*`), or 0: each block then takes every `gridDim.x`-th tile.
    pub tile_counter: u64,
    /// Taylor order 2 on the flash skeleton (`TaylorScore`): the weight `f(s) = a0 + a1 s + a2 s²`.
    pub poly_a0: f32,
    pub poly_a1: f32,
    pub poly_a2: f32,
    /// 1: Taylor on the flash skeleton: the statistics are the denominators, and the backward's row
    /// kernel hands the kernels `1/den` where the other scores get the LSE.
    pub poly: i32,
    /// Causal grids: (batch entry, head) pairs per section of the work order (kernels/common/mask.h
    /// `tile_order`) for the grids of query tiles (forward, dQ) and of key tiles (dK/dV, fused);
    /// 1 is head by head. `heuristics::causal_sections`.
    pub section_q: i32,
    pub section_k: i32,
}

// SAFETY: `AttnParams` is `#[repr(C)]`, made only of integers and floats, and its field order and
// types match `struct AttnParams` in kernels/common/params.h (8-byte fields first, then 4-byte
// fields, then the hyperbolic block under the same rule: no padding).
unsafe impl DeviceRepr for AttnParams {}

/// Cosine-sim scores are bounded by `scale`, so the row max can be fixed at `scale`; above this
/// scale `exp(s − scale)` could underflow f32 for the smallest scores (s ≥ −scale), so the kernel
/// tracks the running max instead.
pub(crate) const FIXED_MAX_SCALE_LIMIT: f32 = 32.0;

fn to_i32(x: usize) -> i32 {
    // Validated sizes are far below 2^31 elements per dimension for any buffer a GPU can hold; the
    // launcher rejects larger ones (see `check_i32_sizes`) before building params.
    i32::try_from(x).unwrap_or(i32::MAX)
}

/// A view's (batch, seq, head) strides for the kernels (validate keeps them within isize).
pub(crate) fn set_strides(s: Strides) -> (i64, i64, i64) {
    (s.batch as i64, s.seq as i64, s.head as i64)
}

/// The kernels' causal code: 0 none, 1 top-left, 2 bottom-right.
pub(crate) fn causal_code(spec: &AttnSpec) -> i32 {
    match spec.causal() {
        Causal::None => 0,
        Causal::TopLeft => 1,
        Causal::BottomRight => 2,
    }
}

/// The window's (left, right) sides for the kernels, −1 for an unbounded side. A window wider than
/// both sequences is no window; clamping keeps device arithmetic in i32.
pub(crate) fn window_sides(spec: &AttnSpec) -> (i32, i32) {
    let cap = spec.seq_q() + spec.seq_k();
    let side = |w: Option<usize>| w.map(|w| to_i32(w.min(cap))).unwrap_or(-1);
    let window = spec.window().unwrap_or_default();
    (side(window.left), side(window.right))
}

impl AttnParams {
    /// Everything but the pointers, from a checked spec.
    pub(crate) fn from_spec(spec: &AttnSpec) -> Self {
        let mut p = AttnParams::default();
        (p.q_batch, p.q_seq, p.q_head) = set_strides(spec.q_strides());
        (p.k_batch, p.k_seq, p.k_head) = set_strides(spec.k_strides());
        (p.v_batch, p.v_seq, p.v_head) = set_strides(spec.v_strides());
        (p.o_batch, p.o_seq, p.o_head) = set_strides(spec.o_strides());
        (p.dq_batch, p.dq_seq, p.dq_head) = set_strides(spec.dq_strides());
        (p.dk_batch, p.dk_seq, p.dk_head) = set_strides(spec.dk_strides());
        (p.dv_batch, p.dv_seq, p.dv_head) = set_strides(spec.dv_strides());
        p.batch = to_i32(spec.batch());
        p.heads_q = to_i32(spec.heads_q());
        p.heads_kv = to_i32(spec.heads_kv());
        p.group = to_i32(spec.group());
        p.seq_q = to_i32(spec.seq_q());
        p.seq_k = to_i32(spec.seq_k());
        p.total_q = to_i32(spec.total_q());
        p.total_k = to_i32(spec.total_k());
        p.head_dim = to_i32(spec.head_dim());
        p.causal = causal_code(spec);
        (p.window_left, p.window_right) = window_sides(spec);
        if let Some(b) = spec.bias() {
            p.bias_batch = to_i32(b.batch);
            p.bias_heads = to_i32(b.heads);
        }
        p.running_max = 1;
        match *spec.family() {
            FamilySpec::Softmax { scale, softcap } => {
                p.scale = scale;
                p.softcap = softcap.unwrap_or(0.0);
            }
            FamilySpec::CosineSim {
                scale,
                qk_l2norm,
                eps,
            } => {
                p.scale = scale;
                p.eps = eps;
                p.l2norm = i32::from(qk_l2norm);
                // f16 has 5 exponent bits: with the fixed offset, a row whose best score sits well
                // below `scale` has every P under f16's normal range (6e-5) before P·V, and loses
                // its digits; the running max keeps each row's largest P at 1. bf16 shares f32's
                // exponent range and keeps the fixed offset.
                let bounded = qk_l2norm
                    && spec.bias().is_none()
                    && scale <= FIXED_MAX_SCALE_LIMIT
                    && spec.dtype() != attn_core::DType::F16;
                if bounded {
                    p.running_max = 0;
                    p.max_offset = scale;
                }
            }
            FamilySpec::Hyperbolic {
                score,
                curvature,
                beta,
                aggregation,
            } => {
                let h = HypConstants::new(score, curvature, beta);
                p.curvature = curvature;
                p.beta = beta;
                (p.hyp_c, p.hyp_lse, p.hyp_grad) = (h.fast, h.lse, h.grad);
                p.midpoint = i32::from(aggregation == Aggregation::EinsteinMidpoint);
            }
            // Taylor's quadratic form on the flash skeleton (order 2, `crate::taylor::dense_on_flash`;
            // its state kernels build their own parameters): the weights themselves, no max.
            FamilySpec::Taylor {
                a,
                scale,
                qk_l2norm,
                eps,
                ..
            } => {
                p.scale = scale;
                p.eps = eps;
                p.l2norm = i32::from(qk_l2norm);
                p.running_max = 0;
                (p.poly_a0, p.poly_a1, p.poly_a2) = (a[0], a[1], a[2]);
                p.poly = 1;
            }
        }
        p
    }
}

/// The constants a hyperbolic score hands its kernels (kernels/flash/score.h), from `c` and `β` in
/// f64. In log2 units the fast path computes `s·log2 e = fast·y + lse·log2 e` from one value `y` per
/// element, and the gradient through the score is `grad·ψ·(k0 q/q0 − k)` with a per-element `ψ`:
///
/// | score         | `y`               | `fast`      | `lse`           | `grad`  |
/// |---------------|-------------------|-------------|-----------------|---------|
/// | squared Lorentz | `q·k − q0 k0`   | `2β log2 e` | `2β/c`          | `2β`    |
/// | geodesic      | `log2(u + √(u² − 1/c²))`, `u = q0 k0 − q·k` | `−β/√c` | `−(β/√c) ln c` | `β/√c` |
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct HypConstants {
    pub fast: f32,
    pub lse: f32,
    pub grad: f32,
}

impl HypConstants {
    pub(crate) fn new(score: HypScore, curvature: f32, beta: f32) -> Self {
        let (c, b) = (curvature as f64, beta as f64);
        let (fast, lse, grad) = match score {
            HypScore::SquaredLorentz => (2.0 * b * std::f64::consts::LOG2_E, 2.0 * b / c, 2.0 * b),
            HypScore::Geodesic => {
                let k = b / c.sqrt();
                (-k, -k * c.ln(), k)
            }
        };
        HypConstants {
            fast: fast as f32,
            lse: lse as f32,
            grad: grad as f32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::{AttnProblem, DType, Family};

    #[test]
    fn params_are_eight_byte_aligned_without_tail_padding() {
        // 20 pointers + 21 strides (8 bytes) + 16 ints + 4 floats (4 bytes) = 408 bytes, then the
        // hyperbolic block: 6 pointers + 1 int + 5 floats + 1 pointer = 80 bytes, then two ints and
        // a pointer, then Taylor's three floats and an int, then the two causal section sizes.
        assert_eq!(
            std::mem::size_of::<AttnParams>(),
            20 * 8 + 21 * 8 + 16 * 4 + 4 * 4 + 6 * 8 + 4 + 5 * 4 + 8 + 2 * 4 + 8 + 3 * 4 + 4 + 2 * 4
        );
        assert_eq!(std::mem::offset_of!(AttnParams, section_q), 408 + 112);
        assert_eq!(std::mem::offset_of!(AttnParams, poly_a0), 408 + 96);
        assert_eq!(std::mem::offset_of!(AttnParams, poly), 408 + 108);
        assert_eq!(std::mem::offset_of!(AttnParams, dq_acc_tiled), 408 + 80);
        assert_eq!(std::mem::offset_of!(AttnParams, tile_counter), 408 + 88);
        assert_eq!(std::mem::offset_of!(AttnParams, dq_rowsum), 408 + 72);
        assert_eq!(std::mem::offset_of!(AttnParams, x0q), 408);
        assert_eq!(std::mem::align_of::<AttnParams>(), 8);
    }

    #[test]
    fn cosine_uses_the_fixed_offset_only_when_scores_are_bounded() {
        let p = |fam: Family, bias: bool| {
            let mut prob = AttnProblem::new(fam, DType::BF16, 1, 1, 1, 4, 4, 16);
            if bias {
                prob = prob.with_bias(1, 1);
            }
            AttnParams::from_spec(&prob.validate().expect("valid problem"))
        };
        let fixed = p(Family::cosine_sim(), false);
        assert_eq!((fixed.running_max, fixed.max_offset), (0, 10.0));
        let f16 = AttnProblem::new(Family::cosine_sim(), DType::F16, 1, 1, 1, 4, 4, 16);
        assert_eq!(
            AttnParams::from_spec(&f16.validate().expect("valid")).running_max,
            1
        );
        assert_eq!(p(Family::cosine_sim(), true).running_max, 1);
        let unnormalised = Family::CosineSim(attn_core::CosineParams {
            qk_l2norm: false,
            ..Default::default()
        });
        assert_eq!(p(unnormalised, false).running_max, 1);
        assert_eq!(p(Family::softmax(), false).running_max, 1);
    }

    #[test]
    fn hyperbolic_constants_reproduce_the_scores() {
        // SqLorentz: s = 2β/c + 2β (q·k − q0 k0) = lse + fast·y·ln 2.
        let (c, beta, qk, q0, k0) = (0.7f64, 1.3f64, 0.4f64, 1.9f64, 1.6f64);
        let h = HypConstants::new(HypScore::SquaredLorentz, c as f32, beta as f32);
        let d2 = 2.0 * (q0 * k0 - qk) - 2.0 / c;
        let y = qk - q0 * k0;
        let s = h.lse as f64 + h.fast as f64 * y * std::f64::consts::LN_2;
        assert!((s - (-beta * d2)).abs() < 1e-5, "{s} vs {}", -beta * d2);
        // Geodesic: s = −(β/√c) arccosh(c u) = lse + fast·log2 w·ln 2, w = u + √(u² − 1/c²).
        let h = HypConstants::new(HypScore::Geodesic, c as f32, beta as f32);
        let u = q0 * k0 - qk;
        let w = u + (u * u - 1.0 / (c * c)).sqrt();
        let s = h.lse as f64 + h.fast as f64 * w.log2() * std::f64::consts::LN_2;
        let expect = -beta / c.sqrt() * (c * u).acosh();
        assert!((s - expect).abs() < 1e-5, "{s} vs {expect}");
        assert!((h.grad as f64 - beta / c.sqrt()).abs() < 1e-6);
        // β/√c = 1 gives exactly fast = −1, the condition of the geodesic's reciprocal forward
        // (flash_fwd.cuh: weight 1/w, no LG2/EX2); any other ratio keeps the log-domain path.
        for (c, beta) in [(1.0f32, 1.0f32), (4.0, 2.0), (0.25, 0.5)] {
            assert_eq!(
                HypConstants::new(HypScore::Geodesic, c, beta).fast,
                -1.0,
                "c {c} β {beta}"
            );
        }
        assert_ne!(HypConstants::new(HypScore::Geodesic, 0.8, 1.3).fast, -1.0);
    }

    /// The kernels' decomposition (score.h, lorentz_tile.cuh), emulated in f64 on one dense slice:
    /// the fast-path value y with `hyp_c` and `hyp_lse`, the geodesic's clamp and ψ, the row sums and
    /// epilogues `dq = hyp_grad·(Σ w k − (Σ w k0) q/q0)`, `dk` likewise, the midpoint's dv term.
    /// Checks the algebra (signs, constants, which side each scalar belongs to) against the CPU
    /// reference; precision is the GPU tests' business.
    #[test]
    fn hyperbolic_kernel_algebra_matches_the_cpu_reference() {
        use attn_core::{Aggregation, HyperbolicParams};
        use attn_cpu_ref::testing::{max_abs, max_abs_diff, random_case};
        let (nq, nk, d) = (5, 7, 8);
        for (score, aggregation, c, beta) in [
            (HypScore::SquaredLorentz, Aggregation::Euclidean, 0.7f32, 1.3f32),
            (HypScore::Geodesic, Aggregation::EinsteinMidpoint, 1.6, 0.8),
            (HypScore::Geodesic, Aggregation::Euclidean, 1.0, 1.0),
        ] {
            let family = Family::Hyperbolic(HyperbolicParams {
                score,
                curvature: c,
                beta,
                aggregation,
            });
            let spec = AttnProblem::new(family, DType::F32, 1, 1, 1, nq, nk, d)
                .validate()
                .expect("valid problem");
            let mut case = random_case(&spec, 3);
            // k_2 = q_1: one pair at zero distance (the geodesic's clamp, ψ = 0).
            case.k[2 * d..3 * d].copy_from_slice(&case.q[d..2 * d]);
            let h = HypConstants::new(score, c, beta);
            let (fast, lse_c, grad) = (h.fast as f64, h.lse as f64, h.grad as f64);
            let (c, l2e) = (c as f64, std::f64::consts::LOG2_E);
            let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
            let x0 = |x: &[f64]| (1.0 / c + dot(x, x)).sqrt();
            let row = |t: &[f64], i: usize| t[i * d..(i + 1) * d].to_vec();
            let (q, k, v, g) = (
                (0..nq).map(|i| row(&case.q, i)).collect::<Vec<_>>(),
                (0..nk).map(|j| row(&case.k, j)).collect::<Vec<_>>(),
                (0..nk).map(|j| row(&case.v, j)).collect::<Vec<_>>(),
                (0..nq).map(|i| row(&case.d_o, i)).collect::<Vec<_>>(),
            );
            let (q0, k0): (Vec<f64>, Vec<f64>) = (
                q.iter().map(|x| x0(x)).collect(),
                k.iter().map(|x| x0(x)).collect(),
            );
            // log γ_j and c γ_j² (no value is near the Klein edge here).
            let mid = aggregation == Aggregation::EinsteinMidpoint;
            let lg: Vec<(f64, f64)> = v
                .iter()
                .map(|v| {
                    let n2 = c * dot(v, v);
                    if mid {
                        (-0.5 * (-n2).ln_1p(), c / (1.0 - n2))
                    } else {
                        (0.0, 0.0)
                    }
                })
                .collect();
            // (y, ψ) of the fast path.
            let value = |i: usize, j: usize| -> (f64, f64) {
                let qk = dot(&q[i], &k[j]);
                match score {
                    HypScore::SquaredLorentz => (qk - q0[i] * k0[j], 1.0),
                    HypScore::Geodesic => {
                        let thr = (1.0 + attn_core::ACOSH_EPS) / c;
                        let u_raw = q0[i] * k0[j] - qk;
                        let u = u_raw.max(thr);
                        let t = u * u - 1.0 / (c * c);
                        let rs = 1.0 / t.sqrt();
                        ((u + t * rs).log2(), if u_raw < thr { 0.0 } else { rs })
                    }
                }
            };
            let (mut o, mut lse, mut p, mut psi) = (
                vec![0.0; nq * d],
                vec![0.0; nq],
                vec![vec![0.0; nk]; nq],
                vec![vec![0.0; nk]; nq],
            );
            for i in 0..nq {
                let s2: Vec<f64> = (0..nk)
                    .map(|j| {
                        let (y, ps) = value(i, j);
                        psi[i][j] = ps;
                        fast * (y + lg[j].0 * l2e / fast)
                    })
                    .collect();
                let m = s2.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = s2.iter().map(|s| (s - m).exp2()).sum();
                lse[i] = (m + l.log2()) * std::f64::consts::LN_2 + lse_c;
                for j in 0..nk {
                    p[i][j] = (s2[j] - m).exp2() / l;
                    for e in 0..d {
                        o[i * d + e] += p[i][j] * v[j][e];
                    }
                }
            }
            let r = attn_cpu_ref::forward_f64(&spec, case.inputs()).expect("forward");
            // The constants are f32: relative errors of 1e-7 in s.
            let tol = |x: &[f64]| 1e-5 * max_abs(x).max(1.0);
            let err = (max_abs_diff(&o, &r.o), max_abs_diff(&lse, &r.stats));
            assert!(
                err.0 < tol(&r.o) && err.1 < tol(&r.stats),
                "{score:?} o, lse: {err:?}"
            );
            let gr = attn_cpu_ref::backward_f64(&spec, case.inputs(), &r.o, &case.d_o, &r.stats)
                .expect("backward");
            let (mut dq, mut dk, mut dv) = (vec![0.0; nq * d], vec![0.0; nk * d], vec![0.0; nk * d]);
            let (mut a, mut b, mut colsum) = (vec![0.0; nq], vec![0.0; nk], vec![0.0; nk]);
            for i in 0..nq {
                let delta = dot(&g[i], &o[i * d..(i + 1) * d]);
                for j in 0..nk {
                    let ds = p[i][j] * (dot(&g[i], &v[j]) - delta);
                    let w = ds * psi[i][j];
                    a[i] += w * k0[j];
                    b[j] += w * q0[i];
                    colsum[j] += ds;
                    for e in 0..d {
                        dq[i * d + e] += w * k[j][e];
                        dk[j * d + e] += w * q[i][e];
                        dv[j * d + e] += p[i][j] * g[i][e];
                    }
                }
            }
            for i in 0..nq {
                for e in 0..d {
                    dq[i * d + e] = grad * (dq[i * d + e] - a[i] / q0[i] * q[i][e]);
                }
            }
            for j in 0..nk {
                for e in 0..d {
                    dk[j * d + e] = grad * (dk[j * d + e] - b[j] / k0[j] * k[j][e]);
                    dv[j * d + e] += colsum[j] * lg[j].1 * v[j][e];
                }
            }
            for (name, got, want) in [("dq", &dq, &gr.dq), ("dk", &dk, &gr.dk), ("dv", &dv, &gr.dv)] {
                let err = max_abs_diff(got, want);
                assert!(
                    err < 1e-7 * max_abs(want).max(1.0),
                    "{score:?} {aggregation:?} {name}: {err:e}"
                );
            }
        }
    }

    #[test]
    fn windows_wider_than_the_sequences_are_clamped() {
        let spec = AttnProblem::new(Family::softmax(), DType::F16, 1, 1, 1, 8, 8, 32)
            .with_window(Some(usize::MAX), None)
            .validate()
            .expect("valid problem");
        let p = AttnParams::from_spec(&spec);
        assert_eq!((p.window_left, p.window_right), (16, -1));
    }
}
