// matmul.hpp: the one way our graphs multiply by a matrix.
#pragma once

#include <initializer_list>
#include <utility>
#include <vector>

#include "ggml.h"

namespace lb {

// w [k, m] (weights or a cache view) times x [k, n]. F32 matrices are chosen for exactness (the
// oracle tests, F32 KV caches), but ggml-cuda multiplies f32 on tf32 tensor cores unless the op
// asks for full precision (vendor/patches/0004); quantized and 16-bit weights keep the fast paths.
inline ggml_tensor * matmul(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    if (w->type == GGML_TYPE_F32) ggml_prec_set_acc(y, GGML_PREC_F32);
    return y;
}

// x [k, n] times several matrices that share it, one result per matrix. Matrices stacked by the
// model loaders (row ranges of one taller matrix: views) share one product; each gets its rows of
// it as a [rows, n] view with the whole product's row stride, so consumers must accept strided
// columns (ggml_cont where an op needs contiguous data).
inline std::vector<ggml_tensor *> project(ggml_context * ctx, std::initializer_list<ggml_tensor *> ws, ggml_tensor * x) {
    std::vector<ggml_tensor *> out;
    std::vector<std::pair<const ggml_tensor *, ggml_tensor *>> products;  // (stacked matrix, its product)
    for (ggml_tensor * w : ws) {
        const ggml_tensor * s = w->view_src;
        if (!s || s->ne[0] != w->ne[0] || s->nb[1] != w->nb[1] || w->view_offs % w->nb[1] != 0) {
            out.push_back(matmul(ctx, w, x));
            continue;
        }
        ggml_tensor * y = nullptr;
        for (const auto & p : products) y = p.first == s ? p.second : y;
        if (!y) {
            y = matmul(ctx, const_cast<ggml_tensor *>(s), x);
            products.push_back({s, y});
        }
        const size_t row0 = w->view_offs / w->nb[1];
        out.push_back(ggml_view_2d(ctx, y, w->ne[1], y->ne[1], y->nb[1], row0 * y->nb[0]));
    }
    return out;
}

}  // namespace lb
