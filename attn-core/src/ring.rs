//! Context parallelism: one self-attention call over a sequence split across `W` ranks (ring
//! attention with zigzag sharding). This module is the plan, a pure function of the shapes; the
//! drivers that run it (attn-cpu-ref's sequential mode, one rank after another on the host) execute
//! the same schedule.
//!
//! ## Sharding
//! The sequence of `N` tokens is cut into `2W` chunks of `C = N / 2W` tokens; rank `r` holds chunks
//! `r` and `2W − 1 − r` (queries, keys and values alike), concatenated in that order: a local
//! sequence of `2C` tokens. Under a causal mask, chunk `a` of the queries sees chunk `b` of the keys
//! wholly when `a > b`, through a top-left causal mask when `a = b`, and not at all when `a < b`;
//! pairing an early chunk with a late one gives every rank the same work (`2W + 1` blocks of `C × C`
//! per rank, of which two are diagonal), the zigzag of ring-flash-attn and Llama 3's context
//! parallelism. Without a causal mask every block is full.
//!
//! ## Schedule
//! In step `t = 0 … W − 1`, rank `r` holds the keys and values of rank `(r − t) mod W` and attends
//! its two query chunks to those two key chunks ([`RingSpec::block`]); then every rank passes what
//! it holds to rank `r + 1`. The partial outputs of a row are merged through their log-sum-exp,
//! `lse = log(e^{lse_a} + e^{lse_b})`, `o = e^{lse_a − lse} o_a + e^{lse_b − lse} o_b` (the merge of
//! split-KV decode); Taylor's through their denominators, `den = den_a + den_b`,
//! `o = (den_a o_a + den_b o_b) / den` ([`Merge`]). The Einstein midpoint does not merge this way.
//! Backward runs the same schedule with the merged o and LSE: each block's dq adds to the rank's own
//! dq, its dk and dv to accumulators that travel with the keys and values and reach their owner
//! after the `W`-th pass.

use crate::{
    AttnError, AttnProblem, AttnSpec, Causal, DType, Family, FamilyKind, FamilySpec, Op, Pass, Result,
};

/// One self-attention call to be split over `world` ranks; q, k and v are `[B, N, H, D]` globally
/// (`[B, 2C, H, D]` per rank after [`RingSpec`]'s sharding).
#[derive(Clone, Debug, PartialEq)]
pub struct RingProblem {
    /// The attention family (softmax, cosine-sim, or hyperbolic with Euclidean aggregation).
    pub family: Family,
    /// Storage dtype of q, k, v and o.
    pub dtype: DType,
    /// Batch size B.
    pub batch: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads (dividing `heads_q`: GQA/MQA).
    pub heads_kv: usize,
    /// The whole sequence's length N (queries and keys alike), a multiple of `2 · world`.
    pub seq: usize,
    /// Head dim of q and k.
    pub head_dim: usize,
    /// Head dim of v and o.
    pub head_dim_v: usize,
    /// Causal (top-left, which is bottom-right too, since queries and keys are the same tokens).
    pub causal: bool,
    /// The number of ranks W ≥ 1.
    pub world: usize,
}

impl RingProblem {
    /// A call of `seq` tokens over `world` ranks, head dim of v equal to `head_dim`, no causal mask.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        family: Family,
        dtype: DType,
        batch: usize,
        heads_q: usize,
        heads_kv: usize,
        seq: usize,
        head_dim: usize,
        world: usize,
    ) -> Self {
        RingProblem {
            family,
            dtype,
            batch,
            heads_q,
            heads_kv,
            seq,
            head_dim,
            head_dim_v: head_dim,
            causal: false,
            world,
        }
    }

    /// Set the causal mask on or off.
    pub fn with_causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// Set the head dim of v and o.
    pub fn with_head_dim_v(mut self, head_dim_v: usize) -> Self {
        self.head_dim_v = head_dim_v;
        self
    }

    /// Check the call and plan it. Errors: the Einstein midpoint (its outputs do not merge),
    /// `world = 0`, a sequence that is not a multiple of
    /// `2 · world`, and everything [`AttnProblem::validate`] rejects.
    pub fn validate(&self) -> Result<RingSpec> {
        let op = Op::new(self.family.kind(), Pass::Spec);
        let unsupported = |what: String| AttnError::Unsupported {
            op,
            backend: "context parallelism",
            what,
        };
        let invalid = |arg: &'static str, reason: String| AttnError::InvalidArgument { op, arg, reason };
        if self.world == 0 {
            return Err(invalid("world", "a ring has at least one rank".into()));
        }
        let parts = self
            .world
            .checked_mul(2)
            .ok_or_else(|| invalid("world", format!("{} ranks overflow 2·world", self.world)))?;
        if self.seq % parts != 0 {
            return Err(invalid(
                "seq",
                format!(
                    "{} tokens do not split into 2·world = {parts} equal chunks (world = {})",
                    self.seq, self.world
                ),
            ));
        }
        let chunk = self.seq / parts;
        let problem = |n: usize, causal: Causal| {
            AttnProblem::new(
                self.family,
                self.dtype,
                self.batch,
                self.heads_q,
                self.heads_kv,
                n,
                n,
                self.head_dim,
            )
            .with_head_dim_v(self.head_dim_v)
            .with_causal(causal)
            .validate()
        };
        let causal = if self.causal {
            Causal::TopLeft
        } else {
            Causal::None
        };
        let global = problem(self.seq, causal)?;
        if let FamilySpec::Hyperbolic {
            aggregation: crate::Aggregation::EinsteinMidpoint,
            ..
        } = global.family()
        {
            return Err(unsupported(
                "the Einstein midpoint (its outputs do not merge through the LSE)".into(),
            ));
        }
        Ok(RingSpec {
            full: problem(chunk, Causal::None)?,
            diagonal: problem(chunk, Causal::TopLeft)?,
            local: problem(2 * chunk, Causal::None)?,
            global,
            world: self.world,
            chunk,
            causal: self.causal,
            merge: if self.family.kind() == FamilyKind::Taylor {
                Merge::Denominator
            } else {
                Merge::LogSumExp
            },
        })
    }
}

/// How query chunk `a` meets key chunk `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// Every query sees every key (no mask, or `a > b` under the causal mask).
    Full,
    /// The same chunk under the causal mask: query `i` sees keys `0 ..= i` (top-left).
    Diagonal,
    /// No query sees any key (`a < b` under the causal mask): nothing to compute.
    Skip,
}

/// How the partial results of one query row over different key blocks combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merge {
    /// Softmax-like families: statistics are LSEs; `lse = log(e^{lse_a} + e^{lse_b})`,
    /// `o = e^{lse_a − lse} o_a + e^{lse_b − lse} o_b`. A block without keys has LSE −∞.
    LogSumExp,
    /// Taylor: statistics are denominators; `den = den_a + den_b`,
    /// `o = (den_a o_a + den_b o_b) / den`.
    Denominator,
}

/// A checked context-parallel call ([`RingProblem::validate`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RingSpec {
    global: AttnSpec,
    local: AttnSpec,
    full: AttnSpec,
    diagonal: AttnSpec,
    world: usize,
    chunk: usize,
    causal: bool,
    merge: Merge,
}

impl RingSpec {
    /// How partial results merge: by LSE (softmax-like families) or by denominator (Taylor).
    pub fn merge(&self) -> Merge {
        self.merge
    }
    /// The whole call on one device: its buffers are the global `[B, N, H, D]` tensors.
    pub fn global(&self) -> &AttnSpec {
        &self.global
    }
    /// One rank's shard as a call without a mask: its buffer lengths are the shard's
    /// (`[B, 2C, H, D]`, statistics `[B, Hq, 2C]`).
    pub fn local(&self) -> &AttnSpec {
        &self.local
    }
    /// The number of ranks W.
    pub fn world(&self) -> usize {
        self.world
    }
    /// Tokens per chunk, `C = N / 2W`.
    pub fn chunk(&self) -> usize {
        self.chunk
    }
    /// Whether the call is causal.
    pub fn is_causal(&self) -> bool {
        self.causal
    }
    /// The two global chunks rank `rank` holds, in its local order: `[rank, 2W − 1 − rank]`.
    ///
    /// Example: W = 4 gives rank 0 chunks `[0, 7]`, rank 3 chunks `[3, 4]`.
    pub fn chunks(&self, rank: usize) -> [usize; 2] {
        [rank, 2 * self.world - 1 - rank]
    }
    /// The global token rows of local row `i` of rank `rank` (`i < 2C`).
    ///
    /// Example: W = 2, C = 3: rank 0 holds chunks 0 and 3, so local rows 0‥2 are tokens 0‥2 and
    /// local rows 3‥5 are tokens 9‥11.
    pub fn global_row(&self, rank: usize, i: usize) -> usize {
        let [a, b] = self.chunks(rank);
        if i < self.chunk {
            a * self.chunk + i
        } else {
            b * self.chunk + (i - self.chunk)
        }
    }
    /// The rank whose keys and values rank `rank` holds in step `step` (`0 ≤ step < W`):
    /// `(rank − step) mod W`. Step 0 is the rank's own.
    pub fn source(&self, rank: usize, step: usize) -> usize {
        (rank + self.world - step % self.world) % self.world
    }
    /// How query chunk `a` meets key chunk `b` (global chunk indices).
    pub fn block(&self, a: usize, b: usize) -> Block {
        match (self.causal, a.cmp(&b)) {
            (false, _) | (true, std::cmp::Ordering::Greater) => Block::Full,
            (true, std::cmp::Ordering::Equal) => Block::Diagonal,
            (true, std::cmp::Ordering::Less) => Block::Skip,
        }
    }
    /// The `C × C` call of a block (`None` for [`Block::Skip`]).
    pub fn block_spec(&self, block: Block) -> Option<&AttnSpec> {
        match block {
            Block::Full => Some(&self.full),
            Block::Diagonal => Some(&self.diagonal),
            Block::Skip => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(world: usize, seq: usize, causal: bool) -> RingSpec {
        RingProblem::new(Family::softmax(), DType::F32, 1, 4, 2, seq, 16, world)
            .with_causal(causal)
            .validate()
            .unwrap()
    }

    #[test]
    fn zigzag_shards_cover_the_sequence_once() {
        for world in 1..=5 {
            let s = spec(world, 2 * world * 3, true);
            let mut seen = vec![0; s.global().seq_q()];
            for r in 0..world {
                for i in 0..2 * s.chunk() {
                    seen[s.global_row(r, i)] += 1;
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "world {world}: {seen:?}");
        }
        let s = spec(2, 12, true);
        let rows: Vec<usize> = (0..6).map(|i| s.global_row(0, i)).collect();
        assert_eq!(rows, [0, 1, 2, 9, 10, 11]);
    }

    #[test]
    fn every_rank_meets_every_source_once_and_causal_work_is_balanced() {
        for world in 1..=6 {
            let s = spec(world, 2 * world, true);
            for r in 0..world {
                let mut sources: Vec<usize> = (0..world).map(|t| s.source(r, t)).collect();
                assert_eq!(sources[0], r);
                sources.sort_unstable();
                assert_eq!(sources, (0..world).collect::<Vec<_>>());
                // Blocks this rank computes over the ring: 2W + 1 (two diagonal), whatever r is.
                let (mut full, mut diag) = (0, 0);
                for t in 0..world {
                    for a in s.chunks(r) {
                        for b in s.chunks(s.source(r, t)) {
                            match s.block(a, b) {
                                Block::Full => full += 1,
                                Block::Diagonal => diag += 1,
                                Block::Skip => {}
                            }
                        }
                    }
                }
                assert_eq!((full, diag), (2 * world - 1, 2), "world {world} rank {r}");
            }
        }
        let s = spec(3, 6, false);
        assert!((0..6).all(|a| (0..6).all(|b| s.block(a, b) == Block::Full)));
    }

    #[test]
    fn block_specs_are_chunk_sized() {
        let s = spec(4, 64, true);
        assert_eq!(s.chunk(), 8);
        let d = s.block_spec(Block::Diagonal).unwrap();
        assert_eq!((d.seq_q(), d.seq_k(), d.causal()), (8, 8, Causal::TopLeft));
        let f = s.block_spec(Block::Full).unwrap();
        assert_eq!((f.seq_q(), f.causal()), (8, Causal::None));
        assert!(s.block_spec(Block::Skip).is_none());
        assert_eq!(s.local().q_len(), 16 * 4 * 16);
        assert_eq!(s.global().q_len(), 64 * 4 * 16);
    }

    #[test]
    fn calls_that_do_not_split_are_typed_errors() {
        let p = |family: Family, seq: usize, world: usize| {
            RingProblem::new(family, DType::F32, 1, 2, 2, seq, 8, world).validate()
        };
        let msg = |r: Result<RingSpec>| r.unwrap_err().to_string();
        assert!(msg(p(Family::softmax(), 10, 2)).contains("seq"));
        assert!(msg(p(Family::softmax(), 8, 0)).contains("world"));
        assert!(msg(p(Family::softmax(), 8, usize::MAX)).contains("world"));
        assert_eq!(p(Family::taylor(2), 8, 2).unwrap().merge(), Merge::Denominator);
        assert_eq!(p(Family::cosine_sim(), 8, 2).unwrap().merge(), Merge::LogSumExp);
        let midpoint = Family::Hyperbolic(crate::HyperbolicParams {
            aggregation: crate::Aggregation::EinsteinMidpoint,
            ..Default::default()
        });
        assert!(msg(p(midpoint, 8, 2)).contains("midpoint"));
        // What AttnProblem::validate rejects stays rejected (heads that do not group).
        let r = RingProblem::new(Family::softmax(), DType::F32, 1, 3, 2, 8, 8, 2).validate();
        assert!(matches!(
            r,
            Err(AttnError::InvalidArgument { .. }) | Err(AttnError::ShapeMismatch { .. })
        ));
        // An empty sequence splits into empty chunks.
        assert_eq!(p(Family::softmax(), 0, 3).unwrap().chunk(), 0);
    }
}
