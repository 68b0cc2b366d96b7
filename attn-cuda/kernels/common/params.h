// Kernel parameters: one struct passed by value (`__grid_constant__`), mirrored field for field by
// `attn_cuda::params::AttnParams` (#[repr(C)]). Eight-byte fields first, then four-byte fields, so
// both sides agree on the layout without padding surprises; the hyperbolic block is appended under the
// same rule (an even number of four-byte fields before it), so the offsets of every other field are
// those the softmax and cosine-sim kernels were built with. Element strides, never bytes.
#pragma once

struct AttnParams {
    // Tensors (device pointers). q, k, v, bias, o, dO, dq, dk, dv are in the storage dtype.
    const void* q;
    const void* k;
    const void* v;
    const void* bias;      // [Bb, Hb, Nq, Nk] contiguous, or null
    void* o;
    float* lse;            // LSE_i, statistics layout (see stats_index)
    const void* d_o;       // same strides as o
    void* dq;
    void* dk;
    void* dv;
    float* delta;          // δ_i = dO_i·o_i, statistics layout
    float* ds;             // f32 dS for the bias gradient, [B, Hq, Nq, Nk], or null
    void* dbias;           // dL/dbias, the bias's shape, written by the reduction over broadcast dims
    float* dq_acc;         // cosine with l2norm: dq̂ (f32, dq strides), projected by a row kernel
    float* dk_acc;         // cosine with l2norm: dk̂ (f32, dk strides)
    float* rq;             // cosine backward: 1/max(‖q‖, eps), indexed by dq_offset / D
    float* rk;             // cosine backward: 1/max(‖k‖, eps), indexed by dk_offset / D
    const int* key_lens;   // key padding: valid keys per batch entry, or null
    const int* cu_q;       // packed varlen: [B + 1] query row offsets, or null
    const int* cu_k;       // packed varlen: [B + 1] key row offsets, or null
    long long q_batch, q_seq, q_head;
    long long k_batch, k_seq, k_head;
    long long v_batch, v_seq, v_head;
    long long o_batch, o_seq, o_head;
    long long dq_batch, dq_seq, dq_head;
    long long dk_batch, dk_seq, dk_head;
    long long dv_batch, dv_seq, dv_head;
    // Sizes and options.
    int batch, heads_q, heads_kv, group;
    int seq_q, seq_k, total_q, total_k;
    int head_dim;
    int causal;            // 0 none, 1 top-left, 2 bottom-right
    int window_left;       // -1: unbounded
    int window_right;      // -1: unbounded
    int bias_batch;        // 1 or B (0 without bias)
    int bias_heads;        // 1 or Hq (0 without bias)
    int l2norm;            // cosine: scores use q̂, k̂
    int running_max;       // 1: online max; 0: fixed offset `max_offset` (cosine)
    float scale;
    float softcap;         // 0: none
    float eps;             // l2-norm epsilon
    float max_offset;      // the fixed row max when running_max == 0
    // Hyperbolic (docs/math.md §4). Per-row scalars in f32 scratch, written by the row kernels of
    // hyperbolic.cu: query rows indexed like the statistics (stats_index), key rows by key_index.
    float* x0q;            // q0 = √(1/c + ‖q‖²)
    float* nq;             // ‖q‖
    float* x0k;            // k0
    float* nk;             // ‖k‖
    float* lgk;            // Einstein midpoint: log γ_j, γ_j = 1/√(1 − min(c‖v_j‖², KLEIN_MAX_NORM2))
    float* dgk;            // Einstein midpoint: c γ_j², 0 where the Klein-ball clamp is active
    int midpoint;          // 1: Einstein-midpoint aggregation (the per-key bias log γ_j)
    float curvature;       // c > 0
    float beta;            // β > 0
    float hyp_c;           // fast-path multiplier, log2 units: 2β·log2 e, or −β/√c (geodesic)
    float hyp_lse;         // the constant part of s, added to LSE: 2β/c, or −(β/√c)·ln c (geodesic)
    float hyp_grad;        // gradient scale: 2β, or β/√c (geodesic)
    float* dq_rowsum;      // fused backward: a_i = Σ_j w_ij k0_j per query row (statistics layout), zeroed
    int dq_acc_tiled;      // 1: dq_acc in the warp-specialised fused backward's layout (SeqInfo::dq_acc_index)
    int tiles_q;           // persistent forward: query tiles per (batch entry, head), persistent_tile
    int* tile_counter;     // read by no kernel (null): the layout params.rs mirrors
    // Taylor order 2 on the flash skeleton (TaylorScore): f(s) = a0 + a1 s + a2 s²; `poly` = 1 tells the
    // row kernels that the statistics are the denominators (the backward's second half holds 1/den).
    float poly_a0, poly_a1, poly_a2;
    int poly;
    // Causal grids: (batch entry, head) pairs per section of mask.h's tile_order, for the grids of
    // query tiles (forward, dQ) and of key tiles (dK/dV, fused); 1: head by head (host:
    // heuristics::causal_sections).
    int section_q, section_k;
};
