// tree_verify.cpp: lb_engine::verify (one target forward over a token tree) and
// lb_engine::commit (make the caches equal "prefix + accepted path"; see commit_graph.hpp).
//
// Node i of a verify tree sits at position P + depth(i), writes KV slot P + i, and attends to the
// committed prefix plus its own ancestors; DeltaNet layers run the tree ops from the committed state.
#include <algorithm>
#include <cstring>

#include "engine.hpp"
#include "error.hpp"

using lb::check;

void lb_engine::verify(const int32_t * toks, const int32_t * parents, int32_t n, int32_t * out_argmax, float * logits,
                       int64_t logits_cap, const lb_sampling * sampling) {
    check(toks != nullptr && parents != nullptr && out_argmax != nullptr, LB_E_INVALID_ARG,
          "lb_verify: toks, parents and out_argmax must not be NULL");
    check(n >= 1 && n <= max_tree, LB_E_INVALID_ARG,
          "lb_verify: n = " + std::to_string(n) + " is outside [1, max_tree = " + std::to_string(max_tree) + "]");
    check(parents[0] == -1, LB_E_INVALID_ARG, "lb_verify: parents[0] must be -1 (node 0 is the root)");
    for (int32_t i = 1; i < n; ++i) {
        check(parents[i] >= 0 && parents[i] < i, LB_E_INVALID_ARG,
              "lb_verify: parents[" + std::to_string(i) + "] = " + std::to_string(parents[i]) +
                  " must be in [0, " + std::to_string(i) + "): every parent precedes its children");
    }
    check_batch(toks, n, logits, logits_cap, "lb_verify", "tree nodes");
    const int64_t n_vocab = model->hp.n_vocab;
    if (sampling) sample_inputs_.check(*sampling, n, model->hp.n_vocab);

    verify_pending_ = false;  // until this verify has fully run
    sampled_rows_ = 0;
    lb::ForwardShape shape{n, n_kv_for(n), true, true, capture_gen_};
    if (sampling) {
        shape.n_cand = sampling->n_candidates;
        shape.pen_slots = lb::penalty_slots(sampling->penalty_last_n, model->hp.n_vocab);
    }
    lb::ForwardGraph & g = forward_graph(verify_slot_, shape, "verify");
    const int32_t n_kv = shape.n_kv;

    // node i: position P + depth(i), slot P + i, sees the prefix and its own ancestors
    depth_host_.assign(size_t(n), 0);
    std::vector<uint8_t> & allowed = allowed_host_;  // [i * n + j]: node i may attend node j
    allowed.assign(size_t(n) * size_t(n), 0);
    for (int32_t i = 0; i < n; ++i) {
        if (i > 0) {
            depth_host_[size_t(i)] = depth_host_[size_t(parents[i])] + 1;
            std::memcpy(&allowed[size_t(i) * size_t(n)], &allowed[size_t(parents[i]) * size_t(n)], size_t(i));
        }
        allowed[size_t(i) * size_t(n) + size_t(i)] = 1;
    }
    model->embedding.stage(backend.get(), toks, n, g.tokens);
    lb::set_input(backend.get(), g.parents, parents, size_t(n) * sizeof(int32_t));
    set_positions_and_slots(g, n, depth_host_.data());
    if (g.mask) verify_mask_.set(backend.get(), g.mask, verify_slot_.builds, n, n_kv, n_past, allowed.data());
    run_sampled(g, sampling, {toks, parents, n}, n, "verify");
    ggml_backend_tensor_get(g.argmax, out_argmax, 0, size_t(n) * sizeof(int32_t));
    if (logits) ggml_backend_tensor_get(g.logits, logits, 0, size_t(n) * size_t(n_vocab) * sizeof(float));
    verify_parents_.assign(parents, parents + n);
    verify_pending_ = true;
}

void lb_engine::commit(const int32_t * path, int32_t n_path) {
    check(verify_pending_, LB_E_STATE,
          "lb_commit without a preceding lb_verify (or after prefill/step/reset/commit); call lb_verify first");
    check(path != nullptr, LB_E_INVALID_ARG, "lb_commit: path must not be NULL");
    const int32_t n = int32_t(verify_parents_.size());
    check(n_path >= 1 && n_path <= n, LB_E_INVALID_ARG,
          "lb_commit: n_path = " + std::to_string(n_path) + " is outside [1, " + std::to_string(n) + "] (tree size)");
    check(path[0] == 0, LB_E_INVALID_ARG, "lb_commit: path[0] must be 0 (the root)");
    bool identity = true;
    for (int32_t i = 1; i < n_path; ++i) {
        check(path[i] > 0 && path[i] < n && verify_parents_[size_t(path[i])] == path[i - 1], LB_E_INVALID_ARG,
              "lb_commit: path[" + std::to_string(i) + "] = " + std::to_string(path[i]) + " is not a child of path[" +
                  std::to_string(i - 1) + "] = " + std::to_string(path[i - 1]));
        identity = identity && path[i] == i;
    }

    const bool move_kv = !identity;
    CommitSlot & slot = commit_slots_[{n_path, move_kv}];
    if (!slot.graph) {
        if (!commit_galloc_) commit_galloc_.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend.get())));
        // a new buffer (grown, or freed by a failed growth) leaves the other graphs' tensors pointing into the old
        // one: they are built again when next used
        auto drop_others = [&] {
            for (auto & other : commit_slots_) {
                if (&other.second != &slot) other.second.graph.reset();
            }
        };
        const size_t before = ggml_gallocr_get_buffer_size(commit_galloc_.get(), 0);
        try {
            lb::install_graph(backend.get(), slot, lb::build_commit(*model, cache, n_path, move_kv), "commit",
                              "lower max_ctx or max_tree", commit_galloc_.get());
        } catch (...) {
            drop_others();
            throw;
        }
        if (ggml_gallocr_get_buffer_size(commit_galloc_.get(), 0) != before) drop_others();
    }
    lb::CommitGraph & g = *slot.graph;
    // the path once per row of the input (each a layer's index row in the batched gathers)
    const int64_t rows = g.path->ne[1];
    i32_host_.resize(size_t(n_path * rows));
    for (int64_t r = 0; r < rows; ++r) std::copy(path, path + n_path, i32_host_.begin() + r * n_path);
    lb::set_input(backend.get(), g.path, i32_host_.data(), i32_host_.size() * sizeof(int32_t));
    if (g.kv_src) {
        i32_host_.resize(size_t(n_path));
        kv_idx_host_.resize(size_t(n_path));
        for (int32_t i = 0; i < n_path; ++i) {
            i32_host_[size_t(i)] = n_past + path[i];
            kv_idx_host_[size_t(i)] = n_past + i;
        }
        lb::set_input(backend.get(), g.kv_src, i32_host_.data(), size_t(n_path) * sizeof(int32_t));
        lb::set_input(backend.get(), g.kv_dst, kv_idx_host_.data(), size_t(n_path) * sizeof(int64_t));
    }
    if (ggml_graph_n_nodes(g.meta.gf) > 0) compute(g.meta.gf, "commit", /*wait=*/false);
    sampled_rows_ = 0;
    n_past += n_path;
    verify_pending_ = false;
    if (on_commit) on_commit(path, n_path, 0);
}
