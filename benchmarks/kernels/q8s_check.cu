// Checks and times ggml-cuda's q8s (lucebox patch 0076, q8s-kernels.cuh): Q8_0 products on 8-bit integer MMAs, on
// matrices stored for them (store_matrix), as ggml_cuda_mul_mat_q8s launches them (groups of up to 24 columns):
//   - accuracy: within 1e-5 of a float64 product of the same 8-bit weights and 8-bit activations (as the first pass
//     left them for the column alone; relative to the sum of |terms|), for the whole matrix and for a range of its
//     strips (a stacked matrix's member);
//   - batch invariance: each column alone == among 8, 16, 23, 24 and 40 (two launches), bit for bit;
//   - time: back to back (dependent launch on Hopper), the weights cycled over 1 GiB, the 27B-shaped draft's matrices
//     at 16 columns (a proposal) and one (a committed token).
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -use_fast_math -I vendor/src/ggml/include \
//        -I vendor/src/ggml/src -I vendor/src/ggml/src/ggml-cuda benchmarks/kernels/q8s_check.cu -o q8s_check
#include "q8s-kernels.cuh"
#include "ggml_cuda_links.cuh"
#include "probe_common.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>


// A matrix stored for q8s and its scratch, multiplied as ggml_cuda_mul_mat_q8s does (rows row0.. of m of the whole)
struct Q8s {
    Q8s(const uint8_t * stored, int64_t m_whole, int64_t row0, int m, int k, int nsm)
        : p(q8s::plan(m, k, nsm)) {
        q8s::matrix_parts(stored, m_whole, k, row0, &wq, &wd);
        CHECK(cudaMalloc(&xq, q8s::xq_bytes(k)));
        CHECK(cudaMalloc(&xd, q8s::xd_floats(k) * sizeof(float)));
        CHECK(cudaMalloc(&part, std::max<size_t>(1, q8s::part_floats(p)) * sizeof(float)));
    }
    ~Q8s() {
        cudaFree(xq);
        cudaFree(xd);
        cudaFree(part);
    }
    void operator()(const float * x, int64_t ldx, int n, float * y, int64_t ldy) const {
        for (int c0 = 0; c0 < n; c0 += q8s::kMaxCols) {
            q8s::launch(p, wq, wd, x + c0 * ldx, ldx, std::min(q8s::kMaxCols, n - c0), y + c0 * ldy, ldy, xq, xd, part,
                        true, 0);
        }
    }
    // the first pass's values of the last launch's first column: its k 8-bit values, a scale per 32
    void first_column(int k, std::vector<int> & q, std::vector<float> & d) const {
        std::vector<int8_t> bq(q8s::xq_bytes(k));
        std::vector<float> bd(q8s::xd_floats(k));
        CHECK(cudaMemcpy(bq.data(), xq, bq.size(), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(bd.data(), xd, bd.size() * sizeof(float), cudaMemcpyDeviceToHost));
        q.resize(k);
        d.resize(k / 32);
        for (int qb = 0; qb < k / 32; ++qb) {
            d[qb] = bd[size_t(qb) * q8s::kMaxNT * 8];  // n-tile 0, t 0, column 0
            for (int i = 0; i < 32; ++i) {  // column 0's lanes: t = (i % 16) / 4, register i / 16
                q[qb * 32 + i] = bq[(size_t(qb) * q8s::kMaxNT * 32 + (i % 16) / 4) * 8 + (i / 16) * 4 + i % 4];
            }
        }
    }
    q8s::Plan p;
    const uint4 * wq, * wd;
    uint8_t * xq;
    float * xd, * part;
};

int main() {
    int nsm = 0;
    CHECK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    const size_t pool_bytes = size_t(1) << 30;
    uint8_t * pool, * rows;
    float * x, * y, * y1;
    CHECK(cudaMalloc(&pool, pool_bytes));
    CHECK(cudaMalloc(&rows, 200u << 20));
    CHECK(cudaMalloc(&x, sizeof(float) * 40 * 25600));
    CHECK(cudaMalloc(&y, sizeof(float) * 40 * 34816));
    CHECK(cudaMalloc(&y1, sizeof(float) * 34816));
    std::vector<float> hx(size_t(40) * 25600);
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = 0.01f * float(int(i * 2246822519u % 401) - 200);
    CHECK(cudaMemcpy(x, hx.data(), sizeof(float) * hx.size(), cudaMemcpyHostToDevice));
    const double copy = copy_gbs();
    printf("copy %.0f GB/s, %d SMs\n", copy, nsm);
    auto fetch = [](const float * d, int64_t count) {
        std::vector<float> h(count);
        CHECK(cudaMemcpy(h.data(), d, count * 4, cudaMemcpyDeviceToHost));
        return h;
    };

    struct Shape { const char * name; int m, k; };
    const Shape shapes[] = { {"o", 5120, 4096}, {"qkv", 6144, 5120}, {"gate|up", 34816, 5120}, {"down", 5120, 17408},
                             {"fc", 5120, 25600}, {"small", 48, 512} };
    bool ok = true;
    for (const Shape & s : shapes) {
        // ggml's Q8_0 rows of a random matrix, stored for q8s into the pool
        const int n_qb = s.k / 32;
        std::vector<block_q8_0> hb(size_t(s.m) * n_qb);
        for (size_t i = 0; i < hb.size(); ++i) {
            hb[i].d = __float2half(1e-3f * float(1 + (i * 40503u) % 97));
            for (int v = 0; v < 32; ++v) hb[i].qs[v] = int8_t(int(((i * 32 + v) * 2654435761u) >> 7 & 0xff) - 128 | 1);
        }
        const size_t bytes = hb.size() * sizeof(block_q8_0);
        CHECK(cudaMemcpy(rows, hb.data(), bytes, cudaMemcpyHostToDevice));
        const int64_t qbs = int64_t(s.m) * n_qb;
        q8s::store_matrix<<<unsigned((qbs + 255) / 256), 256>>>(rows, int64_t(n_qb) * sizeof(block_q8_0), s.m, s.k,
                                                                pool);
        CHECK(cudaDeviceSynchronize());
        const Q8s whole(pool, s.m, 0, s.m, s.k, nsm);
        // every column of 40 alone (its first pass's values kept for the reference), then among others
        bool same = true;
        std::vector<std::vector<float>> alone(40), dx(40);
        std::vector<std::vector<int>> qx(40);
        for (int c = 0; c < 40; ++c) {
            whole(x + int64_t(c) * s.k, s.k, 1, y1, s.m);
            alone[c] = fetch(y1, s.m);
            whole.first_column(s.k, qx[c], dx[c]);
        }
        auto reference = [&](int r, int c, double & mag) {
            double ref = 0.0;
            mag = 0.0;
            for (int b = 0; b < n_qb; ++b) {
                int64_t isum = 0;
                for (int i = 0; i < 32; ++i) isum += int64_t(hb[size_t(r) * n_qb + b].qs[i]) * qx[c][b * 32 + i];
                const double term = double(__half2float(hb[size_t(r) * n_qb + b].d)) * dx[c][b] * double(isum);
                ref += term;
                mag += std::fabs(term);
            }
            return ref;
        };
        for (int n : {8, 16, 23, 24, 40}) {
            whole(x, s.k, n, y, s.m);
            const std::vector<float> got = fetch(y, int64_t(n) * s.m);
            for (int c = 0; c < n; ++c) {
                same = same && memcmp(alone[c].data(), got.data() + size_t(c) * s.m, s.m * 4) == 0;
            }
        }
        double worst = 0.0;
        const int step = s.m > 1024 ? 37 : 1;
        for (int c = 0; c < 40; c += 7) {
            for (int r = c % step; r < s.m; r += step) {
                double mag;
                const double ref = reference(r, c, mag);
                worst = std::max(worst, std::fabs(double(alone[c][r]) - ref) / (mag + 1e-30));
            }
        }
        // a member of a stack: rows [16, m - 16) as a range of strips
        double worst_view = 0.0;
        if (s.m >= 48) {
            const int row0 = 16, m = s.m - 32;
            const Q8s member(pool, s.m, row0, m, s.k, nsm);
            member(x, s.k, 16, y, m);
            const std::vector<float> got = fetch(y, int64_t(16) * m);
            for (int c = 0; c < 16; c += 5) {
                for (int r = c % step; r < m; r += step) {
                    double mag;
                    const double ref = reference(row0 + r, c, mag);
                    worst_view = std::max(worst_view, std::fabs(double(got[size_t(c) * m + r]) - ref) / (mag + 1e-30));
                }
            }
        }
        const bool good = same && worst < 1e-5 && worst_view < 1e-5;
        ok = ok && good;
        printf("check %s %d x %d: max |err| / sum |terms| %.2e, rows 16..m-16 as a member %.2e; a column alone == "
               "among 8, 16, 23, 24, 40: %s; %s\n", s.name, s.m, s.k, worst, worst_view,
               same ? "same bits" : "DIFFERENT", good ? "ok" : "FAIL");
        if (s.m < 1024) continue;
        const int64_t copies = std::max<int64_t>(1, int64_t(pool_bytes / bytes));
        for (int i = 1; i < copies; ++i) CHECK(cudaMemcpy(pool + i * bytes, pool, bytes, cudaMemcpyDeviceToDevice));
        std::vector<const Q8s *> runs;
        for (int i = 0; i < copies; ++i) runs.push_back(new Q8s(pool + i * bytes, s.m, 0, s.m, s.k, nsm));
        for (int n : {16, 1}) {
            const double us = time_back_to_back_us([&](int i) { (*runs[i % copies])(x, s.k, n, y, s.m); }, 5, 50);
            printf("| %s | %d x %d | %d | %.1f us | %.0f%% of copy |\n", s.name, s.m, s.k, n, us,
                   100.0 * bytes / (us * 1e3) / copy);
        }
        for (const Q8s * r : runs) delete r;
    }
    printf("%s\n", ok ? "all ok" : "FAIL");
    return ok ? 0 : 1;
}
