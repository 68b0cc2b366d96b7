// The state part of a Taylor sweep, in three deterministic passes (no atomics on the sums: every
// result is written by one block, in one order, so a call gives the same bits every time):
//
//   fold    block (slab σ, segment k): the segment's sums over the slab's features,
//             ΔS_kᵀ [M, F_slab] = Σ_{s ∈ [kL, (k+1)L)} y_s φ(x_s)ᵀ
//           chunk by chunk (C sources): Φ = φ(X_chunk) [C, F_slab], Sᵀ += Yᵀ Φ, and one store of the
//           segment's sums into st[k] at the end;
//   prefix  one thread per state entry: st[k] = Σ_{k' ≤ k} ΔS_k' in the order k = 0, 1, …, kept in place
//           (f32) or written as its storage-type copies (f16/bf16);
//   read    block = BP probes: each probe p of state index κ = κ(hi_p) ≥ 1 (TaylorSweep) reads
//             value:  O_p += Σ_f ψ_f(z_p) S[f]                      with S = st[κ − 1]
//             grad:   T_pf = S[f]·w_p;  G_pd += Σ_f ∂ψ_f(z_p)/∂z_d T_pf
//           and adds it to the row the dense kernel wrote (a plain add: this block owns the row).
//
// Tensor cores (f16/bf16): the fold and the products of the reads on mma.sync, sums in f32. The fold's
// sums stay in registers for the whole segment (a warp owns 16 columns × 32 features per unit; no
// shared-memory read-modify-write); it also records each segment's largest |sum|. The prefix writes
// each state once in the storage type, scaled by the power of two that brings a bound on its largest
// entry to [2^14, 2^15) (f16 holds any sum), and the read streams those copies 32 features at a time
// with cp.async (two buffers: the next step's copy is in flight during this step's Ψ and mma). The grad
// read multiplies both halves of S = S_hi + S_lo (S_lo = S − S_hi rounded again), so S enters T_pf with
// 16 (bf16) or 22 (f16) significant bits: T_pf = ĝ_p·S[f][..Dv] − δ_p S[f][Dv] cancels, and the den
// column of a forward state grows like N while T grows like √N.
// f32: the same steps on CUDA cores, the reads' dot products accumulated in f64 (Σ_f ψ_f S[f] cancels
// the same way: its terms are up to ~D× the result).
#pragma once
#include "taylor_common.cuh"

namespace attn {

// Shared memory of the fold (bytes, each offset 16-aligned). Mirrored by taylor::heuristics::fold_smem.
// The f32 kernel keeps its sums in shared memory (M rows), the mma kernel in registers.
template <typename T, int D> struct TaylorFoldSmem {
    static constexpr int C = TaylorTile<D>::C, NT = TaylorTile<D>::NT, F = 8 * NT;
    static constexpr int M = TaylorDims<D>::M, MP = TaylorDims<D>::MP;
    static constexpr bool kMma = sizeof(T) == 2;
    static constexpr int kPad = 16 / (int)sizeof(T);  // keeps T rows 16-byte aligned
    static constexpr int LDX = D + 4;                 // X, f32      [C][LDX]
    static constexpr int LDY = MP + kPad;             // Y, T        [C][LDY]
    static constexpr int LDF = F + kPad;              // Φ, T        [C][LDF]
    static constexpr int LDM = F + 4;                 // sums Sᵀ, f32 [M][LDM] (f32 kernel)
    static constexpr int kX = 0;
    static constexpr int kY = kX + C * LDX * 4;
    static constexpr int kFeat = kY + C * LDY * (int)sizeof(T);
    static constexpr int kSums = kFeat + C * LDF * (int)sizeof(T);
    static constexpr int kDesc = kSums + (kMma ? 0 : M * LDM * 4);
    static constexpr int kBytes = kDesc + NT * 16;
    static_assert(NT % kTaylorStepTiles == 0 && C % 16 == 0 && D % 16 == 0, "whole mma tiles");
    static_assert(kY % 16 == 0 && kFeat % 16 == 0 && kSums % 16 == 0 && kDesc % 16 == 0, "16-byte aligned regions");
};

// st[k] of (batch entry b, kv head hk): [M][f_pad] f32.
__device__ __forceinline__ float* taylor_state_at(const TaylorParams& tp, int b, int hk, int k) {
    const long long bh = (long long)b * tp.base.heads_kv + hk;
    return tp.st + (bh * tp.n_seg + k) * (long long)(tp.base.head_dim + 1) * tp.f_pad;
}
__device__ __forceinline__ int* taylor_state_max_at(const TaylorParams& tp, int b, int hk, int k) {
    return tp.st_max + ((long long)b * tp.base.heads_kv + hk) * tp.n_seg + k;
}

// Grid (n_slabs · n_seg, Hkv, B); block x = k · n_slabs + σ.
template <typename T, int D>
__device__ __forceinline__ void taylor_fold(const TaylorParams& tp) {
    using L = TaylorFoldSmem<T, D>;
    constexpr int C = L::C, NT = L::NT, F = L::F, M = L::M, MP = L::MP;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* sX = reinterpret_cast<float*>(smem_raw + L::kX);     // X chunk
    T* sY = reinterpret_cast<T*>(smem_raw + L::kY);             // Y chunk
    T* sF = reinterpret_cast<T*>(smem_raw + L::kFeat);          // Φ
    float* sS = reinterpret_cast<float*>(smem_raw + L::kSums);  // Sᵀ (f32 kernel)
    FeatureTile* sDesc = reinterpret_cast<FeatureTile*>(smem_raw + L::kDesc);
    __shared__ TaylorRowRef sRef[C];  // the chunk's source rows
    if (dynamic_smem_bytes() < (unsigned)L::kBytes) __trap();

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    const int slab = blockIdx.x % tp.n_slabs, seg = blockIdx.x / tp.n_slabs;
    if (seg >= sw.n_seg) return;
    const int s_lo = seg * sw.seg, s_hi = min(s_lo + sw.seg, sw.n_s);
    const int f_tiles = tp.f_pad / 8;  // tiles a state row holds

    for (int t = tid; t < NT; t += kTaylorThreads) sDesc[t] = feature_tile(slab * NT + t, D, tp.order);
    if constexpr (!L::kMma)
        for (int idx = tid; idx < M * L::LDM; idx += kTaylorThreads) sS[idx] = 0.f;

    // Register sums of the mma kernel: unit u = (16 columns of y, 32 features), units warp, warp + 4, …
    constexpr int UNITS = (MP / 16) * (NT / 4);
    constexpr int UPW = (UNITS + kTaylorWarps - 1) / kTaylorWarps;
    float acc[L::kMma ? UPW : 1][4][4];
#pragma unroll
    for (int i = 0; i < (L::kMma ? UPW : 1); ++i)
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][n][e] = 0.f;

    for (int s0 = s_lo; s0 < s_hi; s0 += C) {
        const int valid = min(C, s_hi - s0);
        __syncthreads();  // the previous chunk's X, Y, Φ, refs are no longer read (first time: sDesc, sS ready)
        taylor_tile_refs<C>(sRef, valid, [&](int r) { return sw.source<T>(tp, s0 + r); }, tid);
        __syncthreads();
        taylor_load_x<T, float, C, D, L::LDX>(tp, sX, sRef, tid);
        // Rows past the segment are zero in Y, so their φ (1 for the const feature) adds nothing.
        taylor_load_y<T, C, D, MP, L::LDY>(sY, sRef, tid);
        __syncthreads();
        // Φ = φ(X)   [C, F]
        for (int idx = tid; idx < C * NT; idx += kTaylorThreads) {
            const int r = idx / NT, t = idx % NT;
            float v[8];
            source_features(v, sDesc[t], sX + r * L::LDX);
            store8<T>(sF + r * L::LDF + 8 * t, v);
        }
        __syncthreads();
        // Sᵀ += Yᵀ Φ   [MP, F]
        if constexpr (L::kMma) {
#pragma unroll
            for (int i = 0; i < UPW; ++i) {
                const int u = warp + i * kTaylorWarps;
                const int mv = u % (MP / 16), fq = u / (MP / 16);
                if (u >= UNITS || slab * NT + fq * 4 >= f_tiles) continue;  // warp-uniform
#pragma unroll
                for (int j0 = 0; j0 < C; j0 += 16) {
                    uint32_t a[4];
                    load_a_trans(a, sY, L::LDY, j0, mv * 16, lane);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        uint32_t bf[4];
                        load_b_kn(bf, sF, L::LDF, j0, fq * 32 + h * 16, lane);
                        mma16816<T>(acc[i][2 * h], a, bf[0], bf[1]);
                        mma16816<T>(acc[i][2 * h + 1], a, bf[2], bf[3]);
                    }
                }
            }
        } else {
            for (int idx = tid; idx < M * (F / 4); idx += kTaylorThreads) {
                const int v = idx / (F / 4), f = 4 * (idx % (F / 4));
                float4 a4 = make_float4(0.f, 0.f, 0.f, 0.f);
                for (int j = 0; j < C; ++j) {
                    const float y = to_f32(sY[j * L::LDY + v]);
                    const float4 ph = *reinterpret_cast<const float4*>(sF + j * L::LDF + f);
                    a4.x += y * ph.x;
                    a4.y += y * ph.y;
                    a4.z += y * ph.z;
                    a4.w += y * ph.w;
                }
                float4* m = reinterpret_cast<float4*>(sS + v * L::LDM + f);
                float4 x = *m;
                x.x += a4.x;
                x.y += a4.y;
                x.z += a4.z;
                x.w += a4.w;
                *m = x;
            }
        }
    }

    // st[seg] ← the segment's sums, columns [σ·F, σ·F + F) ∩ [0, f_pad).
    float* out = taylor_state_at(tp, blockIdx.z, blockIdx.y, seg);
    const int f0 = slab * F;
    if constexpr (L::kMma) {
        float mx = 0.f;  // the largest |sum| this thread stores
#pragma unroll
        for (int i = 0; i < UPW; ++i) {
            const int u = warp + i * kTaylorWarps;
            const int mv = u % (MP / 16), fq = u / (MP / 16);
            if (u >= UNITS || slab * NT + fq * 4 >= f_tiles) continue;
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int v = mv * 16 + g + 8 * r;
                    const int f = f0 + fq * 32 + n * 8 + 2 * t4;
                    if (v < M) {
                        const float a = acc[i][n][2 * r], c = acc[i][n][2 * r + 1];
                        *reinterpret_cast<float2*>(out + (long long)v * tp.f_pad + f) = make_float2(a, c);
                        if (isfinite(a)) mx = fmaxf(mx, fabsf(a));
                        if (isfinite(c)) mx = fmaxf(mx, fabsf(c));
                    }
                }
        }
        // st_max[seg] ≥ every |sum| of the segment: non-negative floats order like their bits as ints.
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (lane == 0 && mx > 0.f) atomicMax(taylor_state_max_at(tp, blockIdx.z, blockIdx.y, seg), __float_as_int(mx));
    } else {
        __syncthreads();  // every thread's last adds to sS are done
        const int width = min(F, tp.f_pad - f0);
        for (int idx = tid; idx < M * width; idx += kTaylorThreads) {
            const int v = idx / width, f = idx % width;
            out[(long long)v * tp.f_pad + f0 + f] = sS[v * L::LDM + f];
        }
    }
}

// The exponent e of the storage-type copy of st[k] (f16/bf16): the copy is 2^−e·st[k], with e from the
// bound B_k = Σ_{k' ≤ k} st_max[k'] ≥ max |st[k]| (the segments' largest sums, added in the order
// k' = 0, 1, …, as the prefix does), so the copy's entries stay below 2^15 (f16 holds them) and its
// largest possible entry is in [2^14, 2^15).
__device__ __forceinline__ int taylor_copy_exponent(float bound) {
    return bound > 0.f && isfinite(bound) ? max(-100, min(100, ilogbf(bound))) - 14 : 0;
}
__device__ __forceinline__ int taylor_state_exponent(const TaylorParams& tp, int b, int hk, int k) {
    const int* seg_max = taylor_state_max_at(tp, b, hk, 0);
    float bound = 0.f;
    for (int kk = 0; kk <= k; ++kk) bound += __int_as_float(seg_max[kk]);
    return taylor_copy_exponent(bound);
}

// Copy c (0: hi, 1: lo) of the storage-type states: [B][Hkv][n_seg][copies][M][f_pad].
template <typename T>
__device__ __forceinline__ T* taylor_copy_at(const TaylorParams& tp, int b, int hk, int k, int c) {
    const long long bh = (long long)b * tp.base.heads_kv + hk;
    const long long per = (long long)(tp.base.head_dim + 1) * tp.f_pad;
    return static_cast<T*>(tp.st_t) + ((bh * tp.n_seg + k) * tp.copies + c) * per;
}

// Grid (⌈M·f_pad / 128⌉, Hkv, B): thread e owns entry e of every state of its (batch entry, kv head):
// run = st[0][e] + … + st[k][e], in the order k = 0, 1, …, is the entry of the state st[k]:
//   f32, and f16/bf16 with tp.copies = 0 (the order-1 causal forward reads the f32 sums): written back in
//   place;
//   f16/bf16 otherwise: written as the storage-type copy hi = T(2^−e_k run) and, when tp.copies = 2, lo = T(2^−e_k
//   run − hi) (st itself is left as the fold wrote it); a sweep without a causal mask writes only the last
//   state's copies (TaylorSweep::state_index: its probes read nothing else).
template <typename T>
__device__ __forceinline__ void taylor_prefix(const TaylorParams& tp) {
    const int b = blockIdx.z, hk = blockIdx.y;
    const TaylorSweep sw(tp, b, hk);
    const long long per = (long long)(tp.base.head_dim + 1) * tp.f_pad;
    const long long e = (long long)blockIdx.x * kTaylorThreads + threadIdx.x;
    if (e >= per) return;
    float* x = taylor_state_at(tp, b, hk, 0) + e;
    const int* seg_max = taylor_state_max_at(tp, b, hk, 0);
    float run = 0.f, bound = 0.f;
    for (int k = 0; k < sw.n_seg; ++k) {
        run += x[k * per];
        if (sizeof(T) == 4 || tp.copies == 0) {
            x[k * per] = run;
        } else {
            bound += __int_as_float(seg_max[k]);  // as taylor_state_exponent
            if (!sw.causal && k + 1 < sw.n_seg) continue;  // not causal: only the whole sum is read
            const float xs = run * ldexpf(1.f, -taylor_copy_exponent(bound));
            const T hi = from_f32<T>(xs);
            taylor_copy_at<T>(tp, b, hk, k, 0)[e] = hi;
            if (tp.copies == 2) taylor_copy_at<T>(tp, b, hk, k, 1)[e] = from_f32<T>(xs - to_f32(hi));
        }
    }
}

// Shared memory of the reads (bytes, each offset 16-aligned). Mirrored by taylor::heuristics::read_smem.
template <typename T, int D, bool GRAD> struct TaylorReadSmem {
    static constexpr bool kMma = sizeof(T) == 2;
    static constexpr int M = TaylorDims<D>::M, MP = TaylorDims<D>::MP;
    static constexpr int RT = kMma && !GRAD && D <= 64 ? 2 : 1;  // m16 row tiles per warp
    static constexpr int BP = kMma ? 16 * RT * kTaylorWarps : 32;  // probes per block
    static constexpr int KT = kTaylorStepTiles, KF = 8 * KT;      // feature tiles, features per step
    static constexpr int kPad = 16 / (int)sizeof(T);
    static constexpr int ROWS = kMma ? MP : M;                    // rows of an S tile
    static constexpr int COPIES = GRAD && kMma ? 2 : 1;           // hi (and lo) of S
    static constexpr int BUFS = kMma ? 2 : 1;                     // S tiles in flight (cp.async)
    static constexpr int LDZ = D + 4;                             // Z, f32   [BP][LDZ]
    static constexpr int LDW = MP + kPad;                         // W, T     [BP][LDW]   (grad)
    static constexpr int LDF = KF + kPad;                         // Ψ, T     [BP][LDF]   (value)
    static constexpr int LDT = KF + 1;                            // T, f32   [BP][LDT]   (grad)
    static constexpr int LDC = KF + kPad;                         // S tiles, T [BUFS][COPIES][ROWS][LDC]
    static constexpr int kTile = ROWS * LDC;                      // elements of one S tile
    static constexpr int kZ = 0;
    static constexpr int kW = kZ + BP * LDZ * 4;
    static constexpr int kFeat = kW + (GRAD ? BP * LDW * (int)sizeof(T) : 0);
    static constexpr int kC = kFeat + (GRAD ? BP * LDT * 4 : BP * LDF * (int)sizeof(T));
    // The sums of a state's read, one entry per (p, d) (grad) or, f32 value, per (p, v), each entry
    // owned by one thread: f32 next to mma, f64 for f32 inputs; the mma value sums live in registers.
    static constexpr int kAccBytes = kMma ? 4 : 8;
    // Row stride of the grad sums G [BP][LDA]: one thread per probe row, every thread of a warp at the
    // same column d, so an odd stride keeps the 32 rows in distinct banks.
    static constexpr int LDA = D + 1;
    static constexpr int kAcc = kC + BUFS * COPIES * kTile * (int)sizeof(T);
    static constexpr int kBytes = kAcc + (GRAD ? BP * LDA * kAccBytes : (kMma ? 0 : BP * M * kAccBytes));
    static_assert(kW % 16 == 0 && kFeat % 16 == 0 && kC % 16 == 0 && kAcc % 16 == 0 && (kTile * sizeof(T)) % 16 == 0,
                  "16-byte aligned regions");
    static_assert(KF % 8 == 0, "whole 16-byte copies per S row");
};

// What the reads accumulate their dot products in: f32 next to mma products, f64 for f32 inputs.
template <bool MMA> struct TaylorReadAcc { using type = double; };
template <> struct TaylorReadAcc<true> { using type = float; };

// Grid (⌈n_p / BP⌉, Hkv, B).
template <typename T, int D, bool GRAD>
__device__ __forceinline__ void taylor_read(const TaylorParams& tp) {
    using L = TaylorReadSmem<T, D, GRAD>;
    constexpr int M = L::M, MP = L::MP, BP = L::BP, RT = L::RT, KT = L::KT, KF = L::KF, ROWS = L::ROWS;
    using Acc = typename TaylorReadAcc<L::kMma>::type;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* sZ = reinterpret_cast<float*>(smem_raw + L::kZ);    // probes z
    T* sW = reinterpret_cast<T*>(smem_raw + L::kW);            // probes w (grad)
    T* sF = reinterpret_cast<T*>(smem_raw + L::kFeat);         // Ψ (value)
    float* sT = reinterpret_cast<float*>(smem_raw + L::kFeat); // T = W·S (grad)
    T* sC = reinterpret_cast<T*>(smem_raw + L::kC);            // S tiles: [buffer][copy] (2^−e S: hi, lo)
    Acc* sAcc = reinterpret_cast<Acc*>(smem_raw + L::kAcc);    // G [BP][LDA] (grad), O [BP][M] (f32 value)
    __shared__ FeatureTile sDesc[KT];
    __shared__ int sIdx[BP];                                   // κ of each probe (−1 past the end)
    __shared__ TaylorRowRef sRef[BP];                          // the probes' rows
    if (dynamic_smem_bytes() < (unsigned)L::kBytes) __trap();
    auto tile = [&](int buf, int c) { return sC + (buf * L::COPIES + c) * L::kTile; };

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    const int p0 = blockIdx.x * BP;
    if (p0 >= sw.n_p) return;
    const int np = min(BP, sw.n_p - p0);
    const int k_lo = max(1, sw.state_index(sw.hi(P, p0)));
    const int k_hi = sw.state_index(sw.hi(P, p0 + np - 1));
    if (k_hi < k_lo) return;  // every probe of the tile is dense only

    for (int r = tid; r < BP; r += kTaylorThreads) sIdx[r] = r < np ? sw.state_index(sw.hi(P, p0 + r)) : -1;
    taylor_tile_refs<BP>(sRef, np, [&](int r) { return sw.probe<T>(tp, p0 + r); }, tid);
    if constexpr (L::kMma) {
        // Rows M ≤ v < MP of every S tile stay zero (the copies fill rows v < M only).
        for (int idx = tid; idx < L::BUFS * L::COPIES * (ROWS - M) * KF; idx += kTaylorThreads) {
            const int t = idx / ((ROWS - M) * KF), rest = idx % ((ROWS - M) * KF);
            sC[t * L::kTile + (M + rest / KF) * L::LDC + rest % KF] = from_f32<T>(0.f);
        }
    }
    __syncthreads();
    taylor_load_x<T, float, BP, D, L::LDZ>(tp, sZ, sRef, tid);
    if constexpr (GRAD) taylor_load_y<T, BP, D, MP, L::LDW>(sW, sRef, tid);
    __syncthreads();  // Z and W are read from the first step on

    // Per thread: value (mma) RT·16 rows × MP columns of its warp, in registers; value (f32) the entries
    // (p, v) = tid + 128 j of sAcc; grad the row p = tid < BP of sAcc (zeroed and written back by all).
    constexpr int NV = L::kMma && !GRAD ? MP / 8 : 1;  // n8 tiles of O
    constexpr int NACC = GRAD ? BP * L::LDA : (L::kMma ? 0 : BP * M);
    static_assert(!GRAD || BP <= kTaylorThreads, "one thread per probe row of G");
    const int n_steps = tp.f_pad / KF;
    const long long per = (long long)M * tp.f_pad;

    for (int k = k_lo; k <= k_hi; ++k) {
        // The state st[k − 1]: f32 for f32 inputs, else its storage-type copies scaled by 2^−e.
        const float* S = taylor_state_at(tp, blockIdx.z, blockIdx.y, k - 1);
        const T* Sc = L::kMma ? taylor_copy_at<T>(tp, blockIdx.z, blockIdx.y, k - 1, 0) : nullptr;
        const float up = L::kMma ? ldexpf(1.f, taylor_state_exponent(tp, blockIdx.z, blockIdx.y, k - 1)) : 1.f;
        // cp.async of step `step`'s S tiles (rows v < M, KF features from f0) into buffer `buf`.
        auto stage = [&](int step, int buf) {
            if constexpr (L::kMma) {
                constexpr int CH = KF / 8;  // 16-byte chunks per row
                for (int idx = tid; idx < L::COPIES * M * CH; idx += kTaylorThreads) {
                    const int c = idx / (M * CH), rest = idx % (M * CH), v = rest / CH, ch = rest % CH;
                    cp_async_16(tile(buf, c) + v * L::LDC + 8 * ch, Sc + c * per + (long long)v * tp.f_pad + step * KF + 8 * ch,
                                true);
                }
                cp_async_commit();
            }
        };
        float acc[RT][NV][4];
#pragma unroll
        for (int rt = 0; rt < RT; ++rt)
#pragma unroll
            for (int n = 0; n < NV; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[rt][n][e] = 0.f;
        for (int idx = tid; idx < NACC; idx += kTaylorThreads) sAcc[idx] = 0;

        stage(0, 0);
        for (int step = 0; step < n_steps; ++step) {
            const int f0 = step * KF, buf = L::BUFS == 2 ? step & 1 : 0;
            // (The previous step ended with a barrier: its tiles, Ψ, T and sDesc are no longer read.)
            if (step + 1 < n_steps) stage(step + 1, (step + 1) & 1);
            if (tid < KT) sDesc[tid] = feature_tile(step * KT + tid, D, tp.order);
            if constexpr (!L::kMma) {
                // f32: the S tile straight from the f32 state.
                for (int idx = tid; idx < M * (KF / 4); idx += kTaylorThreads) {
                    const int v = idx / (KF / 4), c = 4 * (idx % (KF / 4));
                    *reinterpret_cast<float4*>(sC + v * L::LDC + c) =
                        *reinterpret_cast<const float4*>(S + (long long)v * tp.f_pad + f0 + c);
                }
            }
            if constexpr (!GRAD) {
                // Ψ = ψ(Z)   [BP, KF], zero for the probes of another state
                for (int idx = tid; idx < BP * KT; idx += kTaylorThreads) {
                    const int r = idx / KT, t = idx % KT;
                    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
                    if (sIdx[r] == k)
                        probe_features(v, feature_tile(step * KT + t, D, tp.order), sZ + r * L::LDZ, tp.a0, tp.a1,
                                       tp.a2);
                    store8<T>(sF + r * L::LDF + 8 * t, v);
                }
            }
            if constexpr (L::kMma) {
                if (step + 1 < n_steps) cp_async_wait<1>();
                else cp_async_wait<0>();
            }
            __syncthreads();  // this step's S tiles, Ψ and sDesc are in place
            const T* sHi = tile(buf, 0);
            if constexpr (!GRAD) {
                if constexpr (L::kMma) {
                    // O += Ψ S   [RT·16 rows of this warp, MP]
#pragma unroll
                    for (int k0 = 0; k0 < KF; k0 += 16) {
#pragma unroll
                        for (int rt = 0; rt < RT; ++rt) {
                            uint32_t a[4];
                            load_a(a, sF, L::LDF, (warp * RT + rt) * 16, k0, lane);
#pragma unroll
                            for (int vb = 0; vb < MP / 16; ++vb) {
                                uint32_t bf[4];
                                load_b_nk(bf, sHi, L::LDC, vb * 16, k0, lane);
                                mma16816<T>(acc[rt][2 * vb], a, bf[0], bf[1]);
                                mma16816<T>(acc[rt][2 * vb + 1], a, bf[2], bf[3]);
                            }
                        }
                    }
                } else {
                    for (int idx = tid; idx < NACC; idx += kTaylorThreads) {
                        const int pr = idx / M, v = idx % M;
                        double s = 0.0;
#pragma unroll 4
                        for (int f = 0; f < KF; f += 4) {
                            const float4 ps = *reinterpret_cast<const float4*>(sF + pr * L::LDF + f);
                            const float4 ms = *reinterpret_cast<const float4*>(sHi + v * L::LDC + f);
                            s += (double)ps.x * ms.x + (double)ps.y * ms.y + (double)ps.z * ms.z + (double)ps.w * ms.w;
                        }
                        sAcc[idx] += s;
                    }
                }
            } else {
                // T = W S   [BP, KF], zero for the probes of another state
                if constexpr (L::kMma) {
                    const T* sLo = tile(buf, 1);
                    float ta[KF / 8][4];
#pragma unroll
                    for (int n = 0; n < KF / 8; ++n)
#pragma unroll
                        for (int e = 0; e < 4; ++e) ta[n][e] = 0.f;
#pragma unroll
                    for (int kv = 0; kv < MP; kv += 16) {
                        uint32_t a[4];
                        load_a(a, sW, L::LDW, warp * 16, kv, lane);
#pragma unroll
                        for (int h = 0; h < KF / 16; ++h) {
                            uint32_t bf[4];
                            load_b_kn(bf, sHi, L::LDC, kv, h * 16, lane);
                            mma16816<T>(ta[2 * h], a, bf[0], bf[1]);
                            mma16816<T>(ta[2 * h + 1], a, bf[2], bf[3]);
                            load_b_kn(bf, sLo, L::LDC, kv, h * 16, lane);
                            mma16816<T>(ta[2 * h], a, bf[0], bf[1]);
                            mma16816<T>(ta[2 * h + 1], a, bf[2], bf[3]);
                        }
                    }
#pragma unroll
                    for (int n = 0; n < KF / 8; ++n)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int pr = warp * 16 + g + 8 * (e / 2);
                            sT[pr * L::LDT + n * 8 + 2 * t4 + (e & 1)] = sIdx[pr] == k ? ta[n][e] * up : 0.f;
                        }
                } else {
                    for (int idx = tid; idx < BP * KF; idx += kTaylorThreads) {
                        const int pr = idx / KF, f = idx % KF;
                        double s = 0.0;
                        for (int v = 0; v < M; ++v) s += (double)to_f32(sW[pr * L::LDW + v]) * to_f32(sHi[v * L::LDC + f]);
                        sT[pr * L::LDT + f] = sIdx[pr] == k ? (float)s : 0.f;
                    }
                }
                __syncthreads();
                // G_p += Σ_f ∇ψ_f(z_p) T_pf over the step's tiles, one thread per probe row (it owns the
                // row's G, so no two threads add to one entry).
                if (tid < BP) {
#pragma unroll
                    for (int t = 0; t < KT; ++t)
                        add_probe_tile_grad(sAcc + tid * L::LDA, sDesc[t], sZ + tid * L::LDZ,
                                            sT + tid * L::LDT + 8 * t, tp.a1, tp.a2);
                }
            }
            __syncthreads();  // the next step overwrites the other buffer, Ψ or T, and sDesc
        }

        // Add this state's part to the rows of its probes (each row belongs to this block alone).
        if constexpr (!GRAD) {
            if constexpr (L::kMma) {
#pragma unroll
                for (int rt = 0; rt < RT; ++rt)
#pragma unroll
                    for (int n = 0; n < NV; ++n)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int pr = (warp * RT + rt) * 16 + g + 8 * (e / 2), v = n * 8 + 2 * t4 + (e & 1);
                            if (v < M && sIdx[pr] == k)
                                tp.out_value[sw.probe_row(p0 + pr) * M + v] += acc[rt][n][e] * up;
                        }
            } else {
                for (int idx = tid; idx < NACC; idx += kTaylorThreads) {
                    const int pr = idx / M, v = idx % M;
                    if (sIdx[pr] != k) continue;
                    float* o = tp.out_value + sw.probe_row(p0 + pr) * M + v;
                    *o = (float)((double)*o + sAcc[idx]);
                }
            }
        } else {
            for (int idx = tid; idx < BP * D; idx += kTaylorThreads) {
                const int pr = idx / D, d = idx % D;
                if (sIdx[pr] != k) continue;
                float* o = tp.out_grad + sw.probe_row(p0 + pr) * D + d;
                *o = (float)((Acc)*o + sAcc[pr * L::LDA + d]);
            }
            __syncthreads();  // the next state's zeroing of sAcc is by other threads than these reads
        }
    }
}

// The whole forward of a tile of BP = 64 query probes (f16/bf16; forward roles, value): the state read
// into the mma accumulators O [16 rows per warp, MP], then the dense part into the same accumulators,
// then o = num/den and den written straight to the outputs (no [rows][M] scratch, no finalize pass).
// A row's state part is in units of 2^e of its state (its Ψ row is zero in the other states' passes):
// multiplied back by that power of two, exact, before the dense part.
template <typename T, int D> struct TaylorForwardSmem {
    static constexpr int M = TaylorDims<D>::M, MP = TaylorDims<D>::MP;
    static constexpr int BP = 16 * kTaylorWarps;             // probes
    static constexpr int BS = D <= 64 ? 64 : 32;              // sources per dense step (D = 128: two blocks per SM)
    static constexpr int KT = kTaylorStepTiles, KF = 8 * KT;
    static constexpr int LDZF = D + 4;                         // Z, f32  [BP][LDZF]  (ψ)
    static constexpr int LDZ = D + 8;                          // Z, X, T [BP|BS][LDZ] (dense S = Z Xᵀ)
    static constexpr int LDY = MP + 8;                         // Y, T    [BS][LDY]
    static constexpr int LDF = KF + 8;                         // Ψ, T    [BP][LDF]
    static constexpr int LDC = KF + 8;                         // S tiles, T [2][MP][LDC]
    static constexpr int kTile = MP * LDC;
    static constexpr int kZf = 0;
    static constexpr int kZ = kZf + BP * LDZF * 4;
    static constexpr int kX = kZ + BP * LDZ * (int)sizeof(T);
    static constexpr int kY = kX + BS * LDZ * (int)sizeof(T);
    static constexpr int kFeat = kY + BS * LDY * (int)sizeof(T);
    static constexpr int kC = kFeat + BP * LDF * (int)sizeof(T);
    static constexpr int kBytes = kC + 2 * kTile * (int)sizeof(T);
    static_assert(sizeof(T) == 2, "tensor-core kernel");
    static_assert(kZ % 16 == 0 && kX % 16 == 0 && kY % 16 == 0 && kFeat % 16 == 0 && kC % 16 == 0 &&
                      (kTile * sizeof(T)) % 16 == 0,
                  "16-byte aligned regions");
};

// Grid (⌈G·seq_q / 64⌉, Hkv, B); tp.reverse = 0.
template <typename T, int D>
__device__ __forceinline__ void taylor_forward_tile(const TaylorParams& tp) {
    using L = TaylorForwardSmem<T, D>;
    constexpr int M = L::M, MP = L::MP, BP = L::BP, BS = L::BS, KT = L::KT, KF = L::KF;
    constexpr int NS = BS / 8, NO = MP / 8;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* sZf = reinterpret_cast<float*>(smem_raw + L::kZf);
    T* sZ = reinterpret_cast<T*>(smem_raw + L::kZ);
    T* sX = reinterpret_cast<T*>(smem_raw + L::kX);
    T* sY = reinterpret_cast<T*>(smem_raw + L::kY);
    T* sF = reinterpret_cast<T*>(smem_raw + L::kFeat);
    T* sC = reinterpret_cast<T*>(smem_raw + L::kC);
    __shared__ int sIdx[BP];
    __shared__ TaylorRowRef sPref[BP], sSref[BS];
    if (dynamic_smem_bytes() < (unsigned)L::kBytes) __trap();

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    const int p0 = blockIdx.x * BP;
    if (p0 >= sw.n_p) return;
    const int np = min(BP, sw.n_p - p0);

    for (int r = tid; r < BP; r += kTaylorThreads) sIdx[r] = r < np ? sw.state_index(sw.hi(P, p0 + r)) : -1;
    taylor_tile_refs<BP>(sPref, np, [&](int r) { return sw.probe<T>(tp, p0 + r); }, tid);
    // Rows M ≤ v < MP of both S tiles stay zero (the copies fill rows v < M only).
    for (int idx = tid; idx < 2 * (MP - M) * KF; idx += kTaylorThreads) {
        const int t = idx / ((MP - M) * KF), rest = idx % ((MP - M) * KF);
        sC[t * L::kTile + (M + rest / KF) * L::LDC + rest % KF] = from_f32<T>(0.f);
    }
    __syncthreads();
    taylor_load_x<T, float, BP, D, L::LDZF>(tp, sZf, sPref, tid);  // u = r_z·q in f32 (ψ); r_z in sPref
    taylor_load_raw<T, BP, D, L::LDZ>(sZ, sPref, tid);              // q raw (the dense scores)

    float acc[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;

    // ---- the state part: O = Σ_f ψ_f(z_p) S[f] with S = st[κ_p − 1] ----
    const int k_lo = max(1, sw.state_index(sw.hi(P, p0)));
    const int k_hi = sw.state_index(sw.hi(P, p0 + np - 1));
    const int n_steps = tp.f_pad / KF;
    for (int k = k_lo; k <= k_hi; ++k) {
        const T* Sc = taylor_copy_at<T>(tp, blockIdx.z, blockIdx.y, k - 1, 0);
        auto stage = [&](int step, int buf) {
            constexpr int CH = KF / 8;
            for (int idx = tid; idx < M * CH; idx += kTaylorThreads) {
                const int v = idx / CH, ch = idx % CH;
                cp_async_16(sC + buf * L::kTile + v * L::LDC + 8 * ch, Sc + (long long)v * tp.f_pad + step * KF + 8 * ch,
                            true);
            }
            cp_async_commit();
        };
        __syncthreads();  // the previous state's tiles are no longer read
        stage(0, 0);
        for (int step = 0; step < n_steps; ++step) {
            const int buf = step & 1;
            if (step + 1 < n_steps) stage(step + 1, (step + 1) & 1);
            // Ψ = ψ(Z)   [BP, KF], zero for the probes of another state
            for (int idx = tid; idx < BP * KT; idx += kTaylorThreads) {
                const int r = idx / KT, t = idx % KT;
                float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
                if (sIdx[r] == k)
                    probe_features(v, feature_tile(step * KT + t, D, tp.order), sZf + r * L::LDZF, tp.a0, tp.a1, tp.a2);
                store8<T>(sF + r * L::LDF + 8 * t, v);
            }
            if (step + 1 < n_steps) cp_async_wait<1>();
            else cp_async_wait<0>();
            __syncthreads();
            // O += Ψ S   [16 rows of this warp, MP]
#pragma unroll
            for (int k0 = 0; k0 < KF; k0 += 16) {
                uint32_t a[4];
                load_a(a, sF, L::LDF, warp * 16, k0, lane);
#pragma unroll
                for (int vb = 0; vb < MP / 16; ++vb) {
                    uint32_t bf[4];
                    load_b_nk(bf, sC + buf * L::kTile, L::LDC, vb * 16, k0, lane);
                    mma16816<T>(acc[2 * vb], a, bf[0], bf[1]);
                    mma16816<T>(acc[2 * vb + 1], a, bf[2], bf[3]);
                }
            }
            __syncthreads();  // the next step overwrites the other buffer and Ψ
        }
    }
    // A row took products only in its own state's pass (the other passes add exact zeros): back from
    // that state's units 2^e.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int kr = sIdx[warp * 16 + g + 8 * r];
        if (kr < 1) continue;
        const float up = ldexpf(1.f, taylor_state_exponent(tp, blockIdx.z, blockIdx.y, kr - 1));
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            acc[n][2 * r] *= up;
            acc[n][2 * r + 1] *= up;
        }
    }

    // ---- the dense part: O += f(S) Y over each probe's sources [B_p, hi_p), S = r_z r_xᵀ ∘ (Z_raw X_rawᵀ) ----
    const int wrow = warp * 16;
    int lo[2], hi[2], prow[2];
    float rz[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        prow[r] = p0 + wrow + g + 8 * r;
        hi[r] = prow[r] < sw.n_p ? sw.hi(P, prow[r]) : 0;
        lo[r] = sw.boundary(hi[r]);
        rz[r] = sPref[wrow + g + 8 * r].rx;
    }
    const int s_begin = sw.boundary(sw.hi(P, p0));
    const int s_end = sw.hi(P, p0 + np - 1);
    for (int s0 = s_begin; s0 < s_end; s0 += BS) {
        __syncthreads();  // the previous block's X, Y and refs are no longer read (first time: sZ ready)
        const int valid = min(BS, sw.n_s - s0);
        taylor_tile_refs<BS>(sSref, valid, [&](int r) { return sw.source<T>(tp, s0 + r); }, tid);
        __syncthreads();
        taylor_load_x<T, T, BS, D, L::LDZ, false>(tp, sX, sSref, tid);  // raw x; r_x in sSref
        taylor_load_y<T, BS, D, MP, L::LDY>(sY, sSref, tid);
        __syncthreads();
        // S = r_z r_xᵀ ∘ (Z_raw X_rawᵀ)   [16, BS]
        float s[NS][4];
        taylor_scores_mma<T, D, BS>(s, sZ, L::LDZ, wrow, sX, L::LDZ, lane);
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = s[n][e] * rz[e / 2] * sSref[n * 8 + 2 * t4 + (e & 1)].rx;
        // P = f(S) on [lo, hi), 0 elsewhere
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e / 2, col = s0 + n * 8 + 2 * t4 + (e & 1);
                s[n][e] = col >= lo[r] && col < hi[r] ? taylor_f(tp, s[n][e]) : 0.f;
            }
        // O += P Y   [16, MP]
        taylor_weights_mma<T, BS, MP>(acc, s, sY, L::LDY, lane);
    }

    // ---- o = num / den, and den, for this thread's two rows (as taylor_finalize_fwd) ----
    // den is column Dv = D of the row: n-tile D/8, held by the lane of the quad with t4 = 0.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float den_acc = __shfl_sync(0xffffffffu, acc[D / 8][2 * r], lane & ~3);
        if (prow[r] >= sw.n_p) continue;
        const int i = prow[r] / sw.group, h = sw.hk * sw.group + prow[r] % sw.group;
        const bool empty = hi[r] == 0;
        const float den = empty ? 0.f : den_acc;
        T* o = static_cast<T*>(P.o) + sw.si.o_off(P, i, h);
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) o[n * 8 + 2 * t4 + e] = from_f32<T>(empty ? 0.f : acc[n][2 * r + e] / den);
        if (t4 == 0) P.lse[sw.si.stats_index(P, h, i)] = den;
    }
}

}  // namespace attn
