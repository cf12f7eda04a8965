// mask_stage.hpp: the host copy of a forward's attention mask, kept between calls and rewritten
// only where it changed, in pinned memory where the device has it.
//
// A forward over n new tokens at P committed ones uploads a mask [n rows][n_kv slots] (f16 bits):
// row i open over the prefix [0, P), then over the new slots [P, P + n) that token i may see (its
// ancestors and itself in a verify tree; slots up to its own in a chain), shut from P + n on. At
// 128K a 23-node verify's mask is 6 MB: filled from scratch and copied from pageable memory each
// step, it cost about a millisecond of host time and transfer (the 128K verify spent ~1.2-1.7 ms
// more than its attention kernels account for: twenty-third and twenty-sixth sessions, H100 /
// H200). Successive verifies (and AR steps) keep n and n_kv, and P only grows, so between them a
// row changes in [P_last, P + n) alone: that span is written, the rest is left as it is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpp.h"

namespace lb {

// Attention-mask values (f16 bits): a slot a token may attend to, and one it may not.
constexpr uint16_t kMaskOpen = 0x0000;  // +0
constexpr uint16_t kMaskShut = 0xFC00;  // -inf

class MaskStage {
public:
    // The mask of n rows over n_kv slots at P committed tokens (P + n <= n_kv); allowed[i * n + j]:
    // row i sees new slot j (nullptr: a chain, j <= i). Returns the mask, n * n_kv values, valid
    // until the next build. `backend`: where the mask goes (its device's pinned host memory is used
    // when it has one).
    const uint16_t * build(ggml_backend_t backend, int32_t n, int32_t n_kv, int32_t P, const uint8_t * allowed);

private:
    uint16_t * reserve(ggml_backend_t backend, size_t values);

    ggml_backend_buffer_ptr pinned_;  // the device's host buffer (CUDA: page-locked), when it has one
    std::vector<uint16_t> plain_;     // otherwise (CPU backend, or pinned memory refused)
    uint16_t * data_ = nullptr;
    size_t capacity_ = 0;             // values
    // what data_ holds (n_ == 0: nothing yet)
    int32_t n_ = 0, n_kv_ = 0, P_ = 0;
};

}  // namespace lb
