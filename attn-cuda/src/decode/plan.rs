//! Host planning of the decode kernels, pure functions tested on the CPU: which calls they take
//! ([`unsupported`], [`route`]), their tile constants (mirrors of `kernels/decode/decode_fwd.cuh`)
//! and the number of key chunks per (sequence, kv head, row tile) ([`splits`]).

use crate::config::{KernelConfig, Route};
use attn_core::{AttnSpec, DType, FamilySpec, SeqLengths};

/// Rows of one tile (query heads of a kv head × queries): one mma M (`kRows`).
pub(crate) const ROWS: usize = 16;
/// Keys of one warp's K/V tile (`kWarpKeys`).
pub(crate) const WARP_KEYS: usize = 16;
/// Warps of the forward block (`kWarps`).
pub(crate) const WARPS: usize = 4;
/// Keys the block's warps take per round (`kKeys`): the unit of a key chunk.
pub(crate) const KEYS: usize = WARP_KEYS * WARPS;
/// Threads of the forward block (`kThreads`).
pub(crate) const THREADS: u32 = 128;
/// Head dims the decode kernels are compiled for (D = Dv): the flash kernels' (16 for cosine-sim
/// only; `dispatch::check_supported` applies each family's list first).
pub(crate) const HEAD_DIMS: [usize; 6] = [16, 32, 64, 96, 128, 256];
/// The most rows per kv head (queries × group) that [`Route::Measured`] sends to the decode kernels:
/// up to four row tiles, each re-reading the keys its chunk covers (at 64 rows the flash kernels'
/// tiles are full enough that splitting the keys is no longer what the grid lacks).
pub(crate) const MEASURED_MAX_ROWS: usize = 64;
/// A chunk holds at least this many key rounds (256 keys) unless the keys are fewer: each block
/// then streams long enough for its pipeline to pay for its prologue and its partial output.
pub(crate) const MIN_TILES_PER_CHUNK: usize = 4;
/// The most key chunks: bounds the workspace (S × rows × Dv f32) and the combine's loop.
pub(crate) const MAX_SPLITS: usize = 1024;

/// The smallest head dim whose K/V rows are loaded by bulk copies where the Hopper kernels are on;
/// below it the coalesced cp.async loads. H200, 2026-12-04 (bf16, Nq = 1, µs, bulk / cp.async,
/// `gpu_bench_decode`): D = 128 (1, 32, 8, 32k) 58.5 / 73.8, (32, 32, 8, 4k) 139.8 / 151.5, bulk
/// 8–26% faster; D = 64 (1, 32, 32, 16k) 59.9 / 53.7, (16, 32, 32, 4k) 163.2 / 141.2, cp.async
/// 11–15% faster (half the bytes per row copy, the same count of copies per byte).
pub(crate) const BULK_MIN_HEAD_DIM: usize = 128;

/// Whether a forward at head dim `d` loads K and V by bulk copies where the Hopper kernels are on.
pub(crate) fn bulk_loads(d: usize) -> bool {
    d >= BULK_MIN_HEAD_DIM
}

/// Stages of each warp's K/V ring (`Cfg<D>::kStages`): two at D = 64 and 256, three elsewhere.
pub(crate) fn stages(d: usize) -> usize {
    if d == 64 || d >= 256 {
        2
    } else {
        3
    }
}

/// Dynamic shared memory of the forward at head dim `d` (`Cfg<D>::kBytes`): the Q tile and the
/// warps' K/V rings (bf16/f16 rows padded to D + 8), f32 row scalars and merge maxima and sums, then
/// one 8-byte mbarrier per (warp, stage) at an 8-byte boundary.
pub(crate) fn smem_bytes(d: usize) -> usize {
    let ld = d + 8;
    let elems = ROWS * ld + WARPS * stages(d) * 2 * WARP_KEYS * ld;
    let floats = ROWS + 2 * WARPS * ROWS;
    (elems * 2 + floats * 4).div_ceil(8) * 8 + WARPS * stages(d) * 8
}

/// Row tiles per kv head: ⌈seq_q·group / 16⌉.
pub(crate) fn row_tiles(seq_q: usize, group: usize) -> usize {
    seq_q.saturating_mul(group).div_ceil(ROWS).max(1)
}

/// How the keys of one (sequence, kv head, row tile) are split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Split {
    /// Chunks (S ≥ 1); every chunk holds at least one key tile of `seq_k`.
    pub splits: usize,
    /// Keys per chunk, a multiple of [`KEYS`].
    pub chunk: usize,
}

/// The split of `seq_k` keys for a grid of `blocks` = B·Hkv·row_tiles blocks per chunk, with
/// `slots` blocks resident at once on the device (blocks per SM × SMs): S = ⌊slots / blocks⌋, so
/// the grid is one wave that fills the device (a second, partial wave would cost a whole chunk's
/// time for a few blocks), at most the key rounds over [`MIN_TILES_PER_CHUNK`], at least 1;
/// `forced` (KernelConfig::decode_splits) replaces the heuristic and is clamped to the key rounds.
/// S is then reduced so that no chunk is empty.
///
/// H200, bf16, Nq = 1, the best of S = 1 … 64 measured (docs/kernels/decode.md) is the one-wave
/// count at every shape of issue 43: (8, 32, 8, 8k, 128) at two blocks per SM: S = 4 (256 blocks),
/// 80.6 µs, against 99.5 at S = 3 and 117 at S = 5; (64, 32, 8, 2k, 128): 512 blocks, S = 1.
pub(crate) fn splits(blocks: usize, seq_k: usize, slots: usize, forced: Option<usize>) -> Split {
    let tiles = seq_k.div_ceil(KEYS).max(1);
    let want = forced.unwrap_or_else(|| (slots / blocks.max(1)).min(tiles / MIN_TILES_PER_CHUNK));
    let want = want.clamp(1, tiles.min(MAX_SPLITS));
    let chunk_tiles = tiles.div_ceil(want);
    Split {
        splits: tiles.div_ceil(chunk_tiles),
        chunk: chunk_tiles * KEYS,
    }
}

/// Why the decode kernels cannot run `spec`, or `None` when they can: a softmax-like family, a
/// compiled head dim with Dv = D, no bias, dense or key-padded (not packed varlen) sequences. f16
/// and bf16 run on the tensor cores, f32 on the CUDA cores (exact, slower).
pub(crate) fn unsupported(spec: &AttnSpec) -> Option<String> {
    if matches!(spec.family(), FamilySpec::Taylor { .. }) {
        return Some("Taylor attention (it decodes through its recurrent state)".into());
    }
    if !HEAD_DIMS.contains(&spec.head_dim()) || spec.head_dim_v() != spec.head_dim() {
        return Some(format!(
            "head dims {}/{} (the decode kernels have {HEAD_DIMS:?} with Dv = D)",
            spec.head_dim(),
            spec.head_dim_v()
        ));
    }
    if spec.bias().is_some() {
        return Some("an additive bias".into());
    }
    if matches!(spec.lengths(), SeqLengths::Varlen { .. }) {
        return Some("packed variable-length sequences".into());
    }
    if spec
        .seq_q()
        .checked_mul(spec.group())
        .is_none_or(|r| r > i32::MAX as usize)
    {
        return Some("seq_q·group past i32".into());
    }
    None
}

/// Whether a forward of `spec` runs on the decode kernels under `config` ([`KernelConfig::decode`]):
/// `Measured` takes f16/bf16 calls with at most [`MEASURED_MAX_ROWS`] rows per kv head (f32 keeps
/// the flash path's SIMT kernels), `Everywhere` every call the kernels support.
pub(crate) fn route(spec: &AttnSpec, config: &KernelConfig) -> bool {
    // KernelConfig::hyperbolic_exact: the decode kernels' hyperbolic score is the tensor cores'.
    if config.hyperbolic_exact && matches!(spec.family(), attn_core::FamilySpec::Hyperbolic { .. }) {
        return false;
    }
    match config.decode {
        Route::Off => false,
        Route::Everywhere => unsupported(spec).is_none(),
        Route::Measured => {
            unsupported(spec).is_none()
                && spec.dtype() != DType::F32
                && spec.seq_q().saturating_mul(spec.group()) <= MEASURED_MAX_ROWS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_core::{AttnProblem, Causal, Family};

    fn spec(dtype: DType, hq: usize, hkv: usize, nq: usize, nk: usize, d: usize) -> AttnSpec {
        AttnProblem::new(Family::softmax(), dtype, 1, hq, hkv, nq, nk, d)
            .with_causal(Causal::BottomRight)
            .validate()
            .expect("valid")
    }

    #[test]
    fn smem_fits_the_h200_and_matches_the_kernel_layout() {
        // Q 16 × 136 and 4 warps × 3 stages × (K, V) × 16 × 136 f16, then 16 + 2·4·16 f32 and 12
        // mbarriers at D = 128: 107 KiB, two blocks per SM (228 KiB, 1 KiB reserved per block).
        assert_eq!(
            smem_bytes(128),
            (16 * 136 + 4 * 3 * 2 * 16 * 136) * 2 + (16 + 128) * 4 + 12 * 8
        );
        assert!(2 * (smem_bytes(128) + 1024) <= 228 * 1024);
        // D = 64, two stages: four blocks per SM.
        assert!(4 * (smem_bytes(64) + 1024) <= 228 * 1024);
        for d in HEAD_DIMS {
            assert!(smem_bytes(d) <= 227 * 1024, "{d}");
            // The merge scratch (4 warps × 16 rows × D f32) fits the rings.
            assert!(
                WARPS * ROWS * d * 4 <= WARPS * stages(d) * 2 * WARP_KEYS * (d + 8) * 2,
                "{d}"
            );
        }
    }

    #[test]
    fn bulk_copies_only_for_rows_of_128_elements_and_more() {
        for (d, bulk) in [
            (16, false),
            (32, false),
            (64, false),
            (96, false),
            (128, true),
            (256, true),
        ] {
            assert_eq!(bulk_loads(d), bulk, "{d}");
        }
    }

    #[test]
    fn splits_fill_one_wave_with_chunks_of_several_tiles() {
        // (1, 32, 8, 32k, 128), one query, two blocks per SM on 132 SMs: 8 blocks per chunk, 264
        // slots: 33 chunks wanted of 512 key rounds, 16 rounds each, so 32 chunks of 1024 keys.
        let s = splits(8, 32768, 264, None);
        assert_eq!(
            s,
            Split {
                splits: 32,
                chunk: 1024
            }
        );
        // (8, 32, 8, 8k, 128): 64 blocks per chunk, 4 chunks (256 blocks, one wave; 5 would need two).
        assert_eq!(splits(64, 8192, 264, None).splits, 4);
        // Enough blocks already (B = 64, Hkv = 8): one chunk.
        assert_eq!(splits(512, 2048, 264, None).splits, 1);
        // (1, 32, 32, 16k, 64) at four blocks per SM: 16 chunks (512 blocks).
        assert_eq!(splits(32, 16384, 528, None).splits, 16);
        // Short keys: chunks of at least 4 rounds.
        assert_eq!(
            splits(8, 512, 264, None),
            Split {
                splits: 2,
                chunk: 256
            }
        );
        assert_eq!(splits(8, 100, 264, None).splits, 1);
        // No slot information (0): one chunk.
        assert_eq!(splits(8, 32768, 0, None).splits, 1);
        // Forced counts are clamped to the tiles and never leave a chunk empty.
        for forced in 1..=20 {
            let s = splits(8, 1000, 264, Some(forced));
            assert!(
                s.splits >= 1 && s.splits <= 16 && s.chunk % KEYS == 0,
                "{forced}: {s:?}"
            );
            assert!(
                (s.splits - 1) * s.chunk < 1000 && s.splits * s.chunk >= 1000,
                "{forced}: {s:?}"
            );
        }
        assert_eq!(splits(8, 1000, 264, Some(16)).splits, 16);
    }

    #[test]
    fn routing_takes_decode_sized_supported_calls() {
        let d = KernelConfig::default();
        assert!(route(&spec(DType::BF16, 32, 8, 1, 32768, 128), &d));
        assert!(route(&spec(DType::F16, 32, 8, 16, 4096, 64), &d)); // 64 rows
        assert!(!route(&spec(DType::F16, 32, 8, 17, 4096, 64), &d)); // 68 rows
        assert!(!route(&spec(DType::F32, 32, 8, 1, 4096, 64), &d));
        assert!(route(&spec(DType::BF16, 32, 8, 1, 4096, 96), &d));
        assert!(!route(&spec(DType::BF16, 32, 8, 1, 4096, 80), &d));
        let every = KernelConfig {
            decode: Route::Everywhere,
            ..d
        };
        assert!(route(&spec(DType::F16, 8, 8, 1000, 4096, 64), &every));
        assert!(route(&spec(DType::F32, 32, 8, 1, 4096, 64), &every));
        let off = KernelConfig {
            decode: Route::Off,
            ..d
        };
        assert!(!route(&spec(DType::BF16, 32, 8, 1, 32768, 128), &off));
        // KernelConfig::hyperbolic_exact: hyperbolic calls leave the decode kernels, others stay.
        let geo = AttnProblem::new(
            Family::hyperbolic(attn_core::HypScore::Geodesic, attn_core::Aggregation::Euclidean),
            DType::BF16,
            1,
            32,
            8,
            1,
            4096,
            128,
        )
        .with_causal(Causal::BottomRight)
        .validate()
        .expect("valid");
        let exact = KernelConfig {
            hyperbolic_exact: true,
            ..d
        };
        assert!(route(&geo, &d) && !route(&geo, &exact));
        assert!(route(&spec(DType::BF16, 32, 8, 1, 32768, 128), &exact));
        let biased = AttnProblem::new(Family::softmax(), DType::BF16, 1, 8, 8, 1, 64, 64)
            .with_bias(1, 1)
            .validate()
            .expect("valid");
        assert!(unsupported(&biased).is_some());
        let varlen = AttnProblem::new(Family::softmax(), DType::BF16, 2, 8, 8, 1, 64, 64)
            .with_varlen(vec![0, 1, 2], vec![0, 10, 64])
            .validate()
            .expect("valid varlen");
        assert!(unsupported(&varlen).is_some());
    }

    /// One row's chunk as the forward computes it: keys `[lo, hi)` of `s` (scores) in key tiles, each
    /// 16-key warp slice with its own online softmax in base 2, the warps merged at the end; returns
    /// the chunk's (LSE, o), (−∞, 0) when it holds no allowed key.
    fn chunk(s: &[f64], v: &[f64], lo: usize, hi: usize) -> (f64, f64) {
        let log2e = std::f64::consts::LOG2_E;
        let mut warps = [(f64::NEG_INFINITY, 0.0f64, 0.0f64); 4];
        for j in lo..hi {
            let w = (j % KEYS) / WARP_KEYS;
            let (m, l, o) = &mut warps[w];
            let x = s[j] * log2e;
            let mn = if x > *m || x.is_nan() { x } else { *m };
            let base = if mn == f64::NEG_INFINITY { 0.0 } else { mn };
            let alpha = (*m - base).exp2();
            let p = (x - base).exp2();
            (*m, *l, *o) = (mn, *l * alpha + p, *o * alpha + p * v[j]);
        }
        let mm = warps
            .iter()
            .fold(f64::NEG_INFINITY, |a, w| if w.0 > a { w.0 } else { a });
        let base = if mm == f64::NEG_INFINITY { 0.0 } else { mm };
        let l: f64 = warps.iter().map(|w| w.1 * (w.0 - base).exp2()).sum();
        let o: f64 = warps.iter().map(|w| w.2 * (w.0 - base).exp2()).sum();
        if mm == f64::NEG_INFINITY || l == 0.0 {
            (f64::NEG_INFINITY, 0.0)
        } else {
            ((mm + l.log2()) * std::f64::consts::LN_2, o / l)
        }
    }

    /// decode_combine: LSE = M + log Σ exp(LSE_s − M), o = Σ exp(LSE_s − LSE)·o_s.
    fn combine(parts: &[(f64, f64)]) -> (f64, f64) {
        let m = parts.iter().fold(f64::NEG_INFINITY, |a, p| a.max(p.0));
        if m == f64::NEG_INFINITY {
            return (f64::NEG_INFINITY, 0.0);
        }
        let lse = m + parts.iter().map(|p| (p.0 - m).exp()).sum::<f64>().ln();
        let o = parts
            .iter()
            .filter(|p| p.0 != f64::NEG_INFINITY)
            .map(|p| (p.0 - lse).exp() * p.1)
            .sum();
        (lse, o)
    }

    #[test]
    fn split_and_merge_equal_the_single_pass_softmax() {
        // Scores and values of one row over 1000 keys (a deterministic spread), the allowed keys a
        // window [lo, hi) of them; every split count, including chunks with no allowed key.
        let n = 1000;
        let s: Vec<f64> = (0..n).map(|j| ((j * 7919) % 1009) as f64 / 97.0 - 5.0).collect();
        let v: Vec<f64> = (0..n).map(|j| ((j * 104729) % 101) as f64 / 50.0 - 1.0).collect();
        for (lo, hi) in [(0, n), (0, 0), (130, 131), (333, 999), (640, 700)] {
            let m = s[lo..hi].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let den: f64 = s[lo..hi].iter().map(|x| (x - m).exp()).sum();
            let want_o: f64 = (lo..hi).map(|j| (s[j] - m).exp() * v[j]).sum::<f64>() / den;
            let want_lse = if hi > lo { m + den.ln() } else { f64::NEG_INFINITY };
            for forced in 1..=20 {
                let sp = splits(1, n, 264, Some(forced));
                let parts: Vec<(f64, f64)> = (0..sp.splits)
                    .map(|c| {
                        let (c0, c1) = (c * sp.chunk, ((c + 1) * sp.chunk).min(n));
                        chunk(&s, &v, lo.max(c0), hi.min(c1).max(lo.max(c0)))
                    })
                    .collect();
                let (lse, o) = combine(&parts);
                let case = format!("keys {lo}..{hi}, {} chunks", sp.splits);
                if hi == lo {
                    assert_eq!((lse, o), (f64::NEG_INFINITY, 0.0), "{case}");
                } else {
                    assert!(
                        (lse - want_lse).abs() < 1e-12 * want_lse.abs().max(1.0),
                        "{case}: {lse} vs {want_lse}"
                    );
                    assert!((o - want_o).abs() < 1e-12, "{case}: {o} vs {want_o}");
                }
            }
        }
    }
}
