// compute_once.hpp: the check tools' one-shot run of a small graph on a backend.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "ggml-alloc.h"  // ggml_backend_alloc_ctx_tensors
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"
#ifdef LUCEBOX_WITH_CUDA
#include "ggml-cpu.h"
#include "ggml-cuda.h"

// The CPU backend and CUDA device 0, which the CUDA check tools compare; exits with status 2, naming the tool, where
// either cannot start.
struct CpuAndCuda {
    ggml_backend_ptr cpu, cuda;
};
inline CpuAndCuda cpu_and_cuda(const char * tool) {
    CpuAndCuda b{ggml_backend_ptr(ggml_backend_cpu_init()), ggml_backend_ptr(ggml_backend_cuda_init(0))};
    if (!b.cpu || !b.cuda) {
        std::fprintf(stderr, "%s: cannot start the CPU or CUDA backend\n", tool);
        std::exit(2);
    }
    return b;
}
#endif

// Allocates ctx's tensors on `backend`, uploads each input (tensor, its ggml_nbytes of host data),
// computes g and copies `out` (ggml_nbytes(out) bytes) to dst, and each of `also` (tensor, host buffer of its
// ggml_nbytes) to its buffer. Exits the tool if the compute fails.
inline void compute_once(ggml_backend_t backend, ggml_context * ctx, ggml_cgraph * g,
                         const std::vector<std::pair<ggml_tensor *, const void *>> & inputs, ggml_tensor * out,
                         void * dst, const std::vector<std::pair<ggml_tensor *, void *>> & also = {}) {
    const ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx, backend));
    for (const auto & in : inputs) ggml_backend_tensor_set(in.first, in.second, 0, ggml_nbytes(in.first));
    if (ggml_backend_graph_compute(backend, g) != GGML_STATUS_SUCCESS) {
        std::fprintf(stderr, "graph compute failed on %s\n", ggml_backend_name(backend));
        std::exit(1);
    }
    ggml_backend_tensor_get(out, dst, 0, ggml_nbytes(out));
    for (const auto & a : also) ggml_backend_tensor_get(a.first, a.second, 0, ggml_nbytes(a.first));
}
