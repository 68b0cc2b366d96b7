//! The benchmark grid: which (family, dtype, pass, shape, causal) points a run measures.
//!
//! The `flash` grid follows FlashAttention's benchmark convention (docs/performance.md): a fixed number of tokens per
//! batch (`B = 16384 / N`) and a fixed hidden size (`H = 2048 / D`), `N` from 512 to 16384, plus
//! long-`N` points (`B = 1`) for the linear family and, as the other side of the Taylor-vs-softmax
//! crossover, for softmax. Points that cannot be built (a head dim that does not divide the hidden
//! size, a shape the spec rejects) come back as [`BadPoint`]s with the reason, and the rest of the
//! grid goes on.

use crate::flops::Shape;
use attn_core::{AttnError, AttnProblem, AttnSpec, Causal, DType, Family, HypScore};
use std::fmt;
use std::str::FromStr;

/// A benchmarked family with its default parameters; the label is the `family` field of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FamilyId {
    Softmax,
    CosineSim,
    Taylor1,
    Taylor2,
    HyperbolicGeodesic,
    HyperbolicSqLorentz,
}

impl FamilyId {
    pub const ALL: [FamilyId; 6] = [
        FamilyId::Softmax,
        FamilyId::CosineSim,
        FamilyId::Taylor1,
        FamilyId::Taylor2,
        FamilyId::HyperbolicGeodesic,
        FamilyId::HyperbolicSqLorentz,
    ];

    /// The row label; equal to [`attn_core::FamilySpec::label`] of the validated family.
    pub fn label(self) -> &'static str {
        match self {
            FamilyId::Softmax => "softmax",
            FamilyId::CosineSim => "cosine_sim",
            FamilyId::Taylor1 => "taylor1",
            FamilyId::Taylor2 => "taylor2",
            FamilyId::HyperbolicGeodesic => "hyperbolic_geodesic",
            FamilyId::HyperbolicSqLorentz => "hyperbolic_sq_lorentz",
        }
    }

    /// The family with its default parameters.
    pub fn family(self) -> Family {
        match self {
            FamilyId::Softmax => Family::softmax(),
            FamilyId::CosineSim => Family::cosine_sim(),
            FamilyId::Taylor1 => Family::taylor(1),
            FamilyId::Taylor2 => Family::taylor(2),
            FamilyId::HyperbolicGeodesic => {
                Family::hyperbolic(HypScore::Geodesic, attn_core::Aggregation::Euclidean)
            }
            FamilyId::HyperbolicSqLorentz => {
                Family::hyperbolic(HypScore::SquaredLorentz, attn_core::Aggregation::Euclidean)
            }
        }
    }

    /// `Some(order)` for the linear (Taylor) family.
    pub fn taylor_order(self) -> Option<u8> {
        match self {
            FamilyId::Taylor1 => Some(1),
            FamilyId::Taylor2 => Some(2),
            _ => None,
        }
    }

    pub fn is_linear(self) -> bool {
        self.taylor_order().is_some()
    }
}

impl fmt::Display for FamilyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for FamilyId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        FamilyId::ALL.into_iter().find(|f| f.label() == s).ok_or_else(|| {
            let known: Vec<&str> = FamilyId::ALL.iter().map(|f| f.label()).collect();
            format!("unknown family `{s}` (known: {})", known.join(", "))
        })
    }
}

/// Which pass a measurement times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PassKind {
    /// Forward only.
    Fwd,
    /// Backward only, from a saved forward.
    Bwd,
    /// Forward then backward.
    FwdBwd,
}

impl PassKind {
    pub const ALL: [PassKind; 3] = [PassKind::Fwd, PassKind::Bwd, PassKind::FwdBwd];

    pub fn label(self) -> &'static str {
        match self {
            PassKind::Fwd => "fwd",
            PassKind::Bwd => "bwd",
            PassKind::FwdBwd => "fwd_bwd",
        }
    }

    pub fn needs_backward(self) -> bool {
        self != PassKind::Fwd
    }
}

impl fmt::Display for PassKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for PassKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PassKind::ALL
            .into_iter()
            .find(|p| p.label() == s)
            .ok_or_else(|| format!("unknown pass `{s}` (known: fwd, bwd, fwd_bwd)"))
    }
}

/// One point of the grid, `Dv = D`. The convention grids are self-attention (`seq_q = seq`); the
/// decode points ([`GridPoint::decode`]) have a few queries against `seq` keys. Causal is top-left where
/// `seq_q = seq` (the same mask as bottom-right there) and bottom-right otherwise (the queries are the
/// last `seq_q` positions, as in decoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GridPoint {
    pub family: FamilyId,
    pub dtype: DType,
    pub pass: PassKind,
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    /// Queries per sequence (`Nq`).
    pub seq_q: usize,
    /// Keys per sequence (`Nk`; the sequence length of a self-attention point).
    pub seq: usize,
    pub head_dim: usize,
    pub causal: bool,
    /// A paged KV cache of this page size (decode points); `None`: dense k and v.
    pub page_size: Option<usize>,
}

impl GridPoint {
    /// A decode point: `seq_q` queries per sequence against `seq_k` keys, causal bottom-right, forward.
    #[allow(clippy::too_many_arguments)]
    pub fn decode(
        family: FamilyId,
        dtype: DType,
        batch: usize,
        heads_q: usize,
        heads_kv: usize,
        seq_q: usize,
        seq_k: usize,
        head_dim: usize,
        page_size: Option<usize>,
    ) -> Self {
        GridPoint {
            family,
            dtype,
            pass: PassKind::Fwd,
            batch,
            heads_q,
            heads_kv,
            seq_q,
            seq: seq_k,
            head_dim,
            causal: true,
            page_size,
        }
    }

    /// Fewer queries than keys: a decode or chunked-prefill point.
    pub fn is_decode(&self) -> bool {
        self.seq_q < self.seq
    }

    /// The implementation label of this point's rows: `id`'s, with `-paged<size>` for a paged cache.
    pub fn impl_label(&self, id: &str) -> String {
        match self.page_size {
            Some(ps) => format!("{id}-paged{ps}"),
            None => id.to_string(),
        }
    }

    /// The attention call this point measures.
    pub fn problem(&self) -> AttnProblem {
        let causal = match (self.causal, self.seq_q == self.seq) {
            (false, _) => Causal::None,
            (true, true) => Causal::TopLeft,
            (true, false) => Causal::BottomRight,
        };
        AttnProblem::new(
            self.family.family(),
            self.dtype,
            self.batch,
            self.heads_q,
            self.heads_kv,
            self.seq_q,
            self.seq,
            self.head_dim,
        )
        .with_causal(causal)
    }

    pub fn spec(&self) -> Result<AttnSpec, AttnError> {
        self.problem().validate()
    }

    pub fn shape(&self) -> Shape {
        Shape {
            batch: self.batch,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            seq_q: self.seq_q,
            seq_k: self.seq,
            head_dim: self.head_dim,
            head_dim_v: self.head_dim,
            causal: self.causal,
        }
    }
}

impl fmt::Display for GridPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.seq_q == self.seq && self.heads_q == self.heads_kv && self.page_size.is_none() {
            return write!(
                f,
                "{} {} {} B={} H={} N={} D={}{}",
                self.family,
                self.pass,
                self.dtype,
                self.batch,
                self.heads_q,
                self.seq,
                self.head_dim,
                if self.causal { " causal" } else { "" }
            );
        }
        write!(
            f,
            "{} {} {} B={} Hq={} Hkv={} Nq={} Nk={} D={}{}",
            self.family,
            self.pass,
            self.dtype,
            self.batch,
            self.heads_q,
            self.heads_kv,
            self.seq_q,
            self.seq,
            self.head_dim,
            if self.causal { " causal" } else { "" }
        )?;
        match self.page_size {
            Some(ps) => write!(f, " paged {ps}"),
            None => Ok(()),
        }
    }
}

/// A requested point that cannot be measured, with the reason.
#[derive(Clone, Debug, PartialEq)]
pub struct BadPoint {
    pub what: String,
    pub reason: String,
}

/// What to measure. `batch`/`heads` override the tokens/hidden convention when set.
#[derive(Clone, Debug, PartialEq)]
pub struct GridConfig {
    pub families: Vec<FamilyId>,
    pub dtypes: Vec<DType>,
    pub head_dims: Vec<usize>,
    pub causal: Vec<bool>,
    pub passes: Vec<PassKind>,
    pub seq_lens: Vec<usize>,
    /// Extra sequence lengths measured only for `long_families`.
    pub long_seq_lens: Vec<usize>,
    pub long_families: Vec<FamilyId>,
    /// Tokens per batch: `B = max(1, tokens / N)` unless `batch` is set.
    pub tokens: usize,
    /// Model width: `H = hidden / D` unless `heads` is set.
    pub hidden: usize,
    pub batch: Option<usize>,
    pub heads: Option<usize>,
}

impl GridConfig {
    /// FlashAttention's benchmark convention over every family, with long N for the linear
    /// family and softmax (the `flash` preset).
    ///
    /// ```
    /// use attn_bench::grid::GridConfig;
    /// let g = GridConfig::flash();
    /// assert_eq!(g.seq_lens, vec![512, 1024, 2048, 4096, 8192, 16384]);
    /// assert_eq!((g.tokens, g.hidden), (16384, 2048));
    /// ```
    pub fn flash() -> Self {
        GridConfig {
            families: FamilyId::ALL.to_vec(),
            dtypes: vec![DType::BF16],
            head_dims: vec![64, 128],
            causal: vec![false, true],
            passes: vec![PassKind::Fwd, PassKind::FwdBwd],
            seq_lens: vec![512, 1024, 2048, 4096, 8192, 16384],
            long_seq_lens: vec![32768, 65536, 131072],
            long_families: vec![FamilyId::Taylor1, FamilyId::Taylor2, FamilyId::Softmax],
            tokens: 16384,
            hidden: 2048,
            batch: None,
            heads: None,
        }
    }

    /// A grid the CPU reference finishes in a few minutes on two cores (the `cpu-small` preset).
    pub fn cpu_small() -> Self {
        GridConfig {
            families: FamilyId::ALL.to_vec(),
            dtypes: vec![DType::F32],
            head_dims: vec![32],
            causal: vec![false],
            passes: vec![PassKind::Fwd, PassKind::FwdBwd],
            seq_lens: vec![128, 256, 512],
            long_seq_lens: vec![1024],
            long_families: vec![FamilyId::Taylor1, FamilyId::Taylor2, FamilyId::Softmax],
            tokens: 512,
            hidden: 64,
            batch: Some(1),
            heads: Some(2),
        }
    }

    /// `(batch, heads)` for a sequence length and head dim, or why the point is impossible.
    ///
    /// ```
    /// use attn_bench::grid::GridConfig;
    /// let g = GridConfig::flash();
    /// assert_eq!(g.batch_heads(1024, 128), Ok((16, 16)));
    /// assert_eq!(g.batch_heads(65536, 64), Ok((1, 32)));
    /// assert!(g.batch_heads(1024, 96).is_err()); // 2048 is not a multiple of 96
    /// ```
    pub fn batch_heads(&self, seq: usize, head_dim: usize) -> Result<(usize, usize), String> {
        if seq == 0 {
            return Err("sequence length 0".into());
        }
        let batch = match self.batch {
            Some(0) => return Err("batch override 0".into()),
            Some(b) => b,
            None => (self.tokens / seq).max(1),
        };
        let heads = match self.heads {
            Some(0) => return Err("heads override 0".into()),
            Some(h) => h,
            None if head_dim == 0 => return Err("head dim 0".into()),
            None if self.hidden % head_dim != 0 => {
                return Err(format!(
                    "hidden {} is not a multiple of head dim {head_dim}",
                    self.hidden
                ))
            }
            None => self.hidden / head_dim,
        };
        Ok((batch, heads))
    }

    /// Every point of the grid, in measurement order (family, dtype, D, causal, N, pass), and the
    /// points that cannot be built.
    pub fn points(&self) -> (Vec<GridPoint>, Vec<BadPoint>) {
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for &family in &self.families {
            let mut seqs = self.seq_lens.clone();
            if self.long_families.contains(&family) {
                seqs.extend(self.long_seq_lens.iter().filter(|n| !self.seq_lens.contains(n)));
            }
            for &dtype in &self.dtypes {
                for &head_dim in &self.head_dims {
                    for &causal in &self.causal {
                        for &seq in &seqs {
                            let (batch, heads) = match self.batch_heads(seq, head_dim) {
                                Ok(bh) => bh,
                                Err(reason) => {
                                    bad.push(BadPoint {
                                        what: format!(
                                            "{family} {dtype} N={seq} D={head_dim}{}",
                                            if causal { " causal" } else { "" }
                                        ),
                                        reason,
                                    });
                                    continue;
                                }
                            };
                            for &pass in &self.passes {
                                let p = GridPoint {
                                    family,
                                    dtype,
                                    pass,
                                    batch,
                                    heads_q: heads,
                                    heads_kv: heads,
                                    seq_q: seq,
                                    seq,
                                    head_dim,
                                    causal,
                                    page_size: None,
                                };
                                match p.spec() {
                                    Ok(_) => good.push(p),
                                    Err(e) => bad.push(BadPoint {
                                        what: p.to_string(),
                                        reason: e.to_string(),
                                    }),
                                }
                            }
                        }
                    }
                }
            }
        }
        (good, bad)
    }
}

/// Parse a comma-separated list of families, keeping the known ones and reporting the others.
///
/// ```
/// use attn_bench::grid::{parse_families, FamilyId};
/// let (ok, unknown) = parse_families(&["softmax".into(), "flash".into(), "taylor2".into()]);
/// assert_eq!(ok, vec![FamilyId::Softmax, FamilyId::Taylor2]);
/// assert_eq!(unknown.len(), 1);
/// ```
pub fn parse_families(names: &[String]) -> (Vec<FamilyId>, Vec<String>) {
    let mut ok = Vec::new();
    let mut unknown = Vec::new();
    for name in names.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        match name.parse::<FamilyId>() {
            Ok(f) if !ok.contains(&f) => ok.push(f),
            Ok(_) => {}
            Err(e) => unknown.push(e),
        }
    }
    (ok, unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash_grid_keeps_tokens_and_hidden_fixed() {
        let g = GridConfig::flash();
        let (points, bad) = g.points();
        assert!(bad.is_empty(), "{bad:?}");
        for p in &points {
            assert_eq!(p.heads_q * p.head_dim, 2048, "{p}");
            if p.seq <= 16384 {
                assert_eq!(p.batch * p.seq, 16384, "{p}");
            } else {
                assert_eq!(p.batch, 1, "{p}");
            }
        }
        // Long N only for the linear family and softmax.
        let long: Vec<_> = points.iter().filter(|p| p.seq > 16384).collect();
        assert!(!long.is_empty());
        assert!(long
            .iter()
            .all(|p| p.family.is_linear() || p.family == FamilyId::Softmax));
        // 6 families × 2 D × 2 causal × 6 N × 2 passes, plus 3 families × 2 × 2 × 3 long N × 2.
        assert_eq!(points.len(), 6 * 2 * 2 * 6 * 2 + 3 * 2 * 2 * 3 * 2);
    }

    #[test]
    fn every_point_is_distinct_and_its_spec_labels_match() {
        let g = GridConfig::cpu_small();
        let (points, _) = g.points();
        let set: std::collections::HashSet<_> = points.iter().collect();
        assert_eq!(set.len(), points.len());
        for p in &points {
            let spec = p.spec().expect("points() returns only valid points");
            assert_eq!(spec.family().label(), p.family.label());
            assert_eq!(spec.batch(), p.batch);
        }
    }

    #[test]
    fn impossible_points_are_reported_and_the_rest_kept() {
        let mut g = GridConfig::flash();
        g.families = vec![FamilyId::Softmax];
        g.head_dims = vec![64, 96, 512];
        g.causal = vec![false];
        g.passes = vec![PassKind::Fwd];
        g.seq_lens = vec![0, 1024];
        g.long_seq_lens = vec![];
        let (points, bad) = g.points();
        // D = 64 and N = 1024 is the one good point; D = 512 divides 2048 but exceeds MAX_HEAD_DIM.
        assert_eq!(points.len(), 1);
        assert_eq!(points[0].head_dim, 64);
        assert_eq!(points[0].seq, 1024);
        assert_eq!(bad.len(), 5);
        assert!(bad
            .iter()
            .any(|b| b.reason.contains("not a multiple of head dim 96")));
        assert!(bad.iter().any(|b| b.reason.contains("head_dim")));
        assert!(bad.iter().any(|b| b.reason.contains("sequence length 0")));
    }

    #[test]
    fn overrides_replace_the_convention() {
        let mut g = GridConfig::flash();
        g.batch = Some(3);
        g.heads = Some(5);
        assert_eq!(g.batch_heads(512, 128), Ok((3, 5)));
        g.batch = Some(0);
        assert!(g.batch_heads(512, 128).is_err());
    }

    #[test]
    fn labels_round_trip() {
        for f in FamilyId::ALL {
            assert_eq!(f.label().parse::<FamilyId>(), Ok(f));
        }
        for p in PassKind::ALL {
            assert_eq!(p.label().parse::<PassKind>(), Ok(p));
        }
        assert!("fwd+bwd".parse::<PassKind>().is_err());
    }
}
