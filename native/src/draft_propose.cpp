// draft_propose.cpp: one block through the draft layers, the target's output matrix and an
// on-device top-k of the log-softmax.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend.hpp"
#include "error.hpp"
#include "matmul.hpp"
#include "draft_model.hpp"

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


}  // namespace

TopKLogProbs top_k_log_softmax(ggml_context * ctx, ggml_tensor * logits, int32_t k) {
    const int64_t n = logits->ne[0], R = logits->ne[1];
    ggml_tensor * ids = ggml_top_k(ctx, logits, k);
    ggml_tensor * vals = ggml_reshape_2d(ctx, ggml_get_rows(ctx, ggml_reshape_3d(ctx, logits, 1, n, R), ids), k, R);
    ggml_tensor * best = ggml_reshape_2d(ctx, ggml_argmax(ctx, vals), 1, R);
    ggml_tensor * max = ggml_reshape_2d(ctx, ggml_get_rows(ctx, ggml_reshape_3d(ctx, vals, 1, k, R), best), 1, R);
    ggml_tensor * lse = ggml_log(ctx, ggml_sum_rows(ctx, ggml_exp(ctx, ggml_sub(ctx, logits, max))));  // [1, R]
    return {ids, ggml_sub(ctx, ggml_sub(ctx, vals, max), lse)};
}

// q [head_dim, B, n_head]; K, V [head_dim, n_kv, n_head_kv] views of the cache; mask [n_kv, B].
// Flash attention where the backend has a kernel for these shapes (CUDA: head_dim 64/128/256...),
// else the same math as softmax(K^T q * scale + mask) V with plain ops. Returns [head_dim*n_head, B].
ggml_tensor * DraftModel::attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * K, ggml_tensor * V,
                                    ggml_tensor * mask, float scale) const {
    const int64_t B = q->ne[1];
    if (use_flash_) {
        ggml_tensor * a = ggml_flash_attn_ext(ctx, q, K, V, mask, scale, 0.0f, 0.0f);  // [head_dim, n_head, B]
        return ggml_reshape_2d(ctx, a, a->ne[0] * a->ne[1], B);
    }
    ggml_tensor * kq = ggml_soft_max_ext(ctx, matmul(ctx, K, q), mask, scale, 0.0f);  // [n_kv, B, n_head]
    ggml_tensor * vt = ggml_cont(ctx, ggml_permute(ctx, V, 1, 0, 2, 3));                   // [n_kv, head_dim, n_head_kv]
    ggml_tensor * a = matmul(ctx, vt, kq);                                           // [head_dim, B, n_head]
    a = ggml_cont(ctx, ggml_permute(ctx, a, 0, 2, 1, 3));                                  // [head_dim, n_head, B]
    return ggml_reshape_2d(ctx, a, a->ne[0] * a->ne[1], B);
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

// The block [last, MASK x (B-1)] over n_kv cache rows (live context, then the block's own rows).
void DraftModel::build_propose(Graph & g, int32_t n_kv, int32_t top_k, ProposeInputs & in) const {
    const DraftConfig & c = cfg_;
    const int32_t B = c.block_size;
    ggml_context * ctx = g.ctx;

    in.toks = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, B);
    in.pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, B);
    in.slots = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, B);
    ggml_set_input(in.toks);
    ggml_set_input(in.pos);
    ggml_set_input(in.slots);
    // One mask per distinct (causal, window) kind; the 3.6 draft has two, the 3.5 draft one.
    std::vector<int32_t> kind_of(static_cast<size_t>(c.n_layer));
    for (int32_t l = 0; l < c.n_layer; ++l) {
        size_t k = 0;
        while (k < in.kinds.size() && !same_kind(in.kinds[k], c.attn[l])) ++k;
        if (k == in.kinds.size()) {
            in.kinds.push_back(c.attn[l]);
            in.masks.push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, B));
            ggml_set_input(in.masks.back());
        }
        kind_of[l] = int32_t(k);
    }

    ggml_tensor * x = ggml_get_rows(ctx, target_.tok_embd, in.toks);  // [n_embd, B]
    if (c.input_embedding_scale != 1.0f) x = ggml_scale(ctx, x, c.input_embedding_scale);
    const int64_t kv_dim = int64_t(c.head_dim) * c.n_head_kv;
    const size_t row_k = ggml_row_size(k_cache_[0]->type, kv_dim);
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    for (int32_t l = 0; l < c.n_layer; ++l) {
        const DraftLayerWeights & L = weights_->layers[l];
        ggml_tensor * hn = rms(ctx, x, L.attn_norm);
        const std::vector<ggml_tensor *> qkv = project(ctx, {L.wq, L.wk, L.wv}, hn);  // [rows, B] views
        ggml_tensor * q = qkv[0], * k = qkv[1], * v = qkv[2];
        if (L.bq) q = ggml_add(ctx, q, L.bq);
        if (L.bk) k = ggml_add(ctx, k, L.bk);
        if (L.bv) v = ggml_add(ctx, v, L.bv);
        const size_t hd = ggml_row_size(q->type, c.head_dim);
        q = rms(ctx, ggml_view_3d(ctx, q, c.head_dim, c.n_head, B, hd, q->nb[1], 0), L.q_norm);
        k = rms(ctx, ggml_view_3d(ctx, k, c.head_dim, c.n_head_kv, B, hd, k->nb[1], 0), L.k_norm);
        q = ggml_rope_ext(ctx, q, in.pos, nullptr, c.head_dim, GGML_ROPE_TYPE_NEOX, 0, c.rope_theta, c.rope_freq_scale,
                          0.0f, 1.0f, 0.0f, 0.0f);
        k = ggml_rope_ext(ctx, k, in.pos, nullptr, c.head_dim, GGML_ROPE_TYPE_NEOX, 0, c.rope_theta, c.rope_freq_scale,
                          0.0f, 1.0f, 0.0f, 0.0f);
        // The block's K/V go into the rows after the live context; viewing the set_rows result
        // (not the cache tensor) makes the attention depend on the write.
        ggml_tensor * kc = ggml_set_rows(ctx, k_cache_[l], ggml_reshape_2d(ctx, k, kv_dim, B), in.slots);
        ggml_tensor * vc = ggml_set_rows(ctx, v_cache_[l], v, in.slots);
        ggml_tensor * K = ggml_view_3d(ctx, kc, c.head_dim, c.n_head_kv, n_kv, ggml_row_size(kc->type, c.head_dim), row_k, 0);
        ggml_tensor * V = ggml_view_3d(ctx, vc, c.head_dim, c.n_head_kv, n_kv, ggml_row_size(vc->type, c.head_dim), row_k, 0);
        K = ggml_permute(ctx, K, 0, 2, 1, 3);  // [head_dim, n_kv, n_head_kv]
        V = ggml_permute(ctx, V, 0, 2, 1, 3);
        q = ggml_permute(ctx, q, 0, 2, 1, 3);  // [head_dim, B, n_head]
        ggml_tensor * a = attention(ctx, q, K, V, in.masks[size_t(kind_of[l])], scale);  // [head_dim*n_head, B]
        a = matmul(ctx, L.wo, a);
        if (L.bo) a = ggml_add(ctx, a, L.bo);
        x = ggml_add(ctx, x, a);
        hn = rms(ctx, x, L.ffn_norm);
        const std::vector<ggml_tensor *> gate_up = project(ctx, {L.ffn_gate, L.ffn_up}, hn);
        ggml_tensor * ff = ggml_swiglu_split(ctx, gate_up[0], gate_up[1]);
        x = ggml_add(ctx, x, matmul(ctx, L.ffn_down, ff));
    }
    x = rms(ctx, x, weights_->out_norm);
    // Only positions 1..B-1 are drafts; position 0 is `last`, already known.
    x = ggml_view_2d(ctx, x, c.n_embd, B - 1, x->nb[1], x->nb[1]);
    ggml_tensor * logits = matmul(ctx, target_.output, x);  // [n_vocab, B-1]
    if (c.output_multiplier != 1.0f) logits = ggml_scale(ctx, logits, c.output_multiplier);
    if (c.logit_softcap > 0.0f) {
        logits = ggml_scale(ctx, ggml_tanh(ctx, ggml_scale(ctx, logits, 1.0f / c.logit_softcap)), c.logit_softcap);
    }
    in.top = top_k_log_softmax(ctx, logits, top_k);  // [K, B-1] each
    ggml_set_output(in.top.ids);
    ggml_set_output(in.top.logp);
    ggml_build_forward_expand(g.gf, in.top.ids);
    ggml_build_forward_expand(g.gf, in.top.logp);
}

void DraftModel::propose(int32_t last, int32_t top_k, int32_t * ids, float * logp) {
    const DraftConfig & c = cfg_;
    const int32_t B = c.block_size;
    if (top_k < 1 || top_k > n_vocab_) {
        throw Error(LB_E_INVALID_ARG, "draft: top_k = " + std::to_string(top_k) + " must be in [1, n_vocab = " +
                                               std::to_string(n_vocab_) + "]");
    }
    if (last < 0 || last >= n_vocab_) throw Error(LB_E_INVALID_ARG, "draft: token id " + std::to_string(last) + " out of range");
    if (!ids || !logp) throw Error(LB_E_INVALID_ARG, "draft: null output buffer");

    const int32_t n_valid = std::min(n_past_, ctx_size_);  // live context rows: slots 0..n_valid-1
    const int32_t n_kv = std::min(draft_pad_rows(n_valid + B), rows_);
    Graph g(meta_propose_, graph_nodes());
    ProposeInputs in;
    build_propose(g, n_kv, top_k, in);
    alloc_graph_or_throw(galloc_, g.gf, backend_, "draft graph", "lower the draft top_k");

    std::vector<int32_t> tok_v(static_cast<size_t>(B), c.mask_token_id), pos_v(static_cast<size_t>(B));
    std::vector<int64_t> slot_v(static_cast<size_t>(B));
    tok_v[0] = last;
    for (int32_t i = 0; i < B; ++i) {
        pos_v[i] = n_past_ + i;
        slot_v[i] = n_valid + i;
    }
    ggml_backend_tensor_set(in.toks, tok_v.data(), 0, ggml_nbytes(in.toks));
    ggml_backend_tensor_set(in.pos, pos_v.data(), 0, ggml_nbytes(in.pos));
    ggml_backend_tensor_set(in.slots, slot_v.data(), 0, ggml_nbytes(in.slots));
    std::vector<ggml_fp16_t> mask_v(size_t(n_kv) * size_t(B));
    for (size_t k = 0; k < in.kinds.size(); ++k) {
        fill_mask(in.kinds[k], n_valid, n_kv, B, mask_v.data());
        ggml_backend_tensor_set(in.masks[k], mask_v.data(), 0, ggml_nbytes(in.masks[k]));
    }
    {
        // one block over the same context in every run that must agree: any deterministic kernel will do
        const BatchDependentKernels fast;
        compute(g.gf, "propose");
    }

    const size_t n_out = size_t(B - 1) * size_t(top_k);
    std::vector<int32_t> id_v(n_out);
    std::vector<float> lp_v(n_out);
    ggml_backend_tensor_get(in.top.ids, id_v.data(), 0, n_out * sizeof(int32_t));
    ggml_backend_tensor_get(in.top.logp, lp_v.data(), 0, n_out * sizeof(float));
    // ggml_top_k leaves each row unordered; order K entries per row on the host (tiny).
    std::vector<int32_t> order(static_cast<size_t>(top_k));
    for (int32_t r = 0; r < B - 1; ++r) {
        const int32_t * rid = id_v.data() + size_t(r) * top_k;
        const float * rlp = lp_v.data() + size_t(r) * top_k;
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
            return rlp[a] != rlp[b] ? rlp[a] > rlp[b] : rid[a] < rid[b];
        });
        for (int32_t j = 0; j < top_k; ++j) {
            ids[size_t(r) * top_k + j] = rid[order[j]];
            logp[size_t(r) * top_k + j] = rlp[order[j]];
        }
    }
}

}  // namespace lb
