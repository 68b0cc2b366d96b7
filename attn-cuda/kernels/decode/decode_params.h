// Parameters of the decode kernels (split-KV forward, its combine, the KV-cache append and the
// key-length kernel): one struct passed by value, mirrored field for field by
// `attn_cuda::decode::params::DecodeParams` (#[repr(C)]). Eight-byte fields first, then four-byte
// fields (an even number of them), so both sides agree on the layout. Element strides, never bytes.
#pragma once

struct DecodeParams {
    const void* q;             // [B, Nq, Hq, D] by the q strides
    const void* k;             // contiguous: [B, T, Hkv, D] by the k strides; paged: [pages·page_size, Hkv, D]
    const void* v;             // likewise, Dv
    void* o;                   // [B, Nq, Hq, Dv] by the o strides (storage dtype)
    float* lse;                // [B, Hq, Nq]
    float* ws_o;               // S > 1: partial outputs [S, B, Hq, Nq, Dv] f32
    float* ws_lse;             // S > 1: partial LSEs [S, B, Hq, Nq]
    const int* key_lens;       // per-sequence valid keys, or null (then seq_k)
    const int* block_table;    // paged: [B, pages_per_seq], or null (contiguous)
    const void* k_new;         // append: [B, new_tokens, Hkv, D]
    const void* v_new;         // append: [B, new_tokens, Hkv, Dv]
    void* k_cache;             // append: the cache written (same layout as k)
    void* v_cache;
    int* total_lens;           // key-length kernel: cache_seqlens[b] + new_tokens
    long long q_batch, q_seq, q_head;
    long long k_batch, k_seq, k_head;  // paged: k_batch unused, k_seq = the stride of one slot
    long long v_batch, v_seq, v_head;
    long long o_batch, o_seq, o_head;
    long long kn_batch, kn_seq, kn_head;  // k_new strides
    long long vn_batch, vn_seq, vn_head;  // v_new strides
    int batch, heads_q, heads_kv, group;
    int seq_q, seq_k, head_dim, head_dim_v;
    int causal;                // 0 none, 1 top-left, 2 bottom-right
    int window_left;           // -1: unbounded
    int window_right;          // -1: unbounded
    int key_len_add;           // added to key_lens[b] (the new tokens of a KV-cache step)
    int page_size;             // paged: a power of two (16 … 256); 0: contiguous
    int page_shift;            // log2(page_size)
    int pages_per_seq;
    int splits;                // S ≥ 1: key chunks per (sequence, kv head, row tile)
    int chunk;                 // keys per chunk, a multiple of the key tile
    int row_tiles;             // ⌈seq_q·group / 16⌉
    int new_tokens;
    int score;                 // 0 softmax, 1 cosine-sim, 2 squared Lorentz, 3 geodesic
    int l2norm;                // cosine-sim: scores on q̂, k̂
    int midpoint;              // hyperbolic Einstein midpoint: + log γ_j
    float scale;
    float softcap;             // 0: none
    float eps;                 // cosine-sim l2-norm epsilon
    float curvature;           // hyperbolic c
    float beta;                // hyperbolic β
    int bulk;                  // 1: K/V tiles by bulk copies on mbarriers (sm_90); 0: cp.async
};
