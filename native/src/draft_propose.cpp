// draft_propose.cpp: one block through the draft layers, the target's output matrix and an
// on-device top-k of the log-softmax.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend.hpp"
#include "draft_model.hpp"
#include "error.hpp"
#include "layers.hpp"
#include "matmul.hpp"

namespace lb {

namespace {

bool visible(const DraftLayerAttn & a, int32_t q_pos, int32_t k_pos) {
    if (a.causal && k_pos > q_pos) return false;
    if (a.window > 0) {
        if (q_pos - k_pos >= a.window) return false;
        if (!a.causal && k_pos - q_pos >= a.window) return false;
    }
    return true;
}

bool same_kind(const DraftLayerAttn & a, const DraftLayerAttn & b) {
    return a.causal == b.causal && a.window == b.window;
}

// Sums of the rows of the contiguous x [n, R] as [1, R]. A row of a vocabulary (~248K) is summed in parts of up
// to 4,096 entries, then the parts: sum_rows gives a row one block, so R = 15 whole rows would keep 15 of the
// GPU's SMs busy. Rows of at most 4,096, or with no divisor in [256, 4096], are summed whole.
ggml_tensor * sum_long_rows(ggml_context * ctx, ggml_tensor * x) {
    const int64_t n = x->ne[0], R = x->ne[1];
    int64_t part = std::min<int64_t>(n, 4096);
    while (n % part != 0) --part;
    if (part == n || part < 256) return ggml_sum_rows(ctx, x);
    ggml_tensor * parts = ggml_sum_rows(ctx, ggml_reshape_2d(ctx, x, part, (n / part) * R));  // [1, n/part * R]
    return ggml_sum_rows(ctx, ggml_reshape_2d(ctx, parts, n / part, R));
}

}  // namespace

TopKLogProbs top_k_log_softmax(ggml_context * ctx, ggml_tensor * logits, int32_t k) {
    const int64_t n = logits->ne[0], R = logits->ne[1];
    ggml_tensor * ids = ggml_top_k(ctx, logits, k);
    ggml_tensor * vals = ggml_reshape_2d(ctx, ggml_get_rows(ctx, ggml_reshape_3d(ctx, logits, 1, n, R), ids), k, R);
    ggml_tensor * best = ggml_reshape_2d(ctx, ggml_argmax(ctx, vals), 1, R);
    ggml_tensor * max = ggml_reshape_2d(ctx, ggml_get_rows(ctx, ggml_reshape_3d(ctx, vals, 1, k, R), best), 1, R);
    ggml_tensor * lse = ggml_log(ctx, sum_long_rows(ctx, ggml_exp(ctx, ggml_sub(ctx, logits, max))));  // [1, R]
    return {ids, ggml_sub(ctx, ggml_sub(ctx, vals, max), lse)};
}

// Mask rows for the B block queries over n_kv key rows: live context slots, then the block, then
// padding. Context positions are all below the queries', so only a window can hide them; with no
// ring wrap (slot == position) that is one boundary per row, found without a per-slot test.
void DraftModel::fill_mask(const DraftLayerAttn & kind, int32_t n_valid, int32_t n_kv, int32_t B,
                           ggml_fp16_t * out) const {
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
    for (int32_t i = 0; i < B; ++i) {
        const int32_t q_pos = n_past_ + i;
        ggml_fp16_t * row = out + size_t(i) * size_t(n_kv);
        if (kind.window == 0) {
            std::fill(row, row + n_valid, zero);
        } else if (n_past_ <= ctx_size_) {
            const int32_t first = std::clamp(q_pos - kind.window + 1, 0, n_valid);
            std::fill(row, row + first, ninf);
            std::fill(row + first, row + n_valid, zero);
        } else {
            for (int32_t s = 0; s < n_valid; ++s) row[s] = visible(kind, q_pos, slot_pos_[size_t(s)]) ? zero : ninf;
        }
        for (int32_t j = 0; j < B; ++j) row[n_valid + j] = visible(kind, q_pos, n_past_ + j) ? zero : ninf;
        std::fill(row + n_valid + B, row + n_kv, ninf);
    }
}

// ---------------------------------------------------------------------------------------------
// propose: block -> draft layers -> target output matrix -> top-k log-probs

void DraftModel::init_mask_kinds() {
    mask_of_layer_.assign(size_t(cfg_.n_layer), 0);
    for (int32_t l = 0; l < cfg_.n_layer; ++l) {
        size_t k = 0;
        while (k < mask_kinds_.size() && !same_kind(mask_kinds_[k], cfg_.attn[l])) ++k;
        if (k == mask_kinds_.size()) mask_kinds_.push_back(cfg_.attn[l]);
        mask_of_layer_[size_t(l)] = int32_t(k);
    }
}

void DraftModel::propose(int32_t last, int32_t top_k, int32_t * ids, float * logp) {
    const int32_t B = cfg_.block_size;
    if (top_k < 1 || top_k > n_vocab_) {
        throw Error(LB_E_INVALID_ARG, "draft: top_k = " + std::to_string(top_k) + " must be in [1, n_vocab = " +
                                               std::to_string(n_vocab_) + "]");
    }
    if (last < 0 || last >= n_vocab_) throw Error(LB_E_INVALID_ARG, "draft: token id " + std::to_string(last) + " out of range");
    if (!ids || !logp) throw Error(LB_E_INVALID_ARG, "draft: null output buffer");

    const int32_t n_valid = std::min(n_past_, ctx_size_);  // live context rows: slots 0..n_valid-1
    const ProposeShape shape{std::min(pad_kv_rows(n_valid + B), rows_), top_k};
    // one block over the same context in every run that must agree: any deterministic kernel will do
    // (a rebuilt graph's op-support check asks about those same kernels)
    const BatchDependentKernels fast;
    const ProposeGraph & g = graph_for(backend_, propose_slot_, shape, [&] { return build_propose(shape); },
                                       "draft graph", "lower the draft top_k");
    set_propose_inputs(g, last, n_valid);
    compute(g.meta.gf, "propose");
    read_top_k(g, top_k, ids, logp);
}

std::unique_ptr<DraftModel::ProposeGraph> DraftModel::build_propose(const ProposeShape & s) const {
    const DraftConfig & c = cfg_;
    const int32_t B = c.block_size;
    const int32_t n_kv = s.n_kv;
    auto out = std::make_unique<ProposeGraph>(s, graph_nodes());
    ProposeGraph & g = *out;
    ggml_context * ctx = g.meta.ctx.get();
    ggml_cgraph * gf = g.meta.gf;
    g.toks = graph_input(ctx, GGML_TYPE_I32, B);
    g.pos = graph_input(ctx, GGML_TYPE_I32, B);
    g.slots = graph_input(ctx, GGML_TYPE_I64, B);
    for (size_t k = 0; k < mask_kinds_.size(); ++k) g.masks.push_back(graph_input(ctx, GGML_TYPE_F16, n_kv, B));

    ggml_tensor * x = ggml_get_rows(ctx, target_.embedding->rows(), g.toks);  // [n_embd, B] (toks: staged rows)
    if (c.input_embedding_scale != 1.0f) x = ggml_scale(ctx, x, c.input_embedding_scale);
    for (int32_t l = 0; l < c.n_layer; ++l) x = block_layer(ctx, g, l, x);
    x = rms(ctx, x, weights_->out_norm);
    // Only positions 1..B-1 are drafts; position 0 is `last`, already known.
    x = ggml_view_2d(ctx, x, c.n_embd, B - 1, x->nb[1], x->nb[1]);
    ggml_tensor * logits = matmul(ctx, target_.output, x);  // [n_vocab, B-1]
    if (c.output_multiplier != 1.0f) logits = ggml_scale(ctx, logits, c.output_multiplier);
    if (c.logit_softcap > 0.0f) {
        logits = ggml_scale(ctx, ggml_tanh(ctx, ggml_scale(ctx, logits, 1.0f / c.logit_softcap)), c.logit_softcap);
    }
    g.top = top_k_log_softmax(ctx, logits, s.top_k);  // [K, B-1] each
    ggml_set_output(g.top.ids);
    ggml_set_output(g.top.logp);
    ggml_build_forward_expand(gf, g.top.ids);
    ggml_build_forward_expand(gf, g.top.logp);
    return out;
}

// Draft layer l over the block x [n_embd, B]: attention over the cached context + the block, then
// the SwiGLU MLP, each a pre-norm residual step.
ggml_tensor * DraftModel::block_layer(ggml_context * ctx, const ProposeGraph & g, int32_t l, ggml_tensor * x) const {
    const DraftConfig & c = cfg_;
    const DraftLayerWeights & L = weights_->layers[l];
    const int32_t B = c.block_size;
    const int64_t kv_dim = int64_t(c.head_dim) * c.n_head_kv;
    ggml_tensor * hn = rms(ctx, x, L.attn_norm);
    const std::vector<ggml_tensor *> qkv = L.attn_qkv.project(ctx, hn);  // [rows, B] views
    ggml_tensor * q = qkv[0], * k = qkv[1], * v = qkv[2];
    if (L.bq) q = ggml_add(ctx, q, L.bq);
    if (L.bk) k = ggml_add(ctx, k, L.bk);
    if (L.bv) v = ggml_add(ctx, v, L.bv);
    const size_t hd = ggml_row_size(q->type, c.head_dim);
    q = rms(ctx, ggml_view_3d(ctx, q, c.head_dim, c.n_head, B, hd, q->nb[1], 0), L.q_norm);
    k = rms(ctx, ggml_view_3d(ctx, k, c.head_dim, c.n_head_kv, B, hd, k->nb[1], 0), L.k_norm);
    q = ggml_rope_ext(ctx, q, g.pos, nullptr, c.head_dim, GGML_ROPE_TYPE_NEOX, 0, c.rope_theta, c.rope_freq_scale,
                      0.0f, 1.0f, 0.0f, 0.0f);
    k = ggml_rope_ext(ctx, k, g.pos, nullptr, c.head_dim, GGML_ROPE_TYPE_NEOX, 0, c.rope_theta, c.rope_freq_scale,
                      0.0f, 1.0f, 0.0f, 0.0f);
    // The block's K/V go into the rows after the live context; viewing the set_rows result
    // (not the cache tensor) makes the attention depend on the write.
    ggml_tensor * kc = ggml_set_rows(ctx, k_cache_[l], ggml_reshape_2d(ctx, k, kv_dim, B), g.slots);
    ggml_tensor * vc = ggml_set_rows(ctx, v_cache_[l], v, g.slots);
    const size_t row_k = ggml_row_size(k_cache_[0]->type, kv_dim);
    const int64_t n_kv = g.shape.n_kv;
    ggml_tensor * K = ggml_view_3d(ctx, kc, c.head_dim, c.n_head_kv, n_kv, ggml_row_size(kc->type, c.head_dim), row_k, 0);
    ggml_tensor * V = ggml_view_3d(ctx, vc, c.head_dim, c.n_head_kv, n_kv, ggml_row_size(vc->type, c.head_dim), row_k, 0);
    K = ggml_permute(ctx, K, 0, 2, 1, 3);  // [head_dim, n_kv, n_head_kv]
    V = ggml_permute(ctx, V, 0, 2, 1, 3);
    q = ggml_permute(ctx, q, 0, 2, 1, 3);  // [head_dim, B, n_head]
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    ggml_tensor * a = attention(ctx, q, K, V, g.masks[size_t(mask_of_layer_[size_t(l)])], scale, use_flash_);
    a = matmul(ctx, L.wo, a);  // a: [head_dim*n_head, B]
    if (L.bo) a = ggml_add(ctx, a, L.bo);
    x = ggml_add(ctx, x, a);
    hn = rms(ctx, x, L.ffn_norm);
    const std::vector<ggml_tensor *> gate_up = L.ffn_gate_up.project(ctx, hn);
    ggml_tensor * ff = ggml_swiglu_split(ctx, gate_up[0], gate_up[1]);
    return ggml_add(ctx, x, matmul(ctx, L.ffn_down, ff));
}

void DraftModel::set_propose_inputs(const ProposeGraph & g, int32_t last, int32_t n_valid) {
    const int32_t B = cfg_.block_size;
    host_.toks.assign(size_t(B), cfg_.mask_token_id);
    host_.toks[0] = last;
    host_.pos.resize(size_t(B));
    host_.slots.resize(size_t(B));
    for (int32_t i = 0; i < B; ++i) {
        host_.pos[size_t(i)] = n_past_ + i;
        host_.slots[size_t(i)] = n_valid + i;
    }
    const size_t mask_values = size_t(g.shape.n_kv) * size_t(B);
    auto * mask = static_cast<ggml_fp16_t *>(
        mask_host_.reserve(backend_, mask_values * mask_kinds_.size() * sizeof(ggml_fp16_t)));
    for (size_t k = 0; k < mask_kinds_.size(); ++k) {
        fill_mask(mask_kinds_[k], n_valid, g.shape.n_kv, B, mask + k * mask_values);
    }
    // The copies last, after all the host work: a commit's graphs may still run (lb_commit), and a copy from pageable
    // memory may wait for them (the masks and the embedding rows are page-locked; the rest is small).
    target_.embedding->stage(backend_, host_.toks.data(), B, g.toks);
    set_input(backend_, g.pos, host_.pos.data(), ggml_nbytes(g.pos));
    set_input(backend_, g.slots, host_.slots.data(), ggml_nbytes(g.slots));
    for (size_t k = 0; k < mask_kinds_.size(); ++k) {
        set_input(backend_, g.masks[k], mask + k * mask_values, ggml_nbytes(g.masks[k]));
    }
}

// ggml_top_k leaves each row unordered; order the K entries per row on the host (tiny): best
// first, ties by lower id.
void DraftModel::read_top_k(const ProposeGraph & g, int32_t top_k, int32_t * ids, float * logp) {
    const int32_t B = cfg_.block_size;
    const size_t n_out = size_t(B - 1) * size_t(top_k);
    host_.ids.resize(n_out);
    host_.logp.resize(n_out);
    ggml_backend_tensor_get(g.top.ids, host_.ids.data(), 0, n_out * sizeof(int32_t));
    ggml_backend_tensor_get(g.top.logp, host_.logp.data(), 0, n_out * sizeof(float));
    host_.order.resize(size_t(top_k));
    for (int32_t r = 0; r < B - 1; ++r) {
        const int32_t * rid = host_.ids.data() + size_t(r) * top_k;
        const float * rlp = host_.logp.data() + size_t(r) * top_k;
        std::iota(host_.order.begin(), host_.order.end(), 0);
        std::sort(host_.order.begin(), host_.order.end(), [&](int32_t a, int32_t b) {
            return rlp[a] != rlp[b] ? rlp[a] > rlp[b] : rid[a] < rid[b];
        });
        for (int32_t j = 0; j < top_k; ++j) {
            ids[size_t(r) * top_k + j] = rid[host_.order[size_t(j)]];
            logp[size_t(r) * top_k + j] = rlp[host_.order[size_t(j)]];
        }
    }
}

}  // namespace lb
