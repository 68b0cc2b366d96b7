//! Work and traffic of one attention call: the pure formulas behind the TFLOP/s, tokens/s and
//! bandwidth columns.
//!
//! Softmax-like families (softmax, cosine-sim, hyperbolic) are counted the FlashAttention way, as
//! the two matmuls `S = Q Kᵀ` and `O = P V`:
//! `fwd = 2·B·Hq·Nq·Nk·(D + Dv)` (= `4·B·H·N²·D` when `Nq = Nk`, `Dv = D`), halved when causal;
//! `bwd = 2.5·fwd` (five matmuls instead of two) and `fwd_bwd = 3.5·fwd`. Elementwise work (exp,
//! norms, arccosh) is not counted, so every implementation is judged on the same yardstick.
//!
//! Taylor linear attention is counted as the factorised algorithm it is (docs/math.md §3). With the
//! feature map `φ(x) = [√a0, √a1·x, √a2·(x⊗x)_sym]` of `M = 1 + D (+ D(D+1)/2 for order 2)` features,
//! the forward builds the state `Σ_j φ(k_j) [v_jᵀ, 1]` (`2·Nk·M·(Dv+1)` FLOPs per head) and reads it
//! back per query (`2·Nq·M·(Dv+1)`): `fwd = 2·B·Hq·(Nq + Nk)·M·(Dv + 1)`, causal or not (prefix
//! states cost the same). The backward does four such products: `bwd = 2·fwd`, `fwd_bwd = 3·fwd`.
//!
//! Bytes moved are the compulsory traffic of the call: every input read once and every output
//! written once (q, k, v, o and the f32 statistics forward; q, k, v, o, dO, statistics in and dq, dk,
//! dv out backward). For the linear family that is the roofline that matters.

use crate::grid::{FamilyId, PassKind};

/// The shape of one benchmark call, as the FLOP formulas need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    pub causal: bool,
}

impl Shape {
    /// A self-attention shape: `Nq = Nk = n`, `Hq = Hkv = h`, `Dv = D = d`.
    pub fn square(batch: usize, heads: usize, n: usize, d: usize, causal: bool) -> Self {
        Shape {
            batch,
            heads_q: heads,
            heads_kv: heads,
            seq_q: n,
            seq_k: n,
            head_dim: d,
            head_dim_v: d,
            causal,
        }
    }
}

/// Forward FLOPs of softmax-like attention, FlashAttention's convention.
///
/// ```
/// use attn_bench::flops::{softmax_fwd_flops, Shape};
/// // 4·B·H·N²·D: B = 1, H = 8, N = 1024, D = 64.
/// assert_eq!(softmax_fwd_flops(&Shape::square(1, 8, 1024, 64, false)), 4.0 * 8.0 * 1024.0 * 1024.0 * 64.0);
/// // Causal counts half.
/// assert_eq!(softmax_fwd_flops(&Shape::square(1, 8, 1024, 64, true)), 2.0 * 8.0 * 1024.0 * 1024.0 * 64.0);
/// // One query against 4096 keys (decode, bottom-right): every key.
/// let decode = Shape { seq_q: 1, seq_k: 4096, ..Shape::square(1, 8, 4096, 64, true) };
/// assert_eq!(softmax_fwd_flops(&decode), 4.0 * 8.0 * 4096.0 * 64.0);
/// ```
pub fn softmax_fwd_flops(s: &Shape) -> f64 {
    let full = 2.0
        * s.batch as f64
        * s.heads_q as f64
        * s.seq_q as f64
        * s.seq_k as f64
        * (s.head_dim + s.head_dim_v) as f64;
    match (s.causal, s.seq_q < s.seq_k) {
        (false, _) => full,
        // Bottom-right with fewer queries than keys (decode): query i of Nq sees Nk − Nq + 1 + i
        // keys, Nq·Nk − Nq(Nq − 1)/2 pairs of the Nq·Nk.
        (true, true) => {
            let (nq, nk) = (s.seq_q as f64, s.seq_k as f64);
            full * (nq * nk - nq * (nq - 1.0) / 2.0) / (nq * nk)
        }
        // FlashAttention's convention for self-attention: half.
        (true, false) => full / 2.0,
    }
}

/// Number of Taylor features `M`: `1 + D` for order 1, `1 + D + D(D+1)/2` for order 2 (the
/// symmetric half of `x⊗x`).
///
/// ```
/// use attn_bench::flops::taylor_features;
/// assert_eq!(taylor_features(1, 64), 65);
/// assert_eq!(taylor_features(2, 64), 1 + 64 + 2080);
/// ```
pub fn taylor_features(order: u8, d: usize) -> usize {
    match order {
        1 => 1 + d,
        _ => 1 + d + d * (d + 1) / 2,
    }
}

/// Forward FLOPs of factorised Taylor attention: `2·B·Hq·(Nq + Nk)·M·(Dv + 1)`.
///
/// ```
/// use attn_bench::flops::{taylor_fwd_flops, Shape};
/// let s = Shape::square(1, 32, 16384, 64, false);
/// // Order 1, M = 65: 2·32·(2·16384)·65·65 ≈ 8.9 GFLOP.
/// assert_eq!(taylor_fwd_flops(1, &s), 2.0 * 32.0 * 32768.0 * 65.0 * 65.0);
/// ```
pub fn taylor_fwd_flops(order: u8, s: &Shape) -> f64 {
    2.0 * s.batch as f64
        * s.heads_q as f64
        * (s.seq_q + s.seq_k) as f64
        * taylor_features(order, s.head_dim) as f64
        * (s.head_dim_v + 1) as f64
}

/// FLOPs of one pass of a family: the forward count times 1 (fwd), 2.5 / 2 (bwd) or 3.5 / 3
/// (fwd_bwd) for softmax-like / Taylor.
///
/// ```
/// use attn_bench::flops::{pass_flops, softmax_fwd_flops, Shape};
/// use attn_bench::grid::{FamilyId, PassKind};
/// let s = Shape::square(16, 16, 1024, 128, false);
/// assert_eq!(pass_flops(FamilyId::Softmax, PassKind::FwdBwd, &s), 3.5 * softmax_fwd_flops(&s));
/// ```
pub fn pass_flops(family: FamilyId, pass: PassKind, s: &Shape) -> f64 {
    match family.taylor_order() {
        Some(order) => {
            let fwd = taylor_fwd_flops(order, s);
            match pass {
                PassKind::Fwd => fwd,
                PassKind::Bwd => 2.0 * fwd,
                PassKind::FwdBwd => 3.0 * fwd,
            }
        }
        None => {
            let fwd = softmax_fwd_flops(s);
            match pass {
                PassKind::Fwd => fwd,
                PassKind::Bwd => 2.5 * fwd,
                PassKind::FwdBwd => 3.5 * fwd,
            }
        }
    }
}

/// Compulsory bytes of one pass: inputs read once, outputs written once. `elem` is the storage
/// dtype's size; statistics are f32.
///
/// ```
/// use attn_bench::flops::{bytes_moved, Shape};
/// use attn_bench::grid::PassKind;
/// // The Taylor floor point: bf16, B=1, H=32, N=16384, D=64 forward reads q, k, v and writes o:
/// // 4 · 32·16384·64 · 2 bytes = 268 MB, plus 2 MB of f32 statistics.
/// let s = Shape::square(1, 32, 16384, 64, false);
/// assert_eq!(bytes_moved(PassKind::Fwd, &s, 2), 4.0 * 32.0 * 16384.0 * 64.0 * 2.0 + 32.0 * 16384.0 * 4.0);
/// ```
pub fn bytes_moved(pass: PassKind, s: &Shape, elem: usize) -> f64 {
    let (b, e) = (s.batch as f64, elem as f64);
    let q = b * (s.seq_q * s.heads_q * s.head_dim) as f64 * e;
    let k = b * (s.seq_k * s.heads_kv * s.head_dim) as f64 * e;
    let v = b * (s.seq_k * s.heads_kv * s.head_dim_v) as f64 * e;
    let o = b * (s.seq_q * s.heads_q * s.head_dim_v) as f64 * e;
    let stats = b * (s.heads_q * s.seq_q) as f64 * 4.0;
    let fwd = q + k + v + o + stats;
    // Reads q, k, v, o, dO, stats; writes dq, dk, dv.
    let bwd = q + k + v + o + o + stats + q + k + v;
    match pass {
        PassKind::Fwd => fwd,
        PassKind::Bwd => bwd,
        PassKind::FwdBwd => fwd + bwd,
    }
}

/// TFLOP/s of `flops` done in `ms` milliseconds.
///
/// ```
/// assert_eq!(attn_bench::flops::tflops(2.0e12, 1000.0), 2.0);
/// ```
pub fn tflops(flops: f64, ms: f64) -> f64 {
    flops / (ms * 1e-3) / 1e12
}

/// Query tokens processed per second: `B·Nq / t`.
///
/// ```
/// use attn_bench::flops::{tokens_per_s, Shape};
/// assert_eq!(tokens_per_s(&Shape::square(16, 16, 1024, 128, false), 2.0), 16.0 * 1024.0 / 2e-3);
/// ```
pub fn tokens_per_s(s: &Shape, ms: f64) -> f64 {
    (s.batch * s.seq_q) as f64 / (ms * 1e-3)
}

/// Percentage of a bandwidth ceiling (bytes per second) reached moving `bytes` in `ms` milliseconds.
///
/// ```
/// // 268 MB in 0.1 ms against 3.0 TB/s is 89%.
/// let pct = attn_bench::flops::bandwidth_pct(268.0e6, 0.1, 3.0e12);
/// assert!((pct - 89.33).abs() < 0.01);
/// ```
pub fn bandwidth_pct(bytes: f64, ms: f64, ceiling_bytes_per_s: f64) -> f64 {
    100.0 * bytes / (ms * 1e-3) / ceiling_bytes_per_s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_flops_follow_the_flash_attention_convention() {
        // The FlashAttention grid: B = 16384/N, H = 2048/D keeps 4·B·H·N²·D = 4·16384·2048·N.
        for n in [512usize, 1024, 4096, 16384] {
            for d in [64usize, 128] {
                let s = Shape::square(16384 / n, 2048 / d, n, d, false);
                let expect = 4.0 * 16384.0 * 2048.0 * n as f64;
                assert_eq!(softmax_fwd_flops(&s), expect);
                assert_eq!(pass_flops(FamilyId::CosineSim, PassKind::Bwd, &s), 2.5 * expect);
                assert_eq!(
                    pass_flops(FamilyId::HyperbolicGeodesic, PassKind::FwdBwd, &s),
                    3.5 * expect
                );
            }
        }
    }

    #[test]
    fn softmax_flops_with_distinct_value_dim_and_lengths() {
        let s = Shape {
            batch: 2,
            heads_q: 8,
            heads_kv: 2,
            seq_q: 100,
            seq_k: 300,
            head_dim: 64,
            head_dim_v: 32,
            causal: false,
        };
        // Q Kᵀ: 2·Nq·Nk·D, P V: 2·Nq·Nk·Dv, per query head; kv heads do not matter.
        let expect = 2.0 * 8.0 * (2.0 * 100.0 * 300.0 * 64.0 + 2.0 * 100.0 * 300.0 * 32.0);
        assert_eq!(softmax_fwd_flops(&s), expect);
    }

    #[test]
    fn taylor_flops_are_linear_in_n() {
        let f = |n| {
            pass_flops(
                FamilyId::Taylor2,
                PassKind::Fwd,
                &Shape::square(1, 8, n, 64, false),
            )
        };
        assert_eq!(f(2048) / f(1024), 2.0);
        assert_eq!(f(65536) / f(1024), 64.0);
        // Causal prefix states do the same work.
        let causal = pass_flops(
            FamilyId::Taylor1,
            PassKind::Fwd,
            &Shape::square(1, 8, 512, 64, true),
        );
        let full = pass_flops(
            FamilyId::Taylor1,
            PassKind::Fwd,
            &Shape::square(1, 8, 512, 64, false),
        );
        assert_eq!(causal, full);
    }

    #[test]
    fn taylor_pass_multipliers() {
        let s = Shape::square(3, 4, 77, 16, false);
        let fwd = taylor_fwd_flops(2, &s);
        assert_eq!(pass_flops(FamilyId::Taylor2, PassKind::Bwd, &s), 2.0 * fwd);
        assert_eq!(pass_flops(FamilyId::Taylor2, PassKind::FwdBwd, &s), 3.0 * fwd);
        // Order 2 at D = 16: M = 1 + 16 + 136 = 153; state and readout over 2·77 rows.
        assert_eq!(fwd, 2.0 * 3.0 * 4.0 * 154.0 * 153.0 * 17.0);
    }

    #[test]
    fn bytes_count_every_tensor_once() {
        let s = Shape {
            batch: 1,
            heads_q: 4,
            heads_kv: 1,
            seq_q: 10,
            seq_k: 20,
            head_dim: 8,
            head_dim_v: 4,
            causal: false,
        };
        let (q, k, v, o, st) = (4.0 * 10.0 * 8.0, 20.0 * 8.0, 20.0 * 4.0, 4.0 * 10.0 * 4.0, 40.0);
        assert_eq!(
            bytes_moved(PassKind::Fwd, &s, 2),
            2.0 * (q + k + v + o) + 4.0 * st
        );
        assert_eq!(
            bytes_moved(PassKind::Bwd, &s, 4),
            4.0 * (2.0 * (q + k + v) + 2.0 * o) + 4.0 * st
        );
        assert_eq!(
            bytes_moved(PassKind::FwdBwd, &s, 4),
            bytes_moved(PassKind::Fwd, &s, 4) + bytes_moved(PassKind::Bwd, &s, 4)
        );
    }

    #[test]
    fn rates() {
        assert_eq!(tflops(1e12, 1.0), 1000.0);
        assert_eq!(tokens_per_s(&Shape::square(2, 1, 500, 8, false), 1000.0), 1000.0);
        assert_eq!(bandwidth_pct(1e9, 1000.0, 2e9), 50.0);
    }
}
