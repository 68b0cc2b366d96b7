//! The chunk length of a sweep: the trade between the quadratic form inside a chunk and the states
//! across chunks, from a FLOP count of both (a pure function of the shape and the key ranges, never
//! of the thread count, so the partition and the rounding are the same on every machine size).
//!
//! Per probe evaluated at boundary `c > 0`, reading the states costs `2·F·m` FLOPs for `value` and
//! again for `grad` (`F = D + D(D+1)/2` state rows for order 2, `D` for order 1; `m` the width of
//! `y`); every source folded before the last boundary costs `2·F·m`; every (probe, source) pair of
//! the dense part costs `2D` (the score) plus `2m + 4` for `value` and `2m + 2D + 4` for `grad`,
//! counted per block of [`PB`] probes up to the block's last source (the tiles it computes).
//!
//! Worked example (forward, order 2, D = Dv = 64: `F = 2144`, `m = 65`): a state read is
//! `2·2144·65 ≈ 279k` FLOPs per probe, a dense pair `2·64 + 2·65 + 4 = 262`. Non-causal with
//! `N = 1024` keys and queries: states cost `1024·279k` for the reads plus `1024·279k` for the folds,
//! 571 MFLOP; the quadratic form `1024·1024·262` = 275 MFLOP, so the chunk is `N + 1` (all dense).
//! At `N = 4096` the states cost 2.3 GFLOP against 4.4 GFLOP dense, and the chunk is 64 (states
//! for all but the last `N mod 64` keys). Causal halves the quadratic form, not the states: at
//! `N = 4096` it stays dense (2.2 GFLOP against 2.3 for the state reads and folds alone); at
//! `N = 16384` it picks 64. Once the states are read at all, their cost does not depend on the chunk
//! (each source is folded once, each probe reads once), and a longer chunk only adds quadratic work:
//! the choice is in practice 64 or all dense, with longer chunks winning only where the first
//! chunk's probes (which read no state) tip the balance.
//!
//! A recurrent decode ([`super::sweep::sweep_on`]) folds every source in the end whatever the
//! chunk, so its folds are left out of the count ([`Work::keep`]), and where its state already
//! holds keys every probe reads it ([`Work::resume`]). Worked example (decode prefill, causal,
//! order 2, D = Dv = 64): at `N = 1024` the reads cost `1024·279k` = 286 MFLOP against 146 MFLOP
//! for the quadratic form, which stays; at `N = 4096` the reads (1.1 GFLOP) beat the quadratic
//! form (2.2 GFLOP), where the forward alone stays dense (the folds would add 1.1 GFLOP). A step
//! of one token has one candidate, no chunk.

use super::sweep::{pairs, PB};

/// Chunk lengths tried: 64, 128, …, below the source count, and `ns + 1` (no state at all).
const MIN_CHUNK: usize = 64;

/// What the sweep computes, for the cost model.
#[derive(Clone, Copy, Debug)]
pub(super) struct Work {
    pub d: usize,
    pub m: usize,
    /// Order 2 (`P2` present).
    pub square: bool,
    pub value: bool,
    pub grad: bool,
    /// The sweep starts from states that already hold sources: every probe reads them.
    pub resume: bool,
    /// Every source ends in the states ([`super::sweep::sweep_on`]): the folds cost the same for
    /// every chunk and are not counted.
    pub keep: bool,
}

impl Work {
    fn state_rows(&self) -> f64 {
        (self.d + if self.square { pairs(self.d) } else { 0 }) as f64
    }
    fn read(&self) -> f64 {
        let per = 2.0 * self.state_rows() * self.m as f64;
        let contract = if self.square {
            2.0 * pairs(self.d) as f64
        } else {
            0.0
        };
        (if self.value { per } else { 0.0 }) + (if self.grad { per + contract } else { 0.0 })
    }
    fn fold(&self) -> f64 {
        2.0 * self.state_rows() * self.m as f64
    }
    fn pair(&self) -> f64 {
        let (d, m) = (self.d as f64, self.m as f64);
        2.0 * d
            + (if self.value { 2.0 * m + 4.0 } else { 0.0 })
            + (if self.grad { 2.0 * m + 2.0 * d + 4.0 } else { 0.0 })
    }
}

/// The FLOP count of a sweep over `ns` sources with chunk `c`, probes seeing `0..hi[p]`.
fn cost(w: &Work, hi: &[usize], ns: usize, c: usize) -> f64 {
    let np = hi.len();
    let (read, fold, pair) = (w.read(), w.fold(), w.pair());
    let (mut total, mut p0, mut start) = (0.0, 0, 0usize);
    while p0 < np {
        let p1 = p0 + hi[p0..].partition_point(|&h| h < start.saturating_add(c));
        if start > 0 || w.resume {
            total += (p1 - p0) as f64 * read;
        }
        for b in (p0..p1).step_by(PB) {
            let e = (b + PB).min(p1);
            total += ((e - b) * hi[e - 1].saturating_sub(start)) as f64 * pair;
        }
        p0 = p1;
        if p0 < np && !w.keep {
            total += (start.saturating_add(c).min(ns) - start.min(ns)) as f64 * fold;
        }
        start = start.saturating_add(c);
    }
    total
}

/// The chunk with the least [`cost`] (the smaller on a tie).
pub(super) fn chunk(w: &Work, hi: &[usize], ns: usize) -> usize {
    let mut candidates: Vec<usize> = std::iter::successors(Some(MIN_CHUNK), |&c| c.checked_mul(2))
        .take_while(|&c| c < ns)
        .collect();
    candidates.push(ns.saturating_add(1));
    let mut best = (f64::INFINITY, ns.saturating_add(1));
    for c in candidates {
        let k = cost(w, hi, ns, c);
        if k < best.0 {
            best = (k, c);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;

    const FWD2: Work = Work {
        d: 64,
        m: 65,
        square: true,
        value: true,
        grad: false,
        resume: false,
        keep: false,
    };

    #[test]
    fn short_non_causal_sequences_run_dense_and_long_ones_through_the_states() {
        // The worked example of the module doc.
        assert_eq!(chunk(&FWD2, &[1024; 1024], 1024), 1025);
        assert_eq!(chunk(&FWD2, &[4096; 4096], 4096), 64);
    }

    #[test]
    fn causal_sequences_switch_to_the_states_later_than_non_causal_ones() {
        let hi: Vec<usize> = (1..=4096).collect();
        assert_eq!(chunk(&FWD2, &hi, 4096), 4097);
        let hi: Vec<usize> = (1..=16384).collect();
        assert_eq!(chunk(&FWD2, &hi, 16384), 64);
        // Order 1 has D state rows, not D²/2: its states pay off at the smallest chunk.
        let fwd1 = Work {
            square: false,
            ..FWD2
        };
        assert_eq!(chunk(&fwd1, &hi, 4096), 64);
    }

    #[test]
    fn a_decode_prefill_reads_its_states_earlier_than_the_forward() {
        // The decode example of the module doc: causal, order 2, D = 64.
        let prefill = Work { keep: true, ..FWD2 };
        let hi: Vec<usize> = (1..=1024).collect();
        assert_eq!(chunk(&prefill, &hi, 1024), 1025);
        let hi: Vec<usize> = (1..=4096).collect();
        assert_eq!(chunk(&FWD2, &hi, 4096), 4097);
        assert_eq!(chunk(&prefill, &hi, 4096), 64);
        // A step of one token: no chunk below the source count, the quadratic form of one pair.
        let step = Work {
            resume: true,
            ..prefill
        };
        assert_eq!(chunk(&step, &[1; 4], 1), 2);
    }

    #[test]
    fn the_dense_candidate_folds_nothing_and_counts_every_visible_pair() {
        let hi = [3, 5, 5];
        let w = Work {
            d: 2,
            m: 3,
            square: false,
            value: true,
            grad: false,
            resume: false,
            keep: false,
        };
        // One block of 3 probes up to its last source (5): 15 pairs at 2·2 + 2·3 + 4 = 14 FLOPs.
        assert_eq!(cost(&w, &hi, 5, 6), 15.0 * 14.0);
        // No sources, no probes: nothing to do.
        assert_eq!(chunk(&w, &[], 0), 1);
        assert_eq!(chunk(&w, &[0, 0], 0), 1);
    }
}
