//! Random valid Taylor problems for the property tests, shared by the unit tests of `taylor.rs` and by
//! `tests/taylor.rs` (which includes this file by path).

use attn_core::{AttnProblem, Causal, DType, Family, Layout, TaylorParams};
use proptest::prelude::*;

/// Upper bounds of a drawn problem.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub batch: usize,
    pub heads_kv: usize,
    pub group: usize,
    pub seq: usize,
    pub dim: usize,
}

/// A Taylor family from four uniform draws in [0, 1), with a denominator bounded away from 0:
/// - order 2: `a2 ∈ [0.1, 1)`, `a1 ∈ [−1.5, 1.5)`, `a0 = a1²/(4 a2) + [0.1, 1.1)`, so
///   `f ≥ a0 − a1²/(4 a2) ≥ 0.1`; `scale ∈ [0.1, 1)`.
/// - order 1: `|a1| < a0` and `|a1|·max|s| ≤ a0/2`, so `f ≥ a0/2 > 0`: with `qk_l2norm`,
///   `|s| ≤ scale ≤ 0.5`; without it, inputs lie in (−1, 1), so `|s| < scale·D` with `scale ≤ 0.5/D`.
pub fn family(order: u8, r: [f64; 4], qk_l2norm: bool, d: usize) -> Family {
    let (a, scale) = if order == 2 {
        let a2 = 0.1 + 0.9 * r[2];
        let a1 = 3.0 * r[1] - 1.5;
        ([a1 * a1 / (4.0 * a2) + 0.1 + r[0], a1, a2], 0.1 + 0.9 * r[3])
    } else {
        let a0 = 0.5 + r[0];
        let s_max = if qk_l2norm { 1.0 } else { d as f64 };
        ([a0, a0 * (2.0 * r[1] - 1.0), 0.0], (0.05 + 0.45 * r[3]) / s_max)
    };
    Family::Taylor(TaylorParams {
        order,
        a: [a[0] as f32, a[1] as f32, a[2] as f32],
        scale: Some(scale as f32),
        qk_l2norm,
    })
}

/// Sequence lengths from per-batch draws in [0, 1): `kind` 0 = dense, 1 = key padding, 2 = packed.
fn lengths(p: AttnProblem, kind: usize, draws: &[(f64, f64)]) -> AttnProblem {
    let pick = |r: f64, n: usize| ((r * (n + 1) as f64) as usize).min(n);
    match kind {
        1 => {
            let key_lens = draws.iter().map(|&(_, rk)| pick(rk, p.seq_k)).collect();
            p.with_key_lens(key_lens)
        }
        2 => {
            let (mut cq, mut ck) = (vec![0], vec![0]);
            for &(rq, rk) in draws {
                cq.push(cq[cq.len() - 1] + pick(rq, p.seq_q));
                ck.push(ck[ck.len() - 1] + pick(rk, p.seq_k));
            }
            p.with_varlen(cq, ck)
        }
        _ => p,
    }
}

/// Random valid Taylor problems (f32 storage; the f64 entry points ignore it) covering every option: order 1 and 2, coefficients, scale,
/// `qk_l2norm`, causal none / top-left / bottom-right with any `Nq`, `Nk`, key padding, packed varlen,
/// GQA, `Dv ≠ D` and both layouts.
pub fn problems(lim: Limits) -> impl Strategy<Value = AttnProblem> {
    let shape = (
        1..=lim.batch,
        1..=lim.heads_kv,
        1..=lim.group,
        1..=lim.seq,
        1..=lim.seq,
        1..=lim.dim,
        1..=lim.dim,
    );
    let coeffs = (1u8..=2, prop::array::uniform4(0.0..1.0f64), any::<bool>());
    let masks = (
        0..3usize,
        0..3usize,
        any::<bool>(),
        prop::collection::vec((0.0..1.0f64, 0.0..1.0f64), lim.batch),
    );
    (shape, coeffs, masks).prop_map(
        |((batch, hkv, group, nq, nk, d, dv), (order, r, l2), (causal, kind, bhnd, draws))| {
            let p = AttnProblem::new(
                family(order, r, l2, d),
                DType::F32,
                batch,
                hkv * group,
                hkv,
                nq,
                nk,
                d,
            )
            .with_head_dim_v(dv)
            .with_causal([Causal::None, Causal::TopLeft, Causal::BottomRight][causal])
            .with_layout(if bhnd { Layout::Bhnd } else { Layout::Bnhd });
            lengths(p, kind, &draws[..batch])
        },
    )
}
