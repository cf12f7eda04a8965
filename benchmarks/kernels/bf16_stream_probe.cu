// Checks and times ggml-cuda's bf16s (lucebox patch 0075, bf16s-kernels.cuh: batch-invariant BF16 products streaming
// the weights) on the 27B-shaped draft's matrices against ggml's mmf, which batch-invariant mode gave them before:
//   - accuracy: within 1e-5 of a float64 product of the bf16-rounded inputs (relative to the sum of |terms|), at 16
//     columns (a draft block) and one (a committed token), mmf's error beside it;
//   - batch invariance: a column alone == the same column among 16 (one split launch), among 64 (4 column groups) and
//     among 512 (a prefill micro-batch: FOLD), bit for bit;
//   - time: back to back (ggml_cuda_kernel_launch: dependent launch on Hopper), the weights cycled over 1 GiB (from
//     DRAM, as in the engine), at 16 and 1 columns against mmf as batch-invariant mode launched it, and at 512 against
//     mmf's grouped launch (patch 0017).
// The fifty-first session's probe (git history: its own copy of the kernel, with f32-staged variants) measured the
// split product alone at 6-23% under mmf at 16 columns; this one measures the patch's launches, passes included.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I vendor/src/ggml/include -I vendor/src/ggml/src \
//        -I vendor/src/ggml/src/ggml-cuda benchmarks/kernels/bf16_stream_probe.cu -o bf16_stream_probe
#include "bf16s-kernels.cuh"
#include "mmf.cuh"
#include "ggml_cuda_links.cuh"
#include "probe_common.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>


constexpr size_t kPool = size_t(1) << 30;
constexpr int kPrefillCols = 512;  // a prefill micro-batch's draft append

// bf16s as ggml_cuda_mul_mat_bf16s runs it (one launch: at most kMaxLaunchN columns), with its scratch
struct Bf16s {
    Bf16s(int m, int k, int nsm) : m(m), k(k), p(bf16s::plan(m, k, nsm)) {
        CHECK(cudaMalloc(&xb, sizeof(__nv_bfloat16) * bf16s::xb_values(k, kPrefillCols)));
        CHECK(cudaMalloc(&part, sizeof(float) * std::max<int64_t>(1, bf16s::part_floats(p, bf16s::kMaxSplitN))));
        CHECK(cudaMalloc(&tickets, sizeof(unsigned) * lbq::kTicketSlots));
        CHECK(cudaMemset(tickets, 0, sizeof(unsigned) * lbq::kTicketSlots));
    }
    ~Bf16s() {
        cudaFree(xb);
        cudaFree(part);
        cudaFree(tickets);
    }
    void operator()(const __nv_bfloat16 * w, const float * x, int n, float * y) const {
        bf16s::launch(p, w, k, m, k, x, k, n, xb, y, m, part, tickets, /*weights_early =*/ true, 0);
    }
    int m, k;
    bf16s::Plan p;
    __nv_bfloat16 * xb = nullptr;
    float * part = nullptr;
    unsigned * tickets = nullptr;
};

template <int COLS>
void mmf_launch(const nv_bfloat162 * w, const float * x, float * dst, int64_t m, int64_t k) {
    constexpr int NW = 8;
    const int smem = std::max(NW * 16 * (32 + 4) * 4, ((COLS + 7) / 8 * 8) * (NW * 32 + 4) * 4);
    mul_mat_f<nv_bfloat162, 32, COLS, NW, false><<<dim3(m / 32, 1, 1), dim3(32, NW, 1), smem>>>(
        w, x, nullptr, dst, int(k / 2), COLS, 1, int(k / 2), int(k / 2), int(m), 0, 0, 1, 0, 0, 0, 1, 0, 0, 0);
}

// mmf as batch-invariant mode launches a prefill's whole 16-column groups: a group a grid channel, the weights shared
void mmf_groups(const nv_bfloat162 * w, const float * x, float * dst, int64_t m, int64_t k, int groups) {
    constexpr int NW = 8;
    const int smem = std::max(NW * 16 * (32 + 4) * 4, 16 * (NW * 32 + 4) * 4);
    mul_mat_f<nv_bfloat162, 32, 16, NW, false><<<dim3(m / 32, groups, 1), dim3(32, NW, 1), smem>>>(
        w, x, nullptr, dst, int(k / 2), 16, groups, int(k / 2), int(k / 2), int(m), 0, 0, groups, 0, int(16 * k),
        int(16 * m), 1, 0, 0, 0);
}

static float bf16_round(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&v, &u, 4);
    return v;
}

int main() {
    int nsm = 0;
    CHECK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    uint16_t * pool;
    float * x, * y, * y2;
    CHECK(cudaMalloc(&pool, kPool));
    CHECK(cudaMalloc(&x, sizeof(float) * kPrefillCols * 25600));
    CHECK(cudaMalloc(&y, sizeof(float) * kPrefillCols * 34816));
    CHECK(cudaMalloc(&y2, sizeof(float) * kPrefillCols * 34816));
    // weights: bf16 bits of varied sign and size over the whole pool; activations likewise
    {
        std::vector<uint16_t> hw(kPool / 2);
        for (size_t i = 0; i < hw.size(); ++i) {
            const uint32_t h = uint32_t(i * 2654435761u) ^ uint32_t(i >> 13);
            hw[i] = uint16_t(0x3800 + h % 0x0800) | uint16_t((h >> 20 & 1) << 15);  // |w| in [2^-15, 2^-4)
        }
        CHECK(cudaMemcpy(pool, hw.data(), kPool, cudaMemcpyHostToDevice));
        std::vector<float> hx(size_t(kPrefillCols) * 25600);
        for (size_t i = 0; i < hx.size(); ++i) hx[i] = 0.01f * float(int(i * 2246822519u % 401) - 200);
        CHECK(cudaMemcpy(x, hx.data(), sizeof(float) * hx.size(), cudaMemcpyHostToDevice));
    }
    const double copy = copy_gbs();
    printf("copy %.0f GB/s, %d SMs\n", copy, nsm);

    struct Shape { const char * name; int m, k; };
    const Shape shapes[] = { {"o", 5120, 4096}, {"qkv", 6144, 5120}, {"gate|up", 34816, 5120}, {"down", 5120, 17408},
                             {"fc", 5120, 25600}, {"k|v", 2048, 5120}, {"odd", 1000, 384} };
    bool ok = true;
    auto fetch = [](const float * d, int64_t count) {
        std::vector<float> h(count);
        CHECK(cudaMemcpy(h.data(), d, count * 4, cudaMemcpyDeviceToHost));
        return h;
    };
    for (const Shape & s : shapes) {
        const Bf16s run(s.m, s.k, nsm);
        const __nv_bfloat16 * w = (const __nv_bfloat16 *) pool;
        // column 0 alone; columns among 16, 64 and 512
        run(w, x, 1, y);
        const std::vector<float> alone = fetch(y, s.m);
        bool same = true;
        std::vector<float> got16;
        for (int n : {16, 64, kPrefillCols}) {
            run(w, x, n, y);
            const std::vector<float> got = fetch(y, int64_t(n) * s.m);
            same = same && memcmp(alone.data(), got.data(), alone.size() * 4) == 0;
            if (n == 16) got16 = got;
        }
        // a column of the 512 against itself alone (the last group's, past the others)
        {
            const int c = 477;
            const std::vector<float> among = fetch(y + int64_t(c) * s.m, s.m);
            run(w, x + int64_t(c) * s.k, 1, y);
            same = same && memcmp(fetch(y, s.m).data(), among.data(), s.m * 4) == 0;
        }
        double max_rel = 0, max_rel_mmf = 0;
        if (int64_t(s.m) * s.k <= 64ll << 20) {  // the float64 check on the smaller matrices
            std::vector<uint16_t> hw(size_t(s.m) * s.k);
            CHECK(cudaMemcpy(hw.data(), pool, hw.size() * 2, cudaMemcpyDeviceToHost));
            const std::vector<float> hx = fetch(x, int64_t(16) * s.k);
            std::vector<float> ref_mmf;
            if (s.m % 32 == 0) {
                mmf_launch<16>((const nv_bfloat162 *) pool, x, y2, s.m, s.k);
                ref_mmf = fetch(y2, int64_t(16) * s.m);
            }
            for (int c = 0; c < 16; ++c)
                for (int r = 0; r < s.m; r += 7) {
                    double ref = 0, mag = 0;
                    for (int kk = 0; kk < s.k; ++kk) {
                        uint32_t u = uint32_t(hw[size_t(r) * s.k + kk]) << 16;
                        float wv;
                        memcpy(&wv, &u, 4);
                        const double prod = double(wv) * bf16_round(hx[size_t(c) * s.k + kk]);
                        ref += prod;
                        mag += std::fabs(prod);
                    }
                    max_rel = std::max(max_rel, std::fabs(got16[size_t(c) * s.m + r] - ref) / (mag + 1e-30));
                    if (!ref_mmf.empty()) {
                        const double err = std::fabs(ref_mmf[size_t(c) * s.m + r] - ref);
                        max_rel_mmf = std::max(max_rel_mmf, err / (mag + 1e-30));
                    }
                }
        }
        ok = ok && max_rel < 1e-5 && same;
        printf("check %s %d x %d: max |err| / sum |terms| %.2e (mmf %.2e); column alone == among 16, 64, 512: %s; "
               "plan %d workers over %lld units\n", s.name, s.m, s.k, max_rel, max_rel_mmf,
               same ? "same bits" : "DIFFERENT", run.p.workers, (long long) run.p.units());
    }
    printf("\n| matrix | rows x k | columns | mmf us | bf16s us | mmf %% of copy | bf16s %% of copy |\n"
           "|---|---|---|---|---|---|---|\n");
    for (const Shape & s : shapes) {
        if (s.m % 32 != 0) continue;  // mmf's row tiles
        const int64_t bytes = int64_t(s.m) * s.k * 2, copies = std::max<int64_t>(1, int64_t(kPool) / bytes);
        auto wat = [&](int i) { return (const __nv_bfloat16 *) (pool + (i % copies) * (bytes / 2)); };
        const Bf16s run(s.m, s.k, nsm);
        for (int cols : {16, 1, kPrefillCols}) {
            const int reps = cols == kPrefillCols ? 10 : 50;
            const double t_mmf = time_back_to_back_us([&](int i) {
                const nv_bfloat162 * wi = (const nv_bfloat162 *) wat(i);
                if (cols == 16) mmf_launch<16>(wi, x, y2, s.m, s.k);
                else if (cols == 1) mmf_launch<1>(wi, x, y2, s.m, s.k);
                else mmf_groups(wi, x, y2, s.m, s.k, kPrefillCols / 16);
            }, 5, reps);
            const double t = time_back_to_back_us([&](int i) { run(wat(i), x, cols, y); }, 5, reps);
            printf("| %s | %d x %d | %d | %.1f | %.1f | %.0f%% | %.0f%% |\n", s.name, s.m, s.k, cols, t_mmf, t,
                   100.0 * bytes / (t_mmf * 1e3) / copy, 100.0 * bytes / (t * 1e3) / copy);
        }
    }
    printf("%s\n", ok ? "all ok" : "FAIL");
    return ok ? 0 : 1;
}
