// matmul.hpp: the one way our graphs multiply by a matrix.
#pragma once

#include <initializer_list>
#include <string>
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

// One matrix of a group that multiplies one input: its tensor name, storage type and rows.
struct StackMember {
    std::string name;
    ggml_type type;
    int64_t rows;
};

// The layout project() reads, for the model loaders: in ctx, each run of consecutive members of one
// storage type becomes one matrix [n_in, sum of its rows] (named after its first member) and each
// member a row-range view of it; a member alone in its run is a plain [n_in, rows] matrix. Returns
// the members' tensors in order; filling them is the caller's.
inline std::vector<ggml_tensor *> new_stacked(ggml_context * ctx, int64_t n_in, const std::vector<StackMember> & members) {
    std::vector<ggml_tensor *> out;
    for (size_t i = 0; i < members.size();) {
        size_t j = i + 1;
        int64_t rows = members[i].rows;
        for (; j < members.size() && members[j].type == members[i].type; ++j) rows += members[j].rows;
        if (j - i == 1) {
            out.push_back(ggml_new_tensor_2d(ctx, members[i].type, n_in, rows));
            ggml_set_name(out.back(), members[i].name.c_str());
            i = j;
            continue;
        }
        ggml_tensor * stack = ggml_new_tensor_2d(ctx, members[i].type, n_in, rows);
        ggml_set_name(stack, (members[i].name + ".stack").c_str());
        for (int64_t row0 = 0; i < j; row0 += members[i].rows, ++i) {
            out.push_back(ggml_view_2d(ctx, stack, n_in, members[i].rows, stack->nb[1], size_t(row0) * stack->nb[1]));
            ggml_set_name(out.back(), members[i].name.c_str());
        }
    }
    return out;
}

// x [k, n] times several matrices that share it, one result per matrix. Matrices stacked by
// new_stacked() (row ranges of one taller matrix: views) share one product; each gets its rows of
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
