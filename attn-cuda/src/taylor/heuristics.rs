//! Sizes of the Taylor kernels: pure host functions, the mirror of `TaylorTile`, `TaylorDims`,
//! `TaylorFoldSmem`, `TaylorReadSmem` and the dense kernel's carve-up in `kernels/taylor/taylor_*.cuh`.

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
/// Feature tiles per step of the state reads (`kTaylorStepTiles`): states are padded to whole steps.
pub(crate) const STEP_TILES: usize = 4;
/// Bytes the segment states of one sweep may take before the segments get longer.
const STATE_BUDGET: usize = 8 << 30;

/// Whether Taylor order 2's quadratic form on the Hopper flash kernels (N² products on tensor cores)
/// beats the factorised state kernels (N·F·D, F = 2376 features at D = 64, 8.6k at D = 128): for keys
/// per query (half the keys under a causal mask) up to 32768 at D = 64 and 131072 at D = 128. H100,
/// bf16, 16k tokens × 2048 / D heads, forward and forward+backward in the same call
/// (2026-11-24): at D = 64 the flash kernels win at 32768 keys
/// (forward 22.3 ms against 25.0, forward+backward 75 against 95) and lose at 65536 (86 against 49);
/// causal they win at 65536 (46.1 against 47.9, 154 against 193); at D = 128 they win at 65536 (62.7
/// ms against the state kernels' ≥ 178), 131072 is extrapolated (∝ N² against ∝ N).
pub(crate) fn dense_faster(d: usize, causal: bool, seq_k: usize) -> bool {
    let keys = if causal { seq_k.div_ceil(2) } else { seq_k };
    let limit = if d >= 128 { 131_072 } else { 32_768 };
    keys <= limit
}

/// The head dim (= value head dim) of the wgmma state kernels (kernels/taylor/taylor_wg.cuh).
pub(crate) const WG_HEAD_DIM: usize = 64;
/// Fold blocks per (split, kv head, batch entry): 68 products of 64 × 64, four per block.
pub(crate) const WG_FOLD_BLOCKS: usize = 17;
/// f32 sums one fold split writes per (batch entry, kv head): 68 × 64 × 64.
pub(crate) const WG_SPLIT_SUMS: usize = 68 * 64 * 64;
/// k16 groups of the read's bf16 state (4 + 4 + 16·(4 + 3 + 2 + 1)); the reduce has one block each
/// and one for the vector.
pub(crate) const WG_STATE_GROUPS: usize = 168;
/// bf16 elements of the read's state per (batch entry, kv head): 168 groups of 16 × 64.
pub(crate) const WG_STATE_ELEMS: usize = WG_STATE_GROUPS * 16 * 64;
/// f32 vector per (batch entry, kv head): a0 Σv `[64]`, a1 Σk̂ `[64]`, a0 n, padding to 16 bytes.
pub(crate) const WG_VEC: usize = 132;
/// Queries per read block (two m64 tiles of one warpgroup).
pub(crate) const WG_READ_QUERIES: usize = 128;
/// Dynamic shared memory of the fold (`TaylorWgFoldSmem::kBytes` + 1 KiB of alignment slack): K, V
/// `[3][64 × 64]` sw128, the multipliers `[4][72]` bf16, r `[64]` f32, the state's staging `[16][16 × 64]`
/// bf16.
pub(crate) const WG_FOLD_SMEM: usize = 6 * 64 * 64 * 2 + 4 * 72 * 2 + 64 * 4 + 16 * 16 * 64 * 2 + 1024;
/// Dynamic shared memory of the read (`TaylorWgReadSmem::kBytes` + 1 KiB): the ring `[5][8 × 16 × 64]`
/// bf16, q/u `[128][72]` bf16, the vector, r `[64]` f32 (the causal dense part's key norms).
pub(crate) const WG_READ_SMEM: usize = 5 * 8 * 16 * 64 * 2 + 128 * 72 * 2 + WG_VEC * 4 + 64 * 4 + 1024;

/// Whether the wgmma state forward beats the quadratic form on the flash kernels (bf16, D = 64): from
/// 4096 keys per query without a causal mask. H100, 16k tokens × 32 heads, forward (docs/kernels/taylor-order2.md,
/// 2026-11-27): 1.24 ms against 1.63 at 4096, 1.07 against 3.06 at 8192; at 2048 the flash
/// kernels win (0.89 against 1.69: the state costs the same at every N, the quadratic form ∝ N).
/// Causal (Nq = Nk): from 8192 keys. H100, same shape, forward (2026-11-27):
/// 1.16 ms against the flash kernels' 1.45 at 8192, 1.35 against 2.81 at 16384, 5.55 against 41.3 at
/// 65536; at 4096 about level (0.76 with one 4096-key segment, 0.78 on the flash kernels).
pub(crate) fn wg_state_faster(seq_k: usize, causal: bool) -> bool {
    seq_k >= if causal { 8192 } else { 4096 }
}

/// States the causal wgmma fold writes per (batch entry, kv head) for segments of `seg` keys: one for
/// each segment m ≥ 1 of the longest sequence (state m − 1: the keys before m·seg).
pub(crate) fn wg_causal_states(seq_k: usize, seg: usize) -> usize {
    seq_k.saturating_sub(1) / seg.max(1)
}

/// Keys per segment of the causal wgmma forward (a multiple of the read's 128 queries): the fold
/// writes one state per segment boundary and stops its sums at the last one, the read takes the keys of
/// its own segment densely (half a segment per query on average). Longer segments trade the fold's work
/// and its stops for dense work; H100, forward, 16k tokens × 32 heads (ms at L = 1024 / 2048 / 4096,
/// 2026-11-27): 8192 keys 1.20 / 1.16 / 1.19,
/// 16384 1.35 / 1.42 / 1.52, 32768 2.89 / 2.90 / 3.26, 65536 5.55 / 5.89 / 6.57.
///
/// ```text
/// wg_causal_seg_len(8192) = 2048    wg_causal_seg_len(8193) = 1024
/// ```
pub(crate) fn wg_causal_seg_len(seq_k: usize) -> usize {
    if seq_k <= 8192 {
        2048
    } else {
        1024
    }
}

/// Keys per split of the wgmma fold (a multiple of 64): splits enough that the 17 blocks of each
/// split and (batch entry, kv head) make about 8 blocks per SM (two resident, four waves), at most one
/// per 64 keys. With one split the fold writes the read's state itself (no f32 sums, no reduce).
///
/// ```text
/// wg_split_len(4096, 128, 132) = 4096       one split: 2176 blocks
/// wg_split_len(65536, 32, 132) = 32768      two splits: 1088 blocks
/// wg_split_len(1 << 20, 8, 132) = 131072    eight splits: 1088 blocks
/// ```
pub(crate) fn wg_split_len(seq_k: usize, heads: usize, sms: usize) -> usize {
    let target = 8 * sms.max(1);
    let per_split = WG_FOLD_BLOCKS * heads.max(1);
    let splits = target.div_ceil(per_split).clamp(1, seq_k.div_ceil(64).max(1));
    seq_k.div_ceil(splits).div_ceil(64).max(1) * 64
}

/// Chunk length `C` of the fold and feature tiles `NT` per fold slab.
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

/// Features per state row, `f_pad`: the tiles rounded up to whole read steps, 8 features each.
///
/// ```text
/// f_pad(64, 1) = 96    f_pad(64, 2) = 2400    f_pad(128, 2) = 8864
/// ```
pub(crate) fn f_pad(d: usize, order: u8) -> usize {
    8 * tiles(d, order).div_ceil(STEP_TILES) * STEP_TILES
}

/// Feature slabs (blocks along the features) of the fold: `⌈f_pad / 8 / NT⌉`.
pub(crate) fn fold_slabs(d: usize, order: u8) -> Option<usize> {
    Some((f_pad(d, order) / 8).div_ceil(state_tile(d)?.nt))
}

/// SMs of the H100 the segment heuristic is tuned for (the segments also size the states, so they do not
/// depend on the device a call runs on).
const H100_SMS: usize = 132;

/// Fold blocks to aim for when the segments only serve parallelism: two per SM of an H100 (order 1:
/// `ORDER1_BLOCKS_PER_SM`, the order-1 fold's residency).
const FOLD_BLOCKS: usize = 2 * H100_SMS;

/// Segment length `L` of the state sweep over `n_s` sources (a multiple of the fold chunk `C`), for
/// `heads` (batch entry, kv head) pairs, storage size `elem`, and whether the probes read the states
/// before their own position (`causal`) or all read the whole sum.
///
/// Every segment is a state of `M × f_pad` entries (an f32 sum, and for f16/bf16 its hi and lo copies:
/// 8 bytes). Causal: probes past a segment boundary take up to L sources densely, so L doubles from C
/// while there are more than 16 segments, up to 256 (order 1, whose state read costs little) or 1024
/// (order 2; 2048 at D = 128, whose state is 9.1 MB). Not causal: no probe reads an intermediate state,
/// so the segments only give the fold enough blocks (`FOLD_BLOCKS`, or 4 per SM for order 1, over slabs ×
/// heads, at most 16).
/// Either way L grows further only while the states would exceed 8 GiB.
///
/// ```text
/// seg_len(64, 2, 200, 8, 2, true)        = 64      // 4 segments: short sequences keep C
/// seg_len(64, 2, 16384, 32, 2, true)     = 1024    // 16 segments × 32 heads × 1.25 MB = 640 MB
/// seg_len(64, 2, 1 << 20, 8, 2, true)    = 2048    // 1024 segments would take 10 GB
/// seg_len(64, 1, 16384, 32, 2, true)     = 256
/// seg_len(64, 1, 16384, 32, 2, false)    = 1024    // 16 segments: 512 fold blocks
/// seg_len(64, 2, 16384, 32, 2, false)    = 16384   // 19 slabs × 32 heads = 608 blocks already
/// ```
pub(crate) fn seg_len(
    d: usize,
    order: u8,
    n_s: usize,
    heads: usize,
    elem: usize,
    causal: bool,
) -> Option<usize> {
    let c = state_tile(d)?.c;
    let mut l = if causal {
        let cap = match (order, d) {
            (1, _) => 256,
            (_, 128) => 2048,
            _ => 1024,
        };
        let mut l = c;
        while l < cap && 16 * l < n_s {
            l *= 2;
        }
        l
    } else {
        let blocks = fold_slabs(d, order)? * heads.max(1);
        let target = if order == 1 {
            ORDER1_BLOCKS_PER_SM * H100_SMS
        } else {
            FOLD_BLOCKS
        };
        let segments = target.div_ceil(blocks).clamp(1, 16);
        n_s.div_ceil(segments).div_ceil(c).max(1) * c
    };
    let state = width(d) * f_pad(d, order) * state_entry_bytes(elem);
    while l < n_s && heads * n_s.div_ceil(l) * state > STATE_BUDGET {
        l *= 2;
    }
    Some(l)
}

/// Dynamic shared memory of the fold (`TaylorFoldSmem<T, D>::kBytes`); `elem` is the storage size
/// (4 for the f32 kernel, which keeps its sums in shared memory; the mma kernel keeps them in registers).
///
/// ```text
/// D = 64, bf16: 64·68·4 + 64·88·2 + 64·136·2 + 16·16 = 46 336
/// ```
pub(crate) fn fold_smem(d: usize, elem: usize) -> Option<usize> {
    let t = state_tile(d)?;
    let (f, pad) = (8 * t.nt, 16 / elem);
    let x = t.c * (d + 4) * 4;
    let y = t.c * (width_padded(d) + pad) * elem;
    let feat = t.c * (f + pad) * elem;
    let sums = if elem == 4 { width(d) * (f + 4) * 4 } else { 0 };
    Some(x + y + feat + sums + t.nt * 16)
}

/// Row tiles of 16 probes per warp of a state read (`TaylorReadSmem::RT`): two for the tensor-core value
/// read at D ≤ 64 (each step's state tile then serves 128 probes), else one.
fn read_row_tiles(d: usize, elem: usize, grad: bool) -> usize {
    if elem == 2 && !grad && d <= 64 {
        2
    } else {
        1
    }
}

/// Probes per block of the state reads (`TaylorReadSmem::BP`): 4 warps × 16 rows × the row tiles on
/// tensor cores, 32 for f32 (whose f64 sums take twice the space).
pub(crate) fn read_probes(d: usize, elem: usize, grad: bool) -> usize {
    if elem == 2 {
        64 * read_row_tiles(d, elem, grad)
    } else {
        32
    }
}

/// Dynamic shared memory of a state read (`TaylorReadSmem<T, D, GRAD>::kBytes`): z `[BP][D + 4]` f32;
/// for the gradient w `[BP][MP + pad]` and T `[BP][33]` f32, else Ψ `[BP][32 + pad]`; the S tiles
/// `[MP or M][32 + pad]` (tensor cores: two buffers, and hi and lo for the gradient); the sums `[BP][D + 1]`
/// (gradient) or `[BP][M]` (f32 value), f32 next to tensor cores and f64 for f32 inputs.
///
/// ```text
/// D = 64, bf16, value: 128·68·4 + 128·40·2 + 2·80·40·2 = 57 856
/// ```
pub(crate) fn read_smem(d: usize, elem: usize, grad: bool) -> Option<usize> {
    state_tile(d)?;
    let (bp, pad, kf) = (read_probes(d, elem, grad), 16 / elem, 8 * STEP_TILES);
    let mp = width_padded(d);
    let z = bp * (d + 4) * 4;
    let w = if grad { bp * (mp + pad) * elem } else { 0 };
    let feat = if grad {
        bp * (kf + 1) * 4
    } else {
        bp * (kf + pad) * elem
    };
    let (rows, tiles) = match (elem, grad) {
        (2, true) => (mp, 4),
        (2, false) => (mp, 2),
        _ => (width(d), 1),
    };
    let acc = if elem == 2 { 4 } else { 8 };
    let sums = match (grad, elem) {
        (true, _) => bp * (d + 1) * acc,
        (false, 2) => 0,
        (false, _) => bp * width(d) * acc,
    };
    Some(z + w + feat + tiles * rows * (kf + pad) * elem + sums)
}

/// Dynamic shared memory of the f16/bf16 forward tile kernel (`TaylorForwardSmem<T, D>::kBytes`): z f32
/// `[64][D + 4]` and T `[64][D + 8]`, the dense source tiles x `[BS][D + 8]` and y `[BS][MP + 8]` (BS =
/// 64, or 32 at D = 128 so that two blocks fit an SM), Ψ `[64][40]` and two S tiles `[MP][40]`.
///
/// ```text
/// D = 64:  64·68·4 + 64·72·2 + 64·72·2 + 64·88·2 + 64·40·2 + 2·80·40·2 = 65 024
/// D = 128: 64·132·4 + 64·136·2 + 32·136·2 + 32·152·2 + 64·40·2 + 2·144·40·2 = 97 792
/// ```
pub(crate) fn forward_smem(d: usize) -> Option<usize> {
    state_tile(d)?;
    let (mp, kf) = (width_padded(d), 8 * STEP_TILES);
    let (bp, bs) = (
        DENSE_PROBES,
        if d <= 64 { DENSE_SOURCES } else { DENSE_SOURCES / 2 },
    );
    let z = bp * (d + 4) * 4 + bp * (d + 8) * 2;
    let dense = bs * (d + 8 + mp + 8) * 2;
    Some(z + dense + bp * (kf + 8) * 2 + 2 * mp * (kf + 8) * 2)
}

/// Sources per chunk and chunks in flight of the order-1 fold (`Taylor1Fold::C`, `STAGES`).
const ORDER1_CHUNK: usize = 64;
const ORDER1_STAGES: usize = 2;

/// Blocks per segment of the order-1 fold (`Taylor1Fold::VSPLIT`): each takes a share of the m16 tiles
/// of the columns v, so that a thread's sums stay at 60 registers or fewer.
pub(crate) fn order1_fold_split(d: usize) -> usize {
    if d == 128 {
        3
    } else {
        1
    }
}

/// Dynamic shared memory of the order-1 fold (`Taylor1Fold::kBytes`): per stage the x and y tiles
/// `[64][D + 8]` in the storage type.
///
/// ```text
/// D = 64: 2·2·64·72·2 = 36 864
/// ```
pub(crate) fn order1_fold_smem(d: usize) -> usize {
    ORDER1_STAGES * 2 * ORDER1_CHUNK * (d + 8) * 2
}

/// Probes per block of the order-1 forward (`Taylor1Forward::BP`): 4 warps × 16 rows × 2 row tiles at
/// D ≤ 64, 1 at D = 128.
pub(crate) fn order1_probes(d: usize) -> usize {
    if d <= 64 {
        128
    } else {
        64
    }
}

/// Dynamic shared memory of the order-1 forward (`Taylor1Forward::kBytes`): two probe tiles q
/// `[BP][D + 8]` and the state's linear rows `[MP][D + 8]`, in the storage type.
///
/// ```text
/// D = 64: (2·128 + 80)·72·2 = 48 384
/// ```
pub(crate) fn order1_forward_smem(d: usize) -> usize {
    (2 * order1_probes(d) + width_padded(d)) * (d + 8) * 2
}

/// Dynamic shared memory of the order-1 backward (`Taylor1Backward::kBytes`): two stages of two probe
/// tiles `[BP][D + 8]` (dO and q, or v and k) and both copies of the state's linear rows `[D][D + 8]`, in
/// the storage type.
///
/// ```text
/// D = 64:  (4·128 + 2·64)·72·2   = 92 160
/// D = 128: (4·64 + 2·128)·136·2  = 139 264
/// ```
pub(crate) fn order1_backward_smem(d: usize) -> usize {
    (4 * order1_probes(d) + 2 * d) * (d + 8) * 2
}

/// Resident blocks per SM that the order-1 fold's grid aims for (4 fit: ≤ 128 registers, 38 KB).
const ORDER1_BLOCKS_PER_SM: usize = 4;

/// Blocks per (batch entry, kv head) of the order-1 forward, which loop over the probe tiles: at most
/// one wave (the blocks that fit an SM: 4 at D ≤ 64, 2 at D = 128 for their shared memory) over
/// `heads`, rounded down so that no block waits for a second wave, at most one per tile.
///
/// ```text
/// order1_forward_blocks(16_384, 64, 32, 132) = 16   // 128 tiles of 128 probes: 8 each
/// order1_forward_blocks(1024, 64, 512, 132)  = 1
/// ```
pub(crate) fn order1_forward_blocks(probes: usize, d: usize, heads: usize, sms: usize) -> usize {
    let per_sm = if d <= 64 { ORDER1_BLOCKS_PER_SM } else { 2 };
    blocks_per_head(probes, d, per_sm, heads, sms)
}

/// Blocks per (batch entry, kv head) of the order-1 backward's probe kernels, as
/// [`order1_forward_blocks`] with the blocks that Hopper's 227 KB of shared memory per SM holds (static
/// arrays included, at most 4): 4 at D ≤ 32, 2 at D = 64, 1 at D = 128.
///
/// ```text
/// order1_backward_blocks(16_384, 64, 32, 132) = 8   // 128 tiles of 128 probes: 16 each
/// ```
pub(crate) fn order1_backward_blocks(probes: usize, d: usize, heads: usize, sms: usize) -> usize {
    let per_sm = (227 * 1024 / (order1_backward_smem(d) + 8 * 1024)).clamp(1, ORDER1_BLOCKS_PER_SM);
    blocks_per_head(probes, d, per_sm, heads, sms)
}

/// At most one wave of `per_sm` blocks per SM over `heads`, at most one block per probe tile.
fn blocks_per_head(probes: usize, d: usize, per_sm: usize, heads: usize, sms: usize) -> usize {
    let tiles = probes.div_ceil(order1_probes(d)).max(1);
    (per_sm * sms / heads.max(1)).clamp(1, tiles)
}

/// Head dims of the order-1 causal kernels, forward and backward (`Taylor1Causal`): at D = 128 their f32
/// state and tiles would exceed sm_80's 163 KB of shared memory.
pub(crate) const ORDER1_CAUSAL_MAX_DIM: usize = 64;

/// Segment length of the order-1 causal forward, whose blocks each take the probes of one segment and
/// carry its state through it (so a segment costs one state, and the dense part is at most one chunk past
/// the carried boundary, whatever L): L doubles from 256 while there are more than 1600 blocks (about
/// six waves of an H100 at 2 blocks per SM), up to 1024, then while the f32 states would exceed the
/// budget.
///
/// ```text
/// order1_causal_seg_len(64, 16_384, 32)  = 512     // 32 segments × 32 heads = 1024 blocks
/// order1_causal_seg_len(64, 1024, 512)   = 512     // 2 segments × 512 heads = 1024 blocks (256: 2048)
/// order1_causal_seg_len(64, 1 << 20, 8)  = 1024
/// ```
pub(crate) fn order1_causal_seg_len(d: usize, n_s: usize, heads: usize) -> usize {
    let mut l = 256;
    while l < 1024 && heads * n_s.div_ceil(l) > 1600 {
        l *= 2;
    }
    let state = width(d) * f_pad(d, 1) * 4;
    while l < n_s && heads * n_s.div_ceil(l) * state > STATE_BUDGET {
        l *= 2;
    }
    l
}

/// Dynamic shared memory of an order-1 causal kernel (`Taylor1Causal`): `tiles` probe tiles `[64][D + 8]`
/// and two source blocks (x `[64][D + 8]`, y `[64][MP + 8]`) in the storage type, and `states` copies of
/// the state `[MP][D + 8]` in f32.
fn order1_causal_layout(d: usize, tiles: usize, states: usize) -> usize {
    let (bp, c, ld) = (DENSE_PROBES, ORDER1_CHUNK, d + 8);
    (tiles * bp * ld + 2 * c * ld + 2 * c * (width_padded(d) + 8)) * 2 + states * width_padded(d) * ld * 4
}

/// Dynamic shared memory of the order-1 causal forward (`Taylor1Causal::kBytes`): two q tiles, and the
/// state twice (the sums, and their tf32 rounding for the mma).
///
/// ```text
/// D = 64: (2·64·72 + 2·64·72 + 2·64·88)·2 + 2·80·72·4 = 105 472
/// ```
pub(crate) fn order1_causal_smem(d: usize) -> usize {
    order1_causal_layout(d, 2, 2)
}

/// Floats of one chain state of the single-pass causal order-1 forward (`Taylor1Chain::kStateFloats`):
/// the fold's accumulators of its threads in thread order, `NPW` n-tiles × `MP/16` m-tiles × 4 each.
///
/// ```text
/// D = 64: 3·5·4·128 = 7680
/// ```
pub(crate) fn order1_chain_state_floats(d: usize) -> usize {
    let npw = (1 + d / 8).div_ceil(4);
    npw * (width_padded(d) / 16) * 4 * THREADS as usize
}

/// Dynamic shared memory of the single-pass causal order-1 forward (`Taylor1Chain::kBytes`): the two-pass
/// forward's layout (two stages of q, k and ṽ; the tf32 state twice, here one per chunk parity).
pub(crate) fn order1_chain_smem(d: usize) -> usize {
    order1_causal_layout(d, 2, 2)
}

/// Dynamic shared memory of the single-pass causal order-1 forward on wgmma (`Taylor1ChainWg::kBytes`,
/// bf16, D = 64): two stages of the q, k, v tiles, the state as bf16 hi and lo tiles of 72 rows twice
/// (one per chunk parity), the ones tile, and 1 KiB to align the sw128 tiles.
///
/// ```text
/// 2·3·8192 + 4·72·128 + 8192 + 1024 = 95 232
/// ```
pub(crate) const ORDER1_CHAIN_WG_SMEM: usize = 2 * 3 * 8192 + 4 * 72 * 128 + 8192 + 1024;

/// Floats of one chain state of the single-pass causal order-1 forward on wgmma
/// (`Taylor1ChainWg::kStateFloats`): its fold's m64n72 accumulators (9 float4 per thread) and the value
/// sums (1 float4 per thread) of 128 threads.
pub(crate) const ORDER1_CHAIN_WG_STATE_FLOATS: usize = (9 + 1) * 4 * THREADS as usize;

/// How many rounds of segments the single-pass causal order-1 forward's fold blocks run ahead of its
/// forward blocks (`Taylor1Chain`'s tickets): 0 puts a segment's fold and forward blocks side by side
/// (the second read of the keys from L2), more shortens the forward blocks' wait for the previous
/// segment's sums.
pub(crate) const ORDER1_CHAIN_LOOKAHEAD: usize = 2;

/// Segment length of the single-pass causal order-1 forward: a forward block runs its segment's chunks
/// one after another (each carries the state to the next), a fold block sums the segment for the chain.
/// 1024 keys at every length (512 was slower at every N, 16k: 0.339 ms against 0.281; 2048 no faster;
/// H100, bf16, D = 64, 2026-11-27): one state of
/// [`order1_chain_state_floats`] per 1024 keys and kv head.
pub(crate) const ORDER1_CHAIN_SEG_LEN: usize = 1024;

/// Dynamic shared memory of the order-1 causal backward (`Taylor1Causal::kBytesBwd`): two stages of two
/// probe tiles (dO and q, or k and v), and the state once (the reads round it themselves).
///
/// ```text
/// D = 64: (4·64·72 + 2·64·72 + 2·64·88)·2 + 80·72·4 = 100 864
/// ```
pub(crate) fn order1_causal_bwd_smem(d: usize) -> usize {
    order1_causal_layout(d, 4, 1)
}

/// Bytes of one state entry: the f32 sum, and for f16/bf16 its storage-type copies (hi and lo).
fn state_entry_bytes(elem: usize) -> usize {
    if elem == 4 {
        4
    } else {
        4 + 2 * elem
    }
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

/// Blocks needed to cover `n` rows `per_block` at a time.
pub(crate) fn blocks(n: usize, per_block: usize) -> usize {
    n.div_ceil(per_block)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wgmma_state_kernels_split_and_shared_memory() {
        assert_eq!(wg_split_len(4096, 128, 132), 4096);
        assert_eq!(wg_split_len(65536, 32, 132), 32768);
        assert_eq!(wg_split_len(1 << 20, 8, 132), 131072);
        // A short sequence: at most one split per 64 keys, every split a whole number of chunks.
        assert_eq!(wg_split_len(100, 1, 132), 64);
        assert_eq!(wg_split_len(1, 1, 132), 64);
        // The kernels' layouts (TaylorWgFoldSmem, TaylorWgReadSmem) plus 1 KiB of slack.
        assert_eq!(WG_FOLD_SMEM, 82_752 + 1024);
        assert_eq!(WG_READ_SMEM, 101_136 + 1024);
        // Two blocks of each per SM on an H100 (228 KiB of shared memory, 1 KiB reserved per block).
        const { assert!(2 * (WG_READ_SMEM + 1024) <= 228 * 1024) };
        const { assert!(2 * (WG_FOLD_SMEM + 1024) <= 228 * 1024) };
        assert_eq!(WG_STATE_GROUPS, 4 + 4 + 16 * (4 + 3 + 2 + 1));
        assert_eq!(wg_causal_seg_len(8192), 2048);
        assert_eq!(wg_causal_seg_len(8193), 1024);
        assert!([wg_causal_seg_len(1), wg_causal_seg_len(1 << 20)]
            .iter()
            .all(|l| l % WG_READ_QUERIES == 0));
    }

    #[test]
    fn worked_examples() {
        assert_eq!(tiles(64, 1), 9);
        assert_eq!(tiles(64, 2), 297);
        assert_eq!(tiles(128, 2), 1105);
        assert_eq!(f_pad(64, 1), 96);
        assert_eq!(f_pad(64, 2), 2400);
        assert_eq!(f_pad(128, 2), 8864);
        assert_eq!(fold_slabs(64, 2), Some(19));
        assert_eq!(fold_slabs(128, 2), Some(139));
        assert_eq!(fold_smem(64, 2), Some(46_336));
        assert_eq!(read_smem(64, 2, false), Some(57_856));
        assert_eq!(read_probes(64, 2, false), 128);
        assert_eq!(forward_smem(64), Some(65_024));
        assert_eq!(forward_smem(128), Some(97_792));
        assert_eq!(read_probes(128, 2, false), 64);
        assert_eq!(order1_fold_smem(64), 36_864);
        assert_eq!(order1_forward_smem(64), 48_384);
        assert_eq!(order1_backward_smem(64), 92_160);
        assert_eq!(order1_backward_smem(128), 139_264);
        assert_eq!(order1_backward_blocks(16_384, 64, 32, 132), 8);
        assert_eq!(
            [16, 32, 64, 128].map(|d| order1_backward_blocks(1 << 20, d, 1, 100)),
            [400, 400, 200, 100]
        );
        assert_eq!(order1_forward_blocks(16_384, 64, 32, 132), 16);
        assert_eq!(order1_forward_blocks(1024, 64, 512, 132), 1);
        assert_eq!(order1_forward_blocks(0, 64, 4, 132), 1);
        assert_eq!(order1_causal_smem(64), 105_472);
        assert_eq!(order1_causal_bwd_smem(64), 100_864);
        assert_eq!(order1_causal_seg_len(64, 16_384, 32), 512);
        assert_eq!(order1_causal_seg_len(64, 1024, 512), 512);
        assert_eq!(order1_causal_seg_len(64, 1 << 20, 8), 1024);
        // The single-pass causal forward (Taylor1Chain): its layout is the two-pass forward's (two blocks
        // per SM on an H100), its chain states the fold's accumulators of 128 threads.
        assert_eq!(order1_chain_smem(64), 105_472);
        assert!(2 * (order1_chain_smem(64) + 1024) <= 228 * 1024);
        assert_eq!(
            [16, 32, 64].map(order1_chain_state_floats),
            [2 * 512, 2 * 3 * 512, 3 * 5 * 512] // NPW · MT · 4 · 128
        );
        const { assert!(ORDER1_CHAIN_SEG_LEN % ORDER1_CHUNK == 0) };
        // Its wgmma kernel: two blocks per SM, 5120 floats per state.
        const { assert!(2 * (ORDER1_CHAIN_WG_SMEM + 1024) <= 228 * 1024) };
        assert_eq!(ORDER1_CHAIN_WG_STATE_FLOATS, 5120);
        assert_eq!(seg_len(64, 2, 200, 8, 2, true), Some(64));
        assert_eq!(seg_len(64, 2, 16_384, 32, 2, true), Some(1024));
        assert_eq!(seg_len(64, 2, 1 << 20, 8, 2, true), Some(2048));
        assert_eq!(seg_len(64, 1, 16_384, 32, 2, true), Some(256));
        assert_eq!(seg_len(64, 1, 16_384, 32, 2, false), Some(1024));
        assert_eq!(seg_len(64, 2, 16_384, 32, 2, false), Some(16_384));
        assert_eq!(seg_len(128, 2, 110, 4, 4, true), Some(32));
        assert_eq!(seg_len(48, 2, 100, 1, 2, true), None);
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
            assert_eq!((t.c % 16, t.nt % STEP_TILES), (0, 0), "D = {d}");
            for elem in [2, 4] {
                let f = fold_smem(d, elem).expect("supported");
                assert!(f <= 163 * 1024, "fold D = {d}, elem {elem}: {f}");
                for grad in [false, true] {
                    let r = read_smem(d, elem, grad).expect("supported");
                    assert!(r <= 163 * 1024, "read D = {d}, elem {elem}, grad {grad}: {r}");
                    assert!(dense_smem(d, elem, grad) <= 163 * 1024);
                    assert!(forward_smem(d).expect("supported") <= 163 * 1024);
                }
                // Every probe row of a gradient read belongs to one thread of 128.
                assert!(read_probes(d, elem, true) <= THREADS as usize);
            }
            for order in [1, 2] {
                let slabs = fold_slabs(d, order).expect("supported");
                assert!(slabs * t.nt * 8 >= f_pad(d, order) && (slabs - 1) * t.nt * 8 < f_pad(d, order));
            }
            assert!(decode_step_smem(d, 64) <= 163 * 1024);
            assert!(order1_fold_smem(d) <= 163 * 1024 && order1_forward_smem(d) <= 163 * 1024);
            assert!(order1_backward_smem(d) <= 163 * 1024, "D = {d}");
            if d <= ORDER1_CAUSAL_MAX_DIM {
                assert!(order1_causal_smem(d) <= 163 * 1024, "D = {d}");
                assert!(order1_causal_bwd_smem(d) <= 163 * 1024, "D = {d}");
            }
            // The order-1 fold splits the m16 tiles of the columns (the last one opens at v = D) evenly.
            assert_eq!((width_padded(d) / 16) % order1_fold_split(d), 0, "D = {d}");
            assert_eq!(width_padded(d), d + 16, "D = {d}");
            // Its features (const and linear tiles) fit a state row.
            assert!(8 * (1 + d / 8) <= f_pad(d, 1), "D = {d}");
        }
        assert_eq!(state_tile(48), None);
        assert_eq!(fold_slabs(96, 2), None);
    }

    #[test]
    fn segments_are_whole_chunks_and_the_states_fit_the_budget() {
        for d in HEAD_DIMS {
            let c = state_tile(d).expect("tile").c;
            for order in [1, 2] {
                for n in [0, 1, 63, 64, 65, 1000, 16_384, 1 << 20] {
                    for (heads, elem, causal) in
                        [(1, 2, true), (32, 2, true), (256, 2, false), (32, 4, false)]
                    {
                        let l = seg_len(d, order, n, heads, elem, causal).expect("supported");
                        assert_eq!(l % c, 0, "D = {d}, order {order}, n = {n}");
                        let bytes =
                            heads * n.div_ceil(l) * width(d) * f_pad(d, order) * state_entry_bytes(elem);
                        assert!(
                            bytes <= STATE_BUDGET || l >= n,
                            "D = {d}, order {order}, n = {n}: {bytes}"
                        );
                    }
                }
            }
        }
    }

    /// `(D, C, NT)` of every `template <> struct TaylorTile<D> { ... C = .., NT = ..; };` line.
    fn kernel_tiles() -> Vec<(usize, usize, usize)> {
        let header = include_str!("../../kernels/taylor/taylor_common.cuh");
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
}
