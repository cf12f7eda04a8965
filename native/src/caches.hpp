// caches.hpp: everything the target remembers between calls, on the backend.
//
//   KV cache (full-attention layers): k[il] = [head_dim*n_head_kv, rows] of type_k, v[il] the same
//     of type_v; slot p holds the token at position p. Rows are padded to 16 bytes so k_raw/v_raw,
//     F32 views of the same bytes, can move rows bit-exactly whatever the types are (commit).
//   Recurrent state (Gated DeltaNet layers): conv[il] = [d_conv-1, conv_channels] f32, the last
//     d_conv-1 pre-conv inputs (oldest first); ssm[il] = [S, S, n_v_heads] f32, the delta-rule state.
//   Tree scratch (Gated DeltaNet layers): the last verify's per-node pre-conv inputs and gates,
//     tree_qkv[il] = [conv_channels, max_tree], tree_g[il] / tree_beta[il] = [n_v_heads, max_tree];
//     commit replays the accepted path from these instead of keeping every node's state.
//   The DeltaNet layers' state and scratch are each one tensor of all layers side by side (the *_all
//   stacks; the per-layer tensors are views into them), so commit replays many layers with one op each.
//   Captured features: capture[j] = [n_embd, capture_rows] f32, the residual stream after layer
//     capture_layers[j] for each token of the last forward (column = token / tree node).
#pragma once

#include <cstdint>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"
#include "gguf_target.hpp"
#include "layers.hpp"

namespace lb {

struct TargetCache {
    int32_t rows = 0;              // KV slots: max_ctx rounded up to kKvPad
    int32_t max_tree = 0;
    ggml_type type_k = GGML_TYPE_F16;
    ggml_type type_v = GGML_TYPE_F16;

    std::vector<ggml_tensor *> k, v;           // per layer; nullptr for DeltaNet layers
    std::vector<ggml_tensor *> k_raw, v_raw;   // per layer; F32 [row_bytes/4, rows] aliases
    std::vector<ggml_tensor *> conv, ssm;      // per layer; nullptr for attention layers
    std::vector<ggml_tensor *> tree_qkv, tree_g, tree_beta;  // per layer; nullptr for attention layers
    // The stacks (nullptr without DeltaNet layers); DeltaNet layer r (counting DeltaNet layers only) is entry r:
    ggml_tensor * conv_all = nullptr;      // [d_conv-1, conv_channels * n_rec]
    ggml_tensor * ssm_all = nullptr;       // [S, S, n_v_heads, n_rec]
    ggml_tensor * tree_qkv_all = nullptr;  // [conv_channels * n_rec, max_tree]: a node's column holds every layer's
    ggml_tensor * tree_g_all = nullptr;    // [n_v_heads, max_tree, n_rec]
    ggml_tensor * tree_beta_all = nullptr; // [n_v_heads, max_tree, n_rec]

    std::vector<int32_t> capture_layers;
    std::vector<ggml_tensor *> capture;        // one per capture layer
    int32_t capture_rows = 0;

    ggml_context_ptr ctx;          // k, v
    ggml_context_ptr alias_ctx;    // k_raw / v_raw (no storage of their own)
    ggml_context_ptr state_ctx;    // conv, ssm
    ggml_context_ptr tree_ctx;     // tree_qkv, tree_g, tree_beta
    ggml_context_ptr capture_ctx;
    // declared after the contexts: a buffer is freed before the context of its tensors
    ggml_backend_buffer_ptr kv_buf, state_buf, tree_buf, capture_buf;

    size_t bytes() const;
};

// Lays out every cache's tensors (no memory yet): what cache_alloc places, and what the memory
// planner sizes (cache_plan_bytes). Throws Error(LB_E_UNSUPPORTED) for a KV type the head size rules out.
void cache_layout(TargetCache & c, const TargetHparams & hp, int32_t max_ctx, ggml_type type_k, ggml_type type_v,
                  int32_t max_tree);
// Allocates and zeroes the laid-out caches. Throws Error(LB_E_OOM) naming the size that did not fit.
void cache_alloc(TargetCache & c, ggml_backend_t backend);

// Bytes the laid-out caches take in buffers of `buft` (what cache_alloc and cache_set_capture allocate).
struct CacheBytes {
    size_t kv = 0, state = 0, tree = 0, capture = 0;
};
CacheBytes cache_plan_bytes(const TargetCache & c, ggml_backend_buffer_type_t buft);

// Zeroes the recurrent state (conv + ssm): the state of an empty prefix. KV rows need no reset.
void cache_clear_state(TargetCache & c);

// (Re)creates the capture tensors for `layers` (0-based target layers), `rows` columns each, and
// allocates them on `backend` (nullptr: lays them out only, for the memory planner).
void cache_set_capture(TargetCache & c, ggml_backend_t backend, int32_t n_embd, const std::vector<int32_t> & layers,
                       int32_t rows);

}  // namespace lb
