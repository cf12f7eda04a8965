// mask_check: the engine's mask stage (native/src/mask_stage.hpp), which rewrites a kept mask only
// where it changed, against masks written from scratch, over random runs of calls, for the tests
// (tests/test_mask_stage.py).
//
//   mask_check [--backend cpu|cuda] [--calls N] [--seed S]
//
// A run mixes what the engine does: AR steps and verifies of one tree size at a growing prefix
// (the kept rows), a prefill's micro-batches (new rows each), a prefix that shrinks (reset, state
// load) and a context's padded slot count moving on. With --backend cuda the mask lives in the
// device's pinned host memory. Prints "mask_check: N builds ok (M on kept rows)" or the first
// difference, exit code 1.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-cpu.h"
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
    std::mt19937 rng(seed);
    const int32_t ctx = 4096;  // slots; lb::pad_kv_rows pads a call's need as the engine does
    int32_t P = 0, tree_n = 23, builds = 0, kept = 0, last_n = 0, last_n_kv = 0, last_P = 0;
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
        const std::vector<uint8_t> allowed = tree ? random_tree(n, rng) : std::vector<uint8_t>();
        const uint8_t * a = tree ? allowed.data() : nullptr;
        kept += n == last_n && n_kv == last_n_kv && P >= last_P;
        ++builds;
        const uint16_t * got = stage.build(backend.get(), n, n_kv, P, a);
        const std::vector<uint16_t> want = scratch(n, n_kv, P, a);
        for (size_t e = 0; e < want.size(); ++e) {
            if (got[e] != want[e]) {
                std::printf("mask_check: FAIL at call %d (n %d, n_kv %d, P %d): row %zu slot %zu is 0x%04x, not 0x%04x\n",
                            call, n, n_kv, P, e / size_t(n_kv), e % size_t(n_kv), unsigned(got[e]), unsigned(want[e]));
                return 1;
            }
        }
        last_n = n;
        last_n_kv = n_kv;
        last_P = P;
        // what the call commits: a chain all of it, a verify an accepted path of 1..depth tokens
        P += tree ? 1 + int32_t(rng() % uint32_t(std::min(n, 9))) : n;
    }
    std::printf("mask_check: %d builds ok (%d on kept rows)\n", builds, kept);
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
