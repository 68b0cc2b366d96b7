//! What a run measures: a preset's named sections, each made of one or more grids.
//!
//! The single-grid presets (`flash`, `cpu-small`) have one section, `grid`. The GPU presets split
//! the GPU programme (the figures of docs/performance.md) into sections that can be selected (`--sections`) so that a run fits
//! in one device call or is split across two:
//!
//! - `flash`: softmax, cosine-sim and both hyperbolic scores on the FlashAttention convention (bf16,
//!   `B = 16384 / N`, `H = 2048 / D`, D ∈ {64, 128}, N = 512 … 16384, causal and not, fwd and fwd_bwd);
//! - `taylor`: Taylor order 1 and 2 at D = 64, N = 1024 … 65536 (B = 1 beyond 16384), causal and
//!   not, with softmax on the same points for the crossover;
//! - `memory`: B = 1, H = 8, causal fwd_bwd at N = 131072, D = 128 for softmax and at
//!   N = 1 048 576, D = 64 for Taylor order 1 and 2 (memory O(N·D) where materialised attention
//!   would need B·H·N² scores).
//!
//! `gpu-smoke` has the same sections at toy sizes, so the GPU script's whole path can be exercised
//! on a CPU. A point that appears in two sections is measured once, in the first.
//!
//! The `decode` preset measures attention against a KV cache (bf16, softmax, causal bottom-right,
//! forward), in its own sections:
//!
//! - `decode`: one query per sequence, (B, Hq, Hkv, T, D) = (1, 32, 8, 32k, 128), (1, 32, 8, 128k, 128),
//!   (8, 32, 8, 8k, 128), (32, 32, 8, 4k, 128), (64, 32, 8, 2k, 128), (1, 32, 32, 16k, 64),
//!   (16, 32, 32, 4k, 64); and 8 and 128 queries against 16k and 32k keys (B = 1, Hq = 32, Hkv = 8,
//!   D = 128: speculative decoding, chunked prefill). Dense `[B, N, H, D]` k and v: attn-cuda's
//!   ordinary forward;
//! - `decode-paged`: the one-query shapes with the keys in a paged cache of 16 and 256 tokens per
//!   page (attn-cuda's kv-cache API; `impls::prepare_paged`).
//!
//! `decode-smoke` has the same sections at toy sizes.
//!
//! `cpu-decode` is the decode section at sizes two CPU cores finish in about two minutes: one
//! query per sequence, f32 and bf16, B = 1, D = 128, (Hq, Hkv) = (32, 8) and (8, 8), T = 4096,
//! 16384 and 32768 keys (dense k and v: attn-cpu-fast's forward with one query, candle's
//! composite over the same keys).

use crate::grid::{BadPoint, FamilyId, GridConfig, GridPoint, PassKind};
use attn_core::DType;
use std::collections::HashSet;
use std::str::FromStr;

/// Named starting points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// One grid: FlashAttention's benchmark convention over every family ([`GridConfig::flash`]).
    Flash,
    /// One grid the CPU reference finishes in minutes ([`GridConfig::cpu_small`]).
    CpuSmall,
    /// The H100 programme in sections `flash`, `taylor`, `memory` (module doc).
    H100,
    /// The H100 sections at toy sizes, for a dry run of the GPU script on a CPU.
    GpuSmoke,
    /// Decode against a KV cache: sections `decode` and `decode-paged` (module doc).
    Decode,
    /// The decode sections at toy sizes.
    DecodeSmoke,
    /// The decode section at CPU sizes (module doc).
    CpuDecode,
}

impl Preset {
    pub const ALL: [Preset; 7] = [
        Preset::Flash,
        Preset::CpuSmall,
        Preset::H100,
        Preset::GpuSmoke,
        Preset::Decode,
        Preset::DecodeSmoke,
        Preset::CpuDecode,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Preset::Flash => "flash",
            Preset::CpuSmall => "cpu-small",
            Preset::H100 => "h100",
            Preset::GpuSmoke => "gpu-smoke",
            Preset::Decode => "decode",
            Preset::DecodeSmoke => "decode-smoke",
            Preset::CpuDecode => "cpu-decode",
        }
    }
}

impl FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Preset::ALL.into_iter().find(|p| p.label() == s).ok_or_else(|| {
            let known: Vec<&str> = Preset::ALL.iter().map(|p| p.label()).collect();
            format!("unknown preset `{s}` (known: {})", known.join(", "))
        })
    }
}

/// A named part of a plan: grids, and points listed one by one (the decode shapes).
#[derive(Clone, Debug, PartialEq)]
pub struct Section {
    pub name: String,
    pub grids: Vec<GridConfig>,
    pub points: Vec<GridPoint>,
}

/// A point of a plan with the section it belongs to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlannedPoint<'a> {
    pub section: &'a str,
    pub point: GridPoint,
}

/// Keep only the listed values of each dimension (`None`: keep all).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    pub families: Option<Vec<FamilyId>>,
    pub dtypes: Option<Vec<DType>>,
    pub head_dims: Option<Vec<usize>>,
    pub causal: Option<Vec<bool>>,
    pub passes: Option<Vec<PassKind>>,
}

fn keep<T: PartialEq>(v: &mut Vec<T>, allowed: &Option<Vec<T>>) {
    if let Some(allowed) = allowed {
        v.retain(|x| allowed.contains(x));
    }
}

/// Sections in measurement order.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub sections: Vec<Section>,
}

const FLASH_N: [usize; 6] = [512, 1024, 2048, 4096, 8192, 16384];
const TAYLOR_N: [usize; 7] = [1024, 2048, 4096, 8192, 16384, 32768, 65536];

/// A grid of the FlashAttention convention with the given lists (no long-N extension).
fn convention(
    families: &[FamilyId],
    head_dims: &[usize],
    seq_lens: &[usize],
    tokens: usize,
    hidden: usize,
) -> GridConfig {
    GridConfig {
        families: families.to_vec(),
        dtypes: vec![DType::BF16],
        head_dims: head_dims.to_vec(),
        causal: vec![false, true],
        passes: vec![PassKind::Fwd, PassKind::FwdBwd],
        seq_lens: seq_lens.to_vec(),
        long_seq_lens: Vec::new(),
        long_families: Vec::new(),
        tokens,
        hidden,
        batch: None,
        heads: None,
    }
}

/// One causal fwd_bwd point per family at fixed B, H (a memory point).
fn memory_point(families: &[FamilyId], heads: usize, n: usize, d: usize) -> GridConfig {
    GridConfig {
        causal: vec![true],
        passes: vec![PassKind::FwdBwd],
        batch: Some(1),
        heads: Some(heads),
        ..convention(families, &[d], &[n], n, heads * d)
    }
}

const SOFTMAX_LIKE: [FamilyId; 4] = [
    FamilyId::Softmax,
    FamilyId::CosineSim,
    FamilyId::HyperbolicGeodesic,
    FamilyId::HyperbolicSqLorentz,
];
const TAYLOR_AND_SOFTMAX: [FamilyId; 3] = [FamilyId::Taylor1, FamilyId::Taylor2, FamilyId::Softmax];
const TAYLOR: [FamilyId; 2] = [FamilyId::Taylor1, FamilyId::Taylor2];

/// One query against a KV cache: (B, Hq, Hkv, T, D).
const DECODE_SHAPES: [(usize, usize, usize, usize, usize); 7] = [
    (1, 32, 8, 32 << 10, 128),
    (1, 32, 8, 128 << 10, 128),
    (8, 32, 8, 8 << 10, 128),
    (32, 32, 8, 4 << 10, 128),
    (64, 32, 8, 2 << 10, 128),
    (1, 32, 32, 16 << 10, 64),
    (16, 32, 32, 4 << 10, 64),
];
/// Several queries against a cache (B = 1, Hq = 32, Hkv = 8, D = 128): (Nq, T).
const MULTI_QUERY: [(usize, usize); 4] = [(8, 16 << 10), (8, 32 << 10), (128, 16 << 10), (128, 32 << 10)];
const PAGE_SIZES: [usize; 2] = [16, 256];

/// The decode sections from the one-query shapes `one`, the several-query points `multi` (B, Hq,
/// Hkv, D of the first one-query shape) and the page sizes.
fn decode_sections(
    one: &[(usize, usize, usize, usize, usize)],
    multi: &[(usize, usize)],
    pages: &[usize],
) -> Vec<Section> {
    let point = |(b, hq, hkv, t, d): (usize, usize, usize, usize, usize), nq, page| {
        GridPoint::decode(FamilyId::Softmax, DType::BF16, b, hq, hkv, nq, t, d, page)
    };
    let mut dense: Vec<GridPoint> = one.iter().map(|&s| point(s, 1, None)).collect();
    if let Some(&(_, hq, hkv, _, d)) = one.first() {
        dense.extend(multi.iter().map(|&(nq, t)| point((1, hq, hkv, t, d), nq, None)));
    }
    let paged = pages
        .iter()
        .flat_map(|&ps| one.iter().map(move |&s| point(s, 1, Some(ps))))
        .collect();
    vec![
        Section {
            name: "decode".into(),
            grids: Vec::new(),
            points: dense,
        },
        Section {
            name: "decode-paged".into(),
            grids: Vec::new(),
            points: paged,
        },
    ]
}

/// One query against a KV cache on the CPU: (Hq, Hkv) at B = 1, D = 128, and the key counts.
const CPU_DECODE_HEADS: [(usize, usize); 2] = [(32, 8), (8, 8)];
const CPU_DECODE_T: [usize; 3] = [4 << 10, 16 << 10, 32 << 10];

/// The `cpu-decode` section: f32 and bf16, every (Hq, Hkv) and T above.
fn cpu_decode_section() -> Section {
    let mut points = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        for (hq, hkv) in CPU_DECODE_HEADS {
            for t in CPU_DECODE_T {
                points.push(GridPoint::decode(
                    FamilyId::Softmax,
                    dtype,
                    1,
                    hq,
                    hkv,
                    1,
                    t,
                    128,
                    None,
                ));
            }
        }
    }
    Section {
        name: "decode".into(),
        grids: Vec::new(),
        points,
    }
}

impl Plan {
    /// A plan of one section, `grid`.
    pub fn single(grid: GridConfig) -> Self {
        Plan {
            sections: vec![Section {
                name: "grid".into(),
                grids: vec![grid],
                points: Vec::new(),
            }],
        }
    }

    /// The plan a preset starts from.
    ///
    /// ```
    /// use attn_bench::plan::{Plan, Preset};
    /// let p = Plan::preset(Preset::H100);
    /// assert_eq!(p.section_names(), vec!["flash", "taylor", "memory"]);
    /// ```
    pub fn preset(preset: Preset) -> Self {
        let section = |name: &str, grids: Vec<GridConfig>| Section {
            name: name.into(),
            grids,
            points: Vec::new(),
        };
        match preset {
            Preset::Flash => Plan::single(GridConfig::flash()),
            Preset::CpuSmall => Plan::single(GridConfig::cpu_small()),
            Preset::H100 => Plan {
                sections: vec![
                    section(
                        "flash",
                        vec![convention(&SOFTMAX_LIKE, &[64, 128], &FLASH_N, 16384, 2048)],
                    ),
                    section(
                        "taylor",
                        vec![convention(&TAYLOR_AND_SOFTMAX, &[64], &TAYLOR_N, 16384, 2048)],
                    ),
                    section(
                        "memory",
                        vec![
                            memory_point(&[FamilyId::Softmax], 8, 131_072, 128),
                            memory_point(&TAYLOR, 8, 1 << 20, 64),
                        ],
                    ),
                ],
            },
            Preset::GpuSmoke => Plan {
                sections: vec![
                    section(
                        "flash",
                        vec![convention(&SOFTMAX_LIKE, &[32, 64], &[32, 64], 128, 128)],
                    ),
                    section(
                        "taylor",
                        vec![convention(
                            &TAYLOR_AND_SOFTMAX,
                            &[32],
                            &[32, 64, 128, 256],
                            128,
                            64,
                        )],
                    ),
                    section(
                        "memory",
                        vec![
                            memory_point(&[FamilyId::Softmax], 2, 512, 64),
                            memory_point(&TAYLOR, 2, 2048, 32),
                        ],
                    ),
                ],
            },
            Preset::Decode => Plan {
                sections: decode_sections(&DECODE_SHAPES, &MULTI_QUERY, &PAGE_SIZES),
            },
            Preset::DecodeSmoke => Plan {
                sections: decode_sections(
                    &[(1, 4, 2, 256, 64), (2, 4, 2, 128, 64), (1, 4, 4, 128, 32)],
                    &[(8, 256), (32, 256)],
                    &PAGE_SIZES,
                ),
            },
            Preset::CpuDecode => Plan {
                sections: vec![cpu_decode_section()],
            },
        }
    }

    pub fn section_names(&self) -> Vec<&str> {
        self.sections.iter().map(|s| s.name.as_str()).collect()
    }

    /// Keep the named sections, in the plan's order; an unknown name is an error listing the known.
    pub fn select(&mut self, names: &[String]) -> Result<(), String> {
        let known = self.section_names().join(", ");
        for n in names {
            if !self.sections.iter().any(|s| &s.name == n) {
                return Err(format!("unknown section `{n}` (this preset has: {known})"));
            }
        }
        self.sections.retain(|s| names.contains(&s.name));
        Ok(())
    }

    /// Narrow every grid to the filter's values.
    pub fn filter(&mut self, f: &Filter) {
        for g in self.sections.iter_mut().flat_map(|s| s.grids.iter_mut()) {
            keep(&mut g.families, &f.families);
            keep(&mut g.long_families, &f.families);
            keep(&mut g.dtypes, &f.dtypes);
            keep(&mut g.head_dims, &f.head_dims);
            keep(&mut g.causal, &f.causal);
            keep(&mut g.passes, &f.passes);
        }
        let allowed = |v, list: &Option<Vec<_>>| list.as_ref().is_none_or(|l: &Vec<_>| l.contains(&v));
        for s in &mut self.sections {
            s.points.retain(|p| {
                allowed(p.family, &f.families)
                    && f.dtypes.as_ref().is_none_or(|l| l.contains(&p.dtype))
                    && f.head_dims.as_ref().is_none_or(|l| l.contains(&p.head_dim))
                    && f.causal.as_ref().is_none_or(|l| l.contains(&p.causal))
                    && f.passes.as_ref().is_none_or(|l| l.contains(&p.pass))
            });
        }
    }

    /// Every point in measurement order (sections in order, each grid's own order), a point that
    /// an earlier section already holds left out; and the points that cannot be built.
    pub fn points(&self) -> (Vec<PlannedPoint<'_>>, Vec<BadPoint>) {
        let mut seen = HashSet::new();
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for s in &self.sections {
            let mut listed = Vec::new();
            for p in &s.points {
                match p.spec() {
                    Ok(_) => listed.push(*p),
                    Err(e) => bad.push(BadPoint {
                        what: p.to_string(),
                        reason: e.to_string(),
                    }),
                }
            }
            for g in &s.grids {
                let (points, b) = g.points();
                bad.extend(b);
                listed.extend(points);
            }
            for p in listed {
                if seen.insert(p) {
                    good.push(PlannedPoint {
                        section: &s.name,
                        point: p,
                    });
                }
            }
        }
        (good, bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flops::{bytes_moved, pass_flops};

    fn in_section<'a>(pts: &'a [PlannedPoint<'a>], name: &str) -> Vec<&'a GridPoint> {
        pts.iter()
            .filter(|p| p.section == name)
            .map(|p| &p.point)
            .collect()
    }

    #[test]
    fn h100_flash_section_is_the_flash_attention_grid() {
        let plan = Plan::preset(Preset::H100);
        let (pts, bad) = plan.points();
        assert!(bad.is_empty(), "{bad:?}");
        let flash = in_section(&pts, "flash");
        // 4 families × 2 D × 2 causal × 6 N × 2 passes.
        assert_eq!(flash.len(), 4 * 2 * 2 * 6 * 2);
        for p in &flash {
            assert_eq!(p.dtype, DType::BF16);
            assert_eq!(p.batch * p.seq, 16384, "{p}");
            assert_eq!(p.heads_q * p.head_dim, 2048, "{p}");
            assert!(!p.family.is_linear());
            assert!(matches!(p.pass, PassKind::Fwd | PassKind::FwdBwd));
        }
        for f in SOFTMAX_LIKE {
            assert!(flash.iter().any(|p| p.family == f), "{f}");
        }
    }

    #[test]
    fn h100_taylor_section_has_the_long_n_points_and_softmax_beyond_the_flash_grid() {
        let plan = Plan::preset(Preset::H100);
        let (pts, _) = plan.points();
        let taylor = in_section(&pts, "taylor");
        // Taylor: 2 orders × 7 N × 2 causal × 2 passes; softmax D = 64 up to N = 16384 is already
        // in the flash section, so only N = 32768 and 65536 are new: 2 N × 2 causal × 2 passes.
        assert_eq!(taylor.len(), 2 * 7 * 2 * 2 + 2 * 2 * 2);
        for p in &taylor {
            assert_eq!(p.head_dim, 64);
            assert_eq!(p.heads_q, 32);
            assert_eq!(p.batch, (16384 / p.seq).max(1), "{p}");
            if p.family == FamilyId::Softmax {
                assert!(p.seq > 16384, "{p}");
            }
        }
        // The crossover has softmax on every Taylor N once both sections are counted.
        for n in TAYLOR_N {
            for causal in [false, true] {
                assert!(pts.iter().any(|p| p.point.family == FamilyId::Softmax
                    && p.point.head_dim == 64
                    && p.point.seq == n
                    && p.point.causal == causal));
            }
        }
    }

    #[test]
    fn h100_memory_section_is_three_causal_fwd_bwd_points() {
        let plan = Plan::preset(Preset::H100);
        let (pts, _) = plan.points();
        let mem = in_section(&pts, "memory");
        let got: Vec<(FamilyId, usize, usize, usize, usize)> = mem
            .iter()
            .map(|p| (p.family, p.batch, p.heads_q, p.seq, p.head_dim))
            .collect();
        assert_eq!(
            got,
            vec![
                (FamilyId::Softmax, 1, 8, 131_072, 128),
                (FamilyId::Taylor1, 1, 8, 1_048_576, 64),
                (FamilyId::Taylor2, 1, 8, 1_048_576, 64),
            ]
        );
        assert!(mem.iter().all(|p| p.causal && p.pass == PassKind::FwdBwd));
        // Work of the softmax point: 3.5 · 4·B·H·N²·D / 2 (causal).
        let s = mem[0].shape();
        let expect = 3.5 * 4.0 * 8.0 * 131_072f64.powi(2) * 128.0 / 2.0;
        assert_eq!(pass_flops(FamilyId::Softmax, PassKind::FwdBwd, &s), expect);
        // Bytes of the order-2 point: fwd (q, k, v, o, stats) + bwd (q, k, v, o, dO, stats, dq, dk, dv).
        let t = mem[2].shape();
        let elems = (1usize << 20) as f64 * 8.0 * 64.0;
        let stats = (1usize << 20) as f64 * 8.0 * 4.0;
        assert_eq!(
            bytes_moved(PassKind::FwdBwd, &t, 2),
            (4.0 * elems * 2.0 + stats) + (8.0 * elems * 2.0 + stats)
        );
    }

    #[test]
    fn h100_flops_of_the_whole_plan_fit_a_few_minutes() {
        // At 150 TFLOP/s (below our kernels' measured rates) 33 calls of every point must take
        // under ~4 minutes of kernel time; the Taylor points are bandwidth-bound and small here.
        let plan = Plan::preset(Preset::H100);
        let (pts, _) = plan.points();
        let flops: f64 = pts
            .iter()
            .map(|p| pass_flops(p.point.family, p.point.pass, &p.point.shape()))
            .sum();
        let seconds = 33.0 * flops / 150e12;
        assert!(seconds < 240.0, "{seconds:.0} s");
        assert!(seconds > 60.0, "{seconds:.0} s: the grid lost points");
    }

    #[test]
    fn sections_select_and_filter() {
        let mut plan = Plan::preset(Preset::H100);
        assert!(plan.select(&["flash".into(), "nope".into()]).is_err());
        plan.select(&["memory".into(), "taylor".into()])
            .expect("known sections");
        assert_eq!(plan.section_names(), vec!["taylor", "memory"]);
        plan.filter(&Filter {
            families: Some(vec![FamilyId::Taylor2]),
            passes: Some(vec![PassKind::FwdBwd]),
            ..Filter::default()
        });
        let (pts, _) = plan.points();
        assert_eq!(pts.len(), 7 * 2 + 1);
        assert!(pts
            .iter()
            .all(|p| p.point.family == FamilyId::Taylor2 && p.point.pass == PassKind::FwdBwd));
    }

    #[test]
    fn smoke_preset_mirrors_the_h100_sections() {
        let h100 = Plan::preset(Preset::H100);
        let smoke = Plan::preset(Preset::GpuSmoke);
        assert_eq!(h100.section_names(), smoke.section_names());
        let (pts, bad) = smoke.points();
        assert!(bad.is_empty(), "{bad:?}");
        for name in smoke.section_names() {
            let fam = |pts: &[PlannedPoint<'_>]| -> HashSet<FamilyId> {
                pts.iter()
                    .filter(|p| p.section == name)
                    .map(|p| p.point.family)
                    .collect()
            };
            assert_eq!(fam(&pts), fam(&h100.points().0), "{name}");
        }
        assert!(pts.iter().all(|p| p.point.seq <= 2048));
    }

    #[test]
    fn decode_preset_has_the_issue_shapes_and_paged_variants() {
        let plan = Plan::preset(Preset::Decode);
        assert_eq!(plan.section_names(), vec!["decode", "decode-paged"]);
        let (pts, bad) = plan.points();
        assert!(bad.is_empty(), "{bad:?}");
        let dense = in_section(&pts, "decode");
        let got: Vec<(usize, usize, usize, usize, usize, usize)> = dense
            .iter()
            .map(|p| (p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq, p.head_dim))
            .collect();
        let k = 1024;
        assert_eq!(
            got,
            vec![
                (1, 32, 8, 1, 32 * k, 128),
                (1, 32, 8, 1, 128 * k, 128),
                (8, 32, 8, 1, 8 * k, 128),
                (32, 32, 8, 1, 4 * k, 128),
                (64, 32, 8, 1, 2 * k, 128),
                (1, 32, 32, 1, 16 * k, 64),
                (16, 32, 32, 1, 4 * k, 64),
                (1, 32, 8, 8, 16 * k, 128),
                (1, 32, 8, 8, 32 * k, 128),
                (1, 32, 8, 128, 16 * k, 128),
                (1, 32, 8, 128, 32 * k, 128),
            ]
        );
        for p in &dense {
            assert_eq!(
                (p.family, p.dtype, p.pass),
                (FamilyId::Softmax, DType::BF16, PassKind::Fwd)
            );
            assert!(p.causal && p.is_decode() && p.page_size.is_none());
            let spec = p.spec().expect("valid");
            assert_eq!(spec.causal(), attn_core::Causal::BottomRight, "{p}");
        }
        let paged = in_section(&pts, "decode-paged");
        assert_eq!(paged.len(), 2 * 7);
        for ps in PAGE_SIZES {
            assert_eq!(paged.iter().filter(|p| p.page_size == Some(ps)).count(), 7);
        }
        assert!(paged.iter().all(|p| p.seq_q == 1));
        assert_eq!(paged[0].impl_label("attn-cuda"), "attn-cuda-paged16");
        // The smoke preset mirrors the sections at sizes a CPU runs.
        let smoke = Plan::preset(Preset::DecodeSmoke);
        assert_eq!(smoke.section_names(), plan.section_names());
        let (pts, bad) = smoke.points();
        assert!(bad.is_empty(), "{bad:?}");
        assert!(pts.iter().all(|p| p.point.seq <= 256 && p.point.is_decode()));
    }

    #[test]
    fn cpu_decode_preset_is_one_query_against_4k_to_32k_keys_in_f32_and_bf16() {
        let plan = Plan::preset(Preset::CpuDecode);
        assert_eq!(plan.section_names(), vec!["decode"]);
        let (pts, bad) = plan.points();
        assert!(bad.is_empty(), "{bad:?}");
        let pts = in_section(&pts, "decode");
        assert_eq!(pts.len(), 2 * 2 * 3);
        for p in &pts {
            assert!(p.is_decode() && p.causal && p.page_size.is_none(), "{p}");
            assert_eq!(
                (p.batch, p.seq_q, p.head_dim, p.pass),
                (1, 1, 128, PassKind::Fwd),
                "{p}"
            );
            assert!((4096..=32768).contains(&p.seq), "{p}");
        }
        for dtype in [DType::F32, DType::BF16] {
            for (hq, hkv) in [(32, 8), (8, 8)] {
                let t: Vec<usize> = pts
                    .iter()
                    .filter(|p| p.dtype == dtype && (p.heads_q, p.heads_kv) == (hq, hkv))
                    .map(|p| p.seq)
                    .collect();
                assert_eq!(t, vec![4096, 16384, 32768], "{dtype} {hq}/{hkv}");
            }
        }
        // --dtypes narrows the points.
        let mut plan = Plan::preset(Preset::CpuDecode);
        plan.filter(&Filter {
            dtypes: Some(vec![DType::F32]),
            ..Filter::default()
        });
        let (pts, _) = plan.points();
        assert_eq!(pts.len(), 6);
        assert!(pts.iter().all(|p| p.point.dtype == DType::F32));
    }

    #[test]
    fn decode_bytes_are_the_cache_read_once_and_flops_count_every_key() {
        let p = GridPoint::decode(FamilyId::Softmax, DType::BF16, 1, 32, 8, 1, 32768, 128, None);
        let s = p.shape();
        // K and V: 2 · 8·32768·128 bf16 = 128 MiB; q and o 2 · 32·128 bf16; the LSE 32 f32.
        let kv = 2.0 * 8.0 * 32768.0 * 128.0 * 2.0;
        let qo = 2.0 * 32.0 * 128.0 * 2.0;
        assert_eq!(bytes_moved(PassKind::Fwd, &s, 2), kv + qo + 32.0 * 4.0);
        assert_eq!(
            pass_flops(FamilyId::Softmax, PassKind::Fwd, &s),
            4.0 * 32.0 * 32768.0 * 128.0
        );
    }

    #[test]
    fn single_presets_have_one_section() {
        for p in [Preset::Flash, Preset::CpuSmall] {
            assert_eq!(Plan::preset(p).section_names(), vec!["grid"]);
        }
        for p in Preset::ALL {
            assert_eq!(p.label().parse::<Preset>(), Ok(p));
        }
        assert!("h200".parse::<Preset>().is_err());
    }
}
