// memory_plan.cpp: see memory_plan.hpp. The forward shapes below are those lb_engine builds
// (engine.cpp prefill / step, tree_verify.cpp verify / commit) at their largest.
#include "memory_plan.hpp"

#include <algorithm>
#include <string>

#include "backend.hpp"
#include "caches.hpp"
#include "commit_graph.hpp"
#include "draft_config.hpp"
#include "draft_model.hpp"
#include "error.hpp"
#include "gguf_target.hpp"
#include "load_params.hpp"
#include "target_graph.hpp"

namespace lb {

namespace {

// The compute buffer of one cached-graph slot: the larger of its greedy and sampled graphs.
size_t forward_bytes(const TargetModel & m, const TargetCache & c, ForwardShape shape, const lb_plan_shape & s,
                     ggml_backend_buffer_type_t buft) {
    size_t bytes = plan_graph_bytes(build_forward(m, c, shape)->meta.gf, buft);
    if (s.n_candidates > 0) {
        shape.n_cand = s.n_candidates;
        shape.pen_slots = penalty_slots(s.penalty_last_n, m.hp.n_vocab);
        bytes = std::max(bytes, plan_graph_bytes(build_forward(m, c, shape)->meta.gf, buft));
    }
    return bytes;
}

void log_slot(const char * what, size_t bytes) {
    log_msg(LB_LOG_DEBUG, "memory plan: compute buffer of the %s graph(s): %.1f MiB", what, double(bytes) / (1 << 20));
}

}  // namespace

lb_memory plan_memory(const lb_params & p, const lb_plan_shape & s) {
    check_params(p);
    // the plan's own messages at the caller's level; a loaded engine's level is back after
    struct LevelFor {
        int32_t was = log_level();
        explicit LevelFor(int32_t level) { set_log_level(level); }
        ~LevelFor() { set_log_level(was); }
    } level_for(p.log_level);
    check(s.verify_nodes >= 1 && s.verify_nodes <= p.max_tree, LB_E_INVALID_ARG,
          "lb_memory_plan: verify_nodes " + std::to_string(s.verify_nodes) + " is outside [1, max_tree = " +
              std::to_string(p.max_tree) + "]");
    check(s.draft_top_k >= 1 && s.n_candidates >= 0 && s.penalty_last_n >= 0, LB_E_INVALID_ARG,
          "lb_memory_plan: draft_top_k must be >= 1, n_candidates and penalty_last_n >= 0");
    const ggml_type type_k = kv_type_from_lb(p.type_k, "type_k"), type_v = kv_type_from_lb(p.type_v, "type_v");
    ggml_backend_dev_t dev = device_of(p.device);
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
    const bool is_cpu = device_is_cpu(dev);

    lb_memory out{};
    size_t weights = 0;
    std::unique_ptr<TargetModel> model = plan_target(p.target_path, buft, is_cpu, &weights);
    const TargetHparams & hp = model->hp;
    out.weights = int64_t(weights);
    if (!is_cpu) check_cuda_shapes(hp);
    check_kv_types(dev, hp, type_k, type_v);
    check_attention_reach(dev, hp, p);
    TargetCache cache;
    cache_layout(cache, hp, p.max_ctx, type_k, type_v, p.max_tree);

    // the draft: its weights, ring and graphs; the target captures its layers' features for it
    int32_t block = 0;
    const bool has_draft = p.draft_path != nullptr && p.draft_path[0] != '\0';
    if (has_draft) {
        const DraftConfig cfg = draft_config_load(p.draft_path);
        cache_set_capture(cache, nullptr, hp.n_embd, cfg.target_layer_ids, capture_rows(p.ubatch, p.max_tree));
        block = cfg.block_size;
    }
    model->embedding.layout(model->tok_embd, embedding_rows(p.ubatch, p.max_tree, block));
    out.weights += int64_t(model->embedding.plan(buft));
    const CacheBytes cb = cache_plan_bytes(cache, buft);
    out.kv = int64_t(cb.kv);
    out.recurrent = int64_t(cb.state);
    out.tree = int64_t(cb.tree + cb.capture);
    for (const ggml_context_ptr * ctx :
         {&model->ctx, &cache.ctx, &cache.alias_ctx, &cache.state_ctx, &cache.tree_ctx, &cache.capture_ctx}) {
        if (*ctx) mark_placed(ctx->get());  // from here on only the graphs' own tensors are sized
    }
    if (has_draft) {
        // the largest append: a prefill micro-batch, or an accepted path (at most one block)
        const int32_t max_append = std::max(std::min(p.ubatch, p.max_ctx), std::min(s.verify_nodes, block));
        const DraftMemory d = DraftModel::plan(p.draft_path, dev, {model->tok_embd, &model->embedding, model->output, hp.n_layer},
                                               draft_options(is_cpu, p), cache.capture,
                                               max_append, s.draft_top_k);
        out.draft = int64_t(d.weights);
        out.draft_cache = int64_t(d.cache);
        out.compute += int64_t(d.compute);
        log_slot("draft", d.compute);
    }

    // one slot (and allocator) per call kind, each at its largest: every KV row attended
    const int32_t rows = cache.rows;
    const size_t prefill = forward_bytes(*model, cache, {std::min(p.ubatch, p.max_ctx), rows, false, false}, s, buft);
    const size_t step = forward_bytes(*model, cache, {1, rows, false, false}, s, buft);
    log_slot("prefill", prefill);
    log_slot("step", step);
    out.compute += int64_t(prefill + step);
    if (has_draft) {
        const int32_t nodes = std::min(s.verify_nodes, p.max_ctx);
        const size_t verify = forward_bytes(*model, cache, {nodes, rows, true, true}, s, buft);
        // commit keeps one graph per (path length, rows moved or not), all in one buffer as large as the largest:
        // accepted paths are at most a block
        size_t commit = 0;
        for (int32_t n_path = 1; n_path <= std::min(nodes, block); ++n_path) {
            for (bool move_kv : {false, true}) {
                if (move_kv && n_path == 1) continue;  // a path of the root alone moves nothing
                commit = std::max(commit, plan_graph_bytes(build_commit(*model, cache, n_path, move_kv)->meta.gf, buft));
            }
        }
        log_slot("verify", verify);
        log_slot("commit (one buffer for all paths)", commit);
        out.compute += int64_t(verify + commit);
    }
    return out;
}

}  // namespace lb
