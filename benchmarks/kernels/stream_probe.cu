// How fast a block pipeline like lbq's streams a weight matrix, by the length of the run it reads from each row.
// lbq's one-column product copies a unit of 128 rows x one super-block (144 bytes of a Q4_K row) a stage, so DRAM sees
// 128 runs of 144 bytes 2,880 bytes apart; its blocks reach ~2.6 TB/s at the middle of a product where a copy kernel
// measures ~4.3 (H200). This probe keeps the stage's bytes and the pipeline's depth (3 stages of 18 KB, two blocks an
// SM, ranges of units dealt evenly to the blocks as slot_plan does) and changes only the shape of a unit: rows x runs
// of 128 x 144, 64 x 288, 32 x 576, 16 x 1,152 bytes, and last a matrix stored unit by unit (each unit's 128 x 144
// bytes contiguous: a layout ggml's rows do not have). No arithmetic but a checksum of the stage (so the copies are
// used). If the longer runs stream faster, a product's unit should take several super-blocks of fewer rows, or the
// matrix another layout.
//   nvcc -O3 -arch=sm_90 -std=c++17 benchmarks/kernels/stream_probe.cu -o stream_probe && ./stream_probe
#include "probe_common.cuh"  // CHECK, cp_async16 / cp_commit / cp_wait

constexpr int kThreads = 128;
constexpr int kStageBytes = 128 * 144;  // lbq's Q4_K stage: 128 rows x one super-block
constexpr int kStages = 3;
constexpr int kRowPieces = kStageBytes / 128 / 16;  // 16-byte pieces of a unit's row by unit (a Q4_K block: 9)

// Block b streams units [b * units / workers, (b + 1) * units / workers) of the matrix; a unit is `rows` rows x `run`
// bytes (rows x run = kStageBytes), taken row tile by row tile, each tile's runs in k order (lbq's walk).
// rows == 0: the matrix stored unit by unit (unit u at u * kStageBytes).
// slot > 0 (by unit only): each row's 144 bytes at slot-byte strides in the stage, and stages stage_bytes apart, as lbq
// laid its Q4_K stage out until patch 0050 (160-byte slots; its stage holds the activations too). The gaps cost the
// stream 20-24% (thirty-sixth session), which is why lbq's Q4_K stage is unpadded now.
__global__ void __launch_bounds__(kThreads, 2) stream(const uint8_t * __restrict__ w, int64_t row_bytes, int m_rows,
                                                      int rows, int run, int workers, unsigned * out, int slot = 0,
                                                      int stage_bytes = kStageBytes) {
    const bool by_unit = rows == 0;
    if (by_unit) {
        rows = 128;
        run = kStageBytes / rows;
    }
    extern __shared__ __align__(16) uint8_t smem[];
    const int runs_per_row = int(row_bytes / run), tiles = m_rows / rows;
    const int64_t units = int64_t(tiles) * runs_per_row;
    const int64_t u0 = blockIdx.x * units / workers, u1 = (blockIdx.x + 1) * units / workers;
    const int pieces_per_row = run / 16, n_pieces = kStageBytes / 16;
    // where piece i of a unit sits in its stage: in order, or (slot) a row's 144 bytes to a slot
    auto stage_offset = [&](int i) { return slot ? (i / kRowPieces) * slot + 16 * (i % kRowPieces) : 16 * i; };
    auto load = [&](int64_t u, int st) {
        const int64_t tile = u / runs_per_row, r = u % runs_per_row;
        const uint8_t * base = w + tile * rows * row_bytes + r * run;
        for (int i = threadIdx.x; i < n_pieces; i += kThreads) {
            const int row = i / pieces_per_row, piece = i % pieces_per_row;
            const uint8_t * src = by_unit ? w + u * kStageBytes + 16 * i : base + row * row_bytes + 16 * piece;
            cp_async16(smem + st * stage_bytes + stage_offset(i), src);
        }
    };
    for (int i = 0; i < kStages - 1; ++i) {
        if (u0 + i < u1) load(u0 + i, i);
        cp_commit();
    }
    unsigned sum = 0;
    for (int64_t u = u0; u < u1; ++u) {
        cp_wait<kStages - 2>();
        __syncthreads();
        const int64_t next = u + kStages - 1;
        if (next < u1) load(next, int(next % kStages));
        cp_commit();
        const uint8_t * sb = smem + (u % kStages) * stage_bytes;
        for (int i = threadIdx.x; i < n_pieces; i += kThreads) {
            const uint4 v = *reinterpret_cast<const uint4 *>(sb + stage_offset(i));
            sum ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    cp_wait<0>();
    if (sum == 0x12345678u) out[blockIdx.x * kThreads + threadIdx.x] = sum;  // keeps the reads; never true in practice
}

// Bytes of a hash of their index: data with as many toggling bits as quantized weights have (STREAM_PROBE_RANDOM=1;
// the thirty-sixth session found the same rates as over a memset's constant bytes).
__global__ void fill_random(uint32_t * p, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        uint32_t h = uint32_t(i) * 2654435761u ^ uint32_t(i >> 32);
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        p[i] = h;
    }
}

__global__ void copy_kernel(const int4 * __restrict__ a, int4 * __restrict__ b, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        b[i] = a[i];
    }
}

template <class F> static float best_ms(F && fn, void * flush, size_t flush_bytes) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a)); CHECK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int it = 0; it < 12; ++it) {
        CHECK(cudaMemsetAsync(flush, it, flush_bytes));  // the matrix out of L2
        CHECK(cudaEventRecord(a));
        fn();
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        if (it >= 2) best = ms < best ? ms : best;
    }
    return best;
}

int main() {
    int n_sm = 0;
    CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    const size_t flush_bytes = 256u << 20;
    void * flush; CHECK(cudaMalloc(&flush, flush_bytes));
    const int64_t big = int64_t(1) << 30;
    uint8_t * w; CHECK(cudaMalloc(&w, size_t(big)));
    uint8_t * w2; CHECK(cudaMalloc(&w2, size_t(big)));
    // STREAM_PROBE_RANDOM=1: the matrix (and the copy's source) random bytes instead of a memset's ones
    const char * rnd = std::getenv("STREAM_PROBE_RANDOM");
    if (rnd && std::atoi(rnd) != 0) {
        fill_random<<<4 * n_sm, 512>>>(reinterpret_cast<uint32_t *>(w), big / 4);
        CHECK(cudaDeviceSynchronize());
        std::printf("data: random bytes\n");
    } else {
        CHECK(cudaMemset(w, 1, size_t(big)));
    }
    unsigned * out; CHECK(cudaMalloc(&out, size_t(4 * n_sm) * kThreads * sizeof(unsigned)));
    const float copy_ms = best_ms([&] {
        copy_kernel<<<4 * n_sm, 512>>>(reinterpret_cast<const int4 *>(w), reinterpret_cast<int4 *>(w2), big / 32);
    }, flush, flush_bytes);  // half the buffer read, half written
    const double copy_gbs = double(big) / (copy_ms * 1e-3) / 1e9;
    std::printf("copy: %.0f GB/s (read + write of %lld MB)\n", copy_gbs, (long long)(big / 2 >> 20));
    CHECK(cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, kStages * kStageBytes));
    // the 27B's ffn gate|up (34816 x 5120 Q4_K: 100 MB) and down (5120 x 17408: 50 MB), and 1 GB of 5120-wide rows
    const struct { int m; int64_t row_bytes; const char * name; } shapes[] = {
        {34816, 2880, "34816 x 2880 B"}, {5120, 9792, "5120 x 9792 B"}, {372736, 2880, "372736 x 2880 B (1 GB)"}};
    for (const auto & sh : shapes) {
        for (int rows : {128, 64, 32, 16, 0}) {
            const int run = kStageBytes / (rows ? rows : 128);
            if (sh.row_bytes % run != 0) continue;
            const int workers = 2 * n_sm;
            const float ms = best_ms([&] {
                stream<<<workers, kThreads, kStages * kStageBytes>>>(w, sh.row_bytes, sh.m, rows, run, workers, out);
            }, flush, flush_bytes);
            CHECK(cudaGetLastError());
            const double gbs = double(sh.m) * sh.row_bytes / (ms * 1e-3) / 1e9;
            char unit[48];
            if (rows) std::snprintf(unit, sizeof unit, "unit %3d rows x %5d B", rows, run);
            else std::snprintf(unit, sizeof unit, "units stored contiguous");
            std::printf("stream %-24s %-24s: %8.1f us  %6.0f GB/s  (%.0f%% of copy)\n", sh.name, unit, ms * 1e3, gbs,
                        100.0 * gbs / copy_gbs);
        }
        // stored by unit in lbq's old stage layout: rows at 160-byte slots, then also with 2,208 bytes more a stage (an
        // int8 candidate's activations, branch wip/lbq-int8; not copied: only the footprint)
        constexpr int kOldSlot = 160;
        for (int extra : {0, 2208}) {
            const int stage_bytes = 128 * kOldSlot + extra;
            CHECK(cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, kStages * stage_bytes));
            const float ms = best_ms([&] {
                stream<<<2 * n_sm, kThreads, kStages * stage_bytes>>>(w, sh.row_bytes, sh.m, 0, 0, 2 * n_sm, out,
                                                                       kOldSlot, stage_bytes);
            }, flush, flush_bytes);
            CHECK(cudaGetLastError());
            const double gbs = double(sh.m) * sh.row_bytes / (ms * 1e-3) / 1e9;
            std::printf("stream %-24s by unit, %d-byte slots, %5d-byte stages: %8.1f us %6.0f GB/s (%.0f%% of copy)\n",
                        sh.name, kOldSlot, stage_bytes, ms * 1e3, gbs, 100.0 * gbs / copy_gbs);
        }
    }
    return 0;
}
