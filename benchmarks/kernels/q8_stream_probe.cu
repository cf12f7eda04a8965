// Would 8-bit integer MMAs stream weights faster than lbq's and bf16s's f16 / bf16 ones, whose per-weight conversion
// bounds them (lbq: the integer pipe, forty-first session)? Two cases, on the 27B pair's shapes:
//   - the draft at 8 bits (its BF16 weights as Q8_0 values: 53% of the bytes) for its proposal's 16 columns (any
//     deterministic kernel may run there) and a committed token's one: ggml's mmq streams those bytes no faster than
//     mmf streams BF16 (thirty-fifth session), bf16s reaches ~75% of copy on the large matrices;
//   - the target at 4 bits (a Q4_0-like scale per 32, no Q4_K sub-block scales or mins) at 1 column (AR) and 23 (a
//     verify), against lbq's Q4_K products (`lbq_check decode`).
// The kernel:
//   - weights stored for it: each warp's A fragments of a (16-row strip, 256-k chunk) unit contiguous (8 bits: 4 KB,
//     a uint4 a lane a 32-block; 4 bits: 2 KB, a nibble pair a byte), the unit's 16 x 8 scales in their own array;
//   - activations quantized to int8 a scale per 32 per column (ggml's q8_1 values) by a first pass, stored as B
//     fragments, with each block's sum for the 4-bit offset (values stored as q + 8);
//   - mma.sync m16n8k32 on 8-bit integers (sm_80+: RTX 3090 too), each 32-block's int32 sums times both scales into
//     f32 (the float epilogue: 4 conversions and 8 FMAs a lane a 32-block an n-tile);
//   - each warp an even range of units (register double buffer: the next unit's bytes in flight while this one
//     multiplies), a strip cut between warps summed in piece order by a third pass.
// Checks every fifth output row against a float64 product of the same 8-bit values (relative to the sum of |terms|),
// and the same bits with dependent launch; times the three passes together (plain, and with dependent launch: the
// gemm's first unit of weights in flight before it waits) and each alone, back to back, the weights cycled over 1 GiB
// (from DRAM, as in the engine).
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a benchmarks/kernels/q8_stream_probe.cu -o q8_stream_probe
#include "probe_common.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

constexpr int kWarps = 8;        // a block's warps; two blocks an SM
constexpr int kStrip = 16;       // a unit's rows (one m16 tile)
constexpr int kChunk = 256;      // a unit's k: 8 quant blocks of 32
constexpr int kBlocks = kChunk / 32;
constexpr int kMaxNT = 3;        // n-tiles of 8 columns: up to 24 columns (a verify's 23)
constexpr int kMaxCols = 8 * kMaxNT;

// Which warps hold a unit's range: warp w takes units [bound(w), bound(w + 1)).
__host__ __device__ inline int64_t bound(int64_t w, int64_t units, int workers) { return w * units / workers; }
__host__ __device__ inline int warp_of(int64_t unit, int64_t units, int workers) {
    return int(((unit + 1) * workers - 1) / units);  // the largest w with bound(w) <= unit
}

// Programmatic dependent launch (sm_90; a no-op before, and where the launch did not ask for it): a kernel lets the
// next one start, then waits for the one before it to finish before touching what that one writes.
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

template <typename... Params, typename... Args>
static void launch(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&cfg, kernel, Params(args)...));
}

// c += a b (m16n8k32, int32 sums): A signed bytes (8-bit weights) or unsigned (4-bit ones, 0..15), B signed
template <bool A_UNSIGNED>
__device__ __forceinline__ void mma_8bit(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, uint2 b) {
    if constexpr (A_UNSIGNED) {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                     "{%0, %1, %2, %3};\n"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
    } else {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                     "{%0, %1, %2, %3};\n"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
    }
}

// x [n columns of k floats] -> xq (B fragments: a uint2 a lane an n-tile a 32-block, [block][n-tile][lane]), xd (the
// block's scale of each column, float2 of columns 2t, 2t + 1 a (block, n-tile, t)) and xo (for 4-bit weights stored
// as q + 8: -8 times the scale times the sum of the block's 8-bit values, the same layout). A warp a (block, column);
// columns n.. are zeros.
__global__ void quantize_x(const float * __restrict__ x, int k, int n, uint8_t * __restrict__ xq,
                           float * __restrict__ xd, float * __restrict__ xo) {
    pdl_trigger();
    pdl_wait();  // x from the kernel before; xq, xd and xo read by the product before that
    const int kb = blockIdx.x, col = threadIdx.x / 32, i = threadIdx.x % 32;
    const float v = col < n ? x[int64_t(col) * k + kb * 32 + i] : 0.0f;
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const int q = d > 0.0f ? __float2int_rn(v / d) : 0;
    int sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    // B fragment of m16n8k32: register r holds k = 4 t + 16 r + (0..3) of column g, lane 4 g + t
    const int t = (i & 15) >> 2, r = i >> 4, nt = col >> 3, g = col & 7;
    xq[((int64_t(kb) * kMaxNT + nt) * 32 + g * 4 + t) * 8 + r * 4 + (i & 3)] = uint8_t(int8_t(q));
    if (i == 0) {
        const int64_t at = ((int64_t(kb) * kMaxNT + nt) * 4 + (g >> 1)) * 2 + (g & 1);
        xd[at] = d;
        xo[at] = -8.0f * d * float(sum);
    }
}

// A unit's weights in registers: 8-bit, a uint4 a 32-block (its A fragment); 4-bit, a uint4 two 32-blocks (rows g and
// g + 8 of block j, then of block j + 1: k 4t.. in the low nibbles, k 16 + 4t.. in the high ones)
template <int BITS> struct UnitRegs {
    static constexpr int kWords = BITS == 8 ? kBlocks : kBlocks / 2;
    uint4 a[kWords];
    uint4 dw[2];  // the scales of rows g and g + 8 (8 halfs each)
};

template <int BITS, int NT>
__device__ __forceinline__ void unit_mma(const UnitRegs<BITS> & u, const uint2 * __restrict__ xq,
                                         const float2 * __restrict__ xd, const float2 * __restrict__ xo, int kb0,
                                         int lane, float (&acc)[NT][4]) {
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
        unsigned a0, a1, a2, a3;
        if constexpr (BITS == 8) {
            a0 = u.a[j].x, a1 = u.a[j].y, a2 = u.a[j].z, a3 = u.a[j].w;
        } else {
            const unsigned w0 = (j & 1) ? u.a[j / 2].z : u.a[j / 2].x, w1 = (j & 1) ? u.a[j / 2].w : u.a[j / 2].y;
            a0 = w0 & 0x0F0F0F0Fu, a1 = w1 & 0x0F0F0F0Fu, a2 = (w0 >> 4) & 0x0F0F0F0Fu, a3 = (w1 >> 4) & 0x0F0F0F0Fu;
        }
        const float d0 = __half2float(reinterpret_cast<const __half *>(&u.dw[0])[j]);
        const float d1 = __half2float(reinterpret_cast<const __half *>(&u.dw[1])[j]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int64_t at = (int64_t(kb0 + j) * kMaxNT + nt) * 32 + lane;
            const uint2 b = __ldg(xq + at);
            const float2 s = __ldg(xd + (int64_t(kb0 + j) * kMaxNT + nt) * 4 + (lane & 3));
            int c[4] = {0, 0, 0, 0};
            mma_8bit<BITS == 4>(c, a0, a1, a2, a3, b);
            if constexpr (BITS == 8) {
                acc[nt][0] = fmaf(float(c[0]), d0 * s.x, acc[nt][0]);
                acc[nt][1] = fmaf(float(c[1]), d0 * s.y, acc[nt][1]);
                acc[nt][2] = fmaf(float(c[2]), d1 * s.x, acc[nt][2]);
                acc[nt][3] = fmaf(float(c[3]), d1 * s.y, acc[nt][3]);
            } else {  // (q + 8) a - 8 sum(a): the offset's term per column
                const float2 o = __ldg(xo + (int64_t(kb0 + j) * kMaxNT + nt) * 4 + (lane & 3));
                acc[nt][0] = fmaf(fmaf(float(c[0]), s.x, o.x), d0, acc[nt][0]);
                acc[nt][1] = fmaf(fmaf(float(c[1]), s.y, o.y), d0, acc[nt][1]);
                acc[nt][2] = fmaf(fmaf(float(c[2]), s.x, o.x), d1, acc[nt][2]);
                acc[nt][3] = fmaf(fmaf(float(c[3]), s.y, o.y), d1, acc[nt][3]);
            }
        }
    }
}

// y [n columns of m] (ldy apart) = W x. wq: unit u's weights at wq + u * kWords * 32 (a uint4 a lane a word);
// wd: unit u's scales at wd + u * 16 (a row's 8 halfs a uint4). A strip whole in one warp's range goes to y, else its
// pieces to part [strip][piece][kMaxCols columns][16 rows].
template <int BITS, int NT>
__global__ void __launch_bounds__(kWarps * 32, 2)
    q8s_gemm(const uint4 * __restrict__ wq, const uint4 * __restrict__ wd, const uint2 * __restrict__ xq,
             const float2 * __restrict__ xd, const float2 * __restrict__ xo, int strips, int chunks, int workers, int n,
             float * __restrict__ y, int64_t ldy, float * __restrict__ part, int max_pieces) {
    constexpr int kWords = UnitRegs<BITS>::kWords;
    const int lane = threadIdx.x % 32, w = blockIdx.x * kWarps + threadIdx.x / 32;
    const int64_t units = int64_t(strips) * chunks;
    const int64_t u0 = bound(w, units, workers), u1 = bound(w + 1, units, workers);
    pdl_trigger();
    if (u0 >= u1) return;
    UnitRegs<BITS> r[2];
    auto load = [&](int64_t u, UnitRegs<BITS> & dst) {
#pragma unroll
        for (int j = 0; j < kWords; ++j) dst.a[j] = __ldcs(wq + (u * kWords + j) * 32 + lane);
        dst.dw[0] = __ldcs(wd + u * 16 + lane / 4);
        dst.dw[1] = __ldcs(wd + u * 16 + lane / 4 + 8);
    };
    float acc[NT][4] = {};
    auto flush = [&](int64_t u_first, int64_t u_last) {  // the units of one strip this warp took
        const int strip = int(u_first / chunks), g = lane / 4, t = lane % 4;
        const bool whole = u_first == int64_t(strip) * chunks && u_last == int64_t(strip + 1) * chunks - 1;
        const int piece = w - warp_of(int64_t(strip) * chunks, units, workers);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = nt * 8 + t * 2 + (e & 1), row = g + (e >> 1) * 8;
                if (whole) {
                    if (col < n) y[col * ldy + int64_t(strip) * kStrip + row] = acc[nt][e];
                } else {
                    part[((int64_t(strip) * max_pieces + piece) * kMaxCols + col) * kStrip + row] = acc[nt][e];
                }
                acc[nt][e] = 0.0f;
            }
    };
    load(u0, r[0]);  // the weights: no kernel writes them, so their first unit streams in before the wait
    pdl_wait();
    int64_t first = u0;
    for (int64_t u = u0; u < u1; u += 2) {
        if (u + 1 < u1) load(u + 1, r[1]);
        unit_mma<BITS, NT>(r[0], xq, xd, xo, int(u % chunks) * kBlocks, lane, acc);
        if (u + 1 == u1 || (u + 1) % chunks == 0) {
            flush(first, u);
            first = u + 1;
        }
        if (u + 1 >= u1) break;
        if (u + 2 < u1) load(u + 2, r[0]);
        unit_mma<BITS, NT>(r[1], xq, xd, xo, int((u + 1) % chunks) * kBlocks, lane, acc);
        if (u + 2 == u1 || (u + 2) % chunks == 0) {
            flush(first, u + 1);
            first = u + 2;
        }
    }
}

// y of the strips cut between warps: their pieces in warp order (a block a strip, a thread a (column, row))
__global__ void q8s_reduce(const float * __restrict__ part, int strips, int chunks, int workers, int n, int max_pieces,
                           float * __restrict__ y, int64_t ldy) {
    pdl_trigger();
    pdl_wait();
    const int strip = blockIdx.x, col = threadIdx.x / kStrip, row = threadIdx.x % kStrip;
    const int64_t units = int64_t(strips) * chunks, first = int64_t(strip) * chunks, last = first + chunks - 1;
    const int w0 = warp_of(first, units, workers), w1 = warp_of(last, units, workers);
    if (w0 == w1 || col >= n) return;  // whole in one warp: stored by it
    float sum = 0.0f;
    for (int w = w0; w <= w1; ++w) {
        if (bound(w, units, workers) == bound(w + 1, units, workers)) continue;  // an empty range
        sum += part[((int64_t(strip) * max_pieces + (w - w0)) * kMaxCols + col) * kStrip + row];
    }
    y[col * ldy + int64_t(strip) * kStrip + row] = sum;
}

template <int BITS> struct Launch {
    int m, k, strips, chunks, workers, max_pieces = 1;
    bool any_cut = false;
    uint8_t * xq;
    float * xd, * xo, * part;
    Launch(int m, int k, int nsm, int blocks_per_sm = 2)
        : m(m), k(k), strips(m / kStrip), chunks(k / kChunk), workers(nsm * blocks_per_sm * kWarps) {
        const int64_t units = int64_t(strips) * chunks;
        for (int s = 0; s < strips; ++s) {
            const int p = warp_of(int64_t(s + 1) * chunks - 1, units, workers) - warp_of(int64_t(s) * chunks, units,
                                                                                       workers) + 1;
            max_pieces = std::max(max_pieces, p);
        }
        any_cut = max_pieces > 1;
        CHECK(cudaMalloc(&xq, size_t(k / 32) * kMaxNT * 32 * 8));
        CHECK(cudaMalloc(&xd, size_t(k / 32) * kMaxCols * sizeof(float)));
        CHECK(cudaMalloc(&xo, size_t(k / 32) * kMaxCols * sizeof(float)));
        CHECK(cudaMalloc(&part, size_t(strips) * max_pieces * kMaxCols * kStrip * sizeof(float)));
    }
    ~Launch() {
        cudaFree(xq);
        cudaFree(xd);
        cudaFree(xo);
        cudaFree(part);
    }
    // the three passes (pdl: each launched to start while the one before it ends)
    void operator()(const uint8_t * wq, const __half * wd, const float * x, int n, float * y, bool pdl = false) const {
        quantize(x, n, pdl);
        gemm(wq, wd, n, y, pdl);
        reduce(n, y, pdl);
    }
    void quantize(const float * x, int n, bool pdl = false) const {
        launch(pdl, quantize_x, dim3(k / 32), dim3(32 * kMaxCols), x, k, n, xq, xd, xo);
    }
    void reduce(int n, float * y, bool pdl = false) const {
        if (any_cut) launch(pdl, q8s_reduce, dim3(strips), dim3(kMaxCols * kStrip), part, strips, chunks, workers, n,
                            max_pieces, y, int64_t(m));
    }
    template <int NT> void gemm_nt(const uint8_t * wq, const __half * wd, int n, float * y, bool pdl) const {
        launch(pdl, q8s_gemm<BITS, NT>, dim3(workers / kWarps), dim3(kWarps * 32), (const uint4 *) wq,
               (const uint4 *) wd, (const uint2 *) xq, (const float2 *) xd, (const float2 *) xo, strips, chunks,
               workers, n, y, int64_t(m), part, max_pieces);
    }
    void gemm(const uint8_t * wq, const __half * wd, int n, float * y, bool pdl = false) const {
        if (n <= 8) gemm_nt<1>(wq, wd, n, y, pdl);
        else if (n <= 16) gemm_nt<2>(wq, wd, n, y, pdl);
        else gemm_nt<3>(wq, wd, n, y, pdl);
    }
};

// W's values (q [m][k]: 8-bit signed, or 4-bit 0..15 standing for q - 8; a half scale per 32) in the kernel's order
template <int BITS>
static void store_for_kernel(const std::vector<int8_t> & q, const std::vector<__half> & d, int m, int k,
                             std::vector<uint8_t> & wq, std::vector<__half> & wd) {
    const int chunks = k / kChunk;
    wq.assign(size_t(m) * k * BITS / 8, 0);
    wd.assign(size_t(m) * k / 32, __float2half(0.0f));
    for (int s = 0; s < m / kStrip; ++s)
        for (int c = 0; c < chunks; ++c) {
            const int64_t u = int64_t(s) * chunks + c;
            for (int j = 0; j < kBlocks; ++j)
                for (int lane = 0; lane < 32; ++lane)
                    for (int r = 0; r < 4; ++r)  // A register r: rows g (+8 if r odd), k 4t.. (+16 if r >= 2)
                        for (int b = 0; b < 4; ++b) {
                            const int row = s * kStrip + lane / 4 + (r & 1) * 8;
                            const int kk = c * kChunk + j * 32 + (lane % 4) * 4 + (r >> 1) * 16 + b;
                            const int v = q[size_t(row) * k + kk];
                            if (BITS == 8) {
                                wq[((u * kBlocks + j) * 32 + lane) * 16 + r * 4 + b] = uint8_t(v);
                            } else {  // word (j & 1) * 2 + (r & 1) of uint4 j / 2; r >= 2 the high nibbles
                                uint8_t & byte = wq[((u * kBlocks / 2 + j / 2) * 32 + lane) * 16 +
                                                    ((j & 1) * 2 + (r & 1)) * 4 + b];
                                byte |= uint8_t(v << ((r >> 1) * 4));
                            }
                        }
            for (int rr = 0; rr < kStrip; ++rr)
                for (int j = 0; j < kBlocks; ++j)
                    wd[(u * kStrip + rr) * kBlocks + j] = d[(size_t(s) * kStrip + rr) * (k / 32) + c * kBlocks + j];
        }
}

struct Shape { const char * name; int m, k; };

// Checks and times the product of BITS-bit weights on each shape at each column count; false where a check failed
template <int BITS>
static bool run_shapes(const std::vector<Shape> & shapes, const std::vector<int> & col_counts, int nsm, double copy,
                       uint8_t * pool, size_t pool_bytes, const float * x, const std::vector<float> & hx, float * y) {
    bool ok = true;
    for (const Shape & s : shapes) {
        // random values, the kernel's check against float64 over the same 8-bit activations
        std::vector<int8_t> q(size_t(s.m) * s.k);
        std::vector<__half> d(size_t(s.m) * s.k / 32);
        for (size_t i = 0; i < q.size(); ++i) {
            const int h = int((i * 2654435761u) >> 7 & 0xff);
            q[i] = BITS == 8 ? int8_t((h - 128) | 1) : int8_t(h & 15);
        }
        for (size_t i = 0; i < d.size(); ++i) d[i] = __float2half(1e-3f * float(1 + (i * 40503u) % 97));
        std::vector<uint8_t> wq;
        std::vector<__half> wd;
        store_for_kernel<BITS>(q, d, s.m, s.k, wq, wd);
        const size_t q_bytes = wq.size(), bytes = q_bytes + wd.size() * 2;
        CHECK(cudaMemcpy(pool, wq.data(), q_bytes, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(pool + q_bytes, wd.data(), wd.size() * 2, cudaMemcpyHostToDevice));
        const Launch<BITS> run(s.m, s.k, nsm);
        double worst = 0.0;
        bool same_pdl = true;
        for (int n : col_counts) {
            CHECK(cudaMemset(y, 0xff, sizeof(float) * kMaxCols * s.m));
            run(pool, (const __half *) (pool + q_bytes), x, n, y);
            CHECK(cudaDeviceSynchronize());
            std::vector<float> got(size_t(n) * s.m), got_pdl(got.size());
            CHECK(cudaMemcpy(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost));
            // the same bits with each pass launched to start while the one before it ends
            CHECK(cudaMemset(y, 0xff, sizeof(float) * kMaxCols * s.m));
            run(pool, (const __half *) (pool + q_bytes), x, n, y, true);
            CHECK(cudaMemcpy(got_pdl.data(), y, got.size() * 4, cudaMemcpyDeviceToHost));
            same_pdl = same_pdl && std::memcmp(got.data(), got_pdl.data(), got.size() * 4) == 0;
            for (int c = 0; c < n; ++c) {
                // the activations' 8-bit values as the first pass makes them
                std::vector<int> qx(s.k);
                std::vector<double> dx(s.k / 32);
                for (int b = 0; b < s.k / 32; ++b) {
                    float amax = 0.0f;
                    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(hx[size_t(c) * s.k + b * 32 + i]));
                    const float dd = amax / 127.0f;
                    dx[b] = dd;
                    for (int i = 0; i < 32; ++i)
                        qx[b * 32 + i] = dd > 0.0f ? int(std::nearbyint(hx[size_t(c) * s.k + b * 32 + i] / dd)) : 0;
                }
                for (int r = c % 5; r < s.m; r += 5) {
                    double ref = 0.0, mag = 0.0;
                    for (int b = 0; b < s.k / 32; ++b) {
                        int64_t isum = 0;
                        for (int i = 0; i < 32; ++i) {
                            const int wv = q[size_t(r) * s.k + b * 32 + i] - (BITS == 4 ? 8 : 0);
                            isum += int64_t(wv) * qx[b * 32 + i];
                        }
                        const double term = double(__half2float(d[size_t(r) * (s.k / 32) + b])) * dx[b] * double(isum);
                        ref += term;
                        mag += std::fabs(term);
                    }
                    worst = std::max(worst, std::fabs(double(got[size_t(c) * s.m + r]) - ref) / (mag + 1e-30));
                }
            }
        }
        const bool good = worst < 1e-5 && same_pdl;
        ok = ok && good;
        printf("check %d-bit %s %d x %d: max |err| / sum |terms| %.2e, dependent launch %s: %s; %d strips x %d chunks "
               "over %d warps, up to %d pieces a strip\n", BITS, s.name, s.m, s.k, worst,
               same_pdl ? "same bits" : "DIFFERENT", good ? "ok" : "FAIL", run.strips, run.chunks, run.workers,
               run.max_pieces);
        if (s.m < 1024) continue;
        const int64_t copies = std::max<int64_t>(1, int64_t(pool_bytes / bytes));
        for (int n : col_counts) {
            auto at = [&](int i) { return pool + (i % copies) * bytes; };
            const double us = time_back_to_back_us([&](int i) {
                run(at(i), (const __half *) (at(i) + q_bytes), x, n, y);
            }, 5, 50);
            // each pass alone, back to back (the gemm on the activations the last quantize left)
            const double us_q = time_back_to_back_us([&](int) { run.quantize(x, n); }, 5, 50);
            const double us_g = time_back_to_back_us([&](int i) {
                run.gemm(at(i), (const __half *) (at(i) + q_bytes), n, y);
            }, 5, 50);
            const double us_r = time_back_to_back_us([&](int) { run.reduce(n, y); }, 5, 50);
            const double us_pdl = time_back_to_back_us([&](int i) {
                run(at(i), (const __half *) (at(i) + q_bytes), x, n, y, true);
            }, 5, 50);
            printf("| %d-bit | %s | %d x %d | %d | %.1f | %.1f | %.0f%% | %.1f | %.1f (%.0f%%) | %.1f |\n", BITS,
                   s.name,
                   s.m, s.k, n, us, us_pdl, 100.0 * bytes / (us_pdl * 1e3) / copy, us_q, us_g,
                   100.0 * bytes / (us_g * 1e3) / copy, us_r);
        }
    }
    return ok;
}

int main() {
    int nsm = 0;
    CHECK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    const size_t pool_bytes = size_t(1) << 30;
    uint8_t * pool;
    float * x, * y;
    CHECK(cudaMalloc(&pool, pool_bytes));
    CHECK(cudaMalloc(&x, sizeof(float) * kMaxCols * 25600));
    CHECK(cudaMalloc(&y, sizeof(float) * kMaxCols * 34816));
    CHECK(cudaMemset(pool, 0x11, pool_bytes));  // timing only: any values (the scales' halfs are then finite)
    std::vector<float> hx(size_t(kMaxCols) * 25600);
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = 0.01f * float(int(i * 2246822519u % 401) - 200);
    CHECK(cudaMemcpy(x, hx.data(), sizeof(float) * hx.size(), cudaMemcpyHostToDevice));
    const double copy = copy_gbs();
    printf("copy %.0f GB/s, %d SMs, %d warps\n", copy, nsm, nsm * 2 * kWarps);
    printf("| weights | matrix | rows x k | columns | us, three passes | the same, dependent launch | its %% of copy | "
           "quantize alone | gemm alone (%% of copy) | reduce alone |\n|---|---|---|---|---|---|---|---|---|---|\n");
    // the draft's matrices at 8 bits (its block: 16 columns; a committed token: 1), the target's at 4 bits (an AR
    // step: 1 column; a verify: 23)
    const std::vector<Shape> draft = { {"o", 5120, 4096}, {"qkv", 6144, 5120}, {"gate|up", 34816, 5120},
                                       {"down", 5120, 17408}, {"fc", 5120, 25600}, {"k|v", 2048, 5120},
                                       {"small", 64, 512} };
    const std::vector<Shape> target = { {"gate", 17408, 5120}, {"down", 5120, 17408}, {"qkv", 10240, 5120},
                                        {"z|b|a", 6240, 5120}, {"out", 5120, 6144}, {"small", 48, 768} };
    bool ok = run_shapes<8>(draft, {16, 1}, nsm, copy, pool, pool_bytes, x, hx, y);
    ok = run_shapes<4>(target, {1, 23}, nsm, copy, pool, pool_bytes, x, hx, y) && ok;
    printf("%s\n", ok ? "all ok" : "FAIL");
    return ok ? 0 : 1;
}
