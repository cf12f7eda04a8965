// mask_stage.hpp: a forward's attention mask, kept between calls on the host and on the device and
// rewritten and sent only where it changed; the host copy in pinned memory where the device has it.
//
// A forward over n new tokens at P committed ones reads a mask [n rows][n_kv slots] (f16 bits): row
// i open over the prefix [0, P), then over the new slots [P, P + n) that token i may see (its
// ancestors and itself in a verify tree; slots up to its own in a chain), shut from P + n on. At
// 128K a 23-node verify's mask is 6 MB: filled from scratch and copied from pageable memory each
// step, it cost about a millisecond of host time and transfer (the 128K verify spent ~0.9-1.7 ms more
// than its attention kernels account for: twenty-third and twenty-sixth sessions, H100 / H200).
// Successive verifies (and AR steps) keep n and n_kv, and P only grows, so between them a row changes
// only in [P_last, P + n): that span is written on the host and, where the graph keeps its mask's
// memory between computes (ggml_set_output on the input), sent as one 2-D copy of n short rows. Copies queue on
// the backend's stream (set_input): the pinned host copy changes only in the next set, after this call's wait.
// Measured (H100, twenty-seventh session, run.sh libab, one run each): the 128K verify 28.52 -> 26.42 ms,
// the AR step 13.87 -> 13.60 ms; nothing at 4K.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ggml-backend.h"
#include "pinned_buffer.hpp"

namespace lb {

// Attention-mask values (f16 bits): a slot a token may attend to, and one it may not.
constexpr uint16_t kMaskOpen = 0x0000;  // +0
constexpr uint16_t kMaskShut = 0xFC00;  // -inf

class MaskStage {
public:
    // Sets dst (f16 [n_kv, n], a graph input) to the mask of n rows at P committed tokens (P + n <=
    // n_kv); allowed[i * n + j]: row i sees new slot j (nullptr: a chain, j <= i). dst_graph: the
    // install count of dst's graph slot (GraphSlot::builds), so a rebuilt graph, whose mask holds
    // nothing yet, is sent whole. A stage serves one graph slot.
    void set(ggml_backend_t backend, ggml_tensor * dst, int32_t dst_graph, int32_t n, int32_t n_kv, int32_t P,
             const uint8_t * allowed);

    // The host copy after the last set (n * n_kv values): for checks.
    const uint16_t * host() const { return static_cast<const uint16_t *>(buf_.data()); }

private:
    PinnedBuffer buf_;
    // what buf_ holds (n_ == 0: nothing yet), and the device mask that holds it too (none: nullptr)
    int32_t n_ = 0, n_kv_ = 0, P_ = 0;
    const void * sent_to_ = nullptr;
    int32_t sent_graph_ = -1;
};

}  // namespace lb
