//! Sizes of the Taylor kernels: pure host functions, the mirror of `TaylorTile`, `TaylorDims`,
//! `TaylorStateSmem` and the dense kernel's carve-up in `kernels/include/taylor_*.cuh`.

/// Head dims with Taylor kernels (the value head dim must equal the head dim).
pub(crate) const HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];

/// Threads per block of every Taylor kernel (`kTaylorThreads`): 4 warps.
pub(crate) const THREADS: u32 = 128;
/// Rows (one warp each) per block of the row kernels and the f32 dense kernel.
pub(crate) const ROWS_PER_BLOCK: usize = 4;
/// Probes per block of the tensor-core dense kernel (4 warps × 16 rows).
pub(crate) const DENSE_PROBES: usize = 64;
/// Sources per block of the tensor-core dense kernel.
const DENSE_SOURCES: usize = 64;
/// Features (8 tiles) per block of the decode kernels (`kDecodeFeatures`).
pub(crate) const DECODE_FEATURES: usize = 64;

/// Chunk length `C` of the state sweep and feature tiles `NT` per slab (`TaylorTile<D>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StateTile {
    pub c: usize,
    pub nt: usize,
}

/// `TaylorTile<D>`: `None` for head dims without kernels.
///
/// ```text
/// state_tile(64) = StateTile { c: 64, nt: 16 }    state_tile(128) = StateTile { c: 32, nt: 8 }
/// ```
pub(crate) fn state_tile(d: usize) -> Option<StateTile> {
    match d {
        16 => Some(StateTile { c: 64, nt: 28 }),
        32 | 64 => Some(StateTile { c: 64, nt: 16 }),
        128 => Some(StateTile { c: 32, nt: 8 }),
        _ => None,
    }
}

/// Columns of `ṽ = [v, 1]`: `M = D + 1`, and `MP`, M padded to whole 16-column mma steps.
pub(crate) fn width(d: usize) -> usize {
    d + 1
}
fn width_padded(d: usize) -> usize {
    (d + 1).div_ceil(16) * 16
}

/// Feature tiles of 8 per head (`taylor_tiles`): const, `D/8` linear and, for order 2,
/// `4·(D/8)·(D/8 + 1)` quad tiles (every pair a ≤ b once, in 8-wide blocks).
///
/// ```text
/// tiles(64, 1) = 9    tiles(64, 2) = 297 (2376 features for the 2080 pairs + 64 linear + 1)
/// ```
pub(crate) fn tiles(d: usize, order: u8) -> usize {
    let w = d / 8;
    if order == 1 {
        1 + w
    } else {
        1 + w + 4 * w * (w + 1)
    }
}

/// Feature slabs (blocks along the features) of the state sweep.
pub(crate) fn slabs(d: usize, order: u8) -> Option<usize> {
    Some(tiles(d, order).div_ceil(state_tile(d)?.nt))
}

/// Dynamic shared memory of the state sweep (`TaylorStateSmem<T, D>::kBytes`); `elem` is the storage
/// size (4 for the f32 kernels, which keep no storage-type copy of the sums).
///
/// ```text
/// D = 64, bf16: 80·132·4 + 80·136·2 + 64·68·4 + 64·88·2 + max(64·136·2, 64·132·4) + 16·16 = 126 720
/// ```
pub(crate) fn state_smem(d: usize, elem: usize) -> Option<usize> {
    let t = state_tile(d)?;
    let f = 8 * t.nt;
    let mp = width_padded(d);
    let pad = 16 / elem;
    let master = mp * (f + 4) * 4;
    let copy = if elem == 2 { mp * (f + pad) * elem } else { 0 };
    let x = t.c * (d + 4) * 4;
    let y = t.c * (mp + pad) * elem;
    let feat = (t.c * (f + pad) * elem).max(t.c * (f + 4) * 4);
    Some(master + copy + x + y + feat + t.nt * 16)
}

/// Dynamic shared memory of the tensor-core dense kernel: z and x tiles `[64][D + 8]`, the y tile
/// `[64][MP + 8]`, and for the gradient the w tile `[64][MP + 8]`. The f32 kernel uses none.
pub(crate) fn dense_smem(d: usize, elem: usize, grad: bool) -> usize {
    if elem == 4 {
        return 0;
    }
    let ldz = d + 8;
    let ldw = width_padded(d) + 8;
    (2 * DENSE_PROBES * ldz + DENSE_SOURCES * ldw + if grad { DENSE_PROBES * ldw } else { 0 }) * elem
}

/// Dynamic shared memory of a decode step (f32): φ `[64]`, ψ `[G][64]`, k̂ `[D]`, ṽ `[M → 4k]`, u `[G][D]`.
pub(crate) fn decode_step_smem(d: usize, group: usize) -> usize {
    let mv = width(d).div_ceil(4) * 4;
    (DECODE_FEATURES + group * DECODE_FEATURES + d + mv + group * d) * 4
}

/// How the state sweep splits the sequence: `(splits, chunks per split)`.
///
/// Each (slab, batch entry, kv head) runs as `splits` blocks that fold `chunks_per_split` chunks each,
/// enough blocks to give every SM two, and at most 8 splits (each split re-reads its probes) and no more
/// than there are chunks.
///
/// ```text
/// split(256 chunks, 13 slabs × 32 heads, 132 SMs) = (1, 256)      // 416 blocks already
/// split(256 chunks, 1 slab × 8 heads, 132 SMs)    = (8, 32)       // order 1, few heads, long sequence
/// ```
pub(crate) fn split(chunks: usize, blocks_per_split: usize, sms: usize) -> (usize, usize) {
    if chunks == 0 {
        return (0, 1);
    }
    let want = (2 * sms).div_ceil(blocks_per_split.max(1));
    let splits = want.clamp(1, 8).min(chunks);
    let per = chunks.div_ceil(splits);
    (chunks.div_ceil(per), per)
}

/// Blocks needed to cover `n` rows `per_block` at a time.
pub(crate) fn blocks(n: usize, per_block: usize) -> usize {
    n.div_ceil(per_block)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_examples() {
        assert_eq!(tiles(64, 1), 9);
        assert_eq!(tiles(64, 2), 297);
        assert_eq!(tiles(128, 2), 1105);
        assert_eq!(slabs(64, 2), Some(19));
        assert_eq!(state_smem(64, 2), Some(126_720));
        assert_eq!(split(256, 13 * 32, 132), (1, 256));
        assert_eq!(split(256, 8, 132), (8, 32));
        assert_eq!(split(3, 8, 132), (3, 1));
        assert_eq!(split(0, 8, 132), (0, 1));
    }

    #[test]
    fn quad_tiles_cover_every_pair_exactly_once() {
        for d in HEAD_DIMS {
            let w = d / 8;
            // The quad tiles of a are the 8-blocks from 8⌊a/8⌋ to D: (w − ⌊a/8⌋) each.
            let quad: usize = (0..d).map(|a| w - a / 8).sum();
            assert_eq!(tiles(d, 2), 1 + w + quad, "D = {d}");
            let weighted_pairs: usize = (0..d).map(|a| (8 * (a / 8)..d).filter(|&b| b >= a).count()).sum();
            assert_eq!(weighted_pairs, d * (d + 1) / 2, "D = {d}");
        }
    }

    #[test]
    fn shared_memory_fits_the_sm80_limit_and_slabs_hold_whole_steps() {
        for d in HEAD_DIMS {
            let t = state_tile(d).expect("tile");
            assert_eq!((t.c % 16, t.nt % 4), (0, 0), "D = {d}");
            for elem in [2, 4] {
                let s = state_smem(d, elem).expect("supported");
                assert!(s <= 163 * 1024, "state D = {d}, elem {elem}: {s}");
                assert!(dense_smem(d, elem, true) <= 163 * 1024);
            }
            assert!(decode_step_smem(d, 64) <= 163 * 1024);
        }
        assert_eq!(state_tile(48), None);
        assert_eq!(slabs(96, 2), None);
    }

    /// `(D, C, NT)` of every `template <> struct TaylorTile<D> { ... C = .., NT = ..; };` line.
    fn kernel_tiles() -> Vec<(usize, usize, usize)> {
        let header = include_str!("../../kernels/include/taylor_common.cuh");
        header
            .lines()
            .filter_map(|line| line.strip_prefix("template <> struct TaylorTile<"))
            .map(|rest| {
                let (d, body) = rest.split_once('>').expect("D>");
                let field = |name: &str| -> usize {
                    let at = body.find(&format!("{name} = ")).expect("field") + name.len() + 3;
                    let digits: String = body[at..].chars().take_while(|c| c.is_ascii_digit()).collect();
                    digits.parse().expect("number")
                };
                (d.parse().expect("head dim"), field("C"), field("NT"))
            })
            .collect()
    }

    #[test]
    fn host_tiles_mirror_the_kernel_specialisations() {
        let tiles = kernel_tiles();
        assert_eq!(tiles.len(), HEAD_DIMS.len(), "one TaylorTile per head dim");
        for (d, c, nt) in tiles {
            assert_eq!(state_tile(d), Some(StateTile { c, nt }), "TaylorTile<{d}>");
        }
    }

    #[test]
    fn splits_cover_every_chunk_and_never_exceed_eight() {
        for chunks in [1, 2, 7, 64, 1000, 16_384] {
            for blocks in [1, 5, 300, 10_000] {
                let (n, per) = split(chunks, blocks, 132);
                assert!((1..=8).contains(&n), "{chunks} {blocks}: {n}");
                assert!(
                    n * per >= chunks && (n - 1) * per < chunks,
                    "{chunks} {blocks}: {n} × {per}"
                );
            }
        }
    }
}
