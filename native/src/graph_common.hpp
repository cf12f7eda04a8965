// graph_common.hpp: pieces shared by the forward graph (target_graph.cpp) and the commit graph
// (commit_graph.cpp): their size bound, the Gated DeltaNet core that turns a layer's pre-conv inputs into
// its output (and, on a chain, its next state), and the store of that state into the caches.
#pragma once

#include <cstdint>

#include "ggml.h"
#include "gguf_target.hpp"
#include "layers.hpp"

namespace lb {

// Upper bound on graph nodes for a target of n_layer layers.
size_t graph_max_nodes(int32_t n_layer);

struct DeltaOut {
    ggml_tensor * y = nullptr;          // [S, n_v_heads, n, L]: delta-rule output (before the gated norm)
    ggml_tensor * new_state = nullptr;  // [S, S, n_v_heads * L]: state after the last token (chain only)
    ggml_tensor * new_conv = nullptr;   // [d_conv-1, C * L]: conv window after the last token (chain only)
};

// The Gated DeltaNet recurrence of L layers side by side (L = ssm_state->ne[3]: 1 in a forward, several when commit
// replays a path through many layers at once; each layer's arithmetic is the same either way) for n tokens.
//   qkv   [C * L, n]: pre-conv projections (each layer's q | k | v), C = conv_channels
//   g     [n_v_heads, n, L]: log decay, ssm_a * softplus(alpha + dt_bias)
//   beta  [n_v_heads, n, L]: sigmoid(beta projection)
//   conv1d [d_conv, C * L]: the layers' conv weights
//   conv_state [d_conv-1, C * L], ssm_state [S, S, n_v_heads, L]: the committed state (read only here)
//   parents: nullptr for a chain (token t follows t-1; new_state / new_conv are returned), or
//            i32 [n] tree parents (token t follows parents[t]; the state is not advanced; one layer only)
DeltaOut build_delta_core(ggml_context * ctx, const TargetHparams & hp, ggml_tensor * conv1d, ggml_tensor * conv_state,
                          ggml_tensor * ssm_state, ggml_tensor * qkv, ggml_tensor * g, ggml_tensor * beta,
                          ggml_tensor * parents);

// Stores a chain's next state and conv window into the caches (nodes of gf). The state goes through a flat
// [S*S*n_v_heads, L, 1] view of the cache: the pattern ggml-cuda recognises to have the delta net kernel write
// the cache itself (ggml_cuda_try_gdn_cache_fusion) instead of a copy after it. The same bytes either way.
void store_delta_state(ggml_context * ctx, ggml_cgraph * gf, const DeltaOut & d, ggml_tensor * conv_state,
                       ggml_tensor * ssm_state);

}  // namespace lb
