// Taylor order 2 on Hopper tensor cores (wgmma, sm_90a), D = Dv = 64, bf16: the factorised forward of
// docs/math.md §3 as products of whole 64 × 64 tiles, without a causal mask or with one where every
// sequence has as many queries as keys (query i sits on key i; see "Causal" below). With u_i = scale·q̂_i and
// k̂_j (taylor_common.cuh's symbols) and f(s) = a0 + a1 s + a2 s²,
//   num_i = a0 Σ_j v_j + a1 Σ_b u_ib S1[b] + a2 Σ_a u_ia Σ_b u_ib S2[a][b]
//   den_i = a0 n    + a1 u_i·Σ_j k̂_j    + a2 u_iᵀ K2 u_i
// with the states S1[b][·] = Σ_j k̂_jb v_j, S2[a][b][·] = Σ_j k̂_ja k̂_jb v_j (symmetric in a, b) and
// K2[b][c] = Σ_j k̂_jb k̂_jc. Three kernels:
//
// fold (grid (17 · splits, Hkv, B), one warpgroup): 68 SLOTS, each one 64 × 64 f32 product summed over
//   a split of the keys (tp.seg_len keys, chunks of 64), four slots per block:
//     slot a < 64:  S2[a]  = Σ_j (k̂_ja k̂_j) v_jᵀ   A = (k̂_a ∘ k̂)ᵀ,  B = V
//     slot 64:      S1     = Σ_j k̂_j v_jᵀ           A = k̂ᵀ,         B = V
//     slot 65:      K2     = Σ_j k̂_j k̂_jᵀ          A = k̂ᵀ,         B = k̂
//     slot 66:      Σ_j v_j (every row)             A = 1,          B = V
//     slot 67:      Σ_j k̂_j (every row)            A = 1,          B = k̂
//   (r_j = 1/max(‖k_j‖, eps) under qk_l2norm, else 1; k̂_j = bf16(r_j k_j)). K and V chunks of 64 keys
//   stream through three sw128 stages (cp.async); A comes from registers: Kᵀ's fragments by
//   ldmatrix.trans, times the multipliers bf16(r_j² k_ja) in one bf16x2 multiply (without qk_l2norm
//   k_ja k_jb rounded once, as the mma fold rounds its features; with it one more rounding). Blocks
//   0–15 hold four quadratic slots each, block 16 the special ones (its K tile normalised in place).
//   Each block writes its four f32 sums to tp.st [B][Hkv][splits][68][64][64]; with one split (tp.n_seg
//   = 1) it writes its rows of the read's state and vector itself instead, as the reduce would.
// reduce (grid (169, Hkv, B), several splits only): sums the splits in order (the same bits every run) and writes the read's
//   state in bf16 (tp.st_t, [B][Hkv][168 k16 groups][16][64], each group a sw128 tile of 16 rows) with the
//   coefficients folded in: groups 0–3 a2·K2, 4–7 a1·S1, then for a = 0…63 the rows b ≥ 16⌊a/16⌋ of
//   a2·c_ab·S2[a] (c_ab = 2 for b > a, 1 for b = a, 0 below: each pair once, the symmetry of k⊗k), 160
//   groups where 256 would hold every row; and the f32 vector tp.st_vec [B][Hkv][132]: a0 Σ_j v_j [64],
//   a1 Σ_j k̂_j [64], a0 n [1].
// read (grid (⌈seq_q/128⌉, Hq, B), one warpgroup, two m64 tiles of queries): U = u rounded to bf16 in
//   registers (the A fragments); the 168 groups stream through a ring of five 16 KiB stages (cp.async,
//   three in flight). First Y = U·(a2 K2), den = a0 n + u·(a1 Σk̂) + rowsum(U ∘ Y); then
//   O = a0 Σv + U·(a1 S1) + Σ_a (u_a ∘ U)·(a2 c S2[a]) on the k16 steps of the stored rows, A = u_ia·U
//   rounded once to bf16 (one bf16x2 multiply per register); o = O/den, den saved as the statistic. A
//   sequence without keys gets o = 0, den = 0 (its state was never written).
//
// Causal (P.causal ≠ 0, len_q = len_k; tp.seg_len = L, a multiple of 128, tp.n_seg = states per head):
// the fold runs one split over the keys before the last segment's start and, each time its sums pass
// a multiple m·L, writes state m − 1 (the keys before m·L, layout and coefficients as above, through a
// shared-memory staging copied out by cp.async.bulk) without resetting them; no reduce. The read's
// block at i0 (segment m = ⌊i0/L⌋) first takes the keys m·L … i0 + 127 densely: 64-key tiles of K and V
// in ring stages 3 and 4, S = U·K̂ᵀ (B K-major; r_j applied to S in f32 under qk_l2norm), f(S) for
// j ≤ i, den += Σ f in f32, O += bf16(f)·V; then, for m ≥ 1, state m − 1 as above (Y in S's registers).
//
// Cost per (token, head): the fold 68 · 64 · 64 · 2 = 557k FLOP, the read 168 · 16 · 64 · 2 = 344k (the
// ideal factorisation, 4·F·M = 558k, counts each of the 2145 features once, both sides).
#pragma once
#include "../common/loads.h"
#include "../common/online_softmax.h"
#include "taylor_common.cuh"
#include "../common/wgmma.h"

namespace attn {

constexpr int kWgD = 64;              // head dim = value head dim
constexpr int kWgChunk = 64;          // keys per fold step
constexpr int kWgSlots = 68;          // fold products (above)
constexpr int kWgSlotsPerBlock = 4;   // per fold block (128 accumulator registers per thread)
constexpr int kWgFoldBlocks = kWgSlots / kWgSlotsPerBlock;  // 17 per (split, kv head, batch entry)
constexpr int kWgGroups = 168;        // k16 groups of the read's state: 4 (K2) + 4 (S1) + 16·(4 + 3 + 2 + 1)
constexpr int kWgGroupElems = 16 * kWgD;  // one k16 group: 16 rows × 64 columns
constexpr int kWgStateElems = kWgGroups * kWgGroupElems;  // per (batch entry, kv head)
constexpr int kWgVec = 132;           // a0 Σv [64], a1 Σk̂ [64], a0 n [1], padding
constexpr int kWgQueries = 128;       // queries per read block (two m64 tiles)
constexpr int kWgStageGroups = 8;     // k16 groups per ring stage (16 KiB)
constexpr int kWgStages = 5;          // ring stages; stage s + 3 is loaded at the start of stage s
static_assert(kWgSlots % kWgSlotsPerBlock == 0, "whole fold blocks");
static_assert(kWgGroups % kWgStageGroups == 0, "whole ring stages");

// Shared memory of the fold (bytes from a 1024-aligned base; the host adds 1 KiB of slack):
// K (k̂ in the special block), V [3][64 × 64] sw128; the multipliers [4][LDM] bf16; r [64] f32.
struct TaylorWgFoldSmem {
    static constexpr int LDM = kWgChunk + 8;
    static constexpr int kTile = kWgChunk * kWgD * 2;
    static constexpr int kK = 0;
    static constexpr int kV = kK + 3 * kTile;
    static constexpr int kM = kV + 3 * kTile;
    static constexpr int kR = kM + kWgSlotsPerBlock * LDM * 2;
    // The state's staging: [4 slots][4 warps] k16 groups of 2 KiB, copied out by the bulk engine.
    static constexpr int kEmit = kR + kWgChunk * 4;
    static constexpr int kBytes = kEmit + kWgSlotsPerBlock * 4 * kWgGroupElems * 2;
};
static_assert(TaylorWgFoldSmem::kEmit % 16 == 0, "bulk copies from 16-byte aligned shared memory");

// Shared memory of the read: the ring [5][8 groups] (1024-aligned stages), q/u [128][LDQ] plain, the vector.
struct TaylorWgReadSmem {
    static constexpr int LDQ = kWgD + 8;
    static constexpr int kStage = kWgStageGroups * kWgGroupElems * 2;
    static constexpr int kRing = 0;
    static constexpr int kQ = kRing + kWgStages * kStage;
    static constexpr int kVec = kQ + kWgQueries * LDQ * 2;
    static constexpr int kR = kVec + kWgVec * 4;  // causal: r_j of the dense part's key tile [64]
    static constexpr int kBytes = kR + kWgChunk * 4;
    // Causal: the dense part's K and V tiles (64 keys, sw128) in ring stages 3 and 4 (loaded only after it).
    static constexpr int kDense = kRing + 3 * kStage;
};
static_assert(TaylorWgReadSmem::kStage == 2 * kWgChunk * kWgD * 2, "a ring stage holds one K and one V tile");

template <int N> struct IntC { static constexpr int value = N; };

__device__ __forceinline__ float bf16_lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t x, uint32_t y) {
    __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&x), *reinterpret_cast<__nv_bfloat162*>(&y));
    return *reinterpret_cast<uint32_t*>(&r);
}

// d (+)= A·B for one k16 step of m64n64, bf16, A from registers and B K-major in shared memory (the
// causal read's S = U·K̂ᵀ over a [64 keys][64] tile; wgmma.h's rs takes B MN-major).
__device__ __forceinline__ void wg_rs_kmajor(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
          "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
          "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// The fold slot and coefficient row of k16 group G of the read's state: {slot, kk, a} with a = −1 for
// K2 (G < 4) and S1 (G < 8).
struct WgGroup {
    int slot, kk, a;
};
__host__ __device__ constexpr WgGroup wg_group(int G) {
    if (G < 4) return {65, G, -1};
    if (G < 8) return {64, G - 4, -1};
    const int q = G - 8;
    if (q < 64) return {q / 4, q % 4, q / 4};
    if (q < 112) return {16 + (q - 64) / 3, 1 + (q - 64) % 3, 16 + (q - 64) / 3};
    if (q < 144) return {32 + (q - 112) / 2, 2 + (q - 112) % 2, 32 + (q - 112) / 2};
    return {48 + (q - 144), 3, 48 + (q - 144)};
}

// The k16 group that holds rows 16kk … 16kk + 15 of fold slot `slot` < 66 (the inverse of wg_group), or
// −1 where those rows are not kept (slot a < 64 with kk < ⌊a/16⌋).
__device__ __forceinline__ int wg_group_index(int slot, int kk) {
    if (slot == 65) return kk;
    if (slot == 64) return 4 + kk;
    const int q = slot / 16;
    if (kk < q) return -1;
    // 16 slots of 4 − i groups for each i < q, then (slot − 16q) slots of 4 − q.
    const int before = 16 * (4 * q - q * (q - 1) / 2) + (slot - 16 * q) * (4 - q);
    return 8 + before + (kk - q);
}

// The coefficient folded into row b of fold slot `slot` < 66: a1 (S1), a2 (K2), a2·c_ab (S2[a]: c = 2
// above the diagonal, 1 on it, 0 below).
__device__ __forceinline__ float wg_coef(const TaylorParams& tp, int slot, int b) {
    if (slot == 64) return tp.a1;
    if (slot == 65) return tp.a2;
    return tp.a2 * quad_weight(slot, b);
}

// Element offset of (row r of 16, column c) of k16 group G: sw128 within the group, the 16-byte chunk
// c / 8 of row r at chunk (c / 8) ^ (r % 8).
__device__ __forceinline__ int wg_state_offset(int G, int r, int c) {
    return G * kWgGroupElems + r * kWgD + (((c / 8) ^ (r & 7)) * 8) + c % 8;
}

// r_j = 1/max(‖k_j‖, eps) of key j = tid / 2 of a [64][64] sw128 K tile (128 threads; thread → columns
// 32·(tid % 2) …, the pair summed by one shuffle), with the thread's four 16-byte chunks of the row.
__device__ __forceinline__ float wg_key_inv_norm(const unsigned char* k_tile, float eps, int tid, uint4 (&chunk)[4]) {
    const int j = tid / 2, half = tid % 2;
    float ss = 0.f;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        chunk[q] = *reinterpret_cast<const uint4*>(k_tile + sw128_offset<kWgChunk>(j, 32 * half + 8 * q));
        const uint32_t w[4] = {chunk[q].x, chunk[q].y, chunk[q].z, chunk[q].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) ss += bf16_lo(w[e]) * bf16_lo(w[e]) + bf16_hi(w[e]) * bf16_hi(w[e]);
    }
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);
    return 1.f / fmaxf(sqrtf(ss), eps);
}

// The row of wg_key_inv_norm (its chunks as read) times r, written back in place (bf16, one rounding).
__device__ __forceinline__ void wg_scale_key_rows(unsigned char* k_tile, float r, const uint4 (&chunk)[4], int tid) {
    const int j = tid / 2, half = tid % 2;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const uint32_t w[4] = {chunk[q].x, chunk[q].y, chunk[q].z, chunk[q].w};
        uint32_t o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = pack2<__nv_bfloat16>(r * bf16_lo(w[e]), r * bf16_hi(w[e]));
        *reinterpret_cast<uint4*>(k_tile + sw128_offset<kWgChunk>(j, 32 * half + 8 * q)) = make_uint4(o[0], o[1], o[2], o[3]);
    }
}

// One fold block's chunk loop. kSpecial: slots 64–67 (A = k̂ᵀ or 1; under qk_l2norm the K tile is
// normalised in place first, as B of K2 and Σk̂); else four quadratic slots a = slot0 … slot0 + 3, A =
// Kᵀ ∘ m with the multipliers m_j = bf16(r_j² k_ja) (one rounding; k_ja exactly when r = 1) from a
// [4][64] shared row. Kᵀ's fragments come from the sw128 tile by ldmatrix.trans.
template <bool kSpecial, typename Emit>
__device__ __forceinline__ void taylor_wg_fold_chunks(const TaylorParams& tp, const SeqInfo& si, unsigned char* base,
                                                      int slot0, int j_begin, int j_end,
                                                      float (&acc)[kWgSlotsPerBlock][kWgD / 8][4], Emit emit) {
    using T = __nv_bfloat16;
    using L = TaylorWgFoldSmem;
    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, t4 = lane % 4;
    const int hk = blockIdx.y;
    T* sK = reinterpret_cast<T*>(base + L::kK);
    T* sV = reinterpret_cast<T*>(base + L::kV);
    T* sM = reinterpret_cast<T*>(base + L::kM);    // multipliers [4][LDM]
    float* sR = reinterpret_cast<float*>(base + L::kR);  // r_j [64]
    const T* kbase = static_cast<const T*>(P.k) + si.k_off(P, 0, hk);
    const T* vbase = static_cast<const T*>(P.v) + si.v_off(P, 0, hk);
    const int n_chunks = (j_end - j_begin + kWgChunk - 1) / kWgChunk;
    auto load = [&](int c) {
        const int j0 = j_begin + c * kWgChunk;
        load_tile_sw128<T, kWgChunk, kWgD, 128>(sK + (c % 3) * kWgChunk * kWgD, kbase, P.k_seq, j0, j_end, tid);
        load_tile_sw128<T, kWgChunk, kWgD, 128>(sV + (c % 3) * kWgChunk * kWgD, vbase, P.v_seq, j0, j_end, tid);
    };
    load(0);
    cp_async_commit();
    if (n_chunks > 1) load(1);
    cp_async_commit();

    for (int c = 0; c < n_chunks; ++c) {
        cp_async_wait<1>();  // chunk c has landed (c + 1 may be in flight)
        fence_proxy_async();
        __syncthreads();  // chunk c visible; every warp is done with chunk c − 1 (its products waited)
        if (c + 2 < n_chunks) load(c + 2);  // into the stage chunk c − 1 used
        cp_async_commit();
        const int stage = c % 3;
        unsigned char* k_tile = reinterpret_cast<unsigned char*>(sK + stage * kWgChunk * kWgD);

        // r_j = 1/max(‖k_j‖, eps) under qk_l2norm (thread → key j = tid / 2, columns 32·(tid % 2) …); the
        // special block writes k̂ = bf16(r k) over the tile.
        if (P.l2norm) {
            const int j = tid / 2, half = tid % 2;
            uint4 chunk[4];
            const float r = wg_key_inv_norm(k_tile, P.eps, tid, chunk);
            if (kSpecial) {
                wg_scale_key_rows(k_tile, r, chunk, tid);
                fence_proxy_async();  // k̂ in place: B of K2 and Σk̂
            } else if (half == 0) {
                sR[j] = r;
            }
            __syncthreads();
        }
        if (!kSpecial) {
            // m_j for slot s = tid / 32 and keys 2·(tid % 32), + 1.
            const int s = tid / 32, j = 2 * (tid % 32), a = slot0 + s;
            const unsigned short* kt = reinterpret_cast<const unsigned short*>(k_tile);
            uint32_t m = (uint32_t)kt[sw128_offset<kWgChunk>(j, a) / 2] | ((uint32_t)kt[sw128_offset<kWgChunk>(j + 1, a) / 2] << 16);
            if (P.l2norm) m = pack2<T>(sR[j] * sR[j] * bf16_lo(m), sR[j + 1] * sR[j + 1] * bf16_hi(m));
            *reinterpret_cast<uint32_t*>(sM + s * L::LDM + j) = m;
            __syncthreads();
        }

        // A's base fragments (rows b = 16·warp + g, + 8; keys 16kk + 2t4 + {0, 1}, + 8): Kᵀ (k̂ᵀ in the
        // special block) by ldmatrix.trans: lane l gives key 16kk + 8·(m / 2) + l % 8, columns
        // 16·warp + 8·(m % 2) … of matrix m = l / 8.
        uint32_t kb[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const int m = lane / 8;
            ldsm_x4_trans(kb[kk], k_tile + sw128_offset<kWgChunk>(16 * kk + 8 * (m / 2) + lane % 8, 16 * warp + 8 * (m % 2)));
        }

        uint32_t af[2][4][4];
        constexpr uint32_t kOnes = 0x3F803F80u;  // bf16x2 (1, 1)
#pragma unroll
        for (int s = 0; s < kWgSlotsPerBlock; ++s) {
            uint32_t(&a)[4][4] = af[s & 1];
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    const int j = 16 * kk + 2 * t4 + 8 * hf;
                    const uint32_t m = kSpecial ? 0u : *reinterpret_cast<const uint32_t*>(sM + s * L::LDM + j);
#pragma unroll
                    for (int rs = 0; rs < 2; ++rs) {
                        const int ri = 2 * hf + rs;
                        a[kk][ri] = !kSpecial ? bf16x2_mul(kb[kk][ri], m) : (s < 2 ? kb[kk][ri] : kOnes);
                    }
                }
            // B: V, except K2 (slot 65) and Σk̂ (67): k̂.
            const bool b_is_k = kSpecial && (s == 1 || s == 3);
            const uint32_t b_addr = smem_addr(b_is_k ? sK + stage * kWgChunk * kWgD : sV + stage * kWgChunk * kWgD);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) Wgmma<T, kWgD>::rs(acc[s], a[kk], mnmajor_desc<kWgChunk>(b_addr, kk), 1);
            wg_commit();
            wg_wait<1>();  // the previous slot's products are done: its A registers may be rewritten
        }
        wg_wait<0>();
        fence_regs(acc[0]);
        fence_regs(acc[1]);
        fence_regs(acc[2]);
        fence_regs(acc[3]);
        emit(j_begin + (c + 1) * kWgChunk);  // the sums over the keys before this point are complete
    }
}

// Bulk asynchronous copy global[dst, dst + bytes) = shared[src, src + bytes) (sm_90; 16-byte aligned, bytes a
// multiple of 16) in the calling thread's bulk group; the same rules as bulk_reduce_add_f32 (wgmma.h).
__device__ __forceinline__ void bulk_copy_to_global(void* dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
}

// One fold block's rows of the read's state (bf16, coefficients folded in) and vector, from its four sums
// over the first n_keys keys: warp w holds rows 16w … 16w + 15 of every slot, k16 group kk = w, written
// into its 2 KiB of `stage` in the group's own (swizzled) layout and copied out whole by lane 0 (the
// bulk engine, off the warp's instruction stream; the next call first waits until those copies have
// read the staging).
__device__ __forceinline__ void taylor_wg_write_state(const TaylorParams& tp, int slot0,
                                                      const float (&acc)[kWgSlotsPerBlock][kWgD / 8][4],
                                                      __nv_bfloat16* dst, float* vec, int n_keys,
                                                      unsigned char* stage) {
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const int b0 = 16 * warp + g;
    if (lane == 0) bulk_wait_read<0>();
    __syncwarp();
#pragma unroll
    for (int s = 0; s < kWgSlotsPerBlock; ++s) {
        const int slot = slot0 + s;
        if (slot >= 66) {
            // Σv, Σk̂: row 0 (warp 0, g = 0), and a0 n.
            if (warp == 0 && g == 0)
#pragma unroll
                for (int n = 0; n < kWgD / 8; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        vec[(slot - 66) * kWgD + 8 * n + 2 * t4 + e] = (slot == 66 ? tp.a0 : tp.a1) * acc[s][n][e];
            if (slot == 66 && tid == 0) vec[2 * kWgD] = tp.a0 * (float)n_keys;
            continue;
        }
        if (wg_group_index(slot, warp) < 0) continue;
        __nv_bfloat16* st = reinterpret_cast<__nv_bfloat16*>(stage) + (s * 4 + warp) * kWgGroupElems;
#pragma unroll
        for (int rh = 0; rh < 2; ++rh) {
            const int r = g + 8 * rh;
            const float coef = wg_coef(tp, slot, b0 + 8 * rh);
#pragma unroll
            for (int n = 0; n < kWgD / 8; ++n)
                *reinterpret_cast<uint32_t*>(st + wg_state_offset(0, r, 8 * n + 2 * t4)) =
                    pack2<__nv_bfloat16>(coef * acc[s][n][2 * rh], coef * acc[s][n][2 * rh + 1]);
        }
    }
    fence_proxy_async();  // the staging, visible to the bulk copies
    __syncwarp();
    if (lane == 0) {
#pragma unroll
        for (int s = 0; s < kWgSlotsPerBlock; ++s) {
            const int grp = slot0 + s < 66 ? wg_group_index(slot0 + s, warp) : -1;
            if (grp >= 0)
                bulk_copy_to_global(dst + (long long)grp * kWgGroupElems,
                                    smem_addr(stage + (s * 4 + warp) * kWgGroupElems * 2), kWgGroupElems * 2);
        }
        bulk_commit();
    }
}

// The fold. tp.seg_len keys per split (a multiple of 64); blockIdx.x = split · 17 + slot block.
__device__ __forceinline__ void taylor_wg_fold(const TaylorParams& tp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using L = TaylorWgFoldSmem;
    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const int blk = blockIdx.x % kWgFoldBlocks, split = blockIdx.x / kWgFoldBlocks;
    const int hk = blockIdx.y, b = blockIdx.z;
    const SeqInfo si(P, b);
    // Causal: one split over the keys before the last segment's start (seg_len is then the segment of the
    // states it writes; the last segment's queries take the keys after it densely).
    const int j_begin = P.causal != 0 ? 0 : split * tp.seg_len;
    const int j_end = P.causal != 0 ? max(si.len_k - 1, 0) / tp.seg_len * tp.seg_len
                                    : min(si.len_k, j_begin + tp.seg_len);
    if (j_begin >= j_end) return;  // no key here: the reduce reads the splits that have keys only

    extern __shared__ __align__(1024) unsigned char smem_wg[];
    unsigned char* base = smem_wg + ((1024u - (smem_addr(smem_wg) & 1023u)) & 1023u);
    if (dynamic_smem_bytes() < (unsigned)L::kBytes + 1024u) __trap();

    float acc[kWgSlotsPerBlock][kWgD / 8][4];
#pragma unroll
    for (int s = 0; s < kWgSlotsPerBlock; ++s)
#pragma unroll
        for (int n = 0; n < kWgD / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[s][n][e] = 0.f;
    const int slot0 = blk * kWgSlotsPerBlock;
    const long long head = (long long)b * P.heads_kv + hk;
    __nv_bfloat16* st_t = static_cast<__nv_bfloat16*>(tp.st_t);
    // Causal: the state of segment m ≥ 1 (index m − 1) is the sum over the keys before m·seg_len, written
    // as the sums pass that point (the read's queries of segment m take the rest densely).
    auto emit = [&](int end) {
        if (P.causal != 0 && end % tp.seg_len == 0 && end < si.len_k) {
            const long long idx = head * tp.n_seg + end / tp.seg_len - 1;
            taylor_wg_write_state(tp, slot0, acc, st_t + idx * kWgStateElems, tp.st_vec + idx * kWgVec, end,
                                  base + L::kEmit);
        }
    };
    if (slot0 < kWgD) taylor_wg_fold_chunks<false>(tp, si, base, slot0, j_begin, j_end, acc, emit);
    else taylor_wg_fold_chunks<true>(tp, si, base, slot0, j_begin, j_end, acc, emit);
    if (P.causal != 0) {
        if (lane == 0) bulk_wait<0>();  // the last states' copies are complete before the block exits
        return;
    }

    const int b0 = 16 * warp + g;
    if (tp.n_seg == 1) {
        // One split: the read's state straight from the accumulators (no f32 sums, no reduce).
        taylor_wg_write_state(tp, slot0, acc, st_t + head * kWgStateElems, tp.st_vec + head * kWgVec, si.len_k,
                              base + L::kEmit);
        if (lane == 0) bulk_wait<0>();
        return;
    }
    // The four sums: rows b (16 per warp), columns 8n + 2t4 + {0, 1}.
    float* out = tp.st + ((head * tp.n_seg + split) * kWgSlots + slot0) * kWgD * kWgD;
#pragma unroll
    for (int s = 0; s < kWgSlotsPerBlock; ++s)
#pragma unroll
        for (int n = 0; n < kWgD / 8; ++n)
#pragma unroll
            for (int rh = 0; rh < 2; ++rh) {
                const int row = b0 + 8 * rh, col = 8 * n + 2 * t4;
                *reinterpret_cast<float2*>(out + (s * kWgD + row) * kWgD + col) =
                    make_float2(acc[s][n][2 * rh], acc[s][n][2 * rh + 1]);
            }
#endif
}

// The reduce (128 threads): blockIdx.x < 168 is k16 group G (thread → row r = tid / 8 of 16, columns 8·(tid % 8) …),
// block 168 the vector.
__device__ __forceinline__ void taylor_wg_reduce(const TaylorParams& tp) {
    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const SeqInfo si(P, b);
    const int splits = (si.len_k + tp.seg_len - 1) / tp.seg_len;
    const long long head = (long long)b * P.heads_kv + hk;
    const float* part = tp.st + head * tp.n_seg * kWgSlots * kWgD * kWgD;
    constexpr long long kSplit = (long long)kWgSlots * kWgD * kWgD;
    if (blockIdx.x == kWgGroups) {
        // a0 Σ_j v_j (slot 66, row 0), a1 Σ_j k̂_j (slot 67, row 0), a0 n.
        const int slot = tid < kWgD ? 66 : 67, col = tid % kWgD;
        float s = 0.f;
        for (int k = 0; k < splits; ++k) s += part[k * kSplit + (long long)slot * kWgD * kWgD + col];
        tp.st_vec[head * kWgVec + tid] = (tid < kWgD ? tp.a0 : tp.a1) * s;
        if (tid == 0) tp.st_vec[head * kWgVec + 2 * kWgD] = tp.a0 * (float)si.len_k;
        return;
    }
    const WgGroup grp = wg_group(blockIdx.x);
    const int r = tid / 8, cc = tid % 8;
    const int row = 16 * grp.kk + r;
    const float coef = wg_coef(tp, grp.slot, row);
    float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const float* src = part + ((long long)grp.slot * kWgD + row) * kWgD + 8 * cc;
    for (int k = 0; k < splits; ++k) {
        const float4 x = *reinterpret_cast<const float4*>(src + k * kSplit);
        const float4 y = *reinterpret_cast<const float4*>(src + k * kSplit + 4);
        s[0] += x.x, s[1] += x.y, s[2] += x.z, s[3] += x.w, s[4] += y.x, s[5] += y.y, s[6] += y.z, s[7] += y.w;
    }
    uint4 o;
    o.x = pack2<__nv_bfloat16>(coef * s[0], coef * s[1]);
    o.y = pack2<__nv_bfloat16>(coef * s[2], coef * s[3]);
    o.z = pack2<__nv_bfloat16>(coef * s[4], coef * s[5]);
    o.w = pack2<__nv_bfloat16>(coef * s[6], coef * s[7]);
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(tp.st_t) + head * kWgStateElems +
                         wg_state_offset(blockIdx.x, r, 8 * cc);
    *reinterpret_cast<uint4*>(dst) = o;
}

// The read. blockIdx.x = tile of 128 queries, blockIdx.y = query head.
__device__ __forceinline__ void taylor_wg_read(const TaylorParams& tp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using T = __nv_bfloat16;
    using L = TaylorWgReadSmem;
    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / P.group;
    const SeqInfo si(P, b);
    const int i0 = blockIdx.x * kWgQueries;
    if (i0 >= si.len_q) return;
    const bool causal = P.causal != 0;
    if (!causal && si.len_k == 0) {
        // No key: o = 0 and den = 0 (the fold wrote no state for this sequence).
        for (int x = tid; x < kWgQueries * kWgD; x += 128) {
            const int i = i0 + x / kWgD;
            if (i < si.len_q) static_cast<T*>(P.o)[si.o_off(P, i, h) + x % kWgD] = from_f32<T>(0.f);
            if (i < si.len_q && x % kWgD == 0) P.lse[si.stats_index(P, h, i)] = 0.f;
        }
        return;
    }
    const long long head = (long long)b * P.heads_kv + hk;
    // Causal (len_q = len_k, key j allowed for query i when j ≤ i): the keys before the segment of i0 come
    // from state m − 1 of segment m = i0 / seg_len (none in segment 0), the rest s0 … i densely.
    const int seg = causal ? i0 / tp.seg_len : 1;
    const bool has_state = seg > 0;
    const long long state_index = causal ? head * tp.n_seg + seg - 1 : head;

    extern __shared__ __align__(1024) unsigned char smem_wg[];
    unsigned char* base = smem_wg + ((1024u - (smem_addr(smem_wg) & 1023u)) & 1023u);
    T* sRing = reinterpret_cast<T*>(base + L::kRing);
    T* sQ = reinterpret_cast<T*>(base + L::kQ);
    float* sVec = reinterpret_cast<float*>(base + L::kVec);

    if (dynamic_smem_bytes() < (unsigned)L::kBytes + 1024u) __trap();
    const T* state = static_cast<const T*>(tp.st_t) + state_index * kWgStateElems;
    auto load_stage = [&](int st) {
        if (has_state && st * kWgStageGroups < kWgGroups) {
            const T* src = state + (long long)st * kWgStageGroups * kWgGroupElems;
            T* dst = sRing + (st % kWgStages) * kWgStageGroups * kWgGroupElems;
#pragma unroll
            for (int q = 0; q < L::kStage / 16 / 128; ++q) {
                const int e = (tid + 128 * q) * 8;
                cp_async_16(dst + e, src + e, true);
            }
        }
        cp_async_commit();
    };
    load_tile_async<T, kWgQueries, kWgD, 128>(sQ, static_cast<const T*>(P.q) + si.q_off(P, 0, h), P.q_seq, i0,
                                              si.len_q, tid);
    // The vector, zero without a state.
    if (tid < kWgVec / 4) cp_async_16(sVec + 4 * tid, tp.st_vec + (has_state ? state_index * kWgVec + 4 * tid : 0), has_state);
    load_stage(0);  // group 0: q, the vector and stage 0
    load_stage(1);
    load_stage(2);
    cp_async_wait<2>();
    __syncthreads();

    // U = u rounded to bf16: the A fragments of both tiles (rows 64t + 16·warp + g, + 8), and u back into sQ
    // for the per-row multipliers u_ia.
    uint32_t U[2][4][4];
    float uvals[2][4][4][2];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
        const int r0 = 64 * t + 16 * warp + g;
        float ss[2] = {0.f, 0.f};
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int ri = 0; ri < 4; ++ri) {
                const int row = r0 + 8 * (ri & 1), col = 16 * kk + 2 * t4 + 8 * (ri >> 1);
                const uint32_t x = *reinterpret_cast<const uint32_t*>(sQ + row * L::LDQ + col);
                const float x0 = bf16_lo(x), x1 = bf16_hi(x);
                uvals[t][kk][ri][0] = x0;
                uvals[t][kk][ri][1] = x1;
                ss[ri & 1] += x0 * x0 + x1 * x1;
            }
#pragma unroll
        for (int rh = 0; rh < 2; ++rh) {
            ss[rh] = quad_sum(ss[rh]);
            ss[rh] = P.l2norm ? P.scale / fmaxf(sqrtf(ss[rh]), P.eps) : P.scale;
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int ri = 0; ri < 4; ++ri) {
                const float rq = ss[ri & 1];
                U[t][kk][ri] = pack2<T>(rq * uvals[t][kk][ri][0], rq * uvals[t][kk][ri][1]);
            }
    }
    __syncthreads();  // every thread has read its q
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
            for (int ri = 0; ri < 4; ++ri) {
                const int row = 64 * t + 16 * warp + g + 8 * (ri & 1), col = 16 * kk + 2 * t4 + 8 * (ri >> 1);
                *reinterpret_cast<uint32_t*>(sQ + row * L::LDQ + col) = U[t][kk][ri];
            }

    float acc[2][kWgD / 8][4];  // O: the dense part's P·V, then the state's products
    float den[2][2];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
        den[t][0] = den[t][1] = 0.f;
#pragma unroll
        for (int n = 0; n < kWgD / 8; ++n) acc[t][n][0] = acc[t][n][1] = acc[t][n][2] = acc[t][n][3] = 0.f;
    }
    float sacc[2][kWgD / 8][4];  // the dense part's S, then the state's Y

    if (causal) {
        // Dense part: keys s0 … i0 + 127 in tiles of 64 (one cp.async group in flight, the next tile loaded
        // while this one is used). S = U·K̂ᵀ (K̂ = r·K: r applied to S in f32), f(S) with j ≤ i, den += Σ f,
        // O += bf16(f)·V.
        float* sR = reinterpret_cast<float*>(base + L::kR);
        const int s0 = seg * tp.seg_len;
        const int j_stop = min(i0 + kWgQueries, si.len_k);
        const int n_tiles = (j_stop - s0 + kWgChunk - 1) / kWgChunk;
        const T* kbase = static_cast<const T*>(P.k) + si.k_off(P, 0, hk);
        const T* vbase = static_cast<const T*>(P.v) + si.v_off(P, 0, hk);
        auto load_kv = [&](int c) {
            unsigned char* buf = base + L::kDense + (c % 2) * L::kStage;
            const int j0 = s0 + c * kWgChunk;
            load_tile_sw128<T, kWgChunk, kWgD, 128>(reinterpret_cast<T*>(buf), kbase, P.k_seq, j0, si.len_k, tid);
            load_tile_sw128<T, kWgChunk, kWgD, 128>(reinterpret_cast<T*>(buf + L::kStage / 2), vbase, P.v_seq, j0,
                                                   si.len_k, tid);
            cp_async_commit();
        };
        load_kv(0);
#pragma unroll 1
        for (int c = 0; c < n_tiles; ++c) {
            cp_async_wait<0>();
            fence_proxy_async();
            __syncthreads();  // tile c landed; every warp is done with tile c − 1 (its buffer is c + 1's)
            if (c + 1 < n_tiles) load_kv(c + 1);
            const int j0 = s0 + c * kWgChunk;
            unsigned char* k_tile = base + L::kDense + (c % 2) * L::kStage;
            const uint32_t k_addr = smem_addr(k_tile), v_addr = k_addr + L::kStage / 2;
            if (P.l2norm) {
                // r_j for the 64 keys of the tile.
                uint4 chunk[4];
                const float r = wg_key_inv_norm(k_tile, P.eps, tid, chunk);
                if (tid % 2 == 0) sR[tid / 2] = r;
                __syncthreads();
            }
            // Both query tiles take every key tile: tile 0's products on the last one (j0 = i0 + 64, all
            // masked) are wasted, but a branch around them makes ptxas insert warpgroup arrives (C7519).
            // Two commit groups per product: tile 1's S runs while tile 0's f is formed, tile 0's P·V
            // while tile 1's is; drained before the loop's back edge.
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) wg_rs_kmajor(sacc[0], U[0][kk], kmajor_desc<kWgChunk>(k_addr, kk), kk > 0);
            wg_commit();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) wg_rs_kmajor(sacc[1], U[1][kk], kmajor_desc<kWgChunk>(k_addr, kk), kk > 0);
            wg_commit();
            // f(S) of tile t, masked (key j0 + col against query i), into A fragments of P, then P·V.
            auto pv = [&](auto tc) {
                constexpr int t = decltype(tc)::value;
                uint32_t pa[4][4];
                const int ir = i0 + 64 * t + 16 * warp + g;
#pragma unroll
                for (int n = 0; n < kWgD / 8; ++n)
#pragma unroll
                    for (int rh = 0; rh < 2; ++rh) {
                        float f[2];
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int col = 8 * n + 2 * t4 + e;
                            float sv = sacc[t][n][2 * rh + e];
                            if (P.l2norm) sv *= sR[col];
                            f[e] = j0 + col <= ir + 8 * rh ? tp.a0 + sv * (tp.a1 + tp.a2 * sv) : 0.f;
                            den[t][rh] += f[e];
                        }
                        // Accumulator (row g + 8rh, columns 8n + 2t4 …) → A register 2·(n % 2) + rh of k16 step n / 2.
                        pa[n / 2][2 * (n % 2) + rh] = pack2<T>(f[0], f[1]);
                    }
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < 4; ++kk) Wgmma<T, kWgD>::rs(acc[t], pa[kk], mnmajor_desc<kWgChunk>(v_addr, kk), 1);
                wg_commit();
            };
            wg_wait<1>();  // tile 0's S
            fence_regs(sacc[0]);
            pv(IntC<0>());
            wg_wait<1>();  // tile 1's S (tile 0's P·V may still run)
            fence_regs(sacc[1]);
            pv(IntC<1>());
            wg_wait<0>();
            fence_regs(acc[0]);
            fence_regs(acc[1]);
        }
        // The quarter sums of den across the row's four threads.
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int rh = 0; rh < 2; ++rh) den[t][rh] = quad_sum(den[t][rh]);
        __syncthreads();  // every warp is done with the dense tiles (ring stages 3 and 4)
    }

    if (has_state) {
        const uint32_t ring = smem_addr(sRing);
        int G = 0;
        // Stage boundary before group G: stage G/8 has landed (wait, fence, barrier), then stage G/8 + 3 is
        // loaded into the buffer of stage G/8 − 2, whose products every warp has waited for.
        auto group_desc = [&](int grp) {
            if (grp % kWgStageGroups == 0) {
                cp_async_wait<2>();
                fence_proxy_async();
                __syncthreads();
                load_stage(grp / kWgStageGroups + 3);
            }
            const int slot_in_ring = (grp / kWgStageGroups) % kWgStages * kWgStageGroups + grp % kWgStageGroups;
            return Sw128Desc(ring + slot_in_ring * kWgGroupElems * 2, 16, 1024).at16(0);
        };
        // One product over groups G … G + 3 − KK0 (k16 steps KK0 … 3) with A fragments a into d: the
        // descriptors (and any stage boundary) first, then the products back to back.
        auto issue = [&](auto kk0, const uint32_t(&a)[2][4][4], float(&d2)[2][kWgD / 8][4], int accumulate) {
            constexpr int KK0 = decltype(kk0)::value;
            uint64_t d[4];
#pragma unroll
            for (int kk = KK0; kk < 4; ++kk) d[kk] = group_desc(G++);
            wg_fence();
#pragma unroll
            for (int kk = KK0; kk < 4; ++kk) {
                Wgmma<T, kWgD>::rs(d2[0], a[0][kk], d[kk], kk > KK0 || accumulate);
                Wgmma<T, kWgD>::rs(d2[1], a[1][kk], d[kk], kk > KK0 || accumulate);
            }
            wg_commit();
        };

        // den += a0 n + u·(a1 Σk̂) + rowsum(U ∘ Y), Y = U · a2 K2 (in sacc).
        issue(IntC<0>(), U, sacc, 0);
        wg_wait<0>();
        fence_regs(sacc[0]);
        fence_regs(sacc[1]);
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int rh = 0; rh < 2; ++rh) {
                float sum = 0.f;
#pragma unroll
                for (int n = 0; n < kWgD / 8; ++n) {
                    const uint32_t uu = U[t][n / 2][2 * (n % 2) + rh];
                    const int col = 8 * n + 2 * t4;
                    sum += bf16_lo(uu) * (sacc[t][n][2 * rh] + sVec[kWgD + col]) +
                           bf16_hi(uu) * (sacc[t][n][2 * rh + 1] + sVec[kWgD + col + 1]);
                }
                sum = quad_sum(sum);
                den[t][rh] += sum + sVec[2 * kWgD];
            }
        // O += U·(a1 S1), then the quadratic slots; a0 Σv is added at the end.
        issue(IntC<0>(), U, acc, 1);
        // Slot a: A = u_a ∘ U (u_ia of rows r0, r0 + 8 from sQ) in buffer A, on the k16 steps KK0 … 3. Four
        // slots per turn of the loops below: each slot's A is formed while the previous slot's products run
        // (two buffers, wg_wait<1>), and the turn ends with every product done (wg_wait<0>), so that no
        // product is in flight across the loop's back edge (ptxas serialises every wgmma otherwise, C7513).
        uint32_t af[2][4][4], af2[2][4][4];
        auto quad = [&](auto kk0, uint32_t(&A)[2][4][4], int a) {
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const int r0 = 64 * t + 16 * warp + g;
                const uint32_t m0 = reinterpret_cast<const unsigned short*>(sQ)[r0 * L::LDQ + a];
                const uint32_t m1 = reinterpret_cast<const unsigned short*>(sQ)[(r0 + 8) * L::LDQ + a];
                const uint32_t mm[2] = {m0 * 0x10001u, m1 * 0x10001u};
#pragma unroll
                for (int kk = decltype(kk0)::value; kk < 4; ++kk)
#pragma unroll
                    for (int ri = 0; ri < 4; ++ri) A[t][kk][ri] = bf16x2_mul(U[t][kk][ri], mm[ri & 1]);
            }
            issue(kk0, A, acc, 1);
        };
        auto turn = [&](auto kk0, int a) {
            quad(kk0, af, a);
            quad(kk0, af2, a + 1);
            wg_wait<1>();
            quad(kk0, af, a + 2);
            wg_wait<1>();
            quad(kk0, af2, a + 3);
            wg_wait<0>();
            fence_regs(acc[0]);
            fence_regs(acc[1]);
        };
        // a ∈ [16 q, 16 q + 16) keeps the rows b ≥ 16 q: k16 steps q … 3.
#pragma unroll 1
        for (int a = 0; a < 16; a += 4) turn(IntC<0>(), a);
#pragma unroll 1
        for (int a = 16; a < 32; a += 4) turn(IntC<1>(), a);
#pragma unroll 1
        for (int a = 32; a < 48; a += 4) turn(IntC<2>(), a);
#pragma unroll 1
        for (int a = 48; a < 64; a += 4) turn(IntC<3>(), a);
        wg_wait<0>();
        fence_regs(acc[0]);
        fence_regs(acc[1]);
    }

    // o = O / den and den, rows i0 + 64t + 16·warp + g (+ 8).
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int rh = 0; rh < 2; ++rh) {
            const int i = i0 + 64 * t + 16 * warp + g + 8 * rh;
            if (i >= si.len_q) continue;
            const float d = den[t][rh];
            const float inv = 1.f / d;
            T* o = static_cast<T*>(P.o) + si.o_off(P, i, h);
#pragma unroll
            for (int n = 0; n < kWgD / 8; ++n)
                *reinterpret_cast<uint32_t*>(o + 8 * n + 2 * t4) =
                    pack2<T>((acc[t][n][2 * rh] + sVec[8 * n + 2 * t4]) * inv,
                             (acc[t][n][2 * rh + 1] + sVec[8 * n + 2 * t4 + 1]) * inv);
            if (t4 == 0) P.lse[si.stats_index(P, h, i)] = d;
        }
#endif
}

}  // namespace attn
