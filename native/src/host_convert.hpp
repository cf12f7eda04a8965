// host_convert.hpp: element conversion on the host while loading weights (the target's small F16/BF16
// tensors, the draft's checkpoint), through ggml's own row converters.
#pragma once

#include <cstdint>
#include <cstring>

#include "ggml.h"

namespace lb {

// n elements of `type` (F32, F16, BF16 or any type ggml can dequantize) at src -> f32 at dst.
inline void to_f32(ggml_type type, const void * src, float * dst, int64_t n) {
    if (type == GGML_TYPE_F32) {
        std::memcpy(dst, src, size_t(n) * sizeof(float));
    } else {
        ggml_get_type_traits(type)->to_float(src, dst, n);
    }
}

}  // namespace lb
