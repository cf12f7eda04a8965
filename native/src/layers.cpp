// layers.cpp: see layers.hpp.
#include "layers.hpp"

#include "error.hpp"
#include "matmul.hpp"

namespace lb {

GraphMeta::GraphMeta(size_t max_nodes) {
    const size_t bytes = ggml_tensor_overhead() * max_nodes * 2 + ggml_graph_overhead_custom(max_nodes, false);
    ggml_init_params ip = {bytes, nullptr, /*no_alloc=*/true};
    ctx.reset(ggml_init(ip));
    check(ctx != nullptr, LB_E_OOM, "cannot allocate graph metadata");
    gf = ggml_new_graph_custom(ctx.get(), max_nodes, false);
}

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
}

ggml_tensor * graph_input(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1) {
    ggml_tensor * t = ggml_new_tensor_2d(ctx, type, ne0, ne1);
    ggml_set_input(t);
    return t;
}

ggml_tensor * attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * K, ggml_tensor * V, ggml_tensor * mask,
                        float scale, bool flash) {
    const int64_t n = q->ne[1];
    if (flash) {
        ggml_tensor * a = ggml_flash_attn_ext(ctx, q, K, V, mask, scale, 0.0f, 0.0f);  // [head_dim, n_head, n]
        return ggml_reshape_2d(ctx, a, a->ne[0] * a->ne[1], n);
    }
    ggml_tensor * kq = ggml_soft_max_ext(ctx, matmul(ctx, K, q), mask, scale, 0.0f);  // [n_kv, n, n_head]
    ggml_tensor * vt = ggml_cont(ctx, ggml_permute(ctx, V, 1, 0, 2, 3));             // [n_kv, head_dim, n_head_kv]
    ggml_tensor * a = matmul(ctx, vt, kq);                                            // [head_dim, n, n_head]
    a = ggml_cont(ctx, ggml_permute(ctx, a, 0, 2, 1, 3));                             // [head_dim, n_head, n]
    return ggml_reshape_2d(ctx, a, a->ne[0] * a->ne[1], n);
}

}  // namespace lb
