// pinned_buffer.cpp: see pinned_buffer.hpp.
#include "pinned_buffer.hpp"

#include <algorithm>

namespace lb {

void * PinnedBuffer::reserve(ggml_backend_t backend, size_t bytes) {
    grew_ = bytes > capacity_;
    if (!grew_) return data_;
    const size_t want = std::max(bytes, capacity_ + capacity_ / 2);
    if (pinned_) ggml_backend_synchronize(backend);  // a copy from the old buffer may still be queued
    pinned_.reset();
    data_ = nullptr;
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_buffer_type_t host = dev ? ggml_backend_dev_host_buffer_type(dev) : nullptr;
    if (host) {
        pinned_.reset(ggml_backend_buft_alloc_buffer(host, want));
        if (pinned_) data_ = ggml_backend_buffer_get_base(pinned_.get());
    }
    if (data_) {
        plain_ = {};
    } else {
        pinned_.reset();
        plain_.resize(want);
        data_ = plain_.data();
    }
    capacity_ = want;
    return data_;
}

}  // namespace lb
