// draft_model.cpp: loading (and its memory plan), the context cache, and the append (context projection) graph.
#include "draft_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend.hpp"
#include "error.hpp"
#include "layers.hpp"
#include "matmul.hpp"

namespace lb {

namespace {

// Tokens per append graph: bounds the fc input (n_feat floats per token) for long prefills.
constexpr int32_t kAppendChunk = 256;

void check_target_shape(const ggml_tensor * t, const char * what, int32_t n_embd) {
    if (!t) throw Error(LB_E_INVALID_ARG, std::string("draft: the target's ") + what + " is missing");
    if (t->ne[0] != n_embd) {
        throw Error(LB_E_MISMATCH, std::string("draft does not fit the target: the target's ") + what + " rows have " +
                                            std::to_string(t->ne[0]) + " values, the draft's hidden_size is " +
                                            std::to_string(n_embd));
    }
}

void check_target_placement(ggml_backend_t backend, const ggml_tensor * t, const char * what) {
    if (!t->buffer) throw Error(LB_E_INVALID_ARG, std::string("draft: the target's ") + what + " is not loaded");
    if (!ggml_backend_supports_buft(backend, ggml_backend_buffer_get_type(t->buffer))) {
        throw Error(LB_E_UNSUPPORTED, std::string("draft: the target's ") + what + " lives in a " +
                                               ggml_backend_buffer_name(t->buffer) + " buffer that " +
                                               ggml_backend_name(backend) + " cannot read; load both on one device");
    }
}

}  // namespace

// Everything but memory: config, its fit to the target's shapes, the context cache's tensors, the
// attention kernel `dev` runs, the mask kinds. load() then places weights and cache; plan() sizes them.
std::unique_ptr<DraftModel> DraftModel::layout(const std::string & dir, ggml_backend_dev_t dev,
                                               const DraftTarget & target, const DraftOptions & opt) {
    if (opt.kv_type != GGML_TYPE_F16 && opt.kv_type != GGML_TYPE_F32) {
        throw Error(LB_E_INVALID_ARG, "draft: context cache type must be F16 or F32");
    }
    if (opt.ctx_size < 0 || opt.ctx_limit < 1) throw Error(LB_E_INVALID_ARG, "draft: ctx_size must be >= 0");
    std::unique_ptr<DraftModel> m(new DraftModel());
    m->target_ = target;
    m->cfg_ = draft_config_load(dir);
    const DraftConfig & c = m->cfg_;
    check_target_shape(target.tok_embd, "token embedding", c.n_embd);
    if (!target.embedding) throw Error(LB_E_INVALID_ARG, "draft: the target's token embedding rows are not given");
    check_target_shape(target.output, "output matrix", c.n_embd);
    m->n_vocab_ = int32_t(target.output->ne[1]);
    if (target.tok_embd->ne[1] < m->n_vocab_) {
        throw Error(LB_E_MISMATCH, "draft: the target's token embedding has fewer rows than its output matrix");
    }
    draft_config_check_target(c, int32_t(target.tok_embd->ne[0]), m->n_vocab_, target.n_layer);

    const int32_t window = opt.ctx_size > 0 ? opt.ctx_size : c.sliding_window > 0 ? c.sliding_window
                                                                                  : LB_DRAFT_WINDOW_DEFAULT;
    m->ctx_size_ = std::min(window, opt.ctx_limit);
    m->rows_ = pad_kv_rows(m->ctx_size_ + c.block_size);
    m->slot_pos_.assign(size_t(m->ctx_size_), -1);
    ggml_init_params ip = {ggml_tensor_overhead() * size_t(2 * c.n_layer), nullptr, true};
    m->kv_ctx_.reset(ggml_init(ip));
    if (!m->kv_ctx_) throw Error(LB_E_OOM, "draft: cannot create the cache context");
    const int64_t kv_dim = int64_t(c.head_dim) * c.n_head_kv;
    for (int32_t l = 0; l < c.n_layer; ++l) {
        m->k_cache_.push_back(ggml_new_tensor_2d(m->kv_ctx_.get(), opt.kv_type, kv_dim, m->rows_));
        m->v_cache_.push_back(ggml_new_tensor_2d(m->kv_ctx_.get(), opt.kv_type, kv_dim, m->rows_));
    }

    using Attention = DraftOptions::Attention;
    m->use_flash_ = opt.attention != Attention::plain && m->flash_supported(dev);
    if (opt.attention == Attention::flash && !m->use_flash_) {
        throw Error(LB_E_UNSUPPORTED, std::string("draft: ") + ggml_backend_dev_name(dev) +
                                          " has no flash-attention kernel for head_dim " + std::to_string(c.head_dim));
    }
    m->init_mask_kinds();
    return m;
}

std::unique_ptr<DraftModel> DraftModel::load(const std::string & dir, ggml_backend_t backend,
                                             const DraftTarget & target, const DraftOptions & opt) {
    if (!backend) throw Error(LB_E_INVALID_ARG, "draft: no backend");
    if (!target.clock) throw Error(LB_E_INVALID_ARG, "draft: no clock to run its graphs through (DraftTarget.clock)");
    std::unique_ptr<DraftModel> m = layout(dir, ggml_backend_get_device(backend), target, opt);
    m->backend_ = backend;
    check_target_placement(backend, target.output, "output matrix");
    m->weights_ = draft_weights_load(dir, m->cfg_, backend, opt.weight_type);
    m->kv_buf_ = alloc_tensors_or_throw(m->kv_ctx_.get(), backend,
                                        "draft's context cache (" + std::to_string(m->rows_) + " rows)", "lower max_ctx");
    // Rows past the live ones are masked out, but 0 * NaN would still poison the attention sum.
    ggml_backend_buffer_clear(m->kv_buf_.get(), 0);
    return m;
}

DraftMemory DraftModel::plan(const std::string & dir, ggml_backend_dev_t dev, const DraftTarget & target,
                             const DraftOptions & opt, const std::vector<ggml_tensor *> & feats, int32_t max_append,
                             int32_t top_k) {
    std::unique_ptr<DraftModel> m = layout(dir, dev, target, opt);
    m->weights_ = draft_weights_layout(dir, m->cfg_, opt.weight_type);
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
    DraftMemory out;
    out.weights = ggml_backend_alloc_ctx_tensors_from_buft_size(m->weights_->ctx.get(), buft);
    out.cache = ggml_backend_alloc_ctx_tensors_from_buft_size(m->kv_ctx_.get(), buft);
    mark_placed(m->weights_->ctx.get());
    mark_placed(m->kv_ctx_.get());
    // the graph slots at their largest (see append_slots_): an append graph for every size up to a
    // block, one for the largest chunk past that (a prefill micro-batch, at most kAppendChunk and the
    // ring), and the propose graph over a full ring
    const int32_t chunk = std::min({max_append, kAppendChunk, m->ctx_size_});
    AppendShape shape;
    auto append_bytes = [&](int32_t n) {
        m->set_append_shape(shape, &feats, n);
        return plan_graph_bytes(m->build_append(shape, &feats)->meta.gf, buft);
    };
    for (int32_t n = 1; n <= std::min(chunk, m->cfg_.block_size); ++n) out.compute += append_bytes(n);
    if (chunk > m->cfg_.block_size) out.compute += append_bytes(chunk);
    out.compute += plan_graph_bytes(m->build_propose({m->rows_, std::min(top_k, m->n_vocab_)})->meta.gf, buft);
    return out;
}

// Asks the device about a flash-attention node of the propose graph's shapes (largest key count).
bool DraftModel::flash_supported(ggml_backend_dev_t dev) const {
    const DraftConfig & c = cfg_;
    ggml_init_params p = {ggml_tensor_overhead() * 8, nullptr, true};
    const ggml_context_ptr owned(ggml_init(p));
    ggml_context * ctx = owned.get();
    if (!ctx) return false;
    const int64_t B = c.block_size;
    ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.head_dim, B, c.n_head);
    ggml_tensor * k = ggml_new_tensor_3d(ctx, k_cache_[0]->type, c.head_dim, rows_, c.n_head_kv);
    ggml_tensor * v = ggml_new_tensor_3d(ctx, v_cache_[0]->type, c.head_dim, rows_, c.n_head_kv);
    ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, rows_, B);
    ggml_tensor * fa = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f, 0.0f, 0.0f);
    const BatchDependentKernels as_in_propose;  // the kernels propose() runs with
    return ggml_backend_dev_supports_op(dev, fa);
}

size_t DraftModel::cache_bytes() const {
    return kv_buf_ ? ggml_backend_buffer_get_size(kv_buf_.get()) : 0;
}

namespace {

template <class Graph>
size_t slot_bytes(const GraphSlot<Graph> & slot) {
    return slot.galloc ? ggml_gallocr_get_buffer_size(slot.galloc.get(), 0) : 0;
}

}  // namespace

size_t DraftModel::compute_bytes() const {
    size_t bytes = slot_bytes(append_large_) + slot_bytes(propose_slot_);
    for (const auto & kv : append_slots_) bytes += slot_bytes(kv.second);
    return bytes;
}

int32_t DraftModel::graph_builds() const {
    int32_t builds = append_large_.builds + propose_slot_.builds;
    for (const auto & kv : append_slots_) builds += kv.second.builds;
    return builds;
}

ggml_tensor * DraftModel::rms(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w) const {
    return rms_norm(ctx, x, w, cfg_.rms_eps);
}

void DraftModel::compute(ggml_cgraph * gf, const char * what, bool wait) {
    if (target_.clock->compute(backend_, gf, wait) != GGML_STATUS_SUCCESS) {
        throw Error(LB_E_BACKEND, std::string("draft: ") + what + " graph failed on " + ggml_backend_name(backend_));
    }
}

// ---------------------------------------------------------------------------------------------
// append: features -> per-layer context K/V rows

void DraftModel::append(const std::vector<ggml_tensor *> & feats, const int32_t * rows, int32_t n, int32_t unread) {
    if (n < 0) throw Error(LB_E_INVALID_ARG, "draft: negative token count");
    if (unread < 0 || unread > n) throw Error(LB_E_INVALID_ARG, "draft: unread tokens outside [0, n]");
    int64_t width = 0;
    for (const ggml_tensor * f : feats) {
        if (!f || !f->buffer) throw Error(LB_E_INVALID_ARG, "draft: feature tensor is not allocated");
        if (f->type != GGML_TYPE_F32 && f->type != GGML_TYPE_F16 && f->type != GGML_TYPE_BF16) {
            throw Error(LB_E_INVALID_ARG, "draft: feature tensors must be F32, F16 or BF16");
        }
        for (int32_t i = 0; rows && i < n; ++i) {
            if (rows[i] < 0 || rows[i] >= f->ne[1]) throw Error(LB_E_INVALID_ARG, "draft: feature row out of range");
        }
        if (!rows && n > f->ne[1]) throw Error(LB_E_INVALID_ARG, "draft: fewer captured feature rows than tokens");
        width += f->ne[0];
    }
    if (width != cfg_.n_feat()) {
        throw Error(LB_E_INVALID_ARG, "draft: features are " + std::to_string(width) + " wide, fc takes " +
                                               std::to_string(cfg_.n_feat()) + " (capture target_layer_ids in order)");
    }
    // the rows in memory of our own: their copies may run after the call that handed them over returns (lb_commit's
    // path), and a caller's pinned memory would be read only then (set_input)
    host_.rows.resize(size_t(n));
    if (rows) {
        std::copy(rows, rows + n, host_.rows.begin());
    } else {
        std::iota(host_.rows.begin(), host_.rows.end(), 0);
    }
    rows = host_.rows.data();
    // their slots are marked empty: should a later micro-batch of the prefill fail before overwriting them, the
    // windowed layers hide the older rows left there (full-attention layers see them: acceptance only)
    for (int32_t i = std::max(0, unread - ctx_size_); i < unread; ++i) slot_pos_[size_t((n_past_ + i) % ctx_size_)] = -1;
    n_past_ += unread;
    for (int32_t done = unread; done < n;) {
        const int32_t slot = n_past_ % ctx_size_;
        const int32_t take = std::min({n - done, kAppendChunk, ctx_size_ - slot});
        // the chunk before runs unwaited: a rebuilt graph must not free memory it still uses (a prefill's chunks)
        if (done > unread) target_.clock->settle(backend_);
        append_chunk(&feats, rows + done, nullptr, take);
        done += take;
    }
}

void DraftModel::append_host(const float * feats, int32_t n) {
    if (n < 0 || (n > 0 && !feats)) throw Error(LB_E_INVALID_ARG, "draft: bad host features");
    for (int32_t done = 0; done < n;) {
        const int32_t slot = n_past_ % ctx_size_;
        const int32_t take = std::min({n - done, kAppendChunk, ctx_size_ - slot});
        if (done > 0) target_.clock->settle(backend_);  // as in append()
        append_chunk(nullptr, nullptr, feats + size_t(done) * size_t(cfg_.n_feat()), take);
        done += take;
    }
}

ggml_tensor * DraftModel::project_context(ggml_context * ctx, ggml_tensor * feat_cat) const {
    return rms(ctx, matmul(ctx, weights_->fc, feat_cat), weights_->hidden_norm);
}

void DraftModel::set_append_shape(AppendShape & s, const std::vector<ggml_tensor *> * feats, int32_t n) const {
    s.n = n;
    s.feats.clear();
    for (size_t i = 0; feats && i < feats->size(); ++i) {
        ggml_tensor * f = (*feats)[i];
        s.feats.push_back({f, f->data, f->type, f->ne[0], f->nb[1]});
    }
}

// The append graph of s.n tokens: feats, device features gathered by row (AppendGraph::rows), or
// nullptr for host features (AppendGraph::host).
std::unique_ptr<DraftModel::AppendGraph> DraftModel::build_append(const AppendShape & s,
                                                                  const std::vector<ggml_tensor *> * feats) const {
    const DraftConfig & c = cfg_;
    const int32_t n = s.n;
    auto out = std::make_unique<AppendGraph>(s, graph_nodes());
    AppendGraph & g = *out;
    ggml_context * ctx = g.meta.ctx.get();
    ggml_cgraph * gf = g.meta.gf;
    g.pos = graph_input(ctx, GGML_TYPE_I32, n);
    g.slots = graph_input(ctx, GGML_TYPE_I64, n);
    ggml_tensor * cat = nullptr;
    if (!feats) {
        g.host = graph_input(ctx, GGML_TYPE_F32, c.n_feat(), n);
        cat = g.host;
    } else {
        g.rows = graph_input(ctx, GGML_TYPE_I32, n);
        for (ggml_tensor * f : *feats) {
            ggml_tensor * part = ggml_get_rows(ctx, f, g.rows);  // [ne0, n] F32
            cat = cat ? ggml_concat(ctx, cat, part, 0) : part;
        }
    }
    ggml_tensor * h = project_context(ctx, cat);  // [n_embd, n]
    const int64_t kv_dim = int64_t(c.head_dim) * c.n_head_kv;
    for (int32_t l = 0; l < c.n_layer; ++l) {
        const DraftLayerWeights & L = weights_->layers[l];
        // k and v: one product of their rows of the layer's q|k|v stack (views of it, strided)
        const std::vector<ggml_tensor *> kv = L.attn_qkv.project(ctx, h, 1, 3);
        ggml_tensor * k = kv[0], * v = kv[1];
        if (L.bk) k = ggml_add(ctx, k, L.bk);
        if (L.bv) v = ggml_add(ctx, v, L.bv);
        k = rms(ctx, ggml_view_3d(ctx, k, c.head_dim, c.n_head_kv, n, ggml_row_size(k->type, c.head_dim), k->nb[1], 0),
                L.k_norm);
        k = ggml_rope_ext(ctx, k, g.pos, nullptr, c.head_dim, GGML_ROPE_TYPE_NEOX, 0, c.rope_theta, c.rope_freq_scale,
                          0.0f, 1.0f, 0.0f, 0.0f);
        ggml_build_forward_expand(gf, ggml_set_rows(ctx, k_cache_[l], ggml_reshape_2d(ctx, k, kv_dim, n), g.slots));
        ggml_build_forward_expand(gf, ggml_set_rows(ctx, v_cache_[l], v, g.slots));
    }
    return out;
}

// n tokens landing in consecutive ring slots (the caller splits at the wrap).
void DraftModel::append_chunk(const std::vector<ggml_tensor *> * feats, const int32_t * rows, const float * host,
                              int32_t n) {
    const int32_t slot0 = n_past_ % ctx_size_;
    if (host) feats = nullptr;
    set_append_shape(append_key_, feats, n);
    GraphSlot<AppendGraph> & slot = n <= cfg_.block_size ? append_slots_[n] : append_large_;
    const AppendGraph & g = graph_for(backend_, slot, append_key_, [&] { return build_append(append_key_, feats); },
                                      "draft's append graph", "lower max_ctx or ubatch");

    host_.pos.resize(size_t(n));
    host_.slots.resize(size_t(n));
    for (int32_t i = 0; i < n; ++i) {
        host_.pos[size_t(i)] = n_past_ + i;
        host_.slots[size_t(i)] = slot0 + i;
    }
    set_input(backend_, g.pos, host_.pos.data(), ggml_nbytes(g.pos));
    set_input(backend_, g.slots, host_.slots.data(), ggml_nbytes(g.slots));
    if (g.host) set_input(backend_, g.host, host, ggml_nbytes(g.host));
    if (g.rows) set_input(backend_, g.rows, rows, ggml_nbytes(g.rows));
    // left running: nothing reads the context rows before the next proposal, whose graph queues after this one
    compute(g.meta.gf, "append", /*wait=*/false);
    for (int32_t i = 0; i < n; ++i) slot_pos_[size_t(slot0 + i)] = n_past_ + i;
    n_past_ += n;
}

}  // namespace lb
