// target_graph.hpp: the target's forward graph for a batch of tokens.
//
// One builder serves prefill (a chain of n tokens), the AR step (n = 1) and tree verify: each
// token carries its own position, KV slot and attention-mask row (inputs set per call), so the
// graph's shape depends only on ForwardShape. Callers keep a built graph and reuse it while the
// shape is unchanged (then ggml-cuda can replay its captured CUDA graph).
//
// Per layer (pre-norm residual block, then a SwiGLU FFN with its own pre-norm):
//   full attention: q|gate = Wq x (per head), RMS-norm q and k, M-RoPE (all sections = position),
//                   K/V written to their slots, softmax(q k^T / sqrt(d) + mask) v, * sigmoid(gate), Wo
//   Gated DeltaNet: qkv = Wqkv x -> causal conv (window continues the cached one) -> silu ->
//                   l2-normed q, k + v -> delta rule with gate g and beta -> RMS norm * silu(z) -> Wout
#pragma once

#include <cstdint>
#include <memory>

#include "caches.hpp"
#include "graph_common.hpp"
#include "gguf_target.hpp"
#include "sample_graph.hpp"

namespace lb {

struct ForwardShape {
    int32_t n_tokens = 0;
    int32_t n_kv = 0;        // KV rows attended: a multiple of kKvPad covering every written slot
    bool tree = false;       // verify: tree ops for DeltaNet, recurrent state left as is, inputs kept
    bool all_rows = false;   // logits + argmax for every token (else for the last one only)
    uint32_t capture_gen = 0;  // capture configuration the graph was built for
    int32_t n_cand = 0;      // sampling tail: candidates per output row (0: no tail)
    int32_t pen_slots = 0;   // sampling tail: penalty slots per output row

    bool operator==(const ForwardShape & o) const {
        return n_tokens == o.n_tokens && n_kv == o.n_kv && tree == o.tree && all_rows == o.all_rows &&
               capture_gen == o.capture_gen && n_cand == o.n_cand && pen_slots == o.pen_slots;
    }
};

struct ForwardGraph {
    ForwardShape shape;
    GraphMeta meta;
    // inputs (set before each compute)
    ggml_tensor * tokens = nullptr;   // i32 [n]
    ggml_tensor * pos = nullptr;      // i32 [4n]: M-RoPE positions, section-major (t, h, w, e)
    ggml_tensor * kv_idx = nullptr;   // i64 [n]: KV slot each token writes (only with attention layers)
    ggml_tensor * mask = nullptr;     // f16 [n_kv, n]: 0 = may attend, -inf = may not
    ggml_tensor * parents = nullptr;  // i32 [n]: tree parent of each token, -1 for the root (tree only)
    // outputs
    ggml_tensor * logits = nullptr;   // f32 [n_vocab, n_out]
    ggml_tensor * argmax = nullptr;   // i32 [n_out]
    int32_t n_out = 0;
    SampleTail sample;                // sampling tail over logits (shape.n_cand > 0), see sample_graph.hpp

    explicit ForwardGraph(size_t max_nodes) : meta(max_nodes) {}
};

std::unique_ptr<ForwardGraph> build_forward(const TargetModel & m, const TargetCache & c, const ForwardShape & s);

}  // namespace lb
