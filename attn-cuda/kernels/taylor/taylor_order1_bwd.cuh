// Order 1 (f(s) = a0 + a1 s), f16/bf16, not causal: the backward's two probe kernels, after the prefix of
// each sweep has written the whole sum of its sources as the storage-type copies hi and lo
// (TaylorParams::copies = 2). With g_i = [rg_i dO_i, nd_i] (rg = 1/den,
// nd = −δ: taylor_prep_grads) and ṽ_j = [v_j, 1]:
//
//   queries  S = Σ_j ṽ_j ⊗ [1, k̂_j]          (the forward sweep's state: st[n_seg − 1])
//            dû_i = a1 (rg_i dO_i·S_lin[0..Dv) + nd_i S_lin[Dv])       dq_i = J(q_i)ᵀ (scale·dû_i)
//   keys     U = Σ_i g_i ⊗ [1, scale q̂_i]    (the reversed sweep's state, the same fold with q and dO)
//            dk̂_j = a1 (v_j·U_lin[0..Dv) + U_lin[Dv])                  dk_j = J(k_j)ᵀ dk̂_j
//            dv_j = a0 U_const[0..Dv) + a1 (k̂_j · U_lin[0..Dv))
//
// (J: the l2-norm's Jacobian under qk_l2norm, else the identity.) Both dot products with the linear rows
// run on mma.sync with the raw rows as A (dO or v, exact) and S_lin = up·(hi + lo) as B (2^e = up: the
// copies' scale), so the state enters with 16 (bf16) or 22 (f16) significant bits, as in the general
// gradient read: dO·S_lin[0..Dv) and δ S_lin[Dv] cancel. The row factors (rg, nd, 1/‖k‖) and the den row
// S_lin[Dv] apply in f32 after the product. A block reads the state once, then streams probe tiles of BP
// rows with the next tile's copies in flight; its results go back into the tiles' rows and out in 16-byte
// stores. Keys past key_lens get zero gradients.
#pragma once
#include "taylor_order1.cuh"

namespace attn {

// Tiles of the backward. Mirrored by taylor::heuristics::order1_backward_smem.
template <typename T, int D> struct Taylor1Backward {
    static constexpr int RT = Taylor1Forward<T, D>::RT;  // m16 row tiles per warp
    static constexpr int BP = 16 * RT * kTaylorWarps;    // probes per tile
    static constexpr int NO = D / 8;                     // n8 tiles of a result row (Dv = D)
    static constexpr int LD = SmemRow<D>::ld;
    static constexpr int CPR = D * 2 / 16;               // 16-byte copies per row
    static constexpr int kZ = 0;                         // Z [2][BP][LD] T: dO or v (then dq or dk)
    static constexpr int kX = kZ + 2 * BP * LD * 2;      // X [2][BP][LD] T: q or k (then dv)
    static constexpr int kS = kX + 2 * BP * LD * 2;      // S_lin [2 copies][D][LD] T: rows v < Dv
    static constexpr int kBytes = kS + 2 * D * LD * 2;
};

// Grid (blocks per head, Hkv, B), tp.reverse = KEYS: block x takes the probe tiles x, x + gridDim.x, … of
// the query rows of the GQA group (KEYS = false: dq) or of the key rows (KEYS = true: dk and dv).
template <typename T, int D, bool KEYS>
__device__ __forceinline__ void taylor1_backward(const TaylorParams& tp) {
    using L = Taylor1Backward<T, D>;
    constexpr int BP = L::BP, RT = L::RT, NO = L::NO, LD = L::LD, CPR = L::CPR;
    constexpr int RPP = kTaylorThreads / CPR;

    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* sS = reinterpret_cast<T*>(smem_raw + L::kS);
    __shared__ __align__(8) float sDen[D];    // a1·up·S_lin[Dv] (the den row; its probe factor: nd or 1)
    __shared__ __align__(8) float sConst[D];  // up·a0·U_const[0..Dv) (keys)
    __shared__ float sInv[BP];                // 1/‖x‖ of the tile's rows, negative where eps clamps it
    __shared__ float sRg[2][BP], sNd[2][BP];  // per tile in flight: rg and nd (queries); 1 or 0 (keys: live)
    __shared__ long long sOz[2][BP], sOx[2][BP];  // output offsets: dq or dk; dv
    if (dynamic_smem_bytes() < (unsigned)L::kBytes) __trap();

    const AttnParams& P = tp.base;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const TaylorSweep sw(tp, blockIdx.z, blockIdx.y);
    // Rows: G·len_q query rows; every key row of the batch entry (those past len_k get zeros).
    const int n_rows = KEYS ? sw.si.key_rows(P) : sw.n_p;
    const int n_tiles = (n_rows + BP - 1) / BP;
    if ((int)blockIdx.x >= n_tiles) return;
    const bool has = sw.n_s > 0;  // no source at all: zero gradients
    const bool l2 = P.l2norm != 0;
    auto stage_z = [&](int st) { return reinterpret_cast<T*>(smem_raw + L::kZ) + st * BP * LD; };
    auto stage_x = [&](int st) { return reinterpret_cast<T*>(smem_raw + L::kX) + st * BP * LD; };

    // The state's linear rows v < Dv of both copies by cp.async (their group is the first tile's).
    const T* hi = has ? taylor_copy_at<T>(tp, blockIdx.z, blockIdx.y, sw.n_seg - 1, 0) : nullptr;
    const T* lo = has ? taylor_copy_at<T>(tp, blockIdx.z, blockIdx.y, sw.n_seg - 1, 1) : nullptr;
    for (int idx = tid; idx < 2 * D * CPR; idx += kTaylorThreads) {
        const int c = idx / (D * CPR), v = idx / CPR % D, ch = idx % CPR;
        const T* src = has ? (c == 0 ? hi : lo) + (long long)v * tp.f_pad + 8 + 8 * ch : static_cast<const T*>(P.q);
        cp_async_16(sS + (c * D + v) * LD + 8 * ch, src, has);
    }

    // Tile t into stage st: Z and X rows by cp.async (zero past the rows, and for keys past len_k), the
    // row scalars and output offsets; one commit, also past the last tile.
    auto issue = [&](int t, int st) {
        if (t < n_tiles) {
            const int ch = tid % CPR;
            T* z = stage_z(st);
            T* x = stage_x(st);
            for (int r = tid / CPR; r < BP; r += RPP) {
                const int p = t * BP + r;
                const T* zp = static_cast<const T*>(P.q);
                const T* xp = zp;
                bool valid;
                if constexpr (KEYS) {
                    valid = p < sw.si.len_k;
                    if (valid) {
                        zp = static_cast<const T*>(P.v) + sw.si.v_off(P, p, sw.hk) + 8 * ch;
                        xp = static_cast<const T*>(P.k) + sw.si.k_off(P, p, sw.hk) + 8 * ch;
                    }
                    if (ch == 0 && p < n_rows) {
                        sRg[st][r] = valid ? 1.f : 0.f;
                        sOz[st][r] = sw.si.dk_off(P, p, sw.hk);
                        sOx[st][r] = sw.si.dv_off(P, p, sw.hk);
                    }
                } else {
                    valid = p < n_rows;
                    const int i = sw.group == 1 ? p : p / sw.group, gg = p - i * sw.group;
                    const int h = sw.hk * sw.group + gg;
                    if (valid) {
                        zp = static_cast<const T*>(P.d_o) + sw.si.o_off(P, i, h) + 8 * ch;
                        xp = static_cast<const T*>(P.q) + sw.si.q_off(P, i, h) + 8 * ch;
                    }
                    if (ch == 0) {
                        const float* fs = static_cast<const float*>(P.q);  // a valid address for zero fills
                        const long long row = valid ? taylor_query_row(P, sw.si, sw.hk, i, gg) : 0;
                        cp_async_4(&sRg[st][r], valid ? tp.rg + row : fs, valid);
                        cp_async_4(&sNd[st][r], valid ? tp.nd + row : fs, valid);
                        if (valid) sOz[st][r] = sw.si.dq_off(P, i, h);
                    }
                }
                cp_async_16(z + r * LD + 8 * ch, zp, valid);
                cp_async_16(x + r * LD + 8 * ch, xp, valid);
            }
        }
        cp_async_commit();
    };

    issue(blockIdx.x, 0);
    const float up = has ? ldexpf(1.f, taylor_state_exponent(tp, blockIdx.z, blockIdx.y, sw.n_seg - 1)) : 0.f;
    auto both = [&](long long e) { return to_f32(hi[e]) + to_f32(lo[e]); };
    for (int d = tid; d < D; d += kTaylorThreads) {
        sDen[d] = has ? tp.a1 * up * both((long long)D * tp.f_pad + 8 + d) : 0.f;
        sConst[d] = has ? tp.a0 * up * both((long long)d * tp.f_pad) : 0.f;
    }
    const int wrow = warp * 16 * RT;
    const float xs = KEYS && tp.rev_raw != 0 ? P.scale : 1.f;  // the keys' state: x = q raw (rev_raw), or scale·q̂

    for (int t = blockIdx.x, n = 0; t < n_tiles; t += gridDim.x, ++n) {
        const int st = n & 1;
        T* sZ = stage_z(st);
        T* sX = stage_x(st);
        __syncthreads();  // the other stage (the previous tile's results, offsets) is no longer read
        issue(t + gridDim.x, st ^ 1);
        cp_async_wait<1>();
        __syncthreads();  // this tile (and, the first time, the state) has landed for every thread
        if (l2) taylor1_row_inv_norms<T, D, 16 * RT>(sInv, sX, wrow, P.eps, lane, true);
        const int np = min(BP, n_rows - t * BP);

        // acc = Z_raw S_lin[0..Dv)   [16·RT rows of this warp, D]: A = Z (k = v), B = S_lin rows (k = v).
        float acc[RT][NO][4];
        taylor1_rows_mma<T, D, RT, D / 16, 2, true>(acc, sZ, wrow, sS, D * LD, lane);
        __syncwarp();  // this warp's Z rows are read: dq or dk goes in their place

        // x = scale·dû (queries) or dk̂ (keys); then J(x_raw)ᵀ x into Z.
#pragma unroll
        for (int rt = 0; rt < RT; ++rt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = wrow + 16 * rt + g + 8 * r;
                // live·xs (keys: U's x is q raw under rev_raw, the scale applied here); rg·scale
                const float fz = KEYS ? sRg[st][row] * xs : sRg[st][row] * P.scale;
                const float fd = KEYS ? sRg[st][row] * xs : sNd[st][row] * P.scale;  // the den row's factor
                const float cz = tp.a1 * up * fz;
                float y[NO][2];
#pragma unroll
                for (int nn = 0; nn < NO; ++nn) {
                    const float2 dn = *reinterpret_cast<const float2*>(sDen + nn * 8 + 2 * t4);
                    y[nn][0] = cz * acc[rt][nn][2 * r] + fd * dn.x;
                    y[nn][1] = cz * acc[rt][nn][2 * r + 1] + fd * dn.y;
                }
                taylor1_store_l2_grad<T, NO>(sZ + row * LD, sX + row * LD, y, l2, l2 ? sInv[row] : 1.f, t4);
            }

        if constexpr (KEYS) {
            // acc = X_raw U_lin[0..Dv)ᵀ   [16·RT rows, Dv]: A = k (k = d), B = U_lin rows (n = v, k = d).
            taylor1_rows_mma<T, D, RT, D / 16, 2>(acc, sX, wrow, sS, D * LD, lane);
            __syncwarp();  // this warp's X rows are read: dv goes in their place
            // dv = live·(up·a0·U_const + a1·up·r_k·acc), r_k = 1/‖k‖ (qk_l2norm) or 1
#pragma unroll
            for (int rt = 0; rt < RT; ++rt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int row = wrow + 16 * rt + g + 8 * r;
                    const float live = sRg[st][row];
                    const float cz = tp.a1 * up * xs * (l2 ? fabsf(sInv[row]) : 1.f);
#pragma unroll
                    for (int nn = 0; nn < NO; ++nn) {
                        const int c = nn * 8 + 2 * t4;
                        const float2 k0 = *reinterpret_cast<const float2*>(sConst + c);
                        *reinterpret_cast<uint32_t*>(sX + row * LD + c) = pack2<T>(
                            live * (k0.x + cz * acc[rt][nn][2 * r]), live * (k0.y + cz * acc[rt][nn][2 * r + 1]));
                    }
                }
        }
        __syncwarp();
        taylor1_store_rows<T, D, 16 * RT>(KEYS ? P.dk : P.dq, sOz[st], sZ, wrow, np, lane);
        if constexpr (KEYS) taylor1_store_rows<T, D, 16 * RT>(P.dv, sOx[st], sX, wrow, np, lane);
    }
    cp_async_wait<0>();  // (only an empty group can be left)
}

}  // namespace attn
