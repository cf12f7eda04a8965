// mul_mat_check: mat-mul on the CUDA backend against the CPU backend, at the column counts of a decode
// step (1), of verify trees (2..32) and of prefill micro-batches (up to 300: several launches of column
// groups), for the weight types patch 0006's small-batch kernel takes (Q4_K, Q6_K) and others ggml runs
// (Q8_0, F16, BF16: BF16 at a shape the tensor-core mmf kernel takes and one it does not; in invariant mode
// patch 0075's bf16s takes all three, up to 300 columns), with contiguous and strided activations.
//   mul_mat_check              prints one line per case; exit 1 if any result is off
//   mul_mat_check invariant    batch-invariant mode (patch 0009) on, and every column must compute to the
//                              same bits alone and inside any batch (a one-token step == a verify batch
//                              == a prefill micro-batch)
#include "compute_once.hpp"
#include "ggml-cpu.h"
#ifdef LUCEBOX_WITH_CUDA
#include "ggml-cuda.h"
#endif

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int kMaxCols = 300;

struct Case {
    ggml_type type;
    int64_t k, m;
};

// y = W x for the first n columns of x (a view with row stride x_stride floats); returns [n][m]
std::vector<float> mul_mat(ggml_backend_t backend, const Case & c, const std::vector<uint8_t> & w_bytes,
                           const std::vector<float> & x, int64_t x_stride, int n) {
    ggml_init_params ip = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    const ggml_context_ptr owned(ggml_init(ip));
    ggml_context * ctx = owned.get();
    ggml_tensor * w = ggml_new_tensor_2d(ctx, c.type, c.k, c.m);
    ggml_tensor * xs = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, x_stride, kMaxCols);
    ggml_tensor * xv = ggml_view_2d(ctx, xs, c.k, n, xs->nb[1], 0);
    ggml_tensor * y = ggml_mul_mat(ctx, w, xv);
    ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, y);
    std::vector<float> out(size_t(n * c.m));
    compute_once(backend, ctx, g, {{w, w_bytes.data()}, {xs, x.data()}}, y, out.data());
    return out;
}

}  // namespace

int main(int argc, char ** argv) {
#ifndef LUCEBOX_WITH_CUDA
    (void) argc;
    (void) argv;
    std::fprintf(stderr, "mul_mat_check: this build has no CUDA (configure with -DLUCEBOX_CUDA=ON)\n");
    return 2;
#else
    const bool invariant = argc > 1 && std::strcmp(argv[1], "invariant") == 0;
    ggml_backend_cuda_set_batch_invariant(invariant);
    const CpuAndCuda backends = cpu_and_cuda("mul_mat_check");
    ggml_backend_t cpu = backends.cpu.get(), cuda = backends.cuda.get();
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int bad = 0;
    const Case cases[] = {{GGML_TYPE_Q4_K, 5120, 600}, {GGML_TYPE_Q6_K, 1024, 9000}, {GGML_TYPE_Q4_K, 256, 64},
                          {GGML_TYPE_Q8_0, 1024, 300}, {GGML_TYPE_F16, 512, 200}, {GGML_TYPE_BF16, 512, 200},
                          {GGML_TYPE_BF16, 2560, 256},
                          // BF16 on patch 0075's bf16s in invariant mode (64-row tiles of 128-value units; an H100
                          // or H200 deals them to 264 workers; past 64 columns a FOLD launch): 33 tiles of 33 units,
                          // ranges that cross tiles; 320 tiles of 4 units, whole tiles inside ranges; 1040 tiles of
                          // one unit, more (group, tile) ticket counters at 49..64 columns than a stream has, so
                          // launches of 16 columns
                          {GGML_TYPE_BF16, 4224, 2112}, {GGML_TYPE_BF16, 512, 20480}, {GGML_TYPE_BF16, 128, 66560},
                          // 66 row tiles at k split 2: launches of 257 and 300 columns fold the splits in their blocks
                          {GGML_TYPE_Q4_K, 2048, 8448},
                          // 132 row tiles at k split 2: on an H100 launches of 257 and 300 columns run wide (8 n-tiles a
                          // block) and fold, those of 100 fold at 4 n-tiles
                          {GGML_TYPE_Q4_K, 2048, 16896},
                          // 40 row tiles at k split 6: on an H100 launches of 257 and 300 columns run at 8 n-tiles with
                          // their splits through memory (lbq's wide_apart)
                          {GGML_TYPE_Q4_K, 6144, 5120},
                          // Q6_K, 132 row tiles at k split 2: on an H100 launches of 257 and 300 columns run wide (6
                          // n-tiles a block) and fold, those of 100 run wide with their splits through memory
                          {GGML_TYPE_Q6_K, 2048, 16896}};
    for (const Case & c : cases) {
        std::vector<float> wf(size_t(c.k * c.m));
        for (float & v : wf) v = nd(rng) / std::sqrt(float(c.k));
        std::vector<uint8_t> wq(ggml_row_size(c.type, c.k) * c.m);
        ggml_quantize_chunk(c.type, wf.data(), wq.data(), 0, c.m, c.k, nullptr);
        for (int64_t x_stride : {c.k, c.k + 64}) {
            std::vector<float> x(size_t(x_stride * kMaxCols));
            for (float & v : x) v = nd(rng);
            // up to kMaxCols columns for the K-quant and BF16 kernels (several launches of column groups; BF16's
            // prefill launches), 64 for the rest
            const bool wide = (ggml_is_quantized(c.type) && c.type != GGML_TYPE_Q8_0) || c.type == GGML_TYPE_BF16;
            const int n_max = wide ? kMaxCols : 64;
            // each column's product alone (invariant mode): column j moved to column 0 of a copy
            std::vector<std::vector<float>> alone;
            if (invariant) {
                for (int j = 0; j < n_max; ++j) {
                    std::vector<float> xj(x);
                    std::copy(x.begin() + j * x_stride, x.begin() + (j + 1) * x_stride, xj.begin());
                    alone.push_back(mul_mat(cuda, c, wq, xj, x_stride, 1));
                }
            }
            for (int n : {1, 2, 8, 9, 16, 17, 23, 32, 33, 64, 100, 257, 300}) {
                if (n > n_max) continue;
                const std::vector<float> ref = mul_mat(cpu, c, wq, x, x_stride, n);
                const std::vector<float> got = mul_mat(cuda, c, wq, x, x_stride, n);
                double num = 0, den = 0;
                bool finite = true;
                for (size_t i = 0; i < ref.size(); ++i) {
                    num += double(got[i] - ref[i]) * (got[i] - ref[i]);
                    den += double(ref[i]) * ref[i];
                    finite = finite && std::isfinite(got[i]);
                }
                const double rel = std::sqrt(num / den);
                int differ = 0;  // columns whose bits differ from the column alone
                for (int j = 0; invariant && j < n; ++j) {
                    differ += std::memcmp(alone[size_t(j)].data(), got.data() + size_t(j) * c.m, size_t(c.m) * sizeof(float)) != 0;
                }
                const bool same = differ == 0;
                // the CPU quantizes activations to 8 bits, the GPU to 8 bits (mmvq, mmq), f16 (lbq) or bf16 (mmf,
                // bf16s)
                // (and for all n, every column: a one-column product's bits, in invariant mode)
                const bool ok = finite && rel < 2e-2 && (!invariant || same);
                bad += !ok;
                std::printf("%s k=%lld m=%lld stride=%lld n=%3d: rel L2 vs cpu %.2e, columns differing from alone: %d %s\n",
                            ggml_type_name(c.type), (long long)c.k, (long long)c.m, (long long)x_stride, n, rel,
                            differ, ok ? "ok" : "FAIL");
            }
        }
    }
    std::printf("%s\n", bad ? "FAILED" : "all ok");
    return bad ? 1 : 0;
#endif
}
