// Would the draft's BF16 products run faster with k split over more blocks? ggml's mmf kernel (mul_mat_f, the one
// batch-invariant mode gives every BF16 product) takes 32 rows a block, so the 27B-shaped draft's 5120-row matrices
// (o, down, the feature projection fc) launch 160 blocks and qkv 192 on 132 SMs: about one wave, unevenly spread. This
// probe runs that kernel as ggml launches it, then with k cut into S equal pieces (S blocks a row tile, each a
// partial sum through the kernel's own sample stride, then a pass adding the S pieces in order: a column's bits
// still come from the shape alone), on the draft's shapes at 16 columns (a draft block) and 1 column (a committed
// token's fc and K|V), the weights cycled over 1 GiB so that they come from DRAM as in the engine.
// With -DPROBE_WIDE_BLOCKS it also runs 64 and 128 rows a block (fewer blocks, each reading the activations for more
// rows), first checking that they give the 32-row bits; ggml's kernel has device code for 32 rows only, so that build
// needs mmf.cuh's `rows_per_block != MMF_ROWS_PER_BLOCK` guard of the NVIDIA path relaxed to "not a multiple of it"
// in the materialized tree (the fifty-first session did so for one run, then materialized again).
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I vendor/src/ggml/include -I vendor/src/ggml/src \
//        -I vendor/src/ggml/src/ggml-cuda benchmarks/kernels/mmf_split_probe.cu -o mmf_split_probe
#include "mmf.cuh"
#include "probe_common.cuh"

#include <cstdio>
#include <cstring>
#include <vector>

constexpr int kWarp = 32;
constexpr size_t kPool = size_t(1) << 30;  // weights cycled over 1 GiB
#ifdef PROBE_WIDE_BLOCKS
constexpr bool kWideBlocks = true;  // 64 and 128 rows a block too (see the header)
#else
constexpr bool kWideBlocks = false;
#endif

// dst[j][r] = sum over s of part[s][j][r], s in order
__global__ void add_pieces(const float * part, float * dst, int m, int n, int S) {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= int64_t(m) * n) return;
    float sum = part[i];
    for (int s = 1; s < S; ++s) sum += part[int64_t(s) * m * n + i];
    dst[i] = sum;
}

// nwarps as mul_mat_f_cuda picks it: the fewest k iterations, the fewest warps among ties
int pick_warps(int64_t pairs) {
    int best = 1;
    int64_t niter_best = (pairs + kWarp * 2 - 1) / (kWarp * 2);
    for (int nw = 2; nw <= 8; ++nw) {
        const int64_t niter = (pairs + nw * kWarp * 2 - 1) / (nw * kWarp * 2);
        if (niter < niter_best) { niter_best = niter; best = nw; }
    }
    return best;
}

template <int ROWS, int COLS, int NW>
void launch(const nv_bfloat162 * w, const float * x, float * dst, int64_t m, int64_t pairs, int S, cudaStream_t st) {
    const int64_t len = pairs / S;  // pairs a piece
    const int smem_iter = NW * 16 * (kWarp + 4) * 4;
    const int smem_comb = ((COLS + 7) / 8 * 8) * (NW * ROWS + 4) * 4;
    const int smem = std::max(smem_iter, smem_comb);
    static bool attr = false;
    if (!attr) {
        CHECK(cudaFuncSetAttribute(mul_mat_f<nv_bfloat162, ROWS, COLS, NW, false>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
        attr = true;
    }
    const dim3 grid(m / ROWS, 1, S), block(kWarp, NW, 1);
    // the sample index is the piece: x and y move by the piece's k, dst by a [COLS][m] plane
    mul_mat_f<nv_bfloat162, ROWS, COLS, NW, false><<<grid, block, smem, st>>>(
        w, x, nullptr, dst, int(len), COLS, 1, int(pairs), int(pairs), int(m), 0, 0,
        1, 0, 0, 0, 1, int(len), int(2 * len), int(COLS * m));
}

template <int ROWS, int COLS>
double time_shape(nv_bfloat162 * pool, const float * x, float * part, float * dst, int64_t m, int64_t k, int S) {
    const int64_t pairs = k / 2, bytes = m * k * 2;
    const int nw = pick_warps(pairs / S);
    const int64_t copies = std::max<int64_t>(1, int64_t(kPool) / bytes);
    return time_back_to_back_us([&](int i) {
        const nv_bfloat162 * w = pool + (int64_t(i) % copies) * (bytes / 4);
        float * out = S == 1 ? dst : part;
        switch (nw) {
            case 8: launch<ROWS, COLS, 8>(w, x, out, m, pairs, S, 0); break;
            case 4: launch<ROWS, COLS, 4>(w, x, out, m, pairs, S, 0); break;
            case 5: launch<ROWS, COLS, 5>(w, x, out, m, pairs, S, 0); break;
            case 6: launch<ROWS, COLS, 6>(w, x, out, m, pairs, S, 0); break;
            case 7: launch<ROWS, COLS, 7>(w, x, out, m, pairs, S, 0); break;
            default: fprintf(stderr, "nwarps %d not built\n", nw); exit(1);
        }
        if (S > 1) add_pieces<<<(m * COLS + 255) / 256, 256>>>(part, dst, int(m), COLS, S);
    }, 5, 60);
}

int main() {
    nv_bfloat162 * pool;
    float * x, * part, * dst;
    CHECK(cudaMalloc(&pool, kPool));
    CHECK(cudaMemset(pool, 0x3c, kPool));
    CHECK(cudaMalloc(&x, sizeof(float) * 16 * 25600));
    {
        std::vector<float> hx(16 * 25600);
        for (size_t i = 0; i < hx.size(); ++i) hx[i] = 0.01f * float(int(i * 2654435761u % 201) - 100);
        CHECK(cudaMemcpy(x, hx.data(), sizeof(float) * hx.size(), cudaMemcpyHostToDevice));
    }
    CHECK(cudaMalloc(&part, sizeof(float) * 8 * 16 * 34816));
    CHECK(cudaMalloc(&dst, sizeof(float) * 16 * 34816));
    const double copy = copy_gbs();
    int nsm = 0;
    CHECK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    printf("copy %.0f GB/s, %d SMs; mul_mat_f<bf16, 32 rows, cols, nwarps> as ggml launches it (S 1) and with k in S "
           "pieces plus their sum\n", copy, nsm);
    // 64 or 128 rows a block: each element the same chain of MMAs and the same sum over warps, so the same bits
    if (kWideBlocks) {
        const int64_t m = 5120, k = 4096;
        std::vector<uint16_t> hw(m * k);  // bf16 bits: varied signs and exponents
        for (size_t i = 0; i < hw.size(); ++i) {
            hw[i] = uint16_t(0x3a00 + (i * 2246822519u >> 7) % 0x0600) | uint16_t((i & 1) << 15);
        }
        CHECK(cudaMemcpy(pool, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
        std::vector<float> r32(16 * m), r(16 * m);
        launch<32, 16, 8>(pool, x, dst, m, k / 2, 1, 0);
        CHECK(cudaMemcpy(r32.data(), dst, sizeof(float) * r32.size(), cudaMemcpyDeviceToHost));
        for (int rows : {64, 128}) {
            CHECK(cudaMemset(dst, 0, sizeof(float) * r.size()));
            if (rows == 64) launch<64, 16, 8>(pool, x, dst, m, k / 2, 1, 0);
            else launch<128, 16, 8>(pool, x, dst, m, k / 2, 1, 0);
            CHECK(cudaMemcpy(r.data(), dst, sizeof(float) * r.size(), cudaMemcpyDeviceToHost));
            printf("%d rows a block against 32: %s\n", rows,
                   memcmp(r.data(), r32.data(), sizeof(float) * r.size()) == 0 ? "same bits" : "DIFFERENT");
        }
    }
    printf("| matrix | rows x k | columns | rows a block | S | blocks | us | GB/s | %% of copy |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    struct Shape { const char * name; int64_t m, k; };
    const Shape shapes[] = { {"o", 5120, 4096}, {"qkv", 6144, 5120}, {"gate|up", 34816, 5120}, {"down", 5120, 17408},
                             {"fc", 5120, 25600}, {"k|v", 2048, 5120} };
    for (const Shape & s : shapes) {
        for (int cols : {16, 1}) {
            if (cols == 1 && s.m != 5120 && s.m != 2048) continue;
            for (int rows : {32, 64, 128}) {
                for (int S : {1, 2, 4}) {
                    const int64_t pairs = s.k / 2;
                    if (pairs % S != 0 || pairs / S < 256 || (rows != 32 && (S > 2 || !kWideBlocks))) continue;
                    double us = 0;
                    if (cols == 16) {
                        us = rows == 32 ? time_shape<32, 16>(pool, x, part, dst, s.m, s.k, S)
                           : rows == 64 ? time_shape<64, 16>(pool, x, part, dst, s.m, s.k, S)
                                        : time_shape<128, 16>(pool, x, part, dst, s.m, s.k, S);
                    } else {
                        us = rows == 32 ? time_shape<32, 1>(pool, x, part, dst, s.m, s.k, S)
                           : rows == 64 ? time_shape<64, 1>(pool, x, part, dst, s.m, s.k, S)
                                        : time_shape<128, 1>(pool, x, part, dst, s.m, s.k, S);
                    }
                    const double gbs = s.m * s.k * 2 / (us * 1e3);
                    printf("| %s | %lld x %lld | %d | %d | %d | %lld | %.1f | %.0f | %.0f%% |\n", s.name,
                           (long long) s.m, (long long) s.k, cols, rows, S, (long long) (s.m / rows * S), us, gbs,
                           100 * gbs / copy);
                }
            }
        }
    }
    return 0;
}
