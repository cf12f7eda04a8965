// small_ops_check: the small ops our patches move onto new CUDA kernels, on the CUDA backend against the CPU
// backend, bit for bit: same-type ggml_cpy of a whole tensor and of strided views (rows of 5 to 40960 bytes,
// into a view of a larger tensor whose other bytes must stay as they were; 0022), dim-0 ggml_concat whose
// second source is a transposed matrix (the DeltaNet conv window: carried state, then the new tokens; 0023),
// and ggml_argmax over vocabulary-long rows (0026). Ties in argmax: the CUDA kernel takes the lowest column, the
// CPU backend the highest, so the compared rows have none and planted ties are checked against that rule.
// And a residual ADD fused into the RMS_NORM -> MUL after it (0029), on the CUDA backend against the same ops apart
// (their sums of squares run in another order than the CPU backend's), with a check that the fusion ran; and a Gated
// DeltaNet layer's gates (sigmoid, add, softplus, product) as one kernel (0034), likewise.
//   small_ops_check         prints one line per case; exit 1 if any result is off
#include "compute_once.hpp"
#include "ggml-cpu.h"
#ifdef LUCEBOX_WITH_CUDA
#include "ggml-cuda.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

// src (a view of the [from0, from1] `from`, from element src_off0 of each row) copied into the same view of the
// [into0, into1] `into`; `into` is read back whole
struct CopyCase {
    const char * name;
    ggml_type type;
    int64_t from0, from1, into0, into1, ne0, ne1, src_off0, dst_off0;
};

const CopyCase kCopies[] = {
    // whole tensors (one run of bytes): a DeltaNet state, an odd byte count
    {"cpy f32 contiguous 786432", GGML_TYPE_F32, 16384, 48, 16384, 48, 16384, 48, 0, 0},
    {"cpy i8 contiguous 1001", GGML_TYPE_I8, 1001, 1, 1001, 1, 1001, 1, 0, 0},
    // the conv state kept after an AR step: the last 3 of 4 columns of 10240 rows (12-byte rows)
    {"cpy f32 rows of 12 bytes", GGML_TYPE_F32, 4, 10240, 3, 10240, 3, 10240, 1, 0},
    // a verify's kept inputs: a member of a stacked product into the first rows of a larger cache
    {"cpy f32 10240 of 12000 into 23 of 64 rows", GGML_TYPE_F32, 12000, 23, 10240, 64, 10240, 23, 0, 0},
    {"cpy f32 48 of 100 at 7 into 48 of 50 at 2", GGML_TYPE_F32, 100, 9, 50, 9, 48, 9, 7, 2},
    {"cpy f16 rows of 14 bytes", GGML_TYPE_F16, 9, 5, 8, 5, 7, 5, 1, 0},
    {"cpy i8 rows of 5 bytes", GGML_TYPE_I8, 6, 7, 9, 7, 5, 7, 1, 3},
};

// dim-0 concat of a [k, C] state and the transpose of a [C, n] view of a [C + pad, n] matrix
struct ConcatCase {
    const char * name;
    ggml_type type;
    int64_t k, C, n, pad;
};

const ConcatCase kConcats[] = {
    // the DeltaNet conv window (3 carried columns) for a verify tree, a prefill micro-batch, an AR step, odd sizes
    {"concat f32 3 + 23^T x 10240", GGML_TYPE_F32, 3, 10240, 23, 1760},
    {"concat f32 3 + 512^T x 10240", GGML_TYPE_F32, 3, 10240, 512, 0},
    {"concat f32 3 + 1^T x 10240", GGML_TYPE_F32, 3, 10240, 1, 16},
    {"concat f32 2 + 45^T x 37", GGML_TYPE_F32, 2, 37, 45, 3},
    {"concat f16 3 + 33^T x 70", GGML_TYPE_F16, 3, 70, 33, 5},
};

// ggml_argmax of [n_cols, n_rows] normal values (a tie of the maximum has probability ~0)
struct ArgmaxCase {
    const char * name;
    int64_t n_cols, n_rows;
};

const ArgmaxCase kArgmaxes[] = {
    // the target's logits for an AR step and a verify tree; a row of one part; a ragged last part
    {"argmax 248320 x 1", 248320, 1},
    {"argmax 248320 x 23", 248320, 23},
    {"argmax 8192 x 3", 8192, 3},
    {"argmax 20001 x 2", 20001, 2},
};

// x = a + b kept (a residual stream), and rms_norm(x) * w: [n_cols, n_rows] rows, w broadcast over them
struct AddNormCase {
    const char * name;
    int64_t n_cols, n_rows;
    bool in_place;  // the ADD on its first addend, as ggml-alloc runs the engine's
};

const AddNormCase kAddNorms[] = {
    // a verify's residual stream (1024-thread rows), an AR step's, a row of under 1024 columns (256-thread rows)
    {"add+rms_norm+mul 5120 x 23", 5120, 23, false},
    {"add+rms_norm+mul 5120 x 1, add in place", 5120, 1, true},
    {"add+rms_norm+mul 640 x 5", 640, 5, false},
};

// A Gated DeltaNet layer's gates as the engine lays them out: alpha and b, H-value rows of a stacked product's output
// [4 H, n] (strided for n > 1), beta = sigmoid(b) (after a CONT where b is strided), g = softplus(alpha + dt) * a;
// `keep`: both copied into the first n rows of larger tensors right after (a verify's copies for its commit; they stay
// apart: ggml's fusion check takes no view of a tensor that is not a weight)
struct GatesCase {
    const char * name;
    int64_t H, n;
    bool keep;
};

const GatesCase kGates[] = {
    // an AR step's, a verify's (kept), a prefill micro-batch's (the 27B's 48 value heads), an odd size
    {"delta gates 48 x 1", 48, 1, false},
    {"delta gates 48 x 23, kept", 48, 23, true},
    {"delta gates 48 x 512", 48, 512, false},
    {"delta gates 7 x 3, kept", 7, 3, true},
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

// A case's graph on one backend: `build` adds its tensors to ctx and its op to g and returns the tensor read back;
// every tensor the case created gets random bytes (the same on both backends: one seed), then compute_once
// `probe`, where given, is a tensor of the graph whose buffer starts as 0xff bytes and is read back into `probed`.
template <typename Build>
std::vector<unsigned char> run(ggml_backend_t backend, Build build, ggml_tensor * const * probe = nullptr,
                               std::vector<unsigned char> * probed = nullptr) {
    ggml_init_params ip = {ggml_tensor_overhead() * 32 + ggml_graph_overhead(), nullptr, true};
    const ggml_context_ptr owned(ggml_init(ip));
    ggml_context * ctx = owned.get();
    ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_tensor * out = build(ctx, g);
    std::mt19937 rng(7);
    std::vector<std::vector<unsigned char>> bytes;  // each buffer stays put when `bytes` grows (moved, not copied)
    std::vector<std::pair<ggml_tensor *, const void *>> inputs;
    for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
        if (t->op != GGML_OP_NONE || t->view_src != nullptr) continue;  // the ops' results and views
        bytes.push_back(random_bytes(t, rng));
        inputs.emplace_back(t, bytes.back().data());
    }
    std::vector<unsigned char> result(ggml_nbytes(out));
    std::vector<std::pair<ggml_tensor *, void *>> also;
    std::vector<unsigned char> unset;
    if (probe != nullptr) {
        unset.assign(ggml_nbytes(*probe), 0xff);
        inputs.emplace_back(*probe, unset.data());
        probed->resize(unset.size());
        also.emplace_back(*probe, probed->data());
    }
    compute_once(backend, ctx, g, inputs, out, result.data(), also);
    return result;
}

ggml_tensor * build_copy(const CopyCase & c, ggml_context * ctx, ggml_cgraph * g) {
    ggml_tensor * from = ggml_new_tensor_2d(ctx, c.type, c.from0, c.from1);
    ggml_tensor * into = ggml_new_tensor_2d(ctx, c.type, c.into0, c.into1);
    ggml_tensor * src = ggml_view_2d(ctx, from, c.ne0, c.ne1, from->nb[1], ggml_row_size(c.type, c.src_off0));
    ggml_tensor * dst = ggml_view_2d(ctx, into, c.ne0, c.ne1, into->nb[1], ggml_row_size(c.type, c.dst_off0));
    ggml_build_forward_expand(g, ggml_cpy(ctx, src, dst));
    return into;
}

ggml_tensor * build_concat(const ConcatCase & c, ggml_context * ctx, ggml_cgraph * g) {
    ggml_tensor * state = ggml_new_tensor_2d(ctx, c.type, c.k, c.C);
    ggml_tensor * wide = ggml_new_tensor_2d(ctx, c.type, c.C + c.pad, c.n);
    ggml_tensor * x = ggml_view_2d(ctx, wide, c.C, c.n, wide->nb[1], 0);
    ggml_tensor * out = ggml_concat(ctx, state, ggml_transpose(ctx, x), 0);
    ggml_build_forward_expand(g, out);
    return out;
}

ggml_tensor * build_argmax(const ArgmaxCase & c, ggml_context * ctx, ggml_cgraph * g) {
    ggml_tensor * out = ggml_argmax(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n_cols, c.n_rows));
    ggml_build_forward_expand(g, out);
    return out;
}

// [x | rms_norm(x) * w] with x = a + b; `apart`: a view between the ADD and the norm, so that no fusion can take the
// ADD. *norm: the RMS_NORM node (its buffer is left unwritten where the ADD, the norm and the MUL run as one kernel).
ggml_tensor * build_add_norm(const AddNormCase & c, bool apart, ggml_context * ctx, ggml_cgraph * g, ggml_tensor ** norm) {
    ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n_cols, c.n_rows);
    ggml_tensor * b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n_cols, c.n_rows);
    ggml_tensor * w = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.n_cols);
    ggml_tensor * x = c.in_place ? ggml_add_inplace(ctx, a, b) : ggml_add(ctx, a, b);
    *norm = ggml_rms_norm(ctx, apart ? ggml_view_2d(ctx, x, c.n_cols, c.n_rows, x->nb[1], 0) : x, 1e-6f);
    ggml_tensor * out = ggml_concat(ctx, x, ggml_mul(ctx, *norm, w), 1);
    ggml_build_forward_expand(g, out);
    return out;
}

// A fusion's case run three ways: on `cuda` as built (fused), on `cuda` with its ops kept apart, on the CPU backend;
// and whether the probed node's buffer stayed unwritten in the fused run (the fusion ran). build_case(apart, ctx, g,
// &probe) builds the case and names the node to probe.
struct FusionRuns {
    std::vector<unsigned char> fused, apart, on_cpu;
    bool probe_unwritten;
};

template <typename BuildCase>
FusionRuns fusion_runs(BuildCase build_case, ggml_backend_t cuda, ggml_backend_t cpu) {
    ggml_tensor * probe = nullptr;
    std::vector<unsigned char> probe_bytes;
    auto build = [&](bool apart) {
        return [&build_case, apart, &probe](ggml_context * ctx, ggml_cgraph * g) { return build_case(apart, ctx, g, &probe); };
    };
    FusionRuns r;
    r.fused = run(cuda, build(false), &probe, &probe_bytes);
    r.probe_unwritten = std::all_of(probe_bytes.begin(), probe_bytes.end(), [](unsigned char v) { return v == 0xff; });
    r.apart = run(cuda, build(true));
    r.on_cpu = run(cpu, build(false));
    return r;
}

// The fused kernel against the ops apart on `cuda`, bit for bit (the sum and the product), the sum against the CPU
// backend's, and the norm's own buffer never written (the fusion ran).
bool add_norm_ok(const AddNormCase & c, ggml_backend_t cuda, ggml_backend_t cpu) {
    const FusionRuns r = fusion_runs(
        [&c](bool apart, ggml_context * ctx, ggml_cgraph * g, ggml_tensor ** norm) { return build_add_norm(c, apart, ctx, g, norm); },
        cuda, cpu);
    const size_t sum_bytes = size_t(c.n_cols * c.n_rows) * sizeof(float);
    return r.fused == r.apart && std::equal(r.on_cpu.begin(), r.on_cpu.begin() + sum_bytes, r.fused.begin()) &&
           r.probe_unwritten;
}

// [beta | g | the copies' whole destinations]. `apart`: a view between the ADD and the softplus, so that no fusion can
// take the run (softplus and the product may still run as one kernel: the engine's way before 0034). *add: the ADD
// node (its buffer is left unwritten where the run is one kernel).
ggml_tensor * build_gates(const GatesCase & c, bool apart, ggml_context * ctx, ggml_cgraph * g, ggml_tensor ** add) {
    ggml_tensor * proj = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4 * c.H, c.n);
    ggml_tensor * dt = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.H);
    ggml_tensor * a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.H);
    ggml_tensor * b = ggml_view_2d(ctx, proj, c.H, c.n, proj->nb[1], size_t(2 * c.H) * sizeof(float));
    ggml_tensor * alpha = ggml_view_2d(ctx, proj, c.H, c.n, proj->nb[1], size_t(3 * c.H) * sizeof(float));
    ggml_build_forward_expand(g, alpha);
    ggml_tensor * beta = ggml_sigmoid(ctx, ggml_is_contiguous(b) ? b : ggml_cont(ctx, b));
    ggml_build_forward_expand(g, beta);
    *add = ggml_add(ctx, alpha, dt);
    ggml_tensor * gate = ggml_mul(ctx, ggml_softplus(ctx, apart ? ggml_view_2d(ctx, *add, c.H, c.n, (*add)->nb[1], 0) : *add), a);
    ggml_build_forward_expand(g, gate);
    ggml_tensor * out = ggml_concat(ctx, beta, gate, 1);
    if (c.keep) {
        for (ggml_tensor * src : {beta, gate}) {
            ggml_tensor * into = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.H, 64);
            ggml_tensor * kept = ggml_cpy(ctx, src, ggml_view_2d(ctx, into, c.H, c.n, into->nb[1], 0));
            ggml_build_forward_expand(g, kept);
            out = ggml_concat(ctx, out, ggml_view_2d(ctx, kept, c.H, 64, into->nb[1], 0), 1);  // all of `into`, after
        }
    }
    ggml_build_forward_expand(g, out);
    return out;
}

// The fused kernel against the ops apart on `cuda`, bit for bit, the CPU backend's within its exp / log rounding, and
// the ADD's own buffer never written (the fusion ran).
bool gates_ok(const GatesCase & c, ggml_backend_t cuda, ggml_backend_t cpu) {
    const FusionRuns r = fusion_runs(
        [&c](bool apart, ggml_context * ctx, ggml_cgraph * g, ggml_tensor ** add) { return build_gates(c, apart, ctx, g, add); },
        cuda, cpu);
    bool close = r.fused.size() == r.on_cpu.size();
    for (size_t i = 0; close && i + 4 <= r.fused.size(); i += 4) {
        float x, y;
        std::memcpy(&x, &r.fused[i], 4);
        std::memcpy(&y, &r.on_cpu[i], 4);
        close = std::fabs(x - y) <= 1e-5f * (1.0f + std::fabs(y));
    }
    return r.fused == r.apart && close && r.probe_unwritten;
}

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

}  // namespace

int main() {
#ifndef LUCEBOX_WITH_CUDA
    std::fprintf(stderr, "small_ops_check: this build has no CUDA (configure with -DLUCEBOX_CUDA=ON)\n");
    return 2;
#else
    const CpuAndCuda backends = cpu_and_cuda("small_ops_check");
    ggml_backend_t cpu = backends.cpu.get(), cuda = backends.cuda.get();
    int bad = 0;
    auto report = [&](const char * name, bool ok) {
        bad += !ok;
        std::printf("%-44s: %s\n", name, ok ? "ok" : "FAIL");
    };
    auto same = [&](auto build) { return run(cpu, build) == run(cuda, build); };
    for (const CopyCase & c : kCopies) {
        report(c.name, same([&](ggml_context * ctx, ggml_cgraph * g) { return build_copy(c, ctx, g); }));
    }
    for (const ConcatCase & c : kConcats) {
        report(c.name, same([&](ggml_context * ctx, ggml_cgraph * g) { return build_concat(c, ctx, g); }));
    }
    for (const ArgmaxCase & c : kArgmaxes) {
        report(c.name, same([&](ggml_context * ctx, ggml_cgraph * g) { return build_argmax(c, ctx, g); }));
    }
    report("argmax ties: lowest column", argmax_ties_ok(cuda));
    for (const AddNormCase & c : kAddNorms) {
        report(c.name, add_norm_ok(c, cuda, cpu));
    }
    for (const GatesCase & c : kGates) {
        report(c.name, gates_ok(c, cuda, cpu));
    }
    std::printf(bad ? "FAILED: %d cases\n" : "all ok\n", bad);
    return bad ? 1 : 0;
#endif
}
