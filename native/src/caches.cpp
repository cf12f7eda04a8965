// caches.cpp: allocation of the KV cache, recurrent state, tree scratch and capture buffers.
#include "caches.hpp"

#include "backend.hpp"

#include "error.hpp"
#include "ggml-alloc.h"

#include <numeric>

namespace lb {

namespace {

ggml_backend_buffer_t alloc_or_throw(ggml_context * ctx, ggml_backend_t backend, const char * what) {
    ggml_backend_buffer_t buf =
        alloc_tensors_or_throw(ctx, backend, what, "lower max_ctx / max_tree or use a smaller KV type");
    ggml_backend_buffer_clear(buf, 0);  // masked KV rows must hold finite values: 0 * NaN is NaN
    return buf;
}

// A [row_elems, rows] tensor of `type` whose row stride is padded to a multiple of 16 bytes and
// of the type's block size: ggml-cuda's flash attention reads 16-byte aligned f16 rows, and
// dequantizes strided quantized K/V with strides counted in whole blocks (a 136-byte Q8_0 row
// padded to 144 would be read as 4 blocks of 34 bytes, then wrong from the second row on).
// One spare row at the end: ggml sizes a tensor as its last row's bytes, not a padded stride,
// and the F32 alias that moves whole rows (cache_init) must stay inside the allocation.
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

TargetCache::~TargetCache() {
    for (ggml_backend_buffer_t b : {kv_buf, state_buf, tree_buf, capture_buf}) {
        if (b) ggml_backend_buffer_free(b);
    }
    for (ggml_context * c : {ctx, alias_ctx, state_ctx, tree_ctx, capture_ctx}) {
        if (c) ggml_free(c);
    }
}

size_t TargetCache::bytes() const {
    size_t n = 0;
    for (ggml_backend_buffer_t b : {kv_buf, state_buf, tree_buf, capture_buf}) {
        if (b) n += ggml_backend_buffer_get_size(b);
    }
    return n;
}

void cache_layout(TargetCache & c, const TargetHparams & hp, int32_t max_ctx, ggml_type type_k, ggml_type type_v,
                  int32_t max_tree) {
    c.rows = (max_ctx + kKvPad - 1) / kKvPad * kKvPad;
    c.max_tree = max_tree;
    c.type_k = type_k;
    c.type_v = type_v;
    const size_t n_layer = size_t(hp.n_layer);
    c.k.assign(n_layer, nullptr); c.v.assign(n_layer, nullptr);
    c.k_raw.assign(n_layer, nullptr); c.v_raw.assign(n_layer, nullptr);
    c.conv.assign(n_layer, nullptr); c.ssm.assign(n_layer, nullptr);
    c.tree_qkv.assign(n_layer, nullptr); c.tree_g.assign(n_layer, nullptr); c.tree_beta.assign(n_layer, nullptr);

    const int64_t kv_row = int64_t(hp.head_dim) * hp.n_head_kv;
    for (ggml_type t : {type_k, type_v}) {
        check(hp.head_dim % ggml_blck_size(t) == 0, LB_E_UNSUPPORTED,
              std::string("KV type ") + ggml_type_name(t) + " needs a head size that is a multiple of " +
                  std::to_string(ggml_blck_size(t)) + " (this model: " + std::to_string(hp.head_dim) + "); use f16");
    }

    // one context per buffer (KV, state, tree scratch): the state buffer alone is cleared on reset
    ggml_init_params ip = {ggml_tensor_overhead() * n_layer * 8 + 1024, nullptr, true};
    c.ctx = ggml_init(ip);
    ggml_init_params ipa = {ggml_tensor_overhead() * n_layer * 2 + 1024, nullptr, true};
    c.alias_ctx = ggml_init(ipa);
    ggml_init_params ip_state = {ggml_tensor_overhead() * n_layer * 2 + 1024, nullptr, true};
    ggml_init_params ip_tree = {ggml_tensor_overhead() * n_layer * 3 + 1024, nullptr, true};
    c.state_ctx = ggml_init(ip_state);
    c.tree_ctx = ggml_init(ip_tree);
    check(c.ctx && c.alias_ctx && c.state_ctx && c.tree_ctx, LB_E_OOM, "cannot create the cache contexts");

    for (int32_t il = 0; il < hp.n_layer; ++il) {
        const std::string s = std::to_string(il);
        if (!hp.recurrent[size_t(il)]) {
            ggml_tensor * k = c.k[size_t(il)] = new_padded_rows(c.ctx, type_k, kv_row, c.rows);
            ggml_tensor * v = c.v[size_t(il)] = new_padded_rows(c.ctx, type_v, kv_row, c.rows);
            ggml_set_name(k, ("cache_k." + s).c_str());
            ggml_set_name(v, ("cache_v." + s).c_str());
            // F32 views of the same rows (placed onto them by cache_alloc): commit moves rows through these
            c.k_raw[size_t(il)] = ggml_new_tensor_2d(c.alias_ctx, GGML_TYPE_F32, int64_t(k->nb[1] / 4), c.rows);
            c.v_raw[size_t(il)] = ggml_new_tensor_2d(c.alias_ctx, GGML_TYPE_F32, int64_t(v->nb[1] / 4), c.rows);
        } else {
            const int64_t C = hp.conv_channels(), S = hp.head_v_dim, H = hp.n_v_heads;
            c.conv[size_t(il)] = ggml_new_tensor_2d(c.state_ctx, GGML_TYPE_F32, hp.d_conv - 1, C);
            c.ssm[size_t(il)] = ggml_new_tensor_3d(c.state_ctx, GGML_TYPE_F32, S, S, H);
            c.tree_qkv[size_t(il)] = ggml_new_tensor_2d(c.tree_ctx, GGML_TYPE_F32, C, max_tree);
            c.tree_g[size_t(il)] = ggml_new_tensor_2d(c.tree_ctx, GGML_TYPE_F32, H, max_tree);
            c.tree_beta[size_t(il)] = ggml_new_tensor_2d(c.tree_ctx, GGML_TYPE_F32, H, max_tree);
            ggml_set_name(c.conv[size_t(il)], ("cache_conv." + s).c_str());
            ggml_set_name(c.ssm[size_t(il)], ("cache_ssm." + s).c_str());
        }
    }
}

void cache_alloc(TargetCache & c, ggml_backend_t backend) {
    if (ggml_get_first_tensor(c.ctx)) c.kv_buf = alloc_or_throw(c.ctx, backend, "KV cache");
    if (ggml_get_first_tensor(c.state_ctx)) {
        c.state_buf = alloc_or_throw(c.state_ctx, backend, "DeltaNet state");
        c.tree_buf = alloc_or_throw(c.tree_ctx, backend, "tree verify scratch");
    }
    for (size_t il = 0; il < c.k.size(); ++il) {
        if (!c.k[il]) continue;
        ggml_backend_tensor_alloc(c.kv_buf, c.k_raw[il], c.k[il]->data);
        ggml_backend_tensor_alloc(c.kv_buf, c.v_raw[il], c.v[il]->data);
    }
}

CacheBytes cache_plan_bytes(const TargetCache & c, ggml_backend_buffer_type_t buft) {
    const auto bytes = [&](ggml_context * ctx) {
        return ctx && ggml_get_first_tensor(ctx) ? ggml_backend_alloc_ctx_tensors_from_buft_size(ctx, buft) : 0;
    };
    return {bytes(c.ctx), bytes(c.state_ctx), bytes(c.tree_ctx), bytes(c.capture_ctx)};
}

void cache_clear_state(TargetCache & c) {
    if (c.state_buf) ggml_backend_buffer_clear(c.state_buf, 0);
}

void cache_set_capture(TargetCache & c, ggml_backend_t backend, int32_t n_embd, const std::vector<int32_t> & layers,
                       int32_t rows) {
    if (c.capture_buf) ggml_backend_buffer_free(c.capture_buf);
    if (c.capture_ctx) ggml_free(c.capture_ctx);
    c.capture_buf = nullptr;
    c.capture_ctx = nullptr;
    c.capture.clear();
    c.capture_layers = layers;
    c.capture_rows = rows;
    if (layers.empty()) return;
    ggml_init_params ip = {ggml_tensor_overhead() * (layers.size() + 1), nullptr, true};
    c.capture_ctx = ggml_init(ip);
    check(c.capture_ctx != nullptr, LB_E_OOM, "cannot create the capture context");
    for (size_t j = 0; j < layers.size(); ++j) {
        ggml_tensor * t = ggml_new_tensor_2d(c.capture_ctx, GGML_TYPE_F32, n_embd, rows);
        ggml_set_name(t, ("capture." + std::to_string(layers[j])).c_str());
        c.capture.push_back(t);
    }
    if (backend) c.capture_buf = alloc_or_throw(c.capture_ctx, backend, "captured features");
}

}  // namespace lb
