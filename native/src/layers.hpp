// layers.hpp: graph pieces the target and the draft share: a graph's metadata context, RMS norm,
// attention, and the padding of attended KV rows.
#pragma once

#include <cstdint>

#include "ggml-cpp.h"
#include "ggml.h"

namespace lb {

// A graph's tensor metadata (no data: gallocr places it) and the graph itself. Kept with its graph
// in a GraphSlot (backend.hpp) while the graph is reused.
struct GraphMeta {
    ggml_context_ptr ctx;
    ggml_cgraph * gf = nullptr;

    explicit GraphMeta(size_t max_nodes);
};

// x * rsqrt(mean(x^2) + eps) * w, over ne0.
ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps);

// A graph input [ne0, ne1] of `type` (ne1 = 1: a vector), uploaded before each compute.
ggml_tensor * graph_input(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1 = 1);

// softmax(K^T q * scale + mask) V per head (GQA: n_head a multiple of n_head_kv).
//   q [head_dim, n, n_head]; K, V [head_dim, n_kv, n_head_kv] (cache views); mask f16 [n_kv, n]
// flash: ggml's flash attention, which visits a query's unmasked key rows in slot order and skips
// masked ones; else the same math with plain ops (mul_mat, soft_max, mul_mat) for backends with no
// flash kernel for the shapes. Returns [head_dim * n_head, n].
ggml_tensor * attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * K, ggml_tensor * V, ggml_tensor * mask,
                        float scale, bool flash);

// KV rows are allocated and attended in multiples of this: flash-attention kernels take their fast
// paths at such key counts, and graph shapes (hence CUDA graphs) change only every kKvPad tokens.
constexpr int32_t kKvPad = 256;
inline int32_t pad_kv_rows(int32_t n) { return (n + kKvPad - 1) / kKvPad * kKvPad; }

}  // namespace lb
