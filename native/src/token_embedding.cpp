// token_embedding.cpp: see token_embedding.hpp.
#include "token_embedding.hpp"

#include <cstring>
#include <numeric>
#include <string>

#include "backend.hpp"
#include "error.hpp"

namespace lb {

void TokenEmbedding::layout(const ggml_tensor * table, int32_t rows) {
    check(rows >= 1, LB_E_INVALID_ARG, "token embedding: the staging matrix needs at least one row");
    ggml_init_params ip = {ggml_tensor_overhead(), nullptr, /*no_alloc=*/true};
    buf_.reset();
    ctx_.reset(ggml_init(ip));
    check(ctx_ != nullptr, LB_E_OOM, "cannot create the token embedding's tensor context");
    stage_ = ggml_new_tensor_2d(ctx_.get(), table->type, table->ne[0], rows);
    ggml_set_name(stage_, "token_embd_rows");
    row_bytes_ = ggml_row_size(table->type, table->ne[0]);
    index_.resize(size_t(rows));
    std::iota(index_.begin(), index_.end(), 0);
}

void TokenEmbedding::alloc(ggml_backend_t backend) {
    buf_ = alloc_tensors_or_throw(ctx_.get(), backend, "token embedding rows", "lower ubatch or max_tree");
    host_.reserve(backend, size_t(capacity()) * row_bytes_);  // once: a pinned allocation takes milliseconds
}

size_t TokenEmbedding::plan(ggml_backend_buffer_type_t buft) {
    const size_t bytes = ggml_backend_alloc_ctx_tensors_from_buft_size(ctx_.get(), buft);
    mark_placed(ctx_.get());
    return bytes;
}

size_t TokenEmbedding::bytes() const { return buf_ ? ggml_backend_buffer_get_size(buf_.get()) : 0; }

void TokenEmbedding::stage(ggml_backend_t backend, const int32_t * toks, int32_t n, ggml_tensor * index) {
    check(n >= 1 && n <= capacity() && host_rows_ != nullptr, LB_E_STATE,
          "token embedding: " + std::to_string(n) + " rows asked of a staging matrix of " + std::to_string(capacity()));
    char * rows = static_cast<char *>(host_.reserve(backend, size_t(n) * row_bytes_));
    for (int32_t i = 0; i < n; ++i) {  // ids were checked against n_vocab by the caller
        std::memcpy(rows + size_t(i) * row_bytes_, host_rows_ + size_t(toks[i]) * row_bytes_, row_bytes_);
    }
    set_input(backend, stage_, rows, size_t(n) * row_bytes_);
    set_input(backend, index, index_.data(), size_t(n) * sizeof(int32_t));
}

}  // namespace lb
