// mask_stage.cpp: see mask_stage.hpp.
#include "mask_stage.hpp"

#include <algorithm>

#include "backend.hpp"

namespace lb {

void MaskStage::set(ggml_backend_t backend, ggml_tensor * dst, int32_t dst_graph, int32_t n, int32_t n_kv, int32_t P,
                    const uint8_t * allowed) {
    uint16_t * mask = static_cast<uint16_t *>(buf_.reserve(backend, size_t(n) * size_t(n_kv) * sizeof(uint16_t)));
    if (buf_.grew()) n_ = 0;  // what was there is not kept
    // The same rows as last time with P grown: a row changed only in [P_, P + n) (it was open before P_ and
    // shut from P_ + n <= P + n on, and now is open before P and shut from P + n on).
    const bool same_rows = n_ == n && n_kv_ == n_kv && P_ <= P;
    const int32_t from = same_rows ? P_ : 0;
    for (int32_t i = 0; i < n; ++i) {
        uint16_t * row = mask + size_t(i) * size_t(n_kv);
        std::fill(row + from, row + P, kMaskOpen);
        for (int32_t j = 0; j < n; ++j) {
            const bool sees = allowed ? allowed[size_t(i) * size_t(n) + size_t(j)] != 0 : j <= i;
            row[P + j] = sees ? kMaskOpen : kMaskShut;
        }
        if (!same_rows) std::fill(row + P + n, row + n_kv, kMaskShut);
    }
    n_ = n;
    n_kv_ = n_kv;
    P_ = P;

    if (!dst || !dst->buffer) {  // an input the graph does not use
        sent_to_ = nullptr;
        return;
    }
    // dst holds the last mask when it received it, is still the same graph's, and that graph keeps its memory
    const bool kept = (dst->flags & GGML_TENSOR_FLAG_OUTPUT) != 0;
    const size_t ld = size_t(n_kv) * sizeof(uint16_t);
    if (same_rows && kept && sent_to_ == dst->data && sent_graph_ == dst_graph) {
        set_input_2d(backend, dst, mask + from, size_t(from) * sizeof(uint16_t), size_t(P + n - from) * sizeof(uint16_t),
                     size_t(n), ld, ld);
    } else {
        set_input(backend, dst, mask, size_t(n) * ld);
    }
    sent_to_ = kept ? dst->data : nullptr;
    sent_graph_ = dst_graph;
}

}  // namespace lb
