// token_embedding.hpp: the target's input embedding, looked up on the host.
//
// A forward reads one embedding row per token, so the table stays in host memory (the mapped
// GGUF, as llama.cpp keeps token_embd on the CPU) and each call copies only its tokens' rows into
// a small staging matrix on the backend: ~680 MiB less GPU memory for the 27B's 248,320 Q4_K rows.
// Graphs dequantize the staged rows with ggml_get_rows, as they would the whole table, so the
// result is the same to the bit. The target's forward and the draft's proposal both stage through
// it (one at a time: the engine runs one call at a time).
//
//   layout(table, rows)       the staging tensor's metadata: `rows` rows of the table's type
//   alloc(backend) / plan(buft) its memory / the bytes alloc would take (lb_memory_plan)
//   set_host_rows(p)          where the table's rows are in host memory (row i at p + i * row bytes)
//   stage(backend, toks, n,   rows of toks[0..n) -> staging rows 0..n-1, and 0..n-1 -> index (the
//         index)              graph's i32 input), so ggml_get_rows(rows(), index) reads them (copies on
//                             the backend's stream, set_input: the graph computed next reads them)
#pragma once

#include <cstdint>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"
#include "pinned_buffer.hpp"

namespace lb {

class TokenEmbedding {
public:
    void layout(const ggml_tensor * table, int32_t rows);
    void alloc(ggml_backend_t backend);
    size_t plan(ggml_backend_buffer_type_t buft);
    void set_host_rows(const char * rows) { host_rows_ = rows; }  // must outlive this object

    ggml_tensor * rows() const { return stage_; }  // [n_embd, rows] of the table's type
    int32_t capacity() const { return stage_ ? int32_t(stage_->ne[1]) : 0; }
    size_t bytes() const;                           // the allocated staging memory
    void stage(ggml_backend_t backend, const int32_t * toks, int32_t n, ggml_tensor * index);

private:
    const char * host_rows_ = nullptr;
    size_t row_bytes_ = 0;
    ggml_context_ptr ctx_;
    ggml_backend_buffer_ptr buf_;
    ggml_tensor * stage_ = nullptr;
    PinnedBuffer host_;             // the rows of one call, uploaded at once (page-locked: pinned_buffer.hpp)
    std::vector<int32_t> index_;    // 0..capacity-1
};

}  // namespace lb
