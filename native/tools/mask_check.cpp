// mask_check: the engine's mask stage (native/src/mask_stage.hpp), which rewrites and sends a kept
// mask only where it changed, against masks written from scratch, over random runs of calls, for the tests
// (tests/test_mask_stage.py).
//
//   mask_check [--backend cpu|cuda] [--calls N] [--seed S]
//
// A run mixes what the engine does: AR steps and verifies of one tree size at a growing prefix
// (the kept rows), a prefill's micro-batches (new rows each), a prefix that shrinks (reset, state
// load), a context's padded slot count moving on, and the graph whose input receives the mask
// rebuilt; checks the host copy and the device mask (sent in part or whole) after every call. With
// --backend cuda the host copy lives in the device's pinned memory and the partial sends are 2-D
// copies. Prints "mask_check: N builds ok (M on kept rows, K of them sent in part)" or the first
// difference, exit code 1.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-cpu.h"
#include "ggml.h"
#ifdef LUCEBOX_WITH_CUDA
#include "ggml-cuda.h"
#endif
#include "layers.hpp"
#include "mask_stage.hpp"

namespace {

ggml_backend_ptr make_backend(const std::string & name) {
    if (name == "cpu") return ggml_backend_ptr(ggml_backend_cpu_init());
#ifdef LUCEBOX_WITH_CUDA
    if (name == "cuda") {
        ggml_backend_ptr be(ggml_backend_cuda_init(0));
        if (!be) throw std::runtime_error("no CUDA device: run on a GPU machine or use --backend cpu");
        return be;
    }
#endif
    throw std::runtime_error("unknown or unbuilt backend '" + name + "': use cpu (or cuda in a CUDA build)");
}

// The mask as the engine wrote it before the stage kept one: every value, from scratch.
std::vector<uint16_t> scratch(int32_t n, int32_t n_kv, int32_t P, const uint8_t * allowed) {
    std::vector<uint16_t> m(size_t(n) * size_t(n_kv), lb::kMaskShut);
    for (int32_t i = 0; i < n; ++i) {
        for (int32_t j = 0; j < P; ++j) m[size_t(i) * size_t(n_kv) + size_t(j)] = lb::kMaskOpen;
        for (int32_t j = 0; j < n; ++j) {
            const bool sees = allowed ? allowed[size_t(i) * size_t(n) + size_t(j)] != 0 : j <= i;
            if (sees) m[size_t(i) * size_t(n_kv) + size_t(P + j)] = lb::kMaskOpen;
        }
    }
    return m;
}

// A random tree of n nodes (parents precede children), as the verify builds `allowed`: ancestors and self
std::vector<uint8_t> random_tree(int32_t n, std::mt19937 & rng) {
    std::vector<uint8_t> allowed(size_t(n) * size_t(n), 0);
    for (int32_t i = 0; i < n; ++i) {
        if (i > 0) {
            const int32_t parent = int32_t(rng() % uint32_t(i));
            for (int32_t j = 0; j < i; ++j) allowed[size_t(i) * size_t(n) + size_t(j)] = allowed[size_t(parent) * size_t(n) + size_t(j)];
        }
        allowed[size_t(i) * size_t(n) + size_t(i)] = 1;
    }
    return allowed;
}

// A graph's mask input as the engine's graph slots hold it: a tensor [n_kv, n] in a compute buffer,
// rebuilt (a new install) when the shape changes. kept: the graph keeps its memory between computes
// (ggml_set_output); otherwise other tensors of the graph overwrite it, as garbage here.
struct Graph {
    ggml_context_ptr ctx;
    ggml_backend_buffer_ptr buf;
    ggml_tensor * mask = nullptr;
    int32_t builds = 0;
    bool kept = true;

    void install(ggml_backend_t backend, int32_t n, int32_t n_kv, bool keep) {
        ggml_init_params ip{ggml_tensor_overhead() * 2, nullptr, true};
        ctx.reset(ggml_init(ip));
        mask = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F16, n_kv, n);
        if (keep) ggml_set_output(mask);
        buf.reset(ggml_backend_alloc_ctx_tensors(ctx.get(), backend));
        if (!buf) throw std::runtime_error("cannot allocate a mask tensor on the backend");
        kept = keep;
        ++builds;
        scribble();
    }
    void scribble() {  // what the compute buffer holds where nothing kept the mask
        std::vector<uint16_t> junk(size_t(ggml_nelements(mask)), 0x1234);
        ggml_backend_tensor_set(mask, junk.data(), 0, ggml_nbytes(mask));
    }
};

int run(int argc, char ** argv) {
    std::string backend_name = "cpu";
    int32_t calls = 2000;
    uint32_t seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if (k == "--backend") backend_name = v;
        else if (k == "--calls") calls = std::stoi(v);
        else if (k == "--seed") seed = uint32_t(std::stoul(v));
        else throw std::runtime_error("unknown option " + k + ": use --backend, --calls, --seed");
    }
    ggml_backend_ptr backend = make_backend(backend_name);
    lb::MaskStage stage;
    Graph graph;
    std::mt19937 rng(seed);
    const int32_t ctx = 4096;  // slots; lb::pad_kv_rows pads a call's need as the engine does
    int32_t P = 0, tree_n = 23, builds = 0, kept = 0, in_part = 0, last_n = 0, last_n_kv = 0, last_P = 0;
    std::vector<uint16_t> got;
    for (int32_t call = 0; call < calls; ++call) {
        const uint32_t kind = rng() % 16;
        int32_t n;
        bool tree = false;
        if (kind == 0) {           // reset or an earlier state: the prefix shrinks
            P = int32_t(rng() % uint32_t(P + 1));
            continue;
        } else if (kind == 1) {    // a prefill micro-batch
            n = 1 + int32_t(rng() % 64);
        } else if (kind == 2) {    // another tree size
            tree_n = 1 + int32_t(rng() % 40);
            continue;
        } else if (kind < 9) {     // an AR step
            n = 1;
        } else {                   // a verify
            n = tree_n;
            tree = true;
        }
        if (P + n > ctx) P = 0;
        const int32_t n_kv = std::min(ctx, lb::pad_kv_rows(P + n));
        // the graph: rebuilt for a new shape, now and then for another reason (a sampling tail) at the same
        // address or not, and one in eight not keeping its mask
        const bool new_shape = !graph.mask || graph.mask->ne[0] != n_kv || graph.mask->ne[1] != n;
        const bool rebuilt = new_shape || rng() % 50 == 0;
        if (rebuilt) {
            if (!new_shape && rng() % 2) {
                ++graph.builds;
                graph.scribble();
            } else {
                graph.install(backend.get(), n, n_kv, rng() % 8 != 0);
            }
        } else if (!graph.kept) {
            graph.scribble();
        }
        const std::vector<uint8_t> allowed = tree ? random_tree(n, rng) : std::vector<uint8_t>();
        const uint8_t * a = tree ? allowed.data() : nullptr;
        const bool same_rows = n == last_n && n_kv == last_n_kv && P >= last_P;
        kept += same_rows;
        in_part += same_rows && !rebuilt && graph.kept;  // what the stage may send as the changed spans alone
        ++builds;
        stage.set(backend.get(), graph.mask, graph.builds, n, n_kv, P, a);
        ggml_backend_synchronize(backend.get());  // the stage queues its copies on the backend's stream (set_input)
        const std::vector<uint16_t> want = scratch(n, n_kv, P, a);
        got.resize(want.size());
        ggml_backend_tensor_get(graph.mask, got.data(), 0, got.size() * sizeof(uint16_t));
        for (int side = 0; side < 2; ++side) {
            const uint16_t * have = side == 0 ? stage.host() : got.data();
            for (size_t e = 0; e < want.size(); ++e) {
                if (have[e] != want[e]) {
                    std::printf("mask_check: FAIL at call %d (n %d, n_kv %d, P %d): the %s mask's row %zu slot %zu is "
                                "0x%04x, not 0x%04x\n", call, n, n_kv, P, side == 0 ? "host" : "device",
                                e / size_t(n_kv), e % size_t(n_kv), unsigned(have[e]), unsigned(want[e]));
                    return 1;
                }
            }
        }
        last_n = n;
        last_n_kv = n_kv;
        last_P = P;
        // what the call commits: a chain all of it, a verify an accepted path of 1..depth tokens
        P += tree ? 1 + int32_t(rng() % uint32_t(std::min(n, 9))) : n;
    }
    std::printf("mask_check: %d builds ok (%d on kept rows, %d of them sent in part)\n", builds, kept, in_part);
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception & e) {
        std::fprintf(stderr, "mask_check: %s\n", e.what());
        return 2;
    }
}
