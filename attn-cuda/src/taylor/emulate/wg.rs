//! The causal wgmma forward (`taylor_wg.cuh`) in the emulator: its states and its reads' decomposition.

use super::*;

/// The fold's sums over a prefix of one (batch entry, kv head)'s keys, as the causal wgmma fold holds them
/// when it writes a state: K2 = Σ k̂k̂ᵀ, S1 = Σ k̂vᵀ, S2[a][b] = Σ k̂_a k̂_b vᵀ for b ≥ a only (the rows the
/// state keeps), Σv, Σk̂ and the key count.
#[derive(Clone)]
struct WgSums {
    k2: Vec<f64>,
    s1: Vec<f64>,
    s2: Vec<f64>,
    sv: Vec<f64>,
    sk: Vec<f64>,
    n: usize,
}

/// The causal forward of the wgmma state kernels (taylor_wg.cuh: order 2, every sequence with as many
/// queries as keys), o and den in f64. A (batch entry, kv head)'s state m − 1 holds the sums over the
/// keys before m·seg for m = 1 … while m·seg < len (the fold stops at the last segment start), at most
/// `heuristics::wg_causal_states` of them, read in the stored form: a0 n + u·(a1 Σk̂) + uᵀ(a2 K2)u for den,
/// a0 Σv + uᵀ(a1 S1) + Σ_a u_a Σ_{b ≥ a} c_ab u_b (a2 S2[a][b]) for num (c_ab = 2 above the diagonal, 1 on
/// it: the symmetry of k̂⊗k̂). The read's block of 128 queries at i0 takes state ⌊i0/seg⌋ − 1 and the
/// keys ⌊i0/seg⌋·seg … i0 + 127 densely (j ≤ i).
pub(super) fn wg_causal_forward(
    spec: &AttnSpec,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    seg: usize,
) -> (Vec<f64>, Vec<f64>) {
    const QUERIES: usize = heuristics::WG_READ_QUERIES;
    let fam = family(spec);
    let [a0, a1, a2] = fam.c;
    let d = spec.head_dim();
    let per_head = heuristics::wg_causal_states(spec.seq_k(), seg);
    let (mut o, mut den) = (vec![0.0; spec.o_len()], vec![0.0; spec.stats_len()]);
    let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>();
    for b in 0..spec.batch() {
        let seq = Seq::new(spec, b);
        // Internal invariant: the tests drive this with Nq = Nk per sequence only.
        assert_eq!(seq.len_q, seq.len_k, "the causal wgmma path needs Nq = Nk");
        for hk in 0..spec.heads_kv() {
            let kh: Vec<Vec<f64>> = (0..seq.len_k)
                .map(|j| {
                    let row = &k[spec.k_offset(b, j, hk)..][..d];
                    let r = inv_norm(row, &fam);
                    row.iter().map(|x| x * r).collect()
                })
                .collect();
            let vr: Vec<&[f64]> = (0..seq.len_k)
                .map(|j| &v[spec.v_offset(b, j, hk)..][..d])
                .collect();
            // The fold: the sums, written as state m − 1 each time they pass m·seg < len.
            let mut sums = WgSums {
                k2: vec![0.0; d * d],
                s1: vec![0.0; d * d],
                s2: vec![0.0; d * d * d],
                sv: vec![0.0; d],
                sk: vec![0.0; d],
                n: 0,
            };
            let mut states: Vec<WgSums> = Vec::new();
            for j in 0..seq.len_k.saturating_sub(1) / seg * seg {
                let (x, y) = (&kh[j], vr[j]);
                for a in 0..d {
                    for c in 0..d {
                        sums.k2[a * d + c] += x[a] * x[c];
                        sums.s1[a * d + c] += x[a] * y[c];
                    }
                    for bb in a..d {
                        let row = &mut sums.s2[(a * d + bb) * d..][..d];
                        for (acc, &yc) in row.iter_mut().zip(y) {
                            *acc += x[a] * x[bb] * yc;
                        }
                    }
                    sums.sv[a] += y[a];
                    sums.sk[a] += x[a];
                }
                sums.n += 1;
                if (j + 1) % seg == 0 {
                    states.push(sums.clone());
                }
            }
            // Internal invariant (test-only module): the host's state count covers the fold's writes.
            assert!(states.len() <= per_head, "more states than the host allocates");
            for g in 0..spec.group() {
                let h = hk * spec.group() + g;
                for i in 0..seq.len_q {
                    let row = &q[spec.q_offset(b, i, h)..][..d];
                    let r = inv_norm(row, &fam) * fam.scale;
                    let u: Vec<f64> = row.iter().map(|x| x * r).collect();
                    let i0 = i / QUERIES * QUERIES;
                    let m = i0 / seg;
                    let (mut num, mut dn) = (vec![0.0; d], 0.0);
                    if m > 0 {
                        let st = &states[m - 1];
                        dn += a0 * st.n as f64 + a1 * dot(&u, &st.sk);
                        for c in 0..d {
                            dn += u[c] * (0..d).map(|bb| u[bb] * a2 * st.k2[bb * d + c]).sum::<f64>();
                            num[c] +=
                                a0 * st.sv[c] + (0..d).map(|bb| u[bb] * a1 * st.s1[bb * d + c]).sum::<f64>();
                            for a in 0..d {
                                for bb in a..d {
                                    num[c] += u[a] * weight(a, bb) * u[bb] * a2 * st.s2[(a * d + bb) * d + c];
                                }
                            }
                        }
                    }
                    for j in m * seg..(i0 + QUERIES).min(seq.len_k) {
                        if j > i {
                            continue;
                        }
                        let s = dot(&u, &kh[j]);
                        let f = a0 + s * (a1 + a2 * s);
                        dn += f;
                        for c in 0..d {
                            num[c] += f * vr[j][c];
                        }
                    }
                    let oo = spec.o_offset(b, i, h);
                    for c in 0..d {
                        o[oo + c] = num[c] / dn;
                    }
                    den[spec.stats_index(b, h, i)] = dn;
                }
            }
        }
    }
    (o, den)
}
