// commit_graph.hpp: make the caches equal "prefix + accepted path" after a tree verify.
//
// The verify wrote node i's K/V to slot P+i and kept every node's DeltaNet inputs (pre-conv qkv,
// g, beta) in the tree scratch, without advancing the recurrent state. For an accepted path
// path[0] = 0 (root), path[1], ..., path[k] the commit graph
//   * moves KV rows P+path[i] -> P+i in every attention layer (bit-exact: through the F32 raw
//     views of the cache; gathered before scattered, so overlapping moves are safe), and
//   * replays the path through each DeltaNet layer as a chain from the committed state: conv
//     window and delta-rule state come out exactly as k+1 AR steps would leave them, at the cost of
//     one state read + write per layer (instead of storing every node's state during verify). The
//     layers are independent here, so kCommitLayers of them replay side by side (the caches' *_all
//     stacks): one op each for the group instead of one per layer (~8 kernels a group, not a layer).
// The commit graphs never run at once: they share one compute buffer (tree_verify.cpp).
#pragma once

#include <cstdint>
#include <memory>

#include "caches.hpp"
#include "graph_common.hpp"
#include "gguf_target.hpp"

namespace lb {

struct CommitGraph {
    int32_t n_path = 0;
    bool move_kv = false;             // false when the path is the identity (nothing to move)
    GraphMeta meta;
    ggml_tensor * path = nullptr;     // i32 [n_path, path->ne[1]]: tree node of each accepted token, each row alike
    ggml_tensor * kv_src = nullptr;   // i32 [n_path]: P + path[i]
    ggml_tensor * kv_dst = nullptr;   // i64 [n_path]: P + i

    explicit CommitGraph(size_t max_nodes) : meta(max_nodes) {}
};

std::unique_ptr<CommitGraph> build_commit(const TargetModel & m, const TargetCache & c, int32_t n_path, bool move_kv);

}  // namespace lb
