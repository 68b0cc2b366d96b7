// Forward pass of the flash skeleton on Hopper (sm_90a): warpgroup MMAs (wgmma) instead of
// mma.sync, the same scores, masks, online softmax and epilogue as flash_fwd.cuh (shared helpers).
//
// One block = BM / 64 warpgroups (128 threads each) = one (batch b, query head h, query tile of BM
// rows); warpgroup w owns rows 64w..64w+63, warp w' within it rows 16w'.., so every per-warp helper of
// the mma.sync kernel applies unchanged (one 16-row tile per warp, MT = 1). Q stays in shared memory;
// K and V blocks of BN keys stream through two buffers each (cp.async into the sw128 layout of
// wgmma.h). Both products read their B operand from shared memory: S = Q Kᵀ with Q from shared
// memory too, O += P V with P from registers (V transposed by the descriptor).
//
// Software pipeline (per key block j):
//   barrier (K_j and V_{j−1} have landed; every warp is done with block j − 1's products)
//   issue S_j = Q K_jᵀ, then O += P_{j−1} V_{j−1}       (both async)
//   cp.async K_{j+1} and V_j into the buffers of K_{j−1} and V_{j−2}  (under the products)
//   wait for S_j; scores and online softmax of block j  (overlaps P_{j−1} V_{j−1} on the tensor cores)
//   wait for P_{j−1} V_{j−1}; rescale O by α_j; P_j → A fragments
// so a K block is loaded one block ahead of its use, and V one block before its product, with one
// barrier per block. Load groups: 0 = {Q, K_0}, j + 1 = {K_{j+1}, V_j} (committed in block j).
#pragma once
#include "flash_fwd.cuh"
#include "../common/wgmma.h"

namespace attn {

// A consumer warp of the Hopper forwards (flash_fwd_wg, flash_fwd_ws) before its first key block: its
// two rows (of the 16 from wrow) and their key ranges, O = 0, the running state, and for cosine-sim
// with fused norms 1/‖q‖ of the rows (from the inv-norm row kernel).
template <class Score, int D, bool kQ0 = true>
__device__ __forceinline__ void wg_fwd_rows_init(const AttnParams& p, const SeqInfo& si, int h, int i0, int wrow,
                                                 int g, bool norms, int (&row)[1][2], int (&lo)[1][2],
                                                 int (&hi)[1][2], float (&acc_o)[1][D / 8][4], float (&m)[1][2],
                                                 float (&l)[1][2], float (&rq)[1][2]) {
    fwd_rows<1>(p, si, i0, wrow, g, row, lo, hi);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[0][dt][e] = 0.f;
    fwd_state_init<Score, 1, kQ0>(p, si, h, row, m, l, rq);
    if (norms) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
            if (row[0][r] < si.len_q) rq[0][r] = p.rq[si.dq_off(p, row[0][r], h) / D];
    }
}

// The wgmma operands of the Hopper forwards: warpgroup wg's 64 rows of the sw128 Q tile (BM rows),
// and two buffers of BN rows each of K and of V. k16 step kk of a K-major operand is column block
// kk / 4, +32 bytes per step inside it; of V, 16 rows = 2048 bytes. kK0 (Ops::tc_k0, the
// warp-specialised forward): S gains one more k16 step over the q0 panel (BM rows) and the K stage's
// k0 panel (BN rows each), sw128.
template <typename T, int D, int BM, int BN, bool kK0 = false>
struct WgFwdOperands {
    static constexpr uint32_t kTile = BN * D * 2;  // bytes of one K (or V) buffer
    Sw128Desc q_desc, k_desc, v_desc;              // at k16 step 0 of buffer 0
    Sw128Desc q0_desc, k0_desc;                    // kK0: the panels (buffer 0)
    __device__ __forceinline__ WgFwdOperands(const T* sQ, const T* sK, const T* sV, int wg, const T* sQ0p = nullptr,
                                             const T* sK0p = nullptr)
        : q_desc(smem_addr(sQ) + wg * 64 * 128, 16, 1024), k_desc(smem_addr(sK), 16, 1024),
          v_desc(smem_addr(sV), BN * 128, 1024), q0_desc(kK0 ? smem_addr(sQ0p) + wg * 64 * 128 : 0u, 16, 1024),
          k0_desc(kK0 ? smem_addr(sK0p) : 0u, 16, 1024) {}
    // Offsets in 16-byte units (Sw128Desc::at16).
    __device__ __forceinline__ uint64_t q(int kk) const { return q_desc.at16((kk / 4) * BM * 8 + (kk % 4) * 2); }
    __device__ __forceinline__ uint64_t k(int buf, int kk) const {
        return k_desc.at16(buf * (kTile / 16) + (kk / 4) * BN * 8 + (kk % 4) * 2);
    }
    __device__ __forceinline__ uint64_t v(int buf, int kk) const { return v_desc.at16(buf * (kTile / 16) + kk * 128); }

    // Issue S = Q K_kbufᵀ as one group, then O += P V_vbuf (when pv; empty otherwise) as a second.
    __device__ __forceinline__ void products(float (&s)[BN / 8][4], float (&acc_o)[D / 8][4],
                                             const uint32_t (&pa)[BN / 16][4], int kbuf, int vbuf, bool pv) const {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) Wgmma<T, BN>::ss(s, q(kk), k(kbuf, kk), kk > 0);
        if constexpr (kK0) Wgmma<T, BN>::ss(s, q0_desc.at16(0), k0_desc.at16(kbuf * BN * 8), 1);
        wg_commit();
        if (pv) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) Wgmma<T, D>::rs(acc_o, pa[kk], v(vbuf, kk), 1);
        }
        wg_commit();
    }

    // The last key block's O += P V_vbuf, waited for.
    __device__ __forceinline__ void last_pv(float (&acc_o)[D / 8][4], uint32_t (&pa)[BN / 16][4], int vbuf) const {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) Wgmma<T, D>::rs(acc_o, pa[kk], v(vbuf, kk), 1);
        wg_commit();
        wg_wait<0>();
        fence_regs<D / 8>(acc_o);
        fence_regs<BN / 16>(pa);
    }
};

// After a key block's P·V has landed: O rescaled by α (with a running max) and the block's
// probabilities as the A fragments of its own P·V.
template <typename T, class Score, int D, int BN>
__device__ __forceinline__ void wg_fwd_next_p(const AttnParams& p, float (&acc_o)[D / 8][4], const float (&alpha)[2],
                                              const float (&s)[BN / 8][4], uint32_t (&pa)[BN / 16][4]) {
    if (Score::Ops::rescales(p)) rescale_rows<D / 8>(acc_o, alpha);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) pack_a<T>(pa[kk], s[2 * kk], s[2 * kk + 1]);
}

template <typename T, int D, class Score, int BM, int BN>
__device__ __forceinline__ void flash_fwd_wg(const AttnParams& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int MT = 1;
    constexpr int kWgThreads = BM * 2;  // one warpgroup (128 threads) per 64 rows
    constexpr int NT = BN / 8;          // n8 tiles of S per warp
    constexpr int DT = D / 8;           // n8 tiles of O per warp
    static_assert(BM % 64 == 0 && BN % 64 == 0, "64 rows per warpgroup, whole sw128 row groups");

    // The sw128 layout needs 1024-byte alignment; the host adds 1 KiB of slack to the allocation.
    extern __shared__ __align__(1024) unsigned char smem_wg[];
    unsigned char* base = smem_wg + ((1024u - (smem_addr(smem_wg) & 1023u)) & 1023u);
    T* sQ = reinterpret_cast<T*>(base);  // [BM × D] sw128
    T* sK = sQ + BM * D;                 // [2][BN × D] sw128
    T* sV = sK + 2 * BN * D;             // [2][BN × D] sw128
    float* sK0 = reinterpret_cast<float*>(sV + 2 * BN * D);  // [2][BN] hyperbolic: k0
    float* sLg = sK0 + 2 * BN + BM;                           // [2][BN] hyperbolic midpoint: log γ_j

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
    int b, h;
    const int m_block = grid_tile<true>(p, b, h);
    const SeqInfo si(p, b);
    int i0, hk, n_first, n_count;
    if (!query_tile_at<BM, BN>(p, si, h, m_block, i0, hk, n_first, n_count)) return;

    const T* q = static_cast<const T*>(p.q) + si.q_off(p, 0, h);
    const T* k = static_cast<const T*>(p.k) + si.k_off(p, 0, hk);
    const T* v = static_cast<const T*>(p.v) + si.v_off(p, 0, hk);
    using Ops = typename Score::Ops;
    const bool norms = Ops::norms(p);  // K holds k̂ (the host's copy); rows scaled by 1/‖q‖
    const bool midpoint = Ops::midpoint(p);
    auto load_k = [&](int it) {
        const int buf = it & 1;
        load_tile_sw128<T, BN, D, kWgThreads>(sK + buf * BN * D, k, p.k_seq, (n_first + it) * BN, si.len_k, tid);
        load_key_scalars<Score, BN, D>(p, si, hk, n_first + it, sK0 + buf * BN, sLg + buf * BN, false, midpoint, tid);
    };
    auto load_v = [&](int it) {
        load_tile_sw128<T, BN, D, kWgThreads>(sV + (it & 1) * BN * D, v, p.v_seq, (n_first + it) * BN, si.len_k,
                                              tid);
    };

    load_tile_sw128<T, BM, D, kWgThreads>(sQ, q, p.q_seq, i0, si.len_q, tid);
    if (n_count > 0) load_k(0);
    cp_async_commit();

    const int g = lane / 4, t4 = lane % 4;
    int row[MT][2], lo[MT][2], hi[MT][2];
    float acc_o[MT][DT][4];
    float m[MT][2], l[MT][2], rq[MT][2];
    // The score's row scalars from the Q tile once it has landed (Ops::wg_fwd_q0: the hyperbolic q0,
    // so the row kernel before this one reads only the keys, dispatch::forward_forms_q0).
    wg_fwd_rows_init<Score, D, false>(p, si, h, i0, warp * 16, g, norms, row, lo, hi, acc_o, m, l, rq);
    const WgFwdOperands<T, D, BM, BN> ops(sQ, sK, sV, wg);
    Ops::template wg_fwd_q0<T, D, BM>(p, si, sQ, row, warp * 16 + g, t4, rq);

    uint32_t pa[BN / 16][4];  // P of the previous key block as A fragments
    for (int it = 0; it < n_count; ++it) {
        const int n = n_first + it, buf = it & 1;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();  // K_j, V_{j−1} have landed; every warp is done with block j − 1's products

        float s[MT][NT][4];
        ops.products(s[0], acc_o[0], pa, buf, buf ^ 1, it > 0);  // no P·V in block 0
        // K_{j+1} and V_j into the buffers of K_{j−1} and V_{j−2} (their products were waited for in
        // block j − 1), while the products run.
        if (it + 1 < n_count) load_k(it + 1);
        load_v(it);
        cp_async_commit();
        wg_wait<1>();
        fence_regs<NT>(s[0]);

        const int j0 = n * BN;
        const bool full = si.tile_full(p, i0, i0 + BM, j0, j0 + BN);
        float alpha[MT][2];
        fwd_block_scores<T, Score, MT, NT>(p, si, h, j0, full, false, s, m, l, alpha, rq, row, lo, hi,
                                           sK0 + buf * BN, sK0 + buf * BN, sLg + buf * BN, t4);
        wg_wait<0>();
        fence_regs<DT>(acc_o[0]);
        fence_regs<BN / 16>(pa);
        wg_fwd_next_p<T, Score, D, BN>(p, acc_o[0], alpha[0], s[0], pa);
    }
    if (n_count > 0) {  // the last block's P·V
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();
        ops.last_pv(acc_o[0], pa, (n_count - 1) & 1);
    }
    cp_async_wait<0>();
    fwd_epilogue<T, Score, MT, DT>(p, si, h, acc_o, m, l, row, t4);
#else
    __trap();  // launched only on compute capability 9.0 (host dispatch)
#endif
}

}  // namespace attn

// The Hopper (wgmma) forward of a score (NAME_fwd_wg_{f16,bf16}_d{64,128}), tile WgFwdTile.
#define ATTN_FLASH_FWD_WG(NAME, SCORE, DT, T, D)                                                                   \
    extern "C" __global__ void __launch_bounds__(attn::WgFwdTile<D>::BM * 2, attn::WgFwdTile<D>::MIN_BLOCKS)      \
        NAME##_fwd_wg_##DT##_d##D(const __grid_constant__ AttnParams p) {                                           \
        attn::flash_fwd_wg<T, D, SCORE, attn::WgFwdTile<D>::BM, attn::WgFwdTile<D>::BN>(p);                       \
    }
#define ATTN_FLASH_FWD_WG_ALL(NAME, SCORE)                  \
    ATTN_FLASH_FWD_WG(NAME, SCORE, f16, __half, 64)         \
    ATTN_FLASH_FWD_WG(NAME, SCORE, bf16, __nv_bfloat16, 64) \
    ATTN_FLASH_FWD_WG(NAME, SCORE, f16, __half, 128)        \
    ATTN_FLASH_FWD_WG(NAME, SCORE, bf16, __nv_bfloat16, 128)
