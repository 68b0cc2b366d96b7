//! Taylor attention's naive same-dtype baseline: quadratic Taylor attention in the storage dtype
//! `T`. q̂, k̂, the scores S, the weights f(S), num, den, o and every gradient product rounded to
//! `T`, sums in f32.

use super::{dot, key_rows, l2norm_bwd, prep_row, query_rows, KeyCache, KeyRow, Outputs, QueryRow};
use crate::Inputs;
use attn_core::{AttnSpec, Element};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Quadratic Taylor attention in dtype `T` (module doc), forward and backward; `lse` holds the
/// denominators.
///
/// The query rows run in groups of one (batch entry, kv head), the groups on parallel threads: a group's
/// rows are the only ones that add into its keys' dk and dv sums, and each group takes its rows in
/// `query_rows`' order, so every sum is taken in the same order as one pass over `query_rows` would (the
/// same bits). A group prepares its key and value rows in `T` once (`KeyCache`). (Done row by row and on one thread,
/// this baseline took ~30× as long as the f64 reference and most of the GPU tests' time.)
pub(super) fn naive<T: Element>(
    spec: &AttnSpec,
    x: Inputs<'_, f64>,
    d_o: &[f64],
    a: [f32; 3],
    scale: f32,
    l2: Option<f32>,
) -> Outputs {
    let rt = |v: f32| T::from_f32(v).to_f32();
    let f = |s: f32| a[0] + s * (a[1] + a[2] * s);
    let df = |s: f32| a[1] + 2.0 * a[2] * s;
    let (d, dv) = (spec.head_dim(), spec.head_dim_v());
    let prep = |buf: &[f64], off: usize| prep_row::<T>(&buf[off..off + d], l2);
    let mut groups: BTreeMap<(usize, usize), Vec<QueryRow>> = BTreeMap::new();
    for row in query_rows(spec) {
        groups.entry((row.b, row.hk)).or_default().push(row);
    }
    let groups: Vec<((usize, usize), Vec<QueryRow>)> = groups.into_iter().collect();
    // One group's results: per query row (o offset, statistics index, dq offset, o, den, dq), and the
    // group's keys' dk and dv sums (key j at j·d and j·dv).
    type Rows = Vec<(usize, usize, usize, Vec<f32>, f32, Vec<f32>)>;
    type Group = (Rows, Vec<f32>, Vec<f32>);
    let run_group = |(b, hk): (usize, usize), rows: &[QueryRow]| -> Group {
        let n = spec.seq_k();
        let (mut dk_acc, mut dv_acc) = (vec![0f32; n * d], vec![0f32; n * dv]);
        let mut cache = KeyCache::new(n); // per key: the prepared k row and the v row, in T
        let mut out_rows = Rows::new();
        for &QueryRow { h, i, ref keys, .. } in rows {
            let keys = keys.clone();
            let (qh, qnorm) = prep(x.q, spec.q_offset(b, i, h));
            for j in keys.clone() {
                cache.fill(b, hk, j, || {
                    let o = spec.v_offset(b, j, hk);
                    let v: Vec<f32> = x.v[o..o + dv].iter().map(|&v| v as f32).collect();
                    (prep(x.k, spec.k_offset(b, j, hk)).0, v)
                });
            }
            let kr: Vec<&[f32]> = keys.clone().map(|j| cache.at(b, hk, j).0.as_slice()).collect();
            let vr: Vec<&[f32]> = keys.clone().map(|j| cache.at(b, hk, j).1.as_slice()).collect();
            let s: Vec<f32> = kr.iter().map(|k| rt(scale * dot(&qh, k))).collect();
            let w: Vec<f32> = s.iter().map(|&s| rt(f(s))).collect();
            let den = rt(w.iter().sum());
            // num[c] = Σ_j w_j v_j[c], summed over j in order (key by key: the rows are read once).
            let mut num = vec![0f32; dv];
            for (w, v) in w.iter().zip(&vr) {
                num.iter_mut().zip(v.iter()).for_each(|(n, v)| *n += w * v);
            }
            let o_row: Vec<f32> = num.iter().map(|&n| rt(rt(n) / den)).collect();
            // Backward: ĝ = dO/den, δ = ĝ·o, dA = ĝ·v − δ, dS = f'(S)·dA.
            let oo = spec.o_offset(b, i, h);
            let gh: Vec<f32> = d_o[oo..oo + dv].iter().map(|&g| rt(g as f32 / den)).collect();
            let delta = rt(dot(&gh, &o_row));
            let mut dqh = vec![0f32; d];
            for (jj, j) in keys.clone().enumerate() {
                let da = rt(rt(dot(&gh, vr[jj])) - delta);
                let ds = rt(df(s[jj]) * da);
                for c in 0..d {
                    dqh[c] += ds * kr[jj][c];
                    dk_acc[j * d + c] += ds * qh[c];
                }
                for c in 0..dv {
                    dv_acc[j * dv + c] += w[jj] * gh[c];
                }
            }
            let dqh: Vec<f32> = dqh.iter().map(|&v| rt(scale * v)).collect();
            let dq = l2norm_bwd(&qh, &dqh, qnorm, l2);
            out_rows.push((
                oo,
                spec.stats_index(b, h, i),
                spec.dq_offset(b, i, h),
                o_row,
                den,
                dq,
            ));
        }
        (out_rows, dk_acc, dv_acc)
    };
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(groups.len())
        .max(1);
    let mut done: Vec<(usize, Group)> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let g = next.fetch_add(1, Ordering::Relaxed);
                        let Some((key, rows)) = groups.get(g) else { break };
                        mine.push((g, run_group(*key, rows)));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect()
    });
    done.sort_by_key(|(g, _)| *g);
    let mut out = Outputs {
        lse: vec![0.0; spec.stats_len()],
        dbias: None,
        ..Outputs::zeros(spec)
    };
    let mut dk_acc = vec![0f32; spec.dk_len()];
    let mut dv_acc = vec![0f32; spec.dv_len()];
    for (g, (rows, dk_g, dv_g)) in done {
        let (b, hk) = groups[g].0;
        for (oo, stat, qo, o_row, den, dq) in rows {
            for (c, &o) in o_row.iter().enumerate() {
                out.o[oo + c] = o as f64;
            }
            out.lse[stat] = den as f64;
            for (dst, &x) in out.dq[qo..qo + d].iter_mut().zip(&dq) {
                *dst = rt(x) as f64;
            }
        }
        for j in 0..spec.seq_lens(b).k {
            let (ko, vo) = (spec.dk_offset(b, j, hk), spec.dv_offset(b, j, hk));
            dk_acc[ko..ko + d].copy_from_slice(&dk_g[j * d..][..d]);
            dv_acc[vo..vo + dv].copy_from_slice(&dv_g[j * dv..][..dv]);
        }
    }
    for KeyRow { b, hk, j, valid } in key_rows(spec) {
        let ko = spec.dk_offset(b, j, hk);
        let dkh: Vec<f32> = dk_acc[ko..ko + d].iter().map(|&v| rt(scale * v)).collect();
        let dk = if valid {
            let (kh, norm) = prep(x.k, spec.k_offset(b, j, hk));
            l2norm_bwd(&kh, &dkh, norm, l2)
        } else {
            dkh
        };
        let vo = spec.dv_offset(b, j, hk);
        for (dst, &x) in out.dk[ko..ko + d].iter_mut().zip(&dk) {
            *dst = rt(x) as f64;
        }
        for c in 0..dv {
            out.dv[vo + c] = rt(dv_acc[vo + c]) as f64;
        }
    }
    out
}
