// Recurrent Taylor decode: the running sums S[f][v] = Σ_j φ_f(k̂_j) ṽ_j[v] of every feature f of a
// (batch entry, kv head) over the keys so far, f32, [B][Hkv][features][M] (features = 8·taylor_tiles).
//   prefill:       S over every valid key of each batch entry (after its forward);
//   step:          for each new token i in order: S += φ(k̂_i) ṽ_iᵀ, then every query head g of the group
//                  reads its feature block's part Σ_f ψ_f(u_ig) S[f] of [num, den] into its own slot
//                  of the partials (st: [n_slabs feature blocks][rows][M]);
//   reduce:        [num, den] = the sum of the partials in feature-block order (no atomics: the same
//                  bits on every run), then the forward's finalize turns them into o and den.
// One block = FB = 64 features of one (batch entry, kv head); thread v owns column v of those rows, so a
// token costs O(features·M) per kv head: O(D^p·Dv). f32 on CUDA cores for every storage type.
#pragma once
#include "taylor_rows.cuh"

namespace attn {

constexpr int kDecodeFeatures = 64;  // features (8 tiles) per block

template <typename T, int D>
__device__ __forceinline__ void taylor_decode_prefill(const TaylorParams& tp) {
    constexpr int M = TaylorDims<D>::M, FB = kDecodeFeatures, CK = 32, LDX = D + 4, LDY = M + 3;
    constexpr int PER = (FB * M + kTaylorThreads - 1) / kTaylorThreads;
    __shared__ __align__(16) float sX[CK * LDX];
    __shared__ __align__(16) float sY[CK * LDY];
    __shared__ __align__(16) float sPhi[CK * FB];
    __shared__ TaylorRowRef sRef[CK];
    const AttnParams& p = tp.base;
    const int tid = threadIdx.x, b = blockIdx.z, hk = blockIdx.y, f0 = blockIdx.x * FB;
    const SeqInfo si(p, b);
    float acc[PER];
#pragma unroll
    for (int k = 0; k < PER; ++k) acc[k] = 0.f;
    for (int j0 = 0; j0 < si.len_k; j0 += CK) {
        const int valid = min(CK, si.len_k - j0);
        // k̂_j (the loader applies the l2-norm), ṽ_j = [v_j, 1]
        for (int r = tid; r < CK; r += kTaylorThreads) {
            TaylorRowRef ref{nullptr, nullptr, 1.f, 1.f, 1.f};
            if (r < valid) ref.x = static_cast<const T*>(p.k) + si.k_off(p, j0 + r, hk);
            sRef[r] = ref;
        }
        __syncthreads();
        taylor_load_x<T, float, CK, D, LDX>(tp, sX, sRef, tid);
        for (int idx = tid; idx < CK * M; idx += kTaylorThreads) {
            const int r = idx / M, v = idx % M, j = j0 + r;
            float y = 0.f;
            if (r < valid) y = v < D ? to_f32(static_cast<const T*>(p.v)[si.v_off(p, j, hk) + v]) : 1.f;
            sY[r * LDY + v] = y;
        }
        __syncthreads();
        for (int idx = tid; idx < CK * (FB / 8); idx += kTaylorThreads) {
            const int r = idx / (FB / 8), t = idx % (FB / 8);
            float v[8];
            source_features(v, feature_tile(f0 / 8 + t, D, tp.order), sX + r * LDX);
            store8<float>(sPhi + r * FB + 8 * t, v);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int item = tid + k * kTaylorThreads;
            if (item >= FB * M) continue;
            const int f = item / M, v = item % M;
            for (int r = 0; r < CK; ++r) acc[k] += sPhi[r * FB + f] * sY[r * LDY + v];
        }
        __syncthreads();
    }
    float* S = tp.state + ((long long)b * p.heads_kv + hk) * tp.features * M;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int item = tid + k * kTaylorThreads;
        const int f = item / M, v = item % M;
        if (item < FB * M && f0 + f < tp.features) S[(long long)(f0 + f) * M + v] = acc[k];
    }
}

// Shared memory of a step (f32): φ [FB], ψ [G][FB], k̂ [D], ṽ [M rounded to 4], u [G][D].
template <typename T, int D>
__device__ __forceinline__ void taylor_decode_step(const TaylorParams& tp) {
    constexpr int M = TaylorDims<D>::M, FB = kDecodeFeatures, MV = (M + 3) / 4 * 4;
    const AttnParams& p = tp.base;
    const int G = p.group;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* sPhi = reinterpret_cast<float*>(smem_raw);
    float* sPsi = sPhi + FB;
    float* sK = sPsi + G * FB;
    float* sV = sK + D;
    float* sU = sV + MV;
    if (dynamic_smem_bytes() < (unsigned)((FB + G * FB + D + MV + G * D) * 4)) __trap();

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int b = blockIdx.z, hk = blockIdx.y, f0 = blockIdx.x * FB;
    const SeqInfo si(p, b);
    const int nf = min(FB, tp.features - f0);
    const long long rows = (long long)p.total_q * p.heads_q;  // query rows of the partials
    float* S = tp.state + (((long long)b * p.heads_kv + hk) * tp.features + f0) * M;
    for (int i = 0; i < si.len_q; ++i) {
        // k̂_i, ṽ_i = [v_i, 1] and u_ig = scale·q̂_ig of the group's heads (one warp per row).
        for (int row = warp; row < 2 + G; row += kTaylorWarps) {
            if (row == 0) {
                const T* k = static_cast<const T*>(p.k) + si.k_off(p, i, hk);
                const float r = p.l2norm ? 1.f / fmaxf(sqrtf(taylor_row_sq(k, D, lane)), p.eps) : 1.f;
                for (int d = lane; d < D; d += 32) sK[d] = to_f32(k[d]) * r;
            } else if (row == 1) {
                const T* v = static_cast<const T*>(p.v) + si.v_off(p, i, hk);
                for (int d = lane; d < M; d += 32) sV[d] = d < D ? to_f32(v[d]) : 1.f;
            } else {
                const int g = row - 2;
                const T* q = static_cast<const T*>(p.q) + si.q_off(p, i, hk * G + g);
                const float r = p.scale * (p.l2norm ? 1.f / fmaxf(sqrtf(taylor_row_sq(q, D, lane)), p.eps) : 1.f);
                for (int d = lane; d < D; d += 32) sU[g * D + d] = to_f32(q[d]) * r;
            }
        }
        __syncthreads();
        for (int idx = tid; idx < (1 + G) * (FB / 8); idx += kTaylorThreads) {
            const int row = idx / (FB / 8), t = idx % (FB / 8);
            const FeatureTile ft = feature_tile(f0 / 8 + t, D, tp.order);
            float v[8];
            if (row == 0) {
                source_features(v, ft, sK);
                store8<float>(sPhi + 8 * t, v);
            } else {
                probe_features(v, ft, sU + (row - 1) * D, tp.a0, tp.a1, tp.a2);
                store8<float>(sPsi + (row - 1) * FB + 8 * t, v);
            }
        }
        __syncthreads();
        for (int v = tid; v < M; v += kTaylorThreads) {
            const float vv = sV[v];
            for (int f = 0; f < nf; ++f) S[(long long)f * M + v] += sPhi[f] * vv;  // S += φ(k̂_i) ṽ_iᵀ
            for (int g = 0; g < G; ++g) {
                float acc = 0.f;
                for (int f = 0; f < nf; ++f) acc += sPsi[g * FB + f] * S[(long long)f * M + v];
                tp.st[(long long)blockIdx.x * rows * M + taylor_query_row(p, si, hk, i, g) * M + v] = acc;
            }
        }
        __syncthreads();  // k̂, ṽ, u, φ, ψ are rewritten by the next token
    }
}

// Grid (⌈rows·M / 128⌉): acc_q[e] = Σ_σ st[σ][e] over the n_slabs feature blocks, in order.
__device__ __forceinline__ void taylor_decode_reduce(const TaylorParams& tp) {
    const long long n = (long long)tp.base.total_q * tp.base.heads_q * (tp.base.head_dim + 1);
    const long long e = (long long)blockIdx.x * kTaylorThreads + threadIdx.x;
    if (e >= n) return;
    float s = 0.f;
    for (int fb = 0; fb < tp.n_slabs; ++fb) s += tp.st[fb * n + e];
    tp.acc_q[e] = s;
}

}  // namespace attn
