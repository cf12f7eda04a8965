// matmul.hpp: the one way our graphs multiply by a matrix.
#pragma once

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

}  // namespace lb
