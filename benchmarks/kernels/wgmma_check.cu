// Does wgmma (Hopper's warpgroup MMA, sm_90a) round f16 products with f32 accumulation to the same bits as mma.sync
// m16n8k16 on the same rows and columns? The invariant attention's rows must come out the same in a one-query call
// and in a tree: a Hopper tree block on wgmma can sit beside an mma.sync one-query block only if they do. Checked
// against mma.sync over random tiles of four input distributions (each output element compared bit for bit, the
// shared-memory layouts checked against the exact product), for A from registers and from shared memory, B K-major
// (K rows: S = Q K^T) and MN-major (V rows: O = P V), n = 8 / 32 / 256. Then a throughput probe: S of a 64-row tile
// against 32-key pieces on wgmma vs on 4 warps of mma.sync with ldmatrix. Differing bits are a finding (printed);
// the exit status is 1 only when a layout is wrong, i.e. the check itself is broken. (`run.sh wgmma` runs it.)
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a benchmarks/kernels/wgmma_check.cu -o wgmma_check
//   (-arch=sm_90a is not enough with nvcc 13.0: its PTX targets sm_90, which has no wgmma)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wgmma_ops.cuh"

// ---- the check ----
constexpr int kM = 64;          // rows: one warpgroup's m64
constexpr int kK = 256;         // k: a head's 256 dimensions, 16 k-steps
constexpr int kSteps = kK / 16;
constexpr int kTests = 512;     // 64 x N tiles per distribution
constexpr int kLayoutTests = 16;  // of which checked against the exact product (on the CPU)

__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned pair(const half * p) { return *reinterpret_cast<const unsigned *>(p); }

// A fragment of m16n8k16 (and of wgmma's A in registers, warp w taking rows 16 w ..): rows g, g + 8, k 2t.., 2t + 8..
__device__ __forceinline__ void a_frag(const half * A, int row0, int s, unsigned (&a)[4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const half * r0 = A + (row0 + g) * kK + 16 * s + 2 * t;
    const half * r1 = r0 + 8 * kK;
    a[0] = pair(r0); a[1] = pair(r1); a[2] = pair(r0 + 8); a[3] = pair(r1 + 8);
}

// The reference: mma.sync m16n8k16, warp w rows 16 w .. 16 w + 15, each n-tile's k-steps in order from C = 0.
// A: [kM][kK]; Bt: [N][kK] (B's columns, k contiguous); D: [kM][N].
template <int N>
__global__ void ref_mma(const half * A, const half * Bt, float * D) {
    A += size_t(blockIdx.x) * kM * kK; Bt += size_t(blockIdx.x) * N * kK; D += size_t(blockIdx.x) * kM * N;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int nt = 0; nt < N / 8; ++nt) {
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        for (int s = 0; s < kSteps; ++s) {
            unsigned a[4];
            a_frag(A, 16 * w, s, a);
            const half * bc = Bt + (8 * nt + g) * kK + 16 * s + 2 * t;
            mma_16816(c, a, pair(bc), pair(bc + 8));
        }
        const int r = 16 * w + g, col = 8 * nt + 2 * t;
        D[r * N + col] = c[0]; D[r * N + col + 1] = c[1];
        D[(r + 8) * N + col] = c[2]; D[(r + 8) * N + col + 1] = c[3];
    }
}

// No-swizzle layouts of 8 x 8 core matrices (128 contiguous bytes, 8 rows of 16 bytes); LBO: the byte step between
// core matrices along k, SBO: along m / n.
//   K-major (B's columns or A's rows along k): byte(k, x) = (k / 8) LBO + (x / 8) 128 + (x % 8) 16 + (k % 8) 2
//   MN-major (B[k][n], n contiguous: V's rows):  byte(k, n) = (n / 8) SBO + (k / 8) 128 + (k % 8) 16 + (n % 8) 2
__device__ __forceinline__ int kmajor_byte(int k, int x, int lbo) {
    return (k / 8) * lbo + (x / 8) * 128 + (x % 8) * 16 + (k % 8) * 2;
}
__device__ __forceinline__ int mnmajor_byte(int k, int n, int sbo) {
    return (n / 8) * sbo + (k / 8) * 128 + (k % 8) * 16 + (n % 8) * 2;
}

// The wrapper of shape N
// The same product on wgmma (one warpgroup): B from shared memory (K-major, or MN-major with kTransB), A from
// registers or (kSmemA) shared memory; kZeroFirst: the first k-step with scale-d = 0 instead of zeroed accumulators
// (ptxas 13.0 turns the zeroed accumulators into scale-d = 0 as well, so the two compile alike there; kept for a
// compiler that does not).
template <int N, int kTransB, bool kSmemA, bool kZeroFirst>
__global__ void __launch_bounds__(128) wg_mma(const half * A, const half * Bt, float * D) {
    A += size_t(blockIdx.x) * kM * kK; Bt += size_t(blockIdx.x) * N * kK; D += size_t(blockIdx.x) * kM * N;
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char * sb = smem;                    // B: kK x N halfs
    unsigned char * sa = smem + kK * N * 2;       // A: kM x kK halfs (kSmemA)
    const unsigned lbo_b = kTransB ? 128 : (N / 8) * 128, sbo_b = kTransB ? (kK / 8) * 128 : 128;
    const unsigned lbo_a = (kM / 8) * 128, sbo_a = 128;
    for (int i = threadIdx.x; i < N * kK; i += blockDim.x) {
        const int n = i / kK, k = i % kK;
        const int byte = kTransB ? mnmajor_byte(k, n, sbo_b) : kmajor_byte(k, n, lbo_b);
        *reinterpret_cast<half *>(sb + byte) = Bt[i];
    }
    if (kSmemA) {
        for (int i = threadIdx.x; i < kM * kK; i += blockDim.x) {
            const int m = i / kK, k = i % kK;
            *reinterpret_cast<half *>(sa + kmajor_byte(k, m, lbo_a)) = A[i];
        }
    }
    fence_proxy_async();  // generic-proxy stores, then async-proxy reads
    __syncthreads();
    float d[N / 2];
    for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
    const int w = threadIdx.x / 32;
    unsigned a[kSteps][4];
    if (!kSmemA) {
        for (int s = 0; s < kSteps; ++s) a_frag(A, 16 * w, s, a[s]);
    }
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
        // k-step s: k groups 2 s and 2 s + 1
        const uint64_t db = wgmma_desc(sb + 2 * s * lbo_b, lbo_b, sbo_b);
        const int sd = kZeroFirst && s == 0 ? 0 : 1;
        if constexpr (kSmemA) {
            wgmma_ss<kTransB>(d, wgmma_desc(sa + 2 * s * lbo_a, lbo_a, sbo_a), db, sd);
        } else {
            wgmma_rs<kTransB>(d, a[s], db, sd);
        }
    }
    wgmma_commit();
    wgmma_wait<0>();
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    // D: warp w rows 16 w + g (+ 8), n-tile i's columns 8 i + 2 t (+ 1) in d[4 i .. 4 i + 3]
    for (int i = 0; i < N / 8; ++i) {
        const int r = 16 * w + g, col = 8 * i + 2 * t;
        D[r * N + col] = d[4 * i]; D[r * N + col + 1] = d[4 * i + 1];
        D[(r + 8) * N + col] = d[4 * i + 2]; D[(r + 8) * N + col + 1] = d[4 * i + 3];
    }
}

// ---- inputs ----
static uint32_t mix32(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
}
// dist 0: uniform in (-1, 1); 1: random sign x (1 + frac) x 2^e, e in [-12, 12] (the adder's alignment); 2: +-2^e with
// e in {0, 4, 8} and +-1 in A (exact cancellations); 3: a mix of zeros, -0, subnormal halves and normal values.
static half make_value(int dist, uint32_t seed, uint32_t i, bool is_a) {
    const uint32_t h = mix32(seed * 0x9e3779b9U + i * 0x85ebca6bU + (is_a ? 0x1234567U : 0x7654321U));
    const float u = float(h & 0xffffff) / float(1 << 24);
    const float sign = (h >> 31) ? -1.f : 1.f;
    switch (dist) {
        case 0: return __float2half(2.f * u - 1.f);
        case 1: return __float2half(sign * (1.f + u) * std::ldexp(1.f, int((h >> 24) % 25) - 12));
        case 2: return __float2half(is_a ? sign : sign * std::ldexp(1.f, 4 * int((h >> 24) % 3)));
        default: {
            const int kind = (h >> 24) % 4;
            if (kind == 0) return __float2half(0.f * sign);
            if (kind == 1) return __float2half(sign * (1.f + u) * std::ldexp(1.f, -24 + int((h >> 26) % 9)));
            return __float2half(sign * (2.f * u - 1.f) * 64.f);
        }
    }
}

#define CHECK(x)                                                                                      \
    do {                                                                                              \
        cudaError_t e_ = (x);                                                                         \
        if (e_ != cudaSuccess) {                                                                      \
            std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);      \
            std::exit(1);                                                                             \
        }                                                                                             \
    } while (0)

struct Result { long long elems = 0, diff_bits = 0; double max_layout_err = 0; };

template <int N, int kTransB, bool kSmemA, bool kZeroFirst>
static Result run_case(int dist) {
    std::vector<half> A(size_t(kTests) * kM * kK), Bt(size_t(kTests) * N * kK);
    for (size_t i = 0; i < A.size(); ++i) A[i] = make_value(dist, 17, uint32_t(i), true);
    for (size_t i = 0; i < Bt.size(); ++i) Bt[i] = make_value(dist, 17 + N, uint32_t(i), false);
    half *dA, *dB; float *dR, *dW;
    CHECK(cudaMalloc(&dA, A.size() * 2)); CHECK(cudaMalloc(&dB, Bt.size() * 2));
    CHECK(cudaMalloc(&dR, size_t(kTests) * kM * N * 4)); CHECK(cudaMalloc(&dW, size_t(kTests) * kM * N * 4));
    CHECK(cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dB, Bt.data(), Bt.size() * 2, cudaMemcpyHostToDevice));
    ref_mma<N><<<kTests, 128>>>(dA, dB, dR);
    const int smem = kK * N * 2 + (kSmemA ? kM * kK * 2 : 0);
    CHECK(cudaFuncSetAttribute(wg_mma<N, kTransB, kSmemA, kZeroFirst>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               smem));
    wg_mma<N, kTransB, kSmemA, kZeroFirst><<<kTests, 128, smem>>>(dA, dB, dW);
    CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
    std::vector<float> R(size_t(kTests) * kM * N), W(R.size());
    CHECK(cudaMemcpy(R.data(), dR, R.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(W.data(), dW, W.size() * 4, cudaMemcpyDeviceToHost));
    Result res;
    for (int tcase = 0; tcase < kTests; ++tcase)
        for (int m = 0; m < kM; ++m)
            for (int n = 0; n < N; ++n) {
                const size_t o = (size_t(tcase) * kM + m) * N + n;
                uint32_t rb, wb;
                std::memcpy(&rb, &R[o], 4); std::memcpy(&wb, &W[o], 4);
                res.diff_bits += rb != wb;
                res.elems++;
                if (tcase >= kLayoutTests) continue;
                double exact = 0, mag = 0;
                for (int k = 0; k < kK; ++k) {
                    const double p = double(__half2float(A[(size_t(tcase) * kM + m) * kK + k])) *
                                     double(__half2float(Bt[(size_t(tcase) * N + n) * kK + k]));
                    exact += p; mag += std::fabs(p);
                }
                // the layout is right where wgmma's value is the product's within f32 summation error
                const double err = mag > 0 ? std::fabs(double(W[o]) - exact) / mag : std::fabs(double(W[o]));
                res.max_layout_err = std::max(res.max_layout_err, err);
            }
    cudaFree(dA); cudaFree(dB); cudaFree(dR); cudaFree(dW);
    return res;
}

template <int N, int kTransB, bool kSmemA, bool kZeroFirst>
static bool report(const char * name) {
    bool ok = true;
    for (int dist = 0; dist < 4; ++dist) {
        const Result r = run_case<N, kTransB, kSmemA, kZeroFirst>(dist);
        const bool layout_ok = r.max_layout_err < 1e-5;
        std::printf("| %s | %d | %lld | %lld | %.2e | %s |\n", name, dist, r.elems, r.diff_bits, r.max_layout_err,
                    !layout_ok ? "LAYOUT WRONG" : r.diff_bits ? "bits differ" : "same bits");
        ok = ok && layout_ok;
    }
    return ok;
}

// ---- throughput: S = Q K^T of a 64-row tile against 32-key pieces (kSteps k-steps each), operands resident in
// shared memory, as a tree block's S would run: wgmma m64n32k16 (A from registers) vs 4 warps of mma.sync m16n8k16
// with ldmatrix'd B fragments. Each block repeats `reps` pieces; the grid fills the GPU.
__global__ void __launch_bounds__(128) bench_wgmma(int reps, float * sink) {
    __shared__ __align__(128) unsigned char sb[32 * kK * 2];
    for (int i = threadIdx.x; i < 32 * kK / 2; i += 128) {
        reinterpret_cast<unsigned *>(sb)[i] = 0x3c003c00u ^ (i & 0x00ff00ffu);
    }
    fence_proxy_async();
    __syncthreads();
    unsigned a[4] = {0x3c003c00u, 0x3c003c00u, threadIdx.x, 0x3c00u};
    float d[16] = {};
    const unsigned lbo = 4 * 128, sbo = 128;
    for (int r = 0; r < reps; ++r) {
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < kSteps; ++s) wgmma_rs<0>(d, a, wgmma_desc(sb + 2 * s * lbo, lbo, sbo), 1);
        wgmma_commit();
        wgmma_wait<0>();
    }
    float acc = 0; for (int i = 0; i < 16; ++i) acc += d[i];
    if (acc == 12345.f) sink[threadIdx.x] = acc;
}
__global__ void __launch_bounds__(128) bench_mma(int reps, float * sink) {
    __shared__ __align__(128) half sb[32 * (kK + 8)];  // [key][dim] with a pad, as the present block's pieces
    for (int i = threadIdx.x; i < 32 * (kK + 8); i += 128) sb[i] = __float2half(float(i & 7));
    __syncthreads();
    const int lane = threadIdx.x % 32;
    unsigned a[4] = {0x3c003c00u, 0x3c003c00u, threadIdx.x, 0x3c00u};
    float c[4][4] = {};
    // ldmatrix x4 of 8 key rows at dims k0, +8, +16, +24: two k-steps' b0, b1 of one n-tile
    const unsigned base = unsigned(__cvta_generic_to_shared(sb)) + ((lane % 8) * (kK + 8) + (lane / 8) * 8) * 2;
    for (int r = 0; r < reps; ++r) {
#pragma unroll
        for (int s2 = 0; s2 < kSteps / 2; ++s2)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                unsigned b[4];
                const unsigned addr = base + (nt * 8 * (kK + 8) + 32 * s2) * 2;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(addr));
                mma_16816(c[nt], a, b[0], b[1]);
                mma_16816(c[nt], a, b[2], b[3]);
            }
    }
    float acc = 0; for (int i = 0; i < 4; ++i) for (int j = 0; j < 4; ++j) acc += c[i][j];
    if (acc == 12345.f) sink[threadIdx.x] = acc;
}

template <typename F>
static double time_ms(F launch) {
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    launch();
    cudaEventRecord(e0);
    for (int i = 0; i < 5; ++i) launch();
    cudaEventRecord(e1); CHECK(cudaEventSynchronize(e1));
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    return ms / 5;
}

int main() {
    int nsm = 0; CHECK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop; CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, %d SMs\n\n", prop.name, nsm);
    std::printf("wgmma (m64nNk16, f16 in, f32 accumulate) against mma.sync m16n8k16 on the same rows and columns, "
                "%d tiles of 64 x N x %d a distribution; layout error: |wgmma - exact| / sum |a b|\n\n", kTests, kK);
    std::printf("| wgmma | inputs | elements | bits differ | layout error | verdict |\n|---|---|---|---|---|---|\n");
    bool ok = true;
    ok &= report<8, 0, false, false>("n8, A regs, B K-major");
    ok &= report<32, 0, false, false>("n32, A regs, B K-major");
    ok &= report<32, 0, false, true>("n32, A regs, B K-major, first step scale-d 0");
    ok &= report<32, 0, true, false>("n32, A smem, B K-major");
    ok &= report<8, 0, true, false>("n8, A smem, B K-major");
    ok &= report<32, 1, false, false>("n32, A regs, B MN-major");
    ok &= report<256, 1, false, false>("n256, A regs, B MN-major (P V)");
    ok &= report<256, 0, false, false>("n256, A regs, B K-major");
    float * sink; CHECK(cudaMalloc(&sink, 4096));
    const int reps = 4096, blocks = nsm * 4;
    const double flop = 2.0 * 64 * 32 * kK * double(reps) * blocks;
    const double t_wg = time_ms([&] { bench_wgmma<<<blocks, 128>>>(reps, sink); });
    const double t_mma = time_ms([&] { bench_mma<<<blocks, 128>>>(reps, sink); });
    CHECK(cudaGetLastError());
    std::printf("\nS of a 64-row tile x 32-key pieces x %d dims, %d blocks x %d pieces, operands in shared memory:\n",
                kK, blocks, reps);
    std::printf("  wgmma m64n32k16, A in registers: %.3f ms, %.0f TFLOP/s\n", t_wg, flop / t_wg / 1e9);
    std::printf("  mma.sync m16n8k16 + ldmatrix.x4: %.3f ms, %.0f TFLOP/s\n", t_mma, flop / t_mma / 1e9);
    std::printf("\nwgmma_check: %s\n", ok ? "layouts ok" : "LAYOUT FAILURES");
    return ok ? 0 : 1;
}
