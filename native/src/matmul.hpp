// matmul.hpp: the one way our graphs multiply by a matrix, and matrices stacked to share a product.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
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

// Matrices that multiply one input (an attention layer's q|k|v, a FFN's gate|up, ...). Each run of
// consecutive members of one storage type is stored as one taller matrix [n_in, sum of its rows]
// (named after its first member + ".stack"), so one product serves the whole run: fewer, taller
// mat-muls run much closer to a GPU's bandwidth. A member alone in its run is a plain matrix.
class StackedMatrices {
public:
    StackedMatrices() = default;
    // Creates the tensors in ctx (metadata only: allocating and filling them is the caller's).
    StackedMatrices(ggml_context * ctx, int64_t n_in, const std::vector<StackMember> & members);

    size_t size() const { return members_.size(); }
    // Member i as [n_in, rows_i]: a row-range view of its run's matrix, or the matrix itself.
    ggml_tensor * operator[](size_t i) const { return members_[i].w; }

    // x [n_in, n] -> one [rows_i, n] result per member i in [first, last) (default: all). Members of
    // one run get their rows of one product (of just those members' rows) as views with the product's
    // row stride, so consumers must accept strided columns (ggml_cont where an op needs contiguous data).
    std::vector<ggml_tensor *> project(ggml_context * ctx, ggml_tensor * x, size_t first = 0,
                                       size_t last = SIZE_MAX) const;

private:
    struct Member {
        ggml_tensor * w;       // what operator[] returns
        ggml_tensor * stack;   // the run's matrix when the run has several members, else nullptr
        int64_t row0;          // first row of w in stack
    };
    std::vector<Member> members_;
};

inline StackedMatrices::StackedMatrices(ggml_context * ctx, int64_t n_in, const std::vector<StackMember> & members) {
    for (size_t i = 0; i < members.size();) {
        size_t j = i + 1;
        int64_t rows = members[i].rows;
        for (; j < members.size() && members[j].type == members[i].type; ++j) rows += members[j].rows;
        if (j - i == 1) {
            ggml_tensor * w = ggml_new_tensor_2d(ctx, members[i].type, n_in, rows);
            ggml_set_name(w, members[i].name.c_str());
            members_.push_back({w, nullptr, 0});
            i = j;
            continue;
        }
        ggml_tensor * stack = ggml_new_tensor_2d(ctx, members[i].type, n_in, rows);
        ggml_set_name(stack, (members[i].name + ".stack").c_str());
        for (int64_t row0 = 0; i < j; row0 += members[i].rows, ++i) {
            ggml_tensor * w = ggml_view_2d(ctx, stack, n_in, members[i].rows, stack->nb[1], size_t(row0) * stack->nb[1]);
            ggml_set_name(w, members[i].name.c_str());
            members_.push_back({w, stack, row0});
        }
    }
}

inline std::vector<ggml_tensor *> StackedMatrices::project(ggml_context * ctx, ggml_tensor * x, size_t first,
                                                           size_t last) const {
    last = std::min(last, members_.size());
    std::vector<ggml_tensor *> out;
    for (size_t i = first; i < last;) {
        const Member & m = members_[i];
        if (!m.stack) {
            out.push_back(matmul(ctx, m.w, x));
            ++i;
            continue;
        }
        // the members of this run within [first, last): one product of their rows
        size_t j = i + 1;
        int64_t rows = m.w->ne[1];
        for (; j < last && members_[j].stack == m.stack; ++j) rows += members_[j].w->ne[1];
        ggml_tensor * w = rows == m.stack->ne[1]
                              ? m.stack
                              : ggml_view_2d(ctx, m.stack, m.stack->ne[0], rows, m.stack->nb[1], size_t(m.row0) * m.stack->nb[1]);
        ggml_tensor * product = matmul(ctx, w, x);
        for (; i < j; ++i) {
            const Member & mi = members_[i];
            out.push_back(ggml_view_2d(ctx, product, mi.w->ne[1], product->ne[1], product->nb[1],
                                       size_t(mi.row0 - m.row0) * product->nb[0]));
        }
    }
    return out;
}

}  // namespace lb
