// caches.cpp: allocation of the KV cache, recurrent state, tree scratch and capture buffers.
#include "caches.hpp"

#include "backend.hpp"

#include "error.hpp"
#include "ggml-alloc.h"

#include <numeric>

namespace lb {

namespace {

ggml_backend_buffer_ptr alloc_or_throw(const ggml_context_ptr & ctx, ggml_backend_t backend, const char * what) {
    ggml_backend_buffer_ptr buf =
        alloc_tensors_or_throw(ctx.get(), backend, what, "lower max_ctx / max_tree or use a smaller KV type");
    ggml_backend_buffer_clear(buf.get(), 0);  // masked KV rows must hold finite values: 0 * NaN is NaN
    return buf;
}

ggml_context_ptr new_meta_context(size_t n_tensors) {
    ggml_init_params ip = {ggml_tensor_overhead() * n_tensors + 1024, nullptr, /*no_alloc=*/true};
    ggml_context_ptr ctx(ggml_init(ip));
    check(ctx != nullptr, LB_E_OOM, "cannot create the cache contexts");
    return ctx;
}

// A [row_elems, rows] tensor of `type` whose row stride is padded to a multiple of 16 bytes and
// of the type's block size: ggml-cuda's flash attention reads 16-byte aligned f16 rows, and
// dequantizes strided quantized K/V with strides counted in whole blocks (a 136-byte Q8_0 row
// padded to 144 would be read as 4 blocks of 34 bytes, then wrong from the second row on).
// One spare row at the end: ggml sizes a tensor as its last row's bytes, not a padded stride,
// and the F32 alias that moves whole rows (commit) must stay inside the allocation.
ggml_tensor * new_padded_rows(ggml_context * ctx, ggml_type type, int64_t row_elems, int64_t rows) {
    ggml_tensor * t = ggml_new_tensor_2d(ctx, type, row_elems, rows + 1);
    const size_t row = ggml_row_size(type, row_elems);
    const size_t align = std::lcm(ggml_type_size(type), size_t(16));
    const size_t padded = (row + align - 1) / align * align;
    t->nb[1] = padded;
    t->nb[2] = padded * size_t(rows + 1);
    t->nb[3] = t->nb[2];
    return t;
}

}  // namespace

size_t TargetCache::bytes() const {
    size_t n = 0;
    for (const ggml_backend_buffer_ptr * b : {&kv_buf, &state_buf, &tree_buf, &capture_buf}) {
        if (*b) n += ggml_backend_buffer_get_size(b->get());
    }
    return n;
}

void cache_layout(TargetCache & c, const TargetHparams & hp, int32_t max_ctx, ggml_type type_k, ggml_type type_v,
                  int32_t max_tree) {
    c.rows = pad_kv_rows(max_ctx);
    c.max_tree = max_tree;
    c.type_k = type_k;
    c.type_v = type_v;
    const size_t n_layer = size_t(hp.n_layer);
    c.k.assign(n_layer, nullptr); c.v.assign(n_layer, nullptr);
    c.k_raw.assign(n_layer, nullptr); c.v_raw.assign(n_layer, nullptr);
    c.conv.assign(n_layer, nullptr); c.ssm.assign(n_layer, nullptr);
    c.tree_qkv.assign(n_layer, nullptr); c.tree_g.assign(n_layer, nullptr); c.tree_beta.assign(n_layer, nullptr);
    c.conv_all = c.ssm_all = c.tree_qkv_all = c.tree_g_all = c.tree_beta_all = nullptr;

    const int64_t kv_row = int64_t(hp.head_dim) * hp.n_head_kv;
    for (ggml_type t : {type_k, type_v}) {
        check(hp.head_dim % ggml_blck_size(t) == 0, LB_E_UNSUPPORTED,
              std::string("KV type ") + ggml_type_name(t) + " needs a head size that is a multiple of " +
                  std::to_string(ggml_blck_size(t)) + " (this model: " + std::to_string(hp.head_dim) + "); use f16");
    }

    // one context per buffer (KV, state, tree scratch): the state buffer alone is cleared on reset
    c.ctx = new_meta_context(n_layer * 8);
    c.alias_ctx = new_meta_context(n_layer * 2);
    c.state_ctx = new_meta_context(n_layer * 2 + 2);
    c.tree_ctx = new_meta_context(n_layer * 3 + 3);
    ggml_context * ctx_kv = c.ctx.get();
    ggml_context * ctx_state = c.state_ctx.get();
    ggml_context * ctx_tree = c.tree_ctx.get();

    const int64_t C = hp.conv_channels(), S = hp.head_v_dim, H = hp.n_v_heads, n_rec = hp.n_recurrent_layers();
    if (n_rec > 0) {
        c.conv_all = ggml_new_tensor_2d(ctx_state, GGML_TYPE_F32, hp.d_conv - 1, C * n_rec);
        c.ssm_all = ggml_new_tensor_4d(ctx_state, GGML_TYPE_F32, S, S, H, n_rec);
        c.tree_qkv_all = ggml_new_tensor_2d(ctx_tree, GGML_TYPE_F32, C * n_rec, max_tree);
        c.tree_g_all = ggml_new_tensor_3d(ctx_tree, GGML_TYPE_F32, H, max_tree, n_rec);
        c.tree_beta_all = ggml_new_tensor_3d(ctx_tree, GGML_TYPE_F32, H, max_tree, n_rec);
        ggml_set_name(c.conv_all, "cache_conv.all");
        ggml_set_name(c.ssm_all, "cache_ssm.all");
    }
    int64_t r = 0;  // DeltaNet layers before this one

    for (int32_t il = 0; il < hp.n_layer; ++il) {
        const std::string s = std::to_string(il);
        if (!hp.recurrent[size_t(il)]) {
            ggml_tensor * k = c.k[size_t(il)] = new_padded_rows(ctx_kv, type_k, kv_row, c.rows);
            ggml_tensor * v = c.v[size_t(il)] = new_padded_rows(ctx_kv, type_v, kv_row, c.rows);
            ggml_set_name(k, ("cache_k." + s).c_str());
            ggml_set_name(v, ("cache_v." + s).c_str());
            // F32 views of the same rows (placed onto them by cache_alloc): commit moves rows through these
            c.k_raw[size_t(il)] = ggml_new_tensor_2d(c.alias_ctx.get(), GGML_TYPE_F32, int64_t(k->nb[1] / 4), c.rows);
            c.v_raw[size_t(il)] = ggml_new_tensor_2d(c.alias_ctx.get(), GGML_TYPE_F32, int64_t(v->nb[1] / 4), c.rows);
        } else {
            // views of entry r of the stacks (placed by cache_alloc with them)
            ggml_tensor * conv = c.conv[size_t(il)] = ggml_view_2d(ctx_state, c.conv_all, hp.d_conv - 1, C,
                                                                   c.conv_all->nb[1], size_t(r * C) * c.conv_all->nb[1]);
            ggml_tensor * ssm = c.ssm[size_t(il)] = ggml_view_3d(ctx_state, c.ssm_all, S, S, H, c.ssm_all->nb[1],
                                                                 c.ssm_all->nb[2], size_t(r) * c.ssm_all->nb[3]);
            c.tree_qkv[size_t(il)] = ggml_view_2d(ctx_tree, c.tree_qkv_all, C, max_tree, c.tree_qkv_all->nb[1],
                                                  size_t(r * C) * c.tree_qkv_all->nb[0]);
            c.tree_g[size_t(il)] = ggml_view_2d(ctx_tree, c.tree_g_all, H, max_tree, c.tree_g_all->nb[1],
                                                size_t(r) * c.tree_g_all->nb[2]);
            c.tree_beta[size_t(il)] = ggml_view_2d(ctx_tree, c.tree_beta_all, H, max_tree, c.tree_beta_all->nb[1],
                                                   size_t(r) * c.tree_beta_all->nb[2]);
            ggml_set_name(conv, ("cache_conv." + s).c_str());
            ggml_set_name(ssm, ("cache_ssm." + s).c_str());
            ++r;
        }
    }
}

void cache_alloc(TargetCache & c, ggml_backend_t backend) {
    if (ggml_get_first_tensor(c.ctx.get())) c.kv_buf = alloc_or_throw(c.ctx, backend, "KV cache");
    if (ggml_get_first_tensor(c.state_ctx.get())) {
        c.state_buf = alloc_or_throw(c.state_ctx, backend, "DeltaNet state");
        c.tree_buf = alloc_or_throw(c.tree_ctx, backend, "tree verify scratch");
    }
    for (size_t il = 0; il < c.k.size(); ++il) {
        if (!c.k[il]) continue;
        ggml_backend_tensor_alloc(c.kv_buf.get(), c.k_raw[il], c.k[il]->data);
        ggml_backend_tensor_alloc(c.kv_buf.get(), c.v_raw[il], c.v[il]->data);
    }
}

CacheBytes cache_plan_bytes(const TargetCache & c, ggml_backend_buffer_type_t buft) {
    const auto bytes = [&](ggml_context * ctx) {
        return ctx && ggml_get_first_tensor(ctx) ? ggml_backend_alloc_ctx_tensors_from_buft_size(ctx, buft) : 0;
    };
    return {bytes(c.ctx.get()), bytes(c.state_ctx.get()), bytes(c.tree_ctx.get()), bytes(c.capture_ctx.get())};
}

void cache_clear_state(TargetCache & c) {
    if (c.state_buf) ggml_backend_buffer_clear(c.state_buf.get(), 0);
}

void cache_set_capture(TargetCache & c, ggml_backend_t backend, int32_t n_embd, const std::vector<int32_t> & layers,
                       int32_t rows) {
    c.capture_buf.reset();
    c.capture_ctx.reset();
    c.capture.clear();
    c.capture_layers = layers;
    c.capture_rows = rows;
    if (layers.empty()) return;
    c.capture_ctx = new_meta_context(layers.size() + 1);
    for (size_t j = 0; j < layers.size(); ++j) {
        ggml_tensor * t = ggml_new_tensor_2d(c.capture_ctx.get(), GGML_TYPE_F32, n_embd, rows);
        ggml_set_name(t, ("capture." + std::to_string(layers[j])).c_str());
        c.capture.push_back(t);
    }
    if (backend) c.capture_buf = alloc_or_throw(c.capture_ctx, backend, "captured features");
}

}  // namespace lb
