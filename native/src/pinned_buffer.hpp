// pinned_buffer.hpp: host memory that graph inputs are copied from: page-locked where the device has a
// host buffer type (CUDA), ordinary memory otherwise (the CPU backend, or a refused pinned allocation).
//
// Why page-locked: a queued copy (set_input, cudaMemcpyAsync) from pageable memory larger than the
// driver's inline limit may wait for the stream to reach it, since CUDA stages such a source before it
// returns; from page-locked memory it only queues. A commit's graphs are left running (lb_commit), so
// an upload that waits for the stream would hold the host until they finish.
//
// The caller rewrites the memory only after the copies it queued from it have run (a wait on the
// stream: the call that queued them waits for its results).
// Measured (H200, forty-seventh session, run.sh libab at 8K): with the draft's masks and the embedding rows here, a
// speculative step run back to back took 15.24-15.26 ms against 15.27-15.32 with them pageable.
#pragma once

#include <cstddef>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpp.h"

namespace lb {

class PinnedBuffer {
public:
    // At least `bytes` of host memory for copies to backend's device. Growing waits for the backend's queued copies
    // and loses what the buffer held; grew() says whether the last reserve did. It grows by half again at least:
    // pinned allocations are slow and a long prompt's micro-batches grow a little each (doubling would hold up to
    // twice a 256K prefill's 256 MB mask).
    void * reserve(ggml_backend_t backend, size_t bytes);
    bool grew() const { return grew_; }
    void * data() const { return data_; }  // what the last reserve returned

private:
    ggml_backend_buffer_ptr pinned_;
    std::vector<char> plain_;
    void * data_ = nullptr;
    size_t capacity_ = 0;  // bytes
    bool grew_ = false;
};

}  // namespace lb
