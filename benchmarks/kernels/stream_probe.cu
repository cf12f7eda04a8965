// How fast a block pipeline like lbq's streams a weight matrix, by the length of the run it reads from each row.
// lbq's one-column product copies a unit of 128 rows x one super-block (144 bytes of a Q4_K row) a stage, so DRAM sees
// 128 runs of 144 bytes 2,880 bytes apart; its blocks reach ~2.6 TB/s at the middle of a product where a copy kernel
// measures ~4.3 (H200). This probe keeps the stage's bytes and the pipeline's depth (3 stages of 18 KB, two blocks an
// SM, ranges of units dealt evenly to the blocks as slot_plan does) and changes only the shape of a unit: rows x runs
// of 128 x 144, 64 x 288, 32 x 576, 16 x 1,152 bytes, and last a matrix stored unit by unit (each unit's 128 x 144
// bytes contiguous: a layout ggml's rows do not have). No arithmetic but a checksum of the stage (so the copies are
// used). If the longer runs stream faster, a product's unit should take several super-blocks of fewer rows, or the
// matrix another layout.
//   nvcc -O3 -arch=sm_90 -std=c++17 benchmarks/kernels/stream_probe.cu -o stream_probe && ./stream_probe [chain]
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

// The same stream through Hopper's bulk copy engine (cp.async.bulk, sm_90+; the matrix stored unit by unit, so a unit
// is one contiguous run): one thread asks for a stage's `unit_bytes` x `per_stage` bytes in one instruction and an
// mbarrier counts them in, where the 16-byte cp.async above takes 9 instructions a thread a unit and a commit group.
// S stages; all S in flight while the block reads none (the load for u + S goes out once stage u is read). If this
// streams nearer a copy's rate than lbq's 16-byte pipeline at the same bytes in flight, lbq's weight staging on Hopper
// should move to it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define STREAM_PROBE_BULK 1
#endif
__device__ __forceinline__ void mbar_init(uint64_t * bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect(uint64_t * bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t * bar, unsigned parity) {
    asm volatile(
        "{\n .reg .pred p;\n"
        "W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        " @!p bra W;\n}\n" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
}
// bytes from src into dst by the bulk copy engine, counted into the barrier bar (which then expects them)
__device__ __forceinline__ void bulk_load(uint64_t * bar, void * dst, const void * src, unsigned bytes) {
    mbar_expect(bar, bytes);
#ifdef STREAM_PROBE_BULK
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
#endif
}

// The stages' barriers, each expecting one arrival (the copy's expect_tx) a phase, before any thread uses them
template <int S> __device__ __forceinline__ void init_stages(uint64_t (&full)[S]) {
    if (threadIdx.x == 0) {
        for (int i = 0; i < S; ++i) mbar_init(&full[i], 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
}

// This thread's share of a stage of n 16-byte pieces, folded into a checksum (so the copies are used)
__device__ __forceinline__ unsigned stage_checksum(const uint8_t * sb, int n) {
    unsigned sum = 0;
    for (int j = threadIdx.x; j < n; j += kThreads) {
        const uint4 v = *reinterpret_cast<const uint4 *>(sb + 16 * j);
        sum ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    return sum;
}

template <int S>
__global__ void __launch_bounds__(kThreads) stream_bulk(const uint8_t * __restrict__ w, int64_t units, int per_stage,
                                                        int workers, unsigned * out) {
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ uint64_t full[S];
    const int stage_bytes = kStageBytes * per_stage;
    const int64_t chunks = (units + per_stage - 1) / per_stage;  // a chunk: per_stage units, one bulk copy
    const int64_t c0 = blockIdx.x * chunks / workers, c1 = (blockIdx.x + 1) * chunks / workers;
    init_stages(full);
    auto load = [&](int64_t c) {
        const int st = int(c % S);
        const int64_t u = c * per_stage;
        const unsigned bytes = unsigned((units - u < per_stage ? units - u : per_stage) * kStageBytes);
        bulk_load(&full[st], smem + st * stage_bytes, w + u * kStageBytes, bytes);
    };
    if (threadIdx.x == 0) {
        for (int64_t c = c0; c < c1 && c < c0 + S; ++c) load(c);
    }
    unsigned sum = 0;
    for (int64_t c = c0; c < c1; ++c) {
        const int st = int(c % S);
        mbar_wait(&full[st], unsigned(((c - c0) / S) & 1));
        const uint8_t * sb = smem + st * stage_bytes;
        const int64_t left = units - c * per_stage;
        const int n = int(left < per_stage ? left : per_stage) * kStageBytes / 16;
        sum ^= stage_checksum(sb, n);
        __syncthreads();  // stage st read by every thread: it may be written again
        if (threadIdx.x == 0 && c + S < c1) load(c + S);
    }
    if (sum == 0x12345678u) out[blockIdx.x * kThreads + threadIdx.x] = sum;
}

// As stream_bulk, but the units are not dealt out before the launch: a block claims its next unit (a counter in
// memory, one atomic a unit) when a stage frees, so a block that streams faster takes more units and all blocks end
// within about one unit of each other. The bound on what a product's tail costs: a product's blocks end 3-5 us apart
// on fixed ranges (lbq_check trace), and lbq's claimed ranges lost to their partial sums (nineteenth session).
template <int S>
__global__ void __launch_bounds__(kThreads) stream_claim(const uint8_t * __restrict__ w, int64_t units,
                                                         unsigned long long * next, unsigned * out) {
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ uint64_t full[S];
    __shared__ long long claimed[S];
    init_stages(full);
    auto load = [&](int st) {  // thread 0: claim a unit for stage st, or mark the stage as the end
        const long long u = (long long) atomicAdd(next, 1ull);
        claimed[st] = u < units ? u : -1;
        if (u < units) {
            bulk_load(&full[st], smem + st * kStageBytes, w + u * kStageBytes, kStageBytes);
        } else {
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(&full[st])) : "memory");
        }
    };
    if (threadIdx.x == 0) {
        for (int st = 0; st < S; ++st) load(st);
    }
    unsigned sum = 0;
    for (int64_t i = 0;; ++i) {
        const int st = int(i % S);
        mbar_wait(&full[st], unsigned((i / S) & 1));
        if (claimed[st] < 0) break;
        const uint8_t * sb = smem + st * kStageBytes;
        sum ^= stage_checksum(sb, kStageBytes / 16);
        __syncthreads();
        if (threadIdx.x == 0) load(st);
    }
    if (sum == 0x12345678u) out[blockIdx.x * kThreads + threadIdx.x] = sum;
}

// A DeltaNet layer's products streamed back to back (`stream_probe chain`): what a product's launch, ramp and tail cost
// a chain of dependent products, and what streaming them from one persistent grid would save. The weights only, stored
// by unit, no arithmetic; each product must wait for the one before it to end before it reads a byte of its own stage
// (as lbq's products wait for their inputs), but may load its first stages before.
//  - chain_launch: a launch a product in a CUDA graph, with dependent launch (as ggml launches lbq): a block loads its
//    first S units, lets the next launch start, waits for the launch before, then streams its range.
//  - chain_persistent: one grid of resident blocks walks every product's range in turn, its pipeline running on from
//    one product into the next (the next one's first S units in flight during this one's tail), and a grid barrier
//    before a block reads the first unit of a product (the wait for the product before).
struct ChainArgs {
    const uint8_t * w;
    const int64_t * first;  // [n_prod + 1]: product p's units are [first[p], first[p + 1]) of w
    int n_prod;
    unsigned * arrived;     // the grid barrier's counter (zeroed before each launch)
    unsigned * out;
};

__device__ __forceinline__ void grid_wait(unsigned * arrived, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(arrived, 1u);
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(arrived) : "memory");
        } while (seen < target);
    }
    __syncthreads();
}

template <int S>
__global__ void __launch_bounds__(kThreads) chain_persistent(const ChainArgs a) {
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ uint64_t full[S];
    init_stages(full);
    // a cursor over this block's units of every product in turn: (product, unit)
    struct Cursor { int p; int64_t u, hi; };
    auto range = [&](int p, int64_t & lo, int64_t & hi) {
        const int64_t n = a.first[p + 1] - a.first[p];
        lo = a.first[p] + blockIdx.x * n / gridDim.x;
        hi = a.first[p] + (blockIdx.x + 1) * n / gridDim.x;
    };
    auto settle = [&](Cursor & c) {  // past an empty or finished range: the next product's
        while (c.p < a.n_prod && c.u >= c.hi) {
            if (++c.p < a.n_prod) range(c.p, c.u, c.hi);
        }
    };
    Cursor ld{0, 0, 0}, use{0, 0, 0};
    range(0, ld.u, ld.hi);
    settle(ld);
    use = ld;
    auto load = [&](int64_t i) {  // thread 0: the load cursor's unit into stage i % S
        const int st = int(i % S);
        bulk_load(&full[st], smem + st * kStageBytes, a.w + ld.u * kStageBytes, kStageBytes);
        ++ld.u;
        settle(ld);
    };
    int64_t issued = 0;
    if (threadIdx.x == 0) {
        for (; issued < S && ld.p < a.n_prod; ++issued) load(issued);
    } else {
        for (; issued < S && ld.p < a.n_prod; ++issued) { ++ld.u; settle(ld); }  // the same cursor, no loads
    }
    unsigned sum = 0;
    int waited = 0;  // products this block has waited for
    for (int64_t i = 0; use.p < a.n_prod; ++i) {
        while (waited < use.p) grid_wait(a.arrived, unsigned(++waited) * gridDim.x);  // the products before use.p ended
        const int st = int(i % S);
        mbar_wait(&full[st], unsigned((i / S) & 1));
        const uint8_t * sb = smem + st * kStageBytes;
        sum ^= stage_checksum(sb, kStageBytes / 16);
        __syncthreads();
        if (ld.p < a.n_prod) {
            if (threadIdx.x == 0) load(issued);
            else { ++ld.u; settle(ld); }
            ++issued;
        }
        ++use.u;
        settle(use);
    }
    while (waited < a.n_prod) grid_wait(a.arrived, unsigned(++waited) * gridDim.x);  // every block ends together
    if (sum == 0x12345678u) a.out[blockIdx.x * kThreads + threadIdx.x] = sum;
}

// One product of the chain as its own launch (dependent launch: loads its first S units, lets the next launch start,
// then waits for the launch before).
template <int S>
__global__ void __launch_bounds__(kThreads) chain_launch(const uint8_t * __restrict__ w, int64_t u_lo, int64_t units,
                                                         unsigned * out, int spin_ns = 0) {
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ uint64_t full[S];
    const int64_t u0 = u_lo + blockIdx.x * units / gridDim.x, u1 = u_lo + (blockIdx.x + 1) * units / gridDim.x;
    init_stages(full);
    auto load = [&](int64_t u) {
        const int st = int(u % S);
        bulk_load(&full[st], smem + st * kStageBytes, w + u * kStageBytes, kStageBytes);
    };
    if (threadIdx.x == 0) {
        for (int64_t u = u0; u < u1 && u < u0 + S; ++u) load(u);
    }
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    unsigned sum = 0;
    for (int64_t u = u0; u < u1; ++u) {
        const int st = int(u % S);
        mbar_wait(&full[st], unsigned(((u - u0) / S) & 1));
        if (spin_ns > 0) {  // a unit's arithmetic stood in by a wait of spin_ns (the stage held meanwhile)
            unsigned long long t0, t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
            do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (unsigned long long) spin_ns);
        }
        const uint8_t * sb = smem + st * kStageBytes;
        sum ^= stage_checksum(sb, kStageBytes / 16);
        __syncthreads();
        if (threadIdx.x == 0 && u + S < u1) load(u + S);
    }
    if (sum == 0x12345678u) out[blockIdx.x * kThreads + threadIdx.x] = sum;
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

// `stream_probe chain`: 8 copies of a DeltaNet layer's Q4_K products by unit (in|z|b|a 16480 x 5120, out 5120 x 6144,
// gate|up 34816 x 5120, down 5120 x 17408: 215.6 MB a layer, 1.7 GB in all, past L2), streamed as launches (shared
// memory padded so that 2-6 blocks fit an SM; then with a unit's work stood in by a wait) and as one persistent grid,
// at 2 blocks an SM and 2-6 stages. STREAM_PROBE_SPIN_ONLY=1 stops after the waits.
static int chain_main(int n_sm) {
    const int64_t layer_rows[4] = {16480, 5120, 34816, 5120}, layer_row_bytes[4] = {2880, 3456, 2880, 9792};
    const int n_layers = 8, n_prod = 4 * n_layers;
    std::vector<int64_t> first(1, 0);
    for (int l = 0; l < n_layers; ++l)
        for (int i = 0; i < 4; ++i) first.push_back(first.back() + layer_rows[i] * layer_row_bytes[i] / kStageBytes);
    const int64_t total = first.back();
    uint8_t * w; CHECK(cudaMalloc(&w, size_t(total) * kStageBytes));
    CHECK(cudaMemset(w, 1, size_t(total) * kStageBytes));
    int64_t * d_first; CHECK(cudaMalloc(&d_first, first.size() * sizeof(int64_t)));
    CHECK(cudaMemcpy(d_first, first.data(), first.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    unsigned * arrived; CHECK(cudaMalloc(&arrived, sizeof(unsigned)));
    unsigned * out; CHECK(cudaMalloc(&out, size_t(4 * n_sm) * kThreads * sizeof(unsigned)));
    cudaStream_t st; CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const double bytes = double(total) * kStageBytes;
    // the best of 10 timed runs (after 2), each after the counter's reset and past the reset
    auto time_ms = [&](auto fn) {
        float best = 1e30f;
        cudaEvent_t a, b; CHECK(cudaEventCreate(&a)); CHECK(cudaEventCreate(&b));
        for (int it = 0; it < 12; ++it) {
            CHECK(cudaMemsetAsync(arrived, 0, sizeof(unsigned), st));
            CHECK(cudaEventRecord(a, st));
            fn();
            CHECK(cudaEventRecord(b, st));
            CHECK(cudaEventSynchronize(b));
            float ms; CHECK(cudaEventElapsedTime(&ms, a, b));
            if (it >= 2) best = ms < best ? ms : best;
        }
        return best;
    };
    auto report = [&](const char * what, int stages, float ms) {
        std::printf("chain %-44s %d stages, 2 blocks an SM: %7.1f us a layer  %6.0f GB/s\n", what, stages,
                    ms * 1e3 / n_layers, bytes / (ms * 1e-3) / 1e9);
    };
    // the chain as a CUDA graph of a launch a product (2 blocks an SM's worth, smem bytes each), with dependent launch
    // or without, each unit held spin_ns: its best time
    auto time_launches = [&](auto launch_kernel, int smem, bool pdl, int spin_ns) {
        cudaGraph_t g; cudaGraphExec_t ge;
        CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int p = 0; p < n_prod; ++p) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(2 * n_sm); cfg.blockDim = dim3(kThreads); cfg.dynamicSmemBytes = size_t(smem);
            cfg.stream = st;
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = attr; cfg.numAttrs = pdl ? 1 : 0;
            CHECK(cudaLaunchKernelEx(&cfg, launch_kernel, static_cast<const uint8_t *>(w), first[p],
                                     first[p + 1] - first[p], out, spin_ns));
        }
        CHECK(cudaStreamEndCapture(st, &g));
        CHECK(cudaGraphInstantiate(&ge, g, 0));
        const float ms = time_ms([&] { CHECK(cudaGraphLaunch(ge, st)); });
        CHECK(cudaGraphExecDestroy(ge)); CHECK(cudaGraphDestroy(g));
        return ms;
    };
    auto run = [&](auto launch_kernel, auto persistent_kernel, int stages) {
        const int smem = stages * kStageBytes, grid = 2 * n_sm;
        CHECK(cudaFuncSetAttribute(launch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CHECK(cudaFuncSetAttribute(persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        int fit = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, persistent_kernel, kThreads, size_t(smem)));
        report("a launch a product", stages, time_launches(launch_kernel, smem, false, 0));
        report("a launch a product, dependent launch", stages, time_launches(launch_kernel, smem, true, 0));
        if (fit < 2) {
            std::printf("chain persistent, %d stages: %d blocks fit an SM, not 2 (skipped)\n", stages, fit);
            return;
        }
        ChainArgs args{w, d_first, n_prod, arrived, out};
        void * params[] = {&args};
        report("one persistent grid, a barrier a product", stages, time_ms([&] {  // one launch: no graph needed
            CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void *>(persistent_kernel), dim3(grid),
                                              dim3(kThreads), params, size_t(smem), st));
        }));
    };
    // the launches with dependent launch at 2 blocks an SM, their shared memory padded so that 2, 3 or 4 blocks fit an
    // SM: whether the next product's blocks stream their first stages during this one's tail only when a whole
    // product's blocks fit beside it (lbq's Q4_K fused block takes 80 KB: 2 fit)
    auto run_fit = [&](auto launch_kernel, int stages, int smem, int spin_ns = 0) {
        CHECK(cudaFuncSetAttribute(launch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        int fit = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, launch_kernel, kThreads, size_t(smem)));
        const float ms = time_launches(launch_kernel, smem, true, spin_ns);
        std::printf("chain a launch a product, dependent launch, %d stages, %3d KB of shared memory a block: %d fit an SM, "
                    "%4d ns a unit's work: %7.1f us a layer  %6.0f GB/s\n", stages, smem / 1024, fit, spin_ns,
                    ms * 1e3 / n_layers, bytes / (ms * 1e-3) / 1e9);
    };
    for (int smem_kb : {54, 60, 72, 80, 100}) run_fit(chain_launch<3>, 3, smem_kb * 1024);
    for (int smem_kb : {36, 54, 72, 100}) run_fit(chain_launch<2>, 2, smem_kb * 1024);
    // a unit's arithmetic as a wait (lbq's one-column chain: ~91 us a layer): how long a block may spend on a unit
    // before the stream slows, at lbq's 3 stages and 80 KB (2 blocks an SM), and with more stages
    for (int spin : {250, 500, 750, 1000, 1250, 1500, 2000}) {
        run_fit(chain_launch<3>, 3, 80 * 1024, spin);
        run_fit(chain_launch<4>, 4, 100 * 1024, spin);
        run_fit(chain_launch<6>, 6, 110 * 1024, spin);
    }
    if (std::getenv("STREAM_PROBE_SPIN_ONLY")) return 0;
    std::printf("chain: %d products, %.1f MB a layer\n", n_prod, bytes / n_layers / 1e6);
    run(chain_launch<3>, chain_persistent<3>, 3);
    run(chain_launch<4>, chain_persistent<4>, 4);
    run(chain_launch<6>, chain_persistent<6>, 6);
    return 0;
}

int main(int argc, char ** argv) {
    int n_sm = 0;
    CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    if (argc > 1 && std::strcmp(argv[1], "chain") == 0) return chain_main(n_sm);
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
    // the bulk copy engine's stream (stored by unit): stages x units a stage x blocks an SM, the same bytes in flight as
    // lbq's Q4_K pipeline first (3 x 1 x 2: 6 units an SM), then more
    const struct { int stages, per_stage, per_sm; } bulk[] = {{3, 1, 2}, {4, 1, 2}, {6, 1, 2}, {3, 2, 2}, {4, 2, 2},
                                                               {6, 1, 1}, {8, 1, 1}, {4, 2, 1}, {3, 4, 1}, {4, 1, 3}};
    for (const auto & sh : shapes) {
        const int64_t units = int64_t(sh.m) * sh.row_bytes / kStageBytes;
        for (const auto & b : bulk) {
            const int smem = b.stages * b.per_stage * kStageBytes;
            const int workers = b.per_sm * n_sm;
            auto run = [&](auto kernel) {
                CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                int fit = 0;
                CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kThreads, size_t(smem)));
                const float ms = best_ms([&] { kernel<<<workers, kThreads, smem>>>(w, units, b.per_stage, workers, out); },
                                         flush, flush_bytes);
                CHECK(cudaGetLastError());
                const double gbs = double(units) * kStageBytes / (ms * 1e-3) / 1e9;
                std::printf("bulk   %-24s %d stages x %d units (%3d KB in flight an SM), %d blocks an SM (fit %d): %8.1f "
                            "us  %6.0f GB/s  (%.0f%% of copy)\n", sh.name, b.stages, b.per_stage,
                            b.stages * b.per_stage * b.per_sm * kStageBytes / 1024, b.per_sm, fit, ms * 1e3, gbs,
                            100.0 * gbs / copy_gbs);
            };
            switch (b.stages) {
                case 3: run(stream_bulk<3>); break;
                case 4: run(stream_bulk<4>); break;
                case 6: run(stream_bulk<6>); break;
                default: run(stream_bulk<8>); break;
            }
        }
    }
    // claimed units: stages x blocks an SM
    unsigned long long * next; CHECK(cudaMalloc(&next, sizeof *next));
    const float reset_ms = best_ms([&] { CHECK(cudaMemsetAsync(next, 0, sizeof *next)); }, flush, flush_bytes);
    std::printf("claim: the counter's reset alone %.1f us (in each time below)\n", reset_ms * 1e3);
    const struct { int stages, per_sm; } claim[] = {{3, 2}, {4, 2}, {3, 3}, {6, 1}};
    for (const auto & sh : shapes) {
        const int64_t units = int64_t(sh.m) * sh.row_bytes / kStageBytes;
        for (const auto & c : claim) {
            const int smem = c.stages * kStageBytes;
            auto run = [&](auto kernel) {
                CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                const float ms = best_ms([&] {
                    CHECK(cudaMemsetAsync(next, 0, sizeof *next));
                    kernel<<<c.per_sm * n_sm, kThreads, smem>>>(w, units, next, out);
                }, flush, flush_bytes);
                CHECK(cudaGetLastError());
                const double gbs = double(units) * kStageBytes / (ms * 1e-3) / 1e9;
                std::printf("claim  %-24s %d stages, %d blocks an SM: %8.1f us  %6.0f GB/s  (%.0f%% of copy)\n", sh.name,
                            c.stages, c.per_sm, ms * 1e3, gbs, 100.0 * gbs / copy_gbs);
            };
            switch (c.stages) {
                case 3: run(stream_claim<3>); break;
                case 4: run(stream_claim<4>); break;
                default: run(stream_claim<6>); break;
            }
        }
    }
    return 0;
}
