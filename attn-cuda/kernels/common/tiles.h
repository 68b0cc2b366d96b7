// Tile shapes per head dim: specialisations only, no generic fallback, so an unsupported head dim
// cannot compile. Mirrored by attn_cuda::heuristics (host side: grid and shared-memory sizes).
// The mma.sync kernels run 4 warps (128 threads), the Hopper ones a warpgroup (128 threads) per 64
// resident rows; either way a warp owns 16 rows of the M side of its products.
#pragma once
#include <type_traits>

namespace attn {

constexpr int kThreads = 128;
constexpr int kWarps = 4;

// Forward: MT 16-row mma tiles per warp (each K/V fragment loaded from shared memory feeds MT
// MMAs), BM = 64·MT queries resident, BN keys per streamed K/V block.
template <int D> struct FwdTile;
template <> struct FwdTile<16> { static constexpr int MT = 2, BM = 128, BN = 64; };
template <> struct FwdTile<32> { static constexpr int MT = 2, BM = 128, BN = 64; };
template <> struct FwdTile<64> { static constexpr int MT = 2, BM = 128, BN = 64; };
template <> struct FwdTile<96> { static constexpr int MT = 2, BM = 128, BN = 64; };
template <> struct FwdTile<128> { static constexpr int MT = 2, BM = 128, BN = 32; };
template <> struct FwdTile<256> { static constexpr int MT = 1, BM = 64, BN = 32; };

// Backward dQ: MT 16-row tiles per warp, BM = 64·MT queries resident, BN keys per streamed block.
template <int D> struct DqTile;
template <> struct DqTile<16> { static constexpr int MT = 2, BM = 128, BN = 32; };
template <> struct DqTile<32> { static constexpr int MT = 2, BM = 128, BN = 32; };
template <> struct DqTile<64> { static constexpr int MT = 2, BM = 128, BN = 32; };
template <> struct DqTile<96> { static constexpr int MT = 1, BM = 64, BN = 64; };
template <> struct DqTile<128> { static constexpr int MT = 1, BM = 64, BN = 64; };
template <> struct DqTile<256> { static constexpr int MT = 1, BM = 64, BN = 32; };

// Backward dK/dV: MT 16-key tiles per warp, BN = 64·MT keys resident, BM queries per streamed
// block, DA of the D columns of dK and dV accumulated per block (D / DA blocks split the columns;
// each recomputes S and dP).
template <int D> struct DkvTile;
template <> struct DkvTile<16> { static constexpr int MT = 2, BN = 128, BM = 64, DA = 16; };
template <> struct DkvTile<32> { static constexpr int MT = 2, BN = 128, BM = 32, DA = 32; };
template <> struct DkvTile<64> { static constexpr int MT = 2, BN = 128, BM = 32, DA = 64; };
template <> struct DkvTile<96> { static constexpr int MT = 1, BN = 64, BM = 32, DA = 96; };
template <> struct DkvTile<128> { static constexpr int MT = 1, BN = 64, BM = 32, DA = 128; };
template <> struct DkvTile<256> { static constexpr int MT = 1, BN = 64, BM = 32, DA = 128; };

// Hyperbolic scores keep per-row scalars and row sums in registers besides the skeleton's tiles; where
// two 16-row tiles per warp would spill (ptxas, sm_90a: dQ and dK/dV at D = 64, the forward at
// D = 96) they take one. Every other head dim uses the skeleton's tile.
template <int D> struct LorentzFwdTile : FwdTile<D> {};
template <> struct LorentzFwdTile<96> { static constexpr int MT = 1, BM = 64, BN = 64; };
template <int D> struct LorentzDqTile : DqTile<D> {};
template <> struct LorentzDqTile<64> { static constexpr int MT = 1, BM = 64, BN = 64; };
template <int D> struct LorentzDkvTile : DkvTile<D> {};
template <> struct LorentzDkvTile<64> { static constexpr int MT = 1, BN = 64, BM = 32, DA = 64; };

// Hopper forward (flash_fwd_wg.cuh, sm_90a): BM / 64 warpgroups of 64 query rows (128 threads each), BN
// keys per streamed K/V block, MIN_BLOCKS blocks per SM (the launch bound), at the head dims with
// wgmma-sized O accumulators.
// D = 64: two blocks per SM (128 registers per thread), whose softmax and MMAs overlap each other's
// (measured on the H100: +20% over one block of BN = 128 for softmax, +13–17% for the hyperbolic
// scores, which spill 60–110 bytes at 128 registers); D = 128: one block (255 registers). Every score.
template <int D> struct WgFwdTile;
template <> struct WgFwdTile<64> { static constexpr int BM = 128, BN = 64, MIN_BLOCKS = 2; };
template <> struct WgFwdTile<128> { static constexpr int BM = 128, BN = 128, MIN_BLOCKS = 1; };

// Warp-specialised Hopper forward (flash_fwd_ws.cuh, sm_90a): BM / 64 consumer warpgroups of 64 query
// rows and a producer warpgroup (BM·2 + 128 threads, one block per SM), BN keys per stage, two stages
// of K and of V. D = 128: two consumers (measured on the H100: +12–28% over WgFwdTile<128>). D = 64:
// three, as FlashAttention-3 does there (two measured 0.87–1.02× the two blocks per SM of
// WgFwdTile<64>; three not yet measured).
template <int D> struct WsFwdTile;
template <> struct WsFwdTile<64> { static constexpr int BM = 192, BN = 128; };
template <> struct WsFwdTile<128> { static constexpr int BM = 128, BN = 128; };

// Hopper backward (flash_bwd_wg.cuh, sm_90a), one block per SM (ptxas: 206–255 registers; two blocks
// would spill hundreds of bytes). dQ: BM resident queries (64 per warpgroup), BN keys per streamed
// block: 128 at D = 64 (H100: +3–4% softmax forward+backward over 64, though ptxas spills 48 B, 80 B
// for the geodesic), 64 at D = 128. dK/dV: BN resident keys (64 per warpgroup), BM queries per
// streamed block: 128 at D = 64 (+6–15% over 64; 255 registers, no spills except cosine-sim's
// 60 B), 64 at D = 128 (the fused kernel's shape). Every score.
template <int D> struct WgDqTile;
template <> struct WgDqTile<64> { static constexpr int BM = 128, BN = 128; };
template <> struct WgDqTile<128> { static constexpr int BM = 128, BN = 64; };
template <int D> struct WgDkvTile;
template <> struct WgDkvTile<64> { static constexpr int BN = 128, BM = 128; };
template <> struct WgDkvTile<128> { static constexpr int BN = 128, BM = 64; };
// The warp-specialised dK/dV kernel (flash_bwd_ws.cuh; host: heuristics::ws_dkdv_tile,
// WS_DKDV_STAGES): WgDkvTile's tile (at D = 64, 128 queries per block spill 100 bytes within the
// consumers' 240 registers and 64 spill none, yet 128 measured 5–6% faster on the H100),
// kWsDkvStages stages of Q and dO.
template <int D> struct WsDkvTile;
template <> struct WsDkvTile<64> { static constexpr int BN = 128, BM = 128; };
template <> struct WsDkvTile<128> { static constexpr int BN = 128, BM = 64; };
constexpr int kWsDkvStages = 3;
// The hyperbolic scores' tile of it (host: heuristics::ws_dkdv_lorentz_tile): at D = 64, 64 queries
// per block (128 spill 440–490 bytes within 240 registers; 64: none for the squared Lorentz score,
// 12 bytes for the geodesic).
template <int D> struct LorentzWsDkvTile : WsDkvTile<D> {};
template <> struct LorentzWsDkvTile<64> { static constexpr int BN = 128, BM = 64; };
// The warp-specialised fused backward (flash_bwd_ws.cuh with kDq; host: heuristics::ws_fused_smem,
// WS_FUSED_STAGES): WsDkvTile's tile with two stages of Q and dO (three do not fit beside the two dS'ᵀ
// tiles and the dQ rows in 227 KiB).
constexpr int kWsFusedStages = 2;
// The warp-specialised dQ kernel (flash_bwd_ws.cuh; host: heuristics::ws_dq_tile, WS_DQ_STAGES):
// WgDqTile's tile, kWsDqKStages stages of K (a K block is read from its own block to the end of the
// next one) and kWsDqVStages of V.
template <int D> struct WsDqTile;
template <> struct WsDqTile<64> { static constexpr int BM = 128, BN = 128; };
template <> struct WsDqTile<128> { static constexpr int BM = 128, BN = 64; };
constexpr int kWsDqKStages = 4, kWsDqVStages = 3;

// The tile of a score: the skeleton's, or the hyperbolic one.
template <class Score, int D> using FwdTileOf = std::conditional_t<Score::kLorentz, LorentzFwdTile<D>, FwdTile<D>>;
template <class Score, int D> using DqTileOf = std::conditional_t<Score::kLorentz, LorentzDqTile<D>, DqTile<D>>;
template <class Score, int D> using DkvTileOf = std::conditional_t<Score::kLorentz, LorentzDkvTile<D>, DkvTile<D>>;
template <class Score, int D>
using WsDkvTileOf = std::conditional_t<Score::kLorentz, LorentzWsDkvTile<D>, WsDkvTile<D>>;

}  // namespace attn
