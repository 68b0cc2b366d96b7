//! The single-pass causal order-1 forward (`taylor_order1_chain.cuh`) in the emulator: its tickets, the fold
//! blocks' chain of inclusive sums and the forward blocks' chunk loop.

use super::*;

/// Order 1's sums over a prefix of keys: cst[v] = Σ ṽ[v], lin[v][e] = Σ k̂[e] ṽ[v] (ṽ = [v, 1]), and how
/// many keys they hold.
#[derive(Clone)]
struct Order1Sums {
    cst: Vec<f64>,
    lin: Vec<f64>,
    keys: usize,
}

impl Order1Sums {
    fn zero(d: usize) -> Self {
        Order1Sums {
            cst: vec![0.0; d + 1],
            lin: vec![0.0; (d + 1) * d],
            keys: 0,
        }
    }

    /// Adds the keys [j0, j0 + n) (`x` = k̂, `y` = ṽ rows).
    fn fold(&mut self, x: &[Vec<f64>], y: &[Vec<f64>], j0: usize, n: usize) {
        let d = self.lin.len() / self.cst.len();
        for j in j0..j0 + n {
            for (v, &yv) in y[j].iter().enumerate() {
                self.cst[v] += yv;
                (0..d).for_each(|e| self.lin[v * d + e] += x[j][e] * yv);
            }
        }
        self.keys += n;
    }

    fn add(&mut self, other: &Order1Sums) {
        self.cst.iter_mut().zip(&other.cst).for_each(|(a, b)| *a += b);
        self.lin.iter_mut().zip(&other.lin).for_each(|(a, b)| *a += b);
        self.keys += other.keys;
    }
}

/// The k̂ rows and the ṽ rows of one (batch entry, kv head).
type KeyRows = (Vec<Vec<f64>>, Vec<Vec<f64>>);

/// The single-pass causal order-1 forward (every sequence with as many queries as keys), o and den in f64,
/// with segments of `seg` keys and the fold blocks `lookahead` rounds ahead. The blocks run one at a time
/// in ticket order, which is an order the GPU's waits allow (a block waits only for smaller tickets):
///   tickets: the fold blocks of rounds 0 … lookahead − 1, then per round r the fold blocks of round
///   r + lookahead and the forward blocks of round r;
///   fold block (b, hk, r), when segment r + 1 exists: T_r over segment r's keys (whole chunks of 64),
///   I_r = I_{r−1} + T_r (I_0 = T_0);
///   forward block (b, h, r): from I_{r−1} (nothing for r = 0), per chunk of 64 queries c0 …: each query i
///   takes a0 cst + a1 u·lin + Σ_{c0 ≤ j ≤ i} f(u·k̂_j) ṽ_j, then the chunk's keys are folded in (not after
///   the segment's last chunk).
/// Every block of the grid is visited exactly once, and the checks below hold the kernel's invariants.
pub(super) fn order1_chain_forward(
    spec: &AttnSpec,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    seg: usize,
    lookahead: usize,
) -> (Vec<f64>, Vec<f64>) {
    const C: usize = 64;
    let fam = family(spec);
    let [a0, a1, _] = fam.c;
    let (d, g) = (spec.head_dim(), spec.group());
    let (n_fold, n_fwd) = (spec.batch() * spec.heads_kv(), spec.batch() * spec.heads_q());
    let rounds = spec.seq_k().div_ceil(seg);
    let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>();
    let (mut o, mut den) = (vec![0.0; spec.o_len()], vec![0.0; spec.stats_len()]);
    // k̂ and ṽ rows per (batch entry, kv head).
    let rows: Vec<Vec<KeyRows>> = (0..spec.batch())
        .map(|b| {
            let seq = Seq::new(spec, b);
            // Internal invariant: the tests drive this with Nq = Nk per sequence only.
            assert_eq!(seq.len_q, seq.len_k, "the single-pass forward needs Nq = Nk");
            (0..spec.heads_kv())
                .map(|hk| {
                    let kh = (0..seq.len_k)
                        .map(|j| {
                            let row = &k[spec.k_offset(b, j, hk)..][..d];
                            let r = inv_norm(row, &fam);
                            row.iter().map(|x| x * r).collect()
                        })
                        .collect();
                    let vt = (0..seq.len_k)
                        .map(|j| {
                            let mut y = v[spec.v_offset(b, j, hk)..][..d].to_vec();
                            y.push(1.0);
                            y
                        })
                        .collect();
                    (kh, vt)
                })
                .collect()
        })
        .collect();
    let mut chain: Vec<Option<Order1Sums>> = vec![None; n_fold * rounds];
    let mut fwd_done = vec![false; n_fwd * rounds];
    let tickets = lookahead * n_fold + rounds * (n_fold + n_fwd);
    for t in 0..tickets {
        let (fold, round, idx) = if t < lookahead * n_fold {
            (true, t / n_fold, t % n_fold)
        } else {
            let t = t - lookahead * n_fold;
            let (r, i) = (t / (n_fold + n_fwd), t % (n_fold + n_fwd));
            if i < n_fold {
                (true, r + lookahead, i)
            } else {
                (false, r, i - n_fold)
            }
        };
        let heads = if fold { spec.heads_kv() } else { spec.heads_q() };
        let (b, h) = (idx / heads, idx % heads);
        let hk = if fold { h } else { h / g };
        let seq = Seq::new(spec, b);
        let n_seg = seq.len_k.div_ceil(seg);
        let (kh, vt) = &rows[b][hk];
        let at = (b * spec.heads_kv() + hk) * rounds;
        let lo = round * seg;
        if fold {
            if round + 1 >= n_seg {
                continue;
            }
            // Internal invariants (test-only module): a fold block folds whole chunks, and the chain
            // state it extends is there (its fold block took a smaller ticket).
            assert!(
                seg % C == 0 && lo + seg <= seq.len_k,
                "a fold block's segment is whole"
            );
            let mut sums = Order1Sums::zero(d);
            for c0 in (lo..lo + seg).step_by(C) {
                sums.fold(kh, vt, c0, C);
            }
            if round > 0 {
                // Internal invariant (test-only module): the previous link's fold block took a smaller ticket.
                let prev = chain[at + round - 1].as_ref().expect("I_{r-1} before I_r");
                let mut inclusive = prev.clone();
                inclusive.add(&sums);
                sums = inclusive;
            }
            // Internal invariant (test-only module): the tickets name each fold block once.
            assert!(chain[at + round].is_none(), "one fold block per segment");
            chain[at + round] = Some(sums);
            continue;
        }
        if round >= n_seg {
            continue;
        }
        // Internal invariant (test-only module): the tickets name each forward block once.
        assert!(!fwd_done[idx * rounds + round], "one forward block per segment");
        fwd_done[idx * rounds + round] = true;
        let mut state = if round > 0 {
            // Internal invariant (test-only module): its fold block took a smaller ticket.
            chain[at + round - 1]
                .clone()
                .expect("I_{r-1} before the forward block")
        } else {
            Order1Sums::zero(d)
        };
        let hi = (lo + seg).min(seq.len_k);
        for c0 in (lo..hi).step_by(C) {
            // Internal invariant: the state holds exactly the keys before the chunk.
            assert_eq!(state.keys, c0, "the state before chunk {c0}");
            for i in c0..(c0 + C).min(hi) {
                let row = &q[spec.q_offset(b, i, h)..][..d];
                let r = inv_norm(row, &fam) * fam.scale;
                let u: Vec<f64> = row.iter().map(|x| x * r).collect();
                let mut acc: Vec<f64> = (0..=d)
                    .map(|vv| a0 * state.cst[vv] + a1 * dot(&u, &state.lin[vv * d..][..d]))
                    .collect();
                for j in c0..=i {
                    let f = a0 + a1 * dot(&u, &kh[j]);
                    acc.iter_mut().zip(&vt[j]).for_each(|(a, y)| *a += f * y);
                }
                let oo = spec.o_offset(b, i, h);
                for c in 0..d {
                    o[oo + c] = acc[c] / acc[d];
                }
                den[spec.stats_index(b, h, i)] = acc[d];
            }
            if c0 + C < hi {
                state.fold(kh, vt, c0, C);
            }
        }
    }
    // Every forward block of every existing segment ran.
    for b in 0..spec.batch() {
        let n_seg = Seq::new(spec, b).len_k.div_ceil(seg);
        for h in 0..spec.heads_q() {
            for r in 0..n_seg {
                // Internal invariant (test-only module): the tickets cover every forward block.
                assert!(
                    fwd_done[(b * spec.heads_q() + h) * rounds + r],
                    "forward block ({b}, {h}, {r})"
                );
            }
        }
    }
    (o, den)
}
