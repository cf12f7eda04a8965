// small_ops_check: the copies patches 0022 / 0023 move onto kernels, on the CUDA backend against the CPU
// backend, bit for bit: same-type ggml_cpy of a whole tensor and of strided views (rows of 1 to 40960 bytes,
// into a view of a larger tensor whose other bytes must stay as they were), and dim-0 ggml_concat whose
// second source is a transposed matrix (the DeltaNet conv window: carried state, then the new tokens).
//   small_ops_check         prints one line per case; exit 1 if any result is off
#include "compute_once.hpp"
#include "ggml-cpu.h"
#ifdef LUCEBOX_WITH_CUDA
#include "ggml-cuda.h"
#endif

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

// One case builds its graph in ctx from its inputs and names the tensor whose bytes are compared
struct Built {
    std::vector<std::pair<ggml_tensor *, std::vector<unsigned char>>> inputs;
    ggml_tensor * out;  // read back whole: for a copy into a view, the view's parent
};

std::vector<unsigned char> random_bytes(const ggml_tensor * t, std::mt19937 & rng) {
    std::vector<unsigned char> b(ggml_nbytes(t));
    std::uniform_int_distribution<int> byte(0, 255);
    if (t->type == GGML_TYPE_F32) {  // finite floats: NaN payloads need not survive every path
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (size_t i = 0; i < b.size(); i += 4) {
            const float v = nd(rng);
            std::memcpy(&b[i], &v, 4);
        }
    } else {
        for (unsigned char & c : b) c = (unsigned char) byte(rng);
        if (t->type == GGML_TYPE_F16) {  // clear the exponent's top bit: no inf / NaN halves
            for (size_t i = 1; i < b.size(); i += 2) b[i] &= 0xBF;
        }
    }
    return b;
}

// src (a view of `from`) copied into a view of `into`; both parents are inputs, `into` is read back whole
Built copy_into(ggml_context * ctx, ggml_cgraph * g, std::mt19937 & rng, ggml_type type, int64_t from0, int64_t from1,
                int64_t into0, int64_t into1, int64_t ne0, int64_t ne1, int64_t src_off0, int64_t dst_off0) {
    ggml_tensor * from = ggml_new_tensor_2d(ctx, type, from0, from1);
    ggml_tensor * into = ggml_new_tensor_2d(ctx, type, into0, into1);
    ggml_tensor * src = ggml_view_2d(ctx, from, ne0, ne1, from->nb[1], ggml_row_size(type, src_off0));
    ggml_tensor * dst = ggml_view_2d(ctx, into, ne0, ne1, into->nb[1], ggml_row_size(type, dst_off0));
    ggml_build_forward_expand(g, ggml_cpy(ctx, src, dst));
    return {{{from, random_bytes(from, rng)}, {into, random_bytes(into, rng)}}, into};
}

// dim-0 concat of a [k, C] state and the transpose of a [C, n] view of a [C + pad, n] matrix
Built concat_window(ggml_context * ctx, ggml_cgraph * g, std::mt19937 & rng, ggml_type type, int64_t k, int64_t C,
                    int64_t n, int64_t pad) {
    ggml_tensor * state = ggml_new_tensor_2d(ctx, type, k, C);
    ggml_tensor * wide = ggml_new_tensor_2d(ctx, type, C + pad, n);
    ggml_tensor * x = ggml_view_2d(ctx, wide, C, n, wide->nb[1], 0);
    ggml_tensor * out = ggml_concat(ctx, state, ggml_transpose(ctx, x), 0);
    ggml_build_forward_expand(g, out);
    return {{{state, random_bytes(state, rng)}, {wide, random_bytes(wide, rng)}}, out};
}

// ggml_argmax of [n_cols, n_rows] normal values (ties have probability ~0: argmax_ties_ok plants them)
Built argmax_rows(ggml_context * ctx, ggml_cgraph * g, std::mt19937 & rng, int64_t n_cols, int64_t n_rows) {
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_cols, n_rows);
    ggml_tensor * out = ggml_argmax(ctx, x);
    ggml_build_forward_expand(g, out);
    return {{{x, random_bytes(x, rng)}}, out};
}

struct Case {
    const char * name;
    Built (*build)(ggml_context *, ggml_cgraph *, std::mt19937 &);
};

const Case kCases[] = {
    // whole tensors (one run of bytes): a DeltaNet state, an odd byte count
    {"cpy f32 contiguous 786432", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) {
         return copy_into(c, g, r, GGML_TYPE_F32, 128 * 128, 48, 128 * 128, 48, 128 * 128, 48, 0, 0);
     }},
    {"cpy i8 contiguous 1001", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) {
         return copy_into(c, g, r, GGML_TYPE_I8, 1001, 1, 1001, 1, 1001, 1, 0, 0);
     }},
    // the conv state kept after an AR step: the last 3 of 4 columns of 10240 rows (12-byte rows)
    {"cpy f32 rows of 12 bytes", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) {
         return copy_into(c, g, r, GGML_TYPE_F32, 4, 10240, 3, 10240, 3, 10240, 1, 0);
     }},
    // a verify's kept inputs: a member of a stacked product into the first rows of a larger cache
    {"cpy f32 10240 of 12000 into 23 of 64 rows", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) {
         return copy_into(c, g, r, GGML_TYPE_F32, 12000, 23, 10240, 64, 10240, 23, 0, 0);
     }},
    {"cpy f32 48 of 100 at 7 into 48 of 50 at 2", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) {
         return copy_into(c, g, r, GGML_TYPE_F32, 100, 9, 50, 9, 48, 9, 7, 2);
     }},
    {"cpy f16 rows of 14 bytes", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) {
         return copy_into(c, g, r, GGML_TYPE_F16, 9, 5, 8, 5, 7, 5, 1, 0);
     }},
    {"cpy i8 rows of 5 bytes", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) {
         return copy_into(c, g, r, GGML_TYPE_I8, 6, 7, 9, 7, 5, 7, 1, 3);
     }},
    // the DeltaNet conv window (3 carried columns) for a verify tree, a prefill micro-batch, odd sizes
    {"concat f32 3 + 23^T x 10240", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) {
         return concat_window(c, g, r, GGML_TYPE_F32, 3, 10240, 23, 1760);
     }},
    {"concat f32 3 + 512^T x 10240", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) {
         return concat_window(c, g, r, GGML_TYPE_F32, 3, 10240, 512, 0);
     }},
    {"concat f32 3 + 1^T x 10240", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) {
         return concat_window(c, g, r, GGML_TYPE_F32, 3, 10240, 1, 16);
     }},
    {"concat f32 2 + 45^T x 37", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) {
         return concat_window(c, g, r, GGML_TYPE_F32, 2, 37, 45, 3);
     }},
    {"concat f16 3 + 33^T x 70", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) {
         return concat_window(c, g, r, GGML_TYPE_F16, 3, 70, 33, 5);
     }},
    // the target's logits (248320 columns) for an AR step and a verify tree; a row of one part; a ragged last part
    {"argmax 248320 x 1", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) { return argmax_rows(c, g, r, 248320, 1); }},
    {"argmax 248320 x 23", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) { return argmax_rows(c, g, r, 248320, 23); }},
    {"argmax 8192 x 3", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) { return argmax_rows(c, g, r, 8192, 3); }},
    {"argmax 20001 x 2", [](ggml_context * c, ggml_cgraph * g, std::mt19937 & r) { return argmax_rows(c, g, r, 20001, 2); }},
};

// Ties on the CUDA backend: the lowest of the maximal columns, in one part and across parts
bool argmax_ties_ok(ggml_backend_t cuda) {
    const int64_t n_cols = 248320, n_rows = 3;
    const int64_t planted[n_rows][3] = {{100, 70000, 200000}, {8191, 8192, 16384}, {248319, 248318, 5}};
    std::vector<float> x(size_t(n_cols * n_rows), 0.0f);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float & v : x) v = nd(rng);
    for (int64_t r = 0; r < n_rows; ++r) {
        for (const int64_t col : planted[r]) x[size_t(r * n_cols + col)] = 5.0f;
    }
    ggml_init_params ip = {ggml_tensor_overhead() * 4 + ggml_graph_overhead(), nullptr, true};
    const ggml_context_ptr owned(ggml_init(ip));
    ggml_context * ctx = owned.get();
    ggml_tensor * t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_cols, n_rows);
    ggml_tensor * out = ggml_argmax(ctx, t);
    ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, out);
    int32_t got[n_rows];
    compute_once(cuda, ctx, g, {{t, x.data()}}, out, got);
    return got[0] == 100 && got[1] == 8191 && got[2] == 5;
}

std::vector<unsigned char> run(ggml_backend_t backend, const Case & c) {
    ggml_init_params ip = {ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true};
    const ggml_context_ptr owned(ggml_init(ip));
    ggml_context * ctx = owned.get();
    ggml_cgraph * g = ggml_new_graph(ctx);
    std::mt19937 rng(7);  // the same inputs on both backends
    Built b = c.build(ctx, g, rng);
    std::vector<unsigned char> out(ggml_nbytes(b.out));
    const ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx, backend));
    for (const auto & in : b.inputs) ggml_backend_tensor_set(in.first, in.second.data(), 0, in.second.size());
    if (ggml_backend_graph_compute(backend, g) != GGML_STATUS_SUCCESS) {
        std::fprintf(stderr, "graph compute failed on %s\n", ggml_backend_name(backend));
        std::exit(1);
    }
    ggml_backend_tensor_get(b.out, out.data(), 0, out.size());
    return out;
}

}  // namespace

int main() {
#ifndef LUCEBOX_WITH_CUDA
    std::fprintf(stderr, "small_ops_check: this build has no CUDA (configure with -DLUCEBOX_CUDA=ON)\n");
    return 2;
#else
    const ggml_backend_ptr cpu_owned(ggml_backend_cpu_init()), cuda_owned(ggml_backend_cuda_init(0));
    ggml_backend_t cpu = cpu_owned.get(), cuda = cuda_owned.get();
    if (!cpu || !cuda) {
        std::fprintf(stderr, "small_ops_check: cannot start the CPU or CUDA backend\n");
        return 2;
    }
    int bad = 0;
    for (const Case & c : kCases) {
        const bool ok = run(cpu, c) == run(cuda, c);
        bad += !ok;
        std::printf("%-44s: %s\n", c.name, ok ? "ok" : "FAIL");
    }
    const bool ties = argmax_ties_ok(cuda);
    bad += !ties;
    std::printf("%-44s: %s\n", "argmax ties: lowest column", ties ? "ok" : "FAIL");
    std::printf(bad ? "FAILED: %d cases\n" : "all ok\n", bad);
    return bad ? 1 : 0;
#endif
}
