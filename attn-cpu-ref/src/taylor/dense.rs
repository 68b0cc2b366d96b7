//! The dense quadratic form of Taylor attention, row by row: docs/math.md §3's sums taken literally,
//! `O(Nq·Nk·D)` time. It is the cross-check for the factorised path and is not used by the public
//! entry points.
//!
//! Forward: `o_i = Σ_j f(s_ij) v_j / Σ_j f(s_ij)` over `spec.key_range(b, i)`, `s_ij = scale·q̂_i·k̂_j`.
//! Backward: `ĝ_i = g_i/den_i`, `δ_i = ĝ_i·o_i`, `dV_j = Σ_i f(s_ij) ĝ_i`,
//! `dq̂_i = scale Σ_j f'(s_ij)(ĝ_i·v_j − δ_i) k̂_j`, `dk̂_j = scale Σ_i f'(s_ij)(ĝ_i·v_j − δ_i) q̂_i`,
//! then through the l2-norm.

use super::Params;
use crate::{Gradients, Inputs};
use attn_core::AttnSpec;

/// `x̂` of the `width` entries of `buf` at `off`, and `‖x‖`.
fn load(par: &Params, buf: &[f64], off: usize, width: usize) -> (Vec<f64>, f64) {
    let mut xh = vec![0.0; width];
    let norm = par.load(&buf[off..off + width], &mut xh);
    (xh, norm)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// Dense forward: `o` and the denominators, like [`super::forward`].
pub(crate) fn forward_dense(spec: &AttnSpec, x: &Inputs<'_, f64>, o: &mut [f64], stats: &mut [f64]) {
    let par = Params::of(spec);
    let (d, dv) = (spec.head_dim(), spec.head_dim_v());
    for b in 0..spec.batch() {
        for h in 0..spec.heads_q() {
            let hk = spec.kv_head(h);
            for i in 0..spec.seq_lens(b).q {
                let (qh, _) = load(&par, x.q, spec.q_offset(b, i, h), d);
                let mut num = vec![0.0; dv];
                let mut den = 0.0;
                for j in spec.key_range(b, i) {
                    let (kh, _) = load(&par, x.k, spec.k_offset(b, j, hk), d);
                    let w = par.poly.f(par.scale * dot(&qh, &kh));
                    let vo = spec.v_offset(b, j, hk);
                    num.iter_mut()
                        .zip(&x.v[vo..vo + dv])
                        .for_each(|(n, v)| *n += w * v);
                    den += w;
                }
                let oo = spec.o_offset(b, i, h);
                if spec.key_range(b, i).is_empty() {
                    o[oo..oo + dv].fill(0.0);
                    stats[spec.stats_index(b, h, i)] = 0.0;
                } else {
                    o[oo..oo + dv]
                        .iter_mut()
                        .zip(&num)
                        .for_each(|(o, n)| *o = n / den);
                    stats[spec.stats_index(b, h, i)] = den;
                }
            }
        }
    }
}

/// Dense backward: dq, dk, dv, like [`super::backward`].
pub(crate) fn backward_dense(
    spec: &AttnSpec,
    x: &Inputs<'_, f64>,
    o: &[f64],
    d_o: &[f64],
    stats: &[f64],
    grads: &mut Gradients<f64>,
) {
    let par = Params::of(spec);
    let (d, dv) = (spec.head_dim(), spec.head_dim_v());
    // dk̂, summed over every query (and query head) before going through the l2-norm.
    let mut dkh = vec![0.0; grads.dk.len()];
    for b in 0..spec.batch() {
        for h in 0..spec.heads_q() {
            let hk = spec.kv_head(h);
            for i in 0..spec.seq_lens(b).q {
                let range = spec.key_range(b, i);
                if range.is_empty() {
                    continue;
                }
                let (qh, q_norm) = load(&par, x.q, spec.q_offset(b, i, h), d);
                let oo = spec.o_offset(b, i, h);
                let den = stats[spec.stats_index(b, h, i)];
                let gh: Vec<f64> = d_o[oo..oo + dv].iter().map(|g| g / den).collect();
                let delta = dot(&gh, &o[oo..oo + dv]);
                let mut dqh = vec![0.0; d];
                for j in range {
                    let (kh, _) = load(&par, x.k, spec.k_offset(b, j, hk), d);
                    let vo = spec.v_offset(b, j, hk);
                    let v = &x.v[vo..vo + dv];
                    let s = par.scale * dot(&qh, &kh);
                    let dvo = spec.dv_offset(b, j, hk);
                    let w = par.poly.f(s);
                    grads.dv[dvo..dvo + dv]
                        .iter_mut()
                        .zip(&gh)
                        .for_each(|(a, g)| *a += w * g);
                    let ds = par.poly.df(s) * (dot(&gh, v) - delta);
                    dqh.iter_mut()
                        .zip(&kh)
                        .for_each(|(a, k)| *a += par.scale * ds * k);
                    let dko = spec.dk_offset(b, j, hk);
                    dkh[dko..dko + d]
                        .iter_mut()
                        .zip(&qh)
                        .for_each(|(a, q)| *a += par.scale * ds * q);
                }
                par.unload(&qh, q_norm, &mut dqh);
                let dqo = spec.dq_offset(b, i, h);
                grads.dq[dqo..dqo + d].copy_from_slice(&dqh);
            }
        }
    }
    for b in 0..spec.batch() {
        for hk in 0..spec.heads_kv() {
            for j in 0..spec.seq_lens(b).k {
                let (kh, k_norm) = load(&par, x.k, spec.k_offset(b, j, hk), d);
                let dko = spec.dk_offset(b, j, hk);
                let dk = &mut dkh[dko..dko + d];
                par.unload(&kh, k_norm, dk);
                grads.dk[dko..dko + d].copy_from_slice(dk);
            }
        }
    }
}
