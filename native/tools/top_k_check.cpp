// top_k_check: ggml_top_k on the CUDA backend against the CPU backend, at the draft's shape (the 8
// best of a 248K vocabulary for each of 15 block positions) and around the edges of patch 0007's
// selection kernel (one part or many, k up to 32, ties, -inf entries, a row shorter than a part).
//   top_k_check            prints one line per case; exit 1 if any result is off
// A case is right when both backends pick entries of the same values (ties may pick other columns
// of the same value) and every picked column holds the value it claims.
#include "compute_once.hpp"
#include "ggml-cpu.h"
#ifdef LUCEBOX_WITH_CUDA
#include "ggml-cuda.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

struct Case {
    int64_t n_cols, n_rows;
    int k;
    const char * data;  // "normal", "ties" (values from a handful of levels), "neg_inf" (mostly -inf)
};

std::vector<int32_t> top_k(ggml_backend_t backend, const Case & c, const std::vector<float> & x) {
    ggml_init_params ip = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    const ggml_context_ptr owned(ggml_init(ip));
    ggml_context * ctx = owned.get();
    ggml_tensor * a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.n_cols, c.n_rows);
    ggml_tensor * sel = ggml_top_k(ctx, a, c.k);
    ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, sel);
    std::vector<int32_t> out(size_t(c.k * c.n_rows));
    compute_once(backend, ctx, g, {{a, x.data()}}, sel, out.data());
    return out;
}

}  // namespace

int main() {
#ifndef LUCEBOX_WITH_CUDA
    std::fprintf(stderr, "top_k_check: this build has no CUDA (configure with -DLUCEBOX_CUDA=ON)\n");
    return 2;
#else
    const CpuAndCuda backends = cpu_and_cuda("top_k_check");
    ggml_backend_t cpu = backends.cpu.get(), cuda = backends.cuda.get();
    const Case cases[] = {
        {248320, 15, 8, "normal"}, {248320, 15, 1, "normal"}, {248320, 15, 32, "normal"}, {248320, 3, 8, "ties"},
        {248320, 2, 8, "neg_inf"}, {8193, 4, 16, "normal"}, {1000, 5, 8, "normal"}, {1000, 5, 8, "ties"},
        {40, 3, 32, "normal"},   {8, 2, 8, "normal"},      {300000, 1, 20, "normal"},
    };
    std::mt19937 rng(11);
    int bad = 0;
    for (const Case & c : cases) {
        std::vector<float> x(size_t(c.n_cols * c.n_rows));
        std::normal_distribution<float> nd(0.0f, 3.0f);
        std::uniform_int_distribution<int> level(0, 5), rare(0, 999);
        for (float & v : x) {
            if (c.data[0] == 't') v = float(level(rng));
            else if (c.data[0] == 'n' && c.data[1] == 'e') v = rare(rng) < 2 ? nd(rng) : -INFINITY;
            else v = nd(rng);
        }
        const std::vector<int32_t> want = top_k(cpu, c, x), got = top_k(cuda, c, x);
        bool ok = true;
        for (int64_t r = 0; r < c.n_rows && ok; ++r) {
            std::vector<float> vw, vg;
            std::vector<int32_t> ids;
            for (int j = 0; j < c.k; ++j) {
                const int32_t iw = want[size_t(r * c.k + j)], ig = got[size_t(r * c.k + j)];
                if (ig < 0 || ig >= c.n_cols) {
                    ok = false;
                    break;
                }
                vw.push_back(x[size_t(r * c.n_cols + iw)]);
                vg.push_back(x[size_t(r * c.n_cols + ig)]);
                ids.push_back(ig);
            }
            if (!ok) break;
            std::sort(vw.begin(), vw.end());
            std::sort(vg.begin(), vg.end());
            std::sort(ids.begin(), ids.end());
            // same values picked; no column twice (unless the row has fewer real entries than k)
            ok = vw == vg && (std::adjacent_find(ids.begin(), ids.end()) == ids.end() || c.n_cols < c.k);
        }
        bad += !ok;
        std::printf("top_k %6lld x %2lld, k %2d, %-7s: %s\n", (long long) c.n_cols, (long long) c.n_rows, c.k, c.data,
                    ok ? "ok" : "FAIL");
    }
    std::printf(bad ? "FAILED: %d cases\n" : "all ok\n", bad);
    return bad ? 1 : 0;
#endif
}
