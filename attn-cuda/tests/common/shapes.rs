//! Random problem shapes for the GPU tests: a small deterministic generator (the tensors themselves
//! come from `random_case`) and the shape builders the test files share. Each file picks its
//! sequence lengths through [`Lengths`]; a builder draws its lengths in a fixed order, so one seed
//! always gives the same shape.

use attn_core::{AttnProblem, Causal, DType, Family, InputStrides, Layout, Strides};

/// A shape builder: the problem of a family, dtype and head dim, its lengths drawn from the shapes.
pub type Make = dyn Fn(Family, DType, usize, &mut Shapes) -> AttnProblem;

/// The sequence lengths of one test file.
#[derive(Clone, Copy, Debug)]
pub struct Lengths {
    /// Longest sequence at head dim `d`.
    pub max: fn(usize) -> usize,
    /// Shortest key length of the dense builders ([`dense_gqa`], [`mqa_bhnd`], [`strided_views`]).
    pub min_k: usize,
}

/// A linear congruential generator of lengths, with the file's [`Lengths`].
#[derive(Clone, Debug)]
pub struct Shapes {
    state: u64,
    lengths: Lengths,
}

impl Shapes {
    pub fn new(seed: u64, lengths: Lengths) -> Self {
        Self { state: seed, lengths }
    }

    /// A value in [lo, hi].
    pub fn next(&mut self, lo: usize, hi: usize) -> usize {
        self.state = self
            .state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        lo + ((self.state >> 33) as usize) % (hi - lo + 1)
    }

    /// A length in [lo, hi] that is not a multiple of 16 (so every tile and chunk has a tail).
    pub fn tail(&mut self, lo: usize, hi: usize) -> usize {
        let n = self.next(lo, hi);
        if n % 16 == 0 {
            n + 3
        } else {
            n
        }
    }

    /// The longest sequence at head dim `d`.
    pub fn max_len(&self, d: usize) -> usize {
        (self.lengths.max)(d)
    }

    /// Query and key lengths of the dense builders: `Nq` in [40, max], `Nk` in [min_k, max].
    fn dense_lens(&mut self, d: usize) -> (usize, usize) {
        let (max, min_k) = (self.max_len(d), self.lengths.min_k);
        let nq = self.tail(40, max);
        let nk = self.tail(min_k, max);
        (nq, nk)
    }
}

/// Dense GQA (4 query heads over 2 key/value heads), `Nq ≠ Nk`, both with tails.
pub fn dense_gqa(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let (nq, nk) = s.dense_lens(d);
    AttnProblem::new(f, dt, 2, 4, 2, nq, nk, d)
}

/// Top-left causal with `Nq < Nk` (`Nk` in [70, max]), GQA 2:1.
pub fn causal_top_left_q_shorter(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let nk = s.tail(70, s.max_len(d));
    let nq = s.tail(20, nk - 20);
    AttnProblem::new(f, dt, 2, 2, 1, nq, nk, d).with_causal(Causal::TopLeft)
}

/// Bottom-right causal with `Nq > Nk`: the first `Nq − Nk` queries see no key (zeros, LSE = −∞,
/// zero gradients).
pub fn causal_bottom_right_q_longer(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let nq = s.tail(70, s.max_len(d));
    let nk = s.tail(20, nq - 20);
    AttnProblem::new(f, dt, 1, 3, 3, nq, nk, d).with_causal(Causal::BottomRight)
}

/// Bottom-right causal over many key blocks (`Nk` in [900, 1300], `Nq` in [300, 500]), GQA 2:1: the
/// forward's key and value stages refill several times per query tile, and the backward visits
/// several query blocks per key tile.
pub fn long_keys_bottom_right(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let nk = s.tail(900, 1300);
    let nq = s.tail(300, 500);
    AttnProblem::new(f, dt, 1, 2, 1, nq, nk, d).with_causal(Causal::BottomRight)
}

/// Every sequence's lengths multiples of 128 and no mask, so every tile of the Hopper backward is
/// fast (the squared Lorentz fused kernel's 128-query tile, dispatch::fused_even): dense GQA, Nq ≠ Nk.
pub fn whole_tiles_gqa(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let (nq, nk) = (128 * s.next(1, 3), 128 * s.next(2, 4));
    AttnProblem::new(f, dt, 2, 4, 2, nq, nk, d)
}

/// [`whole_tiles_gqa`]'s condition with packed sequences (one with no queries).
pub fn whole_tiles_varlen(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let lq = [128 * s.next(1, 3), 0, 128 * s.next(1, 2)];
    let lk = [128 * s.next(1, 3), 128, 128 * s.next(1, 2)];
    let (mq, mk) = (*lq.iter().max().expect("3"), *lk.iter().max().expect("3"));
    AttnProblem::new(f, dt, 3, 4, 2, mq, mk, d).with_varlen(cu_seqlens(&lq), cu_seqlens(&lk))
}

/// [`whole_tiles_gqa`]'s condition with key padding (entries of 384, 128 and 256 valid keys).
pub fn whole_tiles_key_padding(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let nq = 128 * s.next(1, 2);
    AttnProblem::new(f, dt, 3, 4, 2, nq, 384, d).with_key_lens(vec![384, 128, 256])
}

/// Key lengths per batch entry (entry 2 has no valid key at all) and a sliding window.
pub fn key_padding_and_window(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let (nq, nk) = (s.tail(40, s.max_len(d)), s.tail(40, s.max_len(d)));
    let lens = vec![nk, s.next(1, nk - 1), 0];
    AttnProblem::new(f, dt, 3, 2, 2, nq, nk, d)
        .with_key_lens(lens)
        .with_window(Some(s.next(5, 40)), Some(s.next(0, 12)))
}

/// A bias broadcast over the batch (one per head), top-left causal.
pub fn bias_broadcast_batch(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let (nq, nk) = (s.tail(30, 100), s.tail(30, 100));
    AttnProblem::new(f, dt, 2, 4, 2, nq, nk, d)
        .with_bias(1, 4)
        .with_causal(Causal::TopLeft)
}

/// A bias broadcast over the heads (one per batch entry): its gradient sums over heads.
pub fn bias_broadcast_heads(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let (nq, nk) = (s.tail(30, 100), s.tail(30, 100));
    AttnProblem::new(f, dt, 2, 4, 2, nq, nk, d).with_bias(2, 1)
}

/// Packed-varlen offsets of sequences of lengths `lens`: `[0, l0, l0 + l1, …]`.
pub fn cu_seqlens(lens: &[usize]) -> Vec<usize> {
    let mut c = vec![0];
    for x in lens {
        c.push(c.last().expect("non-empty") + x);
    }
    c
}

/// Four packed sequences, bottom-right causal: one without queries, one of short lengths, one with
/// `Nq = Nk`.
pub fn varlen_causal(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let max = s.max_len(d);
    let lq = [s.tail(20, max), 0, s.tail(5, 60), s.tail(30, max)];
    let lk = [s.tail(20, max), s.next(1, 30), s.tail(5, 60), lq[3]];
    let (mq, mk) = (*lq.iter().max().expect("4"), *lk.iter().max().expect("4"));
    AttnProblem::new(f, dt, 4, 4, 2, mq, mk, d)
        .with_varlen(cu_seqlens(&lq), cu_seqlens(&lk))
        .with_causal(Causal::BottomRight)
}

/// One key/value head for 4 query heads, `[B, H, N, D]` layout, top-left causal.
pub fn mqa_bhnd(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let (nq, nk) = s.dense_lens(d);
    AttnProblem::new(f, dt, 2, 4, 1, nq, nk, d)
        .with_layout(Layout::Bhnd)
        .with_causal(Causal::TopLeft)
}

/// `[B, N, H, D]` views whose rows are padded (seq stride H·D + 16) and whose heads are spread
/// (head stride D + 8): strided, last dim contiguous.
pub fn strided_views(f: Family, dt: DType, d: usize, s: &mut Shapes) -> AttnProblem {
    let (nq, nk) = s.dense_lens(d);
    let (b, hq, hkv) = (2, 2, 1);
    let st = |n: usize, h: usize| {
        let head = d + 8;
        let seq = h * head + 16;
        Strides {
            batch: n * seq + 8,
            seq,
            head,
            dim: 1,
        }
    };
    AttnProblem::new(f, dt, b, hq, hkv, nq, nk, d)
        .with_strides(InputStrides {
            q: st(nq, hq),
            k: st(nk, hkv),
            v: st(nk, hkv),
        })
        .with_causal(Causal::BottomRight)
}
