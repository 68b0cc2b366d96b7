//! Tile shapes, shared-memory sizes and grids: pure host functions, the mirror of
//! `kernels/common/tiles.h` and of each kernel's shared-memory carve-up.
//!
//! The mma.sync, SIMT and row kernels run 4 warps (128 threads), with shared rows padded to `D + 8`
//! elements; the Hopper kernels run one warpgroup (128 threads) per 64 resident rows, in the unpadded
//! 128-byte-swizzled layout.

/// Threads per block of every flash and row kernel.
pub(crate) const THREADS: u32 = 128;
/// Warps per block of the SIMT and row kernels (`kSimtRows`); a SIMT kernel's warp holds one row.
pub(crate) const SIMT_ROWS: usize = 4;

/// Rows per warp of the row kernels (`with_lane_row` in `simt_f32.cuh`): 16-bit rows of
/// D ∈ {32, 64, 128, 256} take D/16 lanes each, of D = 16 two; every other row the whole warp.
pub(crate) fn row_kernel_rows_per_warp(head_dim: usize, elem_bytes: usize) -> usize {
    match (elem_bytes, head_dim) {
        (2, 16) => 16,
        (2, 32 | 64 | 128 | 256) => 32 / (head_dim / 16),
        _ => 1,
    }
}

/// Tile shape of one pass at one head dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tile {
    /// Query rows per block (resident in forward and dQ, streamed in dK/dV).
    pub bm: usize,
    /// Key rows per block (streamed in forward and dQ, resident in dK/dV).
    pub bn: usize,
    /// dK/dV columns accumulated per block (`D` except where registers force a split).
    pub da: usize,
}

/// `FwdTile<D>`: `None` for head dims without a kernel. Two 16-row mma tiles per warp (BM = 128)
/// up to D = 128; one at D = 256, where the O accumulator alone takes 128 registers.
///
/// ```text
/// fwd_tile(128) = Tile { bm: 128, bn: 32, da: 128 }   fwd_tile(256) = Tile { bm: 64, bn: 32, .. }
/// ```
pub(crate) fn fwd_tile(d: usize) -> Option<Tile> {
    match d {
        16 | 32 | 64 | 96 => Some(Tile {
            bm: 128,
            bn: 64,
            da: d,
        }),
        128 => Some(Tile {
            bm: 128,
            bn: 32,
            da: d,
        }),
        256 => Some(Tile {
            bm: 64,
            bn: 32,
            da: d,
        }),
        _ => None,
    }
}

/// `DqTile<D>`: two 16-row tiles per warp (BM = 128 resident queries) up to D = 64, one above
/// (the dQ accumulator and the S, dP tiles share the registers); BN streamed keys.
pub(crate) fn dq_tile(d: usize) -> Option<Tile> {
    match d {
        16 | 32 | 64 => Some(Tile {
            bm: 128,
            bn: 32,
            da: d,
        }),
        96 | 128 => Some(Tile {
            bm: 64,
            bn: 64,
            da: d,
        }),
        256 => Some(Tile {
            bm: 64,
            bn: 32,
            da: d,
        }),
        _ => None,
    }
}

/// `DkvTile<D>`: 128 resident keys (two 16-key tiles per warp) up to D = 64, 64 above; 32 streamed
/// queries (64 at D = 16); at D = 256 each block accumulates 128 of the columns (two column blocks
/// per key tile), as dK and dV must both fit in registers.
pub(crate) fn dkdv_tile(d: usize) -> Option<Tile> {
    match d {
        16 => Some(Tile {
            bm: 64,
            bn: 128,
            da: d,
        }),
        32 | 64 => Some(Tile {
            bm: 32,
            bn: 128,
            da: d,
        }),
        96 | 128 => Some(Tile {
            bm: 32,
            bn: 64,
            da: d,
        }),
        256 => Some(Tile {
            bm: 32,
            bn: 64,
            da: 128,
        }),
        _ => None,
    }
}

/// `LorentzFwdTile<D>`: the hyperbolic scores' forward tile, one 16-row tile per warp at D = 96
/// (two would spill), else the skeleton's.
///
/// ```text
/// lorentz_fwd_tile(96) = Tile { bm: 64, bn: 64, da: 96 }   lorentz_fwd_tile(128) = fwd_tile(128)
/// ```
pub(crate) fn lorentz_fwd_tile(d: usize) -> Option<Tile> {
    match d {
        96 => Some(Tile {
            bm: 64,
            bn: 64,
            da: d,
        }),
        _ => fwd_tile(d),
    }
}

/// `LorentzDqTile<D>`: one 16-row tile per warp at D = 64, else the skeleton's.
pub(crate) fn lorentz_dq_tile(d: usize) -> Option<Tile> {
    match d {
        64 => Some(Tile {
            bm: 64,
            bn: 64,
            da: d,
        }),
        _ => dq_tile(d),
    }
}

/// `LorentzDkvTile<D>`: one 16-key tile per warp at D = 64 (64 resident keys), else the skeleton's.
pub(crate) fn lorentz_dkdv_tile(d: usize) -> Option<Tile> {
    match d {
        64 => Some(Tile {
            bm: 32,
            bn: 64,
            da: d,
        }),
        _ => dkdv_tile(d),
    }
}

/// `WgFwdTile<D>`: the Hopper (wgmma) forward, 128 queries (64 per warpgroup: `bm · 2` threads) per
/// block, at D = 64 and 128 only: 64 keys per streamed block at D = 64 (two blocks per SM), 128 at
/// D = 128 (one).
pub(crate) fn wg_fwd_tile(d: usize) -> Option<Tile> {
    match d {
        64 => Some(Tile {
            bm: 128,
            bn: 64,
            da: d,
        }),
        128 => Some(Tile {
            bm: 128,
            bn: 128,
            da: d,
        }),
        _ => None,
    }
}

/// `WsFwdTile<D>`: the warp-specialised Hopper forward ([`ws_threads`]: `bm / 64` consumer
/// warpgroups of 64 query rows and a producer warpgroup), 128 keys per stage: 192 queries (three
/// consumers) at D = 64, 128 (two) at D = 128; its shared memory is [`wg_fwd_smem`]'s.
pub(crate) fn ws_fwd_tile(d: usize) -> Option<Tile> {
    let bm = match d {
        64 => 192,
        128 => 128,
        _ => return None,
    };
    Some(Tile { bm, bn: 128, da: d })
}

/// Whether the warp-specialised forward replaces the wgmma one under `Route::Measured`
/// (`KernelConfig::ws_forward`): where it measured faster on the H100 (2026-11-24: bf16, N = 4k and
/// 16k, causal and not, against the wgmma forward in the same call). At D = 128 for every call
/// (softmax 1.20–1.27×, cosine-sim 1.08–1.31×, squared Lorentz 1.11–1.14×, geodesic 1.23–1.29×). At
/// D = 64 for the geodesic, and without a causal mask or sliding window
/// (`banded`) for cosine-sim at every length (4k 1.01×, 16k 1.12×) and the other scores
/// from `seq_k` ≥ 8192 (softmax 4k 0.94×, 16k 1.04×; squared Lorentz 0.96× and 1.05×; 8192 is an
/// interpolation). Causal at D = 64 the wgmma kernel stays ahead (4k: ws 0.72× for softmax, 0.88× for
/// cosine-sim). The squared Lorentz score on bf16 (`k0_panels`: its q0·k0 on the tensor cores, which
/// only the warp-specialised kernel does) takes it at D = 64 without a mask at every length (4k:
/// 1.06× the wgmma kernel, 1.11× the wgmma kernel with the panels) and causal from 16384
/// keys (16k: 1.05×; 4k: 0.89×, so the wgmma kernel keeps 4k and 8k; H100, 2026-11-27).
pub(crate) fn ws_fwd_measured_faster(
    d: usize,
    geodesic: bool,
    cosine: bool,
    k0_panels: bool,
    banded: bool,
    seq_k: usize,
) -> bool {
    match d {
        128 => true,
        64 => {
            geodesic || (k0_panels && (!banded || seq_k >= 16384)) || (!banded && (cosine || seq_k >= 8192))
        }
        _ => false,
    }
}

/// Stages of the key scalars in the warp-specialised forward (`kCs` in flash_fwd_ws.cuh).
pub(crate) const WS_SCALAR_STAGES: usize = 3;

/// Dynamic shared memory of the warp-specialised forward: [`wg_fwd_smem`]'s layout, whose scalars
/// hold the [`WS_SCALAR_STAGES`] stages of k0, plus as many of log γ_j for the hyperbolic scores
/// (`lorentz`), and with `k0_panels` (bf16) the panels of [`k0_panels_smem`].
pub(crate) fn ws_fwd_smem(t: Tile, d: usize, elem: usize, lorentz: bool, k0_panels: bool) -> usize {
    wg_fwd_smem(t, d, elem)
        + if lorentz { WS_SCALAR_STAGES * t.bn * 4 } else { 0 }
        + usize::from(k0_panels) * k0_panels_smem(t)
}

/// The warp-specialised forward's panels of q0's and −k0's bf16 pieces (`kLorentzTcK0`, hyperbolic
/// scores on bf16): a 128-byte sw128 row per query of the tile and per key of each of the two K stages.
///
/// ```text
/// D = 128 (bm = bn = 128): (128 + 2·128)·128 = 49 152 bytes
/// ```
pub(crate) fn k0_panels_smem(t: Tile) -> usize {
    (t.bm + 2 * t.bn) * 128
}

/// Threads of a warp-specialised Hopper forward block: the consumers' `bm · 2` and the producer's 128.
pub(crate) fn ws_threads(t: Tile) -> u32 {
    (t.bm * 2 + 128) as u32
}

/// `WgDqTile<D>`: the Hopper (wgmma) dQ kernel, 128 resident queries (64 per warpgroup: `bm · 2`
/// threads) and 128 (D = 64) or 64 (D = 128) keys per streamed block, every score.
pub(crate) fn wg_dq_tile(d: usize) -> Option<Tile> {
    match d {
        64 => Some(Tile {
            bm: 128,
            bn: 128,
            da: d,
        }),
        128 => Some(Tile {
            bm: 128,
            bn: 64,
            da: d,
        }),
        _ => None,
    }
}

/// `WgDkvTile<D>`: the Hopper (wgmma) dK/dV kernel, 128 resident keys (64 per warpgroup: `bn · 2`
/// threads) and 128 (D = 64) or 64 (D = 128) queries per streamed block, every score; no column split.
pub(crate) fn wg_dkdv_tile(d: usize) -> Option<Tile> {
    match d {
        64 => Some(Tile {
            bm: 128,
            bn: 128,
            da: d,
        }),
        128 => Some(Tile {
            bm: 64,
            bn: 128,
            da: d,
        }),
        _ => None,
    }
}

/// Dynamic shared memory of the Hopper dQ kernel: 1 KiB of alignment slack, Q and dO, three K and
/// two V buffers (K of the previous block is still read by its dQ product while the next one lands),
/// and 1/‖k‖ (hyperbolic: k0) and log γ for three key blocks.
///
/// ```text
/// D = 128, bf16: 1024 + (2·128 + 5·64)·128·2 + 6·64·4 = 150 016 bytes
/// ```
pub(crate) fn wg_dq_smem(t: Tile, d: usize, elem: usize) -> usize {
    1024 + (2 * t.bm + 5 * t.bn) * d * elem + 6 * t.bn * 4
}

/// Dynamic shared memory of the Hopper dK/dV kernel: 1 KiB of slack, K and V, two Q and two dO
/// buffers, and LSE, δ and q0 (hyperbolic; 1 for the others) for two query blocks.
///
/// ```text
/// D = 128, bf16: 1024 + (2·128 + 4·64)·128·2 + 6·64·4 = 133 632 bytes
/// ```
pub(crate) fn wg_dkdv_smem(t: Tile, d: usize, elem: usize) -> usize {
    1024 + (2 * t.bn + 4 * t.bm) * d * elem + 6 * t.bm * 4
}

/// Stages of Q and dO in the warp-specialised dK/dV kernel (`kWsDkvStages` in tiles.h).
pub(crate) const WS_DKDV_STAGES: usize = 3;

/// `WsDkvTile<D>`: the warp-specialised dK/dV kernel (flash_bwd_ws.cuh; two consumer warpgroups and a
/// producer, `bn · 2 + 128` threads), [`wg_dkdv_tile`]'s tile: 128 resident keys, 128 (D = 64) or 64
/// (D = 128) queries per streamed block.
pub(crate) fn ws_dkdv_tile(d: usize) -> Option<Tile> {
    wg_dkdv_tile(d)
}

/// `LorentzWsDkvTile<D>`: the hyperbolic scores' tile of the warp-specialised dK/dV kernel, 64 queries
/// per block at D = 64 (128 spill 440–490 bytes within the consumers' 240 registers), else
/// [`ws_dkdv_tile`]'s.
pub(crate) fn ws_dkdv_lorentz_tile(d: usize) -> Option<Tile> {
    match d {
        64 => Some(Tile {
            bm: 64,
            bn: 128,
            da: 64,
        }),
        _ => ws_dkdv_tile(d),
    }
}

/// The tile of the squared Lorentz fused backward for calls whose every tile is fast (bf16, D = 64;
/// `ATTN_FLASH_BWD_FUSED_WS_EVEN` in flash_bwd_ws.cuh, dispatch::fused_even): softmax's 128 queries per
/// block where [`ws_dkdv_lorentz_tile`] has 64.
pub(crate) const WS_FUSED_EVEN_TILE: Tile = Tile {
    bm: 128,
    bn: 128,
    da: 64,
};

/// Stages of K and of V in the warp-specialised dQ kernel (`kWsDqKStages`, `kWsDqVStages` in tiles.h).
pub(crate) const WS_DQ_STAGES: (usize, usize) = (4, 3);

/// `WsDqTile<D>`: the warp-specialised dQ kernel (flash_bwd_ws.cuh; two consumer warpgroups of 64 query
/// rows and a producer, `bm · 2 + 128` threads), [`wg_dq_tile`]'s tile.
pub(crate) fn ws_dq_tile(d: usize) -> Option<Tile> {
    wg_dq_tile(d)
}

/// Dynamic shared memory of the warp-specialised dQ kernel: 1 KiB of slack, Q and dO, the
/// [`WS_DQ_STAGES`] stages of K and of V, and k0 and log γ (hyperbolic) with each K stage.
///
/// ```text
/// D = 128, bf16: 1024 + (2·128 + 7·64)·128·2 + 8·64·4 = 183 296 bytes
/// D = 64, bf16:  1024 + (2·128 + 7·128)·64·2 + 8·128·4 = 152 576 bytes
/// ```
///
/// `k0_panel` (the hyperbolic scores on bf16, `kLorentzTcK0` in lorentz_tile.cuh): each K stage
/// also holds a BN × 128-byte panel of k0's bf16 pieces, the B operand of the tensor-core row sums.
pub(crate) fn ws_dq_smem(t: Tile, d: usize, elem: usize, k0_panel: bool) -> usize {
    let (ks, vs) = WS_DQ_STAGES;
    1024 + (2 * t.bm + (ks + vs) * t.bn) * d * elem
        + 2 * ks * t.bn * 4
        + usize::from(k0_panel) * ks * t.bn * 128
}

/// Dynamic shared memory of the warp-specialised dK/dV kernel: 1 KiB of slack, K and V,
/// [`WS_DKDV_STAGES`] stages of Q and dO, and LSE, δ and a row of ones (the per-query factor of the
/// shared per-element code) for each stage.
///
/// ```text
/// D = 128, bf16: 1024 + (2·128 + 6·64)·128·2 + 9·64·4 = 167 168 bytes
/// D = 64, bf16:  1024 + (2·128 + 6·128)·64·2 + 9·128·4 = 136 704 bytes
/// ```
///
/// `q0_panel` (the hyperbolic scores on bf16 at D = 64, and squared Lorentz at D = 128: `kLorentzTcRowSum`
/// in flash_bwd_ws.cuh, host mirror `dispatch::ws_q0_panel`): each
/// stage also holds a BM × 128-byte panel of q0's bf16 pieces, the B operand of the tensor-core row sums.
pub(crate) fn ws_dkdv_smem(t: Tile, d: usize, elem: usize, q0_panel: bool) -> usize {
    1024 + (2 * t.bn + 2 * WS_DKDV_STAGES * t.bm) * d * elem
        + 3 * WS_DKDV_STAGES * t.bm * 4
        + usize::from(q0_panel) * WS_DKDV_STAGES * t.bm * 128
}

/// Stages of Q and dO in the warp-specialised fused backward (`kWsFusedStages` in tiles.h).
pub(crate) const WS_FUSED_STAGES: usize = 2;

/// Dynamic shared memory of the warp-specialised fused backward (flash_bwd_ws.cuh with kDq, tile
/// [`ws_dkdv_tile`]): 1 KiB of slack, K, V, [`WS_FUSED_STAGES`] stages of Q and dO, two dS'ᵀ tiles
/// (BN × BM), the stages' scalars, and each consumer warp's 16 × 64 f32 of dQ.
///
/// ```text
/// D = 128, bf16: 1024 + (2·128 + 4·64)·128·2 + 2·128·64·2 + 6·64·4 + 8·16·64·4 = 199 168 bytes
/// D = 64, bf16:  1024 + (2·128 + 4·128)·64·2 + 2·128·128·2 + 6·128·4 + 8·16·64·4 = 200 704 bytes
/// ```
/// `q0_panel`: a BN × 128-byte panel of the keys' k0 pieces, the dQ product's 8 more columns, whose
/// other 16-byte chunks hold the stages' q0 panels ([`ws_dkdv_smem`]'s, `kTcDq` in flash_bwd_ws.cuh).
pub(crate) fn ws_fused_smem(t: Tile, d: usize, elem: usize, q0_panel: bool) -> usize {
    1024 + (2 * t.bn + 2 * WS_FUSED_STAGES * t.bm) * d * elem
        + 2 * t.bn * t.bm * elem
        + 3 * WS_FUSED_STAGES * t.bm * 4
        + 8 * 16 * 64 * 4
        + usize::from(q0_panel) * t.bn * 128
}

/// Dynamic shared memory of the fused Hopper backward: the dK/dV kernel's, dS'ᵀ of one query block
/// (the A operand of its dQ product) and, for the hyperbolic scores, k0 of the resident keys.
///
/// ```text
/// D = 128, bf16: 133 632 + 128·64·2 + 128·4 = 150 528 bytes
/// ```
pub(crate) fn wg_fused_smem(t: Tile, d: usize, elem: usize) -> usize {
    wg_dkdv_smem(t, d, elem) + t.bn * t.bm * elem + t.bn * 4
}

/// Threads of a Hopper forward block: one warpgroup (128 threads) per 64 query rows.
pub(crate) fn wg_threads(t: Tile) -> u32 {
    (t.bm * 2) as u32
}

/// Dynamic shared memory of the Hopper forward: 1 KiB of slack to align the tiles to 1024 bytes
/// (the 128-byte swizzle), Q, two K and two V buffers in unpadded rows, and the scalars of
/// [`fwd_smem`].
///
/// ```text
/// D = 128, bf16: 1024 + (128 + 4·128)·128·2 + (2·128 + 128)·4 = 166 400 bytes
/// ```
pub(crate) fn wg_fwd_smem(t: Tile, d: usize, elem: usize) -> usize {
    1024 + (t.bm + 4 * t.bn) * d * elem + (2 * t.bn + t.bm) * 4
}

fn row_bytes(d: usize, elem: usize) -> usize {
    (d + 8) * elem
}

/// Dynamic shared memory of the forward with tile `t`: Q, two K and two V buffers, 1/‖k‖ for two
/// key blocks and 1/‖q‖ for the query tile.
///
/// ```text
/// D = 128, bf16: (128 + 4·32)·136·2 + (2·32 + 128)·4 = 70 400 bytes
/// ```
pub(crate) fn fwd_smem(t: Tile, d: usize, elem: usize) -> usize {
    (t.bm + 4 * t.bn) * row_bytes(d, elem) + (2 * t.bn + t.bm) * 4
}

/// dQ: Q and dO tiles, two K and two V buffers, 1/‖k‖ for two key blocks (tile `t`).
pub(crate) fn dq_smem(t: Tile, d: usize, elem: usize) -> usize {
    (2 * t.bm + 4 * t.bn) * row_bytes(d, elem) + 2 * t.bn * 4
}

/// dK/dV: K and V tiles, two Q and two dO buffers, and LSE, δ, 1/‖q‖ for two query blocks (tile `t`).
pub(crate) fn dkdv_smem(t: Tile, d: usize, elem: usize) -> usize {
    (2 * t.bn + 4 * t.bm) * row_bytes(d, elem) + 3 * 2 * t.bm * 4
}

/// Extra dynamic shared memory of the hyperbolic forward and dQ kernels: besides the skeleton's
/// scalars (whose key slots hold k0), the Einstein midpoint's log γ_j for two key blocks.
///
/// ```text
/// D = 128 forward: 2·32·4 = 256 bytes
/// ```
pub(crate) fn lorentz_extra_smem(t: Tile) -> usize {
    2 * t.bn * 4
}

/// The L2 share one section of a causal grid may stream (bytes), a quarter of the H100's 50 MB (two
/// partitions of 25): 24 MiB made D = 128 at 16k keys (3 heads of 8 MiB) 3–4% slower than head by
/// head, while 2–6 MiB per head (D = 64 at 16k, 4k keys) gained 1–3% (H200, 2026-11-26).
pub(crate) const SECTION_L2_BYTES: usize = 12 << 20;

/// (batch entry, head) pairs per section of a causal grid's work order (`AttnParams::section_q` for
/// the grids of query tiles, `section_k` for those of key tiles; kernels/common/mask.h `tile_order`):
/// as many pairs as the rows their tiles stream fit in [`SECTION_L2_BYTES`] (K and V per query head
/// for query tiles, shared by a GQA group; Q and dO of a kv head's group for key tiles), at least 1.
/// Without a causal mask the order is the launch's whatever these say.
///
/// ```text
/// D = 64, 16384 keys, no GQA: K and V are 4 MiB per head → 3 heads per section; D = 128 → 1
/// ```
pub(crate) fn causal_sections(head_dim: usize, seq_q: usize, seq_k: usize, group: usize) -> (usize, usize) {
    // Two 16-bit rows (K and V, or Q and dO) of head_dim per position.
    let row_pair = 4 * head_dim;
    let per_query_head = (row_pair * seq_k).div_ceil(group.max(1));
    let per_kv_head = row_pair * seq_q * group.max(1);
    let fit = |bytes: usize| (SECTION_L2_BYTES / bytes.max(1)).max(1);
    (fit(per_query_head), fit(per_kv_head))
}

/// Blocks needed to cover `n` rows `per_block` at a time.
pub(crate) fn blocks(n: usize, per_block: usize) -> usize {
    n.div_ceil(per_block)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_kernels_share_warps_between_16_bit_rows() {
        // Lanes of 8-element chunks, at most 16 elements a lane: rows per warp × lanes per row = 32.
        for (d, rows, lanes) in [(16, 16, 2), (32, 16, 2), (64, 8, 4), (128, 4, 8), (256, 2, 16)] {
            assert_eq!(row_kernel_rows_per_warp(d, 2), rows, "D = {d}");
            assert_eq!(rows * lanes, 32, "D = {d}");
            assert!(d / lanes <= 16 && (d / lanes) % 8 == 0, "D = {d}");
        }
        // f32 rows and head dims off the vector layout take a warp each.
        assert_eq!(row_kernel_rows_per_warp(64, 4), 1);
        assert_eq!(row_kernel_rows_per_warp(96, 2), 1);
        assert_eq!(row_kernel_rows_per_warp(48, 2), 1);
    }

    #[test]
    fn causal_sections_fill_the_l2_share_and_never_drop_below_one() {
        // K and V of 16384 keys: 4 MiB per head at D = 64, 8 MiB at D = 128.
        assert_eq!(causal_sections(64, 16384, 16384, 1), (3, 3));
        assert_eq!(causal_sections(64, 4096, 4096, 1), (12, 12));
        // Rows of one head filling the share: pair by pair.
        assert_eq!(causal_sections(128, 16384, 16384, 1), (1, 1));
        assert_eq!(causal_sections(128, 131072, 131072, 1), (1, 1));
        // A GQA group shares K and V (query tiles) and streams every head's Q and dO (key tiles).
        assert_eq!(causal_sections(128, 16384, 16384, 4), (6, 1));
        assert_eq!(causal_sections(64, 4096, 1024, 1), (48, 12));
    }

    #[test]
    fn shared_memory_fits_the_h100_opt_in_limit() {
        // 227 KiB of dynamic shared memory per block on sm_90 (and 163 KiB on sm_80: all of these
        // fit both).
        for d in [16, 32, 64, 96, 128, 256] {
            let tiles = [
                (
                    fwd_tile as fn(usize) -> Option<Tile>,
                    fwd_smem as fn(Tile, usize, usize) -> usize,
                ),
                (dq_tile, dq_smem),
                (dkdv_tile, dkdv_smem),
                (lorentz_fwd_tile, fwd_smem),
                (lorentz_dq_tile, dq_smem),
                (lorentz_dkdv_tile, dkdv_smem),
            ];
            for (tile, smem) in tiles {
                let t = tile(d).expect("supported head dim");
                // Hyperbolic tiles add log γ for two key blocks.
                let bytes = smem(t, d, 2) + lorentz_extra_smem(t);
                assert!(bytes <= 163 * 1024, "D = {d}: {bytes} bytes");
            }
        }
    }

    #[test]
    fn hopper_forward_fits_the_sm90_opt_in_limit() {
        for (d, t) in [64, 128].into_iter().map(|d| (d, wg_fwd_tile(d))) {
            let t = t.expect("Hopper tile");
            let bytes = wg_fwd_smem(t, d, 2) + lorentz_extra_smem(t);
            assert!(bytes <= 227 * 1024, "D = {d}: {bytes} bytes");
            // Two warpgroups of 64 rows; the sw128 column blocks are 64 wide and 8-row aligned.
            assert_eq!((t.bm, wg_threads(t)), (128, 256));
            assert_eq!((d % 64, t.bn % 64, t.bm % 64), (0, 0, 0));
        }
        assert!(wg_fwd_tile(32).is_none() && wg_fwd_tile(256).is_none());
        for d in [64, 128] {
            let t = ws_fwd_tile(d).expect("warp-specialised tile");
            let bytes = ws_fwd_smem(t, d, 2, true, true);
            // The scalar ring in the place of the wgmma forward's scalars.
            assert!(WS_SCALAR_STAGES * t.bn <= 2 * t.bn + t.bm, "{t:?}");
            // Plus the kernel's static 1 KiB (its barriers, aligned).
            assert!(bytes + 1024 <= 227 * 1024, "D = {d}: {bytes} bytes");
            // Two or three consumer warpgroups of 64 rows; one scalar per producer thread for each key;
            // at most 512 threads (setmaxnreg's split, flash_fwd_ws.cuh).
            assert_eq!((t.bm % 64, t.bn % 64, t.bn <= 128), (0, 0, true));
            assert!(matches!(ws_threads(t), 384 | 512), "{t:?}");
        }
        assert!(ws_fwd_tile(96).is_none() && ws_fwd_tile(256).is_none());
        for d in [64, 128] {
            let (q, kv) = (wg_dq_tile(d).expect("dQ"), wg_dkdv_tile(d).expect("dK/dV"));
            for bytes in [
                wg_dq_smem(q, d, 2),
                ws_dq_tile(d).map_or(0, |t| ws_dq_smem(t, d, 2, true)),
                wg_dkdv_smem(kv, d, 2),
                wg_fused_smem(kv, d, 2),
                ws_fused_smem(kv, d, 2, false),
                ws_dkdv_lorentz_tile(d).map_or(0, |t| ws_fused_smem(t, d, 2, true)) + 1024,
            ] {
                assert!(bytes <= 227 * 1024, "D = {d}: {bytes} bytes");
            }
            // 64 resident rows per warpgroup, sw128 column blocks 64 wide, whole k16 steps streamed.
            assert_eq!((q.bm % 64, q.bn % 64, kv.bn % 64, kv.bm % 16), (0, 0, 0, 0));
            assert_eq!(kv.da, d, "no column split");
        }
        assert!(wg_dq_tile(96).is_none() && wg_dkdv_tile(256).is_none());
    }

    #[test]
    fn worked_examples() {
        assert_eq!(fwd_tile(128).map(|t| fwd_smem(t, 128, 2)), Some(70_400));
        assert_eq!(wg_fwd_tile(128).map(|t| wg_fwd_smem(t, 128, 2)), Some(166_400));
        // D = 64: 1024 + (128 + 4·64)·64·2 + (2·64 + 128)·4; two blocks fit an SM's 228 KiB.
        assert_eq!(wg_fwd_tile(64).map(|t| wg_fwd_smem(t, 64, 2)), Some(51_200));
        assert_eq!(ws_fwd_tile(128).map(k0_panels_smem), Some(49_152));
        assert_eq!(wg_dq_tile(128).map(|t| wg_dq_smem(t, 128, 2)), Some(150_016));
        // The hyperbolic k0 panels: 183 296 + 4·64·128 and 152 576 + 4·128·128.
        assert_eq!(
            ws_dq_tile(128).map(|t| ws_dq_smem(t, 128, 2, true)),
            Some(216_064)
        );
        assert_eq!(ws_dq_tile(64).map(|t| ws_dq_smem(t, 64, 2, true)), Some(218_112));
        assert_eq!(wg_dkdv_tile(128).map(|t| wg_dkdv_smem(t, 128, 2)), Some(133_632));
        assert_eq!(wg_dkdv_tile(128).map(|t| wg_fused_smem(t, 128, 2)), Some(150_528));
        assert_eq!(
            ws_dkdv_tile(128).map(|t| ws_fused_smem(t, 128, 2, false)),
            Some(199_168)
        );
        assert_eq!(
            ws_dkdv_tile(64).map(|t| ws_fused_smem(t, 64, 2, false)),
            Some(200_704)
        );
        // The hyperbolic tiles with their panel:
        // 1024 + (2·128 + 4·64)·64·2 + 2·128·64·2 + 6·64·4 + 8·16·64·4 + 128·128, and 199 168 + 128·128
        // (with the kernel's static 1 KiB, within 227 KiB).
        assert_eq!(
            ws_dkdv_lorentz_tile(64).map(|t| ws_fused_smem(t, 64, 2, true)),
            Some(150_016)
        );
        assert_eq!(
            ws_dkdv_lorentz_tile(128).map(|t| ws_fused_smem(t, 128, 2, true)),
            Some(215_552)
        );
        assert_eq!(
            dkdv_tile(256),
            Some(Tile {
                bm: 32,
                bn: 64,
                da: 128
            })
        );
        assert_eq!(blocks(65, 64), 2);
    }

    /// `(D, [(field, value)])` for every `template <> struct {name}<D> { ... }` line of tiles.h.
    fn kernel_tiles(name: &str) -> Vec<(usize, Vec<(String, usize)>)> {
        let header = include_str!("../kernels/common/tiles.h");
        let prefix = format!("template <> struct {name}<");
        header
            .lines()
            .filter_map(|line| line.strip_prefix(&prefix))
            .map(|rest| {
                let (d, body) = rest.split_once('>').expect("D>");
                let body = body.split_once("int ").expect("constexpr int").1;
                let body = body.split(';').next().expect("fields");
                let fields = body
                    .split(',')
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').expect("k = v");
                        (k.trim().to_string(), v.trim().parse().expect("number"))
                    })
                    .collect();
                (d.parse().expect("head dim"), fields)
            })
            .collect()
    }

    fn field(fields: &[(String, usize)], k: &str, default: usize) -> usize {
        fields
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| *v)
            .unwrap_or(default)
    }

    #[test]
    fn host_tiles_mirror_the_kernel_specialisations() {
        for (name, host) in [
            ("FwdTile", fwd_tile as fn(usize) -> Option<Tile>),
            ("DqTile", dq_tile),
            ("DkvTile", dkdv_tile),
        ] {
            let tiles = kernel_tiles(name);
            assert_eq!(tiles.len(), 6, "{name}: one specialisation per head dim");
            for (d, fields) in tiles {
                let t = host(d).unwrap_or_else(|| panic!("{name}<{d}> has no host tile"));
                let expect = Tile {
                    bm: field(&fields, "BM", 0),
                    bn: field(&fields, "BN", 0),
                    da: field(&fields, "DA", d),
                };
                assert_eq!(t, expect, "{name}<{d}>");
            }
        }
    }

    #[test]
    fn host_hopper_tiles_mirror_the_kernel_specialisations() {
        for (name, host, dims) in [
            (
                "WgFwdTile",
                wg_fwd_tile as fn(usize) -> Option<Tile>,
                &[64, 128][..],
            ),
            ("WsFwdTile", ws_fwd_tile, &[64, 128]),
            ("WgDqTile", wg_dq_tile, &[64, 128]),
            ("WgDkvTile", wg_dkdv_tile, &[64, 128]),
            ("WsDkvTile", ws_dkdv_tile, &[64, 128]),
            ("LorentzWsDkvTile", ws_dkdv_lorentz_tile, &[64]),
            ("WsDqTile", ws_dq_tile, &[64, 128]),
        ] {
            let tiles = kernel_tiles(name);
            let have: Vec<usize> = tiles.iter().map(|(d, _)| *d).collect();
            assert_eq!(have, dims, "{name}: its head dims");
            for (d, fields) in tiles {
                let expect = Tile {
                    bm: field(&fields, "BM", 0),
                    bn: field(&fields, "BN", 0),
                    da: d,
                };
                assert_eq!(host(d), Some(expect), "{name}<{d}>");
            }
        }
        let tiles = include_str!("../kernels/common/tiles.h");
        assert!(tiles.contains(&format!("constexpr int kWsDkvStages = {WS_DKDV_STAGES};")));
        assert!(tiles.contains(&format!("constexpr int kWsFusedStages = {WS_FUSED_STAGES};")));
        let (ks, vs) = WS_DQ_STAGES;
        assert!(tiles.contains(&format!(
            "constexpr int kWsDqKStages = {ks}, kWsDqVStages = {vs};"
        )));
    }

    #[test]
    fn host_lorentz_tiles_mirror_the_kernel_specialisations() {
        for (name, host, base) in [
            (
                "LorentzFwdTile",
                lorentz_fwd_tile as fn(usize) -> Option<Tile>,
                fwd_tile as fn(usize) -> Option<Tile>,
            ),
            ("LorentzDqTile", lorentz_dq_tile, dq_tile),
            ("LorentzDkvTile", lorentz_dkdv_tile, dkdv_tile),
        ] {
            let special = kernel_tiles(name);
            assert_eq!(special.len(), 1, "{name}: one specialisation");
            for d in [32, 64, 96, 128, 256] {
                let t = host(d).expect("supported head dim");
                match special.iter().find(|(sd, _)| *sd == d) {
                    Some((_, fields)) => {
                        let expect = Tile {
                            bm: field(fields, "BM", 0),
                            bn: field(fields, "BN", 0),
                            da: field(fields, "DA", d),
                        };
                        assert_eq!(t, expect, "{name}<{d}>");
                        // One 16-row tile per warp, and it still fits.
                        assert!(t.bm == 64 || t.bn == 64, "{name}<{d}>: {t:?}");
                    }
                    None => assert_eq!(Some(t), base(d), "{name}<{d}> is the skeleton's"),
                }
            }
        }
    }

    #[test]
    fn unsupported_head_dims_have_no_tile() {
        for d in [0, 8, 48, 80, 100, 192, 512] {
            assert!(
                fwd_tile(d).is_none() && dq_tile(d).is_none() && dkdv_tile(d).is_none(),
                "D = {d}"
            );
        }
    }

    #[test]
    fn each_warp_owns_one_m16_tile_and_tiles_are_whole_k16_steps() {
        for d in [16, 32, 64, 96, 128, 256] {
            for t in [fwd_tile(d), dq_tile(d)].into_iter().flatten() {
                let warps = THREADS as usize / 32;
                assert!(t.bm == 16 * warps || t.bm == 32 * warps, "{t:?}");
                assert_eq!(t.bn % 16, 0);
            }
            let t = dkdv_tile(d).expect("supported");
            let warps = THREADS as usize / 32;
            assert!(t.bn == 16 * warps || t.bn == 32 * warps, "{t:?}");
            assert_eq!((t.bm % 16, d % t.da, t.da % 16), (0, 0, 0));
        }
    }
}
