// What a standalone check of ggml-cuda's kernel headers (lbq_check.cu, bf16_stream_probe.cu, q8s_check.cu) would
// otherwise link from ggml-cuda.cu: common.cuh's CUDA_CHECK handler and device query. One translation unit a program.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

void ggml_cuda_error(const char * stmt, const char * func, const char * file, int line, const char * msg) {
    std::fprintf(stderr, "CUDA error: %s\n  in %s at %s:%d: %s\n", msg, func, file, line, stmt);
    std::exit(1);
}

int ggml_cuda_get_device() {
    int id = 0;
    if (cudaGetDevice(&id) != cudaSuccess) ggml_cuda_error("cudaGetDevice", __func__, __FILE__, __LINE__, "no device");
    return id;
}
