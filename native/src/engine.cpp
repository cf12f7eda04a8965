// engine.cpp: lb_engine's calls. Arguments are checked before anything touches ggml (lb_params: load_params.cpp).
#include "engine.hpp"

#include <algorithm>
#include <cstring>

#include "error.hpp"
#include "load_params.hpp"

using lb::Error;
using lb::check;

void lb_engine::load(const lb_params & p) {
    lb::set_log_level(p.log_level);
    lb::check_params(p);
    type_k = lb::kv_type_from_lb(p.type_k, "type_k");
    type_v = lb::kv_type_from_lb(p.type_v, "type_v");

    target_path = p.target_path;
    max_ctx = p.max_ctx;
    ubatch = p.ubatch;
    max_tree = p.max_tree;

    lb::backend_init(backend, p.device, p.n_threads, p.batch_invariant != 0);
    model = lb::load_target(target_path, backend.get(), backend.is_cpu());
    if (!backend.is_cpu()) lb::check_cuda_shapes(model->hp);
    lb::check_kv_types(ggml_backend_get_device(backend.get()), model->hp, type_k, type_v);
    lb::check_attention_reach(ggml_backend_get_device(backend.get()), model->hp, p);
    lb::cache_layout(cache, model->hp, max_ctx, type_k, type_v, max_tree);
    lb::cache_alloc(cache, backend.get());
    lb::log_msg(LB_LOG_INFO, "caches: %.1f MiB (%d KV rows, K %s, V %s)", double(cache.bytes()) / (1 << 20),
                cache.rows, ggml_type_name(type_k), ggml_type_name(type_v));
    if (p.draft_path != nullptr && p.draft_path[0] != '\0') load_draft(p.draft_path, lb::draft_options(backend.is_cpu(), p));
    model->embedding.layout(model->tok_embd, lb::embedding_rows(ubatch, max_tree, draft ? draft->config().block_size : 0));
    model->embedding.alloc(backend.get());
}

// The draft borrows the target's embedding and lm head, and receives the captured features of
// every committed token through on_commit (so its context always holds the P committed tokens).
void lb_engine::load_draft(const std::string & dir, const lb::DraftOptions & options) {
    lb::DraftTarget t;
    t.tok_embd = model->tok_embd;
    t.embedding = &model->embedding;
    t.output = model->output;
    t.n_layer = model->hp.n_layer;
    t.clock = &call_clock;
    draft = lb::DraftModel::load(dir, backend.get(), t, options);
    set_capture_layers(draft->config().target_layer_ids);
    on_commit = [this](const int32_t * rows, int32_t n, int32_t unread) { draft->append(cache.capture, rows, n, unread); };
    on_reset = [this] { draft->reset(); };
}

void lb_engine::draft_block(int32_t last, int32_t top_k, int32_t * ids, float * logp, int64_t cap) {
    check(draft != nullptr, LB_E_STATE, "lb_draft: no draft is loaded; load one with lb_params.draft_path");
    check(ids != nullptr && logp != nullptr, LB_E_INVALID_ARG, "lb_draft: ids and logp must not be NULL");
    const int64_t need = int64_t(draft->config().block_size - 1) * int64_t(top_k);
    check(top_k >= 1 && cap >= need, LB_E_INVALID_ARG,
          "lb_draft: ids/logp hold " + std::to_string(cap) + " entries, need (block_size - 1) * top_k = " +
              std::to_string(need) + " (top_k >= 1)");
    check_tokens(&last, 1, "lb_draft");
    check(draft->n_past() == n_past, LB_E_STATE,
          "lb_draft: the draft context holds " + std::to_string(draft->n_past()) + " tokens but " +
              std::to_string(n_past) + " are committed; call lb_reset and prefill again");
    draft->propose(last, top_k, ids, logp);
}

lb_model_info lb_engine::info() const {
    lb_model_info out{};
    out.n_vocab = model->hp.n_vocab;
    out.n_embd = model->hp.n_embd;
    out.n_layer = model->hp.n_layer;
    out.max_ctx = max_ctx;
    out.n_past = n_past;
    out.has_draft = draft ? 1 : 0;
    out.block_size = draft ? draft->config().block_size : 0;
    out.mask_token_id = draft ? draft->config().mask_token_id : -1;
    out.max_tree = max_tree;
    out.device = backend.device;
    out.draft_window = draft ? draft->ctx_size() : 0;
    out.n_ctx_train = model->hp.n_ctx_train;
    out.type_k = lb::kv_type_to_lb(type_k);
    out.type_v = lb::kv_type_to_lb(type_v);
    return out;
}

namespace {

int64_t buffer_bytes(const ggml_backend_buffer_ptr & b) { return b ? int64_t(ggml_backend_buffer_get_size(b.get())) : 0; }
int64_t galloc_bytes(const ggml_gallocr_ptr & g) { return g ? int64_t(ggml_gallocr_get_buffer_size(g.get(), 0)) : 0; }

}  // namespace

lb_memory lb_engine::memory() const {
    lb_memory out{};
    for (const ggml_backend_buffer_ptr & b : model->buffers) out.weights += buffer_bytes(b);
    out.weights += int64_t(model->embedding.bytes());
    out.kv = buffer_bytes(cache.kv_buf);
    out.recurrent = buffer_bytes(cache.state_buf);
    out.tree = buffer_bytes(cache.tree_buf) + buffer_bytes(cache.capture_buf);
    for (const ForwardSlot * s : {&prefill_slot_, &step_slot_, &verify_slot_}) out.compute += galloc_bytes(s->galloc);
    out.compute += galloc_bytes(commit_galloc_);
    if (draft) {
        out.draft = int64_t(draft->weight_bytes());
        out.draft_cache = int64_t(draft->cache_bytes());
        out.compute += int64_t(draft->compute_bytes());
    }
    return out;
}

void lb_engine::reset() {
    n_past = 0;
    verify_pending_ = false;
    sampled_rows_ = 0;
    lb::cache_clear_state(cache);
    if (on_reset) on_reset();
}

void lb_engine::set_capture_layers(const std::vector<int32_t> & layers) {
    for (int32_t l : layers) {
        check(l >= 0 && l < model->hp.n_layer, LB_E_INVALID_ARG,
              "capture layer " + std::to_string(l) + " is outside the target's 0.." + std::to_string(model->hp.n_layer - 1));
    }
    lb::cache_set_capture(cache, backend.get(), model->hp.n_embd, layers, lb::capture_rows(ubatch, max_tree));
    ++capture_gen_;  // every cached forward graph is rebuilt on its next use
}

int32_t lb_engine::n_kv_for(int32_t n_tokens) const {
    const int32_t need = n_past + n_tokens;
    return std::min(cache.rows, lb::pad_kv_rows(need));
}

void lb_engine::check_tokens(const int32_t * toks, int32_t n, const char * what) const {
    const int32_t n_vocab = model->hp.n_vocab;
    for (int32_t i = 0; i < n; ++i) {
        if (toks[i] < 0 || toks[i] >= n_vocab) {
            throw Error(LB_E_INVALID_ARG, std::string(what) + ": token " + std::to_string(toks[i]) + " at index " +
                                              std::to_string(i) + " is outside the vocabulary [0, " +
                                              std::to_string(n_vocab) + ")");
        }
    }
}

void lb_engine::check_batch(const int32_t * toks, int32_t n, const float * logits, int64_t logits_cap,
                            const char * what, const char * noun) const {
    const int64_t n_vocab = model->hp.n_vocab;
    check(logits == nullptr || logits_cap >= int64_t(n) * n_vocab, LB_E_INVALID_ARG,
          std::string(what) + ": logits buffer holds " + std::to_string(logits_cap) +
              " floats, need n * n_vocab = " + std::to_string(int64_t(n) * n_vocab));
    check_tokens(toks, n, what);
    check(int64_t(n_past) + n <= max_ctx, LB_E_CONTEXT,
          std::string(what) + ": " + std::to_string(n_past) + " cached + " + std::to_string(n) + " " + noun +
              " exceed max_ctx " + std::to_string(max_ctx) + "; reset or load with a larger max_ctx");
}

lb::ForwardGraph & lb_engine::forward_graph(ForwardSlot & slot, const lb::ForwardShape & shape, const char * what) {
    return lb::graph_for(backend.get(), slot, shape, [&] { return lb::build_forward(*model, cache, shape); }, what,
                         "lower ubatch or max_tree");
}

// Computes a forward graph; with `sampling`, uploads the tail's inputs first (the penalty windows
// over `call`'s tokens), reads its outputs after (rows = the graph's last `rows` tokens) and draws
// each row's next token: the one at the position after the row's token (set_positions_and_slots'
// positions + 1). Keeps the graph for processed_row.
void lb_engine::run_sampled(lb::ForwardGraph & g, const lb_sampling * sampling, const lb::CallTokens & call,
                            int32_t rows, const char * what) {
    if (sampling) sample_inputs_.upload(backend.get(), g.sample, *sampling, call, rows, model->hp.n_vocab);
    else if (g.sample.inv_temp) sample_inputs_.upload_neutral(backend.get(), g.sample, rows, model->hp.n_vocab);
    compute(g.meta.gf, what);
    if (!sampling) return;
    lb::SampleInputs::download(g.sample, *sampling, rows);
    draw_pos_host_.resize(size_t(rows));
    const int32_t first = g.shape.n_tokens - rows;
    for (int32_t r = 0; r < rows; ++r) draw_pos_host_[size_t(r)] = int64_t(pos_host_[size_t(first + r)]) + 1;
    drawer_.draw(*sampling, rows, draw_pos_host_.data());
    sampled_graph_ = &g;
    sampled_rows_ = rows;
}

void lb_engine::processed_row(int32_t row, float * out, int64_t cap) {
    check(sampled_rows_ > 0 && sampled_graph_ != nullptr, LB_E_STATE,
          "lb_processed_row: no sampled forward to read (it must follow lb_prefill_sampled or lb_verify_sampled "
          "directly)");
    check(row >= 0 && row < sampled_rows_, LB_E_INVALID_ARG,
          "lb_processed_row: row " + std::to_string(row) + " is outside [0, " + std::to_string(sampled_rows_) + ")");
    const int64_t n_vocab = model->hp.n_vocab;
    check(out != nullptr && cap >= n_vocab, LB_E_INVALID_ARG,
          "lb_processed_row: out must hold n_vocab = " + std::to_string(n_vocab) + " floats");
    ggml_backend_tensor_get(sampled_graph_->sample.processed, out, size_t(row) * size_t(n_vocab) * sizeof(float),
                            size_t(n_vocab) * sizeof(float));
}

void lb_engine::compute(ggml_cgraph * gf, const char * what, bool wait) {
    const ggml_status st = call_clock.compute(backend.get(), gf, wait);
    check(st == GGML_STATUS_SUCCESS, LB_E_BACKEND,
          std::string(what) + " failed on " + backend.name() + " (ggml status " + std::to_string(int(st)) + ")");
}

// Node i sits at position P + depth(i) (depth == nullptr: a chain, depth i) in all four M-RoPE
// sections (text only), and writes KV slot P + i; the caller fills the mask.
void lb_engine::set_positions_and_slots(lb::ForwardGraph & g, int32_t n, const int32_t * depth) {
    pos_host_.resize(size_t(4 * n));
    for (int32_t s = 0; s < 4; ++s) {
        for (int32_t i = 0; i < n; ++i) pos_host_[size_t(s * n + i)] = n_past + (depth ? depth[i] : i);
    }
    lb::set_input(backend.get(), g.pos, pos_host_.data(), pos_host_.size() * sizeof(int32_t));
    if (!g.mask) return;
    kv_idx_host_.resize(size_t(n));
    for (int32_t i = 0; i < n; ++i) kv_idx_host_[size_t(i)] = n_past + i;
    lb::set_input(backend.get(), g.kv_idx, kv_idx_host_.data(), kv_idx_host_.size() * sizeof(int64_t));
}

// Inputs of a chain: token i sits at position P+i, writes slot P+i, sees slots 0..P+i.
void lb_engine::set_chain_inputs(lb::ForwardGraph & g, const ForwardSlot & slot, lb::MaskStage & mask,
                                 const int32_t * toks, int32_t n) {
    model->embedding.stage(backend.get(), toks, n, g.tokens);
    set_positions_and_slots(g, n, nullptr);
    if (g.mask) mask.set(backend.get(), g.mask, slot.builds, n, g.shape.n_kv, n_past, nullptr);
}

void lb_engine::prefill(const int32_t * toks, int32_t n, int32_t * out_next, float * logits, int64_t logits_cap,
                        const lb_sampling * sampling) {
    check(toks != nullptr && out_next != nullptr, LB_E_INVALID_ARG, "lb_prefill: toks and out_next must not be NULL");
    check(n >= 1, LB_E_INVALID_ARG, "lb_prefill: n must be >= 1 (got " + std::to_string(n) + ")");
    check_batch(toks, n, logits, logits_cap, "lb_prefill", "new tokens");
    const int64_t n_vocab = model->hp.n_vocab;
    if (sampling) sample_inputs_.check(*sampling, 1, model->hp.n_vocab);
    verify_pending_ = false;
    sampled_rows_ = 0;
    // a prompt longer than the draft's window: its first tokens leave the draft's ring to later tokens of this
    // call before any proposal reads them, so the draft does not project them (a 32K prompt: 28K of its tokens)
    const int32_t unread = draft ? std::max(0, n - draft->ctx_size()) : 0;

    for (int32_t off = 0; off < n; off += ubatch) {
        const int32_t nc = std::min(ubatch, n - off);
        lb::ForwardShape shape{nc, n_kv_for(nc), false, logits != nullptr, capture_gen_};
        if (sampling) {  // every micro-batch carries the tail (one graph shape); the last one's is read
            shape.n_cand = sampling->n_candidates;
            shape.pen_slots = lb::penalty_slots(sampling->penalty_last_n, model->hp.n_vocab);
        }
        lb::ForwardGraph & g = forward_graph(prefill_slot_, shape, "prefill");
        set_chain_inputs(g, prefill_slot_, prefill_mask_, toks + off, nc);
        run_sampled(g, off + nc == n ? sampling : nullptr, {toks, nullptr, n}, 1, "prefill");
        if (logits) {
            ggml_backend_tensor_get(g.logits, logits + int64_t(off) * n_vocab, 0, size_t(nc) * size_t(n_vocab) * sizeof(float));
        }
        n_past += nc;
        if (on_commit) on_commit(nullptr, nc, std::clamp(unread - off, 0, nc));
        if (off + nc == n) {
            ggml_backend_tensor_get(g.argmax, out_next, size_t(g.n_out - 1) * sizeof(int32_t), sizeof(int32_t));
        }
    }
}

void lb_engine::step(int32_t tok, int32_t * out_next, const lb_sampling * sampling) {
    check(out_next != nullptr, LB_E_INVALID_ARG, "lb_step: out_next must not be NULL");
    check_tokens(&tok, 1, "lb_step");
    check(n_past + 1 <= max_ctx, LB_E_CONTEXT,
          "lb_step: the context is full (max_ctx " + std::to_string(max_ctx) + "); reset or load with a larger max_ctx");
    if (sampling) sample_inputs_.check(*sampling, 1, model->hp.n_vocab);
    verify_pending_ = false;
    sampled_rows_ = 0;
    lb::ForwardShape shape{1, n_kv_for(1), false, false, capture_gen_};
    if (sampling) {
        shape.n_cand = sampling->n_candidates;
        shape.pen_slots = lb::penalty_slots(sampling->penalty_last_n, model->hp.n_vocab);
    }
    lb::ForwardGraph & g = forward_graph(step_slot_, shape, "step");
    set_chain_inputs(g, step_slot_, step_mask_, &tok, 1);
    run_sampled(g, sampling, {&tok, nullptr, 1}, 1, "step");
    ggml_backend_tensor_get(g.argmax, out_next, 0, sizeof(int32_t));
    n_past += 1;
    if (on_commit) on_commit(nullptr, 1, 0);
}
